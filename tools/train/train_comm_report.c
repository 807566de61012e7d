/* zero-train's per-step communication report (train_comm_report.h). */
#include "train_comm_report.h"

#include <stdio.h>
#include <string.h>

#include "train_parallel.h"

static void add(train_comm_report *t, const char *name, zero_comm *c)
{
    if (!c || t->n == TRAIN_COMM_GROUPS) return;
    t->name[t->n] = name;
    t->comm[t->n] = c;
    zero_comm_get_counters(c, &t->base[t->n]);
    t->n++;
}

void train_comm_report_start(train_comm_report *t, const run *r)
{
    memset(t, 0, sizeof *t);
    if (r->par) {
        zero_comm *g[4];
        const char *names[4];
        int n = train_parallel_comms(r->par, names, g);
        for (int k = 0; k < n; k++) add(t, names[k], g[k]);
    } else {
        /* on the CPU the engine's comm also carries zero-train's per-step metrics (host_comm) */
        add(t, r->ep ? "edp" : "dp", r->comm);
        add(t, "ep", r->ep);
    }
}

static const char *const kind_name[ZERO_OP_KIND_COUNT] = {"all-reduce", "reduce-scatter", "all-gather", "broadcast",
                                                           "send", "recv", "barrier", "all-to-all", "all-to-all-v"};

void train_comm_report_print(const train_comm_report *t, int64_t steps)
{
    if (steps < 1 || t->n == 0) return;
    printf("summary: rank 0 bytes sent per step:");
    for (int g = 0; g < t->n; g++) {
        zero_comm_counters now;
        if (zero_comm_get_counters(t->comm[g], &now) != ZERO_OK) continue;
        uint64_t total = 0;
        for (int k = 0; k < ZERO_OP_KIND_COUNT; k++) total += now.bytes_sent[k] - t->base[g].bytes_sent[k];
        printf("%s %s %.0f (", g ? ";" : "", t->name[g], (double)total / (double)steps);
        int first = 1;
        for (int k = 0; k < ZERO_OP_KIND_COUNT; k++) {
            uint64_t b = now.bytes_sent[k] - t->base[g].bytes_sent[k];
            if (!b) continue;
            printf("%s%s %.0f", first ? "" : ", ", kind_name[k], (double)b / (double)steps);
            first = 0;
        }
        printf("%s)", first ? "none" : "");
    }
    printf("\n");
}
