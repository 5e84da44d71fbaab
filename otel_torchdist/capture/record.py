"""The compact record the hot path writes, and the queue it goes into.

A record is a flat sequence indexed by the constants below: a ``list`` while its collective is in flight
(nested calls add to its size, completion fills its end), frozen into a ``tuple`` when it is queued. The
tuple holds only ints, strings, dtypes, enums and flat tuples of them, so the garbage collector stops
tracking it by the time it leaves the young generations: thousands of records waiting for the background
thread trigger no collections of the whole heap. (A ``__slots__`` object per record did, measurably, and
so did tuples nested three deep, which the collector untracks one level per generation.)

The queue is bounded: when the background thread cannot keep up, records are dropped and counted, never
queued without bound.
"""

from __future__ import annotations

import threading
from collections import deque
from time import perf_counter_ns
from typing import Any

from .. import health

# Field positions. Times are perf_counter_ns values; GROUP is an index into groups.BY_ID.
OP = 0  # API name as called, e.g. "all_gather_into_tensor"
KIND = 1  # nccl-tests family (bandwidth.KINDS)
SOURCE = 2  # capture path: c10d, process_group, coalescing_manager, ...
GROUP = 3
SEQ = 4  # the group's sequence number for this collective, or None
T_START = 5
T_END = 6  # 0 until complete
NBYTES = 7  # S, nccl-tests' message size
DTYPE = 8
SHAPES = 9  # flat tuple of ints: ndim, dims..., ndim, dims... (at most ops.MAX_SHAPES shapes)
NUMEL = 10
NTENSORS = 11
ASYNC = 12
ROOT = 13  # (global rank, group rank) as given to the API; resolved off the hot path
PEER = 14
REDOP = 15
END = 16  # names.END_* : how the end was observed
ERROR = 17  # (exception type, message): not the exception, which would pin its frames
PARENT = 18  # the caller's current OpenTelemetry span object, if any
EXTRA = 19  # flat tuple key, value, key, value... of op-specific attributes (strings and ints)
GPU_NS = 20  # GPU-measured duration (NCCL timing), when known
INNER = 21  # add nested calls' message sizes into NBYTES (object collectives)
CTX = 22  # the thread's framework context (context.py): framework, module, phase, parent, extras
BWD = 23  # issued inside an autograd backward pass
STEPCTX = 24  # the process's current training step context (steps), or None
FIELDS = 25

_TEMPLATE = [
    None, None, None, 0, None, 0, 0, 0, None, (), 0, 0, False, None, None, None, None, None, None, None, None, False,
    None, False, None,
]  # fmt: skip
assert len(_TEMPLATE) == FIELDS


def iter_shapes(flat: tuple):
    """The shapes of a SHAPES field, as tuples."""
    i = 0
    while i < len(flat):
        ndim = flat[i]
        yield flat[i + 1 : i + 1 + ndim]
        i += 1 + ndim


STEP: list = [None]  # the current step context, process-wide (steps.py sets it); backward threads see it too
# Where C++ reads them (the native capture's slots while it is loaded, capture/ddp_native.py; else a buffer
# nothing reads): [0] the current step's index, 0 for none (steps.py writes it with STEP), [1] a batch
# number for buckets issued outside a backward pass (ddp.py, DDP's Join hook).
NO_SLOTS = memoryview(bytearray(16)).cast("q")
# The contexts of the last steps begun, at their serial modulo its length (steps.py): the native capture's
# records carry a step's serial, and the drain finds its context here. As many as the drain keeps open
# (Pipeline's STEPS_OPEN_MAX): 256 lost the steps of a drain interval beyond 256 (steps under 0.8 ms at the
# default 200 ms), whose buckets were then exported as collectives outside any step, a span each.
RECENT_STEPS: list = [None] * 4096
SLOTS = NO_SLOTS
_graph_task_id = None


def in_backward() -> bool:
    return _graph_task_id() != -1


def _bind_graph_task() -> None:
    global _graph_task_id
    import torch

    _graph_task_id = torch._C._current_graph_task_id


_bind_graph_task()


def new(op: str, kind: str, source: str, gid: int) -> list:
    rec = _TEMPLATE.copy()
    rec[OP] = op
    rec[KIND] = kind
    rec[SOURCE] = source
    rec[GROUP] = gid
    rec[CTX] = TLS.ctx
    rec[BWD] = _graph_task_id() != -1
    rec[STEPCTX] = STEP[0]
    return rec


def describe(rec) -> str:
    """For debugging and test failure messages."""
    dur = (rec[T_END] - rec[T_START]) / 1e3 if rec[T_END] else None
    return f"record({rec[OP]} group={rec[GROUP]} seq={rec[SEQ]} S={rec[NBYTES]} dur_us={dur} end={rec[END]} error={rec[ERROR]})"


def of_tensor(
    op: str, kind: str, source: str, gid: int, x: Any, nbytes: int, is_async: bool, root: Any, peer: Any, redop: Any, parent: Any
) -> list:
    """The record of a call on one plain tensor, the capture paths' common case, built in one literal."""
    shape = tuple(x.shape)
    return [
        op, kind, source, gid, None, 0, 0, nbytes, x.dtype, (len(shape),) + shape, x.numel(), 1, is_async, root,
        peer, redop, None, None, parent, None, None, False, TLS.ctx, _graph_task_id() != -1, STEP[0],
    ]  # fmt: skip


class _Local(threading.local):
    outer: list | None = None  # the outermost capture in progress on this thread
    ctx: tuple | None = None  # framework context, see context.py


TLS = _Local()
# thread id -> the record of the blocking call that thread is inside, written by every wrapper that holds one
# (the c10d and functional wrappers, the coalescing block, the native fast path): the hang watchdog reads it.
BLOCKING: dict[int, list] = {}
QUEUE: deque[tuple] = deque()
_limit = [65536]
_dropped = [0]


# Work the background thread does for the training thread (a step's close, an optimizer step, a framework
# span, metric updates): entries ``(index, *flat args)``, bounded by the same limit as records. The index
# names the drain function registered under a reserved name (:func:`reserve`, :func:`drained_as`), not the
# function: a function is an object the garbage collector tracks, so an entry holding one stays tracked
# until the drain frees it, while an entry of an index and flat arguments is untracked by the first young
# collection, like a record. One flat tuple per entry, not a pair holding the arguments: each tuple a
# training step leaves queued is one more object for the collector's young generation to count and visit.
DEFERRED: deque[tuple] = deque()
DRAINED: list[Any] = []  # index -> drain function (drain/deferred.py runs them)


_named: dict[str, int] = {}


def reserve(name: str) -> int:
    """The index of the drain function registered as ``name`` (:func:`drained_as`): capture code defers work
    to the drain by this index without importing the drain."""
    index = _named.get(name)
    if index is None:
        index = _named[name] = len(DRAINED)
        DRAINED.append(None)
    return index


def drained_as(name: str):
    """Register a drain function under the name capture code reserved (decorator)."""

    def register(fn):
        DRAINED[reserve(name)] = fn
        return fn

    return register


# Metric updates capture code hands the drain as data, (how, metric, labels, value) each: the drain applies
# them to its framework metrics (drain/framework_metrics.py), so no capture code touches the drain's state.
SET, ADD, OBSERVE = "set", "add", "observe"
_METRIC_UPDATES = reserve("metric_updates")


def update_metrics(*updates: tuple) -> None:
    """Queue ``(how, metric, labels, value)`` updates (``how``: SET, ADD or OBSERVE) for the drain."""
    queue((_METRIC_UPDATES, updates))


def set_limit(max_records: int) -> None:
    _limit[0] = max_records


def queue(entry: tuple) -> None:
    if len(DEFERRED) < _limit[0]:
        DEFERRED.append(entry)
    else:
        _dropped[0] += 1


def push(rec: list) -> None:
    if len(QUEUE) < _limit[0]:
        QUEUE.append(tuple(rec))
    else:
        _dropped[0] += 1


def dropped_records() -> int:
    return _dropped[0]


health.count_drops_of("record", dropped_records, lambda: _dropped.__setitem__(0, 0))


def error_info(exc: BaseException) -> tuple[str, str]:
    t = type(exc)
    name = t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
    try:
        message = str(exc)
    except Exception:
        message = "<unprintable>"
    return name, message


def complete(rec: list, end_source: str, t_end: int | None = None) -> None:
    rec[T_END] = perf_counter_ns() if t_end is None else t_end
    rec[END] = end_source
    push(rec)


__all__ = ["new", "push", "complete", "error_info", "QUEUE", "TLS", "Any"]
