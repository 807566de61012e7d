"""PyTorch peer of tests/model/model_bench.c: the same model (model_torch_ref.GPT)
and batch, forward+backward timed the same way. Not a test.
  model_bench_torch.py [n_layer n_head d_model seq batch vocab iters]   (threads: OMP_NUM_THREADS)"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
import model_torch_ref as ref  # noqa: E402

a = [4, 4, 256, 128, 8, 256, 10]
for i, v in enumerate(sys.argv[1:8]):
    a[i] = int(v)
L, H, C, T, B, V, iters = a
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
model = ref.GPT(L, H, C, T, V)
tok = torch.randint(0, V, (B, T))
tgt = torch.randint(0, V, (B, T))
tf = tb = tot = 0.0
best = 1e30
for it in range(iters + 2):
    model.zero_grad(set_to_none=False)
    if it == 2:
        cpu0 = time.process_time()
    t0 = time.perf_counter()
    _, loss = model(tok, tgt)
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    if it >= 2:
        tf += t1 - t0
        tb += t2 - t1
        tot += t2 - t0
        best = min(best, t2 - t0)
cpu = time.process_time() - cpu0
print(f"torch model L{L} H{H} C{C} T{T} B{B} V{V}: fwd {1e3*tf/iters:.2f} ms, bwd {1e3*tb/iters:.2f} ms, "
      f"fwd+bwd mean {1e3*tot/iters:.2f} ms (best {1e3*best:.2f}), {B*T*iters/tot:.0f} tokens/s, "
      f"cpu {1e3*cpu/iters:.2f} ms/iter "
      f"[{torch.get_num_threads()} threads]")
