"""Exact, cheap metric aggregation off the hot path, read by every metric exporter.

The background thread folds each collective record into a per-(op, group) series: a cumulative histogram
of durations with the latest sampled span as exemplar per bucket, and counters of calls, bytes, bus-bytes
and errors. Exporters (OTLP push, the run folder, the Prometheus ``/metrics`` endpoint) read snapshots, so
every exporter shows the same numbers under the same names. Span sampling never thins these.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field

from . import names as n
from .otlp import HistogramPoint, MetricData, NumberPoint

BOUNDS = n.DURATION_BUCKETS


@dataclass(slots=True)
class Series:
    buckets: list[int]
    count: int = 0
    errors: int = 0
    bytes: int = 0
    bus_bytes: float = 0.0
    dur_sum: float = 0.0
    dur_min: float | None = None
    dur_max: float | None = None
    exemplars: dict[int, tuple[float, int, int, int]] = field(default_factory=dict)

    def copy(self) -> Series:
        return Series(
            list(self.buckets),
            self.count,
            self.errors,
            self.bytes,
            self.bus_bytes,
            self.dur_sum,
            self.dur_min,
            self.dur_max,
            dict(self.exemplars),
        )


class MetricStore:
    def __init__(self, bounds: tuple[float, ...] = BOUNDS) -> None:
        self.bounds = bounds
        self._lock = threading.Lock()
        self._series: dict[tuple[str, str], Series] = {}

    def observe(
        self,
        op: str,
        group: str,
        seconds: float,
        message_size: int,
        bus_bytes: float,
        error: bool,
        exemplar: tuple[int, int, int] | None = None,  # time_ns, trace_id, span_id of a sampled span
    ) -> None:
        key = (op, group)
        with self._lock:
            s = self._series.get(key)
            if s is None:
                s = self._series[key] = Series([0] * (len(self.bounds) + 1))
            s.count += 1
            s.bytes += message_size
            s.bus_bytes += bus_bytes
            s.dur_sum += seconds
            if s.dur_min is None or seconds < s.dur_min:
                s.dur_min = seconds
            if s.dur_max is None or seconds > s.dur_max:
                s.dur_max = seconds
            i = bisect.bisect_left(self.bounds, seconds)
            s.buckets[i] += 1
            if error:
                s.errors += 1
            if exemplar is not None:
                s.exemplars[i] = (seconds, exemplar[0], exemplar[1], exemplar[2])

    def snapshot(self) -> dict[tuple[str, str], Series]:
        with self._lock:
            return {k: v.copy() for k, v in self._series.items()}


def collective_metrics(
    snapshot: dict[tuple[str, str], Series], base_labels: dict[str, str], bounds: tuple[float, ...] = BOUNDS
) -> list[MetricData]:
    """The collective metrics of one snapshot as exporter-neutral points."""
    hist, calls, nbytes, bus, errors = [], [], [], [], []
    for (op, group), s in sorted(snapshot.items()):
        labels = {**base_labels, n.M_OP: op, n.M_GROUP: group}
        hist.append(
            HistogramPoint(
                labels,
                s.count,
                s.dur_sum,
                list(s.buckets),
                bounds,
                s.dur_min,
                s.dur_max,
                [s.exemplars[i] for i in sorted(s.exemplars)],
            )
        )
        calls.append(NumberPoint(labels, s.count))
        nbytes.append(NumberPoint(labels, s.bytes))
        bus.append(NumberPoint(labels, int(round(s.bus_bytes))))
        errors.append(NumberPoint(labels, s.errors))
    return [
        MetricData(n.COLLECTIVE_DURATION, hist),
        MetricData(n.COLLECTIVE_CALLS, calls),
        MetricData(n.COLLECTIVE_BYTES, nbytes),
        MetricData(n.COLLECTIVE_BUS_BYTES, bus),
        MetricData(n.COLLECTIVE_ERRORS, errors),
    ]


def health_metrics(drops: dict[str, int], errors: dict[str, int], base_labels: dict[str, str]) -> list[MetricData]:
    """Telemetry's own drops and errors. Always present (zero) so alert rules have a series to watch."""
    drop_kinds = {"record": 0, "span": 0, "span_batch": 0, "metric_batch": 0, **drops}
    err_kinds = {"capture": 0, "export": 0, **errors}
    return [
        MetricData(
            n.TELEMETRY_DROPPED,
            [NumberPoint({**base_labels, n.M_KIND: k}, v) for k, v in sorted(drop_kinds.items())],
        ),
        MetricData(
            n.TELEMETRY_ERRORS,
            [NumberPoint({**base_labels, n.M_KIND: k}, v) for k, v in sorted(err_kinds.items())],
        ),
    ]


class Histogram:
    """A cumulative histogram of seconds over ``bounds`` (the ``histogram_buckets`` option)."""

    __slots__ = ("bounds", "count", "sum", "buckets", "min", "max")

    def __init__(self, bounds: tuple[float, ...] = BOUNDS) -> None:
        self.bounds = bounds
        self.count = 0
        self.sum = 0.0
        self.buckets = [0] * (len(bounds) + 1)
        self.min: float | None = None
        self.max: float | None = None

    def observe(self, value: float) -> None:
        self.count += 1
        self.sum += value
        self.buckets[bisect.bisect_left(self.bounds, value)] += 1
        if self.min is None or value < self.min:
            self.min = value
        if self.max is None or value > self.max:
            self.max = value

    def point(self, labels: dict[str, str]) -> HistogramPoint:
        return HistogramPoint(labels, self.count, self.sum, list(self.buckets), self.bounds, self.min, self.max)


class FrameworkMetrics:
    """Histograms and gauges the framework captures feed (optimizer steps, models, DDP's own stats).

    Written from the drain thread (deferred work) and from the training thread for rare gauges, read by
    exporters: one lock.
    """

    def __init__(self, bounds: tuple[float, ...] = BOUNDS) -> None:
        self.bounds = bounds
        self._lock = threading.Lock()
        # Keyed by the metric's name, a string whose hash Python caches: a Metric is a frozen dataclass,
        # whose hash is a Python call over its fields on every update.
        self._metrics: dict[str, n.Metric] = {}
        self._histograms: dict[tuple[str, tuple], Histogram] = {}
        self._gauges: dict[tuple[str, tuple], float] = {}
        self._counters: dict[tuple[str, tuple], float] = {}

    def observe(self, metric: n.Metric, labels: tuple, value: float) -> None:
        """``labels``: values of ``metric.attributes`` after run and rank, in order."""
        key = (metric.name, labels)
        with self._lock:
            if key[0] not in self._metrics:
                self._metrics[key[0]] = metric
            h = self._histograms.get(key)
            if h is None:
                h = self._histograms[key] = Histogram(self.bounds)
            h.observe(value)

    def set(self, metric: n.Metric, labels: tuple, value: float) -> None:
        key = (metric.name, labels)
        with self._lock:
            if key[0] not in self._metrics:
                self._metrics[key[0]] = metric
            self._gauges[key] = value

    def add(self, metric: n.Metric, labels: tuple, value: float) -> None:
        key = (metric.name, labels)
        with self._lock:
            if key[0] not in self._metrics:
                self._metrics[key[0]] = metric
            self._counters[key] = self._counters.get(key, 0) + value

    def get(self, metric: n.Metric, labels: tuple) -> float | None:
        key = (metric.name, labels)
        with self._lock:
            return self._gauges.get(key, self._counters.get(key))

    def metric_data(self, base_labels: dict[str, str]) -> list[MetricData]:
        out: dict[str, list] = {}
        with self._lock:
            for (name, values), h in self._histograms.items():
                out.setdefault(name, []).append(h.point(_labels(self._metrics[name], base_labels, values)))
            for (name, values), v in list(self._gauges.items()) + list(self._counters.items()):
                out.setdefault(name, []).append(NumberPoint(_labels(self._metrics[name], base_labels, values), v))
            return [MetricData(self._metrics[name], points) for name, points in out.items()]


def _labels(metric: n.Metric, base: dict[str, str], values: tuple) -> dict[str, str]:
    """Base labels (run, and rank unless turned off) then the metric's own, in its declared order."""
    own = [a for a in metric.attributes if a not in (n.M_RUN, n.M_RANK)]
    labels = {k: v for k, v in base.items() if k in metric.attributes}
    labels.update(zip(own, (str(v) for v in values)))
    return labels
