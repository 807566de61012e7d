"""No leak over 1,000 create/destroy cycles.

Each cycle creates a local comm and a stage-3 engine, registers two modules,
finalizes, runs one gathered micro-step with grad views and a step, takes a
memory report, and closes everything. After the warm-up cycles (allocator
arenas, import caches, and the library's ring of retired handles: destroyed
comms and engines are kept, up to ZERO_HANDLE_RETIRED_MAX = 1024 of them, so
that a second destroy or a call on a stale handle is recognised rather than
a use-after-free; each cycle retires at least one, so 1024 cycles fill it and
from then on each retirement frees the oldest), 1,000 more may grow the resident set by at most
1 MiB, i.e. ~1 KiB per cycle: far less than one engine's own allocations
(~10 KiB of buffers and bookkeeping here), so a per-cycle leak of any engine
structure fails it. Python-side, tracemalloc must see < 64 KiB growth and no
resource may remain registered."""
import gc
import os
import tracemalloc

import numpy as np

import zero_testlib  # noqa: F401

CYCLES = 1000
WARMUP = 100 + 1024  # + common/handle.h's ZERO_HANDLE_RETIRED_MAX: see above
RSS_BOUND = 1 << 20
PY_BOUND = 64 << 10


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def cycle(zero, w1, b1):
    with zero.Comm.world(backend="local") as world:
        with zero.Engine(world, {"zero_optimization": {"stage": 3, "reduce_bucket_size": 256,
                                                       "stage3_param_persistence_threshold": 16}}) as eng:
            m1 = eng.add_module("m1", {"w": w1, "b": b1})
            m2 = eng.add_module("m2", {"w": (32, 8)})
            eng.finalize()
            for m in (m1, m2):
                with eng.gathered(m) as P:
                    float(P["w"].sum())
            for m in (m2, m1):
                with eng.grads(m) as G:
                    G["w"] += 0.5
            eng.step()
            eng.memory_report()


def test_no_leak_over_1000_cycles(zero_mod):
    w1 = np.ones((16, 32), np.float32)
    b1 = np.zeros(32, np.float32)
    for _ in range(WARMUP):
        cycle(zero_mod, w1, b1)
    gc.collect()
    tracemalloc.start()
    py0 = tracemalloc.get_traced_memory()[0]
    rss0 = rss_bytes()
    for _ in range(CYCLES):
        cycle(zero_mod, w1, b1)
    gc.collect()
    rss1 = rss_bytes()
    py1 = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    print(f"RSS growth over {CYCLES} cycles: {rss1 - rss0} bytes; Python heap growth {py1 - py0} bytes")
    assert rss1 - rss0 <= RSS_BOUND, f"RSS grew {rss1 - rss0} bytes over {CYCLES} cycles"
    assert py1 - py0 <= PY_BOUND, f"Python heap grew {py1 - py0} bytes over {CYCLES} cycles"
    from zero import _resource
    assert not [r for r in _resource._live.values() if r.native_alive and not (r._kind == "comm" and r._deps)]
