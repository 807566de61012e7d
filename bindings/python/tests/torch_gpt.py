"""Small GPTs made of stock torch.nn modules, for the zero.torch tests.

GPT: nn.Embedding, nn.LayerNorm, nn.Linear blocks with causal attention
written out. Its query/key/value projection has no bias: a key bias gets an
exactly-zero gradient in exact arithmetic (softmax does not see a shift
shared by all keys), so in floating point it receives rounding noise that
AdamW's normalisation turns into lr-sized updates in whatever direction the
noise points - no two implementations could agree on it to 1e-6.

EncoderGPT: nn.TransformerEncoderLayer blocks (nn.MultiheadAttention inside),
for the stage-3 hooks on a module that torch wrote."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d_model, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model)
        self.ln_2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.out = nn.Linear(4 * d_model, d_model)

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.qkv(self.ln_1(x)).split(C, dim=2)
        q, k, v = (z.view(B, T, self.n_head, hs).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=x.device).tril(), float("-inf"))
        y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, n_layer=2, n_head=2, d_model=32, seq_len=16, vocab=64):
        super().__init__()
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, tokens, targets):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class EncoderGPT(nn.Module):
    def __init__(self, n_layer=2, n_head=2, d_model=32, seq_len=16, vocab=64):
        super().__init__()
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, n_head, 4 * d_model, dropout=0.0, activation="gelu",
                                       batch_first=True, norm_first=True) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, tokens, targets):
        T = tokens.shape[1]
        mask = torch.triu(torch.full((T, T), float("-inf"), device=tokens.device), diagonal=1)
        x = self.wte(tokens) + self.wpe(torch.arange(T, device=tokens.device))
        for b in self.blocks:
            x = b(x, src_mask=mask)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def make(kind, seed=0, **shape):
    torch.manual_seed(seed)
    return (GPT if kind == "gpt" else EncoderGPT)(**shape)


def batch(step, rank, micro=2, seq_len=16, vocab=64):
    """Rank `rank`'s micro-batch of step `step` (the same on every process)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return (torch.randint(0, vocab, (micro, seq_len), generator=g),
            torch.randint(0, vocab, (micro, seq_len), generator=g))
