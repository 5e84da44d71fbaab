"""Exact, cheap metric aggregation off the hot path, read by every metric exporter.

The background thread folds each collective record into a per-(op, group) series: a cumulative histogram
of durations with the latest sampled span as exemplar per bucket, and counters of calls, bytes, bus-bytes
and errors. Exporters (OTLP push, the run folder, the Prometheus ``/metrics`` endpoint) read snapshots, so
every exporter shows the same numbers under the same names. Span sampling never thins these.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from .. import names as n
from ..telemetry import HistogramPoint, MetricData, NumberPoint

_INF = float("inf")

BOUNDS = n.DURATION_BUCKETS
_bisect_left = bisect.bisect_left
_bisect_right = bisect.bisect_right


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
        # Runs for every collective, on the drain thread: one lock, no call but the bisection. (``with``, not
        # acquire/try/release, though that costs 0.1 us less: a signal's exception raised between acquire()
        # and the try, as on a flush from the main thread, would leave the lock held and the drain stuck.)
        i = _bisect_left(self.bounds, seconds)
        with self._lock:
            s = self._series.get((op, group))
            if s is None:
                s = self._series[(op, group)] = Series([0] * (len(self.bounds) + 1), dur_min=seconds, dur_max=seconds)
            elif seconds < s.dur_min:
                s.dur_min = seconds
            elif seconds > s.dur_max:
                s.dur_max = seconds
            s.count += 1
            s.bytes += message_size
            s.bus_bytes += bus_bytes
            s.dur_sum += seconds
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
                sum(s.buckets),  # the calls that completed: failed and unfinished ones count as calls, untimed
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
    """A cumulative histogram of seconds over ``bounds`` (the ``histogram_buckets`` option).

    A value is appended as it comes and folded into the buckets when the histogram is read or ``FOLD_AT``
    values wait: sorted once, a batch of values finds its buckets with a bisection per bound, where a
    bisection per value made each observation cost a step's close ~2 k instructions (a close observes two
    histograms). Read and observe it holding the lock of its owner (FrameworkMetrics.lock)."""

    FOLD_AT = 256
    __slots__ = ("bounds", "tap", "waiting", "_count", "_sum", "_buckets", "_low", "_high")

    def __init__(self, bounds: tuple[float, ...] = BOUNDS) -> None:
        self.bounds = bounds
        self.tap: Callable[[float], None] | None = None  # also gets every value (export.otel_metrics)
        self.waiting: list[float] = []  # observed, not folded yet
        self._count = 0
        self._sum = 0.0
        self._buckets = [0] * (len(bounds) + 1)
        self._low = _INF  # the extremes so far, infinite before the first value; min and max read None then
        self._high = -_INF

    def observe(self, value: float) -> None:
        waiting = self.waiting
        waiting.append(value)
        if len(waiting) >= self.FOLD_AT:
            self._fold()
        if self.tap is not None:
            self.tap(value)

    def _fold(self) -> None:
        values = self.waiting
        if not values:
            return
        self.waiting = []
        self._count += len(values)
        self._sum += sum(values)  # in arrival order, before sorting
        values.sort()
        if values[0] < self._low:
            self._low = values[0]
        if values[-1] > self._high:
            self._high = values[-1]
        # Bucket i holds bounds[i-1] < v <= bounds[i] (bisect_left of v in bounds): the values up to each bound.
        buckets, below = self._buckets, 0
        for i, bound in enumerate(self.bounds):
            upto = _bisect_right(values, bound, below)
            buckets[i] += upto - below
            below = upto
        buckets[-1] += len(values) - below

    @property
    def count(self) -> int:
        self._fold()
        return self._count

    @property
    def sum(self) -> float:
        self._fold()
        return self._sum

    @property
    def buckets(self) -> list[int]:
        self._fold()
        return self._buckets

    @property
    def min(self) -> float | None:
        return self._low if self.count else None

    @property
    def max(self) -> float | None:
        return self._high if self.count else None

    def point(self, labels: dict[str, str]) -> HistogramPoint:
        self._fold()
        return HistogramPoint(labels, self._count, self._sum, list(self._buckets), self.bounds, self.min, self.max)


class Cell:
    """One counter's or gauge's value, bound to its labels (see FrameworkMetrics.counter)."""

    __slots__ = ("value",)

    def __init__(self, value: float = 0) -> None:
        self.value = value


class FrameworkMetrics:
    """Histograms, gauges and counters the framework captures feed (optimizer steps, models, DDP's own stats).

    Written from the drain thread (deferred work) and from the training thread for rare gauges, read by
    exporters: one lock. Work that updates the same series every training step binds them once
    (``histogram``, ``counter``, ``gauge``) and updates them together under ``lock``: a step's close is
    then one lock and a few attribute updates, instead of a lock, a key and a lookup per update.
    """

    def __init__(self, bounds: tuple[float, ...] = BOUNDS) -> None:
        self.bounds = bounds
        self.lock = threading.Lock()
        # Keyed by the metric's name, a string whose hash Python caches: a Metric is a frozen dataclass,
        # whose hash is a Python call over its fields on every update.
        self._metrics: dict[str, n.Metric] = {}
        self._histograms: dict[tuple[str, tuple], Histogram] = {}
        self._gauges: dict[tuple[str, tuple], Cell] = {}
        self._counters: dict[tuple[str, tuple], Cell] = {}
        # (metric, labels) -> a function every value of that histogram also goes to (export.otel_metrics)
        self._tap: Callable[[n.Metric, dict[str, str]], Callable[[float], None]] | None = None
        self._base: dict[str, str] = {}

    def set_tap(self, tap: Callable[[n.Metric, dict[str, str]], Callable[[float], None]] | None, base_labels: dict[str, str]) -> None:
        """Send every histogram value also to ``tap(metric, labels)`` (None: no more), bound ones included."""
        with self.lock:
            self._tap, self._base = tap, dict(base_labels)
            for (name, values), h in self._histograms.items():
                h.tap = None if tap is None else tap(self._metrics[name], _labels(self._metrics[name], self._base, values))

    def histogram(self, metric: n.Metric, labels: tuple = ()) -> Histogram:
        """The histogram of ``metric`` at ``labels``, created at zero: update it holding ``lock``."""
        with self.lock:
            return self._child(self._histograms, metric, labels, Histogram, self.bounds)

    def counter(self, metric: n.Metric, labels: tuple = ()) -> Cell:
        """The counter of ``metric`` at ``labels`` (``.value``), created at zero: update it holding ``lock``."""
        with self.lock:
            return self._child(self._counters, metric, labels, Cell, 0)

    def gauge(self, metric: n.Metric, labels: tuple = ()) -> Cell:
        """The gauge of ``metric`` at ``labels`` (``.value``), created unset: it is exported once set (not None)."""
        with self.lock:
            return self._child(self._gauges, metric, labels, Cell, None)

    def _child(self, table: dict, metric: n.Metric, labels: tuple, make, arg):
        key = (metric.name, labels)
        child = table.get(key)
        if child is None:
            if key[0] not in self._metrics:
                self._metrics[key[0]] = metric
            child = table[key] = make(arg)
            if self._tap is not None and table is self._histograms:
                child.tap = self._tap(metric, _labels(metric, self._base, labels))
        return child

    def observe(self, metric: n.Metric, labels: tuple, value: float) -> None:
        """``labels``: values of ``metric.attributes`` after run and rank, in order."""
        with self.lock:
            self._child(self._histograms, metric, labels, Histogram, self.bounds).observe(value)

    def set(self, metric: n.Metric, labels: tuple, value: float) -> None:
        with self.lock:
            self._child(self._gauges, metric, labels, Cell, None).value = value

    def add(self, metric: n.Metric, labels: tuple, value: float) -> None:
        with self.lock:
            self._child(self._counters, metric, labels, Cell, 0).value += value

    def get(self, metric: n.Metric, labels: tuple) -> float | None:
        key = (metric.name, labels)
        with self.lock:
            cell = self._gauges.get(key)
            if cell is None or cell.value is None:
                cell = self._counters.get(key)
            return None if cell is None else cell.value

    def metric_data(self, base_labels: dict[str, str]) -> list[MetricData]:
        out: dict[str, list] = {}
        with self.lock:
            for (name, values), h in self._histograms.items():
                if h.count:  # bound ahead and not observed yet: no point (as before binding existed)
                    out.setdefault(name, []).append(h.point(_labels(self._metrics[name], base_labels, values)))
            for (name, values), cell in list(self._gauges.items()) + list(self._counters.items()):
                if cell.value is not None:
                    out.setdefault(name, []).append(NumberPoint(_labels(self._metrics[name], base_labels, values), cell.value))
            return [MetricData(self._metrics[name], points) for name, points in out.items()]


def _labels(metric: n.Metric, base: dict[str, str], values: tuple) -> dict[str, str]:
    """Base labels (run, and rank unless turned off) then the metric's own, in its declared order."""
    own = [a for a in metric.attributes if a not in (n.M_RUN, n.M_RANK)]
    labels = {k: v for k, v in base.items() if k in metric.attributes}
    labels.update(zip(own, (str(v) for v in values)))
    return labels
