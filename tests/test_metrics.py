"""The metric aggregation itself (no process group needed): what the drain thread folds records into."""

from __future__ import annotations

import bisect
import random

from otel_torchdist import names as n
from otel_torchdist.drain.metrics import FrameworkMetrics, Histogram, MetricStore, collective_metrics


def test_collective_series_match_a_direct_computation_in_any_order():
    store = MetricStore()
    rng = random.Random(8)
    values = [rng.lognormvariate(-7, 2) for _ in range(500)]
    values[0] = max(values)  # the first value is the maximum: min and max must still both move
    sizes = [rng.randrange(1, 1 << 20) for _ in values]
    for i, (v, size) in enumerate(zip(values, sizes)):
        store.observe("all_reduce", "g0", v, size, size * 1.5, error=i % 7 == 0, exemplar=(i, 10 + i, 20 + i) if i == 42 else None)
    store.observe("broadcast", "g0", 0.25, 8, 8.0, error=False)

    snap = store.snapshot()
    s = snap[("all_reduce", "g0")]
    assert s.count == len(values)
    assert s.dur_min == min(values) and s.dur_max == max(values)
    assert abs(s.dur_sum - sum(values)) < 1e-12 * len(values)
    assert s.bytes == sum(sizes) and abs(s.bus_bytes - 1.5 * sum(sizes)) < 1e-6
    assert s.errors == len(range(0, len(values), 7))
    expected = [0] * (len(store.bounds) + 1)
    for v in values:
        expected[bisect.bisect_left(store.bounds, v)] += 1
    assert s.buckets == expected
    i = bisect.bisect_left(store.bounds, values[42])
    assert s.exemplars == {i: (values[42], 42, 52, 62)}
    one = snap[("broadcast", "g0")]
    assert (one.count, one.dur_min, one.dur_max) == (1, 0.25, 0.25)

    points = {m.metric.name: m.points for m in collective_metrics(snap, {n.M_RANK: "0"})}
    (hist,) = [p for p in points[n.COLLECTIVE_DURATION.name] if p.attributes[n.M_OP] == "all_reduce"]
    assert hist.count == len(values) and sum(hist.bucket_counts) == len(values)


def test_a_histogram_folded_in_batches_equals_one_value_at_a_time():
    # Values wait and are folded when read or when FOLD_AT wait: read at odd moments, the result is what a
    # bisection per value gives (values on a bound go to that bound's bucket).
    h = Histogram()
    rng = random.Random(3)
    values = [rng.lognormvariate(-5, 3) for _ in range(3 * Histogram.FOLD_AT + 17)] + list(h.bounds[:5])
    seen = []
    for i, v in enumerate(values):
        h.observe(v)
        seen.append(v)
        if i in (0, 1, 100, 700):
            assert (h.count, h.min, h.max) == (len(seen), min(seen), max(seen))
        assert len(h.waiting) < Histogram.FOLD_AT
    expected = [0] * (len(h.bounds) + 1)
    for v in values:
        expected[bisect.bisect_left(h.bounds, v)] += 1
    point = h.point({})
    assert point.bucket_counts == expected and point.count == len(values)
    assert abs(point.sum - sum(values)) < 1e-12 * sum(values)
    assert (point.min, point.max) == (min(values), max(values))
    assert Histogram().point({}).count == 0 and Histogram().min is None


def test_bound_children_are_the_series_the_keyed_calls_update():
    fw = FrameworkMetrics()
    h = fw.histogram(n.STEP_DURATION_METRIC)
    c = fw.counter(n.STEPS_METRIC)
    g = fw.gauge(n.STEP_CURRENT)
    # Bound but not updated: a histogram with no observation and a gauge never set are not exported (as
    # before any update); a counter is a counter from zero.
    names = {m.metric.name for m in fw.metric_data({})}
    assert names == {n.STEPS_METRIC.name}
    with fw.lock:
        h.observe(0.5)
        c.value += 1
        g.value = 7
    fw.observe(n.STEP_DURATION_METRIC, (), 1.5)  # the keyed calls reach the same children
    fw.add(n.STEPS_METRIC, (), 1)
    assert fw.histogram(n.STEP_DURATION_METRIC) is h and fw.counter(n.STEPS_METRIC) is c
    assert (h.count, h.sum, h.min, h.max) == (2, 2.0, 0.5, 1.5)
    assert fw.get(n.STEPS_METRIC, ()) == 2 and fw.get(n.STEP_CURRENT, ()) == 7
    assert fw.get(n.TRAIN_LOSS, ()) is None
    data = {m.metric.name: m.points for m in fw.metric_data({n.M_RANK: "3"})}
    assert data[n.STEP_DURATION_METRIC.name][0].count == 2
    assert data[n.STEPS_METRIC.name][0].value == 2
    assert data[n.STEP_CURRENT.name][0].value == 7
