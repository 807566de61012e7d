/* Internal: this process's resident memory as Linux reports it, for what
 * holds the engine's memory report against what the process really holds:
 * zero-train's summary and metrics (tools/train/train_loop.c), the memory
 * benchmark (benchmarks/memory/bench_memory.c) and the tests (tests/engine:
 * test_engine_init.c, test_engine_memory.c, test_engine_param_offload.c).
 * One copy of what each of them had written out. Header-only: the library
 * itself does not read /proc. */
#ifndef ZERO_COMMON_PROC_MEM_H
#define ZERO_COMMON_PROC_MEM_H

#include <stdio.h>
#include <unistd.h>

/* Resident bytes now (/proc/self/statm); -1 if unknown. */
static inline long proc_rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, res = 0;
    if (!f) return -1;
    if (fscanf(f, "%ld %ld", &pages, &res) != 2) res = -1;
    fclose(f);
    return res < 0 ? -1 : res * sysconf(_SC_PAGESIZE);
}

/* Peak resident bytes (VmHWM) since the last proc_reset_peak(); -1 if unknown. */
static inline long proc_hwm_bytes(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    if (!f) return -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %ld kB", &kb) == 1) break;
    fclose(f);
    return kb < 0 ? -1 : kb * 1024;
}

/* Resets the peak to the current resident size ("5" to clear_refs, Linux
 * >= 4.0); 1 if it did, 0 if not (the peak checks are then skipped). */
static inline int proc_reset_peak(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return 0;
    int ok = fputs("5", f) >= 0;
    return fclose(f) == 0 && ok;
}

#endif
