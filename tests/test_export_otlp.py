"""Spans and metrics leave real processes over OTLP and arrive at real receivers.

rotel (a Rust OTLP collector) receives rank 0 over gRPC and rank 1 over HTTP/protobuf, both gzip-compressed,
in the same job; oteltap (an OTLP/HTTP receiver) decodes the protobuf so the exact field values can be
asserted.
"""

from __future__ import annotations

import base64
import http.client
import http.server
import json
import logging
import threading
import time
import urllib.parse

import pytest

import otel_torchdist
from otel_torchdist import names as n

from .harness import library_log, run_ranks, wait_for
from .peers import OtelTap, Rotel


@pytest.fixture
def rotel(tmp_path):
    r = Rotel(str(tmp_path)).start()
    yield r
    r.stop()


@pytest.fixture
def tap():
    t = OtelTap().start()
    yield t
    t.stop()


def test_grpc_and_http_reach_a_real_collector(rotel, tmp_path):
    """Both gzip-compressed (HTTP bodies at sinks.GZIP_LEVEL, gRPC messages by grpc): the collector decodes
    them, or refuses them and the spans never arrive."""
    endpoints = [[rotel.grpc_endpoint, "grpc", "gzip"], [rotel.http_endpoint, "http/protobuf", "gzip"]]
    args = {"run_id": "otlp-rotel", "endpoints": endpoints}
    results = run_ranks("export_otlp", 2, str(tmp_path / "job"), args)
    assert all(r["flushed"] for r in results)

    def both_ranks():
        got = rotel.received()
        ids = {s["resource"].get(n.SERVICE_INSTANCE_ID) for s in got["spans"]}
        return got if ids >= {"otlp-rotel-rank0", "otlp-rotel-rank1"} else None

    got = wait_for(both_ranks, 20, what="spans of both ranks at rotel")
    for rank, transport in ((0, "grpc"), (1, "http")):
        spans = [
            s for s in got["spans"]
            if s["resource"][n.SERVICE_INSTANCE_ID] == f"otlp-rotel-rank{rank}" and n.COLL_OP in s["attributes"]
        ]  # fmt: skip
        names = sorted(s["Name"] for s in spans)  # as exported: with the rank
        assert names == sorted(f"{op} rank={rank}" for op in ["all_reduce"] * 4 + ["broadcast", "all_gather_into_tensor"]), transport
        res = spans[0]["resource"]
        assert res[n.SERVICE_NAME] == "otlp-test"
        assert res[n.RANK] == rank and res[n.WORLD_SIZE] == 2 and res[n.RUN_ID] == "otlp-rotel"
        big = [s for s in spans if s["attributes"].get(n.COLL_MESSAGE_SIZE) == 1024]
        assert len(big) == 3 and all(s["attributes"][n.COLL_KIND] == "all_reduce" for s in big)
        child = [s for s in spans if s["Parent ID"] == results[rank]["user_span_id"]]
        assert len(child) == 1
        assert child[0]["Trace ID"] == results[rank]["user_trace_id"]
        metric_names = {m.get("name") for m in got["metrics"] if m["resource"].get(n.RANK) == rank}
        assert {m.name for m in n.COLLECTIVE_METRICS + n.TELEMETRY_METRICS} <= metric_names, transport


def test_http_protobuf_fields_decoded_by_oteltap(tap, tmp_path):
    args = {"run_id": "otlp-tap", "endpoints": [[tap.endpoint, "http/protobuf"]] * 2}
    results = run_ranks("export_otlp", 2, str(tmp_path / "job"), args)
    def collectives():
        return [s for s in tap.spans if any(kv.key == n.COLL_OP for kv in s.attributes)]

    wait_for(lambda: len(collectives()) >= 12, 20, what="12 collective spans at oteltap")
    spans = collectives()
    assert len(spans) == 12
    # Inside the user's span a collective joins the user's trace; the others belong to the step's trace.
    user_traces = {r["user_trace_id"] for r in results}
    in_user = [s for s in spans if s.trace_id.hex() in user_traces]
    assert len(in_user) == 2 and all(s.parent_span_id.hex() in {r["user_span_id"] for r in results} for s in in_user)
    steps = {s.trace_id.hex() for s in spans if s.trace_id.hex() not in user_traces}
    assert len(steps) == 1  # both ranks: step 1 of the run, one trace id derived from the run id
    for span in spans:
        attrs = {kv.key: kv.value for kv in span.attributes}
        assert span.name in (f"{attrs[n.COLL_OP].string_value} rank={r}" for r in (0, 1))
        assert attrs[n.COLL_GROUP_SIZE].int_value == 2
        assert attrs[n.COLL_DURATION].double_value == pytest.approx(
            (span.end_time_unix_nano - span.start_time_unix_nano) / 1e9, abs=1e-6
        )
        assert span.kind == 1  # INTERNAL
        if n.span_base_name(span.name) == "all_gather_into_tensor":
            assert attrs[n.COLL_MESSAGE_SIZE].int_value == 16 * 4 * 2
            assert [v.string_value for v in attrs[n.COLL_SHAPES].array_value.values] == ["[32]"]

    wanted = {m.name for m in n.COLLECTIVE_METRICS + n.TELEMETRY_METRICS}
    wait_for(lambda: {m.name for m in tap.metrics} >= wanted, 20, what="metrics at oteltap")
    calls = [m for m in tap.metrics if m.name == n.COLLECTIVE_CALLS.name]
    values = {
        (dp.attributes[0].value.string_value, dp.attributes[2].value.string_value): dp.as_int
        for m in calls
        for dp in m.sum.data_points
    }
    assert values[("otlp-tap", "all_reduce")] == 4


def test_the_http_exporter_applies_the_environment_as_requests_would_read_once(monkeypatch, tmp_path):
    """Proxies (and NO_PROXY), the CA bundle variables and ~/.netrc apply as requests applies them to a
    request from a session that trusts the environment; they are read when the exporter is made instead of
    for every request. (The settings are compared with requests' own here; a later test sends through a
    real proxy.)"""
    import requests

    from otel_torchdist.config import Config
    from otel_torchdist.export.sinks import OtlpHttpSink

    netrc = tmp_path / "netrc"
    netrc.write_text("machine collector.example login user password secret\n")
    netrc.chmod(0o600)
    for var, value in {
        "NETRC": str(netrc),
        "HTTPS_PROXY": "http://proxy.example:3128",
        "HTTP_PROXY": "http://proxy.example:3128",
        "NO_PROXY": "localhost",
        "REQUESTS_CA_BUNDLE": str(tmp_path / "ca.pem"),
    }.items():
        monkeypatch.setenv(var, value)
    seen = []
    for endpoint in ("https://collector.example:4318", "http://localhost:4318"):
        sink = OtlpHttpSink(Config(endpoint=endpoint), "traces", "http/protobuf")
        expected = requests.Session().merge_environment_settings(sink.url, {}, None, True, None)
        assert (sink.proxies, sink.verify) == (expected["proxies"], expected["verify"])
        assert sink.auth == requests.utils.get_netrc_auth(sink.url)
        seen.append((sink.proxies, sink.auth))
    assert seen == [
        ({"https": "http://proxy.example:3128", "http": "http://proxy.example:3128", "no": "localhost"}, ("user", "secret")),
        ({}, None),  # NO_PROXY, and no netrc entry
    ]
    mine = str(tmp_path / "mine.pem")
    certified = OtlpHttpSink(Config(endpoint="https://collector.example:4318", certificate=mine), "traces", "http/protobuf")
    assert certified.verify == mine  # OTEL_EXPORTER_OTLP_CERTIFICATE wins over the variables


class _Relay(http.server.BaseHTTPRequestHandler):
    """A real HTTP proxy for plain-HTTP targets (a request line with the absolute URL, as proxies get them);
    with ``redirect_to`` set on its server, a collector that answers every POST with a 307 there (whose body
    is not the gzip its Content-Encoding says: clients skip a redirect's body); with ``cookie`` set, a
    collector behind a load balancer that answers 200 and sets that sticky-session cookie."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.seen.append({"line": self.requestline, "headers": dict(self.headers)})
        if self.server.redirect_to or self.server.cookie:
            reply = b"moved, not gzip" if self.server.redirect_to else b""
            self.send_response(307 if self.server.redirect_to else 200)
            if self.server.redirect_to:
                self.send_header("Location", self.server.redirect_to)
                self.send_header("Content-Encoding", "gzip")
            else:
                self.send_header("Set-Cookie", self.server.cookie + "; Path=/")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)
            return
        target = urllib.parse.urlsplit(self.path)
        forward = {k: v for k, v in self.headers.items() if k.lower() not in ("proxy-authorization", "proxy-connection")}
        conn = http.client.HTTPConnection(target.hostname, target.port, timeout=10)
        conn.request("POST", target.path, body=body, headers=forward)
        answer = conn.getresponse()
        reply = answer.read()
        self.send_response(answer.status)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def relay():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Relay)
    server.daemon_threads = True
    server.seen, server.redirect_to, server.cookie = [], None, None
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def receiver():
    from .test_faults_export import OtlpHttpReceiver

    rx = OtlpHttpReceiver()
    yield rx
    rx.stop()


def _only_http_proxy(monkeypatch, url: str) -> None:
    """HTTP_PROXY set to ``url``, with no NO_PROXY (nor a lower-case twin) to bypass it for 127.0.0.1."""
    monkeypatch.setenv("HTTP_PROXY", url)
    for var in ("NO_PROXY", "no_proxy", "http_proxy"):
        monkeypatch.delenv(var, raising=False)


def _export_empty_spans(endpoint: str, **options) -> bool:
    from otel_torchdist.config import Config
    from otel_torchdist.export.sinks import OtlpHttpSink

    sink = OtlpHttpSink(Config(endpoint=endpoint, **options), "traces", "http/protobuf")
    try:
        return sink.export_spans({"service.name": "relay-test"}, [], timeout=10)
    finally:
        sink.shutdown()


def test_the_http_exporter_goes_through_a_proxy_with_its_credentials_and_the_netrc_login(
    monkeypatch, tmp_path, relay, receiver
):
    """HTTP_PROXY (with a user in its URL) and ~/.netrc reach the wire as requests sends them: the proxy
    gets the absolute URL and Proxy-Authorization, the collector the Authorization of the netrc entry and
    the exporter's User-Agent."""
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login user password secret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    _only_http_proxy(monkeypatch, f"http://puser:ppass@127.0.0.1:{relay.server_address[1]}")
    assert _export_empty_spans(receiver.endpoint)
    (via,) = relay.seen
    assert via["line"] == f"POST {receiver.endpoint}/v1/traces HTTP/1.1"
    assert via["headers"]["Proxy-Authorization"] == "Basic " + base64.b64encode(b"puser:ppass").decode()
    (got,) = wait_for(lambda: receiver.requests, 5, what="the post at the collector")  # kept after it answers
    assert got["path"] == "/v1/traces"
    assert got["headers"]["Authorization"] == "Basic " + base64.b64encode(b"user:secret").decode()
    assert got["headers"]["User-Agent"] == f"otel-torchdist/{otel_torchdist.__version__}"
    assert "Proxy-Authorization" not in got["headers"]


def test_the_http_exporter_follows_a_redirect(relay, receiver):
    """A 307 from the endpoint is followed (the post is sent again, body and headers, where it points)."""
    relay.redirect_to = receiver.endpoint + "/v1/traces"
    assert _export_empty_spans(f"http://127.0.0.1:{relay.server_address[1]}", headers={"x-tenant": "a"})
    assert [s["line"] for s in relay.seen] == ["POST /v1/traces HTTP/1.1"]
    (got,) = wait_for(lambda: receiver.requests, 5, what="the post at the collector")
    assert got["path"] == "/v1/traces" and got["headers"]["x-tenant"] == "a"
    assert got["headers"]["Content-Type"] == "application/x-protobuf"


def test_the_http_exporter_sends_back_the_cookie_a_load_balancer_set(relay):
    """As a requests session does: a sticky-session cookie set on one post goes with the next."""
    from otel_torchdist.config import Config
    from otel_torchdist.export.sinks import OtlpHttpSink

    relay.cookie = "AWSALB=abc"
    sink = OtlpHttpSink(Config(endpoint=f"http://127.0.0.1:{relay.server_address[1]}"), "traces", "http/protobuf")
    try:
        for _ in range(3):
            assert sink.export_spans({"service.name": "cookie-test"}, [], timeout=10)
    finally:
        sink.shutdown()
    assert [s["headers"].get("Cookie") for s in relay.seen] == [None, "AWSALB=abc", "AWSALB=abc"]


def test_a_malformed_proxy_setting_fails_each_export_not_instrument(monkeypatch):
    """HTTP_PROXY=http://[::1 (a typo) is refused by requests: the exporter is still made, and each export
    fails, is logged once and counted, as with any failing backend."""
    from otel_torchdist.config import Config
    from otel_torchdist.export.sinks import OtlpHttpSink

    _only_http_proxy(monkeypatch, "http://[::1")
    sink = OtlpHttpSink(Config(endpoint="http://127.0.0.1:4318"), "traces", "http/protobuf")
    with library_log() as messages:
        assert not sink.export_spans({"service.name": "proxy-typo"}, [], timeout=2)
        assert not sink.export_spans({"service.name": "proxy-typo"}, [], timeout=2)
    sink.shutdown()
    failing = [m for m in messages if "is failing" in m]
    assert len(failing) == 1 and "Invalid" in failing[0], failing


def _sdk_span_export(endpoint: str, spans: list, resource: dict, **options) -> bool:
    """The same spans through the OpenTelemetry SDK's own OTLP/HTTP exporter: an SDK TracerProvider with
    that exporter, the spans started and ended by the library's TracerSink (the provider-side path)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from otel_torchdist.export.otel_spans import TracerSink

    exporter = OTLPSpanExporter(endpoint=endpoint + "/v1/traces", **options)
    provider = TracerProvider(resource=Resource(resource), shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    TracerSink(provider, "sdk", {}).export_span_fragments({}, spans)
    provider.shutdown()
    return True



def _spans_to_send() -> list:
    from otel_torchdist import names as n
    from otel_torchdist.telemetry import SpanData

    return [
        SpanData("all_reduce", 0xA1, 0xB1, 0xC1, 1_000, 5_000, [(n.COLL_OP, "all_reduce"), (n.COLL_MESSAGE_SIZE, 4096), (n.COLL_BUSBW, 1.5)],
                 shared=(((n.COLL_GROUP_RANKS, (0, 1)), (n.COLL_ASYNC, False)),)),
        SpanData(n.SPAN_RANK_STEP, 0xA1, 0xC1, 0xD1, 500, 9_000, [(n.STEP, 3)], remote_parent=True, links=((0xE1, 0xF1, ()),)),
        SpanData("broadcast", 0xA1, 0xB2, 0xC1, 6_000, 7_000, [], error="RuntimeError: boom",
                 events=[("exception", 7_000, [("exception.type", "RuntimeError"), ("exception.message", "boom")])]),
    ]  # fmt: skip


def _decoded(requests_seen: list) -> tuple[dict, list]:
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    resources, spans = [{}], []
    for req in [r for r in list(requests_seen) if r["path"].endswith("/v1/traces")]:
        for rs in ExportTraceServiceRequest.FromString(req["body"]).resource_spans:
            resources.append({a.key: MessageToDict(a.value) for a in rs.resource.attributes})
            for ss in rs.scope_spans:
                assert ss.scope.name == "otel_torchdist" and ss.scope.version == otel_torchdist.__version__
                for sp in ss.spans:
                    d = MessageToDict(sp)
                    d["attributes"] = sorted((a["key"], json.dumps(a["value"], sort_keys=True)) for a in d.get("attributes", []))
                    d.setdefault("status", {})  # an empty Status message or none: both UNSET
                    # Bits 8-9 (the parent is remote, and that this is known) must agree; the SDK's encoder
                    # leaves the W3C trace flags (bits 0-7) out, the library sends the sampled bit.
                    for item in [d] + d.get("links", []):
                        item["flags"] = item.get("flags", 0) & 0x300
                    spans.append(d)
    resources = resources[1:] or resources
    assert all(r == resources[0] for r in resources)
    return resources[0], sorted(spans, key=lambda d: d["spanId"])


def test_the_fast_exporter_sends_what_the_sdks_otlp_exporter_sends():
    """The library's own OTLP/HTTP exporter (pre-encoded spans, native encoders) against the SDK's
    OTLPSpanExporter, both to a real receiver, for the same spans: the same resource, spans, ids, times,
    attributes, events, status and links."""
    from .test_faults_export import OtlpHttpReceiver

    from otel_torchdist.config import Config
    from otel_torchdist.export.sinks import OtlpHttpSink

    resource = {"service.name": "same", "torchdist.rank": 0}
    ours, theirs = OtlpHttpReceiver(), OtlpHttpReceiver()
    try:
        sink = OtlpHttpSink(Config(endpoint=ours.endpoint), "traces", "http/protobuf")
        assert sink.export_spans(resource, _spans_to_send(), timeout=10)
        sink.shutdown()
        assert _sdk_span_export(theirs.endpoint, _spans_to_send(), resource)
        wait_for(lambda: len(_decoded(ours.requests)[1]) == len(_decoded(theirs.requests)[1]) == 3, 5, what="the spans at both")
        ours_resource, ours_spans = _decoded(ours.requests)
        theirs_resource, theirs_spans = _decoded(theirs.requests)
    finally:
        ours.stop()
        theirs.stop()
    assert ours_resource == {k: v for k, v in theirs_resource.items() if not k.startswith("telemetry.sdk.")}
    assert ours_spans == theirs_spans


@pytest.mark.parametrize(
    "answers,posts,ok",
    [
        ([(503, {"Retry-After": "0"})], 2, True),  # retryable: tried again, after the delay the server asked for
        ([(429, {"Retry-After": "0"}), (502, {"Retry-After": "0"})], 3, True),
        ([(400, {})], 1, False),  # not retryable: once
    ],
)
def test_the_fast_exporter_tries_again_when_the_sdks_exporter_does(answers, posts, ok):
    from .test_faults_export import OtlpHttpReceiver

    from otel_torchdist.config import Config
    from otel_torchdist.export.sinks import OtlpHttpSink

    ours, theirs = OtlpHttpReceiver(answers=answers), OtlpHttpReceiver(answers=answers)
    try:
        sink = OtlpHttpSink(Config(endpoint=ours.endpoint), "traces", "http/protobuf")
        assert sink.export_spans({"service.name": "retry"}, _spans_to_send()[:1], timeout=10) is ok
        sink.shutdown()
        _sdk_span_export(theirs.endpoint, _spans_to_send()[:1], {"service.name": "retry"})
        for rx in (ours, theirs):  # a request is kept after it is answered
            wait_for(lambda: len(rx.requests) == posts, 5, what=f"{posts} posts")
        time.sleep(0.2)
        assert len(ours.requests) == len(theirs.requests) == posts
    finally:
        ours.stop()
        theirs.stop()


def test_the_fast_exporter_gives_up_within_its_deadline_when_the_server_keeps_failing():
    """A collector answering 503 with a Retry-After longer than the time left: no second try, no wait."""
    from .test_faults_export import OtlpHttpReceiver

    from otel_torchdist.config import Config
    from otel_torchdist.export.sinks import OtlpHttpSink

    rx = OtlpHttpReceiver(answers=[(503, {"Retry-After": "30"})] * 6)
    try:
        sink = OtlpHttpSink(Config(endpoint=rx.endpoint), "traces", "http/protobuf")
        t0 = time.monotonic()
        assert not sink.export_spans({"service.name": "busy"}, [], timeout=2)
        assert time.monotonic() - t0 < 1.5
        wait_for(lambda: rx.requests, 5, what="the post at the collector")
        time.sleep(0.2)
        assert len(rx.requests) == 1
        sink.shutdown()
    finally:
        rx.stop()


@pytest.mark.parametrize("compression", ["gzip", "deflate"])
def test_the_fast_exporter_compresses_as_configured(compression):
    from .test_faults_export import OtlpHttpReceiver

    from otel_torchdist.config import Config
    from otel_torchdist.export.sinks import OtlpHttpSink

    rx = OtlpHttpReceiver()
    try:
        sink = OtlpHttpSink(Config(endpoint=rx.endpoint, compression=compression), "traces", "http/protobuf")
        assert sink.export_spans({"service.name": "z"}, _spans_to_send(), timeout=10)
        sink.shutdown()
        (got,) = wait_for(lambda: rx.requests, 5, what="the post at the collector")  # kept after it answers
        assert got["headers"]["Content-Encoding"] == compression and len(rx.spans()) == 3  # decoded by the receiver
    finally:
        rx.stop()


@pytest.mark.parametrize("form", ["%a, %d %b %Y %H:%M:%S GMT", "%A, %d-%b-%y %H:%M:%S GMT", "%a %b %d %H:%M:%S %Y", "%a, %d %b %Y %H:%M:%S -0000"])
def test_a_retry_after_date_is_gmt_whatever_the_local_zone(form, monkeypatch):
    """RFC 9110's three date forms (asctime's has no zone: it is GMT), read on a machine far from GMT."""
    from datetime import datetime, timedelta, timezone

    from otel_torchdist.export.retry import retry_after

    value = (datetime.now(timezone.utc) + timedelta(seconds=100)).strftime(form)
    monkeypatch.setenv("TZ", "America/Los_Angeles")
    time.tzset()
    try:
        assert 97 <= retry_after(value) <= 101
    finally:
        monkeypatch.undo()
        time.tzset()


def test_grpc_unavailable_with_a_retry_delay_is_tried_again_after_it():
    """A collector that is up but overloaded answers UNAVAILABLE with RetryInfo: tried again after the delay
    it asks for, as the SDK's gRPC exporter tries again (not taken for an unreachable one and given up)."""
    import grpc

    from otel_torchdist.config import Config
    from otel_torchdist.export.sinks import OtlpGrpcSink

    from .test_faults_export import OtlpGrpcReceiver

    rx = OtlpGrpcReceiver(answers=[(grpc.StatusCode.UNAVAILABLE, 0.4)] * 2)
    sink = OtlpGrpcSink(Config(endpoint=rx.endpoint), "traces")
    try:
        assert sink.export_spans({"service.name": "busy"}, [], timeout=10)
        times = [c.get("failed") for c in rx.calls]
        assert len(rx.calls) == 3 and times[2] is None
        assert times[1] - times[0] >= 0.35
    finally:
        sink.shutdown()
        rx.stop()


@pytest.mark.parametrize("transport", ["http/protobuf", "http/json", "grpc"])
def test_what_the_collector_rejects_in_a_partial_success_is_counted_and_said_once(transport, caplog):
    """OTLP's partial success (accepted, but some items refused, never sent again per the spec): the refused
    spans and data points count as dropped, and the collector's message is said once per destination."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    from otel_torchdist import health
    from otel_torchdist.config import Config
    from otel_torchdist.drain.metrics import MetricStore, collective_metrics
    from otel_torchdist.export.sinks import OtlpGrpcSink, OtlpHttpSink

    from .test_faults_export import OtlpGrpcReceiver, OtlpHttpReceiver

    if transport == "grpc":
        rx = OtlpGrpcReceiver(rejected=(3, "spans too old"))
    else:
        traces, metrics = ExportTraceServiceResponse(), ExportMetricsServiceResponse()
        traces.partial_success.rejected_spans = 3
        metrics.partial_success.rejected_data_points = 2
        for m in (traces, metrics):
            m.partial_success.error_message = "spans too old"
        if transport == "http/json":
            bodies = [json.dumps({"partialSuccess": {"rejectedSpans": "3", "errorMessage": "spans too old"}}).encode(),
                      json.dumps({"partialSuccess": {"rejectedDataPoints": "2", "errorMessage": "spans too old"}}).encode()]  # fmt: skip
        else:
            bodies = [traces.SerializeToString(), metrics.SerializeToString()]
        rx = OtlpHttpReceiver(answers=[(200, {}, body) for body in bodies for _ in range(2)])
    health.reset()
    cfg = Config(endpoint=rx.endpoint)
    spans_sink = OtlpGrpcSink(cfg, "traces") if transport == "grpc" else OtlpHttpSink(cfg, "traces", transport)
    store = MetricStore()
    store.observe("all_reduce", "default_pg", 0.001, 100, 100.0, False)
    try:
        with caplog.at_level(logging.WARNING, logger="otel_torchdist"):
            for _ in range(2):
                assert spans_sink.export_spans({"service.name": "p"}, [], timeout=5)
            if transport != "grpc":
                metrics_sink = OtlpHttpSink(cfg, "metrics", transport)
                for _ in range(2):
                    assert metrics_sink.export_metrics({"service.name": "p"}, collective_metrics(store.snapshot(), {}), 1, 2, timeout=5)
                metrics_sink.shutdown()
        drops = health.drops()
        assert drops.get("span") == 6
        if transport != "grpc":
            assert drops.get("metric_point") == 4
        said = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
        assert len(said) == (1 if transport == "grpc" else 2) and all("spans too old" in line for line in said), said
    finally:
        spans_sink.shutdown()
        rx.stop()
        health.reset()


def test_an_export_to_a_collector_that_answers_a_byte_at_a_time_ends_at_its_timeout(caplog):
    """requests' timeout bounds each read; the exporter's bounds the whole request, as the OTLP timeout means."""
    from otel_torchdist.config import Config
    from otel_torchdist.export.sinks import OtlpHttpSink

    from .test_faults_export import BlackHole

    drip = BlackHole(trickle=True)
    sink = OtlpHttpSink(Config(endpoint=drip.endpoint, timeout=1.0), "traces", "http/protobuf")
    try:
        with caplog.at_level(logging.WARNING, logger="otel_torchdist"):
            t0 = time.monotonic()
            assert not sink.export_spans({"service.name": "drip"}, [])
            assert time.monotonic() - t0 < 1.5
        assert any("kept the request open" in r.getMessage() for r in caplog.records), caplog.records
        assert len(drip.connections) == 1  # not tried again: the time was spent
    finally:
        sink.shutdown()
        drip.stop()
