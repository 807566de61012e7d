"""Checkpoints through zero-train: resume is bitwise, reshard works.

* same world size and stage: N steps straight == N/2 + resume + N/2, every
  later loss and grad norm bitwise, final master weights and moments bitwise
  (fp32, bf16 and fp16 with its dynamic loss scaler);
* stage 3 -> stage 0 at the same world size: bitwise too (the engine's stages
  are bitwise identical at one dp size);
* 2 ranks -> 1 rank (same global batch via accumulation): the first loss
  after the resume is bitwise the straight run's (the weights arrived intact
  and rank r's rows are micro-batch r at world 1); later steps within 1e-5
  relative (the gradient-norm sum runs in another order);
* an offline `zero-ckpt reshard` to 3 files resumes exactly like the original.
"""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from train_helpers import TINY, consolidated, corpus, metrics, run_ckpt, run_train  # noqa: E402


def args(tmp_path, extra=()):
    return TINY + ["--data", corpus(tmp_path), "--set", "train_batch_size=8", "--log-every", "100"] + list(extra)


def same_tensors(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k}: max abs diff {(a[k] - b[k]).abs().max().item():.3g}"


@pytest.mark.parametrize("ranks,stage,precision", [(2, 3, "fp32"), (1, 1, "fp32"), (2, 2, "bf16"),
                                                   (1, 0, "fp16")])
def test_resume_is_bitwise(tmp_path, ranks, stage, precision):
    extra = ["--stage", str(stage)]
    if precision != "fp32":
        extra += ["--set", f"{precision}.enabled=true"]
    if precision == "fp16":
        extra += ["--set", "fp16.initial_scale_power=8", "--set", "fp16.loss_scale_window=3"]
    a, b = tmp_path / "a", tmp_path / "b"
    run_train(args(tmp_path, extra) + ["--steps", "8", "--metrics", str(tmp_path / "straight.jsonl"),
                                       "--checkpoint-dir", str(a)], ranks=ranks)
    run_train(args(tmp_path, extra) + ["--steps", "4", "--metrics", str(tmp_path / "first.jsonl"),
                                       "--checkpoint-dir", str(b)], ranks=ranks)
    p = run_train(args(tmp_path, extra) + ["--steps", "8", "--metrics", str(tmp_path / "second.jsonl"),
                                           "--checkpoint-dir", str(b), "--resume", "auto"], ranks=ranks)
    assert "resumed from" in p.stdout and "step 4" in p.stdout
    straight, second = metrics(tmp_path / "straight.jsonl"), metrics(tmp_path / "second.jsonl")
    assert [r["step"] for r in second] == [5, 6, 7, 8]
    for s, r in zip(straight[4:], second):
        assert (s["loss_text"], s["grad_norm"], s["lr"], s["loss_scale"]) == \
               (r["loss_text"], r["grad_norm"], r["lr"], r["loss_scale"]), (s, r)
    same_tensors(consolidated(tmp_path, str(a), "a"), consolidated(tmp_path, str(b), "b"))
    # the moments too: every state element of both final checkpoints
    d = run_ckpt(["diff", str(a), str(b)])
    assert "identical" in d.stdout, d.stdout


def test_stage3_to_stage0_same_world_is_bitwise(tmp_path):
    run_train(args(tmp_path, ["--stage", "0"]) + ["--steps", "6", "--metrics", str(tmp_path / "s0.jsonl"),
                                                  "--checkpoint-dir", str(tmp_path / "s0")], ranks=2)
    run_train(args(tmp_path, ["--stage", "3"]) + ["--steps", "3", "--checkpoint-dir", str(tmp_path / "x")], ranks=2)
    run_train(args(tmp_path, ["--stage", "0"]) + ["--steps", "6", "--metrics", str(tmp_path / "x.jsonl"),
                                                  "--checkpoint-dir", str(tmp_path / "x"), "--resume", "auto"],
              ranks=2)
    ref, got = metrics(tmp_path / "s0.jsonl"), metrics(tmp_path / "x.jsonl")
    assert [r["loss_text"] for r in ref[3:]] == [r["loss_text"] for r in got]
    same_tensors(consolidated(tmp_path, str(tmp_path / "s0"), "s0"), consolidated(tmp_path, str(tmp_path / "x"), "x"))


def test_reshard_two_ranks_to_one(tmp_path):
    run_train(args(tmp_path, ["--stage", "3"]) + ["--steps", "6", "--metrics", str(tmp_path / "ref.jsonl"),
                                                  "--checkpoint-dir", str(tmp_path / "ref")], ranks=2)
    run_train(args(tmp_path, ["--stage", "3"]) + ["--steps", "3", "--checkpoint-dir", str(tmp_path / "x")], ranks=2)
    # one rank, stage 0: train_batch_size 8 = micro 4 x accumulation 2 x 1 rank
    p = run_train(args(tmp_path, ["--stage", "0"]) + ["--steps", "6", "--metrics", str(tmp_path / "x.jsonl"),
                                                      "--checkpoint-dir", str(tmp_path / "x"), "--resume", "auto"],
                  ranks=1)
    assert "saved by 2 ranks at stage 3" in p.stdout and "4 x 2 accumulation x 1 ranks" in p.stdout
    ref, got = metrics(tmp_path / "ref.jsonl"), metrics(tmp_path / "x.jsonl")
    assert got[0]["step"] == 4 and got[0]["loss_text"] == ref[3]["loss_text"]
    for r, g in zip(ref[3:], got):
        assert abs(r["loss"] - g["loss"]) <= 1e-5 * abs(r["loss"]), (r["loss"], g["loss"])
    a = consolidated(tmp_path, str(tmp_path / "ref"), "ref")
    b = consolidated(tmp_path, str(tmp_path / "x"), "x")
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-5), k


def test_offline_reshard_resumes_the_same(tmp_path):
    run_train(args(tmp_path, ["--stage", "3"]) + ["--steps", "3", "--checkpoint-dir", str(tmp_path / "x")], ranks=2)
    r3 = tmp_path / "r3"
    run_ckpt(["reshard", str(tmp_path / "x"), str(r3), "3"])
    assert sorted(os.listdir(r3)) == ["meta.json", "rank-00000.bin", "rank-00001.bin", "rank-00002.bin"]
    run_ckpt(["verify", str(r3)])
    same_tensors(consolidated(tmp_path, str(tmp_path / "x"), "x"), consolidated(tmp_path, str(r3), "r3"))
    for name, src in (("orig", str(tmp_path / "x")), ("r3", str(r3))):
        run_train(args(tmp_path, ["--stage", "2"]) + ["--steps", "5", "--metrics", str(tmp_path / f"{name}.jsonl"),
                                                      "--resume", src], ranks=2)
    assert [r["loss_text"] for r in metrics(tmp_path / "orig.jsonl")] == \
           [r["loss_text"] for r in metrics(tmp_path / "r3.jsonl")]


def test_sigterm_saves_a_checkpoint_and_resumes(tmp_path):
    """SIGTERM (what mpirun forwards and batch systems send before preemption)
    stops the run at the end of the step, saves, and exits with 128 + 15."""
    import signal
    import subprocess
    import time
    from train_helpers import exe
    ck, m = tmp_path / "ck", tmp_path / "m.jsonl"
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    p = subprocess.Popen([exe("zero-train"), "--plain"] + args(tmp_path) +
                         ["--steps", "100000", "--checkpoint-dir", str(ck), "--metrics", str(m)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 60
    while time.time() < deadline and (not m.exists() or m.stat().st_size == 0):
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM, (p.returncode, out, err)
    last = metrics(m)[-1]["step"]
    assert f"stopping after step {last} on signal 15" in out
    assert (ck / "latest").read_text().strip() == f"step-{last:08d}"
    run_ckpt(["verify", str(ck)])
    r = run_train(args(tmp_path) + ["--steps", str(last + 2), "--checkpoint-dir", str(ck), "--resume", "auto"])
    assert f"step {last}" in r.stdout and "2 this run" in r.stdout
