"""The analysis builders on synthetic records: numbers checked against formulas computed here.

No processes, no files except where the loader itself is under test: these are the fast tests of
``otel_torchdist.analysis``; ``test_cli.py`` runs the command on real runs.
"""

from __future__ import annotations

import json
import math
import random
import statistics

import pytest

from otel_torchdist import names as n
from otel_torchdist.analysis import builders, loader, render_text, report
from otel_torchdist.analysis.compare import compare
from otel_torchdist.analysis.records import (
    Collective,
    Hang,
    Histogram,
    MetricPoint,
    MetricSnapshot,
    Problem,
    RankResource,
    RankStep,
    Span,
)
from otel_torchdist.analysis.stats import Sketch, histogram_quantile, kind_of

MS = 1_000_000  # ns


def coll(rank, *, op="all_reduce", kind="all_reduce", size=1 << 20, dur=0.001, start=0, seq=1, n_ranks=4,
         group="default_pg", group_name="0", trace="t1", **kw) -> Collective:
    return Collective(
        rank=rank, op=op, kind=kind, group=group, group_name=group_name, group_size=n_ranks,
        group_ranks=tuple(range(n_ranks)), seq=seq, message_size=size, start_ns=start,
        end_ns=start + int(dur * 1e9), duration_s=dur, trace_id=trace, **kw,
    )


def rank_step(rank, step, *, dur, compute, wait, start=0, trace=None) -> RankStep:
    return RankStep(
        rank=rank, step=step, trace_id=trace or f"trace{step}", span_id=f"s{rank}{step}", start_ns=start,
        end_ns=start + int(dur * 1e9), duration_s=dur, compute_s=compute, wait_s=wait,
    )


def resources(world: int) -> list[RankResource]:
    return [RankResource(rank=r, world_size=world, run_id="synthetic", backend="gloo") for r in range(world)]


# ------------------------------------------------------------------------------------ bandwidth
def test_busbw_is_bytes_weighted_with_nccl_tests_bus_factor():
    rng = random.Random(3)
    records = list(resources(4))
    sizes, times = [], []
    for rank in range(4):
        for i in range(50):
            s, t = rng.choice([1 << 10, 1 << 16, 1 << 22]), rng.uniform(1e-4, 5e-3)
            sizes.append(s)
            times.append(t)
            records.append(coll(rank, size=s, dur=t, seq=i + 1, start=i * 10 * MS))
    for rank in range(4):  # an all_gather and a broadcast on the same group
        records.append(coll(rank, op="all_gather_into_tensor", kind="all_gather", size=4000, dur=0.002, seq=100))
        records.append(coll(rank, op="broadcast", kind="broadcast", size=8000, dur=0.004, seq=101))
    rows = {r.op: r for r in builders.ops_table(records).rows}

    ar = rows["all_reduce"]
    algbw = sum(sizes) / sum(times) / 1e9  # nccl-tests: algbw = S / t, GB/s
    assert ar.count == 200 and ar.calls_per_rank == 50 and ar.ranks == 4
    assert ar.algbw_gbps == pytest.approx(algbw)
    assert ar.busbw_gbps == pytest.approx(algbw * 2 * (4 - 1) / 4)  # all_reduce: 2(n-1)/n
    assert ar.total_bytes == sum(sizes) and ar.total_s == pytest.approx(sum(times))
    assert ar.mean_s == pytest.approx(statistics.fmean(times))
    assert ar.p50_s == pytest.approx(sorted(times)[math.ceil(0.5 * len(times)) - 1], rel=0.01)
    assert ar.p99_s == pytest.approx(sorted(times)[math.ceil(0.99 * len(times)) - 1], rel=0.01)
    assert ar.quantiles_from == "spans" and ar.source == "spans"
    assert rows["all_gather_into_tensor"].busbw_gbps == pytest.approx(4000 / 0.002 / 1e9 * 3 / 4)  # (n-1)/n
    assert rows["broadcast"].busbw_gbps == pytest.approx(8000 / 0.004 / 1e9)  # factor 1
    assert [r.op for r in builders.ops_table(records).rows][0] == "all_reduce"  # ordered by total time


@pytest.mark.parametrize("subgroup_first", [True, False])
def test_busbw_by_size_takes_each_groups_bus_factor(subgroup_first):
    """1 MiB all-reduces on a world of 3 and on a subgroup of 2 fell in one bucket, with the bus factor of
    whichever group came first (busbw equal to algbw, or 2(3-1)/3 for the subgroup's calls)."""
    records = list(resources(3))
    world = [coll(r, dur=0.004, seq=1, n_ranks=3) for r in range(3)]
    sub = [coll(r, dur=0.002, seq=1, n_ranks=2, group="pg1", group_name="1") for r in range(2)]
    records += (sub + world) if subgroup_first else (world + sub)
    rows = {s.group_size: s for s in builders.ops_table(records).by_size}
    assert sorted(rows) == [2, 3] and all(s.size_floor == 1 << 20 for s in rows.values())
    assert rows[3].busbw_gbps == pytest.approx((1 << 20) / 0.004 / 1e9 * 2 * 2 / 3)
    assert rows[2].busbw_gbps == pytest.approx((1 << 20) / 0.002 / 1e9 * 2 * 1 / 2)


def _collective_metrics(rank: int, op: str, calls: int, nbytes: int, bus: int, dur_sum: float,
                        buckets: list[int]) -> MetricSnapshot:
    labels = {n.M_RUN: "synthetic", n.M_RANK: str(rank), n.M_OP: op, n.M_GROUP: "default_pg"}
    return MetricSnapshot(
        rank=rank,
        time_ns=10,
        metrics={
            n.COLLECTIVE_CALLS.name: [MetricPoint(attributes=labels, value=calls)],
            n.COLLECTIVE_BYTES.name: [MetricPoint(attributes=labels, value=nbytes)],
            n.COLLECTIVE_BUS_BYTES.name: [MetricPoint(attributes=labels, value=bus)],
            n.COLLECTIVE_ERRORS.name: [MetricPoint(attributes=labels, value=0)],
            n.COLLECTIVE_DURATION.name: [
                MetricPoint(
                    attributes=labels,
                    value=Histogram(count=calls, sum=dur_sum, bounds=n.DURATION_BUCKETS, bucket_counts=tuple(buckets)),
                )
            ],
        },
    )


def test_a_failed_calls_time_is_in_no_rows_bandwidth_or_mean():
    """A call that timed out after 6 s moved nothing: its time made the row's algbw 133 times too low (its
    bytes were already left out, its time was not)."""
    records = resources(2) + [coll(r, size=4000, dur=0.005, seq=s, n_ranks=2) for r in range(2) for s in (1, 2)]
    records += [coll(0, size=4000, dur=6.0, seq=3, n_ranks=2, error="DistBackendError: timed out")]
    (row,) = builders.ops_table(records).rows
    assert row.count == 5 and row.errors == 1
    assert row.total_s == pytest.approx(0.020) and row.mean_s == pytest.approx(0.005)
    assert row.algbw_gbps == pytest.approx(16000 / 0.020 / 1e9)


def test_metrics_are_preferred_and_quantiles_come_from_histograms_without_spans():
    buckets = [0] * (len(n.DURATION_BUCKETS) + 1)
    i = n.DURATION_BUCKETS.index(1e-3)
    buckets[i] = 100  # 100 calls between 0.5 ms and 1 ms
    records = resources(2) + [
        _collective_metrics(r, "all_reduce", 100, 100 * 4096, 100 * 4096, 0.075, buckets) for r in range(2)
    ]
    # rank 0 also traced 3 of its calls: metrics (100 calls) win for the counts
    records += [coll(0, size=4096, dur=0.001, seq=s, n_ranks=2) for s in (1, 2, 3)]
    (row,) = builders.ops_table(records).rows
    assert row.count == 200 and row.source == "metrics"
    alg = 200 * 4096 / 0.15 / 1e9
    assert row.algbw_gbps == pytest.approx(alg)
    assert row.busbw_gbps == pytest.approx(alg * 2 * (2 - 1) / 2)
    assert row.quantiles_from == "spans"  # the traced calls give exact-ish quantiles
    only_metrics = [r for r in records if not isinstance(r, Collective)]
    (row,) = builders.ops_table(only_metrics).rows
    assert row.quantiles_from == "histogram"
    assert row.p50_s == pytest.approx(0.5e-3 + 0.5 * 0.5e-3)  # linear inside the (0.5, 1] ms bucket
    assert row.group_size == 2  # the default group spans the world


def test_stale_metrics_lose_to_more_spans():
    buckets = [0] * (len(n.DURATION_BUCKETS) + 1)
    records = resources(2) + [_collective_metrics(0, "all_reduce", 1, 4096, 4096, 0.001, buckets)]
    records += [coll(0, size=4096, dur=0.002, seq=s, n_ranks=2) for s in range(1, 6)]
    (row,) = builders.ops_table(records).rows
    assert row.count == 5 and row.source == "spans"


def test_kind_by_name_when_no_span_says_it():
    assert kind_of("reduce_scatter_tensor") == "reduce_scatter"
    assert kind_of("all_gather_into_tensor_coalesced") == "all_gather"
    assert kind_of("_broadcast_coalesced") == "broadcast"
    assert kind_of("batch_isend_irecv") == "send_recv"
    assert kind_of("monitored_barrier") == "barrier"


# -------------------------------------------------------------------------------------- sketches
def test_sketch_quantiles_within_one_percent():
    rng = random.Random(7)
    values = [rng.lognormvariate(-7, 1.5) for _ in range(20000)] + [0.0] * 10
    sk = Sketch()
    for v in values:
        sk.add(v)
    ordered = sorted(values)
    for q in (0.01, 0.5, 0.9, 0.99, 1.0):
        exact = ordered[max(1, math.ceil(q * len(values))) - 1]
        assert sk.quantile(q) == pytest.approx(exact, rel=0.01)
    assert len(sk.buckets) < 1000


def test_histogram_quantile_interpolates_like_prometheus():
    bounds = (1.0, 2.0, 4.0)
    assert histogram_quantile(0.5, bounds, [0, 10, 0, 0]) == pytest.approx(1.5)
    assert histogram_quantile(0.25, bounds, [10, 10, 0, 0]) == pytest.approx(0.5)
    assert histogram_quantile(0.99, bounds, [0, 0, 0, 5]) == 4.0  # +Inf bucket: the highest bound
    assert histogram_quantile(0.5, bounds, [0, 0, 0, 0]) is None


# ------------------------------------------------------------------------------------- modules
def test_module_counts_roll_up_the_hierarchy_like_comm_debug_mode():
    records = []
    for rank in range(2):
        seq = 0
        for module, phase, count in (("TPMLP.net1", "backward", 1), ("TPMLP.net2", "forward", 2), (None, "optimizer", 3)):
            for _ in range(count):
                seq += 1
                records.append(coll(rank, module=module, phase=phase, seq=seq, n_ranks=2))
    records.append(Span(rank=0, name=n.SPAN_FULLY_SHARD, trace_id="t", span_id="x", parent_id=None, start_ns=0, end_ns=1,
                        attributes={n.SHARD_MODULE: "Linear", n.SHARD_PARAMS: 1088, n.SHARD_MESH_SHAPE: [2]}))
    table = builders.module_counts(records, noise_level=2)
    rows = {r.module: r for r in table.rows}
    assert [r.module for r in table.rows] == ["Global", "TPMLP", "TPMLP.net1", "TPMLP.net2"]
    assert rows["Global"].counts == {"forward": 2, "backward": 1, "optimizer": 3} and rows["Global"].total == 6
    assert rows["TPMLP"].counts == {"forward": 2, "backward": 1}
    assert rows["TPMLP.net2"].depth == 2 and rows["TPMLP.net2"].counts == {"forward": 2}
    assert table.phases == ["forward", "backward", "optimizer"]
    assert table.consistent and table.rank == 0
    assert [(o.op, o.phase, o.count) for o in rows["TPMLP.net1"].ops] == [("all_reduce", "backward", 1)]
    assert table.sharding[0].module == "Linear" and table.sharding[0].parameters == 1088
    assert builders.module_counts(records, noise_level=0).sharding == []  # noise level 1 adds sharding
    assert builders.module_counts(records[:-2]).consistent is False  # rank 1 lost a record


# ---------------------------------------------------------------------------------- stragglers
def test_straggler_named_by_compute_and_arrival():
    records = list(resources(3))
    for step in range(1, 8):
        t0 = step * 100 * MS
        for rank in range(3):
            late = 20 * MS if rank == 2 else rank * MS // 10  # rank 2 arrives 20 ms late
            compute = 0.025 if rank == 2 else 0.005
            records.append(rank_step(rank, step, dur=0.05, compute=compute, wait=0.05 - compute, start=t0))
            records.append(coll(rank, seq=step, start=t0 + 5 * MS + late, dur=0.02, n_ranks=3, trace=f"trace{step}"))
    table = builders.stragglers(records)
    by_rank = {r.rank: r for r in table.rows}
    assert table.slowest_rank == 2
    assert table.matched == 7 and table.partial == 0
    assert by_rank[2].last_arrivals == 7 and by_rank[2].mean_late_s == pytest.approx(0.020)
    assert by_rank[2].steps == 6  # step 1 holds set-up: left out
    assert by_rank[2].score == pytest.approx((0.025 - 0.005) / 0.05)  # (compute - min compute) / mean step
    assert by_rank[0].score == pytest.approx(0.0)
    assert table.mean_skew_s == pytest.approx(0.020)
    assert "rank 2 is the slowest" in table.verdict


def test_no_straggler_when_ranks_are_even_and_one_rank_only():
    records = list(resources(2))
    for step in range(1, 5):
        for rank in range(2):
            records.append(rank_step(rank, step, dur=0.05, compute=0.01, wait=0.04))
    table = builders.stragglers(records)
    assert table.slowest_rank is None and table.verdict.startswith("no straggler")
    one = builders.stragglers([r for r in records if r.rank == 0])
    assert one.slowest_rank is None and "one rank only" in one.verdict


def test_partial_matches_are_counted_not_scored():
    records = [coll(0, seq=1, n_ranks=3), coll(1, seq=1, n_ranks=3)]  # rank 2 never recorded seq 1
    table = builders.stragglers(records)
    assert table.matched == 0 and table.partial == 1


# --------------------------------------------------------------------------------------- steps
def test_steps_table_median_step_time_and_async_share():
    records = list(resources(2))
    durations = {1: 0.9, 2: 0.10, 3: 0.12, 4: 0.11, 5: 0.30}
    for step, dur in durations.items():
        for rank in range(2):
            records.append(rank_step(rank, step, dur=dur, compute=dur * 0.75, wait=dur * 0.25, trace=f"tr{step}"))
            records.append(coll(rank, seq=step * 2, dur=0.01, is_async=True, trace=f"tr{step}", n_ranks=2))
            records.append(coll(rank, seq=step * 2 + 1, dur=0.03, trace=f"tr{step}", n_ranks=2))
    table = builders.steps_table(records, noise_level=1)
    assert [r.step for r in table.rows] == [1, 2, 3, 4, 5]
    assert table.step_time_s == pytest.approx(statistics.median([0.10, 0.12, 0.11, 0.30]))
    row = table.rows[1]
    assert row.comm_share == pytest.approx(0.25)
    assert row.async_share == pytest.approx(0.01 / 0.04)
    assert row.collectives == 2 and len(row.cells) == 2
    assert "median of 4 traced steps" in table.step_time_from
    # the split reads against the step time: same steps (the first's set-up left out), same statistic
    assert table.step_compute_s == pytest.approx(statistics.median([d * 0.75 for d in (0.10, 0.12, 0.11, 0.30)]))
    assert table.step_wait_s == pytest.approx(statistics.median([d * 0.25 for d in (0.10, 0.12, 0.11, 0.30)]))
    line = next(x for x in render_text.summary(builders.analyze_records(records)).splitlines() if x.startswith("  steps:"))
    assert line.endswith("of a step (medians) 86.2 ms compute, 28.7 ms in collectives")


# --------------------------------------------------------------------------------------- hangs
def _seq_snapshot(rank: int, started: int, completed: int, group: str = "default_pg") -> MetricSnapshot:
    labels = {n.M_RUN: "x", n.M_RANK: str(rank), n.M_GROUP: group}
    return MetricSnapshot(
        rank=rank,
        time_ns=5,
        metrics={
            n.GROUP_SEQ_STARTED.name: [MetricPoint(attributes=labels, value=started)],
            n.GROUP_SEQ_COMPLETED.name: [MetricPoint(attributes=labels, value=completed)],
        },
    )


def test_hang_report_names_the_rank_that_never_arrived():
    records = resources(4) + [_seq_snapshot(0, 7, 7), _seq_snapshot(1, 8, 7), _seq_snapshot(2, 8, 7), _seq_snapshot(3, 8, 7)]
    records += [
        Hang(rank=r, op="all_reduce", group="default_pg", group_name="0", seq=8, waited_s=2.0, threshold_s=1.5,
             start_ns=0, end_ns=2 * 10**9)
        for r in (1, 2, 3)
    ]
    table = builders.hang_report(records)
    (g,) = table.groups
    assert g.stuck_seq == 8 and g.never_arrived == [0] and g.waiting == [1, 2, 3] and g.op == "all_reduce"
    assert [(r.ranks, r.started, r.completed) for r in g.ranks] == [([0], 7, 7), ([1, 2, 3], 8, 7)]
    assert "rank 0 never arrived at all_reduce sequence number 8" in table.verdict


def test_a_rank_that_arrived_after_the_others_timed_out_is_named_late(tmp_path):
    """Rank 0 slept past rank 1's timeout, then started the all-reduce, which failed at once: both ranks
    started #5, so the report said "slow or failed, not missing a rank", where the hang board had named rank 0
    on rank 1's collective.hang span (torchdist.hang.missing_ranks)."""
    from otel_torchdist import telemetry
    from otel_torchdist.export import otlp

    hang = telemetry.SpanData(n.SPAN_HANG, 7, 8, None, 10**9, 3 * 10**9, [
        (n.COLL_OP, "all_reduce"), (n.COLL_GROUP_DESC, "default_pg"), (n.COLL_GROUP_NAME, "0"), (n.COLL_SEQ, 5),
        (n.HANG_WAITED, 1.5), (n.COLL_GROUP_RANKS, [0, 1]), (n.HANG_MISSING_RANKS, [0])])  # fmt: skip
    (tmp_path / "traces.rank1.jsonl").write_text(otlp.spans_to_json({n.RANK: 1, n.WORLD_SIZE: 2}, [hang]) + "\n")
    (loaded,) = [r for r in loader.iter_records(loader.discover(str(tmp_path)), []) if isinstance(r, Hang)]
    assert loaded.missing_ranks == (0,)
    failed = [coll(r, seq=5, n_ranks=2, dur=6.0 if r else 0.001, error="DistBackendError: timed out") for r in (0, 1)]
    records = resources(2) + [_seq_snapshot(0, 5, 4), _seq_snapshot(1, 5, 4), loaded] + failed
    table = builders.hang_report(records)
    assert table.verdict.startswith(
        "default_pg: rank 0 had not started all_reduce sequence number 5 when rank 1 reported waiting in it (1.5 s, "
        "the hang board's view), and started it later: late, not missing; it failed: DistBackendError"
    ), table.verdict


def test_hang_state_comes_from_the_last_export_that_has_it():
    # Rank 1's final export came after its groups were gone: no sequence gauges in it. The one before holds
    # the state (39 started), not the spans' lower bound (16).
    late = MetricSnapshot(rank=1, time_ns=9, metrics={n.GPU_UTILIZATION.name: []})
    records = resources(2) + [_seq_snapshot(0, 39, 39), _seq_snapshot(1, 39, 38), late, coll(1, seq=16, n_ranks=2)]
    table = builders.hang_report(records)
    (g,) = table.groups
    assert [(r.ranks, r.started, r.completed) for r in g.ranks] == [([0], 39, 39), ([1], 39, 38)]
    assert table.source.startswith("last exported group metrics of ranks 0-1")


def test_a_slow_collective_that_completed_later_is_not_a_hang():
    # Rank 0's first collective passed the threshold (connection set-up) and then completed; ranks 1-2 are stuck.
    records = resources(3) + [_seq_snapshot(0, 2, 2), _seq_snapshot(1, 3, 2), _seq_snapshot(2, 3, 2)]
    records += [
        Hang(rank=r, op="all_reduce", group="default_pg", group_name="0", seq=seq, waited_s=1.1, threshold_s=1.0,
             start_ns=0, end_ns=1)
        for r, seq in ((0, 1), (1, 3), (2, 3))
    ]
    table = builders.hang_report(records)
    (g,) = table.groups
    assert g.never_arrived == [0] and g.waiting == [1, 2]
    assert [(h.rank, h.resolved) for h in table.hangs] == [(0, True), (1, False), (2, False)]
    calm = resources(2) + [_seq_snapshot(0, 4, 4), _seq_snapshot(1, 4, 4), records[-3]]
    assert builders.hang_report(calm).verdict.startswith("no hang left: 1 collective.hang report(s)")


def test_hang_report_with_a_silent_rank_and_without_a_hang():
    records = resources(3) + [_seq_snapshot(0, 5, 5), _seq_snapshot(1, 5, 5)]
    table = builders.hang_report(records)
    assert table.groups[0].no_data == [2]
    assert table.verdict.startswith("no hang") and "rank 2 left none" in table.verdict
    stuck = resources(3) + [_seq_snapshot(0, 5, 4), _seq_snapshot(1, 5, 4)]
    assert "rank 2 never arrived" in builders.hang_report(stuck).verdict


def test_a_hang_in_a_subgroups_first_collective_names_the_member_that_never_arrived():
    # Group "pair" = ranks 1, 2; rank 1 is stuck in its first collective there, rank 2 never issued it, so
    # rank 2 has no metric for the group yet: only the hang span says who the members are.
    records = resources(3) + [_seq_snapshot(0, 3, 3), _seq_snapshot(1, 3, 3), _seq_snapshot(2, 3, 3)]
    records += [_seq_snapshot(1, 1, 0, group="pair")]
    records += [Hang(rank=1, op="all_reduce", group="pair", group_name="1", seq=1, waited_s=1.9, threshold_s=1.5,
                     start_ns=0, end_ns=1, group_ranks=(1, 2))]
    table = builders.hang_report(records)
    (pair,) = [g for g in table.groups if g.group == "pair"]
    assert pair.members == [1, 2] and pair.never_arrived == [2] and pair.waiting == [1]
    assert "pair: rank 2 never arrived at all_reduce sequence number 1" in table.verdict


def test_a_failed_call_counts_as_a_call_and_adds_no_bytes():
    """As the bytes counters count (drain/pipeline.py): a call that failed moved nothing the record vouches for."""
    records = resources(2) + [coll(r, seq=1, n_ranks=2, size=1000) for r in range(2)]
    records += [coll(r, seq=None, n_ranks=2, size=5000, error="RuntimeError: invalid tensor size") for r in range(2)]
    (row,) = builders.ops_table(records).rows
    assert (row.count, row.errors, row.total_bytes, row.mean_message_size) == (4, 2, 2000, 1000)
    assert "(2 failed)" in "\n".join(render_text.ops(builders.ops_table(records)))


def test_a_failure_the_run_went_on_after_is_no_hang():
    """Every failed collective set the group stuck, whatever came after it: the ranks finished at 13/13 and
    the verdict said they still waited in 13."""
    records = resources(2) + [_seq_snapshot(0, 13, 13), _seq_snapshot(1, 13, 13)]
    records += [coll(r, seq=None, n_ranks=2, error="TypeError: unsupported op") for r in range(2)]
    table = builders.hang_report(records)
    assert table.groups[0].stuck_seq is None
    assert table.verdict.startswith("no hang left: 0 collective.hang report(s) and 2 failed collective(s)")


def test_a_rank_whose_last_data_stops_early_is_named():
    """Rank 1 died between two metric exports (19) after its spans reached 59, while rank 0 reached 80: the
    verdict said no hang. The spans beyond a stale export count, and a rank behind is named."""
    records = resources(2) + [_seq_snapshot(0, 80, 80), _seq_snapshot(1, 19, 19), coll(1, seq=59, n_ranks=2)]
    table = builders.hang_report(records)
    assert [(r.ranks, r.started) for r in table.groups[0].ranks] == [([0], 80), ([1], 59)]
    assert table.verdict.startswith("default_pg: rank 1 last seen at sequence number 59 while rank 0 reached 80")


def test_hang_report_from_spans_alone():
    # A Jaeger download: no metrics. Ranks 1 and 2 reported a hang at seq 3; rank 0's last span is seq 2.
    records = [coll(r, seq=s, n_ranks=3) for r in range(3) for s in (1, 2)]
    records += [Hang(rank=r, op="all_reduce", group="default_pg", group_name="0", seq=3, waited_s=1.6,
                     threshold_s=1.5, start_ns=0, end_ns=1) for r in (1, 2)]
    table = builders.hang_report(records)
    assert table.groups[0].never_arrived == [0]
    assert "traced steps only" in table.source


def test_a_sampled_runs_step_time_is_the_metrics_mean_of_every_step_not_the_traced_warm_up():
    """The default sampling traces the first 10 steps and every 100th: their median was mostly warm-up (9.8 ms
    where the run's steps took 35), and compare's speedup was off by as much. The metrics count every step:
    their totals, less the traced set-up step, over the other steps; the slowest rank's."""
    steps, setup, warm, steady = 100, 1.0, 0.02, 0.1
    records = list(resources(2))
    for rank in range(2):
        first = rank_step(rank, 1, dur=setup, compute=0.9, wait=0.1, trace="tr1")
        first.setup = True
        records.append(first)
        records += [rank_step(rank, k, dur=warm, compute=warm / 2, wait=warm / 2, trace=f"tr{k}") for k in (2, 3, 4)]
        slow = steady * (1.5 if rank == 1 else 1.0)
        total = setup + 3 * warm + (steps - 4) * slow
        labels = {n.M_RUN: "synthetic", n.M_RANK: str(rank)}
        records.append(MetricSnapshot(rank=rank, time_ns=10, metrics={
            n.STEPS_METRIC.name: [MetricPoint(attributes=labels, value=steps)],
            n.STEP_DURATION_METRIC.name: [MetricPoint(attributes=labels, value=Histogram(
                count=steps, sum=total, bounds=n.DURATION_BUCKETS, bucket_counts=(0,) * (len(n.DURATION_BUCKETS) + 1)))],
            n.STEP_COMPUTE_TIME.name: [MetricPoint(attributes=labels, value=total * 0.75)],
            n.STEP_COLLECTIVE_WAIT_TIME.name: [MetricPoint(attributes=labels, value=total * 0.25)],
        }))  # fmt: skip
    table = builders.steps_table(records, noise_level=1)
    total1 = setup + 3 * warm + 96 * 0.15
    assert table.step_time_s == pytest.approx((total1 - setup) / 99)
    assert table.step_statistic == "mean"
    assert table.step_time_from == "mean of the 99 steps after the set-up step (metrics, every step; 4 traced)"
    assert table.step_compute_s == pytest.approx((total1 * 0.75 - 0.9) / 99)
    assert table.step_wait_s == pytest.approx((total1 * 0.25 - 0.1) / 99)
    every = [r for r in records if not isinstance(r, MetricSnapshot)]  # spans alone: the traced median
    assert builders.steps_table(every).step_time_s == pytest.approx(warm)


def test_a_steps_collectives_per_rank_round_up_and_spans_alone_claim_no_metrics():
    """One rank's one collective in a step of two ranks showed 0; a Jaeger download (spans alone) said
    "totals: metrics"."""
    records = resources(2) + [rank_step(r, 1, dur=0.1, compute=0.05, wait=0.05, trace="t1") for r in range(2)]
    records.append(coll(1, seq=1, n_ranks=2, trace="t1"))
    table = builders.steps_table(records)
    assert table.rows[0].collectives == 1
    assert table.source.endswith("; no step metrics") and "totals: metrics" not in table.source


# ------------------------------------------------------------------------------------- compare
def _report_with(world: int, step_s: float, busbw: float) -> report.Report:
    recs = list(resources(world))
    for step in range(1, 6):
        for rank in range(world):
            recs.append(rank_step(rank, step, dur=step_s, compute=step_s / 2, wait=step_s / 2))
    size = 10**6
    factor = 2 * (world - 1) / world
    recs += [coll(r, size=size, dur=size * factor / (busbw * 1e9), n_ranks=world, seq=1) for r in range(world)]
    return builders.analyze_records(recs, path=f"ws{world}")


def test_compare_scaling_arithmetic():
    a, b = _report_with(2, 0.100, 1.0), _report_with(8, 0.040, 1.5)
    c = compare(a, b)
    assert c.step_speedup == pytest.approx(0.100 / 0.040)
    assert c.rank_ratio == pytest.approx(4.0)
    assert c.strong_efficiency == pytest.approx((0.100 / 0.040) / 4)
    assert c.weak_efficiency == pytest.approx(0.100 / 0.040)
    assert c.throughput_speedup == pytest.approx((8 / 0.040) / (2 / 0.100))
    (op,) = c.ops
    assert op.busbw_a == pytest.approx(1.0) and op.busbw_b == pytest.approx(1.5) and op.change == pytest.approx(0.5)
    assert any("strong scaling" in line and "62.5%" in line for line in c.arithmetic)


def test_compare_says_when_one_runs_op_numbers_come_from_metrics_and_the_others_from_spans():
    buckets = [0] * (len(n.DURATION_BUCKETS) + 1)
    buckets[n.DURATION_BUCKETS.index(1e-3)] = 100
    spans_only = resources(2) + [coll(r, size=4096, dur=0.001, seq=s, n_ranks=2) for r in range(2) for s in (1, 2)]
    with_metrics = spans_only + [
        _collective_metrics(r, "all_reduce", 100, 100 * 4096, 100 * 4096, 0.075, buckets) for r in range(2)
    ]
    a, b = builders.analyze_records(with_metrics, path="a"), builders.analyze_records(spans_only, path="b")
    c = compare(a, b)
    (op,) = c.ops
    assert (op.source_a, op.source_b) == ("metrics", "spans")
    assert any("all_reduce (metrics in A, spans in B)" in note for note in c.notes)
    assert "metrics in A, spans in B" in render_text.compare(c)
    assert not [note for note in compare(b, b).notes if "sources" in note]


def test_plot_picks_a_repeated_step_numbers_later_occurrence_by_analyzes_label():
    from otel_torchdist.analysis import plot

    recs = list(resources(2))
    for occurrence, dur in ((0, 0.010), (1, 0.030)):  # two epochs numbering their steps 1, 2 again
        for step in (1, 2):
            for rank in range(2):
                r = rank_step(rank, step, dur=dur, compute=dur / 2, wait=dur / 2, start=occurrence * 10**9,
                              trace=f"t{step}-{occurrence}")
                r.occurrence = occurrence
                recs.append(r)
    rep = builders.analyze_records(recs, path="epochs")
    assert plot.pick_step(rep, 2).occurrence == 0  # the number alone: its first occurrence
    second = plot.pick_step(rep, 2, 1)
    assert (second.step, second.occurrence, second.duration_s) == (2, 1, pytest.approx(0.030))
    assert second.label == "2#1"
    with pytest.raises(plot.StepNotTraced, match=r"--step 2#3 was not traced .*repeated numbers: 1#1, 2#1"):
        plot.pick_step(rep, 2, 3)


# -------------------------------------------------------------------------------------- loader
def test_loader_skips_cut_and_foreign_lines_and_reads_the_rest(tmp_path):
    good = {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": n.RANK, "value": {"intValue": "1"}},
                                            {"key": n.WORLD_SIZE, "value": {"intValue": "2"}}]},
                "scopeSpans": [{"spans": [{
                    "traceId": "0" * 31 + "1", "spanId": "0" * 15 + "2", "name": "all_reduce",
                    "startTimeUnixNano": "1000", "endTimeUnixNano": "3000",
                    "attributes": [
                        {"key": n.COLL_OP, "value": {"stringValue": "all_reduce"}},
                        {"key": n.COLL_GROUP_DESC, "value": {"stringValue": "undefined"}},
                        {"key": n.COLL_GROUP_NAME, "value": {"stringValue": "3"}},
                        {"key": n.COLL_MESSAGE_SIZE, "value": {"intValue": "64"}},
                    ],
                }]}],
            }
        ]
    }
    path = tmp_path / "traces.rank1.jsonl"
    path.write_text('{"foo": 1}\n' + json.dumps(good) + "\n" + json.dumps(good)[:40])
    problems: list[Problem] = []
    recs = list(loader.iter_records(loader.discover(str(tmp_path)), problems))
    colls = [r for r in recs if isinstance(r, Collective)]
    assert len(colls) == 1 and colls[0].rank == 1 and colls[0].group == "pg3"  # the metric label of that group
    assert colls[0].duration_s == pytest.approx(2e-6)
    assert [p.line for p in problems] == [1, 3]
    assert "not an OTLP export request" in problems[0].message
    assert "cut short" in problems[1].message


def test_loader_reads_jaeger_native_json(tmp_path):
    doc = {
        "data": [{
            "traceID": "ab" * 16,
            "spans": [{
                "traceID": "ab" * 16, "spanID": "cd" * 8, "operationName": "all_gather_into_tensor",
                "references": [{"refType": "CHILD_OF", "spanID": "ef" * 8}],
                "startTime": 1000, "duration": 250, "processID": "p1",
                "tags": [
                    {"key": n.COLL_OP, "type": "string", "value": "all_gather_into_tensor"},
                    {"key": n.COLL_KIND, "type": "string", "value": "all_gather"},
                    {"key": n.COLL_MESSAGE_SIZE, "type": "int64", "value": 4096},
                    {"key": n.COLL_GROUP_RANKS, "type": "string", "value": "[0, 1]"},
                    {"key": n.COLL_SEQ, "type": "int64", "value": 9},
                ],
            }],
            "processes": {"p1": {"serviceName": "torch-distributed",
                                 "tags": [{"key": n.RANK, "type": "int64", "value": 1}]}},
        }]
    }
    path = tmp_path / "jaeger.json"
    path.write_text(json.dumps(doc, indent=2))
    problems: list[Problem] = []
    recs = list(loader.iter_records(loader.discover(str(path)), problems))
    (c,) = [r for r in recs if isinstance(r, Collective)]
    assert problems == []
    assert (c.rank, c.kind, c.message_size, c.seq, c.group_ranks) == (1, "all_gather", 4096, 9, (0, 1))
    assert c.start_ns == 1_000_000 and c.end_ns == 1_250_000 and c.parent_id == "ef" * 8


def test_loader_accepts_base64_ids():
    assert loader._hex_id("AAAAAAAAAAE=", 8) == "0000000000000001"
    assert loader._hex_id("00000000000000ff", 8) == "00000000000000ff"


def test_report_json_is_typed_and_versioned():
    data = report.to_data(_report_with(2, 0.1, 1.0))
    assert data["schema"] == report.SCHEMA and data["version"] == report.VERSION
    assert set(data) >= {"run", "ops", "modules", "stragglers", "steps", "hangs", "gpu", "warnings"}
    json.dumps(data)  # plain data all the way down


def _dropped(rank: int, **kinds: int) -> MetricSnapshot:
    base = {n.M_RUN: "synthetic", n.M_RANK: str(rank)}
    points = [MetricPoint(attributes={**base, n.M_KIND: k}, value=v) for k, v in kinds.items()]
    return MetricSnapshot(rank=rank, time_ns=20, metrics={n.TELEMETRY_DROPPED.name: points})


@pytest.mark.parametrize(
    "drops,says",
    [
        ([{}, {}], None),
        ([{"span": 3}, {"span_step_limit": 2}], ["counted by ranks 0-1: 3 span, 2 span_step_limit", "miss those"]),
        ([{}, {"record": 1}], ["counted by rank 1: 1 record", "miss those", "missing from the metrics as well"]),
        ([{"metric_batch": 4}, {}], ["counted by rank 0: 4 metric_batch", "nothing in these tables"]),
        ([{"span_file_rotated": 7}, {"span_file_rotated": 5}], [
            "12 spans deleted by the run folder's size limit (file_max_bytes) on ranks 0-1", "miss the oldest",
        ]),
    ],
)
def test_the_run_says_what_the_ranks_dropped_and_what_it_thins(drops, says):
    records = [_dropped(rank, **kinds) for rank, kinds in enumerate(drops)]
    notes = [x for x in builders.analyze_records(records).run.notes if "dropped" in x or "deleted" in x]
    if says is None:
        assert notes == []
    else:
        (note,) = notes
        assert all(s in note for s in says), note


def test_an_unfinished_call_counts_as_a_call_and_adds_no_size_or_time():
    """The mean message size is over the calls that completed, as the summary and the dashboards divide it:
    an unfinished call (never seen to complete) stayed in the divisor and made the mean 2/3 of the size."""
    records = resources(2) + [coll(r, seq=1, n_ranks=2, size=1000, module="net", phase="forward") for r in range(2)]
    records += [coll(r, seq=2, n_ranks=2, size=1000, dur=6.0, end_source=n.END_UNFINISHED, module="net",
                     phase="forward") for r in range(2)]
    table = builders.ops_table(records, noise_level=2)
    (row,) = table.rows
    assert (row.count, row.errors, row.total_bytes, row.mean_message_size, row.mean_s) == (4, 0, 2000, 1000, 0.001)
    assert [(s.count, s.mean_message_size) for s in table.by_size] == [(2, 1000)]
    (net,) = [m for m in builders.module_counts(records, noise_level=2).rows if m.module == "net"]
    assert [(o.count, o.mean_message_size, o.mean_s) for o in net.ops] == [(2, 1000, 0.001)]


def test_node_totals_are_not_taken_for_a_ranks_metrics():
    """metrics_aggregation=node writes the node's totals (labelled host, no rank) in its first rank's file:
    analyze took them for rank 0's own and added rank 1's spans on top (70 all-reduces for 60)."""
    records = resources(2) + [coll(r, seq=s, n_ranks=2, size=1000) for r in range(2) for s in range(1, 6)]
    node = _collective_metrics(0, "all_reduce", 60, 60_000, 60_000, 0.06, [0] * (len(n.DURATION_BUCKETS) + 1))
    for points in node.metrics.values():
        for p in points:
            p.attributes = {n.M_RUN: "synthetic", n.M_HOST: "vm", n.M_OP: "all_reduce", n.M_GROUP: "default_pg"}
    report = builders.analyze_records(records + [node])
    (row,) = report.ops.rows
    assert (row.count, row.ranks, row.source) == (10, 2, "spans")
    assert report.run.metric_ranks == [] and any("node totals (metrics_aggregation=node, host vm)" in x for x in report.run.notes)
    assert not any(x.startswith("no metrics for") for x in report.run.notes)


def test_a_rank_an_elastic_restart_ran_again_adds_both_processes_metrics():
    """Each process's metrics are cumulative from its own start: after a restart, analyze kept the last
    process's only (80 all-reduces for 131, attempt 0's failure gone)."""
    zeros = [0] * (len(n.DURATION_BUCKETS) + 1)
    first = _collective_metrics(1, "all_reduce", 51, 51_000, 51_000, 0.5, zeros)
    first.instance, first.time_ns = "run-rank1", 5
    first.metrics[n.COLLECTIVE_ERRORS.name][0].value = 1
    again = _collective_metrics(1, "all_reduce", 40, 40_000, 40_000, 0.4, zeros)
    again.instance, again.time_ns = "run-rank1-attempt1", 9
    rank0 = _collective_metrics(0, "all_reduce", 40, 40_000, 40_000, 0.4, zeros)
    report = builders.analyze_records(resources(2) + [first, again, rank0])
    (row,) = report.ops.rows
    assert (row.count, row.errors, row.total_bytes, row.source) == (131, 1, 131_000, "metrics")
    assert any(x.startswith("rank 1 ran in 2 processes (elastic restarts)") for x in report.run.notes), report.run.notes


def test_a_restarted_ranks_step_time_leaves_out_every_processs_set_up():
    """Each process of a restarted rank began with a set-up step (model build, checkpoint load): the steady
    step time took the earlier process's into its mean (185.6 ms for steps of 2-15 ms)."""
    records = resources(2)
    for r in range(2):
        for attempt, (steps, setup_s) in enumerate(((5, 1.0), (7, 1.0))):
            labels = {n.M_RUN: "synthetic", n.M_RANK: str(r)}
            total = setup_s + (steps - 1) * 0.01
            zeros = [0] * (len(n.DURATION_BUCKETS) + 1)
            records.append(MetricSnapshot(rank=r, time_ns=10 + attempt, instance=f"synthetic-rank{r}-{attempt}", metrics={
                n.STEPS_METRIC.name: [MetricPoint(attributes=labels, value=steps)],
                n.STEP_DURATION_METRIC.name: [MetricPoint(attributes=labels, value=Histogram(
                    count=steps, sum=total, bounds=n.DURATION_BUCKETS, bucket_counts=tuple(zeros)))],
                n.STEP_COMPUTE_TIME.name: [MetricPoint(attributes=labels, value=total)],
                n.STEP_COLLECTIVE_WAIT_TIME.name: [MetricPoint(attributes=labels, value=0.0)],
            }))  # fmt: skip
        # the last process's traced steps: its set-up step 1 and step 2
        setup = rank_step(r, 1, dur=1.0, compute=1.0, wait=0.0, trace="a1s1")
        setup.setup = True
        records += [setup, rank_step(r, 2, dur=0.01, compute=0.01, wait=0.0, start=2 * 10**9, trace="a1s2")]
    steps = builders.analyze_records(records).steps
    assert steps.step_time_s == pytest.approx(0.01), (steps.step_time_s, steps.step_time_from)
