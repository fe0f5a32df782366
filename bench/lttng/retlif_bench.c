/* The LTTng comparison of bench/bench_lttng.py (Fig. 13 of Sharma and
 * Dagenais, "Enhanced Userspace and In-Kernel Trace Filtering for Production
 * Systems", JCST 2016), as a
 * shared library that Python loads with ctypes, so hwtrace's JIT-compiled
 * filter (machine code in the same process) can guard the tracepoint.
 *
 * The library holds the tracepoint provider retlif_tp:tpfilt (retlif_tp.h)
 * and the timed loops.  Every loop fires, or offers to fire, the tracepoint
 * n times with var0..var8 = "str0".."str8" and lyf = 42 (TRUE-biased) or 43
 * (FALSE-biased), inside one CLOCK_MONOTONIC span (the artifact's method);
 * the thread's CPU time over the same span is returned too, so the caller
 * can tell a run during which the thread lost the CPU on a shared machine.
 *
 *   run_plain(n, bias, cpu)     tracepoint every iteration: LTTng decides
 *                               (its --filter, no filter, or disabled)
 *   run_guarded(f, n, bias, fired, cpu)
 *                               if (f(&event, NULL)) tracepoint(...): a
 *                               native filter (hwtrace's eBPF JIT, LLVM tier,
 *                               or simple_filter below) guards the call
 *   run_guarded_interp(run, program, n, bias, fired, cpu)
 *                               the same through an interpreter,
 *                               run(program, &event, NULL)
 *
 * *fired counts the guard's nonzero verdicts: n (TRUE) or 0 (FALSE). */
#define TRACEPOINT_CREATE_PROBES
#define TRACEPOINT_DEFINE
#include "retlif_tp.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

/* The event record the filters read: hwtrace's Schema.declare of nine
 * `string` (char *) fields and one s64, laid out as this C struct. */
struct retlif_event {
    const char *var0, *var1, *var2, *var3, *var4, *var5, *var6, *var7, *var8;
    int64_t lyf;
};

typedef int64_t (*filter_fn)(const void *event, const void *context);
typedef int64_t (*run_fn)(const void *program, const void *event, const void *context);

#define FIRE(e)                                                                          \
    tracepoint(retlif_tp, tpfilt, (e)->var0, (e)->var1, (e)->var2, (e)->var3, (e)->var4, \
               (e)->var5, (e)->var6, (e)->var7, (e)->var8, (e)->lyf)

static void fill(struct retlif_event *e, int true_bias) {
    e->var0 = "str0";
    e->var1 = "str1";
    e->var2 = "str2";
    e->var3 = "str3";
    e->var4 = "str4";
    e->var5 = "str5";
    e->var6 = "str6";
    e->var7 = "str7";
    e->var8 = "str8";
    e->lyf = true_bias ? 42 : 43;
}

static double clock_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static double finish(double t0, double c0, int64_t n, double *cpu_ns) {
    double t1 = clock_ns(CLOCK_MONOTONIC);
    double c1 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    if (cpu_ns)
        *cpu_ns = n > 0 ? (c1 - c0) / (double)n : 0.0;
    return n > 0 ? (t1 - t0) / (double)n : 0.0;
}

double run_plain(int64_t n, int true_bias, double *cpu_ns) {
    struct retlif_event e;
    fill(&e, true_bias);
    double c0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    double t0 = clock_ns(CLOCK_MONOTONIC);
    for (int64_t i = 0; i < n; i++)
        FIRE(&e);
    return finish(t0, c0, n, cpu_ns);
}

double run_guarded(uint64_t fn, int64_t n, int true_bias, int64_t *fired, double *cpu_ns) {
    filter_fn f = (filter_fn)(uintptr_t)fn;
    struct retlif_event e;
    int64_t hits = 0;
    fill(&e, true_bias);
    double c0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    double t0 = clock_ns(CLOCK_MONOTONIC);
    for (int64_t i = 0; i < n; i++) {
        if (f(&e, NULL)) {
            hits++;
            FIRE(&e);
        }
    }
    double ns = finish(t0, c0, n, cpu_ns);
    if (fired)
        *fired = hits;
    return ns;
}

double run_guarded_interp(uint64_t run, uint64_t program, int64_t n, int true_bias,
                          int64_t *fired, double *cpu_ns) {
    run_fn r = (run_fn)(uintptr_t)run;
    const void *prog = (const void *)(uintptr_t)program;
    struct retlif_event e;
    int64_t hits = 0;
    fill(&e, true_bias);
    double c0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    double t0 = clock_ns(CLOCK_MONOTONIC);
    for (int64_t i = 0; i < n; i++) {
        if (r(prog, &e, NULL)) {
            hits++;
            FIRE(&e);
        }
    }
    double ns = finish(t0, c0, n, cpu_ns);
    if (fired)
        *fired = hits;
    return ns;
}

/* Sharma and Dagenais's SIMPLE filter (hand-written C, libc strcmp), the lower bound
 * a compiled filter is measured against. */
int64_t simple_filter(const void *event, const void *context) {
    const struct retlif_event *e = event;
    (void)context;
    return strcmp(e->var0, "str0") == 0 && strcmp(e->var1, "str1") == 0 &&
           strcmp(e->var2, "str2") == 0 && strcmp(e->var3, "str3") == 0 &&
           strcmp(e->var4, "str4") == 0 && strcmp(e->var5, "str5") == 0 &&
           strcmp(e->var6, "str6") == 0 && strcmp(e->var7, "str7") == 0 &&
           strcmp(e->var8, "str8") == 0 && e->lyf == 42;
}

/* Whether LTTng has attached a probe to the tracepoint (an enabled event in
 * some session), so the caller can wait for the session daemon's update. */
int tp_enabled(void) { return tracepoint_enabled(retlif_tp, tpfilt) ? 1 : 0; }

/* The layout, for checking it against the hwtrace Schema. */
int64_t event_size(void) { return (int64_t)sizeof(struct retlif_event); }
int64_t lyf_offset(void) { return (int64_t)offsetof(struct retlif_event, lyf); }

/* An event of each bias, to check every filter's verdict before timing. */
static struct retlif_event sample_true, sample_false;
const void *sample_event(int true_bias) {
    struct retlif_event *e = true_bias ? &sample_true : &sample_false;
    fill(e, true_bias);
    return e;
}
