"""zero-train's bf16 path on the CPU (issue 15): the matmuls multiply in bf16
where the CPU has a fast bf16 kernel (amx_bf16, avx512_bf16), and the losses
stay those of fp32 training within bf16's tolerance; the fp32-kernel fallback
(forced with ZERO_CPU_GEMM, what every CPU without a bf16 kernel runs) too.

Tolerance: per-step |loss_bf16 - loss_fp32| <= 0.05 over 30 steps of the tiny
model (losses 5.52 -> 2.72). Measured on an Emerald Rapids core: 0.0018 with
amx_bf16, 0.0060 with the fp32-kernel fallback (bf16 parameters alone), so
the bound leaves 8x head-room."""
import re

import pytest

from train_helpers import TINY, corpus, metrics, run_train

STEPS = 30
TOL = 0.05


def train(tmp_path, name, bf16, gemm=None):
    m = str(tmp_path / f"{name}.jsonl")
    p = run_train(TINY + ["--steps", str(STEPS), "--data", corpus(tmp_path), "--metrics", m,
                          "--set", f"bf16.enabled={'true' if bf16 else 'false'}"],
                  env={"ZERO_CPU_GEMM": gemm} if gemm else None)
    kernel = re.search(r"cpu gemm: (\S+) \((\w+) matmuls[):]", p.stdout)
    assert kernel, p.stdout
    math = kernel.group(2)
    if bf16 and math == "fp32":  # the fallback says so, and what it means
        assert "no bf16 GEMM kernel runs here" in p.stdout and "saves memory, not time" in p.stdout, p.stdout
    return [r["loss"] for r in metrics(m)], kernel.group(1), math


def close(a, b):
    return max(abs(x - y) for x, y in zip(a, b))


def test_bf16_losses_match_fp32_and_the_fallback(tmp_path):
    f32, k32, math32 = train(tmp_path, "f32", False)
    assert math32 == "fp32" and k32 != "amx_bf16" and k32 != "avx512_bf16"
    b16, k16, math16 = train(tmp_path, "bf16", True)
    native = k16 in ("amx_bf16", "avx512_bf16")
    assert math16 == ("bf16" if native else "fp32"), (k16, math16)  # fp32 math where no bf16 kernel runs
    assert len(b16) == len(f32) == STEPS
    assert close(b16, f32) <= TOL, (b16, f32)
    assert b16[-1] < b16[0] - 1.0  # it trains
    if not native:
        pytest.skip(f"this CPU has no bf16 GEMM kernel (bf16 math runs {k16}); the fallback ran above")
    # the fp32-kernel fallback: what a CPU without a bf16 kernel runs
    fb, kfb, mathfb = train(tmp_path, "fallback", True, gemm=k32)
    assert kfb == k32 and mathfb == "fp32"
    assert close(fb, f32) <= TOL, (fb, f32)
    assert fb != b16  # the bf16 kernel really ran in the first bf16 run


def test_invalid_gemm_kernel_is_refused_by_name(tmp_path):
    p = run_train(TINY + ["--steps", "1", "--data", corpus(tmp_path)], check=False, env={"ZERO_CPU_GEMM": "sgemm9"})
    assert p.returncode != 0
    assert "ZERO_CPU_GEMM=sgemm9" in p.stderr, p.stderr
