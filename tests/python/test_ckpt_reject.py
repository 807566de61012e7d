"""Damaged, foreign and mismatched checkpoints are refused with a clear
message (zero-ckpt verify and zero-train --resume), and nothing already saved
is lost: the good checkpoint still verifies and resumes afterwards. A save
killed half-way (a stale .tmp-step-* directory) leaves `latest` on the
previous checkpoint."""
import os
import shutil
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from train_helpers import TINY, corpus, run_ckpt, run_train  # noqa: E402


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    d = tmp_path_factory.mktemp("ck")
    run_train(TINY + ["--data", corpus(d), "--stage", "3", "--steps", "4", "--checkpoint-dir", str(d / "ck")],
              ranks=2)
    return d


def damaged(saved, tmp_path, how):
    step = saved / "ck" / "step-00000004"
    bad = tmp_path / "bad"
    shutil.copytree(step, bad)
    shard = bad / "rank-00001.bin"
    if how == "flip":
        data = bytearray(shard.read_bytes())
        data[200] ^= 0x01
        shard.write_bytes(bytes(data))
    elif how == "truncate":
        shard.write_bytes(shard.read_bytes()[:-100])
    elif how == "foreign-shard":
        shard.write_bytes(os.urandom(4096))
    elif how == "foreign-meta":
        (bad / "meta.json").write_text('{"format": "something else"}')
    elif how == "edited-meta":
        text = (bad / "meta.json").read_text()
        (bad / "meta.json").write_text(text.replace('"world_size": 2', '"world_size": 3'))
    elif how == "missing-shard":
        shard.unlink()
    return str(bad)


CASES = [("flip", "checksum mismatch"), ("truncate", "truncated"),
         ("foreign-shard", "not a libzero checkpoint shard"), ("foreign-meta", "not a libzero checkpoint"),
         ("edited-meta", "checksum mismatch"), ("missing-shard", "rank-00001.bin")]


@pytest.mark.parametrize("how,needle", CASES, ids=[c[0] for c in CASES])
def test_damaged_checkpoint_is_refused(saved, tmp_path, how, needle):
    bad = damaged(saved, tmp_path, how)
    v = run_ckpt(["verify", bad], check=False)
    assert v.returncode == 1 and needle in v.stderr, v.stderr
    p = run_train(TINY + ["--data", corpus(saved), "--steps", "6", "--resume", bad], ranks=2, check=False)
    assert p.returncode != 0 and needle in p.stderr, p.stderr
    c = run_ckpt(["consolidate", bad, str(tmp_path / "x.safetensors")], check=False)
    assert c.returncode == 1 and not (tmp_path / "x.safetensors").exists()
    # nothing saved is lost
    run_ckpt(["verify", str(saved / "ck")])


@pytest.mark.parametrize("override,needle", [(["--set", "model.n_layer=3"], "holds another model: parameter 26 is ln_f.weight"),
                                             (["--set", "model.d_model=48"], "wte.weight"),
                                             (["--set", "model.n_head=4"], "holds another model")])
def test_checkpoint_of_another_model_is_refused(saved, override, needle):
    p = run_train(TINY + override + ["--data", corpus(saved), "--steps", "6", "--resume", str(saved / "ck")],
                  ranks=1, check=False)
    assert p.returncode != 0 and needle in p.stderr, p.stderr


def test_killed_save_leaves_the_previous_checkpoint(saved, tmp_path):
    ck = tmp_path / "ck"
    shutil.copytree(saved / "ck", ck)
    # what a save killed half-way leaves: a temporary directory, partial files
    tmp = ck / ".tmp-step-00000006"
    tmp.mkdir()
    (tmp / "rank-00000.bin.tmp").write_bytes(b"partial")
    assert "step-00000004" in run_ckpt(["inspect", str(ck)]).stdout
    p = run_train(TINY + ["--data", corpus(saved), "--stage", "3", "--steps", "6", "--checkpoint-dir", str(ck),
                          "--resume", "auto"], ranks=2)
    assert "resumed from" in p.stdout and "step 4" in p.stdout
    assert not tmp.exists() and (ck / "latest").read_text().strip() == "step-00000006"
    run_ckpt(["verify", str(ck)])


def test_inspect_reports_the_checkpoint(saved):
    out = run_ckpt(["inspect", str(saved / "ck")]).stdout
    assert "step        4" in out and "2 ranks, ZeRO stage 3" in out
    assert '"n_layer":2' in out and "exp_avg_sq" in out
