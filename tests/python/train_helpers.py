"""Helpers for the zero-train and checkpoint tests (test_train_*.py, test_ckpt_*.py).

Binaries come from ZERO_BUILD_ROOT (scripts/test.sh sets it to the build dir);
multi-rank runs go through tests/mpirun.sh like every other multi-rank test.
"""
import gzip
import json
import os
import shutil
import struct
import subprocess

import numpy as np
import pytest
import torch

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MPIRUN = os.path.join(SRC, "tests", "mpirun.sh")

# A model small enough that a step takes milliseconds.
TINY = ["--set", "model.n_layer=2", "--set", "model.n_head=2", "--set", "model.d_model=32",
        "--set", "model.seq_len=16", "--micro-batch", "4", "--set", "optimizer.params.lr=0.01",
        "--set", "scheduler.params.warmup_num_steps=2", "--set", "scheduler.params.total_num_steps=40"]
TINY_MODEL = dict(n_layer=2, n_head=2, d_model=32, seq_len=16, vocab=256)


def build_root():
    root = os.environ.get("ZERO_BUILD_ROOT")
    if not root:
        pytest.skip("ZERO_BUILD_ROOT is not set (run through scripts/test.sh)")
    return root


def exe(name):
    sub = {"zero-train": "tools/train", "zero-ckpt": "tools/ckpt", "model_driver": "tests/model"}[name]
    path = os.path.join(build_root(), sub, name)
    if not os.path.exists(path):
        pytest.skip(f"{path} is not built")
    return path


CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "corpus.txt.gz")


def corpus(tmp_path):
    """A fixed text corpus (328 KB): libzero's zero/*.c and collectives/*.c as of commit 7cbf23e,
    frozen in data/corpus.txt.gz. It used to be read from the live sources, so any edit there
    changed every training test's data - and a pure rename in collectives/ moved
    test_train_parallel's tp/pp-vs-1-rank loss gap at step 7 from below 1e-7 to 7e-5 relative."""
    path = tmp_path / "corpus.txt"
    if not path.exists():
        with gzip.open(CORPUS, "rb") as f:
            path.write_bytes(f.read())
    return str(path)


def run_train(args, ranks=1, check=True, timeout=300, env=None):
    if ranks > 1 and shutil.which("mpirun") is None:
        pytest.skip("multi-rank run needs Open MPI's mpirun")
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", **(env or {}))
    cmd = ([MPIRUN, str(ranks)] if ranks > 1 else []) + [exe("zero-train"), "--plain"] + list(args)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


def run_ckpt(args, check=True):
    p = subprocess.run([exe("zero-ckpt")] + list(args), capture_output=True, text=True, timeout=120)
    if check and p.returncode != 0:
        raise AssertionError(f"zero-ckpt {' '.join(args)} exited {p.returncode}: {p.stderr}")
    return p


def metrics(path):
    """Per-step rows; the loss is kept as its JSON text too, for bitwise comparison."""
    rows = []
    for line in open(path):
        row = json.loads(line)
        row["loss_text"] = line.split('"loss": ')[1].split(",")[0]
        rows.append(row)
    return rows


def read_safetensors(path):
    """Parse a safetensors file with struct + json + torch.frombuffer (Debian has no
    python3-safetensors): 8-byte little-endian header length, JSON header, raw data.
    Enforces what the reference loader enforces: the tensors' byte ranges, sorted by
    offset, tile the data section exactly, and each range holds 4 * prod(shape) bytes."""
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    assert 8 + n <= len(data), "header runs past the end of the file"
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    out = {}
    base = 8 + n
    expect = 0
    for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        assert t["dtype"] == "F32", f"{name}: dtype {t['dtype']}"
        b, e = t["data_offsets"]
        numel = 1
        for d in t["shape"]:
            numel *= d
        assert b == expect, f"{name}: data starts at {b}, expected {expect} (gap or overlap)"
        assert e - b == 4 * numel, f"{name}: {e - b} bytes for shape {t['shape']}"
        expect = e
        buf = bytearray(data[base + b:base + e])
        out[name] = torch.frombuffer(buf, dtype=torch.float32).reshape(t["shape"]) if e > b else \
            torch.zeros(t["shape"])
    assert base + expect == len(data), f"{len(data) - base - expect} bytes after the last tensor"
    return out, meta, list(header.keys())


def consolidated(tmp_path, ckpt, name):
    out = str(tmp_path / f"{name}.safetensors")
    run_ckpt(["consolidate", ckpt, out])
    return read_safetensors(out)[0]


def read_logits(path):
    raw = open(path, "rb").read()
    B, T, V = struct.unpack("<3i", raw[:12])
    tokens = np.frombuffer(raw, dtype="<i4", count=B * T, offset=12).reshape(B, T)
    logits = np.frombuffer(raw, dtype="<f4", offset=12 + 4 * B * T).reshape(B, T, V)
    return tokens, logits
