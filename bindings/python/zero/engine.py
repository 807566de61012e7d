"""The ZeRO engine: registration, gather/release, gradients, step, memory,
state and checkpoints, with numpy views of the engine's buffers.

View lifetime (docs/python.md explains the choice):
  * every view holds a lease on its engine: the native engine is destroyed
    only after close() AND the last view is gone, so a view never points
    at freed engine memory because of close() or garbage collection;
  * memory that libzero frees during training - stage-3 gathered
    parameters (freed by the last release of their module) and stage-2/3
    gradient buffers (freed by grads_ready, step and zero_grad) - is
    guarded the other way round: the call that would free it raises
    ZeroInvalidStateError, before doing anything, while a view of it is
    still referenced. Drop the view (or keep a .copy()) and call again;
  * parameter views are read-only (libzero changes parameters only in
    step() and params_changed()); gradient views are writable.
"""
import contextlib
import dataclasses
import gc
import math
from collections.abc import Mapping

import numpy as np

from ._arrays import ZERO_TO_NUMPY, as_c_buffer, bf16_to_f32, f32_to_bf16
from ._device_arrays import DeviceArray
from ._ffi import ffi, lib, string
from ._resource import _Resource
from .comm import Device
from .config import Config, as_config
from .errors import (ZeroError, ZeroInvalidArgumentError, ZeroInvalidStateError, ZeroNotFoundError,
                     ZeroUnsupportedError, check)
from .init import Init

STATE_KINDS = {"master": lib.ZERO_STATE_MASTER, "moment1": lib.ZERO_STATE_MOMENT1,
               "moment2": lib.ZERO_STATE_MOMENT2}


def _mem_categories():
    elems = ffi.typeof("zero_mem_category").elements
    return [(v, n[len("ZERO_MEM_"):].lower()) for v, n in sorted(elems.items())
            if n != "ZERO_MEM_CATEGORY_COUNT"]


MEM_CATEGORIES = _mem_categories()


def _report_dict(r):
    out = {name: int(r.bytes[v]) for v, name in MEM_CATEGORIES}
    out["total"] = int(r.total)
    out["peak"] = {name: int(r.peak[v]) for v, name in MEM_CATEGORIES}
    out["peak"]["total"] = int(r.peak_total)
    return out


def memory_estimate(numel, dp, stage, dtype="f32", optimizer="adamw", sgd_momentum=False):
    """ZeRO's formula (zero_memory_estimate) as a memory-report dict."""
    from ._arrays import zero_dtype
    from .config import OPTIMIZERS
    r = ffi.new("zero_memory_report *")
    check(lib.zero_memory_estimate(int(numel), dp, stage, zero_dtype(dtype), OPTIMIZERS[optimizer],
                                   1 if sgd_momentum else 0, r))
    return _report_dict(r)


@dataclasses.dataclass(frozen=True)
class StepResult:
    """What step() did (zero_step_result)."""
    grad_norm: float       # global L2 norm of the averaged, unscaled gradient, before clipping
    clip_coef: float       # factor applied to the gradient (1.0: not clipped)
    loss_scale: float      # the scale this step's gradients carried
    next_loss_scale: float  # the scale for the next step's loss
    skipped: bool          # fp16 overflow somewhere: nothing was updated
    step: int              # optimizer updates applied so far, this one included


@dataclasses.dataclass(frozen=True)
class Param:
    id: int
    name: str
    shape: tuple
    module: int

    @property
    def numel(self):
        return math.prod(self.shape)


class Module:
    """A registered module: its id, name and parameters (by short name:
    the parameter name without a leading "<module name>.")."""

    def __init__(self, mid, name):
        self.id = mid
        self.name = name
        self.params = {}

    def _short(self, pname):
        prefix = self.name + "."
        return pname[len(prefix):] if pname.startswith(prefix) else pname

    def __repr__(self):
        return f"<zero.Module {self.id} {self.name!r} params {list(self.params)}>"


class _Lease:
    """One view's hold on its engine (see the module doc). view: what the
    view is, for messages ("numpy view", "device view")."""
    __slots__ = ("engine", "kind", "param", "scope", "view")

    def __init__(self, engine, kind, param, scope, view="numpy view"):
        engine._add_dep()
        self.engine, self.kind, self.param, self.scope, self.view = engine, kind, param, scope, view
        engine._leases[id(self)] = self

    def dead(self, _cdata):
        e = self.engine
        e._leases.pop(id(self), None)
        e._drop_dep()


class ModuleViews(Mapping):
    """Views of one module's parameters (or gradients), by short name, full
    name, Param or id; created on first access, dropped when the `with`
    block ends (any access after that raises)."""

    def __init__(self, engine, module, getter, what):
        self._engine, self._module, self._getter, self._what = engine, module, getter, what
        self._cache = {}
        self._open = True

    def __getitem__(self, key):
        if not self._open:
            raise ZeroInvalidStateError(f"{self._what} of module '{self._module.name}' ended; its views are gone")
        p = self._engine._param_in(self._module, key)
        v = self._cache.get(p.id)
        if v is None:
            v = self._cache[p.id] = self._getter(p)
        return v

    def __setitem__(self, key, value):
        # `G["w"] += dw` updates the view in place, then assigns it back:
        # accept exactly that; anything else would silently replace nothing.
        if value is not self[key]:
            raise ZeroInvalidArgumentError(f"{self._what}: write through the view (views[{key!r}][...] = v, or "
                                           f"+= v), not by assigning a new array")

    def __iter__(self):
        return iter(self._module.params)

    def __len__(self):
        return len(self._module.params)

    def _close(self):
        self._open = False
        self._cache.clear()


class Engine(_Resource):
    """A ZeRO engine (zero_engine) on the dp group `comm`.

        eng = zero.Engine(comm, {"zero_optimization": {"stage": 3}}, lr=1e-2)
        fc = eng.add_module("fc", {"weight": w0, "bias": (16,)})
        eng.finalize()
        with eng.gathered(fc) as P:             # forward
            y = x @ P["weight"] + P["bias"]
        with eng.gathered(fc) as P, eng.grads(fc) as G:  # backward
            G["weight"] += x.T @ dy; G["bias"] += dy.sum(0)
        result = eng.step()

    config: a Config, a dict (DeepSpeed-style), a JSON file path or JSON
    text; keyword arguments override single fields (Config's C names).
    device: a zero.Device; by default a CPU device owned by the engine."""
    _kind = "engine"

    def __init__(self, comm, config=None, device=None, **fields):
        cfg = as_config(config)
        for k, v in fields.items():
            setattr(cfg, k, v)
        own_device = device is None
        if own_device:
            device = Device("cpu")
        try:
            out = ffi.new("zero_engine **")
            check(lib.zero_engine_create(out, cfg._c, comm._live_handle(), device._live_handle()))
            super().__init__(out[0], parents=(comm, device))
        finally:
            if own_device:
                device.close()  # destroyed after the engine (a dependent)
        self.comm = comm
        self.device = device
        self.config = cfg
        self.stage = cfg.stage
        self._leases = {}
        self._modules = []
        self._params = []
        self._persistent = {}
        self._init_fills = []  # (holder, cffi handle) of callback inits, alive until finalize succeeds
        self._gather_depth = {}
        self._finalized = False
        self._compute_stream = 0      # the cudaStream_t (int) set by set_compute_stream; 0: the default
        self._stream_wrappers = []    # zero_stream * wrappers made by set_compute_stream, freed after the engine

    def _destroy(self, h):
        lib.zero_engine_destroy(h)
        for s in self._stream_wrappers:  # the engine used them until now: freed after it
            lib.zero_stream_destroy(s)
        self._stream_wrappers = []

    def _check(self, status):
        check(status, lambda: lib.zero_engine_last_error(self._h) if self._h is not None else ffi.NULL)

    @property
    def last_error(self):
        return string(lib.zero_engine_last_error(self._live_handle()))

    @property
    def live_views(self):
        """Numpy views of this engine's memory still referenced."""
        return len(self._leases)

    def __repr__(self):
        state = "closed" if self._closed else ("finalized" if self._finalized else "registering")
        return f"<zero.Engine stage {self.stage} {state}, {len(self._params)} params>"

    # ================================================================ registration
    def add_module(self, name, params=None):
        """Register a module; `params` (optional): {short name: init array, shape,
        or (shape, zero.init spec)}, registered as "<name>.<short name>" in dict order."""
        mid = ffi.new("int *")
        self._check(lib.zero_engine_add_module(self._live_handle(), name.encode(), mid))
        m = Module(mid[0], name)
        self._modules.append(m)
        for pname, spec in (params or {}).items():
            if isinstance(spec, np.ndarray):
                self.add_param(m, f"{name}.{pname}", init=spec)
            elif isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[1], Init):
                self.add_param(m, f"{name}.{pname}", init=spec[1], shape=spec[0])
            else:
                self.add_param(m, f"{name}.{pname}", shape=spec)
        return m

    def add_param(self, module, name, init=None, shape=None, group=None):
        """Register a parameter of `module`, in parameter group `group` (a
        name or id from add_group; None: "default"). `init`:
          * a zero.init spec (zero.init.normal(std, seed=...), uniform, constant,
            ones, zeros) with `shape`: each rank computes only what it keeps, at
            finalize; nothing is held before (zero_engine_add_param_init);
          * a C-contiguous float32 array (passed zero-copy; libzero copies it
            now and holds 4 bytes x numel on every rank until finalize);
          * None: zeros of `shape`.
        Returns a Param."""
        m = self.module(module)
        spec = None
        if isinstance(init, Init):
            if shape is None:
                raise ZeroInvalidArgumentError(f"add_param '{name}': an init spec needs shape")
            spec, init = init.c_spec(keep=self._init_fills), None
        if init is not None:
            shape = tuple(init.shape) if shape is None else tuple(shape)
            buf, _, n = as_c_buffer(init, f"add_param '{name}' init", dtype=np.float32)
            if n != int(np.prod(shape)):
                raise ZeroInvalidArgumentError(f"add_param '{name}': init has {n} elements, shape {shape} needs "
                                               f"{int(np.prod(shape))}")
        elif shape is None:
            raise ZeroInvalidArgumentError(f"add_param '{name}': give init or shape")
        else:
            shape = (int(shape),) if np.isscalar(shape) else tuple(int(s) for s in shape)
            buf = ffi.NULL
        if not 1 <= len(shape) <= lib.ZERO_MAX_DIMS:
            raise ZeroInvalidArgumentError(f"add_param '{name}': {len(shape)} dimensions; 1..{lib.ZERO_MAX_DIMS}")
        cshape = ffi.new("int64_t[]", list(shape))
        pid = ffi.new("int *")
        if spec is not None:
            self._check(lib.zero_engine_add_param_init(self._live_handle(), m.id, name.encode(), len(shape), cshape,
                                                       spec, pid))
        else:
            self._check(lib.zero_engine_add_param(self._live_handle(), m.id, name.encode(), len(shape), cshape,
                                                  buf, pid))
        if group is not None:
            self._check(lib.zero_engine_set_param_group(self._live_handle(), pid[0], self._group_id(group)))
        p = Param(pid[0], name, shape, m.id)
        self._params.append(p)
        m.params[m._short(name)] = p
        return p

    def finalize(self):
        """COLLECTIVE: plan, check it across ranks, allocate, load the inits."""
        try:
            self._check(lib.zero_engine_finalize(self._live_handle()))
        except ZeroError as e:
            raised = next((h.error for h, _ in self._init_fills if h.error is not None), None)
            if raised is not None:
                raise raised from e
            raise
        self._init_fills = []  # called by finalize only: kept until it succeeds (a retry calls them again)
        self._finalized = True
        for p in self._params:
            self._persistent[p.id] = bool(self.param_info(p)["persistent"])

    @property
    def modules(self):
        return list(self._modules)

    @property
    def params(self):
        return list(self._params)

    def module(self, key):
        """A Module by Module, id or name."""
        if isinstance(key, Module):
            return key
        if isinstance(key, (int, np.integer)):
            if 0 <= key < len(self._modules):
                return self._modules[key]
            return Module(int(key), f"#{key}")  # unknown: the C call names the error
        for m in self._modules:
            if m.name == key:
                return m
        raise ZeroNotFoundError(f"engine: no module {key!r} (modules: {[m.name for m in self._modules]})")

    def param(self, key):
        """A Param by Param, id or full name."""
        if isinstance(key, Param):
            return key
        if isinstance(key, (int, np.integer)):
            if 0 <= key < len(self._params):
                return self._params[key]
            return Param(int(key), f"#{key}", (1,), -1)  # unknown: the C call names the error
        for p in self._params:
            if p.name == key:
                return p
        raise ZeroNotFoundError(f"engine: no param named {key!r}")

    def _param_in(self, module, key):
        if isinstance(key, str) and key in module.params:
            return module.params[key]
        p = self.param(key)
        if p.module != module.id:
            raise ZeroInvalidArgumentError(f"param '{p.name}' is not in module '{module.name}'")
        return p

    # ================================================================ views
    def _view(self, p, ptr, kind, scope, writable):
        if self.device.kind != "cpu":
            raise ZeroUnsupportedError(f"{kind} view of '{p.name}': the engine's memory is on the {self.device.kind} "
                                       "device, numpy views need host memory; use read_param / state_get")
        dt = ZERO_TO_NUMPY[self.config._c.compute_dtype]
        lease = _Lease(self, kind, p.id, scope)
        # The view's buffer holds a cdata whose destructor ends the lease:
        # numpy view -> ffi.buffer -> cdata (ffi.gc) -> lease -> engine.
        owner = ffi.gc(ffi.cast("char *", ptr), lease.dead)
        arr = np.frombuffer(ffi.buffer(owner, p.numel * dt.itemsize), dtype=dt).reshape(p.shape)
        if not writable:
            arr.flags.writeable = False
        return arr

    def _check_views(self, scopes, what):
        """Raise if a view of memory `what` frees is still referenced."""
        def live():
            return [le for le in self._leases.values() if le.scope in scopes]
        if not live():
            return
        gc.collect()  # views kept only by reference cycles (old tracebacks)
        left = live()
        if left:
            le = left[0]
            p = self._params[le.param]
            raise ZeroInvalidStateError(
                f"{what}: a {le.view} of the {le.kind} of '{p.name}' is still referenced and this call would free "
                f"the memory under it ({len(left)} such view(s)); drop it (del) or keep a copy (.copy()) instead")

    # ---------------------------------------------------------------- CUDA device views
    def set_compute_stream(self, cuda_stream):
        """Make the cudaStream_t `cuda_stream` (an int, e.g. torch's
        torch.cuda.current_stream().cuda_stream; 0 or None: the device's
        default stream) the engine's COMPUTE stream (engine.h "streams"):
        gathered parameters and fresh gradient buffers are ready on it, and
        grads_ready / step read gradients after the work queued on it. The
        caller keeps owning the stream and must keep it alive while the
        engine uses it. CUDA engines only."""
        what = "engine set_compute_stream"
        if self.device.kind != "cuda":
            raise ZeroUnsupportedError(f"{what}: the engine's device is {self.device.kind}; a CUDA stream needs a "
                                       "CUDA engine (zero.Device('cuda'))")
        handle = int(cuda_stream or 0)
        wrapper = ffi.NULL
        if handle:
            if not lib.zero_py_cuda_handles():
                raise ZeroUnsupportedError(f"{what}: the loaded libzero has no zero_stream_wrap_cuda (built without "
                                           "CUDA)")
            out = ffi.new("zero_stream **")
            check(lib.zero_py_stream_wrap_cuda(self.device._live_handle(), ffi.cast("void *", handle), out),
                  lambda: lib.zero_device_last_error(self.device._live_handle()))
            wrapper = out[0]
            self._stream_wrappers.append(wrapper)
        try:
            self._check(lib.zero_engine_set_compute_stream(self._live_handle(), wrapper))
        except ZeroError:
            if wrapper != ffi.NULL:
                self._stream_wrappers.pop()
                lib.zero_stream_destroy(wrapper)
            raise
        self._compute_stream = handle

    @property
    def compute_stream(self):
        """The compute stream's cudaStream_t as an int (0: the device's default stream)."""
        return self._compute_stream

    def _device_view(self, p, ptr, kind, scope, writable):
        if self.device.kind != "cuda":
            raise ZeroUnsupportedError(f"{kind} device view of '{p.name}': the engine's memory is on the "
                                       f"{self.device.kind} device; use the numpy views (param_data / param_grad)")
        lease = _Lease(self, kind, p.id, scope, view="device view (a DeviceArray, or a tensor over one)")
        owner = ffi.gc(ffi.cast("char *", ptr), lease.dead)  # ends the lease when the DeviceArray is gone
        return DeviceArray(int(ffi.cast("uintptr_t", ptr)), p.shape, self.config._c.compute_dtype,
                           stream=self._compute_stream, writable=writable, owner=owner)

    def param_data_device(self, param, writable=False):
        """param_data for a CUDA engine: a zero.DeviceArray over the full
        parameter in device memory (compute dtype; bf16 as uint16 bit
        patterns), with __cuda_array_interface__ (torch.as_tensor takes it
        zero-copy). The same validity and release rules as param_data.
        writable: the interface's read-only flag (torch refuses read-only
        arrays; the engine changes parameters only in step())."""
        p = self.param(param)
        out = ffi.new("void **")
        self._check(lib.zero_engine_param_data(self._live_handle(), p.id, out))
        scope = ("gather", p.module) if self.stage == 3 and not self._persistent.get(p.id) else None
        return self._device_view(p, out[0], "parameter", scope, writable)

    def param_grad_device(self, param):
        """param_grad for a CUDA engine: a writable zero.DeviceArray over the
        gradient buffer (ACCUMULATE into it, on the compute stream). The same
        validity rules as param_grad."""
        p = self.param(param)
        out = ffi.new("void **")
        self._check(lib.zero_engine_param_grad(self._live_handle(), p.id, out))
        scope = ("grad", p.module) if self.stage >= 2 else None
        return self._device_view(p, out[0], "gradient", scope, writable=True)

    def param_data(self, param):
        """Read-only numpy view of the full parameter in the compute dtype
        (bf16: uint16 bit patterns). Valid at stages 0-2 and for persistent
        stage-3 parameters until the engine is gone; for other stage-3
        parameters between gather(module) and its release."""
        p = self.param(param)
        out = ffi.new("void **")
        self._check(lib.zero_engine_param_data(self._live_handle(), p.id, out))
        scope = ("gather", p.module) if self.stage == 3 and not self._persistent.get(p.id) else None
        return self._view(p, out[0], "parameter", scope, writable=False)

    def param_grad(self, param):
        """Writable numpy view of the parameter's gradient buffer: ACCUMULATE
        (+=) into it. Stages 0-1: valid until the engine is gone; stages 2-3:
        until grads_ready(module) / step / zero_grad (which refuse to run
        while the view is referenced)."""
        p = self.param(param)
        out = ffi.new("void **")
        self._check(lib.zero_engine_param_grad(self._live_handle(), p.id, out))
        scope = ("grad", p.module) if self.stage >= 2 else None
        return self._view(p, out[0], "gradient", scope, writable=True)

    def _grad_block(self, params):
        """Private (zero.torch, stages 2-3): one writable numpy view (1-D)
        spanning the gradient buffers of `params`, all of one module (its
        fresh buffer of this micro-step), and each one's element offset in
        it. One lease for the lot, under param_grad's rule: grads_ready,
        step and zero_grad refuse while the block or a slice of it is
        referenced. Costs one view per module instead of one per parameter."""
        h = self._live_handle()
        out = ffi.new("void **")
        addrs = []
        for p in params:
            self._check(lib.zero_engine_param_grad(h, p.id, out))
            addrs.append(int(ffi.cast("uintptr_t", out[0])))
        dt = ZERO_TO_NUMPY[self.config._c.compute_dtype]
        base = min(addrs)
        end = max(a + p.numel * dt.itemsize for a, p in zip(addrs, params))
        first = params[addrs.index(base)]
        lease = _Lease(self, "gradient", first.id, ("grad", first.module))
        owner = ffi.gc(ffi.cast("char *", base), lease.dead)
        arr = np.frombuffer(ffi.buffer(owner, end - base), dtype=dt)
        return arr, [(a - base) // dt.itemsize for a in addrs]

    def add_grad(self, param, grad):
        """param_grad(param) += grad, without keeping a view. For bf16
        compute the sum is formed in fp32 and rounded to nearest even."""
        g = self.param_grad(param)
        if self.config._c.compute_dtype == lib.ZERO_BF16:
            g[...] = f32_to_bf16(bf16_to_f32(g) + np.asarray(grad, dtype=np.float32))
        else:
            g += grad
        del g

    # ================================================================ training
    def gather(self, module):
        """COLLECTIVE at stage 3. Prefer `with engine.gathered(module)`."""
        m = self.module(module)
        self._check(lib.zero_engine_gather(self._live_handle(), m.id))
        self._gather_depth[m.id] = self._gather_depth.get(m.id, 0) + 1

    def release(self, module):
        m = self.module(module)
        if self.stage == 3 and self._gather_depth.get(m.id, 0) == 1:
            self._check_views({("gather", m.id)}, f"engine release of module '{m.name}'")
        self._check(lib.zero_engine_release(self._live_handle(), m.id))
        self._gather_depth[m.id] -= 1

    @contextlib.contextmanager
    def gathered(self, module):
        """gather(module) ... release(module); yields a ModuleViews of the
        module's parameters (read-only numpy views), dropped at the end."""
        m = self.module(module)
        self.gather(m)
        views = ModuleViews(self, m, self.param_data, "gathered()")
        try:
            yield views
        except BaseException:
            views._close()
            try:
                self.release(m)
            except ZeroError:
                pass  # a view in the failing frame keeps it gathered; the original error matters
            raise
        views._close()
        self.release(m)

    @contextlib.contextmanager
    def untraced(self):
        """Forwards outside training (eval, generation; engine.h "untraced
        forwards"): gathers inside work as usual but leave the stage-3
        recorded order, the prefetcher and stats() untouched. At stage 3
        every rank must make the same gathers (generate on every rank)."""
        self._check(lib.zero_engine_set_untraced(self._live_handle(), 1))
        try:
            yield self
        finally:
            self._check(lib.zero_engine_set_untraced(self._live_handle(), 0))

    def grads_ready(self, module):
        """COLLECTIVE: the module's micro-step gradients are complete."""
        m = self.module(module)
        if self.stage >= 2:
            self._check_views({("grad", m.id)}, f"engine grads_ready of module '{m.name}'")
        self._check(lib.zero_engine_grads_ready(self._live_handle(), m.id))

    @contextlib.contextmanager
    def grads(self, module):
        """Yields a ModuleViews of the module's gradient buffers (writable:
        accumulate with +=); on a normal exit calls grads_ready(module).
        On an exception grads_ready (collective) is not called."""
        m = self.module(module)
        views = ModuleViews(self, m, self.param_grad, "grads()")
        try:
            yield views
        finally:
            views._close()
        self.grads_ready(m)

    def _check_grad_views(self, what):
        if self.stage >= 2:
            self._check_views({("grad", m.id) for m in self._modules}, what)

    def step(self):
        """COLLECTIVE: the optimizer step. Returns a StepResult."""
        self._check_grad_views("engine step")
        r = ffi.new("zero_step_result *")
        self._check(lib.zero_engine_step(self._live_handle(), r))
        return StepResult(r.grad_norm, r.clip_coef, r.loss_scale, r.next_loss_scale, bool(r.skipped), r.step)

    def zero_grad(self):
        self._check_grad_views("engine zero_grad")
        self._check(lib.zero_engine_zero_grad(self._live_handle()))

    @property
    def lr(self):
        return lib.zero_engine_get_lr(self._live_handle())

    @lr.setter
    def lr(self, value):
        self._check(lib.zero_engine_set_lr(self._live_handle(), float(value)))

    # ================================================================ parameter groups
    def _hparams(self, lr_scale, weight_decay, betas, eps, momentum=None, dampening=None, nesterov=None):
        # None: "keep" (-1), the config's value for a new group
        h = ffi.new("zero_group_hparams *")
        h.size = ffi.sizeof("zero_group_hparams")
        h.version = lib.ZERO_GROUP_HPARAMS_VERSION
        h.lr_scale = float(lr_scale)
        h.weight_decay = -1.0 if weight_decay is None else float(weight_decay)
        h.beta1, h.beta2 = (-1.0, -1.0) if betas is None else (float(betas[0]), float(betas[1]))
        h.eps = -1.0 if eps is None else float(eps)
        h.momentum = -1.0 if momentum is None else float(momentum)
        h.dampening = -1.0 if dampening is None else float(dampening)
        h.nesterov = -1 if nesterov is None else int(bool(nesterov))
        return h

    def add_group(self, name, lr_scale=1.0, weight_decay=None, betas=None, eps=None, momentum=None,
                  dampening=None, nesterov=None):
        """A parameter group (torch's param_groups; engine.h "parameter
        groups"): its lr is engine.lr * lr_scale; weight_decay, betas, eps
        (AdamW), momentum, dampening, nesterov (SGD) default to the config's.
        Returns its id (1, 2, ...); group 0 is "default"."""
        gid = ffi.new("int *")
        self._check(lib.zero_engine_add_group(
            self._live_handle(), name.encode(),
            self._hparams(lr_scale, weight_decay, betas, eps, momentum, dampening, nesterov), gid))
        return gid[0]

    def _group_id(self, group):
        if isinstance(group, str):
            for g in range(lib.zero_engine_get_num_groups(self._live_handle())):
                if string(lib.zero_engine_get_group_name(self._live_handle(), g)) == group:
                    return g
            raise ZeroNotFoundError(f"no parameter group named '{group}'")
        return int(group)

    @property
    def groups(self):
        """The group names, by id."""
        h = self._live_handle()
        return [string(lib.zero_engine_get_group_name(h, g)) for g in range(lib.zero_engine_get_num_groups(h))]

    def set_group_hparams(self, group, lr_scale=None, weight_decay=None, betas=None, eps=None, momentum=None,
                          dampening=None, nesterov=None):
        """Change a group's hyperparameters (name or id) from the next step
        on; None leaves one unchanged. Any time between steps; the same on
        every rank."""
        gid = self._group_id(group)
        if lr_scale is None:
            lr_scale = self.group_hparams(gid)["lr_scale"]
        self._check(lib.zero_engine_set_group_hparams(
            self._live_handle(), gid, self._hparams(lr_scale, weight_decay, betas, eps, momentum, dampening, nesterov)))

    def group_hparams(self, group):
        """{"lr_scale", "weight_decay", "betas", "eps", "momentum", "dampening",
        "nesterov"} of a group (name or id)."""
        h = ffi.new("zero_group_hparams *")
        h.size = ffi.sizeof("zero_group_hparams")
        h.version = lib.ZERO_GROUP_HPARAMS_VERSION
        self._check(lib.zero_engine_get_group_hparams(self._live_handle(), self._group_id(group), h))
        return {"lr_scale": h.lr_scale, "weight_decay": h.weight_decay, "betas": (h.beta1, h.beta2), "eps": h.eps,
                "momentum": h.momentum, "dampening": h.dampening, "nesterov": bool(h.nesterov)}

    def param_group(self, param):
        """The group id of a parameter."""
        g = ffi.new("int *")
        self._check(lib.zero_engine_get_param_group(self._live_handle(), self.param(param).id, g))
        return g[0]

    @property
    def loss_scale(self):
        """Multiply the loss by this before backward (1.0 unless fp16)."""
        return lib.zero_engine_get_loss_scale(self._live_handle())

    # ================================================================ introspection
    def memory_report(self):
        """{"params", "grads", "master", "moments", "buffers", "other", "cache":
        bytes held now, "total", "peak": {the same maxima, "total"}}."""
        r = ffi.new("zero_memory_report *")
        self._check(lib.zero_engine_get_memory_report(self._live_handle(), r))
        return _report_dict(r)

    def empty_cache(self):
        """Free the released module buffers the engine keeps for the next
        step (the report's "cache"), like torch.cuda.empty_cache()."""
        self._check(lib.zero_engine_empty_cache(self._live_handle()))

    def plan_info(self):
        i = ffi.new("zero_plan_info *")
        self._check(lib.zero_engine_get_plan_info(self._live_handle(), i))
        out = {name: getattr(i, name) for name, _ in ffi.typeof("zero_plan_info").fields}
        out["compute_dtype"] = string(lib.zero_dtype_name(i.compute_dtype))
        return out

    def stats(self):
        """What the engine did since finalize (zero_engine_stats) as a dict:
        steps, reduce_scatters, gathers, prefetches, prefetch_hits, ..."""
        st = ffi.new("zero_engine_stats *")
        self._check(lib.zero_engine_get_stats(self._live_handle(), st))
        return {name: int(getattr(st, name)) for name, _ in ffi.typeof("zero_engine_stats").fields}

    def param_info(self, param):
        pid = self.param(param).id
        i = ffi.new("zero_param_info *")
        self._check(lib.zero_engine_get_param_info(self._live_handle(), pid, i))
        out = {name: getattr(i, name) for name, _ in ffi.typeof("zero_param_info").fields}
        out["name"] = string(i.name)
        out["shape"] = tuple(i.shape[k] for k in range(i.ndim))
        out["dtype"] = string(lib.zero_dtype_name(i.dtype))
        return out

    # ================================================================ state
    def _owned(self, p):
        i = self.param_info(p)
        return int(i["owned_numel"])  # a split parameter's owned ranges, one after another

    def state_get(self, kind, param):
        """This rank's owned part of `param`'s fp32 state ("master",
        "moment1", "moment2") as a new float32 array."""
        p = self.param(param)
        out = np.empty(self._owned(p), dtype=np.float32)
        buf, _, _ = as_c_buffer(out, "state_get", dtype=np.float32, writable=True)
        self._check(lib.zero_engine_state_get(self._live_handle(), STATE_KINDS[kind], p.id, buf))
        return out

    def state_set(self, kind, param, values):
        """Write this rank's owned part; call params_changed() after "master"."""
        p = self.param(param)
        buf, _, _ = as_c_buffer(values, "state_set", dtype=np.float32, count=self._owned(p))
        self._check(lib.zero_engine_state_set(self._live_handle(), STATE_KINDS[kind], p.id, buf))

    def params_changed(self):
        """COLLECTIVE: re-derive the parameters from the master weights."""
        self._check(lib.zero_engine_params_changed(self._live_handle()))

    def read_param(self, param):
        """COLLECTIVE: the full fp32 master value of `param` (a new array)."""
        p = self.param(param)
        out = np.empty(p.shape, dtype=np.float32)
        buf, _, _ = as_c_buffer(out, "read_param", dtype=np.float32, writable=True)
        self._check(lib.zero_engine_read_param(self._live_handle(), p.id, buf))
        return out

    def scalars(self):
        s = ffi.new("zero_engine_scalars *")
        self._check(lib.zero_engine_get_scalars(self._live_handle(), s))
        return {name: getattr(s, name) for name, _ in ffi.typeof("zero_engine_scalars").fields}

    def set_scalars(self, **values):
        s = ffi.new("zero_engine_scalars *")
        self._check(lib.zero_engine_get_scalars(self._live_handle(), s))
        for k, v in values.items():
            setattr(s, k, v)
        self._check(lib.zero_engine_set_scalars(self._live_handle(), s))

    # ================================================================ checkpoints
    def save_checkpoint(self, directory, step=None, user=None, keep_last=0, durable=True, comm=None):
        """COLLECTIVE: save as directory/step-<step> (zero_checkpoint_save).
        step: defaults to the optimizer step count; user: a JSON-able dict
        stored with it; comm: a host-memory comm of the dp ranks (default:
        the engine's own, right for CPU engines)."""
        from . import checkpoint
        return checkpoint.save(self, directory, step, user, keep_last, durable, comm)

    def load_checkpoint(self, path, comm=None):
        """COLLECTIVE: load a step directory or a checkpoint directory's
        latest (any world size and stage). Returns a checkpoint.Loaded."""
        from . import checkpoint
        return checkpoint.load(self, path, comm)


__all__ = ["Engine", "Config", "StepResult", "Param", "Module", "ModuleViews", "memory_estimate"]
