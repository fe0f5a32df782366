"""Kernel tracing applications: sessions that compile filters to eBPF, load
and attach them and read what they emit (:mod:`.trace`), the followed
process set (:mod:`.follow`), the tracepoint programs they attach
(:mod:`.programs`), the co-operative system call latency tracker
(:mod:`.latency`) and their writers (:mod:`.output`, :mod:`.report`).

They sit above :mod:`hwtrace.filter` (the filter compilers) and use the
system-call wrappers of :mod:`hwtrace.kernel`.
"""
