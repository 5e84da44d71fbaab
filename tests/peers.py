"""Real peers the tests talk to: the rotel OTLP collector, the oteltap OTLP/HTTP receiver, Prometheus.

Nothing here is mocked. rotel is a real OTLP collector (gRPC and HTTP) shipped as a binary in its wheel;
its debug exporter prints what it received, which :func:`parse_rotel` reads back. oteltap is an
in-process OTLP/HTTP receiver that yields the decoded protobuf messages. Prometheus is Debian's
``prometheus`` binary, scraping over real HTTP.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from typing import Any

from .harness import free_port, wait_for

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


# ----------------------------------------------------------------------------------------------- rotel
def rotel_binary() -> str:
    import rotel

    return os.path.join(os.path.dirname(rotel.__file__), "rotel-agent")


class Rotel:
    """``rotel-agent`` on loopback ports, printing everything it receives."""

    def __init__(self, workdir: str) -> None:
        self.grpc_port = free_port()
        self.http_port = free_port()
        self.out_path = os.path.join(workdir, f"rotel-{self.grpc_port}.out")
        self.proc: subprocess.Popen | None = None

    @property
    def grpc_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"

    @property
    def http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def start(self) -> Rotel:
        out = open(self.out_path, "w")
        self.proc = subprocess.Popen(
            [
                rotel_binary(), "start",
                "--otlp-grpc-endpoint", f"127.0.0.1:{self.grpc_port}",
                "--otlp-http-endpoint", f"127.0.0.1:{self.http_port}",
                "--exporter", "blackhole",
                "--debug-log", "traces", "--debug-log", "metrics",
                "--debug-log-verbosity", "detailed",
                "--disable-batching",
            ],  # fmt: skip
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        wait_for(lambda: _port_open(self.grpc_port) and _port_open(self.http_port), 10, what="rotel ports")
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def received(self) -> dict[str, list[dict[str, Any]]]:
        with open(self.out_path, errors="replace") as f:
            return parse_rotel(f.read())


def _port_open(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _rotel_value(raw: str) -> Any:
    m = re.match(r"(\w+)\((.*)\)$", raw.strip())
    if not m:
        return raw.strip()
    kind, value = m.groups()
    if kind == "Int":
        return int(value)
    if kind == "Double":
        return float(value)
    if kind == "Bool":
        return value == "true"
    if kind == "Str":
        return value
    return raw.strip()


def parse_rotel(text: str) -> dict[str, list[dict[str, Any]]]:
    """Spans and metric names out of rotel's detailed debug dump."""
    spans: list[dict[str, Any]] = []
    metrics: list[dict[str, Any]] = []
    resource: dict[str, Any] = {}
    section = None
    current: dict[str, Any] | None = None
    for line in _ANSI.sub("", text).splitlines():
        stripped = line.strip()
        if stripped.startswith(("ResourceSpans #", "ResourceMetrics #")):
            resource = {}
            section = "resource"
            current = None
        elif stripped == "Resource attributes:":
            section = "resource"
        elif stripped.startswith("Span #"):
            current = {"resource": resource, "attributes": {}}
            spans.append(current)
            section = "span"
        elif stripped.startswith("Metric #"):
            current = {"resource": resource, "points": []}
            metrics.append(current)
            section = "metric"
        elif stripped == "Attributes:" and section == "span":
            section = "span-attrs"
        elif stripped.startswith("->") and ":" in stripped:
            key, _, value = stripped[2:].strip().partition(": ")
            if section == "resource":
                resource[key] = _rotel_value(value)
            elif section == "span-attrs" and current is not None:
                current["attributes"][key] = _rotel_value(value)
            elif section == "metric" and current is not None and key == "Name":
                current["name"] = value.strip()
        elif section in ("span", "span-attrs") and current is not None and ":" in stripped:
            key, _, value = stripped.partition(":")
            key = key.strip()
            if key in ("Trace ID", "Parent ID", "ID", "Name", "Kind"):
                current[key] = value.strip()
    return {"spans": spans, "metrics": metrics}


# ---------------------------------------------------------------------------------------------- oteltap
class OtelTap:
    """oteltap's OTLP/HTTP receiver on its own event loop thread, collecting everything it is sent."""

    def __init__(self) -> None:
        self.port = free_port()
        self.spans: list[Any] = []
        self.metrics: list[Any] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._rx = None
        self._tasks: list[Any] = []

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> OtelTap:
        from oteltap import OtelTapHttpProtobufReceiver, OtelTapHttpProtobufReceiverSettings

        self._thread.start()

        async def boot():
            settings = OtelTapHttpProtobufReceiverSettings(
                http_port=self.port,
                listen_on_all_interfaces=False,
                print_traces_as_ndjson=False,
                print_logs_as_ndjson=False,
                print_metrics_as_ndjson=False,
            )
            self._rx = OtelTapHttpProtobufReceiver(settings)
            await self._rx.start()
            self._tasks.append(asyncio.ensure_future(self._collect(self._rx.stream_traces(), self.spans)))
            self._tasks.append(asyncio.ensure_future(self._collect(self._rx.stream_metrics(), self.metrics)))

        asyncio.run_coroutine_threadsafe(boot(), self._loop).result(10)
        return self

    @staticmethod
    async def _collect(stream, sink: list) -> None:
        async for item in stream:
            sink.append(item)

    def stop(self) -> None:
        async def down():
            for t in self._tasks:
                t.cancel()
            if self._rx is not None:
                await self._rx.stop()

        try:
            asyncio.run_coroutine_threadsafe(down(), self._loop).result(10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()


# ------------------------------------------------------------------------------------------- Prometheus
def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


class Prometheus:
    """A real Prometheus on loopback with exemplar storage, scraping what ``config`` says."""

    def __init__(self, workdir: str, scrape_configs: str, rule_files: list[str] | None = None, binary: str | None = None) -> None:
        self.binary = binary
        self.port = free_port()
        self.workdir = workdir
        os.makedirs(workdir, exist_ok=True)
        rules = "".join(f"  - {r}\n" for r in (rule_files or []))
        self.config_path = os.path.join(workdir, "prometheus.yml")
        with open(self.config_path, "w") as f:
            f.write(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                + (f"rule_files:\n{rules}" if rules else "")
                + "scrape_configs:\n"
                + scrape_configs
            )
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Prometheus:
        binary = self.binary or prometheus_binary()
        assert binary, "prometheus is not installed (apt-get install prometheus; .ci/run does it)"
        log = open(os.path.join(self.workdir, "prometheus.log"), "w")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={self.config_path}",
                f"--storage.tsdb.path={os.path.join(self.workdir, 'data')}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--enable-feature=exemplar-storage",
                "--web.enable-lifecycle",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        wait_for(lambda: self._ready(), 20, what="prometheus /-/ready")
        return self

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=1) as r:
                return r.status == 200
        except Exception:
            return False

    def api(self, path: str, **params: Any) -> Any:
        import json

        url = f"{self.url}/api/v1/{path}?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as r:
            doc = json.load(r)
        assert doc["status"] == "success", doc
        return doc["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return self.api("query", query=expr)["result"]

    def wait_query(self, expr: str, timeout: float = 30, check=lambda r: bool(r)) -> list[dict[str, Any]]:
        return wait_for(lambda: (lambda r: r if check(r) else None)(self.query(expr)), timeout, 0.5, what=expr)

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        return self.api("query_range", query=expr, start=start, end=end, step=step)["result"]

    def exemplars(self, expr: str, seconds: float = 600) -> list[dict[str, Any]]:
        now = time.time()
        return self.api("query_exemplars", query=expr, start=now - seconds, end=now + 60)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
