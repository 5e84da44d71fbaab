"""A real Prometheus scrapes every rank's /metrics (found through the run folder's file-SD targets)."""

from __future__ import annotations

import glob
import os
import socket

import pytest

from .harness import finish_ranks, launcher_log, read_spans, start_ranks, wait_for
from .peers import Prometheus, prometheus_binary

pytestmark = pytest.mark.skipif(prometheus_binary() is None, reason="needs Debian's prometheus (.ci/run installs it)")

ALL_REDUCES = 7
BROADCASTS = 3


def test_real_prometheus_scrapes_every_rank(tmp_path):
    out = str(tmp_path / "job")
    run_folder = os.path.join(out, "runs", "prom-run")
    go = str(tmp_path / "go")
    # Hold the base port so rank 0 must fall back to another one and say where it went.
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    base_port = taken.getsockname()[1]
    prom = Prometheus(
        str(tmp_path / "prom"),
        "  - job_name: ranks\n"
        "    file_sd_configs:\n"
        f"      - files: ['{run_folder}/prometheus-targets.*.json']\n"
        "        refresh_interval: 1s\n",
    ).start()
    proc = start_ranks(
        "serve_metrics",
        2,
        out,
        {"run_id": "prom-run", "base_port": base_port, "all_reduces": ALL_REDUCES, "broadcasts": BROADCASTS, "go": go},
    )
    try:
        calls = prom.wait_query(
            'torchdist_collective_calls_total{run="prom-run",op="all_reduce"}',
            timeout=60,
            check=lambda r: len(r) == 2 and all(float(s["value"][1]) == ALL_REDUCES for s in r),
        )
        assert sorted(s["metric"]["rank"] for s in calls) == ["0", "1"]
        assert {s["metric"]["group"] for s in calls} == {"default_pg"}
        nbytes = prom.query('sum by (op) (torchdist_collective_bytes_total{run="prom-run"})')
        assert {s["metric"]["op"]: float(s["value"][1]) for s in nbytes} == {
            "all_reduce": 2 * ALL_REDUCES * 4096,
            "broadcast": 2 * BROADCASTS * 1024,
        }
        # all_reduce over 2 ranks: bus factor 2(n-1)/n = 1, so bus-bytes equal bytes
        bus = prom.query('sum(torchdist_collective_bus_bytes_total{run="prom-run",op="all_reduce"})')
        assert float(bus[0]["value"][1]) == 2 * ALL_REDUCES * 4096
        count = prom.query('sum(torchdist_collective_duration_seconds_count{run="prom-run"})')
        assert float(count[0]["value"][1]) == 2 * (ALL_REDUCES + BROADCASTS)
        busbw = prom.query(
            'sum by (rank) (torchdist_collective_bus_bytes_total{op="all_reduce"}) / '
            'sum by (rank) (torchdist_collective_duration_seconds_sum{op="all_reduce"})'
        )
        assert len(busbw) == 2 and all(float(s["value"][1]) > 0 for s in busbw)
        p99 = prom.query(
            'histogram_quantile(0.99, sum by (le, op) (torchdist_collective_duration_seconds_bucket{run="prom-run"}))'
        )
        assert {s["metric"]["op"] for s in p99} == {"all_reduce", "broadcast"}
        dropped = prom.query('torchdist_telemetry_dropped_total{run="prom-run"}')
        assert dropped and all(float(s["value"][1]) == 0 for s in dropped)

        # Exemplars carry the trace id of a span that really was exported.
        exemplars = wait_for(
            lambda: prom.exemplars('torchdist_collective_duration_seconds_bucket{run="prom-run"}'), 30, what="exemplars"
        )
        trace_ids = {e["labels"]["trace_id"] for series in exemplars for e in series["exemplars"]}
        assert trace_ids
        exported = set()
        for path in glob.glob(os.path.join(run_folder, "traces.rank*.jsonl")):
            exported |= {s["traceId"] for s in read_spans(path)}
        assert trace_ids <= exported

        # Rank 0's base port was taken: it warned, served elsewhere, and said where.
        targets = prom.api("targets")["activeTargets"]
        ports = sorted(int(t["labels"]["instance"].rsplit(":", 1)[1]) for t in targets)
        assert base_port not in ports and len(ports) == 2
        assert all(t["health"] == "up" for t in targets)
    finally:
        open(go, "w").close()
        taken.close()
        try:
            finish_ranks(proc, out, 2)
        finally:
            prom.stop()
    assert "is taken" in launcher_log(out)


def test_an_ipv6_host_is_bracketed_in_the_url_and_the_target(tmp_path):
    import json
    import urllib.request

    from otel_torchdist.export.prometheus import PrometheusEndpoint

    try:
        socket.socket(socket.AF_INET6).close()
    except OSError:
        pytest.skip("no IPv6 on this machine")
    endpoint = PrometheusEndpoint(lambda: [])
    try:
        endpoint.start("::1", 0)
    except OSError as exc:
        pytest.skip(f"cannot bind ::1 here ({exc})")
    try:
        assert endpoint.url == f"http://[::1]:{endpoint.port}/metrics"
        with urllib.request.urlopen(endpoint.url, timeout=5) as resp:  # the URL as printed works
            assert resp.status == 200
        path = str(tmp_path / "targets.json")
        endpoint.write_target(path, {"rank": "0"})
        assert json.load(open(path))[0]["targets"] == [f"[::1]:{endpoint.port}"]
    finally:
        endpoint.stop()
