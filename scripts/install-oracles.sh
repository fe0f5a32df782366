#!/usr/bin/env bash
# Install the optional Debian oracles (libipt headers, perf, LTTng) and
# readers (babeltrace2 and its Python bindings) and a browser when possible.
# Failure here is not an error: the tests that need them skip with a reason.
set -u
# tracefs: the kernel filter and ftrace tests need it mounted (root only).
if [ "$(id -u)" = 0 ] && [ ! -d /sys/kernel/tracing/events ] && [ -d /sys/kernel/tracing ]; then
    mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null \
        || echo "note: could not mount tracefs; the tests that need it will skip"
fi
need=()
[ -e /usr/include/intel-pt.h ] || need+=(libipt-dev)
command -v perf >/dev/null 2>&1 || need+=(linux-perf)
# babeltrace2's Python bindings: reading CTF traces (hwtrace filter).
[ -e /usr/lib/python3/dist-packages/bt2 ] || need+=(python3-bt2)
# LTTng-UST: the filter tiers' peer and the tracer-impact experiment.
command -v lttng-sessiond >/dev/null 2>&1 || need+=(lttng-tools)
[ -e /usr/include/lttng/tracepoint.h ] || need+=(liblttng-ust-dev)
command -v babeltrace2 >/dev/null 2>&1 || need+=(babeltrace2)
# OpenCSD: ARM's CoreSight decoder (STM, ETMv4/ETE, frame deformatter) and
# its trc_pkt_lister, the oracle for hwtrace's CoreSight codecs.
[ -e /usr/include/opencsd/c_api/opencsd_c_api.h ] || need+=(libopencsd-dev)
command -v trc_pkt_lister >/dev/null 2>&1 || need+=(libopencsd-bin)
# bpftool: an independent view of the BPF programs and maps hwtrace loads.
command -v bpftool >/dev/null 2>&1 || need+=(bpftool)
# Headless Chromium: the HTML views are checked in a real browser.
command -v chromium >/dev/null 2>&1 || need+=(chromium)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "note: not root or no apt-get; skipping optional oracles: ${need[*]}"
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -qq "${need[@]}" >/dev/null 2>&1; then
    apt-get update -qq >/dev/null 2>&1 || true
    apt-get install -y -qq "${need[@]}" >/dev/null 2>&1 \
        || echo "note: could not install ${need[*]}; oracle tests will skip"
fi
exit 0
