"""Builders: typed records in, tables out, with no I/O.

An :class:`Analyzer` takes records one at a time (``add``) and keeps only what the tables need: running
sums and a quantile sketch per op, counts per module, the collectives not yet matched across ranks, one
row per traced step, each rank's latest metric snapshot. ``finish`` turns that into a :class:`Report`.
The functions at the end (``ops_table``, ``stragglers``...) do the same over any iterable of records,
for tests and for callers that already hold records.

How the numbers are made:

* **Per op** (like DeepSpeed's comms summary): from each rank's metrics when present (complete), else from
  its spans (traced steps only); whichever saw more calls wins, so a stale last metric export does not hide
  later spans. Bandwidth is bytes-weighted, ``algbw = sum(S) / sum(t)`` and ``busbw = algbw x`` nccl-tests'
  bus factor for the op's kind and group size (``bandwidth.py``). p50/p99 come from the spans' durations
  (a sketch within 1%), else from the duration histogram's buckets.
* **Per module and phase** (like CommDebugMode): a module counts the collectives its submodules issued,
  by dotted FQN prefix; from spans.
* **Stragglers**: collectives are matched across ranks by (process group name, sequence number); a rank's
  lateness at one is its start minus the earliest start. Step compute and wait come from the traced
  ``train.rank_step`` spans (the first step, which holds set-up, left out) and from the metrics' totals.
  The score is the library's (``stragglers.scores``): ``(median compute - lowest median compute) / median
  step time``, over the traced steps; over the metrics' totals (means) when steps were not traced.
* **Hangs**: each rank's last exported ``last_started_seq`` / ``last_completed_seq`` per group; the ranks
  whose started number is behind the group's highest never arrived at that collective.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from collections.abc import Iterable
from typing import Any

from .. import bandwidth as bw
from .. import names as n
from ..drain.stragglers import scores as straggler_scores
from .records import (
    Collective,
    Hang,
    Histogram,
    MetricSnapshot,
    Phase,
    Problem,
    RankResource,
    RankStep,
    Record,
    Span,
    WarningRecord,
)
from .report import (
    FailureRow,
    GpuSeries,
    HangGroup,
    HangRank,
    HangReport,
    HangSpanRow,
    ModuleOp,
    ModuleRow,
    ModulesTable,
    OpRow,
    OpsTable,
    OverlapRow,
    Report,
    RunInfo,
    ShardingRow,
    SizeRow,
    StepCell,
    StepRow,
    StepsTable,
    StepTotals,
    StragglerRow,
    Stragglers,
    WarningRow,
)
from .stats import Sketch, bandwidth, bus_factor, fmt_ranks, histogram_quantile, kind_of

MAX_LISTED = 200  # failures, warnings and hang spans kept for the report (all are counted)
STRAGGLER_THRESHOLD = 0.05  # a score below this share of a step is noise, not a straggler
DEFAULT_GROUP = "default_pg"


class _OpAgg:
    __slots__ = ("count", "errors", "bytes", "dur", "sketch")

    def __init__(self) -> None:
        self.count = 0
        self.errors = 0
        self.bytes = 0
        self.dur = 0.0
        self.sketch = Sketch()


class _MetricOp:
    __slots__ = ("count", "errors", "bytes", "bus", "dur", "bounds", "buckets")

    def __init__(self) -> None:
        self.count = 0
        self.errors = 0
        self.bytes = 0
        self.bus = 0
        self.dur = 0.0
        self.bounds: tuple[float, ...] = ()
        self.buckets: list[int] = []


class Analyzer:
    """Every table of ``otel-torchdist analyze``, built incrementally from records."""

    def __init__(self, *, path: str = "", noise_level: int = 0) -> None:
        self.path = path
        self.noise = noise_level
        self.resources: dict[int, RankResource] = {}
        self.span_ranks: set[int] = set()
        self.n_spans = 0
        self.n_coll = 0
        self.n_snapshots = 0
        self.trace_steps: dict[str, int] = {}
        # ops
        self.op_spans: dict[tuple[int, str, str], _OpAgg] = {}
        self.op_meta: dict[tuple[str, str], list[Any]] = {}  # (op, group) -> [kind, group size]
        self.by_size: dict[tuple[str, int], list[Any]] = {}
        # modules
        self.mod_counts: dict[int, dict[tuple[str | None, str, str], list[float]]] = {}
        self.sharding: dict[int, dict[tuple, list[Any]]] = {}
        # arrival matching
        self.pending: dict[tuple[str, int], dict[int, int]] = {}
        self.arrival: dict[int, list[float]] = {}  # rank -> [matched, late sum, late max, last arrivals]
        self.matched = 0
        self.skew_sum = 0.0
        self.skew_max = 0.0
        # steps
        # (step number, occurrence) -> rank -> its part: numbers may repeat (epochs, evaluation steps)
        self.rank_steps: dict[tuple[int, int], dict[int, RankStep]] = {}
        self.step_coll: dict[str, list[float]] = {}  # trace id -> [count, async s, all s]
        self.phases = 0
        # hangs
        self.hang_spans: list[Hang] = []
        self.failures: list[Collective] = []
        self.failures_total = 0
        self.span_seq: dict[tuple[int, str], int] = {}
        self.members: dict[tuple[int, str], tuple[int, ...]] = {}
        # metrics
        self.last_snapshot: dict[int, MetricSnapshot] = {}
        # The last snapshot holding the group sequence gauges: a rank's final export may lack them (its
        # groups destroyed before it), and hangs are judged from the last state that was recorded.
        self.last_seq_snapshot: dict[int, MetricSnapshot] = {}
        self.gpu: dict[tuple[int, str], GpuSeries] = {}
        # warnings
        self.warnings: list[WarningRecord] = []
        self.warnings_total = 0
        self._dispatch = {
            Collective: self._collective,
            RankStep: self._rank_step,
            Phase: self._phase,
            Span: self._span,
            Hang: self._hang,
            WarningRecord: self._warning,
            MetricSnapshot: self._snapshot,
            RankResource: self._resource,
        }

    # ------------------------------------------------------------------------------------ intake
    def add(self, rec: Record) -> None:
        self._dispatch[type(rec)](rec)

    def add_all(self, records: Iterable[Record]) -> Analyzer:
        for rec in records:
            self.add(rec)
        return self

    def _resource(self, r: RankResource) -> None:
        known = self.resources.get(r.rank)
        if known is None:
            self.resources[r.rank] = r
        elif known.world_size is None and r.world_size is not None:
            known.world_size = r.world_size

    def _collective(self, c: Collective) -> None:
        self.n_spans += 1
        self.n_coll += 1
        self.span_ranks.add(c.rank)
        key = (c.rank, c.op, c.group)
        agg = self.op_spans.get(key)
        if agg is None:
            agg = self.op_spans[key] = _OpAgg()
        agg.count += 1
        agg.bytes += c.message_size
        agg.dur += c.duration_s
        agg.sketch.add(c.duration_s)
        meta = self.op_meta.get((c.op, c.group))
        if meta is None:
            self.op_meta[(c.op, c.group)] = [c.kind, c.group_size]
        else:
            meta[0] = meta[0] or c.kind
            meta[1] = meta[1] or c.group_size
        if c.error is not None:
            agg.errors += 1
            self.failures_total += 1
            if len(self.failures) < MAX_LISTED:
                self.failures.append(c)
        elif c.message_size > 0:
            floor = 1 << (c.message_size.bit_length() - 1)
            row = self.by_size.get((c.op, floor))
            if row is None:
                row = self.by_size[(c.op, floor)] = [0, 0, 0.0, c.kind, c.group_size]
            row[0] += 1
            row[1] += c.message_size
            row[2] += c.duration_s
        mods = self.mod_counts.get(c.rank)
        if mods is None:
            mods = self.mod_counts[c.rank] = {}
        mkey = (c.module, c.phase or "other", c.op)
        slot = mods.get(mkey)
        if slot is None:
            slot = mods[mkey] = [0, 0, 0.0]
        slot[0] += 1
        slot[1] += c.message_size
        slot[2] += c.duration_s
        # arrival matching by (group, sequence number); point-to-point sequence numbers are per pair
        if c.seq is not None and c.group_size and c.group_size > 1 and c.kind != bw.SEND_RECV and c.error is None:
            mk = (c.group_name, c.seq)
            arrived = self.pending.get(mk)
            if arrived is None:
                arrived = self.pending[mk] = {}
            arrived[c.rank] = c.start_ns
            if len(arrived) >= c.group_size:
                del self.pending[mk]
                self._matched(arrived)
        if c.trace_id:
            sc = self.step_coll.get(c.trace_id)
            if sc is None:
                sc = self.step_coll[c.trace_id] = [0, 0.0, 0.0]
            sc[0] += 1
            sc[2] += c.duration_s
            if c.is_async:
                sc[1] += c.duration_s
        if c.seq is not None:
            sk = (c.rank, c.group)
            if c.seq > self.span_seq.get(sk, 0):
                self.span_seq[sk] = c.seq
        if c.group_ranks and (c.rank, c.group) not in self.members:
            self.members[(c.rank, c.group)] = c.group_ranks

    def _matched(self, arrived: dict[int, int]) -> None:
        first = min(arrived.values())
        last_rank, last = max(arrived.items(), key=lambda kv: kv[1])
        skew = (last - first) / 1e9
        self.matched += 1
        self.skew_sum += skew
        self.skew_max = max(self.skew_max, skew)
        for rank, t in arrived.items():
            a = self.arrival.get(rank)
            if a is None:
                a = self.arrival[rank] = [0, 0.0, 0.0, 0]
            late = (t - first) / 1e9
            a[0] += 1
            a[1] += late
            a[2] = max(a[2], late)
            if rank == last_rank and skew > 0:
                a[3] += 1

    def _rank_step(self, s: RankStep) -> None:
        self.n_spans += 1
        self.span_ranks.add(s.rank)
        self.trace_steps[s.trace_id] = s.step
        self.rank_steps.setdefault((s.step, s.occurrence), {})[s.rank] = s

    def _phase(self, p: Phase) -> None:
        self.n_spans += 1
        self.phases += 1
        self.span_ranks.add(p.rank)

    def _span(self, s: Span) -> None:
        self.n_spans += 1
        self.span_ranks.add(s.rank)
        if s.name == n.SPAN_STEP and isinstance(s.attributes.get(n.STEP), int):
            self.trace_steps[s.trace_id] = s.attributes[n.STEP]
        elif s.name.startswith("sharding."):
            a = s.attributes
            row = ShardingRow(
                name=s.name,
                module=a.get(n.SHARD_MODULE),
                count=0,
                parameters=a.get(n.SHARD_PARAMS),
                original_shapes=a.get(n.SHARD_ORIGINAL_SHAPES),
                sharded_shapes=a.get(n.SHARD_SHARDED_SHAPES),
                placements_before=a.get(n.SHARD_PLACEMENTS_BEFORE),
                placements_after=a.get(n.SHARD_PLACEMENTS_AFTER),
                mesh_shape=a.get(n.SHARD_MESH_SHAPE),
                mesh_dims=a.get(n.SHARD_MESH_DIMS),
                plan=a.get(n.SHARD_PLAN),
            )
            key = tuple(str(v) for v in vars_of(row))
            per_rank = self.sharding.setdefault(s.rank, {})
            if key in per_rank:
                per_rank[key].count += 1
            elif len(per_rank) < MAX_LISTED:
                row.count = 1
                per_rank[key] = row

    def _hang(self, h: Hang) -> None:
        self.n_spans += 1
        self.span_ranks.add(h.rank)
        if len(self.hang_spans) < MAX_LISTED:
            self.hang_spans.append(h)
        if h.group_ranks and (h.rank, h.group) not in self.members:
            self.members[(h.rank, h.group)] = h.group_ranks  # a rank stuck in a group's first collective

    def _warning(self, w: WarningRecord) -> None:
        self.warnings_total += 1
        if len(self.warnings) < MAX_LISTED:
            self.warnings.append(w)

    def _snapshot(self, m: MetricSnapshot) -> None:
        self.n_snapshots += 1
        last = self.last_snapshot.get(m.rank)
        if last is None or m.time_ns >= last.time_ns:
            self.last_snapshot[m.rank] = m
        if n.GROUP_SEQ_STARTED.name in m.metrics:
            last = self.last_seq_snapshot.get(m.rank)
            if last is None or m.time_ns >= last.time_ns:
                self.last_seq_snapshot[m.rank] = m
        for p in m.metrics.get(n.GPU_UTILIZATION.name, ()):
            gpu = str(p.attributes.get(n.M_GPU, "?"))
            series = self.gpu.get((m.rank, gpu))
            if series is None:
                series = self.gpu[(m.rank, gpu)] = GpuSeries(
                    rank=m.rank, gpu=gpu, model=p.attributes.get(n.M_GPU_MODEL), times_ns=[], utilization=[]
                )
            if not series.times_ns or m.time_ns > series.times_ns[-1]:
                series.times_ns.append(m.time_ns)
                series.utilization.append(float(p.value))  # type: ignore[arg-type]

    # ------------------------------------------------------------------------------------ output
    def finish(self, problems: list[Problem] | None = None, *, files: int = 0, lines: int = 0, skipped: int = 0) -> Report:
        run = self._run_info(problems or [], files, lines, skipped)
        return Report(
            noise_level=self.noise,
            run=run,
            ops=self._ops(run),
            modules=self._modules(),
            stragglers=self._stragglers(run),
            steps=self._steps(),
            hangs=self._hangs(run),
            gpu=sorted(self.gpu.values(), key=lambda s: (s.rank, s.gpu)),
            warnings=[WarningRow(rank=w.rank, kind=w.kind, message=w.message) for w in self.warnings],
            warnings_total=self.warnings_total,
        )

    # ---- run
    def world_size(self) -> int | None:
        sizes = [r.world_size for r in self.resources.values() if r.world_size]
        return max(sizes) if sizes else None

    def _run_info(self, problems: list[Problem], files: int, lines: int, skipped: int) -> RunInfo:
        ws = self.world_size()
        metric_ranks = sorted(self.last_snapshot)
        ranks = sorted(set(self.resources) | self.span_ranks | set(metric_ranks))
        missing = [r for r in range(ws) if r not in ranks] if ws else []
        run_ids = sorted({r.run_id for r in self.resources.values() if r.run_id})
        backends = sorted({r.backend for r in self.resources.values() if r.backend})
        notes = []
        if missing:
            notes.append(
                f"only rank{'s' if len(ranks) > 1 else ''} {fmt_ranks(ranks)} of {ws} left telemetry here; "
                f"missing: {fmt_ranks(missing)}. Tables that compare ranks (stragglers, arrival skew, hang sequence "
                "numbers) cover the ranks present only."
            )
        if len(run_ids) > 1:
            notes.append(f"these files come from {len(run_ids)} runs ({', '.join(run_ids)}): their numbers are mixed")
        trace_ranks = sorted(self.span_ranks)
        if not trace_ranks:
            notes.append(
                "no spans: per-module counts, arrival skew and per-step tables need traces (they may have gone to an "
                "OTLP endpoint; with OTEL_TRACES_EXPORTER=file they land in the run folder)"
            )
        elif set(metric_ranks) < set(ranks) or not metric_ranks:
            without = sorted(set(ranks) - set(metric_ranks))
            notes.append(
                f"no metrics for rank{'s' if len(without) > 1 else ''} {fmt_ranks(without)}: "
                "their counts and bandwidth come from the traced steps only (traces are sampled by step)"
            )
        if trace_ranks and set(trace_ranks) < set(metric_ranks):
            without = sorted(set(metric_ranks) - set(trace_ranks))
            notes.append(
                f"no spans for rank{'s' if len(without) > 1 else ''} {fmt_ranks(without)}: the per-module, arrival "
                "and per-step tables leave it out"
            )
        notes += self._dropped_notes()
        return RunInfo(
            path=self.path,
            run_ids=run_ids,
            world_size=ws,
            ranks=ranks,
            missing_ranks=missing,
            backend=backends[0] if len(backends) == 1 else (", ".join(backends) or None),
            hosts=sorted({r.host for r in self.resources.values() if r.host}),
            trace_ranks=trace_ranks,
            metric_ranks=metric_ranks,
            spans=self.n_spans,
            collective_spans=self.n_coll,
            traced_steps=sorted({step for step, _ in self.rank_steps}),
            metric_snapshots=self.n_snapshots,
            files=files,
            lines=lines,
            skipped_lines=skipped,
            problems=[str(p) for p in problems],
            notes=notes,
        )

    # ---- ops
    def _metric_ops(self, rank: int) -> dict[tuple[str, str], _MetricOp]:
        snap = self.last_snapshot.get(rank)
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
                m.count = m.count or h.count
                m.bounds = h.bounds
                m.buckets = list(h.bucket_counts)
        return out

    def _ops(self, run: RunInfo) -> OpsTable:
        ws = run.world_size
        # per (rank, op, group): the chosen source's numbers
        contrib: dict[tuple[int, str, str], tuple[str, int, int, int, float, int | None, _MetricOp | None]] = {}
        ranks = sorted(set(run.ranks))
        used_metrics: set[int] = set()
        used_spans: set[int] = set()
        span_keys: dict[int, set[tuple[str, str]]] = {}
        by_row: dict[tuple[str, str], list[_OpAgg]] = {}
        for (r, op, g), agg in self.op_spans.items():
            span_keys.setdefault(r, set()).add((op, g))
            by_row.setdefault((op, g), []).append(agg)
        for rank in ranks:
            mops = self._metric_ops(rank)
            keys = set(mops) | span_keys.get(rank, set())
            for op, group in keys:
                m = mops.get((op, group))
                s = self.op_spans.get((rank, op, group))
                if m is not None and (s is None or m.count >= s.count):
                    contrib[(rank, op, group)] = ("metrics", m.count, m.errors, m.bytes, m.dur, m.bus, m)
                    used_metrics.add(rank)
                elif s is not None:
                    contrib[(rank, op, group)] = ("spans", s.count, s.errors, s.bytes, s.dur, None, None)
                    used_spans.add(rank)
        rows: dict[tuple[str, str], dict[str, Any]] = {}
        per_rank: list[OpRow] = []
        for (rank, op, group), (src, count, errors, nbytes, dur, bus, mop) in sorted(contrib.items()):
            if count == 0:
                continue
            agg = rows.setdefault(
                (op, group),
                {"ranks": set(), "count": 0, "errors": 0, "bytes": 0, "dur": 0.0, "bus": 0, "bus_known": True,
                 "sources": set(), "buckets": None, "bounds": ()},
            )
            agg["ranks"].add(rank)
            agg["count"] += count
            agg["errors"] += errors
            agg["bytes"] += nbytes
            agg["dur"] += dur
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
            if self.noise >= 2:
                sk = self.op_spans.get((rank, op, group))
                per_rank.append(
                    self._op_row(op, group, ws, rank, {rank}, count, errors, nbytes, dur, bus, {src},
                                 sk.sketch if sk else None, list(mop.buckets) if mop else None, mop.bounds if mop else ())
                )
        out = []
        for (op, group), agg in rows.items():
            sketch = Sketch()
            for span_agg in by_row.get((op, group), ()):
                sketch.merge(span_agg.sketch)
            out.append(
                self._op_row(op, group, ws, None, agg["ranks"], agg["count"], agg["errors"], agg["bytes"], agg["dur"],
                             agg["bus"] if agg["bus_known"] else None, agg["sources"], sketch, agg["buckets"], agg["bounds"])
            )
        out.sort(key=lambda r: (-r.total_s, r.op, r.group))
        per_rank.sort(key=lambda r: (r.op, r.group, r.rank))
        by_size = []
        for (op, floor), (count, nbytes, dur, kind, size) in sorted(self.by_size.items()):
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
        n_traced = sum(s.count for s in self.op_spans.values())
        source = "counts, sizes, times and bandwidth from the " + (" and the ".join(parts) or "(no data)")
        source += f"; p50/p99 from {n_traced} traced calls" if n_traced else "; p50/p99 interpolated in the duration histograms"
        return OpsTable(source=source, rows=out, per_rank=per_rank, by_size=by_size)

    def _op_row(self, op, group, ws, rank, ranks, count, errors, nbytes, dur, bus, sources, sketch, buckets, bounds) -> OpRow:
        kind, size = self.op_meta.get((op, group), [None, None])
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
            mean_message_size=nbytes / count if count else 0.0,
            total_s=dur,
            mean_s=dur / count if count else 0.0,
            p50_s=p50,
            p99_s=p99,
            quantiles_from=qfrom,
            algbw_gbps=alg,
            busbw_gbps=busbw,
            bus_factor=factor,
            source="+".join(sorted(sources)),
        )

    # ---- modules
    def _modules(self) -> ModulesTable:
        if not self.mod_counts:
            return ModulesTable(source="no collective spans", rank=None, phases=[], rows=[], consistent=True)
        shown = min(self.mod_counts)
        counts = self.mod_counts[shown]
        seen_phases = {phase for (_, phase, _) in counts}
        phases = [p for p in n.PHASES if p in seen_phases] + sorted(seen_phases - set(n.PHASES))
        names: set[str] = set()
        for module, _, _ in counts:
            if module:
                parts = module.split(".")
                names.update(".".join(parts[: i + 1]) for i in range(len(parts)))
        rows = [self._module_row("Global", 0, counts, lambda m: True)]
        for name in sorted(names, key=_natural):
            rows.append(
                self._module_row(name, name.count(".") + 1, counts, lambda m, name=name: bool(m) and (m == name or m.startswith(name + ".")))
            )
        signature = {r: {k: v[0] for k, v in c.items()} for r, c in self.mod_counts.items()}
        consistent = all(sig == signature[shown] for sig in signature.values())
        sharding_rank = shown if shown in self.sharding else (min(self.sharding) if self.sharding else None)
        sharding = list(self.sharding.get(sharding_rank, {}).values()) if (self.noise >= 1 and sharding_rank is not None) else []
        traced = len(self.rank_steps)
        return ModulesTable(
            source=(
                f"collective spans of rank {shown} ({traced} traced step{'s' if traced != 1 else ''} and the spans "
                "outside steps); a module counts what its submodules issued, as CommDebugMode counts"
            ),
            rank=shown,
            phases=phases,
            rows=rows,
            consistent=consistent,
            per_rank_totals=[{"rank": r, "collectives": int(sum(v[0] for v in c.values()))} for r, c in sorted(self.mod_counts.items())],
            sharding=sharding,
        )

    def _module_row(self, name: str, depth: int, counts, match) -> ModuleRow:
        per_phase: Counter[str] = Counter()
        ops: dict[tuple[str, str], list[float]] = {}
        for (module, phase, op), (count, nbytes, dur) in counts.items():
            if not match(module):
                continue
            per_phase[phase] += int(count)
            if self.noise >= 2:
                o = ops.setdefault((op, phase), [0, 0, 0.0])
                o[0] += count
                o[1] += nbytes
                o[2] += dur
        return ModuleRow(
            module=name,
            depth=depth,
            counts=dict(per_phase),
            total=sum(per_phase.values()),
            ops=[
                ModuleOp(op=op, phase=phase, count=int(c), mean_message_size=b / c, mean_s=d / c)
                for (op, phase), (c, b, d) in sorted(ops.items())
            ],
        )

    # ---- steps and stragglers
    def _first_step(self) -> tuple[int, int] | None:
        """The run's set-up step, left out of means (when other steps exist): the one its spans mark, else
        (runs of earlier versions) the lowest-numbered when it is step 0 or 1."""
        if len(self.rank_steps) < 2:
            return None
        for key, ranks in self.rank_steps.items():
            if any(s.setup for s in ranks.values()):
                return key
        first = min(self.rank_steps)
        return first if first[0] <= 1 else None

    def _ordered_steps(self) -> list[tuple[int, int]]:
        """The traced steps in the order they ran (numbers may repeat or go back)."""
        return sorted(self.rank_steps, key=lambda k: (min(s.start_ns for s in self.rank_steps[k].values()), k))

    def _dropped_notes(self) -> list[str]:
        """What the ranks dropped (their last metrics say), and which tables it thins."""
        by_kind: dict[str, int] = {}
        ranks: dict[bool, set[int]] = {True: set(), False: set()}  # by: is it the run folder's size limit
        for rank, snap in self.last_snapshot.items():
            for p in snap.metrics.get(n.TELEMETRY_DROPPED.name) or ():
                count = int(p.value) if not isinstance(p.value, Histogram) else 0
                if count > 0:
                    kind = str(p.attributes.get(n.M_KIND, "?"))
                    by_kind[kind] = by_kind.get(kind, 0) + count
                    ranks[kind == n.DROPPED_FILE_ROTATED].add(rank)
        notes = []
        rotated = by_kind.pop(n.DROPPED_FILE_ROTATED, 0)
        if by_kind:
            what = ", ".join(f"{v} {k}" for k, v in sorted(by_kind.items()))
            hurt = []
            if any(k.startswith("span") or k == "record" for k in by_kind):
                hurt.append("the tables built from spans (per module and phase, arrival skew, per step) miss those")
            if "record" in by_kind:
                hurt.append("a dropped record's collective is missing from the metrics as well")
            if set(by_kind) <= {"metric_batch", "straggler_window"}:
                hurt.append("nothing in these tables: metric pushes are cumulative, the last one holds the totals")
            notes.append(
                f"telemetry dropped to protect training, counted by {_ranks_word(ranks[False])}: {what} "
                "(torchdist_telemetry_dropped_total); " + "; ".join(hurt)
            )
        if rotated:
            notes.append(
                f"{rotated} spans deleted by the run folder's size limit (file_max_bytes) on {_ranks_word(ranks[True])}, "
                f'counted as kind="{n.DROPPED_FILE_ROTATED}": the tables built from spans miss the oldest'
            )
        return notes

    def _metric_value(self, rank: int, metric: n.Metric) -> float | None:
        snap = self.last_snapshot.get(rank)
        if snap is None:
            return None
        points = snap.metrics.get(metric.name)
        if not points:
            return None
        total = 0.0
        for p in points:
            v = p.value
            total += v.sum if isinstance(v, Histogram) else float(v)
        return total

    def _totals(self) -> list[StepTotals]:
        out = []
        for rank in sorted(self.last_snapshot):
            steps = self._metric_value(rank, n.STEPS_METRIC)
            if not steps:
                continue
            compute = self._metric_value(rank, n.STEP_COMPUTE_TIME) or 0.0
            wait = self._metric_value(rank, n.STEP_COLLECTIVE_WAIT_TIME) or 0.0
            total = self._metric_value(rank, n.STEP_DURATION_METRIC)
            out.append(
                StepTotals(
                    rank=rank,
                    steps=int(steps),
                    total_s=total if total is not None else compute + wait,
                    compute_s=compute,
                    wait_s=wait,
                    samples=self._metric_value(rank, n.TRAIN_SAMPLES),
                    tokens=self._metric_value(rank, n.TRAIN_TOKENS),
                )
            )
        return out

    def _stragglers(self, run: RunInfo) -> Stragglers:
        first = self._first_step()
        per_rank: dict[int, list[RankStep]] = {}
        for step, ranks in self.rank_steps.items():
            if step == first:
                continue
            for rank, s in ranks.items():
                per_rank.setdefault(rank, []).append(s)
        totals = {t.rank: t for t in self._totals()}
        ranks = sorted(set(run.ranks))
        rows = []
        for rank in ranks:
            steps = per_rank.get(rank, [])
            k = len(steps)
            mean = (lambda xs: sum(xs) / len(xs) if xs else None)
            median = (lambda xs: statistics.median(xs) if xs else None)
            d = mean([s.duration_s for s in steps])
            c = mean([s.compute_s for s in steps if s.compute_s is not None])
            w = mean([s.wait_s for s in steps if s.wait_s is not None])
            a = self.arrival.get(rank)
            t = totals.get(rank)
            rows.append(
                StragglerRow(
                    rank=rank,
                    steps=k,
                    mean_step_s=d,
                    mean_compute_s=c,
                    mean_wait_s=w,
                    wait_share=(w / d) if (w is not None and d) else None,
                    total_compute_s=t.compute_s if t else None,
                    total_wait_s=t.wait_s if t else None,
                    matched=int(a[0]) if a else 0,
                    mean_late_s=a[1] / a[0] if a and a[0] else None,
                    max_late_s=a[2] if a else None,
                    last_arrivals=int(a[3]) if a else 0,
                    score=None,
                    median_compute_s=median([s.compute_s for s in steps if s.compute_s is not None]),
                    median_step_s=median([s.duration_s for s in steps]),
                )
            )
        # score over traced steps when every rank has some, else over the metrics' totals
        from_traces = len(rows) > 1 and all(r.median_compute_s is not None and r.median_step_s for r in rows)
        if from_traces:
            windows = {r.rank: {"compute_median": r.median_compute_s, "duration_median": r.median_step_s} for r in rows}
            per_rank, _ = straggler_scores(windows)  # type: ignore[arg-type]
            for r in rows:
                r.score = per_rank[r.rank]
        elif len(rows) > 1 and all(r.rank in totals and totals[r.rank].steps for r in rows):
            per_step = {r.rank: totals[r.rank].compute_s / totals[r.rank].steps for r in rows}
            step_mean = sum(totals[r].total_s / totals[r].steps for r in per_step) / len(per_step)
            low = min(per_step.values())
            for r in rows:
                r.score = (per_step[r.rank] - low) / step_mean if step_mean > 0 else None
        exchange = self._exchange_slowest()
        slowest, verdict = self._straggler_verdict(rows, from_traces, exchange)
        n_steps = len([s for s in self.rank_steps if s != first])
        if from_traces:
            source = (
                f"steps: {n_steps} traced train.rank_step spans per rank"
                + (f" (step {first[0]}, which holds set-up, left out)" if first is not None else "")
                + "; totals: metrics (every step)"
            )
        elif totals:
            source = "steps: the metrics' totals (every step, the first one's set-up included)"
        else:
            source = "no step data (no train.rank_step spans, no step metrics)"
        source += f"; arrival: {self.matched} collectives matched across ranks by (group, sequence number)"
        return Stragglers(
            source=source,
            rows=rows,
            slowest_rank=slowest,
            verdict=verdict,
            matched=self.matched,
            partial=len(self.pending),
            max_skew_s=self.skew_max if self.matched else None,
            mean_skew_s=self.skew_sum / self.matched if self.matched else None,
            exchange_slowest=exchange,
        )

    def _exchange_slowest(self) -> int | None:
        votes = Counter()
        for rank in self.last_snapshot:
            v = self._metric_value(rank, n.STRAGGLER_SLOWEST)
            if v is not None and v >= 0:
                votes[int(v)] += 1
        return votes.most_common(1)[0][0] if votes else None

    @staticmethod
    def _straggler_verdict(rows: list[StragglerRow], from_traces: bool, exchange: int | None) -> tuple[int | None, str]:
        if len(rows) < 2:
            return None, "one rank only: there is no other rank to compare it with"
        scored = [r for r in rows if r.score is not None]
        late = [r for r in rows if r.mean_late_s is not None]
        by_late = max(late, key=lambda r: r.mean_late_s) if late else None  # type: ignore[arg-type,return-value]
        if not scored:
            if by_late is None or not by_late.mean_late_s:
                return None, "no step data and no matched collectives: no straggler can be named"
            best = by_late
            return best.rank, (
                f"rank {best.rank} arrives last: {best.mean_late_s * 1e3:.1f} ms after the first rank on average "
                f"over {best.matched} matched collectives (no step data to score compute)"
            )
        best = max(scored, key=lambda r: r.score)  # type: ignore[arg-type,return-value]
        where = "over the traced steps" if from_traces else "over all steps (metrics)"
        extra = ""
        if exchange is not None and exchange != best.rank:
            extra = f"; the library's last straggler exchange (a window of recent steps) named rank {exchange}"
        if best.score < STRAGGLER_THRESHOLD:  # type: ignore[operator]
            return None, (
                f"no straggler: the ranks' compute per step differs by at most {best.score * 100:.1f}% of a step "
                f"{where}{extra}"
            )
        text = f"rank {best.rank} is the slowest (score {best.score:.2f}"
        if from_traces:
            low = min(r.median_compute_s for r in scored)  # type: ignore[type-var]
            text += f": {(best.median_compute_s - low) * 1e3:.1f} ms more compute per step than the fastest rank, medians"  # type: ignore[operator]
            text += f", {best.score * 100:.0f}% of a median step, {where})"
        else:
            text += f", {best.score * 100:.0f}% of a mean step, {where})"
        if best.matched:
            text += (
                f"; it started last at {best.last_arrivals} of {best.matched} matched collectives, "
                f"{(best.mean_late_s or 0) * 1e3:.1f} ms after the first rank on average"
            )
        step_mean = [r.mean_step_s for r in rows if r.mean_step_s]
        significant = STRAGGLER_THRESHOLD * (sum(step_mean) / len(step_mean)) if step_mean else 0.0
        if (
            by_late is not None
            and by_late.rank != best.rank
            and (by_late.mean_late_s or 0) > max((best.mean_late_s or 0) * 1.5, significant)
        ):
            text += f"; arrival skew points at rank {by_late.rank} ({by_late.mean_late_s * 1e3:.1f} ms late on average)"
        return best.rank, text + extra

    def _steps(self) -> StepsTable:
        first = self._first_step()
        rows = []
        for key in self._ordered_steps():
            step, occurrence = key
            ranks = self.rank_steps[key]
            comp = [s.compute_s for s in ranks.values() if s.compute_s is not None]
            wait = [s.wait_s for s in ranks.values() if s.wait_s is not None]
            dur = [s.duration_s for s in ranks.values()]
            mean_c = sum(comp) / len(comp) if comp else None
            mean_w = sum(wait) / len(wait) if wait else None
            mean_d = sum(dur) / len(dur)
            async_s = total_s = 0.0
            count = 0
            for s in ranks.values():
                sc = self.step_coll.get(s.trace_id)
                if sc is not None:
                    count, async_s, total_s = sc
                    break
            slow = max((s for s in ranks.values() if s.compute_s is not None), key=lambda s: s.compute_s, default=None)
            rows.append(
                StepRow(
                    step=step,
                    occurrence=occurrence,
                    setup=key == first,
                    ranks=len(ranks),
                    duration_s=max(dur),
                    mean_compute_s=mean_c,
                    mean_wait_s=mean_w,
                    comm_share=(mean_w / mean_d) if (mean_w is not None and mean_d > 0) else None,
                    async_share=(async_s / total_s) if total_s > 0 else None,
                    collectives=round(count / len(ranks)) if count else int(
                        sum(s.collectives or 0 for s in ranks.values()) / len(ranks)
                    ),
                    slowest_rank=slow.rank if (slow is not None and len(ranks) > 1) else None,
                    start_ns=min(s.start_ns for s in ranks.values()),
                    trace_id=next(iter(ranks.values())).trace_id,
                    cells=[
                        StepCell(rank=r, duration_s=s.duration_s, compute_s=s.compute_s, wait_s=s.wait_s)
                        for r, s in sorted(ranks.items())
                    ]
                    if self.noise >= 1
                    else [],
                )
            )
        totals = self._totals()
        usable = [r for r in rows if not r.setup]
        step_compute = step_wait = None
        if len(usable) >= 3:
            step_time = statistics.median(r.duration_s for r in usable)
            step_from = f"median of {len(usable)} traced steps" + (f" (step {first[0]}, which holds set-up, left out)" if first is not None else "")
            # The split over the same steps and by the same statistic, so that it reads against the step
            # time: a mean that took in the first step's set-up could exceed the step itself.
            comp = [r.mean_compute_s for r in usable if r.mean_compute_s is not None]
            wait = [r.mean_wait_s for r in usable if r.mean_wait_s is not None]
            step_compute = statistics.median(comp) if comp else None
            step_wait = statistics.median(wait) if wait else None
        elif totals:
            step_time = sum(t.total_s / t.steps for t in totals) / len(totals)
            step_from = f"mean over all {max(t.steps for t in totals)} steps (metrics, set-up in the first included)"
        elif rows:
            step_time = sum(r.duration_s for r in rows) / len(rows)
            step_from = f"mean of {len(rows)} traced steps"
        else:
            step_time, step_from = None, None
        samples = tokens = None
        if totals and all(t.samples for t in totals):
            samples = sum(t.samples for t in totals) / max(t.steps for t in totals)  # type: ignore[misc]
        if totals and all(t.tokens for t in totals):
            tokens = sum(t.tokens for t in totals) / max(t.steps for t in totals)  # type: ignore[misc]
        overlap = []
        for rank in sorted(self.last_snapshot):
            snap = self.last_snapshot[rank]
            comm = {str(p.attributes.get(n.M_MODEL)): float(p.value) for p in snap.metrics.get(n.DDP_BACKWARD_COMM.name, ())}  # type: ignore[arg-type]
            over = {str(p.attributes.get(n.M_MODEL)): float(p.value) for p in snap.metrics.get(n.DDP_BACKWARD_OVERLAP.name, ())}  # type: ignore[arg-type]
            for model, c in sorted(comm.items()):
                o = over.get(model, 0.0)
                overlap.append(OverlapRow(rank=rank, model=model, comm_s=c, overlap_s=o, share=(o / c) if c > 0 else None))
        all_async = sum(sc[1] for sc in self.step_coll.values())
        all_coll = sum(sc[2] for sc in self.step_coll.values())
        if overlap:
            shares = [o.share for o in overlap if o.share is not None]
            mean_share = sum(shares) / len(shares) if shares else 0.0
            overlap_note = (
                f"DDP's own measure (metrics, sampled by DDP): {mean_share * 100:.0f}% of backward communication "
                "overlapped backward compute, on average over the ranks"
            )
        elif all_coll > 0:
            overlap_note = (
                "no overlap measure (only DDP reports one); async collectives are "
                f"{all_async / all_coll * 100:.0f}% of the traced collective time, an upper bound on what overlapped compute"
            )
        else:
            overlap_note = "no overlap measure (only DDP reports one) and no traced collectives"
        if rows:
            step_ranks = sorted({r for ranks in self.rank_steps.values() for r in ranks})
            source = (
                f"{len(rows)} traced step{'s' if len(rows) != 1 else ''} (train.rank_step spans of rank{'s' if len(step_ranks) > 1 else ''} "
                f"{fmt_ranks(step_ranks)}); totals: metrics, every step"
            )
        elif totals:
            source = "no traced steps; totals: metrics, every step"
        else:
            source = "no step data"
        return StepsTable(
            source=source,
            rows=rows,
            totals=totals,
            step_time_s=step_time,
            step_time_from=step_from,
            step_compute_s=step_compute,
            step_wait_s=step_wait,
            samples_per_step=samples,
            tokens_per_step=tokens,
            overlap=overlap,
            overlap_note=overlap_note,
        )

    # ---- hangs
    def _hangs(self, run: RunInfo) -> HangReport:
        started: dict[str, dict[int, int]] = {}
        completed: dict[str, dict[int, int]] = {}
        age: dict[str, dict[int, float]] = {}
        from_metrics: set[int] = set()
        for rank, snap in self.last_seq_snapshot.items():
            for p in snap.metrics.get(n.GROUP_SEQ_STARTED.name, ()):
                started.setdefault(str(p.attributes.get(n.M_GROUP)), {})[rank] = int(p.value)  # type: ignore[arg-type]
                from_metrics.add(rank)
            for p in snap.metrics.get(n.GROUP_SEQ_COMPLETED.name, ()):
                completed.setdefault(str(p.attributes.get(n.M_GROUP)), {})[rank] = int(p.value)  # type: ignore[arg-type]
            for p in snap.metrics.get(n.COLLECTIVE_INFLIGHT_AGE.name, ()):
                age.setdefault(str(p.attributes.get(n.M_GROUP)), {})[rank] = float(p.value)  # type: ignore[arg-type]
        from_spans: set[int] = set()
        for (rank, group), seq in self.span_seq.items():
            if rank in from_metrics:
                continue
            base = started.setdefault(group, {})
            base[rank] = max(base.get(rank, 0), seq)
            comp = completed.setdefault(group, {})
            comp[rank] = max(comp.get(rank, 0), seq)
            from_spans.add(rank)
        for h in self.hang_spans:  # a hang span proves the rank started that collective
            if h.seq is not None and h.rank not in from_metrics:
                base = started.setdefault(h.group, {})
                base[h.rank] = max(base.get(h.rank, 0), h.seq)
        ws = run.world_size
        groups = []
        verdicts = []
        for label in sorted(started):
            # ranks reporting this label may belong to different groups of the same description (one per mesh
            # slice): partition them by membership where spans told it
            parts: dict[tuple[int, ...] | None, list[int]] = {}
            known = {self._members(r, label) for r in started[label]} - {None}
            for rank in sorted(started[label]):
                members = self._members(rank, label) or next((k for k in known if k and rank in k), None)
                if members is None and label == DEFAULT_GROUP and ws:
                    members = tuple(range(ws))
                parts.setdefault(members, []).append(rank)
            for members, reporting in parts.items():
                if members is None:
                    members = tuple(reporting)  # who else belongs is unknown without spans
                groups.append(self._hang_group(label, members, started[label], completed.get(label, {}), age.get(label, {})))
                if groups[-1].verdict:
                    verdicts.append(groups[-1].verdict)
        hangs = [
            HangSpanRow(rank=h.rank, op=h.op, group=h.group, seq=h.seq, waited_s=h.waited_s,
                        resolved=self._resolved(h, completed.get(h.group, {})))
            for h in self.hang_spans
        ]
        failures = [
            FailureRow(rank=c.rank, op=c.op, group=c.group, seq=c.seq, duration_s=c.duration_s, error=c.error or "")
            for c in self.failures
        ]
        if verdicts:
            verdict = "; ".join(verdicts)
        elif hangs or failures:
            verdict = (
                f"no hang left: {len(hangs)} collective.hang report(s) and {self.failures_total} failed collective(s), "
                "but every group's ranks reached the same sequence numbers: the ranks all arrived, the collective "
                "itself was slow or failed"
            )
        elif groups:
            verdict = "no hang: on every group the ranks started and completed the same collectives"
            silent = sorted({r for g in groups for r in g.no_data})
            if silent:
                verdict += (
                    f" (among the ranks with data: rank{'s' if len(silent) > 1 else ''} {fmt_ranks(silent)} left none, "
                    "so whether they arrived is unknown)"
                )
        else:
            verdict = "no sequence numbers (no group metrics, no collective spans): hangs cannot be judged"
        parts_src = []
        if from_metrics:
            parts_src.append(f"last exported group metrics of rank{'s' if len(from_metrics) > 1 else ''} {fmt_ranks(from_metrics)}")
        if from_spans:
            parts_src.append(
                f"highest sequence number in the spans of rank{'s' if len(from_spans) > 1 else ''} {fmt_ranks(from_spans)} "
                "(traced steps only: a lower bound)"
            )
        source = "; ".join(parts_src) or "no sequence numbers"
        source += f"; {len(self.hang_spans)} collective.hang spans"
        return HangReport(
            source=source,
            groups=groups,
            hangs=hangs,
            failures=failures,
            failures_total=self.failures_total,
            verdict=verdict,
        )

    @staticmethod
    def _resolved(h: Hang, completed: dict[int, int]) -> bool:
        """Whether the collective a hang span reported completed later (the rank's completed seq passed it)."""
        return h.seq is not None and h.rank in completed and completed[h.rank] >= h.seq

    def _members(self, rank: int, label: str) -> tuple[int, ...] | None:
        m = self.members.get((rank, label))
        return tuple(sorted(m)) if m else None

    def _hang_group(self, label: str, members: tuple[int, ...], started: dict[int, int], completed: dict[int, int],
                    age: dict[int, float]) -> HangGroup:
        present = [r for r in members if r in started]
        no_data = [r for r in members if r not in started]
        top = max((started[r] for r in present), default=None)
        in_flight = [r for r in present if started[r] > completed.get(r, started[r])]
        # a hang report counts while its collective had not completed (a slow first collective that completed
        # later is not a hang)
        hang_ranks = {
            h.rank for h in self.hang_spans if h.group == label and h.rank in members and not self._resolved(h, completed)
        }
        failed = {c.rank for c in self.failures if c.group == label and c.rank in members}
        stuck = bool(in_flight or hang_ranks or failed)
        behind = [r for r in present if top is not None and started[r] < top]
        waiting = sorted(set(in_flight) | hang_ranks | failed)
        op = None
        for h in self.hang_spans:
            if h.group == label and h.seq == top:
                op = h.op
                break
        # rows: ranks sharing (started, completed), compressed
        by_values: dict[tuple[int | None, int | None], list[int]] = {}
        for r in present:
            by_values.setdefault((started[r], completed.get(r)), []).append(r)
        ranks = [
            HangRank(ranks=rs, started=s, completed=c, in_flight_s=max((age.get(r, 0.0) for r in rs), default=None) or None)
            for (s, c), rs in sorted(by_values.items(), key=lambda kv: kv[1][0])
        ]
        verdict = None
        if stuck and top is not None:
            never = behind + no_data
            what = f"{op} " if op else "the collective with "
            if never:
                verdict = (
                    f"{label}: rank{'s' if len(never) > 1 else ''} {fmt_ranks(never)} never arrived at {what}sequence "
                    f"number {top}"
                    + (f" (rank{'s' if len(no_data) > 1 else ''} {fmt_ranks(no_data)} left no data)" if no_data else "")
                    + (f"; rank{'s' if len(waiting) > 1 else ''} {fmt_ranks(waiting)} waited in it" if waiting else "")
                )
                waits = [h.waited_s for h in self.hang_spans if h.group == label and h.seq == top]
                if waits:
                    verdict += f" (reported after {max(waits):.1f} s)"
                errs = [c.error for c in self.failures if c.group == label]
                if errs:
                    verdict += f", then it failed: {short_error(errs[0])}"
            else:
                verdict = (
                    f"{label}: every rank reached sequence number {top}, and rank{'s' if len(waiting) > 1 else ''} "
                    f"{fmt_ranks(waiting)} still waited in it: slow or failed, not missing a rank"
                )
        return HangGroup(
            group=label,
            members=list(members),
            ranks=ranks,
            stuck_seq=top if stuck else None,
            op=op,
            never_arrived=(behind + no_data) if stuck else [],
            waiting=waiting if stuck else [],
            no_data=no_data,
            verdict=verdict,
        )


def _natural(fqn: str) -> list[tuple[int, int | str]]:
    """``layers.2`` before ``layers.10``."""
    return [(0, int(p)) if p.isdigit() else (1, p) for p in fqn.split(".")]


def short_error(message: str, limit: int = 120) -> str:
    """An exception message without the C++ source location gloo and NCCL put in front."""
    text = re.sub(r"\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*", "", message).strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def vars_of(row: ShardingRow) -> list[Any]:
    return [row.name, row.module, row.parameters, row.original_shapes, row.sharded_shapes, row.placements_before,
            row.placements_after, row.mesh_shape, row.mesh_dims, row.plan]


# ------------------------------------------------------------------------------- pure functions
def _ranks_word(ranks: set[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {fmt_ranks(sorted(ranks))}"


def analyze_records(records: Iterable[Record], *, path: str = "", noise_level: int = 0) -> Report:
    """The whole report over ``records``."""
    return Analyzer(path=path, noise_level=noise_level).add_all(records).finish()


def ops_table(records: Iterable[Record], noise_level: int = 0) -> OpsTable:
    return analyze_records(records, noise_level=noise_level).ops


def module_counts(records: Iterable[Record], noise_level: int = 0) -> ModulesTable:
    return analyze_records(records, noise_level=noise_level).modules


def stragglers(records: Iterable[Record]) -> Stragglers:
    return analyze_records(records).stragglers


def steps_table(records: Iterable[Record], noise_level: int = 0) -> StepsTable:
    return analyze_records(records, noise_level=noise_level).steps


def hang_report(records: Iterable[Record]) -> HangReport:
    return analyze_records(records).hangs
