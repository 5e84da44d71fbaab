"""The per-op table (like DeepSpeed's comms summary): from each rank's metrics when present, else its spans."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ... import bandwidth as bw
from ... import names as n
from ..records import Histogram
from ..report import OpRow, OpsTable, RunInfo, SizeRow
from ..stats import Sketch, bandwidth, bus_factor, fmt_ranks, histogram_quantile, kind_of
from .common import DEFAULT_GROUP, OpAgg

if TYPE_CHECKING:
    from . import Analyzer


class _MetricOp:
    __slots__ = ("count", "errors", "bytes", "bus", "dur", "timed", "bounds", "buckets")

    def __init__(self) -> None:
        self.timed = 0  # the duration histogram's count: the calls in dur
        self.count = 0
        self.errors = 0
        self.bytes = 0
        self.bus = 0
        self.dur = 0.0
        self.bounds: tuple[float, ...] = ()
        self.buckets: list[int] = []


def _metric_ops(an: Analyzer, rank: int) -> dict[tuple[str, str], _MetricOp]:
    snap = an.last_snapshot.get(rank)
    out: dict[tuple[str, str], _MetricOp] = {}
    if snap is None:
        return out

    def slot(p) -> _MetricOp:
        key = (str(p.attributes.get(n.M_OP, "?")), str(p.attributes.get(n.M_GROUP, "?")))
        m = out.get(key)
        if m is None:
            m = out[key] = _MetricOp()
        return m

    for p in snap.metrics.get(n.COLLECTIVE_CALLS.name, ()):
        slot(p).count = int(p.value)  # type: ignore[arg-type]
    for p in snap.metrics.get(n.COLLECTIVE_ERRORS.name, ()):
        slot(p).errors = int(p.value)  # type: ignore[arg-type]
    for p in snap.metrics.get(n.COLLECTIVE_BYTES.name, ()):
        slot(p).bytes = int(p.value)  # type: ignore[arg-type]
    for p in snap.metrics.get(n.COLLECTIVE_BUS_BYTES.name, ()):
        slot(p).bus = int(p.value)  # type: ignore[arg-type]
    for p in snap.metrics.get(n.COLLECTIVE_DURATION.name, ()):
        h = p.value
        if isinstance(h, Histogram):
            m = slot(p)
            m.dur = h.sum
            m.timed = h.count
            m.count = m.count or h.count
            m.bounds = h.bounds
            m.buckets = list(h.bucket_counts)
    return out


def build(an: Analyzer, run: RunInfo) -> OpsTable:
    ws = run.world_size
    # per (rank, op, group): the chosen source's numbers
    contrib: dict[tuple[int, str, str], tuple[str, int, int, int, float, int, int | None, _MetricOp | None]] = {}
    ranks = sorted(set(run.ranks))
    used_metrics: set[int] = set()
    used_spans: set[int] = set()
    span_keys: dict[int, set[tuple[str, str]]] = {}
    by_row: dict[tuple[str, str], list[OpAgg]] = {}
    for (r, op, g), agg in an.op_spans.items():
        span_keys.setdefault(r, set()).add((op, g))
        by_row.setdefault((op, g), []).append(agg)
    for rank in ranks:
        mops = _metric_ops(an, rank)
        keys = set(mops) | span_keys.get(rank, set())
        for op, group in keys:
            m = mops.get((op, group))
            s = an.op_spans.get((rank, op, group))
            if m is not None and (s is None or m.count >= s.count):
                contrib[(rank, op, group)] = ("metrics", m.count, m.errors, m.bytes, m.dur, m.timed, m.bus, m)
                used_metrics.add(rank)
            elif s is not None:
                contrib[(rank, op, group)] = ("spans", s.count, s.errors, s.bytes, s.dur, s.timed, None, None)
                used_spans.add(rank)
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    per_rank: list[OpRow] = []
    for (rank, op, group), (src, count, errors, nbytes, dur, timed, bus, mop) in sorted(contrib.items()):
        if count == 0:
            continue
        agg = rows.setdefault(
            (op, group),
            {"ranks": set(), "count": 0, "errors": 0, "bytes": 0, "dur": 0.0, "timed": 0, "bus": 0, "bus_known": True,
             "sources": set(), "buckets": None, "bounds": ()},
        )
        agg["ranks"].add(rank)
        agg["count"] += count
        agg["errors"] += errors
        agg["bytes"] += nbytes
        agg["dur"] += dur
        agg["timed"] += timed
        agg["sources"].add(src)
        if bus is None:
            agg["bus_known"] = False
        else:
            agg["bus"] += bus
        if mop is not None and mop.buckets:
            if agg["buckets"] is None:
                agg["buckets"] = list(mop.buckets)
                agg["bounds"] = mop.bounds
            elif len(agg["buckets"]) == len(mop.buckets):
                agg["buckets"] = [a + b for a, b in zip(agg["buckets"], mop.buckets)]
        if an.noise >= 2:
            sk = an.op_spans.get((rank, op, group))
            per_rank.append(
                _op_row(an, op, group, ws, rank, {rank}, count, errors, nbytes, dur, timed, bus, {src},
                             sk.sketch if sk else None, list(mop.buckets) if mop else None, mop.bounds if mop else ())
            )
    out = []
    for (op, group), agg in rows.items():
        sketch = Sketch()
        for span_agg in by_row.get((op, group), ()):
            sketch.merge(span_agg.sketch)
        out.append(
            _op_row(an, op, group, ws, None, agg["ranks"], agg["count"], agg["errors"], agg["bytes"], agg["dur"],
                         agg["timed"], agg["bus"] if agg["bus_known"] else None, agg["sources"], sketch, agg["buckets"], agg["bounds"])
        )
    out.sort(key=lambda r: (-r.total_s, r.op, r.group))
    per_rank.sort(key=lambda r: (r.op, r.group, r.rank))
    by_size = []
    for (op, _, floor), (count, nbytes, dur, kind, size) in sorted(an.by_size.items()):
        kind = kind or kind_of(op)
        alg, bus = bandwidth(kind, size, nbytes, dur)
        by_size.append(
            SizeRow(op=op, kind=kind, group_size=size, size_floor=floor, count=count,
                    mean_message_size=nbytes / count, total_s=dur, algbw_gbps=alg, busbw_gbps=bus)
        )
    parts = []
    if used_metrics:
        parts.append(f"metrics of rank{'s' if len(used_metrics) > 1 else ''} {fmt_ranks(used_metrics)} (every call)")
    if used_spans:
        parts.append(
            f"spans of rank{'s' if len(used_spans) > 1 else ''} {fmt_ranks(used_spans)} (traced steps only)"
        )
    n_traced = sum(s.count for s in an.op_spans.values())
    source = ("counts, sizes, times and bandwidth from the " + " and the ".join(parts)) if parts else "no collective data"
    source += f"; p50/p99 from {n_traced} traced calls" if n_traced else "; p50/p99 interpolated in the duration histograms"
    return OpsTable(source=source, rows=out, per_rank=per_rank, by_size=by_size)


def _op_row(an: Analyzer, op, group, ws, rank, ranks, count, errors, nbytes, dur, timed, bus, sources, sketch, buckets, bounds) -> OpRow:
    kind, size = an.op_meta.get((op, group), [None, None])
    kind = kind or kind_of(op)
    if not size and group == DEFAULT_GROUP and ws:
        size = ws
    alg, busbw = bandwidth(kind, size, nbytes, dur)
    factor = bus_factor(kind, size)
    if busbw is None and alg is not None and bus and kind != bw.BARRIER:
        busbw = bus / dur / 1e9  # the library's own factor, carried by the metrics
        factor = bus / nbytes if nbytes else None
    p50 = p99 = None
    qfrom = None
    if sketch is not None and sketch.count:
        p50, p99, qfrom = sketch.quantile(0.5), sketch.quantile(0.99), "spans"
    elif buckets:
        p50, p99, qfrom = histogram_quantile(0.5, bounds, buckets), histogram_quantile(0.99, bounds, buckets), "histogram"
    return OpRow(
        op=op,
        kind=kind,
        group=group,
        group_size=size,
        rank=rank,
        ranks=len(ranks),
        count=count,
        calls_per_rank=count / max(len(ranks), 1),
        errors=errors,
        total_bytes=nbytes,
        # the bytes are those of the calls that completed (the counters' rule), as the summary and dashboards say
        mean_message_size=nbytes / timed if timed else 0.0,
        total_s=dur,
        mean_s=dur / timed if timed else 0.0,  # over the calls that completed, whose time dur holds
        p50_s=p50,
        p99_s=p99,
        quantiles_from=qfrom,
        algbw_gbps=alg,
        busbw_gbps=busbw,
        bus_factor=factor,
        source="+".join(sorted(sources)),
    )
