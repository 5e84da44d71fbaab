"""Throughput and memory: a rank issuing collectives fast, for a long time.

    python benchmarks/bench_throughput.py [--rate 20000] [--seconds 20] [--million]

One process, ``fake`` backend (8 ranks' worth of group), 1024-element all_reduces paced at ``--rate`` per
second for ``--seconds``, a training step marked every 200 collectives, exporting to a run folder (OTLP/JSON
lines) with the background threads at their default intervals. Two runs: default step sampling, and every
span traced (``traces_sampler=always_on``, no per-step span cap), the case where spans outrun the exporter.
For each it prints the rate reached, whether the exported call count equals the calls made (metrics must
be exact), spans in the run folder, spans counted as dropped and spans the run folder's file rotation
deleted (``file_max_bytes``; together they must equal the spans traced: never queued without bound,
never lost uncounted), and resident memory at start, middle and end.

``--million``: then 1 000 000 collectives unpaced under default sampling, resident memory every 100 000.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import sys
import tempfile
import time

import psutil
import torch
import torch.distributed as dist

from torch.testing._internal.distributed.fake_pg import FakeStore

from otel_torchdist.names import span_base_name

STEP = 200  # collectives per training step


def _count_spans(folder: str) -> tuple[int, int]:
    """(collective spans, all spans) in the run folder."""
    collectives = total = 0
    for path in glob.glob(os.path.join(folder, "traces.rank*.jsonl")):
        with open(path) as f:
            for line in f:
                doc = json.loads(line)
                for rs in doc["resourceSpans"]:
                    for ss in rs["scopeSpans"]:
                        collectives += sum(1 for s in ss["spans"] if span_base_name(s["name"]) == "all_reduce")  # "all_reduce rank=0"
                        total += len(ss["spans"])
    return collectives, total


def _calls(folder: str) -> int:
    with open(os.path.join(folder, "metrics.rank0.jsonl")) as f:
        last = json.loads(f.readlines()[-1])
    for rm in last["resourceMetrics"]:
        for sm in rm["scopeMetrics"]:
            for m in sm["metrics"]:
                if m["name"] == "torchdist.collective.calls":
                    return sum(
                        int(p["asInt"])
                        for p in m["sum"]["dataPoints"]
                        if {"key": "op", "value": {"stringValue": "all_reduce"}} in p["attributes"]
                    )
    return -1


def paced(rate: int, seconds: float, options: dict, label: str) -> dict:
    import otel_torchdist
    from otel_torchdist import health
    from otel_torchdist import names as n

    health.reset()
    proc = psutil.Process()
    folder = tempfile.mkdtemp(prefix="otel-torchdist-throughput-")
    otel_torchdist.instrument(run_dir=folder, run_id="t", summary="none", system_metrics=False, **options)
    t = torch.ones(1024)
    total = int(rate * seconds)
    rss = [proc.memory_info().rss]
    start = time.perf_counter()
    issued = 0
    while issued < total:
        # Pace in slices of 1/100 s: issue the slice's calls, then sleep to the slice's end.
        target = min(total, issued + rate // 100)
        while issued < target:
            dist.all_reduce(t)
            issued += 1
            if issued % STEP == 0:
                otel_torchdist.step_end()
                otel_torchdist.step_begin()
        ahead = start + issued / rate - time.perf_counter()
        if ahead > 0:
            time.sleep(ahead)
        if issued == total // 2:
            rss.append(proc.memory_info().rss)
    elapsed = time.perf_counter() - start
    rss.append(proc.memory_info().rss)
    otel_torchdist.uninstrument()
    drops = health.drops()
    run = os.path.join(folder, "t")
    collective_spans, all_spans = _count_spans(run)
    return {
        "label": label,
        "rate": issued / elapsed,
        "issued": issued,
        "exported_calls": _calls(run),
        "spans": collective_spans,
        "all_spans": all_spans,
        "dropped_spans": drops.get("span", 0),
        # the run folder's traces file past file_max_bytes: rotated, and the copy it replaces counted here
        "rotated_spans": drops.get(n.DROPPED_FILE_ROTATED, 0),
        "dropped_records": drops.get("record", 0),
        "rss_mb": [r / 2**20 for r in rss],
    }


def million(options: dict) -> list[tuple[int, float]]:
    import otel_torchdist

    proc = psutil.Process()
    folder = tempfile.mkdtemp(prefix="otel-torchdist-million-")
    otel_torchdist.instrument(run_dir=folder, run_id="m", summary="none", system_metrics=False, **options)
    t = torch.ones(1024)
    out = [(0, proc.memory_info().rss / 2**20)]
    for i in range(1, 1_000_001):
        dist.all_reduce(t)
        if i % STEP == 0:
            otel_torchdist.step_end()
            otel_torchdist.step_begin()
        if i % 100_000 == 0:
            out.append((i, proc.memory_info().rss / 2**20))
    otel_torchdist.uninstrument()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=20000, help="collectives per second (default 20000)")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds per run (default 20)")
    parser.add_argument("--million", action="store_true", help="also 1 000 000 collectives, memory every 100 000")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    common = {"straggler_exchange_steps": 0, "slow_step_factor": 0.0}
    runs = [
        paced(args.rate, args.seconds, common, "default sampling"),
        paced(args.rate, args.seconds, {**common, "traces_sampler": "always_on", "max_spans_per_step": 0}, "every span traced"),
    ]
    print(f"# fake backend, 1024-element all_reduce at {args.rate}/s for {args.seconds:.0f} s, a step every {STEP}")
    print(f"# {platform.machine()}, {os.cpu_count()} cpus, Python {platform.python_version()}, torch {torch.__version__}")
    print(
        f"{'run':<20} {'rate/s':>8} {'calls':>9} {'exported':>9} {'spans':>8} {'dropped':>8} {'rotated':>8} "
        f"{'rec.drop':>8}  rss MB start/mid/end"
    )
    for r in runs:
        rss = "/".join(f"{x:.0f}" for x in r["rss_mb"])
        print(
            f"{r['label']:<20} {r['rate']:8.0f} {r['issued']:9d} {r['exported_calls']:9d} {r['spans']:8d} "
            f"{r['dropped_spans']:8d} {r['rotated_spans']:8d} {r['dropped_records']:8d}  {rss}"
        )
    traced = runs[1]
    # Steps: one marked every STEP calls, and the one open at uninstrument(); each a train.step and a
    # train.rank_step span (one rank).
    steps = traced["issued"] // STEP + 1
    made = traced["issued"] + 2 * steps
    accounted = traced["all_spans"] + traced["dropped_spans"] + traced["rotated_spans"]
    print(
        f"every span traced: {traced['issued']} collective spans and {steps} steps' {2 * steps} spans made; "
        f"{traced['all_spans']} spans in the run folder ({traced['spans']} of them collectives), "
        f"{traced['dropped_spans']} counted as dropped, {traced['rotated_spans']} counted as rotated away "
        f"(file_max_bytes); {made - accounted} unaccounted for"
    )
    if args.million:
        points = million(common)
        print("1 000 000 collectives, default sampling: resident MB after N collectives")
        print("  " + "  ".join(f"{i // 1000}k:{mb:.0f}" for i, mb in points))
        print(f"  growth from 200k to 1M: {points[-1][1] - points[2][1]:+.1f} MB")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
