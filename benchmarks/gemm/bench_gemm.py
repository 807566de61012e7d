#!/usr/bin/env python3
"""The CPU GEMM against the best kernel on the machine, and zero-train against
both, in one run (issue 15).

  /usr/bin/python3 benchmarks/gemm/bench_gemm.py [--build build] [--rounds 3] [--threads 2]
        [--d-model 768 --layers 12 --seq 128 --micro 4] [--steps 6] [--json FILE]

Each round runs, alternating, at zero-train's shapes (zero-bench-gemm, the
same thread split as zero-train):
  ours f32        the packed AVX-512 FMA kernel      (ZERO_CPU_GEMM=avx512)
  ours f32 avx2   the packed AVX2 FMA kernel         (ZERO_CPU_GEMM=avx2)
  ours bf16       what auto picks for bf16 math, and each bf16 kernel the CPU has
                  (ZERO_CPU_GEMM=amx_bf16, avx512_bf16)
  openblas        OpenBLAS as the environment leaves it (whatever OPENBLAS_CORETYPE says, or its own pick)
  openblas:X      OpenBLAS with OPENBLAS_CORETYPE=X set for that child only (Haswell, SkylakeX, Cooperlake)
The table's kernel column names what ran: OpenBLAS's own core name (a
CoreType this CPU cannot run may fall back, or die, and is then absent).
and zero-train (1 rank, --threads OpenMP threads, stage 0) at the same size in
fp32 and bf16. Every figure is the best of its rounds (a shared machine), in
two clocks: wall (what a user sees) and CPU ("cpu": the work divided by the
process's CPU seconds / threads, i.e. the rate on cores of its own, which
time-slicing by other jobs disturbs far less; spin-waits count against it).
Model GFLOP/s = tokens/s x 6 x (12 L C^2 + C V): the linear layers and the
head only, attention's products left out, so it understates zero-train.
Ratios reported: zero-train fp32 model GFLOP/s / the best fp32 GEMM rate
(target >= 0.8), and zero-train bf16 / fp32 tokens/s (target >= 1.3 where the
CPU has avx512_bf16)."""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def gemm(build, threads, kernel, math, coretype, a):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS="1")
    if coretype:
        env["OPENBLAS_CORETYPE"] = coretype
    cmd = [os.path.join(build, "benchmarks", "gemm", "zero-bench-gemm"), "--kernel", kernel, "--math", math,
           "--d-model", str(a.d_model), "--tokens", str(a.micro * a.seq), "--vocab", str(a.vocab),
           "--layers", str(a.layers), "--seconds", str(a.seconds)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        return None  # a kernel this CPU lacks
    return json.loads(r.stdout.strip().splitlines()[-1])


def ran(r):
    """The kernel a run used: ours by name, OpenBLAS with the core it really ran
    (a CoreType the CPU cannot run falls back: openblas:Cooperlake on an AVX2
    CPU runs Haswell)."""
    return f"blas:{r.get('blas_core', '?')}" if r["kernel"] == "blas" else r["kernel"]


def zero_train(build, threads, dtype, a):
    exe = os.path.join(build, "tools", "train", "zero-train")
    with tempfile.TemporaryDirectory() as d:
        m = os.path.join(d, "m.jsonl")
        cmd = [exe, "--plain", "--steps", str(a.steps), "--stage", "0", "--micro-batch", str(a.micro),
               "--metrics", m, "--log-every", str(a.steps),
               "--set", f"model.n_layer={a.layers}", "--set", f"model.d_model={a.d_model}",
               "--set", f"model.n_head={a.d_model // 64}", "--set", f"model.seq_len={a.seq}",
               "--set", f"model.vocab={a.vocab}", "--set", f"bf16.enabled={'true' if dtype == 'bf16' else 'false'}"]
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS="1")
        subprocess.run(cmd, check=True, env=env, capture_output=True, text=True)
        rows = [json.loads(line) for line in open(m)]
    step = statistics.median(r["step_s"] for r in rows[a.warmup:])
    cpu = statistics.median(r["cpu_s"] for r in rows[a.warmup:]) / threads
    return dict(tokens_per_s=a.micro * a.seq / step, step_s=step, tokens_per_cpu_s=a.micro * a.seq / cpu,
                cpu_s=cpu, loss_last=rows[-1].get("loss"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(SRC, "build"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=1.0, help="zero-bench-gemm time per run")
    ap.add_argument("--no-train", action="store_true", help="GEMM rates only")
    ap.add_argument("--json", default=None, help="default: BUILD/bench_gemm.json")
    a = ap.parse_args()
    cands = [("ours f32", "avx512", "f32", None), ("ours f32 avx2", "avx2", "f32", None),
             ("ours bf16 (auto)", "auto", "bf16", None),
             ("ours amx_bf16", "amx_bf16", "bf16", None), ("ours avx512_bf16", "avx512_bf16", "bf16", None),
             ("openblas (as set)", "blas", "f32", None)]
    cands += [(f"openblas:{c}", "blas", "f32", c) for c in ("Haswell", "SkylakeX", "Cooperlake")]
    best = {}
    trains = {"f32": [], "bf16": []}
    for _ in range(a.rounds):
        for name, kernel, math, core in cands:
            r = gemm(a.build, a.threads, kernel, math, core, a)
            if r:
                b = best.setdefault(name, r)
                b["gflops"] = max(b["gflops"], r["gflops"])
                b["gflops_cpu"] = max(b["gflops_cpu"], r["gflops_cpu"])
        if not a.no_train:
            for dt in ("f32", "bf16"):
                trains[dt].append(zero_train(a.build, a.threads, dt, a))
    flops_tok = 6.0 * (12 * a.layers * a.d_model ** 2 + a.d_model * a.vocab)
    env_core = os.environ.get("OPENBLAS_CORETYPE", "(unset)")
    print(f"GEMM at zero-train's shapes: d_model {a.d_model}, {a.layers} layers, {a.micro * a.seq} tokens, "
          f"vocab {a.vocab}, {a.threads} threads; best of {a.rounds} rounds (OPENBLAS_CORETYPE here: {env_core})")
    print(f"  {'':<22} {'kernel (what ran)':<20} {'wall GFLOP/s':>12} {'cpu GFLOP/s':>12}")
    for name, r in best.items():
        print(f"  {name:<22} {ran(r):<20} {r['gflops']:12.1f} {r['gflops_cpu']:12.1f}")
    f32 = {k: v for k, v in best.items() if v["math"] == "f32"}
    top = max(f32, key=lambda k: f32[k]["gflops"])
    top_cpu = max(f32, key=lambda k: f32[k]["gflops_cpu"])
    out = dict(args=vars(a), gemm=best, best_f32=top, best_f32_gflops=f32[top]["gflops"], best_f32_cpu=top_cpu,
               best_f32_gflops_cpu=f32[top_cpu]["gflops_cpu"], openblas_coretype=env_core)
    if not a.no_train:
        z = {}
        for dt, v in trains.items():
            r = max(v, key=lambda r: r["tokens_per_s"])
            r["tokens_per_cpu_s"] = max(x["tokens_per_cpu_s"] for x in v)
            r["model_gflops"] = r["tokens_per_s"] * flops_tok * 1e-9
            r["model_gflops_cpu"] = r["tokens_per_cpu_s"] * flops_tok * 1e-9
            z[dt] = r
            print(f"  zero-train {dt:<5} {r['tokens_per_s']:9.1f} tok/s (cpu clock {r['tokens_per_cpu_s']:9.1f})  "
                  f"{r['model_gflops']:7.1f} model GFLOP/s (cpu {r['model_gflops_cpu']:7.1f})  "
                  f"loss after {a.steps} steps {r['loss_last']}")
        out["zero_train"] = z
        out["train_vs_best_gemm"] = z["f32"]["model_gflops"] / f32[top]["gflops"]
        out["train_vs_best_gemm_cpu"] = z["f32"]["model_gflops_cpu"] / f32[top_cpu]["gflops_cpu"]
        out["bf16_vs_f32_tokens"] = z["bf16"]["tokens_per_s"] / z["f32"]["tokens_per_s"]
        out["bf16_vs_f32_tokens_cpu"] = z["bf16"]["tokens_per_cpu_s"] / z["f32"]["tokens_per_cpu_s"]
        print(f"zero-train fp32 / best fp32 GEMM: wall {out['train_vs_best_gemm']:.2f} ({top}), "
              f"cpu {out['train_vs_best_gemm_cpu']:.2f} ({top_cpu}) (target >= 0.8)")
        print(f"zero-train bf16 / fp32 tokens/s: wall {out['bf16_vs_f32_tokens']:.2f}, "
              f"cpu {out['bf16_vs_f32_tokens_cpu']:.2f} (target >= 1.3 with a bf16 kernel)")
    path = a.json or os.path.join(a.build, "bench_gemm.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=2)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
