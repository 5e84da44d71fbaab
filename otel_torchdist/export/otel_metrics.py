"""The library's metrics as instruments of an OpenTelemetry MeterProvider (the application's, or one passed to
``instrument()``), under the names, units and labels the dashboards and alert rules use.

Counters and gauges are *observable* instruments whose callbacks read the library's exact totals when the
provider's readers collect: nothing is paid per collective for them. A histogram has no observable form in
OpenTelemetry, and its buckets, sum, min and max need every value, so each duration is recorded once, on the
background thread, as it is folded into the library's own store (the SDK's ``Histogram.record`` costs a few
microseconds a value: docs/performance.md). A histogram is created with the library's bucket bounds as
its advisory boundaries; the provider's views may still rename, re-bucket or drop any instrument.

An instrument cannot be removed from a meter. The instruments of a provider are made once per process and
read whatever this process's current instrumentation is (nothing after ``uninstrument()``).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation

from .. import health
from .. import names as n
from .._version import __version__
from ..telemetry import MetricData, NumberPoint
from .otel_spans import parent_context

SNAPSHOT_TTL_S = 0.5
"""The longest one snapshot serves the callbacks of one collection (a reader's callbacks run one after the
other: one snapshot of every series, not one per instrument). A callback asking again for its instrument
starts the next collection, and a snapshot of its own: a second collection within the TTL (a reader's final
export at shutdown, a second reader) reported the totals of the one before."""


class _Instruments:
    """One MeterProvider's instruments, made once, and the source they read now."""

    def __init__(self, meter_provider: Any, bounds: tuple[float, ...]) -> None:
        meter = meter_provider.get_meter(n.SCOPE_NAME, __version__)
        self.source: Callable[[], list[MetricData]] | None = None
        self.bounds = bounds
        self._lock = threading.Lock()
        self._snapshot: dict[str, list] = {}
        self._taken = 0.0
        self._served: set[str] = set()  # the instruments this snapshot has answered
        # Counter totals of the instrumentations that used these instruments before (uninstrument(), then
        # instrument() again with the same provider): name -> attributes -> total. The instruments are the
        # provider's, with their start time: a new pipeline counting from 0 made its cumulative sums go back.
        self.base: dict[str, dict[frozenset, float]] = {}
        self.histograms: dict[str, Any] = {}
        for metric in n.METRICS:
            if metric.instrument == "histogram":
                self.histograms[metric.name] = meter.create_histogram(
                    metric.name, metric.unit, metric.description, explicit_bucket_boundaries_advisory=list(bounds)
                )
            else:
                make = meter.create_observable_counter if metric.instrument == "counter" else meter.create_observable_gauge
                make(metric.name, [self._callback(metric.name)], metric.unit, metric.description)

    def _callback(self, name: str) -> Callable[[CallbackOptions], list[Observation]]:
        def observe(options: CallbackOptions) -> list[Observation]:
            return [Observation(p.value, p.attributes) for p in self._points(name)]

        observe.__name__ = f"observe_{name.replace('.', '_')}"
        return observe

    def _points(self, name: str) -> list:
        with self._lock:
            now = time.monotonic()
            if name in self._served or now - self._taken > SNAPSHOT_TTL_S:
                source = self.source
                data: list[MetricData] = []
                if source is not None:
                    try:
                        data = source()
                    except Exception as exc:
                        health.error("metrics", "could not read the metrics for the MeterProvider", exc)
                self._snapshot = {md.metric.name: md.points for md in data if md.metric.instrument != "histogram"}
                for name_, base in self.base.items():
                    self._snapshot[name_] = _plus(self._snapshot.get(name_, []), base)
                self._taken = now
                self._served = set()
            self._served.add(name)
            return self._snapshot.get(name, [])

    def retire(self, final: list[MetricData]) -> None:
        """An instrumentation ends with these totals: its counters' become the base the next one's add to;
        the gauges report their last values until then."""
        with self._lock:
            for md in final:
                if md.metric.instrument == "counter" and md.metric not in n.PROCESS_TOTALS:
                    base = self.base.setdefault(md.metric.name, {})
                    for p in md.points:
                        key = frozenset(p.attributes.items())
                        base[key] = base.get(key, 0) + p.value
            gauges = [md for md in final if md.metric.instrument == "gauge" or md.metric in n.PROCESS_TOTALS]
            self.source = lambda: gauges
            self._taken = 0.0


def _plus(points: list, base: dict[frozenset, float]) -> list:
    """``points`` with the earlier instrumentations' totals added, and the series only they had."""
    out, seen = [], set()
    for p in points:
        key = frozenset(p.attributes.items())
        seen.add(key)
        out.append(NumberPoint(p.attributes, p.value + base.get(key, 0)))
    out += [NumberPoint(dict(key), value) for key, value in base.items() if key not in seen]
    return out


_by_provider: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_by_id: dict[int, tuple[Any, _Instruments]] = {}  # providers that cannot be weakly referenced
_by_provider_lock = threading.Lock()


class MeterBridge:
    """This instrumentation's metrics in ``meter_provider``: see the module docstring."""

    def __init__(
        self, meter_provider: Any, origin: str, bounds: tuple[float, ...], base_labels: dict[str, str], owned: bool = False
    ) -> None:
        self.provider = meter_provider
        self.origin = origin
        self.owned = owned  # made by the library (for an installed exporter): shut down with it
        with _by_provider_lock:
            try:
                inst = _by_provider.get(meter_provider)
            except TypeError:  # a provider that cannot be weakly referenced: kept for the process
                inst = _by_id.get(id(meter_provider), (None, None))[1]
            if inst is None:
                inst = _Instruments(meter_provider, bounds)
                try:
                    _by_provider[meter_provider] = inst
                except TypeError:
                    _by_id[id(meter_provider)] = (meter_provider, inst)
            elif inst.bounds != bounds:
                # A meter hands back the instruments it made first (their callbacks, their advisory buckets):
                # they serve this instrumentation too, with the buckets they were made with.
                health.warn_once(
                    "meter_bounds", "the MeterProvider's histograms keep the buckets of the first instrument() "
                    "that used it; histogram_buckets apply to the run folder, /metrics and the library's own exporters",
                )  # fmt: skip
        self.instruments = inst
        self._source: Callable[[], list[MetricData]] | None = None
        self.base_labels = dict(base_labels)
        self._collective = inst.histograms[n.COLLECTIVE_DURATION.name]
        self._attributes: dict[tuple[str, str], dict[str, str]] = {}

    def read_from(self, source: Callable[[], list[MetricData]]) -> None:
        """What the observable instruments report from now on."""
        self._source = self.instruments.source = source
        self.instruments._taken = 0.0

    def collective(self, op: str, group: str, seconds: float, exemplar: tuple | None) -> None:
        """One collective's duration (on the drain thread, as the store takes it). ``exemplar``: (end time,
        trace id, span id) of its span when it has one, so the provider's exemplar filter can link to it."""
        context = None if exemplar is None else parent_context(exemplar[1], exemplar[2], True, False)
        self._collective.record(seconds, self._labels(op, group), context)

    def collective_value(self, op: str, group: str, seconds: float) -> None:
        """One folded collective's duration (the native fold's tap: an unsampled record, no exemplar)."""
        self._collective.record(seconds, self._labels(op, group))

    def _labels(self, op: str, group: str) -> dict[str, str]:
        attributes = self._attributes.get((op, group))
        if attributes is None:
            attributes = self._attributes[(op, group)] = {**self.base_labels, n.M_OP: op, n.M_GROUP: group}
        return attributes

    def tap(self, metric: n.Metric, labels: dict[str, str]) -> Callable[[float], None]:
        """A function recording values of histogram ``metric`` at ``labels`` (for metrics.Histogram.tap)."""
        instrument = self.instruments.histograms[metric.name]
        attributes = dict(labels)

        def record(value: float) -> None:
            try:
                instrument.record(value, attributes)
            except Exception as exc:
                health.error("metrics", f"could not record {metric.name} in the MeterProvider", exc)

        return record

    def flush(self, timeout: float) -> bool:
        """Ask the provider to export what it holds, waiting ``timeout`` seconds at most."""
        from .providers import force_flush

        return force_flush(self.provider, timeout)

    def close(self, final: list[MetricData]) -> None:
        """Instrumentation ends: the instruments keep reporting the last totals (``final``), so that the
        provider's last export (at its shutdown, after ours) still has them."""
        if self.instruments.source is self._source:
            self.instruments.retire(final)
        if self.owned:
            from .providers import shutdown

            shutdown(self.provider)

    def describe(self) -> str:
        return self.origin
