#!/usr/bin/env python3
"""zero-train against PyTorch: training tokens/s of the same GPT and global batch
on the CPU, with the same number of threads, measured in one run.

  /usr/bin/python3 benchmarks/train/bench_train.py [--build build] [--steps 40] [--json FILE]
        [--torch-python PYTHON ...]

Cases (threads in total are equal on both sides):
  1 rank x 1 thread      vs  torch, 1 thread,  batch = micro
  2 ranks x 1 thread     vs  torch, 2 threads, batch = 2 x micro   (zero-train: ZeRO stage 3)
zero-train: its built-in model (4 layers, 4 heads, d_model 128, seq 64, vocab 256)
and AdamW + clipping, step time from its metrics file (each step includes the
gradient reduction, clipping, AdamW, the stage-3 gathers and the loss/memory
all-reduces). PyTorch: each --torch-python interpreter's torch (default: this
interpreter's, Debian's 1.13; add e.g. a venv with a current torch from PyPI to
compare against both in the same run), in a subprocess with OMP_NUM_THREADS = torch threads = the
thread count and a single-threaded BLAS under it (its fastest setting here; zero-train's
ranks run with 1 thread each): the independent reference model of
tests/python/model_torch_ref.py, torch.optim.AdamW, clip_grad_norm_; one step =
zero_grad + forward + backward + clip + step. Both: median over the steps after
a warm-up. Each side runs --repeats times, alternating, and keeps its best run, so a
burst of load from elsewhere on a shared machine does not decide the ratio.
Ratio = zero-train tokens/s / PyTorch tokens/s (target >= 1.5). Also reported:
CPU seconds per step on each side (all ranks' processes / all torch threads),
which time-slicing by other jobs on a shared machine disturbs far less."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(SRC, "tests", "python"))

MODEL = dict(n_layer=4, n_head=4, d_model=128, seq_len=64, vocab=256)
MICRO = 8


def zero_train(build, ranks, steps, warmup, stage):
    exe = os.path.join(build, "tools", "train", "zero-train")
    with tempfile.TemporaryDirectory() as d:
        m = os.path.join(d, "m.jsonl")
        cmd = ([os.path.join(SRC, "tests", "mpirun.sh"), str(ranks)] if ranks > 1 else []) + \
              [exe, "--plain", "--steps", str(steps), "--stage", str(stage), "--micro-batch", str(MICRO),
               "--metrics", m, "--log-every", str(steps)]
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        subprocess.run(cmd, check=True, env=env, capture_output=True, text=True)
        rows = [json.loads(line) for line in open(m)]
    med = statistics.median(r["step_s"] for r in rows[warmup:])
    cpu = statistics.median(r["cpu_s"] for r in rows[warmup:])  # all ranks' processes
    return MICRO * ranks * MODEL["seq_len"] / med, med, cpu


def torch_worker(threads, batch, steps, warmup):
    """The PyTorch side, in its own process so that OMP_NUM_THREADS and
    OPENBLAS_NUM_THREADS are set before torch loads (set_num_threads alone
    leaves the BLAS inside torch free to use every core)."""
    import torch
    import model_torch_ref as ref
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = ref.GPT(**MODEL)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    tok = torch.randint(0, 256, (batch, MODEL["seq_len"]))
    tgt = torch.randint(0, 256, (batch, MODEL["seq_len"]))
    times, cpus = [], []
    for _ in range(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=False)
        _, loss = model(tok, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    print(json.dumps(dict(step_s=statistics.median(times[warmup:]), cpu_s=statistics.median(cpus[warmup:]),
                          version=torch.__version__, threads=torch.get_num_threads())))


def torch_train(python, threads, batch, steps, warmup):
    # torch spreads each op over `threads` intra-op threads; the BLAS under it
    # stays single-threaded, as nested BLAS threads double its step time here
    # (2 threads, batch 16: 208 ms with OPENBLAS_NUM_THREADS=2, 103 ms with 1)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    out = subprocess.run([python, os.path.abspath(__file__), "--torch-worker", str(threads), str(batch),
                          str(steps), str(warmup)], check=True, env=env, capture_output=True, text=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    return batch * MODEL["seq_len"] / r["step_s"], r["step_s"], r["cpu_s"], r["version"]


def main():
    if len(sys.argv) == 6 and sys.argv[1] == "--torch-worker":
        torch_worker(*(int(x) for x in sys.argv[2:]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(SRC, "build"))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=2,
                    help="alternate the two sides this many times and keep each side's best (a shared machine)")
    ap.add_argument("--json", default=None, help="default: BUILD/bench_train.json")
    ap.add_argument("--torch-python", action="append", default=None,
                    help="an interpreter whose torch is a peer (repeat for several; default: this one)")
    a = ap.parse_args()
    pythons = a.torch_python or [sys.executable]
    out = a.json or os.path.join(a.build, "bench_train.json")
    cases = []
    for ranks, stage in ((1, 3), (2, 3)):
        z, t = [], {p: [] for p in pythons}
        for _ in range(a.repeats):  # alternate: zero-train, then each peer
            z.append(zero_train(a.build, ranks, a.steps, a.warmup, stage))
            for p in pythons:
                t[p].append(torch_train(p, ranks, MICRO * ranks, a.steps, a.warmup))
        z_tps, z_step, _ = max(z)
        z_cpu = min(x[2] for x in z)
        peers = []
        for p in pythons:
            t_tps, t_step, _, version = max(t[p])
            t_cpu = min(x[2] for x in t[p])
            peers.append(dict(python=p, torch=version, torch_tokens_per_s=t_tps, torch_step_s=t_step,
                              ratio=z_tps / t_tps, torch_cpu_s_per_step=t_cpu, cpu_ratio=t_cpu / z_cpu))
        cases.append(dict(ranks=ranks, threads_total=ranks, stage=stage, batch=MICRO * ranks,
                          seq=MODEL["seq_len"], zero_tokens_per_s=z_tps, zero_step_s=z_step,
                          zero_cpu_s_per_step=z_cpu, peers=peers))
    print(f"GPT {MODEL}, AdamW + clipping, CPU; medians over {a.steps - a.warmup} steps after {a.warmup} warm-up")
    print(f"{'case':<40} {'torch':<14} {'zero-train tok/s':>16} {'PyTorch tok/s':>14} {'ratio':>7}   "
          f"{'CPU ms/step zero':>16} {'torch':>7} {'ratio':>7}")
    for c in cases:
        name = f"{c['ranks']} rank(s) stage {c['stage']}, {c['threads_total']} thread(s), batch {c['batch']}"
        for pr in c["peers"]:
            print(f"{name:<40} {pr['torch']:<14} {c['zero_tokens_per_s']:>16.0f} {pr['torch_tokens_per_s']:>14.0f} "
                  f"{pr['ratio']:>6.2f}x   {1e3 * c['zero_cpu_s_per_step']:>16.1f} "
                  f"{1e3 * pr['torch_cpu_s_per_step']:>7.1f} {pr['cpu_ratio']:>6.2f}x")
    print("ratio: wall-clock tokens/s, best run of each side; CPU ratio: CPU seconds per step (all threads and "
          "ranks), PyTorch / zero-train, the figure that a busy shared machine disturbs least")
    with open(out, "w") as f:
        json.dump(dict(model=MODEL, micro_batch=MICRO, steps=a.steps, warmup=a.warmup, repeats=a.repeats, target_ratio=1.5,
                       cases=cases), f, indent=2)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
