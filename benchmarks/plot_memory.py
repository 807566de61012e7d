#!/usr/bin/python3
"""Draw zero-bench memory (or estimate) JSON as a PNG chart.

    benchmarks/plot_memory.py in.json out.png [--rank R]

One stacked bar per ZeRO stage (grouped by dp size when the memory run
measured several, --dp-sizes): bytes per category on one rank (rank 0 by
default) as the engine's memory report gave them. For `zero-bench memory`
output, a black tick marks the expected total (ZeRO formula + declared
buffers) and a red diamond the process peak-RSS growth during that stage;
`zero-bench estimate` output is drawn from the formula alone; estimate
output with --offload is drawn as the four stages x offload settings, one
bar each stacked by where the bytes live (device / host / NVMe, per rank),
with "x" under the settings that do not fit the given capacities.
"""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")  # no display: write files only
import matplotlib.pyplot as plt  # noqa: E402

CATEGORIES = ["params", "grads", "master", "moments", "buffers", "other"]
COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860"]


def bars_from(stages, rank):
    """Per stage: (stage, {category: bytes}, expected total, engine peak, peak RSS growth);
    the last three are None for estimates."""
    out = []
    for st in stages:
        if "ranks" in st:  # zero-bench memory
            ranks = {r["rank"]: r for r in st["ranks"]}
            if rank not in ranks:
                sys.exit(f"plot_memory: no rank {rank} in stage {st['stage']}")
            r = ranks[rank]
            out.append((st["stage"], r["measured"], r["expected_total"], r.get("engine_peak_total"),
                        r.get("rss_peak_delta")))
        else:  # zero-bench estimate
            out.append((st["stage"], st["bytes"], None, None, None))
    return out


def title_of(doc, rank):
    if doc.get("benchmark") == "estimate":
        return (f"ZeRO formula: {doc['params']:.3g} params, dp {doc['dp']}, "
                f"{doc['dtype']} {doc['optimizer']} (per rank)")
    runs = doc.get("runs") or [{"world": doc["world"]}]
    dp = ", ".join(str(r["world"]) for r in runs)
    return (f"zero-bench memory: {doc['numel']:,} params, dp {dp}, "
            f"{doc['dtype']} {doc['optimizer']}, rank {rank}")


def plot_offload(doc, output):
    """Four stages x offload settings: device / host / NVMe bytes per rank."""
    rows = doc["offload"]["rows"]
    places = [("device_bytes", "device", "#4C72B0"), ("host_bytes", "host", "#DD8452"),
              ("nvme_bytes", "NVMe", "#55A868")]
    xs, labels, x, last_stage, stage_mid = [], [], 0, None, {}
    for r in rows:
        if last_stage is not None and r["stage"] != last_stage:
            x += 1  # a gap between stages
        last_stage = r["stage"]
        xs.append(x)
        labels.append(r["offload"])
        stage_mid.setdefault(r["stage"], []).append(x)
        x += 1
    fig, ax = plt.subplots(figsize=(max(8, 0.75 * len(xs)), 5), dpi=100)
    bottoms = [0.0] * len(rows)
    for key, name, color in places:
        h = [r[key] / 1e9 for r in rows]
        ax.bar(xs, h, bottom=bottoms, color=color, label=name, width=0.7)
        bottoms = [b + v for b, v in zip(bottoms, h)]
    for xx, r, top in zip(xs, rows, bottoms):
        ax.annotate(f"{r['device_bytes'] / 1e9:.3g}" + ("" if r["fits"] else " x"), (xx, top), ha="center",
                    va="bottom", fontsize=7, xytext=(0, 2), textcoords="offset points")
    ax.set_ylim(0, max(bottoms) * 1.15)
    ax.set_xticks(xs)
    ax.set_xticklabels(labels, rotation=40, ha="right", fontsize=8)
    for st, mids in stage_mid.items():
        ax.annotate(f"stage {st}", (sum(mids) / len(mids), 1.0), xycoords=("data", "axes fraction"),
                    xytext=(0, 4), textcoords="offset points", ha="center", va="bottom", fontsize=9)
    o = doc["offload"]
    caps = ", ".join(f"{n} {o[k] / 1e9:.3g} GB" for k, n in (("device_capacity", "device/rank"),
                                                               ("host_capacity", "host/node"),
                                                               ("nvme_capacity", "NVMe/node")) if o[k] > 0)
    ax.set_ylabel("GB per rank (1e9 B); label: device GB, x = does not fit")
    ax.set_title(f"ZeRO + offload: {doc['params']:.3g} params, dp {doc['dp']}, {doc['dtype']} {doc['optimizer']}, "
                 f"{o['ranks_per_node']} ranks/node" + (f"; capacities {caps}" if caps else ""), fontsize=9,
                 pad=18)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(output, format="png")
    plt.close(fig)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("input", help="JSON written by zero-bench memory/estimate --json")
    ap.add_argument("output", help="PNG file to write")
    ap.add_argument("--rank", type=int, default=0, help="which rank's bytes to draw (memory output)")
    args = ap.parse_args(argv)

    with open(args.input) as f:
        doc = json.load(f)
    if "offload" in doc:
        return plot_offload(doc, args.output)
    # groups of bars: one per dp size measured (one group for estimates)
    runs = doc.get("runs") or [{"world": doc.get("dp", doc.get("world")), "stages": doc["stages"]}]
    groups = [(r["world"], bars_from(r["stages"], args.rank)) for r in runs]
    bars, xs, labels, group_mid = [], [], [], []
    for g, (dp, gbars) in enumerate(groups):
        x0 = g * (len(gbars) + 1)
        bars += gbars
        xs += [x0 + i for i in range(len(gbars))]
        labels += [f"stage {b[0]}" if len(groups) == 1 else f"s{b[0]}" for b in gbars]
        group_mid.append((x0 + (len(gbars) - 1) / 2, dp))
    # GB (1e9) for estimates of real models, MB (1e6) for what a CPU run holds
    biggest = max(sum(b[1].get(c, 0) for c in CATEGORIES) for b in bars)
    scale, unit = (1e9, "GB") if biggest >= 1e9 else (1e6, "MB")

    fig, ax = plt.subplots(figsize=(max(7, 1.1 * len(xs)), 4.5), dpi=100)
    bottoms = [0.0] * len(bars)
    for cat, color in zip(CATEGORIES, COLORS):
        heights = [b[1].get(cat, 0) / scale for b in bars]
        if not any(heights):
            continue
        ax.bar(xs, heights, bottom=bottoms, color=color, label=cat, width=0.6)
        bottoms = [lo + h for lo, h in zip(bottoms, heights)]
    for j, (x, (_, _, expected, peak, rss)) in enumerate(zip(xs, bars)):
        if expected is not None:
            ax.hlines(expected / scale, x - 0.38, x + 0.38, colors="black", linewidth=2,
                      label="formula + buffers" if j == 0 else None)
        if peak is not None:
            ax.hlines(peak / scale, x - 0.38, x + 0.38, colors="gray", linewidth=1.5, linestyles="dashed",
                      label="engine peak (registration, micro-step)" if j == 0 else None)
        if rss is not None:
            ax.plot([x], [rss / scale], marker="D", color="red", linestyle="none",
                    label="peak RSS growth" if j == 0 else None)
    for x, top in zip(xs, bottoms):
        ax.annotate(f"{top:.3g}", (x, top), ha="center", va="bottom", fontsize=8,
                    xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(xs)
    ax.set_xticklabels(labels)
    if len(groups) > 1:
        for mid, dp in group_mid:
            ax.annotate(f"dp {dp}", (mid, 0), xycoords=("data", "axes fraction"), xytext=(0, -28),
                        textcoords="offset points", ha="center", va="top", fontsize=9)
    ax.set_ylabel(f"bytes per rank ({unit} = {scale:.0e} B)")
    ax.set_title(title_of(doc, args.rank), fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.output, format="png")
    plt.close(fig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
