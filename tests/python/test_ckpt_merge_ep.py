"""zero-ckpt merge-ep (issue 14): an expert-parallel zero-train run saves one checkpoint per ep
rank (<dir>/ep<E>: the dense tensors and that rank's slice of every expert stack); merge-ep
writes one checkpoint of the whole model, as a model.moe.ep 1 run holds it.

The reference is the same run at ep 1 (every expert on every rank). Both start from the same
model (gpt_param_init_ep: an expert's values depend on its place in the whole stack) and see the
same samples, with one of our GEMM kernels (avx2: on every x86-64 CI machine; see the test's
comment). Measured here: after 3 steps the dense tensors (embeddings, attention, LayerNorms,
routers), their moments included, are bitwise those of the ep-1 run; the expert stacks are not,
since at ep 2 each expert's weight gradient sums both ranks' rows in one matmul where ep 1
all-reduces two per-rank sums (largest difference 8e-9 on weights of ~0.02, where the one step
with lr > 0 moved each by up to 5e-3): they are held to 1e-7 + 1e-6 relative, while the two ep ranks' slices differ by ~1e-2, so slices put in the wrong order,
or one slice twice, fail."""
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from train_helpers import TINY, consolidated, corpus, metrics, run_ckpt, run_train  # noqa: E402


def moe(ep):
    return ["--set", f'model.moe={{"experts": 4, "top_k": 2, "ep": {ep}}}', "--stage", "2"]


def train(tmp_path, name, extra, steps, ranks=2):
    m = tmp_path / f"{name}.jsonl"
    run_train(TINY + ["--data", corpus(tmp_path), "--metrics", str(m), "--steps", str(steps)] + extra, ranks=ranks)
    return metrics(m)


def test_merge_ep2_is_the_ep1_model(tmp_path, monkeypatch):
    # "dense tensors bitwise" needs a GEMM whose every element is one sum in one order whatever
    # the number of rows: at ep 2 an expert gets both ranks' tokens in one matmul. Our packed
    # kernels promise that (model/gpt_gemm.h); OpenBLAS does not (its edge kernels differ from
    # its main one: on an AVX2 CPU, where it is the default, wte.weight differed in the last bits).
    monkeypatch.setenv("ZERO_CPU_GEMM", "avx2")
    ck2, ck1, merged = str(tmp_path / "ck2"), str(tmp_path / "ck1"), str(tmp_path / "merged")
    train(tmp_path, "ep2", moe(2) + ["--checkpoint-dir", ck2], 3)
    train(tmp_path, "ep1", moe(1) + ["--checkpoint-dir", ck1], 3)
    p = run_ckpt(["merge-ep", ck2, merged])
    assert "8 expert stacks of 4 experts" in p.stdout, p.stdout
    run_ckpt(["verify", merged])
    insp = run_ckpt(["inspect", merged]).stdout
    assert "saved by    1 ranks" in insp and '"ep":1' in insp.replace(" ", ""), insp

    got, ref = consolidated(tmp_path, merged, "merged"), consolidated(tmp_path, ck1, "ep1")
    part = [consolidated(tmp_path, f"{ck2}/ep{r}", f"part{r}") for r in range(2)]
    assert list(got) == list(ref)
    stacks = [n for n in got if ".mlp.experts." in n]
    assert len(stacks) == 8
    for name, t in got.items():
        assert t.shape == ref[name].shape, name
        if name in stacks:
            # the tool's copy is exact: ep rank r's slice is rows [r E/2, (r+1) E/2) of the stack
            assert torch.equal(t, torch.cat([part[0][name], part[1][name]])), name
            assert torch.allclose(t, ref[name], rtol=1e-6, atol=1e-7), (name, (t - ref[name]).abs().max())
            assert (part[0][name] - part[1][name].reshape(part[0][name].shape)).abs().max() > 1e-3
        else:
            assert torch.equal(t, ref[name]) and torch.equal(t, part[1][name]), name
    # the moments too: the dense tensors' bitwise, the stacks' within rounding (zero-ckpt diff lists each)
    d = run_ckpt(["diff", merged, ck1], check=False)
    rows = [line.split() for line in d.stdout.splitlines() if line.startswith("h.")]
    assert rows and all(".mlp.experts." in r[0] for r in rows), d.stdout
    assert all(float(r[-1]) < 1e-7 for r in rows), d.stdout

    # an ep-1 run resumes from it and trains on like the ep-2 run (the same losses to 1e-6)
    straight = train(tmp_path, "straight2", moe(2), 6)
    resumed = train(tmp_path, "resumed1", moe(1) + ["--resume", merged], 6)
    assert [r["step"] for r in resumed] == [4, 5, 6]
    for a, b in zip(resumed, straight[3:]):
        assert abs(a["loss"] - b["loss"]) <= 1e-6 * b["loss"], (a, b)
    # an ep-2 run looks for its per-ep-rank parts there and names the one it misses
    bad = run_train(TINY + ["--data", corpus(tmp_path), "--steps", "6", "--resume", merged] + moe(2), ranks=2,
                    check=False)
    assert bad.returncode != 0 and f"{merged}/ep0" in bad.stderr, bad.stderr


def test_merge_ep_refuses_wrong_parts_by_name(tmp_path):
    ck, other, later = str(tmp_path / "ck"), str(tmp_path / "other"), str(tmp_path / "later")
    train(tmp_path, "ck", moe(2) + ["--checkpoint-dir", ck], 3)
    train(tmp_path, "other", moe(2) + ["--checkpoint-dir", other, "--seed", "7"], 3)
    train(tmp_path, "later", moe(2) + ["--checkpoint-dir", later], 4)
    out = str(tmp_path / "out")

    def refused(d, needle):
        p = run_ckpt(["merge-ep", d, out], check=False)
        assert p.returncode == 1 and needle in p.stderr, p.stderr
        assert not os.path.exists(out) and not os.path.exists(out + ".tmp")

    refused(str(tmp_path), f"{tmp_path}/ep0: no such directory")  # not an ep run's directory
    mixed = str(tmp_path / "mixed")

    def parts(ep0, ep1):
        shutil.rmtree(mixed, ignore_errors=True)
        os.mkdir(mixed)
        for r, src in enumerate((ep0, ep1)):
            if src:
                shutil.copytree(src, f"{mixed}/ep{r}")

    parts(f"{ck}/ep0", None)
    refused(mixed, f"{mixed}/ep1 is missing: {mixed}/ep0 says model.moe.ep 2")
    parts(f"{ck}/ep0", f"{ck}/ep0")
    refused(mixed, f"{mixed}/ep1 was saved by ep rank 0 of model.moe.ep 2, not ep rank 1 of 2")
    parts(f"{ck}/ep0", f"{later}/ep1")
    refused(mixed, "is step 4 but")
    parts(f"{ck}/ep0", f"{other}/ep1")  # another run (seed) at the same step: its dense tensors differ
    refused(mixed, "wte.weight (master), a tensor every part holds whole, differs between")
    parts(f"{ck}/ep0", f"{ck}/ep1")
    os.mkdir(f"{mixed}/ep2")
    refused(mixed, f"{mixed}/ep2 exists but")
    shutil.rmtree(f"{mixed}/ep2")
    run_ckpt(["merge-ep", mixed, out])
    run_ckpt(["verify", out])
    p = run_ckpt(["merge-ep", mixed, out], check=False)
    assert p.returncode == 1 and "already exists" in p.stderr, p.stderr
