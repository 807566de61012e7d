/* zero-bench subcommands: each takes the arguments after its name and
 * returns the process exit status (0 ok, 1 failure, 2 usage error). */
#ifndef ZERO_BENCH_CMDS_H
#define ZERO_BENCH_CMDS_H

int bench_cmd_estimate(int argc, char **argv);
int bench_cmd_memory(int argc, char **argv);
int bench_cmd_steptime(int argc, char **argv);
int bench_cmd_offload(int argc, char **argv);

#endif
