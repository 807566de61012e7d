#!/usr/bin/env python3
"""Peer benchmark (issue 12; not a test): the same GPT training job on 2 CPU ranks
x 1 thread, trained by zero-train, zero.torch, DeepSpeed ZeRO 1-3, PyTorch FSDP2 and
single-process PyTorch.

    bash benchmarks/peers/setup_venv.sh                 # once: torch + DeepSpeed from PyPI
    flock /work/wt/timing.lock python3 benchmarks/peers/bench_peers.py [--build build]
          [--venv /work/venv-peers] [--sizes small,large] [--steps 6] [--warmup 2] [--repeats 2]

The job (peer_worker.py): zero-train's GPT (tests/python/model_torch_ref.py is the
same network in torch), zero-train's initial values, data and data order, AdamW
(zero-train's betas, eps, weight decay), clipping at 1.0, WarmupCosineLR, fp32;
global batch = 2 ranks x `micro` sequences. Sizes: zero-train's built-in model
(4 layers, d_model 128, seq 64, micro 8) and 12 layers x d_model 768 x seq 128
(12 heads, micro 2).

First it proves the systems run the same job: round 1 runs every system once and
compares each system's per-step loss (the mean over both ranks' micro-batches)
with single-process PyTorch's; the maximum difference is reported, and no timing is
reported for a system whose losses differ by more than --loss-tol. Then it
alternates the systems (A B C ... A B C ...) --repeats times. Per system: tokens/s
from the median wall time of the steps after --warmup (best run), CPU seconds per
step (all ranks' processes; median), peak RSS per rank (the larger rank). Ratios:
zero-train / DeepSpeed ZeRO-3 tokens/s and peak RSS; zero.torch / PyTorch CPU
seconds per step (the same global batch: two ranks' processes against one process
doing both micro-batches) at stages 1-2.

The machine may be shared: run it under `flock /work/wt/timing.lock` and read the
CPU seconds per step, which other jobs disturb far less than wall time."""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))

SIZES = {
    "small": dict(model=dict(n_layer=4, n_head=4, d_model=128, seq_len=64, vocab=256), micro=8),
    "large": dict(model=dict(n_layer=12, n_head=12, d_model=768, seq_len=128, vocab=256), micro=2),
}
OPT = {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}
SCHED = {"warmup_min_ratio": 0.1, "warmup_num_steps": 2, "total_num_steps": 20, "cos_min_ratio": 0.1}
SEED = 1234
CLIP = 1.0
RANKS = 2
# bucket sizes as zero-train's and DeepSpeed's defaults; no overlap (one thread per rank)
ZOPT = {"reduce_bucket_size": 500000000, "allgather_bucket_size": 500000000}


def corpus(path):
    """A deterministic corpus: libzero's C sources, sorted (about 1-2 MB)."""
    parts = []
    for d in sorted(os.listdir(SRC)):
        full = os.path.join(SRC, d)
        if d.startswith((".", "build")) or not os.path.isdir(full):
            continue
        for root, dirs, files in os.walk(full):
            dirs.sort()
            for n in sorted(files):
                if n.endswith(".c"):
                    parts.append(open(os.path.join(root, n), "rb").read())
    with open(path, "wb") as f:
        f.write(b"".join(parts))


def env1():
    return dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")


def run_zero_train(a, spec, work, stage):
    cfg = {"model": spec["model"], "train_micro_batch_size_per_gpu": spec["micro"], "gradient_accumulation_steps": 1,
           "optimizer": {"type": "AdamW", "params": OPT}, "gradient_clipping": CLIP,
           "scheduler": {"type": "WarmupCosineLR", "params": dict(SCHED, warmup_type="linear")},
           "zero_optimization": dict(ZOPT, stage=stage),
           "data": {"path": spec["corpus"]},
           "train": {"steps": spec["steps"], "seed": SEED, "log_every": spec["steps"],
                     "metrics_file": os.path.join(work, "m.jsonl")}}
    cpath = os.path.join(work, "zt.json")
    with open(cpath, "w") as f:
        json.dump(cfg, f)
    cmd = [os.path.join(SRC, "tests", "mpirun.sh"), str(RANKS), os.path.join(a.build, "tools", "train", "zero-train"),
           "--plain", "--config", cpath]
    p = subprocess.run(cmd, env=env1(), capture_output=True, text=True)
    if p.returncode != 0:
        return {"error": f"zero-train exited {p.returncode}: {p.stderr[-2000:]}"}
    rows = [json.loads(line) for line in open(cfg["train"]["metrics_file"])]
    steps = [r for r in rows if "loss" in r and "step_s" in r]
    rss = [k["rss_peak"] for r in rows for k in r.get("ranks", [])]  # each rank's VmHWM
    return {"losses": [r["loss"] for r in steps], "lrs": [r["lr"] for r in steps], "step_s": [r["step_s"] for r in steps],
            "cpu_s": [r["cpu_s"] for r in steps], "rss_peak": max(rss) if rss else None}


def run_peer(a, spec, work, system, stage):
    sp = os.path.join(work, "spec.json")
    with open(sp, "w") as f:
        json.dump(spec, f)
    py = os.path.join(a.venv, "bin", "python")
    worker = [py, os.path.join(HERE, "peer_worker.py"), system, str(stage), sp, work]
    cmd = worker if system == "torch" else [os.path.join(SRC, "tests", "mpirun.sh"), str(RANKS)] + worker
    env = env1()
    env["MASTER_PORT"] = str(29500 + (os.getpid() + hash((system, stage))) % 2000)
    env["PYTHONWARNINGS"] = "ignore"
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    n = 1 if system == "torch" else RANKS
    res = []
    for r in range(n):
        f = os.path.join(work, f"rank-{r}.json")
        if os.path.exists(f):
            res.append(json.load(open(f)))
    if p.returncode != 0 or len(res) != n:
        return {"error": f"{system} stage {stage} exited {p.returncode}: {(p.stderr or p.stdout)[-2000:]}"}
    steps = len(res[0]["losses"])
    losses = [sum(r["losses"][s] for r in res) / n for s in range(steps)]
    step_s = [max(r["step_s"][s] for r in res) for s in range(steps)]   # a step ends when the slowest rank's does
    cpu_s = [sum(r["cpu_s"][s] for r in res) for s in range(steps)]     # all ranks' processes
    out = {"losses": losses, "step_s": step_s, "cpu_s": cpu_s, "rss_peak": max(r["rss_peak"] for r in res),
           "torch": res[0]["torch"]}
    if "deepspeed" in res[0]:
        out["deepspeed"] = res[0]["deepspeed"]
    return out


# Not a peer: plain PyTorch on 2 processes at once, each training its own
# micro-batch with its own AdamW, no communication. What two ranks cost in
# CPU seconds over one process doing both micro-batches, before any ZeRO
# system adds anything (the cores' shared caches and memory bandwidth): the
# floor of every 2-rank system's CPU s/step against PyTorch 1 process. Its
# losses are its own (half the data each), so the same-job check skips it.
CONTROL = "PyTorch 2 processes, no comm (control)"


def systems(a, size):
    out = [("zero-train ZeRO-3", "zero-train", 3), ("zero-train ZeRO-1", "zero-train", 1)]
    out += [(f"zero.torch ZeRO-{s}", "zero_torch", s) for s in (1, 2, 3)]
    out += [(f"DeepSpeed ZeRO-{s}", "deepspeed", s) for s in (1, 2, 3)]
    out += [("FSDP2 fully_shard", "fsdp2", 0), ("PyTorch 1 process", "torch", 0), (CONTROL, "torch_2proc", 0)]
    keep = set(a.systems.split(",")) if a.systems else None
    if size == "large":  # the goals' systems only, to keep the run short
        out = [s for s in out if s[0] not in ("zero-train ZeRO-1", "zero.torch ZeRO-3", CONTROL)]
    return [s for s in out if keep is None or s[1] in keep]


def summarize(runs, warmup, tokens):
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {"error": runs[0]["error"]}
    meds = [statistics.median(r["step_s"][warmup:]) for r in ok]
    best = min(range(len(ok)), key=lambda i: meds[i])
    return {"tokens_per_s": tokens / meds[best], "step_s": meds[best],
            "step_s_runs": meds, "cpu_s_per_step": min(statistics.median(r["cpu_s"][warmup:]) for r in ok),
            "rss_peak_per_rank": max(r["rss_peak"] for r in ok if r["rss_peak"]),
            "losses": ok[0]["losses"], "versions": {k: ok[0][k] for k in ("torch", "deepspeed") if k in ok[0]}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(SRC, "build"))
    ap.add_argument("--venv", default=os.environ.get("ZERO_PEERS_VENV", "/work/venv-peers"))
    ap.add_argument("--sizes", default="small,large")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps-large", type=int, default=4, help="steps at the large size (warm-up 1)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--systems", default="",
                    help="comma list of zero-train,zero_torch,deepspeed,fsdp2,torch,torch_2proc (the control)")
    ap.add_argument("--loss-tol", type=float, default=1e-3, help="max |loss - PyTorch's| to count as the same job")
    ap.add_argument("--json", default=None, help="default: BUILD/bench_peers.json")
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    if not os.path.exists(os.path.join(a.venv, "bin", "python")):
        sys.exit(f"bench_peers: no virtual environment at {a.venv}; run benchmarks/peers/setup_venv.sh")
    results = {"ranks": RANKS, "threads_per_rank": 1, "steps": a.steps, "warmup": a.warmup, "repeats": a.repeats,
               "optimizer": OPT, "scheduler": SCHED, "clip": CLIP, "seed": SEED, "sizes": {}}
    out = a.json or os.path.join(a.build, "bench_peers.json")
    work_root = tempfile.mkdtemp(prefix="bench_peers_")
    try:
        cpath = os.path.join(work_root, "corpus.bin")
        corpus(cpath)
        for size in a.sizes.split(","):
            sz = SIZES[size]
            steps, warmup = (a.steps_large, 1) if size == "large" else (a.steps, a.warmup)
            spec = {"model": sz["model"], "micro": sz["micro"], "ranks": RANKS, "steps": steps, "seed": SEED,
                    "optimizer": OPT, "scheduler": SCHED, "clip": CLIP, "corpus": cpath, "build": a.build,
                    "zero_optimization": ZOPT}
            tokens = RANKS * sz["micro"] * sz["model"]["seq_len"]
            runs = {name: [] for name, _, _ in systems(a, size)}
            for rep in range(a.repeats):
                for name, system, stage in systems(a, size):
                    work = tempfile.mkdtemp(dir=work_root)
                    r = (run_zero_train(a, spec, work, stage) if system == "zero-train"
                         else run_peer(a, spec, work, system, stage))
                    if system == "zero-train" and "lrs" in r and "lrs" not in spec:
                        spec["lrs"] = r["lrs"]  # the peers apply zero-train's schedule, value for value
                    runs[name].append(r)
                    shutil.rmtree(work, ignore_errors=True)
                    print(f"[{size} round {rep + 1}] {name}: " + (r["error"].splitlines()[-1] if "error" in r else
                          f"median step {statistics.median(r['step_s'][warmup:]):.3f} s"), flush=True)
                if rep == 0:  # the same job? (before any timing is reported)
                    ref = runs["PyTorch 1 process"][0]
                    for name in runs:
                        r = runs[name][0]
                        if "error" in r or "error" in ref or name == CONTROL:
                            continue
                        r["loss_max_diff"] = max(abs(x - y) for x, y in zip(r["losses"], ref["losses"]))
                        print(f"  same job: {name}: max |loss - PyTorch| over {len(ref['losses'])} steps = "
                              f"{r['loss_max_diff']:.2e}", flush=True)
            table = {}
            for name, rs in runs.items():
                s = summarize(rs, warmup, tokens)
                s["loss_max_diff_vs_torch"] = rs[0].get("loss_max_diff")
                if s.get("loss_max_diff_vs_torch") is not None and s["loss_max_diff_vs_torch"] > a.loss_tol:
                    s["not_the_same_job"] = True
                table[name] = s
            results["sizes"][size] = {"model": sz["model"], "micro": sz["micro"], "tokens_per_step": tokens,
                                      "steps": steps, "warmup": warmup,
                                      "systems": table, "ratios": ratios(table)}
            report(size, results["sizes"][size])
            with open(out, "w") as f:  # after each size: a long run that is stopped keeps what it measured
                json.dump(results, f, indent=2)
            print(f"wrote {out}")
    finally:
        shutil.rmtree(work_root, ignore_errors=True)


def ratios(t):
    def get(name, key):
        v = t.get(name, {})
        return None if "error" in v or v.get("not_the_same_job") else v.get(key)
    out = {}
    zt, ds3 = get("zero-train ZeRO-3", "tokens_per_s"), get("DeepSpeed ZeRO-3", "tokens_per_s")
    if zt and ds3:
        out["zero_train_vs_deepspeed_z3_tokens"] = zt / ds3
        out["zero_train_vs_deepspeed_z3_rss"] = get("zero-train ZeRO-3", "rss_peak_per_rank") / \
            get("DeepSpeed ZeRO-3", "rss_peak_per_rank")
    pt_cpu, pt_step = get("PyTorch 1 process", "cpu_s_per_step"), get("PyTorch 1 process", "step_s")
    for s in (1, 2, 3):
        c = get(f"zero.torch ZeRO-{s}", "cpu_s_per_step")
        if c and pt_cpu:
            out[f"zero_torch_z{s}_vs_torch_cpu_s"] = c / pt_cpu
        c2 = get(CONTROL, "cpu_s_per_step")
        if c and c2:
            out[f"zero_torch_z{s}_vs_torch_2proc_cpu_s"] = c / c2
    c2 = get(CONTROL, "cpu_s_per_step")
    if c2 and pt_cpu:
        out["torch_2proc_vs_torch_cpu_s"] = c2 / pt_cpu
    return out


def report(size, r):
    m = r["model"]
    print(f"\n{size}: GPT {m['n_layer']} layers x d_model {m['d_model']} x seq {m['seq_len']}, "
          f"global batch {RANKS} x {r['micro']}, {r['tokens_per_step']} tokens/step")
    print(f"{'system':<22} {'tokens/s':>9} {'step s':>8} {'CPU s/step':>10} {'peak RSS/rank':>14} {'max dloss':>10}")
    for name, s in r["systems"].items():
        if "error" in s:
            print(f"{name:<22} failed: {s['error'].strip().splitlines()[-1][:90]}")
            continue
        d = s.get("loss_max_diff_vs_torch")
        flag = "  NOT THE SAME JOB" if s.get("not_the_same_job") else ""
        print(f"{name:<22} {s['tokens_per_s']:>9.0f} {s['step_s']:>8.3f} {s['cpu_s_per_step']:>10.3f} "
              f"{s['rss_peak_per_rank'] / 2**20:>11.0f} MiB {('%.1e' % d) if d is not None else '-':>10}{flag}")
    for k, v in r["ratios"].items():
        print(f"  {k}: {v:.2f}")


if __name__ == "__main__":
    main()
