"""Builders: typed records in, tables out, with no I/O.

An :class:`Analyzer` takes records one at a time (``add``) and keeps only what the tables need: running
sums and a quantile sketch per op, counts per module, the collectives not yet matched across ranks, one
row per traced step, each rank's latest metric snapshot. ``finish`` turns that into a :class:`Report`,
one table per module beside this one (``ops``, ``modules``, ``stragglers``, ``steps``, ``hangs``), each a
``build`` function reading the Analyzer's state.
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

from collections.abc import Iterable
from typing import Any

from ... import bandwidth as bw
from ... import names as n
from ..records import (
    Collective,
    Hang,
    Histogram,
    MetricPoint,
    MetricSnapshot,
    Phase,
    Problem,
    RankResource,
    RankStep,
    Record,
    Span,
    WarningRecord,
)
from ..report import (
    GpuSeries,
    HangReport,
    ModulesTable,
    OpsTable,
    Report,
    RunInfo,
    ShardingRow,
    StepsTable,
    StepTotals,
    Stragglers,
    WarningRow,
)
from ..stats import fmt_ranks
from .common import OpAgg
from .hangs import build as _hangs
from .modules import build as _modules
from .ops import build as _ops
from .steps import build as _steps
from .stragglers import build as _stragglers

MAX_LISTED = 200  # failures, warnings and hang spans kept for the report (all are counted)


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
        self.op_spans: dict[tuple[int, str, str], OpAgg] = {}
        self.op_meta: dict[tuple[str, str], list[Any]] = {}  # (op, group) -> [kind, group size]
        self.by_size: dict[tuple[str, int, int], list[Any]] = {}
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
        self.last_snapshot: dict[int, MetricSnapshot] = {}  # per rank, its processes' totals (finish())
        self._process_snapshot: dict[tuple[int, str], MetricSnapshot] = {}  # (rank, instance) -> its last
        self._restarted: dict[int, int] = {}  # rank -> processes that ran it, where more than one
        self.last_process: dict[int, MetricSnapshot] = {}  # such a rank's last process's own snapshot
        self.node_snapshots: dict[str, int] = {}  # host -> snapshots of node totals (metrics_aggregation=node)
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
            agg = self.op_spans[key] = OpAgg()
        agg.count += 1
        completed = c.error is None and c.end_source != n.END_UNFINISHED
        if completed:
            # What moved and how long it took, as the metrics count them: a failed call's time (a 6 s timeout)
            # is no transfer's, and made a row's bandwidth a hundred times too low.
            agg.bytes += c.message_size
            agg.dur += c.duration_s
            agg.timed += 1
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
        if completed and c.message_size > 0:
            floor = 1 << (c.message_size.bit_length() - 1)
            # by group size too: the bus factor is the group's, and one op on groups of 2 and of 8 is two series
            key = (c.op, c.group_size or 0, floor)
            row = self.by_size.get(key)
            if row is None:
                row = self.by_size[key] = [0, 0, 0.0, c.kind, c.group_size]
            row[0] += 1
            row[1] += c.message_size
            row[2] += c.duration_s
        mods = self.mod_counts.get(c.rank)
        if mods is None:
            mods = self.mod_counts[c.rank] = {}
        mkey = (c.module, c.phase or "other", c.op)
        slot = mods.get(mkey)
        if slot is None:
            slot = mods[mkey] = [0, 0, 0.0, 0]
        slot[0] += 1
        if completed:
            slot[1] += c.message_size
            slot[2] += c.duration_s
            slot[3] += 1
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
        calls = m.metrics.get(n.COLLECTIVE_CALLS.name) or m.metrics.get(n.STEPS_METRIC.name) or ()
        if calls and all(n.M_RANK not in p.attributes for p in calls):
            # A node's totals (metrics_aggregation=node), in its first rank's file: taken as that rank's, they
            # counted every rank of the node twice (its own spans added) and made a step 19 times too long.
            host = str(calls[0].attributes.get(n.M_HOST, "?"))
            self.node_snapshots[host] = self.node_snapshots.get(host, 0) + 1
            return
        last = self._process_snapshot.get((m.rank, m.instance))
        if last is None or m.time_ns >= last.time_ns:
            self._process_snapshot[(m.rank, m.instance)] = m
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
        restarted = self._restarted
        by_rank: dict[int, list[MetricSnapshot]] = {}
        for (rank, _), snap in self._process_snapshot.items():
            by_rank.setdefault(rank, []).append(snap)
        for rank, snaps in by_rank.items():
            self.last_snapshot[rank] = snaps[0] if len(snaps) == 1 else _processes_totals(snaps)
            if len(snaps) > 1:
                restarted[rank] = len(snaps)
                self.last_process[rank] = max(snaps, key=lambda s: s.time_ns)
        run = self._run_info(problems or [], files, lines, skipped)
        return Report(
            noise_level=self.noise,
            run=run,
            ops=_ops(self, run),
            modules=_modules(self),
            stragglers=_stragglers(self, run),
            steps=_steps(self),
            hangs=_hangs(self, run),
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
        elif self.node_snapshots:
            notes.append(
                f"the metrics are node totals (metrics_aggregation=node, host{'s' if len(self.node_snapshots) > 1 else ''} "
                f"{', '.join(sorted(self.node_snapshots))}), not any rank's: counts, bandwidth and step times here "
                "come from the traced steps only (traces are sampled by step); the every-call totals are the "
                "node series on /metrics or your backend"
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
        if self._restarted:
            counts = sorted(set(self._restarted.values()))
            notes.append(
                f"{_ranks_word(set(self._restarted))} ran in {'/'.join(map(str, counts))} processes (elastic restarts): "
                "counts, sizes and times add every process's; the per-step tables show a step number each process "
                "ran once, the last process's where they repeat"
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

    # ---- modules

    # ---- steps and stragglers
    def first_step(self) -> tuple[int, int] | None:
        """The run's set-up step, left out of means (when other steps exist): the one its spans mark, else
        (runs of earlier versions) the lowest-numbered when it is step 0 or 1."""
        if len(self.rank_steps) < 2:
            return None
        for key, ranks in self.rank_steps.items():
            if any(s.setup for s in ranks.values()):
                return key
        first = min(self.rank_steps)
        return first if first[0] <= 1 else None

    def ordered_steps(self) -> list[tuple[int, int]]:
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

    def metric_value(self, rank: int, metric: n.Metric, snap: MetricSnapshot | None = None) -> float | None:
        snap = snap or self.last_snapshot.get(rank)
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

    def totals(self, last_process: bool = False) -> list[StepTotals]:
        """Per rank, its step totals from the metrics; ``last_process``: of a restarted rank, its last process's
        alone (the one whose set-up step the traces hold)."""
        out = []
        for rank in sorted(self.last_snapshot):
            snap = self.last_process.get(rank) if last_process else None
            steps = self.metric_value(rank, n.STEPS_METRIC, snap)
            if not steps:
                continue
            compute = self.metric_value(rank, n.STEP_COMPUTE_TIME, snap) or 0.0
            wait = self.metric_value(rank, n.STEP_COLLECTIVE_WAIT_TIME, snap) or 0.0
            total = self.metric_value(rank, n.STEP_DURATION_METRIC, snap)
            out.append(
                StepTotals(
                    rank=rank,
                    steps=int(steps),
                    total_s=total if total is not None else compute + wait,
                    compute_s=compute,
                    wait_s=wait,
                    samples=self.metric_value(rank, n.TRAIN_SAMPLES, snap),
                    tokens=self.metric_value(rank, n.TRAIN_TOKENS, snap),
                )
            )
        return out

    # ---- hangs


def vars_of(row: ShardingRow) -> list[Any]:
    return [row.name, row.module, row.parameters, row.original_shapes, row.sharded_shapes, row.placements_before,
            row.placements_after, row.mesh_shape, row.mesh_dims, row.plan]


# ------------------------------------------------------------------------------- pure functions
_KIND_OF_METRIC = {m.name: m.instrument for m in n.METRICS}
_KIND_OF_METRIC[n.GPU_ECC_ERRORS.name] = "gauge"  # NVML's count since the driver loaded: the device's, not a process's


def _processes_totals(snaps: list[MetricSnapshot]) -> MetricSnapshot:
    """One rank's metrics over the processes that ran it (elastic restarts), each cumulative from its own
    start: counters and histograms added, gauges (and a device's own totals) the last process's."""
    snaps = sorted(snaps, key=lambda s: s.time_ns)
    last = snaps[-1]
    metrics: dict[str, list[MetricPoint]] = {}
    for name in {name for s in snaps for name in s.metrics}:
        if _KIND_OF_METRIC.get(name, "gauge") == "gauge":
            metrics[name] = list(last.metrics.get(name, ()))
            continue
        summed: dict[frozenset, MetricPoint] = {}
        for s in snaps:
            for p in s.metrics.get(name, ()):
                key = frozenset(p.attributes.items())
                known = summed.get(key)
                summed[key] = p if known is None else MetricPoint(attributes=p.attributes, value=_plus(known.value, p.value))
        metrics[name] = list(summed.values())
    return MetricSnapshot(rank=last.rank, time_ns=last.time_ns, metrics=metrics, instance=last.instance)


def _plus(a, b):
    if isinstance(a, Histogram) and isinstance(b, Histogram):
        if a.bounds != b.bounds:
            return b  # re-bucketed between processes: the later one's alone
        mins = [m for m in (a.min, b.min) if m is not None]
        maxs = [m for m in (a.max, b.max) if m is not None]
        return Histogram(count=a.count + b.count, sum=a.sum + b.sum, bounds=a.bounds,
                         bucket_counts=tuple(x + y for x, y in zip(a.bucket_counts, b.bucket_counts)),
                         min=min(mins) if mins else None, max=max(maxs) if maxs else None)  # fmt: skip
    if isinstance(a, Histogram) or isinstance(b, Histogram):
        return b
    return a + b


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
