"""zero.torch with a bf16 engine on the CPU, one rank: wrap gives
the parameters the engine's dtype, every micro-step's gradients reach the
engine through the AccumulateGrad hooks (one grads_ready per unit per
micro-step, issued by the unit's last gradient during backward, not by the
end-of-backward fallback), and the accumulated gradient is torch's fp32 one
within bf16 tolerance.

It would have caught: wrap failing outright at bf16 on the CPU (torch's
from_numpy refuses numpy's uint16 bit patterns), and torch dropping the
hooked AccumulateGrad node when wrap swapped .data from fp32 to bf16 (every
hook silent; grads_ready only from the fallback after backward, so no
overlap, and a gradient autograd made outside a unit's outputs would not
have been added to the engine's buffer)."""
import pytest

torch = pytest.importorskip("torch")

GAS = 3      # micro-steps per optimizer step
STEPS = 2    # optimizer steps (stages 2-3 hand out fresh gradient buffers each micro-step)
# max |zero - torch| / max |torch| per tensor. bf16 rounds to 2^-9 relative (0.2%) at every activation,
# weight copy and gradient, and here chains of them meet: 1.3% is the worst measured (every stage; most
# tensors 0.3-0.7%). A lost or doubled micro-step would be 33% off (1 of GAS = 3).
TOL = 3e-2


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 16)

    def forward(self, x):
        return x + self.fc2(torch.tanh(self.fc1(x)))


def make_model():
    torch.manual_seed(1234)
    return torch.nn.Sequential(Block(), Block(), torch.nn.Linear(16, 4))  # the Linear: the root unit's


def batches():
    g = torch.Generator().manual_seed(99)
    return [torch.randn(8, 16, generator=g) for _ in range(STEPS * GAS)]


def loss_of(out):
    return out.float().pow(2).mean()


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_bf16_grads_through_the_hooks(zero_mod, world, stage):
    """(fp16 takes the same path, but torch 1.13 has no fp16 matmul on the CPU.)"""
    import zero.torch as zt
    torch.set_num_threads(1)
    tdtype = torch.bfloat16
    # SGD with lr 1, no momentum, decay or clipping: each step moves the fp32
    # master by exactly minus the engine's accumulated gradient (the mean of
    # the GAS micro-steps'), which is what is compared.
    cfg = {"zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
           "optimizer": {"type": "SGD", "params": {"lr": 1.0, "momentum": 0.0, "weight_decay": 0.0}},
           "gradient_clipping": 0.0, "gradient_accumulation_steps": GAS, "bf16": {"enabled": True}}
    zm = zt.wrap(make_model(), cfg, comm=world, wrap_policy={Block})
    try:
        assert all(p.dtype == tdtype for p in zm.module.parameters() if p.numel())
        units = zm._units
        calls = []  # (unit index, during backward, gradients the unit's hooks counted)
        index = {u.eng_module: k for k, u in enumerate(units)}
        real = zm.engine.grads_ready

        def spy(mod):
            u = units[index[mod]]
            calls.append((index[mod], zm._in_backward, u.done))
            return real(mod)
        zm.engine.grads_ready = spy

        ref = make_model()
        with torch.no_grad():  # torch in fp32 on the weights the engine computes with (bf16-rounded)
            for p in ref.parameters():
                p.copy_(p.to(tdtype).float())
        xs = batches()
        before = {n: v.clone() for n, v in zm.full_parameters().items()}
        worst = 0.0
        for s in range(STEPS):
            for ref_p in ref.parameters():
                ref_p.grad = None
            for m in range(GAS):
                x = xs[s * GAS + m]
                calls.clear()
                zm.backward(loss_of(zm(x.to(tdtype))))
                # one grads_ready per unit, each issued by its own last hook during backward
                assert sorted(k for k, _, _ in calls) == list(range(len(units))), (s, m, calls)
                for k, during, done in calls:
                    assert during and done == len(units[k].params), \
                        f"step {s} micro {m}: unit '{units[k].name}' grads_ready with {done} of " \
                        f"{len(units[k].params)} hooks counted, during backward: {during}"
                loss_of(ref(x.to(tdtype).float())).backward()
                result = zm.step()
                assert (result is None) == (m < GAS - 1)
            after = zm.full_parameters()
            grads = {n: p.grad / GAS for n, p in ref.named_parameters()}
            for n, want in grads.items():
                got = before[n] - after[n]  # lr 1: the engine's averaged gradient
                err = float((got - want).abs().max() / want.abs().max())
                worst = max(worst, err)
                assert err <= TOL, f"stage {stage} step {s + 1}, {n}: max|zero - torch|/max|torch| = " \
                                   f"{err:.3g} > {TOL}"
            with torch.no_grad():  # the reference continues from the engine's weights, as the engine computes
                for n, p in ref.named_parameters():
                    p.copy_(after[n].to(tdtype).float())
            before = after
        print(f"stage {stage}: worst gradient error {worst:.3g} of max|torch| (bound {TOL})")
    finally:
        zm.close()
