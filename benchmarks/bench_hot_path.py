"""Hot-path and whole-pipeline cost per collective, ``fake`` backend (no transport to hide the cost).

    python benchmarks/bench_hot_path.py [--calls 20000] [--repeats 7] [--chunk 2000]

Plain and instrumented ``dist.all_reduce`` loops run interleaved in one process, ``--repeats`` rounds of
``--calls`` calls each; the table gives median, min and max microseconds per call over rounds.

The background thread normally drains the record queue every 200 ms. Here the loop pauses after every
``--chunk`` calls (about what 200 ms holds at 10 000 collectives/s) and lets a drain run on another
thread, timed on its own: so the training-thread cost is measured at a realistic queue depth, without the
drain's CPU time (or its GIL holding, which a fake collective rate of 300 000/s would turn into the
dominant cost) mixed in. That pause drains and exports everything queued (metrics, span building,
encoding, writing OTLP/JSON lines to the run folder): its time is the deferred cost per collective.
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


def _loop(calls: int, chunk: int, t: torch.Tensor, between=None) -> tuple[float, float]:
    """Microseconds per call on the calling thread, and per call spent in ``between`` (untimed work)."""
    all_reduce = dist.all_reduce
    timed = other = 0
    done = 0
    while done < calls:
        n = min(chunk, calls - done)
        start = time.perf_counter_ns()
        for _ in range(n):
            all_reduce(t)
        timed += time.perf_counter_ns() - start
        done += n
        if between is not None:
            start = time.perf_counter_ns()
            between()
            other += time.perf_counter_ns() - start
    return timed / calls / 1e3, other / calls / 1e3


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
    args = parser.parse_args(argv)

    import otel_torchdist
    from otel_torchdist import runtime
    from otel_torchdist.capture import record

    torch.set_num_threads(1)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    t = torch.ones(1024)
    folder = tempfile.mkdtemp(prefix="otel-torchdist-bench-")
    plain: list[float] = []
    hot: dict[str, list[float]] = {"always_on": [], "always_off": []}
    deferred: dict[str, list[float]] = {"always_on": [], "always_off": []}
    _loop(2000, 2000, t)  # warm-up
    for _ in range(args.repeats):
        for sampler in ("always_on", "always_off"):
            plain.append(_loop(args.calls, args.chunk, t, lambda: None)[0])
            otel_torchdist.instrument(
                run_dir=folder,
                run_id=f"bench-{sampler}",
                traces_sampler=sampler,
                metrics_exporter=("file",),
                traces_exporter="file",
                drain_interval=3600.0,  # hold the background thread back while the loop is timed
                span_schedule_delay=3600.0,
                span_queue_size=args.calls,
                max_queued_records=args.calls,
                summary="none",
            )
            pipeline = runtime.current().pipeline
            on_thread, drained = _loop(args.calls, args.chunk, t, lambda: _on_other_thread(lambda: pipeline.flush(600)))
            hot[sampler].append(on_thread)
            start = time.perf_counter_ns()
            runtime.current().flush(600)
            exported = (time.perf_counter_ns() - start) / args.calls / 1e3
            deferred[sampler].append(drained + exported)
            otel_torchdist.uninstrument()
    dist.destroy_process_group()

    def stats(values: list[float]) -> str:
        return f"{statistics.median(values):8.2f} {min(values):8.2f} {max(values):8.2f}"

    print(f"# fake backend, 1024-element all_reduce, {args.calls} calls x {args.repeats} rounds, drained every {args.chunk}")
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, Python {platform.python_version()}, torch {torch.__version__}")
    print(f"{'variant':<52} {'median':>8} {'min':>8} {'max':>8}   (us per collective)")
    print(f"{'plain dist.all_reduce':<52} {stats(plain)}")
    print(f"{'instrumented, hot path (training thread)':<52} {stats(hot['always_on'] + hot['always_off'])}")
    on, off = statistics.median(hot["always_on"]), statistics.median(hot["always_off"])
    print(f"{'  median in rounds traced 100% / not traced':<52} {on:8.2f} {off:8.2f}")
    pairs = list(zip(plain, [x for pair in zip(hot["always_on"], hot["always_off"]) for x in pair]))
    added = [h - p for p, h in pairs]
    print(f"{'added on the training thread':<52} {stats(added)}")
    print(f"{'deferred: metrics + span + OTLP/JSON file, 100% traced':<52} {stats(deferred['always_on'])}")
    print(f"{'deferred: metrics only (sampler always_off)':<52} {stats(deferred['always_off'])}")
    med_added = statistics.median(added)
    print(f"{'whole CPU cost, 100% traced (median sum)':<52} {med_added + statistics.median(deferred['always_on']):8.2f}")
    print(f"{'whole CPU cost, not traced (median sum)':<52} {med_added + statistics.median(deferred['always_off']):8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
