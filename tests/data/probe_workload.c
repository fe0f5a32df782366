/* A multithreaded target for hwtrace's dynamic tracepoint tests.
 *
 * Commands on stdin, one per line:
 *   run N    every thread calls each traced function N times; prints
 *            "done CHECKSUM" when all threads are done
 *   spin     threads call the functions until "stop" (for live patching)
 *   stop     end a spin; prints "done CHECKSUM CALLS", then a line
 *            "thread K CALLS CHECKSUM" per thread
 *   sum K N  the checksum thread K makes in N calls (computed here, by main)
 *   fork N   a child process makes thread 0's N calls; prints "child CHECKSUM"
 *   signals  prints "signals N": the SIGUSR1s the main thread handled
 *   quit
 * A second argument "blocktrap" makes the worker threads block SIGTRAP.
 * The checksum depends only on the calls made, so a traced run must print
 * the untraced run's checksum.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAXT 16

/* Short instructions first: a jump here covers five of them, each start
 * a trap the redirect handler must send to its relocated copy. */
__attribute__((noinline, used)) uint64_t shorties(uint64_t x);
__asm__(
    ".text\n.globl shorties\n.type shorties,@function\nshorties:\n"
    "  push %rbx\n"          /* 1 byte */
    "  mov %rdi, %rax\n"     /* 3 bytes */
    "  inc %rax\n"           /* 3 bytes */
    "  pop %rbx\n"           /* 1 byte */
    "  xor %edx, %edx\n"     /* 2 bytes */
    "  add %rdx, %rax\n"
    "  ret\n"
    ".size shorties, .-shorties\n");

/* A loop whose back edge lands on the second instruction of a window
 * starting at loop_into_window: every iteration takes the trap path. */
__attribute__((noinline, used)) uint64_t loop_into_window(uint64_t n);
__asm__(
    ".text\n.globl loop_into_window\n.type loop_into_window,@function\n"
    "loop_into_window:\n"
    "  xor %eax, %eax\n"     /* 2 bytes: the site */
    "1:\n"
    "  add %rdi, %rax\n"     /* 3 bytes: a branch target inside the window */
    "  dec %rdi\n"           /* 3 bytes */
    "  jnz 1b\n"
    "  ret\n"
    ".size loop_into_window, .-loop_into_window\n");

/* A leaf that keeps data in the red zone across the tracepoint. */
__attribute__((noinline, used)) uint64_t red_zone(uint64_t x);
__asm__(
    ".text\n.globl red_zone\n.type red_zone,@function\nred_zone:\n"
    "  mov %rdi, -8(%rsp)\n"
    "  mov %rdi, -16(%rsp)\n"
    "  lea 3(%rdi), %rax\n"  /* a tracepoint here must not touch [rsp-16, rsp) */
    "  add -8(%rsp), %rax\n"
    "  add -16(%rsp), %rax\n"
    "  ret\n"
    ".size red_zone, .-red_zone\n");

/* Recursion: every level's return must find its own return address. */
__attribute__((noinline, used)) uint64_t depth(uint64_t n) {
    if (n == 0) return 1;
    uint64_t r = depth(n - 1);
    __asm__ volatile("" : "+r"(r)); /* keep it a real recursion */
    return r * 3 + n;
}

/* longjmp out of a function whose return was hooked: that frame never
 * returns, and later calls must not be confused by it. */
static __thread jmp_buf unwind;
__attribute__((noinline, used)) void thrower(uint64_t n) {
    if (n % 3 == 0) longjmp(unwind, 1);
    __asm__ volatile("");
}
__attribute__((noinline, used)) uint64_t jumper(uint64_t n) {
    if (setjmp(unwind)) return 7;
    thrower(n);
    return n;
}

/* Starts with xbegin, which cannot run out of line (its abort address is
 * relative): a tracepoint here falls back to a kernel uprobe.  Never
 * called (not every CPU has RTM). */
__attribute__((noinline, used)) void transaction(void);
__asm__(
    ".text\n.globl transaction\n.type transaction,@function\ntransaction:\n"
    "  xbegin 1f\n"
    "  xend\n"
    "1:\n"
    "  ret\n"
    ".size transaction, .-transaction\n");

static volatile uint64_t global_bias = 7;

__attribute__((noinline, used)) uint64_t work(uint64_t x) {
    uint64_t r = global_bias;
    for (int i = 0; i < 20; i++) r = r * 6364136223846793005ULL + x + (uint64_t)i;
    return r;
}

static int nthreads = 2;
static pthread_barrier_t started, start_line, finish_line;
static volatile int command;       /* 1 run, 2 spin, 3 quit */
static volatile int spinning;
static uint64_t iterations;
static uint64_t sums[MAXT], calls[MAXT];

static uint64_t one(uint64_t i) {
    return work(i) ^ shorties(i) ^ (loop_into_window(i % 7 + 1) << 1) ^ (red_zone(i) << 2) ^
           (depth(i % 5) << 3) ^ (jumper(i) << 4);
}

static int block_trap;
static volatile sig_atomic_t usr1;

static void on_usr1(int sig) {
    (void)sig;
    usr1++;
}

static void *worker(void *arg) {
    int me = (int)(intptr_t)arg;
    if (block_trap) {
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, SIGTRAP);
        pthread_sigmask(SIG_BLOCK, &set, NULL);
    }
    /* Running with its own signal mask (a new thread starts with all
     * signals blocked until glibc sets its mask): "ready" waits for it. */
    pthread_barrier_wait(&started);
    for (;;) {
        pthread_barrier_wait(&start_line);
        if (command == 3) return NULL;
        uint64_t s = 0, n = 0;
        if (command == 1) {
            for (uint64_t i = 0; i < iterations; i++) s += one(i + (uint64_t)me * 1000003);
            n = iterations;
        } else {
            while (spinning) { s += one(n + (uint64_t)me * 1000003); n++; }
        }
        sums[me] = s;
        calls[me] = n;
        pthread_barrier_wait(&finish_line);
    }
}

int main(int argc, char **argv) {
    if (argc > 1) nthreads = atoi(argv[1]);
    if (argc > 2 && !strcmp(argv[2], "blocktrap")) block_trap = 1;
    if (nthreads < 1 || nthreads > MAXT) nthreads = 2;
    pthread_t t[MAXT];
    pthread_barrier_init(&started, NULL, (unsigned)nthreads + 1);
    pthread_barrier_init(&start_line, NULL, (unsigned)nthreads + 1);
    pthread_barrier_init(&finish_line, NULL, (unsigned)nthreads + 1);
    for (int i = 0; i < nthreads; i++) pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i);
    pthread_barrier_wait(&started);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, NULL);
    printf("ready %d\n", getpid());
    fflush(stdout);
    char line[128];
    while (fgets(line, sizeof line, stdin)) {
        if (!strncmp(line, "run ", 4)) {
            iterations = strtoull(line + 4, NULL, 10);
            command = 1;
        } else if (!strncmp(line, "spin", 4)) {
            spinning = 1;
            command = 2;
            pthread_barrier_wait(&start_line);
            printf("spinning\n");
            fflush(stdout);
            continue;
        } else if (!strncmp(line, "stop", 4)) {
            spinning = 0;
            pthread_barrier_wait(&finish_line);
            uint64_t s = 0, n = 0;
            for (int i = 0; i < nthreads; i++) { s += sums[i]; n += calls[i]; }
            printf("done %llu %llu\n", (unsigned long long)s, (unsigned long long)n);
            for (int i = 0; i < nthreads; i++)
                printf("thread %d %llu %llu\n", i, (unsigned long long)calls[i],
                       (unsigned long long)sums[i]);
            fflush(stdout);
            continue;
        } else if (!strncmp(line, "fork ", 5)) {
            uint64_t n = strtoull(line + 5, NULL, 10);
            int fds[2];
            if (pipe(fds)) return 1;
            pid_t child = fork();
            if (child == 0) {
                uint64_t s = 0;
                for (uint64_t i = 0; i < n; i++) s += one(i);
                if (write(fds[1], &s, sizeof s) != sizeof s) _exit(1);
                _exit(0);
            }
            uint64_t s = 0;
            close(fds[1]);
            if (read(fds[0], &s, sizeof s) != sizeof s) s = 0;
            close(fds[0]);
            int status;
            waitpid(child, &status, 0);
            printf("child %llu %d\n", (unsigned long long)s, status);
            fflush(stdout);
            continue;
        } else if (!strncmp(line, "signals", 7)) {
            printf("signals %d\n", (int)usr1);
            fflush(stdout);
            continue;
        } else if (!strncmp(line, "sum ", 4)) {
            char *end;
            uint64_t k = strtoull(line + 4, &end, 10), n = strtoull(end, NULL, 10), s = 0;
            for (uint64_t i = 0; i < n; i++) s += one(i + k * 1000003);
            printf("sum %llu\n", (unsigned long long)s);
            fflush(stdout);
            continue;
        } else {
            break;
        }
        pthread_barrier_wait(&start_line);
        pthread_barrier_wait(&finish_line);
        uint64_t s = 0, n = 0;
        for (int i = 0; i < nthreads; i++) { s += sums[i]; n += calls[i]; }
        printf("done %llu %llu\n", (unsigned long long)s, (unsigned long long)n);
        fflush(stdout);
    }
    command = 3;
    pthread_barrier_wait(&start_line);
    for (int i = 0; i < nthreads; i++) pthread_join(t[i], NULL);
    return 0;
}
