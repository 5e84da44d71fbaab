"""A run as a Chrome / Perfetto trace (Trace Event Format JSON), written as it is read.

One process track per rank (``pid`` = rank, named ``rank R``). On its ``training thread`` (``tid`` 0) the
slices that nest, as the training thread lived them: the rank's steps (``train.rank_step``), their phases
(``train.forward``, ``train.backward``), optimizer steps and blocking collectives. Async collectives (DDP's bucket all-reduces,
in flight while backward computes) and the spans that may straddle those (sharding, ``ddp.init``,
checkpoints, ``collective.hang``) are async slices of the same process, which Perfetto stacks in rows of
their own under it. Timestamps are whole microseconds since the run's start (its earliest span; ``otherData``
holds that instant as ``run_start_unix_ns``): each end and start is floored to the microsecond it falls in,
so slices that touch or nest in the spans still touch or nest (float epoch microseconds cannot: they are
0.25 us coarse). A collective's exact duration is in its ``duration_ms`` argument. The spans' own clock: on
one host the ranks line up; across hosts they are as good as the hosts' clock sync.

Open the file at https://ui.perfetto.dev (or chrome://tracing).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from .. import names as n
from .loader import discover, gc_paused, iter_records
from .records import Collective, Hang, Phase, Problem, RankResource, RankStep, Span

TRAINING_TID = 0
_NESTING_SPANS = {n.SPAN_OPTIMIZER_STEP}


@dataclass(kw_only=True)
class PerfettoResult:
    path: str
    events: int
    ranks: list[int]
    slices: int
    problems: list[Problem] = field(default_factory=list)


class _Clock:
    """Whole microseconds since ``origin`` (ns); a slice's duration is taken between floored ends."""

    def __init__(self, origin: int) -> None:
        self.origin = origin

    def ts(self, ns: int) -> int:
        return (ns - self.origin) // 1000

    def dur(self, start: int, end: int) -> int:
        return self.ts(end) - self.ts(start)


def _args(c: Collective) -> dict:
    out = {
        "group": c.group,
        "seq": c.seq,
        "message_size": c.message_size,
        "duration_ms": round(c.duration_s * 1e3, 6),
        "phase": c.phase,
        "module": c.module,
        "framework": c.framework,
        "end_source": c.end_source,
    }
    if c.error:
        out["error"] = c.error
    return {k: v for k, v in out.items() if v is not None}


def events_of(rec, clock: _Clock) -> list[dict]:
    """Trace events of one record (none for records that are not spans)."""
    if isinstance(rec, RankStep):
        return [
            {
                "ph": "X", "name": f"step {rec.step}", "cat": "step", "pid": rec.rank, "tid": TRAINING_TID,
                "ts": clock.ts(rec.start_ns), "dur": clock.dur(rec.start_ns, rec.end_ns),
                "args": {k: v for k, v in (("compute_ms", rec.compute_s and rec.compute_s * 1e3),
                                           ("wait_ms", rec.wait_s and rec.wait_s * 1e3), ("trace_id", rec.trace_id)) if v is not None},
            }
        ]
    if isinstance(rec, Phase):
        return [
            {"ph": "X", "name": rec.phase, "cat": "phase", "pid": rec.rank, "tid": TRAINING_TID,
             "ts": clock.ts(rec.start_ns), "dur": clock.dur(rec.start_ns, rec.end_ns)}
        ]
    if isinstance(rec, Collective):
        if not rec.is_async:
            return [
                {"ph": "X", "name": rec.op, "cat": "collective", "pid": rec.rank, "tid": TRAINING_TID,
                 "ts": clock.ts(rec.start_ns), "dur": clock.dur(rec.start_ns, rec.end_ns), "args": _args(rec)}
            ]
        return _async(clock, rec.rank, rec.op, "async collective", rec.span_id, rec.start_ns, rec.end_ns, _args(rec))
    if isinstance(rec, Hang):
        return _async(clock, rec.rank, f"hang: {rec.op}", "hang", f"hang-{rec.rank}-{rec.start_ns}", rec.start_ns, rec.end_ns,
                      {"group": rec.group, "seq": rec.seq, "waited_s": rec.waited_s})
    if isinstance(rec, Span):
        if rec.name == n.SPAN_STEP:
            return []  # rank 0's rank step shows the same interval
        args = {k.removeprefix("torchdist."): v for k, v in rec.attributes.items() if isinstance(v, (int, float, str, bool))}
        if rec.name in _NESTING_SPANS:
            return [
                {"ph": "X", "name": rec.name, "cat": "training", "pid": rec.rank, "tid": TRAINING_TID,
                 "ts": clock.ts(rec.start_ns), "dur": clock.dur(rec.start_ns, rec.end_ns), "args": args}
            ]
        return _async(clock, rec.rank, rec.name, "training", rec.span_id, rec.start_ns, rec.end_ns, args)
    return []


def _async(clock: _Clock, pid: int, name: str, cat: str, ident: str, start: int, end: int, args: dict) -> list[dict]:
    return [
        {"ph": "b", "name": name, "cat": cat, "id": ident, "pid": pid, "tid": TRAINING_TID, "ts": clock.ts(start), "args": args},
        {"ph": "e", "name": name, "cat": cat, "id": ident, "pid": pid, "tid": TRAINING_TID, "ts": clock.ts(end)},
    ]


def _run_start(source) -> int | None:
    """The earliest span start of the run (a first pass: the file is written as it is read)."""
    earliest = None
    with gc_paused():
        for rec in iter_records(source, [], metrics=False):
            start = getattr(rec, "start_ns", None)
            if start is not None and (earliest is None or start < earliest):
                earliest = start
    return earliest


def export(path: str, out_path: str) -> PerfettoResult:
    """Write the trace of the run at ``path`` to ``out_path``; raises ``loader.RunNotFound`` if there is none."""
    source = discover(path)
    problems: list[Problem] = []
    ranks: set[int] = set()
    hosts: dict[int, str] = {}
    count = slices = 0
    origin = _run_start(source) or 0
    clock = _Clock(origin)
    with open(out_path, "w") as out, gc_paused():
        other = json.dumps({"producer": "otel-torchdist", "run_start_unix_ns": origin})
        out.write('{"displayTimeUnit": "ms", "otherData": %s, "traceEvents": [\n' % other)
        first = True
        for rec in iter_records(source, problems, metrics=False):
            if isinstance(rec, RankResource):
                if rec.host:
                    hosts.setdefault(rec.rank, rec.host)
                continue
            events = events_of(rec, clock)
            if not events:
                continue
            ranks.add(events[0]["pid"])
            slices += 1
            for ev in events:
                out.write(("" if first else ",\n") + json.dumps(ev, separators=(",", ":")))
                first = False
                count += 1
        for rank in sorted(ranks):
            label = f"rank {rank}" + (f" ({hosts[rank]})" if rank in hosts else "")
            for ev in (
                {"ph": "M", "name": "process_name", "pid": rank, "args": {"name": label}},
                {"ph": "M", "name": "process_sort_index", "pid": rank, "args": {"sort_index": rank}},
                {"ph": "M", "name": "thread_name", "pid": rank, "tid": TRAINING_TID, "args": {"name": "training thread"}},
            ):
                out.write(("" if first else ",\n") + json.dumps(ev, separators=(",", ":")))
                first = False
                count += 1
        out.write("\n]}\n")
    return PerfettoResult(path=out_path, events=count, ranks=sorted(ranks), slices=slices, problems=problems)
