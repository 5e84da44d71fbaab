"""The background half: records -> exact metrics and sampled spans -> the outbox.

The **drain** thread wakes every ``drain_interval``, empties the record queue, folds every record into the
metric store and turns sampled ones into spans, which wait in the :class:`~.outbox.Outbox` (bounded;
overflow is dropped and counted). The outbox's **export** thread sends span batches every
``span_schedule_delay`` (or as soon as a batch is full) and its **metrics** thread metric snapshots every
``metric_export_interval``, so a slow backend never stalls aggregation.

``flush(timeout)`` drains and sends both at once from the calling thread, within the deadline.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from time import perf_counter_ns, time_ns
from typing import Any

from .. import bandwidth as bw
from .. import health
from .. import names as n
from ..capture import caller, ddp_native, groups, nccl
from ..capture import record as R
from ..capture import step_context as S
from ..capture.context import PARENT_SPAN as _PARENT_SPAN
from ..capture.context import PARENT_TRACE as _PARENT_TRACE
from ..config import Config
from ..ids import new_trace_id
from ..telemetry import MetricData, SpanData
from .deferred import function as deferred_function
from . import framework_spans  # noqa: F401  registers the build that capture/framework_spans.py defers to
from . import optimizer  # noqa: F401  registers the step end that capture/optim.py defers to
from . import step_close  # noqa: F401  registers the close that steps.py defers to
from .metrics import FrameworkMetrics, MetricStore, Series, collective_metrics, health_metrics
from .outbox import Outbox
from .sampling import Sampler
from .spans import collective_span
from .step_stats import Intervals, StepStats

_log = logging.getLogger("otel_torchdist")
_BY_ID = groups.BY_ID
_GROUP, _GPU_NS, _T_START, _T_END, _NBYTES, _KIND = R.GROUP, R.GPU_NS, R.T_START, R.T_END, R.NBYTES, R.KIND
_STEPCTX, _PARENT, _CTX, _OP, _ERROR, _SEQ, _END = R.STEPCTX, R.PARENT, R.CTX, R.OP, R.ERROR, R.SEQ, R.END
_END_UNFINISHED = n.END_UNFINISHED
_END_WAIT, _EXTRA = n.END_WAIT, R.EXTRA
_SERIAL, _TRACE, _SPAN, _SAMPLED = S.SERIAL, S.TRACE, S.SPAN, S.SAMPLED
_bus_factors = bw.FACTORS
_INTERVALS_CAP = Intervals.CAP


OFFSET_STEP_NS = 1_000_000  # a wall-clock step the span times follow (see drain)
OFFSET_TRIES = 5
DRAIN_ROUNDS = 8  # a drain goes round at most this often while the training threads keep queueing
STEPS_OPEN = 64  # steps open past which those opened before a closed one are forgotten (open_step_stats)
STEPS_OPEN_MAX = 4096  # and past which the oldest is, closed since or not


def wall_offset_ns() -> int:
    """``time_ns() - perf_counter_ns()``, from the try whose wall-clock read the two monotonic reads around it
    enclose most tightly: a thread switched out between two bare reads (a busy host) shifted every span of the
    process by the time it was away, up to OFFSET_STEP_NS for good."""
    best_gap, offset = None, 0
    for _ in range(OFFSET_TRIES):
        before = perf_counter_ns()
        wall = time_ns()
        after = perf_counter_ns()
        if best_gap is None or after - before < best_gap:
            best_gap, offset = after - before, wall - (before + after) // 2
    return offset


class Pipeline:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.bounds = tuple(cfg.histogram_buckets) if cfg.histogram_buckets else n.DURATION_BUCKETS
        self.store: Any = MetricStore(self.bounds)  # or native/fold.cpp's (use_native)
        # (op, group) -> [calls, errors] of the calls that failed or were never seen to finish: counted as calls
        # (and errors), with no time in the duration histogram (a 6 s timeout is no transfer's) nor bytes.
        self.untimed: dict[tuple[str, str], list[int]] = {}
        self._fold: Any = None  # native/fold.cpp's fold(...), with its store (use_native)
        # That store, which also keeps the folded records' step aggregates (take_step at a step's close), or None.
        self.native_steps: Any = None
        self.sampler = Sampler(cfg.traces_sampler or "parentbased_always_on", cfg.traces_sampler_arg)
        self.traced = True  # False on a rank trace_ranks leaves out (stop_tracing)
        self.base_labels: dict[str, str] = {}
        self.metric_sources: list[Any] = []  # callables returning list[MetricData] (components)
        self.node_merge: Any = None  # list[MetricData] -> list[MetricData], on a node's exporting rank
        self.meter: Any = None  # export.otel_metrics.MeterBridge: every duration also to a MeterProvider
        self.framework = FrameworkMetrics(self.bounds)
        self.step_stats: dict[int, StepStats] = {}  # until step_close.py closes the step
        self.last_closed_step = 0
        # Framework spans that collectives point at (an optimizer step, a redistribution) and their children
        # that end after them: when each built one ended (span id -> end, epoch ns), and how late the
        # children of one not built yet ended (framework_spans.build stretches it over them).
        self.framework_ends: dict[int, int] = {}
        self.children_ends: dict[int, int] = {}
        self._opened = 0  # step stats opened so far (StepStats.opened)
        self.closed_opened = 0  # the latest StepStats.opened of a closed step
        self.step_tracker: Any = None  # the StepTracker whose steps' closes this drain runs (steps.py)
        self.offset_ns = wall_offset_ns()
        self.processed = 0
        self._stop = threading.Event()
        self._drain_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.outbox = Outbox(cfg, self._drain_lock, self.metric_data)

    # ------------------------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._thread = threading.Thread(target=self._drain_loop, name="otel-torchdist-drain", daemon=True)
        self._thread.start()
        self.outbox.start()

    def set_destination(
        self,
        resource: dict[str, Any],
        base_labels: dict[str, str],
        span_sinks: list[Any],
        metric_sinks: list[Any],
        encoders: Mapping[str, Callable[[SpanData], Any]],
    ) -> None:
        """Where telemetry goes from now on; ``encoders``: span format -> encoder (export.otlp.SPAN_ENCODERS,
        which the native part may update in place)."""
        with self._drain_lock:
            self.base_labels = base_labels
            self.outbox.set_destination(resource, span_sinks, metric_sinks, encoders)
        self.outbox.wake.set()

    def stop(self, timeout: float) -> bool:
        """Stop the threads and flush what is left, within ``timeout`` seconds. True if all was sent."""
        deadline = time.monotonic() + timeout
        self._stop.set()
        self.outbox.stop_threads(deadline)
        if self._thread is not None:
            self._thread.join(max(0.0, min(1.0, deadline - time.monotonic())))
            self._thread = None
        ok = self.flush(max(0.0, deadline - time.monotonic()), force=True)
        self.outbox.finish()
        return ok

    # ---------------------------------------------------------------------------------------- drain
    def _drain_loop(self) -> None:
        while not self._stop.wait(self.cfg.drain_interval):
            try:
                self.drain()
            except Exception as exc:
                health.error("pipeline", "the drain thread hit an error", exc)

    def drain(self, force: bool = False) -> int:
        """Process what the training threads queued. ``force``: also what the native capture holds back
        (a backward's buckets whose backward may not be over: at stop)."""
        q = R.QUEUE
        deferred = R.DEFERRED
        count = 0
        with self._drain_lock:
            self.outbox.room_until = None
            # The wall clock, from the monotonic one: kept unless the wall clock stepped (NTP, by more than
            # OFFSET_STEP_NS), since a fresh reading each drain moved it by a few hundred ns, and spans that
            # touch (one step ends as the next begins) came out overlapping.
            offset = wall_offset_ns()
            if abs(offset - self.offset_ns) > OFFSET_STEP_NS:
                self.offset_ns = offset
            for _ in range(DRAIN_ROUNDS):
                # A step's close (deferred) must see the records of that step: the closes queued before the
                # records are taken, and only those, run after them (a close queued meanwhile waits for the
                # next round, with the records queued before it).
                closes = len(deferred)
                try:  # the C++ completion hook's reports, joined with their records (queued by this)
                    nccl.take_completions()
                except Exception as exc:
                    health.error("completion", "could not take the NCCL completion hook's reports", exc)
                count += self._process_all(q)
                if ddp_native.active():
                    try:
                        native = ddp_native.take(self.step_tracker, perf_counter_ns(), force)
                    except Exception as exc:
                        health.error("pipeline", "could not take the native capture's records", exc)
                        native = ()
                    if native:
                        count += self._process_all(deque(native))
                for _ in range(closes):
                    entry = deferred.popleft()
                    try:
                        R.DRAINED[entry[0]](self, *entry[1:])
                    except Exception as exc:
                        fn = deferred_function(entry)
                        health.error("pipeline", f"deferred telemetry work {getattr(fn, '__name__', fn)} failed", exc)
                if closes and self.step_tracker is not None:
                    # The coming steps' ids, once a round that closed steps (not at each close: it is the
                    # training thread's numbering that decides how far ahead they are needed).
                    try:
                        self.step_tracker.prepare_ids()
                    except Exception as exc:
                        health.error("pipeline", "could not prepare the coming steps' ids", exc)
                if not q and not deferred:
                    break
        self.processed += count
        if self.outbox.queued_spans() >= self.cfg.span_batch_size:
            self.outbox.wake.set()
        return count

    def use_native(self, mod: Any) -> None:
        """Fold unsampled records and keep the collective metrics in C (``native/fold.cpp``: the same
        series, without Pipeline.process's interpreter cost for the records that make no span). A store that
        already holds series stays in Python: its numbers are not moved while exporters may read them."""
        with self._drain_lock:
            if self.store.snapshot():
                return
            mod.fold_setup(
                {
                    "by_id": _BY_ID,
                    "factors": _bus_factors,
                    "end_unfinished": _END_UNFINISHED,
                    "end_wait": _END_WAIT,
                    "intervals_cap": Intervals.CAP,
                    "intervals_head": Intervals.HEAD,
                    "intervals_keep": Intervals.KEEP,
                    "steps_open": STEPS_OPEN,
                    "steps_open_max": STEPS_OPEN_MAX,
                }
            )
            self.store = self.native_steps = mod.MetricStore(self.bounds, Series)
            self._fold = mod.fold

    def bridge_metrics(self, meter: Any) -> None:
        """Record every duration in ``meter`` too (export.otel_metrics.MeterBridge: process() and the native
        fold hand it each value), and read the totals from this pipeline."""
        with self._drain_lock:
            self.meter = meter
        self.framework.set_tap(meter.tap, self.base_labels)
        meter.read_from(self.metric_data)

    def _fold_failed(self, exc: Exception) -> None:
        health.error("pipeline", "could not fold a record into the metrics", exc)

    def _process_all(self, q: deque) -> int:
        count = 0
        process = self.process
        fold = self._fold
        store = self.store
        roots_unsampled = self.sampler.bound == 0  # then outside a step too, no record makes a span
        report = self._fold_failed
        tap = self.meter.collective_value if self.meter is not None else None
        while q:
            if fold is not None:
                try:  # the unsampled records at the front (fold.cpp)
                    folded = fold(store, q, roots_unsampled, report, tap)
                except Exception as exc:
                    # Not a record's failure (those go to report, counted, and the fold goes on): the rest
                    # of this turn goes through process(), so that no failure can repeat for ever.
                    health.error("pipeline", "could not fold records into the metrics", exc)
                    fold = None
                    continue
                if folded:  # a batch (or up to a record for process, or to the end): more may follow
                    count += folded
                    continue
            try:
                rec = q.popleft()
            except IndexError:
                break
            try:
                process(rec)
            except Exception as exc:
                health.error("pipeline", f"could not process a {rec[R.OP]} record", exc)
            count += 1
        return count

    def process(self, rec: tuple) -> None:
        # Runs for every collective: locals and inlined lookups, the common case first.
        gi = _BY_ID[rec[_GROUP]]
        gpu_ns = rec[_GPU_NS]
        t0, t1 = rec[_T_START], rec[_T_END]
        if gpu_ns is not None:
            seconds = gpu_ns / 1e9
        else:
            elapsed = t1 - t0
            seconds = elapsed / 1e9 if elapsed > 0 else 0.0
        # Bytes and time count what moved: not those of a call that failed, nor of one never seen to finish
        # (its record still counts as a call: self.untimed).
        timed = rec[_ERROR] is None and rec[_END] != _END_UNFINISHED
        nbytes = rec[_NBYTES] if timed else 0
        kind = rec[_KIND]
        size = gi.size
        factor = _bus_factors.get((kind, size))
        if factor is None:
            factor = _bus_factors[(kind, size)] = bw.bus_factor(kind, size) if size > 0 else 0.0
        step = rec[_STEPCTX]
        fw = rec[_CTX]
        if rec[_PARENT] is None and (fw is None or fw[_PARENT_TRACE] is None) and step is not None:
            # parent_of's answer without the call: no span of the caller's, none of a framework's
            trace_id, parent_span_id, sampled = step[_TRACE], step[_SPAN], step[_SAMPLED]
        else:
            trace_id, parent_span_id, sampled = self.parent_of(rec[_PARENT], rec[_CTX], step)
        stats = None
        if step is not None:
            stats = self.step_stats.get(step[_SERIAL])
            if stats is None:
                stats = self.open_step_stats(step[_SERIAL])
            tail = stats.tail  # Intervals.append, inlined
            if rec[_END] == _END_WAIT and (extra := rec[_EXTRA]) and "wait_ns" in extra:
                # timed to a wait() entered after the issue: the rank waited only while wait() blocked
                tail.append((max(t0, t1 - extra[extra.index("wait_ns") + 1]), t1))
            else:
                tail.append((t0, t1))
            if len(tail) >= _INTERVALS_CAP:
                stats.compact()
            stats.collectives += 1
            stats.nbytes += nbytes
        exemplar = None
        if sampled and (stats is None or self.admit(stats, step, None, parent_span_id)):
            outbox = self.outbox
            if (queued := outbox.queued_spans()) < self.cfg.span_queue_size or outbox.room():
                outlived = None
                if fw is not None and step is not None and parent_span_id == fw[_PARENT_SPAN] and trace_id == step[_TRACE]:
                    # An async collective the framework call issued and left in flight (DTensor's redistribute
                    # returns before its all-reduce completes) would be drawn past its parent's end: a parent
                    # not built yet is stretched over it; under one already out, it hangs from the training
                    # step instead, linked to that call.
                    end = self.framework_ends.get(parent_span_id)
                    child_end = t1 + self.offset_ns
                    if end is None:
                        ends = self.children_ends
                        if child_end > ends.get(parent_span_id, 0):
                            if len(ends) >= 4096:
                                ends.clear()
                            ends[parent_span_id] = child_end
                    elif child_end > end:
                        outlived, parent_span_id = parent_span_id, step[_SPAN]
                span = collective_span(rec, gi, seconds, self.offset_ns, trace_id, parent_span_id, True)
                if outlived is not None:
                    span.links = ((trace_id, outlived, ()),)
                outbox.enqueue(span)
                if self.sampler.exemplars:
                    exemplar = (span.end_ns, trace_id, span.span_id)
                if queued + 1 == self.cfg.span_batch_size:
                    outbox.wake.set()  # a full batch: let the exporter send it while we go on draining
            else:
                health.dropped("span")
        if timed:
            self.store.observe(rec[_OP], gi.series, seconds, nbytes, nbytes * factor, False, exemplar)
            if self.meter is not None:
                self.meter.collective(rec[_OP], gi.series, seconds, exemplar)
        else:
            counts = self.untimed.get((rec[_OP], gi.series))
            if counts is None:
                counts = self.untimed[(rec[_OP], gi.series)] = [0, 0]
            counts[0] += 1
            counts[1] += rec[_ERROR] is not None
        seq = rec[_SEQ]
        # A collective that failed did not complete: counting it would tell the hang report it completed later.
        if seq is not None and seq > gi.last_completed and rec[_END] != _END_UNFINISHED and rec[_ERROR] is None:
            gi.last_completed = seq

    def collective_series(self) -> dict[tuple[str, str], Series]:
        """The store's series with the untimed calls counted in (a series of those alone where no call of its
        completed): calls and errors; the duration histogram's count is its buckets' (metrics.collective_metrics)."""
        snap = self.store.snapshot()
        for key, (calls, errors) in list(self.untimed.items()):
            s = snap.get(key)
            if s is None:
                s = snap[key] = Series([0] * (len(self.bounds) + 1))
            s.count += calls
            s.errors += errors
        return snap

    def stop_tracing(self) -> None:
        """This rank is not one of ``trace_ranks``: no span is sampled from now on, steps included (warnings,
        hang reports and a failing step's span do not go through sampling)."""
        self.traced = False
        self.sampler = Sampler("always_off", 0.0)

    def open_step_stats(self, index: int) -> StepStats:
        table = self.step_stats
        if len(table) > STEPS_OPEN:
            # A step nobody closed (an explicit step left open) is forgotten once a step opened after it has
            # closed (in the order opened: explicit step numbers may start again, at each epoch, say);
            # not merely the oldest open one: a drain takes all its records before it runs their steps'
            # closes, so with short steps (1 ms steps, a drain every 200 ms) it holds hundreds of open steps,
            # all still to close, whose stats (collectives, bytes, wait) their closes need.
            oldest = next(iter(table))
            if table[oldest].opened < self.closed_opened or len(table) > STEPS_OPEN_MAX:
                del table[oldest]
        self._opened += 1
        stats = table[index] = StepStats(self._opened)
        return stats

    def admit(self, stats: StepStats, step: tuple, span_id: int | None, parent: int | None) -> bool:
        """Whether one more span of traced ``step`` fits ``max_spans_per_step``; a span that a kept span
        points at as its parent always does (no orphans). What does not fit is counted."""
        cap = self.cfg.max_spans_per_step
        if not cap:
            return True
        if stats.spans >= cap and (span_id is None or stats.parents is None or span_id not in stats.parents):
            health.dropped(n.DROPPED_STEP_LIMIT)
            if not stats.capped:
                # A "step" that never ends (no optimizer, no marked steps) would trace every collective.
                stats.capped = True
                _log.info(
                    "otel-torchdist: a step has more than %d spans; the rest of it is not traced "
                    "(max_spans_per_step / OTEL_TORCHDIST_MAX_SPANS_PER_STEP; mark steps with otel_torchdist.step())",
                    cap,
                )
            return False
        stats.spans += 1
        if parent is not None and parent != step[_SPAN]:  # the step's own span is never capped
            if stats.parents is None:
                stats.parents = {parent}
            else:
                stats.parents.add(parent)
        return True

    def _parent_of(self, rec: tuple) -> tuple[int, int | None, bool]:
        return self.parent_of(rec[R.PARENT], rec[R.CTX], rec[R.STEPCTX])

    def parent_of(self, user: Any, fw: tuple | None, step: tuple | None) -> tuple[int, int | None, bool]:
        """Trace, parent span and sampling: the caller's own OpenTelemetry span first, then the framework
        context's parent (an optimizer step), then the training step, else a new trace."""
        ctx = caller.span_context(user, step)
        if ctx is not None:
            return ctx.trace_id, ctx.span_id, self.sampler.decide(ctx.trace_id, bool(ctx.trace_flags.sampled))
        if fw is not None and fw[_PARENT_TRACE] is not None:
            return fw[_PARENT_TRACE], fw[_PARENT_SPAN], self.sampled(fw[_PARENT_TRACE], None, fw, step)
        if step is not None:
            return step[_TRACE], step[_SPAN], step[_SAMPLED]
        trace_id = new_trace_id()
        return trace_id, None, self.sampler.decide(trace_id, None)

    def sampled(self, trace_id: int, user: Any, fw: tuple | None, step: tuple | None) -> bool:
        """Whether a span of ``trace_id`` opened under this context is kept (same rules as parent_of)."""
        ctx = caller.span_context(user, step)
        if ctx is not None and ctx.trace_id == trace_id:
            return self.sampler.decide(trace_id, bool(ctx.trace_flags.sampled))
        if step is not None and step[_TRACE] == trace_id:
            return step[_SAMPLED]
        return self.sampler.decide(trace_id, None)

    def metric_data(self) -> list[MetricData]:
        labels = self.base_labels
        data = collective_metrics(self.collective_series(), labels, self.bounds) + self.framework.metric_data(labels)
        for source in list(self.metric_sources):
            try:
                data += source()
            except Exception as exc:
                health.error("metrics", "a metric source failed", exc)
        data += health_metrics(
            health.drops(), health.errors(), {k: v for k, v in labels.items() if k in (n.M_RUN, n.M_RANK)}
        )
        if self.node_merge is not None:
            try:
                return self.node_merge(data)
            except Exception as exc:
                # This rank's points alone, under the node's labels, would send the node's counters back.
                health.error("node_metrics", "could not combine the node's metrics; none exported this time", exc)
                return []
        return data

    def flush(self, timeout: float, force: bool = False) -> bool:
        """Drain, then send every queued span and a metric snapshot, within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        self.drain(force)
        outbox = self.outbox
        # The metrics first, within half the time, then the spans with the rest: a traces endpoint that never
        # answers held the span export (its lock) for the whole time, and the run's last metrics went nowhere,
        # uncounted, not even to the run folder or to a metrics endpoint that was up.
        ok = outbox.export_metrics(max(0.0, deadline - time.monotonic()) / 2, final=True)
        ok = outbox.export_spans(deadline) and ok
        # What went to an application's providers: their processors and readers hold it until they export.
        for part in [s for s in outbox.span_sinks if s.span_format == "data"] + ([self.meter] if self.meter else []):
            ok = part.flush(deadline - time.monotonic()) and ok
        return ok
