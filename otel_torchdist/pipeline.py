"""The background half: records -> exact metrics and sampled spans -> sinks.

Two daemon threads, so a slow backend never stalls aggregation:

* the **drain** thread wakes every ``drain_interval``, empties the record queue, folds every record into
  the metric store and turns sampled ones into spans (bounded queue; overflow is dropped and counted);
* the **export** thread sends span batches every ``span_schedule_delay`` (or as soon as a batch is full)
  and metric snapshots every ``metric_export_interval``, each call bounded by the exporter timeout.

``flush(timeout)`` does both at once from the calling thread, within the deadline.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from time import perf_counter_ns, time_ns
from typing import Any

from . import bandwidth as bw
from . import health
from . import names as n
from .capture import record
from .capture.record import Record
from .config import Config
from .export.sinks import Sink
from .metrics import MetricStore, collective_metrics, health_metrics
from .otlp import MetricData, SpanData
from .sampling import Sampler
from .spans import collective_span, duration_seconds, new_trace_id


class Pipeline:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.store = MetricStore()
        self.sampler = Sampler(cfg.traces_sampler, cfg.traces_sampler_arg)
        self.spans: deque[SpanData] = deque()
        self.span_sinks: list[Sink] = []
        self.metric_sinks: list[Sink] = []
        self.resource: dict[str, Any] | None = None
        self.base_labels: dict[str, str] = {}
        self.start_ns = time_ns()
        self.offset_ns = time_ns() - perf_counter_ns()
        self.processed = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._drain_lock = threading.Lock()
        self._export_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._last_metrics = time.monotonic()
        self._last_spans = time.monotonic()

    # ------------------------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        for name, target in (("otel-torchdist-drain", self._drain_loop), ("otel-torchdist-export", self._export_loop)):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def set_destination(
        self, resource: dict[str, Any], base_labels: dict[str, str], span_sinks: list[Sink], metric_sinks: list[Sink]
    ) -> None:
        self.resource = resource
        self.base_labels = base_labels
        self.span_sinks = span_sinks
        self.metric_sinks = metric_sinks
        self._wake.set()

    def stop(self, timeout: float) -> bool:
        """Stop the threads and flush what is left, within ``timeout`` seconds. True if all was sent."""
        deadline = time.monotonic() + timeout
        self._stop.set()
        self._wake.set()
        for t in self._threads:
            t.join(max(0.0, min(1.0, deadline - time.monotonic())))
        self._threads.clear()
        ok = self.flush(max(0.0, deadline - time.monotonic()))
        if self.spans:
            health.dropped("span", len(self.spans))  # out of time: what is left is lost, and counted
            self.spans.clear()
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

    def drain(self) -> int:
        q = record.QUEUE
        count = 0
        with self._drain_lock:
            self.offset_ns = time_ns() - perf_counter_ns()
            while q:
                try:
                    rec = q.popleft()
                except IndexError:
                    break
                try:
                    self.process(rec)
                except Exception as exc:
                    health.error("pipeline", f"could not process a {rec.op} record", exc)
                count += 1
        self.processed += count
        if len(self.spans) >= self.cfg.span_batch_size:
            self._wake.set()
        return count

    def process(self, rec: Record) -> None:
        gi = rec.group
        seconds = duration_seconds(rec)
        bus = rec.nbytes * bw.bus_factor(rec.kind, gi.size) if gi.size > 0 else 0.0
        parent = rec.parent
        if parent is not None:
            trace_id = parent.trace_id
            parent_span_id = parent.span_id
            sampled = self.sampler.decide(trace_id, bool(parent.trace_flags.sampled))
        else:
            trace_id = new_trace_id()
            parent_span_id = None
            sampled = self.sampler.decide(trace_id, None)
        exemplar = None
        if sampled:
            if len(self.spans) < self.cfg.span_queue_size:
                span = collective_span(rec, seconds, self.offset_ns, trace_id, parent_span_id, True)
                self.spans.append(span)
                exemplar = (span.end_ns, trace_id, span.span_id)
            else:
                health.dropped("span")
        self.store.observe(rec.op, gi.label, seconds, rec.nbytes, bus, rec.error is not None, exemplar)

    # --------------------------------------------------------------------------------------- export
    def _export_loop(self) -> None:
        cfg = self.cfg
        while not self._stop.is_set():
            self._wake.wait(min(cfg.span_schedule_delay, cfg.metric_export_interval, 1.0))
            self._wake.clear()
            if self._stop.is_set() or self.resource is None:
                continue
            now = time.monotonic()
            try:
                if len(self.spans) >= cfg.span_batch_size or (
                    self.spans and now - self._last_spans >= cfg.span_schedule_delay
                ):
                    self._last_spans = now
                    self.export_spans(now + cfg.timeout * 2)
                if now - self._last_metrics >= cfg.metric_export_interval:
                    self._last_metrics = now
                    self.export_metrics(cfg.timeout)
            except Exception as exc:
                health.error("pipeline", "the export thread hit an error", exc)

    def export_spans(self, deadline: float) -> bool:
        """Send queued spans in batches until the queue is empty or ``deadline`` (monotonic) passes."""
        ok = True
        with self._export_lock:
            while self.spans and self.resource is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                batch = []
                while self.spans and len(batch) < self.cfg.span_batch_size:
                    batch.append(self.spans.popleft())
                for sink in self.span_sinks:
                    if not sink.export_spans(self.resource, batch, timeout=remaining):
                        health.dropped("span", len(batch))
                        health.dropped("span_batch")
                        ok = False
        return ok

    def metric_data(self) -> list[MetricData]:
        labels = self.base_labels
        return collective_metrics(self.store.snapshot(), labels) + health_metrics(
            health.drops(), health.errors(), {k: v for k, v in labels.items() if k in (n.M_RUN, n.M_RANK)}
        )

    def export_metrics(self, timeout: float) -> bool:
        if self.resource is None or not self.metric_sinks:
            return True
        ok = True
        with self._export_lock:
            data = self.metric_data()
            now = time_ns()
            for sink in self.metric_sinks:
                if not sink.export_metrics(self.resource, data, self.start_ns, now, timeout=timeout):
                    health.dropped("metric_batch")
                    ok = False
        return ok

    def flush(self, timeout: float) -> bool:
        """Drain, then send every queued span and a metric snapshot, within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        self.drain()
        ok = self.export_spans(deadline)
        remaining = deadline - time.monotonic()
        if remaining > 0:
            ok = self.export_metrics(remaining) and ok
        else:
            ok = False
        return ok
