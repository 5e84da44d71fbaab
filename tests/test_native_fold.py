"""The native fold of unsampled records (native/fold.cpp, Pipeline.use_native): the same metrics, step
stats and completed sequence numbers as Pipeline.process, record for record, on the records real calls
make; its store the same snapshot as metrics.MetricStore. The rest of the suite's metric checks (counts
against CommDebugMode, Prometheus, the run folder) go through it wherever the native part is built."""

from __future__ import annotations

import math
import random
from collections import deque

import pytest
import torch
import torch.distributed as dist
from opentelemetry import trace

import otel_torchdist
from otel_torchdist import native, runtime
from otel_torchdist.capture import groups
from otel_torchdist.capture import record as R
from otel_torchdist.config import Config
from otel_torchdist.drain.metrics import MetricStore, Series
from otel_torchdist.drain.pipeline import Pipeline


@pytest.fixture
def mod(native_built):
    return native.load()


class _S(str):
    pass


def _without_span_ids(snapshot: dict) -> dict:
    """Snapshots of two runs: the exemplars' times and ids differ, their buckets and values not."""
    return {k: (s.buckets, s.count, s.errors, s.bytes, s.bus_bytes, s.dur_sum, s.dur_min, s.dur_max,
                {i: e[0] for i, e in s.exemplars.items()}) for k, s in snapshot.items()}  # fmt: skip


def test_the_native_store_keeps_the_python_stores_series(mod):
    rng = random.Random(3)
    bounds = (0.001, 0.01, 0.1, 1.0)
    ours, theirs = mod.MetricStore(bounds, Series), MetricStore(bounds)
    assert ours.bounds == bounds and ours.snapshot() == {}
    for i in range(20_000):
        op = rng.choice(["all_reduce", "broadcast", _S("all_reduce"), "".join(["all_", "gather"])])
        group = rng.choice(["default_pg", "tp", _S("tp")])
        seconds = rng.choice([0.0, 0.001, 0.01, 1.0, 5.0, rng.random() / 10, rng.random() * 1e-6])
        nbytes = rng.choice([0, 4096, rng.randrange(1 << 40), 1 << 62])  # past 2**63 in sum: exact
        exemplar = (i, rng.getrandbits(128), rng.getrandbits(64)) if i % 97 == 0 else None
        for store in (ours, theirs):
            store.observe(op, group, seconds, nbytes, nbytes * 1.5, i % 13 == 0, exemplar)
    snapshot = ours.snapshot()
    assert snapshot == theirs.snapshot() and len(snapshot) == 6
    assert all(type(k[0]) is str and type(k[1]) is str for k in snapshot)  # subclasses merged as plain str
    assert max(s.bytes for s in snapshot.values()) > 2**63
    snapshot[("broadcast", "tp")].buckets[0] += 1  # a copy
    assert ours.snapshot() == theirs.snapshot()


def test_the_native_store_refuses_what_python_refuses_without_a_trace(mod):
    ours, theirs = mod.MetricStore((1.0,), Series), MetricStore((1.0,))
    for args in (
        ("op", "g", 0.5, 1, 1.0),  # no error flag
        ("op", "g", "0.5", 1, 1.0, False),
        ("op", "g", 0.5, 1, 1.0, False, (1, 2)),  # an exemplar is (time_ns, trace_id, span_id)
    ):
        try:
            theirs.observe(*args)
        except Exception as exc:
            with pytest.raises(type(exc)):
                ours.observe(*args)
        else:
            raise AssertionError(f"the Python store took {args}")
    with pytest.raises(TypeError):  # names are strings (the Python store would take any key)
        ours.observe(1, "g", 0.5, 1, 1.0, False)
    assert ours.snapshot() == {}  # (the Python store had counted the last one before its exemplar failed)
    ours.observe("op", "g", math.inf, 1, 1.0, False)
    assert ours.snapshot()[("op", "g")].buckets == [0, 1]


def _records(world: int) -> list[tuple]:
    """Records of real calls: unsampled and sampled steps, calls outside steps and under a caller's span,
    an asynchronous call, a failing one, several groups and kinds."""
    tp = dist.new_group([0, 1])
    tracer = trace.get_tracer("test")
    for index in range(1, 7):
        with otel_torchdist.step(index):
            for _ in range(5):
                dist.all_reduce(torch.ones(4))
                dist.broadcast(torch.ones(3, 2), src=1)
                dist.all_gather_into_tensor(torch.empty(4 * world), torch.ones(4))
                dist.all_reduce(torch.ones(8), group=tp)
                dist.barrier()
            dist.all_reduce(torch.ones(4, dtype=torch.float16), async_op=True).wait()
            with pytest.raises(Exception):
                dist.all_reduce(torch.ones(2), op="not an op")  # fails in the call: its record carries the error
            if index == 2:
                with tracer.start_as_current_span("user"):
                    dist.all_reduce(torch.ones(4))
    dist.all_reduce(torch.ones(4))  # outside any step
    return list(R.QUEUE)


def _steps(pipeline: Pipeline) -> dict:
    """{serial: (intervals, collectives, bytes, spans admitted)} of the open steps: the records process() took
    (StepStats) and, with the native fold, those it took (the store's aggregates)."""
    out = {k: (sorted(v.head + v.tail), v.collectives, v.nbytes, v.spans) for k, v in pipeline.step_stats.items()}
    if pipeline.native_steps is not None:
        for k, (count, nbytes, intervals) in pipeline.native_steps.steps_snapshot().items():
            old = out.get(k, ([], 0, 0, 0))
            out[k] = (sorted(old[0] + intervals), old[1] + count, old[2] + nbytes, old[3])
    return out


def _totals(pipeline: Pipeline, serials, lo: int, hi: int, stretch: bool) -> dict:
    """What each step's close (step_close.py) takes: (collectives, bytes, seconds in flight, end)."""
    out = {}
    for serial in serials:
        stats = pipeline.step_stats.pop(serial, None)
        if pipeline.native_steps is not None:
            out[serial] = pipeline.native_steps.take_step(serial, lo, hi, stretch, stats)
        else:
            out[serial] = stats.totals(lo, hi, stretch)
    return out


def _fold_state(pipeline: Pipeline, records: list[tuple]) -> tuple:
    for gi in groups.BY_ID:
        gi.last_completed = 0
    count = pipeline._process_all(deque(records))
    steps = _steps(pipeline)
    starts = sorted(r[R.T_START] for r in records)
    lo, hi = starts[len(starts) // 3], starts[2 * len(starts) // 3]  # a window that clips some, the rest stretched
    totals = _totals(pipeline, sorted(steps), lo, hi, True)
    return count, _without_span_ids(pipeline.store.snapshot()), steps, [gi.last_completed for gi in groups.BY_ID], totals


@pytest.mark.parametrize("sampler", [None, "always_off"])
def test_fold_leaves_the_same_state_as_process_record_for_record(mod, fake_pg, instrumented, sampler):
    instrumented(native="off", drain_interval=3600.0, trace_first_steps=0, trace_every_steps=3)
    records = _records(dist.get_world_size())
    if sampler is None:  # an unsampled step's records; the others make spans
        ours_too = [r for r in records if r[R.STEPCTX] is not None and r[R.STEPCTX][3] is False and r[R.PARENT] is None]
    else:  # no root sampled (a rank trace_ranks leaves out): also those outside a step
        ours_too = [r for r in records if (r[R.STEPCTX] is None or r[R.STEPCTX][3] is False) and r[R.PARENT] is None]
        assert any(r[R.STEPCTX] is None for r in ours_too)
    assert len(records) > 150 and 0 < len(ours_too) < len(records)  # both paths are exercised
    assert any(r[R.ERROR] is not None for r in ours_too) and any(r[R.SEQ] for r in ours_too)
    python = Pipeline(Config(traces_sampler=sampler))
    ours = Pipeline(Config(traces_sampler=sampler))
    ours.use_native(mod)
    assert isinstance(ours.store, mod.MetricStore) and ours._fold is mod.fold
    folded = []
    ours._fold = lambda *args: folded.append(mod.fold(*args)) or folded[-1]
    expected = _fold_state(python, records)
    assert _fold_state(ours, records) == expected
    assert sum(folded) > 0.95 * len(ours_too)  # all but a group size's first
    assert expected[0] == len(records) and expected[2] and any(expected[3])
    assert any(t[2] > 0 for t in expected[4].values())  # steps with time in flight inside the window
    assert ours.native_steps.steps_snapshot() == {}  # each step's aggregate gone with its close


def _untraced_step(mod, instrumented, calls: int) -> tuple[list[tuple], Pipeline]:
    """The records of one untraced step of ``calls`` all_reduces, and a pipeline folding in C."""
    instrumented(native="off", drain_interval=3600.0, trace_first_steps=0, trace_every_steps=0)
    with otel_torchdist.step(1):
        for _ in range(calls):
            dist.all_reduce(torch.ones(4))
    pipeline = Pipeline(Config())
    pipeline.use_native(mod)
    return list(R.QUEUE), pipeline


def _fold(mod, pipeline: Pipeline, q: deque, tap=None) -> int:
    return mod.fold(pipeline.store, q, False, pipeline._fold_failed, tap)


def test_fold_takes_a_batch_at_a_time_and_stops_at_a_record_for_process(mod, fake_pg, instrumented):
    records, pipeline = _untraced_step(mod, instrumented, 600)
    q = deque(records)
    assert _fold(mod, pipeline, q) == 256  # the step opened with its first record; then back to the interpreter
    assert list(pipeline.native_steps.steps_snapshot()) == [records[0][R.STEPCTX][0]] and pipeline.step_stats == {}
    q.insert(10, ["not", "a", "record"])
    assert _fold(mod, pipeline, q) == 10
    assert q[0] == ["not", "a", "record"] and len(q) == len(records) - 266 + 1


def test_a_record_the_fold_fails_on_is_reported_and_the_fold_goes_on(mod, fake_pg, instrumented):
    from otel_torchdist import health

    class FailingMeter:  # a MeterProvider's histogram that raises on every value
        def collective_value(self, op, group, seconds):
            raise RuntimeError("the provider's histogram failed")

    records, pipeline = _untraced_step(mod, instrumented, 5)
    pipeline.meter = FailingMeter()
    before = health.errors().get("pipeline", 0)
    assert pipeline._process_all(deque(records)) == 5  # each counted once, none left behind, no loop
    assert health.errors().get("pipeline", 0) == before + 5  # each record's, reported, and the fold went on
    ((_, series),) = pipeline.store.snapshot().items()
    assert series.count == 5  # folded before the value went to the provider
    assert [v[0] for v in pipeline.native_steps.steps_snapshot().values()] == [5]


def test_a_record_left_for_process_leaves_no_step_opened(mod, fake_pg, instrumented):
    from otel_torchdist import bandwidth

    records, pipeline = _untraced_step(mod, instrumented, 1)
    bandwidth.FACTORS.clear()  # a group size not met yet: process() works out its bus factor
    q = deque(records)
    assert _fold(mod, pipeline, q) == 0
    assert pipeline.step_stats == {} and pipeline.native_steps.steps_snapshot() == {} and len(q) == 1
    pipeline._process_all(q)
    ((key, series),) = pipeline.store.snapshot().items()
    assert len(pipeline.step_stats) == 1 and key[0] == "all_reduce" and series.count == 1


def test_message_sizes_past_64_bits_are_kept_exact(mod):
    ours, theirs = mod.MetricStore((1.0,), Series), MetricStore((1.0,))
    for size in (2**64 + 5, 2**100, -(2**70), 3):
        for store in (ours, theirs):
            store.observe("op", "g", 0.5, size, 1.0, False)
    assert ours.snapshot() == theirs.snapshot()
    assert ours.snapshot()[("op", "g")].bytes == 2**64 + 5 + 2**100 - 2**70 + 3
    with pytest.raises(OverflowError):  # past 128 bits
        ours.observe("op", "g", 0.5, 2**130, 1.0, False)


def test_an_exemplar_that_fails_raises_its_own_error(mod):
    class Exemplar:
        def __getitem__(self, i):
            raise ValueError("bad time")

    store = mod.MetricStore((1.0,), Series)
    with pytest.raises(ValueError, match="bad time"):
        store.observe("op", "g", 0.5, 1, 1.0, False, Exemplar())
    assert store.snapshot() == {}


def test_instrument_folds_with_the_native_part_and_native_off_in_python(fake_pg, instrumented, native_built):
    module = native.load()
    instrumented(native="auto", drain_interval=3600.0)
    assert isinstance(runtime.current().pipeline.store, module.MetricStore)
    otel_torchdist.uninstrument()
    instrumented(native="off", drain_interval=3600.0)
    assert isinstance(runtime.current().pipeline.store, MetricStore)


def test_steps_never_closed_are_forgotten_as_the_python_side_forgets_them(mod, fake_pg, instrumented):
    """The native aggregates follow Pipeline.open_step_stats's rule: past STEPS_OPEN open steps, the oldest
    is forgotten once a step opened after it has closed; past STEPS_OPEN_MAX, whatever closed."""
    from otel_torchdist.drain.pipeline import STEPS_OPEN, STEPS_OPEN_MAX

    records, pipeline = _untraced_step(mod, instrumented, 1)
    rec = records[0]

    def fold_step(serial: int) -> None:
        ctx = rec[R.STEPCTX]
        assert _fold(mod, pipeline, deque([rec[: R.STEPCTX] + ((serial,) + ctx[1:],) + rec[R.STEPCTX + 1 :]])) == 1

    fold_step(1)  # left open
    fold_step(5)
    assert pipeline.native_steps.take_step(5, 0, 1, False, None)[0] == 1  # closed
    for i in range(10, 10 + STEPS_OPEN):
        fold_step(i)
    open_steps = pipeline.native_steps.steps_snapshot()
    assert 1 in open_steps and len(open_steps) == STEPS_OPEN + 1  # none forgotten yet
    fold_step(100)
    open_steps = pipeline.native_steps.steps_snapshot()
    assert 1 not in open_steps and 10 in open_steps  # only the stale one
    for i in range(200, 200 + STEPS_OPEN_MAX):
        fold_step(i)
    assert len(pipeline.native_steps.steps_snapshot()) == STEPS_OPEN_MAX + 1  # bounded whatever closes


@pytest.mark.parametrize("fold", [False, True], ids=["python", "native"])
def test_bytes_and_bandwidth_only_for_calls_seen_to_complete(fold, fake_pg, instrumented, request):
    """A call that failed moved nothing the record can vouch for, one never seen to finish (flushed at the
    end) and one ended at its launch (NCCL without completion timing) have no transfer time: no algbw or
    busbw on their spans; the first two add no bytes to the counters and no time to the duration histogram
    (every one still counts as a call)."""
    from otel_torchdist import names as n
    from otel_torchdist.drain.spans import dynamic_attributes

    instrumented(native="off", drain_interval=3600.0, trace_first_steps=0, trace_every_steps=0)
    with otel_torchdist.step(1):
        dist.all_reduce(torch.ones(4))
        with pytest.raises(Exception):
            dist.all_reduce(torch.ones(4), op="not an op")
    ok, failed = [r for r in R.QUEUE if r[R.OP] == "all_reduce"]
    assert ok[R.ERROR] is None and failed[R.ERROR] is not None
    R.QUEUE.clear()

    def ended(source: str) -> tuple:
        return ok[: R.END] + (source,) + ok[R.END + 1 :]

    records = [ok, failed, ended(n.END_UNFINISHED), ended(n.END_ENQUEUE)]
    pipeline = Pipeline(Config())
    if fold:
        pipeline.use_native(request.getfixturevalue("mod"))
    pipeline._process_all(deque(records))
    ((key, series),) = pipeline.collective_series().items()
    assert (series.count, series.errors, series.bytes) == (4, 1, 2 * 16)  # the completed call and the launched one
    assert sum(series.buckets) == 2  # timed: the completed call and the launched one
    gi = groups.BY_ID[ok[R.GROUP]]
    with_bandwidth = [n.COLL_BUSBW in dict(dynamic_attributes(r, gi, 0.001)) for r in records]
    assert with_bandwidth == [True, False, False, False]
