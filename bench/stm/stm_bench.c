/* N events in a loop, one way, printing ns per event:
 *   0 nothing (the loop alone), 1 hwtrace's software PTW channel,
 *   2 an LTTng-UST tracepoint, 3 hwtrace's virtual STM (hwtrace_stm.h),
 *   each event two 64-bit words (as bench/channel/channel_bench.c);
 * or, mode 4, N events paced at RATE per second (event i due at i / RATE,
 * on the TSC, at once when late), each one 24-bit integer stored as D32
 * into the virtual STM (the paper's payload); prints the seconds taken
 * and the TSC's frequency.
 *
 *   stm_bench N MODE [RATE]
 */
#define TRACEPOINT_DEFINE
#define TRACEPOINT_CREATE_PROBES
#include "hwbench_tp.h"
#include "hwtrace_channel.h"
#include "hwtrace_stm.h"
#include <stdio.h>
#include <time.h>

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

/* TSC ticks per second, over 20 ms. */
static double tsc_hz(void)
{
	double t0 = now_s(), t1;
	uint64_t c0 = __rdtsc(), c1;
	do {
		t1 = now_s();
		c1 = __rdtsc();
	} while (t1 - t0 < 0.02);
	return (c1 - c0) / (t1 - t0);
}

static int paced(long n, double rate)
{
	double hz = tsc_hz(), step = hz / rate;
	uint64_t t0 = __rdtsc(), due;

	for (long i = 0; i < n; i++) {
		due = t0 + (uint64_t)(i * step);
		while (__rdtsc() < due)
			_mm_pause();
		hwtrace_stm_emit32((uint32_t)i & 0xffffff);
	}
	printf("%.6f %.0f\n", (__rdtsc() - t0) / hz, hz);
	return 0;
}

int main(int argc, char **argv)
{
	long n = atol(argv[1]);
	int mode = atoi(argv[2]);
	struct timespec t0, t1;
	uint64_t words[2];
	volatile uint64_t sink = 0;

	if (mode == 4)
		return paced(n, atof(argv[3]));
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (long i = 0; i < n; i++) {
		words[0] = (uint64_t)i;
		words[1] = (uint64_t)i * 3;
		if (mode == 1)
			hwtrace_emit(1, 2, words);
		else if (mode == 2)
			tracepoint(hwbench, ev, words[0], words[1]);
		else if (mode == 3)
			hwtrace_stm_emit(2, words);
		else
			sink += words[1];
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	if (mode == 1)
		hwtrace_flush();
	printf("%.2f\n", ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / n);
	return 0;
}
