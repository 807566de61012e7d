#!/usr/bin/env python3
"""The pipeline bubble table (docs/BENCHMARKS.md): every schedule at p = 2, 4
and M = 4, 8 on simulated compute, and on the real GPT, through
zero-bench-pipeline with ranks as processes (tests/mpirun.sh).

    flock /work/wt/timing.lock benchmarks/pipeline/bench_pipeline.py BUILD_DIR OUT_DIR [--sim-ms 20] [--steps 4]
        [--schedules zb-h1,zb-h2]   (some rows only: the listed schedules, alternated per (p, M))

Writes OUT_DIR/pipeline.json (every row), OUT_DIR/pipeline.md (the table),
traces of p = 4, M = 8 per schedule and OUT_DIR/pipeline_p4_m8.png (them side
by side, benchmarks/pipeline/plot_trace.py)."""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SCHEDULES = ["gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2"]


def run(build, p, sched, m, out, extra):
    j = os.path.join(out, f"row_{sched}_p{p}_m{m}_{'real' if '--real' in extra else 'sim'}.json")
    cmd = [os.path.join(ROOT, "tests", "mpirun.sh"), str(p), os.path.join(build, "benchmarks", "pipeline",
                                                                           "zero-bench-pipeline"),
           sched, str(m), "--json", j] + extra
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run(cmd, check=True, env=env, stdout=sys.stderr)
    with open(j) as f:
        return json.load(f)[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("out")
    ap.add_argument("--sim-ms", default="20")
    ap.add_argument("--steps", default="4")
    ap.add_argument("--schedules", default=",".join(SCHEDULES))
    a = ap.parse_args()
    scheds = a.schedules.split(",")
    bad = [s for s in scheds if s not in SCHEDULES]
    if bad:
        ap.error(f"--schedules: {bad} not among {SCHEDULES}")
    os.makedirs(a.out, exist_ok=True)
    rows = []
    for p in (2, 4):
        for m in (4, 8):
            for s in scheds:
                extra = ["--sim-ms", a.sim_ms, "--steps", a.steps]
                if p == 4 and m == 8:
                    extra += ["--trace", os.path.join(a.out, f"trace_{s}_p4_m8.json")]
                rows.append(run(a.build, p, s, m, a.out, extra))
    for p in (2, 4):
        for s in scheds:
            rows.append(run(a.build, p, s, 8, a.out, ["--real", "--steps", "3"]))
    with open(os.path.join(a.out, "pipeline.json"), "w") as f:
        json.dump(rows, f, indent=1)
    lines = ["| compute | schedule | p | M | v | measured bubble | theoretical | peak live activation sets per stage |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        comp = f"simulated {r['op_ms']:.0f} ms/op" if r["compute"] == "simulated" else "real GPT"
        peaks = " / ".join(f"{x:g}" for x in r["peak_live_stage_units"])
        lines.append(f"| {comp} | {r['schedule']} | {r['p']} | {r['m']} | {r['v']} | {r['measured_bubble']:.3f} | "
                     f"{r['theoretical_bubble']:.3f} | {peaks} |")
    with open(os.path.join(a.out, "pipeline.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    subprocess.run([sys.executable, os.path.join(HERE, "plot_trace.py"), os.path.join(a.out, "pipeline_p4_m8.png")] +
                   [os.path.join(a.out, f"trace_{s}_p4_m8.json") for s in scheds] + ["--step", "1"], check=True)


if __name__ == "__main__":
    main()
