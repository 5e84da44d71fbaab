"""The end-of-run summary a rank prints and writes to its run folder."""

from __future__ import annotations

from typing import Any

from .drain.metrics import Series


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def human_rate(gbps: float | None) -> str:
    """A bandwidth given in GB/s (10^9 bytes/s, as nccl-tests), in the unit that gives it 1 to 3 digits
    before the point: ``1.46 GB/s``, ``14.6 kB/s``; ``-`` for none."""
    if gbps is None:
        return "-"
    value = gbps * 1e9
    for unit in ("B/s", "kB/s", "MB/s", "GB/s"):
        if abs(value) < 999.5 or unit == "GB/s":
            return f"{value:.3g} {unit}" if value >= 1 or value == 0 else f"{value:.2g} {unit}"
        value /= 1000
    return f"{value:.3g} GB/s"


def rows(snapshot: dict[tuple[str, str], Series]) -> list[dict[str, Any]]:
    out = []
    for (op, group), s in sorted(snapshot.items(), key=lambda kv: -kv[1].dur_sum):
        timed = sum(s.buckets)  # the calls that completed: the bytes and the time are theirs
        out.append(
            {
                "op": op,
                "group": group,
                "calls": s.count,
                "errors": s.errors,
                "bytes": s.bytes,
                "mean_message_size": s.bytes / timed if timed else 0,
                "total_s": s.dur_sum,
                "mean_s": s.dur_sum / timed if timed else 0.0,
                # Time-weighted, like rate(bytes)/rate(duration_sum) in PromQL.
                "algbw_gbps": s.bytes / s.dur_sum / 1e9 if s.dur_sum > 0 and s.bytes else None,
                "busbw_gbps": s.bus_bytes / s.dur_sum / 1e9 if s.dur_sum > 0 and s.bus_bytes else None,
            }
        )
    return out


def render(header: str, table: list[dict[str, Any]], footer: list[str]) -> str:
    lines = [header]
    if not table:
        lines.append("  no collectives were recorded")
    else:
        lines.append(
            f"  {'op':<28} {'group':<14} {'calls':>7} {'avg size':>10} {'total ms':>10} {'mean ms':>9} "
            f"{'algbw':>11} {'busbw':>11}"
        )
        for r in table:
            alg, bus = human_rate(r["algbw_gbps"]), human_rate(r["busbw_gbps"])
            calls = f"{r['calls']}" + (f" ({r['errors']} err)" if r["errors"] else "")
            lines.append(
                f"  {r['op']:<28} {r['group']:<14} {calls:>7} {human_bytes(r['mean_message_size']):>10} "
                f"{r['total_s'] * 1e3:>10.2f} {r['mean_s'] * 1e3:>9.3f} {alg:>11} {bus:>11}"
            )
    lines.extend("  " + f for f in footer)
    return "\n".join(lines)


def steps(framework: Any, tracker: Any = None) -> dict[str, Any]:
    """This rank's step figures and straggler verdict, from the framework metrics and the step tracker:
    the set-up step (imports, initialisation, the model's construction, often 50 steps' worth) apart, a
    median for the step time (one slow step does not move it)."""
    from . import names as n

    count = int(framework.get(n.STEPS_METRIC, ()) or 0)
    out: dict[str, Any] = {"steps": count}
    if count:
        compute = framework.get(n.STEP_COMPUTE_TIME, ()) or 0.0
        wait = framework.get(n.STEP_COLLECTIVE_WAIT_TIME, ()) or 0.0
        setup = getattr(tracker, "setup", None)
        steady = count
        if setup is not None and count > 1:
            out.update(setup_step=setup[0], setup_step_s=setup[1])
            compute, wait, steady = compute - setup[2], wait - setup[3], count - 1
        median = tracker._recent.median() if tracker is not None else None
        out.update(
            median_step_s=median if median is not None else (compute + wait) / steady,
            median_of=len(tracker._recent) if median is not None else 0,
            mean_step_s=(compute + wait) / steady,
            mean_compute_s=compute / steady,
            mean_collective_wait_s=wait / steady,
        )
    slowest = framework.get(n.STRAGGLER_SLOWEST, ())
    if slowest is not None and slowest >= 0:
        out["slowest_rank"] = int(slowest)
        out["straggler_score"] = framework.get(n.STRAGGLER_SCORE, ())
    return out


def step_lines(stats: dict[str, Any]) -> list[str]:
    if not stats.get("steps"):
        return []
    line = f"steps: {stats['steps']}"
    if "setup_step_s" in stats:
        line += f" (step {stats['setup_step']}, with set-up, took {_duration(stats['setup_step_s'])})"
    median_of = stats.get("median_of") or 0
    # The split is of the mean step (the totals over the steps), so it is said against the mean: beside the
    # median alone, one slow step made "2.9 ms a step, on average 1.60 s compute".
    line += f"; a step takes {_duration(stats['median_step_s'])} " + (
        f"(median of the last {median_of}); on average {_duration(stats['mean_step_s'])}: " if median_of else "(mean): "
    ) + (
        f"{_duration(stats['mean_compute_s'])} compute and {_duration(stats['mean_collective_wait_s'])} in collectives"
    )  # fmt: skip
    if "slowest_rank" in stats:
        line += f"; slowest rank at the last exchange: {stats['slowest_rank']}"
    return [line]


def _duration(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1e3:.1f} ms"
