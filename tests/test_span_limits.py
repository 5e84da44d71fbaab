"""What bounds a traced step's spans: ``max_spans_per_step`` over collective and framework spans alike, and
``trace_ranks``, the ranks that trace at all. In-process on the ``fake`` backend (the decisions are per
rank and per step; no transport is involved)."""

from __future__ import annotations

import os
from collections import Counter

import pytest
import torch
import torch.distributed as dist

import otel_torchdist
from otel_torchdist import config
from otel_torchdist import names as n
from tests.harness import collective_spans, last_metrics, metric_value, read_spans

STEP_SPANS = (n.SPAN_STEP, n.SPAN_RANK_STEP)


def _sharded_steps(steps: int, ops: int) -> None:
    """Each op: a distribute_tensor (one scatter) and a redistribute (one all_gather), both framework spans
    that parent their collective."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for _ in range(steps):
        with otel_torchdist.step():
            for _ in range(ops):
                distribute_tensor(torch.ones(8, 8), mesh, [Shard(0)]).redistribute(mesh, [Replicate()])


def _by_trace(spans: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for s in spans:
        out.setdefault(s["traceId"], []).append(s)
    return out


def test_framework_spans_count_against_the_step_limit_without_orphans(fake_pg, instrumented):
    folder = instrumented(run_id="cap", max_spans_per_step=6)
    _sharded_steps(steps=2, ops=5)
    otel_torchdist.uninstrument()
    spans = read_spans(os.path.join(folder, "traces.rank0.jsonl"))
    steps = [t for t in _by_trace(spans).values() if any(s["name"] == n.SPAN_RANK_STEP for s in t)]
    assert len(steps) == 2
    for trace in steps:
        ids = {s["spanId"] for s in trace}
        assert all(s.get("parentSpanId", "") in ids | {""} for s in trace), "a kept span points at a dropped one"
        counted = Counter(s["name"] for s in trace if s["name"] not in STEP_SPANS)
        # 20 spans per step (10 framework, 10 collectives): the first 6 leaves (collectives, which end first)
        # and the 6 framework spans they point at.
        assert sum(counted.values()) == 12, counted
        assert counted[n.SPAN_DISTRIBUTE_TENSOR] + counted[n.SPAN_REDISTRIBUTE] == 6
    metrics = last_metrics(os.path.join(folder, "metrics.rank0.jsonl"))
    assert metric_value(metrics, n.TELEMETRY_DROPPED, kind="span_step_limit") == 2 * (20 - 12)
    # Sampling and the cap never thin the metrics.
    assert metric_value(metrics, n.COLLECTIVE_CALLS, op="all_gather_single") == 10


def test_no_limit_keeps_every_span(fake_pg, instrumented):
    folder = instrumented(run_id="nocap", max_spans_per_step=0)
    _sharded_steps(steps=1, ops=5)
    otel_torchdist.uninstrument()
    spans = [s for s in read_spans(os.path.join(folder, "traces.rank0.jsonl")) if s["name"] not in STEP_SPANS]
    assert Counter(s["name"] for s in spans) == {
        n.SPAN_DISTRIBUTE_TENSOR: 5, n.SPAN_REDISTRIBUTE: 5, "scatter": 5, "all_gather_single": 5,
    }  # fmt: skip


def test_an_explicit_step_numbered_like_the_set_up_before_it_is_one_step(fake_pg, instrumented):
    """Collectives before the loop fall in the optimizer-closed step 1; an explicit step(1) has the same
    ids: the two are one step, never two spans with one id."""
    folder = instrumented(run_id="renumber")
    dist.all_reduce(torch.ones(4))  # set-up, before the first explicit step
    for i in (1, 2):
        with otel_torchdist.step(i):
            dist.all_reduce(torch.ones(4))
    otel_torchdist.uninstrument()
    spans = read_spans(os.path.join(folder, "traces.rank0.jsonl"))
    ids = Counter(s["spanId"] for s in spans)
    assert max(ids.values()) == 1
    rank_steps = {s["attributes"][n.STEP]: s for s in spans if s["name"] == n.SPAN_RANK_STEP}
    assert sorted(rank_steps) == [1, 2]
    assert rank_steps[1]["attributes"][n.STEP_COLLECTIVES] == 2
    assert len(collective_spans(spans)) == 3
    # and every child lies inside its parent's time (the step kept the set-up's start)
    by_id = {s["spanId"]: s for s in spans}
    for s in spans:
        parent = by_id.get(s.get("parentSpanId"))
        if parent is not None:
            assert int(parent["startTimeUnixNano"]) <= int(s["startTimeUnixNano"]), (s["name"], parent["name"])
            assert int(s["endTimeUnixNano"]) <= int(parent["endTimeUnixNano"]), (s["name"], parent["name"])


# -------------------------------------------------------------------------------------------- trace_ranks
@pytest.fixture
def rank2_pg():
    """Rank 2 of a 4-rank ``fake`` group."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=2, world_size=4)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def _warn_in_step() -> None:
    """A framework warning inside a step (the DDP configuration check emits these)."""
    from otel_torchdist.capture import framework_spans

    t = 0
    framework_spans.span_later(n.SPAN_WARNING, t, t, [(n.WARNING_KIND, "test"), (n.WARNING_MESSAGE, "x")], framework_spans.snapshot())


@pytest.mark.parametrize(("ranks", "traced"), [("0-1,3", False), ("0-3:2", True), ("2", True)])
def test_trace_ranks_decides_which_ranks_export_spans(rank2_pg, instrumented, ranks, traced):
    folder = instrumented(run_id="subset", trace_ranks=ranks)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        dist.all_reduce(torch.ones(4))
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
        _warn_in_step()
    otel_torchdist.uninstrument()
    spans = read_spans(os.path.join(folder, "traces.rank2.jsonl")) if traced else _spans_if_any(folder)
    names = Counter(s["name"] for s in spans)
    # Warnings are kept on every rank, as their own traces where the step is not traced.
    assert names[n.SPAN_WARNING] == 3
    if traced:
        assert names["all_reduce"] == 3 and names[n.SPAN_RANK_STEP] == 3 and names[n.SPAN_OPTIMIZER_STEP] == 3
    else:
        assert set(names) == {n.SPAN_WARNING}
        assert all("parentSpanId" not in s or not s["parentSpanId"] for s in spans)
    metrics = last_metrics(os.path.join(folder, "metrics.rank2.jsonl"))
    assert metric_value(metrics, n.COLLECTIVE_CALLS, op="all_reduce") == 3  # metrics on every rank
    assert metric_value(metrics, n.STEPS_METRIC) == 3


def _spans_if_any(folder: str) -> list[dict]:
    path = os.path.join(folder, "traces.rank2.jsonl")
    return read_spans(path) if os.path.exists(path) else []


def test_trace_ranks_forms_and_errors():
    assert config.load({"trace_ranks": "0-7,1024,0-16383:4096"}).trace_ranks == (
        0, 1, 2, 3, 4, 5, 6, 7, 1024, 4096, 8192, 12288,
    )  # fmt: skip
    assert config.load({"trace_ranks": [3, 1, 3]}).trace_ranks == (1, 3)
    assert config.load({}, {"OTEL_TORCHDIST_TRACE_RANKS": " 5 "}).trace_ranks == (5,)
    for bad in ("x", "7-3", "0-5:0", ",", "1;2", [], [-1], 1.5):
        with pytest.raises(ValueError, match="trace_ranks"):
            config.load({"trace_ranks": bad})
    with pytest.raises(ValueError, match="OTEL_TORCHDIST_TRACE_RANKS='3-1'"):
        config.load({}, {"OTEL_TORCHDIST_TRACE_RANKS": "3-1"})


def test_a_burst_beyond_the_span_queue_waits_for_the_exporter_instead_of_dropping(fake_pg, instrumented):
    """A drain that makes more spans than the span queue holds lets the export thread take batches (it only
    waits for the interpreter) instead of dropping what it could send; a drain whose exporter does not take
    them within ROOM_WAIT_S in all drops and counts them, as before (the black-hole backends of
    test_faults_export)."""
    from otel_torchdist import health

    health.reset()
    folder = instrumented(
        run_id="burst", traces_sampler="always_on", max_spans_per_step=0, span_queue_size=128, span_batch_size=32,
        drain_interval=3600.0, max_queued_records=4096,
    )  # fmt: skip
    for _ in range(1000):  # one drain's worth: 1000 spans for a queue of 128
        dist.all_reduce(torch.ones(4))
    otel_torchdist.flush()
    otel_torchdist.uninstrument()
    assert len(collective_spans(read_spans(os.path.join(folder, "traces.rank0.jsonl")))) == 1000
    assert health.drops().get("span", 0) == 0
