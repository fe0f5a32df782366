/* N events in a loop, one way: 0 nothing (the loop alone), 1 hwtrace's
 * software PTW channel, 2 an LTTng-UST tracepoint; prints ns per event. */
#define TRACEPOINT_DEFINE
#define TRACEPOINT_CREATE_PROBES
#include "hwbench_tp.h"
#include "hwtrace_channel.h"
#include <stdio.h>
#include <time.h>

int main(int argc, char **argv)
{
	long n = atol(argv[1]);
	int mode = atoi(argv[2]);
	struct timespec t0, t1;
	uint64_t words[2];
	volatile uint64_t sink = 0;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (long i = 0; i < n; i++) {
		words[0] = (uint64_t)i;
		words[1] = (uint64_t)i * 3;
		if (mode == 1)
			hwtrace_emit(1, 2, words);
		else if (mode == 2)
			tracepoint(hwbench, ev, words[0], words[1]);
		else
			sink += words[1];
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	if (mode == 1)
		hwtrace_flush();
	printf("%.2f\n", ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / n);
	return 0;
}
