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
                  "buffers": 0, "other": 0, "cache": 0}
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


def offload_formula(psi, n, d, moment_bytes, sub_group, bucket, opt_buffers, param_buffers):
    """docs/memory.md, "Where the state lives": per rank (device, host, nvme) bytes
    for every stage x setting the engine accepts; psi divisible by n here."""
    def r4k(x):
        return (x + 4095) // 4096 * 4096
    s = psi // n
    k_dev = moment_bytes + (4 if d < 4 else 0)  # fp32 params are their own master
    base = {0: (d * psi, d * psi, k_dev * psi), 1: (d * psi, d * psi, k_dev * s),
            2: (d * psi, d * s, k_dev * s), 3: (d * s, d * s, k_dev * s)}
    o = (4 + moment_bytes) * s                   # master (always kept) + moments of the shard
    opt_staging = (opt_buffers + 1) * r4k((4 + moment_bytes) * min(sub_group, s))
    par_staging = param_buffers * r4k(d * -(-min(bucket, psi) // n))
    rows = {}
    for st, (p, g, k) in base.items():
        rows[(st, "none")] = (p + g + k, 0, 0)
        if st >= 1:
            rows[(st, "opt cpu")] = (p + g, o, 0)
            rows[(st, "opt nvme")] = (p + g, opt_staging, o)
        if st == 3:
            rows[(st, "opt+param cpu")] = (g, o + p, 0)
            rows[(st, "opt+param nvme")] = (g, opt_staging + par_staging, o + p)
    return rows


@pytest.mark.parametrize("dtype,d,opt,moment_bytes", [("bf16", 2, ["--optimizer", "adamw"], 8),
                                                      ("fp32", 4, ["--optimizer", "adamw"], 8),
                                                      ("fp16", 2, ["--optimizer", "sgd", "--momentum", "0"], 0)])
def test_offload_placement_equals_the_formula(tmp_path, dtype, d, opt, moment_bytes):
    """Every stage x offload cell, to the byte, against the documented formula;
    stage 0 has no offload and only stage 3 offloads parameters."""
    psi, n = 3_200_000_000, 8
    _, doc = estimate(tmp_path, "--params", psi, "--dp", n, "--dtype", dtype, *opt, "--offload",
                      "--sub-group", "1e7", "--bucket", "2e7", "--opt-buffers", "4", "--param-buffers", "5")
    got = {(r["stage"], r["offload"]): (r["device_bytes"], r["host_bytes"], r["nvme_bytes"])
           for r in doc["offload"]["rows"]}
    assert got == offload_formula(psi, n, d, moment_bytes, 10_000_000, 20_000_000, 4, 5)
    assert doc["offload"]["ranks_per_node"] == 8  # min(dp, 8)


def test_offload_fits_the_capacities(tmp_path):
    """This machine's case: 3.2e9 fp32 AdamW params on 2 ranks, 12 GB of
    device per rank, 25 GB host and 80 GB NVMe per node: only stage 3 with
    both offloads to NVMe fits; the chart of the 12 cells is a PNG."""
    text, doc = estimate(tmp_path, "--params", "3.2e9", "--dp", "2", "--dtype", "fp32", "--offload",
                         "--sub-group", "1e7", "--bucket", "2e7", "--device-gb", "12", "--host-gb", "25",
                         "--nvme-gb", "80")
    rows = doc["offload"]["rows"]
    assert len(rows) == 12
    assert [(r["stage"], r["offload"]) for r in rows if r["fits"]] == [(3, "opt+param nvme")]
    cpu = [r for r in rows if r["offload"] == "opt+param cpu"][0]
    assert cpu["fits_device"] and not cpu["fits_host"] and cpu["fits_nvme"]
    assert "opt+param nvme" in text and "no: device" in text
    png = tmp_path / "off.png"
    plot(tmp_path / "est.json", png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert matplotlib.image.imread(str(png)).shape[1] >= 700
