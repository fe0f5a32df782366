"""The kernel side: bpf(), perf_event_open, tracefs, maps and ring buffers."""
