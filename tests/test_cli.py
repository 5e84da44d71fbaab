"""The ``otel-torchdist`` command on real runs: the demo, a straggler run and a hang run (real gloo ranks),
and synthetic run folders written with the library's own OTLP/JSON encoder where exact numbers are needed.

The three real jobs start together in one module fixture (about 20 s on two cores); every test reads them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from types import SimpleNamespace

import pytest

from otel_torchdist import names as n
from otel_torchdist import telemetry
from otel_torchdist.export import otlp
from otel_torchdist.cli import main

from .harness import REPO, finish_ranks, start_ranks

HANG_ARGS = {"threshold": 1.0, "timeout": 5}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("cli-runs")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TORCHELASTIC_", "SLURM_"))}
    env["OTEL_EXPORTER_PROMETHEUS_PORT"] = "0"
    demo = subprocess.Popen(
        [sys.executable, "-m", "otel_torchdist.cli", "demo", "--steps", "3", "--run-dir", str(base / "demo")],
        cwd=str(base),
        env={**env, "PYTHONPATH": REPO},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    strag = start_ranks("scenarios_steps:stragglers", 3, str(base / "strag"), {"ddp_slow": 1, "plain_slow": 2}, env=env)
    hang = start_ranks("scenarios_steps:hang", 3, str(base / "hang"), HANG_ARGS, env=env)
    try:
        out, err = demo.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        demo.kill()
        raise
    finish_ranks(strag, str(base / "strag"), 3)
    finish_ranks(hang, str(base / "hang"), 3)
    assert demo.returncode == 0, err[-4000:]
    (run_id,) = os.listdir(base / "demo")
    return SimpleNamespace(
        base=base,
        demo=str(base / "demo" / run_id),
        demo_err=err,
        strag=str(base / "strag" / "runs" / "stragglers-ws3"),
        hang=str(base / "hang" / "runs" / "hang-ws3"),
    )


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def analyze_json(capsys, path: str, *extra: str) -> dict:
    code, out, err = run_cli(capsys, "analyze", path, "--json", *extra)
    assert code == 0, err
    return json.loads(out)


# ------------------------------------------------------------------------------- independent counts
def count_spans(folder: str) -> tuple[Counter, Counter]:
    """(collective spans per op, all ranks; collective spans per rank), counted straight from the files."""
    per_op: Counter = Counter()
    per_rank: Counter = Counter()
    for name in os.listdir(folder):
        if not name.startswith("traces.rank"):
            continue
        with open(os.path.join(folder, name)) as f:
            for line in f:
                for rs in json.loads(line)["resourceSpans"]:
                    rank = next(int(a["value"]["intValue"]) for a in rs["resource"]["attributes"] if a["key"] == n.RANK)
                    for ss in rs["scopeSpans"]:
                        for s in ss["spans"]:
                            keys = {a["key"] for a in s["attributes"]}
                            name = s["name"].rsplit(" rank=", 1)[0]  # the name as exported carries the rank
                            if n.COLL_OP in keys and name != n.SPAN_HANG:
                                per_op[name] += 1
                                per_rank[rank] += 1
    return per_op, per_rank


def count_metric_calls(folder: str) -> Counter:
    """Calls per op from each rank's last metrics export, summed over ranks."""
    calls: Counter = Counter()
    for name in os.listdir(folder):
        if not name.startswith("metrics.rank"):
            continue
        with open(os.path.join(folder, name)) as f:
            last = f.readlines()[-1]
        for rm in json.loads(last)["resourceMetrics"]:
            for sm in rm["scopeMetrics"]:
                for m in sm["metrics"]:
                    if m["name"] == n.COLLECTIVE_CALLS.name:
                        for dp in m["sum"]["dataPoints"]:
                            op = next(a["value"]["stringValue"] for a in dp["attributes"] if a["key"] == n.M_OP)
                            calls[op] += int(dp["asInt"])
    return calls


# ------------------------------------------------------------------------------------------- demo
def test_the_demo_says_where_telemetry_goes_as_the_exporters_are_built(monkeypatch):
    """The run folder's copy included (run_folder_copy), as export/sinks.build adds it."""
    from otel_torchdist import demo

    for var in [v for v in os.environ if v.startswith("OTEL_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    where = demo.destinations("RUN", demo.instrument_options())
    assert where == (
        "traces: OTLP (http/protobuf) to http://collector:4318, OTLP/JSON lines in RUN; "
        "metrics: OTLP (http/protobuf) to http://collector:4318, OTLP/JSON lines in RUN, Prometheus /metrics on every rank (port 9464 + local rank)"
    )
    monkeypatch.setenv("OTEL_TORCHDIST_RUN_FOLDER_COPY", "false")
    assert demo.destinations("RUN", demo.instrument_options()).startswith("traces: OTLP (http/protobuf) to http://collector:4318; metrics:")


def test_demo_trains_every_path_and_ends_with_the_analysis(runs):
    err = runs.demo_err
    assert "otel-torchdist demo: 2 ranks, gloo, 3 steps each of MLPs trained with DDP, FSDP2 and tensor parallel" in err
    for label in ("ddp", "fsdp", "tp"):
        assert f"  {label:<5} [" in err  # a progress bar per model
    assert "otel-torchdist summary: run" in err and "all_reduce" in err
    assert "stragglers: " in err and "hangs: no hang" in err
    assert f"Telemetry of every rank is in {runs.demo}:" in err
    files = set(os.listdir(runs.demo))
    for rank in (0, 1):
        assert {f"traces.rank{rank}.jsonl", f"metrics.rank{rank}.jsonl", f"resource.rank{rank}.json"} <= files


def test_analyze_counts_equal_the_records_in_the_files(runs, capsys):
    data = analyze_json(capsys, runs.demo)
    spans_per_op, spans_per_rank = count_spans(runs.demo)
    metric_calls = count_metric_calls(runs.demo)
    rows = {r["op"]: r for r in data["ops"]["rows"]}
    assert set(rows) == set(spans_per_op) == set(metric_calls)
    for op, row in rows.items():
        assert row["count"] == spans_per_op[op] == metric_calls[op], op  # the demo traces every step
        assert row["source"] == "metrics"
    # every path was exercised: DDP buckets, FSDP2 all-gathers and reduce-scatters, tensor-parallel all-reduces
    assert {"_broadcast_coalesced", "all_reduce", "all_gather_single", "reduce_scatter_single"} <= set(rows)
    assert data["run"]["collective_spans"] == sum(spans_per_op.values())
    modules = {m["module"]: m for m in data["modules"]["rows"]}
    assert modules["Global"]["total"] == spans_per_rank[data["modules"]["rank"]]
    for unit in ("Sequential.0", "Sequential.2", "Sequential.4"):  # FSDP units, full paths: an all-gather in each forward, and backward work
        assert modules[unit]["counts"]["forward"] == 3 and modules[unit]["counts"]["backward"] >= 3
    assert modules["TPMLP.net2"]["counts"]["forward"] >= 1
    assert data["run"]["traced_steps"][:9] == list(range(1, 10))
    assert data["hangs"]["verdict"].startswith("no hang")


def test_analyze_text_says_where_each_table_came_from(runs, capsys):
    code, out, _ = run_cli(capsys, "analyze", runs.demo, "--noise-level", "2")
    assert code == 0
    assert "Collectives by op (counts, sizes, times and bandwidth from the metrics of ranks 0-1 (every call)" in out
    assert "Collectives by module and phase (collective spans of rank 0" in out
    assert "sharding.fully_shard" in out and "sharding.parallelize_module" in out  # noise level 1 and up
    assert "by message size (spans):" in out and "per rank:" in out  # noise level 2
    assert "Stragglers (steps: " in out and "Hangs: sequence numbers per group (last exported group metrics" in out
    assert "GPU utilization: no GPU metrics in this run" in out


# ------------------------------------------------------------------------------ stragglers, hangs
def test_straggler_run_names_the_slow_rank(runs, capsys):
    data = analyze_json(capsys, runs.strag)
    st = data["stragglers"]
    # Traced steps 1-10 are the DDP phase, where rank 1 computes 200 ms more; the library's last exchange
    # covered the plain loop, where rank 2 is late.
    assert st["slowest_rank"] == 1
    assert st["exchange_slowest"] == 2
    rows = {r["rank"]: r for r in st["rows"]}
    # This run shares 2 cores with the demo and the hang run (8 processes): every step is longer, so the
    # slow rank's share of it is smaller than alone; what must hold is that it stands out.
    # (The 200 ms is a known share of a step only alone; under that contention another rank's median
    # compute moves by a few tens of ms, so the margin asked is 20 % of a step, not a ratio.)
    others = max(rows[0]["score"], rows[2]["score"])
    assert rows[1]["score"] > 0.2 and rows[1]["score"] - others > 0.2, rows
    assert rows[1]["last_arrivals"] >= 0.6 * rows[1]["matched"] > 0
    assert rows[1]["mean_wait_s"] < rows[0]["mean_wait_s"]
    code, out, _ = run_cli(capsys, "analyze", runs.strag)
    assert "verdict: rank 1 is the slowest" in out
    assert "the library's last straggler exchange (a window of recent steps) named rank 2" in out


def test_hang_run_names_the_rank_that_never_arrived(runs, capsys):
    data = analyze_json(capsys, runs.hang)
    hangs = data["hangs"]
    (group,) = hangs["groups"]
    assert group["group"] == "default_pg"
    assert group["never_arrived"] == [0] and group["waiting"] == [1, 2]
    assert group["stuck_seq"] == 3 and group["op"] == "all_reduce"
    # On a loaded machine rank 0's first collective (connection set-up) may pass the 1 s threshold too: that
    # report is kept, marked resolved, and does not make rank 0 a waiter.
    assert {h["rank"] for h in hangs["hangs"] if not h["resolved"]} == {1, 2}
    assert all(h["seq"] < 3 for h in hangs["hangs"] if h["resolved"])
    code, out, _ = run_cli(capsys, "analyze", runs.hang)
    assert "verdict: default_pg: rank 0 never arrived at all_reduce sequence number 3; ranks 1-2 waited in it" in out
    assert "collective.hang: rank 1 all_reduce on default_pg, sequence number 3" in out


# ----------------------------------------------------------------------------- synthetic runs
def write_run(folder, *, world: int, step_s: float, busbw_gbps: float, steps: int = 6, size: int = 64 << 20) -> float:
    """A run folder as ranks would write it, through the library's OTLP/JSON encoder; returns t per all-reduce."""
    os.makedirs(folder, exist_ok=True)
    factor = 2 * (world - 1) / world
    t = size * factor / (busbw_gbps * 1e9)  # nccl-tests: busbw = S / t * 2(n-1)/n
    run_id = os.path.basename(str(folder))
    base = 1_800_000_000 * 10**9
    for rank in range(world):
        resource = {n.RUN_ID: run_id, n.RANK: rank, n.WORLD_SIZE: world, n.BACKEND: "nccl", n.HOST_NAME: f"node{rank}"}
        spans = []
        for step in range(1, steps + 1):
            dur = step_s * (5 if step == 1 else 1)  # the first step holds set-up
            t0 = base + step * 10**9
            trace, root = step, 1000 + step
            spans.append(
                telemetry.SpanData(n.SPAN_RANK_STEP, trace, 2000 + step * 100 + rank, root, t0, t0 + int(dur * 1e9),
                              [(n.STEP, step), (n.STEP_DURATION, dur), (n.STEP_COMPUTE, dur - t), (n.STEP_COLLECTIVE_WAIT, t)])
            )
            spans.append(
                telemetry.SpanData("all_reduce", trace, 5000 + step * 100 + rank, 2000 + step * 100 + rank, t0,
                              t0 + int(t * 1e9),
                              [(n.COLL_OP, "all_reduce"), (n.COLL_KIND, "all_reduce"), (n.COLL_GROUP_NAME, "0"),
                               (n.COLL_GROUP_DESC, "default_pg"), (n.COLL_GROUP_SIZE, world), (n.COLL_SEQ, step),
                               (n.COLL_MESSAGE_SIZE, size), (n.COLL_DURATION, t)])
            )
        with open(os.path.join(folder, f"traces.rank{rank}.jsonl"), "w") as f:
            f.write(otlp.spans_to_json(resource, spans) + "\n")
        labels = {n.M_RUN: run_id, n.M_RANK: str(rank)}
        op = {**labels, n.M_OP: "all_reduce", n.M_GROUP: "default_pg"}
        total = step_s * (steps + 4)
        buckets = [0] * (len(n.DURATION_BUCKETS) + 1)
        buckets[-1] = steps
        metrics = [
            telemetry.MetricData(n.COLLECTIVE_CALLS, [telemetry.NumberPoint(op, steps)]),
            telemetry.MetricData(n.COLLECTIVE_BYTES, [telemetry.NumberPoint(op, steps * size)]),
            telemetry.MetricData(n.COLLECTIVE_BUS_BYTES, [telemetry.NumberPoint(op, int(steps * size * factor))]),
            telemetry.MetricData(n.COLLECTIVE_DURATION, [telemetry.HistogramPoint(op, steps, steps * t, buckets, n.DURATION_BUCKETS)]),
            telemetry.MetricData(n.STEPS_METRIC, [telemetry.NumberPoint(labels, steps)]),
            telemetry.MetricData(n.STEP_DURATION_METRIC, [telemetry.HistogramPoint(labels, steps, total, buckets, n.DURATION_BUCKETS)]),
            telemetry.MetricData(n.STEP_COMPUTE_TIME, [telemetry.NumberPoint(labels, total - steps * t)]),
            telemetry.MetricData(n.STEP_COLLECTIVE_WAIT_TIME, [telemetry.NumberPoint(labels, steps * t)]),
            telemetry.MetricData(n.GROUP_SEQ_STARTED, [telemetry.NumberPoint({**labels, n.M_GROUP: "default_pg"}, steps)]),
            telemetry.MetricData(n.GROUP_SEQ_COMPLETED, [telemetry.NumberPoint({**labels, n.M_GROUP: "default_pg"}, steps)]),
        ]
        with open(os.path.join(folder, f"metrics.rank{rank}.jsonl"), "w") as f:
            f.write(otlp.metrics_to_json(resource, metrics, base, base + 100 * 10**9) + "\n")
    return t


def test_busbw_of_a_synthetic_run_is_the_nccl_tests_formula(tmp_path, capsys):
    size = 64 << 20
    t = write_run(tmp_path / "ws8", world=8, step_s=0.05, busbw_gbps=123.0, size=size)
    (row,) = analyze_json(capsys, str(tmp_path / "ws8"))["ops"]["rows"]
    algbw = size / t / 1e9
    assert row["count"] == 8 * 6 and row["group_size"] == 8
    assert row["algbw_gbps"] == pytest.approx(algbw)
    assert row["busbw_gbps"] == pytest.approx(algbw * 2 * (8 - 1) / 8) == pytest.approx(123.0)
    assert row["p50_s"] == pytest.approx(t, rel=0.01)


def test_compare_runs_of_different_world_sizes(tmp_path, capsys):
    write_run(tmp_path / "a", world=2, step_s=0.100, busbw_gbps=10.0)
    write_run(tmp_path / "b", world=4, step_s=0.060, busbw_gbps=12.0)
    code, out, err = run_cli(capsys, "compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json")
    assert code == 0, err
    c = json.loads(out)
    assert c["schema"] == "otel-torchdist.compare" and c["version"] == 1
    assert c["a"]["step_time_s"] == pytest.approx(0.100) and c["b"]["step_time_s"] == pytest.approx(0.060)
    assert c["step_speedup"] == pytest.approx(0.100 / 0.060)
    assert c["rank_ratio"] == pytest.approx(2.0)
    assert c["strong_efficiency"] == pytest.approx((0.100 / 0.060) / 2)  # same global batch: ideal 2x
    assert c["weak_efficiency"] == pytest.approx(0.100 / 0.060)  # same batch per rank: ideal t_B = t_A
    assert c["throughput_speedup"] == pytest.approx((4 / 0.060) / (2 / 0.100))
    (op,) = c["ops"]
    assert op["busbw_a"] == pytest.approx(10.0) and op["busbw_b"] == pytest.approx(12.0)
    assert op["change"] == pytest.approx(0.2)
    code, out, _ = run_cli(capsys, "compare", str(tmp_path / "a"), str(tmp_path / "b"))
    assert "speedup per step: t_A / t_B = 100.00 ms / 60.00 ms = 1.667" in out
    assert "strong scaling (same global batch): ideal speedup N_B / N_A = 4 / 2 = 2.000; efficiency = 1.667 / 2.000 = 83.3%" in out
    assert "+20%" in out


# ------------------------------------------------------------------------------- plot and export
def test_plot_writes_non_empty_pngs(runs, tmp_path, capsys):
    code, out, err = run_cli(capsys, "plot", runs.demo, "-o", str(tmp_path / "charts"))
    assert code == 0, err
    for name in ("timeline.png", "busbw_by_size.png", "step_heatmap.png"):
        path = tmp_path / "charts" / name
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000, name
        assert f"wrote {path}" in out
    assert "skipped gpu_utilization.png: no GPU metrics in this run" in out  # a CPU run
    assert not (tmp_path / "charts" / "gpu_utilization.png").exists()
    code, out, _ = run_cli(capsys, "plot", runs.demo, "-o", str(tmp_path / "step2"), "--step", "2")
    assert code == 0 and "timeline.png (step 2)" in out


def test_plot_timeline_draws_what_its_caption_says_and_busbw_joins_neighbours_only(runs):
    from otel_torchdist.analysis import plot
    from otel_torchdist.analysis.report import SizeRow
    from otel_torchdist.analysis import analyze_path

    report = analyze_path(runs.demo, noise_level=1)
    row = plot.pick_step(report, None)
    fig = plot.timeline_figure(plot._step_records(runs.demo, row), row)
    ax = fig.axes[0]
    assert "phases above, collectives below" in ax.get_xlabel() and ax.yaxis_inverted()
    centre = lambda label: {round(b.get_y() + b.get_height() / 2 - round(b.get_y() + b.get_height() / 2), 2)  # noqa: E731
                            for c in ax.containers if c.get_label().strip() == label for b in c}
    assert centre("forward") == {-0.2} and centre("all_reduce") == {0.2}  # above = smaller y, inverted axis

    def rows(*floors):
        return [SizeRow(op="all_reduce", kind="", group_size=2, size_floor=f, count=1, mean_message_size=f, total_s=1.0,
                        algbw_gbps=1.0, busbw_gbps=1.0) for f in floors]
    runs_of = plot.adjacent_runs(rows(4, 8, 16, 1 << 20, 1 << 22, 1 << 23))
    assert [[r.size_floor for r in run] for run in runs_of] == [[4, 8, 16], [1 << 20], [1 << 22, 1 << 23]]


def test_perfetto_export_has_one_track_per_rank(runs, tmp_path, capsys):
    out_path = tmp_path / "trace.json"
    code, out, err = run_cli(capsys, "export", runs.demo, "--perfetto", str(out_path))
    assert code == 0, err
    doc = json.loads(out_path.read_text())
    events = doc["traceEvents"]
    assert {e["pid"] for e in events} == {0, 1}
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert set(names) == {0, 1} and names[0].startswith("rank 0")
    steps = [e for e in events if e["ph"] == "X" and e["cat"] == "step"]
    traced = len(analyze_json(capsys, runs.demo)["run"]["traced_steps"])
    assert len(steps) == 2 * traced
    begins = Counter(e["id"] for e in events if e["ph"] == "b")
    ends = Counter(e["id"] for e in events if e["ph"] == "e")
    assert begins == ends and begins  # async slices (DDP buckets, sharding) close
    assert all(e["dur"] >= 0 for e in events if e["ph"] == "X")
    assert "one track per rank" in out
    timed = [e for e in events if "ts" in e]
    assert all(type(e["ts"]) is int for e in timed) and all(type(e["dur"]) is int for e in timed if "dur" in e)
    assert min(e["ts"] for e in timed) >= 0 and doc["otherData"]["run_start_unix_ns"] > 1.6e18
    for pid in (0, 1):  # the training thread's slices nest or follow one another: none overlaps the next
        stack: list[int] = []
        for e in sorted((e for e in events if e["ph"] == "X" and e["pid"] == pid), key=lambda e: (e["ts"], -e["dur"])):
            while stack and stack[-1] <= e["ts"]:
                stack.pop()
            assert not stack or e["ts"] + e["dur"] <= stack[-1], e
            stack.append(e["ts"] + e["dur"])


def test_export_leaves_what_it_reads_and_what_was_there_as_they_were(runs, tmp_path, capsys):
    """`export X --perfetto X` truncated its own input, found nothing to export and removed it; a run with
    nothing to export removed a file that was there before; an unusable path was a traceback."""
    source = tmp_path / "run"
    shutil.copytree(runs.demo, source)
    inside = source / "traces.rank0.jsonl"
    before = inside.read_bytes()
    with pytest.raises(SystemExit) as exc:
        run_cli(capsys, "export", str(source), "--perfetto", str(inside))
    assert exc.value.code == 2 and "is one of the files it would read" in capsys.readouterr().err
    assert inside.read_bytes() == before
    metrics_only = tmp_path / "metrics-only"
    metrics_only.mkdir()
    shutil.copy(source / "metrics.rank0.jsonl", metrics_only)
    kept = tmp_path / "trace.json"
    kept.write_text("an earlier export")
    code, _, err = run_cli(capsys, "export", str(metrics_only), "--perfetto", str(kept))
    assert code == 1 and "holds no spans to export" in err and kept.read_text() == "an earlier export"
    code, _, err = run_cli(capsys, "export", str(source), "--perfetto", str(tmp_path / "no" / "trace.json"))
    assert code == 1 and "cannot write" in err and "Traceback" not in err
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".partial")]


# ------------------------------------------------------------------------------------ bad input
def test_missing_and_empty_folders(tmp_path, capsys):
    code, _, err = run_cli(capsys, "analyze", str(tmp_path / "nope"))
    assert code == 1 and f"otel-torchdist analyze: error: {tmp_path / 'nope'} does not exist" in err
    (tmp_path / "empty").mkdir()
    code, _, err = run_cli(capsys, "analyze", str(tmp_path / "empty"))
    assert code == 1 and "holds no otel-torchdist telemetry (no traces.rank<R>.jsonl or metrics.rank<R>.jsonl" in err
    (tmp_path / "blank").mkdir()
    (tmp_path / "blank" / "traces.rank0.jsonl").write_text("")
    (tmp_path / "blank" / "metrics.rank0.jsonl").write_text("")
    code, _, err = run_cli(capsys, "analyze", str(tmp_path / "blank"))
    assert code == 1 and "every telemetry file is empty" in err and "were killed before their first export" in err


def test_a_folder_of_runs_asks_for_one(runs, tmp_path, capsys):
    shutil.copytree(runs.demo, tmp_path / "runs" / "first")
    code, _, err = run_cli(capsys, "analyze", str(tmp_path / "runs"))
    assert code == 1 and "is a folder of 1 run folder, not a run: pass one of them (newest last: first)" in err
    (tmp_path / "runs" / "trace.json").write_text('{"traceEvents": []}')  # an export beside the runs
    code, _, err = run_cli(capsys, "analyze", str(tmp_path / "runs"))
    assert code == 1 and "is a folder of 1 run folder, not a run: pass one of them (newest last: first); or one of its other files (trace.json)" in err


def test_cut_and_foreign_lines_give_a_partial_answer(runs, tmp_path, capsys):
    folder = tmp_path / "damaged"
    shutil.copytree(runs.demo, folder)
    traces = folder / "traces.rank1.jsonl"
    text = traces.read_text()
    traces.write_text(text[: len(text) - 200])  # rank 1 killed while writing its last line
    metrics = folder / "metrics.rank0.jsonl"
    metrics.write_text('{"resource": "something else"}\n' + metrics.read_text())
    code, out, _ = run_cli(capsys, "analyze", str(folder))
    assert code == 0
    assert "traces.rank1.jsonl:" in out and "the last line is cut short" in out and "was the process killed" in out
    assert "metrics.rank0.jsonl:1: JSON, but not an OTLP export request" in out
    assert "Collectives by op" in out and "verdict:" in out  # the rest is still analyzed


def test_one_rank_only_says_what_is_missing(runs, tmp_path, capsys):
    folder = tmp_path / "rank0"
    folder.mkdir()
    for name in os.listdir(runs.demo):
        if ".rank0." in name:
            shutil.copy(os.path.join(runs.demo, name), folder)
    code, out, _ = run_cli(capsys, "analyze", str(folder))
    assert code == 0
    assert "1 rank of 2" in out
    assert "note: only rank 0 of 2 left telemetry here; missing: 1." in out
    assert "verdict: one rank only: there is no other rank to compare it with" in out
    assert "rank 1 left none, so whether they arrived is unknown" in out


def test_a_jaeger_download_is_analyzed(runs, tmp_path, capsys):
    spans = []
    for rank in (0, 1):
        with open(os.path.join(runs.demo, f"traces.rank{rank}.jsonl")) as f:
            for line in f:
                spans.extend(json.loads(line)["resourceSpans"])
    path = tmp_path / "trace-download.json"
    path.write_text(json.dumps({"resourceSpans": spans}, indent=2))
    data = analyze_json(capsys, str(path))
    per_op, _ = count_spans(runs.demo)
    assert {r["op"]: r["count"] for r in data["ops"]["rows"]} == dict(per_op)
    assert all(r["source"] == "spans" for r in data["ops"]["rows"])
    assert any("no metrics for ranks 0-1" in note for note in data["run"]["notes"])


# ----------------------------------------------------------------------------------- the command
def test_help_is_full_sentences(capsys):
    for command in ("demo", "analyze", "compare", "plot", "export"):
        with pytest.raises(SystemExit) as exc:
            main([command, "--help"])
        assert exc.value.code == 0
        out = capsys.readouterr().out
        assert len(re.findall(r"[a-z)]\.\s", out)) >= 3, command  # sentences, not fragments
    with pytest.raises(SystemExit):
        main(["analyze", "--help"])
    out = capsys.readouterr().out
    assert "--noise-level" in out and "CommDebugMode" in out and "--json" in out


def test_version_is_the_installed_distributions(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"otel-torchdist {version('otel-torchdist')}"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["analyze", "x", "--noise-level", "7"], "--noise-level takes 0, 1 or 2, got 7"),
        (["plot", "x"], "the following arguments are required: -o/--output"),
        (["demo", "--model", "moe"], "argument --model: invalid choice: 'moe'"),
        (["demo", "--steps", "0"], "--steps must be at least 1, got 0"),
    ],
)
def test_errors_name_the_flag(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_plot_without_matplotlib_names_the_extra_to_install(runs, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what `import matplotlib` meets when it is not installed
    code, _, err = run_cli(capsys, "plot", runs.demo, "-o", str(tmp_path / "png"))
    assert code == 1
    assert err.strip() == "otel-torchdist plot: error: plot needs matplotlib, which a plain install leaves out: pip install 'otel-torchdist[plot]'"
    assert not (tmp_path / "png").exists()


def test_export_and_plot_errors_name_the_flag(runs, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["export", runs.demo])
    assert exc.value.code == 2 and "export needs --perfetto OUT.json" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["plot", runs.demo, "-o", str(tmp_path / "c"), "--step", "999"])
    assert exc.value.code == 2 and "--step 999 was not traced in this run (traced steps: 1-" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["plot", runs.demo, "-o", str(tmp_path / "c"), "--step", "2#x"])
    assert exc.value.code == 2 and "--step takes a step number, or N#K for a repeated number's K-th repeat, got '2#x'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["plot", runs.demo, "-o", str(tmp_path / "c"), "--step", "2#1"])
    assert exc.value.code == 2 and "--step 2#1 was not traced in this run" in capsys.readouterr().err


def test_plot_draws_every_ranks_part_of_a_step_begun_inside_the_programs_spans(tmp_path):
    """Each rank's step under its own iteration span is in that span's trace: the timeline took the spans
    of the first rank's trace only, and drew one rank of two."""
    from otel_torchdist.analysis import analyze_path, plot

    from .harness import run_ranks

    run_ranks("scenarios_steps:user_span_steps", 2, str(tmp_path), {})
    folder = os.path.join(str(tmp_path), "runs", "user-span-steps")
    report = analyze_path(folder, noise_level=1)
    row = plot.pick_step(report, 3)
    records = plot._step_records(folder, row)
    assert {r.rank for r in records} == {0, 1}
    assert {(type(r).__name__, r.rank) for r in records} >= {("RankStep", 0), ("RankStep", 1), ("Collective", 0), ("Collective", 1)}
    assert all(r.step == 3 for r in records if type(r).__name__ == "RankStep")


_WITHOUT_TORCH = """
import importlib.abc, json, sys

class NoTorch(importlib.abc.MetaPathFinder):  # a laptop's Python, where torch is not installed
    def find_spec(self, name, path, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError("No module named 'torch'")

sys.meta_path.insert(0, NoTorch())
from otel_torchdist import cli
for argv in (["analyze", sys.argv[1], "--json"], ["compare", sys.argv[1], sys.argv[1]], ["export", sys.argv[1], "--perfetto", sys.argv[2]]):
    assert cli.main(argv) == 0, argv
print("torch" in sys.modules)
"""


def test_the_analysis_commands_run_without_torch(tmp_path):
    """analyze, compare and export read run folders: a laptop without torch ran none of them (the package's
    import pulled in the instrumentation, and torch with it). Simulated by refusing torch's import."""
    import subprocess
    import sys

    write_run(tmp_path / "run", world=2, step_s=0.05, busbw_gbps=10.0)
    done = subprocess.run([sys.executable, "-c", _WITHOUT_TORCH, str(tmp_path / "run"), str(tmp_path / "t.json")],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "False"
