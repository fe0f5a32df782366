/*
 * ptpkt_dump - print every Intel PT packet in a file as libipt's packet
 * decoder (pt_pkt_next) sees it, one line per packet, for use as a test
 * oracle.
 *
 * Usage:
 *   ptpkt_dump [--no-sync] FILE.pt
 *
 * By default decoding starts at the first PSB (pt_pkt_sync_forward); with
 * --no-sync it starts at offset 0 (pt_pkt_sync_set).  After a decode error
 * the decoder synchronizes forward to the next PSB and goes on.
 *
 * Output format (stdout), one line per packet:
 *
 *   OFFSET SIZE TYPE [FIELD=VALUE ...]
 *
 * OFFSET and SIZE are decimal (the packet's byte offset in the file and its
 * length in bytes).  TYPE is the packet name as Intel's ptdump spells it.
 * Each FIELD is a member of the type's struct pt_packet payload, with the
 * libipt name; VALUEs are integers, decimal or 0x-prefixed hexadecimal
 * (Python: int(value, 0)), never negative, never symbolic.  Fields are
 * always printed in this order:
 *
 *   pad | psb | psbend | stop | ovf      (no fields)
 *   fup | tip | tip.pge | tip.pgd        ipc=N ip=0xRAW
 *        ipc is the IP compression (0, 1, 2, 3, 4 or 6); ip is the raw
 *        payload, zero-extended, neither sign-extended nor combined with
 *        the last IP (0x0 when ipc=0)
 *   tnt.8 | tnt.64                       bit_size=N payload=0xBITS
 *        payload excludes the stop bit; its most significant bit (bit
 *        bit_size-1) is the oldest branch
 *   mode.exec                            leaf=0x0 bits=0xB csl=N csd=N
 *   mode.tsx                             leaf=0x20 bits=0xB intx=N abrt=N
 *        bits is rebuilt from libipt's bit-fields (exec: csl=1, csd=2;
 *        tsx: intx=1, abrt=2); libipt 2.0.5 has no mode.exec IF field and
 *        silently drops that bit (0x4), so bits never has it
 *   pip                                  cr3=0xCR3 nr=N
 *   vmcs                                 base=0xADDR
 *   cbr                                  ratio=N
 *   tsc                                  tsc=0xTSC
 *   tma                                  ctc=0xCTC fc=0xFC
 *   mtc                                  ctc=0xCTC
 *   cyc                                  value=0xCYCLES
 *   mnt                                  payload=0xPAYLOAD
 *   exstop                               ip=N
 *   mwait                                hints=0xEAX ext=0xECX
 *   pwre                                 state=N sub_state=N hw=N
 *   pwrx                                 last=N deepest=N interrupt=N
 *                                        store=N autonomous=N
 *   ptw                                  plc=N ip=N payload=0xPAYLOAD
 *   unknown                              (none; not produced: no callback
 *                                        is installed)
 *
 * A decode error is one line
 *
 *   OFFSET error CODE
 *
 * with CODE the positive enum pt_error_code value: 4 pte_bad_opc (unknown
 * opcode), 5 pte_bad_packet (known opcode, bad payload), 7 pte_eos (the
 * file ends inside a packet).  Decoding then resumes at the next PSB after
 * OFFSET, if any.
 *
 * If no PSB is found (without --no-sync) nothing is printed.  Diagnostics go
 * to stderr; the exit status is 0 unless the file cannot be read.
 *
 * Build: gcc -O2 -Wall -Wextra -o ptpkt_dump ptpkt_dump.c -lipt
 */

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

static const char *type_name(const struct pt_packet *p)
{
	switch (p->type) {
	case ppt_invalid:	return "invalid";
	case ppt_unknown:	return "unknown";
	case ppt_pad:		return "pad";
	case ppt_psb:		return "psb";
	case ppt_psbend:	return "psbend";
	case ppt_fup:		return "fup";
	case ppt_tip:		return "tip";
	case ppt_tip_pge:	return "tip.pge";
	case ppt_tip_pgd:	return "tip.pgd";
	case ppt_tnt_8:		return "tnt.8";
	case ppt_tnt_64:	return "tnt.64";
	case ppt_mode:
		return p->payload.mode.leaf == pt_mol_tsx ?
			"mode.tsx" : "mode.exec";
	case ppt_pip:		return "pip";
	case ppt_vmcs:		return "vmcs";
	case ppt_cbr:		return "cbr";
	case ppt_tsc:		return "tsc";
	case ppt_tma:		return "tma";
	case ppt_mtc:		return "mtc";
	case ppt_cyc:		return "cyc";
	case ppt_stop:		return "stop";
	case ppt_ovf:		return "ovf";
	case ppt_mnt:		return "mnt";
	case ppt_exstop:	return "exstop";
	case ppt_mwait:		return "mwait";
	case ppt_pwre:		return "pwre";
	case ppt_pwrx:		return "pwrx";
	case ppt_ptw:		return "ptw";
	}
	return "invalid";
}

static void print_packet(uint64_t offset, const struct pt_packet *p)
{
	printf("%" PRIu64 " %u %s", offset, (unsigned) p->size, type_name(p));

	switch (p->type) {
	case ppt_fup:
	case ppt_tip:
	case ppt_tip_pge:
	case ppt_tip_pgd:
		printf(" ipc=%u ip=0x%" PRIx64, (unsigned) p->payload.ip.ipc,
		       p->payload.ip.ip);
		break;

	case ppt_tnt_8:
	case ppt_tnt_64:
		printf(" bit_size=%u payload=0x%" PRIx64,
		       (unsigned) p->payload.tnt.bit_size,
		       p->payload.tnt.payload);
		break;

	case ppt_mode: {
		/* Rebuild the raw mode bits from libipt's bit-fields. */
		unsigned a, b;

		if (p->payload.mode.leaf == pt_mol_tsx) {
			a = p->payload.mode.bits.tsx.intx;
			b = p->payload.mode.bits.tsx.abrt;
			printf(" leaf=0x%x bits=0x%x intx=%u abrt=%u",
			       (unsigned) p->payload.mode.leaf, a | b << 1, a,
			       b);
		} else {
			a = p->payload.mode.bits.exec.csl;
			b = p->payload.mode.bits.exec.csd;
			printf(" leaf=0x%x bits=0x%x csl=%u csd=%u",
			       (unsigned) p->payload.mode.leaf, a | b << 1, a,
			       b);
		}
		break;
	}

	case ppt_pip:
		printf(" cr3=0x%" PRIx64 " nr=%u", p->payload.pip.cr3,
		       (unsigned) p->payload.pip.nr);
		break;

	case ppt_vmcs:
		printf(" base=0x%" PRIx64, p->payload.vmcs.base);
		break;

	case ppt_cbr:
		printf(" ratio=%u", (unsigned) p->payload.cbr.ratio);
		break;

	case ppt_tsc:
		printf(" tsc=0x%" PRIx64, p->payload.tsc.tsc);
		break;

	case ppt_tma:
		printf(" ctc=0x%x fc=0x%x", (unsigned) p->payload.tma.ctc,
		       (unsigned) p->payload.tma.fc);
		break;

	case ppt_mtc:
		printf(" ctc=0x%x", (unsigned) p->payload.mtc.ctc);
		break;

	case ppt_cyc:
		printf(" value=0x%" PRIx64, p->payload.cyc.value);
		break;

	case ppt_mnt:
		printf(" payload=0x%" PRIx64, p->payload.mnt.payload);
		break;

	case ppt_exstop:
		printf(" ip=%u", (unsigned) p->payload.exstop.ip);
		break;

	case ppt_mwait:
		printf(" hints=0x%" PRIx32 " ext=0x%" PRIx32,
		       p->payload.mwait.hints, p->payload.mwait.ext);
		break;

	case ppt_pwre:
		printf(" state=%u sub_state=%u hw=%u",
		       (unsigned) p->payload.pwre.state,
		       (unsigned) p->payload.pwre.sub_state,
		       (unsigned) p->payload.pwre.hw);
		break;

	case ppt_pwrx:
		printf(" last=%u deepest=%u interrupt=%u store=%u "
		       "autonomous=%u", (unsigned) p->payload.pwrx.last,
		       (unsigned) p->payload.pwrx.deepest,
		       (unsigned) p->payload.pwrx.interrupt,
		       (unsigned) p->payload.pwrx.store,
		       (unsigned) p->payload.pwrx.autonomous);
		break;

	case ppt_ptw:
		printf(" plc=%u ip=%u payload=0x%" PRIx64,
		       (unsigned) p->payload.ptw.plc,
		       (unsigned) p->payload.ptw.ip, p->payload.ptw.payload);
		break;

	case ppt_invalid:
	case ppt_unknown:
	case ppt_pad:
	case ppt_psb:
	case ppt_psbend:
	case ppt_stop:
	case ppt_ovf:
		break;
	}
	putchar('\n');
}

static void usage(void)
{
	fprintf(stderr, "usage: ptpkt_dump [--no-sync] FILE.pt\n");
	exit(2);
}

int main(int argc, char **argv)
{
	const char *path = NULL;
	int no_sync = 0, fd, status, i;
	struct stat st;
	uint8_t *data;
	struct pt_config config;
	struct pt_packet_decoder *dec;
	struct pt_packet pkt;
	uint64_t offset;
	static char outbuf[1 << 16];

	for (i = 1; i < argc; ++i) {
		if (!strcmp(argv[i], "--no-sync"))
			no_sync = 1;
		else if (argv[i][0] == '-' && argv[i][1])
			usage();
		else if (!path)
			path = argv[i];
		else
			usage();
	}
	if (!path)
		usage();

	fd = open(path, O_RDONLY);
	if (fd < 0 || fstat(fd, &st) < 0) {
		fprintf(stderr, "ptpkt_dump: %s: %s\n", path, strerror(errno));
		return 1;
	}
	if (st.st_size == 0)
		return 0;

	data = mmap(NULL, (size_t) st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (data == MAP_FAILED) {
		fprintf(stderr, "ptpkt_dump: %s: %s\n", path, strerror(errno));
		return 1;
	}
	close(fd);

	setvbuf(stdout, outbuf, _IOFBF, sizeof(outbuf));

	pt_config_init(&config);
	config.begin = data;
	config.end = data + st.st_size;

	dec = pt_pkt_alloc_decoder(&config);
	if (!dec) {
		fprintf(stderr, "ptpkt_dump: cannot allocate decoder\n");
		return 1;
	}

	status = no_sync ? pt_pkt_sync_set(dec, 0) : pt_pkt_sync_forward(dec);
	if (status < 0)
		fprintf(stderr, "ptpkt_dump: %s: no PSB found\n", path);

	while (status >= 0) {
		if (pt_pkt_get_offset(dec, &offset) < 0)
			break;

		status = pt_pkt_next(dec, &pkt, sizeof(pkt));
		if (status >= 0) {
			print_packet(offset, &pkt);
			continue;
		}

		/* -pte_eos exactly at the end is the normal end; before the
		 * end it means the last packet is cut short.
		 */
		if (status == -pte_eos && offset >= (uint64_t) st.st_size)
			break;
		printf("%" PRIu64 " error %d\n", offset, -status);

		/* The decoder does not move on an error: search the next PSB
		 * from here (libipt skips the PSB it is synchronized at).
		 */
		status = pt_pkt_sync_forward(dec);
	}

	pt_pkt_free_decoder(dec);
	munmap(data, (size_t) st.st_size);
	if (fflush(stdout) != 0) {
		fprintf(stderr, "ptpkt_dump: write error: %s\n",
			strerror(errno));
		return 1;
	}
	return 0;
}
