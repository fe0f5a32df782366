#undef TRACEPOINT_PROVIDER
#define TRACEPOINT_PROVIDER hwbench

#undef TRACEPOINT_INCLUDE
#define TRACEPOINT_INCLUDE "./hwbench_tp.h"

#if !defined(HWBENCH_TP_H) || defined(TRACEPOINT_HEADER_MULTI_READ)
#define HWBENCH_TP_H

#include <lttng/tracepoint.h>

/* The same event as the channel's: two 64-bit words. */
TRACEPOINT_EVENT(hwbench, ev,
	TP_ARGS(uint64_t, a, uint64_t, b),
	TP_FIELDS(ctf_integer(uint64_t, a, a) ctf_integer(uint64_t, b, b)))

#endif

#include <lttng/tracepoint-event.h>
