"""One trace per step across ranks, step metrics, stragglers named, hangs reported while alive.

Real gloo jobs (``tests/scenarios_steps.py``); each test reads what every rank exported.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict

import pytest

from otel_torchdist import names as n
from otel_torchdist.drain.step_stats import union_seconds
from otel_torchdist.steps import _Recent, step_ids

from .harness import last_metrics, read_spans, run_ranks, trace_layout_problems, wait_for


def _job(tmp_path_factory, scenario: str, ws: int, run: str, args: dict | None = None):
    out = str(tmp_path_factory.mktemp(f"{scenario}{ws}"))
    results = run_ranks(f"scenarios_steps:{scenario}", ws, out, args or {})
    folder = os.path.join(out, "runs", run)
    spans = [read_spans(os.path.join(folder, f"traces.rank{r}.jsonl")) for r in range(ws)]
    metrics = [last_metrics(os.path.join(folder, f"metrics.rank{r}.jsonl")) for r in range(ws)]
    return {"ws": ws, "results": results, "spans": spans, "metrics": metrics}


def _value(metrics: dict, metric: n.Metric, **labels) -> float:
    (point,) = [p for p in metrics[metric.name] if all(p["attributes"].get(k) == v for k, v in labels.items())]
    return float(point.get("asDouble", point.get("asInt", point.get("sum"))))


# -------------------------------------------------------------------------------------- pure helpers
def test_step_ids_are_shared_by_ranks_and_distinct_per_step():
    a = step_ids("run-x", 7, 0)
    b = step_ids("run-x", 7, 3)
    assert a[:2] == b[:2] and a[2] != b[2]  # same trace and root, own step span
    assert step_ids("run-x", 8, 0)[0] != a[0] and step_ids("run-y", 7, 0)[0] != a[0]


def test_median_of_recent_steps_matches_statistics_over_the_window():
    import random
    import statistics
    from collections import deque

    rng = random.Random(7)
    recent, window = _Recent(101), deque(maxlen=101)
    assert recent.median() is None
    medians = []  # the window's median before each value
    for i in range(400):
        value = rng.choice([rng.random(), 0.5, float(i % 7)])  # repeated values
        medians.append(statistics.median(window) if window else None)
        given = recent.append(value)
        window.append(value)
        assert recent.median() == statistics.median(window)
        assert len(recent) == len(window)
        if i < 2 * _Recent.REFRESH:
            assert given == medians[-1]  # a short window: exact every step
        else:  # then as of at most REFRESH steps before
            assert given in medians[-_Recent.REFRESH :]


def test_union_of_in_flight_intervals():
    assert union_seconds([(0, 10), (5, 20), (30, 40)], 0, 100) == pytest.approx(30e-9)
    assert union_seconds([(0, 10), (5, 20)], 8, 15) == pytest.approx(7e-9)  # clipped to the step
    assert union_seconds([], 0, 10) == 0.0


# --------------------------------------------------------------------------------------- step traces
@pytest.fixture(scope="module", params=(2, 4), ids=lambda ws: f"ws{ws}")
def steps_job(request, tmp_path_factory):
    ws = request.param
    return _job(tmp_path_factory, "steps", ws, f"steps-ws{ws}")


def test_ranks_that_trace_without_rank_0_have_their_steps_under_a_root(tmp_path_factory):
    """trace_ranks="1-2" on 3 ranks: only rank 0 emitted the steps' roots, so every traced step span of
    ranks 1 and 2 pointed at a parent that never came (and their step times stayed in the store)."""
    out = str(tmp_path_factory.mktemp("traceranks"))
    run_ranks("scenarios_steps:steps", 3, out, {"run": "steps-ranks12", "extra": {"trace_ranks": "1-2"}})
    folder = os.path.join(out, "runs", "steps-ranks12")
    assert not os.path.exists(os.path.join(folder, "traces.rank0.jsonl"))
    by_rank = [read_spans(os.path.join(folder, f"traces.rank{r}.jsonl")) for r in (1, 2)]
    spans = by_rank[0] + by_rank[1]
    roots = [s for s in spans if s["name"] == n.SPAN_STEP]
    assert roots and roots == [s for s in by_rank[0] if s["name"] == n.SPAN_STEP]  # the lowest traced rank's
    assert {s["attributes"][n.STEP_RANKS_TIMED] for s in roots} == {2}
    assert trace_layout_problems(spans) == []


@pytest.mark.parametrize("native", ["off", "auto"])
def test_a_step_of_many_collectives_keeps_its_intervals_bounded_and_its_wait_exact(fake_pg, instrumented, native):
    """A step that never ends (no optimizer, no marked steps) of 20 000 collectives: the drain keeps at most
    Intervals.CAP of their intervals, and the step's collective time stays exact (back-to-back calls do
    not overlap, so folding the old ones loses nothing). In Python (StepStats) and, where the native part
    is built, in its fold (the store's step aggregates)."""
    import torch
    import torch.distributed as dist

    import otel_torchdist
    from otel_torchdist import runtime
    from otel_torchdist.capture import record as R
    from otel_torchdist.drain.step_stats import Intervals

    instrumented(native=native, drain_interval=3600.0, max_queued_records=4096, traces_sampler="always_off")
    pipeline = runtime.current().pipeline
    spans: list[tuple[int, int]] = []

    def the_open_step() -> tuple[int, int, int]:  # (serial, collectives, intervals kept)
        if pipeline.native_steps is not None:
            ((serial, (count, _, intervals)),) = pipeline.native_steps.steps_snapshot().items()
            return serial, count, len(intervals)
        ((serial, stats),) = pipeline.step_stats.items()
        return serial, stats.collectives, len(stats)

    with otel_torchdist.step():
        for chunk in range(10):
            for _ in range(2000):
                dist.all_reduce(torch.ones(4))
            spans += [(rec[R.T_START], rec[R.T_END]) for rec in R.QUEUE]
            pipeline.drain()
            assert the_open_step()[2] <= Intervals.CAP
        serial, count, _ = the_open_step()
        assert len(spans) == 20_000 and count == 20_000
        lo, hi = spans[0][0], spans[-1][1]
        stats = pipeline.step_stats.pop(serial, None)
        if pipeline.native_steps is not None:
            wait = pipeline.native_steps.take_step(serial, lo, hi, False, stats)[2]
        else:
            wait = stats.totals(lo, hi, False)[2]
    assert wait == pytest.approx(union_seconds(spans, lo, hi), rel=1e-12)


def test_each_step_is_one_trace_across_ranks_with_one_root(steps_job):
    ws = steps_job["ws"]
    per_step = defaultdict(lambda: defaultdict(list))  # step -> trace -> spans
    for rank in range(ws):
        for s in steps_job["spans"][rank]:
            if s["name"] in (n.SPAN_STEP, n.SPAN_RANK_STEP):
                per_step[s["attributes"][n.STEP]][s["traceId"]].append((rank, s))
    # trace_first_steps=2, trace_every_steps=2: steps 1, 2, 4 of training, 100 and 102 of evaluation
    assert sorted(per_step) == [1, 2, 4, 100, 102]
    for step, traces in per_step.items():
        assert len(traces) == 1, f"step {step} is split over traces"
        (spans,) = traces.values()
        roots = [s for _, s in spans if s["name"] == n.SPAN_STEP]
        assert len(roots) == 1 and [r for r, s in spans if s["name"] == n.SPAN_STEP] == [0]
        ranks = sorted(r for r, s in spans if s["name"] == n.SPAN_RANK_STEP)
        assert ranks == list(range(ws))
        for _, s in spans:
            if s["name"] == n.SPAN_RANK_STEP:
                assert s["parentSpanId"] == roots[0]["spanId"]
        assert roots[0]["attributes"][n.STEP_RANKS_TIMED] == ws  # the root's interval covers every rank's step
    # As Jaeger lays the traces out: no orphan, no span id twice, every child inside its parent, across ranks
    assert trace_layout_problems([s for rank in range(ws) for s in steps_job["spans"][rank]]) == []


def test_rank_step_holds_its_collectives_optimizer_step_and_phases(steps_job):
    for rank in range(steps_job["ws"]):
        spans = steps_job["spans"][rank]
        steps = {s["spanId"]: s for s in spans if s["name"] == n.SPAN_RANK_STEP}
        by_step = defaultdict(list)
        for s in spans:
            if s.get("parentSpanId") in steps:
                by_step[steps[s["parentSpanId"]]["attributes"][n.STEP]].append(s)
        # Recorded by the native group (built on this machine), the reducer's own bucket rebuild shows too: two
        # broadcasts in the second step's forward, which the comm hook does not see.
        native = any(s["attributes"].get(n.COLL_SOURCE) == "ddp_reducer" for s in spans)
        for step in (2, 4):
            names = sorted(c["name"] for c in by_step[step])
            # DDP's gradient bucket, the optimizer step, and the forward / backward phases
            rebuild = ["broadcast", "broadcast"] if native and step == 2 else []
            assert names == sorted(["all_reduce", "optimizer.step", "train.backward", "train.forward"] + rebuild), (step, names)
            phases = sorted(c["attributes"][n.PHASE_NAME] for c in by_step[step] if c["name"] in n.SPAN_PHASES.values())
            assert phases == ["backward", "forward"]
        # Jaeger's row shows the rank: every span's exported name carries it, but the cross-rank root's
        assert all(s["exported_name"] == (s["name"] if s["name"] == n.SPAN_STEP else f"{s['name']} rank={rank}") for s in spans)
        # every span of a traced step shares the step's trace; untraced steps left nothing
        traced = {s["traceId"] for s in steps.values()}
        for s in spans:
            if n.COLL_OP in s["attributes"] and s["attributes"].get(n.COLL_OP) != "_broadcast_coalesced":
                assert s["traceId"] in traced


def test_sampling_never_thins_the_metrics(steps_job):
    for rank in range(steps_job["ws"]):
        m = steps_job["metrics"][rank]
        # 5 optimizer-closed steps + 3 explicit evaluation steps, every one counted
        assert _value(m, n.STEPS_METRIC) == 8
        assert int(m[n.STEP_DURATION_METRIC.name][0]["count"]) == 8
        assert _value(m, n.STEP_CURRENT) == 102
        calls = {p["attributes"]["op"]: int(p["asInt"]) for p in m[n.COLLECTIVE_CALLS.name]}
        assert calls["all_reduce"] == 5 + 3  # DDP buckets of all five steps, traced or not, and the evals


def test_step_metrics_match_what_was_fed(steps_job):
    for rank in range(steps_job["ws"]):
        m = steps_job["metrics"][rank]
        fed = steps_job["results"][rank]["fed_loss"]
        assert _value(m, n.TRAIN_LOSS) == pytest.approx(fed[-1])
        assert _value(m, n.TRAIN_LR) == pytest.approx(0.05)
        assert _value(m, n.TRAIN_SAMPLES) == 5 * 32
        assert _value(m, n.TRAIN_TOKENS) == 5 * 32 * 128
        # throughput of the last training step = its samples / its duration (the span says the duration)
        last = [s for s in steps_job["spans"][rank] if s["name"] == n.SPAN_RANK_STEP and s["attributes"][n.STEP] == 4]
        assert last[0]["attributes"][n.STEP_SAMPLES] == 32 and last[0]["attributes"][n.STEP_LOSS] == fed[3]
        rate = _value(m, n.TRAIN_SAMPLE_RATE)
        assert rate > 0 and _value(m, n.TRAIN_TOKEN_RATE) == pytest.approx(rate * 128)
        # total 20 steps, and step 5 was the last counted training step
        assert _value(m, n.TRAIN_ETA) == 0.0  # evaluation steps 100-102 are past the total
        compute, wait = _value(m, n.STEP_COMPUTE_TIME), _value(m, n.STEP_COLLECTIVE_WAIT_TIME)
        total = float(m[n.STEP_DURATION_METRIC.name][0]["sum"])
        assert compute > 0 and wait > 0 and compute + wait == pytest.approx(total, rel=1e-6)


def test_otel_traces_sampler_keeps_the_same_steps_on_every_rank(tmp_path_factory):
    job = _job(tmp_path_factory, "sampled_by_ratio", 2, "ratio")
    kept = [
        sorted(s["attributes"][n.STEP] for s in spans if s["name"] == n.SPAN_RANK_STEP) for spans in job["spans"]
    ]
    # traceidratio keeps a trace when its id's low 64 bits fall under ratio * 2**64
    expected = [i for i in range(1, 13) if step_ids("ratio", i, 0)[0] & ((1 << 64) - 1) < (1 << 63)]
    assert kept[0] == kept[1] == expected
    assert 0 < len(expected) < 12
    for spans in job["spans"]:
        colls = [s for s in spans if n.COLL_OP in s["attributes"]]
        assert len(colls) == len(expected)  # the collectives of dropped steps went with them
    for m in job["metrics"]:
        assert _value(m, n.STEPS_METRIC) == 12


# ---------------------------------------------------------------------------------------- stragglers
@pytest.fixture(scope="module")
def straggler_job(tmp_path_factory):
    return _job(tmp_path_factory, "stragglers", 3, "stragglers-ws3", {"ddp_slow": 1, "plain_slow": 2, "delay": 0.2})


@pytest.mark.parametrize("phase,slow", [("ddp", 1), ("plain", 2)])
def test_straggler_signal_names_the_slow_rank(straggler_job, phase, slow):
    results = [r[phase] for r in straggler_job["results"]]
    assert all(r["windows"] >= (1 if phase == "ddp" else 2) for r in results)
    assert {r["slowest"] for r in results} == {slow}
    scores = [r["score"] for r in results]
    # The slow rank computes 200 ms a step longer: about 0.9 of a step. The others are near 0, but on a
    # loaded 2-core machine running 3 ranks a descheduled rank's lost time counts as its compute: a CI run
    # with a 100 ms delay once saw 0.27 (about 33 ms a step) on a rank that was not slow.
    assert scores[slow] == max(scores) and scores[slow] > 0.5
    assert all(s < 0.25 for i, s in enumerate(scores) if i != slow), results


def test_every_rank_is_told_the_straggler_verdicts_through_its_callback(straggler_job):
    for rank, result in enumerate(straggler_job["results"]):
        verdicts = result["verdicts"]
        assert {v["rank"] for v in verdicts} == {rank}
        assert [(v["window"], v["slowest"]) for v in verdicts] == [(1, 1), (2, 2)], verdicts
        assert all(v["score"] > 0.2 for v in verdicts)


def test_slow_rank_waits_least_and_computes_most(straggler_job):
    # Over both phases each slow rank spent 10 x 200 ms extra computing; the others waited for it.
    computes = [_value(m, n.STEP_COMPUTE_TIME) for m in straggler_job["metrics"]]
    waits = [_value(m, n.STEP_COLLECTIVE_WAIT_TIME) for m in straggler_job["metrics"]]
    assert computes[0] == min(computes)
    assert waits[0] == max(waits)


# ------------------------------------------------------------------------------------------- hangs
@pytest.fixture(scope="module")
def hang_job(tmp_path_factory):
    return _job(tmp_path_factory, "hang", 3, "hang-ws3", {"threshold": 1.5, "timeout": 6})


def test_watchdog_fires_on_the_waiting_ranks_while_they_wait(hang_job):
    for rank in (1, 2):
        result = hang_job["results"][rank]
        assert result["raised_after"] > 5  # they really were stuck until gloo's timeout
        # the hang report had already left the process before the call gave up
        assert "collective.hang" in result["traces_while_stuck"]
        (hang,) = [s for s in hang_job["spans"][rank] if s["name"] == n.SPAN_HANG]
        a = hang["attributes"]
        assert a[n.COLL_OP] == "all_reduce" and a[n.COLL_GROUP_DESC] == "default_pg"
        assert a[n.COLL_SEQ] == 3
        assert 1.5 <= a[n.HANG_WAITED] < 1.5 + 1.5  # within the threshold plus one check interval
        assert hang["events"][0]["name"] == n.HANG_EVENT
        assert a[n.HANG_MISSING_RANKS] == [0]  # named live, from the hang board
        assert _value(hang_job["metrics"][rank], n.COLLECTIVE_HANGS, op="all_reduce") == 1
    assert not [s for s in hang_job["spans"][0] if s["name"] == n.SPAN_HANG]


def test_exported_sequence_numbers_name_the_rank_that_never_arrived(hang_job):
    started = {r: _value(m, n.GROUP_SEQ_STARTED, group="default_pg") for r, m in enumerate(hang_job["metrics"])}
    completed = {r: _value(m, n.GROUP_SEQ_COMPLETED, group="default_pg") for r, m in enumerate(hang_job["metrics"])}
    behind = [r for r, s in started.items() if s < max(started.values())]
    assert behind == [0]
    assert completed == {0: 2, 1: 2, 2: 2}


# --------------------------------------------------------------------------------------- slow steps
def test_slow_step_warns_once_with_a_span(fake_pg, instrumented):
    import time

    import torch
    import torch.distributed as dist

    import otel_torchdist
    from tests.harness import read_spans

    folder = instrumented(run_id="slow", trace_every_steps=1000)
    for i in range(1, 12):
        with otel_torchdist.step(i):
            dist.all_reduce(torch.ones(4))
            time.sleep(0.35 if i in (9, 10) else 0.01)  # step 9 is slow; 10 too, but within a hundred steps
    otel_torchdist.uninstrument()
    warnings = [s for s in read_spans(f"{folder}/traces.rank0.jsonl") if s["name"] == n.SPAN_WARNING]
    (warning,) = warnings
    assert warning["attributes"][n.WARNING_KIND] == "slow_step"
    assert warning["attributes"][n.STEP] == 9
    assert "x the median of recent steps" in warning["attributes"][n.WARNING_MESSAGE]


def test_slow_steps_warn_again_a_hundred_steps_later_when_numbers_restart_every_epoch(fake_pg, instrumented):
    """Rate-limited by the program's step numbers, a loop numbering its steps 0-29 in each epoch was never
    warned again after its first slow step."""
    import time

    import torch
    import torch.distributed as dist

    import otel_torchdist
    from tests.harness import read_spans

    folder = instrumented(run_id="slow-epochs", trace_every_steps=1000)
    for epoch in range(5):
        for i in range(30):
            with otel_torchdist.step(i):
                dist.all_reduce(torch.ones(4))
                time.sleep(0.3 if i == 20 and epoch in (0, 4) else 0.002)  # 120 steps apart
    otel_torchdist.uninstrument()
    warnings = [s for s in read_spans(f"{folder}/traces.rank0.jsonl") if s["name"] == n.SPAN_WARNING]
    assert [w["attributes"][n.STEP] for w in warnings] == [20, 20]


def test_a_step_gradscaler_skips_still_ends_its_training_step(fake_pg, instrumented):
    """fp16 training skips optimizer steps whose gradients overflow (GradScaler, at its start and when its
    scale grows too far): no optimizer hook ran, so the iteration merged into the next, and every later step
    number was one behind the loop's."""
    import time

    import torch
    import torch.distributed as dist

    import otel_torchdist

    folder = instrumented(run_id="scaler", trace_first_steps=10)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    for i in range(1, 6):
        time.sleep(0.05)
        loss = model(torch.ones(2, 4)).sum() * (float("inf") if i == 3 else 1.0)
        scaler.scale(loss).backward()
        dist.all_reduce(torch.ones(2))
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    assert scaler.get_scale() < 65536.0  # step 3 was skipped
    otel_torchdist.uninstrument()
    spans = read_spans(f"{folder}/traces.rank0.jsonl")
    steps = sorted((s for s in spans if s["name"] == n.SPAN_RANK_STEP), key=lambda s: s["attributes"][n.STEP])
    assert [s["attributes"][n.STEP] for s in steps] == [1, 2, 3, 4, 5]
    for step in steps[1:]:
        took = (int(step["endTimeUnixNano"]) - int(step["startTimeUnixNano"])) / 1e9
        assert 0.05 <= took < 0.09, (step["attributes"][n.STEP], took)
    assert sum(s["name"] == "optimizer.step" for s in spans) == 4
    assert _value(last_metrics(f"{folder}/metrics.rank0.jsonl"), n.STEPS_METRIC) == 5
    assert trace_layout_problems(spans) == []


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.distributed.optim's own torch.jit.script
def test_gradscaler_over_an_optimizer_wrapper_skips_nothing_it_did_not_skip(fake_pg, instrumented):
    """PostLocalSGDOptimizer never calls Optimizer.__init__: torch's hooks see its inner optimizer's steps
    only, so every step through GradScaler read as skipped, each training step was closed twice as a
    warm-up, and a slow step was never warned of."""
    import time

    import torch
    from torch.distributed.algorithms.model_averaging import averagers
    from torch.distributed.optim import PostLocalSGDOptimizer

    import otel_torchdist

    folder = instrumented(run_id="wrapper", trace_first_steps=100)
    model = torch.nn.Linear(4, 4)
    opt = PostLocalSGDOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), averagers.PeriodicModelAverager(period=4, warmup_steps=1000))
    scaler = torch.amp.GradScaler("cpu")
    for i in range(1, 13):
        scaler.scale(model(torch.ones(2, 4)).sum()).backward()
        time.sleep(0.4 if i == 10 else 0.01)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    otel_torchdist.uninstrument()
    spans = read_spans(f"{folder}/traces.rank0.jsonl")
    assert sorted(s["attributes"][n.STEP] for s in spans if s["name"] == n.SPAN_RANK_STEP) == list(range(1, 13))
    assert [s["attributes"][n.STEP] for s in spans if s["name"] == n.SPAN_WARNING] == [10]


def test_an_optimizers_first_step_is_warmup_not_slow(fake_pg, instrumented):
    """A second model's first step (lazy initialisation) is not a slow step; its later slow step is."""
    import time

    import torch

    import otel_torchdist
    from tests.harness import read_spans

    folder = instrumented(run_id="warmup", trace_every_steps=1000)
    for model_index in range(2):
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(8):
            model(torch.ones(2, 4)).sum().backward()
            time.sleep(0.35 if i == 0 or (model_index == 1 and i == 6) else 0.01)
            opt.step()
    otel_torchdist.uninstrument()
    warnings = [s for s in read_spans(f"{folder}/traces.rank0.jsonl") if s["name"] == n.SPAN_WARNING]
    assert [w["attributes"][n.STEP] for w in warnings] == [15]


def test_step_ids_are_the_documented_shake_stream():
    """The ids are read from SHAKE-128 of the documented string, 64 steps to a block (steps.step_ids)."""
    import hashlib

    trace, root, rank_span = step_ids("run-z", 42, 3)
    stream = hashlib.shake_128(b"run-z:steps:0").digest(32 * 64)
    chunk = stream[32 * 42 : 32 * 43]
    assert trace == int.from_bytes(chunk[:16], "big") and root == int.from_bytes(chunk[16:24], "big")
    assert rank_span == int.from_bytes(chunk[24:], "big") ^ (3 * 0x9E3779B97F4A7C15 % 2**64)
    # the next block, and a number below 0 (explicit steps may be numbered so): floor division
    assert step_ids("run-z", 64, 0)[0] == int.from_bytes(hashlib.shake_128(b"run-z:steps:1").digest(16), "big")
    last = hashlib.shake_128(b"run-z:steps:-1").digest(32 * 64)[32 * 63 :]
    assert step_ids("run-z", -1, 0)[1] == int.from_bytes(last[16:24], "big")


@pytest.mark.parametrize(
    "numbers, closes_every, most",
    [
        (list(range(1, 3001)), 1, 1.0),  # counting up: one step's ids at each close
        (list(range(1, 3001)), 30, 1.0),  # a drain every 30 steps
        (list(range(1, 3001)), 120, 1.0),  # a drain every 120 steps (1 ms steps, 120 ms apart)
        ([x for i in range(1, 1500) for x in (i, -i)], 1, 1.1),  # evaluation steps numbered apart
        ([x for e in range(30) for x in list(range(e * 100 + 1, e * 100 + 101)) + list(range(1, 11))], 1, 1.1),
        ([x for e in range(20) for x in range(1, 101)], 1, 0.1),  # epochs numbered alike: repeats make their own
        (list(range(1000, 300_000, 1000)), 1, 9.0),  # numbered by samples: a jump every step
        (list(range(1, 101)) + list(range(5001, 8001)), 1, 1.2),  # one jump, then counting up again
    ],
)
def test_the_coming_steps_ids_are_made_about_once_each(numbers, closes_every, most, monkeypatch):
    from otel_torchdist.config import Config
    from otel_torchdist.steps import IDS_AHEAD, STEPS_PER_BLOCK, StepTracker

    tracker = StepTracker(Config())
    tracker.trace_key = "run-ids"
    made = []
    real = StepTracker._fill
    monkeypatch.setattr(StepTracker, "_fill", lambda self, a, b: made.extend(range(a, b + 1)) or real(self, a, b))
    tracker.prepare_ids()
    tracker.index = 1  # the first step: counting up from there fills the table, to the end of a block
    tracker.prepare_ids()
    assert sorted(made) == list(range(1, (1 + IDS_AHEAD) // STEPS_PER_BLOCK * STEPS_PER_BLOCK + STEPS_PER_BLOCK))
    made.clear()
    seen = set()
    for k, index in enumerate(numbers):
        tracker.index = index
        tracker.serial += 1  # as begin() counts steps
        if k and numbers[k - 1] + 1 == index and index not in seen:
            assert index in tracker._ids  # counting up: ready when begun, however seldom the drain comes
        seen.add(index)
        tracker._ids.pop(index, None)  # begun
        if k % closes_every == 0:
            tracker.prepare_ids()
    assert len(made) <= most * len(numbers) + STEPS_PER_BLOCK
    if numbers[1] == numbers[0] + 1 and closes_every == 1 and most == 1.0:
        first = (1 + IDS_AHEAD) // STEPS_PER_BLOCK * STEPS_PER_BLOCK + STEPS_PER_BLOCK
        assert made == list(range(first, first + len(made)))  # in order, each once, a block at a time
        assert len(made) % STEPS_PER_BLOCK == 0


def test_a_blocks_ids_are_each_steps_ids():
    from otel_torchdist.steps import block_table

    def table(*ids):  # step_ids as the table holds them: trace, rank span, sampled (left False), root
        return tuple(ids[k] for k in (0, 2)) + (False, ids[1])

    assert block_table("run-b", 2, 3) == {128 + i: table(*step_ids("run-b", 128 + i, 3)) for i in range(64)}
    assert block_table("run-b", -1, 0, 5, 3) == {-59 + i: table(*step_ids("run-b", -59 + i, 0)) for i in range(3)}


def test_step_span_ids_differ_across_ranks_and_steps():
    ids = {step_ids("run-w", i, r)[2] for i in range(200) for r in range(64)}
    roots = {step_ids("run-w", i, 0)[1] for i in range(200)}
    assert len(ids) == 200 * 64 and not ids & roots
    assert len({step_ids("run-w", i, 0)[0] for i in range(200)}) == 200


def test_queued_work_of_a_training_step_is_untracked_by_the_collector(gloo_alone, instrumented):
    """What a DDP step leaves queued for the drain (bucket records, the optimizer step, the step's close)
    is tuples of numbers and strings: the collector untracks such tuples as it meets them, so thousands
    of queued steps never become long-lived objects that every full collection walks (a list, a dict or a
    closure in there would be)."""
    import gc

    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from otel_torchdist import runtime
    from otel_torchdist.capture import record as R

    def untrackable(x) -> bool:
        return not gc.is_tracked(x) or (type(x) is tuple and all(untrackable(e) for e in x))

    # Every step traced: the most queued per step. Through the comm hook, whose bucket records wait in the
    # queue (the native group's wait in C++ until the drain: no Python object at all).
    instrumented(drain_interval=3600.0, trace_every_steps=1, native="off")
    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)), bucket_cap_mb=0.0001)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    otel = runtime.current()
    for _ in range(3):
        model(torch.ones(2, 8)).sum().backward()
        opt.step()
    otel.flush(60)
    for _ in range(5):
        model(torch.ones(2, 8)).sum().backward()
        opt.step()
    queued = list(R.QUEUE) + list(R.DEFERRED)
    buckets = [r for r in R.QUEUE if r[R.SOURCE] == "ddp_hook"]
    assert len(buckets) >= 10 and len(R.DEFERRED) >= 5, (len(buckets), len(R.DEFERRED))
    # One entry per step: the optimizer step, carrying the close of the training step it ends.
    from otel_torchdist import steps
    from otel_torchdist.drain import optimizer

    entries = [e for e in R.DEFERRED if R.DRAINED[e[0]] is optimizer.finished]
    closing = [e for e in entries if any(type(x) is tuple and x[:1] == (steps._CLOSE_STEP,) for x in e)]
    assert len(entries) == len(closing) == 5, entries
    held = [entry for entry in queued if not untrackable(entry)]
    assert not held, held[:3]
    for _ in range(4):  # a tuple met before one it holds stays tracked until the next pass: one per level
        gc.collect()
    assert not [entry for entry in queued if gc.is_tracked(entry)]
    otel.flush(60)


def test_two_optimizers_an_iteration_are_one_step(fake_pg, instrumented):
    """A GAN's two optimizers (or parameter groups split over two) step once each per iteration: one
    training step per iteration, the later ones holding both optimizer steps; an optimizer that replaces
    the lead takes over."""
    import torch

    import otel_torchdist

    folder = instrumented(run_id="gan")
    gen, critic = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    opt_c, opt_g = torch.optim.SGD(critic.parameters(), lr=0.1), torch.optim.SGD(gen.parameters(), lr=0.1)
    for _ in range(5):
        critic(torch.ones(2, 4)).sum().backward()
        opt_c.step()
        gen(torch.ones(2, 4)).sum().backward()
        opt_g.step()
    otel_torchdist.uninstrument()
    spans = read_spans(f"{folder}/traces.rank0.jsonl")
    steps = {s["spanId"]: s["attributes"][n.STEP] for s in spans if s["name"] == n.SPAN_RANK_STEP}
    per_step = defaultdict(list)
    for s in spans:
        if s["name"] == n.SPAN_OPTIMIZER_STEP:
            per_step[steps[s["parentSpanId"]]].append(s["attributes"][n.OPT_CLASS])
    # the first iteration's critic step ends step 1, before the pattern is known; then one per iteration
    assert _value(last_metrics(f"{folder}/metrics.rank0.jsonl"), n.STEPS_METRIC) == 5
    assert [len(per_step[i]) for i in range(3, 6)] == [2, 2, 2]


def test_unnumbered_explicit_steps_start_at_one(fake_pg, instrumented):
    import torch
    import torch.distributed as dist

    import otel_torchdist

    folder = instrumented(run_id="unnumbered", trace_first_steps=3, trace_every_steps=0)
    for _ in range(5):
        with otel_torchdist.step():
            dist.all_reduce(torch.ones(4))
    otel_torchdist.uninstrument()
    spans = read_spans(f"{folder}/traces.rank0.jsonl")
    assert sorted(s["attributes"][n.STEP] for s in spans if s["name"] == n.SPAN_RANK_STEP) == [1, 2, 3]
    assert _value(last_metrics(f"{folder}/metrics.rank0.jsonl"), n.STEPS_METRIC) == 5


def test_a_failed_collective_does_not_count_as_completed(fake_pg, instrumented):
    """An async collective that fails at completion (its peer died) did not complete: the group's last
    completed sequence number, which the hang report reads, stays where it was."""
    import torch
    import torch.distributed as dist

    import otel_torchdist
    from otel_torchdist import runtime
    from otel_torchdist.capture import groups
    from otel_torchdist.capture import record as R

    instrumented(run_id="failed")
    dist.all_reduce(torch.ones(4))
    pipeline = runtime.current().pipeline
    pipeline.drain()
    gi = groups.info(fake_pg)
    done = gi.last_completed
    rec = R.new("all_reduce", "all_reduce", "c10d", gi.gid)
    rec[R.SEQ], rec[R.T_START], rec[R.T_END], rec[R.END] = done + 1, 1, 2, n.END_FUTURE
    rec[R.NBYTES], rec[R.ASYNC] = 16, True
    rec[R.ERROR] = ("RuntimeError", "Connection closed by peer")
    pipeline.process(tuple(rec))
    assert gi.last_completed == done
    otel_torchdist.uninstrument()


def test_span_times_keep_one_clock_offset(fake_pg, instrumented):
    """Monotonic to wall-clock: one offset, not a fresh reading per drain that moved touching spans (one
    step ends as the next begins) apart or into each other by hundreds of nanoseconds."""
    import time

    import otel_torchdist
    from otel_torchdist import runtime

    instrumented(run_id="offset")
    pipeline = runtime.current().pipeline
    offset = pipeline.offset_ns
    for _ in range(5):
        time.sleep(0.01)
        pipeline.drain()
    assert pipeline.offset_ns == offset
    otel_torchdist.uninstrument()


def test_the_clock_offset_is_read_where_the_reads_are_closest(monkeypatch):
    """A thread switched out between the monotonic and the wall-clock read would shift every span by the time
    it was away: the offset comes from the try whose two monotonic reads enclose the wall-clock one most
    tightly, at their midpoint."""
    from otel_torchdist.drain import pipeline

    # tries of (before, wall, after): the first stalled 3 ms after its first read, the second is tight
    reads = iter([1_000, 3_001_000, 3_001_100, 5_000_000, 5_000_500_000, 5_000_040] + [9_000_000, 9_000_900_000, 9_000_500] * 3)
    monkeypatch.setattr(pipeline, "perf_counter_ns", lambda: next(reads))
    monkeypatch.setattr(pipeline, "time_ns", lambda: next(reads))
    assert pipeline.wall_offset_ns() == 5_000_500_000 - 5_000_020


def test_a_new_optimizer_taking_over_is_warm_up_not_slow(fake_pg, instrumented):
    """A second training phase with its own optimizer (the first still referenced): the step in which it
    takes over holds the phase's set-up and is not called slow."""
    import time

    import torch

    import otel_torchdist

    folder = instrumented(run_id="phases", trace_every_steps=1000)
    model = torch.nn.Linear(4, 4)
    first = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(8):
        model(torch.ones(2, 4)).sum().backward()
        time.sleep(0.01)
        first.step()
    second = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(8):
        model(torch.ones(2, 4)).sum().backward()
        time.sleep(0.5 if i == 0 else 0.01)  # the new phase's set-up
        second.step()
    otel_torchdist.uninstrument()
    warnings = [s for s in read_spans(f"{folder}/traces.rank0.jsonl") if s["name"] == n.SPAN_WARNING]
    assert warnings == [] and first is not None


def _short_steps(instrumented, epochs: int, steps: int) -> list[dict]:
    """The rank step spans of ``epochs`` runs of steps numbered 1..``steps``, two all_reduces (48 bytes)
    each, every epoch's records and steps' closes held for one drain."""
    import torch
    import torch.distributed as dist

    import otel_torchdist
    from otel_torchdist import runtime

    from .harness import read_spans

    folder = instrumented(drain_interval=3600.0, trace_every_steps=1, max_spans_per_step=0)
    for _epoch in range(epochs):
        for i in range(1, steps + 1):
            with otel_torchdist.step(i):
                dist.all_reduce(torch.ones(4))
                dist.all_reduce(torch.ones(8))
        runtime.current().pipeline.drain()
    otel_torchdist.uninstrument()
    return [s for s in read_spans(os.path.join(folder, "traces.rank0.jsonl")) if s["name"] == n.SPAN_RANK_STEP]


def test_a_drain_of_hundreds_of_short_steps_keeps_every_steps_totals(fake_pg, instrumented):
    """A drain takes all its records before it runs their steps' closes: with 1 ms steps and a 200 ms drain
    it holds hundreds of open steps. Each keeps its own collectives, bytes and in-flight time until its
    close (forgetting all but the last 64 gave the earlier ones none)."""
    steps = _short_steps(instrumented, 1, 300)
    assert sorted(s["attributes"][n.STEP] for s in steps) == list(range(1, 301))
    assert {s["attributes"][n.STEP_COLLECTIVES] for s in steps} == {2}
    assert {s["attributes"][n.STEP_BYTES] for s in steps} == {48}
    assert all(s["attributes"][n.STEP_COLLECTIVE_WAIT] > 0 for s in steps)


def test_a_step_left_open_is_forgotten_once_later_steps_closed():
    from otel_torchdist.config import Config
    from otel_torchdist.drain.pipeline import STEPS_OPEN, STEPS_OPEN_MAX, Pipeline

    pipeline = Pipeline(Config())
    left_open = pipeline.open_step_stats(1)
    pipeline.closed_opened = pipeline.open_step_stats(5).opened  # as step_close.close_step notes step 5's close
    del pipeline.step_stats[5]
    for i in range(10, 10 + STEPS_OPEN):
        pipeline.open_step_stats(i)
    assert 1 in pipeline.step_stats and len(pipeline.step_stats) == STEPS_OPEN + 1  # none forgotten yet
    pipeline.open_step_stats(100)
    assert 1 not in pipeline.step_stats and pipeline.step_stats[10] is not left_open  # only the stale one
    for i in range(200, 200 + STEPS_OPEN_MAX):
        pipeline.open_step_stats(i)
    assert len(pipeline.step_stats) == STEPS_OPEN_MAX + 1  # bounded whatever closes


def test_steps_numbered_again_from_one_keep_their_totals(fake_pg, instrumented):
    """Explicit steps numbered per epoch start again at 1: a drain holding the second epoch's open steps keeps
    them (forgetting goes by the order steps were opened, not by their numbers)."""
    steps = _short_steps(instrumented, 2, 150)
    assert len(steps) == 300 and {s["attributes"][n.STEP_COLLECTIVES] for s in steps} == {2}


def test_occurrences_count_repeats_in_intervals():
    from otel_torchdist.steps import Occurrences

    occ = Occurrences()
    assert [occ.add(i) for i in range(1, 6)] == [0] * 5  # counting up: one interval
    assert [occ.add(i) for i in (0, 1, 2)] == [0, 1, 1]  # 0 joins level 0; 1 and 2 repeat
    assert [occ.add(i) for i in (0, 1, 2, 3, 9, 7, 8)] == [1, 2, 2, 1, 0, 0, 0]
    assert occ.levels == [[[0, 5], [7, 9]], [[0, 3]], [[1, 2]]]


def test_occurrences_equal_a_count_of_every_number_begun():
    # Counting up (the fast path), epochs numbered alike, jumps, numbers below zero, in random runs.
    import random
    from collections import Counter

    from otel_torchdist.steps import Occurrences

    rng = random.Random(11)
    for _ in range(200):
        occ, seen, index = Occurrences(), Counter(), rng.randrange(-5, 5)
        for _ in range(rng.randrange(1, 120)):
            move = rng.random()
            index = index + 1 if move < 0.7 else rng.randrange(-10, 40) if move < 0.9 else index
            assert occ.add(index) == seen[index], (index, seen)
            seen[index] += 1


def test_no_two_steps_share_ids_however_they_are_numbered(tmp_path_factory):
    from otel_torchdist.analysis import analyze_path

    out = str(tmp_path_factory.mktemp("numbering"))
    results = run_ranks("scenarios_steps:numbering", 2, out, {})
    folder = os.path.join(out, "runs", "numbering")
    spans = [s for r in range(2) for s in read_spans(os.path.join(folder, f"traces.rank{r}.jsonl"))]
    assert trace_layout_problems(spans) == []  # no span id twice in a trace, no orphan, children inside parents
    rank_steps = [s for s in spans if s["name"] == n.SPAN_RANK_STEP]
    per_trace = defaultdict(list)
    for s in rank_steps:
        per_trace[s["traceId"]].append(s)
    steps = results[0]["steps"] + 1  # and the set-up step
    assert len(per_trace) == steps and all(len(v) == 2 for v in per_trace.values())  # one trace per step, both ranks
    roots = {s["traceId"] for s in spans if s["name"] == n.SPAN_STEP}
    assert roots == set(per_trace)
    setup = [s for s in rank_steps if s["attributes"].get(n.STEP_SETUP)]
    assert len(setup) == 2 and {s["attributes"][n.STEP] for s in setup} == {1}
    repeats = sorted(s["attributes"].get(n.STEP_OCCURRENCE, 0) for s in rank_steps if s["attributes"][n.STEP] == 1)
    assert repeats == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]  # set-up, epoch 1, eval, epoch 2, the 1-based run
    report = analyze_path(folder, noise_level=1)
    assert len(report.steps.rows) == steps
    assert "(step 1, which holds set-up, left out)" in report.steps.step_time_from  # the set-up step told apart


def test_summary_keeps_the_set_up_step_apart_and_gives_a_median(fake_pg, instrumented):
    import json
    import time

    import torch
    import torch.distributed as dist

    from otel_torchdist.summary import step_lines

    folder = instrumented(run_id="summary")
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    time.sleep(0.4)  # set-up: imports, initialisation, the model's construction
    for i in range(9):
        model(torch.ones(2, 4)).sum().backward()
        dist.all_reduce(torch.ones(4))
        time.sleep(0.3 if i == 4 else 0.01)  # one slow step: a median does not move
        opt.step()
    import otel_torchdist

    otel_torchdist.uninstrument()
    stats = json.load(open(f"{folder}/summary.rank0.json"))["steps"]
    assert stats["steps"] == 9 and stats["setup_step"] == 1 and stats["setup_step_s"] >= 0.4
    assert 0.01 <= stats["median_step_s"] < 0.1 and stats["median_of"] == 8
    assert stats["mean_step_s"] > stats["median_step_s"]  # the slow step is in the mean, set-up is not
    (line,) = step_lines(stats)
    assert line.startswith("steps: 9 (step 1, with set-up, took ") and "; a step takes " in line and "(median of the last 8)" in line


@pytest.mark.parametrize("optimizer", ["SGD", "LBFGS"])
def test_a_closure_passed_to_the_optimizer_is_the_steps_forward_and_backward(fake_pg, instrumented, optimizer):
    """Lightning calls optimizer.step(closure), LBFGS re-evaluates through it: the closure's collectives
    belong to the training step in their own phases, not to the optimizer, and the phases cover it."""
    import torch
    import torch.distributed as dist

    import otel_torchdist

    folder = instrumented(run_id=f"closure-{optimizer}")
    model = torch.nn.Linear(4, 1)
    opt = getattr(torch.optim, optimizer)(model.parameters(), lr=0.01, **({"max_iter": 3} if optimizer == "LBFGS" else {}))

    def closure():
        opt.zero_grad()
        loss = model(torch.ones(8, 4)).square().mean()
        dist.all_reduce(loss.detach().clone())  # self.log(sync_dist=True)
        loss.backward()
        return loss

    for _ in range(3):
        opt.step(closure)
    otel_torchdist.uninstrument()
    spans = read_spans(f"{folder}/traces.rank0.jsonl")
    by_id = {s["spanId"]: s for s in spans}
    colls = [s for s in spans if s["name"] == "all_reduce"]
    assert len(colls) >= 3
    for c in colls:
        assert c["attributes"][n.COLL_PHASE] != "optimizer"
        assert by_id[c["parentSpanId"]]["name"] == n.SPAN_RANK_STEP  # not the optimizer.step span
    for step in (s for s in spans if s["name"] == n.SPAN_RANK_STEP and s["attributes"][n.STEP] in (2, 3)):
        children = [s for s in spans if s.get("parentSpanId") == step["spanId"]]
        names = {s["name"] for s in children}
        assert {"train.forward", "train.backward", "optimizer.step"} <= names
        (opt_span,) = [s for s in children if s["name"] == "optimizer.step"]
        first_backward = min(int(s["startTimeUnixNano"]) for s in children if s["name"] == "train.backward")
        assert int(opt_span["startTimeUnixNano"]) > first_backward  # begins after its closure's first return
    assert trace_layout_problems(spans) == []


def test_gradient_accumulation_gives_every_micro_batch_its_forward_and_backward(fake_pg, instrumented):
    import torch

    import otel_torchdist

    folder = instrumented(run_id="accumulation")
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(3):
        for _micro in range(2):
            model(torch.ones(8, 4)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    otel_torchdist.uninstrument()
    spans = read_spans(f"{folder}/traces.rank0.jsonl")
    for step in (s for s in spans if s["name"] == n.SPAN_RANK_STEP and s["attributes"][n.STEP] in (2, 3)):
        phases = sorted(
            (int(s["startTimeUnixNano"]), s["name"]) for s in spans
            if s.get("parentSpanId") == step["spanId"] and s["name"] in n.SPAN_PHASES.values()
        )  # fmt: skip
        assert [name for _, name in phases] == ["train.forward", "train.backward"] * 2


def test_what_an_iteration_does_after_its_optimizer_step_stays_in_its_step(fake_pg, instrumented):
    """A DataLoader loop that all-reduces its loss for logging after opt.step(): that all-reduce is in the
    same step as the optimizer step, the step ends when the next batch is fetched, and the last iteration's
    step covers its tail without the time after the loop. The set-up step ends at the first optimizer step
    (a batch read before it says nothing of the loop: a peek at a shape reads one too)."""
    import time

    import torch
    import torch.distributed as dist

    import otel_torchdist

    folder = instrumented(run_id="tail")
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(16, 4)), batch_size=4)
    for (x,) in loader:
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        dist.all_reduce(loss.detach().clone())  # logged after the step
    time.sleep(0.3)  # after the loop: no step's time
    otel_torchdist.uninstrument()
    spans = read_spans(f"{folder}/traces.rank0.jsonl")
    steps = {s["spanId"]: s for s in spans if s["name"] == n.SPAN_RANK_STEP}
    logged = sorted((s for s in spans if s["name"] == "all_reduce"), key=lambda s: int(s["startTimeUnixNano"]))
    assert len(logged) == 4
    assert steps[logged[0]["parentSpanId"]]["attributes"][n.STEP] == 2
    for c in logged[1:]:
        (opt_span,) = [s for s in spans if s.get("parentSpanId") == c["parentSpanId"] and s["name"] == "optimizer.step"]
        assert c["parentSpanId"] in steps  # in the step of the optimizer step it followed
        assert int(c["startTimeUnixNano"]) >= int(opt_span["endTimeUnixNano"])
    assert sorted(s["attributes"][n.STEP] for s in steps.values()) == [1, 2, 3, 4]
    assert _value(last_metrics(f"{folder}/metrics.rank0.jsonl"), n.STEPS_METRIC) == 4
    last = max(steps.values(), key=lambda s: s["attributes"][n.STEP])
    assert (int(last["endTimeUnixNano"]) - int(last["startTimeUnixNano"])) / 1e9 < 0.25
    assert trace_layout_problems(spans) == []


def test_an_evaluation_between_optimizer_steps_is_in_no_training_step(fake_pg, instrumented):
    """An evaluation loader read after an optimizer step (Hugging Face's Trainer every eval_steps, an
    epoch's validation): its first batch began the next training step, which held the whole evaluation (a
    slow step warned of at every evaluation), and the last one made a step of its own after the last
    optimizer step. The training loader's next batch begins the next step; a loader made anew for an epoch
    is the training loader from its first batch (its first iteration's collectives were in no step), and an
    evaluation loader over the training set, sequential where training shuffles, is not."""
    import time

    import torch
    import torch.distributed as dist

    import otel_torchdist

    folder = instrumented(run_id="eval", trace_first_steps=100)
    data = torch.utils.data.TensorDataset(torch.ones(8, 4))
    evaluation = torch.utils.data.DataLoader(data, batch_size=2)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(3):
        if epoch != 1:  # made anew for epochs 0 and 2, kept for 1
            loader = torch.utils.data.DataLoader(data, batch_size=2, shuffle=True)
        for (x,) in loader:
            dist.all_reduce(torch.ones(1))  # before the optimizer's first step with this loader
            time.sleep(0.02)
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
        for _ in evaluation:  # 0.6 s, a collective per batch
            time.sleep(0.15)
            dist.all_reduce(torch.ones(2))
    otel_torchdist.uninstrument()
    spans = read_spans(f"{folder}/traces.rank0.jsonl")
    steps = {s["spanId"]: s for s in spans if s["name"] == n.SPAN_RANK_STEP}
    assert sorted(s["attributes"][n.STEP] for s in steps.values()) == list(range(1, 13))  # 12 optimizer steps
    for step in steps.values():
        if step["attributes"][n.STEP] > 1:
            assert (int(step["endTimeUnixNano"]) - int(step["startTimeUnixNano"])) / 1e9 < 0.25, step["attributes"]
    evaluated = [s for s in spans if s["name"] == "all_reduce" and s["attributes"][n.COLL_MESSAGE_SIZE] == 8]
    assert len(evaluated) == 12 and not any(s.get("parentSpanId") in steps for s in evaluated)
    trained = [s for s in spans if s["name"] == "all_reduce" and s["attributes"][n.COLL_MESSAGE_SIZE] == 4]
    assert sorted(steps[s["parentSpanId"]]["attributes"][n.STEP] for s in trained) == list(range(1, 13))
    assert [s for s in spans if s["name"] == n.SPAN_WARNING] == []
    assert _value(last_metrics(f"{folder}/metrics.rank0.jsonl"), n.STEPS_METRIC) == 12


@pytest.mark.parametrize("loop", ["evaluation_only", "batch_reused"])
def test_a_step_per_optimizer_step_where_batches_do_not_come_one_per_iteration(fake_pg, instrumented, loop):
    """Training without a DataLoader and an evaluation loader read every 4 iterations, or each batch used for
    3 optimizer steps (PPO's epochs over a rollout): a batch after an optimizer step kept the next step open
    until the one after, which then held two iterations (10 and 9 steps for 12 optimizer steps)."""
    import torch

    import otel_torchdist

    folder = instrumented(run_id=loop, trace_first_steps=100)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(8, 4)), batch_size=4)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = iter(data) if loop == "batch_reused" else None
    for i in range(12):
        if batches is not None and i % 3 == 0:
            (x,) = next(batches, None) or next(batches := iter(data))
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
        if loop == "evaluation_only" and i % 4 == 3:
            for _ in data:
                pass
    otel_torchdist.uninstrument()
    spans = read_spans(f"{folder}/traces.rank0.jsonl")
    steps = {s["spanId"]: s["attributes"][n.STEP] for s in spans if s["name"] == n.SPAN_RANK_STEP}
    per_step = sorted(steps[s["parentSpanId"]] for s in spans if s["name"] == "optimizer.step")
    assert per_step == list(range(1, 13))
    assert _value(last_metrics(f"{folder}/metrics.rank0.jsonl"), n.STEPS_METRIC) == 12


def test_a_zero_based_loop_traces_its_first_steps(fake_pg, instrumented):
    """Explicit steps numbered from 0: the set-up step before the loop held number 1, so the loop's step 1
    was a repeat, and repeats are traced every hundredth step only: steps 0, 2, 3... were traced, not 1."""
    import torch
    import torch.distributed as dist

    import otel_torchdist

    folder = instrumented(run_id="zero", trace_first_steps=5, trace_every_steps=0)
    dist.all_reduce(torch.ones(2))  # set-up
    for i in range(8):
        with otel_torchdist.step(i):
            dist.all_reduce(torch.ones(2))
    otel_torchdist.uninstrument()
    spans = read_spans(f"{folder}/traces.rank0.jsonl")
    traced = sorted(s["attributes"][n.STEP] for s in spans if s["name"] == n.SPAN_RANK_STEP and s["attributes"].get(n.STEP_SOURCE) == "explicit")
    assert traced == [0, 1, 2, 3, 4, 5]
    assert trace_layout_problems(spans) == []


def test_a_loader_read_once_leaves_each_iteration_in_its_own_step(fake_pg, instrumented):
    """One batch peeked from a DataLoader, then a loop that never fetches: each optimizer step found the last
    still waiting for a fetch and closed it at its own end, so step N held iteration N+1 and the last step
    was empty (and across ranks, step N of a rank that peeked met step N+1 of one that did not)."""
    import time

    import torch
    import torch.distributed as dist

    import otel_torchdist

    folder = instrumented(run_id="peek")
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(8, 4)), batch_size=2)
    next(iter(loader))
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(4):
        time.sleep(0.05 * (i + 1))  # iteration i takes (i + 1) x 50 ms
        model(torch.ones(2, 4)).sum().backward()
        dist.all_reduce(torch.ones(2))
        opt.step()
        opt.zero_grad()
    otel_torchdist.uninstrument()
    spans = read_spans(f"{folder}/traces.rank0.jsonl")
    steps = sorted((s for s in spans if s["name"] == n.SPAN_RANK_STEP), key=lambda s: s["attributes"][n.STEP])
    assert [s["attributes"][n.STEP] for s in steps] == [1, 2, 3, 4]
    for step in steps[1:]:  # step 1 holds the set-up
        took = (int(step["endTimeUnixNano"]) - int(step["startTimeUnixNano"])) / 1e9
        assert 0.05 * step["attributes"][n.STEP] <= took < 0.05 * step["attributes"][n.STEP] + 0.04, (step["attributes"][n.STEP], took)
    assert all(s["name"] != "all_reduce" or s["parentSpanId"] in {st["spanId"] for st in steps} for s in spans)
    assert trace_layout_problems(spans) == []


@pytest.mark.parametrize(
    "traced, sampler, traces_sampler",
    [
        (True, None, None),
        (False, None, None),
        (True, "parentbased_traceidratio", None),  # the library's default sampler: the step rule decides
        (True, "traceidratio", "traceidratio"),  # OTEL_TRACES_SAMPLER on the library's own exporters
        (True, "narrows", None),  # a provider's sampler narrowing the step rule
    ],
)
def test_the_prepared_ids_sample_as_sampled_decides(traced, sampler, traces_sampler):
    """The table of coming steps decides sampling in place for the plain step rule (StepTracker._fill):
    the same decision StepTracker.sampled makes, under every sampler set-up."""
    from types import SimpleNamespace

    from otel_torchdist.config import Config
    from otel_torchdist.drain.sampling import Sampler
    from otel_torchdist.steps import StepTracker

    tracker = StepTracker(Config(trace_first_steps=5, trace_every_steps=7, traces_sampler=traces_sampler, traces_sampler_arg=0.5))
    if sampler == "narrows":
        chosen = SimpleNamespace(narrows=True, root=lambda trace_id: trace_id % 3 == 0)
    else:
        chosen = None if sampler is None else Sampler(sampler, 0.5)
    tracker.pipeline = SimpleNamespace(traced=traced, sampler=chosen)
    tracker.trace_key = "run-rule"
    tracker._fill(-70, 200)
    decided = {i: entry[2] for i, entry in tracker._ids.items()}
    assert decided == {i: tracker.sampled(i, tracker._ids[i][0], 0) for i in range(-70, 201)}
    assert any(decided.values()) == traced and not all(decided.values())


@pytest.mark.parametrize("first, every", [(10, 100), (0, 0), (5, 7), (70, 3), (-3, 64)])
def test_the_filled_table_holds_what_each_steps_ids_give(first, every):
    # The table's entries (made a block at a time, sampling decided by the first steps and the multiples)
    # are what _ids_of makes for each step on its own, across blocks and below zero.
    from otel_torchdist.config import Config
    from otel_torchdist.steps import StepTracker

    tracker = StepTracker(Config(trace_first_steps=first, trace_every_steps=every))
    tracker.trace_key, tracker.rank = "run-fill", 5
    tracker._fill(-70, 200)
    assert tracker._ids == {i: tracker._ids_of(i, 0) for i in range(-70, 201)}
    assert any(entry[2] for entry in tracker._ids.values())


def test_the_straggler_exchange_gives_up_once_the_store_is_gone_and_not_after_a_late_window(monkeypatch):
    """A store whose host ended (rank 0 exited) fails every call, and torch logs each failure with a stack:
    the exchange stops at the first. A window a rank did not answer in time (_wait's TimeoutError) does not
    stop it."""
    from types import SimpleNamespace

    from otel_torchdist.drain import stragglers

    class Gone:
        calls = 0

        def set(self, *args):
            Gone.calls += 1
            raise RuntimeError("sendBytes failed: Broken pipe")

    tried: list[int] = []

    def late_first(self, window, totals):
        tried.append(window)
        if len(tried) == 1:
            raise TimeoutError("no answer")

    for client, exchange in ((Gone(), None), (object(), late_first)):
        monkeypatch.setattr(stragglers, "connect_store", lambda *a, c=client: c)
        if exchange is not None:
            monkeypatch.setattr(stragglers.Exchange, "_exchange", exchange)
        ex = stragglers.Exchange(SimpleNamespace(framework=SimpleNamespace(set=lambda *a: None)), "t", 1, 2, every=2)
        ex.start()
        for index in range(2, 8):
            ex.add_step(index, 1.0, 0.5, 0.5)
            time.sleep(0.05)
        if exchange is None:
            ex._thread.join(5)
            assert not ex._thread.is_alive() and Gone.calls == 1
        else:
            wait_for(lambda: len(tried) == 3, 5, what="every window tried")
            ex.stop()


def test_the_store_threads_start_again_with_a_process_group_made_after_destroy(tmp_path):
    """They stopped with destroy_process_group() and never came back: hang reports without the missing ranks,
    straggler gauges frozen, step roots timed from rank 0 alone, and nothing said."""
    results = run_ranks("scenarios_steps:reinit", 2, str(tmp_path), {})
    for result in results:
        first, second = result["threads"]
        for name in ("otel-torchdist-hang-board", "otel-torchdist-step-roots", "otel-torchdist-stragglers"):
            assert name in first and name in second, (first, second)


def test_a_process_group_with_another_rank_keeps_the_first_identity_and_says_so(tmp_path):
    """A process's series cannot change rank: with another rank in the second world, the process keeps the
    identity its telemetry started with, and the threads that compare ranks stay off, with one warning."""
    results = run_ranks("scenarios_steps:reinit", 2, str(tmp_path), {"swap": True})
    for rank, result in enumerate(results):
        first, second = result["threads"]
        assert "otel-torchdist-hang-board" in first and "otel-torchdist-hang-board" not in second
        other = 1 - rank
        line = f"a process group with rank {other} of 2 after rank {rank} of 2 was destroyed: the straggler exchange"
        assert [m for m in result["said"] if line in m], result["said"]


def test_a_sampled_zero_based_loops_step_time_leaves_out_a_set_up_step_the_metrics_never_counted(fake_pg, instrumented):
    """The set-up step explicit steps take over never had an optimizer step: traced, marked set-up, and left
    out of the step metrics. analyze took its duration out of the metrics' totals all the same: a 4 ms
    step read 0.9 ms after half a second of set-up, and less than nothing after a second."""
    import torch
    import torch.distributed as dist

    import otel_torchdist
    from otel_torchdist.analysis import analyze_path

    folder = instrumented(run_id="zero-based", trace_first_steps=3, trace_every_steps=100)
    dist.broadcast(torch.ones(4), 0)  # the set-up step's collective (DDP's constructor's)
    time.sleep(0.6)  # building the model, loading data
    for i in range(40):
        with otel_torchdist.step(i):
            time.sleep(0.004)
            dist.all_reduce(torch.ones(4))
    otel_torchdist.uninstrument()
    spans = read_spans(f"{folder}/traces.rank0.jsonl")
    (setup,) = [s for s in spans if s["name"] == n.SPAN_RANK_STEP and s["attributes"].get(n.STEP_SETUP)]
    assert setup["attributes"].get(n.STEP_UNCOUNTED) is True
    steps = analyze_path(folder).steps
    assert steps.step_statistic == "mean" and "mean of the 40 steps after the set-up step" in steps.step_time_from
    assert 0.004 <= steps.step_time_s < 0.004 + 0.1 * 0.6 / 40  # the set-up's 0.6 s is in none of them


@pytest.mark.parametrize("traced", [1, 0])
def test_a_send_waited_after_compute_counts_as_compute(tmp_path, traced):
    """gloo's isend completes only at wait(): a send posted, then 0.3 s of compute, then wait() counted the
    compute as collective wait (3.02 s of wait, 0.003 s of compute), so a pipeline stage that computes
    three times as long as its peer looked the faster one. The step counts the time wait() blocked, in the
    span's attributes and in the metrics (untraced steps' records go through the native part's fold)."""
    out = str(tmp_path)
    results = run_ranks("scenarios_steps:send_overlapping_compute", 2, out, {"traced": traced})
    folder = os.path.join(out, "runs", f"overlap-{traced}")
    m = last_metrics(os.path.join(folder, "metrics.rank0.jsonl"))
    compute, wait = _value(m, n.STEP_COMPUTE_TIME), _value(m, n.STEP_COLLECTIVE_WAIT_TIME)
    assert compute > 0.25 * 3 and wait < 0.05 * 3 + results[0]["blocked"], (compute, wait)
    spans = read_spans(os.path.join(folder, "traces.rank0.jsonl")) if traced else []
    steps = [s for s in spans if s["name"] == n.SPAN_RANK_STEP]
    assert len(steps) == 3 * traced
    for s in steps:
        assert s["attributes"][n.STEP_COMPUTE] > 0.25, s["attributes"]
    assert all(s["attributes"][n.COLL_WAIT_S] < s["attributes"][n.COLL_DURATION] for s in spans if s["name"] == "isend")
