"""The way out: sampled spans waiting for export, encoded once per wire format the sinks take, and the two
threads that send them, spans and metric snapshots apart, so that a metric exporter retrying against a
collector that is down never holds the spans back, nor spans the metrics. The drain (pipeline.py) fills it;
only the sinks it is given (export/) know a wire format or OpenTelemetry.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from time import time_ns
from typing import Any

from .. import health
from ..capture import record
from ..config import Config
from ..telemetry import MetricData, SpanData
from .spans import limited

ROOM_WAIT_S = 0.1  # the most a drain waits in all for the export thread to take spans from a full queue
# How long spans wait for a sink that batches them itself (a provider's processors): the application's span
# processor holds them for its own schedule, and what the library still held when the application shut its
# provider down was lost.
HAND_OVER_S = 0.25
SPAN_ATTRIBUTES_MAX = 64  # more than any span of the library carries: a count limit at or above it cuts nothing


class ExportLock:
    """One export path's lock (spans, metrics), taken within a timeout; without waiting while its holder is an
    export call a flush already waited out (stuck on a backend that never answers), so the flushes of
    destroy_process_group() and of process exit do not add up behind the same stuck call."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._turn = 0  # incremented by every holder
        self._abandoned = -1
        self.holder: int | None = None  # the holding thread's ident

    @property
    def stuck(self) -> bool:
        """Whether its holder is an export call a flush gave up waiting for."""
        return self._abandoned == self._turn

    def take(self, timeout: float) -> bool:
        if self.stuck:
            timeout = 0.0
        if self._lock.acquire(timeout=max(timeout, 0.0)):
            self._turn += 1
            self.holder = threading.get_ident()
            return True
        self._abandoned = self._turn
        return False

    def release(self) -> None:
        self.holder = None
        self._lock.release()


class Outbox:
    """The span queue and the export and metrics threads. ``lock`` is the drain's: spans queued from other
    threads (:meth:`emit_span`) and a new destination wait for a drain in progress."""

    def __init__(self, cfg: Config, lock: threading.Lock, metric_data: Callable[[], list[MetricData]]) -> None:
        self.cfg = cfg
        self._lock = lock
        self.metric_data = metric_data  # the drain's snapshot of every metric, taken at each export
        # Sampled spans wait for export already encoded, one deque per wire format the sinks want
        # (bytes and str are not tracked by the garbage collector; SpanData objects would be). Until the
        # sinks are known (before init_process_group) they wait as SpanData in ``pending``.
        self.pending: deque[SpanData] = deque()
        self.encoded: dict[str, deque] = {}
        self._queues: list[deque] = []  # encoded's values, for queued_spans (per span: no generator)
        # The export package's sinks (export/sinks.py: span_format, export_span_fragments, export_metrics, flush,
        # shutdown) and the encoder of each span format they take: the drain knows no wire format.
        self.span_sinks: list[Any] = []
        self.span_delay = cfg.span_schedule_delay  # set_destination's: shorter for a sink that batches itself
        self.metric_sinks: list[Any] = []
        self.encoders: Mapping[str, Callable[[SpanData], Any]] = {}
        self.resource: dict[str, Any] | None = None
        self.metric_interval = cfg.metric_export_interval
        self.start_ns = time_ns()
        self.span_lock = ExportLock()
        self.metric_lock = ExportLock()
        self._in_flight = 0  # spans inside the export call now running; None once finish() counted them
        self._in_flight_lock = threading.Lock()
        self._stop = threading.Event()
        self.wake = threading.Event()  # the export thread's: a full batch, an urgent export, a destination
        self._metrics_wake = threading.Event()
        self._threads: list[threading.Thread] = []
        self._exporter: threading.Thread | None = None
        self.room_until: float | None = None  # when this drain stops waiting for room in the span queue (room)
        self._last_metrics = time.monotonic()
        self._last_spans = time.monotonic()
        self._urgent = self._urgent_metrics = False

    def start(self) -> None:
        for name, target in (("otel-torchdist-metrics", self._metrics_loop), ("otel-torchdist-export", self._export_loop)):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        self._exporter = self._threads[-1]

    def set_destination(
        self,
        resource: dict[str, Any],
        span_sinks: list[Any],
        metric_sinks: list[Any],
        encoders: Mapping[str, Callable[[SpanData], Any]],
    ) -> None:
        """Where telemetry goes from now on (called with the drain's lock held)."""
        self.encoders = encoders
        self.resource = resource
        self.span_sinks = span_sinks
        self.metric_sinks = metric_sinks
        delay = self.cfg.span_schedule_delay
        self.span_delay = min(delay, HAND_OVER_S) if any(s.hands_over for s in span_sinks) else delay
        self.encoded = {fmt: deque() for fmt in dict.fromkeys(s.span_format for s in span_sinks if s.span_format)}
        self._queues = list(self.encoded.values())
        # Spans are far below the default limits (128 attributes, no value limit): checked only when set.
        cfg = self.cfg
        if (
            cfg.attribute_value_length_limit is not None
            or cfg.event_attribute_value_length_limit is not None
            or cfg.attribute_count_limit < SPAN_ATTRIBUTES_MAX
        ):
            self.enqueue = self._enqueue_limited
        while self.pending:
            self.enqueue(self.pending.popleft())

    def stop_threads(self, deadline: float) -> None:
        """Stop the export and metrics threads; one stuck in an export a flush gave up on is not waited for."""
        self._stop.set()
        self.wake.set()
        self._metrics_wake.set()
        stuck = {"otel-torchdist-export": self.span_lock.stuck, "otel-torchdist-metrics": self.metric_lock.stuck}
        for t in self._threads:
            t.join(0.0 if stuck.get(t.name) else max(0.0, min(1.0, deadline - time.monotonic())))
        self._threads.clear()

    def finish(self) -> None:
        """The last flush is over: what is left is lost with the process, and counted; the sinks shut down."""
        left = self._clear_spans()
        with self._in_flight_lock:
            left += self._in_flight or 0  # an export call still stuck: its spans are lost with the process
            self._in_flight = None
        if left:
            health.dropped("span", left)
        for sink in {id(s): s for s in self.span_sinks + self.metric_sinks}.values():
            sink.shutdown()

    def export_soon(self) -> None:
        """Send spans and metrics now rather than at their intervals (a hang was found)."""
        self._urgent = self._urgent_metrics = True
        self.wake.set()
        self._metrics_wake.set()

    def queued_spans(self) -> int:
        queues = self._queues
        if queues:
            return len(queues[0]) if len(queues) == 1 else min(map(len, queues))
        return len(self.pending) if self.resource is None else 0

    def enqueue(self, span: SpanData) -> None:
        """Queue ``span`` (its caller checked the bound: :meth:`add_span` does)."""
        if self.resource is None:
            self.pending.append(span)
            return
        for fmt, queue in self.encoded.items():
            queue.append(self.encoders[fmt](span))

    def _enqueue_limited(self, span: SpanData) -> None:
        """enqueue, the span limits applied first for the library's own encoders (a provider applies its own)."""
        if self.resource is None:
            self.pending.append(span)
            return
        cut = None
        cfg = self.cfg
        for fmt, queue in self.encoded.items():
            if fmt != "data" and cut is None:
                cut = limited(
                    span, cfg.attribute_value_length_limit, cfg.attribute_count_limit, cfg.event_attribute_value_length_limit
                )
            queue.append(self.encoders[fmt](span if fmt == "data" else cut))

    def _clear_spans(self) -> int:
        count = self.queued_spans()
        self.pending.clear()
        for queue in self.encoded.values():
            queue.clear()
        return count

    def room(self) -> bool:
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
        until = self.room_until
        if until is None:
            until = self.room_until = now + ROOM_WAIT_S
        limit = self.cfg.span_queue_size
        self.wake.set()
        while now < until and len(record.QUEUE) < record._limit[0] // 2:
            time.sleep(0.001)
            if self.queued_spans() < limit:
                return True
            now = time.monotonic()
        self.room_until = now  # spent: no more waiting in this drain
        return False

    def add_span(self, span: SpanData) -> None:
        """Queue a span built on the drain thread (deferred work), within the span queue's bound."""
        if self.queued_spans() < self.cfg.span_queue_size or self.room():
            self.enqueue(span)
        else:
            health.dropped("span")

    # --------------------------------------------------------------------------------------- threads
    def _export_loop(self) -> None:
        cfg = self.cfg
        while not self._stop.is_set():
            self.wake.wait(min(self.span_delay, 1.0))
            self.wake.clear()
            if self._stop.is_set() or self.resource is None:
                continue
            now = time.monotonic()
            urgent, self._urgent = self._urgent, False
            try:
                queued = self.queued_spans()
                if urgent or queued >= cfg.span_batch_size or (queued and now - self._last_spans >= self.span_delay):
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
        if not self.span_lock.take(deadline - time.monotonic()):
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
            self.span_lock.release()
        return ok

    def emit_span(self, span: SpanData) -> None:
        """Queue a span built outside the record path (warnings, sharding steps...); bounded like the rest."""
        with self._lock:
            if self.queued_spans() < self.cfg.span_queue_size:
                self.enqueue(span)
            else:
                health.dropped("span")

    def export_metrics(self, timeout: float, final: bool = False) -> bool:
        """A snapshot to every metric sink within ``timeout``. ``final`` (a flush): where the metrics thread
        holds the lock, stuck on a network sink, the snapshot still goes to the local sinks (the run folder:
        they lock their own files), and each network sink's share counts as dropped."""
        if self.resource is None or not self.metric_sinks:
            return True
        ok = True
        deadline = time.monotonic() + timeout
        if not self.metric_lock.take(timeout):
            # Only past another thread's stuck export: this thread holding it is a flush interrupted by a
            # signal handler's flush, inside a sink's own lock it would wait on for ever.
            if not final or self.metric_lock.holder == threading.get_ident():
                return False
            data, now = self.metric_data(), time_ns()
            for sink in self.metric_sinks:
                if not (getattr(sink, "local", False) and sink.export_metrics(self.resource, data, self.start_ns, now, timeout=timeout)):
                    health.dropped("metric_batch")
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
            self.metric_lock.release()
        return ok
