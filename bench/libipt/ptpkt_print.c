/*
 * ptpkt_print - libipt's packet decoder printing every packet with printf,
 * in Intel's ptdump format (its default options: offset, name, payload and
 * the cr3/vmcs columns): the peer of `hwtrace ptdump` for a whole-process
 * benchmark.
 *
 * Usage:
 *   ptpkt_print FILE.pt
 *
 * Decoding starts at the first PSB (pt_pkt_sync_forward), and after a
 * decode error goes on at the next PSB, as Intel's ptdump does; one printf
 * per packet (and per error) writes the text to stdout.  Packet types that
 * libipt 2.0.5 does not know are not printed (it cannot decode them).
 *
 * Build: gcc -O2 -Wall -Wextra -o ptpkt_print ptpkt_print.c -lipt
 */

#define _GNU_SOURCE

#include <intel-pt.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define LINE "%016" PRIx64 "  "

/* The IP payload as ptdump shows it: the bytes not in the packet as '?'. */
static void print_ip(uint64_t offset, const char *name,
		     const struct pt_packet_ip *ip)
{
	uint64_t v = ip->ip;

	switch (ip->ipc) {
	case pt_ipc_suppressed:
		printf(LINE "%-10s %u: ????????????????\n", offset, name,
		       ip->ipc);
		break;
	case pt_ipc_update_16:
		printf(LINE "%-10s %u: ????????????%04" PRIx64 "\n", offset,
		       name, ip->ipc, v);
		break;
	case pt_ipc_update_32:
		printf(LINE "%-10s %u: ????????%08" PRIx64 "\n", offset, name,
		       ip->ipc, v);
		break;
	case pt_ipc_update_48:
		printf(LINE "%-10s %u: ????%012" PRIx64 "\n", offset, name,
		       ip->ipc, v);
		break;
	case pt_ipc_sext_48:
		if (v & (1ull << 47))
			v |= 0xffff000000000000ull;
		printf(LINE "%-10s %u: %016" PRIx64 "\n", offset, name,
		       ip->ipc, v);
		break;
	default:
		printf(LINE "%-10s %u: %016" PRIx64 "\n", offset, name,
		       ip->ipc, v);
		break;
	}
}

static void print_tnt(uint64_t offset, const char *name,
		      const struct pt_packet_tnt *tnt)
{
	char bits[65];
	int i, n = tnt->bit_size;

	for (i = 0; i < n; ++i)
		bits[i] = (tnt->payload >> (n - 1 - i)) & 1 ? '!' : '.';
	bits[n] = 0;
	printf(LINE "%-10s %s\n", offset, name, bits);
}

static void print_packet(uint64_t offset, const struct pt_packet *pkt)
{
	char text[64];

	switch (pkt->type) {
	case ppt_pad:
		printf(LINE "pad\n", offset);
		break;
	case ppt_psb:
		printf(LINE "psb\n", offset);
		break;
	case ppt_psbend:
		printf(LINE "psbend\n", offset);
		break;
	case ppt_stop:
		printf(LINE "stop\n", offset);
		break;
	case ppt_ovf:
		printf(LINE "ovf\n", offset);
		break;
	case ppt_tnt_8:
		print_tnt(offset, "tnt.8", &pkt->payload.tnt);
		break;
	case ppt_tnt_64:
		print_tnt(offset, "tnt.64", &pkt->payload.tnt);
		break;
	case ppt_tip:
		print_ip(offset, "tip", &pkt->payload.ip);
		break;
	case ppt_tip_pge:
		print_ip(offset, "tip.pge", &pkt->payload.ip);
		break;
	case ppt_tip_pgd:
		print_ip(offset, "tip.pgd", &pkt->payload.ip);
		break;
	case ppt_fup:
		print_ip(offset, "fup", &pkt->payload.ip);
		break;
	case ppt_mode:
		if (pkt->payload.mode.leaf == pt_mol_exec) {
			const struct pt_packet_mode_exec *m =
				&pkt->payload.mode.bits.exec;

			if (!m->csl && !m->csd)
				printf(LINE "mode.exec\n", offset);
			else
				printf(LINE "%-10s %s%s%s\n", offset, "mode.exec",
				       m->csd ? "cs.d" : "",
				       m->csd && m->csl ? ", " : "",
				       m->csl ? "cs.l" : "");
		} else {
			const struct pt_packet_mode_tsx *m =
				&pkt->payload.mode.bits.tsx;

			if (!m->intx && !m->abrt)
				printf(LINE "mode.tsx\n", offset);
			else
				printf(LINE "%-10s %s%s%s\n", offset, "mode.tsx",
				       m->intx ? "intx" : "",
				       m->intx && m->abrt ? ", " : "",
				       m->abrt ? "abrt" : "");
		}
		break;
	case ppt_pip:
		snprintf(text, sizeof(text), "%" PRIx64 "%s",
			 pkt->payload.pip.cr3, pkt->payload.pip.nr ? ", nr" : "");
		printf(LINE "%-10s %-25s cr3  %016" PRIx64 "\n", offset, "pip",
		       text, pkt->payload.pip.cr3);
		break;
	case ppt_vmcs:
		snprintf(text, sizeof(text), "%" PRIx64, pkt->payload.vmcs.base);
		printf(LINE "%-10s %-25s vmcs %016" PRIx64 "\n", offset, "vmcs",
		       text, pkt->payload.vmcs.base);
		break;
	case ppt_tsc:
		printf(LINE "%-10s %" PRIx64 "\n", offset, "tsc",
		       pkt->payload.tsc.tsc);
		break;
	case ppt_cbr:
		printf(LINE "%-10s %x\n", offset, "cbr", pkt->payload.cbr.ratio);
		break;
	case ppt_tma:
		printf(LINE "%-10s %x, %x\n", offset, "tma",
		       pkt->payload.tma.ctc, pkt->payload.tma.fc);
		break;
	case ppt_mtc:
		printf(LINE "%-10s %x\n", offset, "mtc", pkt->payload.mtc.ctc);
		break;
	case ppt_cyc:
		printf(LINE "%-10s %" PRIx64 "\n", offset, "cyc",
		       pkt->payload.cyc.value);
		break;
	case ppt_mnt:
		printf(LINE "%-10s %" PRIx64 "\n", offset, "mnt",
		       pkt->payload.mnt.payload);
		break;
	case ppt_exstop:
		if (pkt->payload.exstop.ip)
			printf(LINE "%-10s ip\n", offset, "exstop");
		else
			printf(LINE "exstop\n", offset);
		break;
	case ppt_mwait:
		printf(LINE "%-10s %08x, %08x\n", offset, "mwait",
		       pkt->payload.mwait.hints, pkt->payload.mwait.ext);
		break;
	case ppt_pwre:
		printf(LINE "%-10s c%u.%u%s\n", offset, "pwre",
		       (pkt->payload.pwre.state + 1) & 0xf,
		       (pkt->payload.pwre.sub_state + 1) & 0xf,
		       pkt->payload.pwre.hw ? ", hw" : "");
		break;
	case ppt_pwrx: {
		const struct pt_packet_pwrx *x = &pkt->payload.pwrx;
		const char *wake = "bad";

		if (x->interrupt && !x->store && !x->autonomous)
			wake = "int";
		else if (!x->interrupt && x->store && !x->autonomous)
			wake = " st";
		else if (!x->interrupt && !x->store && x->autonomous)
			wake = " hw";
		printf(LINE "%-10s %s: c%u, c%u\n", offset, "pwrx", wake,
		       (x->last + 1) & 0xf, (x->deepest + 1) & 0xf);
		break;
	}
	case ppt_ptw:
		printf(LINE "%-10s %x: %" PRIx64 "%s\n", offset, "ptw",
		       pkt->payload.ptw.plc, pkt->payload.ptw.payload,
		       pkt->payload.ptw.ip ? ", ip" : "");
		break;
	default:
		break;
	}
}

int main(int argc, char **argv)
{
	struct pt_packet_decoder *dec;
	struct pt_config config;
	struct pt_packet pkt;
	struct stat st;
	uint8_t *data;
	int fd, status;

	if (argc != 2) {
		fprintf(stderr, "usage: ptpkt_print FILE.pt\n");
		return 2;
	}
	fd = open(argv[1], O_RDONLY);
	if (fd < 0 || fstat(fd, &st) < 0 || st.st_size == 0) {
		fprintf(stderr, "ptpkt_print: %s: cannot read\n", argv[1]);
		return 1;
	}
	data = mmap(NULL, (size_t) st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (data == MAP_FAILED) {
		fprintf(stderr, "ptpkt_print: %s: %s\n", argv[1], strerror(errno));
		return 1;
	}
	madvise(data, (size_t) st.st_size, MADV_SEQUENTIAL);
	pt_config_init(&config);
	config.begin = data;
	config.end = data + st.st_size;
	dec = pt_pkt_alloc_decoder(&config);
	if (!dec)
		return 1;

	status = pt_pkt_sync_forward(dec);
	while (status >= 0) {
		for (;;) {
			uint64_t offset;

			pt_pkt_get_offset(dec, &offset);
			status = pt_pkt_next(dec, &pkt, sizeof(pkt));
			if (status < 0) {
				if (status != -pte_eos)
					printf("[%" PRIx64 ": error decoding packet: %s]\n",
					       offset, pt_errstr(pt_errcode(status)));
				break;
			}
			print_packet(offset, &pkt);
		}
		if (status == -pte_eos)
			break;
		status = pt_pkt_sync_forward(dec);
	}
	pt_pkt_free_decoder(dec);
	return 0;
}
