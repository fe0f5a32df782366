/* Timing loops for bench/bench_filter.py: every tier is called n times in a
 * native loop through a function pointer read from a volatile, so the
 * compiler can neither inline nor hoist the call (the C baseline pays the
 * same indirect call as the JIT and the LLVM tier).  One CLOCK_MONOTONIC
 * span around the loop, as the benchmarks published with Sharma and
 * Dagenais's "Enhanced Userspace and In-Kernel Trace Filtering for Production
 * Systems" (JCST 2016, libebpf-benchmarks); returns ns per call.
 * Out parameters (each may be NULL): *verdicts, how many calls returned
 * nonzero; *cpu_ns, the thread's CPU time per call over the same span
 * (CLOCK_THREAD_CPUTIME_ID), so the caller can tell a run during which the
 * thread was preempted (wall time well above CPU time) on a shared machine.
 *
 *   double time_fn(f, event, ctx, n, verdicts, cpu_ns)       f(event, ctx)
 *   double time_interp(run, program, event, ctx, n, verdicts, cpu_ns)
 *                                                      run(program, event, ctx)
 *
 * The hand-written C filters (that paper's SIMPLE) are generated per
 * predicate count by bench_filter.py and compiled into the same library. */
#include <stdint.h>
#include <time.h>

typedef int64_t (*filter_fn)(const void *event, const void *context);
typedef int64_t (*run_fn)(const void *program, const void *event, const void *context);

static double clock_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static double finish(double t0, double c0, int64_t n, int64_t hits, int64_t *verdicts,
                     double *cpu_ns) {
    double t1 = clock_ns(CLOCK_MONOTONIC);
    double c1 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    if (verdicts)
        *verdicts = hits;
    if (cpu_ns)
        *cpu_ns = n > 0 ? (c1 - c0) / (double)n : 0.0;
    return n > 0 ? (t1 - t0) / (double)n : 0.0;
}

double time_fn(uint64_t fn, const void *event, const void *context, int64_t n,
               int64_t *verdicts, double *cpu_ns) {
    filter_fn volatile f = (filter_fn)(uintptr_t)fn;
    int64_t hits = 0;
    double c0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    double t0 = clock_ns(CLOCK_MONOTONIC);
    for (int64_t i = 0; i < n; i++)
        hits += f(event, context) != 0;
    return finish(t0, c0, n, hits, verdicts, cpu_ns);
}

double time_interp(uint64_t run, const void *program, const void *event, const void *context,
                   int64_t n, int64_t *verdicts, double *cpu_ns) {
    run_fn volatile r = (run_fn)(uintptr_t)run;
    int64_t hits = 0;
    double c0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    double t0 = clock_ns(CLOCK_MONOTONIC);
    for (int64_t i = 0; i < n; i++)
        hits += r(program, event, context) != 0;
    return finish(t0, c0, n, hits, verdicts, cpu_ns);
}

/* The cost of the loop and the indirect call alone (that paper's CLEAN: no
 * filter work), for reading the other numbers. */
int64_t filter_nop(const void *event, const void *context) {
    (void)event;
    (void)context;
    return 1;
}
