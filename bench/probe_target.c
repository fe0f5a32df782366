/* The traced program of bench/bench_probe.py: the per-hit cost of a probe at
 * the entry of a function of about 1 µs.
 *
 *   probe_target [-n N] [-r R] [-t T] [-W WARM] [-k ROUNDS] [-w stdin|signal|PATH]
 *
 * work(base, exp, mod) is iterative (square-and-multiply) modular
 * exponentiation with 128-bit products and a 64-bit exponent, chained ROUNDS
 * times (-k, default 2: ~1 µs a call on the 2-vCPU EPYC this was tuned on).
 * Each of T threads (default 1) calls it WARM times untimed, then R
 * repetitions (default 10) of N calls (default 100000), each repetition timed
 * with CLOCK_MONOTONIC (and the thread's CPU time, which tells a repetition
 * that lost the CPU on a shared machine).  It prints the mean ns per call
 * ± the standard deviation over the T*R repetitions, every repetition, the
 * number of calls of work() (the hits a probe on it must count) and the
 * checksum of all results (the same for the same N, R, T, WARM, ROUNDS,
 * whatever traces the run).
 *
 * -w holds the timing back until a tool has attached to the running
 * process: "stdin" prints "ready PID" and waits for a line on stdin,
 * "signal" prints it and waits for SIGUSR1, any other word is a path to wait
 * for (polled every ms).
 *
 * Built with -DWITH_LTTNG (and -llttng-ust -ldl), work() starts with the
 * LTTng-UST static tracepoint hwtrace_bench:work_entry (probe_target_tp.h),
 * and the output says whether a session had it enabled when timing began. */
#define _GNU_SOURCE
#ifdef WITH_LTTNG
#define TRACEPOINT_CREATE_PROBES
#define TRACEPOINT_DEFINE
#include "probe_target_tp.h"
#endif

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* 2^63 - 25, the largest prime below 2^63. */
#define MODULUS UINT64_C(0x7FFFFFFFFFFFFFE7)

static inline uint64_t mulmod(uint64_t a, uint64_t b, uint64_t m) {
    return (uint64_t)((unsigned __int128)a * b % m);
}

/* Exponentiations chained in one call of work(): 2 makes a call ~1 µs on
 * the 2-vCPU EPYC this was tuned on (one 64-bit exponentiation is ~490 ns). */
static long work_rounds = 2;

/* The probed function.  noclone: with a constant argument gcc would
 * otherwise call a work.constprop.0 clone and a probe on `work` would
 * never fire; used: it stays a symbol of its own. */
__attribute__((noinline, noclone, used)) uint64_t work(uint64_t base, uint64_t exp, uint64_t mod) {
#ifdef WITH_LTTNG
    tracepoint(hwtrace_bench, work_entry, base, exp, mod);
#endif
    uint64_t result = base % mod;
    for (long k = 0; k < work_rounds; k++) {
        uint64_t b = result, e = exp;
        result = 1 % mod;
        while (e) {
            if (e & 1)
                result = mulmod(result, b, mod);
            b = mulmod(b, b, mod);
            e >>= 1;
        }
    }
    return result;
}

struct thread_arg {
    pthread_t thread;
    int index;
    double *wall_ns; /* per repetition, ns per call */
    double *cpu_ns;
    uint64_t checksum;
};

static long n_calls = 100000, reps = 10, warm = 20000;
static int n_threads = 1;
static uint64_t modulus = MODULUS;
static pthread_barrier_t barrier;

static double clock_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* Arguments of the i-th call of a thread: the exponent keeps its top bit set
 * so every call squares 64 times per round; its other bits vary (Fibonacci
 * hashing) as the base does. */
static inline uint64_t call(uint64_t seed, uint64_t i) {
    uint64_t exp = (UINT64_C(1) << 63) | (i + seed) * UINT64_C(0x9E3779B97F4A7C15);
    return work(seed + i + 2, exp, modulus);
}

static void *thread_main(void *p) {
    struct thread_arg *a = p;
    uint64_t seed = (uint64_t)a->index << 40, i = 0, sum = 0;
    for (long k = 0; k < warm; k++)
        sum += call(seed, i++);
    for (long r = 0; r < reps; r++) {
        pthread_barrier_wait(&barrier);
        double c0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
        double t0 = clock_ns(CLOCK_MONOTONIC);
        for (long k = 0; k < n_calls; k++)
            sum += call(seed, i++);
        double t1 = clock_ns(CLOCK_MONOTONIC);
        double c1 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
        a->wall_ns[r] = (t1 - t0) / (double)n_calls;
        a->cpu_ns[r] = (c1 - c0) / (double)n_calls;
    }
    a->checksum = sum;
    return NULL;
}

static void wait_for_go(const char *how) {
    if (strcmp(how, "stdin") == 0) {
        printf("ready %d\n", (int)getpid());
        fflush(stdout);
        char line[64];
        if (!fgets(line, sizeof line, stdin)) {
            fprintf(stderr, "probe_target: stdin closed before the go line\n");
            exit(3);
        }
    } else if (strcmp(how, "signal") == 0) {
        sigset_t set;
        int sig;
        sigemptyset(&set);
        sigaddset(&set, SIGUSR1);
        /* Blocked before "ready" is printed, so an early signal stays pending. */
        pthread_sigmask(SIG_BLOCK, &set, NULL);
        printf("ready %d\n", (int)getpid());
        fflush(stdout);
        sigwait(&set, &sig);
    } else {
        printf("ready %d\n", (int)getpid());
        fflush(stdout);
        while (access(how, F_OK) != 0)
            usleep(1000);
    }
}

static long parse_long(const char *s, const char *what, long min) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 0);
    if (errno || *end || v < min) {
        fprintf(stderr, "probe_target: bad %s: %s\n", what, s);
        exit(2);
    }
    return v;
}

static void summarize(const char *label, const double *v, long count) {
    double sum = 0, sq = 0;
    for (long k = 0; k < count; k++)
        sum += v[k];
    double mean = sum / (double)count;
    for (long k = 0; k < count; k++)
        sq += (v[k] - mean) * (v[k] - mean);
    double sd = count > 1 ? sqrt(sq / (double)(count - 1)) : 0.0;
    printf("%s: %.3f ± %.3f\n", label, mean, sd);
    printf("%s_reps:", label);
    for (long k = 0; k < count; k++)
        printf(" %.3f", v[k]);
    printf("\n");
}

int main(int argc, char **argv) {
    const char *wait_how = NULL;
    int opt;
    while ((opt = getopt(argc, argv, "n:r:t:W:k:w:")) != -1) {
        switch (opt) {
        case 'n': n_calls = parse_long(optarg, "-n", 1); break;
        case 'r': reps = parse_long(optarg, "-r", 1); break;
        case 't': n_threads = (int)parse_long(optarg, "-t", 1); break;
        case 'W': warm = parse_long(optarg, "-W", 0); break;
        case 'k': work_rounds = parse_long(optarg, "-k", 1); break;
        case 'w': wait_how = optarg; break;
        default:
            fprintf(stderr, "usage: %s [-n N] [-r R] [-t T] [-W WARM] [-k ROUNDS] "
                            "[-w stdin|signal|PATH]\n", argv[0]);
            return 2;
        }
    }
    if (wait_how)
        wait_for_go(wait_how);
#ifdef WITH_LTTNG
    /* Whether a session's probe is connected now that timing begins (the
     * session daemon pushes it while liblttng-ust's constructor waits). */
    printf("lttng_enabled: %d\n", tracepoint_enabled(hwtrace_bench, work_entry) ? 1 : 0);
#endif
    struct thread_arg *args = calloc((size_t)n_threads, sizeof *args);
    double *wall = calloc((size_t)(n_threads * reps), sizeof *wall);
    double *cpu = calloc((size_t)(n_threads * reps), sizeof *cpu);
    if (!args || !wall || !cpu) {
        perror("calloc");
        return 1;
    }
    pthread_barrier_init(&barrier, NULL, (unsigned)n_threads);
    for (int t = 0; t < n_threads; t++) {
        args[t].index = t;
        args[t].wall_ns = wall + t * reps;
        args[t].cpu_ns = cpu + t * reps;
        int err = pthread_create(&args[t].thread, NULL, thread_main, &args[t]);
        if (err) {
            fprintf(stderr, "pthread_create: %s\n", strerror(err));
            return 1;
        }
    }
    uint64_t checksum = 0;
    for (int t = 0; t < n_threads; t++) {
        pthread_join(args[t].thread, NULL);
        checksum += args[t].checksum;
    }
    printf("config: n=%ld reps=%ld threads=%d warm=%ld rounds=%ld\n", n_calls, reps, n_threads,
           warm, work_rounds);
    summarize("ns_per_call", wall, n_threads * reps);
    summarize("cpu_ns_per_call", cpu, n_threads * reps);
    printf("calls: %ld\n", (long)n_threads * (warm + n_calls * reps));
    printf("checksum: 0x%016" PRIx64 "\n", checksum);
    return 0;
}
