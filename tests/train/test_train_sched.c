/* zero-train's schedulers step for step against DeepSpeed's
 * (deepspeed/runtime/lr_schedules.py, as its docs state them):
 *
 *   w = max(2, warmup_num_steps)
 *   gamma(it) = log(it + 1) / log(w)   (warmup_type "log", the default)
 *             = it / w                 ("linear"), for it < w
 *   WarmupLR       lr(it) = min + (max - min) * (it < w ? gamma(it) : 1)
 *   WarmupDecayLR  lr(it) = min + (max - min) * (it < w ? gamma(it)
 *                           : max(0, (total - it) / max(1, total - w)))
 *   WarmupCosineLR lr(it) = base * (it < w ? wmin + (1 - wmin) * gamma(it)
 *                           : max(0, cmin + (1 - cmin) * (1 + cos(pi * (it - w + 1) / (total - w))) / 2))
 *
 * and DeepSpeed's order of events: the scheduler is constructed with
 * last_batch_iteration = -1 and does NOT step then; it sets the lr to its
 * value at -1 (WarmupLR/WarmupDecayLR: min, WarmupCosineLR: 0). The engine
 * calls scheduler.step() (it += 1) after every applied optimizer update.
 * The test replays that loop and checks train_sched_lr gives the lr each
 * update used. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "train_config.h"

typedef struct ds_sched {
    int kind; /* 1 WarmupLR, 2 WarmupDecayLR, 3 WarmupCosineLR */
    double min, max, wmin, cmin, base;
    long long warmup, total;
    int linear;
} ds_sched;

static double ds_lr(const ds_sched *d, long long it)
{
    if (it < 0) return d->kind == 3 ? 0.0 : d->min;
    const long long w = d->warmup > 2 ? d->warmup : 2;
    const double gamma = d->linear ? (double)it / (double)w : log((double)it + 1.0) / log((double)w);
    if (d->kind == 1) return d->min + (d->max - d->min) * (it < w ? gamma : 1.0);
    if (d->kind == 2) {
        double span = (double)(d->total - w) > 1.0 ? (double)(d->total - w) : 1.0;
        double g = it < w ? gamma : fmax(0.0, (double)(d->total - it) / span);
        return d->min + (d->max - d->min) * g;
    }
    double ratio = it < w ? d->wmin + (1.0 - d->wmin) * gamma
                          : fmax(0.0, d->cmin + (1.0 - d->cmin) *
                                                    (1.0 + cos(M_PI * (double)(it - w + 1) / (double)(d->total - w))) / 2.0);
    return d->base * ratio;
}

static void load(const char *text, train_config *c)
{
    json_error_t je;
    json_t *root = json_loads(text, 0, &je);
    char err[512] = "";
    CHECK_MSG(root && train_config_parse(c, root, 1, err, sizeof err) == 0, "%s: %s", text, err);
    json_decref(root);
}

/* DeepSpeed's training loop, `updates` applied updates long. */
static void replay(const char *text, const ds_sched *d, int updates)
{
    train_config c;
    load(text, &c);
    long long it = -1;           /* constructed: not stepped */
    double lr = ds_lr(d, it);    /* ... but the lr at -1 is set */
    for (int k = 1; k <= updates; k++) {
        double ours = train_sched_lr(&c.sched, c.lr, k - 1); /* k - 1 updates applied before update k */
        CHECK_MSG(fabs(ours - lr) <= 1e-15 + 1e-12 * fabs(lr), "%s: update %d: ours %.17g, DeepSpeed %.17g", text,
                  k, ours, lr);
        it++; /* engine.step(): optimizer.step(), then lr_scheduler.step() */
        lr = ds_lr(d, it);
    }
    train_config_free(&c);
}

int main(void)
{
    /* The numbers: linear warm-up 0 -> 6e-4 over 4 steps; DeepSpeed's
     * updates 1-5 use 0, 0, 1.5e-4, 3e-4, 4.5e-4 (then 6e-4 from update 6). */
    train_config c;
    load("{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_min_lr\": 0, \"warmup_max_lr\": 0.0006,"
         "\"warmup_num_steps\": 4, \"warmup_type\": \"linear\"}}}", &c);
    const double want[] = {0, 0, 1.5e-4, 3e-4, 4.5e-4, 6e-4, 6e-4};
    for (int k = 1; k <= 7; k++)
        CHECK_MSG(fabs(train_sched_lr(&c.sched, c.lr, k - 1) - want[k - 1]) < 1e-18, "update %d: %.17g", k,
                  train_sched_lr(&c.sched, c.lr, k - 1));
    train_config_free(&c);

    ds_sched d = {1, 0.0, 6e-4, 0, 0, 0, 4, 0, 1};
    replay("{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_min_lr\": 0, \"warmup_max_lr\": 0.0006,"
           "\"warmup_num_steps\": 4, \"warmup_type\": \"linear\"}}}", &d, 12);
    /* log warm-up (the default type) from a non-zero min; warmup 1 is clamped to 2 */
    d = (ds_sched){1, 1e-5, 2e-3, 0, 0, 0, 10, 0, 0};
    replay("{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_min_lr\": 0.00001, \"warmup_max_lr\": 0.002,"
           "\"warmup_num_steps\": 10}}}", &d, 30);
    d = (ds_sched){1, 0.0, 1e-3, 0, 0, 0, 1, 0, 1};
    replay("{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_max_lr\": 0.001, \"warmup_num_steps\": 1,"
           "\"warmup_type\": \"linear\"}}}", &d, 6);
    /* WarmupDecayLR: past total_num_steps the lr stays at min */
    d = (ds_sched){2, 1e-4, 2e-3, 0, 0, 0, 10, 20, 0};
    replay("{\"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {\"warmup_min_lr\": 0.0001,"
           "\"warmup_max_lr\": 0.002, \"warmup_num_steps\": 10, \"total_num_steps\": 20}}}", &d, 40);
    d = (ds_sched){2, 0.0, 3e-4, 0, 0, 0, 5, 50, 1};
    replay("{\"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {\"warmup_max_lr\": 0.0003,"
           "\"warmup_num_steps\": 5, \"total_num_steps\": 50, \"warmup_type\": \"linear\"}}}", &d, 60);
    /* WarmupCosineLR: ratios of optimizer.params.lr; the first update uses 0 */
    d = (ds_sched){3, 0, 0, 0.0, 0.1, 0.01, 10, 110, 1};
    replay("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}},"
           "\"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {\"warmup_num_steps\": 10,"
           "\"total_num_steps\": 110, \"warmup_min_ratio\": 0.0, \"cos_min_ratio\": 0.1,"
           "\"warmup_type\": \"linear\"}}}", &d, 130);
    d = (ds_sched){3, 0, 0, 0.05, 1e-4, 0.003, 20, 1000, 0};
    replay("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.003}},"
           "\"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {\"warmup_num_steps\": 20,"
           "\"total_num_steps\": 1000, \"warmup_min_ratio\": 0.05}}}", &d, 1000);
    /* no scheduler: the optimizer's lr from the first update on */
    load("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.02}}}", &c);
    CHECK(train_sched_lr(&c.sched, c.lr, 0) == 0.02 && train_sched_lr(&c.sched, c.lr, 7) == 0.02);
    train_config_free(&c);
    return check_exit();
}
