"""The background half: records -> exact metrics and sampled spans -> sinks.

Three daemon threads, so a slow backend never stalls aggregation:

* the **drain** thread wakes every ``drain_interval``, empties the record queue, folds every record into
  the metric store and turns sampled ones into spans (bounded queue; overflow is dropped and counted);
* the **export** thread sends span batches every ``span_schedule_delay`` (or as soon as a batch is full),
  and the **metrics** thread metric snapshots every ``metric_export_interval``, each call bounded by the
  exporter timeout: a metric exporter retrying against a collector that is down (the SDK's exporter waits
  out its backoff) never holds the spans back, nor spans the metrics.

``flush(timeout)`` does both at once from the calling thread, within the deadline.
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
from ..capture import ddp_native, groups, record
from ..capture.caller import span_context
from ..capture import record as R
from ..config import Config
from .metrics import FrameworkMetrics, MetricStore, Series, collective_metrics, health_metrics
from ..telemetry import MetricData, SpanData
from .sampling import Sampler
from ..ids import new_trace_id
from . import framework_spans  # noqa: F401  registers the build that capture/framework_spans.py defers to
from .spans import collective_span, duration_seconds, limited
from ..steps import Intervals, StepStats

_log = logging.getLogger("otel_torchdist")
_BY_ID = groups.BY_ID
_GROUP, _GPU_NS, _T_START, _T_END, _NBYTES, _KIND = R.GROUP, R.GPU_NS, R.T_START, R.T_END, R.NBYTES, R.KIND
_STEPCTX, _PARENT, _CTX, _OP, _ERROR, _SEQ, _END = R.STEPCTX, R.PARENT, R.CTX, R.OP, R.ERROR, R.SEQ, R.END
_END_UNFINISHED = n.END_UNFINISHED
_bus_factors = bw.FACTORS
_INTERVALS_CAP = Intervals.CAP


OFFSET_STEP_NS = 1_000_000  # a wall-clock step the span times follow (see drain)
ROOM_WAIT_S = 0.1  # the most a drain waits in all for the export thread to take spans from a full queue
DRAIN_ROUNDS = 8  # a drain goes round at most this often while the training threads keep queueing
STEPS_OPEN = 64  # steps open past which those opened before a closed one are forgotten (open_step_stats)
STEPS_OPEN_MAX = 4096  # and past which the oldest is, closed since or not
SPAN_ATTRIBUTES_MAX = 64  # more than any span of the library carries: a count limit at or above it cuts nothing


class ExportLock:
    """One export path's lock (spans, metrics), taken within a timeout; without waiting while its holder is an
    export call a flush already waited out (stuck on a backend that never answers), so the flushes of
    destroy_process_group() and of process exit do not add up behind the same stuck call."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._turn = 0  # incremented by every holder
        self._abandoned = -1

    @property
    def stuck(self) -> bool:
        """Whether its holder is an export call a flush gave up waiting for."""
        return self._abandoned == self._turn

    def take(self, timeout: float) -> bool:
        if self.stuck:
            timeout = 0.0
        if self._lock.acquire(timeout=max(timeout, 0.0)):
            self._turn += 1
            return True
        self._abandoned = self._turn
        return False

    def release(self) -> None:
        self._lock.release()


class Pipeline:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.bounds = tuple(cfg.histogram_buckets) if cfg.histogram_buckets else n.DURATION_BUCKETS
        self.store: Any = MetricStore(self.bounds)  # or native/fold.cpp's (use_native)
        self._fold: Any = None  # native/fold.cpp's fold(...), with its store (use_native)
        self.sampler = Sampler(cfg.traces_sampler or "parentbased_always_on", cfg.traces_sampler_arg)
        self.traced = True  # False on a rank trace_ranks leaves out (stop_tracing)
        # Sampled spans wait for export already encoded, one deque per wire format the sinks want
        # (bytes and str are not tracked by the garbage collector; SpanData objects would be). Until the
        # sinks are known (before init_process_group) they wait as SpanData in ``pending``.
        self.pending: deque[SpanData] = deque()
        self.encoded: dict[str, deque] = {}
        self._queues: list[deque] = []  # encoded's values, for queued_spans (per span: no generator)
        # The export package's sinks (export/sinks.py: span_format, export_span_fragments, export_metrics, flush,
        # shutdown) and the encoder of each span format they take: the drain knows no wire format.
        self.span_sinks: list[Any] = []
        self.metric_sinks: list[Any] = []
        self.encoders: Mapping[str, Callable[[SpanData], Any]] = {}
        self.resource: dict[str, Any] | None = None
        self.base_labels: dict[str, str] = {}
        self.metric_sources: list[Any] = []  # callables returning list[MetricData] (components)
        self.metric_interval = cfg.metric_export_interval
        self.node_merge: Any = None  # list[MetricData] -> list[MetricData], on a node's exporting rank
        self.meter: Any = None  # export.otel_metrics.MeterBridge: every duration also to a MeterProvider
        self.framework = FrameworkMetrics(self.bounds)
        self.step_stats: dict[int, StepStats] = {}  # until steps.py closes the step
        self.last_closed_step = 0
        # Framework spans that collectives point at (an optimizer step, a redistribution) and their children
        # that end after them: when each built one ended (span id -> end, epoch ns), and how late the
        # children of one not built yet ended (emit.build stretches it over them).
        self.framework_ends: dict[int, int] = {}
        self.children_ends: dict[int, int] = {}
        self._opened = 0  # step stats opened so far (StepStats.opened)
        self.closed_opened = 0  # the latest StepStats.opened of a closed step
        self.step_tracker: Any = None  # the StepTracker whose steps' closes this drain runs (steps.py)
        self.start_ns = time_ns()
        self.offset_ns = time_ns() - perf_counter_ns()
        self.processed = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._drain_lock = threading.Lock()
        self._span_lock = ExportLock()
        self._metric_lock = ExportLock()
        self._in_flight = 0  # spans inside the export call now running; None once stop() counted them
        self._in_flight_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._exporter: threading.Thread | None = None
        self._metrics_wake = threading.Event()
        self._room_until: float | None = None  # when this drain stops waiting for room in the span queue (_room)
        self._last_metrics = time.monotonic()
        self._last_spans = time.monotonic()
        self._urgent = self._urgent_metrics = False

    # ------------------------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        for name, target in (
            ("otel-torchdist-drain", self._drain_loop),
            ("otel-torchdist-metrics", self._metrics_loop),
            ("otel-torchdist-export", self._export_loop),
        ):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        self._exporter = self._threads[-1]

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
            self.encoders = encoders
            self.resource = resource
            self.base_labels = base_labels
            self.span_sinks = span_sinks
            self.metric_sinks = metric_sinks
            self.encoded = {fmt: deque() for fmt in dict.fromkeys(s.span_format for s in span_sinks if s.span_format)}
            self._queues = list(self.encoded.values())
            # Spans are far below the default limits (128 attributes, no value limit): checked only when set.
            if self.cfg.attribute_value_length_limit is not None or self.cfg.attribute_count_limit < SPAN_ATTRIBUTES_MAX:
                self._enqueue = self._enqueue_limited
            while self.pending:
                self._enqueue(self.pending.popleft())
        self._wake.set()

    def queued_spans(self) -> int:
        queues = self._queues
        if queues:
            return len(queues[0]) if len(queues) == 1 else min(map(len, queues))
        return len(self.pending) if self.resource is None else 0

    def _enqueue(self, span: SpanData) -> None:
        if self.resource is None:
            self.pending.append(span)
            return
        for fmt, queue in self.encoded.items():
            queue.append(self.encoders[fmt](span))

    def _enqueue_limited(self, span: SpanData) -> None:
        """_enqueue, the span limits applied first for the library's own encoders (a provider applies its own)."""
        if self.resource is None:
            self.pending.append(span)
            return
        cut = None
        for fmt, queue in self.encoded.items():
            if fmt != "data" and cut is None:
                cut = limited(span, self.cfg.attribute_value_length_limit, self.cfg.attribute_count_limit)
            queue.append(self.encoders[fmt](span if fmt == "data" else cut))

    def _clear_spans(self) -> int:
        count = self.queued_spans()
        self.pending.clear()
        for queue in self.encoded.values():
            queue.clear()
        return count

    def stop(self, timeout: float) -> bool:
        """Stop the threads and flush what is left, within ``timeout`` seconds. True if all was sent."""
        deadline = time.monotonic() + timeout
        self._stop.set()
        self._wake.set()
        self._metrics_wake.set()
        stuck = {"otel-torchdist-export": self._span_lock.stuck, "otel-torchdist-metrics": self._metric_lock.stuck}
        for t in self._threads:
            t.join(0.0 if stuck.get(t.name) else max(0.0, min(1.0, deadline - time.monotonic())))
        self._threads.clear()
        ok = self.flush(max(0.0, deadline - time.monotonic()), force=True)
        left = self._clear_spans()
        with self._in_flight_lock:
            left += self._in_flight or 0  # an export call still stuck: its spans are lost with the process
            self._in_flight = None
        if left:
            health.dropped("span", left)  # out of time: what is left is lost, and counted
        for sink in {id(s): s for s in self.span_sinks + self.metric_sinks}.values():
            sink.shutdown()
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
        q = record.QUEUE
        deferred = record.DEFERRED
        count = 0
        with self._drain_lock:
            self._room_until = None
            # The wall clock, from the monotonic one: kept unless the wall clock stepped (NTP, by more than
            # OFFSET_STEP_NS), since a fresh reading each drain moved it by a few hundred ns, and spans that
            # touch (one step ends as the next begins) came out overlapping.
            offset = time_ns() - perf_counter_ns()
            if abs(offset - self.offset_ns) > OFFSET_STEP_NS:
                self.offset_ns = offset
            for _ in range(DRAIN_ROUNDS):
                # A step's close (deferred) must see the records of that step: the closes queued before the
                # records are taken, and only those, run after them (a close queued meanwhile waits for the
                # next round, with the records queued before it).
                closes = len(deferred)
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
                        record.run(self, entry)
                    except Exception as exc:
                        fn = record.function(entry)
                        health.error("pipeline", f"deferred telemetry work {getattr(fn, '__name__', fn)} failed", exc)
                if not q and not deferred:
                    break
        self.processed += count
        if self.queued_spans() >= self.cfg.span_batch_size:
            self._wake.set()
        return count

    def use_native(self, mod: Any) -> None:
        """Fold unsampled records and keep the collective metrics in C (``native/fold.cpp``: the same
        series, without Pipeline.process's interpreter cost for the records that make no span). A store that
        already holds series stays in Python: its numbers are not moved while exporters may read them."""
        with self._drain_lock:
            if self.store.snapshot():
                return
            mod.fold_setup(
                {"by_id": _BY_ID, "factors": _bus_factors, "end_unfinished": _END_UNFINISHED, "intervals_cap": _INTERVALS_CAP}
            )
            self.store = mod.MetricStore(self.bounds, Series)
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
        store, step_stats = self.store, self.step_stats
        roots_unsampled = self.sampler.bound == 0  # then outside a step too, no record makes a span
        open_step, report = self.open_step_stats, self._fold_failed
        tap = self.meter.collective_value if self.meter is not None else None
        while q:
            if fold is not None:
                try:  # the unsampled records at the front (fold.cpp)
                    folded = fold(store, step_stats, q, roots_unsampled, open_step, report, tap)
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
        nbytes = rec[_NBYTES]
        kind = rec[_KIND]
        size = gi.size
        factor = _bus_factors.get((kind, size))
        if factor is None:
            factor = _bus_factors[(kind, size)] = bw.bus_factor(kind, size) if size > 0 else 0.0
        step = rec[_STEPCTX]
        fw = rec[_CTX]
        if rec[_PARENT] is None and (fw is None or fw[3] is None) and step is not None:
            # parent_of's answer without the call: no span of the caller's, none of a framework's
            trace_id, parent_span_id, sampled = step[1], step[2], step[3]
        else:
            trace_id, parent_span_id, sampled = self.parent_of(rec[_PARENT], rec[_CTX], step)
        stats = None
        if step is not None:
            stats = self.step_stats.get(step[0])
            if stats is None:
                stats = self.open_step_stats(step[0])
            tail = stats.intervals.tail  # Intervals.append, inlined
            tail.append((t0, t1))
            if len(tail) >= _INTERVALS_CAP:
                stats.intervals.compact()
            stats.collectives += 1
            stats.nbytes += nbytes
        exemplar = None
        if sampled and (stats is None or self.admit(stats, step, None, parent_span_id)):
            if (queued := self.queued_spans()) < self.cfg.span_queue_size or self._room():
                outlived = None
                if fw is not None and parent_span_id == fw[4] and step is not None and trace_id == step[1]:
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
                        outlived, parent_span_id = parent_span_id, step[2]
                span = collective_span(rec, gi, seconds, self.offset_ns, trace_id, parent_span_id, True)
                if outlived is not None:
                    span.links = ((trace_id, outlived, ()),)
                self._enqueue(span)
                exemplar = (span.end_ns, trace_id, span.span_id)
                if queued + 1 == self.cfg.span_batch_size:
                    self._wake.set()  # a full batch: let the exporter send it while we go on draining
            else:
                health.dropped("span")
        self.store.observe(rec[_OP], gi.label, seconds, nbytes, nbytes * factor, rec[_ERROR] is not None, exemplar)
        if self.meter is not None:
            self.meter.collective(rec[_OP], gi.label, seconds, exemplar)
        seq = rec[_SEQ]
        # A collective that failed did not complete: counting it would tell the hang report it completed later.
        if seq is not None and seq > gi.last_completed and rec[_END] != _END_UNFINISHED and rec[_ERROR] is None:
            gi.last_completed = seq

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
        stats = table[index] = StepStats()
        self._opened += 1
        stats.opened = self._opened
        return stats

    def admit(self, stats: StepStats, step: tuple, span_id: int | None, parent: int | None) -> bool:
        """Whether one more span of traced ``step`` fits ``max_spans_per_step``; a span that a kept span
        points at as its parent always does (no orphans). What does not fit is counted."""
        cap = self.cfg.max_spans_per_step
        if not cap:
            return True
        if stats.spans >= cap and (span_id is None or span_id not in stats.parents):
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
        if parent is not None and parent != step[2]:  # the step's own span is never capped
            stats.parents.add(parent)
        return True

    def _parent_of(self, rec: tuple) -> tuple[int, int | None, bool]:
        return self.parent_of(rec[R.PARENT], rec[R.CTX], rec[R.STEPCTX])

    def parent_of(self, user: Any, fw: tuple | None, step: tuple | None) -> tuple[int, int | None, bool]:
        """Trace, parent span and sampling: the caller's own OpenTelemetry span first, then the framework
        context's parent (an optimizer step), then the training step, else a new trace."""
        ctx = span_context(user, step)
        if ctx is not None:
            return ctx.trace_id, ctx.span_id, self.sampler.decide(ctx.trace_id, bool(ctx.trace_flags.sampled))
        if fw is not None and fw[3] is not None:
            return fw[3], fw[4], self.sampled(fw[3], None, fw, step)
        if step is not None:
            return step[1], step[2], step[3]
        trace_id = new_trace_id()
        return trace_id, None, self.sampler.decide(trace_id, None)

    def sampled(self, trace_id: int, user: Any, fw: tuple | None, step: tuple | None) -> bool:
        """Whether a span of ``trace_id`` opened under this context is kept (same rules as parent_of)."""
        ctx = span_context(user, step)
        if ctx is not None and ctx.trace_id == trace_id:
            return self.sampler.decide(trace_id, bool(ctx.trace_flags.sampled))
        if step is not None and step[1] == trace_id:
            return step[3]
        return self.sampler.decide(trace_id, None)

    def export_soon(self) -> None:
        """Send spans and metrics now rather than at their intervals (a hang was found)."""
        self._urgent = self._urgent_metrics = True
        self._wake.set()
        self._metrics_wake.set()

    def _room(self) -> bool:
        """Room in the full span queue, after a moment for the export thread to take a batch from it. It
        only waits for this thread to let go of the interpreter: dropping at once lost spans it had the
        capacity to send (at 100 % tracing and 20 000 collectives a second, over half of them). Bounded so
        that spans never cost the metrics: ROOM_WAIT_S in all per drain, and no wait once the record queue
        is half full (records dropped there would be missing from the metrics). Past that, or with no
        exporter to wait for (not started, stopped, no destination yet), spans are dropped and counted."""
        exporter = self._exporter
        if exporter is None or self.resource is None or self._stop.is_set() or not exporter.is_alive():
            return False
        now = time.monotonic()
        until = self._room_until
        if until is None:
            until = self._room_until = now + ROOM_WAIT_S
        limit = self.cfg.span_queue_size
        self._wake.set()
        while now < until and len(record.QUEUE) < record._limit[0] // 2:
            time.sleep(0.001)
            if self.queued_spans() < limit:
                return True
            now = time.monotonic()
        self._room_until = now  # spent: no more waiting in this drain
        return False

    def add_span(self, span: SpanData) -> None:
        """Queue a span built on the drain thread (deferred work), within the span queue's bound."""
        if self.queued_spans() < self.cfg.span_queue_size or self._room():
            self._enqueue(span)
        else:
            health.dropped("span")

    # --------------------------------------------------------------------------------------- export
    def _export_loop(self) -> None:
        cfg = self.cfg
        while not self._stop.is_set():
            self._wake.wait(min(cfg.span_schedule_delay, 1.0))
            self._wake.clear()
            if self._stop.is_set() or self.resource is None:
                continue
            now = time.monotonic()
            urgent, self._urgent = self._urgent, False
            try:
                queued = self.queued_spans()
                if urgent or queued >= cfg.span_batch_size or (queued and now - self._last_spans >= cfg.span_schedule_delay):
                    self._last_spans = now
                    self.export_spans(now + cfg.for_signal("timeout", "traces") * 2)
            except Exception as exc:
                health.error("pipeline", "the export thread hit an error", exc)

    def _metrics_loop(self) -> None:
        while not self._stop.is_set():
            self._metrics_wake.wait(min(self.metric_interval, 1.0))
            self._metrics_wake.clear()
            if self._stop.is_set() or self.resource is None:
                continue
            now = time.monotonic()
            urgent, self._urgent_metrics = self._urgent_metrics, False
            try:
                if urgent or now - self._last_metrics >= self.metric_interval:
                    self._last_metrics = now
                    self.export_metrics(self.cfg.for_signal("timeout", "metrics"))
            except Exception as exc:
                health.error("pipeline", "the metrics thread hit an error", exc)

    def export_spans(self, deadline: float) -> bool:
        """Send queued spans in batches until the queue is empty or ``deadline`` (monotonic) passes."""
        ok = True
        # Bounded: the export thread may hold the lock, stuck on a slow backend for its own timeout.
        if not self._span_lock.take(deadline - time.monotonic()):
            return False
        try:
            while self.resource is not None and self.encoded:
                count = min(self.queued_spans(), self.cfg.span_batch_size)
                if count == 0:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                batch = {fmt: [queue.popleft() for _ in range(count)] for fmt, queue in self.encoded.items()}
                for sink in self.span_sinks:
                    with self._in_flight_lock:
                        if self._in_flight is None:  # stopped: counted there
                            return False
                        self._in_flight = count
                    sent = sink.export_span_fragments(self.resource, batch[sink.span_format], timeout=remaining)
                    with self._in_flight_lock:
                        counted = self._in_flight is None
                        if not counted:
                            self._in_flight = 0
                    if not sent and not counted:
                        health.dropped("span", count)
                        health.dropped("span_batch")
                    ok = ok and sent
        finally:
            self._span_lock.release()
        return ok

    def metric_data(self) -> list[MetricData]:
        labels = self.base_labels
        data = collective_metrics(self.store.snapshot(), labels, self.bounds) + self.framework.metric_data(labels)
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

    def emit_span(self, span: SpanData) -> None:
        """Queue a span built outside the record path (warnings, sharding steps...); bounded like the rest."""
        with self._drain_lock:
            if self.queued_spans() < self.cfg.span_queue_size:
                self._enqueue(span)
            else:
                health.dropped("span")

    def export_metrics(self, timeout: float) -> bool:
        if self.resource is None or not self.metric_sinks:
            return True
        ok = True
        deadline = time.monotonic() + timeout
        if not self._metric_lock.take(timeout):
            return False
        try:
            data = self.metric_data()
            now = time_ns()
            for sink in self.metric_sinks:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not sink.export_metrics(self.resource, data, self.start_ns, now, timeout=remaining):
                    health.dropped("metric_batch")
                    ok = False
        finally:
            self._metric_lock.release()
        return ok

    def flush(self, timeout: float, force: bool = False) -> bool:
        """Drain, then send every queued span and a metric snapshot, within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        self.drain(force)
        ok = self.export_spans(deadline)
        remaining = deadline - time.monotonic()
        if remaining > 0:
            ok = self.export_metrics(remaining) and ok
        else:
            ok = False
        # What went to an application's providers: their processors and readers hold it until they export.
        for part in [s for s in self.span_sinks if s.span_format == "data"] + ([self.meter] if self.meter else []):
            ok = part.flush(deadline - time.monotonic()) and ok
        return ok
