// Frida agent for bench/peers.py's frida_stalker runner: Stalker follows
// every thread of the process and the agent receives the events it emits
// (EVENT_KIND: "compile", one event per basic block the first time it is
// translated, i.e. block coverage; or "block", one per executed block).
// The events are counted, not kept: the cost measured is Stalker's
// recompilation plus the event stream, a lower bound of a recorder's.
const EVENT_KIND = "%EVENT_KIND%";
let bytes = 0;
let batches = 0;
let eventSize = 0;
const followed = [];

function onReceive(events) {
  if (eventSize === 0) {
    const parsed = Stalker.parse(events);
    if (parsed.length > 0) eventSize = events.byteLength / parsed.length;
  }
  bytes += events.byteLength;
  batches++;
}

function follow(threadId) {
  followed.push(threadId);
  Stalker.follow(threadId, { events: { [EVENT_KIND]: true }, onReceive });
}

// The tally is sent from exit()/_exit() and the exiting thread waits for
// the host's acknowledgement: a message sent while the process dies is lost.
function report(why) {
  Stalker.flush();
  send({ type: "tally", why, bytes, batches, eventSize, followed });
  recv("ack", () => {}).wait();
}

for (const name of ["exit", "_exit"]) {
  const f = Module.findGlobalExportByName(name);
  if (f !== null) Interceptor.attach(f, { onEnter() { report(name); } });
}

rpc.exports = {
  // Called by the host right after resuming the spawned process: Frida's
  // Linux spawn restores the main thread's registers when it resumes it,
  // which undoes a Stalker.follow made before (observed: no events at all).
  followAll() {
    Process.attachThreadObserver({ onAdded(thread) { follow(thread.id); } });
    return followed;
  },
};
