/* LTTng-UST tracepoint provider of bench/probe_target.c (built with
 * -DWITH_LTTNG): hwtrace_bench:work_entry, fired at the start of work() with
 * the call's three arguments, the static-tracepoint peer of a dynamic probe
 * inserted at the same place (bench/bench_probe.py).
 *
 * Written with LTTng-UST's original macro names (TRACEPOINT_EVENT, TP_ARGS,
 * ...), which 2.13 still accepts (LTTNG_UST_COMPAT_API), as
 * bench/lttng/retlif_tp.h. */
#undef TRACEPOINT_PROVIDER
#define TRACEPOINT_PROVIDER hwtrace_bench

#undef TRACEPOINT_INCLUDE
#define TRACEPOINT_INCLUDE "./probe_target_tp.h"

#if !defined(PROBE_TARGET_TP_H) || defined(TRACEPOINT_HEADER_MULTI_READ)
#define PROBE_TARGET_TP_H

#include <lttng/tracepoint.h>
#include <stdint.h>

TRACEPOINT_EVENT(
    hwtrace_bench,
    work_entry,
    TP_ARGS(uint64_t, base, uint64_t, exp, uint64_t, mod),
    TP_FIELDS(
        ctf_integer(uint64_t, base, base)
        ctf_integer(uint64_t, exp, exp)
        ctf_integer(uint64_t, mod, mod)
    )
)

#endif /* PROBE_TARGET_TP_H */

#include <lttng/tracepoint-event.h>
