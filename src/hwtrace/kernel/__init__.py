"""Linux system-call wrappers: bpf() maps and programs, perf_event_open on
tracepoints, tracefs, BPF ring buffers and the system call table.  Nothing
here knows hwtrace's filters or outputs (:mod:`hwtrace.ktrace` does)."""
