"""zero.torch on the CUDA engine against the CPU engine (a GPU check).

    ZERO_BUILD_ROOT=<build> python3 bindings/python/tests/torch_cuda_check.py [nccl|staged]

Runs torch_cuda_worker.py on 2 ranks twice, on the CPU engine (MPI) and on
the CUDA engine (STAGED by default: both ranks share one GPU), 5 steps of
torch_gpt's GPT at stages 0-3 each, and checks:
  * on CUDA every parameter is a CUDA tensor, at stages 0-2 over the
    engine's own device buffer (the same address: zero-copy);
  * each stage's final parameters within TOL of the CPU engine's, per
    tensor: max|cuda - cpu| / max|cpu| <= 1e-4 (fp32 both; torch's CPU and
    CUDA kernels sum in different orders, ~1e-6 relative per op, and five
    AdamW steps carry that at most ~100x here - the CPU engine against
    plain torch holds 1e-6 after 20 steps, test_torch_wrap.py);
  * every step's loss within 1e-4 relative, the clip coefficients within 1e-4;
  * the CUDA stages agree with each other within the same TOL (reported:
    bitwise or not).
Prints `FIGURES {...}` (run_gpu_tests.sh records them). Exit 0 pass, 1 fail,
77 when this python's torch has no CUDA or sees no GPU (a skip).
Used by tests/gpu/run_gpu_tests.sh and by test_torch_cuda.py."""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
TOL = 1e-4
N = 2


def run(device, out, backend):
    build = os.environ.get("ZERO_BUILD_ROOT")
    pp = [os.path.join(build, "bindings", "python")] if build else []
    with tempfile.TemporaryDirectory(prefix="zero_tc_") as rdir:
        env = dict(os.environ, ZERO_RESULT_DIR=rdir,
                   PYTHONPATH=os.pathsep.join(pp + [HERE] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
        cmd = [os.path.join(REPO, "tests", "mpirun.sh"), str(N), sys.executable,
               os.path.join(HERE, "torch_cuda_worker.py"), out, device, backend]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            print(p.stdout[-4000:], p.stderr[-4000:], sep="\n")
            raise SystemExit(f"torch_cuda_check: the {device} run failed (rc {p.returncode}): {' '.join(cmd)}")
        return {r: json.load(open(os.path.join(rdir, f"rank-{r}.json"))) for r in range(N)}


def rel(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def main():
    try:
        import torch
    except ImportError:
        print("torch_cuda_check: this python has no torch; skipped")
        return 77
    if not torch.cuda.is_available():
        print(f"torch_cuda_check: torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU; skipped")
        return 77
    build = os.environ.get("ZERO_BUILD_ROOT")
    if build:
        sys.path.insert(0, os.path.join(build, "bindings", "python"))
    try:
        import zero
    except ImportError as e:
        print(f"torch_cuda_check: {sys.executable} (torch {torch.__version__}) cannot import the build's zero "
              f"bindings ({e}): they are built for meson's python (-Dpython=) and need cffi and numpy")
        return 1
    if not zero.cuda_handles_available():
        print("torch_cuda_check: the loaded libzero was built without CUDA")
        return 1
    backend = sys.argv[1] if len(sys.argv) > 1 else "staged"
    fails, figures = [], {}
    with tempfile.TemporaryDirectory(prefix="zero_tc_out_") as out:
        cpu, gpu = run("cpu", out, backend), run("cuda", out, backend)
        worst, stage_diff, bitwise = 0.0, 0.0, True
        base = torch.load(os.path.join(out, "cuda-stage0.pt"))
        for s in range(4):
            got = torch.load(os.path.join(out, f"cuda-stage{s}.pt"))
            want = torch.load(os.path.join(out, f"cpu-stage{s}.pt"))
            for n, w in want.items():
                e = rel(got[n], w)
                worst = max(worst, e)
                if e > TOL:
                    fails.append(f"stage {s}, {n}: max|cuda - cpu|/max|cpu| = {e:.3g} > {TOL}")
                d = rel(got[n], base[n])
                stage_diff = max(stage_diff, d)
                bitwise = bitwise and torch.equal(got[n], base[n])
                if d > TOL:
                    fails.append(f"stage {s} vs stage 0 on CUDA, {n}: {d:.3g} > {TOL}")
            for r in range(N):
                g, c = gpu[r][f"stage{s}"], cpu[r][f"stage{s}"]
                if not g.get("param_is_cuda"):
                    fails.append(f"stage {s} rank {r}: a parameter is not a CUDA tensor")
                if s < 3 and not g.get("param_zero_copy"):
                    fails.append(f"stage {s} rank {r}: the parameter tensor is not over the engine's device buffer")
                for k, (lg, lc) in enumerate(zip(g["losses"], c["losses"])):
                    if abs(lg - lc) > TOL * abs(lc):
                        fails.append(f"stage {s} rank {r} step {k + 1}: loss {lg} on CUDA vs {lc} on the CPU")
                for k, (rg, rc) in enumerate(zip(g["results"], c["results"])):
                    if abs(rg[1] - rc[1]) > TOL * rc[1] or rg[2] != rc[2]:
                        fails.append(f"stage {s} rank {r} step {k + 1}: step result {rg} on CUDA vs {rc}")
        figures = {"torch_cuda_vs_cpu_max_rel": worst, "torch_cuda_stages_max_rel": stage_diff,
                   "torch_cuda_stages_bitwise": int(bitwise)}
    print("FIGURES " + json.dumps(figures))
    for f in fails[:20]:
        print("FAIL:", f)
    print(f"torch_cuda_check: {'FAILED' if fails else 'passed'} (tolerance {TOL}, {len(fails)} failure(s))")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
