"""Run by test_bindings_mpi.py on real ranks (tests/mpirun.sh N python3 mpi_worker.py CKPT_DIR).

Each rank writes $ZERO_RESULT_DIR/rank-<r>.json; the test compares the ranks' results.
Checks that need every rank (collectives, counters, split, grid, the four
stages, mismatch and timeout errors, checkpoint save) run here; assertions
about one rank's own values are made here too, so a failure names the rank.
"""
import hashlib
import json
import os
import sys
import time

import numpy as np

import zero

CKPT = sys.argv[1]
out = {}


def sha(arrays):
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def build(world, stage, **kw):
    eng = zero.Engine(world, {"zero_optimization": {"stage": stage, "reduce_bucket_size": 40,
                                                    "stage3_param_persistence_threshold": 10,
                                                    "overlap_comm": kw.pop("overlap", False)},
                              "optimizer": {"type": "AdamW", "params": {"lr": 0.05}},
                              "gradient_clipping": 2.0}, **kw)
    rng = np.random.default_rng(11)
    a = eng.add_module("a", {"w": rng.standard_normal((9, 7)).astype(np.float32), "b": (7,)})
    b = eng.add_module("b", {"w": rng.standard_normal((7, 5)).astype(np.float32), "b": (5,)})
    eng.finalize()
    return eng, [a, b]


def train(eng, mods, rank, steps):
    rng = np.random.default_rng(1000 + rank)  # every rank its own gradients
    for _ in range(steps):
        for m in mods:
            with eng.gathered(m) as P:
                float(P["w"].sum())
        for m in reversed(mods):
            with eng.gathered(m), eng.grads(m) as G:
                for k in G:
                    G[k] += rng.standard_normal(G[k].shape).astype(np.float32)
        r = eng.step()
    return r


with zero.Comm.world() as world:
    rank, n = world.rank, world.size
    out.update(rank=rank, size=n, backend=world.backend)

    # ------------------------------------------------------------ collectives and counters
    x = np.arange(6, dtype=np.float32) + rank
    world.reset_counters()
    s = world.allreduce(x)
    out["allreduce"] = s.tolist()
    out["allgather"] = world.allgather(np.array([rank], np.int32)).tolist()
    out["reduce_scatter"] = world.reduce_scatter(np.ones(2 * n, np.float64) * (rank + 1)).tolist()
    bc = np.full(3, rank, np.int64)
    out["broadcast"] = world.broadcast(bc, root=n - 1).tolist()
    out["counters"] = world.counters()

    with world.split(color=rank % 2, key=-rank) as sub:
        out["split"] = [sub.rank, sub.size, sub.name]
    with world.grid(tp=n, pp=1) as g:
        out["grid"] = [g.tp_size, g.dp_size, g.pp_size, g.tp_rank, g.tp.size, g.dp.size]

    # ------------------------------------------------------------ stages 0-3: bitwise-identical params
    digests = {}
    for stage in range(4):
        eng, mods = build(world, stage, overlap=stage == 3)
        r = train(eng, mods, rank, 3)
        digests[stage] = sha(eng.read_param(p) for p in eng.params)
        if stage == 3:
            out["cache3"] = eng.memory_report()["cache"]  # module buffers kept for the next step
            eng.empty_cache()
            rep = eng.memory_report()
            plan = eng.plan_info()
            out["memory3"] = rep
            out["plan3"] = {k: v for k, v in plan.items() if k != "hash"}
            out["persistent3"] = {p.name: [eng.param_info(p)["persistent"], eng.param_info(p)["bucket"],
                                           p.numel] for p in eng.params}
            out["step3"] = [r.step, r.grad_norm, r.clip_coef]
            # save for the single-rank resharding load in the test
            eng.save_checkpoint(CKPT, user={"saved_by": n}, durable=False)
            out["ckpt_params"] = {p.name: eng.read_param(p).ravel().tolist() for p in eng.params}
        eng.close()
    out["digests"] = digests

    # ------------------------------------------------------------ a different registration: MISMATCH
    eng = zero.Engine(world, stage=1)
    m = eng.add_module("m")
    eng.add_param(m, "w", shape=(4, 4 + rank))
    try:
        eng.finalize()
        out["mismatch"] = None
    except zero.ZeroMismatchError as e:
        out["mismatch"] = str(e)
    eng.close()

    # ------------------------------------------------------------ a different init on one rank: MISMATCH
    # (spec inits: each rank computes only its own shard; the values are the same on every rank)
    eng = zero.Engine(world, stage=3)
    m = eng.add_module("m", {"a": ((3, 5), zero.init.normal(0.02, seed=1)),
                             "b": ((7,), zero.init.uniform(-1, 1, seed=1 + rank))})
    try:
        eng.finalize()
        out["init_mismatch"] = None
    except zero.ZeroMismatchError as e:
        out["init_mismatch"] = str(e)
    eng.close()
    calls = []
    eng = zero.Engine(world, stage=3, stage3_param_persistence_threshold=0)
    m = eng.add_module("m", {"a": ((3, 5), zero.init.normal(0.02, seed=1)),
                             "c": ((11,), zero.init.callback(lambda n, b, e: calls.append((b, e)) or
                                                             np.arange(b, e) * 0.25))})
    eng.finalize()
    out["init_a"] = eng.read_param(m.params["a"]).ravel().tolist()
    out["init_c"] = eng.read_param(m.params["c"]).ravel().tolist()
    info = eng.param_info(m.params["c"])
    out["init_c_calls"] = calls
    out["init_c_owned"] = [info["owned_begin"], info["owned_end"]]
    eng.close()

    # ------------------------------------------------------------ a late peer: TIMEOUT
    with world.split(color=0, key=rank) as tcomm:
        tcomm.timeout = 0.5
        if rank == 0:
            t0 = time.monotonic()
            try:
                tcomm.barrier()
                out["timeout"] = None
            except zero.ZeroTimeoutError as e:
                out["timeout"] = [str(e), isinstance(e, TimeoutError), time.monotonic() - t0]
        else:
            time.sleep(2.5)  # arrive well after rank 0 gave up (0.5 s): its abandoned barrier completes ours
            tcomm.timeout = 30.0
            tcomm.barrier()
            out["timeout"] = "late peer completed"
    world.barrier()

# MPI stays initialised after the world comm above is closed (the bindings keep
# the first MPI world until exit), so a new world works.
with zero.Comm.world() as again:
    out["world_again"] = [again.size, int(again.allreduce(np.array([rank + 1], np.int64))[0])]

with open(os.path.join(os.environ["ZERO_RESULT_DIR"], f"rank-{rank}.json"), "w") as f:
    json.dump(out, f)
