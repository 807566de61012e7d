"""The C GPT (model/, CPU path) against an independent PyTorch model.

Tolerances (fp32 on both sides; only the summation order differs):
  * loss:   |c - torch| <= 1e-5 * max(1, |torch|)
  * logits and every gradient: |c - torch| <= ATOL + RTOL * |torch| elementwise,
    with ATOL = 1e-5 * max|torch tensor| (a per-tensor scale, so tiny entries of a
    large tensor are not judged on relative error) and RTOL = 1e-4.
Why: each value is a sum of at most a few thousand fp32 products (d_model 32,
4*d_model 128, B*T 32 rows); the accumulated rounding difference of two
summation orders is ~sqrt(n) * 2^-24 * max|term|, i.e. 1e-6 relative, and the
polynomial exp/tanh of the C kernels adds ~2e-7 relative. 1e-4 / 1e-5 leave
10x head-room while still catching any real bug (a missing term moves values
by >1e-2 relative). The measured errors are printed (pytest -s).
"""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
import model_torch_ref as ref  # noqa: E402

RTOL = 1e-4
ATOL_SCALE = 1e-5

CONFIGS = [
    # the brief's tiny config, and one with more heads, a seq shorter than seq_len, odd sizes
    (dict(n_layer=2, n_head=2, d_model=32, seq_len=16, vocab=256), 2, 16),
    (dict(n_layer=3, n_head=4, d_model=48, seq_len=24, vocab=97), 3, 11),
]


def build_root():
    root = os.environ.get("ZERO_BUILD_ROOT")
    if not root:
        pytest.skip("ZERO_BUILD_ROOT is not set (run through scripts/test.sh)")
    return root


def driver_path():
    exe = os.path.join(build_root(), "tests", "model", "model_driver")
    if not os.path.exists(exe):
        pytest.skip(f"{exe} is not built")
    return exe


def compare(name, c, t):
    t = np.asarray(t, dtype=np.float64)
    c = np.asarray(c, dtype=np.float64)
    assert c.shape == t.shape, f"{name}: shape {c.shape} vs torch {t.shape}"
    scale = max(np.abs(t).max(), 1e-30)
    err = np.abs(c - t)
    bound = ATOL_SCALE * scale + RTOL * np.abs(t)
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert np.all(err <= bound), (f"{name}: max abs err {err.max():.3g} (max|torch| {scale:.3g}); "
                                  f"worst at {worst}: C {c[worst]:.9g} torch {t[worst]:.9g}")
    return err.max() / scale


@pytest.mark.parametrize("cfg,B,T", CONFIGS)
def test_forward_backward_match_torch(tmp_path, cfg, B, T):
    exe = driver_path()
    torch.manual_seed(0)
    model = ref.GPT(**cfg)
    ref.random_init(model, seed=1234)
    g = torch.Generator().manual_seed(99)
    tokens = torch.randint(0, cfg["vocab"], (B, T), generator=g)
    targets = torch.randint(0, cfg["vocab"], (B, T), generator=g)
    targets[0, 1] = -1  # an ignored position: no loss, no gradient
    ref.write_driver_input(tmp_path / "in.bin", cfg, B, T, model, tokens, targets)
    subprocess.run([exe, str(tmp_path / "in.bin"), str(tmp_path / "out.bin")], check=True,
                   env=dict(os.environ, OMP_NUM_THREADS="2", OPENBLAS_NUM_THREADS="2"))
    loss_c, logits_c, grads_c = ref.read_driver_output(tmp_path / "out.bin", cfg, B, T, model)

    logits, loss = model(tokens, targets)
    loss.backward()
    assert abs(loss_c - loss.item()) <= 1e-5 * max(1.0, abs(loss.item())), (loss_c, loss.item())
    worst = {"logits": compare("logits", logits_c, logits.detach().numpy())}
    params = dict(model.named_parameters())
    for name in ref.param_names(cfg["n_layer"]):
        worst[name] = compare(name, grads_c[name], params[name].grad.numpy())
    name = max(worst, key=worst.get)
    print(f"\n{cfg} B={B} T={T}: loss C {loss_c:.7f} torch {loss.item():.7f}; "
          f"largest max|err|/max|torch| {worst[name]:.2e} ({name})")
