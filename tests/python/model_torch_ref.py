"""An independent PyTorch GPT with the model/ layout, for testing the C model.

Written from the math with explicit ops (no nn.MultiheadAttention, no
F.scaled_dot_product_attention), so a shared misunderstanding would have to be
made twice. Parameter names and shapes match gpt_param_info (GPT-2 names,
nn.Linear (out, in) layout), so the state dict is the parameter list.
"""
import math
import struct

import numpy as np
import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, C, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.attn = nn.Module()
        self.attn.c_attn = nn.Linear(C, 3 * C)
        self.attn.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.mlp = nn.Module()
        self.mlp.c_fc = nn.Linear(C, 4 * C)
        self.mlp.c_proj = nn.Linear(4 * C, C)

    def attention(self, x):
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.attn.c_attn(x).split(C, dim=2)
        q, k, v = (z.view(B, T, self.n_head, hs).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
        y = torch.softmax(scores, dim=-1) @ v
        return self.attn.c_proj(y.transpose(1, 2).reshape(B, T, C))

    def mlp_forward(self, x):
        h = self.mlp.c_fc(x)
        # GELU, tanh approximation (GPT-2), written out
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h.pow(3))))
        return self.mlp.c_proj(h)

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp_forward(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, d_model, seq_len, vocab):
        super().__init__()
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(seq_len, d_model)
        self.h = nn.ModuleList(Block(d_model, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model, eps=1e-5)

    def forward(self, tokens, targets=None):
        B, T = tokens.shape
        x = self.wte(tokens) + self.wpe(torch.arange(T))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied head
        loss = None
        if targets is not None:
            loss = nn.functional.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1), ignore_index=-1)
        return logits, loss


def param_names(n_layer):
    """The C model's parameter order (gpt_param_info)."""
    names = ["wte.weight", "wpe.weight"]
    for i in range(n_layer):
        for s in ("ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                  "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                  "mlp.c_proj.weight", "mlp.c_proj.bias"):
            names.append(f"h.{i}.{s}")
    return names + ["ln_f.weight", "ln_f.bias"]


def random_init(model, seed):
    """Weights far from the GPT-2 init (LayerNorm weights and biases non-trivial),
    so every gradient path carries signal."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))


def write_driver_input(path, cfg, B, T, model, tokens, targets):
    params = dict(model.named_parameters())
    with open(path, "wb") as f:
        f.write(b"GPTM" + struct.pack("<I7i", 1, cfg["n_layer"], cfg["n_head"], cfg["d_model"], cfg["seq_len"],
                                      cfg["vocab"], B, T))
        for name in param_names(cfg["n_layer"]):
            f.write(params[name].detach().numpy().astype("<f4").tobytes())
        f.write(tokens.numpy().astype("<i4").tobytes())
        f.write(targets.numpy().astype("<i4").tobytes())


def read_driver_output(path, cfg, B, T, model):
    data = np.fromfile(path, dtype="<f4")
    loss = float(data[0])
    n = B * T * cfg["vocab"]
    logits = data[1:1 + n].reshape(B, T, cfg["vocab"])
    grads, off = {}, 1 + n
    params = dict(model.named_parameters())
    for name in param_names(cfg["n_layer"]):
        k = params[name].numel()
        grads[name] = data[off:off + k].reshape(params[name].shape)
        off += k
    assert off == data.size, f"driver output has {data.size} floats, expected {off}"
    return loss, logits, grads


def write_adamw_input(path, cfg, B, T, model, batches, lr, betas, eps, weight_decay):
    params = dict(model.named_parameters())
    with open(path, "wb") as f:
        f.write(b"GPTA" + struct.pack("<I8i", 1, cfg["n_layer"], cfg["n_head"], cfg["d_model"], cfg["seq_len"],
                                      cfg["vocab"], B, T, len(batches)))
        f.write(struct.pack("<5d", lr, betas[0], betas[1], eps, weight_decay))
        for name in param_names(cfg["n_layer"]):
            f.write(params[name].detach().numpy().astype("<f4").tobytes())
        for tokens, targets in batches:
            f.write(tokens.numpy().astype("<i4").tobytes())
            f.write(targets.numpy().astype("<i4").tobytes())


def read_adamw_output(path, cfg, steps, model):
    data = np.fromfile(path, dtype="<f4")
    losses = data[:steps].astype(np.float64)
    params, off = {}, steps
    shapes = dict(model.named_parameters())
    for name in param_names(cfg["n_layer"]):
        k = shapes[name].numel()
        params[name] = data[off:off + k].reshape(shapes[name].shape)
        off += k
    assert off == data.size, f"driver output has {data.size} floats, expected {off}"
    return losses, params
