/*
 * ptgen - write a random but realistic Intel PT packet stream with libipt's
 * packet encoder (pt_enc_next).
 *
 * Usage:
 *   ptgen OUT.pt SIZE_BYTES [--seed N] [--psb-period BYTES] [--mix bench|all]
 *        [--check]
 *
 * The stream starts with a PSB+ header (PSB, TSC, TMA, CBR, MODE.exec, FUP,
 * PSBEND) and repeats one whenever the output crosses a multiple of
 * --psb-period bytes (default 4096; 0 means only the leading header), the
 * way hardware emits PSB+ after every 2^(n+11) bytes of trace.  Between
 * headers packets are drawn from a weighted mix:
 *
 *   bench  (default) what a branch-heavy trace looks like: TNT-8, TNT-64 and
 *          TIP dominate (TIP with every IP compression: suppressed, 16-bit
 *          update, 32-bit update, 48-bit sign-extended, 48-bit update and
 *          full 64-bit), plus some FUP, TIP.PGE, TIP.PGD, MTC, CYC,
 *          MODE.exec and PAD.
 *   all    the bench mix plus every other packet libipt 2.0.5 can encode
 *          (PIP, VMCS, TSC, CBR, TMA, STOP, OVF, MNT, EXSTOP, MWAIT, PWRE,
 *          PWRX, PTW with 4- and 8-byte payloads, MODE.tsx, TNT-64 of every
 *          length) with random field values that the encoder accepts and
 *          the decoder gives back unchanged; PSB+ headers may then also
 *          carry PIP, VMCS and MODE.tsx.
 *
 * Every field value is chosen so that decoding gives back exactly the value
 * that was encoded (e.g. PIP CR3 is 32-byte aligned, VMCS base 4K aligned).
 *
 * The output is exactly SIZE_BYTES long or a few bytes longer: packets are
 * never cut, generation stops after the first packet that reaches the size.
 * The same arguments always give the same bytes, and a shorter stream is a
 * prefix of a longer one with the same seed, mix and period.
 *
 * --check re-decodes every chunk with libipt's packet decoder and verifies
 * that each packet decodes to the type it was encoded as and re-encodes to
 * the very same bytes (slower; for testing the generator itself).
 *
 * Build: gcc -O2 -Wall -Wextra -o ptgen ptgen.c -lipt
 */

#include <intel-pt.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Output is encoded into a chunk buffer that is flushed whenever it holds at
 * least CHUNK_BYTES; the slack leaves room for the packet (or PSB+ header)
 * that crosses the mark, so pt_enc_next never hits the buffer end.
 */
#define CHUNK_BYTES (1u << 20)
#define CHUNK_SLACK 4096u

/* -------------------------------------------------------------------------
 * Random numbers: wyrand (one 64x64->128 multiply per number), fast and
 * good enough, fully deterministic.
 */

static uint64_t rng_state;

static uint64_t rnd(void)
{
	__uint128_t t;

	rng_state += 0xa0761d6478bd642full;
	t = (__uint128_t) rng_state * (rng_state ^ 0xe7037ed1a0b428dbull);
	return (uint64_t) (t >> 64) ^ (uint64_t) t;
}

/* A uniform integer in [0, n) (Lemire's multiply-shift; n < 2^32). */
static uint32_t below(uint32_t n)
{
	return (uint32_t) (((rnd() >> 32) * (uint64_t) n) >> 32);
}

/* True with probability pct/100. */
static int chance(uint32_t pct)
{
	return below(100) < pct;
}

/* -------------------------------------------------------------------------
 * Packet mix.
 */

enum gen_kind {
	GK_TNT8,
	GK_TNT64,
	GK_TIP,
	GK_FUP,
	GK_PGE,
	GK_PGD,
	GK_MTC,
	GK_CYC,
	GK_MODE_EXEC,
	GK_PAD,
	/* --mix all only. */
	GK_PIP,
	GK_VMCS,
	GK_TSC,
	GK_CBR,
	GK_TMA,
	GK_STOP,
	GK_OVF,
	GK_MNT,
	GK_EXSTOP,
	GK_MWAIT,
	GK_PWRE,
	GK_PWRX,
	GK_PTW,
	GK_MODE_TSX,
	GK_COUNT
};

/* Weights per mille; each column sums to 1000. */
static const struct {
	enum gen_kind kind;
	uint16_t bench, all;
} weights[] = {
	{ GK_TNT8, 430, 300 },	 { GK_TNT64, 60, 60 },	{ GK_TIP, 260, 200 },
	{ GK_FUP, 30, 30 },	 { GK_PGE, 15, 15 },	{ GK_PGD, 15, 15 },
	{ GK_MTC, 60, 50 },	 { GK_CYC, 90, 70 },	{ GK_MODE_EXEC, 15, 15 },
	{ GK_PAD, 25, 25 },	 { GK_PIP, 0, 20 },	{ GK_VMCS, 0, 15 },
	{ GK_TSC, 0, 20 },	 { GK_CBR, 0, 15 },	{ GK_TMA, 0, 15 },
	{ GK_STOP, 0, 10 },	 { GK_OVF, 0, 10 },	{ GK_MNT, 0, 15 },
	{ GK_EXSTOP, 0, 15 },	 { GK_MWAIT, 0, 15 },	{ GK_PWRE, 0, 15 },
	{ GK_PWRX, 0, 15 },	 { GK_PTW, 0, 25 },	{ GK_MODE_TSX, 0, 15 },
};

/* A lookup table with one entry per mille turns a weighted draw into one
 * array access.
 */
static uint8_t pick_table[1000];

static int build_pick_table(int mix_all)
{
	size_t i, n = 0;

	for (i = 0; i < sizeof(weights) / sizeof(weights[0]); ++i) {
		uint16_t w = mix_all ? weights[i].all : weights[i].bench;

		while (w-- && n < sizeof(pick_table))
			pick_table[n++] = (uint8_t) weights[i].kind;
	}
	return n == sizeof(pick_table) ? 0 : -1;
}

/* -------------------------------------------------------------------------
 * Generator state: enough to make values look like a real trace (IPs that
 * stay in code regions, a rising TSC, counting MTCs).
 */

struct gen {
	int mix_all;
	uint64_t ip;	/* the IP the trace is at, always canonical */
	uint64_t tsc;	/* 56 bits are encoded */
	uint16_t ctc;	/* crystal clock counter, low 8 bits go into MTC */
	uint8_t cbr;
};

/* A canonical code address in a fresh region: a PIE executable, a shared
 * library or the kernel.
 */
static uint64_t new_region_ip(int kernel)
{
	if (kernel)
		return 0xffffffff81000000ull + (rnd() & 0x00ffffffull);
	if (chance(60))
		return 0x0000555555554000ull + (rnd() & 0x003fffffull);
	return 0x00007f0000000000ull + (rnd() & 0x000000ffffffffffull);
}

static int ip_is_kernel(uint64_t ip)
{
	return (ip >> 63) != 0;
}

/* Choose an IP compression, in percent per ipc: suppressed, update-16,
 * update-32, sext-48, update-48, full.
 */
static enum pt_ip_compression pick_ipc(const uint8_t pct[6])
{
	static const enum pt_ip_compression ipcs[6] = {
		pt_ipc_suppressed, pt_ipc_update_16, pt_ipc_update_32,
		pt_ipc_sext_48,	   pt_ipc_update_48, pt_ipc_full
	};
	uint32_t r = below(100), acc = 0;
	int i;

	for (i = 0; i < 6; ++i) {
		acc += pct[i];
		if (r < acc)
			return ipcs[i];
	}
	return pt_ipc_update_16;
}

/* Fill an IP payload: move the generator's IP to a target that the chosen
 * compression can express and store the payload bits the hardware would
 * write (libipt's ip field holds the zero-extended raw payload).
 */
static void make_ip(struct gen *g, struct pt_packet_ip *pip,
		    enum pt_ip_compression ipc)
{
	uint64_t target;

	pip->ipc = ipc;
	switch (ipc) {
	case pt_ipc_suppressed:
		pip->ip = 0;
		return;

	case pt_ipc_update_16:
		target = (g->ip & ~0xffffull) | (rnd() & 0xffffull);
		pip->ip = target & 0xffffull;
		break;

	case pt_ipc_update_32:
		target = (g->ip & ~0xffffffffull) | (rnd() & 0xffffffffull);
		pip->ip = target & 0xffffffffull;
		break;

	case pt_ipc_sext_48:
		target = new_region_ip(chance(30));
		pip->ip = target & 0xffffffffffffull;
		break;

	case pt_ipc_update_48:
		/* Upper 16 bits unchanged: stay in the same half. */
		target = new_region_ip(ip_is_kernel(g->ip));
		pip->ip = target & 0xffffffffffffull;
		break;

	case pt_ipc_full:
	default:
		target = new_region_ip(chance(30));
		pip->ip = target;
		break;
	}
	g->ip = target;
}

static void make_mode_exec(struct pt_packet *p, int mix_all)
{
	uint32_t r = below(100);

	p->type = ppt_mode;
	p->payload.mode.leaf = pt_mol_exec;
	if (r < 85)
		p->payload.mode.bits.exec = pt_set_exec_mode(ptem_64bit);
	else if (r < 95)
		p->payload.mode.bits.exec = pt_set_exec_mode(ptem_32bit);
	else if (r < 99 || !mix_all)
		p->payload.mode.bits.exec = pt_set_exec_mode(ptem_16bit);
	else	/* CS.L=1 CS.D=1, reserved; the encoder takes it */
		p->payload.mode.bits.exec = pt_set_exec_mode(ptem_unknown);
}

/* Draw one packet from the mix into @p. */
static void make_packet(struct gen *g, struct pt_packet *p)
{
	/* IPC percentages per packet type (suppressed, upd16, upd32, sext48,
	 * upd48, full); they sum to 100.
	 */
	static const uint8_t ipc_tip[6] = { 4, 46, 25, 12, 8, 5 };
	static const uint8_t ipc_fup[6] = { 5, 40, 25, 15, 10, 5 };
	static const uint8_t ipc_pge[6] = { 0, 20, 30, 30, 15, 5 };
	static const uint8_t ipc_pgd[6] = { 50, 20, 15, 8, 5, 2 };
	enum gen_kind kind = (enum gen_kind) pick_table[below(1000)];

	memset(p, 0, sizeof(*p));
	switch (kind) {
	case GK_TNT8: {
		/* Mostly full (6 bits); bit_size 0 is not encodable: its
		 * stop bit would make the 0x02 extended opcode.
		 */
		int n = chance(70) ? 6 : 1 + (int) below(6);

		p->type = ppt_tnt_8;
		p->payload.tnt.bit_size = (uint8_t) n;
		p->payload.tnt.payload = rnd() & ((1ull << n) - 1);
		break;
	}

	case GK_TNT64: {
		/* Hardware writes a TNT-64 when its 47-bit buffer is full;
		 * --mix all also draws every shorter length.
		 */
		int n = (!g->mix_all && chance(80)) ? 47 : 1 + (int) below(47);

		p->type = ppt_tnt_64;
		p->payload.tnt.bit_size = (uint8_t) n;
		p->payload.tnt.payload = rnd() & ((1ull << n) - 1);
		break;
	}

	case GK_TIP:
		p->type = ppt_tip;
		make_ip(g, &p->payload.ip, pick_ipc(ipc_tip));
		break;

	case GK_FUP:
		p->type = ppt_fup;
		make_ip(g, &p->payload.ip, pick_ipc(ipc_fup));
		break;

	case GK_PGE:
		p->type = ppt_tip_pge;
		make_ip(g, &p->payload.ip, pick_ipc(ipc_pge));
		break;

	case GK_PGD:
		p->type = ppt_tip_pgd;
		make_ip(g, &p->payload.ip, pick_ipc(ipc_pgd));
		break;

	case GK_MTC:
		/* Usually the next CTC tick, sometimes a few were skipped. */
		g->ctc = (uint16_t) (g->ctc + (chance(80) ? 1 : 1 + below(8)));
		p->type = ppt_mtc;
		p->payload.mtc.ctc = (uint8_t) g->ctc;
		break;

	case GK_CYC:
		/* Mostly small cycle counts (one or two bytes); with --mix all
		 * every length up to 9 bytes.  libipt 2.0.5 encodes values of
		 * 2^61 and more in 10 bytes but its decoder rejects those
		 * (-pte_bad_packet), so stay below 2^61.
		 */
		p->type = ppt_cyc;
		if (g->mix_all && chance(30))
			p->payload.cyc.value = rnd() >> (3 + below(61));
		else if (chance(85))
			p->payload.cyc.value = 1 + below(31);
		else
			p->payload.cyc.value = 32 + below(4096);
		break;

	case GK_MODE_EXEC:
		make_mode_exec(p, g->mix_all);
		break;

	case GK_PAD:
		p->type = ppt_pad;
		break;

	case GK_PIP:
		/* The encoder drops CR3 bits 0-4 and keeps 47 bits above. */
		p->type = ppt_pip;
		p->payload.pip.cr3 = rnd() & 0x000fffffffffffe0ull;
		p->payload.pip.nr = chance(50);
		break;

	case GK_VMCS:
		/* 4K aligned, 40 bits of page number. */
		p->type = ppt_vmcs;
		p->payload.vmcs.base = rnd() & 0x000ffffffffff000ull;
		break;

	case GK_TSC:
		g->tsc += 1 + below(100000);
		p->type = ppt_tsc;
		p->payload.tsc.tsc = g->tsc & 0x00ffffffffffffffull;
		break;

	case GK_CBR:
		p->type = ppt_cbr;
		p->payload.cbr.ratio = (uint8_t) rnd();
		break;

	case GK_TMA:
		p->type = ppt_tma;
		p->payload.tma.ctc = (uint16_t) rnd();
		p->payload.tma.fc = (uint16_t) (rnd() & 0x1ff);
		break;

	case GK_STOP:
		p->type = ppt_stop;
		break;

	case GK_OVF:
		p->type = ppt_ovf;
		break;

	case GK_MNT:
		p->type = ppt_mnt;
		p->payload.mnt.payload = rnd();
		break;

	case GK_EXSTOP:
		p->type = ppt_exstop;
		p->payload.exstop.ip = chance(50);
		break;

	case GK_MWAIT:
		p->type = ppt_mwait;
		p->payload.mwait.hints = (uint32_t) rnd();
		p->payload.mwait.ext = (uint32_t) rnd();
		break;

	case GK_PWRE:
		p->type = ppt_pwre;
		p->payload.pwre.state = (uint8_t) below(16);
		p->payload.pwre.sub_state = (uint8_t) below(16);
		p->payload.pwre.hw = chance(50);
		break;

	case GK_PWRX:
		p->type = ppt_pwrx;
		p->payload.pwrx.last = (uint8_t) below(16);
		p->payload.pwrx.deepest = (uint8_t) below(16);
		p->payload.pwrx.interrupt = chance(50);
		p->payload.pwrx.store = chance(50);
		p->payload.pwrx.autonomous = chance(50);
		break;

	case GK_PTW:
		/* plc 0: 4-byte payload, plc 1: 8-byte; 2 and 3 are reserved
		 * and refused by the encoder.
		 */
		p->type = ppt_ptw;
		p->payload.ptw.plc = (uint8_t) below(2);
		p->payload.ptw.payload = p->payload.ptw.plc ?
			rnd() : (rnd() & 0xffffffffull);
		p->payload.ptw.ip = chance(50);
		break;

	case GK_MODE_TSX:
		p->type = ppt_mode;
		p->payload.mode.leaf = pt_mol_tsx;
		p->payload.mode.bits.tsx.intx = chance(50);
		p->payload.mode.bits.tsx.abrt = chance(30);
		break;

	case GK_COUNT:
	default:
		p->type = ppt_pad;
		break;
	}
}

/* -------------------------------------------------------------------------
 * Output.
 */

struct out {
	FILE *file;
	const char *path;
	uint8_t *buf;
	struct pt_encoder *enc;
	struct pt_config config;
	uint64_t flushed;	/* bytes written to the file so far */
	uint64_t used;		/* bytes encoded into buf, not yet written */
	uint64_t packets;
	int check;
	/* With --check: the type of each packet in the current chunk. */
	uint8_t *types;
	size_t ntypes;
};

static void die(const char *what, int errcode)
{
	fprintf(stderr, "ptgen: %s: %s\n", what,
		errcode < 0 ? pt_errstr(pt_errcode(errcode)) : strerror(errno));
	exit(1);
}

static uint64_t total_bytes(const struct out *o)
{
	return o->flushed + o->used;
}

static void emit(struct out *o, const struct pt_packet *p)
{
	int size = pt_enc_next(o->enc, p);

	if (size <= 0) {
		fprintf(stderr, "ptgen: pt_enc_next refused packet type %d "
			"at %" PRIu64 ": %s\n", (int) p->type, total_bytes(o),
			pt_errstr(pt_errcode(size)));
		exit(1);
	}
	if (o->check)
		o->types[o->ntypes++] = (uint8_t) p->type;
	o->used += (uint64_t) size;
	o->packets++;
}

/* Decode the chunk [0, used) again and compare it with what was encoded. */
static void check_chunk(struct out *o, uint64_t used)
{
	struct pt_config cfg = o->config;
	struct pt_packet_decoder *dec;
	struct pt_encoder *enc;
	struct pt_packet pkt;
	uint8_t scratch[64];
	uint64_t offset = 0;
	size_t i = 0;
	int size;

	cfg.end = cfg.begin + used;
	dec = pt_pkt_alloc_decoder(&cfg);
	if (!dec || pt_pkt_sync_set(dec, 0) < 0)
		die("check: cannot set up decoder", -pte_internal);

	cfg.begin = scratch;
	cfg.end = scratch + sizeof(scratch);
	enc = pt_alloc_encoder(&cfg);
	if (!enc)
		die("check: cannot set up encoder", -pte_internal);

	for (;;) {
		size = pt_pkt_next(dec, &pkt, sizeof(pkt));
		if (size == -pte_eos)
			break;
		if (size < 0 || i >= o->ntypes ||
		    (uint8_t) pkt.type != o->types[i])
			goto bad;

		pt_enc_sync_set(enc, 0);
		if (pt_enc_next(enc, &pkt) != size ||
		    memcmp(scratch, o->buf + offset, (size_t) size) != 0)
			goto bad;

		offset += (uint64_t) size;
		++i;
	}
	if (offset != used || i != o->ntypes)
		goto bad;

	pt_free_encoder(enc);
	pt_pkt_free_decoder(dec);
	return;

bad:
	fprintf(stderr, "ptgen: check failed at offset %" PRIu64
		" (packet %zu of chunk, encoded type %d, decoded type %d, "
		"status %d)\n", o->flushed + offset, i,
		i < o->ntypes ? o->types[i] : -1, (int) pkt.type, size);
	exit(1);
}

static void flush(struct out *o)
{
	uint64_t used = o->used;

	if (!used)
		return;
	if (o->check)
		check_chunk(o, used);
	if (fwrite(o->buf, 1, used, o->file) != used)
		die(o->path, 0);
	o->flushed += used;
	o->used = 0;
	o->ntypes = 0;
	if (pt_enc_sync_set(o->enc, 0) < 0)
		die("pt_enc_sync_set", -pte_internal);
}

static void emit_psb_header(struct gen *g, struct out *o)
{
	struct pt_packet p;

	memset(&p, 0, sizeof(p));
	p.type = ppt_psb;
	emit(o, &p);

	g->tsc += 20000 + below(200000);
	memset(&p, 0, sizeof(p));
	p.type = ppt_tsc;
	p.payload.tsc.tsc = g->tsc & 0x00ffffffffffffffull;
	emit(o, &p);

	memset(&p, 0, sizeof(p));
	p.type = ppt_tma;
	p.payload.tma.ctc = g->ctc;
	p.payload.tma.fc = (uint16_t) below(512);
	emit(o, &p);

	if (chance(5))
		g->cbr = (uint8_t) (8 + below(40));
	memset(&p, 0, sizeof(p));
	p.type = ppt_cbr;
	p.payload.cbr.ratio = g->cbr;
	emit(o, &p);

	if (g->mix_all && chance(50)) {
		memset(&p, 0, sizeof(p));
		p.type = ppt_pip;
		p.payload.pip.cr3 = rnd() & 0x00000007ffffffe0ull;
		p.payload.pip.nr = chance(20);
		emit(o, &p);
	}
	if (g->mix_all && chance(20)) {
		memset(&p, 0, sizeof(p));
		p.type = ppt_vmcs;
		p.payload.vmcs.base = rnd() & 0x0000000ffffff000ull;
		emit(o, &p);
	}

	memset(&p, 0, sizeof(p));
	make_mode_exec(&p, g->mix_all);
	emit(o, &p);

	if (g->mix_all && chance(30)) {
		memset(&p, 0, sizeof(p));
		p.type = ppt_mode;
		p.payload.mode.leaf = pt_mol_tsx;
		p.payload.mode.bits.tsx.intx = chance(50);
		emit(o, &p);
	}

	/* PSB resets the decoder's last IP, so hardware sends the current
	 * IP in full (sign-extended 48 bits) - or suppressed if tracing is
	 * currently filtered out.
	 */
	memset(&p, 0, sizeof(p));
	p.type = ppt_fup;
	if (chance(3)) {
		p.payload.ip.ipc = pt_ipc_suppressed;
	} else {
		p.payload.ip.ipc = pt_ipc_sext_48;
		p.payload.ip.ip = g->ip & 0xffffffffffffull;
	}
	emit(o, &p);

	memset(&p, 0, sizeof(p));
	p.type = ppt_psbend;
	emit(o, &p);
}

/* -------------------------------------------------------------------------
 * Command line.
 */

static void usage(void)
{
	fprintf(stderr,
		"usage: ptgen OUT.pt SIZE_BYTES [--seed N] "
		"[--psb-period BYTES] [--mix bench|all] [--check]\n");
	exit(2);
}

static uint64_t parse_u64(const char *s)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 0);
	if (errno || end == s || *end || *s == '-')
		usage();
	return (uint64_t) v;
}

int main(int argc, char **argv)
{
	const char *path = NULL;
	uint64_t size = 0, seed = 1, period = 4096, next_psb = 0;
	int have_size = 0, mix_all = 0, check = 0, i;
	struct gen g;
	struct out o;
	struct pt_packet p;
	struct timespec t0, t1;

	for (i = 1; i < argc; ++i) {
		if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
			seed = parse_u64(argv[++i]);
		} else if (!strcmp(argv[i], "--psb-period") && i + 1 < argc) {
			period = parse_u64(argv[++i]);
		} else if (!strcmp(argv[i], "--mix") && i + 1 < argc) {
			++i;
			if (!strcmp(argv[i], "all"))
				mix_all = 1;
			else if (!strcmp(argv[i], "bench"))
				mix_all = 0;
			else
				usage();
		} else if (!strcmp(argv[i], "--check")) {
			check = 1;
		} else if (argv[i][0] == '-' && argv[i][1]) {
			usage();
		} else if (!path) {
			path = argv[i];
		} else if (!have_size) {
			size = parse_u64(argv[i]);
			have_size = 1;
		} else {
			usage();
		}
	}
	if (!path || !have_size)
		usage();

	if (build_pick_table(mix_all) < 0) {
		fprintf(stderr, "ptgen: internal error: weights\n");
		return 1;
	}

	/* Different seeds must give unrelated streams, seed 0 included. */
	rng_state = seed * 0x2545f4914f6cdd1dull + 0x1234567ull;

	memset(&g, 0, sizeof(g));
	g.mix_all = mix_all;
	g.ip = new_region_ip(0);
	g.tsc = 0x100000000ull + (rnd() & 0xffffffffull);
	g.ctc = (uint16_t) rnd();
	g.cbr = (uint8_t) (8 + below(40));

	memset(&o, 0, sizeof(o));
	o.path = path;
	o.check = check;
	o.buf = malloc(CHUNK_BYTES + CHUNK_SLACK);
	o.types = check ? malloc(CHUNK_BYTES + CHUNK_SLACK) : NULL;
	if (!o.buf || (check && !o.types))
		die("malloc", 0);

	pt_config_init(&o.config);
	o.config.begin = o.buf;
	o.config.end = o.buf + CHUNK_BYTES + CHUNK_SLACK;
	o.enc = pt_alloc_encoder(&o.config);
	if (!o.enc)
		die("pt_alloc_encoder", -pte_nomem);

	o.file = fopen(path, "wb");
	if (!o.file)
		die(path, 0);

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		uint64_t total = total_bytes(&o);

		if (total >= size)
			break;
		if (total >= next_psb) {
			emit_psb_header(&g, &o);
			/* The next multiple of the period past this header. */
			next_psb = period ?
				(total_bytes(&o) / period + 1) * period :
				UINT64_MAX;
		} else {
			make_packet(&g, &p);
			emit(&o, &p);
		}
		if (o.used >= CHUNK_BYTES)
			flush(&o);
	}
	flush(&o);
	clock_gettime(CLOCK_MONOTONIC, &t1);

	if (fclose(o.file) != 0)
		die(path, 0);

	fprintf(stderr, "ptgen: %s: %" PRIu64 " bytes, %" PRIu64
		" packets, %.2f s%s\n", path, o.flushed, o.packets,
		(double) (t1.tv_sec - t0.tv_sec) +
			(double) (t1.tv_nsec - t0.tv_nsec) * 1e-9,
		check ? ", checked" : "");

	pt_free_encoder(o.enc);
	free(o.types);
	free(o.buf);
	return 0;
}
