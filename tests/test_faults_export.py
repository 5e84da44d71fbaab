"""Export-side faults, injected with real processes and real receivers on loopback.

Each fault is one real 2-rank (or 3-rank) gloo job (tests/scenarios_faults_export.py), shared by the checks
on it through a module-scoped fixture:

* the OTLP backend is absent for the whole run (nothing listens; http/protobuf on rank 0, gRPC on rank 1);
* the backend (a real rotel collector) is killed mid-run and restarted on the same ports;
* the backend is a black hole (a TCP server that accepts and never answers) or slow (a real HTTP server
  that answers after a delay);
* tensors full of a planted value go through every collective kind, and every exported artifact is scanned
  for it; the /metrics socket is probed on every interface;
* OTLP over TLS and mTLS with auth headers, configured only through ``OTEL_EXPORTER_OTLP_*`` variables,
  against a real HTTPS server and a real gRPC server with TLS credentials, then with the wrong CA.

docs/reliability.md quotes what these runs log and names these tests.
"""

from __future__ import annotations

import base64
import datetime
import glob
import gzip
import http.server
import ipaddress
import json
import os
import re
import socket
import ssl
import struct
import subprocess
import sys
import textwrap
import threading
import time
import zlib
from concurrent import futures
from typing import Any

import psutil
import pytest

from otel_torchdist import names as n

from . import scenarios_faults_export as sc
from .harness import REPO, finish_ranks, free_port, last_metrics, launcher_log, library_log, start_ranks, wait_for
from .peers import _ANSI, Rotel, _rotel_value, parse_rotel

_FOREIGN_ENV = ("OTEL_", "TORCHELASTIC_", "SLURM_")


def _start(scenario: str, world_size: int, out: str, args: dict, env: dict | None = None) -> subprocess.Popen:
    """start_ranks with the test process's own OTEL_* settings (if any) kept away from the ranks."""
    with pytest.MonkeyPatch.context() as mp:
        for var in list(os.environ):
            if var.startswith(_FOREIGN_ENV):
                mp.delenv(var)
        return start_ranks(f"scenarios_faults_export:{scenario}", world_size, out, args, env)


def _exit_time(proc: subprocess.Popen, timeout: float = 180) -> float:
    """Wall-clock time (``time.time()``) at which the job's launcher exited, to within 20 ms."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the job did not finish in {timeout}s")
        time.sleep(0.02)
    return time.time()


def _warnings(out: str, rank: int) -> list[str]:
    return [line for line in launcher_log(out).splitlines() if line.startswith(f"[otel-torchdist rank={rank}] WARNING")]


def _summary(out: str, run_id: str, rank: int) -> dict:
    import json

    with open(os.path.join(out, "runs", run_id, f"summary.rank{rank}.json")) as f:
        return json.load(f)


def _prom_value(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name}{labels} in /metrics")


# ------------------------------------------------------------------------------------- real receivers
class BlackHole:
    """A TCP server that accepts every connection, reads what it is sent, and never answers; with ``trickle``,
    answers a byte every 0.2 s of a status line and a header that never end (never silent as long as a
    client's read timeout: only a deadline for the whole request ends it)."""

    def __init__(self, trickle: bool = False) -> None:
        self.trickle = trickle
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.connections: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            info = {"accepted": time.time(), "closed": None, "bytes": 0}
            self.connections.append(info)
            self._conns.append(conn)
            threading.Thread(target=self._swallow, args=(conn, info), daemon=True).start()

    def _swallow(self, conn: socket.socket, info: dict) -> None:
        try:
            while data := conn.recv(65536):
                if self.trickle and not info["bytes"]:
                    threading.Thread(target=self._drip, args=(conn,), daemon=True).start()
                info["bytes"] += len(data)
        except OSError:
            pass
        info["closed"] = time.time()

    def _drip(self, conn: socket.socket) -> None:
        answer = b"HTTP/1.1 200 OK\r\nX-Pad: "
        try:
            while not self._stop.is_set():
                conn.sendall(answer[:1] or b"a")
                answer = answer[1:]
                time.sleep(0.2)
        except OSError:
            pass

    def stop(self) -> None:
        self._stop.set()
        self.sock.close()
        for conn in self._conns:
            conn.close()


class _QuietServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that gave up (timeout, process exit) mid-request is part of these tests


class OtlpHttpReceiver:
    """A real OTLP/HTTP server (http.server): keeps every request (path, headers, raw body, client
    certificate), answers 200 after ``delay`` seconds; HTTPS when given an ``ssl`` server context. The first
    requests get the ``answers`` given instead, (status, headers) or (status, headers, body) each, in order."""

    def __init__(self, delay: float = 0.0, tls: ssl.SSLContext | None = None, answers: list | None = None) -> None:
        self.requests: list[dict[str, Any]] = []
        self.answers = list(answers or [])
        rx = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                elif self.headers.get("Content-Encoding") == "deflate":
                    body = zlib.decompress(body)
                peer = self.connection.getpeercert() if tls is not None else None
                item = {"path": self.path, "headers": dict(self.headers), "body": body, "peer": peer, "t": time.time()}
                time.sleep(delay)
                json_body = self.headers.get("Content-Type") == "application/json"
                reply = b"{}" if json_body else b""
                status, extra, *body_given = rx.answers.pop(0) if rx.answers else (200, {})
                if body_given:
                    reply = body_given[0]
                self.send_response(status)
                for key, value in extra.items():
                    self.send_header(key, value)
                self.send_header("Content-Type", self.headers.get("Content-Type", "application/x-protobuf"))
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)
                rx.requests.append(item)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.scheme = "https" if tls is not None else "http"
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def spans(self) -> list[Any]:
        """Every span of the protobuf trace requests, decoded with opentelemetry-proto."""
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        out = []
        for req in list(self.requests):
            if req["path"].endswith("/v1/traces") and req["headers"].get("Content-Type") == "application/x-protobuf":
                msg = ExportTraceServiceRequest.FromString(req["body"])
                out += [s for rs in msg.resource_spans for ss in rs.scope_spans for s in ss.spans]
        return out

    def metric_names(self) -> set[str]:
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

        names = set()
        for req in list(self.requests):
            if req["path"].endswith("/v1/metrics") and req["headers"].get("Content-Type") == "application/x-protobuf":
                msg = ExportMetricsServiceRequest.FromString(req["body"])
                names |= {m.name for rm in msg.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
        return names

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class OtlpGrpcReceiver:
    """A real OTLP/gRPC server (grpcio, opentelemetry-proto services) with TLS server credentials: keeps
    every request with its metadata and the client certificate's common name."""

    def __init__(self, credentials: Any = None, answers: list | None = None, rejected: tuple[int, str] | None = None) -> None:
        """``credentials`` None: plaintext. ``answers``: (status code, RetryInfo delay in seconds or None) the
        first calls fail with, in order; then every call succeeds, with a partial success of ``rejected``
        (count, message) when given."""
        import grpc
        from google.rpc.error_details_pb2 import RetryInfo
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as ms
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as ts

        self.calls: list[dict[str, Any]] = []
        self.answers = list(answers or [])
        self.credentials = credentials

        def handler(signal: str, response: Any):
            def export(request, context):
                if self.answers:
                    self.calls.append({"signal": signal, "failed": time.monotonic()})
                    code, delay = self.answers.pop(0)
                    if delay is not None:
                        info = RetryInfo()
                        info.retry_delay.FromNanoseconds(int(delay * 1e9))
                        context.set_trailing_metadata((("google.rpc.retryinfo-bin", info.SerializeToString()),))
                    context.abort(code, "scripted failure")
                auth = context.auth_context()
                self.calls.append(
                    {
                        "signal": signal,
                        "request": request,
                        "metadata": dict(context.invocation_metadata()),
                        "client_cn": [v.decode() for v in auth.get("x509_common_name", [])],
                    }
                )
                reply = response()
                if rejected is not None:
                    setattr(reply.partial_success, "rejected_spans" if signal == "traces" else "rejected_data_points", rejected[0])
                    reply.partial_success.error_message = rejected[1]
                return reply

            return export

        services = [
            ("opentelemetry.proto.collector.trace.v1.TraceService", "traces", ts.ExportTraceServiceRequest, ts.ExportTraceServiceResponse),
            ("opentelemetry.proto.collector.metrics.v1.MetricsService", "metrics", ms.ExportMetricsServiceRequest, ms.ExportMetricsServiceResponse),
        ]  # fmt: skip
        self.server = grpc.server(futures.ThreadPoolExecutor(4))
        for service, signal, request, response in services:
            method = grpc.unary_unary_rpc_method_handler(
                handler(signal, response),
                request_deserializer=request.FromString,
                response_serializer=response.SerializeToString,
            )
            self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, {"Export": method}),))
        if credentials is None:
            self.port = self.server.add_insecure_port("127.0.0.1:0")
        else:
            self.port = self.server.add_secure_port("127.0.0.1:0", credentials)
        self.server.start()

    @property
    def endpoint(self) -> str:
        return f"{'http' if self.credentials is None else 'https'}://127.0.0.1:{self.port}"

    def spans(self) -> list[Any]:
        return [
            s
            for c in list(self.calls)
            if c["signal"] == "traces" and "request" in c
            for rs in c["request"].resource_spans
            for ss in rs.scope_spans
            for s in ss.spans
        ]

    def stop(self) -> None:
        self.server.stop(0)


def _rotel_on(workdir: str, grpc_port: int, http_port: int, tag: str) -> Rotel:
    """A real rotel collector on the given ports (so a restarted one takes over from a killed one)."""
    rotel = Rotel(workdir)
    rotel.grpc_port, rotel.http_port = grpc_port, http_port
    rotel.out_path = os.path.join(workdir, f"rotel-{tag}.out")
    return rotel.start()


def _rotel_points(text: str) -> list[tuple[str, dict[str, Any], float]]:
    """(metric name, point attributes, value) of every number point in rotel's detailed dump."""
    points = []
    metric = None
    attrs: dict[str, Any] | None = None
    section = None
    for line in _ANSI.sub("", text).splitlines():
        s = line.strip()
        if s.startswith("Metric #"):
            metric, section = None, "descriptor"
        elif s.startswith("-> Name:") and section == "descriptor":
            metric = s.partition(":")[2].strip()
        elif s.startswith("NumberDataPoints #"):
            attrs, section = {}, "point"
        elif s == "Data point attributes:" and attrs is not None:
            section = "attributes"
        elif s.startswith("->") and section == "attributes":
            key, _, value = s[2:].strip().partition(": ")
            attrs[key] = _rotel_value(value)
        elif s.startswith("Value:") and attrs is not None and section in ("point", "attributes"):
            points.append((metric, attrs, float(s.partition(":")[2])))
            attrs, section = None, None
        elif s.startswith(("StartTimestamp", "Timestamp")) and section == "attributes":
            section = "point"
    return points


# ---------------------------------------------------------------------------------- 1. backend absent
ABSENT_ITERATIONS = 100


@pytest.fixture(scope="module")
def absent(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("absent"))
    http_port, grpc_port = free_port(), free_port()  # nothing listens on either
    args = {
        "run_id": "absent",
        "iterations": ABSENT_ITERATIONS,
        "endpoints": [[f"http://127.0.0.1:{http_port}", "http/protobuf"], [f"http://127.0.0.1:{grpc_port}", "grpc"]],
    }
    proc = _start("backend_absent", 2, out, args)
    exited = _exit_time(proc)
    results = finish_ranks(proc, out, 2)
    return {"out": out, "results": results, "exited": exited, "ports": [http_port, grpc_port]}


def test_absent_backend_training_completes_and_exits_promptly(absent):
    expected = sc.expected_checksum(2, ABSENT_ITERATIONS, 8)
    assert [r["checksum"] for r in absent["results"]] == [expected, expected]
    assert [r["flushed"] for r in absent["results"]] == [False, False]  # flush() says so, and returns
    last = max(r["t_last"] for r in absent["results"])
    # A collector that cannot be reached is given up at once (export/retry.py), so the end's flushes
    # (destroy_process_group(), exit), which share one flush_timeout, do not even use it up.
    assert absent["exited"] - last < 5.0, "each process must exit within 5 s of its last collective"
    for rank in range(2):
        done = float(open(os.path.join(absent["out"], f"exit.rank{rank}")).read())
        assert done - absent["results"][rank]["t_last"] < 2.0, f"rank {rank}"


def test_absent_backend_drops_are_counted(absent):
    for rank, result in enumerate(absent["results"]):
        drops = result["drops"]
        assert drops["span"] == ABSENT_ITERATIONS  # every span of the run, none silently lost
        assert drops["span_batch"] >= 3 and drops["metric_batch"] >= 3
        # The drop metric a dashboard watches says the same (read from the rank's own /metrics)...
        text = result["metrics_text"]
        assert _prom_value(text, "torchdist_telemetry_dropped_total", kind="span", rank=str(rank)) == drops["span"]
        assert _prom_value(text, "torchdist_telemetry_errors_total", kind="export", rank=str(rank)) >= 6
        # ...and so does the end-of-run summary, which also counts what the last flush at exit lost.
        summary = _summary(absent["out"], "absent", rank)
        assert summary["dropped"]["span"] >= ABSENT_ITERATIONS
        assert summary["dropped"]["metric_batch"] > drops["metric_batch"]


def test_absent_backend_failure_logged_once_per_destination(absent):
    for rank, port in enumerate(absent["ports"]):
        about = [w for w in _warnings(absent["out"], rank) if f"127.0.0.1:{port}" in w]
        assert len(about) == 2, about  # one line per signal, not one per failed batch (dozens failed)
        for signal in ("traces", "metrics"):
            (line,) = [w for w in about if f"exporting {signal} to" in w]
            assert "is failing" in line and "batches are dropped and counted" in line
            assert ("UNAVAILABLE" if rank == 1 else "Connection refused") in line
        (summary_line,) = [w for w in _warnings(absent["out"], rank) if "telemetry dropped on this rank" in w]
        assert re.search(r"\d+ span,", summary_line)


# ------------------------------------------------------------------------ 2. backend dies and returns
OUTAGE_ITERATIONS = 10


@pytest.fixture(scope="module")
def outage(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("outage"))
    first = _rotel_on(out, free_port(), free_port(), "first")
    second = None
    args = {
        "run_id": "outage",
        "iterations": OUTAGE_ITERATIONS,
        "endpoints": [[first.grpc_endpoint, "grpc"], [first.http_endpoint, "http/protobuf"]],
    }
    proc = _start("backend_outage", 2, out, args)
    try:
        phase = lambda name: all(os.path.exists(os.path.join(out, f"{name}.rank{r}")) for r in range(2))  # noqa: E731
        wait_for(lambda: phase("before") or proc.poll() is not None, 120, 0.05, what="phase 1 of both ranks")
        first.proc.kill()  # SIGKILL: the collector dies without a goodbye
        first.proc.wait(10)
        open(os.path.join(out, "killed"), "w").close()
        wait_for(lambda: phase("outage") or proc.poll() is not None, 120, 0.05, what="phase 2 of both ranks")
        second = _rotel_on(out, first.grpc_port, first.http_port, "second")
        open(os.path.join(out, "restarted"), "w").close()
        results = finish_ranks(proc, out, 2)
        time.sleep(0.3)  # rotel prints what it got as it gets it; let the last lines land
    finally:
        if proc.poll() is None:
            proc.kill()
        first.stop()
        if second is not None:
            second.stop()
    return {"out": out, "results": results, "first": first.received(), "second": second.received(),
            "second_text": open(second.out_path, errors="replace").read()}  # fmt: skip


def _phase_spans(received: dict, rank: int) -> dict[str, int]:
    sizes = {4 * numel: phase for phase, numel in sc.PHASE_SIZES.items()}
    counts = {phase: 0 for phase in sc.PHASE_SIZES}
    for span in received["spans"]:
        if span["resource"].get(n.RANK) == rank and span["attributes"].get(n.COLL_OP) == "all_reduce":
            phase = sizes.get(span["attributes"].get(n.COLL_MESSAGE_SIZE))
            if phase:
                counts[phase] += 1
    return counts


def test_outage_leaves_training_unaffected(outage):
    for result in outage["results"]:
        for phase, numel in sc.PHASE_SIZES.items():
            assert result["checksums"][phase] == sc.expected_checksum(2, OUTAGE_ITERATIONS, numel), phase
        assert result["flushed"] == [True, False, True]


def test_outage_export_resumes_after_restart(outage):
    for rank in range(2):  # rank 0 exports over gRPC, rank 1 over HTTP
        assert _phase_spans(outage["first"], rank) == {"before": OUTAGE_ITERATIONS, "outage": 0, "after": 0}
        # After the restart: every span made after it arrives; none of the outage's (they were dropped).
        assert _phase_spans(outage["second"], rank) == {"before": 0, "outage": 0, "after": OUTAGE_ITERATIONS}
        assert outage["results"][rank]["resumed_after_s"] < 30


def test_outage_drops_are_counted_and_metrics_lose_nothing(outage):
    points = _rotel_points(outage["second_text"])
    for rank, result in enumerate(outage["results"]):
        assert result["drops_outage"]["span"] >= OUTAGE_ITERATIONS
        # The restarted collector gets the drop count (cumulative), so the loss is visible downstream...
        dropped = [v for name, a, v in points if name == n.TELEMETRY_DROPPED.name and a.get(n.M_RANK) == str(rank) and a.get(n.M_KIND) == "span"]
        assert dropped and max(dropped) >= OUTAGE_ITERATIONS
        # ...and the metrics are cumulative: the calls made during the outage are all in the counts.
        calls = [v for name, a, v in points if name == n.COLLECTIVE_CALLS.name and a.get(n.M_RANK) == str(rank) and a.get(n.M_OP) == "all_reduce"]
        assert calls and max(calls) == 3 * OUTAGE_ITERATIONS


# ------------------------------------------------------------------ 3. black hole and slow receiver
STUCK = {"otlp_timeout": 30.0, "flush_timeout": 2.5, "span_queue_size": 256, "max_queued_records": 4096, "burst": 1500}
SLOW_DELAY = 1.0
STUCK_RANKS = 3  # rank 0: black hole over HTTP, rank 1: black hole over gRPC, rank 2: slow HTTP receiver


@pytest.fixture(scope="module")
def stuck(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("stuck"))
    holes = [BlackHole(), BlackHole()]
    slow = OtlpHttpReceiver(delay=SLOW_DELAY)
    endpoints = [
        [holes[0].endpoint + "/v1/traces", holes[0].endpoint + "/v1/metrics", "http/protobuf"],
        [holes[1].endpoint, holes[1].endpoint, "grpc"],
        [slow.endpoint + "/v1/traces", slow.endpoint + "/v1/metrics", "http/protobuf"],
    ]
    args = {
        **STUCK,
        "run_id": "stuck",
        "traces": [[traces, protocol] for traces, _, protocol in endpoints],
        "metrics": [[metrics, protocol] for _, metrics, protocol in endpoints],
    }
    proc = _start("backend_stuck", STUCK_RANKS, out, args)
    try:
        exited = _exit_time(proc)
        results = finish_ranks(proc, out, STUCK_RANKS)
    finally:
        for hole in holes:
            hole.stop()
        slow.stop()
    return {"out": out, "results": results, "exited": exited, "holes": holes, "slow": slow}


def test_stuck_export_does_not_block_training(stuck):
    for result in stuck["results"]:
        assert result["checksum"] == 6.0 * STUCK["burst"]  # 1 + 2 + 3, every time
        assert result["stuck_before"], "the burst must start while an export call is in flight"
    for rank, hole in enumerate(stuck["holes"]):
        # The black hole's first export call was still unanswered when the burst was over.
        assert stuck["results"][rank]["stuck_after"]
        first = hole.connections[0]
        assert first["bytes"] > 0  # connected and sent its request
        assert first["accepted"] < stuck["results"][rank]["t_last"]
        assert first["closed"] is None or first["closed"] > stuck["results"][rank]["t_last"]


def test_stuck_export_memory_is_bounded(stuck):
    for result in stuck["results"]:
        samples = result["samples"]
        assert len(samples) >= STUCK["burst"] // 100
        assert max(s[0] for s in samples) <= STUCK["span_queue_size"]
        assert max(s[1] for s in samples) <= STUCK["max_queued_records"]
        assert max(s[2] for s in samples) < 64 << 20  # RSS growth over the burst
        delivered = 64 * (result["burst_s"] / SLOW_DELAY + 2)  # at most a batch a second (slow rank)
        assert result["drops"]["span"] >= STUCK["burst"] - STUCK["span_queue_size"] - delivered


def test_stuck_export_exit_is_bounded_by_flush_timeout(stuck):
    last = max(r["t_last"] for r in stuck["results"])
    flushed = {rank: float(open(os.path.join(stuck["out"], f"exit.rank{rank}")).read()) for rank in (0, 1)}
    for rank, done in flushed.items():
        # A black-hole rank waits out its stuck call once (in destroy's flush), not again at exit.
        assert done - stuck["results"][rank]["t_last"] < STUCK["flush_timeout"] + 1.5
    # destroy_process_group() flushes, and so does process exit, within one flush_timeout between them, plus
    # the interpreter's own teardown. Unbounded, the black holes would hold the ranks for the OTLP timeout (30 s).
    after = {rank: round(done - last, 2) for rank, done in flushed.items()}
    assert stuck["exited"] - last < STUCK["flush_timeout"] + 3.0, f"exit flushes over {after} s after the last step"


@pytest.mark.parametrize("trickle", [False, True], ids=["silent", "a_byte_at_a_time"])
def test_the_end_of_a_job_waits_one_flush_timeout_for_a_collector_that_never_answers(trickle, tmp_path):
    """destroy_process_group() and exit each flush; against a black hole each of their posts would wait its
    whole time out (2 x flush_timeout a rank): they share one flush_timeout between them. A collector that
    answers a byte at a time, never silent for as long as a read timeout, holds a post past any per-read
    timeout: the end of the job still waits one flush_timeout at most."""
    hole = BlackHole(trickle=trickle)
    flush_timeout = 3.0
    try:
        out = str(tmp_path / "hole")
        proc = _start("ddp_black_hole", 2, out, {"endpoint": hole.endpoint, "flush_timeout": flush_timeout})
        results = finish_ranks(proc, out, 2, timeout=120)
    finally:
        hole.stop()
    for rank in range(2):
        done = float(open(os.path.join(out, f"exit.rank{rank}")).read())
        assert done - results[rank]["t_last"] < flush_timeout + 1.0, f"rank {rank} waited {done - results[rank]['t_last']:.1f} s"
        # The run's last metrics still reach the run folder, and the hole's share is counted: the span export,
        # stuck on the hole, took the whole flush, and the metrics went nowhere, uncounted.
        metrics = last_metrics(os.path.join(out, "runs", "ddp-hole", f"metrics.rank{rank}.jsonl"))
        assert sum(int(p["asInt"]) for p in metrics[n.COLLECTIVE_CALLS.name]) >= 3, metrics.get(n.COLLECTIVE_CALLS.name)
        assert _summary(out, "ddp-hole", rank)["dropped"].get("metric_batch", 0) >= 1
    assert hole.connections, "the ranks did try to export"


def test_stuck_export_every_span_delivered_or_counted(stuck):
    made = 20 + STUCK["burst"]  # collective spans; the run's step spans come on top
    received = [0, 0, len(stuck["slow"].spans())]
    for rank in range(STUCK_RANKS):
        dropped = _summary(stuck["out"], "stuck", rank)["dropped"]["span"]
        # Every span arrived or was counted as dropped: the queue overflow, the batches that timed out,
        # what was left at exit, and the batch still inside an export call when the process ended.
        got = received[rank] + dropped
        assert made <= got <= made + (64 if rank == 2 else 0) + 4, f"rank {rank}: {received[rank]} received, {dropped} dropped"
    assert received[2] > 0, "the slow receiver still got spans"


# ---------------------------------------------------------------------------------- 4a/4b. secrets
def _secret_forms() -> dict[str, bytes]:
    """SECRET as text and as bytes, and the results of summing it over 2 or 3 ranks."""
    forms: dict[str, bytes] = {}
    f32 = struct.unpack("<f", struct.pack("<f", sc.SECRET))[0]
    for k in (1, 2, 3):
        for value, label in ((sc.SECRET * k, "f64"), (f32 * k, "f32")):
            for text in (repr(value), f"{value:.4f}", f"{value:.6g}", f"{value:e}"):
                forms[f"text {text}"] = text.encode()
            for fmt in ("<d", ">d", "<f", ">f"):
                raw = struct.pack(fmt, value)
                forms[f"{label} {fmt} x{k}"] = raw
                forms[f"{label} {fmt} x{k} hex"] = raw.hex().encode()
                forms[f"{label} {fmt} x{k} base64"] = base64.b64encode(raw)[:-2]  # the alignment-free part
    forms["text 1234.56"] = b"1234.56"
    forms["text 1234,5678"] = b"1234,5678"
    return forms


def _scan(paths: list[str], blobs: dict[str, bytes]) -> list[str]:
    forms = {form: label for label, form in _secret_forms().items()}  # one label per distinct byte string
    found = []
    for path in paths:
        with open(path, "rb") as f:
            blobs[path] = f.read()
    for where, data in blobs.items():
        for form, label in forms.items():
            if form in data:
                found.append(f"{label} in {where}")
    return found


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("planted"))
    rotel = _rotel_on(out, free_port(), free_port(), "planted")
    rx = OtlpHttpReceiver()
    common = {"prometheus_port": 0}
    options = [
        # rank 0: the run folder (OTLP/JSON files) and /metrics on all interfaces (keyword over the env)
        {**common, "traces_exporter": "file", "metrics_exporter": ("file", "prometheus"), "prometheus_host": "0.0.0.0"},
        # rank 1: OTLP/HTTP protobuf traces and OTLP/HTTP JSON metrics, raw bodies kept; /metrics per the env
        {**common, "traces_exporter": "otlp", "metrics_exporter": ("otlp", "prometheus"),
         "traces_endpoint": rx.endpoint + "/v1/traces", "traces_protocol": "http/protobuf",
         "metrics_endpoint": rx.endpoint + "/v1/metrics", "metrics_protocol": "http/json"},
        # rank 2: OTLP/gRPC to the rotel collector; /metrics per the env
        {**common, "metrics_exporter": ("otlp", "prometheus"), "endpoint": rotel.grpc_endpoint, "protocol": "grpc"},
    ]  # fmt: skip
    proc = _start("planted_values", 3, out, {"run_id": "planted", "options": options},
                  env={"OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1"})  # fmt: skip
    listening = {}
    try:
        wait_for(
            lambda: all(os.path.exists(os.path.join(out, f"listening.rank{r}")) for r in range(3)) or proc.poll() is not None,
            120, 0.05, what="the ranks' /metrics endpoints",
        )  # fmt: skip
        for rank in range(3):
            pid, host, port = open(os.path.join(out, f"listening.rank{rank}")).read().split()
            listening[rank] = {"pid": int(pid), "host": host, "port": int(port), **_probe(int(pid), int(port))}
        open(os.path.join(out, "go"), "w").close()
        results = finish_ranks(proc, out, 3)
        wait_for(lambda: len(parse_rotel(open(rotel.out_path, errors="replace").read())["spans"]) > 20, 20,
                 what="rank 2's spans at rotel")  # fmt: skip
    finally:
        if proc.poll() is None:
            proc.kill()
        rotel.stop()
        rx.stop()
    return {"out": out, "results": results, "rotel": rotel.out_path, "rx": rx, "listening": listening}


def _other_addresses() -> list[str]:
    out = []
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not ipaddress.ip_address(a.address).is_loopback:
                out.append(a.address)
    return out


def _probe(pid: int, port: int) -> dict[str, Any]:
    """Where the /metrics socket of ``pid`` is bound, and whether each interface's address reaches it."""
    bound = [c.laddr.ip for c in psutil.Process(pid).net_connections("tcp") if c.status == "LISTEN" and c.laddr.port == port]
    reach = {}
    for address in ["127.0.0.1", *_other_addresses()]:
        with socket.socket() as s:
            s.settimeout(2)
            reach[address] = s.connect_ex((address, port)) == 0
    return {"bound": bound, "reach": reach}


def test_planted_tensor_values_are_never_exported(planted):
    out = planted["out"]
    assert all(r["flushed"] for r in planted["results"])
    files = [p for p in glob.glob(os.path.join(out, "runs", "**", "*"), recursive=True) if os.path.isfile(p)]
    scrapes = sorted(glob.glob(os.path.join(out, "scrape.rank*.txt")))
    blobs = {f"OTLP/HTTP {r['path']} body #{i}": r["body"] for i, r in enumerate(planted["rx"].requests)}
    found = _scan(files + scrapes + [planted["rotel"], os.path.join(out, "launcher.log")], blobs)
    assert found == []
    # The scan looked at real telemetry of those collectives, in every form it takes:
    contents = {p: open(p, "rb").read() for p in files + scrapes}
    assert b"all_to_all_single" in contents[os.path.join(out, "runs", "planted", "traces.rank0.jsonl")]
    assert b"broadcast_object_list" in contents[os.path.join(out, "runs", "planted", "traces.rank0.jsonl")]
    assert len(scrapes) == 3 and all(b"torchdist_collective_calls_total" in contents[p] for p in scrapes)
    assert len(planted["rx"].spans()) >= 25  # rank 1's protobuf spans
    assert any(b"resourceMetrics" in r["body"] for r in planted["rx"].requests)  # rank 1's JSON metrics
    rotel_spans = parse_rotel(open(planted["rotel"], errors="replace").read())["spans"]
    assert {n.span_base_name(s["Name"]) for s in rotel_spans} >= {"all_reduce", "scatter_object_list", "batch_isend_irecv"}
    # The planted value was really there: the test's own detector finds it in a pickled object.
    import pickle

    assert _scan([], {"control": pickle.dumps(sc.SECRET_OBJECT)})


def test_metrics_endpoint_binds_the_configured_address(planted):
    other = _other_addresses()
    everywhere, *local = (planted["listening"][r] for r in range(3))
    assert everywhere["bound"] == ["0.0.0.0"] and everywhere["reach"]["127.0.0.1"]
    for probe in local:  # OTEL_EXPORTER_PROMETHEUS_HOST=127.0.0.1
        assert probe["host"] == "127.0.0.1" and probe["bound"] == ["127.0.0.1"]
        assert probe["reach"]["127.0.0.1"]
    for address in other:
        assert everywhere["reach"][address], f"the 0.0.0.0 socket answers on {address} (the probe works)"
        assert not any(p["reach"][address] for p in local), f"a 127.0.0.1 /metrics answered on {address}"


def test_prometheus_host_default_is_documented_with_its_reason():
    from otel_torchdist import config

    assert config.Config().prometheus_host == "0.0.0.0"
    source = open(config.__file__).read()
    doc = source[source.index("    prometheus_host:") :].split('"""')[1]
    # The variable, why all interfaces is acceptable (no tensor contents), and how to keep it local.
    assert "OTEL_EXPORTER_PROMETHEUS_HOST" in doc and "tensor contents" in doc and "127.0.0.1" in doc


# ---------------------------------------------------------------------------------------- 4c. TLS
def _pki(folder: str) -> dict[str, str]:
    """A CA, a server certificate for 127.0.0.1/localhost, a client certificate, and an unrelated CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def cert(subject, key, issuer, issuer_key, ca: bool, extensions=()):
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        for ext in extensions:
            builder = builder.add_extension(ext, critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    paths: dict[str, str] = {}

    def write(label: str, obj) -> None:
        paths[label] = os.path.join(folder, label + ".pem")
        if isinstance(obj, x509.Certificate):
            data = obj.public_bytes(serialization.Encoding.PEM)
        else:
            data = obj.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        with open(paths[label], "wb") as f:
            f.write(data)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = cert(name("otel-torchdist test CA"), ca_key, name("otel-torchdist test CA"), ca_key, True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    san = x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    server = cert(name("127.0.0.1"), server_key, ca.subject, ca_key, False,
                  [san, x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH])])  # fmt: skip
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = cert(name("trainer-rank"), client_key, ca.subject, ca_key, False,
                  [x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH])])  # fmt: skip
    wrong_key = ec.generate_private_key(ec.SECP256R1())
    wrong = cert(name("some other CA"), wrong_key, name("some other CA"), wrong_key, True)
    for label, obj in (("ca", ca), ("server", server), ("server-key", server_key), ("client", client),
                       ("client-key", client_key), ("wrong-ca", wrong)):  # fmt: skip
        write(label, obj)
    return paths


TOKEN = "Bearer otd-7c1e-secret-token"  # must reach the receivers and nothing else


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    import grpc

    out = str(tmp_path_factory.mktemp("tls"))
    pki = _pki(str(tmp_path_factory.mktemp("pki")))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki["server"], pki["server-key"])
    context.verify_mode = ssl.CERT_REQUIRED  # mTLS: no client certificate, no connection
    context.load_verify_locations(pki["ca"])
    https = OtlpHttpReceiver(tls=context)
    read = lambda label: open(pki[label], "rb").read()  # noqa: E731
    creds = grpc.ssl_server_credentials([(read("server-key"), read("server"))], read("ca"), require_client_auth=True)
    grpcs = OtlpGrpcReceiver(creds)
    mtls = {
        "OTEL_EXPORTER_OTLP_CERTIFICATE": pki["ca"],
        "OTEL_EXPORTER_OTLP_CLIENT_KEY": pki["client-key"],
        "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": pki["client"],
        "OTEL_METRICS_EXPORTER": "otlp",
    }
    quoted = TOKEN.replace(" ", "%20")
    env = [
        # rank 0: the generic variables, OTLP/HTTP protobuf to https://
        {**mtls, "OTEL_EXPORTER_OTLP_ENDPOINT": https.endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
         "OTEL_EXPORTER_OTLP_HEADERS": f"authorization={quoted},x-tenant=team-a"},
        # rank 1: the per-signal variants: traces over gRPC, metrics over HTTP, each with its own headers
        {**mtls, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": grpcs.endpoint, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
         "OTEL_EXPORTER_OTLP_TRACES_HEADERS": f"authorization={quoted}",
         "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": https.endpoint + "/v1/metrics",
         "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_METRICS_HEADERS": "x-tenant=team-b"},
    ]  # fmt: skip
    wrong_env = [{**e, "OTEL_EXPORTER_OTLP_CERTIFICATE": pki["wrong-ca"]} for e in env]
    # requests' own CA variables, pointing elsewhere, must not override OTEL_EXPORTER_OTLP_CERTIFICATE.
    elsewhere = {"REQUESTS_CA_BUNDLE": pki["wrong-ca"], "CURL_CA_BUNDLE": pki["wrong-ca"]}
    proc = _start("tls_and_auth", 2, out, {"run_id": "tls", "env": env, "wrong_env": wrong_env}, env=elsewhere)
    try:
        results = finish_ranks(proc, out, 2)
    finally:
        if proc.poll() is None:
            proc.kill()
        https.stop()
        grpcs.stop()
    return {"out": out, "results": results, "https": https, "grpc": grpcs}


def test_tls_mtls_and_auth_headers_through_otel_variables(tls):
    https, grpcs = tls["https"], tls["grpc"]
    for result in tls["results"]:
        assert result["flushed"][0] is True
        assert result["checksums"] == [sc.expected_checksum(2, 5, 16)] * 2
    # rank 0 over HTTPS: spans and metrics, each request with the token and the client certificate
    rank0 = [r for r in https.requests if r["headers"].get("x-tenant") == "team-a"]
    assert {r["path"] for r in rank0} == {"/v1/traces", "/v1/metrics"}
    assert all(r["headers"]["authorization"] == TOKEN for r in rank0)
    assert all(dict(x[0] for x in r["peer"]["subject"])["commonName"] == "trainer-rank" for r in rank0)
    spans = [s for s in https.spans() if any(a.key == n.COLL_OP for a in s.attributes)]
    assert len(spans) >= 5
    # rank 1: traces over gRPC with the traces headers; metrics over HTTPS with the metrics headers only
    assert grpcs.spans() and all(c["signal"] == "traces" for c in grpcs.calls)
    assert all(c["metadata"]["authorization"] == TOKEN and c["client_cn"] == ["trainer-rank"] for c in grpcs.calls)
    assert sum(1 for s in grpcs.spans() if n.span_base_name(s.name) == "all_reduce") >= 5
    rank1 = [r for r in https.requests if r["headers"].get("x-tenant") == "team-b"]
    assert rank1 and {r["path"] for r in rank1} == {"/v1/metrics"}
    assert all("authorization" not in r["headers"] for r in rank1)
    assert n.COLLECTIVE_CALLS.name in https.metric_names()


def _run_ids(msg: Any) -> set[str]:
    """The run ids (resource attribute) of an OTLP trace or metrics export request."""
    resources = [r.resource for r in getattr(msg, "resource_spans", [])] + [r.resource for r in getattr(msg, "resource_metrics", [])]
    return {a.value.string_value for r in resources for a in r.attributes if a.key == n.RUN_ID}


def test_tls_wrong_ca_fails_cleanly(tls):
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    for rank, result in enumerate(tls["results"]):
        assert result["flushed"][1] is False  # and no exception: the job finished
        assert result["drops_wrong"].get("span", 0) >= 5
        assert result["drops_wrong"].get("metric_batch", 0) >= 1
        summary = _summary(tls["out"], "tls-wrong-ca", rank)
        assert summary["dropped"]["span"] >= 5
    lines = _warnings(tls["out"], 0) + _warnings(tls["out"], 1)
    failing = [w for w in lines if "is failing" in w]
    assert any("CERTIFICATE_VERIFY_FAILED" in w or "SSLError" in w for w in failing), failing
    assert any("UNAVAILABLE" in w for w in failing), failing
    # Nothing got through with the wrong CA: every request that arrived belongs to the first run.
    decode = {"/v1/traces": ExportTraceServiceRequest, "/v1/metrics": ExportMetricsServiceRequest}
    run_ids = set()
    for req in tls["https"].requests:
        run_ids |= _run_ids(decode[req["path"]].FromString(req["body"]))
    for call in tls["grpc"].calls:
        run_ids |= _run_ids(call["request"])
    assert run_ids == {"tls"}


def test_auth_token_never_written_to_run_folder_or_logs(tls):
    files = [p for p in glob.glob(os.path.join(tls["out"], "**", "*"), recursive=True) if os.path.isfile(p)]
    assert any(p.endswith("summary.rank0.json") for p in files)
    for path in files:
        data = open(path, "rb").read()
        assert b"otd-7c1e-secret-token" not in data, path
        assert b"otd-7c1e-secret-token".replace(b"-", b"%2D") not in data, path


def test_endpoint_password_is_masked_in_what_is_logged():
    from otel_torchdist import config
    from otel_torchdist.export import sinks

    cfg = config.load({"endpoint": "https://trainer:s3cr3t@collector.example:4318", "protocol": "http/protobuf"}, environ={})
    sink = sinks.OtlpHttpSink(cfg, "traces", "http/protobuf")
    assert "s3cr3t" not in sink.describe() and "trainer:***@collector.example:4318" in sink.describe()
    assert "s3cr3t" not in sink._failures.what
    cfg = config.load({"endpoint": "https://trainer:s3cr3t@collector.example:4317", "protocol": "grpc"}, environ={})
    grpc_sink = sinks.OtlpGrpcSink(cfg, "traces")
    assert grpc_sink.target == "collector.example:4317" and "s3cr3t" not in grpc_sink.describe()
    grpc_sink.shutdown()


# -------------------------------------------------------------------------------------- 4d. deploy
def test_deploy_stack_has_no_secret_to_edit_and_says_how_to_set_one():
    from . import scenarios_deploy as sd

    compose_path = os.path.join(sd.DEPLOY, "docker-compose.yml")
    services = sd.load_yaml(compose_path)["services"]
    secret = re.compile(r"PASSWORD|SECRET|TOKEN|API_KEY|CREDENTIAL", re.I)
    for name, service in services.items():
        env = service.get("environment") or {}
        items = env.items() if isinstance(env, dict) else (e.partition("=")[::2] for e in env)
        for key, value in items:
            if secret.search(key):
                # Never a literal in the file: always a variable the user sets (deploy/.env), with a default.
                assert re.fullmatch(r"\$\{\w+:-[^}]*\}", str(value)), f"{name}: {key} is hard-coded"
    # The default credentials are only safe because nothing is published beyond this machine by default.
    for port in services["grafana"]["ports"]:
        assert port.startswith("${TORCHDIST_UI_BIND:-127.0.0.1}")
    readme = open(os.path.join(sd.DEPLOY, "README.md")).read()
    security = readme[readme.index("## Security") :]
    assert "GF_ADMIN_PASSWORD" in security and "deploy/.env" in security and "openssl rand" in security


def _spans_per_line(path) -> list[int]:
    """Spans in each line of a traces file, every line parsed (a torn one fails)."""
    return [len(json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"]) for line in open(path)]


def test_a_full_disk_leaves_whole_lines_and_the_last_good_summary(tmp_path):
    """A full disk stops a write part-way (here a real file-size limit, RLIMIT_FSIZE, does: the kernel's
    EFBIG where a disk gives ENOSPC). The run folder's files keep whole lines and whole documents."""
    script = textwrap.dedent(
        f"""
        import json, os, resource, signal
        from otel_torchdist.export.sinks import FileSink
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the kernel's signal for EFBIG: errno instead
        folder = {str(tmp_path)!r}
        sink = FileSink(folder, 0, traces=True, metrics=False)
        batches, limited = (FileSink(os.path.join(folder, x), 0, traces=True, metrics=False) for x in ("batches", "limited"))
        os.makedirs(batches.folder)
        os.makedirs(limited.folder)
        span = json.dumps({{"pad": "z" * 20}})
        # a batch is written as pieces, a thousand to a vectored write: 1500 spans, one line
        ok = [batches.export_span_fragments({{"service.name": "t"}}, [span] * 1500)]
        resource.setrlimit(resource.RLIMIT_FSIZE, (2500, 2500))
        ok += [sink._write(sink.traces_path, json.dumps({{"i": i, "pad": "x" * 900}})) for i in range(5)]
        # over the limit part-way through the pieces: cut back; then a batch that fits
        ok += [limited.export_span_fragments({{"service.name": "t"}}, [span] * n) for n in (150, 3)]
        for s in (sink, batches, limited):
            s.shutdown()
        from otel_torchdist.runtime.outlets import write_json
        write_json(folder, "summary.rank0.json", {{"a": 1}})
        write_json(folder, "summary.rank0.json", {{"big": "y" * 5000}})  # cannot fit: the first stays
        print(json.dumps(ok), flush=True)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [True, True, True, False, False, False, False, True]
    lines = open(tmp_path / "traces.rank0.jsonl").read().splitlines()
    assert [json.loads(line)["i"] for line in lines] == [0, 1]  # the third was cut back, not left torn
    for folder, sizes in (("batches", [1500]), ("limited", [3])):
        assert _spans_per_line(tmp_path / folder / "traces.rank0.jsonl") == sizes
    assert json.load(open(tmp_path / "summary.rank0.json")) == {"a": 1}
    assert not os.path.exists(tmp_path / "summary.rank0.json.tmp")


def test_an_exception_between_a_batchs_writes_leaves_no_torn_line(tmp_path, monkeypatch):
    """A batch of 512 spans takes two vectored writes. An exception raised between them (a signal handler's
    KeyboardInterrupt while the main thread flushes; simulated, since a signal cannot be aimed between two
    system calls: os.writev raises on its second call) leaves no part-written line for the next to join."""
    from otel_torchdist.export import sinks

    sink = sinks.FileSink(str(tmp_path), 0, traces=True, metrics=False)
    span = json.dumps({"pad": "z" * 20})
    assert sink.export_span_fragments({"service.name": "t"}, [span] * 3)
    real, calls = os.writev, []

    def interrupted(fd, chunk):
        calls.append(len(chunk))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(fd, chunk)

    monkeypatch.setattr(os, "writev", interrupted)
    with pytest.raises(KeyboardInterrupt):
        sink.export_span_fragments({"service.name": "t"}, [span] * 512)
    monkeypatch.undo()
    assert calls == [1024, 1] and sink.export_span_fragments({"service.name": "t"}, [span] * 2)
    sink.shutdown()
    assert _spans_per_line(tmp_path / "traces.rank0.jsonl") == [3, 2]


def test_a_batch_is_one_line_where_there_are_no_vectored_writes(tmp_path, monkeypatch):
    """Where os.writev does not exist (Windows; removed here to stand for it), a batch is joined and written
    whole, short writes completed as before."""
    from otel_torchdist.export import sinks

    monkeypatch.delattr(os, "writev")
    sink = sinks.FileSink(str(tmp_path), 0, traces=True, metrics=False)
    span = json.dumps({"pad": "z" * 20})
    assert sink.export_span_fragments({"service.name": "t"}, [span] * 1500)
    assert sink.export_span_fragments({"service.name": "t"}, [span] * 2)
    sink.shutdown()
    assert _spans_per_line(tmp_path / "traces.rank0.jsonl") == [1500, 2]


def test_run_folder_files_rotate_at_file_max_bytes_and_count_the_spans_they_drop(fake_pg, instrumented):
    """A long run fills no disk: each JSON-lines file is rotated at ``file_max_bytes`` (one older copy
    kept), whatever is deleted is counted, and the reader takes both copies in time order."""
    import torch
    import torch.distributed as dist

    import otel_torchdist
    from otel_torchdist import health
    from otel_torchdist.analysis.loader import discover, iter_records
    from otel_torchdist.analysis.records import Collective, MetricSnapshot

    from .harness import collective_spans, read_metric_lines, read_spans

    health.reset()
    cap = 40_000
    with library_log() as lines:
        folder = instrumented(file_max_bytes=cap, span_batch_size=10, max_spans_per_step=0)
        calls = 400
        for i in range(calls):
            dist.all_reduce(torch.ones(8))
            if i % 20 == 19:
                otel_torchdist.flush()  # a span line and a metric line every 20 calls
        otel_torchdist.uninstrument()

    current, older = (os.path.join(folder, f"traces.rank0{x}.jsonl") for x in ("", ".1"))
    for path in (current, older, os.path.join(folder, "metrics.rank0.jsonl"), os.path.join(folder, "metrics.rank0.1.jsonl")):
        assert 0 < os.path.getsize(path) <= cap, path
    kept_older, kept = collective_spans(read_spans(older)), collective_spans(read_spans(current))
    seqs = [[s["attributes"][n.COLL_SEQ] for s in spans] for spans in (kept_older, kept)]
    assert max(seqs[0]) < min(seqs[1])  # the newest spans are in the current file
    rotated_out = health.drops().get("span_file_rotated", 0)
    assert rotated_out > 0 and len(kept_older) + len(kept) + rotated_out == calls  # none lost uncounted
    assert min(seqs[0]) == rotated_out + 1  # exactly the oldest ones went
    assert sum("(file_max_bytes)" in x for x in lines) == 1, "the first rotation is logged, the later ones only counted"
    assert not any("span_file_rotated" in x for x in lines if "to protect training" in x)  # a limit set, not a loss

    # Both copies are read, the older first: the metric snapshots come in time order, every span once.
    records = list(iter_records(discover(folder), []))
    assert sum(isinstance(r, Collective) for r in records) == len(kept_older) + len(kept)
    times = [r.time_ns for r in records if isinstance(r, MetricSnapshot)]
    lines = read_metric_lines(os.path.join(folder, "metrics.rank0.1.jsonl")) + read_metric_lines(
        os.path.join(folder, "metrics.rank0.jsonl")
    )
    assert len(times) == len(lines) > 2 and times == sorted(times)
    last = lines[-1]["resourceMetrics"][0]["scopeMetrics"]
    calls_metric = [m for sm in last for m in sm["metrics"] if m["name"] == n.COLLECTIVE_CALLS.name]
    assert sum(int(p["asInt"]) for p in calls_metric[0]["sum"]["dataPoints"]) == calls  # metrics lose nothing
    # and the analysis says what was dropped, and which of its tables that thins
    from otel_torchdist.analysis import analyze_path

    notes = analyze_path(folder).run.notes
    assert not [x for x in notes if x.startswith("telemetry dropped")]
    (note,) = [x for x in notes if "size limit" in x]
    assert note.startswith(f"{rotated_out} spans deleted by the run folder's size limit (file_max_bytes) on rank 0"), note

    # An elastic restart appends to the same files: what an earlier process wrote is counted when deleted too.
    # Each process also ends with its step's spans (train.step, train.rank_step), spans like any other here.
    others = len(read_spans(older)) + len(read_spans(current)) - len(kept_older) - len(kept)
    assert others == 2
    instrumented(file_max_bytes=cap, span_batch_size=10, max_spans_per_step=0)
    for i in range(200):
        dist.all_reduce(torch.ones(8))
        if i % 20 == 19:
            otel_torchdist.flush()
    otel_torchdist.uninstrument()
    rotated_out = health.drops()["span_file_rotated"]
    assert len(read_spans(older)) + len(read_spans(current)) + rotated_out == calls + 200 + 2 * others
    kept_older = collective_spans(read_spans(older))
    assert rotated_out > min(s["attributes"][n.COLL_SEQ] for s in kept_older) - 1  # the first process's steps went too


def test_a_file_that_cannot_be_rotated_keeps_every_line(tmp_path):
    """The rename fails (here the rotated copy's name is taken by a folder): the file grows past the
    limit rather than losing what comes next, and says so once."""
    from otel_torchdist import health
    from otel_torchdist.export.sinks import FileSink

    health.reset()
    os.mkdir(tmp_path / "traces.rank0.1.jsonl")
    sink = FileSink(str(tmp_path), 0, traces=True, metrics=False, max_bytes=2000)
    with library_log() as logged:
        ok = [sink._write(sink.traces_path, json.dumps({"i": i, "pad": "x" * 400})) for i in range(20)]
    sink.shutdown()
    assert all(ok)
    lines = open(tmp_path / "traces.rank0.jsonl").read().splitlines()
    assert [json.loads(line)["i"] for line in lines] == list(range(20))
    assert sum("could not rotate" in x for x in logged) == 1
    assert health.errors().get("export") == 1


def test_a_failing_run_folder_file_is_said_once_while_the_other_file_still_writes(tmp_path, caplog):
    """The traces file failing (a file size limit, a read-only remount) while the smaller metrics file still
    wrote: the one failure log of the folder said "failing" and "recovered" at every batch."""
    import logging

    from otel_torchdist.drain.metrics import MetricStore, collective_metrics
    from otel_torchdist.export.sinks import FileSink

    sink = FileSink(str(tmp_path), 0, traces=True, metrics=True)
    os.mkdir(sink.traces_path)  # every open of the traces file fails
    store = MetricStore()
    store.observe("all_reduce", "default_pg", 0.001, 16, 16.0, False)
    with caplog.at_level(logging.WARNING, logger="otel_torchdist"):
        for i in range(3):
            assert not sink.export_span_fragments({"service.name": "f"}, [])
            assert sink.export_metrics({"service.name": "f"}, collective_metrics(store.snapshot(), {}), 1, 2 + i)
    said = [r.getMessage() for r in caplog.records]
    assert len([m for m in said if "is failing" in m]) == 1 and sink.traces_path in said[0], said
    assert not [m for m in said if "recovered" in m], said


def test_a_signal_handlers_flush_inside_a_flush_of_the_same_thread_does_not_wait_on_itself(tmp_path):
    """A SIGTERM handler's flush (a program's handler chained) while the same thread writes the run folder's
    metrics: the final snapshot's way around a stuck export took the file's lock this thread held, for ever.
    In a subprocess, so that a hang is a timeout, not a stuck suite."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        f"""
        import os, signal, threading
        from otel_torchdist.config import load
        from otel_torchdist.drain.outbox import Outbox
        from otel_torchdist.export import sinks
        box = Outbox(load({{}}, {{}}), threading.Lock(), lambda: [])
        box.resource = {{"service.name": "x"}}
        box.metric_sinks = [sinks.FileSink({str(tmp_path)!r}, 0, traces=True, metrics=True)]
        write, fired = sinks._append_whole, []
        def append(fd, pieces):
            if not fired:  # the signal lands while this thread writes the metrics file
                fired.append(1)
                os.kill(os.getpid(), signal.SIGUSR1)
            return write(fd, pieces)
        sinks._append_whole = append
        from otel_torchdist.export import otlp
        from otel_torchdist.telemetry import SpanData
        box.set_destination(box.resource, box.metric_sinks, box.metric_sinks, otlp.SPAN_ENCODERS)
        box.enqueue(SpanData("all_reduce", 1, 2, None, 10, 20, []))
        def flush(*_):  # what Pipeline.flush does: the metrics, then the spans (to the other file)
            print("inner", box.export_metrics(0.2, final=True), box.export_spans(time.monotonic() + 0.2), flush=True)
        signal.signal(signal.SIGUSR1, flush)
        print("outer", box.export_metrics(1.0), flush=True)
        """
    )
    done = subprocess.run([sys.executable, "-c", "import time" + script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["inner", "False", "True", "outer", "True"], done.stdout
    assert os.path.getsize(tmp_path / "traces.rank0.jsonl") > 0  # the span went to its own file
