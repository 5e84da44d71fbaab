"""The library's metric points as the OpenTelemetry SDK's ``MetricsData``, encoded for OTLP/protobuf by the
SDK's own encoder (``opentelemetry-exporter-otlp-proto-common``), as its OTLP metric exporters encode them.

The library keeps exact totals of its own (drain/metrics.py) and sends a snapshot of them once an export interval
through its OTLP transport (export/sinks.py), the one its spans take, with the SDK exporters' retry rules
(export/retry.py). Not through the SDK's ``OTLPMetricExporter`` itself: that one waits out its backoff against
a collector that cannot be reached, up to its timeout (10 s), and says why only in its own log; the end of a
job then spent its whole ``flush_timeout`` on one metric export (5.0 s, against 0.01 s here), and a dead
collector held the metrics thread ten seconds an export (docs/opentelemetry.md).
"""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from .. import names as n
from .._version import __version__
from ..telemetry import TEMPORALITY_DELTA, MetricData

_SCOPE = InstrumentationScope(n.SCOPE_NAME, __version__)


def metrics_data(resource: dict[str, Any], metrics: list[MetricData], start_ns: int, now_ns: int) -> MetricsData:
    """The library's metric points as the SDK's MetricsData (what its metric exporters take)."""
    from opentelemetry.sdk.metrics import Exemplar

    out = []
    for md in metrics:
        if not md.points:
            continue
        m = md.metric
        start = md.start_ns or start_ns
        temporality = AggregationTemporality.DELTA if md.temporality == TEMPORALITY_DELTA else AggregationTemporality.CUMULATIVE
        if m.instrument == "histogram":
            points = [
                HistogramDataPoint(
                    attributes=p.attributes, start_time_unix_nano=start, time_unix_nano=now_ns, count=p.count, sum=p.sum,
                    bucket_counts=list(p.bucket_counts), explicit_bounds=list(p.bounds),
                    min=p.min, max=p.max,  # None (a delta window's are not known): left out of the request
                    exemplars=[Exemplar({}, value, t, span_id, trace_id) for value, t, trace_id, span_id in p.exemplars],
                )  # fmt: skip
                for p in md.points
            ]
            data: Any = Histogram(points, temporality)
        else:
            points = [NumberDataPoint(p.attributes, start, now_ns, p.value) for p in md.points]
            data = Sum(points, temporality, True) if m.instrument == "counter" else Gauge(points)
        out.append(Metric(m.name, m.description, m.unit, data))
    scope = ScopeMetrics(_SCOPE, out, "")
    return MetricsData([ResourceMetrics(Resource({k: v for k, v in resource.items() if v is not None}), [scope], "")])


def metrics_pb(resource: dict[str, Any], metrics: list[MetricData], start_ns: int, now_ns: int) -> bytes:
    """A serialized ``ExportMetricsServiceRequest`` of the points, by the SDK's encoder."""
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics

    return encode_metrics(metrics_data(resource, metrics, start_ns, now_ns)).SerializeToString()
