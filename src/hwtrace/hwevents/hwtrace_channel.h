/* hwtrace's software PTW channel: the packets PTWRITE would put into
 * Intel PT, written by software into shared memory, for machines without
 * PTWRITE.  One decoder (hwtrace.hwevents.ptw) reads both.
 *
 * The channel file (made by hwtrace.hwevents.channel.Channel, named by
 * the HWTRACE_CHANNEL environment variable) holds AREAS areas, one per
 * thread, claimed on a thread's first event; an area is a ring of NSUB
 * sub-buffers of SUB bytes.  A thread writes its events into its current
 * sub-buffer (a TSC packet, then a PTW packet per word); a full
 * sub-buffer is handed to the consumer whole (its byte count, then its
 * sequence number, stored last) and the thread starts the next one with
 * a PSB+ so each decodes alone.  When every sub-buffer waits for the
 * consumer, events are dropped and counted (the paper's drop policy):
 * the program never waits.  No lock, no system call per event.
 *
 * Use:  #include "hwtrace_channel.h"
 *       hwtrace_emit(type_id, nwords, words);   ... hwtrace_flush();
 */
#ifndef HWTRACE_CHANNEL_H
#define HWTRACE_CHANNEL_H

#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <x86intrin.h>

#define HWTRACE_CHANNEL_MAGIC 0x314e484352545748ULL /* "HWTRCHN1" */
#define HWTRACE_MARK 0x485458ULL
#define HWTRACE_MAX_WORDS 8

struct hwtrace_area {            /* 64-byte slots, then the sub-buffers' table */
	uint64_t produced;       /* sub-buffers handed off */
	uint64_t consumed;       /* sub-buffers the consumer took (it writes this) */
	uint64_t events;         /* events written */
	uint64_t lost;           /* events dropped: no free sub-buffer */
	uint64_t tid;
	uint64_t pad[3];
};

struct hwtrace_channel_header {
	uint64_t magic;
	uint32_t areas, nsub;
	uint32_t sub_size, header_size;
	uint64_t claimed;        /* areas taken by threads */
};

static struct hwtrace_channel_header *hwtrace_chan_;
static __thread struct hwtrace_area *hwtrace_area_;
static __thread uint8_t *hwtrace_base_;   /* this area's sub-buffers */
static __thread uint64_t *hwtrace_table_; /* per sub-buffer: used bytes, seq */
static __thread uint32_t hwtrace_off_;    /* in the current sub-buffer; 0: none open */
static __thread int hwtrace_dead_;

static inline int hwtrace_map_(void)
{
	const char *path = getenv("HWTRACE_CHANNEL");
	struct stat st;
	int fd;
	void *p;

	if (!path || (fd = open(path, O_RDWR)) < 0)
		return -1;
	if (fstat(fd, &st) < 0) {
		close(fd);
		return -1;
	}
	p = mmap(NULL, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED || ((struct hwtrace_channel_header *)p)->magic != HWTRACE_CHANNEL_MAGIC)
		return -1;
	hwtrace_chan_ = (struct hwtrace_channel_header *)p;
	return 0;
}

static inline int hwtrace_claim_(void)
{
	struct hwtrace_channel_header *h;
	uint64_t k;
	uint8_t *p;

	if (!hwtrace_chan_ && (hwtrace_dead_ || hwtrace_map_() < 0)) {
		hwtrace_dead_ = 1;
		return -1;
	}
	h = hwtrace_chan_;
	k = __atomic_fetch_add(&h->claimed, 1, __ATOMIC_ACQ_REL);
	if (k >= h->areas) {
		hwtrace_dead_ = 1;
		return -1;
	}
	p = (uint8_t *)h;
	hwtrace_area_ = (struct hwtrace_area *)(p + 64 + 64 * k);
	hwtrace_table_ = (uint64_t *)(p + 64 + 64 * h->areas) + 2 * (uint64_t)h->nsub * k;
	hwtrace_base_ = p + h->header_size + (uint64_t)h->nsub * h->sub_size * k;
	hwtrace_area_->tid = (uint64_t)syscall(SYS_gettid);
	return 0;
}

static inline uint8_t *hwtrace_put64_(uint8_t *q, uint64_t v, int n)
{
	for (int i = 0; i < n; i++)
		*q++ = (uint8_t)(v >> (8 * i));
	return q;
}

/* Open the next sub-buffer with PSB+ (PSB, TSC, PSBEND); 0 if none is free. */
static inline int hwtrace_open_(uint64_t tsc)
{
	struct hwtrace_area *a = hwtrace_area_;
	uint64_t consumed = __atomic_load_n(&a->consumed, __ATOMIC_ACQUIRE);
	uint8_t *q;

	if (a->produced - consumed >= hwtrace_chan_->nsub)
		return 0;
	q = hwtrace_base_ + (a->produced % hwtrace_chan_->nsub) * hwtrace_chan_->sub_size;
	for (int i = 0; i < 8; i++) {
		*q++ = 0x02;
		*q++ = 0x82;
	}
	*q++ = 0x19;
	q = hwtrace_put64_(q, tsc, 7);
	*q++ = 0x02;
	*q++ = 0x23;
	hwtrace_off_ = 26;
	return 1;
}

/* Hand the current sub-buffer to the consumer: its size, then its sequence. */
static inline void hwtrace_handoff_(void)
{
	struct hwtrace_area *a = hwtrace_area_;
	uint64_t s = a->produced % hwtrace_chan_->nsub;

	hwtrace_table_[2 * s] = hwtrace_off_;
	__atomic_store_n(&hwtrace_table_[2 * s + 1], a->produced + 1, __ATOMIC_RELEASE);
	__atomic_store_n(&a->produced, a->produced + 1, __ATOMIC_RELEASE);
	hwtrace_off_ = 0;
}

/* One event: type id and up to 8 payload words.  Returns 1 if written. */
static inline int hwtrace_emit(uint32_t type_id, int nwords, const uint64_t *words)
{
	uint64_t tsc = __rdtsc();
	uint32_t need = 8 + 10 * (uint32_t)(1 + nwords);
	uint8_t *q;

	if (nwords < 0 || nwords > HWTRACE_MAX_WORDS)
		return 0;
	if (!hwtrace_area_ && hwtrace_claim_() < 0)
		return 0;
	if (hwtrace_off_ && hwtrace_off_ + need > hwtrace_chan_->sub_size)
		hwtrace_handoff_();
	if (!hwtrace_off_ && !hwtrace_open_(tsc)) {
		hwtrace_area_->lost++;
		return 0;
	}
	q = hwtrace_base_ + (hwtrace_area_->produced % hwtrace_chan_->nsub) * hwtrace_chan_->sub_size
	    + hwtrace_off_;
	*q++ = 0x19; /* TSC */
	q = hwtrace_put64_(q, tsc, 7);
	*q++ = 0x02; /* PTW, 8-byte payload */
	*q++ = 0x32;
	q = hwtrace_put64_(q, HWTRACE_MARK << 40 | (uint64_t)nwords << 32 | type_id, 8);
	for (int i = 0; i < nwords; i++) {
		*q++ = 0x02;
		*q++ = 0x32;
		q = hwtrace_put64_(q, words[i], 8);
	}
	hwtrace_off_ += need;
	hwtrace_area_->events++;
	return 1;
}

/* Hand off what this thread wrote so far (at its end, or to show it now). */
static inline void hwtrace_flush(void)
{
	if (hwtrace_area_ && hwtrace_off_)
		hwtrace_handoff_();
}

#endif /* HWTRACE_CHANNEL_H */
