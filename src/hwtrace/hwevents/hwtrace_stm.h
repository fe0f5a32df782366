/* hwtrace's virtual STM + ETB: the MIPI STPv2 packets a CoreSight STM
 * (ARM CoreSight STM-500 TRM) would send for a software event, written by
 * software into a small fixed-size byte ring in shared memory standing
 * for the Embedded Trace Buffer, as in Vergé et al., "Hardware-assisted
 * software event tracing" (2017): the producer stores its payload into its
 * own channel, the consumer drains the ETB, decodes and stores.
 *
 * The ETB file is made by hwtrace.hwevents.vstm.VirtualStm and named by
 * the HWTRACE_STM environment variable.  A process takes a master number
 * when it first emits (M8), a thread a channel (C8, or C16 when the high
 * byte changes).  An event is, in STPv2 (MIPI STP v2.x spec, nibble
 * stream, low nibble of a byte first, values most significant nibble
 * first):
 *
 *     [M8 master] [C8/C16 channel]   only when the stream's current master
 *                                    or channel is not the writer's
 *     Dn value ... DnMTS value TS    one data packet per value (D8, D16,
 *                                    D32 or D64 as the store size), the
 *                                    last one marked and timestamped
 *     [NULL]                         pads the event to a whole byte
 *
 * The timestamp is the TSC (rdtsc) taken when the event is placed in the
 * stream, sent as the hardware does: a length nibble n, then the n low
 * nibbles that differ from the stream's previous timestamp (n = 14 or 16
 * for 13 or 15, which STPv2 cannot say).  The stream starts with ASYNC and
 * VERSION 3 (natural-binary timestamps), written by the consumer when it
 * makes the ETB; after that nothing ever cuts it: an event is placed whole
 * or not at all, so one ASYNC suffices and a decoder never has to resync.
 *
 * Policies, when the ETB has no room for an event:
 *   STALL (the paper's STM design): the producer waits for the consumer
 *         (spins a little, then sleeps on a futex the consumer wakes, with
 *         a 1 ms timeout as a safety net); nothing is lost; the waits and
 *         their nanoseconds are counted.
 *   DROP  (what ETM + ETB did): the event is not written and is counted
 *         dropped; the stream is left as it was, so no half event.
 *
 * Cost, honestly: a real STM takes a store per value and serialises the
 * masters in hardware.  Here every event pays a 16-byte compare-and-swap
 * on the ETB's shared state (stream position, current master and channel,
 * last timestamp), the nibble encoding, a copy into the ring and an
 * in-order commit; with several threads the CAS and the commit line are
 * contended.  No lock and no system call per event (only when stalling).
 *
 * Use:  #include "hwtrace_stm.h"
 *       hwtrace_stm_emit(nwords, words);        64-bit values (D64)
 *       hwtrace_stm_emit_sized(size, n, vals);  size 1/2/4/8 bytes each
 *       hwtrace_stm_emit32(v);                  one D32MTS
 * Each returns 1 if the event was written, 0 if dropped or if there is no
 * ETB (HWTRACE_STM unset or unusable: the program runs untraced).
 */
#ifndef HWTRACE_STM_H
#define HWTRACE_STM_H

#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

#define HWTRACE_STM_MAGIC 0x314d545352545748ULL /* "HWTRSTM1" */
#define HWTRACE_STM_MAX_WORDS 8
#define HWTRACE_STM_POS_BITS 40
#define HWTRACE_STM_POS_MASK ((1ULL << HWTRACE_STM_POS_BITS) - 1)
#define HWTRACE_STM_STALL 0
#define HWTRACE_STM_DROP 1
#define HWTRACE_STM_SPINS 256

/* The file: this header page(s), then the ETB ring of `size` bytes.
 * Positions are byte counts modulo 2^40 (size divides 2^40). */
struct hwtrace_stm_header {
	uint64_t magic;                  /*   0 */
	uint32_t size, policy;           /*   8: ETB bytes (a power of two) */
	uint32_t slots, header_size;     /*  16 */
	uint64_t masters;                /*  24: masters taken (processes) */
	uint64_t claimed;                /*  32: slots taken (threads) */
	uint32_t channel_base, closed;   /*  40: first thread's channel; the
					  * consumer is gone (STALL then drops) */
	uint64_t pad1[2];
	/* 64: the stream's state, swapped whole by each event: position (40
	 * bits), current channel (16) and master (8); last timestamp. */
	uint64_t state __attribute__((aligned(16)));
	uint64_t last_ts;
	uint64_t pad2[6];
	uint64_t commit __attribute__((aligned(64))); /* 128: bytes readable */
	uint64_t pad3[7];
	uint64_t tail __attribute__((aligned(64)));   /* 192: bytes consumed */
	uint32_t wake, waiters;          /* 200: producers sleep on wake */
	uint32_t full, csleep;           /* 208: the consumer sleeps on full */
};

struct hwtrace_stm_slot {                /* 64 bytes at 512 + 64 * k */
	uint64_t events, dropped, stalls, stall_ns;
	uint64_t tid, pid;
	uint32_t master, channel;
	uint64_t pad;
};

static struct hwtrace_stm_header *hwtrace_stm_;
static uint8_t *hwtrace_stm_ring_;
static uint32_t hwtrace_stm_master_;
static int hwtrace_stm_once_;            /* 0 not tried, 1 mapping, 2 mapped, 3 none */
static __thread struct hwtrace_stm_slot *hwtrace_stm_slot_;
static __thread int hwtrace_stm_dead_;

/* A forked child is another producer: a master of its own, and a new
 * channel for its thread on its first event. */
static void hwtrace_stm_atfork_child_(void)
{
	if (hwtrace_stm_) {
		hwtrace_stm_master_ = 1 + (uint32_t)(__atomic_fetch_add(&hwtrace_stm_->masters, 1,
					__ATOMIC_ACQ_REL) % 255);
		hwtrace_stm_slot_ = NULL;
	}
}

static inline void hwtrace_stm_map_(void)
{
	const char *path = getenv("HWTRACE_STM");
	struct hwtrace_stm_header *h;
	struct stat st;
	int fd, ok = 3;
	void *p;

	if (path && (fd = open(path, O_RDWR)) >= 0) {
		if (fstat(fd, &st) == 0 && st.st_size >= 4096) {
			p = mmap(NULL, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
			h = (struct hwtrace_stm_header *)p;
			if (p != MAP_FAILED && h->magic == HWTRACE_STM_MAGIC
			    && (uint64_t)h->header_size + h->size <= (uint64_t)st.st_size) {
				hwtrace_stm_ = h;
				hwtrace_stm_ring_ = (uint8_t *)p + h->header_size;
				hwtrace_stm_master_ = 1 + (uint32_t)(__atomic_fetch_add(&h->masters, 1,
							__ATOMIC_ACQ_REL) % 255);
				pthread_atfork(NULL, NULL, hwtrace_stm_atfork_child_);
				ok = 2;
			}
		}
		close(fd);
	}
	__atomic_store_n(&hwtrace_stm_once_, ok, __ATOMIC_RELEASE);
}

/* This thread's slot (and channel); 0 when there is no ETB. */
static inline int hwtrace_stm_claim_(void)
{
	struct hwtrace_stm_header *h;
	int s = 0;
	uint64_t k;

	if (hwtrace_stm_dead_)
		return 0;
	if (__atomic_compare_exchange_n(&hwtrace_stm_once_, &s, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		hwtrace_stm_map_();
	while ((s = __atomic_load_n(&hwtrace_stm_once_, __ATOMIC_ACQUIRE)) == 1)
		sched_yield();
	h = hwtrace_stm_;
	if (s != 2 || (k = __atomic_fetch_add(&h->claimed, 1, __ATOMIC_ACQ_REL)) >= h->slots) {
		hwtrace_stm_dead_ = 1;
		return 0;
	}
	hwtrace_stm_slot_ = (struct hwtrace_stm_slot *)((uint8_t *)h + 512 + 64 * k);
	hwtrace_stm_slot_->tid = (uint64_t)syscall(SYS_gettid);
	hwtrace_stm_slot_->pid = (uint64_t)getpid();
	hwtrace_stm_slot_->master = hwtrace_stm_master_;
	__atomic_store_n(&hwtrace_stm_slot_->channel, (uint32_t)((h->channel_base + k) & 0xffff),
			 __ATOMIC_RELEASE);
	return 1;
}

/* 16-byte compare-and-swap of the stream state (cmpxchg16b). */
static inline int hwtrace_stm_cas16_(uint64_t *p, uint64_t *o0, uint64_t *o1, uint64_t n0, uint64_t n1)
{
	uint8_t ok;
	__asm__ __volatile__("lock cmpxchg16b %1\n\tsete %0"
			     : "=q"(ok), "+m"(*(volatile unsigned __int128 *)p), "+a"(*o0), "+d"(*o1)
			     : "b"(n0), "c"(n1)
			     : "memory", "cc");
	return ok;
}

static inline uint64_t hwtrace_stm_now_ns_(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ULL + (uint64_t)t.tv_nsec;
}

/* Wait until the consumer frees room or moves on (STALL policy). */
static inline void hwtrace_stm_sleep_(struct hwtrace_stm_header *h, uint64_t tail)
{
	struct timespec to = {0, 1000000};
	uint32_t seq;

	__atomic_fetch_add(&h->waiters, 1, __ATOMIC_SEQ_CST);
	seq = __atomic_load_n(&h->wake, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&h->tail, __ATOMIC_SEQ_CST) == tail)
		syscall(SYS_futex, &h->wake, FUTEX_WAIT, seq, &to, NULL, 0);
	__atomic_fetch_sub(&h->waiters, 1, __ATOMIC_SEQ_CST);
}

/* The ETB is full: wake the consumer if it sleeps (the paper's producer
 * yielding to the consumer). */
static inline void hwtrace_stm_full_(struct hwtrace_stm_header *h)
{
	__atomic_fetch_add(&h->full, 1, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&h->csleep, __ATOMIC_SEQ_CST))
		syscall(SYS_futex, &h->full, FUTEX_WAKE, 1, NULL, NULL, 0);
}

/* Nibble writer: nibbles go out low first, packed into a 128-bit
 * accumulator, eight bytes at a time. */
struct hwtrace_stm_nw_ {
	unsigned __int128 acc;
	int n;            /* nibbles in acc */
	uint8_t *q;
};

static inline void hwtrace_stm_put_(struct hwtrace_stm_nw_ *w, uint64_t nibbles, int k)
{
	w->acc |= (unsigned __int128)nibbles << (4 * w->n);
	w->n += k;
	if (w->n >= 16) {
		uint64_t lo = (uint64_t)w->acc;
		memcpy(w->q, &lo, 8);
		w->q += 8;
		w->acc >>= 64;
		w->n -= 16;
	}
}

/* The k low nibbles of v, most significant first, as stream nibbles. */
static inline uint64_t hwtrace_stm_msn_(uint64_t v, int k)
{
	uint64_t r = __builtin_bswap64(v);
	r = ((r & 0x0f0f0f0f0f0f0f0fULL) << 4) | ((r >> 4) & 0x0f0f0f0f0f0f0f0fULL);
	return r >> (64 - 4 * k);
}

/* One event: n values of `size` bytes (1, 2, 4 or 8), the last marked and
 * timestamped.  Returns 1 if written. */
static inline int hwtrace_stm_emit_sized(int size, int n, const uint64_t *vals)
{
	struct hwtrace_stm_header *h;
	struct hwtrace_stm_slot *sl;
	uint64_t s0, s1, n0, pos, tail, ts, diff, t0 = 0, bytes, end, at;
	uint32_t master, channel, cur_master, cur_channel, mask;
	int lg, dn, nts, nib, stalled = 0, spins = 0;
	uint8_t buf[96];
	struct hwtrace_stm_nw_ w;

	if (n < 1 || n > HWTRACE_STM_MAX_WORDS)
		return 0;
	lg = size == 8 ? 3 : size == 4 ? 2 : size == 2 ? 1 : size == 1 ? 0 : -1;
	if (lg < 0)
		return 0;
	if (!hwtrace_stm_slot_ && !hwtrace_stm_claim_())
		return 0;
	h = hwtrace_stm_;
	sl = hwtrace_stm_slot_;
	master = sl->master;
	channel = sl->channel;
	dn = 2 << lg;                               /* data nibbles per value */
	mask = h->size - 1;

	s0 = __atomic_load_n(&h->state, __ATOMIC_ACQUIRE);
	s1 = __atomic_load_n(&h->last_ts, __ATOMIC_ACQUIRE);
	for (;;) {
		pos = s0 & HWTRACE_STM_POS_MASK;
		cur_channel = (uint32_t)(s0 >> 40) & 0xffff;
		cur_master = (uint32_t)(s0 >> 56);
		ts = __rdtsc();
		if (ts < s1)
			ts = s1;                    /* the stream's clock never goes back */
		diff = ts ^ s1;
		nts = diff ? (67 - __builtin_clzll(diff)) >> 2 : 1;
		if (nts == 13 || nts == 15)
			nts++;
		nib = n * (1 + dn) + 1 + nts;
		if (cur_master != master) {
			nib += 3;                   /* M8; the channel becomes 0 */
			cur_channel = 0;
		}
		if (cur_channel != channel)
			nib += (cur_channel >> 8) == (channel >> 8) ? 3 : 6;
		bytes = (uint64_t)(nib + 1) >> 1;
		tail = __atomic_load_n(&h->tail, __ATOMIC_ACQUIRE);
		if (((pos - tail) & HWTRACE_STM_POS_MASK) + bytes > h->size) {
			if (h->policy == HWTRACE_STM_DROP || __atomic_load_n(&h->closed, __ATOMIC_ACQUIRE)) {
				sl->dropped++;
				if (stalled) {
					sl->stalls++;
					sl->stall_ns += hwtrace_stm_now_ns_() - t0;
				}
				return 0;
			}
			if (!stalled) {
				stalled = 1;
				t0 = hwtrace_stm_now_ns_();
				hwtrace_stm_full_(h);
			}
			if (++spins < HWTRACE_STM_SPINS)
				_mm_pause();
			else
				hwtrace_stm_sleep_(h, tail);
			s0 = __atomic_load_n(&h->state, __ATOMIC_ACQUIRE);
			s1 = __atomic_load_n(&h->last_ts, __ATOMIC_ACQUIRE);
			continue;
		}
		n0 = ((pos + bytes) & HWTRACE_STM_POS_MASK) | (uint64_t)channel << 40 | (uint64_t)master << 56;
		if (hwtrace_stm_cas16_(&h->state, &s0, &s1, n0, ts))
			break;
	}

	/* Encode: the stream was (cur_master, cur_channel) before us. */
	w.acc = 0;
	w.n = 0;
	w.q = buf;
	if ((uint32_t)(s0 >> 56) != master)
		hwtrace_stm_put_(&w, 0x1 | hwtrace_stm_msn_(master, 2) << 4, 3);
	if (cur_channel != channel) {
		if ((cur_channel >> 8) == (channel >> 8))
			hwtrace_stm_put_(&w, 0x3 | hwtrace_stm_msn_(channel & 0xff, 2) << 4, 3);
		else
			hwtrace_stm_put_(&w, 0xf | 0x3 << 4 | hwtrace_stm_msn_(channel, 4) << 8, 6);
	}
	for (int i = 0; i < n; i++) {
		hwtrace_stm_put_(&w, (uint64_t)(i == n - 1 ? 8 + lg : 4 + lg), 1);
		hwtrace_stm_put_(&w, hwtrace_stm_msn_(vals[i], dn), dn);
	}
	hwtrace_stm_put_(&w, nts == 14 ? 0xd : nts == 16 ? 0xe : (uint64_t)nts, 1);
	hwtrace_stm_put_(&w, hwtrace_stm_msn_(ts, nts), nts);
	if (w.n & 1)
		w.n++;                              /* a NULL nibble */
	{
		uint64_t lo = (uint64_t)w.acc, hi = (uint64_t)(w.acc >> 64);
		memcpy(w.q, &lo, 8);
		memcpy(w.q + 8, &hi, 8);
		w.q += w.n >> 1;
	}

	/* Copy into the ETB, then commit in stream order. */
	at = pos & mask;
	end = at + bytes;
	if (end <= h->size) {
		memcpy(hwtrace_stm_ring_ + at, buf, bytes);
	} else {
		memcpy(hwtrace_stm_ring_ + at, buf, h->size - at);
		memcpy(hwtrace_stm_ring_, buf + (h->size - at), end - h->size);
	}
	spins = 0;
	while (__atomic_load_n(&h->commit, __ATOMIC_ACQUIRE) != pos) {
		if (++spins < HWTRACE_STM_SPINS)
			_mm_pause();
		else
			sched_yield();
	}
	__atomic_store_n(&h->commit, (pos + bytes) & HWTRACE_STM_POS_MASK, __ATOMIC_RELEASE);
	if (stalled) {
		sl->stalls++;
		sl->stall_ns += hwtrace_stm_now_ns_() - t0;
	}
	__atomic_store_n(&sl->events, sl->events + 1, __ATOMIC_RELAXED);
	return 1;
}

/* One event of nwords 64-bit values (D64 ... D64MTS). */
static inline int hwtrace_stm_emit(int nwords, const uint64_t *words)
{
	return hwtrace_stm_emit_sized(8, nwords, words);
}

/* One 32-bit value (D32MTS), the paper's integer payload. */
static inline int hwtrace_stm_emit32(uint32_t v)
{
	uint64_t w = v;
	return hwtrace_stm_emit_sized(4, 1, &w);
}

#endif /* HWTRACE_STM_H */
