"""zero.torch: a torch.nn.Module whose parameters live in libzero's engine.

    import zero.torch
    model = zero.torch.wrap(my_module, {"zero_optimization": {"stage": 3},
                                         "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                                         "gradient_clipping": 1.0},
                            wrap_policy={MyBlock})
    for x, y in batches:
        loss = loss_fn(model(x), y)
        model.backward(loss)        # or loss.backward(): the hooks do the work
        result = model.step()       # a zero.StepResult at each accumulation boundary

This module imports torch; `import zero` does not import it (torch is an
optional dependency of the bindings). docs/python.md, "zero.torch", is the
tutorial; the mechanics, in short:

  * Units. The module tree is cut into units like FSDP's auto-wrap policy
    (by module class, by parameter count, or a callable); each unit is one
    engine module (the stage-3 gather unit and the grads-ready unit); the
    root takes the parameters no unit claimed.
  * Parameters are zero-copy torch tensors over the engine's buffers
    (torch.from_numpy over the bindings' numpy views; on a CUDA engine,
    wrap(device="cuda"), torch.as_tensor over zero.DeviceArray's
    __cuda_array_interface__, with torch's current stream made the engine's
    compute stream, so the engine's stream contract orders gathers, gradient
    buffers and grads_ready with torch's kernels by events): at stages 0-2 for the
    engine's lifetime; at stage 3 a forward pre-hook gathers the unit and
    points each parameter's .data at the gathered buffer, a forward post-hook
    points them back at an empty tensor and releases the unit.
  * Saved tensors. At stage 3 autograd would keep views of a gathered buffer
    (a Linear saves weight.t()) past its release. A saved_tensors_hooks pair
    stores such a tensor as (parameter, size, stride, offset) instead and
    rebuilds the view from the re-gathered parameter in backward, so nothing
    outlives a release (a tensor that still did would make release raise, by
    the bindings' view rule, never read freed memory).
  * Backward. The post-hook also routes the unit's outputs through an
    identity autograd function whose backward runs before any of the unit's
    gradients: it gathers the unit again (stage 3) and points each
    parameter's .grad at the engine's gradient buffer, into which autograd's
    AccumulateGrad adds in place. A hook on each parameter's AccumulateGrad
    node counts the unit's parameters; when all have their gradient, the
    grads go back to None and grads_ready (then release) runs. At the end of
    backward, units that got no gradient are declared ready too (their
    buffers hold zeros), in a fixed order, so every rank makes the same
    collective calls.
"""
import warnings

import torch

from ._ffi import lib
from .comm import Comm, Device
from .config import as_config
from .engine import Engine
from .errors import ZeroInvalidArgumentError, ZeroInvalidStateError, ZeroUnsupportedError

_TORCH_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
_MARK = object()  # tags a saved tensor stored as a parameter reference


def _storage_ptr(t):
    try:
        return t.untyped_storage().data_ptr()
    except AttributeError:  # torch < 2.0
        return t.storage().data_ptr()


# ------------------------------------------------------------------ wrap policies
def class_policy(classes):
    """A wrap policy: every submodule that is an instance of one of `classes`."""
    classes = tuple(classes)
    return lambda module, unwrapped_numel: isinstance(module, classes)


def size_policy(min_num_params):
    """A wrap policy like FSDP's size_based_auto_wrap_policy: a submodule
    whose parameters not yet claimed by a unit below it number at least
    `min_num_params`."""
    return lambda module, unwrapped_numel: unwrapped_numel >= min_num_params


def _as_policy(policy):
    if policy is None:
        return lambda module, unwrapped_numel: False
    if isinstance(policy, (set, frozenset, list, tuple)):
        return class_policy(policy)
    if isinstance(policy, type):
        return class_policy((policy,))
    if isinstance(policy, (int, float)) and not isinstance(policy, bool):
        return size_policy(policy)
    if callable(policy):
        return policy
    raise ZeroInvalidArgumentError(f"zero.torch.wrap: wrap_policy must be module classes, a parameter count or "
                                   f"a callable(module, unwrapped_numel) -> bool, got {type(policy).__name__}")


class _Unit:
    """One engine module: a torch submodule and the parameters it owns."""

    def __init__(self, name, module, params):
        self.name, self.module, self.params = name, module, params  # params: [(full name, Parameter)]
        self.eng_module = None
        self.eng_params = []        # zero.Param per entry of params
        self.depth = 0              # forward gathers in flight (stage 3)
        self.bw_gathered = False    # gathered for backward (stage 3)
        self.grads_installed = False
        self.grad_views = []        # per entry of params: a tensor over its param_grad (installed); cleared in place
        self.done = 0               # params whose gradient arrived this micro-step
        self.ready = False          # grads_ready called this micro-step


class _PreBackward(torch.autograd.Function):
    """Identity on a unit's outputs; its backward runs before any gradient
    of the unit's parameters is computed."""

    @staticmethod
    def forward(ctx, owner, unit, *tensors):
        ctx.owner, ctx.unit = owner, unit
        return tuple(t.detach() for t in tensors)

    @staticmethod
    def backward(ctx, *grads):
        ctx.owner._pre_backward(ctx.unit)
        return (None, None) + grads


def _map_tensors(obj, fn):
    """obj with each tensor t replaced by fn(list of tensors) (tensors, tuples, lists, dicts)."""
    found = []

    def collect(o):
        if isinstance(o, torch.Tensor):
            found.append(o)
        elif isinstance(o, (tuple, list)):
            for x in o:
                collect(x)
        elif isinstance(o, dict):
            for x in o.values():
                collect(x)
    collect(obj)
    idx = [i for i, t in enumerate(found) if t.requires_grad]
    if not idx:
        return obj
    new = fn([found[i] for i in idx])
    repl = dict(zip(idx, new))
    it = iter(range(len(found)))

    def rebuild(o):
        if isinstance(o, torch.Tensor):
            i = next(it)
            return repl.get(i, o)
        if isinstance(o, tuple) and hasattr(o, "_fields"):
            return type(o)(*(rebuild(x) for x in o))
        if isinstance(o, (tuple, list)):
            return type(o)(rebuild(x) for x in o)
        if isinstance(o, dict):
            return type(o)((k, rebuild(v)) for k, v in o.items())
        return o
    return rebuild(obj)


class ZeroModule(torch.nn.Module):
    """A torch.nn.Module trained by a libzero engine. Made by wrap()."""

    def __init__(self, module, config=None, comm=None, wrap_policy=None, lr_schedule=None, param_groups=None,
                 device=None, **fields):
        super().__init__()
        if not isinstance(module, torch.nn.Module):
            raise ZeroInvalidArgumentError(f"zero.torch.wrap: expected a torch.nn.Module, got {type(module).__name__}")
        self.module = module
        cfg = as_config(config)
        for k, v in fields.items():
            setattr(cfg, k, v)
        self.device = _torch_device(device)
        self._cuda = self.device.type == "cuda"
        self._own_comm = comm is None
        if comm is None:  # a CUDA engine needs a device comm (engine.h); one GPU per rank: NCCL
            comm = Comm.world(backend="nccl", device=self.device.index) if self._cuda else Comm.world()
        self.comm = comm
        if self._cuda:
            zdev = Device("cuda", self.device.index)
            try:
                self.engine = Engine(self.comm, cfg, device=zdev)
            finally:
                zdev.close()  # destroyed after the engine (a dependent)
        else:
            self.engine = Engine(self.comm, cfg)
        self.stage = cfg.stage
        self.gradient_accumulation_steps = cfg.gradient_accumulation_steps
        self.lr_schedule = lr_schedule
        self._dtype = _TORCH_DTYPES[cfg.compute_dtype]
        self._micro = 0
        self._in_backward = False
        self._units = self._make_units(module, _as_policy(wrap_policy))
        self._unit_of = {}
        for u in self._units:
            for _, p in u.params:
                self._unit_of[p] = u
        self._stream = None  # CUDA: the torch stream that is the engine's compute stream
        self._register(param_groups)
        self._follow_stream()
        self._empty = torch.empty(0, dtype=self._dtype, device=self.device)
        self._data = {}        # Parameter -> torch tensor over param_data (stage 0-2, persistent)
        self._gathered = {}    # storage ptr -> Parameter, stage 3 gathered views
        self._attach()

    # ------------------------------------------------------------ construction
    def _make_units(self, root, policy):
        units, seen = [], {}
        order = {id(m): i for i, m in enumerate(root.modules())}

        def assign(mod, prefix, is_root):
            rem = []
            for pn, p in mod.named_parameters(recurse=False):
                if p is None or not p.requires_grad:
                    continue  # frozen parameters stay torch's (docs/python.md)
                if id(p) in seen:
                    if seen[id(p)] is not mod:
                        rem.append((None, p))  # shared: must land in the same unit (checked below)
                    continue
                seen[id(p)] = mod
                rem.append((prefix + pn, p))
            for cn, child in mod.named_children():
                rem += assign(child, prefix + cn + ".", False)
            numel = sum(p.numel() for n, p in rem if n is not None)
            if rem and (is_root or policy(mod, numel)):
                units.append((order[id(mod)], _Unit(prefix[:-1] or "root", mod, rem)))
                return []
            return rem
        assign(root, "", True)
        units.sort(key=lambda x: x[0])  # registration in module (pre-)order: the root first
        out = []
        for _, u in units:
            named = {id(p) for n, p in u.params if n is not None}
            for n, p in u.params:
                if n is None and id(p) not in named:
                    raise ZeroInvalidArgumentError(
                        f"zero.torch.wrap: a parameter shared between units (unit '{u.name}' uses one owned by "
                        f"another unit); put the modules that share it in one unit (wrap_policy)")
            u.params = [(n, p) for n, p in u.params if n is not None]
            out.append(u)
        if not out:
            raise ZeroInvalidArgumentError("zero.torch.wrap: the module has no trainable parameters")
        return out

    def _groups(self, param_groups):
        """{Parameter: engine group id} from torch-style param_groups."""
        if param_groups is None:
            return {}
        if not hasattr(self.engine, "add_group"):
            raise ZeroUnsupportedError("zero.torch.wrap: param_groups need parameter groups in libzero "
                                       "(zero_engine_add_group), which this build lacks")
        base_lr = self.engine.config.lr
        known = {p for u in self._units for _, p in u.params}
        out = {}
        for i, g in enumerate(param_groups):
            if not isinstance(g, dict) or "params" not in g:
                raise ZeroInvalidArgumentError(f"zero.torch.wrap: param_groups[{i}] must be a dict with 'params'")
            extra = set(g) - {"params", "name", "lr", "weight_decay", "betas", "eps"}
            if extra:
                raise ZeroInvalidArgumentError(f"zero.torch.wrap: param_groups[{i}]: unsupported key(s) "
                                               f"{sorted(extra)} (params, name, lr, weight_decay, betas, eps)")
            if "lr" in g and base_lr <= 0:
                raise ZeroInvalidArgumentError(f"zero.torch.wrap: param_groups[{i}] sets lr but the config's lr is "
                                               f"{base_lr} (a group's lr is the config's lr x a scale)")
            gid = self.engine.add_group(g.get("name", f"group{i}"),
                                        lr_scale=g["lr"] / base_lr if "lr" in g else 1.0,
                                        weight_decay=g.get("weight_decay"), betas=g.get("betas"), eps=g.get("eps"))
            for p in g["params"]:
                if p in out:
                    raise ZeroInvalidArgumentError(f"zero.torch.wrap: a parameter is in param_groups[{i}] and "
                                                   f"an earlier group")
                if p not in known:
                    raise ZeroInvalidArgumentError(f"zero.torch.wrap: param_groups[{i}] holds a tensor that is not a "
                                                   f"trainable parameter of the module")
                out[p] = gid
        return out

    def _register(self, param_groups):
        eng = self.engine
        group_of = self._groups(param_groups)
        for u in self._units:
            u.eng_module = eng.add_module(u.name)
            for n, p in u.params:
                if p.dim() > 8:
                    raise ZeroInvalidArgumentError(f"zero.torch.wrap: parameter '{n}' has {p.dim()} dimensions (at most 8)")
                init = p.detach().to("cpu", torch.float32).contiguous().numpy().reshape(tuple(p.shape) or (1,))
                kw = {"group": group_of[p]} if p in group_of else {}
                u.eng_params.append(eng.add_param(u.eng_module, n, init=init, **kw))
        # AccumulateGrad nodes are made now, while every parameter has its
        # full shape (their input metadata is that shape), and kept alive.
        # They are made with the dtype and device _attach gives the data:
        # torch drops a parameter's AccumulateGrad when .data changes dtype
        # or device (and makes another, without our hook), so a bf16/fp16
        # engine or a CUDA one gets a zero-stride stand-in of that dtype on
        # that device first, which _attach replaces.
        self._acc_nodes = []
        with torch.enable_grad():
            for u in self._units:
                u.grad_views = [None] * len(u.params)
                for i, (_, p) in enumerate(u.params):
                    if self._cuda or p.dtype != self._dtype:
                        p.data = torch.zeros((), dtype=self._dtype, device=self.device).expand(p.shape)
                    node = p.expand_as(p).grad_fn.next_functions[0][0]
                    node.register_hook(self._make_grad_hook(u, i, p))
                    self._acc_nodes.append(node)
        eng.finalize()

    def _attach(self):
        eng = self.engine
        for u in self._units:
            for (_, p), ep in zip(u.params, u.eng_params):
                if self.stage < 3 or eng._persistent[ep.id]:
                    t = self._param_tensor(ep, p)
                    self._data[p] = t
                    p.data = t
                else:
                    p.data = self._empty
            if self.stage == 3:
                u.module.register_forward_pre_hook(self._make_pre_forward(u))
            u.module.register_forward_hook(self._make_post_forward(u))

    def _param_tensor(self, ep, p):
        """A tensor over the engine's parameter buffer (zero-copy)."""
        if self._cuda:  # writable: torch refuses read-only arrays; the engine's values change only in step()
            return self._tensor(self.engine.param_data_device(ep, writable=True), p)
        arr = self.engine.param_data(ep)
        arr.flags.writeable = True  # as above
        return self._tensor(arr, p)

    def _grad_tensor(self, ep, p):
        """A tensor over the engine's gradient buffer (zero-copy)."""
        if self._cuda:
            return self._tensor(self.engine.param_grad_device(ep), p)
        return self._tensor(self.engine.param_grad(ep), p)

    def _tensor(self, arr, p):
        if self._cuda:  # __cuda_array_interface__; the DeviceArray (and its lease) lives as long as the storage
            t = torch.as_tensor(arr, device=self.device)
        else:
            if arr.dtype == "uint16":  # bf16 bits: torch.from_numpy takes int16, not uint16
                arr = arr.view("int16")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t = torch.from_numpy(arr)
        if self._dtype == torch.bfloat16:
            t = t.view(torch.bfloat16)
        return t.view(p.shape) if p.dim() == 0 else t

    def _follow_stream(self):
        """CUDA: make torch's current stream the engine's compute stream
        (engine.h "streams"), so gathers, fresh gradient buffers and
        grads_ready order themselves with torch's kernels by events, without
        host synchronisation. Called at wrap and at each forward: a caller
        that switches streams (torch.cuda.stream(s)) moves the engine along."""
        if not self._cuda:
            return
        s = torch.cuda.current_stream(self.device)
        if self._stream is None or s.cuda_stream != self._stream.cuda_stream:
            self.engine.set_compute_stream(s.cuda_stream)
            self._stream = s  # kept: the engine enqueues on it

    # ------------------------------------------------------------ stage 3 gather/release
    def _gather(self, u):
        eng = self.engine
        eng.gather(u.eng_module)
        for (_, p), ep in zip(u.params, u.eng_params):
            if p not in self._data:
                t = self._param_tensor(ep, p)
                self._gathered[_storage_ptr(t)] = p
                p.data = t

    def _release(self, u):
        for _, p in u.params:
            if p not in self._data:
                self._gathered.pop(_storage_ptr(p.data), None)
                p.data = self._empty
        self.engine.release(u.eng_module)

    def _make_pre_forward(self, u):
        def hook(module, inputs):
            if u.depth == 0 and not u.bw_gathered:
                self._gather(u)
            else:
                self.engine.gather(u.eng_module)  # nested: the engine counts
            u.depth += 1
        return hook

    def _make_post_forward(self, u):
        def hook(module, inputs, output):
            if self.stage == 3:
                u.depth -= 1
                if u.depth == 0 and not u.bw_gathered:
                    self._release(u)
                else:
                    self.engine.release(u.eng_module)
            if not torch.is_grad_enabled():
                return output
            return _map_tensors(output, lambda ts: _PreBackward.apply(self, u, *ts))
        return hook

    def _pack(self, t):
        p = self._gathered.get(_storage_ptr(t)) if t.layout == torch.strided else None
        if p is None:
            return t
        return (_MARK, p, tuple(t.size()), tuple(t.stride()), t.storage_offset())

    def _unpack(self, x):
        if type(x) is not tuple or x[0] is not _MARK:
            return x
        _, p, size, stride, offset = x
        u = self._unit_of[p]
        if p not in self._data and not u.bw_gathered:
            self._pre_backward(u)  # an autograd path around the unit's outputs: gather now
        return torch.as_strided(p.detach(), size, stride, offset)

    # ------------------------------------------------------------ backward
    def _begin_backward(self):
        if not self._in_backward:
            self._in_backward = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)

    def _pre_backward(self, u):
        self._begin_backward()
        if self.stage == 3 and not u.bw_gathered and u.depth == 0:
            self._gather(u)
            u.bw_gathered = True
        self._install_grads(u)

    def _install_grads(self, u):
        if u.grads_installed or u.ready:
            return
        views = u.grad_views
        if self.stage >= 2 and not self._cuda and views[0] is None:
            self._grad_block_views(u)
        for i, ((_, p), ep) in enumerate(zip(u.params, u.eng_params)):
            if views[i] is None:  # stages 0-1: made once; 2-3: a fresh buffer each micro-step
                views[i] = self._grad_tensor(ep, p)
            p.grad = views[i]
        u.grads_installed = True

    def _grad_block_views(self, u):
        """Stages 2-3 on the CPU: the unit's gradient buffer is fresh each
        micro-step, so its tensors are made again each micro-step: one leased
        numpy view of the whole unit (Engine._grad_block) and, per parameter,
        a numpy slice of it as a tensor (torch.from_numpy of a writable array:
        no warning to silence), instead of a leased view per parameter and
        warnings.catch_warnings around each from_numpy (issue 12: ~1.5 us a
        parameter instead of ~13 with torch 2.15). The slices keep the
        block's lease alive as the per-parameter views did, so the bindings'
        rule still holds: a gradient tensor kept past its unit's grads_ready
        makes grads_ready raise, never read a reused buffer."""
        arr, offs = self.engine._grad_block(u.eng_params)
        bf16 = self._dtype == torch.bfloat16
        if bf16:  # bf16 bits: torch.from_numpy takes int16, not uint16
            arr = arr.view("int16")
        views = u.grad_views
        for i, ((_, p), ep) in enumerate(zip(u.params, u.eng_params)):
            t = torch.from_numpy(arr[offs[i]:offs[i] + ep.numel].reshape(tuple(p.shape)))
            views[i] = t.view(torch.bfloat16) if bf16 else t

    def _make_grad_hook(self, u, i, p):
        # Runs once per parameter per backward: the unit, the slot and the
        # count are bound here, so the hot path does no dict lookup (a
        # Tensor's __hash__ is a Python call) and no method call when nothing
        # is unusual (docs/python.md, "Overhead").
        views, n = u.grad_views, len(u.params)

        def hook(grad_inputs, grad_outputs):
            if u.ready:
                raise ZeroInvalidStateError(
                    f"zero.torch: a gradient of '{u.name}' arrived after its grads_ready; call step() (or "
                    f"backward once per micro-step) before another backward")
            if not self._in_backward:
                self._begin_backward()
            if not u.grads_installed or p.grad is not views[i]:
                # autograd made its own gradient (a path around the unit's outputs): add it in.
                own = p.grad
                self._install_grads(u)
                views[i].add_(own)
                p.grad = views[i]
            u.done += 1
            if u.done == n:
                self._grads_ready(u)
        return hook

    def _grads_ready(self, u):
        for _, p in u.params:
            p.grad = None
        if self.stage >= 2:
            u.grad_views[:] = [None] * len(u.params)  # in place: the hooks hold the list
        u.grads_installed = False
        self.engine.grads_ready(u.eng_module)
        u.ready = True
        if u.bw_gathered:
            u.bw_gathered = False
            self._release(u)

    def _end_backward(self):
        self._in_backward = False
        for u in reversed(self._units):  # units no gradient reached: zeros, in one order on every rank
            if not u.ready:
                self._grads_ready(u)
        for u in self._units:
            u.ready, u.done = False, 0

    # ------------------------------------------------------------ the training API
    def forward(self, *args, **kwargs):
        self._follow_stream()
        if self.stage == 3:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                return self.module(*args, **kwargs)
        return self.module(*args, **kwargs)

    def backward(self, loss):
        """loss.backward(), scaled by the engine's loss scale (fp16); every
        unit's grads_ready has run when it returns."""
        scale = self.engine.loss_scale
        (loss * scale if scale != 1.0 else loss).backward()

    def step(self):
        """Call after every backward (DeepSpeed's engine.step): at the
        gradient_accumulation_steps-th micro-step the optimizer step runs
        (the lr from lr_schedule(step index) first, when given) and its
        zero.StepResult is returned; otherwise None."""
        self._micro += 1
        if self._micro < self.gradient_accumulation_steps:
            return None
        self._micro = 0
        if self.lr_schedule is not None:
            self.engine.lr = self.lr_schedule(self.global_steps)
        return self.engine.step()

    @property
    def global_steps(self):
        """Optimizer steps applied so far."""
        return int(self.engine.scalars()["step"])

    @property
    def lr(self):
        return self.engine.lr

    @lr.setter
    def lr(self, value):
        self.engine.lr = value

    def zero_grad(self, set_to_none=True):
        """Discard the gradients accumulated since the last step."""
        self.engine.zero_grad()
        self._micro = 0

    def memory_report(self):
        """The engine's memory report: {"params", "grads", "master", "moments",
        "buffers", "other", "cache": bytes, "total", "peak": {...}}."""
        return self.engine.memory_report()

    def empty_cache(self):
        """Free the module buffers kept between steps (the report's "cache")."""
        self.engine.empty_cache()

    def full_parameters(self):
        """COLLECTIVE: {name: full fp32 value (a new torch tensor)} of every parameter."""
        out = {}
        for u in self._units:
            for (n, p), ep in zip(u.params, u.eng_params):
                out[n] = torch.from_numpy(self.engine.read_param(ep)).view(tuple(p.shape) if p.dim() == 0 else ep.shape)
        return out

    def save_checkpoint(self, directory, step=None, user=None, keep_last=0):
        """COLLECTIVE: libzero's sharded checkpoint (zero.checkpoint), loadable at
        any world size and stage. Returns the step directory."""
        return self.engine.save_checkpoint(directory, step=step, user=user, keep_last=keep_last)

    def load_checkpoint(self, path):
        """COLLECTIVE: load a step directory (or a checkpoint directory's latest).
        The parameters' tensors keep their identity and show the loaded values."""
        return self.engine.load_checkpoint(path)

    def close(self):
        for u in self._units:
            for _, p in u.params:
                p.grad = None
                p.data = self._empty
        self._data.clear()
        for u in self._units:
            u.grad_views[:] = [None] * len(u.params)
        self._gathered.clear()
        self.engine.close()
        if self._own_comm:
            self.comm.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def units(self):
        """[(unit name, [parameter names])] in registration order."""
        return [(u.name, [n for n, _ in u.params]) for u in self._units]


def no_decay_groups(module, weight_decay=None):
    """torch's usual recipe as param_groups: tensors of 2+ dimensions (matmul
    weights, embeddings) decay, the rest (biases, LayerNorm gains) get
    weight_decay 0. weight_decay: the decaying group's (None: the config's)."""
    decay, no_decay = [], []
    for p in module.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    g = {"params": decay, "name": "decay"}
    if weight_decay is not None:
        g["weight_decay"] = weight_decay
    return [g, {"params": no_decay, "name": "no_decay", "weight_decay": 0.0}]


def _torch_device(device):
    """The torch.device the parameters live on: None/"cpu" (host buffers,
    numpy views), "cuda", "cuda:N", a torch.device or an int N (a CUDA engine
    on GPU N; "cuda": torch's current device). Refused by name where this
    torch or this libzero has no CUDA."""
    if device is None:
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (TypeError, RuntimeError) as e:
        raise ZeroInvalidArgumentError(f"zero.torch.wrap: device {device!r} is not a torch device: {e}") from None
    if dev.type == "cpu":
        return dev
    if dev.type != "cuda":
        raise ZeroUnsupportedError(f"zero.torch.wrap: device {device!r}: libzero's engine runs on the CPU or a "
                                   f"CUDA GPU, not on {dev.type}")
    if not torch.cuda.is_available():
        why = ("this torch was built without CUDA" if torch.version.cuda is None else
               f"this torch (CUDA {torch.version.cuda}) sees no GPU")
        raise ZeroUnsupportedError(f"zero.torch.wrap: device {device!r}: torch.cuda.is_available() is False "
                                   f"({why}); use device='cpu'")
    if not lib.zero_py_cuda_handles():
        raise ZeroUnsupportedError(f"zero.torch.wrap: device {device!r}: the loaded libzero was built without CUDA "
                                   f"(no zero_stream_wrap_cuda); build it with -Dcuda=enabled")
    return torch.device("cuda", torch.cuda.current_device() if dev.index is None else dev.index)


def wrap(module, config=None, comm=None, *, wrap_policy=None, lr_schedule=None, param_groups=None, device=None,
         **fields):
    """Move `module`'s trainable parameters into a libzero engine; returns a
    ZeroModule (call it like the module; then backward(loss), step()).

    config: a DeepSpeed-style dict, JSON file path or JSON text, or a
      zero.Config (zero_optimization.stage 0-3, optimizer, gradient_clipping,
      gradient_accumulation_steps, bf16/fp16, offload); keyword arguments
      override single fields by their C names (stage=3, lr=1e-3).
    comm: the data-parallel zero.Comm (default zero.Comm.world(): MPI under
      mpirun, else one local rank).
    wrap_policy: the stage-3 gather / grads-ready units, like FSDP's
      auto-wrap: a set of module classes, a parameter count (a submodule with
      at least that many parameters not claimed below it), or
      callable(module, unwrapped_numel) -> bool. The root unit takes the rest.
    lr_schedule: callable(step index) -> lr, applied before each optimizer step.
    device: where the parameters live: None / "cpu" (the default), or
      "cuda" / "cuda:N" / torch.device: a CUDA engine on that GPU whose
      parameters and gradients are CUDA tensors over its device buffers
      (zero-copy, __cuda_array_interface__), computing on torch's current
      stream; its comm must be NCCL or STAGED (the default comm: NCCL).
    param_groups: torch-style [{"params": [...], "weight_decay": 0.0, "lr": ...,
      "betas": ..., "eps": ..., "name": ...}, ...] (no_decay_groups(module) is
      the usual recipe); a group's "lr" is relative to the config's lr (the
      engine's lr_scale), so a schedule keeps the groups' ratio. Parameters in
      no group train with the config's values.

    COLLECTIVE (finalize): every rank wraps the same module the same way."""
    return ZeroModule(module, config, comm, wrap_policy=wrap_policy, lr_schedule=lr_schedule,
                      param_groups=param_groups, device=device, **fields)


__all__ = ["wrap", "ZeroModule", "class_policy", "size_policy", "no_decay_groups"]
