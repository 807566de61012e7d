"""zero-bench estimate: the ZeRO paper's example, exactly, from the library's formula."""
import json

import matplotlib.image
import pytest

from bench_helpers import plot, run

PSI = 7.5e9


def estimate(tmp_path, *args):
    out = tmp_path / "est.json"
    proc = run(["estimate", *args, "--json", out])
    return proc.stdout, json.loads(out.read_text())


def test_paper_example_exact_bytes(tmp_path):
    """ZeRO paper, Fig. 1: 7.5B params, N_d = 64, mixed-precision Adam (K = 12)."""
    text, doc = estimate(tmp_path, "--params", "7.5e9", "--dp", "64")
    totals = [s["total_bytes"] for s in doc["stages"]]
    # (2 + 2 + K) Psi, (2 + 2) Psi + K Psi / N, 2 Psi + (2 + K) Psi / N, (2 + 2 + K) Psi / N
    assert totals == [int(16 * PSI), int(4 * PSI + 12 * PSI / 64), int(2 * PSI + 14 * PSI / 64), int(16 * PSI / 64)]
    # the paper's rounded figures, in GB = 1e9 bytes
    assert [round(t / 1e9, 1) for t in totals] == [120.0, 31.4, 16.6, 1.9]
    for fig in ("120.000", "31.406", "16.641", "1.875"):
        assert fig in text, f"table lacks {fig}:\n{text}"
    s1 = doc["stages"][1]["bytes"]
    assert s1["params"] == s1["grads"] == int(2 * PSI)
    assert s1["master"] == int(4 * PSI / 64) and s1["moments"] == int(8 * PSI / 64)


def test_fp32_params_are_their_own_master(tmp_path):
    """fp32 compute: K = 8 (two moments); no separate master copy."""
    _, doc = estimate(tmp_path, "--params", "1e6", "--dp", "4", "--dtype", "fp32")
    s0, s2 = doc["stages"][0]["bytes"], doc["stages"][2]["bytes"]
    assert s0 == {"params": 4_000_000, "grads": 4_000_000, "master": 0, "moments": 8_000_000,
                  "buffers": 0, "other": 0}
    assert s2["params"] == 4_000_000 and s2["grads"] == 1_000_000 and s2["moments"] == 2_000_000


@pytest.mark.parametrize("momentum,k", [(1, 8), (0, 4)])
def test_sgd_state_bytes(tmp_path, momentum, k):
    """SGD with bf16 compute: master (4) + momentum buffer (4) or master alone."""
    _, doc = estimate(tmp_path, "--params", "1000", "--dp", "1", "--dtype", "bf16", "--optimizer", "sgd",
                      "--momentum", momentum)
    b = doc["stages"][0]["bytes"]
    assert b["master"] + b["moments"] == k * 1000


def test_estimate_rejects_bad_options():
    run(["estimate", "--params", "abc"], ok=(2,))
    run(["estimate", "--dp", "0"], ok=(2,))


def test_chart_from_estimate(tmp_path):
    _, doc = estimate(tmp_path, "--params", "7.5e9", "--dp", "64")
    png = tmp_path / "est.png"
    plot(tmp_path / "est.json", png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = matplotlib.image.imread(str(png))
    assert img.shape[0] >= 300 and img.shape[1] >= 500
