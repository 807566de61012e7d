"""zero.torch's CUDA door: what the CPU can check (the
__cuda_array_interface__ of device views for each dtype, refusals by name
where CUDA is missing), and the real thing on a GPU (skipped without one):
the CUDA engine against the CPU engine (torch_cuda_check.py)."""
import os
import subprocess
import sys

import pytest

from zero_testlib import PYTHONPATH, SKIP_REASON

torch = pytest.importorskip("torch")
import torch_gpt as tg  # noqa: E402  (needs torch)

HERE = os.path.dirname(os.path.abspath(__file__))
CFG = {"zero_optimization": {"stage": 1}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}


@pytest.mark.parametrize("dtype,typestr,itemsize", [("f32", "<f4", 4), ("f16", "<f2", 2), ("bf16", "<u2", 2),
                                                    ("f64", "<f8", 8), ("i32", "<i4", 4), ("i64", "<i8", 8),
                                                    ("u8", "|u1", 1)])
def test_device_array_interface_per_dtype(zero_mod, dtype, typestr, itemsize):
    """Version 3 of the interface: C-contiguous (strides None), the read-only
    flag, the stream (1 for the legacy default stream: the interface reserves 0)."""
    from zero._arrays import zero_dtype
    ptr = 0x7F0012345600
    a = zero_mod.DeviceArray(ptr, (3, 5), zero_dtype(dtype))
    assert a.__cuda_array_interface__ == {"version": 3, "shape": (3, 5), "typestr": typestr, "data": (ptr, True),
                                          "strides": None, "stream": 1}
    assert (a.size, a.itemsize, a.nbytes) == (15, itemsize, 15 * itemsize)
    w = zero_mod.DeviceArray(ptr, [7], zero_dtype(dtype), stream=0xABC0, writable=True)
    cai = w.__cuda_array_interface__
    assert cai["shape"] == (7,) and cai["data"] == (ptr, False) and cai["stream"] == 0xABC0
    # an empty array carries no address
    assert zero_mod.DeviceArray(ptr, (0, 4), zero_dtype(dtype)).__cuda_array_interface__["data"] == (0, True)


def test_device_views_refused_on_a_cpu_engine(zero_mod, world):
    with zero_mod.Engine(world, CFG) as eng:
        fc = eng.add_module("fc", {"w": (4, 3)})
        eng.finalize()
        w = fc.params["w"]
        with pytest.raises(zero_mod.ZeroUnsupportedError, match=r"parameter device view of 'fc.w': the engine's "
                                                                r"memory is on the cpu device; use the numpy views"):
            eng.param_data_device(w)
        with pytest.raises(zero_mod.ZeroUnsupportedError, match="gradient device view of 'fc.w'.*cpu device"):
            eng.param_grad_device(w)
        with pytest.raises(zero_mod.ZeroUnsupportedError, match="set_compute_stream: the engine's device is cpu; "
                                                                 r"a CUDA stream needs a CUDA engine"):
            eng.set_compute_stream(0x1234)
        assert eng.live_views == 0 and eng.compute_stream == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="torch has CUDA here: the refusal is not reached")
@pytest.mark.parametrize("device", ["cuda", "cuda:1", torch.device("cuda", 0)])
def test_wrap_on_cuda_refused_by_name_when_torch_has_no_cuda(zero_mod, device):
    import zero.torch as zt
    with pytest.raises(zero_mod.ZeroUnsupportedError,
                       match=r"zero.torch.wrap: device .*torch.cuda.is_available\(\) is False \(this torch "
                             r"(was built without CUDA|\(CUDA [0-9.]+\) sees no GPU)\); use device='cpu'"):
        zt.wrap(tg.make("gpt"), CFG, device=device)


def test_wrap_device_misuse_named(zero_mod):
    import zero.torch as zt
    with pytest.raises(zero_mod.ZeroUnsupportedError, match="runs on the CPU or a CUDA GPU, not on meta"):
        zt.wrap(tg.make("gpt"), CFG, device="meta")
    with pytest.raises(zero_mod.ZeroInvalidArgumentError, match="device 'gpu0' is not a torch device"):
        zt.wrap(tg.make("gpt"), CFG, device="gpu0")


def test_wrap_on_cpu_by_name_is_the_default(zero_mod, world):
    """device='cpu' is the CPU engine, parameters over its host buffers as before."""
    import zero.torch as zt
    with zt.wrap(tg.make("gpt"), CFG, comm=world, device="cpu") as zm:
        assert zm.device == torch.device("cpu") and zm.engine.device.kind == "cpu"
        p = zm.module.head.weight
        assert p.data_ptr() == zm._data[p].data_ptr() and not p.is_cuda


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA GPU (a GPU check: "
                                                          "tests/gpu/run_gpu_tests.sh runs torch_cuda_check.py)")
def test_cuda_engine_matches_the_cpu_engine():
    if SKIP_REASON:
        pytest.skip(SKIP_REASON)
    p = subprocess.run([sys.executable, os.path.join(HERE, "torch_cuda_check.py")], capture_output=True, text=True,
                       timeout=900, env=dict(os.environ, PYTHONPATH=PYTHONPATH))
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-3000:]
