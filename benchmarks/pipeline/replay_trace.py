#!/usr/bin/env python3
"""Replay a pipeline trace (zero-bench-pipeline --trace, zero-train --trace) with free
communication: each rank's compute spans in the order it ran them, each taking the time it
took, each starting once the stage is free and its data is there (F(m, q) after F(m, q-1),
B(m, q) after B(m, q+1), q the virtual stage). The bubble of that replay is what the
schedule gives at the measured op times, jitter included, with transfers and the host's
waiting removed; set against the measured bubble (the same spans' real start times) it
splits the gap to the unit-time theory into op-time variation and the rest.

    benchmarks/pipeline/replay_trace.py TRACE.json [--skip-steps 1]

Prints per step: measured bubble, replayed bubble; and their means over the counted steps."""
import argparse
import json

KINDS = ("forward", "backward", "weight-grad")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--skip-steps", type=int, default=1, help="warm-up steps left out of the means")
    a = ap.parse_args()
    ev = json.load(open(a.trace))["traceEvents"]
    stage_of = {}
    for e in ev:  # "rank R (pp stage S)"
        if e.get("name") == "process_name":
            stage_of[e["pid"]] = int(e["args"]["name"].split("pp stage ")[1].rstrip(")"))
    spans = [e for e in ev if e.get("ph") == "X" and e.get("cat") in KINDS]
    P = max(stage_of.values()) + 1
    V = max(e["args"]["chunk"] for e in spans) + 1
    steps = sorted({e["args"]["step"] for e in spans})
    meas, rep = [], []
    for step in steps:
        ss = [e for e in spans if e["args"]["step"] == step]
        t0 = min(e["ts"] for e in ss)
        t1 = max(e["ts"] + e["dur"] for e in ss)
        per = {s: sorted((e for e in ss if stage_of[e["pid"]] == s), key=lambda e: e["ts"]) for s in range(P)}
        busy = {s: sum(e["dur"] for e in per[s]) for s in range(P)}
        m_bub = sum(1 - busy[s] / (t1 - t0) for s in range(P)) / P
        # the replay: list scheduling in each stage's order, data dependencies only
        done, pc, clock = {}, {s: 0 for s in range(P)}, {s: 0.0 for s in range(P)}
        last_q = P * V - 1
        progress = True
        while progress:
            progress = False
            for s in range(P):
                while pc[s] < len(per[s]):
                    e = per[s][pc[s]]
                    m, c = e["args"]["micro"], e["args"]["chunk"]
                    q = c * P + s
                    dep = None
                    if e["cat"] == "forward" and q > 0:
                        dep = ("forward", m, q - 1)
                    elif e["cat"] == "backward" and q < last_q:
                        dep = ("backward", m, q + 1)
                    if dep is not None and dep not in done:
                        break
                    start = max(clock[s], done[dep] if dep is not None else 0.0)
                    clock[s] = start + e["dur"]
                    done[(e["cat"], m, q)] = clock[s]
                    pc[s] += 1
                    progress = True
        if any(pc[s] < len(per[s]) for s in range(P)):
            raise SystemExit(f"step {step}: the replay is stuck (the spans do not form a schedule)")
        span = max(clock.values())
        r_bub = sum(1 - busy[s] / span for s in range(P)) / P
        print(f"step {step}: measured bubble {m_bub:.3f}, replayed with free communication {r_bub:.3f}")
        if step >= steps[0] + a.skip_steps:
            meas.append(m_bub), rep.append(r_bub)
    if meas:
        print(f"mean over {len(meas)} counted steps: measured {sum(meas) / len(meas):.3f}, "
              f"replayed {sum(rep) / len(rep):.3f}")


if __name__ == "__main__":
    main()
