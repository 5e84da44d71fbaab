"""The Grafana dashboards in dashboards/: well-formed, wired to the provisioned data sources, and every query
proven on real data.

Static: each file is a dashboard Grafana can provision (unique uid, tags, links), every panel has a unit and
the provisioned Prometheus data source, every variable a query uses is defined (run and rank everywhere; op,
group, gpu where used), every series name is in the frozen schema (otel_torchdist/names.py) or a recording
rule of deploy/prometheus/rules, and every expression parses (promtool).

Live: a real 2-rank gloo job (tests/scenarios_deploy.py: DDP with a straggler, an injected hang, dropped
telemetry) is scraped by a real Prometheus configured from deploy/prometheus (same rule files, the
direct-path job pointed at the run folder). Every panel query and every variable query, with the variables
set as a user would (this run, All), must return data; exemplars must name traces the run exported. GPU
series come from a stand-in endpoint (tests/scenarios_deploy.py ``GpuStandIn``): no GPU exists here.
Queries over metrics the library does not emit yet are xfail(strict=True) (``NOT_EMITTED_YET``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from . import grafana
from . import scenarios_deploy as sd
from .harness import wait_for
from .peers import prometheus_binary
from otel_torchdist.export import prometheus_names

DATASOURCE_UIDS = {ds["uid"]: ds["type"] for ds in sd.load_yaml(sd.DATASOURCES)["datasources"]}
DASHBOARD_FILES = [os.path.basename(p) for p in sd.dashboard_files()]
EXPECTED = {"training-overview.json", "collectives.json", "gpu.json", "stragglers.json"}
CASES = sd.dashboard_exprs()
PANEL_CASES = [c for c in CASES if c.kind == "panel"]
needs_prometheus = pytest.mark.skipif(prometheus_binary() is None, reason="needs Debian's prometheus (.ci/install)")


def _param(case: sd.Expr):
    missing = sd.missing_families(case.expr)
    marks = [pytest.mark.xfail(strict=True, reason=f"{', '.join(sorted(missing))} not emitted yet")] if missing else []
    return pytest.param(case, id=case.case_id, marks=marks)


# --------------------------------------------------------------------------------------------- static
def test_the_four_dashboards_exist_with_unique_uids():
    assert set(DASHBOARD_FILES) == EXPECTED
    dashboards = [sd.load_dashboard(os.path.join(sd.DASHBOARDS, f)) for f in DASHBOARD_FILES]
    uids = [d["uid"] for d in dashboards]
    assert len(set(uids)) == len(uids) and all(re.fullmatch(r"[a-z0-9-]{1,40}", u) for u in uids)
    for d in dashboards:
        assert d["title"].startswith("otel-torchdist / ")
        assert "otel-torchdist" in d["tags"]
        assert isinstance(d["schemaVersion"], int) and d["panels"]
        ids = [p["id"] for p in sd.all_panels(d)]
        assert len(set(ids)) == len(ids)
        assert any(link.get("tags") == ["otel-torchdist"] for link in d["links"])  # links to the others


def test_alert_annotations_link_to_existing_dashboards():
    uids = {sd.load_dashboard(p)["uid"] for p in sd.dashboard_files()}
    rules = [r for g in sd.rule_groups() for r in g["rules"]]
    linked = {r["annotations"]["dashboard"] for r in rules if "dashboard" in r.get("annotations", {})}
    assert linked and {link.removeprefix("/d/") for link in linked} <= uids


@pytest.mark.parametrize("name", DASHBOARD_FILES)
def test_every_panel_has_a_unit_and_the_provisioned_datasource(name):
    dashboard = sd.load_dashboard(os.path.join(sd.DASHBOARDS, name))
    for panel in sd.all_panels(dashboard):
        if panel["type"] == "row":
            continue
        where = f"{name}: {panel['title']}"
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{where} has no unit"
        assert panel.get("description"), f"{where} has no description"
        assert panel["datasource"] == {"type": "prometheus", "uid": "prometheus"}, where
        assert DATASOURCE_UIDS[panel["datasource"]["uid"]] == "prometheus"
        assert panel["targets"], where
        for t in panel["targets"]:
            assert t["datasource"] == panel["datasource"], where
            assert t["expr"].strip() and t["refId"], where
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            assert var["datasource"] == {"type": "prometheus", "uid": "prometheus"}, var["name"]


@pytest.mark.parametrize("name", DASHBOARD_FILES)
def test_every_variable_used_is_defined(name):
    dashboard = sd.load_dashboard(os.path.join(sd.DASHBOARDS, name))
    defined = [v["name"] for v in dashboard["templating"]["list"]]
    assert defined[:2] == ["run", "rank"], "run and rank come first on every dashboard"
    used = set()
    for case in CASES:
        if case.dashboard == name:
            used |= grafana.used_variables(case.expr) | grafana.used_variables((case.target or {}).get("interval", ""))
    builtins = set(grafana.Dashboard().builtins(1, 1))
    assert used - builtins <= set(defined), f"undefined: {used - builtins - set(defined)}"
    assert set(defined) <= used, f"defined but unused: {set(defined) - used}"
    for label in ("op", "group"):
        uses_label = any(re.search(rf"\b{label}=~\"\${label}\"", c.expr) for c in CASES if c.dashboard == name)
        assert uses_label == (label in defined)
    for var in dashboard["templating"]["list"]:
        if var["name"] == "run":
            assert not var["multi"] and not var["includeAll"]  # one run at a time
            assert var["sort"] == 0 and "sort_desc(" in sd.variable_query(var)  # newest first, by time
        elif var["type"] == "query":
            assert var["multi"] and var["includeAll"] and "allValue" not in var


def test_collectives_dashboard_compares_busbw_with_a_link_peak_variable():
    dashboard = sd.load_dashboard(os.path.join(sd.DASHBOARDS, "collectives.json"))
    (peak,) = [v for v in dashboard["templating"]["list"] if v["name"] == "link_peak_gbps"]
    assert peak["type"] == "custom" and float(peak["current"]["value"]) > 0
    exprs = " ".join(c.expr for c in CASES if c.dashboard == "collectives.json")
    assert "vector($link_peak_gbps * 1e9)" in exprs
    assert "rate(torchdist_collective_bus_bytes_total" in exprs and "rate(torchdist_collective_bytes_total" in exprs
    assert any(c.exemplar and "torchdist_collective_duration_seconds_bucket" in c.expr for c in CASES)


def test_every_series_is_in_the_frozen_schema_or_a_recording_rule():

    known = prometheus_names.prometheus_series_names()
    recorded = set(sd.recording_rules())
    for case in CASES:
        assert sd.referenced_series(case.expr) <= known, (case.case_id, sd.referenced_series(case.expr) - known)
        assert sd.referenced_recordings(case.expr) <= recorded, case.case_id


def test_every_dashboard_matches_grafanas_published_schema():
    """@grafana/schema 12.4.0 (the Grafana deploy/ runs), through the TypeScript compiler: wrong or unknown
    fields, enum values and types fail (tests/grafana_schema/check.py)."""
    from .grafana_schema import check

    if shutil.which("node") is None or not os.path.isdir(os.path.join(os.path.dirname(check.__file__), "node_modules")):
        pytest.skip("needs Node.js and `npm ci --prefix tests/grafana_schema` (.ci/install runs it)")
    status, messages = check.check(sd.dashboard_files())
    assert status == 0 and not messages.strip(), messages


def test_the_schema_check_catches_what_grafana_would_not_load(tmp_path):
    from .grafana_schema import check

    if shutil.which("node") is None or not os.path.isdir(os.path.join(os.path.dirname(check.__file__), "node_modules")):
        pytest.skip("needs Node.js and `npm ci --prefix tests/grafana_schema` (.ci/install runs it)")
    dashboard = sd.load_dashboard(os.path.join(sd.DASHBOARDS, "collectives.json"))
    panel = next(p for p in dashboard["panels"] if p["type"] == "timeseries")
    panel["options"]["legend"]["displayMode"] = "tabel"
    panel["fieldConfig"]["defaults"]["custom"]["lineWidthh"] = 1
    dashboard["templating"]["list"][0]["sortt"] = 1
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(dashboard))
    # TypeScript reports one error per object literal: a missing required field in a file of its own
    unversioned = sd.load_dashboard(os.path.join(sd.DASHBOARDS, "gpu.json"))
    del unversioned["schemaVersion"]
    (tmp_path / "unversioned.json").write_text(json.dumps(unversioned))
    status, messages = check.check([str(path), str(tmp_path / "unversioned.json")])
    assert status != 0
    for wrong in ('"tabel"', "lineWidthh", "sortt", "'schemaVersion' is missing"):
        assert wrong in messages, messages


@pytest.mark.skipif(shutil.which("promtool") is None, reason="needs promtool (Debian's prometheus)")
def test_every_expression_parses(tmp_path):
    """promtool parses every query (variables substituted): a typo fails here even where no data exists yet."""
    values = {"run": "r", "rank": "(0|1)", "op": "all_reduce", "group": "default_pg", "gpu": "0"}
    dashboard = grafana.Dashboard(variables=values | {"link_peak_gbps": "25", "resolution": "1m"})
    rules = [{"record": f"check:{i}", "expr": dashboard.query(c.panel, c.target, 0).expr} for i, c in enumerate(PANEL_CASES)]
    rules += [{"record": f"var:{i}", "expr": dashboard.expression(c.expr)} for i, c in enumerate(CASES) if c.kind == "variable"]
    path = tmp_path / "dashboards.rules.yml"
    path.write_text(json.dumps({"groups": [{"name": "dashboards", "rules": rules}]}))  # JSON is YAML
    done = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules)} rules found" in done.stdout


@pytest.mark.skipif(shutil.which("promtool") is None, reason="needs promtool (Debian's prometheus)")
def test_the_dcgm_panels_show_a_gpu_two_ranks_report(tmp_path):
    """A rank reports every GPU its allocator holds memory on: with two ranks on one GPU (a torch.load
    without map_location), the DCGM panels' join by UUID was many-to-many, an error in place of the panel."""
    cases = [c for c in PANEL_CASES if "DCGM_FI_" in c.expr]
    assert len(cases) == 3
    dashboard = grafana.Dashboard(variables={"run": "j", "rank": ".*", "gpu": ".*", "resolution": "1m"})
    gpus = {"GPU-aaa": "0", "GPU-bbb": "1"}
    held = [("0", "GPU-aaa"), ("1", "GPU-bbb"), ("1", "GPU-aaa")]  # rank 1 holds memory on rank 0's GPU too
    series = [
        {"series": f'torchdist_gpu_utilization_ratio{{run="j",rank="{rank}",gpu="{gpus[uuid]}",uuid="{uuid}"}}', "values": "0.9x5"}
        for rank, uuid in held
    ]
    tests = []
    for case in cases:
        (metric,) = re.findall(r"\bDCGM_FI_\w+", case.expr)
        values = {"GPU-aaa": 0.7, "GPU-bbb": 0.6}
        series += [{"series": f'{metric}{{gpu="{gpus[u]}",UUID="{u}",job="dcgm",instance="dcgm:9400"}}', "values": f"{v}x5"} for u, v in values.items()]
        samples = [{"labels": f'{{rank="{rank}",gpu="{gpus[uuid]}"}}', "value": values[uuid]} for rank, uuid in held]
        tests.append({"expr": dashboard.query(case.panel, case.target, 0).expr, "eval_time": "3m", "exp_samples": samples})
    path = tmp_path / "dcgm.test.yml"
    path.write_text(json.dumps({"rule_files": [], "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": tests}]}))
    done = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


# ----------------------------------------------------------------------------------------------- live
@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    if prometheus_binary() is None:
        pytest.skip("needs Debian's prometheus (.ci/install)")
    live = sd.LiveStack(str(tmp_path_factory.mktemp("dashboards")), "dashboards-run").start()
    yield live
    live.stop()


@needs_prometheus
@pytest.mark.parametrize("case", [_param(c) for c in CASES if c.kind == "variable"])
def test_variable_lists_the_run(stack, case):
    dashboard = stack.dashboard(case.dashboard)  # evaluates every variable of the dashboard in order
    (variable,) = [v for v in sd.load_dashboard(os.path.join(sd.DASHBOARDS, case.dashboard))["templating"]["list"]
                   if f"var-{v['name']}" == case.case_id.split("/")[-1]]  # fmt: skip
    found = sd.variable_options(stack.prom, dashboard, variable)
    expected = {
        "run": {stack.run_id},
        "rank": {"0", "1"},
        "op": {"all_reduce", "broadcast", "all_gather_single", "_broadcast_coalesced", "barrier"},
        "group": {"default_pg", "pg1"},
        "gpu": {"0", "1"},
    }[case.label]
    assert expected <= set(found), found


@needs_prometheus
@pytest.mark.parametrize("case", [_param(c) for c in PANEL_CASES])
def test_panel_query_returns_data(stack, case):
    stack.query_ok(stack.dashboard(case.dashboard).query(case.panel, case.target, 0).expr)


@needs_prometheus
@pytest.mark.parametrize("case", [_param(c) for c in PANEL_CASES if c.exemplar])
def test_exemplars_open_traces_the_run_exported(stack, case):
    expr = stack.dashboard(case.dashboard).query(case.panel, case.target, 0).expr
    series = wait_for(lambda: stack.prom.exemplars(expr), 30, what=f"exemplars for {expr}")
    trace_ids = {e["labels"]["trace_id"] for s in series for e in s["exemplars"]}
    assert trace_ids and all(re.fullmatch(r"[0-9a-f]{32}", t) for t in trace_ids)
    assert all(re.fullmatch(r"[0-9a-f]{16}", e["labels"]["span_id"]) for s in series for e in s["exemplars"])
    # A span is in the export queue as soon as its exemplar is visible: give the exporter a moment.
    wait_for(lambda: trace_ids <= stack.exported_trace_ids(), 20, what="the exemplars' traces in traces.rank*.jsonl")
