"""Programs that exercise a recorder's hard cases: threads, deep and
indirect recursion, setjmp/longjmp, signal handlers (on an alternate
stack, and left with siglongjmp), C++ exceptions and code loaded with
dlopen.

Each is deterministic, runs a few hundred thousand to a few million
instructions natively and prints one checksum line, so a recorded (or
valgrind-run) process can be checked against a native run: see
:func:`expected_output`.  They are built with the cached builder of the
software recorder's tests (:func:`test_record_software.compile_program`).
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

from test_record_software import compile_program

# -O1 keeps every noinline function a function of its own (no cloning, no
# sibling calls) and still compiles a dense switch to a jump table.
FLAGS = ("-O1", "-g0", "-fno-omit-frame-pointer")

THREADS = r"""
#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
#define NOINLINE __attribute__((noinline))

/* Branchy loop: Collatz step counts. */
NOINLINE static unsigned long collatz_total(unsigned long upto) {
    unsigned long total = 0;
    for (unsigned long start = 1; start <= upto; start++) {
        unsigned long n = start;
        while (n != 1) {
            n = (n & 1) ? 3 * n + 1 : n / 2;
            total++;
        }
    }
    return total;
}

/* Recursion. */
NOINLINE static unsigned long fib(unsigned n) {
    return n < 2 ? n : fib(n - 1) + fib(n - 2);
}

/* Nested recursion: ackermann(2, n), about 2 n^2 calls, n deep. */
NOINLINE static unsigned long ackermann(unsigned long m, unsigned long n) {
    if (m == 0)
        return n + 1;
    if (n == 0)
        return ackermann(m - 1, 1);
    return ackermann(m - 1, ackermann(m, n - 1));
}

/* Loads and stores: a sieve. */
NOINLINE static unsigned long sieve(unsigned long upto) {
    static unsigned char composite[20001];
    unsigned long count = 0, sum = 0;
    for (unsigned long i = 2; i <= upto; i++) {
        if (composite[i])
            continue;
        count++;
        sum += i;
        for (unsigned long j = i * i; j <= upto; j += i)
            composite[j] = 1;
    }
    return count * 1000003 + sum;
}

struct job {
    int kind;
    unsigned long arg, result;
};

/* Every thread's path must not depend on how the threads interleave (a
 * recorder's log is compared with another's, instruction for instruction):
 * workers report through a pipe, one byte each, and then block until the
 * process exits; main never joins (pthread_join's path depends on whether
 * the thread has already ended), reads the bytes one at a time and gives
 * the workers 200 ms to reach their blocking read before it exits (a
 * worker killed on the way there would have run less). */
static int done[2], never[2];

static void *worker(void *p) {
    struct job *job = p;
    char c;
    switch (job->kind) {
    case 0: job->result = collatz_total(job->arg); break;
    case 1: job->result = fib((unsigned)job->arg); break;
    case 2: job->result = ackermann(2, job->arg); break;
    default: job->result = sieve(job->arg); break;
    }
    if (write(done[1], "x", 1) != 1)
        return NULL;
    while (read(never[0], &c, 1) != 0)
        ;
    return NULL;
}

int main(void) {
    struct job jobs[4] = {{0, 1500, 0}, {1, 20, 0}, {2, 120, 0}, {3, 20000, 0}};
    pthread_t tids[4];
    char c;
    if (pipe(done) != 0 || pipe(never) != 0)
        return 1;
    for (int i = 0; i < 4; i++)
        if (pthread_create(&tids[i], NULL, worker, &jobs[i]) != 0)
            return 1;
    unsigned long checksum = 0;
    for (int i = 0; i < 4; i++)
        if (read(done[0], &c, 1) != 1)
            return 1;
    struct timespec settle = {0, 200000000};
    nanosleep(&settle, NULL);
    for (int i = 0; i < 4; i++)
        checksum = checksum * 31 + jobs[i].result;
    printf("threads %lu %lu %lu %lu checksum %lu\n", jobs[0].result, jobs[1].result,
           jobs[2].result, jobs[3].result, checksum);
    return 0;
}
"""

RECURSION = r"""
#include <stdio.h>
#include <stdlib.h>
#define NOINLINE __attribute__((noinline))

static long depth, max_depth;

/* Not a tail call, and no accumulator the compiler could turn into a
 * loop: deeper than a 64-entry return stack. */
NOINLINE static unsigned long deep(unsigned long n) {
    if (++depth > max_depth)
        max_depth = depth;
    unsigned long r = n == 0 ? 7 : deep(n - 1);
    depth--;
    return (r ^ (r >> 3)) + n;
}

/* Mutual recursion. */
NOINLINE static unsigned long odd_walk(unsigned long n);
NOINLINE static unsigned long even_walk(unsigned long n) {
    if (n == 0)
        return 1;
    unsigned long r = odd_walk(n - 1);
    return r * 3 ^ n;
}
NOINLINE static unsigned long odd_walk(unsigned long n) {
    if (n == 0)
        return 2;
    unsigned long r = even_walk(n - 1);
    return r + (n & 7);
}

/* A dense switch: a jump table. */
NOINLINE static unsigned long dispatch(unsigned op, unsigned long x) {
    switch (op) {
    case 0: return x + 1;
    case 1: return x * 3;
    case 2: return x ^ 0x5a5a;
    case 3: return x >> 1;
    case 4: return x - 7;
    case 5: return x | 0x100;
    case 6: return x * x % 10007;
    case 7: return x + (x >> 4);
    case 8: return ~x & 0xffff;
    default: return x;
    }
}

/* Calls through function pointers, and recursion through one. */
typedef unsigned long (*op_fn)(unsigned long);
NOINLINE static unsigned long add_five(unsigned long x) { return x + 5; }
NOINLINE static unsigned long twice(unsigned long x) { return x * 2; }
NOINLINE static unsigned long rotate(unsigned long x) { return (x << 7) | (x >> 57); }
static op_fn const ops[3] = {add_five, twice, rotate};
static op_fn volatile self_ref;

NOINLINE static unsigned long tree(unsigned long n) {
    if (n < 2)
        return n + 1;
    return self_ref(n - 1) + self_ref(n - 2) + (n & 1);
}

int main(int argc, char **argv) {
    (void)argv;
    unsigned long checksum = 0;
    for (int round = 0; round < 20; round++) {
        checksum = checksum * 33 + deep(300 + round + argc);
        checksum += even_walk(250 + round);
    }
    unsigned long x = 12345;
    for (unsigned i = 0; i < 20000; i++) {
        x = dispatch((i * 7 + (unsigned)(x & 3)) % 10, x);
        x = ops[(x + i) % 3](x) & 0xffffffffUL;
    }
    self_ref = tree;
    checksum ^= x + tree(18);
    printf("recursion max_depth %ld checksum %lu\n", max_depth, checksum);
    return 0;
}
"""

LONGJMP = r"""
#include <setjmp.h>
#include <stdio.h>
#define NOINLINE __attribute__((noinline))

static jmp_buf outer, inner;
static volatile unsigned long work;

/* Calls itself down to `target`, then longjmps: out of every level. */
NOINLINE static void descend(int level, int target, jmp_buf *to) {
    for (int i = 0; i < 8; i++)
        work = work * 5 + (unsigned long)(level ^ i);
    if (level == target)
        longjmp(*to, level + 1);
    descend(level + 1, target, to);
    work += 1000000; /* never reached */
}

/* Sets a jump buffer of its own and goes down further; a longjmp to the
 * outer buffer skips this frame's buffer. */
NOINLINE static int middle(int target, int skip_inner) {
    int got = setjmp(inner);
    if (got != 0)
        return got * 100;
    descend(0, target, skip_inner ? &outer : &inner);
    return -1;
}

int main(void) {
    static const int targets[] = {0, 3, 17, 90, 250, 5};
    static unsigned long checksum; /* in memory across the longjmps */
    for (int i = 0; i < 6 * 40; i++) {
        volatile int round = i % 6;
        int got = setjmp(outer);
        if (got == 0) {
            int r = middle(targets[round], round & 1);
            checksum = checksum * 7 + (unsigned long)r;
        } else {
            checksum = checksum * 11 + (unsigned long)got;
        }
    }
    printf("longjmp work %lu checksum %lu\n", work, checksum);
    return 0;
}
"""

SIGNALS = r"""
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <unistd.h>
#define NOINLINE __attribute__((noinline))

static volatile sig_atomic_t alarms, usr1s;
static volatile unsigned long handler_work, on_alt_stack;
static char *alt_base;
static sigjmp_buf escape;

NOINLINE static unsigned long mix(unsigned long x, int rounds) {
    for (int i = 0; i < rounds; i++)
        x = (x ^ (x >> 7)) * 0x9e3779b97f4a7c15UL + (unsigned long)i;
    return x;
}

static void on_alarm(int sig) {
    handler_work += mix((unsigned long)sig + alarms, 3000);
    alarms++;
}

static void on_usr1(int sig) {
    char here;
    handler_work += mix((unsigned long)sig * 3 + usr1s, 1000);
    usr1s++;
    if (alt_base && &here >= alt_base && &here < alt_base + SIGSTKSZ * 4)
        on_alt_stack++;
}

/* Leaves the handler for the sigsetjmp in main. */
static void on_usr2(int sig) {
    handler_work += mix((unsigned long)sig, 100);
    siglongjmp(escape, 1);
}

NOINLINE static void raise_from(int level) {
    if (level > 0) {
        raise_from(level - 1);
        handler_work += 1; /* never reached once level 0 raised */
        return;
    }
    raise(SIGUSR2);
}

static void install(int sig, void (*fn)(int), int flags) {
    struct sigaction sa = {0};
    sa.sa_handler = fn;
    sa.sa_flags = flags;
    sigemptyset(&sa.sa_mask);
    if (sigaction(sig, &sa, NULL) != 0)
        exit(2);
}

int main(void) {
    install(SIGALRM, on_alarm, SA_RESTART);
    install(SIGUSR1, on_usr1, SA_RESTART);
    install(SIGUSR2, on_usr2, 0);

    /* raise and kill, on the normal stack. */
    for (int i = 0; i < 12; i++) {
        raise(SIGUSR1);
        kill(getpid(), SIGUSR1);
    }

    /* One-shot interval timers, each waited for with SIGALRM blocked
     * until sigsuspend: exactly one handler run per timer. */
    sigset_t block, waiting;
    sigemptyset(&block);
    sigaddset(&block, SIGALRM);
    sigprocmask(SIG_BLOCK, &block, &waiting);
    sigdelset(&waiting, SIGALRM);
    for (int i = 0; i < 3; i++) {
        struct itimerval t = {{0, 0}, {0, 2000}};
        int before = alarms;
        setitimer(ITIMER_REAL, &t, NULL);
        while (alarms == before)
            sigsuspend(&waiting);
    }
    sigprocmask(SIG_UNBLOCK, &block, NULL);

    /* The SIGUSR1 handler again, on an alternate stack. */
    stack_t ss = {0};
    alt_base = malloc(SIGSTKSZ * 4);
    ss.ss_sp = alt_base;
    ss.ss_size = SIGSTKSZ * 4;
    if (sigaltstack(&ss, NULL) != 0)
        return 3;
    install(SIGUSR1, on_usr1, SA_RESTART | SA_ONSTACK);
    for (int i = 0; i < 12; i++)
        raise(SIGUSR1);

    /* Handlers left with siglongjmp, from different depths; the saved
     * mask is restored, so SIGUSR2 can come again. */
    volatile int escapes = 0;
    for (volatile int depth = 0; depth < 40; depth += 13) {
        if (sigsetjmp(escape, 1) == 0)
            raise_from(depth);
        else
            escapes++;
    }
    printf("signals alarms %d usr1 %d alt %lu escapes %d checksum %lu\n", (int)alarms,
           (int)usr1s, on_alt_stack, escapes, handler_work);
    return 0;
}
"""

CXX_EXCEPTIONS = r"""
#include <cstdio>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>
#define NOINLINE __attribute__((noinline))

struct ParseError : std::runtime_error {
    explicit ParseError(const std::string &what) : std::runtime_error(what) {}
};

NOINLINE static int parse_digit(char c) {
    if (c < '0' || c > '9')
        throw ParseError(std::string("bad digit ") + c);
    return c - '0';
}

NOINLINE static long parse_number(const std::string &s) {
    long v = 0;
    for (char c : s)
        v = v * 10 + parse_digit(c);
    return v;
}

/* Catches, counts and rethrows. */
static long rethrown;
NOINLINE static long parse_all(const std::vector<std::string> &fields) {
    long sum = 0;
    try {
        for (const auto &f : fields)
            sum += parse_number(f);
    } catch (const ParseError &) {
        rethrown++;
        throw;
    }
    return sum;
}

NOINLINE static long level3(const std::vector<long> &v, size_t i) {
    if (i % 5 == 4)
        throw 42;
    return v.at(i); /* std::out_of_range past the end */
}
NOINLINE static long level2(const std::vector<long> &v, size_t i) { return level3(v, i) * 2 + 1; }
NOINLINE static long level1(const std::vector<long> &v, size_t i) { return level2(v, i) + 3; }

int main() {
    std::map<std::string, long> counts;
    std::vector<long> values;
    for (long i = 0; i < 400; i++) {
        std::string key = "k" + std::to_string(i * 7919 % 97);
        counts[key] += i;
        values.push_back(i * i % 1009);
    }
    long checksum = 0, caught_parse = 0, caught_range = 0, caught_other = 0;
    for (const auto &kv : counts)
        checksum = checksum * 31 % 1000000007 + kv.second + (long)kv.first.size();
    for (int round = 0; round < 120; round++) {
        std::vector<std::string> fields;
        for (int j = 0; j < 4; j++)
            fields.push_back(std::to_string(round * 13 + j));
        if (round % 3 == 0)
            fields[round % 4] += "x";
        try {
            checksum += parse_all(fields);
        } catch (const ParseError &e) {
            caught_parse++;
            checksum += (long)std::string(e.what()).size();
        }
        try {
            checksum += level1(values, (size_t)round * 4);
        } catch (const std::out_of_range &) {
            caught_range++;
        } catch (...) {
            caught_other++;
        }
    }
    std::printf("cxx_exceptions parse %ld rethrown %ld range %ld other %ld checksum %ld\n",
                caught_parse, rethrown, caught_range, caught_other, checksum);
    return 0;
}
"""

DLOPEN_LIBRARY = r"""
#define NOINLINE __attribute__((noinline))
static unsigned long bumps;

NOINLINE unsigned long lib_work(unsigned long n) {
    unsigned long h = 1469598103934665603UL;
    for (unsigned long i = 0; i < n; i++) {
        h ^= i & 0xff;
        h *= 1099511628211UL;
        if (h & 4)
            bumps++;
    }
    return h ^ bumps;
}

/* Calls back into the program that loaded the library. */
unsigned long lib_apply(unsigned long (*fn)(unsigned long), unsigned long n) {
    unsigned long s = 0;
    for (unsigned long i = 0; i < n; i++)
        s += fn(i);
    return s;
}
"""

DLOPEN = r"""
#include <dlfcn.h>
#include <stdio.h>
#define NOINLINE __attribute__((noinline))

NOINLINE static unsigned long square_plus(unsigned long x) { return x * x + 3; }

int main(void) {
    unsigned long checksum = 0;
    /* Loaded, used and unloaded twice: the second load maps it again. */
    for (int round = 0; round < 2; round++) {
        void *lib = dlopen(PATCH_DLOPEN_LIBRARY, RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            fprintf(stderr, "dlopen: %s\n", dlerror());
            return 1;
        }
        unsigned long (*work)(unsigned long) =
            (unsigned long (*)(unsigned long))dlsym(lib, "lib_work");
        unsigned long (*apply)(unsigned long (*)(unsigned long), unsigned long) =
            (unsigned long (*)(unsigned long (*)(unsigned long), unsigned long))dlsym(lib, "lib_apply");
        if (!work || !apply)
            return 2;
        checksum = checksum * 131 + work(20000 + round);
        checksum = checksum * 131 + apply(square_plus, 2000);
        if (dlclose(lib) != 0)
            return 3;
    }
    printf("dlopen checksum %lu\n", checksum);
    return 0;
}
"""

# name -> (source, language, extra flags)
_PROGRAMS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "threads": (THREADS, "c", ("-pthread",)),
    "recursion": (RECURSION, "c", ()),
    "longjmp": (LONGJMP, "c", ()),
    "signals": (SIGNALS, "c", ()),
    "cxx_exceptions": (CXX_EXCEPTIONS, "c++", ()),
    "dlopen": (DLOPEN, "c", ("-ldl",)),
}

PROGRAM_NAMES: list[str] = list(_PROGRAMS)

# A timer interrupts a busy loop wherever it is: inside the
# recorder's trampolines too.  Its result does not depend on where the
# signals land (the handler touches only its own variables); the loop keeps
# rcx busy (shift counts) so that a handler clobbering a trampoline's saved
# registers shows in the checksum.  Prints the checksum, then how many
# signals the handler took (which varies from run to run).
ASYNC_SIGNALS = r"""
#include <signal.h>
#include <stdio.h>
#include <sys/time.h>
#define NOINLINE __attribute__((noinline))

static volatile unsigned long ticks, handler_mix;

NOINLINE static void on_alarm(int sig) {
    unsigned long x = handler_mix + (unsigned long)sig;
    for (int i = 0; i < 40; i++)
        x = (x & 1) ? x * 3 + 1 : x >> 1;
    handler_mix = x;
    ticks++;
}

int main(void) {
    struct sigaction sa = {0};
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, 0);
    struct itimerval every = {{0, 1000}, {0, 1000}};
    setitimer(ITIMER_REAL, &every, 0);
    unsigned long acc = 1, i;
    for (i = 0; i < 30000000UL; i++) {
        unsigned s = (unsigned)(i & 31);
        acc = (acc << (s & 7)) ^ (acc >> (s >> 2)) ^ (i % 3 ? i : acc >> 5);
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, 0);
    printf("acc %lu\n", acc);
    printf("ticks %lu\n", (unsigned long)ticks);
    return 0;
}
"""


# Children forked without exec run the patched code at the same time as
# each other and as the parent: each must run on control-block state of
# its own.  Call-heavy, with indirect calls; argv[1]: rounds of work;
# argv[2]: a library the parent loads after forking (build_dlopen_library).
FORKS = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#define NOINLINE __attribute__((noinline))

NOINLINE static unsigned long mix(unsigned long x) { return x * 2654435761UL ^ (x >> 13); }
NOINLINE static unsigned long twist(unsigned long x) { return (x << 7) ^ (x >> 3) ^ 0x9e37UL; }
static unsigned long (*const steps[2])(unsigned long) = {mix, twist};

NOINLINE static unsigned long walk(unsigned long x, int depth) {
    if (depth == 0)
        return steps[x & 1](x);
    return walk(steps[(x >> 1) & 1](x) + (unsigned long)depth, depth - 1) ^ x;
}

static int rounds = 40000;

static unsigned long work(unsigned long seed) {
    unsigned long x = seed;
    for (int i = 0; i < rounds; i++)
        x = walk(x + (unsigned long)i, 24);
    return x;
}

int main(int argc, char **argv) {
    if (argc > 1)
        rounds = atoi(argv[1]);
    int fds[4][2];
    pid_t pids[4];
    for (int k = 0; k < 4; k++) {
        if (pipe(fds[k]) != 0 || (pids[k] = fork()) < 0)
            return 2;
        if (pids[k] == 0) {
            unsigned long r = work((unsigned long)k + 1);
            if (write(fds[k][1], &r, sizeof r) != sizeof r)
                _exit(3);
            _exit(0);
        }
        close(fds[k][1]);
    }
    unsigned long own = 0;
    if (argc > 2) { /* a library loaded while the children run */
        void *lib = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
        unsigned long (*lib_work)(unsigned long) =
            lib ? (unsigned long (*)(unsigned long))dlsym(lib, "lib_work") : 0;
        if (!lib_work)
            return 5;
        own = lib_work(5000);
    }
    own ^= work(99);
    for (int k = 0; k < 4; k++) {
        unsigned long r = 0;
        int status = 0;
        if (read(fds[k][0], &r, sizeof r) != sizeof r || waitpid(pids[k], &status, 0) < 0)
            return 4;
        printf("child %d: %lu (status %d)\n", k, r, status);
    }
    printf("parent: %lu\n", own);
    return 0;
}
"""


def build_forks() -> Path:
    """The program whose forked children run patched code at once (FORKS)."""
    return compile_program(FORKS, "patch-forks", (*FLAGS, "-ldl"))


# Code generated at run time, W^X: written to a page mapped read-write,
# made executable, called; then made writable again, rewritten, called.
JIT = r"""
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

static unsigned char code[] = {
    0x31, 0xc0,                   /* xor eax, eax */
    0xb9, 0x10, 0x00, 0x00, 0x00, /* mov ecx, 16 */
    0x01, 0xf8,                   /* loop: add eax, edi */
    0xff, 0xc9,                   /* dec ecx */
    0x75, 0xfa,                   /* jnz loop */
    0xc3                          /* ret */
};

int main(void) {
    unsigned char *p = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return 2;
    memcpy(p, code, sizeof code);
    mprotect(p, 4096, PROT_READ | PROT_EXEC);
    int (*f)(int) = (int (*)(int))p;
    long sum = 0;
    for (int i = 0; i < 100; i++)
        sum += f(i);
    mprotect(p, 4096, PROT_READ | PROT_WRITE);
    p[3] = 0x20; /* 32 rounds */
    mprotect(p, 4096, PROT_READ | PROT_EXEC);
    for (int i = 0; i < 100; i++)
        sum += f(i);
    printf("jit %p sum %ld\n", (void *)p, sum);
    return 0;
}
"""


def build_jit() -> Path:
    """The program that runs code it wrote (JIT)."""
    return compile_program(JIT, "patch-jit", FLAGS)


# Indirect calls to an address nothing is mapped at, each fault caught
# (SIGSEGV handler, siglongjmp): the program prints where each faulted (the
# handler's RIP and si_addr), which must be the bad address itself.
BAD_CALLS = r"""
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>

static sigjmp_buf back;
static volatile unsigned long fault_ip, fault_addr;

static void on_segv(int sig, siginfo_t *info, void *ctx) {
    (void)sig;
    fault_ip = (unsigned long)((ucontext_t *)ctx)->uc_mcontext.gregs[REG_RIP];
    fault_addr = (unsigned long)info->si_addr;
    siglongjmp(back, 1);
}

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigaction(SIGSEGV, &sa, NULL);
    /* An address that was mapped and is not any more. */
    unsigned char *p = mmap(0, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    munmap(p, 4096);
    int (*volatile f)(void) = (int (*)(void))(p + 16);
    int caught = 0;
    for (int i = 0; i < 3; i++) {
        if (sigsetjmp(back, 1) == 0)
            f();
        else if (fault_ip == (unsigned long)(p + 16) && fault_addr == fault_ip)
            caught++;
    }
    printf("caught %d faults at the bad address\n", caught);
    return 0;
}
"""


EPILOGUES = r"""
#include <stdio.h>
long through(long (*f)(long), long x);
static long twice(long x) { return 2 * x; }
/* As optimizing compilers lay code out (hot/cold splitting): the return
 * site of an indirect call falls through into an epilogue that other code
 * jumps to, a 4-byte instruction before a 7-byte block whose second
 * instruction starts 4 bytes in.  A jump there would need a displacement
 * with 0xCC as its top byte, out of reach of a program linked low
 * (-no-pie): the block is moved whole, int3s in place. */
__asm__(
    ".text\n"
    ".globl through\n"
    "through:\n"
    "  push %rbp\n"
    "  push %rbx\n"
    "  sub $0x18, %rsp\n"
    "  mov %rsi, %rbx\n"
    "  test %rbx, %rbx\n"
    "  js 2f\n"
    "  mov %rdi, %rax\n"
    "  mov %rbx, %rdi\n"
    "  call *%rax\n"
    "  add $1, %rax\n"
    "2:\n"
    "  add $0x18, %rsp\n"
    "  pop %rbx\n"
    "  pop %rbp\n"
    "  ret\n");

int main(void) {
    long sum = 0;
    for (long i = 0; i < 1000; i++)
        sum += through(twice, i);
    printf("%ld\n", sum);
    return 0;
}
"""


def build_epilogues() -> Path:
    """The program whose calls return into code falling into a block moved
    whole (see EPILOGUES)."""
    return compile_program(EPILOGUES, "patch-epilogues", (*FLAGS, "-no-pie"))


def build_bad_calls() -> Path:
    """The program whose indirect calls go nowhere (see BAD_CALLS)."""
    return compile_program(BAD_CALLS, "patch-bad-calls", FLAGS)


def build_async_signals() -> Path:
    """The program a profiling timer interrupts anywhere (see ASYNC_SIGNALS)."""
    return compile_program(ASYNC_SIGNALS, "patch-async-signals", FLAGS)


def build_dlopen_library() -> Path:
    """The shared library the ``dlopen`` program loads."""
    return compile_program(DLOPEN_LIBRARY, "patchlib", (*FLAGS, "-shared", "-fPIC"))


def build_program(name: str) -> Path:
    """Program ``name`` (one of :data:`PROGRAM_NAMES`), built and cached."""
    source, language, extra = _PROGRAMS[name]
    flags = (*FLAGS, *extra)
    if name == "dlopen":
        # The library's path compiled in: the program takes no arguments.
        flags = (*flags, f'-DPATCH_DLOPEN_LIBRARY="{build_dlopen_library()}"')
    return compile_program(source, f"patch-{name}", flags, language=language)


@functools.cache
def expected_output(name: str) -> str:
    """Program ``name``'s standard output when run natively (it must exit 0)."""
    exe = build_program(name)
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{exe} exited with {proc.returncode}: {proc.stderr}")
    return proc.stdout
