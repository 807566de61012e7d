"""One system of the peer benchmark (bench_peers.py runs it; not a test).

    [mpirun -np 2] VENV/bin/python peer_worker.py SYSTEM STAGE SPEC.json OUT_DIR

SYSTEM: torch (one process: both ranks' micro-batches accumulated), zero_torch,
deepspeed, fsdp2 (two ranks each); torch_2proc (two ranks, each plain torch on
its own micro-batch, no communication: bench_peers' control). Every system trains the same job as
zero-train: tests/python/model_torch_ref.GPT (zero-train's model: GPT-2
layout, tied head), initialised with zero-train's values (gpt_param_init_spec
through zero.init.generate), fed zero-train's samples in zero-train's order
(its splitmix64 Fisher-Yates permutation of the corpus windows, rank r taking
global samples consumed + r*micro ...), torch.optim.AdamW (or the engine's
AdamW) with zero-train's betas/eps/weight decay, clipping at 1.0 and its
WarmupCosineLR (linear warmup) schedule (the lr of each step taken from
zero-train's metrics when it ran first), fp32, one thread per rank. Writes
OUT_DIR/rank-<r>.json: per-step losses (this rank's micro-batch mean; the
torch system writes the global mean), wall and CPU seconds per step, peak RSS."""
import json
import math
import os
import resource
import sys
import time

SYSTEM, STAGE, SPEC, OUT = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SRC, "tests", "python"))
with open(SPEC) as f:
    spec = json.load(f)
sys.path.insert(0, os.path.join(spec["build"], "bindings", "python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import model_torch_ref as ref  # noqa: E402
import zero  # noqa: E402  (init values only, unless SYSTEM is zero_torch)

torch.set_num_threads(1)
M = spec["model"]
RANK = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
WORLD = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
DP = spec["ranks"]
MICRO = spec["micro"]
STEPS = spec["steps"]
OPT = spec["optimizer"]


# ------------------------------------------------------------------ zero-train's init
def init_model():
    model = ref.GPT(**{k: M[k] for k in ("n_layer", "n_head", "d_model", "seq_len", "vocab")})
    std = np.float32(0.02)
    resid = np.float32(std / np.sqrt(np.float32(2.0 * M["n_layer"]), dtype=np.float32))
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name in ref.param_names(M["n_layer"]):
            p = params[name]
            if name.endswith(("ln_1.weight", "ln_2.weight")) or name == "ln_f.weight":
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                s = float(resid) if name.endswith(("attn.c_proj.weight", "mlp.c_proj.weight")) else float(std)
                v = zero.init.generate(zero.init.normal(s, seed=spec["seed"]), name, 0, p.numel())
                p.copy_(torch.from_numpy(v).view(p.shape))
    return model


# ------------------------------------------------------------------ zero-train's data
M64 = (1 << 64) - 1


def splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & M64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return state, z ^ (z >> 31)


def make_perm(n, seed, epoch):
    s = ((seed * 0x2545F4914F6CDD1D) & M64) ^ (((epoch + 1) * 0x9E3779B97F4A7C15) & M64)
    perm = list(range(n))
    for i in range(n - 1, 0, -1):
        s, r = splitmix64(s)
        j = (r * (i + 1)) >> 64
        perm[i], perm[j] = perm[j], perm[i]
    return perm


CORPUS = np.fromfile(spec["corpus"], dtype=np.uint8)
W = M["seq_len"] + 1
NWIN = CORPUS.size // W
_perms = {}


def window(j):
    e = j // NWIN
    if e not in _perms:
        _perms[e] = make_perm(NWIN, spec["seed"], e)
    return _perms[e][j % NWIN]


def micro_batch(step, rank):
    first = step * MICRO * DP + rank * MICRO
    rows = [CORPUS[window(first + b) * W:(window(first + b) + 1) * W].astype(np.int64) for b in range(MICRO)]
    a = torch.from_numpy(np.stack(rows))
    return a[:, :-1].contiguous(), a[:, 1:].contiguous()


# ------------------------------------------------------------------ zero-train's schedule
def lr_at(step):
    if "lrs" in spec:  # zero-train's own per-step lr (its metrics), when it ran first
        return spec["lrs"][step]
    s = spec["scheduler"]
    base = OPT["lr"]
    if step < s["warmup_num_steps"]:
        ratio = s["warmup_min_ratio"] + (1.0 - s["warmup_min_ratio"]) * step / s["warmup_num_steps"]
    else:
        real_last = step - s["warmup_num_steps"] + 1
        real_total = s["total_num_steps"] - s["warmup_num_steps"]
        c = (1.0 + math.cos(math.pi * real_last / (real_total if real_total > 0 else 1.0))) / 2.0
        ratio = max(0.0, s["cos_min_ratio"] + (1.0 - s["cos_min_ratio"]) * c)
    return base * ratio


def adamw(params):
    return torch.optim.AdamW(params, lr=lr_at(0), betas=tuple(OPT["betas"]), eps=OPT["eps"],
                             weight_decay=OPT["weight_decay"])


def set_lr(opt, lr):
    for g in opt.param_groups:
        g["lr"] = lr


def dist_init():
    import torch.distributed as dist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.update(RANK=str(RANK), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(RANK), LOCAL_WORLD_SIZE=str(WORLD))
    dist.init_process_group("gloo", rank=RANK, world_size=WORLD)
    return dist


# ------------------------------------------------------------------ the systems
def run():
    model = init_model()
    losses, wall, cpu = [], [], []
    if SYSTEM in ("torch", "torch_2proc"):
        # torch_2proc (bench_peers' control): each of 2 processes trains its own micro-batch, no communication
        mine = range(DP) if SYSTEM == "torch" else [RANK]
        opt = adamw(model.parameters())
        for s in range(STEPS):
            t0, c0 = time.perf_counter(), time.process_time()
            set_lr(opt, lr_at(s))
            tot = 0.0
            for r in mine:
                _, loss = model(*micro_batch(s, r))
                loss.backward()
                tot += float(loss)
            for p in model.parameters():
                p.grad.mul_(1.0 / len(mine))
            torch.nn.utils.clip_grad_norm_(model.parameters(), spec["clip"])
            opt.step()
            opt.zero_grad(set_to_none=True)
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            losses.append(tot / len(mine))
    elif SYSTEM == "zero_torch":
        import zero.torch as zt
        cfg = {"zero_optimization": dict(spec["zero_optimization"], stage=STAGE),
               "optimizer": {"type": "AdamW", "params": OPT}, "gradient_clipping": spec["clip"]}
        eng = zt.wrap(model, cfg, wrap_policy={ref.Block}, lr_schedule=lr_at)
        for s in range(STEPS):
            t0, c0 = time.perf_counter(), time.process_time()
            _, loss = eng(*micro_batch(s, RANK))
            eng.backward(loss)
            eng.step()
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            losses.append(float(loss))
        eng.close()
    elif SYSTEM == "deepspeed":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import deepspeed
        dist_init()
        ds_cfg = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 1,
                  "gradient_clipping": spec["clip"], "zero_allow_untested_optimizer": True,
                  "zero_optimization": dict(spec["zero_optimization"], stage=STAGE),
                  "steps_per_print": 1 << 30, "wall_clock_breakdown": False}
        engine, opt, _, _ = deepspeed.initialize(model=model, optimizer=adamw(model.parameters()), config=ds_cfg)
        for s in range(STEPS):
            t0, c0 = time.perf_counter(), time.process_time()
            set_lr(opt, lr_at(s))
            _, loss = engine(*micro_batch(s, RANK))
            engine.backward(loss)
            engine.step()
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            losses.append(float(loss))
    elif SYSTEM == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        dist = dist_init()
        for b in model.h:
            fully_shard(b)
        fully_shard(model)
        opt = adamw(model.parameters())
        for s in range(STEPS):
            t0, c0 = time.perf_counter(), time.process_time()
            set_lr(opt, lr_at(s))
            _, loss = model(*micro_batch(s, RANK))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), spec["clip"])
            opt.step()
            opt.zero_grad(set_to_none=True)
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            losses.append(float(loss))
        dist.destroy_process_group()
    else:
        raise SystemExit(f"peer_worker: unknown system {SYSTEM!r}")
    out = dict(system=SYSTEM, stage=STAGE, rank=RANK, losses=losses, step_s=wall, cpu_s=cpu,
               rss_peak=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, torch=torch.__version__)
    if SYSTEM == "deepspeed":
        import deepspeed
        out["deepspeed"] = deepspeed.__version__
    with open(os.path.join(OUT, f"rank-{RANK}.json"), "w") as f:
        json.dump(out, f)


run()
