"""From a collective record to its span attributes and metric contribution (off the hot path)."""

from __future__ import annotations

import random
from typing import Any

from . import bandwidth as bw
from . import names as n
from .capture.record import Record
from .otlp import SpanData

_rand = random.Random()


def new_trace_id() -> int:
    return _rand.getrandbits(128) or 1


def new_span_id() -> int:
    return _rand.getrandbits(64) or 1


def dtype_name(dtype: Any) -> str | None:
    if dtype is None:
        return None
    return str(dtype).removeprefix("torch.")


def redop_name(op: Any) -> str | None:
    if op is None:
        return None
    name = getattr(op, "name", None)
    if isinstance(name, str):
        return name.lower()
    text = str(op)
    if "." in text and " " not in text:
        return text.rsplit(".", 1)[-1].lower()
    return type(op).__name__.lower()


def _rank_of(gi: Any, pair: tuple[Any, Any] | None) -> int | None:
    """A (global rank, group rank) pair as given to the API, as a global rank."""
    if pair is None:
        return None
    global_rank, group_rank = pair
    if global_rank is not None:
        return int(global_rank)
    if group_rank is not None:
        return gi.global_rank(int(group_rank))
    return None


def duration_seconds(rec: Record) -> float:
    if rec.gpu_duration_ns is not None:
        return rec.gpu_duration_ns / 1e9
    return max(rec.t_end - rec.t_start, 0) / 1e9


def collective_attributes(rec: Record, seconds: float) -> dict[str, Any]:
    gi = rec.group
    size = gi.size
    attrs: dict[str, Any] = {
        n.COLL_OP: rec.op,
        n.COLL_KIND: rec.kind,
        n.COLL_BACKEND: gi.backend,
        n.COLL_GROUP_NAME: gi.name,
        n.COLL_GROUP_DESC: gi.desc,
        n.COLL_GROUP_SIZE: size,
        n.COLL_GROUP_RANK: gi.rank,
        n.COLL_GROUP_RANKS: list(gi.ranks) if gi.ranks is not None else None,
        n.COLL_DTYPE: dtype_name(rec.dtype),
        n.COLL_SHAPES: [str(list(s)) for s in rec.shapes] if rec.shapes else None,
        n.COLL_NUMEL: rec.numel,
        n.COLL_TENSORS: rec.ntensors,
        n.COLL_MESSAGE_SIZE: rec.nbytes,
        n.COLL_REDUCE_OP: redop_name(rec.redop),
        n.COLL_ROOT: _rank_of(gi, rec.root),
        n.COLL_PEER: _rank_of(gi, rec.peer),
        n.COLL_ASYNC: rec.async_op,
        n.COLL_SEQ: rec.seq,
        n.COLL_DURATION: seconds,
        n.COLL_END_SOURCE: rec.end_source,
        n.COLL_SOURCE: rec.source,
    }
    if rec.kind != bw.BARRIER and size > 0:
        attrs[n.COLL_ALGBW] = bw.algbw_gbps(rec.nbytes, seconds)
        attrs[n.COLL_BUSBW] = bw.busbw_gbps(rec.kind, size, rec.nbytes, seconds)
    extra = rec.extra
    if extra:
        if "bytes_sent" in extra:
            attrs[n.COLL_BYTES_SENT] = extra["bytes_sent"]
            attrs[n.COLL_BYTES_RECEIVED] = extra["bytes_received"]
            attrs[n.COLL_PEERS] = [f"{kind}:{peer}" for kind, peer in extra["peers"]]
        if "coalesced_ops" in extra:
            attrs[n.COLL_COALESCED_OPS] = extra["coalesced_ops"]
    if rec.error is not None:
        attrs[n.ERROR_TYPE] = rec.error[0]
    return attrs


def collective_span(
    rec: Record, seconds: float, offset_ns: int, trace_id: int, parent_span_id: int | None, sampled: bool
) -> SpanData:
    start = rec.t_start + offset_ns
    end = (rec.t_end or rec.t_start) + offset_ns
    span = SpanData(
        name=rec.op,
        trace_id=trace_id,
        span_id=new_span_id(),
        parent_span_id=parent_span_id,
        start_ns=start,
        end_ns=max(end, start),
        attributes=collective_attributes(rec, seconds),
        sampled=sampled,
    )
    if rec.error is not None:
        etype, message = rec.error
        span.error = f"{etype.rsplit('.', 1)[-1]}: {message}"
        span.events.append((n.EXCEPTION_EVENT, span.end_ns, {n.EXCEPTION_TYPE: etype, n.EXCEPTION_MESSAGE: message}))
    return span
