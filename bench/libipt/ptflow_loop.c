/*
 * ptflow_loop - benchmark libipt's instruction-flow decoders: reconstruct
 * every instruction of a trace with the block decoder (pt_blk_next) or the
 * instruction decoder (pt_insn_next) and report the best time of several
 * runs.
 *
 * Usage:
 *   ptflow_loop FILE.pt --raw FILE:OFFSET:SIZE:VADDR [--raw ...]
 *               [--decoder blk|insn] [--repeat N]
 *               [--mtc-freq N] [--nom-freq N]
 *               [--cpuid-0x15.eax N] [--cpuid-0x15.ebx N]
 *
 * The image is given as raw sections: SIZE bytes of FILE from OFFSET mapped
 * at VADDR (pt_image_add_file, any address space).  Loading ELF files is the
 * caller's job: bench/bench_flow.py passes an executable's PT_LOAD segments
 * this way.  Numbers take C syntax (0x... for hex).  The decoder defaults to
 * blk, N to 5.  The timing options are ptxed's: the trace's time parameters,
 * so libipt does the time keeping a real decode does (without them it skips
 * some of it and only notes lost MTC/CYC).
 *
 * Each run builds a fresh image (so libipt's per-section block cache starts
 * cold, as it does for a ptxed run), allocates a decoder on the
 * memory-mapped trace and then, timed with CLOCK_MONOTONIC, decodes the
 * whole trace the way ptxed does: sync to the first PSB, drain pending
 * events with pt_blk_event / pt_insn_event, step with pt_blk_next /
 * pt_insn_next until the end of the trace; after an error count it and sync
 * forward to the next PSB.  Image and decoder setup stay outside the timing.
 * Output is one JSON line on stdout:
 *
 *   {"decoder": "blk", "bytes": B, "instructions": I, "blocks": K,
 *    "events": V, "errors": E, "best_seconds": S, "insn_per_s": R,
 *    "repeat": N}
 *
 * with bytes the trace size, blocks 0 for the insn decoder and
 * insn_per_s = instructions / best_seconds.  Instructions of a block cut
 * short by an error still count, as ptxed prints them.
 *
 * Build: gcc -O2 -Wall -Wextra -o ptflow_loop ptflow_loop.c -lipt
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

struct raw_section {
	char *file;
	uint64_t offset;
	uint64_t size;
	uint64_t vaddr;
};

struct result {
	uint64_t instructions;
	uint64_t blocks;
	uint64_t events;
	uint64_t errors;
};

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static void usage(void)
{
	fprintf(stderr, "usage: ptflow_loop FILE.pt "
		"--raw FILE:OFFSET:SIZE:VADDR [--raw ...] [--decoder blk|insn] "
		"[--repeat N] [--mtc-freq N] [--nom-freq N] "
		"[--cpuid-0x15.eax N] [--cpuid-0x15.ebx N]\n");
	exit(2);
}

static int parse_u64(const char *text, uint64_t *value)
{
	char *end;

	if (!*text)
		return -1;
	errno = 0;
	*value = strtoull(text, &end, 0);
	return (errno || *end) ? -1 : 0;
}

/* A number option's value, at most max. */
static uint64_t parse_option(const char *name, const char *text, uint64_t max)
{
	uint64_t value;

	if (parse_u64(text, &value) < 0 || value > max) {
		fprintf(stderr, "ptflow_loop: bad %s %s\n", name, text);
		usage();
	}
	return value;
}

/* ptxed's timing options: sets the one called @name and returns 1, or
 * returns 0 if @name is none of them.
 */
static int timing_option(struct pt_config *config, const char *name,
			 const char *text)
{
	if (!strcmp(name, "--mtc-freq"))
		config->mtc_freq = (uint8_t) parse_option(name, text, 15);
	else if (!strcmp(name, "--nom-freq"))
		config->nom_freq = (uint8_t) parse_option(name, text, 0xff);
	else if (!strcmp(name, "--cpuid-0x15.eax"))
		config->cpuid_0x15_eax =
			(uint32_t) parse_option(name, text, UINT32_MAX);
	else if (!strcmp(name, "--cpuid-0x15.ebx"))
		config->cpuid_0x15_ebx =
			(uint32_t) parse_option(name, text, UINT32_MAX);
	else
		return 0;
	return 1;
}

/* FILE:OFFSET:SIZE:VADDR, split from the right so FILE may contain ':'. */
static int parse_raw(char *arg, struct raw_section *sec)
{
	char *fields[3];
	int i;

	for (i = 2; i >= 0; --i) {
		char *colon = strrchr(arg, ':');

		if (!colon || colon == arg)
			return -1;
		*colon = '\0';
		fields[i] = colon + 1;
	}
	sec->file = arg;
	if (parse_u64(fields[0], &sec->offset) < 0 ||
	    parse_u64(fields[1], &sec->size) < 0 ||
	    parse_u64(fields[2], &sec->vaddr) < 0)
		return -1;
	return 0;
}

static struct pt_image *make_image(const struct raw_section *secs, int nsecs)
{
	struct pt_image *image;
	int i;

	image = pt_image_alloc("ptflow_loop");
	if (!image)
		return NULL;
	for (i = 0; i < nsecs; ++i) {
		int errcode = pt_image_add_file(image, secs[i].file,
						secs[i].offset, secs[i].size,
						NULL, secs[i].vaddr);
		if (errcode < 0) {
			fprintf(stderr, "ptflow_loop: %s:0x%" PRIx64 ":0x%"
				PRIx64 ":0x%" PRIx64 ": %s\n", secs[i].file,
				secs[i].offset, secs[i].size, secs[i].vaddr,
				pt_errstr(pt_errcode(errcode)));
			pt_image_free(image);
			return NULL;
		}
	}
	return image;
}

/* The block decoder over the whole trace (ptxed's decode_block, minus the
 * printing).  Returns a negative pt_error_code only for setup failures.
 */
static int decode_blk(struct pt_block_decoder *dec, struct result *res)
{
	struct pt_block block;
	struct pt_event ev;
	uint64_t offset, last = 0;
	int status, have_offset = 0;

	for (;;) {
		status = pt_blk_sync_forward(dec);
		if (status < 0) {
			/* No further PSB: the trace is done. */
			if (status == -pte_eos)
				break;
			++res->errors;
			/* As ptxed: give up when syncing makes no progress. */
			if (pt_blk_get_offset(dec, &offset) < 0 ||
			    (have_offset && offset <= last))
				break;
			last = offset;
			have_offset = 1;
			continue;
		}

		for (;;) {
			while (status & pts_event_pending) {
				status = pt_blk_event(dec, &ev, sizeof(ev));
				if (status < 0)
					break;
				++res->events;
			}
			if (status < 0)
				break;
			if (status & pts_eos) {
				status = -pte_eos;
				break;
			}

			status = pt_blk_next(dec, &block, sizeof(block));
			/* A block cut short by an error still holds the
			 * instructions decoded before it (pt_blk_next zeroes
			 * the block first).
			 */
			res->instructions += block.ninsn;
			if (status < 0)
				break;
			++res->blocks;
		}

		if (status == -pte_eos)
			break;
		++res->errors;
	}
	return 0;
}

/* The instruction decoder, likewise (ptxed's decode_insn). */
static int decode_insn(struct pt_insn_decoder *dec, struct result *res)
{
	struct pt_insn insn;
	struct pt_event ev;
	uint64_t offset, last = 0;
	int status, have_offset = 0;

	for (;;) {
		status = pt_insn_sync_forward(dec);
		if (status < 0) {
			if (status == -pte_eos)
				break;
			++res->errors;
			/* As ptxed: give up when syncing makes no progress. */
			if (pt_insn_get_offset(dec, &offset) < 0 ||
			    (have_offset && offset <= last))
				break;
			last = offset;
			have_offset = 1;
			continue;
		}

		for (;;) {
			while (status & pts_event_pending) {
				status = pt_insn_event(dec, &ev, sizeof(ev));
				if (status < 0)
					break;
				++res->events;
			}
			if (status < 0)
				break;
			if (status & pts_eos) {
				status = -pte_eos;
				break;
			}

			status = pt_insn_next(dec, &insn, sizeof(insn));
			if (status < 0)
				break;
			++res->instructions;
		}

		if (status == -pte_eos)
			break;
		++res->errors;
	}
	return 0;
}

/* One run: set up (untimed), decode (timed), tear down. */
static int run_once(const struct pt_config *config, int use_blk,
		    const struct raw_section *secs, int nsecs,
		    struct result *res, double *seconds)
{
	struct pt_image *image;
	double t0;
	int errcode;

	memset(res, 0, sizeof(*res));
	image = make_image(secs, nsecs);
	if (!image)
		return -pte_nomem;

	if (use_blk) {
		struct pt_block_decoder *dec = pt_blk_alloc_decoder(config);

		if (!dec) {
			pt_image_free(image);
			return -pte_nomem;
		}
		errcode = pt_blk_set_image(dec, image);
		if (errcode >= 0) {
			t0 = now();
			errcode = decode_blk(dec, res);
			*seconds = now() - t0;
		}
		pt_blk_free_decoder(dec);
	} else {
		struct pt_insn_decoder *dec = pt_insn_alloc_decoder(config);

		if (!dec) {
			pt_image_free(image);
			return -pte_nomem;
		}
		errcode = pt_insn_set_image(dec, image);
		if (errcode >= 0) {
			t0 = now();
			errcode = decode_insn(dec, res);
			*seconds = now() - t0;
		}
		pt_insn_free_decoder(dec);
	}
	pt_image_free(image);
	return errcode;
}

int main(int argc, char **argv)
{
	const char *path = NULL;
	struct raw_section *secs;
	int nsecs = 0, use_blk = 1, fd, i;
	long repeat = 5;
	struct stat st;
	uint8_t *data;
	struct pt_config config;
	struct result res, best_res;
	double best = 0.0;

	pt_config_init(&config);

	secs = calloc((size_t) argc, sizeof(*secs));
	if (!secs)
		return 1;
	for (i = 1; i < argc; ++i) {
		if (!strcmp(argv[i], "--repeat") && i + 1 < argc) {
			char *end;

			repeat = strtol(argv[++i], &end, 10);
			if (*end || repeat < 1)
				usage();
		} else if (!strcmp(argv[i], "--decoder") && i + 1 < argc) {
			++i;
			if (!strcmp(argv[i], "blk"))
				use_blk = 1;
			else if (!strcmp(argv[i], "insn"))
				use_blk = 0;
			else
				usage();
		} else if (!strcmp(argv[i], "--raw") && i + 1 < argc) {
			if (parse_raw(argv[++i], &secs[nsecs]) < 0) {
				fprintf(stderr, "ptflow_loop: bad --raw %s\n",
					argv[i]);
				usage();
			}
			++nsecs;
		} else if (i + 1 < argc &&
			   timing_option(&config, argv[i], argv[i + 1])) {
			++i;
		} else if (argv[i][0] == '-' && argv[i][1]) {
			usage();
		} else if (!path) {
			path = argv[i];
		} else {
			usage();
		}
	}
	if (!path || !nsecs)
		usage();

	fd = open(path, O_RDONLY);
	if (fd < 0 || fstat(fd, &st) < 0) {
		fprintf(stderr, "ptflow_loop: %s: %s\n", path, strerror(errno));
		return 1;
	}
	if (st.st_size <= 0) {
		fprintf(stderr, "ptflow_loop: %s: empty trace\n", path);
		return 1;
	}
	/* MAP_POPULATE keeps page faults on the trace out of the timings. */
	data = mmap(NULL, (size_t) st.st_size, PROT_READ,
		    MAP_PRIVATE | MAP_POPULATE, fd, 0);
	if (data == MAP_FAILED) {
		fprintf(stderr, "ptflow_loop: %s: %s\n", path, strerror(errno));
		return 1;
	}

	config.begin = data;
	config.end = data + st.st_size;

	memset(&best_res, 0, sizeof(best_res));
	for (i = 0; i < repeat; ++i) {
		double t = 0.0;
		int errcode;

		errcode = run_once(&config, use_blk, secs, nsecs, &res, &t);
		if (errcode < 0) {
			fprintf(stderr, "ptflow_loop: %s\n",
				pt_errstr(pt_errcode(errcode)));
			return 1;
		}
		if (i > 0 && res.instructions != best_res.instructions)
			fprintf(stderr, "ptflow_loop: instruction count "
				"changed between runs: %" PRIu64 " then %"
				PRIu64 "\n", best_res.instructions,
				res.instructions);
		if (i == 0 || t < best) {
			best = t;
			best_res = res;
		}
	}
	munmap(data, (size_t) st.st_size);
	close(fd);
	free(secs);

	printf("{\"decoder\": \"%s\", \"bytes\": %jd, \"instructions\": %"
	       PRIu64 ", \"blocks\": %" PRIu64 ", \"events\": %" PRIu64
	       ", \"errors\": %" PRIu64 ", \"best_seconds\": %.6f, "
	       "\"insn_per_s\": %.1f, \"repeat\": %ld}\n",
	       use_blk ? "blk" : "insn", (intmax_t) st.st_size,
	       best_res.instructions, best_res.blocks, best_res.events,
	       best_res.errors, best,
	       best > 0.0 ? (double) best_res.instructions / best : 0.0,
	       repeat);
	return 0;
}
