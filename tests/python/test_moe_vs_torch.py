"""The MoE FFN (model/moe.h, CPU, one rank) against an independent PyTorch one.

The routing (each token's top-k experts, the slots the capacity rule gives,
the dropped choices) must be IDENTICAL; outputs, the aux loss and every
gradient (of sum(out * dout) + dloss * aux_loss_coef * aux) within
ATOL = 1e-5 * max|torch tensor| + RTOL = 1e-4 * |torch| elementwise, the
tolerance of test_model_vs_torch.py (fp32 both sides, only summation orders
differ: each value sums at most a few hundred products here).
"""
import math
import os
import struct
import subprocess
import tempfile

import numpy as np
import pytest
import torch

RTOL = 1e-4
ATOL_SCALE = 1e-5

# (d_model, d_ff, experts, top_k, tokens, capacity_factor, aux_loss_coef, dloss)
CASES = [
    (16, 32, 4, 1, 40, 1.0, 0.01, 1.0),    # Switch top-1, with drops
    (24, 40, 8, 2, 64, 1.25, 0.02, 0.5),   # top-2, with drops
    (8, 24, 4, 2, 13, 0.0, 0.1, 2.0),      # top-2 unlimited, odd token count
    (12, 20, 6, 3, 30, 0.5, 0.05, 1.0),    # top-3, heavy dropping
]


def driver():
    root = os.environ.get("ZERO_BUILD_ROOT")
    if not root:
        pytest.skip("ZERO_BUILD_ROOT is not set")
    exe = os.path.join(root, "tests", "model", "moe_driver")
    if not os.path.exists(exe):
        pytest.skip(f"{exe} is not built")
    return exe


def torch_moe(C, H, E, K, N, cf, coef, dloss, prm, x, init, dout):
    t = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in prm.items()}
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    probs = torch.softmax(xt @ t["gate"].T, dim=-1)
    topv, topi = torch.topk(probs, K, dim=-1)
    w = topv / topv.sum(-1, keepdim=True) if K > 1 else topv
    cap = math.ceil(cf * K * N / E) if cf > 0 else N
    slot = np.full((N, K), -1, dtype=np.int64)
    count = [0] * E
    for i in range(K):            # priority: choice rank, then token
        for n in range(N):
            e = int(topi[n, i])
            if count[e] < cap:
                slot[n, i] = count[e]
                count[e] += 1
    out = torch.tensor(init, dtype=torch.float64).clone()
    for e in range(E):
        rows = [(n, i) for n in range(N) for i in range(K) if int(topi[n, i]) == e and slot[n, i] >= 0]
        if not rows:
            continue
        idx = torch.tensor([n for n, _ in rows])
        wi = torch.stack([w[n, i] for n, i in rows])
        hmid = torch.nn.functional.gelu(xt[idx] @ t["fc_w"][e].T + t["fc_b"][e], approximate="tanh")
        y = hmid @ t["proj_w"][e].T + t["proj_b"][e]
        out = out.index_add(0, idx, wi[:, None] * y)
    first = torch.nn.functional.one_hot(topi[:, 0], E).double().mean(0)
    aux = E * (first * probs.mean(0)).sum()
    loss = (out * torch.tensor(dout, dtype=torch.float64)).sum() + dloss * coef * aux
    loss.backward()
    grads = {k: v.grad.numpy() for k, v in t.items()}
    return dict(aux=aux.item(), out=out.detach().numpy(), expert=topi.numpy(), slot=slot,
                weight=w.detach().numpy(), dx=xt.grad.numpy(), grads=grads)


def compare(name, c, t):
    c = np.asarray(c, dtype=np.float64)
    t = np.asarray(t, dtype=np.float64)
    assert c.shape == t.shape, f"{name}: shape {c.shape} vs {t.shape}"
    scale = max(np.abs(t).max(), 1e-30)
    err = np.abs(c - t)
    bound = ATOL_SCALE * scale + RTOL * np.abs(t)
    assert np.all(err <= bound), f"{name}: max abs err {err.max():.3g} (max|torch| {scale:.3g})"
    print(f"  {name}: max abs err {err.max():.3g} (max|torch| {scale:.3g})")


@pytest.mark.parametrize("case", CASES, ids=[f"C{c[0]}-E{c[2]}-top{c[3]}-cf{c[5]}" for c in CASES])
def test_moe_vs_torch(case):
    C, H, E, K, N, cf, coef, dloss = case
    rng = np.random.default_rng(1234 + E * 10 + K)
    prm = dict(gate=rng.normal(0, 1.0, (E, C)), fc_w=rng.normal(0, 0.3, (E, H, C)), fc_b=rng.normal(0, 0.1, (E, H)),
               proj_w=rng.normal(0, 0.3, (E, C, H)), proj_b=rng.normal(0, 0.1, (E, C)))
    prm = {k: v.astype(np.float32) for k, v in prm.items()}
    x = rng.normal(0, 1.0, (N, C)).astype(np.float32)
    init = rng.normal(0, 1.0, (N, C)).astype(np.float32)
    dout = rng.normal(0, 1.0, (N, C)).astype(np.float32)
    with tempfile.TemporaryDirectory() as d:
        fin, fout = os.path.join(d, "in"), os.path.join(d, "out")
        with open(fin, "wb") as f:
            f.write(b"MOE1" + struct.pack("<5i3f", C, H, E, K, N, cf, coef, dloss))
            for k in ("gate", "fc_w", "fc_b", "proj_w", "proj_b"):
                f.write(prm[k].tobytes())
            for a in (x, init, dout):
                f.write(a.tobytes())
        subprocess.run([driver(), fin, fout], check=True)
        raw = open(fout, "rb").read()
    off = 0

    def take(n, dtype=np.float32):
        nonlocal off
        a = np.frombuffer(raw, dtype=dtype, count=n, offset=off)
        off += 4 * n
        return a

    aux = take(1)[0]
    out = take(N * C).reshape(N, C)
    expert = take(N * K, np.int32).reshape(N, K)
    slot = take(N * K, np.int32).reshape(N, K)
    weight = take(N * K).reshape(N, K)
    dx = take(N * C).reshape(N, C)
    grads = dict(gate=take(E * C).reshape(E, C), fc_w=take(E * H * C).reshape(E, H, C),
                 fc_b=take(E * H).reshape(E, H), proj_w=take(E * C * H).reshape(E, C, H),
                 proj_b=take(E * C).reshape(E, C))
    assert off == len(raw)
    ref = torch_moe(C, H, E, K, N, cf, coef, dloss, prm, x, init, dout)
    np.testing.assert_array_equal(expert, ref["expert"], err_msg="top-k experts differ")
    np.testing.assert_array_equal(slot, ref["slot"], err_msg="capacity slots / dropped choices differ")
    dropped = int((slot < 0).sum())
    print(f"\n{case}: capacity rule dropped {dropped} of {N * K} choices")
    if cf > 0 and cf < 1.1:
        assert dropped > 0, "the case was meant to drop choices"
    assert abs(aux - ref["aux"]) <= 1e-5 * abs(ref["aux"]), f"aux {aux} vs torch {ref['aux']}"
    compare("weight", weight, ref["weight"])
    compare("out", out, ref["out"])
    compare("dx", dx, ref["dx"])
    for k in grads:
        compare("d" + k, grads[k], ref["grads"][k])


# ---------------------------------------------------------------- the GPT with MoE blocks

def gpt_moe_torch(cfg, E, K, cf, coef):
    """model_torch_ref's GPT whose blocks' MLPs are MoE layers named and laid
    out as gpt_param_info lists them (expert stacks, then the router)."""
    import sys
    sys.path.insert(0, os.path.dirname(__file__))
    import model_torch_ref as ref

    C = cfg["d_model"]
    model = ref.GPT(cfg["n_layer"], cfg["n_head"], C, cfg["seq_len"], cfg["vocab"])
    auxes = []
    for blk in model.h:
        del blk.mlp.c_fc, blk.mlp.c_proj
        blk.mlp.experts = torch.nn.Module()
        blk.mlp.experts.c_fc = torch.nn.Linear(C, E * 4 * C)
        blk.mlp.experts.c_proj = torch.nn.Linear(4 * C, E * C)
        blk.mlp.gate = torch.nn.Linear(C, E, bias=False)

        def mlp_forward(x, blk=blk):
            shape = x.shape
            x = x.reshape(-1, C)
            N = x.shape[0]
            probs = torch.softmax(blk.mlp.gate(x), dim=-1)
            topv, topi = torch.topk(probs, K, dim=-1)
            w = topv / topv.sum(-1, keepdim=True) if K > 1 else topv
            cap = math.ceil(cf * K * N / E) if cf > 0 else N
            count, kept = [0] * E, np.zeros((N, K), dtype=bool)
            for i in range(K):
                for n in range(N):
                    e = int(topi[n, i])
                    if count[e] < cap:
                        kept[n, i] = True
                        count[e] += 1
            out = torch.zeros_like(x)
            fc, pj = blk.mlp.experts.c_fc, blk.mlp.experts.c_proj
            for e in range(E):
                rows = [(n, i) for n in range(N) for i in range(K) if int(topi[n, i]) == e and kept[n, i]]
                if not rows:
                    continue
                idx = torch.tensor([n for n, _ in rows])
                wi = torch.stack([w[n, i] for n, i in rows])
                h = x[idx] @ fc.weight[e * 4 * C:(e + 1) * 4 * C].T + fc.bias[e * 4 * C:(e + 1) * 4 * C]
                h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h.pow(3))))
                y = h @ pj.weight[e * C:(e + 1) * C].T + pj.bias[e * C:(e + 1) * C]
                out = out.index_add(0, idx, wi[:, None] * y)
            first = torch.nn.functional.one_hot(topi[:, 0], E).to(probs.dtype).mean(0)
            auxes.append(E * (first * probs.mean(0)).sum())
            return out.reshape(shape)

        blk.mlp_forward = mlp_forward
    return model, auxes


def test_gpt_moe_vs_torch(tmp_path):
    """The C GPT with MoE blocks (model_driver, GPTM version 2) against
    model_torch_ref's GPT with the MoE above: loss (cross-entropy + coef x
    aux), logits and every gradient, in float64 on the torch side."""
    cfg = dict(n_layer=2, n_head=2, d_model=16, seq_len=8, vocab=40)
    E, K, cf, coef, B, T = 4, 2, 1.0, 0.05, 2, 8
    torch.manual_seed(5)
    model, auxes = gpt_moe_torch(cfg, E, K, cf, coef)
    g = torch.Generator().manual_seed(9)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif "gate" in name:
                p.copy_(1.0 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    names = ["wte.weight", "wpe.weight"]
    for i in range(cfg["n_layer"]):
        names += [f"h.{i}.{s}" for s in ("ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                                          "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                                          "mlp.experts.c_fc.weight", "mlp.experts.c_fc.bias",
                                          "mlp.experts.c_proj.weight", "mlp.experts.c_proj.bias",
                                          "mlp.gate.weight")]
    names += ["ln_f.weight", "ln_f.bias"]
    params = dict(model.named_parameters())
    assert sorted(names) == sorted(params), "the torch model's parameters are not the C model's list"
    tokens = torch.randint(0, cfg["vocab"], (B, T), generator=g)
    targets = torch.randint(0, cfg["vocab"], (B, T), generator=g)
    fin = tmp_path / "in"
    with open(fin, "wb") as f:
        f.write(b"GPTM" + struct.pack("<I7i", 2, cfg["n_layer"], cfg["n_head"], cfg["d_model"], cfg["seq_len"],
                                      cfg["vocab"], B, T))
        f.write(struct.pack("<2i2f", E, K, cf, coef))
        for n in names:
            f.write(params[n].detach().numpy().astype("<f4").tobytes())
        f.write(tokens.numpy().astype("<i4").tobytes())
        f.write(targets.numpy().astype("<i4").tobytes())
    exe = os.path.join(os.path.dirname(driver()), "model_driver")
    subprocess.run([exe, str(fin), str(tmp_path / "out")], check=True)
    data = np.fromfile(tmp_path / "out", dtype="<f4")

    model = model.double()
    logits, ce = model(tokens, targets)
    loss = ce + coef * sum(auxes)
    loss.backward()
    c_loss = float(data[0])
    assert abs(c_loss - loss.item()) <= 1e-5 * max(1.0, abs(loss.item())), f"loss {c_loss} vs torch {loss.item()}"
    print(f"\nGPT MoE: loss {c_loss:.6f} (torch {loss.item():.6f}, aux {sum(a.item() for a in auxes):.4f})")
    n = B * T * cfg["vocab"]
    compare("logits", data[1:1 + n].reshape(B, T, -1), logits.detach().numpy())
    off = 1 + n
    for name in names:
        p = params[name]
        compare("d " + name, data[off:off + p.numel()].reshape(p.shape), p.grad.numpy())
        off += p.numel()
    assert off == data.size
