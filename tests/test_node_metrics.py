"""metrics_aggregation="node": a node's ranks exported as one, checked against each rank's own summary and
scraped by a real Prometheus; the merge rules, hand-over files and restarts on their own."""

from __future__ import annotations

import bisect
import glob
import json
import logging
import os
import time

import pytest

from otel_torchdist import config
from otel_torchdist import names as n
from otel_torchdist.export import node
from otel_torchdist.telemetry import HistogramPoint, MetricData, NumberPoint

from .harness import finish_ranks, last_metrics, metric_value, start_ranks
from .peers import Prometheus, prometheus_binary
from .scenarios_node import ALL_REDUCES, BROADCASTS, STEPS

BOUNDS = n.DURATION_BUCKETS


def _hist(labels, values, exemplar=None):
    buckets = [0] * (len(BOUNDS) + 1)
    for v in values:
        buckets[bisect.bisect_left(BOUNDS, v)] += 1
    return HistogramPoint(labels, len(values), sum(values), buckets, BOUNDS, min(values), max(values), [exemplar] if exemplar else [])


def _rank(r, calls, loss, step, seq_done, durations, exemplar=None):
    base = {n.M_RUN: "r", n.M_RANK: str(r)}
    coll = {**base, n.M_OP: "all_reduce", n.M_GROUP: "default_pg"}
    grp = {**base, n.M_GROUP: "default_pg"}
    return [
        MetricData(n.COLLECTIVE_CALLS, [NumberPoint(coll, calls)]),
        MetricData(n.COLLECTIVE_DURATION, [_hist(coll, durations, exemplar)]),
        MetricData(n.TRAIN_LOSS, [NumberPoint(base, loss)]),
        MetricData(n.STEP_CURRENT, [NumberPoint(base, step)]),
        MetricData(n.GROUP_SEQ_COMPLETED, [NumberPoint(grp, seq_done)]),
        MetricData(n.HOST_NETWORK_IO, [NumberPoint({**base, n.M_HOST: "real-host", n.M_DIRECTION: "transmit"}, 1000 + r)]),
    ]


def _by_name(data):
    return {md.metric.name: md.points for md in data}


def test_every_gauge_says_how_a_node_combines_it():
    gauges = {m.name for m in n.METRICS if m.instrument == "gauge"}
    assert gauges <= set(node.NODE_MERGE), sorted(gauges - set(node.NODE_MERGE))
    assert set(node.NODE_MERGE) <= {m.name for m in n.METRICS}
    assert set(node.NODE_MERGE.values()) <= set(node.NODE_MERGE_RULES)


def test_merge_sums_counts_and_buckets_and_combines_gauges_by_their_rule():
    a = _rank(0, calls=5, loss=1.0, step=10, seq_done=40, durations=[1.5e-3, 2e-3], exemplar=(1.5e-3, 100, 1, 2))
    b = _rank(1, calls=7, loss=3.0, step=9, seq_done=38, durations=[2e-3, 0.2], exemplar=(2e-3, 200, 3, 4))
    got = _by_name(node.merge([a, b], "node-a"))
    (calls,) = got[n.COLLECTIVE_CALLS.name]
    assert calls.value == 12
    assert calls.attributes == {n.M_RUN: "r", n.M_OP: "all_reduce", n.M_GROUP: "default_pg", n.M_HOST: "node-a"}
    (hist,) = got[n.COLLECTIVE_DURATION.name]
    assert (hist.count, hist.min, hist.max) == (4, 1.5e-3, 0.2)
    assert hist.sum == pytest.approx(1.5e-3 + 2e-3 + 2e-3 + 0.2)
    assert hist.bucket_counts == [x + y for x, y in zip(a[1].points[0].bucket_counts, b[1].points[0].bucket_counts)]
    # 1.5 ms and 2 ms fall in one bucket (1 ms < v <= 2.5 ms): the later exemplar stays
    assert hist.exemplars == [(2e-3, 200, 3, 4)]
    assert got[n.TRAIN_LOSS.name][0].value == 2.0  # mean
    assert got[n.STEP_CURRENT.name][0].value == 9  # the laggard
    assert got[n.GROUP_SEQ_COMPLETED.name][0].value == 38
    (net,) = got[n.HOST_NETWORK_IO.name]  # one host read by both ranks: not doubled, named as the node
    assert net.value == 1001 and net.attributes[n.M_HOST] == "node-a"
    assert all(n.M_RANK not in p.attributes for points in got.values() for p in points)


def test_merge_keeps_points_with_different_labels_apart():
    a = [MetricData(n.COLLECTIVE_CALLS, [NumberPoint({n.M_RUN: "r", n.M_OP: "all_reduce", n.M_GROUP: "g"}, 1)])]
    b = [MetricData(n.COLLECTIVE_CALLS, [NumberPoint({n.M_RUN: "r", n.M_OP: "broadcast", n.M_GROUP: "g"}, 2)])]
    (md,) = node.merge([a, b], "x")
    assert sorted((p.attributes[n.M_OP], p.value) for p in md.points) == [("all_reduce", 1), ("broadcast", 2)]


def test_a_histogram_with_other_bounds_is_left_out_and_counted():
    from otel_torchdist import health

    a = _rank(0, 1, 0.0, 1, 1, [1e-3])
    odd = HistogramPoint(dict(a[1].points[0].attributes), 1, 5.0, [0, 1], (1.0,), 5.0, 5.0)
    before = health.errors().get("node_metrics", 0)
    (hist,) = _by_name(node.merge([a, [MetricData(n.COLLECTIVE_DURATION, [odd])]], "x"))[n.COLLECTIVE_DURATION.name]
    assert hist.count == 1
    assert health.errors().get("node_metrics", 0) == before + 1


def test_hand_over_round_trip_and_a_restarted_rank_keeps_its_counts(tmp_path, monkeypatch):
    where = str(tmp_path / "node-metrics" / "n")
    reader = node.NodeReader(where, 0, "n")
    own = _rank(0, 5, 1.0, 3, 9, [1e-3])
    peer = node.HandOver(where, 1)
    peer.export_metrics({}, _rank(1, 7, 3.0, 3, 9, [2e-3]), 0, 0)
    got = _by_name(reader.merge_with(own))
    assert got[n.COLLECTIVE_CALLS.name][0].value == 12
    assert got[n.COLLECTIVE_DURATION.name][0].count == 2
    assert reader.wait_final(0) is False  # the peer has not finished

    # The peer's process is replaced (an elastic restart) and counts from zero again.
    time.sleep(0.01)  # a new mtime
    monkeypatch.setattr(os, "getpid", lambda: 999_999_999)
    peer2 = node.HandOver(where, 1)
    peer2.export_metrics({}, _rank(1, 2, 5.0, 4, 11, [0.5]), 0, 0)
    got = _by_name(reader.merge_with(own))
    assert got[n.COLLECTIVE_CALLS.name][0].value == 5 + 7 + 2
    assert got[n.COLLECTIVE_DURATION.name][0].count == 3
    assert got[n.TRAIN_LOSS.name][0].value == 3.0  # gauges: the live process only (mean of 1 and 5)
    peer2.finish(_rank(1, 3, 5.0, 4, 11, [0.5, 0.5]))
    assert reader.wait_final(0) is True
    assert _by_name(reader.merge_with(own))[n.COLLECTIVE_CALLS.name][0].value == 5 + 7 + 3


def test_the_exporting_rank_waits_for_the_last_hand_over_then_says_who_is_missing(tmp_path):
    where = str(tmp_path)
    node.HandOver(where, 3).export_metrics({}, [], 0, 0)
    reader = node.NodeReader(where, 0, "n")
    logger = logging.getLogger("otel_torchdist")
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        t0 = time.monotonic()
        assert reader.wait_final(0.3) is False
        assert time.monotonic() - t0 >= 0.3
    finally:
        logger.removeHandler(handler)
    assert any("rank3.json" in m and "node n" in m for m in seen), seen


def test_a_rank_with_no_exporting_rank_on_its_node_says_so_once(tmp_path, monkeypatch):
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("otel_torchdist").addHandler(handler)
    monkeypatch.setattr(node.HandOver, "grace", 0.0)
    try:
        alone = node.HandOver(str(tmp_path / "alone"), 5)
        alone.export_metrics({}, [], 0, 0)
        alone.export_metrics({}, [], 0, 0)
        node.NodeReader(str(tmp_path / "served"), 0, "n")
        served = node.HandOver(str(tmp_path / "served"), 1)
        served.export_metrics({}, [], 0, 0)
    finally:
        logging.getLogger("otel_torchdist").removeHandler(handler)
    warnings = [m for m in seen if "no rank with LOCAL_RANK 0" in m]
    assert len(warnings) == 1 and str(tmp_path / "alone") in warnings[0]


@pytest.mark.parametrize(
    "options, message",
    [
        ({"metrics_aggregation": "host"}, "metrics_aggregation"),
        ({"node_name": "a/b"}, "node_name"),
        ({"node_metrics_interval": 0}, "node_metrics_interval"),
    ],
)
def test_bad_node_settings_are_refused_by_name(options, message):
    with pytest.raises(ValueError, match=message):
        config.load(options, environ={})


def test_node_settings_from_the_environment():
    cfg = config.load(
        {},
        environ={
            "OTEL_TORCHDIST_METRICS_AGGREGATION": "node",
            "OTEL_TORCHDIST_NODE_NAME": "gpu-17",
            "OTEL_TORCHDIST_NODE_METRICS_INTERVAL_MS": "2500",
        },
    )
    assert (cfg.metrics_aggregation, cfg.node_name, cfg.node_metrics_interval) == ("node", "gpu-17", 2.5)


@pytest.mark.skipif(prometheus_binary() is None, reason="needs Debian's prometheus (.ci/run installs it)")
def test_two_nodes_of_two_ranks_export_two_targets_summed_as_each_rank_counted(tmp_path):
    out = str(tmp_path / "job")
    run_folder = os.path.join(out, "runs", "node-run")
    go = str(tmp_path / "go")
    prom = Prometheus(
        str(tmp_path / "prom"),
        "  - job_name: ranks\n"
        "    honor_labels: true\n"
        "    file_sd_configs:\n"
        f"      - files: ['{run_folder}/prometheus-targets.*.json']\n"
        "        refresh_interval: 1s\n",
    ).start()
    proc = start_ranks("scenarios_node:node_metrics", 4, out, {"run_id": "node-run", "go": go})
    try:
        calls = prom.wait_query(
            'torchdist_collective_calls_total{run="node-run",op="all_reduce"}',
            timeout=90,
            check=lambda r: len(r) == 2 and all(float(s["value"][1]) == 2 * ALL_REDUCES for s in r),
        )
        assert sorted(s["metric"]["host"] for s in calls) == ["node-a", "node-b"]
        assert all("rank" not in s["metric"] for s in calls)
        assert len(prom.api("targets")["activeTargets"]) == 2  # the local ranks 0 only
        tokens = prom.query('torchdist_train_tokens_total{run="node-run"}')
        assert {s["metric"]["host"]: float(s["value"][1]) for s in tokens} == {
            "node-a": STEPS * (100 + 200),
            "node-b": STEPS * (300 + 400),
        }
        loss = prom.query('torchdist_train_loss{run="node-run"}')
        assert {s["metric"]["host"]: float(s["value"][1]) for s in loss} == {"node-a": 0.5, "node-b": 2.5}
        steps = prom.query('torchdist_steps_total{run="node-run"}')
        assert [float(s["value"][1]) for s in steps] == [2 * STEPS, 2 * STEPS]
        count = prom.query('sum(torchdist_collective_duration_seconds_count{run="node-run"})')
        assert float(count[0]["value"][1]) == 4 * (ALL_REDUCES + BROADCASTS)
        per_node = prom.query('count by (host) ({run="node-run", __name__=~"torchdist_.*"})')
        assert len(per_node) == 2
    finally:
        open(go, "w").close()
        try:
            finish_ranks(proc, out, 4)
        finally:
            prom.stop()

    # After the end: each node's file holds its ranks' final counts, equal to the sum of their own summaries.
    assert sorted(os.path.basename(p) for p in glob.glob(os.path.join(run_folder, "metrics.rank*.jsonl"))) == [
        "metrics.rank0.jsonl",
        "metrics.rank2.jsonl",
    ]
    for leader, name in ((0, "node-a"), (2, "node-b")):
        exported = last_metrics(os.path.join(run_folder, f"metrics.rank{leader}.jsonl"))
        summaries = [json.load(open(os.path.join(run_folder, f"summary.rank{r}.json"))) for r in (leader, leader + 1)]
        for op in ("all_reduce", "broadcast", "barrier"):
            expected = sum(row["calls"] for s in summaries for row in s["collectives"] if row["op"] == op)
            assert expected > 0
            assert metric_value(exported, n.COLLECTIVE_CALLS, op=op, host=name) == expected, op
        hand_over = json.load(open(os.path.join(run_folder, "node-metrics", name, f"rank{leader + 1}.json")))
        assert hand_over["final"] is True and hand_over["rank"] == leader + 1
