/* hwtrace_coop.h: the application's side of hwtrace's co-operative system
 * call latency tracker.
 *
 * hwtrace's kernel programs time the system calls of tracked processes and
 * record only those at least as slow as the calling thread's threshold.  The
 * thresholds, and the state the kernel publishes per thread, live in a
 * BPF_F_MMAPABLE array map that hwtrace hands to the application as a file
 * descriptor (environment variable HWTRACE_COOP_FD).  Mapped here, a
 * threshold update is one store and reading the state is one load: no system
 * call, so steering the tracer does not disturb what it measures.
 *
 * The other side is src/hwtrace/ktrace/syscall_latency.py (MAGIC, VERSION, COLUMNS,
 * HEADER_WORDS, HIST_WORDS, STATE_WORDS, HEADER_FIELDS, STATE_FIELDS,
 * CoopLayout); the layout below must stay word for word the same.
 *
 * Usage:
 *     struct hwtrace_coop c;
 *     if (hwtrace_coop_open(&c) == 0) {
 *         hwtrace_set_threshold(&c, SYS_read, 5000000);   // reads >= 5 ms
 *         ...
 *         hwtrace_coop_close(&c);
 *     }
 *
 * C99 with GNU extensions (__thread, __atomic builtins); Linux only.
 * syscall() needs _DEFAULT_SOURCE (gcc's default gnu modes define it; with
 * -std=c99 include this header first).  After fork(), the child must call
 * hwtrace_coop_forget_row(): it inherits the parent thread's cached row.
 */
#ifndef HWTRACE_COOP_H
#define HWTRACE_COOP_H

#if !defined(_DEFAULT_SOURCE) && !defined(_GNU_SOURCE)
#define _DEFAULT_SOURCE 1
#endif

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Constants of src/hwtrace/ktrace/syscall_latency.py. */
#define HWTRACE_COOP_MAGIC 0x31504F4F43545748ULL /* "HWTCOOP1" little-endian */
#define HWTRACE_COOP_VERSION 1
#define HWTRACE_COLUMNS 512 /* system calls 0..510 and ANY */
#define HWTRACE_ANY (HWTRACE_COLUMNS - 1)
#define HWTRACE_HEADER_WORDS 64
#define HWTRACE_HIST_WORDS 64
#define HWTRACE_STATE_WORDS 16

/* HEADER_FIELDS: word indices in the header. */
enum hwtrace_header_field {
    HWTRACE_H_MAGIC, HWTRACE_H_VERSION, HWTRACE_H_ROWS, HWTRACE_H_COLUMNS,
    HWTRACE_H_NEXT_ROW, HWTRACE_H_CALLS, HWTRACE_H_RECORDED, HWTRACE_H_LOST,
    HWTRACE_H_OVERFLOW
};

/* STATE_FIELDS: word indices in a thread's state row. */
enum hwtrace_state_field {
    HWTRACE_S_TID, HWTRACE_S_CALLS, HWTRACE_S_RECORDED, HWTRACE_S_LAST_NR,
    HWTRACE_S_LAST_LATENCY, HWTRACE_S_MAX_LATENCY, HWTRACE_S_TOTAL_LATENCY,
    HWTRACE_S_LAST_CPU, HWTRACE_S_MIGRATIONS, HWTRACE_S_IN_CALL,
    HWTRACE_S_APP_STATE, HWTRACE_S_LAST_THRESHOLD
};

/* CoopLayout, in 64-bit words from the start of the mapping. */
#define HWTRACE_HIST_OFFSET HWTRACE_HEADER_WORDS
#define HWTRACE_STATE_OFFSET (HWTRACE_HEADER_WORDS + HWTRACE_HIST_WORDS)
#define HWTRACE_THRESHOLDS_OFFSET(rows) (HWTRACE_STATE_OFFSET + (rows) * HWTRACE_STATE_WORDS)
#define HWTRACE_WORDS(rows) (HWTRACE_THRESHOLDS_OFFSET(rows) + (rows) * HWTRACE_COLUMNS)

struct hwtrace_coop {
    volatile int64_t *words; /* the shared memory */
    size_t size;             /* bytes mapped */
    int64_t rows;            /* thread rows; row 0 holds the defaults */
    int fd;
};

/* The calling thread's row, found once per thread and mapping (the base
 * tells a stale cache from a current one). */
static __thread const volatile int64_t *hwtrace_row_base_;
static __thread int hwtrace_row_;

static inline size_t hwtrace_page_round_(size_t n)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return (n + page - 1) / page * page;
}

/* Map the shared memory of descriptor fd.  0, or -1 with errno set
 * (EINVAL: not hwtrace's map or another version). */
static inline int hwtrace_coop_open_fd(struct hwtrace_coop *c, int fd)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    /* The header first: the rows, hence the size, are only known from it. */
    void *head = mmap(NULL, page, PROT_READ, MAP_SHARED, fd, 0);
    if (head == MAP_FAILED)
        return -1;
    const volatile int64_t *h = (const volatile int64_t *)head;
    int ok = (uint64_t)h[HWTRACE_H_MAGIC] == HWTRACE_COOP_MAGIC &&
             h[HWTRACE_H_VERSION] == HWTRACE_COOP_VERSION &&
             h[HWTRACE_H_COLUMNS] == HWTRACE_COLUMNS && h[HWTRACE_H_ROWS] >= 2 &&
             h[HWTRACE_H_ROWS] <= 1 << 16;
    int64_t rows = h[HWTRACE_H_ROWS];
    munmap(head, page);
    if (!ok) {
        errno = EINVAL;
        return -1;
    }
    size_t size = hwtrace_page_round_((size_t)HWTRACE_WORDS(rows) * 8);
    void *all = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (all == MAP_FAILED)
        return -1;
    c->words = (volatile int64_t *)all;
    c->size = size;
    c->rows = rows;
    c->fd = fd;
    return 0;
}

/* Open the map hwtrace pinned at path (hwtrace trace --latency --pin PATH,
 * for applications it did not start) and map it.  0, or -1 with errno set. */
static inline int hwtrace_coop_open_pinned(struct hwtrace_coop *c, const char *path)
{
    /* union bpf_attr for BPF_OBJ_GET (7): pathname, bpf_fd, file_flags. */
    struct {
        uint64_t pathname;
        uint32_t bpf_fd, file_flags;
        uint8_t pad[128];
    } attr = {0};
    attr.pathname = (uint64_t)(uintptr_t)path;
    long fd = syscall(321 /* SYS_bpf on x86-64 */, 7 /* BPF_OBJ_GET */, &attr, sizeof attr);
    if (fd < 0)
        return -1;
    if (hwtrace_coop_open_fd(c, (int)fd) < 0) {
        int e = errno;
        close((int)fd);
        errno = e;
        return -1;
    }
    return 0;
}

/* Map the descriptor named by HWTRACE_COOP_FD (a command hwtrace started),
 * else the map pinned at HWTRACE_COOP_PIN.  0, or -1 with errno set
 * (ENOENT: not run under hwtrace's tracker). */
static inline int hwtrace_coop_open(struct hwtrace_coop *c)
{
    const char *s = getenv("HWTRACE_COOP_FD");
    const char *pin = getenv("HWTRACE_COOP_PIN");
    char *end;
    long fd;
    if ((!s || !*s) && pin && *pin)
        return hwtrace_coop_open_pinned(c, pin);
    if (!s || !*s) {
        errno = ENOENT;
        return -1;
    }
    fd = strtol(s, &end, 10);
    if (*end || fd < 0 || fd > 0x7fffffff) {
        errno = EBADF;
        return -1;
    }
    return hwtrace_coop_open_fd(c, (int)fd);
}

static inline void hwtrace_coop_forget_row(void)
{
    hwtrace_row_base_ = NULL;
    hwtrace_row_ = 0;
}

/* Unmap; the descriptor stays open (it is the caller's, or inherited). */
static inline void hwtrace_coop_close(struct hwtrace_coop *c)
{
    if (c->words) {
        if (hwtrace_row_base_ == c->words)
            hwtrace_coop_forget_row();
        munmap((void *)c->words, c->size);
    }
    c->words = NULL;
    c->size = 0;
    c->rows = 0;
    c->fd = -1;
}

static inline int64_t hwtrace_coop_header(const struct hwtrace_coop *c, int field)
{
    return c->words[field];
}

/* The calling thread's row, or -1 when it has none (yet): the kernel gives
 * a tracked thread one at its first system call and publishes its tid there.
 * The gettid() here is such a call.  Only a row found is cached: later calls
 * (and the threshold setters) then make no system call. */
static inline int hwtrace_coop_row(const struct hwtrace_coop *c)
{
    if (hwtrace_row_base_ == c->words && hwtrace_row_ > 0)
        return hwtrace_row_;
    int64_t tid = (int64_t)syscall(SYS_gettid);
    int64_t end = c->words[HWTRACE_H_NEXT_ROW];
    if (end > c->rows)
        end = c->rows;
    /* The newest row wins, as in CoopMap.row_of. */
    for (int64_t r = end - 1; r >= 1; r--) {
        if (c->words[HWTRACE_STATE_OFFSET + r * HWTRACE_STATE_WORDS + HWTRACE_S_TID] == tid) {
            hwtrace_row_base_ = c->words;
            hwtrace_row_ = (int)r;
            return hwtrace_row_;
        }
    }
    return -1;
}

/* One word store; the compiler barrier keeps it before the system call that
 * follows, which is what the kernel checks it against at that call's exit. */
static inline void hwtrace_store_(volatile int64_t *p, int64_t v)
{
    __atomic_store_n(p, v, __ATOMIC_RELAXED);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
}

/* Threshold of call nr (HWTRACE_ANY: any call) for thread row (0: the
 * defaults of every tracked thread), in ns: 0 unset, >0 record calls at
 * least that slow, <0 never.  0, or -1 for a row or call out of range. */
static inline int hwtrace_set_thread_threshold(struct hwtrace_coop *c, int row, int nr,
                                               int64_t ns)
{
    if (row < 0 || row >= c->rows || nr < 0 || nr >= HWTRACE_COLUMNS)
        return -1;
    hwtrace_store_(&c->words[HWTRACE_THRESHOLDS_OFFSET(c->rows) +
                             (int64_t)row * HWTRACE_COLUMNS + nr],
                   ns);
    return 0;
}

/* The same for the calling thread; -1 when it has no row. */
static inline int hwtrace_set_threshold(struct hwtrace_coop *c, int nr, int64_t ns)
{
    int row = hwtrace_coop_row(c);
    return row < 0 ? -1 : hwtrace_set_thread_threshold(c, row, nr, ns);
}

static inline int64_t hwtrace_get_thread_threshold(const struct hwtrace_coop *c, int row, int nr)
{
    if (row < 0 || row >= c->rows || nr < 0 || nr >= HWTRACE_COLUMNS)
        return 0;
    return c->words[HWTRACE_THRESHOLDS_OFFSET(c->rows) + (int64_t)row * HWTRACE_COLUMNS + nr];
}

/* A word of the state the kernel publishes for thread row (a field of
 * enum hwtrace_state_field); 0 out of range. */
static inline int64_t hwtrace_thread_state(const struct hwtrace_coop *c, int row, int field)
{
    if (row < 0 || row >= c->rows || field < 0 || field >= HWTRACE_STATE_WORDS)
        return 0;
    return __atomic_load_n(
        &c->words[HWTRACE_STATE_OFFSET + (int64_t)row * HWTRACE_STATE_WORDS + field],
        __ATOMIC_RELAXED);
}

/* The application's own word in its thread's row (the paper's proc_state),
 * for hwtrace to read.  0, or -1 when the thread has no row. */
static inline int hwtrace_set_app_state(struct hwtrace_coop *c, int64_t v)
{
    int row = hwtrace_coop_row(c);
    if (row < 1)
        return -1;
    hwtrace_store_(&c->words[HWTRACE_STATE_OFFSET + (int64_t)row * HWTRACE_STATE_WORDS +
                             HWTRACE_S_APP_STATE],
                   v);
    return 0;
}

#endif /* HWTRACE_COOP_H */
