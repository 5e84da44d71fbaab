"""What the background thread describes for the exporters: spans and metric points, plain and neutral.

The drain (drain/pipeline.py, steps.py, the framework captures) builds these; only the export package turns them
into a wire format (export/otlp.py, export/wire.py) or hands them to an OpenTelemetry provider
(export/otel_spans.py, export/otel_metrics.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import names as n

TEMPORALITY_DELTA = 1  # OTLP's AggregationTemporality values
TEMPORALITY_CUMULATIVE = 2


class Block(tuple):
    """A tuple of attribute pairs that recurs across spans (a call site's), hashed by identity: the
    encoders' caches find its encoding without hashing twenty pairs every time."""

    __slots__ = ()
    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other


@dataclass(slots=True)
class SpanData:
    name: str
    trace_id: int
    span_id: int
    parent_span_id: int | None
    start_ns: int
    end_ns: int
    attributes: list[tuple[str, Any]]  # (key, value) pairs; None values are left out by the producer
    shared: tuple[tuple[tuple[str, Any], ...], ...] = ()  # blocks of pairs that recur across spans (export/wire.py)
    error: str | None = None  # status description when the span failed
    events: list[tuple[str, int, list[tuple[str, Any]]]] = field(default_factory=list)
    sampled: bool = True
    remote_parent: bool = False  # the parent span is made by another process (a rank's step under rank 0's)
    links: tuple = ()  # (trace id, span id, attribute pairs): a rank's step under the caller's span, to its step's root

    def all_attributes(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for block in self.shared:
            out.update(block)
        out.update(self.attributes)
        return out


@dataclass(slots=True)
class HistogramPoint:
    attributes: dict[str, Any]
    count: int
    sum: float
    bucket_counts: list[int]  # per bucket, len(bounds) + 1
    bounds: tuple[float, ...]
    min: float | None = None
    max: float | None = None
    exemplars: list[tuple[float, int, int, int]] = field(default_factory=list)  # value, time_ns, trace, span


@dataclass(slots=True)
class NumberPoint:
    attributes: dict[str, Any]
    value: int | float


@dataclass(slots=True)
class MetricData:
    metric: n.Metric
    points: list[Any]  # HistogramPoint for histograms, NumberPoint otherwise
    start_ns: int | None = None  # a cumulative counter's own start (CPU time counts from the process's start)
    temporality: int = TEMPORALITY_CUMULATIVE  # export.temporality.Delta makes deltas for a backend that wants them
