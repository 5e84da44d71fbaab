"""Our direct OTLP encoders: the JSON form and the protobuf form carry exactly the same data."""

from __future__ import annotations

import base64
import json

from google.protobuf import json_format
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from otel_torchdist import names as n
from otel_torchdist import telemetry
from otel_torchdist.export import otlp

RESOURCE = {"service.name": "t", "torchdist.rank": 3, "torchdist.world_size": 8}


def _hex_ids_to_base64(node):
    """OTLP/JSON writes ids as hex; protobuf's JSON parser wants base64 for bytes fields."""
    if isinstance(node, dict):
        return {
            k: base64.b64encode(bytes.fromhex(v)).decode()
            if k in ("traceId", "spanId", "parentSpanId") and isinstance(v, str)
            else _hex_ids_to_base64(v)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_hex_ids_to_base64(x) for x in node]
    return node


SHARED = (("torchdist.group.size", 8), ("torchdist.group.ranks", (0, 1, 2)))
SPANS = [
    telemetry.SpanData(
        "all_reduce", 0xABC, 0x12, None, 10, 20,
        [("a", 1), ("neg", -3), ("b", 1.5), ("c", True), ("c2", False), ("d", "x \"q\" é"), ("e", [1, 2])],
        shared=(SHARED, (("op", "all_reduce"),)),
    ),
    telemetry.SpanData(
        "broadcast", (1 << 127) + 5, (1 << 63) + 7, 5, 30, 45, [("s", ["[2, 3]"])], error="RuntimeError: boom",
        events=[("exception", 44, [("exception.type", "RuntimeError"), ("exception.message", "boom")])],
    ),
    telemetry.SpanData("barrier", 3, 4, None, 50, 60, [], shared=(SHARED,), sampled=False),
    telemetry.SpanData("train.rank_step", 3, 6, 5, 50, 60, [], remote_parent=True),
]  # fmt: skip


def _reference(resource, spans):
    """The same request built with the official message classes: the oracle for the hand encoder."""
    from opentelemetry.proto.common.v1 import common_pb2

    def fill(av, v):
        if isinstance(v, bool):
            av.bool_value = v
        elif isinstance(v, int):
            av.int_value = v
        elif isinstance(v, float):
            av.double_value = v
        elif isinstance(v, (list, tuple)):
            for x in v:
                fill(av.array_value.values.add(), x)
        else:
            av.string_value = v

    def add(container, pairs):
        for k, v in pairs:
            kv = container.add(key=k)
            fill(kv.value, v)

    req = trace_service_pb2.ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    add(rs.resource.attributes, resource.items())
    ss = rs.scope_spans.add()
    ss.scope.name = "otel_torchdist"
    from otel_torchdist import __version__

    ss.scope.version = __version__
    for s in spans:
        p = ss.spans.add(
            trace_id=s.trace_id.to_bytes(16, "big"), span_id=s.span_id.to_bytes(8, "big"), name=s.name, kind=1,
            start_time_unix_nano=s.start_ns, end_time_unix_nano=s.end_ns, flags=(0x101 if s.sampled else 0x100) | (0x200 if s.remote_parent else 0),
        )  # fmt: skip
        if s.parent_span_id:
            p.parent_span_id = s.parent_span_id.to_bytes(8, "big")
        add(p.attributes, [pair for block in s.shared for pair in block] + list(s.attributes))
        for name, t, attrs in s.events:
            ev = p.events.add(name=name, time_unix_nano=t)
            add(ev.attributes, attrs)
        if s.error is not None:
            p.status.code = 2
            p.status.message = s.error
    assert isinstance(common_pb2.AnyValue(), common_pb2.AnyValue)
    return req


def test_span_protobuf_matches_the_official_message_classes():
    ours = trace_service_pb2.ExportTraceServiceRequest.FromString(otlp.spans_to_proto(RESOURCE, SPANS))
    assert ours == _reference(RESOURCE, SPANS)


def test_span_json_is_the_otlp_json_mapping_of_the_same_request():
    doc = json.loads(otlp.spans_to_json(RESOURCE, SPANS))
    first = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert first["traceId"] == f"{0xABC:032x}" and first["spanId"] == f"{0x12:016x}"
    assert {"key": "a", "value": {"intValue": "1"}} in first["attributes"]  # int64 as a string
    parsed = json_format.ParseDict(_hex_ids_to_base64(doc), trace_service_pb2.ExportTraceServiceRequest())
    assert parsed == _reference(RESOURCE, SPANS)


def test_metric_json_and_protobuf_agree():
    metrics = [
        telemetry.MetricData(
            n.COLLECTIVE_DURATION,
            [telemetry.HistogramPoint({"op": "all_reduce"}, 3, 0.5, [1, 2, 0], (0.1, 1.0), 0.05, 0.3, [(0.3, 99, 0xAB, 0xCD)])],
        ),
        telemetry.MetricData(n.COLLECTIVE_CALLS, [telemetry.NumberPoint({"op": "all_reduce"}, 3)]),
        telemetry.MetricData(n.Metric("g", "gauge", "1", "", ()), [telemetry.NumberPoint({}, 0.25)]),
    ]
    doc = json.loads(otlp.metrics_to_json(RESOURCE, metrics, 1, 2))
    parsed = json_format.ParseDict(_hex_ids_to_base64_exemplars(doc), metrics_service_pb2.ExportMetricsServiceRequest())
    assert parsed == _sdk_encoded(metrics)


def _sdk_encoded(metrics):
    """The same points as the SDK's OTLP metric exporters encode them (what export.standard sends)."""
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics

    from otel_torchdist.export.sdk_metrics import metrics_data

    return encode_metrics(metrics_data(RESOURCE, metrics, 1, 2))


def _hex_ids_to_base64_exemplars(doc):
    return _hex_ids_to_base64(doc)


def _strict(text: str):
    """json.loads that refuses NaN and Infinity literals, as every JSON parser outside Python does."""

    def refuse(literal):
        raise ValueError(f"not JSON: {literal}")

    return json.loads(text, parse_constant=refuse)


def test_metric_json_writes_nan_and_infinities_as_the_mapping_says():
    # a diverging run's loss gauge: a bare NaN made the whole export line (or request) invalid JSON
    nan, inf = float("nan"), float("inf")
    metrics = [
        telemetry.MetricData(n.Metric("loss", "gauge", "1", "", ()), [telemetry.NumberPoint({"k": "nan"}, nan), telemetry.NumberPoint({"k": "inf"}, -inf)]),
        telemetry.MetricData(
            n.COLLECTIVE_DURATION,
            [telemetry.HistogramPoint({"op": "all_reduce"}, 2, inf, [1, 1, 0], (0.1, 1.0), 0.05, inf, [(nan, 99, 0xAB, 0xCD)])],
        ),
    ]
    doc = _strict(otlp.metrics_to_json(RESOURCE, metrics, 1, 2))
    gauge, hist = doc["resourceMetrics"][0]["scopeMetrics"][0]["metrics"]
    assert [p["asDouble"] for p in gauge["gauge"]["dataPoints"]] == ["NaN", "-Infinity"]
    point = hist["histogram"]["dataPoints"][0]
    assert (point["sum"], point["max"], point["exemplars"][0]["asDouble"]) == ("Infinity", "Infinity", "NaN")
    parsed = json_format.ParseDict(_hex_ids_to_base64(doc), metrics_service_pb2.ExportMetricsServiceRequest())
    ours = _sdk_encoded(metrics)
    assert str(parsed) == str(ours)  # NaN != NaN, so compare the text forms


def test_span_json_writes_nan_attributes_as_strings():
    span = telemetry.SpanData("s", 1, 2, None, 1, 2, [("loss", float("nan")), ("big", float("inf"))])
    attrs = _strict(otlp.spans_to_json(RESOURCE, [span]))["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"]
    assert [a["value"]["doubleValue"] for a in attrs] == ["NaN", "Infinity"]


def test_equal_values_of_other_types_keep_their_own_encoding():
    """1, 1.0 and True are equal in Python, and so are tuples of them: no cache of encodings may hand one
    the other's (a block that is a plain tuple, an array value)."""
    from collections import namedtuple

    pair = namedtuple("pair", "a b")
    for x in (1, 1.0, True, 1, True):  # each after the others, so a shared cache entry would show
        span = telemetry.SpanData("s", 1, 2, None, 1, 2, [("v", (x, 2)), ("n", pair(x, 2)), ("w", x)], shared=((("a", x),),))
        expected = _reference(RESOURCE, [span])
        assert trace_service_pb2.ExportTraceServiceRequest.FromString(otlp.spans_to_proto(RESOURCE, [span])) == expected
        doc = json.loads(otlp.spans_to_json(RESOURCE, [span]))
        assert json_format.ParseDict(_hex_ids_to_base64(doc), trace_service_pb2.ExportTraceServiceRequest()) == expected


def test_a_request_built_in_one_join_is_the_nested_messages_bytes():
    """trace_request_pb computes the nested lengths first and joins once; trace_request_json_pieces joins to
    trace_request_json's text: the same bytes as building each message around the next."""
    from otel_torchdist.export import wire

    for count in (0, 1, 3, 700):  # 700 spans: lengths of three-byte varints
        spans = (SPANS * 200)[:count]
        fragments = [otlp.span_pb(s) for s in spans]
        scope_spans = wire.length_delimited(1, otlp._scope_body()) + b"".join(fragments)
        resource_msg = wire.length_delimited(1, wire.attributes_pb(1, list(RESOURCE.items())))
        nested = wire.length_delimited(1, resource_msg + wire.length_delimited(2, scope_spans))
        assert otlp.trace_request_pb(RESOURCE, fragments) == nested
        texts = [otlp.span_json(s) for s in spans]
        assert b"".join(otlp.trace_request_json_pieces(RESOURCE, texts)) == otlp.trace_request_json(RESOURCE, texts).encode()
