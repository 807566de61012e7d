#!/usr/bin/env python3
"""zero.torch's own cost per step, apart from communication and from running
two processes at once (issue 12; not a test).

    flock /work/wt/timing.lock /work/venv-peers/bin/python benchmarks/peers/zero_torch_overhead.py \\
          [--build build] [--stages 1,2,3] [--steps 40]

One process, one thread: bench_peers' small job (zero-train's GPT, its data,
AdamW, clipping) trained side by side by plain PyTorch and by zero.torch on a
one-rank engine (local comm), step by step alternated (torch step s, zero.torch
step s, torch step s+1, ...) on the same micro-batch, so both see the same load
at the same moment: a shared machine disturbs the ratio far less than it
disturbs two separate runs. Reports the median CPU milliseconds of forward,
backward and step of each (after 5 warm-up steps) and zero.torch / torch for
forward + backward (the hooks, the gradient added into the engine's buffer)
and for the whole step (the engine's AdamW instead of torch.optim.AdamW).
bench_peers.py measures the 2-rank job; the difference is communication and
the two processes sharing the machine (its control system)."""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_peers  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(bench_peers.SRC, "build"))
    ap.add_argument("--stages", default="1,2,3")
    ap.add_argument("--steps", type=int, default=40)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="zt_overhead_")
    cpath = os.path.join(work, "corpus.bin")
    bench_peers.corpus(cpath)
    sz = bench_peers.SIZES["small"]
    spec = {"model": sz["model"], "micro": sz["micro"], "ranks": bench_peers.RANKS, "steps": a.steps,
            "seed": bench_peers.SEED, "optimizer": bench_peers.OPT, "scheduler": bench_peers.SCHED,
            "clip": bench_peers.CLIP, "corpus": cpath, "build": os.path.abspath(a.build),
            "zero_optimization": bench_peers.ZOPT}
    sp = os.path.join(work, "spec.json")
    with open(sp, "w") as f:
        json.dump(spec, f)
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[k] = "1"
    # peer_worker.py's job definitions (model, init, data, schedule) without its run()
    src = open(os.path.join(HERE, "peer_worker.py")).read()
    src = src[:src.rindex("\nrun()")]
    for stage in (int(s) for s in a.stages.split(",")):
        sys.argv = ["peer_worker.py", "zero_torch", str(stage), sp, work]
        g = {"__file__": os.path.join(HERE, "peer_worker.py"), "__name__": "peer_worker"}
        exec(compile(src, g["__file__"], "exec"), g)
        measure(g, stage, a.steps)


def measure(g, stage, steps):
    torch, zero, spec = g["torch"], g["zero"], g["spec"]
    import zero.torch as zt
    plain = g["init_model"]()
    opt = g["adamw"](plain.parameters())
    cfg = {"zero_optimization": dict(spec["zero_optimization"], stage=stage),
           "optimizer": {"type": "AdamW", "params": spec["optimizer"]}, "gradient_clipping": spec["clip"]}
    world = zero.Comm.world(backend="local")
    zm = zt.wrap(g["init_model"](), cfg, comm=world, wrap_policy={g["ref"].Block}, lr_schedule=g["lr_at"])
    t = {k: {"fwd": [], "bwd": [], "step": []} for k in ("torch", "zero.torch")}
    ct = time.process_time
    for s in range(steps):
        x, y = g["micro_batch"](s, 0)
        c0 = ct()
        _, loss = plain(x, y)
        c1 = ct()
        loss.backward()
        c2 = ct()
        torch.nn.utils.clip_grad_norm_(plain.parameters(), spec["clip"])
        g["set_lr"](opt, g["lr_at"](s))
        opt.step()
        opt.zero_grad(set_to_none=True)
        c3 = ct()
        for k, v in zip(("fwd", "bwd", "step"), (c1 - c0, c2 - c1, c3 - c2)):
            t["torch"][k].append(v)
        c0 = ct()
        _, zloss = zm(x, y)
        c1 = ct()
        zm.backward(zloss)
        c2 = ct()
        zm.step()
        c3 = ct()
        for k, v in zip(("fwd", "bwd", "step"), (c1 - c0, c2 - c1, c3 - c2)):
            t["zero.torch"][k].append(v)
        if abs(float(loss) - float(zloss)) > 1e-4 * abs(float(loss)):
            raise SystemExit(f"zero_torch_overhead: step {s}: losses {float(loss)} vs {float(zloss)}: not the same job")
    zm.close()
    world.close()

    def med(v):
        return statistics.median(v[5:]) * 1e3
    row = {}
    for k, d in t.items():
        fb = [a + b for a, b in zip(d["fwd"], d["bwd"])]
        tot = [a + b + c for a, b, c in zip(d["fwd"], d["bwd"], d["step"])]
        row[k] = {"fwd": med(d["fwd"]), "bwd": med(d["bwd"]), "step": med(d["step"]), "fwd+bwd": med(fb),
                  "total": med(tot)}
    zr, tr = row["zero.torch"], row["torch"]
    print(f"stage {stage}: median CPU ms per step (torch | zero.torch): forward {tr['fwd']:.1f} | {zr['fwd']:.1f}, "
          f"backward {tr['bwd']:.1f} | {zr['bwd']:.1f}, step {tr['step']:.1f} | {zr['step']:.1f}; "
          f"zero.torch / torch: forward+backward {zr['fwd+bwd'] / tr['fwd+bwd']:.3f}, "
          f"whole step {zr['total'] / tr['total']:.3f}", flush=True)


if __name__ == "__main__":
    main()
