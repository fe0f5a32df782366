/* The minimal single-step loop hwtrace's stepper is measured against:
 *
 *   step_loop START END PROGRAM ARGS...
 *
 * fork, PTRACE_TRACEME, exec; an int3 at START (a non-PIE function's
 * address) and PTRACE_CONT to it; then PTRACE_SINGLESTEP + waitpid +
 * PTRACE_PEEKUSER(RIP) until RIP leaves [START, END).  Prints the number of
 * steps and the nanoseconds the loop took (CLOCK_MONOTONIC). */
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ptrace.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: step_loop START END PROGRAM ARGS...\n");
        return 2;
    }
    unsigned long start = strtoul(argv[1], 0, 0), end = strtoul(argv[2], 0, 0);
    pid_t pid = fork();
    if (pid == 0) {
        ptrace(PTRACE_TRACEME, 0, 0, 0);
        execv(argv[3], argv + 3);
        _exit(127);
    }
    int status;
    waitpid(pid, &status, 0);
    if (!WIFSTOPPED(status))
        return 1;
    long word = ptrace(PTRACE_PEEKTEXT, pid, (void *)start, 0);
    ptrace(PTRACE_POKETEXT, pid, (void *)start, (void *)((word & ~0xffL) | 0xcc));
    ptrace(PTRACE_CONT, pid, 0, 0);
    waitpid(pid, &status, 0);
    ptrace(PTRACE_POKETEXT, pid, (void *)start, (void *)word);
    struct user_regs_struct regs;
    ptrace(PTRACE_GETREGS, pid, 0, &regs);
    regs.rip = start;
    ptrace(PTRACE_SETREGS, pid, 0, &regs);

    const long rip_off = offsetof(struct user_regs_struct, rip);
    unsigned long rip = start, steps = 0;
    long t0 = now_ns();
    while (rip >= start && rip < end) {
        steps++;
        ptrace(PTRACE_SINGLESTEP, pid, 0, 0);
        waitpid(pid, &status, __WALL);
        if (!WIFSTOPPED(status))
            break;
        rip = (unsigned long)ptrace(PTRACE_PEEKUSER, pid, (void *)rip_off, 0);
    }
    long t1 = now_ns();
    printf("%lu %ld\n", steps, t1 - t0);
    ptrace(PTRACE_CONT, pid, 0, 0);
    waitpid(pid, &status, 0);
    return 0;
}
