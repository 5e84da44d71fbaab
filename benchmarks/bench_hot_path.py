"""Hot-path and whole-pipeline cost per collective, ``fake`` backend (no transport to hide the cost).

    python benchmarks/bench_hot_path.py [--calls 20000] [--repeats 7] [--chunk 2000] [--endpoint URL [--grpc]]

With the native part built (``otel-torchdist build-native``) the c10d wrapper's common case runs in C++;
the last variant turns it off (``native="off"``), for the Python wrapper's cost.

Plain and instrumented ``dist.all_reduce`` loops run interleaved in one process, ``--repeats`` rounds of
``--calls`` calls each; the table gives median, min and max microseconds per call over rounds.

The background thread normally drains the record queue every 200 ms. Here the loop pauses after every
``--chunk`` calls (about what 200 ms holds at 10 000 collectives/s) and lets a drain run on another
thread, timed on its own: so the training-thread cost is measured at a realistic queue depth, without the
drain's CPU time (or its GIL holding, which a fake collective rate of 300 000/s would turn into the
dominant cost) mixed in. That pause does what the background threads do in 200 ms: drains the records
(metrics, span building and encoding) and sends the queued spans once a batch (512) is full. The round
ends with a flush of everything left (spans, a metric export): the pauses' time and the flush's is the
deferred cost per collective. The default-sampling rounds first run the steps that sampling traces in
full (``trace_first_steps``), untimed, so that their figure is a long training's: one step in
``trace_every_steps`` traced. Metrics are thus exported once in 20 000 collectives, every 2 s at 10 000
collectives/s (the default interval is 60 s); until 2026-11-25 every pause exported them, ten times as
often, which over OTLP/HTTP was 40 % of the default sampling's deferred cost.

``--endpoint http://127.0.0.1:4318``: spans and metrics go over OTLP/HTTP protobuf to that receiver (a
collector such as rotel, started apart) instead of the run folder. The deferred cost is then this
process's CPU time during the pause (its threads'), not the pause's wall time, which would include the
receiver's own work on the same cores. With ``--grpc`` as well (``--endpoint http://127.0.0.1:4317``), over
OTLP/gRPC.

``--sdk`` (with ``--endpoint``): through an application's SDK providers instead of the library's own
exporters, as a program that set up OpenTelemetry itself has them: a TracerProvider with a
BatchSpanProcessor and the SDK's OTLP span exporter, a MeterProvider with a PeriodicExportingMetricReader and
the SDK's OTLP metric exporter, passed to ``instrument()`` (the "metrics only" variant's provider samples
nothing: ALWAYS_OFF). The SDK's batch processor exports on its own thread while the loop runs, so the whole
CPU cost is also given as this process's CPU time over the instrumented loop, its pauses and the final flush
(the providers' own flush included; every thread, the library's idle threads' wake-ups too) less the plain
loop's, per collective.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore


def _loop(
    calls: int,
    chunk: int,
    t: torch.Tensor,
    between=None,
    step_every: int = 0,
    clock=time.perf_counter_ns,
    chunks: list[float] | None = None,
) -> tuple[float, float]:
    """Microseconds per call on the calling thread, and per call spent in ``between`` (untimed work, by
    ``clock``). ``step_every``: mark a training step every that many calls (otel_torchdist.step_end /
    step_begin, which cost nothing uninstrumented), so the default step sampling applies. ``chunks``: gets
    each chunk's microseconds per call."""
    import otel_torchdist

    all_reduce = dist.all_reduce
    step_end, step_begin = otel_torchdist.step_end, otel_torchdist.step_begin
    timed = other = 0
    done = 0
    while done < calls:
        n = min(chunk, calls - done)
        start = time.perf_counter_ns()
        if step_every:
            for i in range(n):
                all_reduce(t)
                if i % step_every == 0:
                    step_end()
                    step_begin()
        else:
            for _ in range(n):
                all_reduce(t)
        elapsed = time.perf_counter_ns() - start
        timed += elapsed
        if chunks is not None:
            chunks.append(elapsed / n / 1e3)
        done += n
        if between is not None:
            start = clock()
            between()
            other += clock() - start
    return timed / calls / 1e3, other / calls / 1e3


STEP = 20  # collectives per training step in the default-sampling variant


def _background(pipeline) -> None:
    """What the background threads do in the 200 ms a chunk stands for: drain the records, and send the
    queued spans once a batch is full (the export thread's rule; its 5 s schedule and the metric export,
    every 60 s by default, are left to the round's end, still one in 20 000 collectives)."""
    pipeline.drain()
    if pipeline.outbox.queued_spans() >= pipeline.cfg.span_batch_size:
        pipeline.outbox.export_spans(time.monotonic() + 600)


def _on_other_thread(fn) -> None:
    import threading

    worker = threading.Thread(target=fn)
    worker.start()
    worker.join()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000, help="calls per round (default 20000)")
    parser.add_argument("--repeats", type=int, default=7, help="rounds (default 7)")
    parser.add_argument("--chunk", type=int, default=2000, help="calls between drains (default 2000)")
    parser.add_argument("--endpoint", help="export over OTLP/HTTP protobuf to this receiver instead of the run folder")
    parser.add_argument("--grpc", action="store_true", help="with --endpoint: over OTLP/gRPC instead of HTTP")
    parser.add_argument("--sdk", action="store_true", help="with --endpoint: through SDK providers with the SDK's OTLP exporters")
    parser.add_argument(
        "--sdk-tracer-only", action="store_true",
        help="with --sdk: the TracerProvider only; metrics through the library's own OTLP exporter (global_meter_provider=False)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.sdk and not args.endpoint:
        parser.error("--sdk needs --endpoint (the receiver the SDK's exporters send to)")
    clock = time.process_time_ns if args.endpoint else time.perf_counter_ns
    if args.endpoint:
        protocol = "grpc" if args.grpc else "http/protobuf"
        export = dict(endpoint=args.endpoint, protocol=protocol, metrics_exporter=("otlp",), traces_exporter="otlp")
        where = f"OTLP/{'gRPC' if args.grpc else 'HTTP protobuf'} to {args.endpoint} (this process's CPU time)"
        if args.sdk:
            where = "the application's SDK providers (BatchSpanProcessor, PeriodicExportingMetricReader), " + where
            if args.sdk_tracer_only:
                where = "spans through the application's SDK TracerProvider (BatchSpanProcessor), metrics the library's own, " + where
    else:
        export = dict(metrics_exporter=("file",), traces_exporter="file")
        where = "OTLP/JSON file"

    import otel_torchdist
    from otel_torchdist import runtime

    torch.set_num_threads(1)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    t = torch.ones(1024)
    folder = tempfile.mkdtemp(prefix="otel-torchdist-bench-")
    variants = {
        # name: (options, steps marked every N calls)
        "always_on": ({"traces_sampler": "always_on", "max_spans_per_step": 0}, 0),
        "default": ({}, STEP),
        "always_off": ({"traces_sampler": "always_off"}, 0),
        "python": ({"native": "off"}, STEP),  # the c10d wrapper's Python body for every call
    }
    plain: dict[str, list[float]] = {v: [] for v in variants}
    hot: dict[str, list[float]] = {v: [] for v in variants}
    deferred: dict[str, list[float]] = {v: [] for v in variants}
    plain_chunks: dict[str, list[float]] = {v: [] for v in variants}
    hot_chunks: dict[str, list[float]] = {v: [] for v in variants}
    cpu_whole: dict[str, list[float]] = {v: [] for v in variants}  # process CPU, instrumented round less plain
    _loop(2000, 2000, t)  # warm-up
    for _ in range(args.repeats):
        for variant, (options, step_every) in variants.items():
            cpu0 = time.process_time_ns()
            plain[variant].append(_loop(args.calls, args.chunk, t, lambda: None, step_every, chunks=plain_chunks[variant])[0])
            cpu_plain = time.process_time_ns() - cpu0
            providers = _sdk_providers(args, variant == "always_off") if args.sdk else {}
            otel_torchdist.instrument(
                run_dir=folder,
                run_id=f"bench-{variant}",
                **export,
                drain_interval=3600.0,  # hold the background thread back while the loop is timed
                span_schedule_delay=3600.0,
                span_queue_size=args.calls,
                max_queued_records=args.calls,
                summary="none",
                system_metrics=False,
                straggler_exchange_steps=0,
                slow_step_factor=0,  # the benchmark's own pauses between chunks are not slow steps
                **providers,
                **options,
            )
            pipeline = runtime.current().pipeline
            pause = lambda: _on_other_thread(lambda: _background(pipeline))  # noqa: E731
            if step_every:
                # Past the first steps the default sampling traces in full, untimed: a training of thousands
                # of steps pays for them once, where a round of 1 000 steps would count them as 1 % more of
                # its collectives traced (through an SDK provider, 3-4 us a collective more).
                _loop(step_every * pipeline.cfg.trace_first_steps, args.chunk, t, step_every=step_every)
                runtime.current().flush(600)
            cpu0 = time.process_time_ns()
            on_thread, drained = _loop(args.calls, args.chunk, t, pause, step_every, clock, hot_chunks[variant])
            hot[variant].append(on_thread)
            start = clock()
            runtime.current().flush(600)
            exported = (clock() - start) / args.calls / 1e3
            deferred[variant].append(drained + exported)
            cpu_whole[variant].append((time.process_time_ns() - cpu0 - cpu_plain) / args.calls / 1e3)
            otel_torchdist.uninstrument()
            for provider in providers.values():
                provider.shutdown()
    dist.destroy_process_group()

    def stats(values: list[float]) -> str:
        return f"{statistics.median(values):8.2f} {min(values):8.2f} {max(values):8.2f}"

    print(f"# fake backend, 1024-element all_reduce, {args.calls} calls x {args.repeats} rounds, drained every {args.chunk}")
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, Python {platform.python_version()}, torch {torch.__version__}")
    print(f"# export: {where}")
    print(f"{'variant':<52} {'median':>8} {'min':>8} {'max':>8}   (us per collective)")
    labels = {
        "always_on": "100% traced",
        "default": f"default sampling, a step every {STEP} calls",
        "always_off": "metrics only (sampler always_off)",
        "python": "default sampling, without the native part (native=off)",
    }
    whole = {}
    for variant, label in labels.items():
        added = [h - p for p, h in zip(plain[variant], hot[variant])]
        print(f"{label}:")
        print(f"{'  plain dist.all_reduce':<52} {stats(plain[variant])}")
        print(f"{'  instrumented, training thread':<52} {stats(hot[variant])}")
        print(f"{'  added on the training thread':<52} {stats(added)}")
        # paired within rounds: this machine's speed drifts between rounds more than the added cost does
        print(f"{'  added, in plain calls of the same round':<52} {stats([a / p for a, p in zip(added, plain[variant])])}")
        print(f"{'  deferred: metrics, spans, export':<52} {stats(deferred[variant])}")
        print(f"{'  deferred, in plain calls of the same round':<52} {stats([d / p for d, p in zip(deferred[variant], plain[variant])])}")
        whole[label] = (
            statistics.median(added) + statistics.median(deferred[variant]),
            statistics.median([(a + d) / p for a, d, p in zip(added, deferred[variant], plain[variant])]),
        )
    print("whole CPU cost per collective (median added + median deferred; median of added + deferred in plain calls of the same round):")
    for label, (value, calls) in whole.items():
        print(f"  {label:<56} {value:8.2f} us {calls:6.2f} plain calls")
    print("whole CPU cost per collective as this process's CPU time, instrumented loop and flush less plain loop (every thread):")
    for variant, label in labels.items():
        print(f"  {label:<56} {statistics.median(cpu_whole[variant]):8.2f} us")
    # A shared host's slow spells only ever add time: the fastest chunks show its undisturbed speed (timeit's
    # best-of rule), which the medians above cannot when most rounds fall in a slow spell.
    print(f"the training thread in the fastest tenth of {args.chunk}-call chunks (10th percentile; the host's undisturbed speed):")
    print(f"{'':<56} {'plain':>7} {'instr.':>7} {'added':>7}   (us per collective)")
    for variant, label in labels.items():
        fast_plain, fast_hot = _tenth(plain_chunks[variant]), _tenth(hot_chunks[variant])
        print(f"  {label:<54} {fast_plain:7.2f} {fast_hot:7.2f} {fast_hot - fast_plain:7.2f}")
    return 0


def _sdk_providers(args, sample_nothing: bool) -> dict:
    """An application's own SDK set-up: what --sdk passes to instrument()."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    if args.grpc:
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        spans, metrics = OTLPSpanExporter(endpoint=args.endpoint, insecure=True), OTLPMetricExporter(endpoint=args.endpoint, insecure=True)
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        spans = OTLPSpanExporter(endpoint=args.endpoint.rstrip("/") + "/v1/traces")
        metrics = OTLPMetricExporter(endpoint=args.endpoint.rstrip("/") + "/v1/metrics")
    tracer_provider = TracerProvider(sampler=ALWAYS_OFF if sample_nothing else None, shutdown_on_exit=False)
    # A queue that holds a round's spans: the benchmark measures cost, not the processor's drops.
    tracer_provider.add_span_processor(BatchSpanProcessor(spans, max_queue_size=args.calls + 4096))
    if args.sdk_tracer_only:
        return {"tracer_provider": tracer_provider}
    reader = PeriodicExportingMetricReader(metrics, export_interval_millis=60_000)
    return {"tracer_provider": tracer_provider, "meter_provider": MeterProvider([reader], shutdown_on_exit=False)}


def _tenth(values: list[float]) -> float:
    return sorted(values)[len(values) // 10]


if __name__ == "__main__":
    sys.exit(main())
