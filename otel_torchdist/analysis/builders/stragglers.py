"""Which rank is slow: arrival lateness at matched collectives, step compute and wait, the library's score."""

from __future__ import annotations

import statistics
from collections import Counter
from typing import TYPE_CHECKING

from ... import names as n
from ...drain.stragglers import scores as straggler_scores
from ..records import RankStep
from ..report import RunInfo, StragglerRow, Stragglers

if TYPE_CHECKING:
    from . import Analyzer


STRAGGLER_THRESHOLD = 0.05  # a score below this share of a step is noise, not a straggler


def build(an: Analyzer, run: RunInfo) -> Stragglers:
    first = an.first_step()
    per_rank: dict[int, list[RankStep]] = {}
    for step, ranks in an.rank_steps.items():
        if step == first:
            continue
        for rank, s in ranks.items():
            per_rank.setdefault(rank, []).append(s)
    totals = {t.rank: t for t in an.totals()}
    ranks = sorted(set(run.ranks))
    rows = []
    for rank in ranks:
        steps = per_rank.get(rank, [])
        k = len(steps)
        mean = (lambda xs: sum(xs) / len(xs) if xs else None)
        median = (lambda xs: statistics.median(xs) if xs else None)
        d = mean([s.duration_s for s in steps])
        c = mean([s.compute_s for s in steps if s.compute_s is not None])
        w = mean([s.wait_s for s in steps if s.wait_s is not None])
        a = an.arrival.get(rank)
        t = totals.get(rank)
        rows.append(
            StragglerRow(
                rank=rank,
                steps=k,
                mean_step_s=d,
                mean_compute_s=c,
                mean_wait_s=w,
                wait_share=(w / d) if (w is not None and d) else None,
                total_compute_s=t.compute_s if t else None,
                total_wait_s=t.wait_s if t else None,
                matched=int(a[0]) if a else 0,
                mean_late_s=a[1] / a[0] if a and a[0] else None,
                max_late_s=a[2] if a else None,
                last_arrivals=int(a[3]) if a else 0,
                score=None,
                median_compute_s=median([s.compute_s for s in steps if s.compute_s is not None]),
                median_step_s=median([s.duration_s for s in steps]),
            )
        )
    # score over traced steps when every rank has some, else over the metrics' totals
    from_traces = len(rows) > 1 and all(r.median_compute_s is not None and r.median_step_s for r in rows)
    if from_traces:
        windows = {r.rank: {"compute_median": r.median_compute_s, "duration_median": r.median_step_s} for r in rows}
        per_rank, _ = straggler_scores(windows)  # type: ignore[arg-type]
        for r in rows:
            r.score = per_rank[r.rank]
    elif len(rows) > 1 and all(r.rank in totals and totals[r.rank].steps for r in rows):
        per_step = {r.rank: totals[r.rank].compute_s / totals[r.rank].steps for r in rows}
        step_mean = sum(totals[r].total_s / totals[r].steps for r in per_step) / len(per_step)
        low = min(per_step.values())
        for r in rows:
            r.score = (per_step[r.rank] - low) / step_mean if step_mean > 0 else None
    exchange = _exchange_slowest(an, )
    slowest, verdict = _straggler_verdict(rows, from_traces, exchange)
    n_steps = len([s for s in an.rank_steps if s != first])
    if from_traces:
        source = (
            f"steps: {n_steps} traced train.rank_step spans per rank"
            + (f" (step {first[0]}, which holds set-up, left out)" if first is not None else "")
            + ("; totals: metrics (every step)" if totals else "; no step metrics")
        )
    elif totals:
        source = "steps: the metrics' totals (every step, the first one's set-up included)"
    else:
        source = "no step data (no train.rank_step spans, no step metrics)"
    source += f"; arrival: {an.matched} collectives matched across ranks by (group, sequence number)"
    return Stragglers(
        source=source,
        rows=rows,
        slowest_rank=slowest,
        verdict=verdict,
        matched=an.matched,
        partial=len(an.pending),
        max_skew_s=an.skew_max if an.matched else None,
        mean_skew_s=an.skew_sum / an.matched if an.matched else None,
        exchange_slowest=exchange,
    )


def _exchange_slowest(an: Analyzer) -> int | None:
    votes = Counter()
    for rank in an.last_snapshot:
        v = an.metric_value(rank, n.STRAGGLER_SLOWEST)
        if v is not None and v >= 0:
            votes[int(v)] += 1
    return votes.most_common(1)[0][0] if votes else None


def _straggler_verdict(rows: list[StragglerRow], from_traces: bool, exchange: int | None) -> tuple[int | None, str]:
    if len(rows) < 2:
        return None, "one rank only: there is no other rank to compare it with"
    scored = [r for r in rows if r.score is not None]
    late = [r for r in rows if r.mean_late_s is not None]
    by_late = max(late, key=lambda r: r.mean_late_s) if late else None  # type: ignore[arg-type,return-value]
    if not scored:
        if by_late is None or not by_late.mean_late_s:
            return None, "no step data and no matched collectives: no straggler can be named"
        best = by_late
        return best.rank, (
            f"rank {best.rank} arrives last: {best.mean_late_s * 1e3:.1f} ms after the first rank on average "
            f"over {best.matched} matched collectives (no step data to score compute)"
        )
    best = max(scored, key=lambda r: r.score)  # type: ignore[arg-type,return-value]
    where = "over the traced steps" if from_traces else "over all steps (metrics)"
    extra = ""
    if exchange is not None and exchange != best.rank:
        extra = f"; the library's last straggler exchange (a window of recent steps) named rank {exchange}"
    if best.score < STRAGGLER_THRESHOLD:  # type: ignore[operator]
        return None, (
            f"no straggler: the ranks' compute per step differs by at most {best.score * 100:.1f}% of a step "
            f"{where}{extra}"
        )
    text = f"rank {best.rank} is the slowest (score {best.score:.2f}"
    if from_traces:
        low = min(r.median_compute_s for r in scored)  # type: ignore[type-var]
        text += f": {(best.median_compute_s - low) * 1e3:.1f} ms more compute per step than the fastest rank, medians"  # type: ignore[operator]
        text += f", {best.score * 100:.0f}% of a median step, {where})"
    else:
        text += f", {best.score * 100:.0f}% of a mean step, {where})"
    if best.matched:
        text += (
            f"; it started last at {best.last_arrivals} of {best.matched} matched collectives, "
            f"{(best.mean_late_s or 0) * 1e3:.1f} ms after the first rank on average"
        )
    step_mean = [r.mean_step_s for r in rows if r.mean_step_s]
    significant = STRAGGLER_THRESHOLD * (sum(step_mean) / len(step_mean)) if step_mean else 0.0
    if (
        by_late is not None
        and by_late.rank != best.rank
        and (by_late.mean_late_s or 0) > max((best.mean_late_s or 0) * 1.5, significant)
    ):
        text += f"; arrival skew points at rank {by_late.rank} ({by_late.mean_late_s * 1e3:.1f} ms late on average)"
    return best.rank, text + extra
