/*
 * xdc_loop - benchmark libxdc (kAFL/Nyx's Intel PT decoder): decode a
 * whole trace against an ELF image and report the time.
 *
 * Usage:
 *   xdc_loop ELF TRACE REPEAT [--strip-timing]
 *
 * The image is the ELF's PT_LOAD segments, loaded into memory (.bss
 * zero-filled); libxdc's page-fetch callback is served from them.  The
 * filter ranges libxdc disassembles in (libxdc_init's filter[4][2]) are the
 * executable PT_LOAD segments, at most four.  libxdc only accepts traces
 * recorded with return compression and CYC, TSC and MTC packets off (its
 * readme); --strip-timing drops TSC, TMA, MTC and CYC packets from the
 * trace before decoding (a diagnostic: compressed returns still confuse it).
 *
 * Runs, each timed with CLOCK_MONOTONIC around libxdc_decode alone:
 *
 *   first:  a fresh decoder (libxdc_init), so its CFG and trace caches are
 *           empty: a single decode as a one-off tool would see it;
 *   warm:   REPEAT more decodes with that same decoder, caches kept and the
 *           bitmap reset between runs (libxdc's tester, performance mode,
 *           and a fuzzer decode the same code over and over); best kept;
 *   edges:  untimed, a fresh decoder in trace mode (libxdc_enable_tracing)
 *           with an edge callback counting every edge it reports, to check
 *           that it followed the whole trace.
 *
 * Output is one line of key=value pairs on stdout:
 *
 *   bytes=B first_seconds=S first_result=R seconds=S runs=N result=R
 *   edges=E edges_result=R [page_fault=0x...]
 *
 * with bytes the size of the decoded trace (after stripping, without the
 * end marker) and results libxdc's decoder_result_t names.
 *
 * Build (against libxdc.a from libxdc's Makefile, with its flags):
 *   gcc -Ofast -flto -Wall -Wextra -I LIBXDC -o xdc_loop xdc_loop.c \
 *       LIBXDC/libxdc.a -lcapstone
 */

#include <libxdc.h>

#include <elf.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PAGE_SIZE 0x1000ULL
#define PAGE_MASK (~(PAGE_SIZE - 1))
/* libxdc's tester appends 16 PT_TRACE_END bytes; libxdc_decode needs one. */
#define END_MARKER_BYTES 16
/* libxdc's tester uses a 64 KiB bitmap. */
#define BITMAP_SIZE 0x10000

struct image {
	uint8_t *data;		/* pages [lo, hi) */
	uint64_t lo;
	uint64_t hi;
};

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static const char *result_name(decoder_result_t result)
{
	switch (result) {
	case decoder_success:
		return "decoder_success";
	case decoder_success_pt_overflow:
		return "decoder_success_pt_overflow";
	case decoder_page_fault:
		return "decoder_page_fault";
	case decoder_error:
		return "decoder_error";
	case decoder_unkown_packet:
		return "decoder_unkown_packet";	/* libxdc's spelling */
	}
	return "decoder_result_unknown";
}

static uint8_t *read_file(const char *path, size_t extra, size_t *size)
{
	FILE *f = fopen(path, "rb");
	uint8_t *data;
	long n;

	if (!f) {
		fprintf(stderr, "%s: %s\n", path, strerror(errno));
		exit(1);
	}
	if (fseek(f, 0, SEEK_END) || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET)) {
		fprintf(stderr, "%s: cannot size\n", path);
		exit(1);
	}
	data = malloc((size_t) n + extra);
	if (!data || fread(data, 1, (size_t) n, f) != (size_t) n) {
		fprintf(stderr, "%s: cannot read\n", path);
		exit(1);
	}
	fclose(f);
	*size = (size_t) n;
	return data;
}

/*
 * Load the PT_LOAD segments of a 64-bit ELF into one zero-filled range of
 * pages and take the executable ones as libxdc's filter ranges.
 */
static void load_elf(const char *path, struct image *image, uint64_t filter[4][2])
{
	size_t size;
	uint8_t *file = read_file(path, 0, &size);
	const Elf64_Ehdr *eh = (const Elf64_Ehdr *) file;
	const Elf64_Phdr *ph;
	int i, nfilter = 0;

	if (size < sizeof(*eh) || memcmp(eh->e_ident, ELFMAG, SELFMAG) ||
	    eh->e_ident[EI_CLASS] != ELFCLASS64 || eh->e_machine != EM_X86_64 ||
	    eh->e_phoff + (uint64_t) eh->e_phnum * sizeof(*ph) > size) {
		fprintf(stderr, "%s: not a 64-bit x86 ELF file\n", path);
		exit(1);
	}
	ph = (const Elf64_Phdr *) (file + eh->e_phoff);
	image->lo = UINT64_MAX;
	image->hi = 0;
	for (i = 0; i < eh->e_phnum; i++) {
		if (ph[i].p_type != PT_LOAD || !ph[i].p_memsz)
			continue;
		if (ph[i].p_vaddr < image->lo)
			image->lo = ph[i].p_vaddr & PAGE_MASK;
		if (ph[i].p_vaddr + ph[i].p_memsz > image->hi)
			image->hi = (ph[i].p_vaddr + ph[i].p_memsz + PAGE_SIZE - 1) & PAGE_MASK;
	}
	/* A static executable spans a few MiB; calloc maps the gaps lazily. */
	if (image->hi <= image->lo || image->hi - image->lo > (1ULL << 30)) {
		fprintf(stderr, "%s: PT_LOAD segments missing or spread over > 1 GiB\n", path);
		exit(1);
	}
	image->data = calloc(1, image->hi - image->lo);
	if (!image->data) {
		fprintf(stderr, "%s: out of memory\n", path);
		exit(1);
	}
	for (i = 0; i < eh->e_phnum; i++) {
		if (ph[i].p_type != PT_LOAD || !ph[i].p_memsz)
			continue;
		if (ph[i].p_offset + ph[i].p_filesz > size || ph[i].p_filesz > ph[i].p_memsz) {
			fprintf(stderr, "%s: segment %d out of the file\n", path, i);
			exit(1);
		}
		memcpy(image->data + (ph[i].p_vaddr - image->lo), file + ph[i].p_offset,
		       ph[i].p_filesz);
		if (!(ph[i].p_flags & PF_X))
			continue;
		if (nfilter == 4) {
			fprintf(stderr, "%s: more than 4 executable segments\n", path);
			exit(1);
		}
		filter[nfilter][0] = ph[i].p_vaddr;
		filter[nfilter][1] = ph[i].p_vaddr + ph[i].p_memsz;
		nfilter++;
	}
	if (!nfilter) {
		fprintf(stderr, "%s: no executable PT_LOAD segment\n", path);
		exit(1);
	}
	free(file);
}

/* libxdc's page_cache_fetch: the 4 KiB page holding address, or failure. */
static void *fetch_page(void *opaque, uint64_t address, bool *success)
{
	const struct image *image = opaque;

	if (address < image->lo || address >= image->hi) {
		*success = false;
		return NULL;
	}
	*success = true;
	return image->data + ((address & PAGE_MASK) - image->lo);
}

static void count_edge(void *opaque, uint64_t from, uint64_t to)
{
	(void) from;
	(void) to;
	(*(uint64_t *) opaque)++;
}

/* The size of the packet at p (Intel SDM, Vol. 3, 33.4), 0 if unknown. */
static size_t packet_size(const uint8_t *p, const uint8_t *end)
{
	static const size_t ip_bytes[8] = { 0, 2, 4, 6, 6, 0, 8, 0 };
	uint8_t b = p[0];
	size_t n;

	if (b == 0x02) {
		if (end - p < 2)
			return 0;
		switch (p[1]) {
		case 0x82: return 16;	/* PSB */
		case 0x23: return 2;	/* PSBEND */
		case 0x03: return 4;	/* CBR */
		case 0xf3: return 2;	/* OVF */
		case 0xa3: return 8;	/* LTNT */
		case 0x43: return 8;	/* PIP */
		case 0x73: return 7;	/* TMA */
		case 0xc8: return 7;	/* VMCS */
		case 0xc3: return 11;	/* MNT */
		case 0x83: return 2;	/* TraceStop */
		case 0x62: case 0xe2: return 2;	/* EXSTOP */
		case 0x22: return 4;	/* PWRE */
		case 0xa2: return 7;	/* PWRX */
		case 0xc2: return 10;	/* MWAIT */
		}
		if ((p[1] & 0x1f) == 0x12)	/* PTW */
			return ((p[1] >> 5) & 3) ? 10 : 6;
		return 0;
	}
	if (b == 0x00 || !(b & 1))	/* PAD, TNT-8 */
		return 1;
	if ((b & 3) == 3) {		/* CYC: more bytes while bit 0 is set */
		n = 1;
		if (b & 4)
			while (p + n < end && (p[n++] & 1))
				;
		return n;
	}
	switch (b & 0x1f) {
	case 0x01: case 0x0d: case 0x11: case 0x1d:	/* TIP.PGD, TIP, TIP.PGE, FUP */
		n = ip_bytes[b >> 5];
		return (n || !(b >> 5)) ? 1 + n : 0;
	}
	switch (b) {
	case 0x19: return 8;	/* TSC */
	case 0x59: return 2;	/* MTC */
	case 0x99: return 2;	/* MODE */
	}
	return 0;
}

static bool is_timing(const uint8_t *p)
{
	return p[0] == 0x19 || p[0] == 0x59 || (p[0] & 3) == 3 ||
	       (p[0] == 0x02 && p[1] == 0x73);
}

/* Copy the trace without TSC, TMA, MTC and CYC packets, in place. */
static size_t strip_timing(uint8_t *trace, size_t size)
{
	const uint8_t *end = trace + size, *p = trace;
	uint8_t *out = trace;
	size_t n;

	while (p < end) {
		n = packet_size(p, end);
		if (!n || n > (size_t) (end - p)) {
			fprintf(stderr, "--strip-timing: unknown packet 0x%02x at offset %zu\n",
				p[0], (size_t) (p - trace));
			exit(1);
		}
		if (!is_timing(p)) {
			memmove(out, p, n);
			out += n;
		}
		p += n;
	}
	return (size_t) (out - trace);
}

int main(int argc, char **argv)
{
	uint64_t filter[4][2] = { { 0 } };
	struct image image;
	uint8_t *trace, *bitmap;
	size_t size;
	long repeat;
	libxdc_t *decoder;
	decoder_result_t first_result, result = decoder_success, edges_result;
	uint64_t edges = 0, page_fault = 0;
	double t0, first_seconds, best = -1.0;
	long i;

	if (argc < 4 || argc > 5 || (argc == 5 && strcmp(argv[4], "--strip-timing"))) {
		fprintf(stderr, "usage: xdc_loop ELF TRACE REPEAT [--strip-timing]\n");
		return 2;
	}
	repeat = strtol(argv[3], NULL, 0);
	if (repeat < 1) {
		fprintf(stderr, "xdc_loop: REPEAT must be at least 1\n");
		return 2;
	}
	load_elf(argv[1], &image, filter);
	trace = read_file(argv[2], END_MARKER_BYTES, &size);
	if (argc == 5)
		size = strip_timing(trace, size);
	memset(trace + size, PT_TRACE_END, END_MARKER_BYTES);
	bitmap = calloc(1, BITMAP_SIZE);
	if (!bitmap)
		return 1;

	decoder = libxdc_init(filter, fetch_page, &image, bitmap, BITMAP_SIZE);
	if (!decoder) {
		fprintf(stderr, "xdc_loop: libxdc_init failed\n");
		return 1;
	}
	t0 = now();
	first_result = libxdc_decode(decoder, trace, size);
	first_seconds = now() - t0;
	if (first_result == decoder_page_fault)
		page_fault = libxdc_get_page_fault_addr(decoder);
	for (i = 0; i < repeat; i++) {
		double seconds;

		libxdc_bitmap_reset(decoder);
		t0 = now();
		result = libxdc_decode(decoder, trace, size);
		seconds = now() - t0;
		if (best < 0 || seconds < best)
			best = seconds;
	}
	libxdc_free(decoder);

	decoder = libxdc_init(filter, fetch_page, &image, bitmap, BITMAP_SIZE);
	if (!decoder) {
		fprintf(stderr, "xdc_loop: libxdc_init failed\n");
		return 1;
	}
	libxdc_enable_tracing(decoder);
	libxdc_register_edge_callback(decoder, count_edge, &edges);
	edges_result = libxdc_decode(decoder, trace, size);
	libxdc_disable_tracing(decoder);
	libxdc_free(decoder);

	printf("bytes=%zu first_seconds=%.9f first_result=%s seconds=%.9f runs=%ld "
	       "result=%s edges=%" PRIu64 " edges_result=%s",
	       size, first_seconds, result_name(first_result), best, repeat,
	       result_name(result), edges, result_name(edges_result));
	if (page_fault)
		printf(" page_fault=0x%" PRIx64, page_fault);
	printf("\n");
	free(bitmap);
	free(trace);
	free(image.data);
	return 0;
}
