"""The real stack on loopback: the Collector, Jaeger v2 and Prometheus built by deploy/from-source/build-stack.sh,
run with deploy/'s own configuration files.

Configurations are never copied by hand: ``transform`` takes a component's own file and changes host names
and ports only (each ``host:port`` or ``port: N`` named in the mapping must occur, so a config that moves
breaks the tests loudly instead of silently running something else).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
from typing import Any

from .harness import REPO, free_port

BUILD = os.path.join(REPO, "deploy", "from-source", "build-stack.sh")
BIN = os.environ.get("TORCHDIST_STACK_BIN", os.path.expanduser("~/.cache/otel-torchdist/stack/bin"))


class NoGo(Exception):
    """This machine has no Go toolchain: the components cannot be built."""


def build(component: str = "all") -> str:
    """Build (or find up to date) the components; returns the folder of the binaries."""
    if shutil.which("go") is None:
        raise NoGo("no Go toolchain on this machine (deploy/from-source/build-stack.sh needs one)")
    done = subprocess.run(["bash", BUILD, component], capture_output=True, text=True, env={**os.environ, "TORCHDIST_STACK_BIN": BIN})
    if done.returncode == 3:
        raise NoGo(done.stderr.strip())
    if done.returncode != 0:
        raise RuntimeError(f"deploy/from-source/build-stack.sh {component} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return BIN


def transform(text: str, endpoints: dict[str, str], ports: dict[int, int] | None = None) -> str:
    """``text`` with each ``endpoints`` key (``host:port``, as written in the file) replaced by its value and
    each ``port: N`` line of ``ports`` given the new port; every key must occur."""
    for old, new in endpoints.items():
        if old not in text:
            raise ValueError(f"{old!r} is not in the configuration any more: the stack tests need updating")
        text = text.replace(old, new)
    for old_port, new_port in (ports or {}).items():
        pattern = re.compile(rf"(\bport:\s*){old_port}\b")
        if not pattern.search(text):
            raise ValueError(f"'port: {old_port}' is not in the configuration any more: the stack tests need updating")
        text = pattern.sub(rf"\g<1>{new_port}", text)
    return text


def write_atomically(path: str, text: str) -> None:
    """Prometheus re-reads file-SD files as they change: never let it see one half written."""
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def get_json(url: str, timeout: float = 10) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def wait_http(url: str, proc: subprocess.Popen, log: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited ({proc.returncode}):\n{open(log).read()[-4000:]}")
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except Exception:
            time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer within {timeout:.0f} s:\n{open(log).read()[-4000:]}")


class Component:
    """A built binary running with a configuration file in ``folder``, its output in ``<name>.log``."""

    def __init__(self, name: str, argv: list[str], folder: str) -> None:
        self.name = name
        self.log = os.path.join(folder, f"{name}.log")
        self.proc = subprocess.Popen(argv, stdout=open(self.log, "w"), stderr=subprocess.STDOUT, cwd=folder)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def jaeger_default_config() -> str:
    """Jaeger v2's own all-in-one configuration (what ``jaeger`` runs without ``--config``), from the
    module the binary was built from."""
    modcache = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=True).stdout.strip()
    gomod = open(os.path.join(REPO, "deploy", "from-source", "jaeger", "go.mod")).read()
    version = re.search(r"github.com/jaegertracing/jaeger (v\S+)", gomod).group(1)
    return open(os.path.join(modcache, f"github.com/jaegertracing/jaeger@{version}", "cmd", "jaeger", "internal", "all-in-one.yaml")).read()


def jaeger_spans(trace: dict) -> list[dict[str, Any]]:
    """A trace of Jaeger's query API (``/api/traces``) as the test harness's span dicts (OTLP/JSON names),
    attributes and process tags flattened, so ``harness.trace_layout_problems`` reads it."""
    processes = {pid: {t["key"]: t["value"] for t in p.get("tags", [])} | {"service.name": p["serviceName"]}
                 for pid, p in trace["processes"].items()}  # fmt: skip
    out = []
    for s in trace["spans"]:
        parent = next((r["spanID"] for r in s.get("references", []) if r["refType"] == "CHILD_OF" and r["traceID"] == s["traceID"]), None)
        start = int(s["startTime"]) * 1000  # Jaeger's microseconds
        out.append({
            "traceId": s["traceID"],
            "spanId": s["spanID"],
            "parentSpanId": parent,
            "name": s["operationName"],
            "exported_name": s["operationName"],
            "startTimeUnixNano": start,
            "endTimeUnixNano": start + int(s["duration"]) * 1000,
            "attributes": {t["key"]: t["value"] for t in s.get("tags", [])},
            "resource": processes[s["processID"]],
        })  # fmt: skip
    return out


QUERY = "http://127.0.0.1:16686"  # Jaeger's query API: its all-in-one default, kept (the tests read it there)


class Stack:
    """Jaeger v2 on its all-in-one configuration, the Collector on deploy/otel-collector/config.yaml and, with
    ``prometheus``, Prometheus v3 on deploy/prometheus/prometheus.yml, in ``folder`` on loopback ports.

    Prometheus' folder is laid out as deploy/prometheus is (``prometheus.yml``, ``rules`` linked to deploy's,
    ``targets/`` for file-SD target files), so the configuration's relative paths hold; ``add_targets``
    copies a run's target files in as deploy/README.md tells a user to."""

    def __init__(self, folder: str, prometheus: bool = False) -> None:
        self.folder = folder
        self.components: list[Component] = []
        self.ports = {name: free_port() for name in ("grpc", "http", "health", "exporter", "self")}
        self.prom = None
        self.proms: list[Any] = []
        try:
            self._start(prometheus)
        except BaseException:
            self.stop()
            raise

    def _write(self, name: str, text: str) -> str:
        path = os.path.join(self.folder, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        return path

    def _start(self, prometheus: bool) -> None:
        jaeger_otlp = free_port()
        jaeger = self._write("jaeger.yaml", transform(
            jaeger_default_config(),
            {"${env:JAEGER_LISTEN_HOST:-localhost}:4317": f"127.0.0.1:{jaeger_otlp}",
             "${env:JAEGER_LISTEN_HOST:-localhost}:4318": f"127.0.0.1:{free_port()}"},
            {8888: free_port()},
        ))  # fmt: skip
        p = self.ports
        collector = self._write("collector.yaml", transform(
            open(os.path.join(REPO, "deploy", "otel-collector", "config.yaml")).read(),
            {"0.0.0.0:4317": f"127.0.0.1:{p['grpc']}", "0.0.0.0:4318": f"127.0.0.1:{p['http']}",
             "jaeger:4317": f"127.0.0.1:{jaeger_otlp}", "0.0.0.0:8889": f"127.0.0.1:{p['exporter']}",
             "0.0.0.0:13133": f"127.0.0.1:{p['health']}", "host: 0.0.0.0": "host: 127.0.0.1"},
            {8888: p["self"]},
        ))  # fmt: skip
        self.jaeger = self._run("jaeger", [os.path.join(BIN, "jaeger"), "--config", jaeger])
        self.collector = self._run("collector", [os.path.join(BIN, "otelcol-torchdist"), "--config", collector])
        wait_http(f"{QUERY}/api/services", self.jaeger.proc, self.jaeger.log)
        wait_http(f"http://127.0.0.1:{p['health']}/", self.collector.proc, self.collector.log)
        if prometheus:
            self._start_prometheus()

    def _start_prometheus(self) -> None:
        self.prom = self._prometheus("prometheus", self.ports["exporter"], self.ports["self"])

    def witness(self) -> Any:
        """A second Prometheus on the same deploy configuration, its Collector jobs pointed at a port nothing
        listens on: it reads only the ranks whose target files are copied into its own targets/
        (``add_targets(..., into="witness")``), so a run's Collector-path series can be set against what
        the very same processes served on /metrics."""
        dead = free_port()
        self.witness_prom = self._prometheus("witness", dead, dead)
        return self.witness_prom

    def _prometheus(self, name: str, exporter: int, own: int) -> Any:
        from .peers import Prometheus

        deploy = os.path.join(REPO, "deploy", "prometheus")
        folder = os.path.join(self.folder, name)
        os.makedirs(os.path.join(folder, "targets"), exist_ok=True)
        os.symlink(os.path.join(deploy, "rules"), os.path.join(folder, "rules"))
        prom = Prometheus(folder, "", binary=os.path.join(BIN, "prometheus"))
        self._write(f"{name}/prometheus.yml", transform(
            open(os.path.join(deploy, "prometheus.yml")).read(),
            {"otel-collector:8889": f"127.0.0.1:{exporter}",
             "otel-collector:8888": f"127.0.0.1:{own}",
             "localhost:9090": f"127.0.0.1:{prom.port}"},
        ))  # fmt: skip
        self.proms.append(prom)
        return prom.start()

    def _run(self, name: str, argv: list[str]) -> Component:
        component = Component(name, argv, self.folder)
        self.components.append(component)
        return component

    def endpoint(self, protocol: str) -> str:
        return f"http://127.0.0.1:{self.ports['grpc' if protocol == 'grpc' else 'http']}"

    def add_targets(self, run_folder: str, run_id: str, into: str = "prometheus") -> None:
        """A run's per-rank target files, copied into Prometheus' targets/ as ``<run id>.<file name>``."""
        for name in os.listdir(run_folder):
            if name.startswith("prometheus-targets.rank") and name.endswith(".json"):
                with open(os.path.join(run_folder, name)) as f:
                    write_atomically(os.path.join(self.folder, into, "targets", f"{run_id}.{name}"), f.read())

    def collector_metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ports['self']}/metrics", timeout=10) as response:
            return response.read().decode()

    def stop(self) -> None:
        for prom in self.proms:
            prom.stop()
        for component in reversed(self.components):
            component.stop()
