"""A consolidated checkpoint in PyTorch: train on 2 ranks at ZeRO stage 3,
consolidate the sharded checkpoint into one fp32 safetensors file, parse it
with struct + json + torch.frombuffer, load it into the independent PyTorch
GPT of test_model_vs_torch.py (strict: every name and shape must match), and
reproduce the logits the C model computed from the engine's parameters
(zero-train --dump-logits) within the fp32 tolerances of that test."""
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
import model_torch_ref as ref  # noqa: E402
from test_model_vs_torch import compare  # noqa: E402
from train_helpers import TINY, TINY_MODEL, corpus, read_logits, read_safetensors, run_ckpt, run_train  # noqa: E402


def test_consolidated_checkpoint_reproduces_logits_in_torch(tmp_path):
    ck, dump, st = tmp_path / "ck", tmp_path / "logits.bin", tmp_path / "model.safetensors"
    run_train(TINY + ["--data", corpus(tmp_path), "--stage", "3", "--steps", "12", "--checkpoint-dir", str(ck),
                      "--dump-logits", str(dump)], ranks=2)
    run_ckpt(["consolidate", str(ck), str(st)])
    tensors, meta, order = read_safetensors(st)
    assert order == ref.param_names(TINY_MODEL["n_layer"])  # the C model's parameter order
    user = json.loads(meta["user"])
    # the model's shape as trained; the rest of the section (pipeline schedule, MoE) at its defaults
    assert {k: user["model"][k] for k in TINY_MODEL} == TINY_MODEL and meta["step"] == "12"
    assert user["model"]["moe"]["experts"] == 0 and user["model"]["pp_schedule"] == "1f1b"

    model = ref.GPT(**TINY_MODEL)
    model.load_state_dict(tensors, strict=True)
    # trained, not the initialisation: the LayerNorm weights have moved off 1
    assert (tensors["ln_f.weight"] - 1).abs().max() > 1e-3

    tokens, c_logits = read_logits(dump)
    with torch.no_grad():
        t_logits, _ = model(torch.from_numpy(tokens.astype(np.int64)))
    err = compare("logits", c_logits, t_logits.numpy())
    print(f"max relative logits error vs torch: {err:.2e}")
