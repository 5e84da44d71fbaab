"""The library's own exporters (no provider of the application's) apply what the standard variables ask of an
SDK: span limits, the metrics temporality preference, resource detectors, exporters installed for the SDK."""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

import otel_torchdist
from otel_torchdist import names as n

from .harness import read_spans, wait_for


def _collective_attributes(folder: str) -> list[dict]:
    return [s["attributes"] for s in read_spans(os.path.join(folder, "traces.rank0.jsonl")) if s["name"] == "all_reduce"]


def test_span_limits_cut_as_the_sdk_cuts(fake_pg, instrumented, monkeypatch):
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider

    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "3")
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "6")
    folder = instrumented(native="off")
    with otel_torchdist.step(1):
        dist.all_reduce(torch.ones(4))
    otel_torchdist.uninstrument()
    (ours,) = _collective_attributes(folder)
    assert len(ours) == 6
    # The SDK, given the same attributes in the same order and the same limits, keeps the same.
    from otel_torchdist.drain.spans import limited
    from otel_torchdist.telemetry import SpanData

    assert all(len(v) <= 3 for v in ours.values() if isinstance(v, str))
    tracer = TracerProvider(span_limits=SpanLimits(), shutdown_on_exit=False).get_tracer("t")
    span = SpanData("x", 1, 2, None, 0, 1, [("a", "abcdef"), ("b", 1), ("c", ("long", "longer")), ("d", 2.0)], ((("e", "xyzxyz"),),))
    with tracer.start_as_current_span("x", attributes=span.all_attributes()) as sdk_span:
        expected = dict(sdk_span.attributes)
    assert dict(limited(span, 3, 6).attributes) == expected


def test_events_and_links_take_the_global_value_limit_alone_as_in_the_sdk(monkeypatch):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Link, SpanContext

    from otel_torchdist import config
    from otel_torchdist.drain.spans import limited
    from otel_torchdist.telemetry import SpanData

    long = "x" * 40
    for env in ({"OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT": "10"}, {"OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT": "30", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "5"}):
        with monkeypatch.context() as mp:
            for k, v in env.items():
                mp.setenv(k, v)
            tracer = TracerProvider(shutdown_on_exit=False).get_tracer("t")
            link = Link(SpanContext(3, 4, True), {"l": long})
            with tracer.start_as_current_span("x", attributes={"a": long}, links=[link]) as sdk_span:
                sdk_span.add_event("e", {"m": long})
            expected = (len(sdk_span.attributes["a"]), len(sdk_span.events[0].attributes["m"]), len(sdk_span.links[0].attributes["l"]))
        cfg = config.load({}, environ=env)
        span = SpanData("x", 1, 2, None, 0, 1, [("a", long)], (), events=[("e", 1, [("m", long)])], links=((3, 4, (("l", long),)),))
        cut = limited(span, cfg.attribute_value_length_limit, cfg.attribute_count_limit, cfg.event_attribute_value_length_limit)
        assert (len(dict(cut.attributes)["a"]), len(cut.events[0][2][0][1]), len(cut.links[0][2][0][1])) == expected


def test_delta_temporality_sends_what_happened_since_the_last_export():
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    from otel_torchdist.config import Config
    from otel_torchdist.export.sinks import OtlpHttpSink
    from otel_torchdist.drain.metrics import MetricStore, collective_metrics

    from .test_faults_export import OtlpHttpReceiver

    rx = OtlpHttpReceiver()
    store = MetricStore()
    sink = OtlpHttpSink(Config(endpoint=rx.endpoint, metrics_temporality="delta"), "metrics", "http/protobuf")
    try:
        for i, calls in enumerate((3, 2)):
            for _ in range(calls):
                store.observe("all_reduce", "default_pg", 0.001, 100, 100.0, False)
            assert sink.export_metrics({"service.name": "d"}, collective_metrics(store.snapshot(), {}), 1_000, 2_000 + i)
        wait_for(lambda: len(rx.requests) == 2, 5, what="two exports")
    finally:
        sink.shutdown()
        rx.stop()
    exported = []
    for req in rx.requests:
        metrics = {m.name: MessageToDict(m) for rm in ExportMetricsServiceRequest.FromString(req["body"]).resource_metrics
                   for sm in rm.scope_metrics for m in sm.metrics}  # fmt: skip
        exported.append(metrics)
    calls = [m[n.COLLECTIVE_CALLS.name]["sum"] for m in exported]
    assert [c["dataPoints"][0]["asInt"] for c in calls] == ["3", "2"]
    assert all(c["aggregationTemporality"] == "AGGREGATION_TEMPORALITY_DELTA" for c in calls)
    durations = [m[n.COLLECTIVE_DURATION.name]["histogram"]["dataPoints"][0] for m in exported]
    assert [d["count"] for d in durations] == ["3", "2"]
    assert durations[1]["startTimeUnixNano"] == "2000"  # the second window starts where the first ended


def test_resource_detectors_the_sdk_is_told_to_run_describe_the_rank(fake_pg, instrumented, monkeypatch):
    monkeypatch.setenv("OTEL_EXPERIMENTAL_RESOURCE_DETECTORS", "process")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "team=ml")
    folder = instrumented()
    otel_torchdist.uninstrument()
    with open(os.path.join(folder, "resource.rank0.json")) as f:
        resource = json.load(f)
    assert resource["process.pid"] == os.getpid() and resource["team"] == "ml"
    assert resource[n.SERVICE_NAME] == "torch-distributed" and resource[n.RANK] == 0  # the library's own still set


def test_the_applications_resource_attributes_win_over_what_the_library_finds(fake_pg, instrumented, monkeypatch):
    """As OTEL_RESOURCE_ATTRIBUTES wins over the SDK's detectors (Resource.create() keeps them); the library's
    own torchdist.* attributes stay its own."""
    from opentelemetry.sdk.resources import Resource

    value = "service.instance.id=my-pod-7,host.name=k8s-node-3,torchdist.rank=9"
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", value)
    sdk = Resource.create().attributes
    folder = instrumented()
    otel_torchdist.uninstrument()
    with open(os.path.join(folder, "resource.rank0.json")) as f:
        resource = json.load(f)
    for key in ("service.instance.id", "host.name"):
        assert resource[key] == sdk[key]
    assert resource[n.RANK] == 0


def test_an_exporter_installed_for_the_sdk_gets_the_spans_and_metrics(fake_pg, instrumented, monkeypatch, tmp_path):
    """OTEL_TRACES_EXPORTER / OTEL_METRICS_EXPORTER naming an exporter installed under the SDK's entry-point
    groups (a vendor's): it is loaded as the SDK's configurator loads it and gets the telemetry through SDK
    providers the library makes. The exporter here is a real installed distribution (a .dist-info on the
    path), writing what it gets to a file."""
    site = tmp_path / "site"
    (site / "jsonl_exporter-1.0.dist-info").mkdir(parents=True)
    (site / "jsonl_exporter-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: jsonl-exporter\nVersion: 1.0\n")
    (site / "jsonl_exporter-1.0.dist-info" / "entry_points.txt").write_text(
        "[opentelemetry_traces_exporter]\njsonl = jsonl_exporter:Spans\n\n[opentelemetry_metrics_exporter]\njsonl = jsonl_exporter:Metrics\n"
    )
    out = tmp_path / "got.jsonl"
    (site / "jsonl_exporter.py").write_text(f'''
import json
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

class Spans(SpanExporter):
    def export(self, spans):
        with open({str(out)!r}, "a") as f:
            for s in spans:
                f.write(json.dumps({{"span": s.name, "service": s.resource.attributes["service.name"]}}) + "\\n")
        return SpanExportResult.SUCCESS

class Metrics(MetricExporter):
    def __init__(self):
        super().__init__()
    def export(self, data, timeout_millis=10000, **kw):
        with open({str(out)!r}, "a") as f:
            for rm in data.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        f.write(json.dumps({{"metric": m.name}}) + "\\n")
        return MetricExportResult.SUCCESS
    def force_flush(self, timeout_millis=10000):
        return True
    def shutdown(self, timeout_millis=30000, **kw):
        pass
''')
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "jsonl")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "jsonl")
    instrumented(traces_exporter=None, metrics_exporter=None)
    with otel_torchdist.step(1):
        dist.all_reduce(torch.ones(4))
    otel_torchdist.uninstrument()
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert {"span": "all_reduce rank=0", "service": "torch-distributed"} in got  # the rank in the name
    assert {"metric": n.COLLECTIVE_CALLS.name} in got
    sys.modules.pop("jsonl_exporter", None)


def test_no_span_of_the_library_comes_near_the_attribute_count_where_limits_are_applied(fake_pg, instrumented):
    """The span limits pass runs only for a count limit under outbox.SPAN_ATTRIBUTES_MAX: below any span's
    attribute count, it must cut nothing a span carries (collectives with every optional attribute, a step)."""
    from otel_torchdist.drain.outbox import SPAN_ATTRIBUTES_MAX

    folder = instrumented()
    with otel_torchdist.step(1):
        dist.all_reduce(torch.ones(4), async_op=True).wait()
        dist.broadcast(torch.ones(4), 0)
        dist.reduce_scatter_tensor(torch.empty(4), torch.ones(16))
        dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.ones(2), 1), dist.P2POp(dist.irecv, torch.empty(2), 1)])
        with dist._coalescing_manager():
            dist.all_reduce(torch.ones(2))
            dist.all_reduce(torch.ones(3))
    otel_torchdist.uninstrument()
    spans = read_spans(os.path.join(folder, "traces.rank0.jsonl"))
    widest = max(len(s["attributes"]) for s in spans)
    assert 15 < widest < SPAN_ATTRIBUTES_MAX // 2
