/* A workload for tests/ktrace/test_kernel_latency.py: system calls of known
 * latency, each preceded by a threshold set through include/hwtrace_coop.h,
 * so that exactly the calls it announces ("EXPECT" lines) are recorded.
 *
 * Run with the tracker's map as HWTRACE_COOP_FD; it prints "READY", waits
 * for a line on stdin (the tracker then tracks it), runs, and prints:
 *   EXPECT nr= tid= threshold= min_ns=   per call to be recorded, in order
 *   NOSYSCALL before= after=             calls of the main thread around
 *                                        1000 threshold stores (equal)
 *   APPSTATE row= value=                 the main thread's app_state
 *   ROW name= row= tid=                  each thread's row
 *   DONE
 * Which calls are recorded does not depend on timing: a recorded call is at
 * least as slow as its threshold (sleeps never end early, and the pipe writer
 * starts its delay only once the reader is blocked in read(), as the kernel
 * publishes), and a call not recorded has a threshold far above its latency
 * or a negative one.  Sleeps use syscall(SYS_nanosleep) (35), as glibc's
 * nanosleep() may be clock_nanosleep (230), which the helpers' own pauses
 * use so that no threshold of 35 applies to them. */
#include "hwtrace_coop.h" /* include/, given with -I */

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define MS 1000000LL

static struct hwtrace_coop coop;
static int main_row;
static int data_pipe[2], cmd_pipe[2], go_pipe[2], ack_pipe[2];
static char outbuf[1 << 16];

static void die(const char *what)
{
    fprintf(stderr, "coop_workload: %s: %s\n", what, strerror(errno));
    exit(2);
}

static struct timespec ts_of(long long ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
    return ts;
}

/* The timed call: nanosleep (35). */
static void sleep_ns(long long ns)
{
    struct timespec ts = ts_of(ns);
    if (syscall(SYS_nanosleep, &ts, NULL) != 0)
        die("nanosleep");
}

/* Untimed waits: clock_nanosleep (230), no threshold set for it. */
static void pause_ns(long long ns)
{
    struct timespec ts = ts_of(ns);
    syscall(SYS_clock_nanosleep, CLOCK_MONOTONIC, 0, &ts, NULL);
}

static void expect(int nr, long long threshold, long long min_ns)
{
    printf("EXPECT nr=%d tid=%ld threshold=%lld min_ns=%lld\n", nr, (long)syscall(SYS_gettid),
           threshold, min_ns);
}

static int my_row(const char *name)
{
    int row = hwtrace_coop_row(&coop);
    if (row < 1) {
        fprintf(stderr, "coop_workload: %s has no row (not tracked?)\n", name);
        exit(3);
    }
    printf("ROW name=%s row=%d tid=%ld\n", name, row, (long)syscall(SYS_gettid));
    return row;
}

static void set(int nr, long long ns)
{
    if (hwtrace_set_threshold(&coop, nr, ns) != 0)
        die("hwtrace_set_threshold");
}

static void set_row(int row, int nr, long long ns)
{
    if (hwtrace_set_thread_threshold(&coop, row, nr, ns) != 0)
        die("hwtrace_set_thread_threshold");
}

static void put(int fd, const void *p, size_t n)
{
    if (write(fd, p, n) != (ssize_t)n)
        die("write");
}

static void get(int fd, void *p, size_t n)
{
    if (read(fd, p, n) != (ssize_t)n)
        die("read");
}

/* The pipe writer: for each delay it is sent, waits until the main thread is
 * blocked in read() (in_call = nr + 1, published by the kernel at the call's
 * entry), then sleeps the delay and writes one byte. */
static void *writer(void *arg)
{
    (void)arg;
    my_row("writer");
    for (;;) {
        int delay_ms;
        get(cmd_pipe[0], &delay_ms, sizeof delay_ms);
        if (delay_ms < 0)
            return NULL;
        while (hwtrace_thread_state(&coop, main_row, HWTRACE_S_IN_CALL) != SYS_read + 1)
            pause_ns(100000);
        pause_ns(delay_ms * MS);
        put(data_pipe[1], "x", 1);
    }
}

/* The second thread: steers the main thread's thresholds, and its own. */
static void *steer(void *arg)
{
    (void)arg;
    my_row("steer");
    for (;;) {
        char cmd;
        get(go_pipe[0], &cmd, 1);
        switch (cmd) {
        case 'a': /* main's nanosleeps from 5 ms */
            set_row(main_row, SYS_nanosleep, 5 * MS);
            break;
        case 'b': /* main's nanosleeps never */
            set_row(main_row, SYS_nanosleep, -1);
            break;
        case 'z': /* main's threshold is not this thread's: not recorded */
            sleep_ns(20 * MS);
            break;
        case 's': /* its own row */
            set(SYS_nanosleep, 5 * MS);
            sleep_ns(20 * MS);
            expect(SYS_nanosleep, 5 * MS, 20 * MS);
            set(SYS_nanosleep, 0);
            break;
        case 'q':
            return NULL;
        }
        put(ack_pipe[1], &cmd, 1);
    }
}

static void steer_and_wait(char cmd)
{
    put(go_pipe[1], &cmd, 1);
    get(ack_pipe[0], &cmd, 1);
}

static void pipe_read(int delay_ms)
{
    char b;
    put(cmd_pipe[1], &delay_ms, sizeof delay_ms);
    get(data_pipe[0], &b, 1);
}

int main(void)
{
    pthread_t w, s;
    char line[64];

    setvbuf(stdout, outbuf, _IOFBF, sizeof outbuf);
    if (hwtrace_coop_open(&coop) != 0)
        die("hwtrace_coop_open");
    if (pipe(data_pipe) || pipe(cmd_pipe) || pipe(go_pipe) || pipe(ack_pipe))
        die("pipe");
    printf("READY\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin))
        die("waiting for go");
    main_row = my_row("main");

    /* Own row, per call. */
    set(SYS_nanosleep, 5 * MS);
    sleep_ns(20 * MS);
    expect(SYS_nanosleep, 5 * MS, 20 * MS);
    set(SYS_nanosleep, 50 * MS);
    sleep_ns(1 * MS);
    sleep_ns(10 * MS);
    set(SYS_nanosleep, 8 * MS);
    sleep_ns(10 * MS);
    expect(SYS_nanosleep, 8 * MS, 10 * MS);
    set(SYS_nanosleep, -1);
    sleep_ns(20 * MS);
    /* Own row, any call; the call's own threshold comes first. */
    set(SYS_nanosleep, 0);
    set(HWTRACE_ANY, 5 * MS);
    sleep_ns(10 * MS);
    expect(SYS_nanosleep, 5 * MS, 10 * MS);
    set(SYS_nanosleep, 50 * MS);
    sleep_ns(10 * MS);
    set(HWTRACE_ANY, 0);
    /* The defaults (row 0), per call and for any; the own row first. */
    set(SYS_nanosleep, 0);
    set_row(0, SYS_nanosleep, 6 * MS);
    sleep_ns(10 * MS);
    expect(SYS_nanosleep, 6 * MS, 10 * MS);
    set_row(0, SYS_nanosleep, 0);
    set_row(0, HWTRACE_ANY, 7 * MS);
    sleep_ns(10 * MS);
    expect(SYS_nanosleep, 7 * MS, 10 * MS);
    set_row(0, HWTRACE_ANY, 0);
    set_row(0, SYS_nanosleep, 5 * MS);
    set(SYS_nanosleep, -1);
    sleep_ns(10 * MS);
    set_row(0, SYS_nanosleep, 0);

    /* Threshold and app_state stores make no system call: the kernel's
     * count of this thread's calls does not move. */
    long long before = hwtrace_thread_state(&coop, main_row, HWTRACE_S_CALLS);
    for (int i = 0; i < 1000; i++) {
        set(SYS_nanosleep, i + 1);
        hwtrace_set_app_state(&coop, i);
    }
    long long after = hwtrace_thread_state(&coop, main_row, HWTRACE_S_CALLS);
    set(SYS_nanosleep, 0);
    hwtrace_set_app_state(&coop, 0x5eed);
    printf("NOSYSCALL before=%lld after=%lld\n", before, after);
    printf("APPSTATE row=%d value=%d\n", main_row, 0x5eed);

    /* Pipe reads (read, 0) whose writer writes after a chosen delay. */
    if (pthread_create(&w, NULL, writer, NULL))
        die("pthread_create");
    set(SYS_read, 5 * MS);
    pipe_read(20);
    expect(SYS_read, 5 * MS, 20 * MS);
    set(SYS_read, 50 * MS);
    pipe_read(0);
    set(SYS_read, -1);
    pipe_read(20);
    int stop = -1;
    put(cmd_pipe[1], &stop, sizeof stop);
    pthread_join(w, NULL);

    /* Another thread changes this one's threshold; its next call sees it.
     * The handshake's reads are never recorded (threshold -1). */
    if (pthread_create(&s, NULL, steer, NULL))
        die("pthread_create");
    steer_and_wait('a');
    if (hwtrace_get_thread_threshold(&coop, main_row, SYS_nanosleep) != 5 * MS)
        die("the other thread's store is not visible");
    sleep_ns(20 * MS);
    expect(SYS_nanosleep, 5 * MS, 20 * MS);
    steer_and_wait('z');
    steer_and_wait('s');
    steer_and_wait('b');
    sleep_ns(20 * MS);
    put(go_pipe[1], "q", 1);
    pthread_join(s, NULL);
    set(SYS_read, 0);
    set(SYS_nanosleep, 0);

    printf("DONE\n");
    fflush(stdout);
    hwtrace_coop_close(&coop);
    return 0;
}
