"""OTLP encoding of our spans and metric points, as protobuf and as OTLP/JSON, built directly.

We do not go through the SDK's ``ReadableSpan`` and encoder (about 35 µs a span): records become plain
:class:`SpanData` off the hot path and are encoded straight into the OTLP messages. The JSON form follows
the OTLP/JSON mapping (hex trace and span ids, integer enums, 64-bit integers as strings), one
``Export*ServiceRequest`` per line, which is what Jaeger's UI accepts as an uploaded trace file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from . import names as n
from ._version import __version__

SPAN_KIND_INTERNAL = 1
STATUS_UNSET = 0
STATUS_OK = 1
STATUS_ERROR = 2
TEMPORALITY_CUMULATIVE = 2


@dataclass(slots=True)
class SpanData:
    name: str
    trace_id: int
    span_id: int
    parent_span_id: int | None
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    error: str | None = None  # status description when the span failed
    events: list[tuple[str, int, dict[str, Any]]] = field(default_factory=list)
    sampled: bool = True


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


# ------------------------------------------------------------------------------------------ protobuf
def _set_value(av: common_pb2.AnyValue, v: Any) -> None:
    if v is True or v is False:
        av.bool_value = v
    elif isinstance(v, int):
        av.int_value = v
    elif isinstance(v, float):
        av.double_value = v
    elif isinstance(v, (list, tuple)):
        arr = av.array_value
        for item in v:
            _set_value(arr.values.add(), item)
    else:
        av.string_value = str(v)


def _add_attributes(container, attrs: dict[str, Any]) -> None:
    for key, value in attrs.items():
        if value is None:
            continue
        kv = container.add()
        kv.key = key
        _set_value(kv.value, value)


def spans_to_proto(resource: dict[str, Any], spans: list[SpanData]) -> trace_service_pb2.ExportTraceServiceRequest:
    req = trace_service_pb2.ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    _add_attributes(rs.resource.attributes, resource)
    ss = rs.scope_spans.add()
    ss.scope.name = n.SCOPE_NAME
    ss.scope.version = __version__
    out = ss.spans
    for s in spans:
        p = out.add()
        p.trace_id = s.trace_id.to_bytes(16, "big")
        p.span_id = s.span_id.to_bytes(8, "big")
        if s.parent_span_id:
            p.parent_span_id = s.parent_span_id.to_bytes(8, "big")
        p.flags = 0x101 if s.sampled else 0x100  # W3C sampled flag + "has is_remote" bit (not remote)
        p.name = s.name
        p.kind = SPAN_KIND_INTERNAL
        p.start_time_unix_nano = s.start_ns
        p.end_time_unix_nano = s.end_ns
        _add_attributes(p.attributes, s.attributes)
        for name, t, attrs in s.events:
            ev = p.events.add()
            ev.name = name
            ev.time_unix_nano = t
            _add_attributes(ev.attributes, attrs)
        if s.error is not None:
            p.status.code = STATUS_ERROR
            p.status.message = s.error
    return req


def metrics_to_proto(
    resource: dict[str, Any], metrics: list[MetricData], start_ns: int, now_ns: int
) -> metrics_service_pb2.ExportMetricsServiceRequest:
    req = metrics_service_pb2.ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    _add_attributes(rm.resource.attributes, resource)
    sm = rm.scope_metrics.add()
    sm.scope.name = n.SCOPE_NAME
    sm.scope.version = __version__
    for md in metrics:
        if not md.points:
            continue
        m = sm.metrics.add()
        m.name = md.metric.name
        m.unit = md.metric.unit
        m.description = md.metric.description
        if md.metric.instrument == "histogram":
            m.histogram.aggregation_temporality = TEMPORALITY_CUMULATIVE
            for pt in md.points:
                dp = m.histogram.data_points.add()
                _add_attributes(dp.attributes, pt.attributes)
                dp.start_time_unix_nano = start_ns
                dp.time_unix_nano = now_ns
                dp.count = pt.count
                dp.sum = pt.sum
                dp.bucket_counts.extend(pt.bucket_counts)
                dp.explicit_bounds.extend(pt.bounds)
                if pt.min is not None:
                    dp.min = pt.min
                    dp.max = pt.max
                for value, t, trace_id, span_id in pt.exemplars:
                    ex = dp.exemplars.add()
                    ex.as_double = value
                    ex.time_unix_nano = t
                    ex.trace_id = trace_id.to_bytes(16, "big")
                    ex.span_id = span_id.to_bytes(8, "big")
        else:
            if md.metric.instrument == "counter":
                data = m.sum
                data.aggregation_temporality = TEMPORALITY_CUMULATIVE
                data.is_monotonic = True
            else:
                data = m.gauge
            for pt in md.points:
                dp = data.data_points.add()
                _add_attributes(dp.attributes, pt.attributes)
                if md.metric.instrument == "counter":
                    dp.start_time_unix_nano = start_ns
                dp.time_unix_nano = now_ns
                if isinstance(pt.value, int):
                    dp.as_int = pt.value
                else:
                    dp.as_double = pt.value
    return req


# ---------------------------------------------------------------------------------------------- JSON
def _json_value(v: Any) -> dict[str, Any]:
    if v is True or v is False:
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, (list, tuple)):
        return {"arrayValue": {"values": [_json_value(x) for x in v]}}
    return {"stringValue": str(v)}


def _json_attributes(attrs: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"key": k, "value": _json_value(v)} for k, v in attrs.items() if v is not None]


def _scope() -> dict[str, str]:
    return {"name": n.SCOPE_NAME, "version": __version__}


def spans_to_json(resource: dict[str, Any], spans: list[SpanData]) -> str:
    out = []
    for s in spans:
        d: dict[str, Any] = {
            "traceId": f"{s.trace_id:032x}",
            "spanId": f"{s.span_id:016x}",
            "flags": 0x101 if s.sampled else 0x100,
            "name": s.name,
            "kind": SPAN_KIND_INTERNAL,
            "startTimeUnixNano": str(s.start_ns),
            "endTimeUnixNano": str(s.end_ns),
            "attributes": _json_attributes(s.attributes),
        }
        if s.parent_span_id:
            d["parentSpanId"] = f"{s.parent_span_id:016x}"
        if s.events:
            d["events"] = [
                {"name": name, "timeUnixNano": str(t), "attributes": _json_attributes(attrs)}
                for name, t, attrs in s.events
            ]
        d["status"] = {"code": STATUS_ERROR, "message": s.error} if s.error is not None else {}
        out.append(d)
    doc = {
        "resourceSpans": [
            {
                "resource": {"attributes": _json_attributes(resource)},
                "scopeSpans": [{"scope": _scope(), "spans": out}],
            }
        ]
    }
    return json.dumps(doc, separators=(",", ":"))


def metrics_to_json(resource: dict[str, Any], metrics: list[MetricData], start_ns: int, now_ns: int) -> str:
    out = []
    for md in metrics:
        if not md.points:
            continue
        m: dict[str, Any] = {"name": md.metric.name, "unit": md.metric.unit, "description": md.metric.description}
        if md.metric.instrument == "histogram":
            pts = []
            for pt in md.points:
                d: dict[str, Any] = {
                    "attributes": _json_attributes(pt.attributes),
                    "startTimeUnixNano": str(start_ns),
                    "timeUnixNano": str(now_ns),
                    "count": str(pt.count),
                    "sum": pt.sum,
                    "bucketCounts": [str(c) for c in pt.bucket_counts],
                    "explicitBounds": list(pt.bounds),
                }
                if pt.min is not None:
                    d["min"] = pt.min
                    d["max"] = pt.max
                if pt.exemplars:
                    d["exemplars"] = [
                        {
                            "asDouble": value,
                            "timeUnixNano": str(t),
                            "traceId": f"{trace_id:032x}",
                            "spanId": f"{span_id:016x}",
                        }
                        for value, t, trace_id, span_id in pt.exemplars
                    ]
                pts.append(d)
            m["histogram"] = {"dataPoints": pts, "aggregationTemporality": TEMPORALITY_CUMULATIVE}
        else:
            pts = []
            for pt in md.points:
                d = {"attributes": _json_attributes(pt.attributes), "timeUnixNano": str(now_ns)}
                if md.metric.instrument == "counter":
                    d["startTimeUnixNano"] = str(start_ns)
                if isinstance(pt.value, int):
                    d["asInt"] = str(pt.value)
                else:
                    d["asDouble"] = pt.value
                pts.append(d)
            if md.metric.instrument == "counter":
                m["sum"] = {"dataPoints": pts, "aggregationTemporality": TEMPORALITY_CUMULATIVE, "isMonotonic": True}
            else:
                m["gauge"] = {"dataPoints": pts}
        out.append(m)
    doc = {
        "resourceMetrics": [
            {
                "resource": {"attributes": _json_attributes(resource)},
                "scopeMetrics": [{"scope": _scope(), "metrics": out}],
            }
        ]
    }
    return json.dumps(doc, separators=(",", ":"))
