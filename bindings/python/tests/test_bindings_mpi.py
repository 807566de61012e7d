"""`import zero` on two real ranks (tests/mpirun.sh 2 python3 ...): the ranks'
outputs are compared here."""
import os

import numpy as np
import pytest

from zero_testlib import REPO, run_ranks

HERE = os.path.dirname(os.path.abspath(__file__))
N = 2


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("ckpt") / "run"
    res = run_ranks(N, os.path.join(HERE, "mpi_worker.py"), ckpt)
    return res, ckpt


def test_collectives_and_counters(ranks):
    res, _ = ranks
    for r, out in res.items():
        assert out["size"] == N and out["backend"] == "mpi"
        assert out["allreduce"] == [float(2 * i + 1) for i in range(6)]   # (i) + (i + 1)
        assert out["allgather"] == [0, 1]
        assert out["reduce_scatter"] == [3.0, 3.0]                        # 1 + 2 per element
        assert out["broadcast"] == [N - 1] * 3
        c = out["counters"]
        # ring volumes (comm.h): all-reduce 2S(n-1)/n, S = 24 bytes; reduce-scatter S(n-1)/n, S = 32;
        # all-gather S(n-1)/n, S = 8; broadcast: root sends S, the others receive S (S = 24)
        assert (c["allreduce"]["sent"], c["allreduce"]["recv"]) == (24, 24)
        assert (c["reduce_scatter"]["sent"], c["reduce_scatter"]["recv"]) == (16, 16)
        assert (c["allgather"]["sent"], c["allgather"]["recv"]) == (4, 4)
        assert (c["broadcast"]["sent"], c["broadcast"]["recv"]) == ((24, 0) if r == N - 1 else (0, 24))
        assert out["split"] == [0, 1, f"world/split({r % 2})"]
        assert out["grid"] == [N, 1, 1, r, N, 1]
        assert out["world_again"] == [N, N * (N + 1) // 2]


def test_stages_give_bitwise_identical_params_on_every_rank(ranks):
    res, _ = ranks
    digests = {d for out in res.values() for d in out["digests"].values()}
    assert len(digests) == 1, {r: out["digests"] for r, out in res.items()}
    assert res[0]["step3"] == res[1]["step3"] and res[0]["step3"][0] == 3


def test_memory_report_equals_the_c_formula_at_two_ranks(zero_mod, ranks):
    res, _ = ranks
    for out in res.values():
        plan, rep = out["plan3"], out["memory3"]
        P, B = plan["padded_numel"], plan["max_bucket_numel"]
        est = zero_mod.memory_estimate(P, N, 3, "f32", "adamw")
        persistent = {}
        for flag, bucket, numel in out["persistent3"].values():
            if flag:
                persistent[bucket] = persistent.get(bucket, 0) + numel
        want = {"params": est["params"] + sum(-(-n // N) * N for n in persistent.values()) * 4,
                "grads": est["grads"],              # + P*(4-d)/N = 0 for f32
                "master": est["master"], "moments": est["moments"],
                "buffers": 2 * (B * 4 + B * 4 // N),  # overlap_comm: two slots
                "other": 0, "cache": 0}  # read after empty_cache()
        want["total"] = sum(want.values())
        assert {k: rep[k] for k in want} == want
        assert out["cache3"] > 0, "stage 3 keeps its released gathers and module gradients for the next step"


def test_mismatch_and_timeout_errors_carry_the_message(ranks):
    res, _ = ranks
    for r, out in res.items():
        assert "ranks registered different parameters" in out["mismatch"]
        assert f"shape 4x{4 + r}" in out["mismatch"] and "'w' of module 'm'" in out["mismatch"]
    msg, is_timeout_error, waited = res[0]["timeout"]
    assert is_timeout_error and "barrier" in msg and "timed out after 0.5 s" in msg and "world/split(0)" in msg
    assert 0.4 < waited < 5.0
    assert res[1]["timeout"] == "late peer completed"


def test_spec_init_is_checked_across_ranks_and_sharded(zero_mod, ranks):
    """A different uniform seed on rank 1 is named at finalize; a spec init sharded over two
    ranks (stage 3, each computing its half) reads back the values zero.init.generate gives."""
    res, _ = ranks
    for r, out in res.items():
        msg = out["init_mismatch"]
        assert msg and "ranks were given different initial values" in msg, msg
        assert "param #1 'm.b'" in msg and "rank(s) 1 differ from rank 0" in msg
        assert f"seed {1 + r}" in msg
        want = zero_mod.init.generate(zero_mod.init.normal(0.02, seed=1), "m.a", 0, 15)
        assert np.array_equal(np.array(out["init_a"], np.float32), want)
        # a Python callback at stage 3: each owned element once, plus the 5 probes floor(k*10/4)
        assert out["init_c"] == [i * 0.25 for i in range(11)]
        lo, hi = out["init_c_owned"]
        counts = [0] * 11
        for b, e in out["init_c_calls"]:
            for i in range(b, e):
                counts[i] += 1
        assert counts == [int(lo <= i < hi) + [0, 2, 5, 7, 10].count(i) for i in range(11)], (counts, lo, hi)


def test_checkpoint_of_two_ranks_loads_into_one(zero_mod, ranks):
    """Resharding from Python: the stage-3, 2-rank checkpoint into a 1-rank stage-0 engine."""
    res, ckpt = ranks
    with zero_mod.Comm.world(backend="local") as world:
        eng = zero_mod.Engine(world, stage=0)
        rng = np.random.default_rng(5)  # other initial values: the load must overwrite them
        eng.add_module("a", {"w": rng.standard_normal((9, 7)).astype(np.float32), "b": (7,)})
        eng.add_module("b", {"w": rng.standard_normal((7, 5)).astype(np.float32), "b": (5,)})
        eng.finalize()
        info = eng.load_checkpoint(ckpt)
        assert (info.step, info.world_size, info.stage, info.user) == (3, N, 3, {"saved_by": N})
        for p in eng.params:
            want = np.array(res[0]["ckpt_params"][p.name], np.float32).reshape(p.shape)
            assert np.array_equal(eng.read_param(p), want), p.name
            assert np.array_equal(eng.param_data(p), want), p.name
        eng.close()


def test_mlp_example_trains_with_zero3_on_two_ranks():
    res = run_ranks(N, os.path.join(REPO, "bindings", "python", "examples", "mlp_zero3.py"), "--steps", "30",
                    "--quiet")
    losses = res[0]["losses"]
    assert res[1]["losses"] == losses                    # the loss is averaged over the ranks
    assert len(losses) == 30 and all(np.isfinite(losses))
    assert losses[-1] < 0.25 * losses[0], losses           # measured: 0.71 -> 0.045 in 30 steps
    assert sum(b < a for a, b in zip(losses, losses[1:])) >= 25, losses
    assert res[0]["params_sha256"] == res[1]["params_sha256"]
    assert res[0]["plan"]["stage"] == 3 and res[0]["plan"]["dp_size"] == N
    assert res[0]["plan"]["shard_numel"] * N == res[0]["plan"]["padded_numel"]
    st = res[0]["stats"]
    # overlap_comm: after the first step the prefetcher replays the gather order
    assert st["steps"] == 30 and st["prefetch_hits"] > 0 and st["order_changes"] == 0, st
