"""zero-train with tensor / pipeline parallelism (model.tp, model.pp): 4 ranks on the grid
train like 1 rank on the same samples, with gradient clipping engaged (the engine's norm
spans dp x tp x pp), resume from per-position checkpoints continues bitwise, and bad grids
are rejected naming the key."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from train_helpers import TINY, corpus, metrics, run_train  # noqa: E402

# 10 steps: step 12 of this run is a gradient spike (norm 2.3 after 0.6) where the last bits of
# summation order grow to 1e-3 relative for tp/pp alike; up to there they stay below 1e-7
STEPS = 10
# clipping at 0.5 is engaged on every step of this run (norms 1-4), so a norm that missed
# a tp/pp rank's share would change the update and the loss curve
COMMON = TINY + ["--steps", str(STEPS), "--log-every", "4", "--set", "gradient_clipping=0.5"]


def run(tmp_path, name, extra, ranks):
    m = tmp_path / f"{name}.jsonl"
    p = run_train(COMMON + ["--data", corpus(tmp_path), "--metrics", str(m)] + extra, ranks=ranks)
    return metrics(m), p


# cp: Ulysses context parallelism, the engine over dp x cp; sp: Megatron sequence parallelism over tp
# (n_head 4 where tp x cp = 4 heads are needed, in both runs)
@pytest.mark.parametrize("tp,pp,cp,sp,stage", [(2, 1, 1, 0, 3), (1, 2, 1, 0, 1), (2, 2, 1, 0, 2), (2, 1, 1, 1, 3),
                                               (1, 1, 2, 0, 2), (2, 1, 2, 1, 1)])
def test_parallel_matches_one_rank(tmp_path, tp, pp, cp, sp, stage):
    dp = 4 // (tp * pp * cp)
    accum = 4 // dp  # 16 sequences per step: micro 4 x accum x dp
    heads = ["--set", "model.n_head=4"] if tp * cp == 4 else []
    grid = ["--set", f"model.tp={tp}", "--set", f"model.pp={pp}", "--set", f"model.cp={cp}",
            "--set", f"model.sequence_parallel={'true' if sp else 'false'}"]
    par, p = run(tmp_path, "par", ["--steps", str(STEPS), "--stage", str(stage), "--grad-accum", str(accum)] + grid + heads,
                 ranks=4)
    ref, _ = run(tmp_path, "ref", ["--steps", str(STEPS), "--stage", str(stage), "--grad-accum", "4"] + heads, ranks=1)
    assert f"tp {tp} x cp {cp} x pp {pp} x dp {dp}" in p.stdout
    assert ("sequence parallel over tp" in p.stdout) == bool(sp)
    assert [r["step"] for r in par] == list(range(1, STEPS + 1))
    for a, b in zip(par, ref):
        # the same samples each step; only the summation order of tp partial sums and the
        # tied-wte gradient differ (measured: at most 7e-8 relative over these 10 steps)
        assert abs(a["loss"] - b["loss"]) <= 1e-5 * abs(b["loss"]), (a["step"], a["loss"], b["loss"])
        assert abs(a["grad_norm"] - b["grad_norm"]) <= 1e-5 * b["grad_norm"], (a["step"], a["grad_norm"],
                                                                                b["grad_norm"])
        assert b["grad_norm"] > 0.5  # clipping engaged
    first = sum(r["loss"] for r in par[:3]) / 3
    last = sum(r["loss"] for r in par[-3:]) / 3
    assert last < first - 0.3, (first, last)


@pytest.mark.parametrize("tp,pp,stage,sched", [(2, 2, 2, "1f1b"), (1, 2, 1, "zb-h1")])
def test_parallel_bf16_matches_one_rank_bf16(tmp_path, tp, pp, stage, sched):
    """bf16.enabled on the grid: the engine holds bf16 parameters and gradients, the pipeline computes
    on fp32 copies with bf16 matmul products (the single-rank CPU model's rule). Not bitwise: the
    grid rounds the step's accumulated fp32 gradients to bf16 once, the single-rank model after
    each micro-step, and tp/pp sum in another order. Tolerance within bf16's precision (epsilon
    2^-8 = 3.9e-3): loss 1e-3 and gradient norm 1e-2 relative per step; measured over 10 steps
    at most 7.2e-5 and 1.4e-3 (the bf16 run itself is 6.8e-4 away from fp32 in loss)."""
    dp = 4 // (tp * pp)
    bf16 = ["--set", "bf16.enabled=true"]
    par, p = run(tmp_path, "par", bf16 + ["--set", f"model.tp={tp}", "--set", f"model.pp={pp}", "--stage",
                                          str(stage), "--grad-accum", str(4 // dp), "--set",
                                          f"model.pp_schedule={sched}"], ranks=4)
    ref, _ = run(tmp_path, "ref", bf16 + ["--stage", str(stage), "--grad-accum", "4"], ranks=1)
    f32, _ = run(tmp_path, "f32", ["--set", f"model.tp={tp}", "--set", f"model.pp={pp}", "--stage", str(stage),
                                   "--grad-accum", str(4 // dp), "--set", f"model.pp_schedule={sched}"], ranks=4)
    # bf16 matmuls where a bf16 kernel runs, else the stated fp32 fallback
    assert "cpu gemm: " in p.stdout and ("(bf16 matmuls)" in p.stdout or "(fp32 matmuls: no bf16 GEMM kernel" in
                                          p.stdout), p.stdout
    assert "f32 compute" not in p.stdout and "bf16 compute" in p.stdout, p.stdout
    assert len(par) == len(ref) == STEPS
    for a, b in zip(par, ref):
        assert abs(a["loss"] - b["loss"]) <= 1e-3 * abs(b["loss"]), (a["step"], a["loss"], b["loss"])
        assert abs(a["grad_norm"] - b["grad_norm"]) <= 1e-2 * b["grad_norm"], (a["step"], a["grad_norm"],
                                                                                b["grad_norm"])
    # the bf16 path really ran: its losses are not the fp32 grid's
    assert [r["loss_text"] for r in par] != [r["loss_text"] for r in f32]


@pytest.mark.parametrize("tp,cp,sp,stage", [(2, 1, 1, 3), (1, 2, 0, 2), (2, 2, 1, 1)])
def test_sp_cp_bf16_matches_one_rank_bf16(tmp_path, tp, cp, sp, stage):
    """bf16.enabled with Megatron sequence parallelism and / or Ulysses context parallelism (4 ranks).
    The reference is the single-rank bf16 model on the same 16 sequences a step: the same bf16
    parameters, bf16 matmul products and fp32 everything else; SP and cp change only which rank
    computes which rows and the order of the row sums of the weight gradients (and the grid rounds
    the step's accumulated gradient to bf16 once, the single rank after each micro-step). So the
    tolerance is that of the tp/pp bf16 test above, within bf16's epsilon 2^-8 = 3.9e-3: loss 1e-3
    and gradient norm 1e-2 relative per step (measured over 10 steps: at most 4.1e-5 and 4.0e-4),
    and the fp32 run of the same grid within bf16's epsilon in loss (measured at most 1.9e-4). The
    bf16 path really ran: its losses are not the same grid's fp32 ones."""
    dp = 4 // (tp * cp)
    bf16 = ["--set", "bf16.enabled=true"]
    heads = ["--set", "model.n_head=4"] if tp * cp == 4 else []
    grid = ["--set", f"model.tp={tp}", "--set", f"model.cp={cp}",
            "--set", f"model.sequence_parallel={'true' if sp else 'false'}", "--stage", str(stage),
            "--grad-accum", str(4 // dp)] + heads
    par, p = run(tmp_path, "par", bf16 + grid, ranks=4)
    ref, _ = run(tmp_path, "ref", bf16 + heads + ["--stage", str(stage), "--grad-accum", "4"], ranks=1)
    f32, _ = run(tmp_path, "f32", grid, ranks=4)
    assert "bf16 compute" in p.stdout and ("sequence parallel over tp" in p.stdout) == bool(sp), p.stdout
    assert len(par) == len(ref) == STEPS
    worst = [0.0, 0.0]
    for a, b in zip(par, ref):
        dl, dg = abs(a["loss"] - b["loss"]) / abs(b["loss"]), abs(a["grad_norm"] - b["grad_norm"]) / b["grad_norm"]
        worst = [max(worst[0], dl), max(worst[1], dg)]
        assert dl <= 1e-3 and dg <= 1e-2, (a["step"], a["loss"], b["loss"], a["grad_norm"], b["grad_norm"])
    # and from the fp32 run of the same grid by no more than bf16's epsilon (the products' rounding)
    f32_gap = max(abs(a["loss"] - f["loss"]) / f["loss"] for a, f in zip(par, f32))
    print(f"tp {tp} cp {cp} sp {sp}: worst loss {worst[0]:.2e}, grad norm {worst[1]:.2e} relative; "
          f"fp32 gap {f32_gap:.2e}")
    assert f32_gap <= 2 ** -8, f32_gap
    assert [r["loss_text"] for r in par] != [r["loss_text"] for r in f32]
    first, last = sum(r["loss"] for r in par[:3]) / 3, sum(r["loss"] for r in par[-3:]) / 3
    assert last < first - 0.3, (first, last)


@pytest.mark.parametrize("stage,sched", [(1, "1f1b"), (3, "gpipe")])
def test_moe_pp2_ep2_matches_one_rank(tmp_path, stage, sched):
    """model.moe with model.pp (issue 14): pp 2 x ep 2 on 4 ranks - the ep group nested in each
    stage's dp group, ep fastest (DeepSpeed-MoE's order), the engine over the ranks holding the same
    experts - trains like one rank holding every expert (model.moe.ep 1) on the same 16 sequences a
    step, clipping engaged: loss and grad norm within 1e-5 relative per step (the tp/pp tolerance;
    only summation orders differ: each expert's weight gradient sums both ep ranks' rows in one
    matmul, the dense ones are summed over ep)."""
    moe = ["--set", "model.n_layer=4"]
    par, p = run(tmp_path, "par", moe + ["--set", 'model.moe={"experts": 4, "top_k": 2, "ep": 2}', "--set",
                                         "model.pp=2", "--set", f"model.pp_schedule={sched}", "--stage", str(stage),
                                         "--grad-accum", "2"], ranks=4)
    ref, _ = run(tmp_path, "ref", moe + ["--set", 'model.moe={"experts": 4, "top_k": 2, "ep": 1}', "--stage",
                                         str(stage), "--grad-accum", "4"], ranks=1)
    assert "tp 1 x cp 1 x pp 2 x dp 2" in p.stdout and "expert parallel 2 x expert-data-parallel 1" in p.stdout, \
        p.stdout
    assert len(par) == len(ref) == STEPS
    worst = [0.0, 0.0]
    for a, b in zip(par, ref):
        dl, dg = abs(a["loss"] - b["loss"]) / b["loss"], abs(a["grad_norm"] - b["grad_norm"]) / b["grad_norm"]
        worst = [max(worst[0], dl), max(worst[1], dg)]
        assert dl <= 1e-5 and dg <= 1e-5, (a["step"], a["loss"], b["loss"], a["grad_norm"], b["grad_norm"])
        assert b["grad_norm"] > 0.5  # clipping engaged
    print(f"moe pp 2 x ep 2, stage {stage}, {sched}: worst loss {worst[0]:.2e}, grad norm {worst[1]:.2e}")
    first, last = sum(r["loss"] for r in par[:3]) / 3, sum(r["loss"] for r in par[-3:]) / 3
    assert last < first - 0.3, (first, last)


def test_moe_pp2_ep2_zb_h1_is_1f1b(tmp_path):
    """The split backward with MoE blocks on the CPU: zb-h1 (stage 1 defers a W past the next
    micro-batch; the experts' weight gradients wait in their MoE layers) trains pp 2 x ep 2 with
    bitwise 1f1b's losses (every gradient accumulates its micro-batches in the same order)."""
    grid = ["--set", "model.n_layer=4", "--set", 'model.moe={"experts": 4, "top_k": 2, "ep": 2}', "--set",
            "model.pp=2", "--grad-accum", "4", "--stage", "2"]
    zb, _ = run(tmp_path, "zb", grid + ["--set", "model.pp_schedule=zb-h1"], ranks=4)
    ref, _ = run(tmp_path, "ref", grid + ["--set", "model.pp_schedule=1f1b"], ranks=4)
    assert len(zb) == len(ref) == STEPS
    assert [r["loss_text"] for r in zb] == [r["loss_text"] for r in ref]


def test_resume_moe_pp2_ep2_is_bitwise(tmp_path):
    """Each (pp, ep) position saves its expert-data-parallel engine under <dir>/tp0-pp<P>-ep<E>
    (metadata parallel {tp, pp, tp_rank, pp_rank, ep, ep_rank}); 3 steps + resume + 3 steps give
    bitwise the losses of 6 straight steps."""
    grid = ["--set", "model.n_layer=4", "--set", 'model.moe={"experts": 4, "top_k": 2, "ep": 2}', "--set",
            "model.pp=2", "--grad-accum", "2", "--stage", "2"]
    ck = str(tmp_path / "ck")
    straight, _ = run(tmp_path, "straight", grid + ["--steps", "6"], ranks=4)
    run(tmp_path, "first", grid + ["--steps", "3", "--checkpoint-dir", ck], ranks=4)
    assert sorted(os.listdir(ck)) == ["tp0-pp0-ep0", "tp0-pp0-ep1", "tp0-pp1-ep0", "tp0-pp1-ep1"]
    resumed, p = run(tmp_path, "resumed", grid + ["--steps", "6", "--checkpoint-dir", ck, "--resume", "auto"],
                     ranks=4)
    assert "resumed from" in p.stdout and "step 3" in p.stdout
    assert [r["loss_text"] for r in resumed] == [r["loss_text"] for r in straight[3:]]


@pytest.mark.parametrize("extra,needle", [
    (["--set", "model.tp=3"], "world size 4 must equal dp * tp * cp * pp"),
    (["--set", "model.sequence_parallel=true"], "model.sequence_parallel: needs model.tp >= 2"),
    (["--set", "model.cp=4", "--set", "model.n_head=2"], "model.cp: 4 must divide model.seq_len 16, and model.tp 1 x"),
    (["--set", "model.tp=4", "--set", "model.n_head=2"], "model.tp: 4 does not divide model.n_head 2"),
    (["--set", "model.pp=4"], "model.pp: 4 stages need model.n_layer >= 4"),
    (["--set", "model.pp=2", "--set", "fp16.enabled=true"], "fp16.enabled: model.tp / model.pp > 1"),
    (["--set", "model.tp=2", "--set", 'model.moe={"experts": 4, "ep": 2}'],
     "model.moe: the MoE model does not run with model.tp / model.cp > 1"),
    (["--set", "model.tp=2", "--set", "model.sequence_parallel=true", "--set", 'train.device="cuda"'],
     'train.device: "cuda": model.sequence_parallel runs on the CPU only'),
])
def test_bad_grid_is_rejected(tmp_path, extra, needle):
    p = run_train(TINY + ["--steps", "1", "--data", corpus(tmp_path)] + extra, ranks=4, check=False)
    assert p.returncode != 0 and needle in p.stderr, p.stderr


def test_resume_tp2_pp2_is_bitwise(tmp_path):
    """Each tp/pp position saves its dp group's engine under <dir>/tp<T>-pp<P>; 3 steps + resume
    + 3 steps give bitwise the losses of 6 straight steps. A run on another grid refuses it."""
    grid = ["--set", "model.tp=2", "--set", "model.pp=2", "--grad-accum", "2", "--stage", "3"]
    ck = str(tmp_path / "ck")
    straight, _ = run(tmp_path, "straight", grid + ["--steps", "6"], ranks=4)
    run(tmp_path, "first", grid + ["--steps", "3", "--checkpoint-dir", ck], ranks=4)
    assert sorted(os.listdir(ck)) == ["tp0-pp0", "tp0-pp1", "tp1-pp0", "tp1-pp1"]
    resumed, p = run(tmp_path, "resumed", grid + ["--steps", "6", "--checkpoint-dir", ck, "--resume", "auto"],
                     ranks=4)
    assert "resumed from" in p.stdout and "step 3" in p.stdout
    assert [r["step"] for r in resumed] == [4, 5, 6]
    assert [r["loss_text"] for r in resumed] == [r["loss_text"] for r in straight[3:]]
    bad = run_train(TINY + ["--data", corpus(tmp_path), "--steps", "8", "--set", "model.tp=2", "--grad-accum", "2",
                            "--resume", ck], ranks=4, check=False)
    assert bad.returncode != 0 and "holds another model" in bad.stderr, bad.stderr


def test_resume_moe_ep2_is_bitwise(tmp_path):
    """model.moe.ep 2 (issue 14): each ep rank's expert-data-parallel engine (the dense tensors and
    its experts) saves under <dir>/ep<E>; 3 steps + resume + 3 steps give bitwise the losses of 6
    straight steps. A run with ep 1 refuses an ep 2 checkpoint naming the model difference."""
    moe = ["--set", 'model.moe={"experts": 4, "top_k": 2, "ep": 2}', "--stage", "2"]
    ck = str(tmp_path / "ck")
    straight, _ = run(tmp_path, "straight", moe + ["--steps", "6"], ranks=2)
    run(tmp_path, "first", moe + ["--steps", "3", "--checkpoint-dir", ck], ranks=2)
    assert sorted(os.listdir(ck)) == ["ep0", "ep1"]
    resumed, p = run(tmp_path, "resumed", moe + ["--steps", "6", "--checkpoint-dir", ck, "--resume", "auto"],
                     ranks=2)
    assert "resumed from" in p.stdout and "step 3" in p.stdout
    assert [r["step"] for r in resumed] == [4, 5, 6]
    assert [r["loss_text"] for r in resumed] == [r["loss_text"] for r in straight[3:]]
    bad = run_train(TINY + ["--data", corpus(tmp_path), "--steps", "8", "--set",
                            'model.moe={"experts": 4, "top_k": 2, "ep": 1}', "--resume", ck + "/ep0"],
                    ranks=2, check=False)
    assert bad.returncode != 0 and "holds another model" in bad.stderr, bad.stderr
