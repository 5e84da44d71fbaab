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
keyed the same way. An output that is never waited stays alive in c10d's work registry, so its record
ends as unfinished at ``uninstrument()``; should its storage be freed first, a weak reference to it ends
the record then, so a reused address cannot match a stale record.

Functional collectives inside compiled graphs call the C++ ops without these functions: see ``deep.py``.
The autograd backward of a bare functional collective (not DTensor's, which goes through these functions)
is likewise only visible to the deep mode.
"""

from __future__ import annotations

import functools
import threading
import weakref
from time import perf_counter_ns
from typing import Any

import torch

from .. import bandwidth as bw
from .. import health
from .. import names as n
from ..patching import Patch
from . import groups
from . import record as R
from .c10d import _parent_span, _is_compiling
from .completion import _Join
from .ops import describe

SOURCE = "funcol"
MAX_PENDING = 4096

# name -> (kind, size rule, redop position or None, src position or None); positions count the tensor arg.
_SPECS: dict[str, tuple[str, str, int | None, int | None]] = {
    "all_reduce": (bw.ALL_REDUCE, "input", 1, None),
    "all_gather_single": (bw.ALL_GATHER, "input_times_n", None, None),
    "all_gather_tensor": (bw.ALL_GATHER, "input_times_n", None, None),
    "all_gather_single_autograd": (bw.ALL_GATHER, "input_times_n", None, None),
    "all_gather_tensor_autograd": (bw.ALL_GATHER, "input_times_n", None, None),
    "reduce_scatter_single": (bw.REDUCE_SCATTER, "input", 1, None),
    "reduce_scatter_tensor": (bw.REDUCE_SCATTER, "input", 1, None),
    "reduce_scatter_single_autograd": (bw.REDUCE_SCATTER, "input", 1, None),
    "reduce_scatter_tensor_autograd": (bw.REDUCE_SCATTER, "input", 1, None),
    "all_to_all_single": (bw.ALL_TO_ALL, "input", None, None),
    "all_to_all_single_autograd": (bw.ALL_TO_ALL, "input", None, None),
    "broadcast": (bw.BROADCAST, "input", None, 1),
    "all_reduce_coalesced": (bw.ALL_REDUCE, "input", 1, None),
    "all_gather_single_coalesced": (bw.ALL_GATHER, "input_times_n", None, None),
    "all_gather_into_tensor_coalesced": (bw.ALL_GATHER, "input_times_n", None, None),
    "reduce_scatter_single_coalesced": (bw.REDUCE_SCATTER, "input", 1, None),
    "reduce_scatter_tensor_coalesced": (bw.REDUCE_SCATTER, "input", 1, None),
    "permute_tensor": (bw.ALL_TO_ALL, "input", None, None),
}
# The group is the 4th positional parameter for these, the 3rd for the rest (see the signatures).
_GROUP_AT_3 = {
    "all_to_all_single",
    "all_to_all_single_autograd",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "reduce_scatter_single_autograd",
    "reduce_scatter_tensor_autograd",
    "reduce_scatter_single_coalesced",
    "reduce_scatter_tensor_coalesced",
}
_GROUP_AT_1 = {"all_gather_single_coalesced", "all_gather_into_tensor_coalesced"}

_pending: dict[int, tuple[Any, _Join]] = {}  # storage address -> (weakref to the storage, join)
_pending_lock = threading.RLock()  # re-entrant: a GC pass under it may run a storage weakref callback
_group_cache: dict[Any, Any] = {}


def _group_info(funcol: Any, group: Any, tag: str) -> groups.GroupInfo | None:
    try:
        hit = _group_cache.get(group)
    except TypeError:  # a list of ranks: unhashable, resolve every time
        hit = None
    if hit is not None:
        return hit
    resolved = funcol._resolve_group(group, tag)
    if isinstance(resolved, str):
        from torch.distributed import distributed_c10d as c10d

        resolved = c10d._resolve_process_group(resolved)
    gi = groups.info(resolved)
    try:
        if gi is not None:
            _group_cache[group] = gi
    except TypeError:
        pass
    return gi


def _tensors(result: Any) -> list:
    if isinstance(result, (list, tuple)):
        return list(result)
    return [result]


def _wrap(name: str, funcol: Any):
    kind, size_rule, redop_at, src_at = _SPECS[name]
    group_at = 3 if name in _GROUP_AT_3 else (1 if name in _GROUP_AT_1 else 2)
    group_param = ("group",)
    acs_type = funcol.AsyncCollectiveTensor

    def make(orig):
        @functools.wraps(orig)
        def wrapper(*args, **kwargs):
            if _is_compiling() or R.TLS.outer is not None:
                return orig(*args, **kwargs)
            try:
                rec = _begin(args, kwargs)
            except Exception as exc:
                health.error("capture", f"could not describe a functional {name}", exc)
                rec = None
            if rec is None:
                return orig(*args, **kwargs)
            R.TLS.outer = rec
            rec[R.T_START] = perf_counter_ns()
            try:
                result = orig(*args, **kwargs)
            except BaseException as exc:
                R.TLS.outer = None
                rec[R.ERROR] = R.error_info(exc)
                R.complete(rec, n.END_RETURN)
                raise
            R.TLS.outer = None
            try:
                _finish(rec, result)
            except Exception as exc:
                health.error("capture", f"could not complete a functional {name} record", exc)
            return result

        def _begin(args, kwargs):
            if len(args) > group_at:
                group = args[group_at]
            else:
                group = kwargs.get(group_param[0])
            tag = kwargs.get("tag", args[group_at + 1] if len(args) > group_at + 1 else "")
            gi = _group_info(funcol, group, tag)
            if gi is None:
                return None
            rec = R.new(name, kind, SOURCE, gi.gid)
            payload = args[0] if args else kwargs.get("self", kwargs.get("inputs"))
            describe((payload,), rec)
            if size_rule == "input_times_n":
                rec[R.NBYTES] *= gi.size
            rec[R.ASYNC] = True
            if redop_at is not None and len(args) > redop_at:
                rec[R.REDOP] = args[redop_at]
            if src_at is not None and len(args) > src_at:
                rec[R.ROOT] = (args[src_at], None)
            rec[R.PARENT] = _parent_span()
            return rec

        def _finish(rec, result):
            gi = groups.BY_ID[rec[R.GROUP]]
            rec[R.SEQ] = gi.pg._get_sequence_number_for_group() if gi.seq_supported else next(gi.own_seq)
            storages = {}
            for t in _tensors(result):
                if isinstance(t, acs_type):
                    storage = t.elem.untyped_storage()
                    storages[storage._cdata] = storage
            if not storages:
                R.complete(rec, n.END_RETURN)  # tracing, or already waited: complete at return
                return
            join = _Join(rec, len(storages))
            displaced = []
            with _pending_lock:
                for key, storage in storages.items():
                    old = _pending.get(key)
                    if old is not None:
                        displaced.append(old[1])
                    _pending[key] = (weakref.ref(storage, _dropped(key)), join)
                while len(_pending) > MAX_PENDING:
                    displaced.append(_pending.pop(next(iter(_pending)))[1])
            for old in displaced:
                old.done(n.END_UNFINISHED)

        wrapper.__otel_torchdist_wrapped__ = orig
        return wrapper

    return make


def _dropped(key: int):
    """The weakref callback: the output's storage was freed without a wait, so the record cannot end."""

    def callback(ref):
        with _pending_lock:
            entry = _pending.get(key)
            if entry is None or entry[0] is not ref:
                return  # already waited, or the address now belongs to a newer record
            del _pending[key]
        try:
            entry[1].done(n.END_UNFINISHED)
        except Exception as exc:
            health.error("completion", "could not end a functional collective record", exc)

    return callback


def _wrap_wait(orig):
    @functools.wraps(orig)
    def wait_tensor(tensor):
        if not _pending or _is_compiling():
            return orig(tensor)
        t0 = perf_counter_ns()
        result = orig(tensor)
        try:
            key = tensor.untyped_storage()._cdata
            with _pending_lock:
                hit = _pending.pop(key, None)
            if hit is not None:
                join = hit[1]
                rec = join.rec
                blocked = perf_counter_ns() - t0
                with _pending_lock:  # coalesced results are waited one tensor at a time: add up
                    previous = rec[R.EXTRA][1] if rec[R.EXTRA] else 0
                    rec[R.EXTRA] = ("wait_ns", previous + blocked)
                join.done(n.END_WAIT)
        except Exception as exc:
            health.error("completion", "could not complete a functional collective record", exc)
        return result

    wait_tensor.__otel_torchdist_wrapped__ = orig
    return wait_tensor


def flush_unfinished() -> None:
    with _pending_lock:
        joins = [join for _, join in _pending.values()]
        _pending.clear()
    done = set()
    for join in joins:
        if id(join) not in done:
            done.add(id(join))
            join.done(n.END_UNFINISHED)


def patches() -> list[Patch]:
    try:
        import torch.distributed._functional_collectives as funcol
    except ImportError:
        return []
    out = [Patch(funcol, name, _wrap(name, funcol)) for name in _SPECS if hasattr(funcol, name)]
    out.append(Patch(funcol, "wait_tensor", _wrap_wait))
    _ = torch  # the module import above needs torch.distributed initialised as a package
    return out
