/* OpenCSD's packet processors as a throughput peer: reads a trace file,
 * runs it through OpenCSD's STM, ETMv4 or ETE packet processor (optionally
 * behind its frame deformatter) with a packet sink that only counts, and
 * prints the packet count and the best time of R runs.
 *
 *   ocsd_packets stm|etm4|ete FILE REPEAT [formatted] [REG=VALUE ...]
 *
 * Registers: tcsr (STM); idr0 idr1 idr2 idr8 idr9 idr10 idr11 idr12 idr13
 * configr traceidr devarch (ETMv4/ETE).
 */
#include <opencsd/c_api/opencsd_c_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static unsigned long long packets;

static ocsd_datapath_resp_t sink(const void *ctx, const ocsd_datapath_op_t op,
				 const ocsd_trc_index_t index, const void *pkt)
{
	(void)ctx; (void)index; (void)pkt;
	if (op == OCSD_OP_DATA)
		packets++;
	return OCSD_RESP_CONT;
}

static uint32_t reg(int argc, char **argv, const char *name, uint32_t dflt)
{
	size_t n = strlen(name);
	for (int i = 4; i < argc; i++)
		if (!strncmp(argv[i], name, n) && argv[i][n] == '=')
			return (uint32_t)strtoul(argv[i] + n + 1, NULL, 0);
	return dflt;
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: %s stm|etm4|ete FILE REPEAT [formatted] [REG=V...]\n", argv[0]);
		return 2;
	}
	FILE *f = fopen(argv[2], "rb");
	if (!f) { perror(argv[2]); return 1; }
	fseek(f, 0, SEEK_END);
	long size = ftell(f);
	fseek(f, 0, SEEK_SET);
	uint8_t *buf = malloc(size);
	if (fread(buf, 1, size, f) != (size_t)size) { perror("read"); return 1; }
	fclose(f);
	int repeat = atoi(argv[3]);
	int formatted = 0;
	for (int i = 4; i < argc; i++)
		if (!strcmp(argv[i], "formatted"))
			formatted = 1;
	ocsd_stm_cfg stm = {0};
	ocsd_etmv4_cfg etm = {0};
	ocsd_ete_cfg ete = {0};
	const char *name;
	void *cfg;
	stm.reg_tcsr = reg(argc, argv, "tcsr", 0x00A00007);
	stm.reg_devid = 0xFF;       /* 256 channels per master */
	stm.reg_feat3r = 0x7F;      /* 128 masters */
	etm.reg_idr0 = reg(argc, argv, "idr0", 0x28000EA1);
	etm.reg_idr1 = reg(argc, argv, "idr1", 0x4100F403);
	etm.reg_idr2 = reg(argc, argv, "idr2", 0x00000488);
	etm.reg_idr8 = reg(argc, argv, "idr8", 0);
	etm.reg_idr9 = reg(argc, argv, "idr9", 0);
	etm.reg_idr10 = reg(argc, argv, "idr10", 0);
	etm.reg_idr11 = reg(argc, argv, "idr11", 0);
	etm.reg_idr12 = reg(argc, argv, "idr12", 0);
	etm.reg_idr13 = reg(argc, argv, "idr13", 0);
	etm.reg_configr = reg(argc, argv, "configr", 0x000000C1);
	etm.reg_traceidr = reg(argc, argv, "traceidr", 0x10);
	etm.arch_ver = ARCH_V8;
	etm.core_prof = profile_CortexA;
	ete.reg_idr0 = etm.reg_idr0;
	ete.reg_idr1 = etm.reg_idr1;
	ete.reg_idr2 = etm.reg_idr2;
	ete.reg_idr8 = etm.reg_idr8;
	ete.reg_devarch = reg(argc, argv, "devarch", 0x47705A13);
	ete.reg_configr = etm.reg_configr;
	ete.reg_traceidr = etm.reg_traceidr;
	ete.arch_ver = ARCH_AA64;
	ete.core_prof = profile_CortexA;
	if (!strcmp(argv[1], "stm")) { name = OCSD_BUILTIN_DCD_STM; cfg = &stm; }
	else if (!strcmp(argv[1], "etm4")) { name = OCSD_BUILTIN_DCD_ETMV4I; cfg = &etm; }
	else if (!strcmp(argv[1], "ete")) { name = OCSD_BUILTIN_DCD_ETE; cfg = &ete; }
	else { fprintf(stderr, "unknown protocol %s\n", argv[1]); return 2; }
	double best = 1e30;
	unsigned long long count = 0;
	for (int r = 0; r < repeat; r++) {
		dcd_tree_handle_t tree = ocsd_create_dcd_tree(
			formatted ? OCSD_TRC_SRC_FRAME_FORMATTED : OCSD_TRC_SRC_SINGLE,
			formatted ? OCSD_DFRMTR_FRAME_MEM_ALIGN : 0);
		unsigned char csid = 0;
		if (ocsd_dt_create_decoder(tree, name, OCSD_CREATE_FLG_PACKET_PROC, cfg, &csid) != OCSD_OK ||
		    ocsd_dt_attach_packet_callback(tree, csid, OCSD_C_API_CB_PKT_SINK, (void *)sink, NULL) != OCSD_OK) {
			fprintf(stderr, "cannot create the %s packet processor\n", name);
			return 1;
		}
		packets = 0;
		double t0 = now();
		uint32_t done = 0;
		while (done < (uint32_t)size) {
			uint32_t used = 0;
			ocsd_datapath_resp_t resp = ocsd_dt_process_data(tree, OCSD_OP_DATA, done,
									 (uint32_t)size - done, buf + done, &used);
			done += used;
			if (OCSD_DATA_RESP_IS_FATAL(resp)) {
				fprintf(stderr, "fatal at %u\n", done);
				break;
			}
			if (OCSD_DATA_RESP_IS_WAIT(resp))
				ocsd_dt_process_data(tree, OCSD_OP_FLUSH, 0, 0, NULL, NULL);
		}
		ocsd_dt_process_data(tree, OCSD_OP_EOT, 0, 0, NULL, NULL);
		double t = now() - t0;
		if (t < best)
			best = t;
		count = packets;
		ocsd_destroy_dcd_tree(tree);
	}
	printf("%llu %.9f\n", count, best);
	return 0;
}
