"""Single-rank behaviour of `import zero`: config, engine, views and their
lifetime, exceptions carrying libzero's messages, the memory report against
the C formula, checkpoints."""
import json

import numpy as np
import pytest

import zero_testlib  # noqa: F401  (puts the build tree's package on sys.path)


def small_engine(zero, world, stage=3, **kw):
    cfg = {"zero_optimization": {"stage": stage, "reduce_bucket_size": 64,
                                 "stage3_param_persistence_threshold": kw.pop("threshold", 0)}}
    eng = zero.Engine(world, cfg, **kw)
    rng = np.random.default_rng(0)
    fc1 = eng.add_module("fc1", {"weight": rng.standard_normal((6, 10)).astype(np.float32), "bias": (10,)})
    fc2 = eng.add_module("fc2", {"weight": rng.standard_normal((10, 3)).astype(np.float32), "bias": (3,)})
    return eng, fc1, fc2


def test_comm_local(zero_mod, world):
    assert (world.rank, world.size, world.backend, world.name) == (0, 1, "local", "world")
    a = np.arange(5, dtype=np.float32)
    assert np.array_equal(world.allreduce(a), a)
    b = a.copy()
    assert world.allreduce(b, b, op="max") is b
    assert np.array_equal(world.allgather(a), a) and np.array_equal(world.reduce_scatter(a), a)
    world.barrier()
    c = world.counters()
    assert set(c) >= {"allreduce", "reduce_scatter", "allgather", "broadcast", "barrier"}
    assert c["allreduce"] == {"sent": 0, "recv": 0, "calls": 2}  # n = 1 moves no bytes, counts calls
    world.reset_counters()
    assert world.counters()["allreduce"]["calls"] == 0
    world.timeout = 5.0
    assert world.timeout == 5.0
    with world.split(color=0, key=0) as sub:
        assert sub.size == 1 and sub.name.startswith("world/split")
    with world.grid(tp=1, pp=1) as g:
        assert (g.tp_size, g.dp_size, g.pp_size) == (1, 1, 1) and g.dp.size == 1


def test_comm_argument_checks(zero_mod, world):
    with pytest.raises(zero_mod.ZeroInvalidArgumentError, match="C-contiguous"):
        world.allreduce(np.zeros((4, 4), np.float32)[:, 1])
    with pytest.raises(zero_mod.ZeroInvalidArgumentError, match="dtype"):
        world.allreduce(np.zeros(4, np.float32), np.zeros(4, np.float64))
    with pytest.raises(zero_mod.ZeroInvalidArgumentError, match="timeout"):
        world.timeout = -1.0  # libzero's message names the parameter
    with pytest.raises(zero_mod.ZeroInvalidArgumentError, match="unknown backend"):
        zero_mod.Comm.world(backend="carrier-pigeon")


def test_config_sources(zero_mod, tmp_path):
    doc = {"zero_optimization": {"stage": 2, "reduce_bucket_size": 5e3},
           "optimizer": {"type": "SGD", "params": {"lr": 0.5, "momentum": 0.9}},
           "gradient_accumulation_steps": 4, "bf16": {"enabled": True}, "train_batch_size": 8}
    c = zero_mod.Config(doc)
    assert (c.stage, c.reduce_bucket_size, c.optimizer, c.lr, c.momentum, c.gradient_accumulation_steps,
            c.compute_dtype) == (2, 5000, "sgd", 0.5, 0.9, 4, "bf16")
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(doc))
    assert zero_mod.Config(str(path)).to_dict() == c.to_dict()
    assert zero_mod.Config.from_json_file(path, lr=0.25).lr == 0.25
    assert zero_mod.Config(json.dumps(doc), stage=3).stage == 3


def test_config_errors_name_the_key(zero_mod, tmp_path):
    with pytest.raises(zero_mod.ZeroConfigError, match=r"zero_optimization\.stagee") as ei:
        zero_mod.Config({"zero_optimization": {"stagee": 3}})
    assert ei.value.status_name == "ZERO_CONFIG" and isinstance(ei.value, ValueError)
    with pytest.raises(zero_mod.ZeroConfigError, match=r'zero_optimization\.stage: expected an integer 0\.\.3, got "three"'):
        zero_mod.Config({"zero_optimization": {"stage": "three"}})
    with pytest.raises(zero_mod.ZeroConfigError, match="unknown field 'stages'"):
        zero_mod.Config(stages=3)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(zero_mod.ZeroConfigError):
        zero_mod.Config(str(bad))


def test_misuse_raises_with_libzero_message(zero_mod, world):
    eng, fc1, fc2 = small_engine(zero_mod, world)
    with pytest.raises(zero_mod.ZeroInvalidStateError, match="step") as ei:
        eng.step()  # before finalize
    assert "finalize" in str(ei.value) and ei.value.status == zero_mod.lib.ZERO_INVALID_STATE
    eng.finalize()
    with pytest.raises(zero_mod.ZeroNotFoundError, match=r"engine gather: unknown module 7 \(2 modules\)"):
        eng.gather(7)
    with pytest.raises(zero_mod.ZeroNotFoundError, match="unknown module -1"):
        eng.grads_ready(-1)
    with pytest.raises(zero_mod.ZeroNotFoundError, match="99"):
        eng.param_data(99)
    with pytest.raises(zero_mod.ZeroNotFoundError, match="no module 'fc9'"):
        eng.gathered("fc9").__enter__()
    with pytest.raises(zero_mod.ZeroInvalidStateError, match="not gathered"):
        eng.release(fc1)
    with pytest.raises(zero_mod.ZeroInvalidStateError):
        eng.add_module("late")  # after finalize
    assert "late" in eng.last_error or "finalize" in eng.last_error
    eng.close()
    with pytest.raises(zero_mod.ZeroInvalidStateError, match="engine is closed"):
        eng.step()


def test_failed_create_raises_with_the_thread_message(zero_mod, world):
    with pytest.raises(zero_mod.ZeroConfigError, match="stage must be 0..3, got 7"):
        zero_mod.Engine(world, stage=7)  # no handle yet: the message comes from zero_last_error()
    with pytest.raises(zero_mod.ZeroConfigError, match="gradient_accumulation_steps must be >= 1"):
        zero_mod.Engine(world, gradient_accumulation_steps=0)


def test_an_exception_inside_gathered_propagates_unchanged(zero_mod, world):
    eng, fc1, fc2 = small_engine(zero_mod, world, stage=3)
    eng.finalize()
    with pytest.raises(KeyError, match="boom"):
        with eng.gathered(fc1) as P:
            float(P["weight"].sum())
            raise KeyError("boom")
    eng.gather(fc1)            # it was released: gather/release balance again
    eng.release(fc1)
    with pytest.raises(KeyError, match="boom2"):
        with eng.gathered(fc1) as P:
            w = P["weight"]    # escapes: the release is skipped, the KeyError still wins
            raise KeyError("boom2")
    del w
    eng.release(fc1)           # the module stayed gathered until now
    with pytest.raises(zero_mod.ZeroInvalidStateError, match="not gathered"):
        eng.release(fc1)
    eng.close()


def test_registration_checks(zero_mod, world):
    eng = zero_mod.Engine(world, stage=1)
    m = eng.add_module("m")
    with pytest.raises(zero_mod.ZeroInvalidArgumentError, match="expected dtype float32, got float64"):
        eng.add_param(m, "w", init=np.zeros(3))
    with pytest.raises(zero_mod.ZeroInvalidArgumentError, match="C-contiguous"):
        eng.add_param(m, "w", init=np.zeros((4, 4), np.float32).T)
    eng.add_param(m, "w", shape=(2, 3))
    with pytest.raises(zero_mod.ZeroError, match="'w'"):
        eng.add_param(m, "w", shape=(2,))  # duplicate name: libzero names it
    with pytest.raises(zero_mod.ZeroInvalidArgumentError, match="dimensions"):
        eng.add_param(m, "big", shape=(1,) * 9)
    eng.close()


def test_init_specs(zero_mod, world):
    """Spec inits (zero.init): nothing held before finalize, the values zero.init.generate
    gives (any sub-range of them too), bad specs named."""
    zi = zero_mod.init
    eng = zero_mod.Engine(world, stage=3)
    m = eng.add_module("m", {"w": ((6, 7), zi.normal(0.5, mean=1.0, seed=9)), "b": ((7,), zi.constant(0.25))})
    u = eng.add_param(m, "m.u", init=zi.uniform(-2, 3, seed=2), shape=(5,))
    o = eng.add_param(m, "m.o", init=zi.ones(), shape=(3,))
    assert eng.memory_report()["total"] == 0
    eng.finalize()
    w = zi.generate(zi.normal(0.5, mean=1.0, seed=9), "m.w", 0, 42)
    assert np.array_equal(eng.read_param(m.params["w"]).ravel(), w)
    assert np.array_equal(zi.generate(zi.normal(0.5, mean=1.0, seed=9), "m.w", 5, 13), w[5:13])
    assert np.all(eng.read_param(m.params["b"]) == 0.25) and np.all(eng.read_param(o) == 1.0)
    uv = eng.read_param(u)
    assert np.array_equal(uv, zi.generate(zi.uniform(-2, 3, seed=2), "m.u", 0, 5)) and np.all((uv >= -2) & (uv <= 3))
    assert eng.memory_report()["peak"]["other"] == 0
    eng.close()
    eng = zero_mod.Engine(world, stage=1)
    m = eng.add_module("m")
    with pytest.raises(zero_mod.ZeroInvalidArgumentError, match="std >= 0"):
        eng.add_param(m, "w", init=zi.normal(-1.0), shape=(3,))
    with pytest.raises(zero_mod.ZeroInvalidArgumentError, match="lo <= hi"):
        eng.add_param(m, "w", init=zi.uniform(1, 0), shape=(3,))
    with pytest.raises(zero_mod.ZeroInvalidArgumentError, match="needs shape"):
        eng.add_param(m, "w", init=zi.ones())
    with pytest.raises(zero_mod.ZeroInvalidArgumentError, match="begin <= end"):
        zi.generate(zi.ones(), "w", 3, 2)
    eng.close()


def test_init_callback(zero_mod, world):
    """zero.init.callback: called with the ranges the rank keeps (here all: one rank), the
    values land in the engine; an exception in it is re-raised by finalize."""
    zi = zero_mod.init
    calls = []

    def fill(name, begin, end):
        calls.append((name, begin, end))
        return np.arange(begin, end) * 0.5 + (1.0 if name == "m.w" else 2.0)

    eng = zero_mod.Engine(world, stage=3, reduce_bucket_size=7)
    m = eng.add_module("m", {"w": ((3, 4), zi.callback(fill)), "b": ((4,), zi.callback(fill, seed=3))})
    eng.finalize()
    assert np.array_equal(eng.read_param(m.params["w"]).ravel(), np.arange(12, dtype=np.float32) * 0.5 + 1)
    assert np.array_equal(eng.read_param(m.params["b"]), np.arange(4, dtype=np.float32) * 0.5 + 2)
    covered = sorted((n, i) for n, b, e in calls for i in range(b, e))
    assert covered == [("m.b", i) for i in range(4)] + [("m.w", i) for i in range(12)]  # each element once
    eng.close()

    def broken(name, begin, end):
        raise KeyError(f"no table for {name}")

    eng = zero_mod.Engine(world, stage=1)
    eng.add_module("m", {"w": ((5,), zi.callback(broken))})
    with pytest.raises(KeyError, match="no table for m.w"):
        eng.finalize()
    eng.close()
    eng = zero_mod.Engine(world, stage=1)
    eng.add_module("m", {"w": ((5,), zi.callback(lambda n, b, e: np.zeros(e - b + 1)))})
    with pytest.raises(zero_mod.ZeroInvalidArgumentError, match=r"returned \d+ values"):
        eng.finalize()
    eng.close()
    with pytest.raises(zero_mod.ZeroInvalidArgumentError, match="not callable"):
        zi.callback(3)


def test_init_is_zero_copy_in_and_views_are_zero_copy_out(zero_mod, world):
    eng = zero_mod.Engine(world, stage=0)
    w0 = np.arange(12, dtype=np.float32).reshape(3, 4)
    p = eng.add_param(eng.add_module("m"), "w", init=w0)
    eng.finalize()
    v1, v2 = eng.param_data(p), eng.param_data("w")
    assert np.array_equal(v1, w0) and v1.shape == (3, 4) and v1.dtype == np.float32
    assert np.shares_memory(v1, v2)            # both look at the engine's buffer
    assert not v1.flags.writeable              # params change only in step()
    with pytest.raises(ValueError):
        v1[0, 0] = 1.0
    g = eng.param_grad(p)
    assert g.flags.writeable and np.all(g == 0)
    assert zero_mod.ffi.cast("uintptr_t", zero_mod.ffi.from_buffer(v1)) != zero_mod.ffi.cast(
        "uintptr_t", zero_mod.ffi.from_buffer(w0))  # the init was copied by libzero
    del v1, v2, g
    eng.close()


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_sgd_step_through_grad_views(zero_mod, world, stage):
    """w1 = w0 - lr * g exactly (SGD, no momentum, no decay, fp32)."""
    eng = zero_mod.Engine(world, {"zero_optimization": {"stage": stage, "reduce_bucket_size": 16,
                                                        "stage3_param_persistence_threshold": 0},
                                  "optimizer": {"type": "SGD", "params": {"lr": 0.5, "weight_decay": 0.0}}})
    rng = np.random.default_rng(stage)
    w0 = rng.standard_normal((5, 7)).astype(np.float32)
    m = eng.add_module("m", {"w": w0})
    eng.finalize()
    g = rng.standard_normal((5, 7)).astype(np.float32)
    with eng.gathered(m) as P, eng.grads(m) as G:
        assert np.array_equal(P["w"], w0) and np.array_equal(P["m.w"], w0)
        with pytest.raises(zero_mod.ZeroInvalidArgumentError, match="write through the view"):
            G["w"] = g  # would not reach the engine's buffer
        G["w"] += g
    r = eng.step()
    assert isinstance(r, zero_mod.StepResult) and r.step == 1 and not r.skipped and r.clip_coef == 1.0
    assert r.grad_norm == pytest.approx(float(np.linalg.norm(g.astype(np.float64))), rel=1e-6)
    expect = w0 - np.float32(0.5) * g
    assert np.array_equal(eng.read_param("m.w"), expect)
    with eng.gathered(m) as P:
        assert np.array_equal(P["w"], expect)
    eng.close()


@pytest.mark.parametrize("stage", [0, 3])
def test_param_groups(zero_mod, world, stage, tmp_path):
    """Groups (engine.h "parameter groups"): a weight in "default" decays by
    lr * wd, a bias in "no_decay" does not; hyperparameters change between
    steps; a checkpoint restores them by group name."""
    cfg = {"zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
           "optimizer": {"type": "AdamW", "params": {"lr": 0.1, "weight_decay": 0.5}}}
    eng = zero_mod.Engine(world, cfg)
    nd = eng.add_group("no_decay", weight_decay=0.0)
    assert nd == 1 and eng.groups == ["default", "no_decay"]
    with pytest.raises(zero_mod.ZeroInvalidArgumentError, match="beta1 and beta2 must be < 1"):
        eng.add_group("bad", betas=(1.0, 0.9))
    m = eng.add_module("m")
    w0, b0 = np.full(4, 2.0, np.float32), np.full(3, 2.0, np.float32)
    eng.add_param(m, "m.w", init=w0)
    eng.add_param(m, "m.b", init=b0, group="no_decay")
    assert eng.param_group("m.w") == 0 and eng.param_group("m.b") == nd
    eng.finalize()
    assert eng.add_group("late") == 2 and eng.groups[2] == "late"  # after finalize too; holds nothing yet

    def step():  # zero gradients: AdamW moves the parameters by the decay only
        eng.gather(m)
        eng.grads_ready(m)
        eng.release(m)
        eng.step()

    step()
    assert np.array_equal(eng.read_param("m.w"), w0 * np.float32(1 - 0.1 * 0.5))
    assert np.array_equal(eng.read_param("m.b"), b0)
    eng.set_group_hparams("no_decay", weight_decay=0.25, lr_scale=2.0)
    with pytest.raises(zero_mod.ZeroNotFoundError, match="no group 7"):
        eng.set_group_hparams(7, weight_decay=0.0)
    assert eng.group_hparams(nd) == {"lr_scale": 2.0, "weight_decay": 0.25, "betas": (0.9, 0.999), "eps": 1e-8,
                                     "momentum": 0.0, "dampening": 0.0, "nesterov": False}
    step()
    assert np.array_equal(eng.read_param("m.b"), b0 * np.float32(1 - 0.2 * 0.25))
    eng.save_checkpoint(tmp_path / "ck", durable=False)
    eng.close()

    eng2 = zero_mod.Engine(world, cfg)
    eng2.add_group("no_decay", weight_decay=0.0)
    m2 = eng2.add_module("m")
    eng2.add_param(m2, "m.w", init=w0)
    eng2.add_param(m2, "m.b", init=b0, group="no_decay")
    eng2.finalize()
    eng2.load_checkpoint(tmp_path / "ck")
    assert eng2.group_hparams("no_decay")["weight_decay"] == 0.25 and eng2.group_hparams(1)["lr_scale"] == 2.0
    eng2.close()


def test_sgd_group_momentum(zero_mod, world, tmp_path):
    """SGD's momentum, dampening and nesterov per group (zero_group_hparams
    version 2): a group with momentum 0 on an engine with buffers is plain SGD
    (p -= lr * g, bitwise); momentum > 0 where the config has no buffers is
    refused by name; nesterov without momentum is refused; a checkpoint
    restores the groups' momentum settings."""
    def engine(momentum):
        return zero_mod.Engine(world, {"optimizer": {"type": "SGD", "params": {"lr": 0.5, "momentum": momentum,
                                                                            "weight_decay": 0.0}}})

    eng = engine(0.0)
    with pytest.raises(zero_mod.ZeroInvalidArgumentError, match="momentum 0.9 needs SGD momentum buffers"):
        eng.add_group("mom", momentum=0.9)
    eng.close()
    eng = engine(0.9)
    plain = eng.add_group("plain", momentum=0.0, dampening=0.5)
    with pytest.raises(zero_mod.ZeroInvalidArgumentError, match="nesterov needs momentum > 0 and dampening 0"):
        eng.set_group_hparams("plain", nesterov=True)
    assert eng.group_hparams(0)["momentum"] == pytest.approx(0.9) and eng.group_hparams(plain)["momentum"] == 0.0
    m = eng.add_module("m")
    w0 = np.full(4, 2.0, np.float32)
    eng.add_param(m, "m.w", init=w0, group="plain")
    eng.finalize()
    for _ in range(2):  # gradient 1 each step: without momentum the parameter moves by lr each time
        eng.gather(m)
        eng.param_grad("m.w")[:] = 1.0
        eng.grads_ready(m)
        eng.release(m)
        eng.step()
    assert np.array_equal(eng.read_param("m.w"), np.full(4, 1.0, np.float32))
    eng.set_group_hparams("plain", momentum=0.5, nesterov=True, dampening=0.0)
    eng.save_checkpoint(tmp_path / "ck", durable=False)
    eng.close()
    eng2 = engine(0.9)
    eng2.add_group("plain", momentum=0.0)
    m2 = eng2.add_module("m")
    eng2.add_param(m2, "m.w", init=w0, group="plain")
    eng2.finalize()
    eng2.load_checkpoint(tmp_path / "ck")
    h = eng2.group_hparams("plain")
    assert (h["momentum"], h["dampening"], h["nesterov"]) == (0.5, 0.0, True)
    eng2.close()


def test_untraced_eval_leaves_the_stats(zero_mod, world):
    """An eval pass under eng.untraced() sees the current parameters and
    changes neither the stats nor the recorded order."""
    eng, fc1, fc2 = small_engine(zero_mod, world, stage=3, overlap_comm=True)
    eng.finalize()
    _train(zero_mod, eng, [fc1, fc2], 2, seed=1)
    before = eng.stats()
    with eng.untraced():
        for m in (fc2, fc1):  # another order than training's
            with eng.gathered(m) as P:
                for name in P:
                    assert np.array_equal(P[name], eng.read_param(f"{m.name}.{name}"))
    assert eng.stats() == before
    _train(zero_mod, eng, [fc1, fc2], 1, seed=2)
    assert eng.stats()["order_changes"] == 0
    eng.close()


def test_close_with_a_live_view_defers_the_destroy(zero_mod, world):
    eng = zero_mod.Engine(world, stage=1)
    p = eng.add_param(eng.add_module("m"), "w", init=np.full(4, 3.0, np.float32))
    eng.finalize()
    view = eng.param_data(p)[1:]          # a derived view holds the lease too
    assert eng.live_views == 1
    eng.close()
    assert eng.closed and eng.native_alive  # the view keeps the memory valid ...
    assert np.array_equal(view, [3.0, 3.0, 3.0])
    with pytest.raises(zero_mod.ZeroInvalidStateError, match="closed"):
        eng.param_data(p)                   # ... but the engine is closed for use
    with pytest.raises(zero_mod.ZeroInvalidStateError, match="closed"):
        eng.step()
    del view                                # the last view goes: destroyed now
    assert not eng.native_alive


def test_a_comm_outlives_its_engines(zero_mod):
    world = zero_mod.Comm.world(backend="local")
    eng, fc1, fc2 = small_engine(zero_mod, world, stage=2)
    eng.finalize()
    world.close()                           # closed for Python use ...
    assert world.closed and world.native_alive
    with pytest.raises(zero_mod.ZeroInvalidStateError, match="comm is closed"):
        world.barrier()
    for m in (fc2, fc1):                    # ... while the engine keeps using it
        eng.grads_ready(m)
    assert eng.step().step == 1
    eng.close()                             # the last dependent: now both are gone
    assert not eng.native_alive and not world.native_alive


def test_stage3_release_refuses_while_a_view_escapes(zero_mod, world):
    eng, fc1, fc2 = small_engine(zero_mod, world, stage=3)
    eng.finalize()
    with pytest.raises(zero_mod.ZeroInvalidStateError, match=r"release of module 'fc1'.*'fc1.weight'"):
        with eng.gathered(fc1) as P:
            w = P["weight"]                 # escapes the gather scope
    # the module stayed gathered: the escaped view is still valid memory
    assert w.shape == (6, 10) and np.isfinite(w).all()
    del w
    eng.release(fc1)
    with eng.gathered(fc1) as P:
        total = float(P["weight"].sum())    # a temporary: fine
    with pytest.raises(zero_mod.ZeroInvalidStateError, match="ended"):
        P["weight"]
    assert np.isfinite(total) and eng.live_views == 0
    eng.close()


def test_stage3_persistent_views_live_until_the_engine_goes(zero_mod, world):
    eng, fc1, fc2 = small_engine(zero_mod, world, stage=3, threshold=5)  # fc2.bias (3) is persistent
    eng.finalize()
    assert eng.param_info("fc2.bias")["persistent"] == 1
    with eng.gathered(fc2) as P:
        b = P["bias"]
    assert b.shape == (3,)                  # allowed: persistent memory lives until destroy
    eng.close()
    assert eng.native_alive
    del b
    assert not eng.native_alive


@pytest.mark.parametrize("stage", [2, 3])
def test_grad_views_cannot_outlive_grads_ready(zero_mod, world, stage):
    eng, fc1, fc2 = small_engine(zero_mod, world, stage=stage)
    eng.finalize()
    g = eng.param_grad("fc2.weight")
    g += 1.0
    with pytest.raises(zero_mod.ZeroInvalidStateError, match="grads_ready of module 'fc2'.*gradient of 'fc2.weight'"):
        eng.grads_ready(fc2)
    with pytest.raises(zero_mod.ZeroInvalidStateError, match="engine step"):
        eng.step()
    with pytest.raises(zero_mod.ZeroInvalidStateError, match="zero_grad"):
        eng.zero_grad()
    del g
    eng.grads_ready(fc2)
    eng.add_grad("fc1.bias", np.ones(10, np.float32))
    eng.grads_ready(fc1)
    r = eng.step()
    assert r.grad_norm == pytest.approx(np.sqrt(30 + 10), rel=1e-6)
    eng.close()


def _declared_formula(zero_mod, eng, world_size):
    """engine.h: zero_memory_estimate(P, N, stage, ...) + the declared buffers."""
    plan = eng.plan_info()
    cfg = eng.config
    P, N, B, stage = plan["padded_numel"], world_size, plan["max_bucket_numel"], plan["stage"]
    d = {"f32": 4, "bf16": 2, "f16": 2}[plan["compute_dtype"]]
    est = zero_mod.memory_estimate(P, N, stage, plan["compute_dtype"], cfg.optimizer,
                                   sgd_momentum=cfg.momentum != 0)
    want = {k: est[k] for k in ("params", "grads", "master", "moments")}
    want["grads"] += P * 4 // N if stage < 2 else P * (4 - d) // N
    if stage == 3:  # persistent buckets in full
        buckets = {}
        for p in eng.params:
            i = eng.param_info(p)
            if i["persistent"]:
                buckets[i["bucket"]] = buckets.get(i["bucket"], 0) + i["numel"]
        want["params"] += sum(-(-n // N) * N for n in buckets.values()) * d
    slots = 2 if cfg.overlap_comm else 1
    want["buffers"] = slots * (B * 4 + B * 4 // N)
    want["other"] = 0
    want["cache"] = 0
    want["total"] = sum(want.values())
    return want


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("variant", [dict(), dict(compute_dtype="bf16", overlap_comm=1),
                                     dict(optimizer="sgd", momentum=0.9, threshold=40)])
def test_memory_report_equals_the_c_formula(zero_mod, world, stage, variant):
    variant = dict(variant)
    eng, fc1, fc2 = small_engine(zero_mod, world, stage=stage, **variant)
    eng.finalize()
    got = eng.memory_report()
    want = _declared_formula(zero_mod, eng, 1)
    assert {k: got[k] for k in want} == want
    assert got["peak"]["total"] >= got["total"] and set(got["peak"]) == set(want)
    # after a full step, steady state again
    for m in (fc2, fc1):
        with eng.gathered(m):
            for p in m.params.values():
                eng.add_grad(p, np.full(p.shape, 0.125, np.float32))
            eng.grads_ready(m)
    eng.step()
    # steady state again, plus the module buffers kept for the next step
    # (stages 2-3), which empty_cache() frees
    got = eng.memory_report()
    cached = got["cache"]
    assert (cached > 0) if stage >= 2 else (cached == 0)
    assert {k: got[k] for k in want if k not in ("cache", "total")} == {
        k: v for k, v in want.items() if k not in ("cache", "total")}
    assert got["total"] == want["total"] + cached
    eng.empty_cache()
    got = eng.memory_report()
    assert {k: got[k] for k in want} == want
    eng.close()


def test_memory_estimate_reproduces_the_paper(zero_mod):
    # ZeRO paper: 7.5B params, N = 64, fp16 + Adam: 120, 31.4, 16.6, 1.9 GB
    totals = [zero_mod.memory_estimate(7.5e9, 64, s, "f16", "adamw")["total"] / 1e9 for s in range(4)]
    assert [round(t, 1) for t in totals] == [120.0, 31.4, 16.6, 1.9]


def test_bf16_helpers_round_like_libzero(zero_mod):
    x = np.array([1.0, -2.5, 3.14159, 1e-3, 65504.0, np.inf, 1.00390625, 1.01171875], np.float32)
    ours = zero_mod.f32_to_bf16(x)
    ref = np.array([zero_mod.lib.zero_f32_to_bf16(float(v)) for v in x], np.uint16)
    assert np.array_equal(ours, ref)
    assert np.array_equal(zero_mod.bf16_to_f32(ref), [zero_mod.lib.zero_bf16_to_f32(int(b)) for b in ref])


def test_state_and_scalars(zero_mod, world):
    eng, fc1, fc2 = small_engine(zero_mod, world, stage=2)
    eng.finalize()
    master = eng.state_get("master", "fc1.weight")
    assert master.shape == (60,) and np.array_equal(master, eng.read_param("fc1.weight").ravel())
    eng.state_set("master", "fc1.weight", np.zeros(60, np.float32))
    eng.params_changed()
    assert not eng.param_data("fc1.weight").any()
    with pytest.raises(zero_mod.ZeroInvalidArgumentError, match="expected 60 elements"):
        eng.state_set("moment1", "fc1.weight", np.zeros(59, np.float32))
    eng.lr = 0.25
    assert eng.lr == 0.25 and eng.scalars()["lr"] == 0.25 and eng.loss_scale == 1.0
    eng.set_scalars(step=7)
    assert eng.scalars()["step"] == 7
    eng.close()


def _train(zero, eng, mods, steps, seed):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        for m in reversed(mods):
            with eng.gathered(m), eng.grads(m) as G:
                for k in G:
                    G[k] += rng.standard_normal(G[k].shape).astype(np.float32)
        eng.step()


def test_checkpoint_round_trip(zero_mod, world, tmp_path):
    assert zero_mod.checkpoint.AVAILABLE  # checkpoint.h is public: the bindings must wrap it
    eng, fc1, fc2 = small_engine(zero_mod, world, stage=3)
    eng.finalize()
    _train(zero_mod, eng, [fc1, fc2], 2, seed=1)
    path = eng.save_checkpoint(tmp_path / "ckpt", user={"epoch": 3}, durable=False)
    assert path.endswith("step-00000002")
    _train(zero_mod, eng, [fc1, fc2], 1, seed=2)
    want = [eng.read_param(p) for p in eng.params]
    eng.close()

    meta = zero_mod.checkpoint.inspect(tmp_path / "ckpt")
    assert meta["step"] == 2 and meta["world_size"] == 1
    zero_mod.checkpoint.verify(tmp_path / "ckpt")

    # resume at another stage: same parameters after the same step, bitwise
    eng2, f1, f2 = small_engine(zero_mod, world, stage=1)
    eng2.finalize()
    info = eng2.load_checkpoint(tmp_path / "ckpt")
    assert (info.step, info.world_size, info.stage, info.user) == (2, 1, 3, {"epoch": 3})
    _train(zero_mod, eng2, [f1, f2], 1, seed=2)
    for p, w in zip(eng2.params, want):
        assert np.array_equal(eng2.read_param(p), w), p.name
    eng2.close()

    shard = next((tmp_path / "ckpt" / "step-00000002").glob("rank-*.bin"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(zero_mod.ZeroCorruptError, match="rank-00000.bin"):
        zero_mod.checkpoint.verify(tmp_path / "ckpt")


def test_log_handler_receives_libzero_warnings(zero_mod, world):
    seen = []
    zero_mod.set_log_handler(lambda level, msg: seen.append((level, msg)), "warn")
    try:
        eng, fc1, fc2 = small_engine(zero_mod, world, stage=3, overlap_comm=1)
        eng.finalize()
        for order in ([fc1, fc2], [fc2, fc1]):  # the second step changes the gather order
            for m in order:
                with eng.gathered(m):
                    pass
            for m in (fc2, fc1):
                eng.grads_ready(m)
            eng.step()
        eng.close()
    finally:
        zero_mod.set_log_handler(None)
    assert any(level == "warn" and "gather order changed" in msg for level, msg in seen), seen
