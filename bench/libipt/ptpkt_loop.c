/*
 * ptpkt_loop - benchmark libipt's packet decoder: decode a whole file with
 * pt_pkt_next, counting packets, and report the best time of several runs.
 *
 * Usage:
 *   ptpkt_loop FILE.pt [--repeat N]        (N defaults to 5)
 *
 * Each run allocates a packet decoder on the memory-mapped file, syncs to
 * the first PSB and calls pt_pkt_next until the end; after a decode error it
 * syncs forward to the next PSB and goes on, counting the error.  Packets
 * before the first PSB are not decoded (libipt cannot know where they
 * start).  Output is one JSON line on stdout:
 *
 *   {"bytes": B, "packets": P, "errors": E, "best_seconds": S,
 *    "mb_per_s": M, "repeat": N}
 *
 * with bytes the file size and mb_per_s = bytes / 1e6 / best_seconds.  The
 * file is mapped with MAP_POPULATE so page faults stay out of the timings.
 *
 * Build: gcc -O2 -Wall -Wextra -o ptpkt_loop ptpkt_loop.c -lipt
 */

#define _GNU_SOURCE	/* MAP_POPULATE */

#include <intel-pt.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct result {
	uint64_t packets;
	uint64_t errors;
};

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static int decode_all(const struct pt_config *config, struct result *res)
{
	struct pt_packet_decoder *dec;
	struct pt_packet pkt;
	uint64_t packets = 0, errors = 0;
	int status;

	dec = pt_pkt_alloc_decoder(config);
	if (!dec)
		return -pte_nomem;

	status = pt_pkt_sync_forward(dec);
	while (status >= 0) {
		/* The hot loop: nothing but the decoder call and a count. */
		for (;;) {
			status = pt_pkt_next(dec, &pkt, sizeof(pkt));
			if (status < 0)
				break;
			++packets;
		}

		/* End of the buffer (or a packet cut short by it). */
		if (status == -pte_eos)
			break;

		++errors;
		status = pt_pkt_sync_forward(dec);
	}

	pt_pkt_free_decoder(dec);
	res->packets = packets;
	res->errors = errors;
	return 0;
}

static void usage(void)
{
	fprintf(stderr, "usage: ptpkt_loop FILE.pt [--repeat N]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	const char *path = NULL;
	long repeat = 5;
	int fd, i;
	struct stat st;
	uint8_t *data = NULL;
	struct pt_config config;
	struct result res = { 0, 0 };
	double best = 0.0;

	for (i = 1; i < argc; ++i) {
		if (!strcmp(argv[i], "--repeat") && i + 1 < argc) {
			char *end;

			repeat = strtol(argv[++i], &end, 10);
			if (*end || repeat < 1)
				usage();
		} else if (argv[i][0] == '-' && argv[i][1]) {
			usage();
		} else if (!path) {
			path = argv[i];
		} else {
			usage();
		}
	}
	if (!path)
		usage();

	fd = open(path, O_RDONLY);
	if (fd < 0 || fstat(fd, &st) < 0) {
		fprintf(stderr, "ptpkt_loop: %s: %s\n", path, strerror(errno));
		return 1;
	}

	if (st.st_size > 0) {
		data = mmap(NULL, (size_t) st.st_size, PROT_READ,
			    MAP_PRIVATE | MAP_POPULATE, fd, 0);
		if (data == MAP_FAILED) {
			fprintf(stderr, "ptpkt_loop: %s: %s\n", path,
				strerror(errno));
			return 1;
		}
		madvise(data, (size_t) st.st_size, MADV_SEQUENTIAL);

		pt_config_init(&config);
		config.begin = data;
		config.end = data + st.st_size;

		for (i = 0; i < repeat; ++i) {
			double t0, t;
			int errcode;

			t0 = now();
			errcode = decode_all(&config, &res);
			t = now() - t0;
			if (errcode < 0) {
				fprintf(stderr, "ptpkt_loop: %s\n",
					pt_errstr(pt_errcode(errcode)));
				return 1;
			}
			if (i == 0 || t < best)
				best = t;
		}
		munmap(data, (size_t) st.st_size);
	}
	close(fd);

	printf("{\"bytes\": %jd, \"packets\": %" PRIu64 ", \"errors\": %"
	       PRIu64 ", \"best_seconds\": %.6f, \"mb_per_s\": %.1f, "
	       "\"repeat\": %ld}\n", (intmax_t) st.st_size, res.packets,
	       res.errors, best,
	       best > 0.0 ? (double) st.st_size / 1e6 / best : 0.0, repeat);
	return 0;
}
