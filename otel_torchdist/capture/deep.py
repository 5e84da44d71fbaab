"""Deep capture: functional collectives inside ``torch.compile``d graphs (opt-in, for sampled steps).

Compiled code calls ``torch.ops._c10d_functional.*`` straight from the generated graph: no Python function
of ours is on that path. A ``TorchDispatchMode`` sees every op at the dispatcher; declaring
``ignore_compile_internals()`` keeps it out of Dynamo's tracing (no recompiles, no graph breaks) and active
while the compiled artifact runs, so it sees the graph's collectives and their ``wait_tensor`` calls.

It costs every aten op a Python round trip (about 5 µs each on the development machine, see
docs/performance.md), so it is not on by default: wrap the steps to observe in :func:`deep_capture`, or let
the step tracker enter it on sampled steps (``compile_capture="sampled"``). Collectives the eager captures
already record (their Python wrapper is running) are left to them.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from time import perf_counter_ns
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .. import bandwidth as bw
from .. import health
from .. import names as n
from . import c10d as c10d_capture
from . import funcol, groups
from . import record as R
from .context import on_stack
from .c10d import _parent_span
from .completion import _Join
from .ops import describe

SOURCE = "deep"

# op name -> (kind, index of the group-name argument, whether S is the input times the group size)
_OPS: dict[str, tuple[str, int, bool]] = {
    "all_reduce": (bw.ALL_REDUCE, 2, False),
    "all_reduce_": (bw.ALL_REDUCE, 2, False),
    "all_reduce_coalesced": (bw.ALL_REDUCE, 2, False),
    "all_reduce_coalesced_": (bw.ALL_REDUCE, 2, False),
    "all_gather_into_tensor": (bw.ALL_GATHER, 2, True),
    "all_gather_into_tensor_out": (bw.ALL_GATHER, 2, True),
    "all_gather_into_tensor_coalesced": (bw.ALL_GATHER, 2, True),
    "reduce_scatter_tensor": (bw.REDUCE_SCATTER, 3, False),
    "reduce_scatter_tensor_coalesced": (bw.REDUCE_SCATTER, 3, False),
    "all_to_all_single": (bw.ALL_TO_ALL, 3, False),
    "broadcast": (bw.BROADCAST, 2, False),
    "broadcast_": (bw.BROADCAST, 2, False),
}
_NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd")


def span_name(op: str) -> str:
    """Functional ops by their out-of-place name: all_reduce_ and all_gather_into_tensor_out included."""
    return op.removesuffix("_out").rstrip("_")


def _group_of(arg: Any) -> groups.GroupInfo | None:
    if isinstance(arg, str):
        from torch.distributed import distributed_c10d as c10d

        arg = c10d._resolve_process_group(arg)
    return groups.info(arg)


class DeepCapture(TorchDispatchMode):
    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        packet = func.overloadpacket
        if func.namespace not in _NAMESPACES or R.TLS.outer is not None:
            return func(*args, **kwargs)
        name = packet.__name__
        if name == "wait_tensor":
            return _wait(func, args, kwargs)
        spec = _OPS.get(name)
        if spec is None:
            return func(*args, **kwargs)
        try:
            rec = _begin(name, spec, args)
        except Exception as exc:
            health.error("capture", f"deep capture could not describe {name}", exc)
            rec = None
        if rec is None:
            return func(*args, **kwargs)
        rec[R.T_START] = perf_counter_ns()
        try:
            out = func(*args, **kwargs)
        except BaseException as exc:
            rec[R.ERROR] = R.error_info(exc)
            R.complete(rec, n.END_RETURN)
            raise
        try:
            _pending(rec, out)
        except Exception as exc:
            health.error("capture", f"deep capture could not track {name}", exc)
        return out


def _begin(name: str, spec: tuple[str, int, bool], args: tuple) -> list | None:
    kind, group_at, times_n = spec
    gi = _group_of(args[group_at]) if len(args) > group_at else None
    if gi is None:
        return None
    rec = R.new(span_name(name), kind, SOURCE, gi.gid)
    describe((args[0],), rec)
    if times_n:
        rec[R.NBYTES] *= gi.size
    rec[R.ASYNC] = True
    if kind in (bw.ALL_REDUCE, bw.REDUCE_SCATTER):
        rec[R.REDOP] = args[1]
    rec[R.PARENT] = _parent_span()
    on_stack(rec)
    return rec


def _pending(rec: list, out: Any) -> None:
    gi = groups.BY_ID[rec[R.GROUP]]
    rec[R.SEQ] = gi.pg._get_sequence_number_for_group() if gi.seq_supported else next(gi.own_seq)
    completion = c10d_capture.completion_of(gi, rec)
    if completion != groups.COMPLETION_FUTURE:
        funcol._without_wait(gi, rec, completion)  # a GPU's wait_tensor only orders the stream
        return
    tensors = [t for t in (out if isinstance(out, (list, tuple)) else [out]) if isinstance(t, torch.Tensor)]
    if not tensors:
        R.complete(rec, n.END_RETURN)
        return
    join = _Join(rec, len(tensors)) if len(tensors) > 1 else None
    for t in tensors:
        funcol._pending[id(t)] = (weakref.ref(t), rec, join)


def _wait(func, args, kwargs):
    t0 = perf_counter_ns()
    tensor = args[0] if args else kwargs.get("tensor")
    try:
        out = func(*args, **kwargs)
    except BaseException as exc:
        funcol.failed(id(tensor), exc)
        raise
    hit = funcol._pending.pop(id(tensor), None)
    if hit is not None:
        if hit[0]() is tensor:
            funcol.end(hit, n.END_WAIT, perf_counter_ns() - t0)
        else:  # the output it was kept for died unwaited and another tensor has its id now
            funcol.end(hit, n.END_UNFINISHED)
    return out


_local = threading.local()


@contextlib.contextmanager
def deep_capture():
    """Record the collectives of compiled code run inside this block (on this thread)."""
    if getattr(_local, "active", False):
        yield
        return
    _local.active = True
    try:
        with DeepCapture():
            yield
    finally:
        _local.active = False
