"""Spans and metrics through the application's OpenTelemetry providers: real SDK providers, in-memory
exporters and readers, a custom exporter that is not OTLP, custom samplers, views that rename and drop.

In-process tests with the ``fake`` backend (4 ranks, this process is rank 0); tests/test_providers_ranks.py
runs the same through global providers in real multi-process gloo jobs.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.metrics.view import DropAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, Decision, ParentBased, Sampler, SamplingResult, TraceIdRatioBased

import otel_torchdist
from otel_torchdist import TorchDistributedInstrumentor
from otel_torchdist import names as n

from .harness import read_spans

RESOURCE = Resource({"service.name": "my-trainer", "team": "ml"})



def _name(span) -> str:
    """A span's name without the rank the library's span names carry (``all_reduce rank=0``)."""
    return n.span_base_name(span.name)

def _providers(sampler=None, views=()):
    spans = InMemorySpanExporter()
    tp = TracerProvider(resource=RESOURCE, sampler=sampler)
    tp.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader], resource=RESOURCE, views=list(views))
    return tp, mp, spans, reader


def _steps(count: int = 3) -> None:
    for i in range(1, count + 1):
        with otel_torchdist.step(i):
            dist.all_reduce(torch.ones(256))
            dist.broadcast(torch.ones(16), 0)


def _points(reader: InMemoryMetricReader) -> dict[str, list]:
    out: dict[str, list] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out.setdefault(m.name, []).extend(m.data.data_points)
    return out


def _by_op(points: list) -> dict[str, object]:
    return {p.attributes[n.M_OP]: p for p in points}


def test_spans_and_metrics_go_through_the_given_providers(fake_pg, instrumented, tmp_path):
    tp, mp, spans, reader = _providers()
    folder = instrumented(tracer_provider=tp, meter_provider=mp)
    _steps(3)
    otel_torchdist.uninstrument()

    finished = spans.get_finished_spans()
    names = [_name(s) for s in finished]
    assert names.count("all_reduce") == 3 and names.count("broadcast") == 3
    assert names.count(n.SPAN_RANK_STEP) == 3 and names.count(n.SPAN_STEP) == 3
    for s in finished:  # the application's Resource; the rank and run on every span
        assert s.resource.attributes["service.name"] == "my-trainer"
        assert s.attributes[n.RANK] == 0 and s.attributes[n.RUN_ID] == "unit"
        assert s.instrumentation_scope.name == n.SCOPE_NAME
    # The run folder keeps only its copy (run_folder_copy): the same spans, for otel-torchdist analyze.
    copied = [s for s in read_spans(os.path.join(folder, "traces.rank0.jsonl")) if s["name"] == "all_reduce"]
    assert len(copied) == 3

    points = _points(reader)
    calls = _by_op(points[n.COLLECTIVE_CALLS.name])
    assert calls["all_reduce"].value == 3 and calls["broadcast"].value == 3
    attributes = dict(calls["all_reduce"].attributes)
    assert attributes.pop(n.M_GROUP).startswith("default_pg")  # ":1"... when earlier tests made groups too
    assert attributes == {n.M_RUN: "unit", n.M_RANK: "0", n.M_OP: "all_reduce"}
    durations = _by_op(points[n.COLLECTIVE_DURATION.name])
    assert durations["all_reduce"].count == 3  # every value, not a sample
    assert list(durations["all_reduce"].explicit_bounds) == list(n.DURATION_BUCKETS)
    assert _by_op(points[n.COLLECTIVE_BYTES.name])["all_reduce"].value == 3 * 256 * 4
    assert points[n.STEPS_METRIC.name][0].value == 3
    assert points[n.STEP_DURATION_METRIC.name][0].count == 3  # a framework histogram, value by value


def test_metric_names_units_and_kinds_are_the_catalogs(fake_pg, instrumented):
    tp, mp, spans, reader = _providers()
    instrumented(tracer_provider=tp, meter_provider=mp)
    _steps(2)
    otel_torchdist.uninstrument()
    data = reader.get_metrics_data()
    seen = {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    catalog = {m.name: m for m in n.METRICS}
    assert {n.COLLECTIVE_DURATION.name, n.COLLECTIVE_CALLS.name, n.TELEMETRY_DROPPED.name} <= set(seen)
    kinds = {"histogram": "Histogram", "counter": "Sum", "gauge": "Gauge"}
    for name, metric in seen.items():
        assert metric.unit == catalog[name].unit, name
        assert type(metric.data).__name__ == kinds[catalog[name].instrument], name


def test_the_instrumentor_takes_providers_as_contrib_instrumentations_do(fake_pg, tmp_path):
    tp, mp, spans, reader = _providers()
    inst = TorchDistributedInstrumentor()
    inst.instrument(tracer_provider=tp, meter_provider=mp, run_dir=str(tmp_path), summary="none", trace_every_steps=1)
    try:
        _steps(1)
    finally:
        inst.uninstrument()
    assert {_name(s) for s in spans.get_finished_spans()} >= {"all_reduce", n.SPAN_RANK_STEP}
    assert _by_op(_points(reader)[n.COLLECTIVE_CALLS.name])["all_reduce"].value == 1


def test_a_provider_option_that_is_not_a_provider_is_refused(fake_pg, tmp_path):
    with pytest.raises(TypeError, match="tracer_provider must be an OpenTelemetry TracerProvider"):
        otel_torchdist.instrument(tracer_provider="jaeger", run_dir=str(tmp_path))
    assert not TorchDistributedInstrumentor().is_instrumented_by_opentelemetry


class _Lines(SpanExporter):
    """A custom exporter that is not OTLP: what a vendor's would be."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def export(self, spans):
        self.lines += [f"{_name(s)} {s.context.trace_id:032x} {s.attributes.get(n.COLL_OP, '')}" for s in spans]
        return SpanExportResult.SUCCESS


def test_a_custom_exporter_that_is_not_otlp_receives_every_span(fake_pg, instrumented):
    tp = TracerProvider(resource=RESOURCE)
    custom = _Lines()
    tp.add_span_processor(SimpleSpanProcessor(custom))
    instrumented(tracer_provider=tp)
    _steps(2)
    otel_torchdist.uninstrument()
    ops = [line.split()[0] for line in custom.lines]
    assert ops.count("all_reduce") == 2 and ops.count(n.SPAN_RANK_STEP) == 2


class _NoBroadcast(Sampler):
    def should_sample(self, parent_context, trace_id, name, kind=None, attributes=None, links=None, trace_state=None):
        return SamplingResult(Decision.DROP if n.span_base_name(name) == "broadcast" else Decision.RECORD_AND_SAMPLE)

    def get_description(self) -> str:
        return "NoBroadcast"


def test_the_providers_sampler_decides_for_every_span(fake_pg, instrumented):
    tp, _, spans, _ = _providers(sampler=_NoBroadcast())
    instrumented(tracer_provider=tp)
    _steps(2)
    otel_torchdist.uninstrument()
    names = [_name(s) for s in spans.get_finished_spans()]
    assert "broadcast" not in names and names.count("all_reduce") == 2


def test_always_off_drops_every_span_steps_included(fake_pg, instrumented):
    tp, mp, spans, reader = _providers(sampler=ALWAYS_OFF)
    instrumented(tracer_provider=tp, meter_provider=mp)
    _steps(3)
    otel_torchdist.uninstrument()
    assert spans.get_finished_spans() == ()
    assert _by_op(_points(reader)[n.COLLECTIVE_CALLS.name])["all_reduce"].value == 3  # metrics are never sampled


def test_a_ratio_sampler_keeps_or_drops_each_step_whole(fake_pg, instrumented):
    tp, _, spans, _ = _providers(sampler=ParentBased(TraceIdRatioBased(0.5)))
    instrumented(tracer_provider=tp)
    _steps(16)
    otel_torchdist.uninstrument()
    by_trace: dict[int, list[str]] = {}
    for s in spans.get_finished_spans():
        by_trace.setdefault(s.context.trace_id, []).append(_name(s))
    assert 0 < len(by_trace) < 16  # some steps kept, some dropped (16 steps at 0.5: 1 in 32 768 to fail)
    for names in by_trace.values():  # a kept step is kept whole
        assert sorted(names) == sorted(["all_reduce", "broadcast", n.SPAN_RANK_STEP, n.SPAN_STEP])


def test_views_rename_and_drop_the_librarys_instruments(fake_pg, instrumented):
    views = (
        View(instrument_name=n.COLLECTIVE_CALLS.name, name="my.collective.calls"),
        View(instrument_name=n.COLLECTIVE_BYTES.name, aggregation=DropAggregation()),
    )
    tp, mp, spans, reader = _providers(views=views)
    instrumented(tracer_provider=tp, meter_provider=mp)
    _steps(2)
    otel_torchdist.uninstrument()
    points = _points(reader)
    assert n.COLLECTIVE_BYTES.name not in points
    assert n.COLLECTIVE_CALLS.name not in points
    assert _by_op(points["my.collective.calls"])["all_reduce"].value == 2
    assert _by_op(points[n.COLLECTIVE_DURATION.name])["all_reduce"].count == 2  # no view: as it is


def test_a_step_under_the_callers_span_makes_one_tree_with_the_callers_spans(fake_pg, instrumented):
    tp, _, spans, _ = _providers()
    tracer = tp.get_tracer("my.training")
    instrumented(tracer_provider=tp)
    for i in range(1, 4):
        with tracer.start_as_current_span("iteration"):
            with otel_torchdist.step(i):
                with tracer.start_as_current_span("my.forward"):
                    dist.all_reduce(torch.ones(8))
                dist.broadcast(torch.ones(8), 0)
    otel_torchdist.uninstrument()
    finished = spans.get_finished_spans()
    by_id = {s.context.span_id: s for s in finished}
    iterations = [s for s in finished if _name(s) == "iteration"]
    steps = sorted((s for s in finished if _name(s) == n.SPAN_RANK_STEP), key=lambda s: s.attributes[n.STEP])
    assert len(iterations) == len(steps) == 3
    for it, step in zip(iterations, steps):
        under = {_name(s): s for s in finished if s.parent is not None and s.parent.span_id == step.context.span_id}
        assert set(under) == {"my.forward", "broadcast"}  # the caller's span inside the step is the step's child
        (forward_child,) = [s for s in finished if s.parent is not None and s.parent.span_id == under["my.forward"].context.span_id]
        assert _name(forward_child) == "all_reduce"
        (link,) = step.links
        if step.attributes[n.STEP] == 1:
            # Step 1 was open since instrument() (set-up may be in it): it stays in the step's shared trace,
            # under its root, and links to the span it was marked in.
            assert (link.context.trace_id, link.context.span_id) == (it.context.trace_id, it.context.span_id)
            assert _name(by_id[step.parent.span_id]) == n.SPAN_STEP
            continue
        assert step.parent.span_id == it.context.span_id and step.context.trace_id == it.context.trace_id
        # Linked to the step's root, which rank 0 emits in the shared step trace.
        root = by_id[link.context.span_id]
        assert _name(root) == n.SPAN_STEP and root.context.trace_id == link.context.trace_id != it.context.trace_id
    for s in finished:  # nothing points at a span that was not exported
        assert s.parent is None or s.parent.span_id in by_id, _name(s)


@pytest.mark.parametrize("marked", [False, True], ids=["optimizer steps", "step_begin"])
def test_a_span_around_the_whole_loop_leaves_each_steps_collectives_in_that_step(fake_pg, instrumented, marked):
    """A job's span around the loop: every collective of every step was that span's child, sampled by it,
    so the library's step choice traced all of them (15 of 15 here, every step's) and the traced steps' own
    spans held none. They are the step's again, traced as the step is."""
    tp, _, spans, _ = _providers()
    instrumented(tracer_provider=tp, trace_first_steps=3, trace_every_steps=100)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with tp.get_tracer("my.job").start_as_current_span("job"):
        for i in range(1, 16):
            if marked:
                otel_torchdist.step_begin(i)
            model(torch.ones(2, 4)).sum().backward()
            dist.all_reduce(torch.ones(3))
            opt.step()
            opt.zero_grad()
            if marked:
                otel_torchdist.step_end()
    otel_torchdist.uninstrument()
    finished = spans.get_finished_spans()
    by_id = {s.context.span_id: s for s in finished}
    collectives = [s for s in finished if _name(s) in ("all_reduce", "optimizer.step")]
    steps = {s.context.span_id: s.attributes[n.STEP] for s in finished if _name(s) == n.SPAN_RANK_STEP}
    assert sorted(steps.values()) == [1, 2, 3]
    job = next(s for s in finished if _name(s) == "job")
    held = sorted(str(steps.get(s.parent.span_id, "job" if s.parent.span_id == job.context.span_id else "?")) for s in collectives)
    # A span is the loop's once two steps began in it: the first step that began in the job's span (step 1
    # marked, step 2 unmarked: step 1, the set-up step, began at the process group) leaves its collectives
    # to that span, as to a span of an iteration.
    assert held == (["2", "2", "3", "3", "job", "job"] if marked else ["3", "3", "job", "job", "job", "job"])
    for s in finished:
        assert s.parent is None or s.parent.span_id in by_id, _name(s)


@pytest.mark.parametrize("sampler", [None, _NoBroadcast()], ids=["default", "span by span"])
def test_exemplars_of_the_duration_histogram_point_at_exported_spans(sampler, fake_pg, instrumented):
    """A sampler of the application's that decides span by span does so after the duration was recorded:
    no exemplar then (one pointed at the broadcasts it dropped)."""
    tp, mp, spans, reader = _providers(sampler=sampler)
    instrumented(tracer_provider=tp, meter_provider=mp)
    _steps(2)
    from otel_torchdist import runtime

    runtime.current().pipeline.drain()  # not flush(): the provider's flush would collect the exemplars itself
    points = _points(reader)
    otel_torchdist.uninstrument()
    exported = {(s.context.trace_id, s.context.span_id) for s in spans.get_finished_spans()}
    exemplars = [e for p in points[n.COLLECTIVE_DURATION.name] for e in p.exemplars]
    assert bool(exemplars) == (sampler is None)
    assert all((e.trace_id, e.span_id) in exported for e in exemplars)


@pytest.mark.parametrize("buckets", [None, (0.001, 0.01, 0.1)], ids=["same buckets", "other buckets"])
def test_uninstrument_leaves_the_providers_as_they_were_with_the_last_totals(buckets, fake_pg, instrumented):
    tp, mp, spans, reader = _providers()
    instrumented(tracer_provider=tp, meter_provider=mp)
    tracer = tp.get_tracer(n.SCOPE_NAME, otel_torchdist.__version__, attributes={n.RANK: 0, n.RUN_ID: "unit", n.WORLD_SIZE: 4})
    _steps(2)
    otel_torchdist.uninstrument()
    assert type(tracer.id_generator).__name__ == "RandomIdGenerator"  # the provider's own again
    dist.all_reduce(torch.ones(4))
    # The last export of the provider (at its shutdown, after ours) still has the run's totals.
    assert _by_op(_points(reader)[n.COLLECTIVE_CALLS.name])["all_reduce"].value == 2
    # A second instrumentation of the same provider reports through the same instruments (made with the
    # first one's buckets: a meter hands back the instruments it made first).
    otel_torchdist.instrument(tracer_provider=tp, meter_provider=mp, run_dir="/tmp/unused-runs", summary="none", histogram_buckets=buckets)
    dist.all_reduce(torch.ones(4))
    otel_torchdist.uninstrument()
    assert _by_op(_points(reader)[n.COLLECTIVE_CALLS.name])["all_reduce"].value == 1


def test_a_global_tracer_provider_is_found_without_options(monkeypatch, fake_pg, instrumented):
    from otel_torchdist.export import providers

    tp, mp, spans, reader = _providers()
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: tp)  # set_tracer_provider works once a process
    chosen = providers.choose()
    assert chosen.tracer_provider is tp and chosen.tracer_origin == "the global opentelemetry.TracerProvider"
    assert chosen.meter_provider is None and chosen.meter_origin == "own"  # the API's placeholder
    instrumented()
    _steps(1)
    otel_torchdist.uninstrument()
    assert "all_reduce" in {_name(s) for s in spans.get_finished_spans()}


@pytest.mark.parametrize("native", ["auto", "off"])
def test_every_duration_reaches_the_providers_histogram_from_untraced_steps_too(fake_pg, instrumented, native, native_built):
    """Records of untraced steps are folded in C with the native part (Python without it): either way each
    duration is recorded in the provider's histogram."""
    tp, mp, spans, reader = _providers()
    instrumented(tracer_provider=tp, meter_provider=mp, native=native, trace_first_steps=0, trace_every_steps=0)
    from otel_torchdist import runtime

    assert (runtime.current().pipeline._fold is not None) == (native == "auto")
    _steps(5)
    otel_torchdist.uninstrument()
    assert [_name(s) for s in spans.get_finished_spans()] == []
    points = _points(reader)
    assert _by_op(points[n.COLLECTIVE_DURATION.name])["all_reduce"].count == 5
    assert _by_op(points[n.COLLECTIVE_CALLS.name])["all_reduce"].value == 5


def test_the_global_meter_provider_can_be_left_to_the_librarys_own_exporters(monkeypatch, fake_pg, instrumented):
    """global_meter_provider=False: spans through the global TracerProvider, metrics to the run folder (the
    cheap path); a meter_provider= given to instrument() is used all the same."""
    from opentelemetry import metrics

    import os

    tp, mp, spans, reader = _providers()
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: tp)
    monkeypatch.setattr(metrics, "get_meter_provider", lambda: mp)
    folder = instrumented(global_meter_provider=False, metrics_exporter=("file",))
    _steps(1)
    otel_torchdist.uninstrument()
    assert "all_reduce" in {_name(s) for s in spans.get_finished_spans()}
    assert n.COLLECTIVE_CALLS.name not in _points(reader)
    assert os.path.exists(os.path.join(folder, "metrics.rank0.jsonl"))


def test_a_span_processor_that_raises_costs_its_spans_counted_not_training(fake_pg, instrumented):
    from opentelemetry.sdk.trace import SpanProcessor

    from otel_torchdist import health

    class Raising(SpanProcessor):
        def on_end(self, span) -> None:
            if _name(span) == "broadcast":
                raise RuntimeError("the application's processor failed")

    tp, _, spans, _ = _providers()
    tp.add_span_processor(Raising())
    health.reset()
    instrumented(tracer_provider=tp)
    _steps(2)
    otel_torchdist.uninstrument()
    names = [_name(s) for s in spans.get_finished_spans()]
    assert names.count("all_reduce") == 2  # the others went through
    assert health.drops()["span"] == 2 and health.errors()["export"] == 2


def test_a_synchronous_processor_over_a_slow_exporter_holds_a_flush_one_flush_timeout(fake_pg, instrumented):
    """SimpleSpanProcessor exports as each span ends, on the thread that ends it: a flush ending 12 spans
    over an exporter that takes 0.5 s each took 6 s against its 1 s. The rest is counted instead."""
    import time

    from otel_torchdist import health

    class Slow(SpanExporter):
        def export(self, spans):
            time.sleep(0.5)
            return SpanExportResult.SUCCESS

    tp = TracerProvider(shutdown_on_exit=False)
    tp.add_span_processor(SimpleSpanProcessor(Slow()))
    health.reset()
    instrumented(tracer_provider=tp, flush_timeout=1.0, span_schedule_delay=3600.0)
    _steps(4)
    t0 = time.monotonic()
    otel_torchdist.flush()
    assert time.monotonic() - t0 < 2.0
    assert health.drops().get("span", 0) > 0
    otel_torchdist.uninstrument()


@pytest.mark.parametrize("route", ["providers", "dead endpoint"])
def test_the_run_folder_keeps_a_copy_whatever_the_exporters(fake_pg, instrumented, route):
    """Telemetry sent elsewhere (an application's providers; an OTLP endpoint that is down) is still in the
    run folder, so the run can be analysed locally."""
    from otel_torchdist.analysis import analyze_path

    if route == "providers":
        tp, mp, spans, _ = _providers()
        folder = instrumented(tracer_provider=tp, meter_provider=mp, traces_exporter="none", metrics_exporter="none")
    else:
        folder = instrumented(
            endpoint="http://127.0.0.1:9", traces_exporter=None, metrics_exporter=None, flush_timeout=1.0,
            timeout=0.5,
        )  # fmt: skip
    _steps(3)
    otel_torchdist.uninstrument()
    if route == "providers":
        assert spans.get_finished_spans()  # the providers got theirs
    report = analyze_path(folder)
    counts = {r.op: r.count for r in report.ops.rows}
    assert counts["all_reduce"] == 3 and counts["broadcast"] == 3
    assert len(report.steps.rows) == 3 and report.run.metric_snapshots >= 1


def test_the_run_folder_copy_can_be_turned_off(fake_pg, instrumented):
    tp, mp, spans, _ = _providers()
    folder = instrumented(tracer_provider=tp, meter_provider=mp, traces_exporter="none", metrics_exporter="none",
                          run_folder_copy=False)  # fmt: skip
    _steps(2)
    otel_torchdist.uninstrument()
    assert spans.get_finished_spans()
    assert not os.path.exists(f"{folder}/traces.rank0.jsonl") and not os.path.exists(f"{folder}/metrics.rank0.jsonl")
    assert os.path.exists(f"{folder}/summary.rank0.json")  # the summary is written as before


def test_providers_made_after_instrument_get_the_last_spans_at_exit(tmp_path):
    """instrument() first, the SDK providers made after it (before the process group), a plain exit: the
    providers' own exit hook, registered later, ran first, shut them down, and the library's spans never
    reached the exporter (1 span of 30: the program's own). A fresh interpreter, for its exit."""
    import subprocess
    import sys
    import textwrap

    out = tmp_path / "exported.txt"
    script = textwrap.dedent(
        f"""
        import torch, torch.distributed as dist
        from torch.testing._internal.distributed.fake_pg import FakeStore
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
        import otel_torchdist

        class Names(SpanExporter):
            names = []
            def export(self, spans):
                Names.names += [s.name.split()[0] for s in spans]
                return SpanExportResult.SUCCESS
            def shutdown(self):
                open({str(out)!r}, "w").write("\\n".join(Names.names))

        otel_torchdist.instrument(run_dir={str(tmp_path)!r}, summary="none", metrics_exporter=("file",))
        tp = TracerProvider()
        tp.add_span_processor(BatchSpanProcessor(Names()))
        trace.set_tracer_provider(tp)
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            model(torch.ones(2, 4)).sum().backward()
            dist.all_reduce(torch.ones(3))
            opt.step()
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    names = out.read_text().split()
    assert names.count("all_reduce") == 3 and names.count("optimizer.step") == 3, names
    assert n.SPAN_RANK_STEP in names


def test_spans_reach_the_providers_processor_without_waiting_for_the_schedule_delay(fake_pg, instrumented):
    """The application's span processor batches again: the library held the spans for OTEL_BSP_SCHEDULE_DELAY
    (5 s) on top, and a provider shut down in that time lost them. Handed over within a quarter second now."""
    import time

    tp, _, spans, _ = _providers()
    instrumented(tracer_provider=tp)
    _steps(3)
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and not [s for s in spans.get_finished_spans() if _name(s) == "all_reduce"]:
        time.sleep(0.05)
    assert len([s for s in spans.get_finished_spans() if _name(s) == "all_reduce"]) >= 2  # steps 1, 2 at least


def test_a_collection_right_after_another_reads_the_totals_of_now(fake_pg, instrumented):
    """The observable counters' snapshot served every collection for half a second: collected right after
    another (a reader's final export at shutdown, a second reader), calls said 3 where the histogram, recorded
    as it goes, said 8."""
    _, mp, _, reader = _providers()
    instrumented(meter_provider=mp)
    from otel_torchdist import runtime

    def totals():
        points = _points(reader)
        return _by_op(points[n.COLLECTIVE_CALLS.name])["all_reduce"].value, _by_op(points[n.COLLECTIVE_DURATION.name])["all_reduce"].count

    for _ in range(3):
        dist.all_reduce(torch.ones(4))
    runtime.current().pipeline.drain()
    assert totals() == (3, 3)
    for _ in range(5):
        dist.all_reduce(torch.ones(4))
    runtime.current().pipeline.drain()
    assert totals() == (8, 8)


def test_instrumenting_again_continues_the_counters_and_repeats_no_ids(fake_pg, instrumented):
    """uninstrument(), then instrument() again with the same providers (as the warning on a second
    instrument() advises to change options): the second's steps had the first's trace and span ids, its
    collectives hung in the first's trees, and the counters, the provider's instruments with their start
    time, went back (steps 3 -> 2) where the histogram went on (3 -> 5)."""
    from otel_torchdist import health

    tp, mp, spans, reader = _providers()
    for steps in (3, 2):
        instrumented(tracer_provider=tp, meter_provider=mp)
        _steps(steps)
        if steps == 3:
            health.dropped("span")  # a process-wide total: it goes on by itself, and must not be added twice
        otel_torchdist.uninstrument()
    finished = spans.get_finished_spans()
    ids = [(s.context.trace_id, s.context.span_id) for s in finished]
    assert len(ids) == len(set(ids))
    assert len({s.context.trace_id for s in finished if _name(s) == n.SPAN_STEP}) == len([s for s in finished if _name(s) == n.SPAN_STEP])
    points = _points(reader)
    (steps_point,) = points[n.STEPS_METRIC.name]
    assert steps_point.value >= 5  # the set-up steps besides
    calls = _by_op(points[n.COLLECTIVE_CALLS.name])["all_reduce"].value
    assert calls == _by_op(points[n.COLLECTIVE_DURATION.name])["all_reduce"].count == 5
    (dropped,) = [p.value for p in points[n.TELEMETRY_DROPPED.name] if p.attributes[n.M_KIND] == "span"]
    assert dropped == health.drops()["span"]


def test_a_span_per_iteration_keeps_its_collectives_when_the_next_step_begins_inside_it(fake_pg, instrumented):
    """Optimizer-closed steps with no DataLoader begin at the end of optimizer.step(), inside the
    iteration's span: taken for a span around the loop, the collectives the iteration issued after its
    optimizer step (a loss all-reduced for logging) were the next, untraced step's, and dropped (1 of 10)."""
    tp, _, spans, _ = _providers()
    instrumented(tracer_provider=tp, trace_first_steps=2, trace_every_steps=100)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tracer = tp.get_tracer("my.loop")
    for _ in range(10):
        with tracer.start_as_current_span("iteration"):
            model(torch.ones(2, 4)).sum().backward()
            dist.all_reduce(torch.ones(3))
            opt.step()
            opt.zero_grad()
            dist.all_reduce(torch.ones(5))  # after the optimizer step
    otel_torchdist.uninstrument()
    finished = spans.get_finished_spans()
    iterations = {s.context.span_id for s in finished if _name(s) == "iteration"}
    for size in (12, 20):
        mine = [s for s in finished if _name(s) == "all_reduce" and s.attributes[n.COLL_MESSAGE_SIZE] == size]
        assert len(mine) == 10 and all(s.parent.span_id in iterations for s in mine), size
