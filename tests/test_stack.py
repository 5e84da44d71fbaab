"""The real stack, end to end: the OpenTelemetry Collector (deploy/otel-collector/config.yaml) and Jaeger v2
(its own all-in-one configuration), built from the Go module proxy by deploy/from-source/build-stack.sh and run on
loopback, receive the demo's 2-rank training (DDP, FSDP2, tensor parallel) over OTLP/HTTP and over
OTLP/gRPC; the traces are read back through Jaeger's query API. Skipped, with the reason, only on a machine
without Go."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time
import urllib.parse

import pytest

from otel_torchdist import names as n

from . import stack
from .harness import REPO, trace_layout_problems

QUERY = stack.QUERY
RUNS = {"stack-http": "http/protobuf", "stack-grpc": "grpc"}


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    try:
        stack.build("otelcol")
        stack.build("jaeger")
    except stack.NoGo as exc:
        pytest.skip(str(exc))
    folder = str(tmp_path_factory.mktemp("stack"))
    running = stack.Stack(folder)
    try:
        for service, protocol in RUNS.items():
            endpoint = running.endpoint(protocol)
            env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TORCHELASTIC_", "SLURM_"))}
            env.update(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_EXPORTER_OTLP_PROTOCOL=protocol, OTEL_SERVICE_NAME=service,
                       OTEL_EXPORTER_PROMETHEUS_PORT="0", PYTHONPATH=REPO)  # fmt: skip
            demo = subprocess.run(
                [sys.executable, "-m", "otel_torchdist.cli", "demo", "--steps", "3", "--run-dir", os.path.join(folder, service)],
                cwd=folder, env=env, capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            assert demo.returncode == 0, demo.stderr[-3000:]
        found = {}
        deadline = time.monotonic() + 60
        for service in RUNS:
            while True:
                query = urllib.parse.urlencode({"service": service, "limit": 1000, "lookback": "1h"})
                data = stack.get_json(f"{QUERY}/api/traces?{query}")["data"]
                roots = [t for t in data if any(s["operationName"] == n.SPAN_STEP for s in t["spans"])]
                if len(roots) >= 9 or time.monotonic() > deadline:  # 3 models x 3 steps, traced by default
                    found[service] = data
                    break
                time.sleep(1)
        yield {"traces": found, "stack": running, "folder": folder}
    finally:
        running.stop()


def test_jaeger_lists_each_run_as_a_service(traces):
    services = stack.get_json(f"{QUERY}/api/services")["data"]
    assert set(RUNS) <= set(services)


@pytest.mark.parametrize("service", list(RUNS))
def test_each_traced_step_is_one_trace_with_every_ranks_spans_and_reads_right(traces, service):
    data = traces["traces"][service]
    steps = [t for t in data if any(s["operationName"] == n.SPAN_STEP for s in t["spans"])]
    assert len(steps) >= 9, f"{len(steps)} step traces in Jaeger"
    for trace in steps:
        spans = stack.jaeger_spans(trace)
        ranks = {s["resource"].get(n.RANK) for s in spans if s["name"].startswith(n.SPAN_RANK_STEP)}
        assert ranks == {0, 1}, ranks
        # every row says its rank; the root is every rank's
        assert all(s["name"] == n.SPAN_STEP or s["name"].endswith(f" rank={s['resource'][n.RANK]}") for s in spans)
        assert trace_layout_problems(spans, slack_ns=2000) == []


def test_searching_by_tag_finds_the_right_spans(traces):
    for tags, check in (
        ({n.COLL_OP: "all_reduce"}, lambda s: s["attributes"].get(n.COLL_OP) == "all_reduce"),
        ({n.RANK: "1"}, lambda s: s["resource"].get(n.RANK) == 1),
        ({n.COLL_GROUP_LABEL: "default_pg"}, lambda s: s["attributes"].get(n.COLL_GROUP_LABEL) == "default_pg"),
    ):
        query = urllib.parse.urlencode({"service": "stack-grpc", "tags": json.dumps(tags), "limit": 50, "lookback": "1h"})
        data = stack.get_json(f"{QUERY}/api/traces?{query}")["data"]
        assert data, tags
        for trace in data:
            assert any(check(s) for s in stack.jaeger_spans(trace)), tags


def test_jaeger_shows_each_span_with_the_attributes_the_library_wrote(traces):
    """Every collective span in Jaeger carries exactly the attributes the same span has in the run folder's
    copy (the library's own encoding, which docs/opentelemetry.md documents); arrays arrive as JSON text."""
    from .harness import collective_spans, read_spans

    folder = os.path.join(traces["folder"], "stack-grpc")
    written = {}
    for path in glob.glob(os.path.join(folder, "*", "traces.rank*.jsonl")):
        written.update({s["spanId"]: s for s in collective_spans(read_spans(path))})
    shown = [s for trace in traces["traces"]["stack-grpc"] for s in stack.jaeger_spans(trace) if s["spanId"] in written]
    assert len(shown) > 100, len(shown)
    for span in shown:
        expected = written[span["spanId"]]["attributes"]
        got = {k: json.loads(v) if isinstance(v, str) and isinstance(expected.get(k), list) else v for k, v in span["attributes"].items()}
        assert {k: got.get(k) for k in expected} == expected, span["name"]


def test_a_burst_of_spans_reaches_jaeger_whole(traces):
    """6 000 spans of about 1.3 KB in three quick posts: the Collector's batches must stay under Jaeger's 4 MiB
    gRPC limit (send_batch_max_size), which refuses a bigger batch as a permanent error: every span of it lost.
    The spans come from the OpenTelemetry SDK's own OTLP exporter, as any application's would."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    running = traces["stack"]
    exporter = OTLPSpanExporter(endpoint=f"{running.endpoint('http/protobuf')}/v1/traces", timeout=30)
    provider = TracerProvider(resource=Resource({"service.name": "stack-burst"}))
    provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=10_000, max_export_batch_size=2000, schedule_delay_millis=600_000))
    tracer = provider.get_tracer("burst")
    attributes = {f"attribute.{i}": "x" * 40 for i in range(20)}
    for t in range(60):
        with tracer.start_as_current_span(f"root {t}", attributes=attributes):
            for i in range(99):
                tracer.start_span(f"child {i}", attributes=attributes).end()
    assert provider.force_flush(60_000)
    provider.shutdown()

    def spans_in_jaeger():
        query = urllib.parse.urlencode({"service": "stack-burst", "limit": 1000, "lookback": "1h"})
        return sum(len(t["spans"]) for t in stack.get_json(f"{QUERY}/api/traces?{query}")["data"])

    deadline = time.monotonic() + 30
    while (found := spans_in_jaeger()) < 6000 and time.monotonic() < deadline:
        time.sleep(1)
    failed = [line for line in running.collector_metrics().splitlines() if line.startswith("otelcol_exporter_send_failed_spans") and not line.endswith(" 0")]
    assert found == 6000 and not failed, (found, failed)
