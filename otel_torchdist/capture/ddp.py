"""DistributedDataParallel: one record per gradient bucket, the configuration once, DDP's own statistics.

DDP's reducer issues the gradient all-reduces from C++, where no Python patch reaches. On gloo, with the
native part built, its reducer is handed the native process group instead (ddp_native.py: no comm hook,
DDP's own bucket path kept). Otherwise each DDP built while instrumented gets a trampoline comm hook. By default it does what DDP does without a hook
(``no_hook_allreduce``: scale by the reciprocal of the group size, or by the ranks not yet joined under
``Join(divide_by_initial_world_size=False)``, and divide a sparse gradient, then all-reduce;
bit-identical parameters but for docs/training-paths.md's one case)
and records the bucket itself: the record carries the framework context (framework ``ddp``,
phase ``backward``, the bucket's index, bytes, parameter count and whether it is the last) and ends in the
callback that hands the reduced bucket back to DDP. That is one Python callback per bucket on the
backend's thread, as with torch's own Python hook, instead of two (DDP's and the c10d capture's), and no
pass through ``dist.all_reduce``'s Python checks. Buckets that path cannot take as is (complex
gradients, a torch function mode, a coalescing block) and comm hooks the user registers go through
``dist.all_reduce``, which the c10d capture records, inside the same framework context. A hook the
user registers later replaces the trampoline's inner hook instead of being registered a second time (the
reducer accepts one hook only), so it keeps working and is measured the same way; builtin hooks map to
their Python twins.

DDPs built before ``instrument()`` are found once (garbage-collector scan) and given the trampoline when
they have no hook yet. One whose hook was registered before ``instrument()`` keeps it untouched: its
collectives are still recorded where the hook calls ``torch.distributed``, without bucket facts.

The construction is recorded as a ``ddp.init`` span (configuration, parameter counts) and model gauges;
every ``LOGGING_EVERY`` forwards DDP's own logging data (sampled averages of forward/backward compute,
backward communication and their overlap; buckets) is read on the training thread and exported as
gauges, and ``find_unused_parameters=True`` with nothing ever unused raises a ``ddp_config`` warning.
"""

from __future__ import annotations

import functools
import gc
import logging
import sys
import types
import weakref
from time import perf_counter_ns
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook as _allreduce_hook
from torch.overrides import has_torch_function as _has_torch_function

from .. import bandwidth as bw
from .. import health
from .. import names as n
from ..patching import Patch
from . import c10d as c10d_capture
from . import caller, completion, context, ddp_native, framework_spans, groups
from . import record as R

_graph_task_id = torch._C._current_graph_task_id
_is_compiling = torch.compiler.is_compiling
_Tensor = torch.Tensor
# Record fields the bucket path fills, bound once (a module attribute read per field per bucket otherwise).
_BWD, _STEPCTX, _PARENT, _T_START, _T_END, _SEQ, _END = R.BWD, R.STEPCTX, R.PARENT, R.T_START, R.T_END, R.SEQ, R.END
_STEP = R.STEP
_inflight = completion._inflight

_log = logging.getLogger("otel_torchdist")
LOGGING_EVERY = 50
WASTE_CHECK_AFTER = 10  # iterations before deciding find_unused_parameters=True was unnecessary
_READ_AT = frozenset({3, WASTE_CHECK_AFTER + 2})  # forwards that read DDP's logging data (and every LOGGING_EVERY)

_state: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # DDP -> _Trampoline
# id(DDP) -> forward count, dropped when the model is collected: a plain dict read per forward, where a
# WeakKeyDictionary made two weak references in Python each time.
_forwards: dict[int, int] = {}
_warned: weakref.WeakSet = weakref.WeakSet()
_coalescing = c10d_capture._coalesce_state  # c10d's coalescing blocks by group, read without the property
_SUM = dist.ReduceOp.SUM
SOURCE = "ddp_hook"


class _Trampoline:
    """The comm hook state the reducer holds: which hook to run, on which state."""

    __slots__ = (
        "inner_hook", "inner_state", "user_hook_registered", "ddp", "model", "contexts", "buckets", "join_work",
        "divisor", "__weakref__",
    )  # fmt: skip

    def __init__(self, ddp: Any) -> None:
        self.inner_hook = no_hook_allreduce
        self.inner_state = ddp.process_group
        self.user_hook_registered = False
        self.ddp = weakref.ref(ddp)
        self.model = model_name(ddp)
        # A bucket's facts are the same every step once DDP has rebuilt its buckets (after the first), so
        # they are read once. A registered hook's path: (index, bytes, last) -> (the context it covers, the
        # bucket's context); the default hook's: id of the bucket's buffer -> _Bucket.
        self.contexts: dict[tuple, tuple] = {}
        self.buckets: dict[int, _Bucket] = {}
        # Under Join(divide_by_initial_world_size=False) DDP divides by the ranks not yet joined, which the
        # forward's join all-reduce counts (its work, until the backward reads it; then the count)
        self.join_work: Any = None
        self.divisor: int | None = None


# True while instrumented (patches() sets it): a trampoline outlives uninstrument() on its model, and must
# then record nothing, since nothing drains the queue.
_LIVE = False


def no_hook_allreduce(process_group: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """What DDP does without a comm hook, as one: each gradient scaled by the reciprocal of the group size,
    then summed. The reducer scales while copying gradients into the bucket (``mul_out`` by
    ``1.0 / world size``) and only when no hook is registered; ``default_hooks.allreduce_hook`` divides
    instead, which for group sizes that are not powers of two differs in the last bit of about a third of
    the values, so the trampoline would change a job's numbers if it ran that one."""
    return _no_hook_allreduce(process_group, bucket, None)


def _no_hook_allreduce(process_group: Any, bucket: dist.GradBucket, state: _Trampoline | None) -> torch.futures.Future[torch.Tensor]:
    group = process_group if process_group is not None else c10d._get_default_group()
    tensor = bucket.buffer()
    _scale(tensor, _divisor(state, group.size()))
    return dist.all_reduce(tensor, group=group, async_op=True).get_future().then(_first)


def _scale(tensor: torch.Tensor, divisor: int) -> None:
    """As the reducer scales a bucket without a hook: dense gradients multiplied by the reciprocal as they are
    copied in, a sparse one divided (``Reducer::mark_variable_ready_sparse``)."""
    if tensor.is_sparse:
        tensor.div_(divisor)
    else:
        tensor.mul_(1.0 / divisor)


def _divisor(state: _Trampoline | None, size: int) -> int:
    """What the reducer divides a bucket by: the group's size, or under ``Join(divide_by_initial_world_size=
    False)`` the ranks not yet joined, as the forward's join all-reduce counted them
    (``Reducer::set_divide_factor``)."""
    if state is None:
        return size
    work = state.join_work
    if work is not None:
        state.join_work = None
        try:
            work.wait()
            state.divisor = int(work.get_future().value()[0].item())
        except Exception as exc:
            health.error("ddp", "could not read how many ranks have not joined; DDP's buckets are divided by the group size", exc)
            state.divisor = None
    return state.divisor or size


def _wrap_notify_join(orig: Any) -> Any:
    """``Join.notify_join_context``: a DDP under ``Join(divide_by_initial_world_size=False)`` keeps its join
    all-reduce's work for its backward's divisor (``_divisor``)."""
    notify = orig.__func__ if isinstance(orig, staticmethod) else orig

    def notify_join_context(joinable: Any) -> Any:
        work = notify(joinable)
        if _LIVE:
            try:
                state = _state.get(joinable)
                if state is not None:
                    dynamic = work is not None and not getattr(joinable, "_divide_by_initial_world_size", True)
                    state.join_work, state.divisor = (work if dynamic else None), None
            except Exception as exc:
                health.error("ddp", "could not follow DDP's Join", exc)
        return work

    notify_join_context.__wrapped__ = notify
    return staticmethod(notify_join_context)


def otel_torchdist_ddp_hook(state: _Trampoline, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook installed by otel-torchdist: records the default all-reduce itself, else runs the
    registered hook inside the bucket's framework context (``_general``).

    The default all-reduce (``no_hook_allreduce``, or torch's ``allreduce_hook`` when registered) is written
    out here with the bucket recorded (it runs for every bucket of every step). It mirrors
    ``dist.all_reduce(tensor, group, async_op=True)`` for the only case it is used for: one plain real
    tensor of a group this rank belongs to, outside torch function modes and coalescing blocks; anything
    else takes the general path.
    """
    inner = state.inner_hook
    if not _LIVE or (inner is not no_hook_allreduce and inner is not _allreduce_hook):
        return _general(state, bucket)
    group = state.inner_state
    tensor = bucket.buffer()
    if group is None:
        group = c10d._get_default_group()
    if tensor.__class__ is not _Tensor or _has_torch_function((tensor,)) or (_coalescing and group in _coalescing):
        return _general(state, bucket)
    try:
        facts = state.buckets.get(id(tensor))
        if facts is None or facts.ref() is not tensor or facts.base is not R.TLS.ctx or facts.group is not group:
            facts = _bucket(state, bucket, group, tensor)
            if facts is None:
                return _general(state, bucket)
        rec = facts.template.copy()
        rec[_BWD] = _graph_task_id() != -1
        rec[_STEPCTX] = _STEP[0]
        rec[_PARENT] = caller.get_current() or None
    except Exception as exc:
        health.error("ddp", "could not describe a DDP bucket", exc)
        return _general(state, bucket)
    # Scaled before the all-reduce, as DDP and its hooks do, so that fp16 sums do not overflow.
    if inner is no_hook_allreduce:
        _scale(tensor, _divisor(state, facts.size))
    else:
        tensor.div_(facts.size)
    rec[_T_START] = perf_counter_ns()
    try:
        work = group.allreduce([tensor], _OPTIONS)
    except BaseException as exc:
        c10d_capture._fail(rec, exc)
        raise
    try:
        gi = facts.info
        if gi.completion is groups.COMPLETION_FUTURE:
            rec[_SEQ] = group._get_sequence_number_for_group() if gi.seq_supported else gi.next_seq()
            join = _BucketJoin(rec)
            _inflight[id(join)] = join  # the hang watchdog sees it until it completes
            return work.get_future().then(join.reduced)
        c10d_capture._finish(rec, work)
    except Exception as exc:
        health.error("ddp", "could not follow a DDP bucket's all-reduce", exc)
    return work.get_future().then(_first)


def _general(state: _Trampoline, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The registered hook (or torch's, for buckets the default path does not take) in the bucket's context;
    after uninstrument(), the hook alone."""
    if state.inner_hook is no_hook_allreduce:
        hook, hook_state = functools.partial(_no_hook_allreduce, state=state), state.inner_state
    else:
        hook, hook_state = state.inner_hook, state.inner_state
    if not _LIVE:
        return hook(hook_state, bucket)
    try:
        buffer = bucket.buffer()
        token = R.TLS.ctx
        R.TLS.ctx = _bucket_context(state, bucket, buffer.numel() * buffer.element_size())
    except Exception as exc:
        health.error("ddp", "could not describe a DDP bucket", exc)
        return hook(hook_state, bucket)
    try:
        return hook(hook_state, bucket)
    finally:
        R.TLS.ctx = token


def _bucket_context(state: _Trampoline, bucket: dist.GradBucket, nbytes: int) -> tuple:
    """The framework context of a bucket that a registered hook all-reduces (general path)."""
    base = R.TLS.ctx
    key = (bucket.index(), nbytes, bucket.is_last())
    cached = state.contexts.get(key)
    if cached is not None and cached[0] is base:
        return cached[1]
    ctx = _derive(state, bucket, key[0], nbytes, key[2])
    state.contexts[key] = (base, ctx)
    return ctx


def model_name(ddp: Any) -> str:
    """The module of a DDP model's collectives: the model as the user wrote it (``Net``; CommDebugMode says
    ``DistributedDataParallel.module``). A bucket holds gradients of many layers, so it is the model's; naming
    the layer whose backward ran when it filled would take hooks on every module (CommDebugMode's cost)."""
    return context.class_name(ddp.module)


def _derive(state: _Trampoline, bucket: dist.GradBucket, index: int, nbytes: int, last: bool) -> tuple:
    facts = (
        n.DDP_BUCKET_INDEX,
        index,
        n.DDP_BUCKET_BYTES,
        nbytes,
        n.DDP_BUCKET_PARAMS,
        len(bucket.parameters()),
        n.DDP_BUCKET_LAST,
        last,
    )
    return context.derive(framework="ddp", module=state.model, phase="backward", extras=facts)


def _options() -> Any:
    opts = dist.AllreduceOptions()
    opts.reduceOp = _SUM
    opts.asyncOp = True
    return opts


_OPTIONS = _options()  # read only: the backend copies what it needs when the call is issued


class _Bucket:
    """What stays the same for one bucket from step to step: its record up to the per-call fields, its
    group's facts, and the context it was made in. Found by the bucket's buffer, which DDP keeps for the
    life of a bucket layout; the Python tensor wrapping it is the same object every step (PyTorch keeps a
    tensor's Python object alive with the tensor), so its id is the key and a weak reference confirms it."""

    __slots__ = ("ref", "base", "group", "info", "size", "template")

    def __init__(self, tensor: torch.Tensor, base: Any, group: Any, info: Any, template: list) -> None:
        self.ref = weakref.ref(tensor)
        self.base, self.group, self.info, self.size, self.template = base, group, info, group.size(), template


def _bucket(state: _Trampoline, bucket: dist.GradBucket, group: Any, tensor: torch.Tensor) -> _Bucket | None:
    """A bucket's facts, made on its first all-reduce in a layout and context (None: take the general path)."""
    if tensor.is_complex():
        return None
    gi = groups.info(group)
    if gi is None:
        return None
    buckets = state.buckets
    for key in [key for key, facts in buckets.items() if facts.ref() is None]:
        del buckets[key]  # layouts DDP has rebuilt away
    numel = tensor.numel()  # a bucket's buffer is flat
    nbytes = numel * tensor.element_size()
    rec = R.new("all_reduce", bw.ALL_REDUCE, SOURCE, gi.gid)
    rec[R.NBYTES] = nbytes
    rec[R.NUMEL] = numel
    rec[R.NTENSORS] = 1
    rec[R.DTYPE] = tensor.dtype
    rec[R.SHAPES] = (1, numel)
    rec[R.ASYNC] = True
    rec[R.REDOP] = _SUM
    rec[R.CTX] = _derive(state, bucket, bucket.index(), nbytes, bucket.is_last())
    facts = buckets[id(tensor)] = _Bucket(tensor, R.TLS.ctx, group, gi, rec)
    return facts


class _BucketJoin(completion._Join):
    """A bucket's record until its all-reduce completes (one work, no lock)."""

    __slots__ = ()

    def __init__(self, rec: list) -> None:
        self.rec, self.remaining, self.source, self.lock = rec, 1, n.END_FUTURE, None

    def reduced(self, fut: torch.futures.Future) -> torch.Tensor:
        """DDP's callback for the bucket, on the backend's thread: the all-reduce has completed."""
        t_end = perf_counter_ns()
        try:
            value = fut.value()
        except BaseException as exc:
            _end(self, exc)
            raise  # DDP sees the failure, as with torch's own hook
        try:
            # join.done() for the one case here: one work, no error.
            rec = self.rec
            _inflight.pop(id(self), None)
            rec[_T_END] = t_end
            rec[_END] = n.END_FUTURE
            R.push(rec)
        except Exception as exc:
            health.error("ddp", "could not complete a DDP bucket record", exc)
        return value[0]


def _end(join: Any, error: BaseException | None) -> None:
    try:
        join.done(n.END_FUTURE, error)
    except Exception as exc:
        health.error("ddp", "could not complete a DDP bucket record", exc)


def _first(fut: torch.futures.Future) -> torch.Tensor:
    return fut.value()[0]


def _install_trampoline(ddp: Any) -> None:
    if ddp in _state or getattr(ddp, "reducer", None) is None:
        return
    if ddp._get_ddp_logging_data().get("comm_hook"):
        return  # a hook is in already (DDP's own mixed-precision hook, say): the reducer takes no second
    trampoline = _Trampoline(ddp)
    # Straight to the reducer, not through register_comm_hook: that would add the trampoline to
    # ddp._comm_hooks, which DDP's compiled-autograd path calls with (grad, param) tuples.
    dist._register_comm_hook(ddp.reducer, trampoline, otel_torchdist_ddp_hook)
    _state[ddp] = trampoline
    # The reducer takes one hook and cannot drop it: the trampoline stays for the model's life, and so do
    # this model's own registration methods, which hand a later hook to it (after uninstrument() too,
    # when the class's methods are torch's again and the reducer would refuse a second hook).
    ddp.register_comm_hook = types.MethodType(_register_comm_hook, ddp)
    ddp._register_builtin_comm_hook = types.MethodType(_register_builtin_comm_hook, ddp)


def _model_counts(module: Any) -> tuple[int, int, int]:
    total = trainable = nbytes = 0
    for p in module.parameters():
        numel = p.numel()
        total += numel
        nbytes += numel * p.element_size()
        if p.requires_grad:
            trainable += numel
    return total, trainable, nbytes


def record_model(
    module: Any, t_start: int, t_end: int, span_name: str, extra: list[tuple[str, Any]], gauges: bool = True
) -> None:
    """A wrapped model's construction span (DDP, an FSDP unit) and, for whole models, parameter gauges.

    FSDP units are parts of a model (and FSDP1 has already flattened and sharded them, so the unit's
    parameters are counted by the caller before wrapping): their counts go on the span only.
    """
    total, trainable, nbytes = _model_counts(module)
    model = type(module).__name__
    attrs = [(n.MODEL_CLASS, model)]
    if gauges:
        attrs += [(n.MODEL_PARAMS, total), (n.MODEL_TRAINABLE, trainable), (n.MODEL_PARAM_BYTES, nbytes)]
    attrs += extra

    then = ()
    if gauges:
        then = (
            (R.SET, n.MODEL_PARAMETERS, (model, "total"), total),
            (R.SET, n.MODEL_PARAMETERS, (model, "trainable"), trainable),
            (R.SET, n.MODEL_PARAMETER_BYTES, (model,), nbytes),
        )
    framework_spans.span_later(span_name, t_start, t_end, attrs, framework_spans.snapshot(), then=then)


def _capture_buckets(ddp: Any) -> None:
    """The native process group under the reducer where it can be (ddp_native.py), else the trampoline."""
    if not ddp_native.attach(ddp):
        _install_trampoline(ddp)


def _on_created(ddp: Any, t_start: int, t_end: int) -> None:
    _capture_buckets(ddp)
    record_model(
        ddp.module,
        t_start,
        t_end,
        n.SPAN_DDP_INIT,
        [
            (n.DDP_BUCKET_CAP_MB, ddp.bucket_bytes_cap / (1024 * 1024)),
            (n.DDP_FIND_UNUSED, bool(ddp.find_unused_parameters)),
            (n.DDP_GRAD_AS_BUCKET_VIEW, bool(ddp.gradient_as_bucket_view)),
            (n.DDP_STATIC_GRAPH, bool(ddp.static_graph)),
            (n.DDP_BROADCAST_BUFFERS, bool(ddp.broadcast_buffers)),
        ],
    )


# --------------------------------------------------------------------------------------------- patches
def _group_of(args: tuple, kwargs: dict) -> Any:
    """The group DDP's constructor will use: ``process_group``, else its 1-D ``device_mesh``'s (a mesh's
    groups are made by DeviceMesh's own binding of new_group, which no wrapper sees), else the default."""
    pg = kwargs.get("process_group", args[6] if len(args) > 6 else None)
    mesh = kwargs.get("device_mesh", args[15] if len(args) > 15 else None)
    if pg is None and mesh is not None:
        try:
            return mesh.get_group(mesh_dim=0) if mesh.ndim == 1 else None  # DDP refuses another mesh
        except Exception:
            return None
    return pg


def _wrap_init(orig):
    def __init__(self, *args, **kwargs):
        t_start = perf_counter_ns()
        model = args[0] if args else kwargs.get("module")
        # The parameter and buffer broadcast from rank 0 that DDP starts with belongs to the model too.
        token = context.push(framework="ddp", module=context.class_name(model)) if model is not None else R.TLS.ctx
        # before DDP's own C++ broadcast, so an NCCL group can still take its completion hook
        c10d_capture.meet(_group_of(args, kwargs))
        try:
            orig(self, *args, **kwargs)
        finally:
            context.pop(token)
        try:
            _on_created(self, t_start, perf_counter_ns())
        except Exception as exc:
            health.error("ddp", "could not instrument a DistributedDataParallel model", exc)

    __init__.__wrapped__ = orig
    return __init__


def _register_comm_hook(self: Any, state: object, hook: Any) -> None:
    """DistributedDataParallel.register_comm_hook for a model with the trampoline: the hook becomes the
    trampoline's inner hook (the reducer accepts one registration only)."""
    trampoline = _state[self]  # bound on models with the trampoline only (_install_trampoline)
    if trampoline.user_hook_registered:
        # What the reducer itself says to a second registration.
        raise RuntimeError("register_comm_hook or register_builtin_comm_hook can only be called once.")
    self._check_comm_hook(hook)
    self.logger._set_comm_hook_name(hook.__qualname__)
    self._comm_hooks.append((hook, state))
    trampoline.inner_hook, trampoline.inner_state = hook, state
    trampoline.user_hook_registered = True


def _register_builtin_comm_hook(self: Any, comm_hook_type: Any) -> None:
    """The same for DDP's builtin hooks: each maps to its Python twin (the trampoline runs Python hooks)."""
    trampoline = _state[self]
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    python_twin = {
        dist.BuiltinCommHookType.ALLREDUCE: default_hooks.allreduce_hook,
        dist.BuiltinCommHookType.FP16_COMPRESS: default_hooks.fp16_compress_hook,
    }.get(comm_hook_type)
    if python_twin is None or trampoline.user_hook_registered:
        return type(self)._register_builtin_comm_hook(self, comm_hook_type)  # the reducer answers as it would
    self.logger._set_comm_hook_name(str(comm_hook_type))
    trampoline.inner_hook, trampoline.inner_state = python_twin, self.process_group
    trampoline.user_hook_registered = True


def _wrap_register(orig):
    """DistributedDataParallel.register_comm_hook / _register_builtin_comm_hook on a model the native group
    records: the trampoline goes in first and takes the hook as its inner one, so the hook's collectives
    carry the bucket's context as on any instrumented model (the native group stays for the reducer's own
    collectives). Any other model: torch's method, or the trampoline's own bound on the model."""

    def register(self, *args, **kwargs):
        if _LIVE and ddp_native.is_attached(self) and self not in _state:
            try:
                _install_trampoline(self)
            except Exception as exc:
                health.error("ddp", "could not put the trampoline under a registered comm hook", exc)
            if self in _state:
                return getattr(self, orig.__name__)(*args, **kwargs)  # bound by _install_trampoline
        return orig(self, *args, **kwargs)

    register.__wrapped__ = orig
    return register


def _wrap_forward(orig):
    def forward(self, *args, **kwargs):
        if _is_compiling():
            # Dynamo would trace the count and its weakref.finalize, guard on the finalizer registry, and
            # fail that guard on the frame it made it for.
            return orig(self, *args, **kwargs)
        key = id(self)
        count = _forwards.get(key)
        if count is None:
            count = _forwards[key] = 0
            weakref.finalize(self, _forwards.pop, key, None)
        count += 1
        _forwards[key] = count
        # DDP has averages from its third forward on (two iterations measured).
        if count in _READ_AT or not count % LOGGING_EVERY:
            _read_logging_data(self)
        return orig(self, *args, **kwargs)

    forward.__wrapped__ = orig
    return forward


def _wrap_update_process_group(orig):
    def _update_process_group(self, new_process_group):
        orig(self, new_process_group)
        if self.process_group is not new_process_group:
            return  # DDP ignores a group this rank is not in
        try:
            if ddp_native.is_attached(self):
                # The reducer now holds the new group itself: record it there as well (or, where the native
                # group cannot go, through the trampoline).
                ddp_native.forget(self)
                _capture_buckets(self)
            trampoline = _state.get(self)
            if trampoline is not None and not trampoline.user_hook_registered:
                # The default all-reduce follows the model to its new group, as DDP's own does; a user's hook
                # is the user's to update (DDP's documentation of this method says so).
                trampoline.inner_state = new_process_group
        except Exception as exc:
            health.error("ddp", "could not follow a DDP model to its new process group", exc)

    _update_process_group.__wrapped__ = orig
    return _update_process_group


# What DDP's _match_unused_params_allreduce does in torch 2.x: read the reducer's used-parameter map and
# ProcessGroup.allreduce it. Only a body that uses exactly these names is replaced.
_MATCH_UNUSED_NAMES = ("reducer", "_get_local_used_map", "process_group", "allreduce")


def _wrap_match_unused(orig):
    """Under ``Join``, a rank done with its inputs matches the others' used-parameter map all-reduce (which
    their reducers issue from C++) with a ``ProcessGroup.allreduce`` of its own map, a call no ``dist.*``
    patch sees; this records it, framework ``ddp``, phase ``backward``."""
    if getattr(getattr(orig, "__code__", None), "co_names", None) != _MATCH_UNUSED_NAMES:
        return orig  # another torch's body: left as it is rather than guessed at

    def _match_unused_params_allreduce(self):
        if not _LIVE:
            return orig(self)
        locally_used_param_map = self.reducer._get_local_used_map()
        token = context.push(framework="ddp", module=model_name(self), phase="backward")
        try:
            group = self.process_group
            # the method as it is now (another tracer may have wrapped it), as torch's body would call it
            c10d_capture.pg_allreduce(type(group).allreduce)(group, locally_used_param_map)
        finally:
            context.pop(token)

    _match_unused_params_allreduce.__wrapped__ = orig
    return _match_unused_params_allreduce


def _wrap_match_all_reduce(orig):
    """DDP's Join hook on a rank out of inputs: it all-reduces zero buckets through the reducer, outside any
    backward pass. A new batch number tells the native capture one such pass from the next."""

    def _match_all_reduce_for_bwd_pass(self):
        if _LIVE:
            R.SLOTS[1] += 1
        return orig(self)

    _match_all_reduce_for_bwd_pass.__wrapped__ = orig
    return _match_all_reduce_for_bwd_pass


def _wrap_sync_buffers(orig):
    def _sync_buffers(self, *args, **kwargs):
        # DDP's buffer broadcast (BatchNorm statistics, broadcast_buffers=True) runs around forward.
        token = context.push(framework="ddp", module=model_name(self), phase="forward")
        try:
            return orig(self, *args, **kwargs)
        finally:
            context.pop(token)

    _sync_buffers.__wrapped__ = orig
    return _sync_buffers


def _read_logging_data(ddp: Any) -> None:
    """DDP's own statistics, read on the training thread (never concurrently with the reducer)."""
    try:
        data = ddp._get_ddp_logging_data()
    except Exception as exc:
        health.error("ddp", "could not read DDP's logging data", exc)
        return
    model = type(ddp.module).__name__
    values = []
    for metric, key in (
        (n.DDP_FORWARD_COMPUTE, "avg_forward_compute_time"),
        (n.DDP_BACKWARD_COMPUTE, "avg_backward_compute_time"),
        (n.DDP_BACKWARD_COMM, "avg_backward_comm_time"),
        (n.DDP_BACKWARD_OVERLAP, "avg_backward_compute_comm_overlap_time"),
    ):
        if key in data:
            values.append((metric, data[key] / 1e9))  # nanoseconds
    sizes = data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes")
    if isinstance(sizes, str) and sizes:
        values.append((n.DDP_BUCKETS, len(sizes.split(","))))

    R.update_metrics(*((R.SET, metric, (model,), value) for metric, value in values))
    if (
        data.get("find_unused_parameters")
        and data.get("iteration", 0) >= WASTE_CHECK_AFTER
        and data.get("unused_parameter_size", 1) == 0
        and ddp not in _warned
    ):
        _warned.add(ddp)
        message = (
            f"DDP({model}) runs with find_unused_parameters=True but no parameter was unused in "
            f"{data.get('iteration')} iterations: every backward pays an extra traversal of the graph; "
            "pass find_unused_parameters=False"
        )
        _log.warning("otel-torchdist: %s", message)
        now = perf_counter_ns()
        framework_spans.span_later(
            n.SPAN_WARNING,
            now,
            now,
            [(n.WARNING_KIND, "ddp_config"), (n.WARNING_MESSAGE, message), (n.MODEL_CLASS, model)],
            framework_spans.snapshot(),
            events=[(n.WARNING_EVENT, 0, [(n.WARNING_KIND, "ddp_config"), (n.WARNING_MESSAGE, message)])],
        )


def patches() -> list[Patch]:
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel as DDP

    return [
        Patch(sys.modules[__name__], "_LIVE", lambda _: True),
        Patch(DDP, "__init__", _wrap_init),
        Patch(DDP, "_update_process_group", _wrap_update_process_group),
        Patch(DDP, "register_comm_hook", _wrap_register),
        Patch(DDP, "_register_builtin_comm_hook", _wrap_register),
        Patch(DDP, "forward", _wrap_forward),
        Patch(DDP, "_sync_buffers", _wrap_sync_buffers),
        Patch(DDP, "_match_unused_params_allreduce", _wrap_match_unused),
        Patch(DDP, "_match_all_reduce_for_bwd_pass", _wrap_match_all_reduce),
        Patch(Join, "notify_join_context", _wrap_notify_join),
    ]


def subclasses(cls: type) -> list[type]:
    out = [cls]
    for sub in cls.__subclasses__():
        out += subclasses(sub)
    return out


def adopt_existing() -> None:
    """DDP models built before instrument(): give them the trampoline if they have no hook yet."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    if not (dist.is_available() and dist.is_initialized()):
        return  # no process group yet, so no DDP either
    classes = subclasses(DDP)
    # An instance refers to its class (tp_traverse of heap types): the collector finds them in C, ~7x
    # faster than walking gc.get_objects() in Python, which took 0.25 s per 3 million objects.
    for obj in gc.get_referrers(*classes):
        if type(obj) in classes and obj not in _state and not ddp_native.is_attached(obj):
            try:
                _capture_buckets(obj)  # not where a hook is registered already: the reducer takes no second
            except Exception as exc:
                health.error("ddp", "could not instrument an existing DDP model", exc)
