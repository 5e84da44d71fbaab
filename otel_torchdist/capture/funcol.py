"""Functional collectives (DTensor, tensor parallel, ``torch.distributed._functional_collectives``).

DTensor and tensor parallel issue their communication through the Python functions of
``torch.distributed._functional_collectives``, which call C++ ops directly (nothing reaches
``torch.distributed.*``). Their callers look the functions up as module attributes (``funcol.all_reduce``),
so wrapping the attributes sees every call. An eager call returns an ``AsyncCollectiveTensor`` at once;
the collective is complete when ``wait_tensor`` returns for its underlying tensor (looked up as a module
global by ``AsyncCollectiveTensor.trigger_wait``), so records run from issue to that return
(``end_source="wait"``) and carry how long the wait itself blocked. Under tracing the functions wait
immediately and the record ends at return.

The wait often arrives for a different tensor than the one issued: a view op on an
``AsyncCollectiveTensor`` (tensor parallel reshapes its outputs) wraps a *view* of the output, and the
view is what gets waited. c10d itself finds the work by the output's storage, so pending records are
keyed the same way. An output that is never waited ends its record as unfinished: when its storage is
freed (a weak reference to it ends the record then, so a reused address cannot match a stale record), or
at ``uninstrument()`` if c10d's work registry keeps it alive (gloo's works hold their outputs).

Functional collectives inside compiled graphs call the C++ ops without these functions: see ``deep.py``.
The autograd backward of a bare functional collective (not DTensor's, which goes through these functions)
is likewise only visible to the deep mode.
"""

from __future__ import annotations

import functools
import threading
import inspect
import sys
import weakref
from time import perf_counter_ns
from collections.abc import Callable
from typing import Any

import torch

from .. import bandwidth as bw
from .. import health
from .. import names as n
from ..patching import Patch
from . import c10d as c10d_capture
from . import caller, groups, nccl
from . import record as R
from .context import on_stack
from .c10d import _is_compiling, _parent_span
from .completion import _Join
from .ops import describe

SOURCE = "funcol"
MAX_PENDING = 4096
SUM, TIMES_N = "input", "input_times_n"

# name -> (kind, size rule, payload parameter, reduce-op parameter, source-rank parameter). Every one of these
# functions takes its process group as ``group`` and its tag as ``tag``; parameters are found by name in
# each function's signature, so keyword calls (DTensor passes ``group=`` and ``reduceOp=``) read the same.
# True while instrumented (patches() sets it): see c10d._LIVE.
_LIVE = False

_SPECS: dict[str, tuple[str, str, str, str | None, str | None]] = {
    "all_reduce": (bw.ALL_REDUCE, SUM, "self", "reduceOp", None),
    "all_gather_single": (bw.ALL_GATHER, TIMES_N, "self", None, None),
    "all_gather_tensor": (bw.ALL_GATHER, TIMES_N, "self", None, None),
    "all_gather_single_autograd": (bw.ALL_GATHER, TIMES_N, "self", None, None),
    "all_gather_tensor_autograd": (bw.ALL_GATHER, TIMES_N, "self", None, None),
    "reduce_scatter_single": (bw.REDUCE_SCATTER, SUM, "self", "reduceOp", None),
    "reduce_scatter_tensor": (bw.REDUCE_SCATTER, SUM, "self", "reduceOp", None),
    "reduce_scatter_single_autograd": (bw.REDUCE_SCATTER, SUM, "self", "reduceOp", None),
    "reduce_scatter_tensor_autograd": (bw.REDUCE_SCATTER, SUM, "self", "reduceOp", None),
    "all_to_all_single": (bw.ALL_TO_ALL, SUM, "self", None, None),
    "all_to_all_single_autograd": (bw.ALL_TO_ALL, SUM, "self", None, None),
    "broadcast": (bw.BROADCAST, SUM, "self", None, "src"),
    "all_reduce_coalesced": (bw.ALL_REDUCE, SUM, "self", "reduceOp", None),
    "all_gather_single_coalesced": (bw.ALL_GATHER, TIMES_N, "self", None, None),
    "all_gather_into_tensor_coalesced": (bw.ALL_GATHER, TIMES_N, "self", None, None),
    "reduce_scatter_single_coalesced": (bw.REDUCE_SCATTER, SUM, "inputs", "reduceOp", None),
    "reduce_scatter_tensor_coalesced": (bw.REDUCE_SCATTER, SUM, "inputs", "reduceOp", None),
    "permute_tensor": (bw.PERMUTE, SUM, "self", None, None),
}

# Output storage address (or, for deep.py, a tensor's id) -> (weak reference to it, record, join or None).
# The join counts the outputs of a coalesced call; a single output ends its record directly. Every access is
# one dict operation, atomic under the GIL, and none needs a lock: a key is written only while its storage is
# fresh (not yet handed to the caller, so no wait can name it) and popped by the wait or by the storage's own
# death, and an address is reused only after its storage's weakref callback has run.
_pending: dict[int, tuple[Any, list, _Join | None]] = {}
# A call's group argument (object or name; a DeviceMesh by identity: _cache_key) -> (GroupInfo, the argument,
# held so that an identity key is not reused). Emptied when a group is forgotten: a destroyed group must not
# be held here, nor its name, which the next group may take, find the old GroupInfo.
_group_cache: dict[Any, tuple[Any, Any]] = {}
groups.on_forget(_group_cache.clear)
_Tensor = torch.Tensor
_BY_ID = groups.BY_ID
_TLS = R.TLS
_of_tensor = R.of_tensor
_get_ident = threading.get_ident
_QUEUE = R.QUEUE
_limit = R._limit
_T_START, _T_END, _END, _EXTRA, _GROUP, _SEQ = R.T_START, R.T_END, R.END, R.EXTRA, R.GROUP, R.SEQ
_END_WAIT = n.END_WAIT
_COMPLETION_FUTURE = groups.COMPLETION_FUTURE
_DYNAMO_IMPORTED = [False]


def _import_dynamo() -> None:
    """Torch's first functional collective imports torch._dynamo (its ops are wrapped in a lazy
    ``_disable_dynamo``): seconds the first call's duration would hold. Imported before the clock starts,
    the same cost, outside the collective."""
    _DYNAMO_IMPORTED[0] = True
    if "torch._dynamo" not in sys.modules:
        try:
            import torch._dynamo  # noqa: F401
        except Exception as exc:  # a broken optional import is torch's to report, at its own call
            health.error("capture", "could not import torch._dynamo ahead of the first functional collective", exc)


def tracing() -> bool:
    """Whether torch is tracing rather than running (funcol's own test while instrumented: patches())."""
    return False


class _StorageRef(weakref.ref):
    """A weak reference to an output's storage that knows its key: one module-level callback serves all."""

    __slots__ = ("key",)


def _cache_key(group: Any) -> Any:
    """What ``group`` is cached under: a DeviceMesh equals any other over the same ranks and dimension names
    whatever process groups it holds (two ``DeviceMesh.from_group`` over one set of ranks, two
    ``init_device_mesh`` of one shape), so a mesh, alone or with its dimension, is taken by identity."""
    cls = group.__class__
    if cls is tuple and len(group) == 2:  # (mesh, dim)
        return (id(group[0]), group[1])
    if cls.__name__ == "DeviceMesh":  # not imported here: DTensor's imports wait for the program's (runtime)
        return id(group)
    return group


def _group_info(funcol: Any, group: Any, tag: str) -> groups.GroupInfo | None:
    # torch < 2.12 has only _resolve_group_name (a group's name, resolved below)
    resolve = getattr(funcol, "_resolve_group", None) or funcol._resolve_group_name
    resolved = resolve(group, tag)
    if isinstance(resolved, str):
        from torch.distributed import distributed_c10d as c10d

        resolved = c10d._resolve_process_group(resolved)
    gi = groups.info(resolved)
    try:
        if gi is not None:
            _group_cache[_cache_key(group)] = (gi, group)
    except TypeError:  # a list of ranks: unhashable, resolved every time
        pass
    return gi


def _make_begin(name: str, funcol: Any, orig: Callable) -> Callable[[tuple, dict], list | None]:
    """(args, kwargs) -> a record without times, or None to pass the call through."""
    kind, size_rule, payload, redop, src = _SPECS[name]
    params = list(inspect.signature(orig).parameters)
    ip, ig, it = params.index(payload), params.index("group"), params.index("tag")
    ir = params.index(redop) if redop else None
    isrc = params.index(src) if src else None
    times_n = size_rule == TIMES_N

    def begin(args: tuple, kwargs: dict) -> list | None:
        # Each parameter read where it is, positional or keyword: no binding of the whole signature.
        count = len(args)
        group = args[ig] if count > ig else kwargs.get("group")
        try:
            cached = _group_cache.get(_cache_key(group))
        except TypeError:
            cached = None
        gi = cached[0] if cached is not None else None
        if gi is None:
            gi = _group_info(funcol, group, args[it] if count > it else kwargs.get("tag", ""))
            if gi is None:
                return None
        x = args[ip] if count > ip else kwargs.get(payload)
        redop_value = None if ir is None else args[ir] if count > ir else kwargs.get(redop)
        # funcol's src is a rank of the group (the C++ op's root rank): mapped to a global rank on the drain
        root = None if isrc is None else (None, args[isrc] if count > isrc else kwargs.get(src))
        if x.__class__ is _Tensor:  # the common case, one plain tensor
            nbytes = x.nbytes * gi.size if times_n else x.nbytes
            parent = caller.get_current() or None
            return _of_tensor(name, kind, SOURCE, gi.gid, x, nbytes, True, root, None, redop_value, parent)
        rec = R.new(name, kind, SOURCE, gi.gid)
        describe((x,), rec)
        if times_n:
            rec[R.NBYTES] *= gi.size
        rec[R.ASYNC] = True
        rec[R.REDOP] = redop_value
        rec[R.ROOT] = root
        rec[R.PARENT] = _parent_span()
        return rec

    return begin


def _wrap(name: str, funcol: Any):
    acs_type = funcol.AsyncCollectiveTensor

    def make(orig):
        try:
            begin = _make_begin(name, funcol, orig)
        except (ValueError, TypeError) as exc:  # a torch whose signature moved: leave this one uncaptured
            health.error("capture", f"cannot capture functional {name}: unexpected signature", exc)
            return orig

        @functools.wraps(orig)
        def wrapper(*args, **kwargs):
            # traced (fake tensors, make_fx, a proxy mode): torch runs no collective
            if not _LIVE or _is_compiling() or _TLS.outer is not None or tracing():
                return orig(*args, **kwargs)
            try:
                rec = begin(args, kwargs)
            except Exception as exc:
                health.error("capture", f"could not describe a functional {name}", exc)
                rec = None
            if rec is None:
                return orig(*args, **kwargs)
            on_stack(rec)
            if not _DYNAMO_IMPORTED[0]:
                _import_dynamo()
            _TLS.outer = rec
            tid = _get_ident()
            R.BLOCKING[tid] = rec  # what the hang watchdog reads
            rec[_T_START] = perf_counter_ns()
            try:
                result = orig(*args, **kwargs)
            except BaseException as exc:
                _TLS.outer = None
                R.BLOCKING.pop(tid, None)
                rec[R.ERROR] = R.error_info(exc)
                R.complete(rec, n.END_RETURN)
                raise
            _TLS.outer = None
            R.BLOCKING.pop(tid, None)
            try:
                gi = _BY_ID[rec[_GROUP]]
                rec[_SEQ] = gi.pg._get_sequence_number_for_group() if gi.seq_supported else next(gi.own_seq)
                completion = c10d_capture.completion_of(gi, rec)
                if completion != _COMPLETION_FUTURE:
                    _without_wait(gi, rec, completion)
                elif result.__class__ is acs_type:
                    _pend(result.elem.untyped_storage(), rec, None)  # the common case, one output
                else:
                    _finish(rec, result, acs_type)
            except Exception as exc:
                health.error("capture", f"could not complete a functional {name} record", exc)
            return result

        wrapper.__otel_torchdist_wrapped__ = orig
        return wrapper

    return make


def wrap_shard_dim_alltoall(orig: Callable) -> Callable:
    """DTensor's ``Shard(i) -> Shard(j)`` off CPU: ``torch.ops._dtensor.shard_dim_alltoall``, a C++ op that
    all-to-alls through the group itself (no function of funcol's on the way) and returns complete. On CPU
    torch all-gathers through funcol instead, which records it as what it is. (Installed with DTensor's
    capture, when the program imports DTensor: dtensor.patches.)"""
    import torch.distributed._functional_collectives as funcol

    @functools.wraps(orig)
    def shard_dim_alltoall(input, gather_dim, shard_dim, mesh, mesh_dim):
        if not _LIVE or _is_compiling() or _TLS.outer is not None or tracing() or mesh.device_type == "cpu":
            return orig(input, gather_dim, shard_dim, mesh, mesh_dim)
        try:
            group = (mesh, mesh_dim)
            cached = _group_cache.get(_cache_key(group))
            gi = cached[0] if cached is not None else _group_info(funcol, group, "")
            rec = None
            if gi is not None:
                rec = R.new("shard_dim_alltoall", bw.ALL_TO_ALL, SOURCE, gi.gid)
                describe((input,), rec)  # S: the send buffer, as for any all_to_all
                rec[R.PARENT] = _parent_span()
        except Exception as exc:
            health.error("capture", "could not describe a shard_dim_alltoall", exc)
            rec = None
        if rec is None:
            return orig(input, gather_dim, shard_dim, mesh, mesh_dim)
        on_stack(rec)
        _TLS.outer = rec
        rec[_T_START] = perf_counter_ns()
        try:
            result = orig(input, gather_dim, shard_dim, mesh, mesh_dim)
        except BaseException as exc:
            _TLS.outer = None
            rec[R.ERROR] = R.error_info(exc)
            R.complete(rec, n.END_RETURN)
            raise
        _TLS.outer = None
        try:
            rec[_SEQ] = gi.next_seq()
            completion = c10d_capture.completion_of(gi, rec)
            if completion == _COMPLETION_FUTURE:
                R.complete(rec, n.END_RETURN)  # the op waited for its work
            else:
                _without_wait(gi, rec, completion)
        except Exception as exc:
            health.error("capture", "could not complete a shard_dim_alltoall record", exc)
        return result

    shard_dim_alltoall.__otel_torchdist_wrapped__ = orig
    return shard_dim_alltoall


def _without_wait(gi: groups.GroupInfo, rec: list, completion: str) -> None:
    """A GPU backend: ``wait_tensor`` only makes the current stream wait, so its return says nothing of the
    collective's end. NCCL's completion hook ends the record (nccl.py), or nothing can: it ends at enqueue."""
    if completion == groups.COMPLETION_NCCL_HOOK:
        nccl.expect(gi, rec)
    else:
        R.complete(rec, n.END_ENQUEUE)


def _finish(rec: list, result: Any, acs_type: type) -> None:
    """A list of outputs (coalesced calls), or a plain tensor (tracing, or already waited)."""
    storages = {}
    for t in result if isinstance(result, (list, tuple)) else (result,):
        if isinstance(t, acs_type):
            storage = t.elem.untyped_storage()
            storages[storage._cdata] = storage
    if not storages:
        R.complete(rec, n.END_RETURN)
        return
    join = _Join(rec, len(storages)) if len(storages) > 1 else None
    for storage in storages.values():
        _pend(storage, rec, join)


def _pend(storage: Any, rec: list, join: _Join | None) -> None:
    """Hold ``rec`` until ``wait_tensor`` returns for a tensor on ``storage``."""
    ref = _StorageRef(storage, _dropped)
    key = ref.key = storage._cdata
    displaced = _pending.pop(key, None)  # a record whose storage died unseen: it cannot end any more
    _pending[key] = (ref, rec, join)
    if displaced is not None:
        end(displaced, n.END_UNFINISHED)
    if len(_pending) > MAX_PENDING:
        try:
            oldest = next(iter(_pending))
        except (StopIteration, RuntimeError):  # emptied, or changed by another thread meanwhile
            return
        evicted = _pending.pop(oldest, None)
        if evicted is not None:
            end(evicted, n.END_UNFINISHED)


def end(entry: tuple, source: str, wait_ns: int = 0, t_end: int | None = None) -> None:
    """End a pending entry's record (its join's share of it, for a coalesced call); ``wait_ns``: how long
    the wait that ended it blocked."""
    rec, join = entry[1], entry[2]
    if join is None:
        if wait_ns:
            rec[_EXTRA] = ("wait_ns", wait_ns)
        R.complete(rec, source, t_end)
        return
    if wait_ns:
        with join.lock:  # coalesced outputs are waited one tensor at a time: add up
            rec[_EXTRA] = ("wait_ns", (rec[_EXTRA][1] if rec[_EXTRA] else 0) + wait_ns)
    join.done(source)


def _dropped(ref: _StorageRef) -> None:
    """The weakref callback: the output's storage was freed without a wait, so the record cannot end."""
    try:
        entry = _pending.get(ref.key)
        if entry is None or entry[0] is not ref:
            return  # already waited: the common case
        popped = _pending.pop(ref.key, None)
        if popped is entry:
            end(entry, n.END_UNFINISHED)
        elif popped is not None:
            _pending[ref.key] = popped  # written meanwhile by another thread: not this storage's to end
    except Exception as exc:
        health.error("completion", "could not end a functional collective record", exc)


def _wrap_wait(orig):
    @functools.wraps(orig)
    def wait_tensor(tensor):
        if not _pending or _is_compiling():
            return orig(tensor)
        t0 = perf_counter_ns()
        try:
            result = orig(tensor)
        except BaseException as exc:
            failed(tensor.untyped_storage()._cdata, exc)
            raise
        t_end = perf_counter_ns()
        try:
            hit = _pending.pop(tensor.untyped_storage()._cdata, None)
            if hit is not None:
                if hit[2] is None:
                    # One output, the common case inline: its record ends here.
                    rec = hit[1]
                    rec[_EXTRA] = ("wait_ns", t_end - t0)
                    rec[_T_END] = t_end
                    rec[_END] = _END_WAIT
                    if len(_QUEUE) < _limit[0]:
                        _QUEUE.append(tuple(rec))
                    else:
                        R._dropped[0] += 1
                else:
                    end(hit, _END_WAIT, t_end - t0)
        except Exception as exc:
            health.error("completion", "could not complete a functional collective record", exc)
        return result

    wait_tensor.__otel_torchdist_wrapped__ = orig
    return wait_tensor


def failed(key: int, exc: BaseException) -> None:
    """The wait for the output pending under ``key`` raised (a peer gone, a timeout): the collective's record
    ends with the error (the deep mode's waits too)."""
    try:
        hit = _pending.pop(key, None)
        if hit is not None:
            if hit[1][R.ERROR] is None:
                hit[1][R.ERROR] = R.error_info(exc)
            end(hit, _END_WAIT)
    except Exception as error:
        health.error("completion", "could not end a failed functional collective record", error)


def flush_unfinished() -> None:
    while True:
        try:
            _, entry = _pending.popitem()  # one at a time: a wait on another thread may pop one meanwhile
        except KeyError:
            return
        end(entry, n.END_UNFINISHED)


# what funcol._are_we_tracing reads in torch 2.11-2.13; another body: it is called as it is
_TRACING_NAMES = ("is_torchdynamo_compiling", "torch", "_C", "_get_dispatch_mode", "_TorchDispatchModeKey", "FAKE",
                  "_dispatch_tls_is_dispatch_key_included", "DispatchKey", "PythonDispatcher", "get_proxy_mode")  # fmt: skip


def _tracing_check(funcol: Any) -> Callable[[], bool]:
    """funcol's own test, with its C lookups bound once (half its cost a call). Its pre-dispatch proxy
    lookup runs in Python and can only find a mode while pre-dispatch tracing holds the PreDispatch key:
    asked only then. Compilation is the callers' first check (_is_compiling)."""
    full = funcol._are_we_tracing
    C = torch._C
    try:
        if full.__code__.co_names != _TRACING_NAMES:
            return full
        get_mode, fake, proxy = C._get_dispatch_mode, C._TorchDispatchModeKey.FAKE, C._TorchDispatchModeKey.PROXY
        included, dispatcher, pre = C._dispatch_tls_is_dispatch_key_included, C.DispatchKey.PythonDispatcher, C.DispatchKey.PreDispatch
    except AttributeError:
        return full

    def tracing() -> bool:
        return get_mode(fake) is not None or included(dispatcher) or get_mode(proxy) is not None or (included(pre) and full())

    return tracing


def patches() -> list[Patch]:
    try:
        import torch.distributed._functional_collectives as funcol
    except ImportError:
        return []
    out = [Patch(sys.modules[__name__], "_LIVE", lambda _: True)]
    out.append(Patch(sys.modules[__name__], "tracing", lambda _: _tracing_check(funcol)))
    out += [Patch(funcol, name, _wrap(name, funcol)) for name in _SPECS if hasattr(funcol, name)]
    out.append(Patch(funcol, "wait_tensor", _wrap_wait))
    _ = torch  # the module import above needs torch.distributed initialised as a package
    return out
