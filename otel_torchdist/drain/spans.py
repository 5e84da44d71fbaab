"""From a collective record to its span attributes and metric contribution (off the hot path)."""

from __future__ import annotations

from typing import Any

from .. import bandwidth as bw
from .. import names as n
from ..capture import record as R
from ..capture.c10d import SOURCE_C10D
from ..capture.ops import ROOT_DEFAULTS
from ..capture.context import EXTRAS, FRAMEWORK, MODULE, PARENT_TRACE, PHASE
from ..ids import getrandbits
from ..telemetry import Block, SpanData


def dtype_name(dtype: Any) -> str | None:
    if dtype is None:
        return None
    return str(dtype).removeprefix("torch.")


def redop_name(op: Any) -> str | None:
    if op is None:
        return None
    if isinstance(op, str):  # functional collectives name the op: "sum", "avg"
        return op.lower()
    name = getattr(op, "name", None)
    if isinstance(name, str):
        return name.lower()
    name = getattr(getattr(op, "op", None), "name", None)  # a ReduceOp object (PREMUL_SUM(factor)): its type's
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


def group_attributes(gi: Any) -> tuple[tuple[str, Any], ...]:
    """The span attributes every collective of one group shares (built once per group)."""
    if not gi.span_attrs:
        pairs = [
            (n.COLL_BACKEND, gi.backend),
            (n.COLL_GROUP_NAME, gi.name),
            (n.COLL_GROUP_DESC, gi.desc),
            (n.COLL_GROUP_LABEL, gi.series),  # the metrics' group: past MAX_SERIES_GROUPS groups, theirs is shared
            (n.COLL_GROUP_SIZE, gi.size),
            (n.COLL_GROUP_RANK, gi.rank),
        ]
        if gi.ranks is not None:
            pairs.append((n.COLL_GROUP_RANKS, tuple(gi.ranks)))
        gi.span_attrs = tuple(pairs)
    return gi.span_attrs


_shapes_text: dict[tuple, tuple[str, ...]] = {}


def shapes_text(flat: tuple) -> tuple[str, ...]:
    """A record's flattened shapes as span attribute values, e.g. ("[1024, 512]", "[512]")."""
    text = _shapes_text.get(flat)
    if text is None:
        text = tuple(str(list(s)) for s in R.iter_shapes(flat))
        if len(_shapes_text) < 65536:
            _shapes_text[flat] = text
    return text


def static_attributes(rec: tuple, gi: Any) -> list[tuple[str, Any]]:
    """The attributes every call from one call site shares: the op and its tensors, where it came from."""
    kind = rec[R.KIND]
    static: list[tuple[str, Any]] = [(n.COLL_OP, rec[R.OP]), (n.COLL_KIND, kind)]
    if rec[R.DTYPE] is not None:
        static.append((n.COLL_DTYPE, dtype_name(rec[R.DTYPE])))
    if rec[R.SHAPES]:
        static.append((n.COLL_SHAPES, shapes_text(rec[R.SHAPES])))
    static += [(n.COLL_NUMEL, rec[R.NUMEL]), (n.COLL_TENSORS, rec[R.NTENSORS]), (n.COLL_MESSAGE_SIZE, rec[R.NBYTES])]
    if rec[R.REDOP] is not None:
        static.append((n.COLL_REDUCE_OP, redop_name(rec[R.REDOP])))
    root = _rank_of(gi, rec[R.ROOT])
    if root is None and rec[R.ROOT] is not None and rec[R.SOURCE] == SOURCE_C10D:
        root = ROOT_DEFAULTS.get(rec[R.OP])  # neither root parameter given: torch's default
    if root is not None:
        static.append((n.COLL_ROOT, root))
    peer = _rank_of(gi, rec[R.PEER])
    if peer is not None:
        static.append((n.COLL_PEER, peer))
    static += [(n.COLL_ASYNC, rec[R.ASYNC]), (n.COLL_END_SOURCE, rec[R.END]), (n.COLL_SOURCE, rec[R.SOURCE])]
    extra = rec[R.EXTRA]
    if extra:
        for i in range(0, len(extra), 2):
            key, value = extra[i], extra[i + 1]
            if key != "wait_ns":
                static.append((_EXTRA_KEYS[key], tuple(value.split(",")) if key == "peers" else value))
    if rec[R.ERROR] is not None:
        static.append((n.ERROR_TYPE, rec[R.ERROR][0]))
    static += source_attributes(rec)
    return static


_BUS_FACTORS = bw.FACTORS
_T_START, _T_END, _OP, _EXTRA, _SEQ, _KIND, _NBYTES = R.T_START, R.T_END, R.OP, R.EXTRA, R.SEQ, R.KIND, R.NBYTES
_SOURCE, _FUNCOL = R.SOURCE, "funcol"  # capture/funcol.py's SOURCE
_DURATION, _SEQ_KEY, _ALGBW, _BUSBW, _BARRIER = n.COLL_DURATION, n.COLL_SEQ, n.COLL_ALGBW, n.COLL_BUSBW, bw.BARRIER
_ERROR, _END = R.ERROR, R.END
# Ends that are not the transfer's: the launch alone, or nothing seen before the flush. No S/t for those.
_UNTIMED_ENDS = frozenset((n.END_ENQUEUE, n.END_UNFINISHED))


def dynamic_attributes(rec: tuple, gi: Any, seconds: float) -> list[tuple[str, Any]]:
    """The attributes new with every call: timings, sequence number, bandwidths."""
    # Runs for every traced collective: locals, bandwidth.algbw_gbps inlined, the bus factor cached.
    dynamic: list[tuple[str, Any]] = [(_DURATION, seconds)]
    extra = rec[_EXTRA]
    if extra:
        for i in range(0, len(extra), 2):
            if extra[i] == "wait_ns":
                dynamic.append((n.FUNCOL_WAIT_S if rec[_SOURCE] == _FUNCOL else n.COLL_WAIT_S, extra[i + 1] / 1e9))
    seq = rec[_SEQ]
    if seq is not None:
        dynamic.append((_SEQ_KEY, seq))
    kind, size, nbytes = rec[_KIND], gi.size, rec[_NBYTES]
    # algbw is undefined otherwise: nothing moved, no time, a call that failed, or no completion seen
    if kind != _BARRIER and size > 0 and nbytes > 0 and seconds > 0 and rec[_ERROR] is None and rec[_END] not in _UNTIMED_ENDS:
        factor = _BUS_FACTORS.get((kind, size))
        if factor is None:
            factor = _BUS_FACTORS[(kind, size)] = bw.bus_factor(kind, size)
        alg = nbytes / seconds / 1e9
        dynamic.append((_ALGBW, alg))
        dynamic.append((_BUSBW, alg * factor))
    return dynamic


# Call site -> its group's and static attributes as one Block (encoded once by the OTLP encoders).
_sites: dict[tuple, Block] = {}
_SITES_LIMIT = 1 << 14


def site_block(rec: tuple, gi: Any) -> Block:
    ctx = rec[R.CTX]
    extra = rec[R.EXTRA]
    block = key = None
    if not (extra and "wait_ns" in extra):
        # Every field static_attributes reads (not SEQ and the times); not the context's parent ids, which change
        # every step.
        key = (rec[: R.SEQ], rec[R.NBYTES : R.PARENT], extra, rec[R.BWD], ctx and (ctx[:PARENT_TRACE], ctx[EXTRAS]))
        try:
            block = _sites.get(key)
        except TypeError:  # an unhashable value in the record: build it every time
            key = None
    if block is None:
        block = Block(group_attributes(gi) + tuple(static_attributes(rec, gi)))
        if key is not None:
            if len(_sites) >= _SITES_LIMIT:
                _sites.clear()
            _sites[key] = block
    return block


_FRAMEWORK_OF_SOURCE = {"funcol": "funcol", "deep": "compiled"}


def phase_of(rec: tuple) -> str:
    ctx = rec[R.CTX]
    if ctx is not None and ctx[PHASE]:
        return ctx[PHASE]
    return "backward" if rec[R.BWD] else "other"


def source_attributes(rec: tuple) -> list[tuple[str, Any]]:
    """Where the collective came from: framework, module, phase, and the framework's own facts."""
    ctx = rec[R.CTX]
    framework = ctx[FRAMEWORK] if ctx is not None else None
    framework = framework or _FRAMEWORK_OF_SOURCE.get(rec[R.SOURCE], "c10d")
    out = [(n.COLL_FRAMEWORK, framework), (n.COLL_PHASE, phase_of(rec))]
    if ctx is not None:
        if ctx[MODULE]:
            out.append((n.COLL_MODULE, ctx[MODULE]))
        extras = ctx[EXTRAS]
        for i in range(0, len(extras), 2):
            out.append((extras[i], extras[i + 1]))
    return out


_EXTRA_KEYS = {
    "bytes_sent": n.COLL_BYTES_SENT,
    "bytes_received": n.COLL_BYTES_RECEIVED,
    "peers": n.COLL_PEERS,
    "coalesced_ops": n.COLL_COALESCED_OPS,
}


def collective_span(
    rec: tuple, gi: Any, seconds: float, offset_ns: int, trace_id: int, parent_span_id: int | None, sampled: bool
) -> SpanData:
    start = rec[_T_START] + offset_ns
    end = (rec[_T_END] or rec[_T_START]) + offset_ns
    span = SpanData(  # positional: SpanData's field order (a keyword call costs more, once per traced collective)
        rec[_OP],
        trace_id,
        getrandbits(64) or 1,  # new_span_id()
        parent_span_id,
        start,
        end if end > start else start,
        dynamic_attributes(rec, gi, seconds),
        (site_block(rec, gi),),
        None,
        [],
        sampled,
    )
    error = rec[R.ERROR]
    if error is not None:
        etype, message = error
        span.error = f"{etype.rsplit('.', 1)[-1]}: {message}"
        span.events.append((n.EXCEPTION_EVENT, span.end_ns, [(n.EXCEPTION_TYPE, etype), (n.EXCEPTION_MESSAGE, message)]))
    return span


def _cut(value: Any, limit: int) -> Any:
    if isinstance(value, str):
        return value[:limit]
    if isinstance(value, tuple):
        return tuple(v[:limit] if isinstance(v, str) else v for v in value)
    return value


def limited(span: SpanData, value_limit: int | None, count_limit: int, event_value_limit: int | None = None) -> SpanData:
    """``span`` within the span limits the SDK applies (OTEL_*ATTRIBUTE_VALUE_LENGTH_LIMIT,
    OTEL_*ATTRIBUTE_COUNT_LIMIT): string values cut to ``value_limit`` characters, and of more than
    ``count_limit`` attributes the last ones kept, as the SDK's bounded attributes keep them; its events' and
    links' string values cut to ``event_value_limit`` (the SDK's global limit, not the span-only one)."""
    pairs = span.all_attributes()
    items = [(k, v) for k, v in pairs.items() if v is not None][-count_limit:] if count_limit else []
    if value_limit is not None:
        items = [(k, _cut(v, value_limit)) for k, v in items]
    events, links = span.events, span.links
    if event_value_limit is not None:
        events = [(name, t, [(k, _cut(v, event_value_limit)) for k, v in attrs]) for name, t, attrs in events]
        links = tuple((t, s, tuple((k, _cut(v, event_value_limit)) for k, v in attrs)) for t, s, attrs in links)
    return SpanData(
        span.name, span.trace_id, span.span_id, span.parent_span_id, span.start_ns, span.end_ns, items, (),
        span.error, events, span.sampled, span.remote_parent, links,
    )  # fmt: skip
