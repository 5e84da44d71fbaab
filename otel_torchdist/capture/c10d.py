"""Capture of the c10d Python API: every ``torch.distributed`` collective becomes one record (see record.py).

Patch sites (see ``../shared/research/pytorch_hooks.md`` for why each is needed):

* the public functions, in **both** ``torch.distributed`` and ``torch.distributed.distributed_c10d``
  (separate bindings; c10d's internal calls resolve through the latter);
* ``ProcessGroup.send/recv/recv_anysource``, because ``isend``/``irecv`` must stay the identical objects
  (``P2POp`` and pipelining compare them by identity), and ``ProcessGroup.broadcast/scatter``, which
  DTensor reaches through names it imported before we patched;
* ``_coalescing_manager``: one record for the real coalesced collective issued at the block's exit, none
  for the calls queued inside it;
* ``Work.wait``, to complete records of Works that offer no completion future (gloo send/recv);
* ``init_process_group`` / ``destroy_process_group``, to learn this rank's identity and to flush.

Every wrapper takes the cheap exits first: under ``torch.compile`` tracing it calls straight through (no
graph break: Dynamo inlines it and still remaps the original), and a call nested inside another captured
call is not recorded again (the outermost call owns the record). The collective's result and exceptions
pass through untouched; a failure to describe a call is counted and the call proceeds unrecorded.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from .. import bandwidth as bw
from .. import health
from .. import names as n
from ..patching import Patch
from . import caller, completion, groups, nccl
from .context import MODULE as _MODULE
from .context import on_stack, stack_context
from .ops import C10D_OPS, OPS_BY_NAME, REQUIRED, Binder, OpSpec, describe, describe_batch, describe_tensor
from . import record as R
from .record import QUEUE, TLS, complete, error_info
from .step_context import SAMPLED as _SAMPLED

_is_compiling = torch.compiler.is_compiling
_world = c10d._world
_coalesce_state = _world._pg_coalesce_state  # created once with c10d's _World; read without the property
_groups = groups._groups
_BY_ID = groups.BY_ID
_QUEUE = QUEUE
_limit = R._limit
_new = R.new
_INNER = R.INNER
_T_START = R.T_START
_T_END = R.T_END
_GROUP = R.GROUP
_ASYNC = R.ASYNC
_SEQ = R.SEQ
_END = R.END
_Tensor = torch.Tensor
_graph_task_id = torch._C._current_graph_task_id
_STEP = R.STEP
_BLOCKING = R.BLOCKING
_get_ident = threading.get_ident
_COMPLETION_FUTURE = groups.COMPLETION_FUTURE
_END_RETURN = n.END_RETURN

# True while instrumented (patches() sets it). A wrapper outlives uninstrument() where a program bound it
# by name meanwhile (``from torch.distributed import all_reduce``; torch's own _collective_utils, imported
# while instrumented): it then records nothing, since nothing drains the queue any more.
_LIVE = False

SOURCE_C10D = "c10d"
SOURCE_PG = "process_group"
SOURCE_COALESCING = "coalescing_manager"


_parent_span = caller.current  # the caller's OpenTelemetry Context (capture/caller.py), or None


def _in_coalescing(group: Any) -> bool:
    if not _coalesce_state:
        return False
    return (group if group is not None else _world._default_pg) in _coalesce_state


# ------------------------------------------------------------------------------------ function wrappers
def _make_begin(spec: OpSpec, binder: Binder) -> Callable[[tuple, dict], list | None]:
    """Build the extraction for one op: (args, kwargs) -> a record without times, or None to pass."""
    ig = binder.index(spec.group)
    ia = binder.index(spec.async_param)
    ir = binder.index(spec.redop)
    root = (binder.index(spec.root[0]), binder.index(spec.root[1])) if spec.root else None
    peer = (binder.index(spec.peer[0]), binder.index(spec.peer[1])) if spec.peer else None
    payload = tuple(binder.index(p) for p in spec.payload)
    single = len(payload) == 1 and spec.size in ("sum", "times_n")
    ip = payload[0] if payload else None
    op, kind, size = spec.name, spec.kind, spec.size
    bind = binder.bind

    times_n = size == "times_n"
    # Inside a coalescing block torch queues only these (its fast path); any other op runs as it is called.
    queued = spec.name in _COALESCED
    r0, r1 = root if root is not None else (None, None)
    p0, p1 = peer if peer is not None else (None, None)

    def begin(args: tuple, kwargs: dict) -> list | None:
        v = bind(args, kwargs)
        if size == "batch":
            p2p_ops = v[ip]
            group = p2p_ops[0].group if p2p_ops else None
        else:
            group = v[ig] if ig is not None else None
        if queued and _coalesce_state and _in_coalescing(group):
            return None  # queued by _coalescing_manager; its exit is what gets recorded
        gi = _groups.get(group if group is not None else _world._default_pg)
        if gi is None:
            gi = groups.info(group)
            if gi is None:
                if group is c10d.GroupMember.NON_GROUP_MEMBER:
                    return None  # not a member: the call returns without communicating
                gi = groups.unresolved()  # no process group (any more): the call raises; record that
        root_pair = (v[r0] if r0 is not None else None, v[r1] if r1 is not None else None) if root is not None else None
        peer_pair = (v[p0], v[p1] if p1 is not None else None) if peer is not None else None
        is_async = bool(v[ia]) if ia is not None else False
        redop = v[ir] if ir is not None else None
        x = v[ip] if single else None
        if x.__class__ is _Tensor:
            # The common case, one plain tensor: R.of_tensor's literal, written out here because the call
            # would add 4 % to this path, the cheapest one.
            shape = tuple(x.shape)
            try:
                return [
                    op, kind, SOURCE_C10D, gi.gid, None, 0, 0, x.nbytes * gi.size if times_n else x.nbytes,
                    x.dtype, (len(shape),) + shape, x.numel(), 1, is_async, root_pair, peer_pair, redop,
                    None, None, caller.get_current() or None, None, None, False,
                    TLS.ctx, _graph_task_id() != -1, _STEP[0],
                ]  # fmt: skip
            except RuntimeError:  # a sparse tensor has no nbytes: describe_tensor below sizes it
                pass
        rec = _new(op, kind, SOURCE_C10D, gi.gid)
        if single:
            if isinstance(x, _Tensor):
                describe_tensor(x, rec)
            else:
                describe((x,), rec)
            if times_n:
                rec[R.NBYTES] *= gi.size
        elif size == "sum":
            describe([v[i] for i in payload], rec)
        elif size == "inner":
            rec[R.INNER] = True
        elif size == "batch":
            describe_batch(v[ip], rec)
            is_async = True
        rec[R.ASYNC] = is_async
        rec[R.REDOP] = redop
        rec[R.ROOT] = root_pair
        rec[R.PEER] = peer_pair
        rec[R.PARENT] = _parent_span()
        return rec

    return begin


def _inner_size(spec: OpSpec, binder: Binder) -> Callable[[tuple, dict], int]:
    """The message size a nested call adds to an outer ``inner``-sized record (object collectives)."""
    payload = tuple(binder.index(p) for p in spec.payload)
    ig = binder.index(spec.group)

    def size(args: tuple, kwargs: dict) -> int:
        v = binder.bind(args, kwargs)
        probe = _new("", "", "", -1)
        if spec.size == "batch":  # send_object_list(use_batch=True) sends through batch_isend_irecv
            describe_batch(v[payload[0]], probe)
            return probe[R.NBYTES]
        describe([v[i] for i in payload], probe)
        if spec.size == "times_n":
            gi = groups.info(v[ig] if ig is not None else None)
            return probe[R.NBYTES] * (gi.size if gi else 1)
        return probe[R.NBYTES]

    return size


def _sender(rec: list, result: int) -> None:
    """recv from any source returns the sender's (global) rank: the record's peer."""
    if rec[R.PEER] == (None, None) and result >= 0:
        rec[R.PEER] = (result, None)


def _finish(rec: list, result: Any) -> None:
    """Called right after the original returned: attach the sequence number and the completion."""
    gi = _BY_ID[rec[R.GROUP]]
    rec[R.SEQ] = gi.pg._get_sequence_number_for_group() if gi.seq_supported else next(gi.own_seq)
    if rec[R.INNER]:
        if gi.cpu_backend is not None:
            _mixed_route(gi, rec)  # inner calls on the CPU backend: not NCCL's number
        complete(rec, n.END_RETURN)  # object collectives copy to host: they return complete
        return
    completion_kind = gi.completion if gi.cpu_backend is None else _mixed_route(gi, rec)  # completion_of, inline
    if completion_kind == groups.COMPLETION_FUTURE:
        if rec[R.ASYNC]:
            completion.track(rec, result if isinstance(result, list) else [result])
            return
        rec[R.T_END] = perf_counter_ns()
        rec[R.END] = _END_RETURN
        if result.__class__ is int:
            _sender(rec, result)
        if len(_QUEUE) < _limit[0]:
            _QUEUE.append(tuple(rec))
        else:
            R._dropped[0] += 1
    elif completion_kind == groups.COMPLETION_NCCL_HOOK and rec[R.KIND] != bw.SEND_RECV:
        # inside a coalescing block the work is made at the block's end, after this call
        nccl.expect(gi, rec, bool(_coalesce_state) and gi.pg in _coalesce_state)
    else:
        complete(rec, n.END_ENQUEUE)


def completion_of(gi: groups.GroupInfo, rec: list) -> str:
    """How ``rec``, just numbered, completes on ``gi``: as its group's do, or, on a group of several backends,
    as the CPU backend's when it ran there (_mixed_route)."""
    return gi.completion if gi.cpu_backend is None else _mixed_route(gi, rec)


def _mixed_route(gi: groups.GroupInfo, rec: list) -> str:
    """A group of several backends ("cpu:gloo,cuda:nccl"): a call that moved the CPU backend's own number ran
    there, on CPU tensors, and completes as on gloo; its number is not the group's (NCCL's), so it has none."""
    try:
        seq = int(gi.cpu_backend._get_sequence_number_for_group())
    except Exception:
        return gi.completion
    if seq == gi.cpu_seq:
        return gi.completion
    gi.cpu_seq = seq
    rec[R.SEQ] = None
    return groups.COMPLETION_FUTURE


def _fail(rec: list, exc: BaseException) -> None:
    rec[R.ERROR] = error_info(exc)
    complete(rec, n.END_RETURN)


def _finish_failed(name: str, exc: BaseException) -> None:
    """A failure to complete a record after the call returned (the Python body's and native_hot's)."""
    health.error("capture", f"could not complete a {name} record", exc)


# The native part's hot_call while it is loaded (native_hot.py), else None; and the wrapped functions it can
# take: (their op cell, spec, binder, original, Python body), for native_hot to fill each cell.
_hot_call: Callable | None = None
HOT: list[tuple[list, OpSpec, Binder, Callable, Callable]] = []


def hot_eligible(spec: OpSpec, binder: Binder) -> bool:
    """Whether the native fast path can take calls of ``spec``: one tensor whose size is the message (or n
    times it), what the Python body's literal describes; at most 16 parameters (hot_path.cpp's kMaxParams)."""
    return len(spec.payload) == 1 and spec.size in ("sum", "times_n") and binder.n <= 16


def wrap_function(spec: OpSpec, orig: Callable) -> Callable:
    binder = Binder(spec, orig)
    begin = _make_begin(spec, binder)
    inner_size = _inner_size(spec, binder)

    def body(args: tuple, kwargs: dict) -> Any:
        outer = TLS.outer
        if outer is not None:
            if outer[_INNER] and inner_size is not None:
                try:
                    outer[R.NBYTES] += inner_size(args, kwargs)
                except Exception as exc:
                    health.error("capture", f"could not size a nested {spec.name}", exc)
            return orig(*args, **kwargs)
        try:
            rec = begin(args, kwargs)
        except Exception as exc:
            health.error("capture", f"could not describe a {spec.name} call", exc)
            rec = None
        if rec is None:
            return orig(*args, **kwargs)
        on_stack(rec)
        TLS.outer = rec
        tid = _get_ident()
        _BLOCKING[tid] = rec  # what the hang watchdog reads
        rec[_T_START] = perf_counter_ns()
        try:
            result = orig(*args, **kwargs)
        except BaseException as exc:
            TLS.outer = None
            _BLOCKING.pop(tid, None)
            _fail(rec, exc)
            raise
        t_end = perf_counter_ns()
        TLS.outer = None
        _BLOCKING.pop(tid, None)
        try:
            gi = _BY_ID[rec[_GROUP]]
            if gi.completion is _COMPLETION_FUTURE and not rec[_ASYNC] and not rec[_INNER]:
                # The common case inline: a blocking call on a CPU backend returns complete.
                rec[_SEQ] = gi.pg._get_sequence_number_for_group() if gi.seq_supported else next(gi.own_seq)
                rec[_T_END] = t_end
                rec[_END] = _END_RETURN
                if result.__class__ is int:
                    _sender(rec, result)
                if len(_QUEUE) < _limit[0]:
                    _QUEUE.append(tuple(rec))
                else:
                    R._dropped[0] += 1
            else:
                _finish(rec, result)
        except Exception as exc:
            _finish_failed(spec.name, exc)
        return result

    hot: list = [None]  # the native part's op for this function while it is loaded (native_hot.py)

    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        if not _LIVE or _is_compiling():
            return orig(*args, **kwargs)
        op = hot[0]
        if op is None:
            return body(args, kwargs)
        step = _STEP[0]
        if step is not None and step[_SAMPLED] and TLS.outer is None:
            ctx = TLS.ctx
            if ctx is None or ctx[_MODULE] is None:
                # A traced step: the module on the stack (context.on_stack), for the native part to read.
                found = stack_context(ctx, _graph_task_id() != -1)
                if found is not None:
                    TLS.ctx = found
                    try:
                        return _hot_call(op, args, kwargs)
                    finally:
                        TLS.ctx = ctx
        return _hot_call(op, args, kwargs)

    if hot_eligible(spec, binder):
        HOT.append((hot, spec, binder, orig, body))
    if spec.name == "monitored_barrier":
        wrapper = _monitored_barrier(orig, wrapper)
    wrapper.__otel_torchdist_wrapped__ = orig
    return wrapper


def _monitored_barrier(orig: Callable, call: Callable) -> Callable:
    """gloo's monitored_barrier is point-to-point calls in C++ that move the group's number (rank 0 by
    2(n-1), the others by 2): all but one of those moves are told to the group as point-to-point, so the
    barrier counts as one collective on every rank (GroupInfo.collective_number)."""
    return _numbering(orig, call, lambda args, kwargs: kwargs.get("group", args[0] if args else None), barrier=True)


def _numbering(orig: Callable, call: Callable, group_of: Callable[[tuple, dict], Any], barrier: bool = False) -> Callable:
    """``call`` (a wrapper of ``orig``) telling the group ``group_of(args, kwargs)`` how far it moved the
    group's number (_p2p_moved)."""

    @functools.wraps(orig)
    def numbered(*args, **kwargs):
        if not _LIVE or _is_compiling():
            return call(*args, **kwargs)
        try:
            gi, before = _seq_before(group_of(args, kwargs))
        except Exception as exc:
            health.error("capture", f"could not number a {orig.__name__} call", exc)
            gi = before = None
        try:
            return call(*args, **kwargs)
        finally:
            if before is not None:
                _p2p_moved(gi, before, barrier)

    return numbered


def _seq_before(group: Any) -> tuple[groups.GroupInfo | None, int | None]:
    """The group of a point-to-point call about to be made and its sequence number now, where the group
    numbers its calls with torch's counter (not on a group of several backends: NCCL's counter is its own)."""
    gi = groups.info(group)
    if gi is None or not gi.seq_supported or gi.cpu_backend is not None:
        return gi, None
    return gi, int(gi.pg._get_sequence_number_for_group())


def _p2p_moved(gi: groups.GroupInfo, before: int, barrier: bool = False) -> None:
    """Tell ``gi`` how far a point-to-point call moved its number since ``before``: a send or a receive by
    one at most (more is another thread's collective meanwhile); a monitored barrier all but its last."""
    try:
        after = int(gi.pg._get_sequence_number_for_group())
        gi.p2p_called(before, after - 1 if barrier else min(after, before + 1))
    except Exception as exc:
        health.error("capture", "could not number a point-to-point call", exc)


# ------------------------------------------------------------------------------- _coalescing_manager
_COALESCED = {
    "all_reduce": ("all_reduce_coalesced", bw.ALL_REDUCE),
    "all_gather_single": ("all_gather_single_coalesced", bw.ALL_GATHER),
    "all_gather_into_tensor": ("all_gather_single_coalesced", bw.ALL_GATHER),
    "reduce_scatter_single": ("reduce_scatter_single_coalesced", bw.REDUCE_SCATTER),
    "reduce_scatter_tensor": ("reduce_scatter_single_coalesced", bw.REDUCE_SCATTER),
}


def _coalesced_record(group: Any, coll_ops: list) -> list | None:
    gi = groups.info(group)
    if gi is None or not coll_ops:
        return None
    first = coll_ops[0]
    op_name = getattr(first.op, "__name__", "unknown")
    op, kind = _COALESCED.get(op_name, (op_name + "_coalesced", bw.ALL_REDUCE))
    rec = _new(op, kind, SOURCE_COALESCING, gi.gid)
    # S: all_gather counts the gathered output (dst_tensor), the others the input tensor.
    describe([c.dst_tensor if (kind == bw.ALL_GATHER and c.dst_tensor is not None) else c.tensor for c in coll_ops], rec)
    rec[R.REDOP] = first.redop
    rec[R.EXTRA] = ("coalesced_ops", len(coll_ops))
    rec[R.PARENT] = _parent_span()
    return rec


def wrap_coalescing_manager(orig: Callable) -> Callable:
    @functools.wraps(orig)
    @contextlib.contextmanager
    def coalescing_manager(group=None, device=None, async_ops=False):
        if not _LIVE or _is_compiling() or TLS.outer is not None:
            with orig(group, device, async_ops) as cm:
                yield cm
            return
        inner = orig(group, device, async_ops)
        cm = inner.__enter__()
        try:
            yield cm
        except BaseException:
            if not inner.__exit__(*sys.exc_info()):
                raise
            return
        rec = None
        try:
            key = group if group is not None else _world.default_pg
            rec = _coalesced_record(group, list(_world.pg_coalesce_state.get(key, ())))
        except Exception as exc:
            health.error("capture", "could not describe a coalesced block", exc)
        if rec is None:
            inner.__exit__(None, None, None)
            return
        TLS.outer = rec
        tid = _get_ident()
        _BLOCKING[tid] = rec
        rec[R.T_START] = perf_counter_ns()
        try:
            inner.__exit__(None, None, None)
        except BaseException as exc:
            TLS.outer = None
            _BLOCKING.pop(tid, None)
            _fail(rec, exc)
            raise
        TLS.outer = None
        _BLOCKING.pop(tid, None)
        rec[R.ASYNC] = bool(async_ops)
        try:
            _finish(rec, list(cm.works) if async_ops else None)
        except Exception as exc:
            health.error("capture", "could not complete a coalesced record", exc)

    coalescing_manager.__otel_torchdist_wrapped__ = orig
    return coalescing_manager


# ------------------------------------------------------------------------------ ProcessGroup methods
def _first_tensor_list(x: Any) -> list:
    if isinstance(x, torch.Tensor):
        return [x]
    return list(x) if isinstance(x, (list, tuple)) else []


def _pg_method(op: str, kind: str, fill: Callable[[list, Any, tuple, dict], None]) -> Callable[[Any], Callable]:
    """A ``ProcessGroup`` method called directly from Python, recorded as ``op``; ``fill(rec, group info,
    args, kwargs)`` adds what the method's arguments say (peer, root, size)."""

    def make(orig: Callable) -> Callable:
        @functools.wraps(orig)
        def method(self, *args, **kwargs):
            if not _LIVE or _is_compiling() or TLS.outer is not None:
                return orig(self, *args, **kwargs)
            try:
                rec = None
                gi = groups.info(self)
                if gi is not None and args:
                    rec = _new(op, kind, SOURCE_PG, gi.gid)
                    describe(_first_tensor_list(args[0]), rec)
                    rec[R.ASYNC] = True
                    fill(rec, gi, args, kwargs)
                    rec[R.PARENT] = _parent_span()
            except Exception as exc:
                health.error("capture", f"could not describe a ProcessGroup.{orig.__name__} call", exc)
                rec = None
            if rec is None:
                return orig(self, *args, **kwargs)
            rec[R.T_START] = perf_counter_ns()
            try:
                work = orig(self, *args, **kwargs)
            except BaseException as exc:
                _fail(rec, exc)
                raise
            try:
                _finish(rec, work)
            except Exception as exc:
                health.error("capture", f"could not complete a {op} record", exc)
            return work

        return method

    return make


def _pg_p2p(op: str, has_peer: bool) -> Callable[[Any], Callable]:
    """``ProcessGroup.send(tensors, dst, tag)`` / ``recv(tensors, src, tag)`` / ``recv_anysource(tensors, tag)``."""

    def fill(rec: list, gi: Any, args: tuple, kwargs: dict) -> None:
        if has_peer and len(args) > 1:
            rec[R.PEER] = (None, args[1])

    recording = _pg_method(op, bw.SEND_RECV, fill)

    # Every send and receive reaches these methods from Python (dist.send/recv/isend/irecv, batches, object
    # lists, the native path's calls), nested or not, recorded or not: each tells its group whether it moved
    # the group's number (gloo: by one; NCCL counts them apart). Read around the issue only, not a wait, so
    # a collective of another thread meanwhile is seldom taken for one.
    return lambda orig: _numbering(orig, recording(orig), lambda args, kwargs: args[0])


def _pg_rooted(op: str, kind: str) -> Callable[[Any], Callable]:
    """``ProcessGroup.broadcast`` / ``scatter`` reached directly (DTensor's ``mesh_broadcast``/``mesh_scatter``)."""

    # the overloads: broadcast(tensors, opts) | broadcast(tensor, root, timeout); scatter(outputs, inputs,
    # opts) | scatter(output, inputs, root, timeout). Options left out: their default root, group rank 0.
    at = 1 if kind == bw.BROADCAST else 2

    def fill(rec: list, gi: Any, args: tuple, kwargs: dict) -> None:
        if kind == bw.SCATTER:
            rec[R.NBYTES] *= gi.size  # broadcast: the tensor; scatter: the outputs
        if isinstance(args[0], torch.Tensor):
            root = args[at] if len(args) > at else kwargs.get("root")
        else:
            opts = args[at] if len(args) > at else kwargs.get("opts")
            root = 0 if opts is None else getattr(opts, "rootRank", None)
        rec[R.ROOT] = (None, root if isinstance(root, int) else None)

    return _pg_method(op, kind, fill)


_REDUCE_SUM = c10d.ReduceOp.SUM


def _set_sum(rec: list, gi: Any, args: tuple, kwargs: dict) -> None:
    rec[R.REDOP] = _REDUCE_SUM


pg_allreduce = _pg_method("all_reduce", bw.ALL_REDUCE, _set_sum)
"""For the framework captures: ``pg_allreduce(ProcessGroup.allreduce)`` records ``pg.allreduce(tensor)``
calls made with the default options (a sum), which torch makes from Python in a few places; not patched on
the class, where every ``dist.all_reduce`` would pay for passing through it."""


def _wrap_work_wait(orig: Callable) -> Callable:
    @functools.wraps(orig)
    def wait(self, *args, **kwargs):
        if not _LIVE:
            return orig(self, *args, **kwargs)
        if completion._pending_waits:
            completion.on_wait_entered(self)
        try:
            result = orig(self, *args, **kwargs)
        except BaseException as exc:
            completion.on_wait_returned(self, exc)
            raise
        completion.on_wait_returned(self)
        return result

    return wait


# ----------------------------------------------------------------------------------- lifecycle hooks
_on_init: list[Callable[[], None]] = []
_on_destroy: list[Callable[[Any], None]] = []


def meet(pg: Any) -> None:
    """Register a group the moment it exists: the NCCL completion hook can only be added before the group's
    first collective, and some come from C++ no wrapper sees (DDP's constructor broadcasts the model)."""
    try:
        groups.info(pg)
    except Exception as exc:
        health.error("capture", "could not register a new process group", exc)


def _wrap_init(orig: Callable) -> Callable:
    @functools.wraps(orig)
    def init_process_group(*args, **kwargs):
        result = orig(*args, **kwargs)
        meet(None)
        for fn in list(_on_init):  # a fork's first group replaces the runtime that hooked it
            try:
                fn()
            except Exception as exc:
                health.error("identity", "could not finish set-up after init_process_group", exc)
        return result

    return init_process_group


def _wrap_new_group(orig: Callable) -> Callable:
    @functools.wraps(orig)
    def new_group(*args, **kwargs):
        pg = orig(*args, **kwargs)
        if pg is c10d.GroupMember.NON_GROUP_MEMBER:
            # new_group(ranks=None, timeout=None, backend=None, pg_options=None, use_local_synchronization=False,
            # group_desc=None, ...)
            groups.reserve_label(kwargs.get("group_desc", args[5] if len(args) > 5 else None))
        else:
            meet(pg)
        return pg

    return new_group


def _wrap_destroy(orig: Callable) -> Callable:
    @functools.wraps(orig)
    def destroy_process_group(group=None):
        for fn in _on_destroy:
            try:
                fn(group)
            except Exception as exc:
                health.error("flush", "could not flush before destroy_process_group", exc)
        try:
            return orig(group)
        finally:
            if group is None or group is _world.default_pg:
                groups.forget_all()
            else:
                groups.forget(group)

    return destroy_process_group


# --------------------------------------------------------------------------------------- patch table
NAMESPACES = (dist, c10d)


def _function_patch(spec: OpSpec) -> Callable[[Any], Any]:
    return lambda orig: wrap_function(spec, orig)


def patches() -> list[Patch]:
    table: list[Patch] = [Patch(sys.modules[__name__], "_LIVE", lambda _: True)]
    for ns in NAMESPACES:
        for spec in C10D_OPS:
            table.append(Patch(ns, spec.name, _function_patch(spec)))
        table.append(Patch(ns, "_coalescing_manager", wrap_coalescing_manager))
        table.append(Patch(ns, "init_process_group", _wrap_init))
        table.append(Patch(ns, "new_group", _wrap_new_group))
        table.append(Patch(ns, "destroy_process_group", _wrap_destroy))
    mesh = sys.modules.get("torch.distributed.device_mesh")
    if mesh is not None:  # init_device_mesh calls its own bindings of these, made when torch.distributed loads
        table += [Patch(mesh, "init_process_group", _wrap_init), Patch(mesh, "new_group", _wrap_new_group)]
    pg = c10d.ProcessGroup
    table += [
        Patch(pg, "send", _pg_p2p("isend", True)),
        Patch(pg, "recv", _pg_p2p("irecv", True)),
        Patch(pg, "recv_anysource", _pg_p2p("irecv", False)),
        Patch(pg, "broadcast", _pg_rooted("broadcast", bw.BROADCAST)),
        Patch(pg, "scatter", _pg_rooted("scatter", bw.SCATTER)),
        Patch(c10d.Work, "wait", _wrap_work_wait),
    ]
    return table


__all__ = ["patches", "OPS_BY_NAME", "REQUIRED"]
