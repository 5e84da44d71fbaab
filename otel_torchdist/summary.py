"""The end-of-run summary a rank prints and writes to its run folder."""

from __future__ import annotations

from typing import Any

from .metrics import Series


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def rows(snapshot: dict[tuple[str, str], Series]) -> list[dict[str, Any]]:
    out = []
    for (op, group), s in sorted(snapshot.items(), key=lambda kv: -kv[1].dur_sum):
        out.append(
            {
                "op": op,
                "group": group,
                "calls": s.count,
                "errors": s.errors,
                "bytes": s.bytes,
                "mean_message_size": s.bytes / s.count if s.count else 0,
                "total_s": s.dur_sum,
                "mean_s": s.dur_sum / s.count if s.count else 0.0,
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
            f"{'algbw GB/s':>11} {'busbw GB/s':>11}"
        )
        for r in table:
            alg = f"{r['algbw_gbps']:.3f}" if r["algbw_gbps"] is not None else "-"
            bus = f"{r['busbw_gbps']:.3f}" if r["busbw_gbps"] is not None else "-"
            calls = f"{r['calls']}" + (f" ({r['errors']} err)" if r["errors"] else "")
            lines.append(
                f"  {r['op']:<28} {r['group']:<14} {calls:>7} {human_bytes(r['mean_message_size']):>10} "
                f"{r['total_s'] * 1e3:>10.2f} {r['mean_s'] * 1e3:>9.3f} {alg:>11} {bus:>11}"
            )
    lines.extend("  " + f for f in footer)
    return "\n".join(lines)


def steps(framework: Any) -> dict[str, Any]:
    """This rank's step totals and straggler verdict, from the framework metrics."""
    from . import names as n

    count = framework.get(n.STEPS_METRIC, ()) or 0
    out: dict[str, Any] = {"steps": int(count)}
    if count:
        compute = framework.get(n.STEP_COMPUTE_TIME, ()) or 0.0
        wait = framework.get(n.STEP_COLLECTIVE_WAIT_TIME, ()) or 0.0
        out.update(
            mean_step_s=(compute + wait) / count,
            mean_compute_s=compute / count,
            mean_collective_wait_s=wait / count,
        )
    slowest = framework.get(n.STRAGGLER_SLOWEST, ())
    if slowest is not None and slowest >= 0:
        out["slowest_rank"] = int(slowest)
        out["straggler_score"] = framework.get(n.STRAGGLER_SCORE, ())
    return out


def step_lines(stats: dict[str, Any]) -> list[str]:
    if not stats.get("steps"):
        return []
    line = (
        f"steps: {stats['steps']}, {stats['mean_step_s'] * 1e3:.1f} ms each on average: "
        f"{stats['mean_compute_s'] * 1e3:.1f} ms compute, {stats['mean_collective_wait_s'] * 1e3:.1f} ms in collectives"
    )
    if "slowest_rank" in stats:
        line += f"; slowest rank at the last exchange: {stats['slowest_rank']}"
    return [line]
