/* zero-bench: memory footprint and step time of the ZeRO stages.
 *
 *   zero-bench estimate --params 7.5e9 --dp 64       the paper's formula, no run
 *   tests/mpirun.sh W zero-bench memory --params N   measured bytes per category
 *   tests/mpirun.sh 2 zero-bench steptime --params N step time vs stage 0
 *   tests/mpirun.sh 2 zero-bench offload --dir D     step time with nvme / cpu offload vs none
 */
#include <stdio.h>
#include <string.h>

#include "bench_cmds.h"

static void usage(void)
{
    fprintf(stderr,
            "usage: zero-bench <command> [options]   (zero-bench <command> --help)\n"
            "  estimate   ZeRO memory formula per stage, without a run\n"
            "  memory     run real steps per stage, report engine bytes per category\n"
            "  steptime   step time of stages 1-3 against stage 0 in one run\n"
            "  stepcost   zero_engine_step against the optimizer kernel alone, per stage\n"
            "  overlap    overlap_comm on against off, per stage, in one run\n"
            "  offload    step time with optimizer offload (cpu, nvme) against none in one run\n");
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage();
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "estimate")) return bench_cmd_estimate(argc - 2, argv + 2);
    if (!strcmp(argv[1], "memory")) return bench_cmd_memory(argc - 2, argv + 2);
    if (!strcmp(argv[1], "steptime")) return bench_cmd_steptime(argc - 2, argv + 2);
    if (!strcmp(argv[1], "stepcost")) return bench_cmd_stepcost(argc - 2, argv + 2);
    if (!strcmp(argv[1], "overlap")) return bench_cmd_overlap(argc - 2, argv + 2);
    if (!strcmp(argv[1], "offload")) return bench_cmd_offload(argc - 2, argv + 2);
    fprintf(stderr, "zero-bench: unknown command '%s'\n", argv[1]);
    usage();
    return 2;
}
