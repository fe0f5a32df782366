/* LTTng-UST tracepoint provider of the LTTng comparison of Sharma and
 * Dagenais ("Enhanced Userspace and In-Kernel Trace Filtering for Production
 * Systems", JCST 2016, Fig. 13):
 * the artifact's retlif_tp:tpfilt, nine ctf_string fields var0..var8 and one
 * 64-bit integer lyf.  Ten arguments is the most TP_ARGS accepts, which is
 * why their LTTng filter stops at 9 strings + 1 integer.
 *
 * Written with LTTng-UST's original macro names (TRACEPOINT_EVENT, TP_ARGS,
 * ...), which 2.13 still accepts (LTTNG_UST_COMPAT_API), so the same file
 * builds against 2.12 and older. */
#undef TRACEPOINT_PROVIDER
#define TRACEPOINT_PROVIDER retlif_tp

#undef TRACEPOINT_INCLUDE
#define TRACEPOINT_INCLUDE "./retlif_tp.h"

#if !defined(RETLIF_TP_H) || defined(TRACEPOINT_HEADER_MULTI_READ)
#define RETLIF_TP_H

#include <lttng/tracepoint.h>
#include <stdint.h>

TRACEPOINT_EVENT(
    retlif_tp,
    tpfilt,
    TP_ARGS(
        const char *, var0, const char *, var1, const char *, var2,
        const char *, var3, const char *, var4, const char *, var5,
        const char *, var6, const char *, var7, const char *, var8,
        int64_t, lyf
    ),
    TP_FIELDS(
        ctf_string(var0, var0)
        ctf_string(var1, var1)
        ctf_string(var2, var2)
        ctf_string(var3, var3)
        ctf_string(var4, var4)
        ctf_string(var5, var5)
        ctf_string(var6, var6)
        ctf_string(var7, var7)
        ctf_string(var8, var8)
        ctf_integer(int64_t, lyf, lyf)
    )
)

#endif /* RETLIF_TP_H */

#include <lttng/tracepoint-event.h>
