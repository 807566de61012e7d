"""zero-train's metrics lines carry every rank's engine memory report, NVMe
traffic and resident set (what benchmarks/infinity/bench_infinity.py reads)."""
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_helpers import TINY, corpus, run_train  # noqa: E402


def strict_json(line):
    def refuse(const):
        raise ValueError(f"not JSON: {const}")
    return json.loads(line, parse_constant=refuse)

CATEGORIES = ("params", "grads", "master", "moments", "buffers", "other", "cache")
OFFLOAD = ["--set", "zero_optimization.stage=3", "--set", "zero_optimization.stage3_param_persistence_threshold=0",
           "--set", "zero_optimization.reduce_bucket_size=3000", "--set", "zero_optimization.sub_group_size=1000",
           "--set", "zero_optimization.offload_param.buffer_size=5000"]


def offload_args(tmp_path):
    d = tmp_path / "swap"
    d.mkdir()
    return OFFLOAD + ["--set", "zero_optimization.offload_optimizer.device=nvme",
                      "--set", f"zero_optimization.offload_optimizer.nvme_path={d}",
                      "--set", "zero_optimization.offload_param.device=nvme",
                      "--set", f"zero_optimization.offload_param.nvme_path={d}"]


def test_per_rank_fields_with_nvme_offload(tmp_path):
    """2 ranks, stage 3, parameters and optimizer state on NVMe, 3 steps. Per
    rank and step: total = the sum of the categories; the optimizer's chunks
    are read and written exactly once per step and the parameter chunks
    written exactly once (counted from the first step: finalize's initial
    writes are not in it), the parameter shard read at least once (the
    gathers); peak RSS >= RSS > 0 and never falls; the last line's totals are
    the summary's per-rank figures."""
    m = tmp_path / "m.jsonl"
    p = run_train(TINY + ["--data", corpus(tmp_path), "--steps", "3", "--metrics", str(m)] + offload_args(tmp_path),
                  ranks=2)
    rows = [strict_json(x) for x in m.read_text().splitlines()]
    assert len(rows) == 3
    for q in range(2):
        prev_peak = 0
        for k, row in enumerate(rows, start=1):
            r = row["ranks"][q]
            assert r["total"] == sum(r[c] for c in CATEGORIES)
            assert r["peak_total"] >= r["total"] > 0
            assert r["master"] == 0 and r["moments"] == 0  # offloaded
            assert r["opt_nvme_bytes"] > 0 and r["param_nvme_bytes"] > 0 and r["opt_host"] > 0
            assert r["opt_nvme_read"] == k * r["opt_nvme_bytes"]
            assert r["opt_nvme_written"] == k * r["opt_nvme_bytes"]
            assert r["param_nvme_written"] == k * r["param_nvme_bytes"]
            assert k * r["param_nvme_bytes"] <= r["param_nvme_read"] <= 3 * k * r["param_nvme_bytes"]
            assert r["rss_peak"] >= r["rss"] > 0 and r["rss_peak"] >= prev_peak
            prev_peak = r["rss_peak"]
    summary = re.search(r"engine memory per rank \(MiB, now/peak\): 0: ([\d.]+)/[\d.]+ 1: ([\d.]+)/", p.stdout)
    assert summary, p.stdout
    for q in range(2):
        assert abs(rows[-1]["ranks"][q]["total"] / 1048576.0 - float(summary.group(q + 1))) < 0.006


def test_no_offload_counts_zero(tmp_path):
    """Without offload the NVMe fields are 0 and 1 rank still gets its entry."""
    m = tmp_path / "m.jsonl"
    run_train(TINY + ["--data", corpus(tmp_path), "--steps", "2", "--metrics", str(m)])
    rows = [strict_json(x) for x in m.read_text().splitlines()]
    for row in rows:
        (r,) = row["ranks"]
        for k in ("opt_nvme_read", "opt_nvme_written", "opt_host", "opt_nvme_bytes", "param_nvme_read",
                  "param_nvme_written", "param_host", "param_nvme_bytes"):
            assert r[k] == 0, k
        assert r["total"] == sum(r[c] for c in CATEGORIES) > 0
