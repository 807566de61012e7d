"""Run by torch_cuda_check.py on real ranks:
    tests/mpirun.sh 2 python3 torch_cuda_worker.py OUT_DIR cpu|cuda [BACKEND]

Trains torch_gpt's GPT with zero.torch at stages 0-3 for ZT_STEPS (5) steps
on each rank's own micro-batches, on the CPU engine (MPI comm) or on the
CUDA engine (BACKEND: staged, the default, lets the ranks share one GPU;
nccl needs a GPU per rank), and writes rank 0's final full parameters
(OUT_DIR/<device>-stage<s>.pt) and every rank's losses, step results and
zero-copy facts ($ZERO_RESULT_DIR/rank-<r>.json)."""
import json
import os
import sys

import torch

import torch_gpt as tg
import zero
import zero.torch as zt

OUT, DEVICE = sys.argv[1], sys.argv[2]
BACKEND = sys.argv[3] if len(sys.argv) > 3 else "staged"
STEPS = int(os.environ.get("ZT_STEPS", "5"))
torch.set_num_threads(1)
torch.backends.cuda.matmul.allow_tf32 = False  # fp32 GEMMs on both devices (torch's default, said here)


def config(stage):
    # as torch_worker.py: small buckets, a low persistence threshold, prefetch at stage 3
    return {"zero_optimization": {"stage": stage, "reduce_bucket_size": 3000, "allgather_bucket_size": 3000,
                                  "stage3_param_persistence_threshold": 200, "overlap_comm": stage == 3},
            "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                                       "weight_decay": 0.1}},
            "gradient_clipping": 0.78}


cuda = DEVICE == "cuda"
with zero.Comm.world(backend=BACKEND if cuda else "mpi") as world:
    rank = world.rank
    dev = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    out = {"rank": rank, "size": world.size, "device": str(dev)}
    for stage in range(4):
        zm = zt.wrap(tg.make("gpt"), config(stage), comm=world, wrap_policy={tg.Block}, device=dev)
        facts = {}
        if cuda:
            # parameters are CUDA tensors over the engine's device buffers (not copies)
            unit = zm._units[0]
            p, ep = unit.params[0][1], unit.eng_params[0]
            facts["param_is_cuda"] = all(q.is_cuda for q in zm.module.parameters())
            if stage < 3:
                facts["param_zero_copy"] = p.data_ptr() == zm.engine.param_data_device(ep).ptr
        losses, results = [], []
        for s in range(STEPS):
            tokens, targets = tg.batch(s, rank)
            loss = zm(tokens.to(dev), targets.to(dev))
            zm.backward(loss)
            r = zm.step()
            losses.append(float(loss))
            results.append([r.grad_norm, r.clip_coef, r.step])
        full = zm.full_parameters()
        out[f"stage{stage}"] = {"losses": losses, "results": results, **facts}
        if rank == 0:
            torch.save(full, os.path.join(OUT, f"{DEVICE}-stage{stage}.pt"))
        zm.close()
    with open(os.path.join(os.environ["ZERO_RESULT_DIR"], f"rank-{rank}.json"), "w") as f:
        json.dump(out, f)
