"""The real stack's metrics, end to end: Prometheus v3 on deploy/prometheus/prometheus.yml and its rules, the
Collector on deploy/otel-collector/config.yaml and Jaeger v2 on its all-in-one configuration (only hosts and
ports changed, tests/stack.py), all built from the Go module proxy, receive three 2-rank runs of the demo's
models (DDP, FSDP2, tensor parallel; tests/scenarios_stack.py) at once:

* ``stack-default``: OTLP/HTTP to the Collector with the metric export interval a user gets by default (60 s);
* ``stack-5s``: OTLP/gRPC to the Collector with the 5 s deploy/README.md recommends;
* ``stack-direct``: no Collector for metrics: Prometheus scrapes every rank's /metrics through file service
  discovery, the run's target files copied into its targets/ folder as deploy/README.md says.

Every panel query, template variable and rule of dashboards/ and deploy/ is then run as Grafana runs it
(tests/grafana.py: the dashboard's 30-minute range, the panel's width, ``$__rate_interval`` from the
"Metric resolution" variable set as the dashboards tell the user: 1m at the default push, 5s otherwise) at
several moments of the run, not only at its end. Each must return data, and the Collector runs' values must
agree with what the same processes served on /metrics, read by a second Prometheus on the same deploy
configuration (the witness) every 5 s at the 5s resolution (the defect this catches: with a 60 s push and
20 s rate windows, rate panels read 0, then 3-4x the truth). The witness reads the very processes, not the
direct run beside them: on a shared 2-core machine two runs' timings differ by 3x and more.

GPU series come from stand-ins (tests/scenarios_deploy.py ``GpuStandIn``, one per run, scraped through a
target file): no GPU exists here. Skipped, with the reason, only on a machine without Go.
"""

from __future__ import annotations

import glob
import math
import os
import re
import time
import urllib.error

import pytest

from . import grafana, stack
from . import scenarios_deploy as sd
from .harness import finish_ranks, start_ranks, wait_for

RUNS = {
    "stack-default": {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
    "stack-5s": {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_METRIC_EXPORT_INTERVAL": "5000"},
    "stack-direct": {"OTEL_METRICS_EXPORTER": "prometheus"},
}
RESOLUTION = {"stack-default": "1m", "stack-5s": "5s", "stack-direct": "5s"}
PUSH_S = {"stack-default": 60, "stack-5s": 5, "stack-direct": 5}
DURATION_S = 285
# A rate needs two pushes (the default run's come at about 60 and 125 s). From 250 s a 4-minute window
# starts less than a push interval before the run's first sample, so Prometheus extrapolates it to the
# window's start and the rate is whole: the moments where the paths are compared.
MOMENTS_S = (150, 200, 250, 280)
FULL_S = 250
STOP_ORDER = ("stack-direct", "stack-5s", "stack-default")  # newest-first must not be alphabetical
WITNESSED = ("stack-default", "stack-5s")

pytestmark = pytest.mark.timeout(900)  # the module's fixture runs the three trainings for 5.5 minutes

CASES = sd.dashboard_exprs()
PANELS = [c for c in CASES if c.kind == "panel"]
GPU = sd.gpu_only_metrics()

# Panels whose value the three runs need not share, and why.
NOT_COMPARED = {
    # the age of the collective in flight at the moment of a sample: near 0, whatever the path
    "stragglers/oldest-collective-in-flight-per-rank-and-group/A": "instantaneous",
    # cumulative sequence numbers of two ranks sampled at different moments (scrapes or pushes seconds apart):
    # at these rates hundreds of collectives apart when nothing is wrong; a hang freezes them, then it reads true
    "stragglers/collectives-behind-the-most-advanced-rank-per-group/A": "sampling skew",
    # how long ago a rank reported: up to the push interval (checked against it in the data test)
    "stragglers/seconds-since-each-rank-last-reported/A": "push interval",
    # a count per rate window: 4 minutes at the 1m resolution, 20 s at 5s
    "gpu/ecc-errors/A": "count per window",
    "gpu/cuda-oom-retries/A": "count per window",
    # the host's own interfaces (every run here shares the host): bursty traffic averaged over other windows
    "gpu/host-network-throughput/A": "host-wide",
    # the difference of two near-equal per-rank means (0.3 ms vs 0.9 ms here): noise, not a reading
    "stragglers/step-time-spread-across-ranks/A": "difference of means",
    # one batch's loss, at whatever batch each run is on
    "training-overview/loss/A": "one batch",
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    try:
        for component in ("otelcol", "jaeger", "prometheus"):
            stack.build(component)
    except stack.NoGo as exc:
        pytest.skip(str(exc))
    folder = str(tmp_path_factory.mktemp("stack-metrics"))
    running = stack.Stack(folder, prometheus=True)
    stand_ins, jobs = [], {}
    try:
        witness = running.witness()
        for run_id in RUNS:
            stand_in = sd.GpuStandIn(run_id).start()
            stand_ins.append(stand_in)
            for prom in ("prometheus", "witness") if run_id in WITNESSED else ("prometheus",):
                stack.write_atomically(os.path.join(folder, prom, "targets", f"gpu-stand-in.{run_id}.targets.json"),
                                       f'[{{"targets": ["{stand_in.target}"]}}]')  # fmt: skip
        started = float(int(time.time()))  # whole seconds: the moments below fall on the queries' steps
        for run_id, variables in RUNS.items():
            env = {"OTEL_SERVICE_NAME": run_id, "OTEL_EXPORTER_PROMETHEUS_PORT": "0", **variables}
            if run_id != "stack-direct":
                env["OTEL_EXPORTER_OTLP_ENDPOINT"] = running.endpoint(variables["OTEL_EXPORTER_OTLP_PROTOCOL"])
            out = os.path.join(folder, run_id)
            control = os.path.join(out, "control")
            os.makedirs(control)
            args = {"run_id": run_id, "control": control, "max_seconds": DURATION_S + 120, "pace_s": 0.05, "straggle_s": 0.04}
            jobs[run_id] = (start_ranks("scenarios_stack:training", 2, out, args, env=env), out)
        for run_id, prom in [("stack-direct", "prometheus")] + [(r, "witness") for r in WITNESSED]:
            run_folder = os.path.join(folder, run_id, "runs", run_id)
            wait_for(lambda: len(glob.glob(os.path.join(run_folder, "prometheus-targets.rank*.json"))) == 2, 120, what="target files")
            running.add_targets(run_folder, run_id, into=prom)
        time.sleep(max(0.0, started + DURATION_S - time.time()))
        for run_id in STOP_ORDER:
            proc, out = jobs[run_id]
            open(os.path.join(out, "control", "stop"), "w").close()
            finish_ranks(proc, out, 2, timeout=120)
            time.sleep(6)  # the run variable's resolution is the evaluation interval, 5 s
        yield {"stack": running, "prom": running.prom, "witness": witness, "started": started}
    finally:
        for proc, _ in jobs.values():
            if proc.poll() is None:
                proc.kill()
        for stand_in in stand_ins:
            stand_in.stop()
        running.stop()


def _dashboard(runs, case: sd.Expr, run_id: str, prom: str = "prom") -> grafana.Dashboard:
    key = (case.dashboard, run_id, prom)
    cache = runs.setdefault("dashboards", {})
    if key not in cache:
        resolution = RESOLUTION[run_id] if prom == "prom" else "5s"
        cache[key] = sd.dashboard_as_user(runs[prom], case.dashboard, run_id, "5s", resolution)
    return cache[key]


def _at(result: list[dict], t: float, step: float) -> dict[tuple, float]:
    """Each series' value at moment ``t`` of a range query's result (the point of the step holding ``t``)."""
    out = {}
    for series in result:
        labels = tuple(sorted((k, v) for k, v in series["metric"].items() if k not in ("run", "job", "instance")))
        for ts, value in series["values"]:
            if t - step < float(ts) <= t:
                out[labels] = float(value)
    return out


def _panel_values(runs, case: sd.Expr, run_id: str, prom: str = "prom") -> tuple[dict[float, dict[tuple, float]], grafana.Query]:
    """The panel's values at each moment of the run, from one range query as Grafana sends it to ``prom``."""
    cache = runs.setdefault("values", {})
    key = (case.case_id, run_id, prom)
    if key not in cache:
        q = _dashboard(runs, case, run_id, prom).query(case.panel, case.target, runs["started"] + DURATION_S)
        result = runs[prom].query_range(q.expr, runs["started"] + MOMENTS_S[0] - q.step, runs["started"] + DURATION_S, q.step)
        cache[key] = {m: _at(result, runs["started"] + m, q.step) for m in MOMENTS_S}, q
    return cache[key]


@pytest.mark.parametrize("run_id", list(RUNS))
@pytest.mark.parametrize("case", PANELS, ids=lambda c: c.case_id)
def test_every_panel_has_data_all_along_the_run(runs, case, run_id):
    values, q = _panel_values(runs, case, run_id)
    for moment, found in values.items():
        finite = [v for v in found.values() if math.isfinite(v)]
        assert finite, f"{run_id}: no data {moment} s into the run for\n{q.expr}\n(step {q.step} s)"
    if case.case_id == "stragglers/seconds-since-each-rank-last-reported/A":
        assert all(v <= PUSH_S[run_id] + 20 for found in values.values() for v in found.values()), values


@pytest.mark.parametrize("run_id", WITNESSED)
@pytest.mark.parametrize("case", [c for c in PANELS if c.case_id not in NOT_COMPARED], ids=lambda c: c.case_id)
def test_the_collector_paths_panels_read_what_the_ranks_measured(runs, case, run_id):
    """Once a rate window lies inside the run, each series of a panel agrees within a factor of 2.5 with the
    witness's reading of the same ranks' /metrics (the defect was 0, or 3-4x)."""
    ours, q = _panel_values(runs, case, run_id)
    truth, _ = _panel_values(runs, case, run_id, "witness")
    compared = 0
    for moment in (m for m in MOMENTS_S if m >= FULL_S):
        for labels, expected in truth[moment].items():
            got = ours[moment].get(labels)
            if got is None or not math.isfinite(expected) or not math.isfinite(got):
                continue
            compared += 1
            if expected == got:
                continue
            assert expected > 0 and got > 0 and 1 / 2.5 <= got / expected <= 2.5, (
                f"{run_id} {dict(labels)} {moment} s in: {got:.4g} where the witness read {expected:.4g} from the same ranks\n{q.expr}"
            )
    assert compared, f"no series to compare: {ours} vs {truth}"


@pytest.mark.parametrize("run_id", list(RUNS))
@pytest.mark.parametrize("case", [c for c in CASES if c.kind == "variable"], ids=lambda c: c.case_id)
def test_every_variable_lists_the_runs_values(runs, case, run_id):
    dashboard = _dashboard(runs, case, run_id)  # sets every variable in order: each must have values
    assert dashboard.variables["run"] == run_id


def test_the_run_variable_lists_the_newest_run_first(runs):
    (variable,) = [v for v in sd.load_dashboard(os.path.join(sd.DASHBOARDS, "training-overview.json"))["templating"]["list"] if v["name"] == "run"]
    found = sd.variable_options(runs["prom"], grafana.Dashboard(), variable)
    assert [r for r in found if r in RUNS] == list(reversed(STOP_ORDER))


def _rule_at(runs, expr: str, moment: float) -> list[dict]:
    return runs["prom"].api("query", query=expr, time=runs["started"] + moment)["result"]


@pytest.mark.parametrize("run_id", list(RUNS))
@pytest.mark.parametrize("case", [c for c in sd.rule_exprs() if c.kind == "recording"], ids=lambda c: c.case_id)
def test_every_recording_rule_has_data_for_each_run(runs, case, run_id):
    name = case.case_id.removeprefix("record/")
    for moment in (m for m in MOMENTS_S if m >= 180):
        values = [float(s["value"][1]) for s in _rule_at(runs, f'{name}{{run="{run_id}"}}', moment)]
        assert values and all(math.isfinite(v) and 0 <= v <= 1.5 for v in values), (moment, values)


ALERTS = {
    # the injected faults: rank 1 straggles in every run and once arrives 2.5 s late at a barrier
    "TorchdistStraggler": {"1"},
    "TorchdistCollectiveHang": {"0"},
    # the stand-in's GPU 1 idles
    "TorchdistLowGpuUtilization": {"1"},
    # nothing was lost and no rank went silent
    "TorchdistTelemetryDropped": set(),
    "TorchdistTelemetryErrors": set(),
    "TorchdistCollectiveErrors": set(),
    "TorchdistRankSilent": set(),
}


@pytest.mark.parametrize("run_id", list(RUNS))
@pytest.mark.parametrize("case", [c for c in sd.rule_exprs() if c.kind == "alert"], ids=lambda c: c.case_id)
def test_every_alert_expression_names_the_faulty_rank_and_nothing_else(runs, case, run_id):
    alert = case.case_id.removeprefix("alert/")
    result = _rule_at(runs, case.expr, FULL_S)
    assert {s["metric"]["rank"] for s in result if s["metric"].get("run") == run_id} == ALERTS[alert], result


@pytest.mark.parametrize("run_id", ["stack-default", "stack-5s"])
def test_exemplars_name_traces_jaeger_holds(runs, run_id):
    (case,) = [c for c in PANELS if c.exemplar and "0.99" in c.expr]
    q = _dashboard(runs, case, run_id).query(case.panel, case.target, runs["started"] + DURATION_S)
    series = runs["prom"].api("query_exemplars", query=q.expr, start=runs["started"], end=runs["started"] + DURATION_S + 60)
    trace_ids = {e["labels"]["trace_id"] for s in series for e in s["exemplars"]}
    assert trace_ids, f"no exemplars for {q.expr}"
    for trace_id in sorted(trace_ids)[:20]:
        try:
            trace = stack.get_json(f"{stack.QUERY}/api/traces/{trace_id}")["data"][0]
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"Jaeger does not know trace {trace_id} ({exc})") from None
        assert any(s.get("operationName", "").startswith(("all_reduce", "all_gather", "broadcast", "reduce_scatter", "_")) for s in trace["spans"])
        assert {p["serviceName"] for p in trace["processes"].values()} == {run_id}


def test_the_collector_refused_and_dropped_nothing(runs):
    prom = runs["prom"]
    text = runs["stack"].collector_metrics()
    counters = {}
    for line in text.splitlines():
        m = re.match(r"^(otelcol_\w+?)(?:\{[^}]*\})? ([0-9.e+-]+)$", line)
        if m:
            counters[m.group(1)] = counters.get(m.group(1), 0.0) + float(m.group(2))
    assert counters.get("otelcol_receiver_accepted_spans_total", 0) > 0, sorted(counters)
    assert counters.get("otelcol_receiver_accepted_metric_points_total", 0) > 0, sorted(counters)
    lost = {k: v for k, v in counters.items() if re.search(r"refused|failed|dropped", k) and v}
    assert lost == {}, lost
    # and Prometheus scrapes those counters (job otel-collector-self), as a user's alerting would
    assert prom.query('sum(otelcol_receiver_accepted_spans_total{job="otel-collector-self"})')
