"""Helpers shared by the tests: run real multi-rank jobs, read what they exported, free ports."""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import socket
import subprocess
import sys
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


_handed_out: set[int] = set()


def free_port() -> int:
    """A free loopback port, never one handed out before in this process: the kernel may give two binds in
    a row the same ephemeral port once the first socket is closed (a Collector's config once had its
    health check and its OTLP receiver on one port, and the Collector could not start)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def start_ranks(scenario: str, world_size: int, out: str, args: dict | None = None, env: dict | None = None):
    """Start ``scenario`` in ``world_size`` gloo ranks in the background; returns the Popen."""
    os.makedirs(out, exist_ok=True)
    full_env = {
        **os.environ,
        "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
        # A rank killed by a signal (a C++ abort) prints every thread's Python stack into the log.
        "PYTHONFAULTHANDLER": "1",
        **(env or {}),
    }
    log = open(os.path.join(out, "launcher.log"), "w")
    return subprocess.Popen(
        [sys.executable, "-m", "tests.launcher", scenario, str(world_size), out, json.dumps(args or {})],
        cwd=REPO,
        env=full_env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def finish_ranks(proc, out: str, world_size: int, timeout: float = 240) -> list[dict[str, Any]]:
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"ranks did not finish in {timeout}s:\n{_log(out)}") from None
    errors = sorted(glob.glob(os.path.join(out, "error.rank*.txt")))
    if proc.returncode != 0 or errors:
        detail = "\n".join(open(e).read() for e in errors)
        done = [r for r in range(world_size) if os.path.exists(os.path.join(out, f"result.rank{r}.json"))]
        raise AssertionError(
            f"ranks failed (rc={proc.returncode}); ranks that returned from the scenario: {done}:\n{detail}\n{_log(out)}"
        )
    results = []
    for rank in range(world_size):
        with open(os.path.join(out, f"result.rank{rank}.json")) as f:
            results.append(json.load(f))
    return results


def run_ranks(scenario: str, world_size: int, out: str, args: dict | None = None, env: dict | None = None, timeout: float = 240):
    return finish_ranks(start_ranks(scenario, world_size, out, args, env), out, world_size, timeout)


def _log(out: str) -> str:
    path = os.path.join(out, "launcher.log")
    return open(path).read()[-6000:] if os.path.exists(path) else ""


def launcher_log(out: str) -> str:
    return _log(out)


# ------------------------------------------------------------------------------------- OTLP/JSON files
def attr_value(v: dict[str, Any]) -> Any:
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        return int(v["intValue"])
    if "doubleValue" in v:
        return float(v["doubleValue"])
    if "boolValue" in v:
        return v["boolValue"]
    if "arrayValue" in v:
        return [attr_value(x) for x in v["arrayValue"].get("values", [])]
    return None


def attrs(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {a["key"]: attr_value(a["value"]) for a in items}


def read_spans(path: str) -> list[dict[str, Any]]:
    """Every span in an OTLP/JSON lines trace file, attributes flattened, resource attached; ``name`` without
    the rank the exported name carries (``exported_name``: as written)."""
    from otel_torchdist.names import span_base_name

    spans = []
    with open(path) as f:
        for line in f:
            doc = json.loads(line)
            for rs in doc["resourceSpans"]:
                resource = attrs(rs["resource"]["attributes"])
                for ss in rs["scopeSpans"]:
                    for s in ss["spans"]:
                        spans.append({**s, "name": span_base_name(s["name"]), "exported_name": s["name"],
                                      "attributes": attrs(s["attributes"]), "resource": resource})
    return spans


def collective_spans(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Only the collectives' spans (not steps, optimizer steps, sharding...)."""
    return [s for s in spans if "torchdist.collective.op" in s["attributes"]]


def read_metric_lines(path: str) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def last_metrics(path: str) -> dict[str, list[dict[str, Any]]]:
    """The data points of each metric in the last snapshot of a metrics file, attributes flattened."""
    docs = read_metric_lines(path)
    out: dict[str, list[dict[str, Any]]] = {}
    for rm in docs[-1]["resourceMetrics"]:
        for sm in rm["scopeMetrics"]:
            for m in sm["metrics"]:
                data = m.get("histogram") or m.get("sum") or m.get("gauge")
                out[m["name"]] = [{**dp, "attributes": attrs(dp["attributes"])} for dp in data["dataPoints"]]
    return out


def metric_value(metrics: dict[str, list[dict[str, Any]]], metric: Any, **labels: str) -> float:
    """The one data point of ``metric`` (a names.Metric) whose attributes include ``labels``."""
    (point,) = [p for p in metrics[metric.name] if all(p["attributes"].get(k) == v for k, v in labels.items())]
    return float(point.get("asDouble", point.get("asInt", point.get("sum", point.get("count")))))


def wait_for(predicate, timeout: float, interval: float = 0.2, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


@contextlib.contextmanager
def library_log():
    """The messages otel-torchdist logs inside the block, collected by a handler of the test's own: the
    library's handler may still write to the stream of an earlier test's capture."""
    messages: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger("otel_torchdist")
    logger.addHandler(handler)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)



def trace_layout_problems(spans: list[dict[str, Any]], slack_ns: int = 0) -> list[str]:
    """What Jaeger's trace view would show wrong in these spans (all ranks' together): a span id twice in a
    trace, a parent that is not in the trace (an orphan: Jaeger's "invalid parent"), or a child that lies
    outside its parent's interval (drawn past its end) by more than ``slack_ns`` (Jaeger keeps
    microseconds: 2 us)."""
    problems: list[str] = []
    by_id: dict[tuple[str, str], dict[str, Any]] = {}
    for s in spans:
        key = (s["traceId"], s["spanId"])
        if key in by_id:
            problems.append(f"span id {key} twice: {by_id[key]['name']}, {s['name']}")
        by_id[key] = s
    for s in spans:
        parent_id = s.get("parentSpanId")
        if not parent_id:
            continue
        parent = by_id.get((s["traceId"], parent_id))
        if parent is None:
            problems.append(f"orphan {s.get('exported_name', s['name'])} (parent {parent_id} not in trace {s['traceId']})")
            continue
        start, end = int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"])
        p_start, p_end = int(parent["startTimeUnixNano"]), int(parent["endTimeUnixNano"])
        if start < p_start - slack_ns or end > p_end + slack_ns:
            problems.append(
                f"{s.get('exported_name', s['name'])} [{start}, {end}] outside its parent "
                f"{parent.get('exported_name', parent['name'])} [{p_start}, {p_end}] by "
                f"{max(p_start - start, end - p_end) / 1e6:.3f} ms"
            )
    return problems
