"""zero-train's pipeline schedules (model.pp_schedule, docs/pipeline.md) and --trace: at
pp 2 x dp 2 every schedule zero-train runs trains bitwise like 1F1B (the same loss text
every step: each tensor accumulates its micro-batches in the same order), --trace writes
Chrome trace-event JSON with one track per rank and forward, backward, weight-grad and
optimizer spans, and bad schedules are rejected naming the key."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from train_helpers import TINY, corpus, metrics, run_train  # noqa: E402

GRID = TINY + ["--steps", "3", "--log-every", "1", "--set", "model.pp=2", "--grad-accum", "4", "--stage", "1"]


def run(tmp_path, name, extra):
    m = tmp_path / f"{name}.jsonl"
    p = run_train(GRID + ["--data", corpus(tmp_path), "--metrics", str(m)] + extra, ranks=4)
    return metrics(m), p


def test_schedules_train_bitwise_like_1f1b_and_trace(tmp_path):
    ref, _ = run(tmp_path, "1f1b", [])
    for sched in ("gpipe", "zb-h1", "zb-h2"):
        trace = tmp_path / f"{sched}.json"
        got, _ = run(tmp_path, sched, ["--set", f"model.pp_schedule={sched}", "--trace", str(trace)])
        assert [r["loss_text"] for r in got] == [r["loss_text"] for r in ref], sched
        doc = json.loads(trace.read_text())
        ev = doc["traceEvents"]
        tracks = {e["args"]["name"] for e in ev if e.get("name") == "process_name"}
        assert tracks == {"rank 0 (pp stage 0)", "rank 1 (pp stage 0)", "rank 2 (pp stage 1)",
                          "rank 3 (pp stage 1)"}, tracks
        cats = {e.get("cat") for e in ev if e.get("ph") == "X"}
        assert {"forward", "backward", "optimizer"} <= cats, cats
        if sched != "gpipe":
            assert "weight-grad" in cats  # B and W apart
        # 3 steps x 4 micro-batches forward on each of the 4 ranks
        assert sum(1 for e in ev if e.get("cat") == "forward") == 3 * 4 * 4


def test_zb_h2_at_pp4_trains_bitwise_like_1f1b(tmp_path):
    """ZB-H2 with its whole structure (M = 8 >= 2p - 1 at pp 4: 2(p-s-1)+1 warm-up forwards, W's
    deferred 2s, the transfers placed by the unit-time schedule) through zero-train at pp 4 x dp 1:
    loss text and gradient norm every step equal to 1F1B's (bitwise: each tensor accumulates its
    micro-batches in the same order; well inside the tp/pp tests' 1e-5)."""
    grid = TINY + ["--set", "model.n_layer=4", "--set", "model.pp=4", "--steps", "2", "--log-every", "1",
                   "--grad-accum", "8", "--stage", "1", "--data", corpus(tmp_path)]
    got = {}
    for sched in ("1f1b", "zb-h2"):
        m = tmp_path / f"pp4_{sched}.jsonl"
        p = run_train(grid + ["--set", f"model.pp_schedule={sched}", "--metrics", str(m)], ranks=4)
        assert f"pp 4 x dp 1 (Megatron-core order: tp fastest, then cp, dp, pp), {sched} (1 chunks per stage) " \
            "over 8 micro-batches" in p.stdout, p.stdout
        got[sched] = metrics(m)
    assert [r["step"] for r in got["zb-h2"]] == [1, 2]
    assert [(r["loss_text"], r["grad_norm"]) for r in got["zb-h2"]] == \
        [(r["loss_text"], r["grad_norm"]) for r in got["1f1b"]]


def test_interleaved_trains_like_one_rank(tmp_path):
    """model.pp_schedule interleaved, model.pp_virtual 2 at pp 2 x dp 2 (4 blocks: stage 0 holds
    blocks 0 and 2, stage 1 blocks 1 and 3, each chunk its own workspace, the engine the stage's
    blocks of both chunks) against the single-rank model on the same 32 sequences per step, with
    clipping engaged: loss and gradient norm within the tp/pp tests' 1e-5 relative
    (test_train_parallel.py; only the norm's summation order over the ranks' shares differs)."""
    layers = ["--set", "model.n_layer=4", "--set", "gradient_clipping=0.5"]
    got, p = run(tmp_path, "il", layers + ["--set", "model.pp_schedule=interleaved", "--set", "model.pp_virtual=2"])
    assert "interleaved (2 chunks per stage)" in p.stdout, p.stdout
    m = tmp_path / "one.jsonl"
    run_train(TINY + layers + ["--steps", "3", "--log-every", "1", "--grad-accum", "8", "--stage", "1",
                               "--data", corpus(tmp_path), "--metrics", str(m)])
    ref = metrics(m)
    assert [r["step"] for r in got] == [r["step"] for r in ref] == [1, 2, 3]
    for a, b in zip(got, ref):
        assert abs(a["loss"] - b["loss"]) <= 1e-5 * abs(b["loss"]), (a["step"], a["loss"], b["loss"])
        assert abs(a["grad_norm"] - b["grad_norm"]) <= 1e-5 * b["grad_norm"], (a["step"], a["grad_norm"],
                                                                                b["grad_norm"])
        assert b["grad_norm"] > 0.5  # clipping engaged: a norm missing a chunk's share would show


def test_interleaved_refuses_a_1f1b_checkpoint(tmp_path):
    """A stage's checkpoint holds its blocks: stage 0 of 1F1B has blocks 0-1, of interleaved v 2
    blocks 0 and 2, so resuming across them is refused naming the first differing tensor."""
    grid = GRID + ["--data", corpus(tmp_path), "--set", "model.n_layer=4"]
    ck = str(tmp_path / "ck")
    run_train(grid + ["--steps", "1", "--checkpoint-dir", ck], ranks=4)
    p = run_train(grid + ["--steps", "2", "--resume", ck, "--set", "model.pp_schedule=interleaved",
                          "--set", "model.pp_virtual=2"], ranks=4, check=False)
    assert p.returncode != 0 and "holds another model" in p.stderr and "h.2." in p.stderr, p.stderr


@pytest.mark.parametrize("extra,needle", [
    (["--set", "model.pp_schedule=zb"], "model.pp_schedule: pipeline schedule 'zb' is not one of"),
    (["--set", "model.pp_virtual=2"], "model.pp_virtual 2: only model.pp_schedule \"interleaved\""),
    (["--set", "model.pp_schedule=interleaved"], "needs model.pp_virtual >= 2"),
    (["--set", "model.pp_schedule=interleaved", "--set", "model.pp_virtual=2"],
     "2 stages x 2 chunks = 4 virtual stages for 2 blocks"),
])
def test_bad_schedule_is_rejected(tmp_path, extra, needle):
    p = run_train(GRID + ["--data", corpus(tmp_path)] + extra, ranks=4, check=False)
    assert p.returncode != 0 and needle in p.stderr, p.stderr


def test_trace_needs_the_pipeline_runtime(tmp_path):
    p = run_train(TINY + ["--steps", "1", "--data", corpus(tmp_path), "--trace", str(tmp_path / "t.json")],
                  check=False)
    assert p.returncode != 0 and "--trace records the pipeline runtime's timeline" in p.stderr, p.stderr
