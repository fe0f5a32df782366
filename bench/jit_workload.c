/* A JIT-like workload for bench/bench_jitcapture.py: compiles N small
 * functions at run time and calls each once (or `calls` times).
 *
 *   jit_workload N MODE LOOP SHIM [CALLS]
 *
 * MODE 0: each function in a fresh page, made executable with mprotect
 *         (then unmapped); MODE 1: one page kept writable and executable,
 *         rewritten for each function.
 * LOOP:   iterations of a countdown loop in each function (its work).
 * SHIM 1: capture each page revision in process, FlowJIT's way with a
 *         SIGSEGV handler (the lower bound of a user-space capture: no
 *         ptrace): executable pages are kept non-executable; an execution
 *         fault copies the page and makes it executable and not writable,
 *         a write fault makes it writable and not executable again.
 * Exits 0 when every call returned what was compiled.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <x86intrin.h>

typedef int (*fn_t)(void);

static unsigned char snapshots[64][4096];
static long captured;
static unsigned long long snapshot_ticks;

static void on_fault(int sig, siginfo_t *si, void *uc_) {
    ucontext_t *uc = uc_;
    uintptr_t page = (uintptr_t)si->si_addr & ~(uintptr_t)4095;
    uintptr_t ip = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
    (void)sig;
    if (ip == (uintptr_t)si->si_addr) { /* an execution: copy, then R-X */
        unsigned long long t = __rdtsc();
        memcpy(snapshots[captured++ & 63], (void *)page, 4096);
        mprotect((void *)page, 4096, PROT_READ | PROT_EXEC);
        snapshot_ticks += __rdtsc() - t;
    } else { /* a write: RW-, so the next execution faults */
        mprotect((void *)page, 4096, PROT_READ | PROT_WRITE);
    }
}

static void emit(unsigned char *p, int v, int loop) {
    unsigned char code[] = {
        0xb9, 0, 0, 0, 0,       /* mov ecx, loop */
        0x85, 0xc9,             /* test ecx, ecx */
        0x74, 0x04,             /* je done */
        0xff, 0xc9,             /* l: dec ecx */
        0x75, 0xfc,             /* jne l */
        0xb8, 0, 0, 0, 0,       /* done: mov eax, v */
        0xc3,                   /* ret */
    };
    memcpy(code + 1, &loop, 4);
    memcpy(code + 14, &v, 4);
    memcpy(p, code, sizeof code);
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: jit_workload N MODE LOOP SHIM [CALLS]\n");
        return 2;
    }
    int n = atoi(argv[1]), mode = atoi(argv[2]), loop = atoi(argv[3]), shim = atoi(argv[4]);
    int calls = argc > 5 ? atoi(argv[5]) : 1;
    int exec = shim ? 0 : PROT_EXEC;
    if (shim) {
        struct sigaction sa = {0};
        sa.sa_sigaction = on_fault;
        sa.sa_flags = SA_SIGINFO;
        sigaction(SIGSEGV, &sa, NULL);
    }
    unsigned char *rwx = mmap(NULL, 4096, PROT_READ | PROT_WRITE | exec,
                              MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < n; i++) {
        unsigned char *p = rwx;
        if (mode == 0) {
            p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            emit(p, i, loop);
            mprotect(p, 4096, PROT_READ | exec);
        } else {
            emit(p, i, loop);
        }
        for (int c = 0; c < calls; c++)
            if (((fn_t)p)() != i)
                return 1;
        if (mode == 0)
            munmap(p, 4096);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const char *out = getenv("JIT_WORKLOAD_NS"); /* the loop's own time, for the bench */
    if (out) {
        FILE *f = fopen(out, "w");
        if (f) {
            fprintf(f, "%lld\n", (t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec));
            fclose(f);
        }
    }
    if (shim)
        fprintf(stderr, "captured %ld snapshot_ticks %llu\n", captured, snapshot_ticks);
    return 0;
}
