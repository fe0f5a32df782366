/* hwtrace views: latency histograms, flame graph, sunburst, differential
   flame graph and line plots, drawn as SVG from the JSON embedded in the
   page.  Self-contained: no library, nothing fetched. */
(function () {
  "use strict";
  const DATA = JSON.parse(document.getElementById("hwtrace-data").textContent);
  const SVGNS = "http://www.w3.org/2000/svg";

  function svg(tag, attrs, parent) {
    const e = document.createElementNS(SVGNS, tag);
    for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function h(tag, attrs, parent, text) {
    const e = document.createElement(tag);
    for (const k in attrs || {}) {
      if (k === "class") e.className = attrs[k]; else e.setAttribute(k, attrs[k]);
    }
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
  const tip = h("div", { id: "tip" }, document.body);
  function showTip(evt, text) {
    tip.textContent = text;
    tip.style.display = "block";
    const x = Math.min(evt.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
    const y = Math.min(evt.clientY + 14, window.innerHeight - tip.offsetHeight - 8);
    tip.style.left = x + "px";
    tip.style.top = y + "px";
  }
  function hideTip() { tip.style.display = "none"; }
  function hover(node, text) {
    node.addEventListener("mousemove", (e) => showTip(e, typeof text === "function" ? text() : text));
    node.addEventListener("mouseleave", hideTip);
  }

  function num(n) { return Math.round(n).toLocaleString("en-US"); }
  function short(n) {
    const a = Math.abs(n);
    if (a >= 1e9) return (n / 1e9).toFixed(a >= 1e10 ? 0 : 1) + "G";
    if (a >= 1e6) return (n / 1e6).toFixed(a >= 1e7 ? 0 : 1) + "M";
    if (a >= 1e3) return (n / 1e3).toFixed(a >= 1e4 ? 0 : 1) + "K";
    if (a >= 10 || Number.isInteger(n)) return String(Math.round(n));
    return n.toFixed(a >= 1 ? 1 : a >= 0.1 ? 2 : 3);
  }
  // Axis labels: short, with as many significant digits as it takes for
  // neighbouring ticks to read differently (a narrow range).
  function tickLabels(vals) {
    let out = vals.map(short);
    for (let p = 3; p <= 8 && out.some((t, i) => i && t === out[i - 1]); p++) {
      out = vals.map((v) => v.toLocaleString("en-US", { maximumSignificantDigits: p }));
    }
    return out;
  }
  function amount(v, unit) {
    if (unit === "ns") {
      const a = Math.abs(v);
      if (a >= 1e9) return (v / 1e9).toFixed(3) + " s";
      if (a >= 1e6) return (v / 1e6).toFixed(3) + " ms";
      if (a >= 1e3) return (v / 1e3).toFixed(2) + " µs";
      return num(v) + " ns";
    }
    return num(v) + (unit ? " " + unit : "");
  }
  function pct(part, whole) { return whole ? (100 * part / whole).toFixed(2) + "%" : "-"; }
  function hash(s) {
    let x = 2166136261;
    for (let i = 0; i < s.length; i++) { x ^= s.charCodeAt(i); x = Math.imul(x, 16777619); }
    return (x >>> 0) / 4294967296;
  }
  function warm(name) {
    // FlameGraph's palette: reds to yellows, a name keeps its colour.
    const v = hash(name);
    return "rgb(" + (205 + Math.round(50 * v)) + "," + Math.round(80 + 140 * hash(name + "#")) + "," +
      Math.round(40 * v) + ")";
  }
  function diffColour(a, b) {
    const m = Math.max(a, b);
    if (!m) return "rgb(220,220,220)";
    const d = (b - a) / m;  // -1 .. 1
    const k = Math.round(215 - 175 * Math.min(1, Math.abs(d)));
    return d > 0 ? "rgb(255," + k + "," + k + ")" : d < 0 ? "rgb(" + k + "," + k + ",255)" : "rgb(235,235,235)";
  }
  function fitText(name, px) {
    const n = Math.floor((px - 6) / 6.4);
    if (n < 3) return "";
    return name.length <= n ? name : name.slice(0, n - 1) + "…";
  }

  // -- trees: {n: name, v: inclusive value, c: children, a/b: diff values} --
  function prepare(node, parent, depth) {
    node.p = parent;
    node.d = depth;
    node.c = node.c || [];
    node.c.sort((x, y) => (x.n < y.n ? -1 : x.n > y.n ? 1 : 0));
    let deepest = depth;
    for (const k of node.c) deepest = Math.max(deepest, prepare(k, node, depth + 1));
    node.deepest = deepest;
    return deepest;
  }
  function layout(node, x0, x1) {
    node.x0 = x0;
    node.x1 = x1;
    const total = node.c.reduce((s, k) => s + k.w, 0);
    let x = x0;
    const span = node.w ? (x1 - x0) / node.w : 0;
    for (const k of node.c) {
      const w = k.w * span;
      layout(k, x, x + w);
      x += w;
    }
    return total;
  }
  function weigh(node, diff) {
    node.w = diff ? Math.max(node.a || 0, node.b || 0) : node.v;
    for (const k of node.c) weigh(k, diff);
    if (diff) {
      const kids = node.c.reduce((s, k) => s + k.w, 0);
      node.w = Math.max(node.w, kids);
    }
  }
  function describe(node, root, unit, diff) {
    const lines = [node.n];
    if (diff) {
      lines.push("A: " + amount(node.a || 0, unit) + "   B: " + amount(node.b || 0, unit));
      const d = (node.b || 0) - (node.a || 0);
      lines.push("B − A: " + (d >= 0 ? "+" : "") + amount(d, unit) +
        ((node.a || 0) ? " (" + (d >= 0 ? "+" : "") + (100 * d / node.a).toFixed(1) + "%)" : " (only in B)"));
    } else {
      lines.push(amount(node.v, unit) + " (" + pct(node.v, root.v) + " of all" +
        (node.p ? ", " + pct(node.v, node.p.v) + " of its caller" : "") + ")");
      if (node.s) lines.push("self: " + amount(node.s, unit));
    }
    return lines.join("\n");
  }

  function flamegraph(host, tree, opts) {
    const diff = !!opts.diff;
    prepare(tree, null, 0);
    weigh(tree, diff);
    layout(tree, 0, 1);
    const controls = h("div", { class: "controls" }, host);
    const search = h("input", { type: "search", placeholder: "search functions (regexp)" }, controls);
    const reset = h("button", {}, controls, "reset zoom");
    const found = h("span", {}, controls);
    if (diff) {
      const lg = h("span", { class: "legend" }, controls);
      lg.innerHTML = '<span><span class="swatch" style="background:rgb(255,60,60)"></span>more in B</span>' +
        '<span><span class="swatch" style="background:rgb(60,60,255)"></span>less in B</span>' +
        "<span>width: the larger of A and B</span>";
    }
    const rowH = 18;
    const depth = Math.min(tree.deepest, 200);
    const width = Math.max(600, host.clientWidth - 30 || 1100);
    const height = (depth + 1) * rowH + 4;
    const root = svg("svg", { width: width, height: height, class: "flamegraph", role: "img" }, host);
    let focus = tree;
    let pattern = null;

    function draw() {
      while (root.firstChild) root.removeChild(root.firstChild);
      const f0 = focus.x0, f1 = focus.x1, scale = width / ((f1 - f0) || 1);
      let hitTotal = 0;
      const stack = [tree];
      while (stack.length) {
        const node = stack.pop();
        const onPath = focus === node || isAncestor(node, focus);
        let x = (node.x0 - f0) * scale, w = (node.x1 - node.x0) * scale;
        if (onPath && node !== focus) { x = 0; w = width; }
        if (x + w < 0 || x > width || w < 0.4 || node.d > depth) continue;
        x = Math.max(0, x);
        w = Math.min(width - x, w);
        const y = height - (node.d + 1) * rowH;
        const g = svg("g", { class: "frame" + (onPath && node !== focus ? " dim" : ""),
          "data-name": node.n }, root);
        const hit = pattern && pattern.test(node.n);
        if (hit) { g.classList.add("hit"); if (!hasHitAncestor(node)) hitTotal += node.w; }
        svg("rect", { x: x.toFixed(2), y: y, width: w.toFixed(2), height: rowH - 1, rx: 1.5,
          fill: diff ? diffColour(node.a || 0, node.b || 0) : (node === tree ? "rgb(200,200,215)" : warm(node.n)) }, g);
        const label = fitText(node.n, w);
        if (label) {
          const t = svg("text", { x: (x + 3).toFixed(1), y: y + 12.5 }, g);
          t.textContent = label;
        }
        g.addEventListener("click", () => { focus = node; draw(); });
        hover(g, () => describe(node, tree, opts.unit, diff));
        if (!onPath || node === focus) for (const k of node.c) stack.push(k);
        else for (const k of node.c) if (k === focus || isAncestor(k, focus)) stack.push(k);
      }
      function hasHitAncestor(node) {
        for (let x = node.p; x; x = x.p) if (pattern.test(x.n)) return true;
        return false;
      }
      found.textContent = pattern ? "matched: " + pct(hitTotal, tree.w) + " of all" : "";
    }
    function isAncestor(a, b) {
      for (let x = b.p; x; x = x.p) if (x === a) return true;
      return false;
    }
    search.addEventListener("input", () => {
      try { pattern = search.value ? new RegExp(search.value) : null; } catch (e) { pattern = null; }
      draw();
    });
    reset.addEventListener("click", () => { focus = tree; draw(); });
    draw();
    return root;
  }

  function arcPath(a0, a1, r0, r1, cx, cy) {
    if (a1 - a0 >= 2 * Math.PI - 1e-6) a1 = a0 + 2 * Math.PI - 1e-4;
    const large = a1 - a0 > Math.PI ? 1 : 0;
    const p = (a, r) => (cx + r * Math.sin(a)).toFixed(2) + "," + (cy - r * Math.cos(a)).toFixed(2);
    return "M" + p(a0, r1) + "A" + r1 + "," + r1 + " 0 " + large + " 1 " + p(a1, r1) +
      "L" + p(a1, r0) + "A" + r0 + "," + r0 + " 0 " + large + " 0 " + p(a0, r0) + "Z";
  }

  function sunburst(host, tree, opts) {
    const diff = !!opts.diff;
    if (tree.x0 === undefined) { prepare(tree, null, 0); weigh(tree, diff); layout(tree, 0, 1); }
    const size = Math.min(Math.max(420, host.clientWidth - 2 || 640), 760);
    const rings = 10;
    const c = size / 2;
    const hole = size * 0.09;
    const ring = (c - hole - 4) / rings;
    const note = h("div", { class: "controls" }, host, "click an arc to zoom in, the centre to zoom out");
    const root = svg("svg", { width: size, height: size, class: "sunburst", role: "img" }, host);
    let focus = tree;
    function draw() {
      while (root.firstChild) root.removeChild(root.firstChild);
      const center = svg("circle", { cx: c, cy: c, r: hole, fill: "rgb(225,228,236)", class: "center" }, root);
      hover(center, () => describe(focus, tree, opts.unit, diff) + (focus.p ? "\n(click: out)" : ""));
      center.addEventListener("click", () => { if (focus.p) { focus = focus.p; draw(); } });
      const label = svg("text", { x: c, y: c + 4, "text-anchor": "middle" }, root);
      label.textContent = fitText(focus.n, hole * 2);
      const f0 = focus.x0, span = (focus.x1 - focus.x0) || 1;
      const stack = focus.c.slice();
      while (stack.length) {
        const node = stack.pop();
        const level = node.d - focus.d;
        if (level > rings) continue;
        const a0 = 2 * Math.PI * (node.x0 - f0) / span, a1 = 2 * Math.PI * (node.x1 - f0) / span;
        if (a1 - a0 < 0.004) continue;
        const r0 = hole + (level - 1) * ring, r1 = r0 + ring - 1;
        const path = svg("path", { d: arcPath(a0, a1, r0, r1, c, c), class: "arc", "data-name": node.n,
          fill: diff ? diffColour(node.a || 0, node.b || 0) : warm(node.n) }, root);
        path.addEventListener("click", () => { focus = node; draw(); });
        hover(path, () => describe(node, tree, opts.unit, diff));
        for (const k of node.c) stack.push(k);
      }
    }
    draw();
    return root;
  }

  function niceStep(raw) {
    if (raw <= 1) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    const m = raw / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
  }

  function histogram(host, rows, opts) {
    const title = h("h2", {}, host, opts.title);
    if (!rows || !rows.length) { h("div", { class: "empty" }, host, "no intervals"); return title; }
    const controls = h("label", { class: "controls" }, host);
    const logBox = h("input", { type: "checkbox" }, controls);
    controls.appendChild(document.createTextNode(" logarithmic counts"));
    // From the bucket before the first non-empty one: Δt buckets below the
    // trace's resolution are all empty and would squeeze the rest.
    const first = Math.max(0, rows.findIndex((r) => r[2] > 0) - 1);
    rows = rows.slice(first);
    const W = 560, H = 230;  // drawn in these units, scaled to the panel
    const left = 52, bottom = 42, top = 10, right = 10;
    const root = svg("svg", { viewBox: "0 0 " + W + " " + H, width: "100%", class: "histogram",
      role: "img", preserveAspectRatio: "xMinYMin meet" }, host);
    function draw() {
      while (root.firstChild) root.removeChild(root.firstChild);
      const log = logBox.checked;
      const peak = Math.max(...rows.map((r) => r[2]));
      const pw = W - left - right, ph = H - top - bottom;
      const bw = pw / rows.length;
      let ticks, yv;
      if (log) {
        const decades = Math.max(1, Math.ceil(Math.log10(peak + 1)));
        ticks = Array.from({ length: decades + 1 }, (_, i) => Math.pow(10, i));
        yv = (v) => Math.log10(1 + v) / Math.log10(1 + ticks[ticks.length - 1]);
        ticks = [0].concat(ticks);
      } else {
        const step = niceStep(peak / 4);
        const topTick = Math.ceil(peak / step) * step;
        ticks = [];
        for (let v = 0; v <= topTick + 1e-9; v += step) ticks.push(v);
        yv = (v) => v / topTick;
      }
      for (const v of ticks) {
        const y = top + ph - ph * yv(v);
        svg("line", { x1: left, x2: W - right, y1: y, y2: y, class: "grid" }, root);
        const t = svg("text", { x: left - 6, y: y + 3.5, "text-anchor": "end", class: "lbl" }, root);
        t.textContent = short(v);
      }
      rows.forEach((r, i) => {
        const hgt = r[2] ? Math.max(1, ph * yv(r[2])) : 0;
        const x = left + i * bw;
        const bar = svg("rect", { x: (x + 1).toFixed(1), y: (top + ph - hgt).toFixed(1),
          width: Math.max(1, bw - 2).toFixed(1), height: hgt.toFixed(1), class: "bar" }, root);
        hover(bar, amount(r[0], opts.unit) + " – " + amount(r[1], opts.unit) + "\n" + num(r[2]) + " intervals");
        if (rows.length <= 24 || i % Math.ceil(rows.length / 24) === 0) {
          const t = svg("text", { x: (x + bw / 2).toFixed(1), y: H - bottom + 14, "text-anchor": "middle",
            class: "lbl" }, root);
          t.textContent = short(r[0]);
        }
      });
      svg("line", { x1: left, x2: W - right, y1: top + ph, y2: top + ph, class: "axis" }, root);
      svg("line", { x1: left, x2: left, y1: top, y2: top + ph, class: "axis" }, root);
      const xl = svg("text", { x: left + pw / 2, y: H - 6, "text-anchor": "middle", class: "lbl" }, root);
      xl.textContent = opts.axis + " (power-of-two buckets, low end)";
    }
    logBox.addEventListener("change", draw);
    draw();
    return root;
  }

  function lines(host, plot) {
    // plot: {title, x: label, y: label, logx, logy, series: [{name, points: [[x, y]...]}]}
    h("h2", {}, host, plot.title);
    const W = 560, H = 260;  // drawn in these units, scaled to the panel
    const left = 64, bottom = 44, top = 12, right = 14;
    const root = svg("svg", { viewBox: "0 0 " + W + " " + H, width: "100%", class: "plot",
      role: "img", preserveAspectRatio: "xMinYMin meet" }, host);
    const pts = plot.series.flatMap((s) => s.points).filter((p) => p[1] !== null);
    if (!pts.length) { h("div", { class: "empty" }, host, "no data"); return root; }
    const tx = (v) => (plot.logx ? Math.log10(Math.max(v, 1e-12)) : v);
    const ty = (v) => (plot.logy ? Math.log10(Math.max(v, 1e-12)) : v);
    let x0 = Math.min(...pts.map((p) => tx(p[0]))), x1 = Math.max(...pts.map((p) => tx(p[0])));
    let y0 = Math.min(...pts.map((p) => ty(p[1]))), y1 = Math.max(...pts.map((p) => ty(p[1])));
    if (!plot.logy) y0 = Math.min(0, y0);
    if (x1 === x0) { x0 -= 1; x1 += 1; }
    if (y1 === y0) { y0 -= 1; y1 += 1; }
    const pw = W - left - right, ph = H - top - bottom;
    const X = (v) => left + (pw * (tx(v) - x0)) / (x1 - x0);
    const Y = (v) => top + ph - (ph * (ty(v) - y0)) / (y1 - y0);
    const steps = [0, 1, 2, 3, 4];
    const yLabels = tickLabels(steps.map((i) => {
      const yv = y0 + ((y1 - y0) * i) / 4;
      return plot.logy ? Math.pow(10, yv) : yv;
    }));
    const xLabels = tickLabels(steps.map((i) => {
      const xv = x0 + ((x1 - x0) * i) / 4;
      return plot.logx ? Math.pow(10, xv) : xv;
    }));
    for (const i of steps) {
      const y = top + ph - (ph * i) / 4;
      svg("line", { x1: left, x2: W - right, y1: y, y2: y, class: "grid" }, root);
      const t = svg("text", { x: left - 6, y: y + 3.5, "text-anchor": "end", class: "lbl" }, root);
      t.textContent = yLabels[i];
      const x = left + (pw * i) / 4;
      const u = svg("text", { x: x, y: H - bottom + 15, "text-anchor": "middle", class: "lbl" }, root);
      u.textContent = xLabels[i];
    }
    svg("line", { x1: left, x2: W - right, y1: top + ph, y2: top + ph, class: "axis" }, root);
    svg("line", { x1: left, x2: left, y1: top, y2: top + ph, class: "axis" }, root);
    const xl = svg("text", { x: left + pw / 2, y: H - 6, "text-anchor": "middle", class: "lbl" }, root);
    xl.textContent = plot.x;
    const yl = svg("text", { x: 12, y: top + ph / 2, "text-anchor": "middle", class: "lbl",
      transform: "rotate(-90 12 " + (top + ph / 2) + ")" }, root);
    yl.textContent = plot.y;
    const palette = ["#2f6fd6", "#e8743b", "#19a979", "#9c5dd6", "#d6455d", "#7a8699"];
    const legend = h("div", { class: "legend" }, host);
    plot.series.forEach((s, k) => {
      const colour = palette[k % palette.length];
      const good = s.points.filter((p) => p[1] !== null);
      svg("polyline", { points: good.map((p) => X(p[0]).toFixed(1) + "," + Y(p[1]).toFixed(1)).join(" "),
        fill: "none", stroke: plot.scatter ? "none" : colour, "stroke-width": 2, class: "series" }, root);
      for (const p of good) {
        const dot = svg("circle", { cx: X(p[0]).toFixed(1), cy: Y(p[1]).toFixed(1), r: 3.5, fill: colour,
          class: "point" }, root);
        hover(dot, s.name + "\n" + plot.x + ": " + p[0] + "\n" + plot.y + ": " + p[1] +
          (p[2] ? "\n" + p[2] : ""));
      }
      const item = h("span", {}, legend);
      item.innerHTML = '<span class="swatch" style="background:' + colour + '"></span>';
      item.appendChild(document.createTextNode(s.name));
    });
    return root;
  }

  function table(host, columns, rows) {
    const wrap = h("div", { class: "scroll" }, host);
    const t = h("table", { class: "data" }, wrap);
    const hr = h("tr", {}, h("thead", {}, t));
    for (const c of columns) h("th", { class: c.left ? "l" : "" }, hr, c.name);
    const body = h("tbody", {}, t);
    for (const r of rows) {
      const tr = h("tr", {}, body);
      columns.forEach((c, i) => h("td", { class: (c.left ? "l " : "") + (c.path ? "path" : "") }, tr, r[i]));
    }
    return t;
  }

  function facts(host, items) {
    const box = h("div", { class: "facts" }, host);
    for (const [label, value] of items) {
      const f = h("div", { class: "fact" }, box);
      h("b", {}, f, value);
      h("span", {}, f, label);
    }
  }

  function tabs(host, names) {
    const bar = h("div", { class: "tabs" }, host);
    const panes = names.map(() => h("div", { class: "panel" }, host));
    const buttons = names.map((n, i) => {
      const b = h("button", { type: "button" }, bar, n);
      b.addEventListener("click", () => select(i));
      return b;
    });
    const made = names.map(() => false);
    let builders = [];
    function select(i) {
      panes.forEach((p, k) => { p.style.display = k === i ? "" : "none"; });
      buttons.forEach((b, k) => b.classList.toggle("on", k === i));
      if (!made[i] && builders[i]) { made[i] = true; builders[i](panes[i]); }
    }
    // A tab can be opened from the address: page.html#sunburst.
    const wanted = names.findIndex((n) => "#" + n.toLowerCase().replace(/[^a-z]+/g, "-") === location.hash);
    return { panes, select, build(fns) { builders = fns; select(Math.max(0, wanted)); } };
  }

  // -- the views ------------------------------------------------------------
  const main = document.querySelector("main");

  function latencyView(d) {
    const s = d.summary;
    const top = h("div", { class: "panel" }, main);
    h("h2", {}, top, "Summary");
    if (s) {
      facts(top, [["intervals", num(s.count)], ["median Δt", amount(s.dt_median, d.unit)],
        ["mean Δt", amount(s.dt_mean, d.unit)], ["max Δt", amount(s.dt_max, d.unit)],
        ["median ΔIC", num(s.dic_median)], ["max ΔIC", num(s.dic_max)],
        ["median Δt resolution", s.resolution_median >= 0 ? "± " + amount(s.resolution_median, d.unit) : "-"],
        ["dropped for gaps", num(d.dropped_for_gaps)], ["repeated opens", num(d.repeated_opens)],
        ["unmatched closes", num(d.unmatched_closes)]]);
    } else {
      h("div", { class: "empty" }, top, "no interval was measured");
    }
    const row = h("div", { class: "row" }, main);
    histogram(h("div", { class: "panel" }, row), d.dt_histogram, { title: "Δt histogram", unit: d.unit, axis: "Δt (" + d.unit + ")" });
    histogram(h("div", { class: "panel" }, row), d.dic_histogram, { title: "ΔIC histogram", unit: "", axis: "instructions" });
    const longest = h("div", { class: "panel" }, main);
    h("h2", {}, longest, d.every_interval ? "Intervals, longest first" : "Longest intervals");
    const ivs = d.intervals.slice().sort((x, y) => y.dt - x.dt || y.dic - x.dic).slice(0, 500);
    table(longest, [{ name: "Δt" }, { name: "± resolution" }, { name: "ΔIC" }, { name: d.key_label || "tid" },
      { name: "cpu" }, { name: "open", left: true }, { name: "close", left: true },
      { name: "call path at the open", left: true, path: true }],
      ivs.map((iv) => [amount(iv.dt, d.unit), iv.resolution >= 0 ? amount(iv.resolution, d.unit) : "-",
        num(iv.dic), iv.key, iv.cpu >= 0 ? iv.cpu : "-", iv.open, iv.close, iv.path]));
  }

  function callPathView(d) {
    const t = tabs(main, ["Flame graph", "Sunburst", "Paths"]);
    t.build([
      (p) => flamegraph(p, d.tree, { unit: d.unit }),
      (p) => sunburst(p, d.tree, { unit: d.unit }),
      (p) => table(p, [{ name: d.unit }, { name: "%" }, { name: "call path", left: true, path: true }],
        d.paths.map((r) => [num(r[1]), pct(r[1], d.tree.v), r[0]])),
    ]);
  }

  function diffView(d) {
    const t = tabs(main, ["Differential flame graph", "Sunburst", "Paths"]);
    t.build([
      (p) => flamegraph(p, d.tree, { unit: d.unit, diff: true }),
      (p) => sunburst(p, d.tree, { unit: d.unit, diff: true }),
      (p) => table(p, [{ name: "A" }, { name: "B" }, { name: "B − A" }, { name: "call path", left: true, path: true }],
        d.paths.map((r) => [num(r[1]), num(r[2]), (r[2] >= r[1] ? "+" : "") + num(r[2] - r[1]), r[0]])),
    ]);
  }

  function plotsView(d) {
    if (d.facts) facts(h("div", { class: "panel" }, main), d.facts);
    const row = h("div", { class: "row" }, main);
    for (const plot of d.plots) lines(h("div", { class: "panel" }, row), plot);
    if (d.table) {
      const p = h("div", { class: "panel" }, main);
      h("h2", {}, p, d.table.title);
      table(p, d.table.columns.map((c, i) => ({ name: c, left: i === 0 })), d.table.rows);
    }
  }

  // A time graph: one row per entity, its intervals coloured by state;
  // wheel to zoom at the pointer, drag to pan, double-click to see all.
  function timegraph(host, rows, opts) {
    const W = Math.max(640, (host.clientWidth || 1200) - 24), LBL = 190, RH = 18, AX = 26;
    const H = AX + rows.length * RH + 4;
    const box = svg("svg", { class: "timegraph", width: W, height: H, viewBox: `0 0 ${W} ${H}` }, host);
    let lo = opts.start, hi = opts.end;
    const plot = W - LBL - 8;
    function x(t) { return LBL + (t - lo) / (hi - lo) * plot; }
    function draw() {
      while (box.firstChild) box.removeChild(box.firstChild);
      const step = niceStep((hi - lo) / 8);
      for (let t = Math.ceil(lo / step) * step; t <= hi; t += step) {
        svg("line", { class: "grid", x1: x(t), x2: x(t), y1: AX - 4, y2: H }, box);
        svg("text", { class: "lbl", x: x(t), y: AX - 8, "text-anchor": "middle" }, box).textContent = amount(t - opts.start, opts.unit);
      }
      rows.forEach((r, i) => {
        const y = AX + i * RH;
        svg("text", { x: 4, y: y + RH - 5 }, box).textContent = r.label;
        let lastEnd = -1;
        for (const [a, b, st] of r.iv) {
          if (b < lo || a > hi) continue;
          const x0 = Math.max(LBL, x(a)), x1 = Math.min(W - 8, x(b));
          if (x1 - x0 < 0.4 && x0 < lastEnd + 0.4) continue;  // below a pixel, drawn already
          lastEnd = x1;
          const rect = svg("rect", { class: "iv", x: x0, y: y + 2, width: Math.max(0.6, x1 - x0), height: RH - 4,
            fill: opts.colours[st] }, box);
          rect.setAttribute("data-state", opts.states[st]);
          hover(rect, `${r.label}: ${opts.states[st]}, ${amount(a - opts.start, opts.unit)} to ${amount(b - opts.start, opts.unit)} (${amount(b - a, opts.unit)})`);
        }
      });
    }
    box.addEventListener("wheel", (e) => {
      e.preventDefault();
      const at = lo + (e.offsetX - LBL) / plot * (hi - lo), k = e.deltaY > 0 ? 1.25 : 0.8;
      lo = Math.max(opts.start, at - (at - lo) * k); hi = Math.min(opts.end, at + (hi - at) * k);
      if (hi - lo < 2) hi = lo + 2;
      draw();
    });
    let drag = null;
    box.addEventListener("mousedown", (e) => { drag = [e.offsetX, lo, hi]; });
    box.addEventListener("mouseup", () => { drag = null; });
    box.addEventListener("mousemove", (e) => {
      if (!drag) return;
      const dt = (e.offsetX - drag[0]) / plot * (drag[2] - drag[1]);
      lo = drag[1] - dt; hi = drag[2] - dt;
      if (lo < opts.start) { hi += opts.start - lo; lo = opts.start; }
      if (hi > opts.end) { lo -= hi - opts.end; hi = opts.end; }
      draw();
    });
    box.addEventListener("dblclick", () => { lo = opts.start; hi = opts.end; draw(); });
    draw();
    const key = h("div", { class: "legend" }, host);
    opts.states.forEach((name, i) => {
      if (!opts.used.includes(i)) return;
      const item = h("span", {}, key);
      h("i", { style: `background:${opts.colours[i]}` }, item);
      item.appendChild(document.createTextNode(name));
    });
  }

  function vmView(d) {
    if (d.facts) facts(h("div", { class: "panel" }, main), d.facts);
    const opts = { start: d.start, end: d.end, unit: d.unit, states: d.states, colours: d.colours };
    const t = tabs(main, d.groups.map((g) => g.title).concat(["Exits"]));
    t.build(d.groups.map((g) => (p) => {
      h("h2", {}, p, g.title);
      const used = [...new Set(g.rows.flatMap((r) => r.iv.map((iv) => iv[2])))];
      timegraph(p, g.rows, Object.assign({ used }, opts));
    }).concat([(p) => {
      h("h2", {}, p, "Longest VM exits");
      table(p, [{ name: "vCPU", left: true }, { name: "at" }, { name: "VMM time" }, { name: "reason", left: true }],
        d.exits.map((r) => [r[0], amount(r[1] - d.start, d.unit), amount(r[2], d.unit), r[3] || ""]));
    }]));
  }

  const views = { latency: latencyView, callpaths: callPathView, diff: diffView, plots: plotsView, vm: vmView };
  views[DATA.view](DATA);
  document.body.setAttribute("data-rendered", DATA.view);
})();
