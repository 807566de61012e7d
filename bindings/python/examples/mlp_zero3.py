#!/usr/bin/python3
"""A two-layer numpy MLP trained with libzero's ZeRO stage 3, data parallel.

    tests/mpirun.sh 2 /usr/bin/python3 bindings/python/examples/mlp_zero3.py --steps 40
    (PYTHONPATH=build/bindings/python, or the package installed with pip)

Every rank holds a different slice of a teacher-student regression data set
and only its shard of the parameters, gradients and AdamW state. Forward
and backward run module by module: gather the module (an all-gather of its
shards), compute in numpy, accumulate the gradient into the engine's
buffer, grads_ready (a reduce-scatter into the owners' shards), release.
Rank 0 prints the loss averaged over the ranks after every step. With
ZERO_RESULT_DIR set (by the test), every rank writes rank-<r>.json there.
"""
import argparse
import hashlib
import json
import os
import sys

import numpy as np

import zero


def make_data(rank, n, d_in, d_out):
    """A fixed teacher network; each rank draws its own inputs."""
    teacher = np.random.default_rng(1234)
    wt = teacher.standard_normal((d_in, 16)).astype(np.float32) / np.sqrt(d_in)
    vt = teacher.standard_normal((16, d_out)).astype(np.float32) / 4.0
    x = np.random.default_rng(100 + rank).standard_normal((n, d_in)).astype(np.float32)
    return x, np.tanh(x @ wt) @ vt


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--stage", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--batch", type=int, default=64, help="samples per rank")
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    d_in, d_out, hidden = 8, 4, args.hidden

    with zero.Comm.world() as world:
        rank = world.rank
        config = {
            "zero_optimization": {
                "stage": args.stage,
                "reduce_bucket_size": 96,                 # several buckets per module
                "stage3_param_persistence_threshold": 8,  # the fc2 bias stays whole
                "overlap_comm": True,                     # async reduce-scatter + prefetch
            },
            "optimizer": {"type": "AdamW", "params": {"lr": args.lr, "weight_decay": 0.0}},
            "gradient_clipping": 1.0,
        }
        # Initial values described, not given: each rank computes only the part it
        # keeps (its shard at stage 3) from (seed, name, index); nothing is broadcast.
        with zero.Engine(world, config) as eng:
            fc1 = eng.add_module("fc1", {
                "weight": ((d_in, hidden), zero.init.normal(std=1 / np.sqrt(d_in), seed=7)),
                "bias": (hidden,)})
            fc2 = eng.add_module("fc2", {
                "weight": ((hidden, d_out), zero.init.normal(std=1 / np.sqrt(hidden), seed=7)),
                "bias": (d_out,)})
            eng.finalize()
            x, t = make_data(rank, args.batch, d_in, d_out)

            losses = []
            for step in range(args.steps):
                # forward, module by module
                with eng.gathered(fc1) as p:
                    a1 = np.tanh(x @ p["weight"] + p["bias"])
                with eng.gathered(fc2) as p:
                    y = a1 @ p["weight"] + p["bias"]
                loss = float(np.mean((y - t) ** 2))

                # backward in reverse: gradients of this rank's MEAN loss
                dy = (2.0 / y.size) * (y - t)
                with eng.gathered(fc2) as p, eng.grads(fc2) as g:
                    g["weight"] += a1.T @ dy
                    g["bias"] += dy.sum(axis=0)
                    da1 = dy @ p["weight"].T
                dh1 = da1 * (1.0 - a1 * a1)
                with eng.grads(fc1) as g:      # fc1's params are not needed here
                    g["weight"] += x.T @ dh1
                    g["bias"] += dh1.sum(axis=0)

                result = eng.step()
                mean_loss = float(world.allreduce(np.array([loss], dtype=np.float64))[0]) / world.size
                losses.append(mean_loss)
                if rank == 0 and not args.quiet:
                    print(f"step {result.step:3d}  loss {mean_loss:.6f}  grad_norm {result.grad_norm:.4f}",
                          flush=True)

            # every rank assembles the full weights: they must agree bitwise
            digest = hashlib.sha256()
            for prm in eng.params:
                digest.update(eng.read_param(prm).tobytes())
            report = eng.memory_report()
            out = {"rank": rank, "size": world.size, "losses": losses, "params_sha256": digest.hexdigest(),
                   "memory": report, "stats": eng.stats(), "plan": {k: v for k, v in eng.plan_info().items() if k != "hash"}}
            if os.environ.get("ZERO_RESULT_DIR"):  # the test's channel (stdout lines may interleave)
                with open(os.path.join(os.environ["ZERO_RESULT_DIR"], f"rank-{rank}.json"), "w") as f:
                    json.dump(out, f)
            elif rank == 0:
                print(f"final loss {losses[-1]:.6f} (first {losses[0]:.6f}); params sha256 "
                      f"{out['params_sha256'][:16]}...; memory on this rank {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
