"""OTLP encoding of the library's spans (protobuf and OTLP/JSON) and metric points (OTLP/JSON), built directly.

Spans do not go through the SDK's ``ReadableSpan`` and encoder (about 50 µs to start and end a span and 80 µs
or more to encode it, against a traced collective's 12 µs in all): records become plain :class:`SpanData` off
the hot path and are encoded straight into the OTLP messages. Protobuf metrics go through the SDK's own
exporter's encoder (export/sdk_metrics.py). The JSON form follows the OTLP/JSON mapping (hex trace and span
ids, integer enums, 64-bit integers as strings), one ``Export*ServiceRequest`` per line, which is what Jaeger's
UI accepts as an uploaded trace file and the run folder's metrics files hold.
"""

from __future__ import annotations

import json
from typing import Any

from .. import names as n
from .._version import __version__
from ..telemetry import MetricData, SpanData
from . import wire

SPAN_KIND_INTERNAL = 1
STATUS_UNSET = 0
STATUS_OK = 1
STATUS_ERROR = 2


# ------------------------------------------------------------------------------------------ protobuf
_scope_pb = b""


def _scope_body() -> bytes:
    global _scope_pb
    if not _scope_pb:
        _scope_pb = wire.length_delimited(1, n.SCOPE_NAME.encode()) + wire.length_delimited(2, __version__.encode())
    return _scope_pb


_name_pb: dict[str, bytes] = {}  # a span's name -> its encoding as exported (the rank in it: name_spans_for_rank)
_rank: list[int | None] = [None]


def name_spans_for_rank(rank: int | None) -> None:
    """Spans encoded from now on carry ``rank`` in their names (names.exported_span_name)."""
    if _rank[0] != rank:
        _rank[0] = rank
        _name_pb.clear()  # in place: the native encoder holds these dicts
        _name_json.clear()


def span_pb(s: SpanData) -> bytes:
    """One span, encoded as the ``spans`` field of ``ScopeSpans`` (a fragment of a request)."""
    name = _name_pb.get(s.name)
    if name is None:
        name = _name_pb[s.name] = wire.length_delimited(5, n.exported_span_name(s.name, _rank[0]).encode())
    parts = [
        b"\x0a\x10" + s.trace_id.to_bytes(16, "big") + b"\x12\x08" + s.span_id.to_bytes(8, "big"),
        b"\x22\x08" + s.parent_span_id.to_bytes(8, "big") if s.parent_span_id else b"",
        name,
        b"\x30\x01\x39" + wire.fixed64(s.start_ns) + b"\x41" + wire.fixed64(s.end_ns),  # kind, start, end
        b"".join([wire.block_pb(9, block) for block in s.shared]) if s.shared else b"",
        wire.attributes_pb(9, s.attributes),
    ]
    for ev_name, t, attrs in s.events:
        body = b"\x09" + wire.fixed64(t) + wire.length_delimited(2, ev_name.encode()) + wire.attributes_pb(3, attrs)
        parts.append(wire.length_delimited(11, body))
    for trace_id, span_id, attrs in s.links:  # Span.links: trace_id, span_id, attributes, flags (sampled, remote)
        body = b"\x0a\x10" + trace_id.to_bytes(16, "big") + b"\x12\x08" + span_id.to_bytes(8, "big")
        parts.append(wire.length_delimited(13, body + wire.attributes_pb(4, attrs) + b"\x35" + wire.fixed32(_LINK_FLAGS)))
    if s.error is not None:
        parts.append(wire.length_delimited(15, wire.length_delimited(2, s.error.encode()) + b"\x18\x02"))
    parts.append(b"\x85\x01" + wire.fixed32(_flags(s)))  # flags (field 16, fixed32)
    body = b"".join(parts)
    return b"\x12" + wire.varint(len(body)) + body  # ScopeSpans.spans = 2


_LINK_FLAGS = 0x301  # a link's span: sampled, and (bit 8 says bit 9 is known) made elsewhere


def _flags(s: SpanData) -> int:
    """Span.flags: W3C sampled (bit 0); bit 8 says bit 9 is known; bit 9, the parent is remote."""
    return (0x301 if s.remote_parent else 0x101) if s.sampled else (0x300 if s.remote_parent else 0x100)


def trace_request_pb(resource: dict[str, Any], fragments: list[bytes]) -> bytes:
    """A serialized ``ExportTraceServiceRequest`` around spans already encoded by :func:`span_pb`. Built in
    one join, the nested messages' lengths computed first: nesting each in the next copied the batch's
    spans (half a megabyte for 512) four more times, each copy on pages fresh from the kernel."""
    scope = wire.length_delimited(1, _scope_body())  # ScopeSpans.scope
    scope_spans_len = len(scope) + sum(map(len, fragments))
    resource_msg = wire.length_delimited(1, wire.attributes_pb(1, [(k, v) for k, v in resource.items() if v is not None]))
    scope_spans_head = wire.tag(2, 2) + wire.varint(scope_spans_len)  # ResourceSpans.scope_spans
    resource_spans_len = len(resource_msg) + len(scope_spans_head) + scope_spans_len
    head = wire.tag(1, 2) + wire.varint(resource_spans_len) + resource_msg + scope_spans_head + scope
    return b"".join([head, *fragments])


def spans_to_proto(resource: dict[str, Any], spans: list[SpanData]) -> bytes:
    return trace_request_pb(resource, [span_pb(s) for s in spans])


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


_name_json: dict[str, str] = {}


def span_json(s: SpanData) -> str:
    """One span as an OTLP/JSON object (a fragment of a request)."""
    attrs = [wire.block_json(block) for block in s.shared if block]
    attrs += wire.attributes_json(s.attributes)
    name = _name_json.get(s.name)
    if name is None:
        name = _name_json[s.name] = json.dumps(n.exported_span_name(s.name, _rank[0]))
    out = '{"traceId":"%032x","spanId":"%016x",%s"flags":%d,"name":%s,"kind":1,"startTimeUnixNano":"%d","endTimeUnixNano":"%d","attributes":[%s]' % (
        s.trace_id,
        s.span_id,
        '"parentSpanId":"%016x",' % s.parent_span_id if s.parent_span_id else "",
        _flags(s),
        name,
        s.start_ns,
        s.end_ns,
        ",".join(attrs),
    )
    if s.events:
        out += ',"events":[%s]' % ",".join(
            '{"name":%s,"timeUnixNano":"%d","attributes":[%s]}' % (json.dumps(name), t, ",".join(wire.attributes_json(a)))
            for name, t, a in s.events
        )
    if s.links:
        out += ',"links":[%s]' % ",".join(
            '{"traceId":"%032x","spanId":"%016x","attributes":[%s],"flags":%d}' % (t, sp, ",".join(wire.attributes_json(a)), _LINK_FLAGS)
            for t, sp, a in s.links
        )
    if s.error is not None:
        out += ',"status":{"code":%d,"message":%s}' % (STATUS_ERROR, json.dumps(s.error))
    return out + "}"


def trace_request_frame(resource: dict[str, Any]) -> tuple[str, str]:
    """What comes before and after the comma-joined :func:`span_json` fragments in a request."""
    res = ",".join(wire.attributes_json([(k, v) for k, v in resource.items() if v is not None]))
    scope = '{"name":%s,"version":%s}' % (json.dumps(n.SCOPE_NAME), json.dumps(__version__))
    return '{"resourceSpans":[{"resource":{"attributes":[%s]},"scopeSpans":[{"scope":%s,"spans":[' % (res, scope), "]}]}]}"


def trace_request_json(resource: dict[str, Any], fragments: list[str]) -> str:
    """One OTLP/JSON ``ExportTraceServiceRequest`` (a line of a traces file) around :func:`span_json` fragments."""
    head, tail = trace_request_frame(resource)
    return head + ",".join(fragments) + tail


def trace_request_json_pieces(resource: dict[str, Any], fragments: list[str], end: str = "") -> list[bytes]:
    """:func:`trace_request_json` (then ``end``), UTF-8, as pieces to write or join once: the batch's
    spans are copied once, where joining, framing and encoding a batch copied them three times, each copy
    of about a megabyte on pages fresh from the kernel."""
    head, tail = trace_request_frame(resource)
    pieces = [head.encode()]
    add = pieces.append
    for fragment in fragments:
        add(fragment.encode())
        add(b",")
    if fragments:
        pieces.pop()
    add((tail + end).encode())
    return pieces


def spans_to_json(resource: dict[str, Any], spans: list[SpanData]) -> str:
    return trace_request_json(resource, [span_json(s) for s in spans])


def span_data(s: SpanData) -> SpanData:
    """The "encoding" of sinks that take spans as they are (export.otel_spans.TracerSink)."""
    return s


SPAN_ENCODERS = {"pb": span_pb, "json": span_json, "data": span_data}


def use_native(mod: Any) -> None:
    """Encode spans with the native part ``mod`` (``native/encode.cpp``: the same bytes, without the
    interpreter's per-attribute cost); ``None``: with the Python encoders above."""
    if mod is None:
        SPAN_ENCODERS.update(pb=span_pb, json=span_json)
        return
    mod.encode_setup(
        {
            "json_fallback": span_json,
            "pb_fallback": span_pb,
            "pair_json": wire.pair_json,
            "pair_pb": wire.pair_pb,
            "block_json_cache": wire._block_json,
            "block_json": wire.block_json,
            "block_pb_cache": wire._block_pb,
            "block_pb": wire.block_pb,
            "key_json_cache": wire._key_json_cache,
            "key_json": wire._key_json,
            "name_json": _name_json,
            "name_pb": _name_pb,
        }
    )
    SPAN_ENCODERS.update(pb=mod.span_pb, json=mod.span_json)


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
                    "startTimeUnixNano": str(md.start_ns or start_ns),
                    "timeUnixNano": str(now_ns),
                    "count": str(pt.count),
                    "sum": wire.json_double(pt.sum),
                    "bucketCounts": [str(c) for c in pt.bucket_counts],
                    "explicitBounds": list(pt.bounds),
                }
                if pt.min is not None:
                    d["min"] = wire.json_double(pt.min)
                    d["max"] = wire.json_double(pt.max)
                if pt.exemplars:
                    d["exemplars"] = [
                        {
                            "asDouble": wire.json_double(value),
                            "timeUnixNano": str(t),
                            "traceId": f"{trace_id:032x}",
                            "spanId": f"{span_id:016x}",
                        }
                        for value, t, trace_id, span_id in pt.exemplars
                    ]
                pts.append(d)
            m["histogram"] = {"dataPoints": pts, "aggregationTemporality": md.temporality}
        else:
            pts = []
            for pt in md.points:
                d = {"attributes": _json_attributes(pt.attributes), "timeUnixNano": str(now_ns)}
                if md.metric.instrument == "counter":
                    d["startTimeUnixNano"] = str(md.start_ns or start_ns)
                if isinstance(pt.value, int):
                    d["asInt"] = str(pt.value)
                else:
                    d["asDouble"] = wire.json_double(pt.value)
                pts.append(d)
            if md.metric.instrument == "counter":
                m["sum"] = {"dataPoints": pts, "aggregationTemporality": md.temporality, "isMonotonic": True}
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
