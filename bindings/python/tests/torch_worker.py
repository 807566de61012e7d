"""Run by test_torch_wrap.py on real ranks (tests/mpirun.sh 2 python3 torch_worker.py OUT_DIR).

Trains the stock-torch GPTs of torch_gpt.py with zero.torch at stages 0-3 on
each rank's own micro-batches and writes what the test compares: per stage
a hash of the final full parameters (every rank; the encoder GPT at stages
0 and 3 only, 4 steps), rank 0's final parameters
(OUT_DIR/<model>-stage<s>.pt), the step results, the memory reports and a
stage-3 checkpoint loaded at stage 1."""
import hashlib
import json
import os
import sys

import torch

import torch_gpt as tg
import zero
import zero.torch as zt

OUT = sys.argv[1]
STEPS = int(os.environ.get("ZT_STEPS", "20"))
torch.set_num_threads(1)
# about half of the 20 steps clip (their norms are 0.73-0.82)
CLIP = 0.78
POLICY = {"gpt": {tg.Block}, "encoder": {torch.nn.TransformerEncoderLayer}}


def config(stage):
    # Small buckets (split parameters, several buckets per unit) and a low
    # persistence threshold, so stage 3 really gathers; prefetch at stage 3.
    return {"zero_optimization": {"stage": stage, "reduce_bucket_size": 3000, "allgather_bucket_size": 3000,
                                  "stage3_param_persistence_threshold": 200, "overlap_comm": stage == 3},
            "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                                       "weight_decay": 0.1}},
            "gradient_clipping": CLIP}


def sha(params):
    h = hashlib.sha256()
    for n in sorted(params):
        h.update(n.encode())
        h.update(params[n].numpy().tobytes())
    return h.hexdigest()


with zero.Comm.world() as world:
    rank = world.rank
    out = {"rank": rank, "size": world.size, "torch_in_sys_modules_before": None}
    for kind in ("gpt", "encoder"):
        steps = STEPS if kind == "gpt" else 4
        for stage in (range(4) if kind == "gpt" else (0, 3)):  # nn.MultiheadAttention under the stage-3 hooks
            zm = zt.wrap(tg.make(kind), config(stage), comm=world, wrap_policy=POLICY[kind])
            results, losses = [], []
            for s in range(steps):
                loss = zm(*tg.batch(s, rank))
                zm.backward(loss)
                r = zm.step()
                losses.append(float(loss))
                results.append([r.grad_norm, r.clip_coef, r.step])
            full = zm.full_parameters()
            key = f"{kind}-stage{stage}"
            out[key] = {"sha": sha(full), "results": results, "losses": losses, "memory": zm.memory_report(),
                        "units": zm.units, "shapes_after": sorted({tuple(p.shape) for p in zm.module.parameters()})}
            if rank == 0:
                torch.save(full, os.path.join(OUT, key + ".pt"))
            if kind == "gpt" and stage == 3:
                step_dir = zm.save_checkpoint(os.path.join(OUT, "ckpt"))
                zm.close()
                # resume at stage 1: the same values, one more step identical to stage 3's
                z1 = zt.wrap(tg.make(kind, seed=99), config(1), comm=world, wrap_policy=POLICY[kind])
                loaded = z1.load_checkpoint(step_dir)
                out["ckpt"] = {"step": loaded.step, "sha_loaded": sha(z1.full_parameters()),
                               "data_is_view": all(p.data.data_ptr() == z1._data[p].data_ptr()
                                                   for p in z1.module.parameters())}
                z1.close()
            else:
                zm.close()
    with open(os.path.join(os.environ["ZERO_RESULT_DIR"], f"rank-{rank}.json"), "w") as f:
        json.dump(out, f)
