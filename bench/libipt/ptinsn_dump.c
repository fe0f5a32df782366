/*
 * ptinsn_dump - print the instruction flow of an Intel PT file as libipt's
 * instruction decoder (pt_insn_next) reconstructs it, one IP a line, or as
 * its block decoder (pt_blk_next) does, one block a line, for use as a test
 * oracle.
 *
 * Usage:
 *   ptinsn_dump [options] FILE.pt
 *
 *   --elf FILE[:BASE]              map FILE's PT_LOAD segments (with file
 *                                  bytes) at their link addresses, or with
 *                                  the lowest one at BASE
 *   --raw FILE:OFFSET:SIZE:VADDR   map SIZE bytes of FILE from OFFSET at VADDR
 *   --cpu F/M[/S]                  the traced CPU (enables its errata
 *                                  workarounds, as ptxed --cpu)
 *   --mtc-freq N, --nom-freq N, --cpuid-0x15.eax N, --cpuid-0x15.ebx N
 *                                  timing parameters (as ptxed)
 *   --events                       also print events
 *   --time                         also print the decoder's time before
 *                                  each block (pt_blk_time, as ptxed
 *                                  --time) or instruction (pt_insn_time)
 *                                  when it changed
 *   --block                        use the block decoder
 *
 * Numbers may be decimal or 0x-prefixed hexadecimal.  Later sections replace
 * what they overlap in earlier ones (pt_image_add_file).
 *
 * Output (stdout):
 *
 *   IP                             an executed instruction: lowercase hex,
 *                                  no prefix, e.g. "401000"
 *   ! error OFFSET IP CODE TEXT    a decode error at trace OFFSET (hex, 0x
 *                                  prefixed) and instruction IP (0x-hex, 0x0
 *                                  if not known); CODE is the positive enum
 *                                  pt_error_code value, TEXT pt_errstr's
 *                                  text.  Decoding resumes at the next PSB.
 *   time TSC                       with --time: the time (lowercase hex,
 *                                  no prefix; 0: none yet) from the next
 *                                  block or instruction on
 *   # event NAME [ip=0x..]         with --events: an event (NAME as in
 *                                  enum pt_event_type without "ptev_")
 *   block IP END_IP NINSN          with --block, instead of IP lines: a
 *                                  block of NINSN instructions (decimal)
 *                                  from IP to END_IP (lowercase hex, no
 *                                  prefix), sequential apart from direct
 *                                  jumps and calls, which the reader follows
 *
 * Reaching the end of the trace is not an error.  Diagnostics about the
 * command line or files go to stderr with exit status 2.
 *
 * Build: gcc -O2 -Wall -Wextra -o ptinsn_dump ptinsn_dump.c -lipt
 */

#include <intel-pt.h>

#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static void die(const char *fmt, const char *arg)
{
	fprintf(stderr, "ptinsn_dump: ");
	fprintf(stderr, fmt, arg);
	fprintf(stderr, "\n");
	exit(2);
}

static void usage(void)
{
	fprintf(stderr,
		"usage: ptinsn_dump [--elf FILE[:BASE]] "
		"[--raw FILE:OFFSET:SIZE:VADDR] [--cpu F/M[/S]] "
		"[--mtc-freq N] [--nom-freq N] [--cpuid-0x15.eax N] "
		"[--cpuid-0x15.ebx N] [--events] [--time] [--block] FILE.pt\n");
	exit(2);
}

static uint64_t parse_num(const char *text)
{
	char *end;
	uint64_t v;

	errno = 0;
	v = strtoull(text, &end, 0);
	if (errno || end == text || *end)
		die("bad number: %s", text);
	return v;
}

/* Split "a:b:c" at the last ':' (file names may hold ':' only before). */
static char *split_last(char *text)
{
	char *colon = strrchr(text, ':');

	if (!colon)
		return NULL;
	*colon = '\0';
	return colon + 1;
}

static void add_file(struct pt_image *image, const char *file,
		     uint64_t offset, uint64_t size, uint64_t vaddr)
{
	int errcode = pt_image_add_file(image, file, offset, size, NULL, vaddr);

	if (errcode < 0) {
		fprintf(stderr, "ptinsn_dump: %s: cannot map 0x%" PRIx64
			"+0x%" PRIx64 " at 0x%" PRIx64 ": %s\n", file, offset,
			size, vaddr, pt_errstr(pt_errcode(errcode)));
		exit(2);
	}
}

static void add_raw(struct pt_image *image, char *spec)
{
	char *vaddr = split_last(spec), *size, *offset;

	size = vaddr ? split_last(spec) : NULL;
	offset = size ? split_last(spec) : NULL;
	if (!offset)
		die("--raw needs FILE:OFFSET:SIZE:VADDR, not %s", spec);
	add_file(image, spec, parse_num(offset), parse_num(size),
		 parse_num(vaddr));
}

/* Map an ELF64 file's PT_LOAD segments, as ptxed's --elf does. */
static void add_elf(struct pt_image *image, char *spec)
{
	char *base_text = NULL, *colon = strrchr(spec, ':');
	Elf64_Ehdr eh;
	Elf64_Phdr ph;
	uint64_t low = UINT64_MAX, bias = 0;
	FILE *f;
	int i, pass;

	if (colon) {
		*colon = '\0';
		base_text = colon + 1;
	}
	f = fopen(spec, "rb");
	if (!f)
		die("cannot open %s", spec);
	if (fread(&eh, sizeof(eh), 1, f) != 1 ||
	    memcmp(eh.e_ident, ELFMAG, SELFMAG) ||
	    eh.e_ident[EI_CLASS] != ELFCLASS64)
		die("%s: not an ELF64 file", spec);

	/* First pass: the lowest segment address, for the bias. */
	for (pass = 0; pass < 2; ++pass) {
		for (i = 0; i < eh.e_phnum; ++i) {
			long at = (long) (eh.e_phoff + (uint64_t) i *
					  eh.e_phentsize);

			if (fseek(f, at, SEEK_SET) ||
			    fread(&ph, sizeof(ph), 1, f) != 1)
				die("%s: bad program header", spec);
			if (ph.p_type != PT_LOAD || !ph.p_filesz)
				continue;
			if (!pass) {
				if (ph.p_vaddr < low)
					low = ph.p_vaddr;
				continue;
			}
			add_file(image, spec, ph.p_offset, ph.p_filesz,
				 ph.p_vaddr + bias);
		}
		if (!pass && base_text && low != UINT64_MAX)
			bias = parse_num(base_text) - low;
	}
	fclose(f);
}

static const char *event_name(enum pt_event_type type)
{
	switch (type) {
	case ptev_enabled:		return "enabled";
	case ptev_disabled:		return "disabled";
	case ptev_async_disabled:	return "async_disabled";
	case ptev_async_branch:		return "async_branch";
	case ptev_paging:		return "paging";
	case ptev_async_paging:		return "async_paging";
	case ptev_overflow:		return "overflow";
	case ptev_exec_mode:		return "exec_mode";
	case ptev_tsx:			return "tsx";
	case ptev_stop:			return "stop";
	case ptev_vmcs:			return "vmcs";
	case ptev_async_vmcs:		return "async_vmcs";
	case ptev_exstop:		return "exstop";
	case ptev_mwait:		return "mwait";
	case ptev_pwre:			return "pwre";
	case ptev_pwrx:			return "pwrx";
	case ptev_ptwrite:		return "ptwrite";
	case ptev_tick:			return "tick";
	case ptev_cbr:			return "cbr";
	case ptev_mnt:			return "mnt";
	}
	return "unknown";
}

static void print_event(const struct pt_event *ev)
{
	printf("# event %s", event_name(ev->type));
	if (ev->status_update)
		printf(" status");
	switch (ev->type) {
	case ptev_enabled:
		printf(" ip=0x%" PRIx64, ev->variant.enabled.ip);
		break;
	case ptev_disabled:
		if (!ev->ip_suppressed)
			printf(" ip=0x%" PRIx64, ev->variant.disabled.ip);
		break;
	case ptev_async_disabled:
		printf(" at=0x%" PRIx64, ev->variant.async_disabled.at);
		if (!ev->ip_suppressed)
			printf(" ip=0x%" PRIx64,
			       ev->variant.async_disabled.ip);
		break;
	case ptev_async_branch:
		printf(" from=0x%" PRIx64 " to=0x%" PRIx64,
		       ev->variant.async_branch.from,
		       ev->variant.async_branch.to);
		break;
	default:
		break;
	}
	printf("\n");
}

/* The offset is unknown (0) before the first synchronization. */
static void print_error(uint64_t offset, uint64_t ip, int status)
{
	printf("! error 0x%" PRIx64 " 0x%" PRIx64 " %d %s\n", offset, ip,
	       -status, pt_errstr(pt_errcode(status)));
}

/* Drain pending events; returns the last status. */
static int drain_events(struct pt_insn_decoder *dec, int status, int show)
{
	while (status >= 0 && (status & pts_event_pending)) {
		struct pt_event ev;

		status = pt_insn_event(dec, &ev, sizeof(ev));
		if (status >= 0 && show)
			print_event(&ev);
	}
	return status;
}

static int drain_blk_events(struct pt_block_decoder *dec, int status, int show)
{
	while (status >= 0 && (status & pts_event_pending)) {
		struct pt_event ev;

		status = pt_blk_event(dec, &ev, sizeof(ev));
		if (status >= 0 && show)
			print_event(&ev);
	}
	return status;
}

/* As decode() below, with the block decoder. */
static uint64_t last_time = UINT64_MAX;

/* The time the decoder gives before the next block or instruction, when it
 * changed ("no time" is 0).
 */
static void print_time(uint64_t tsc, int status)
{
	if (status < 0)
		tsc = 0;
	if (tsc != last_time)
		printf("time %" PRIx64 "\n", tsc);
	last_time = tsc;
}

static void decode_blocks(struct pt_block_decoder *dec, int show_events,
			  int show_time)
{
	uint64_t last_error_offset = UINT64_MAX, offset;

	for (;;) {
		struct pt_block block;
		int status;

		memset(&block, 0, sizeof(block));
		status = pt_blk_sync_forward(dec);
		if (status < 0) {
			if (status != -pte_eos) {
				offset = 0;
				(void) pt_blk_get_offset(dec, &offset);
				print_error(offset, 0, status);
			}
			return;
		}

		for (;;) {
			status = drain_blk_events(dec, status, show_events);
			if (status < 0)
				break;
			if (status & pts_eos) {
				status = -pte_eos;
				break;
			}
			if (show_time) {
				uint64_t tsc = 0;

				print_time(tsc, pt_blk_time(dec, &tsc, NULL,
							    NULL));
			}
			status = pt_blk_next(dec, &block, sizeof(block));
			/* A block cut short by an error still ran. */
			if (block.ninsn)
				printf("block %" PRIx64 " %" PRIx64 " %u\n",
				       block.ip, block.end_ip,
				       (unsigned) block.ninsn);
			if (status < 0)
				break;
		}
		if (status == -pte_eos)
			return;
		offset = 0;
		(void) pt_blk_get_offset(dec, &offset);
		print_error(offset, block.ninsn ? block.end_ip : block.ip,
			    status);
		if (offset == last_error_offset)
			return;
		last_error_offset = offset;
	}
}

static void decode(struct pt_insn_decoder *dec, int show_events,
		   int show_time)
{
	uint64_t last_error_offset = UINT64_MAX;

	for (;;) {
		struct pt_insn insn;
		int status;

		memset(&insn, 0, sizeof(insn));
		status = pt_insn_sync_forward(dec);
		if (status < 0) {
			if (status != -pte_eos) {
				uint64_t offset = 0;

				(void) pt_insn_get_offset(dec, &offset);
				print_error(offset, 0, status);
			}
			return;
		}

		for (;;) {
			status = drain_events(dec, status, show_events);
			if (status < 0)
				break;
			if (status & pts_eos) {
				status = -pte_eos;
				break;
			}
			if (show_time) {
				uint64_t tsc = 0;

				print_time(tsc, pt_insn_time(dec, &tsc, NULL,
							     NULL));
			}
			status = pt_insn_next(dec, &insn, sizeof(insn));
			/* Even on an error the instruction may be valid. */
			if (insn.iclass != ptic_error)
				printf("%" PRIx64 "\n", insn.ip);
			if (status < 0)
				break;
		}
		if (status == -pte_eos)
			return;

		/* Give up if resynchronizing makes no progress. */
		{
			uint64_t offset = 0;

			(void) pt_insn_get_offset(dec, &offset);
			print_error(offset, insn.ip, status);
			if (offset == last_error_offset)
				return;
			last_error_offset = offset;
		}
	}
}

int main(int argc, char **argv)
{
	const char *path = NULL;
	int fd, i, show_events = 0, show_time = 0, blocks = 0;
	struct stat st;
	uint8_t *data;
	struct pt_config config;
	struct pt_image *image;
	static char outbuf[1 << 16];

	pt_config_init(&config);
	image = pt_image_alloc("ptinsn_dump");
	if (!image)
		die("%s", "cannot allocate an image");

	for (i = 1; i < argc; ++i) {
		const char *arg = argv[i];
		int has_value = i + 1 < argc;

		if (!strcmp(arg, "--events"))
			show_events = 1;
		else if (!strcmp(arg, "--time"))
			show_time = 1;
		else if (!strcmp(arg, "--block"))
			blocks = 1;
		else if (!strcmp(arg, "--elf") && has_value)
			add_elf(image, argv[++i]);
		else if (!strcmp(arg, "--raw") && has_value)
			add_raw(image, argv[++i]);
		else if (!strcmp(arg, "--cpu") && has_value) {
			char *text = argv[++i], *end;
			unsigned long v[3] = { 0, 0, 0 };
			int n = 0;

			for (;;) {
				v[n++] = strtoul(text, &end, 0);
				if (end == text || n > 3)
					die("bad --cpu: %s", argv[i]);
				if (!*end)
					break;
				if (*end != '/' || n == 3)
					die("bad --cpu: %s", argv[i]);
				text = end + 1;
			}
			if (n < 2)
				die("bad --cpu: %s", argv[i]);
			config.cpu.vendor = pcv_intel;
			config.cpu.family = (uint16_t) v[0];
			config.cpu.model = (uint8_t) v[1];
			config.cpu.stepping = (uint8_t) v[2];
			if (pt_cpu_errata(&config.errata, &config.cpu) < 0)
				die("unknown cpu: %s", argv[i]);
		} else if (!strcmp(arg, "--mtc-freq") && has_value)
			config.mtc_freq = (uint8_t) parse_num(argv[++i]);
		else if (!strcmp(arg, "--nom-freq") && has_value)
			config.nom_freq = (uint8_t) parse_num(argv[++i]);
		else if (!strcmp(arg, "--cpuid-0x15.eax") && has_value)
			config.cpuid_0x15_eax = (uint32_t) parse_num(argv[++i]);
		else if (!strcmp(arg, "--cpuid-0x15.ebx") && has_value)
			config.cpuid_0x15_ebx = (uint32_t) parse_num(argv[++i]);
		else if (arg[0] == '-' && arg[1])
			usage();
		else if (!path)
			path = arg;
		else
			usage();
	}
	if (!path)
		usage();

	fd = open(path, O_RDONLY);
	if (fd < 0 || fstat(fd, &st) < 0)
		die("cannot open %s", path);
	if (st.st_size == 0)
		return 0;
	data = mmap(NULL, (size_t) st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (data == MAP_FAILED)
		die("cannot map %s", path);
	close(fd);

	setvbuf(stdout, outbuf, _IOFBF, sizeof(outbuf));

	config.begin = data;
	config.end = data + st.st_size;
	if (blocks) {
		struct pt_block_decoder *bdec = pt_blk_alloc_decoder(&config);

		if (!bdec)
			die("%s", "cannot allocate the decoder");
		if (pt_blk_set_image(bdec, image) < 0)
			die("%s", "cannot set the image");
		decode_blocks(bdec, show_events, show_time);
		pt_blk_free_decoder(bdec);
	} else {
		struct pt_insn_decoder *dec = pt_insn_alloc_decoder(&config);

		if (!dec)
			die("%s", "cannot allocate the decoder");
		if (pt_insn_set_image(dec, image) < 0)
			die("%s", "cannot set the image");
		decode(dec, show_events, show_time);
		pt_insn_free_decoder(dec);
	}
	pt_image_free(image);
	munmap(data, (size_t) st.st_size);
	if (fflush(stdout) != 0)
		die("write error: %s", strerror(errno));
	return 0;
}
