"""The compact record the hot path writes, and the queue it goes into.

The hot path does the least: it fills a :class:`Record` (references and integers only: no formatting, no
OTel objects) and appends it to :data:`QUEUE`. A background thread turns records into metrics and spans.
The queue is bounded: when the background thread cannot keep up, records are dropped and counted, never
queued without bound.
"""

from __future__ import annotations

import threading
from collections import deque
from time import perf_counter_ns
from typing import Any


class Record:
    """One collective as seen on this rank. Times are ``perf_counter_ns`` values."""

    __slots__ = (
        "op",  # API name as called, e.g. "all_gather_into_tensor"
        "kind",  # nccl-tests family (bandwidth.KINDS)
        "source",  # capture path: c10d, pg, coalescing, ...
        "group",  # GroupInfo
        "seq",  # the group's sequence number for this collective, or None
        "t_start",
        "t_end",  # 0 until complete
        "nbytes",  # S, nccl-tests' message size; None until known (object collectives sum inner calls)
        "dtype",
        "shapes",  # tuple of torch.Size, possibly truncated
        "numel",
        "ntensors",
        "async_op",
        "root",  # (global, group) rank pair as given, resolved off the hot path
        "peer",
        "redop",
        "end_source",
        "error",  # (exception type, message) if it raised; not the exception: that would pin its frames
        "parent",  # the caller's current SpanContext when valid
        "extra",  # dict of op-specific attributes, or None
        "collect_inner",  # sum nested calls' message sizes into nbytes (object collectives)
        "gpu_duration_ns",  # GPU-measured duration (NCCL timing), when known
    )

    def __init__(self, op: str, kind: str, source: str, group: Any, t_start: int) -> None:
        self.op = op
        self.kind = kind
        self.source = source
        self.group = group
        self.seq = None
        self.t_start = t_start
        self.t_end = 0
        self.nbytes = 0
        self.dtype = None
        self.shapes = ()
        self.numel = 0
        self.ntensors = 0
        self.async_op = False
        self.root = None
        self.peer = None
        self.redop = None
        self.end_source = None
        self.error = None
        self.parent = None
        self.extra = None
        self.collect_inner = False
        self.gpu_duration_ns = None

    def __repr__(self) -> str:  # for debugging and test failure messages
        dur = (self.t_end - self.t_start) / 1e3 if self.t_end else None
        return (
            f"Record({self.op} group={getattr(self.group, 'label', None)} seq={self.seq} S={self.nbytes} "
            f"dur_us={dur} end={self.end_source} error={self.error[0] if self.error else None})"
        )


class _Local(threading.local):
    outer: Record | None = None  # the outermost capture in progress on this thread


TLS = _Local()
QUEUE: deque[Record] = deque()
_limit = [65536]
_dropped = [0]


def set_limit(max_records: int) -> None:
    _limit[0] = max_records


def push(rec: Record) -> None:
    if len(QUEUE) < _limit[0]:
        QUEUE.append(rec)
    else:
        _dropped[0] += 1


def dropped_records() -> int:
    return _dropped[0]


def error_info(exc: BaseException) -> tuple[str, str]:
    t = type(exc)
    name = t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
    try:
        message = str(exc)
    except Exception:
        message = "<unprintable>"
    return name, message


def complete(rec: Record, end_source: str, t_end: int | None = None) -> None:
    rec.t_end = perf_counter_ns() if t_end is None else t_end
    rec.end_source = end_source
    push(rec)
