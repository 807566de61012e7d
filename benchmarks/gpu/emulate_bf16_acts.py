"""Emulates the CUDA GPT's bf16 activation mode (GPT_CUDA_OPTIONS_BF16) on the CPU
with PyTorch, to measure the error the GPU check (tests/model/test_gpt_cuda.c,
check 5) should allow: every value the mode stores in bf16 is rounded where it
is stored (forward) and every activation gradient where it is written
(backward); sums stay fp32, as on the GPU. Compared with the plain fp32 model
(tests/python/model_torch_ref.GPT) on test_gpt_cuda.c's config.

    /usr/bin/python3 benchmarks/gpu/emulate_bf16_acts.py [seeds]

Prints, per seed, the loss difference and the worst relative L2 error over the
logits and every gradient (fp32 params; and bf16 params, gradients rounded to
bf16 once more, against fp32 on the same bf16-rounded weights).
"""
import math
import sys

import torch

sys.path.insert(0, __file__.rsplit("/benchmarks/", 1)[0] + "/tests/python")
from model_torch_ref import GPT  # noqa: E402


def bf(x):
    return x.to(torch.bfloat16).to(torch.float32)


class _R(torch.autograd.Function):  # round the value (stored bf16), pass the gradient
    @staticmethod
    def forward(ctx, x):
        return bf(x)

    @staticmethod
    def backward(ctx, g):
        return g


class _G(torch.autograd.Function):  # pass the value, round the gradient (written bf16)
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return bf(g)


R, G = _R.apply, _G.apply


def RB(x):
    return G(R(x))


def ln(x, m):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), m.weight, m.bias, 1e-5)


def gelu(h):
    return 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h.pow(3))))


def forward_bf16_acts(model, tokens, targets):
    B, T = tokens.shape
    x = model.wte(tokens) + model.wpe(torch.arange(T))  # fp32 views of the embeddings
    for blk in model.h:
        C = x.shape[-1]
        nh, hs = blk.n_head, C // blk.n_head
        a = blk.attn
        ln1 = RB(ln(x, blk.ln_1))
        qkv = RB(ln1 @ R(a.c_attn.weight).t() + R(a.c_attn.bias))  # bf16 output: bf16 bias
        q, k, v = (z.view(B, T, nh, hs).transpose(1, 2) for z in qkv.split(C, dim=2))
        s = (q @ k.transpose(-2, -1)) / math.sqrt(hs)  # flash: fp32 sums on bf16 inputs
        s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        y = RB((torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, T, C))
        x = x + G(y @ R(a.c_proj.weight).t() + a.c_proj.bias)  # fp32 D; its dout is dres16
        ln2 = RB(ln(x, blk.ln_2))
        fch = G(R(ln2 @ R(blk.mlp.c_fc.weight).t() + R(blk.mlp.c_fc.bias)))  # aux bf16; DGELU writes bf16 at fch
        h = R(gelu(fch))
        x = x + G(h @ R(blk.mlp.c_proj.weight).t() + blk.mlp.c_proj.bias)
    logits = G(RB(ln(x, model.ln_f)) @ R(model.wte.weight).t())  # logits fp32, dlogits bf16
    loss = torch.nn.functional.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1), ignore_index=-1)
    return logits, loss


def rel(a, b):
    return float((a - b).norm() / b.norm()) if float(b.norm()) > 0 else float((a - b).norm())


def run(seed, bf16_params):
    torch.manual_seed(seed)
    cfg = dict(n_layer=2, n_head=4, d_model=64, seq_len=40, vocab=256)
    B, T = 3, 40
    model = GPT(**cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            u = torch.rand(p.shape) * 2 - 1
            p.copy_(1.0 + 0.1 * u if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")) else 0.1 * u)
            if bf16_params:
                p.copy_(bf(p))
    tokens = torch.randint(0, 256, (B, T))
    targets = torch.randint(0, 256, (B, T))
    targets[0, 5] = -1
    lr, loss_r = model(tokens, targets)
    loss_r.backward()
    ref = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    le, loss_e = forward_bf16_acts(model, tokens, targets)
    loss_e.backward()
    worst, where = rel(le.detach(), lr.detach()), "logits"
    for n, p in model.named_parameters():
        g = bf(p.grad) if bf16_params else p.grad
        r = rel(g, ref[n])
        if r > worst:
            worst, where = r, n
    return abs(float(loss_e) - float(loss_r)), worst, where


if __name__ == "__main__":
    seeds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    for bp in (False, True):
        res = [run(s, bp) for s in range(seeds)]
        print(f"{'bf16' if bp else 'fp32'} params: max |dloss| {max(r[0] for r in res):.2e}, "
              f"worst rel L2 {max(r[1] for r in res):.2e} ({max(res, key=lambda r: r[1])[2]})")
