#!/usr/bin/env python3
"""Render pipeline step timelines (Chrome trace-event JSON written by
zero-train --trace or zero-bench-pipeline --trace) to a PNG, several traces
side by side (one panel per file, one row per rank).

    plot_trace.py OUT.png TRACE.json [TRACE.json ...] [--step N]

Forward spans are blue, backward (B, or the whole backward when unsplit)
green, weight gradients (W) orange, communication waits grey, the optimizer
red; each span is labelled with its micro-batch (and chunk when > 0)."""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"forward": "#4c72b0", "backward": "#55a868", "weight-grad": "#dd8452", "comm": "#bbbbbb",
          "optimizer": "#c44e52"}


def load(path, step):
    with open(path) as f:
        doc = json.load(f)
    names, spans = {}, []
    for e in doc["traceEvents"]:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            names[e["pid"]] = e["args"]["name"]
        elif e.get("ph") == "X" and (step is None or e["args"].get("step") == step):
            spans.append(e)
    label = doc.get("otherData", {}).get("label", path)
    return label, names, spans


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--step", type=int, default=None, help="only this step (default: all)")
    a = ap.parse_args()
    panels = [load(p, a.step) for p in a.traces]
    fig, axes = plt.subplots(len(panels), 1, figsize=(14, 1.2 + 0.55 * max(len(n) for _, n, _ in panels) * len(panels)),
                             squeeze=False)
    for ax, (label, names, spans) in zip(axes[:, 0], panels):
        t0 = min((s["ts"] for s in spans), default=0)
        for s in spans:
            y = s["pid"]
            x, w = (s["ts"] - t0) / 1e3, s["dur"] / 1e3
            ax.barh(y, w, left=x, height=0.8, color=COLORS.get(s.get("cat"), "#888888"), edgecolor="white",
                    linewidth=0.3)
            if s.get("cat") in ("forward", "backward", "weight-grad") and w > 0:
                m, c = s["args"].get("micro", 0), s["args"].get("chunk", 0)
                ax.text(x + w / 2, y, f"{m}" if c == 0 else f"{m}.{c}", ha="center", va="center", fontsize=6)
        ax.set_yticks(sorted(names))
        ax.set_yticklabels([names[k] for k in sorted(names)], fontsize=8)
        ax.invert_yaxis()
        ax.set_title(label, fontsize=10, loc="left")
        ax.set_xlabel("ms")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    fig.legend(handles, list(COLORS), loc="upper right", ncol=len(COLORS), fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(a.out, dpi=120)


if __name__ == "__main__":
    main()
