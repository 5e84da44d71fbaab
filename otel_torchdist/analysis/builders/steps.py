"""The per-step table: each traced step's ranks, compute, wait and overlap."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from ... import names as n
from ..report import OverlapRow, StepCell, StepRow, StepsTable
from ..stats import fmt_ranks

if TYPE_CHECKING:
    from . import Analyzer


def build(an: Analyzer) -> StepsTable:
    first = an.first_step()
    rows = []
    for key in an.ordered_steps():
        step, occurrence = key
        ranks = an.rank_steps[key]
        comp = [s.compute_s for s in ranks.values() if s.compute_s is not None]
        wait = [s.wait_s for s in ranks.values() if s.wait_s is not None]
        dur = [s.duration_s for s in ranks.values()]
        mean_c = sum(comp) / len(comp) if comp else None
        mean_w = sum(wait) / len(wait) if wait else None
        mean_d = sum(dur) / len(dur)
        async_s = total_s = 0.0
        count = 0
        for s in ranks.values():
            sc = an.step_coll.get(s.trace_id)
            if sc is not None:
                count, async_s, total_s = sc
                break
        slow = max((s for s in ranks.values() if s.compute_s is not None), key=lambda s: s.compute_s, default=None)
        rows.append(
            StepRow(
                step=step,
                occurrence=occurrence,
                setup=key == first,
                ranks=len(ranks),
                duration_s=max(dur),
                mean_compute_s=mean_c,
                mean_wait_s=mean_w,
                comm_share=(mean_w / mean_d) if (mean_w is not None and mean_d > 0) else None,
                async_share=(async_s / total_s) if total_s > 0 else None,
                # per rank, rounded up: one rank's one collective in a step of two ranks is not 0
                collectives=-(-count // len(ranks)) if count else -(
                    -sum(s.collectives or 0 for s in ranks.values()) // len(ranks)
                ),
                slowest_rank=slow.rank if (slow is not None and len(ranks) > 1) else None,
                start_ns=min(s.start_ns for s in ranks.values()),
                trace_id=next(iter(ranks.values())).trace_id,
                cells=[
                    StepCell(rank=r, duration_s=s.duration_s, compute_s=s.compute_s, wait_s=s.wait_s)
                    for r, s in sorted(ranks.items())
                ]
                if an.noise >= 1
                else [],
            )
        )
    totals = an.totals()
    usable = [r for r in rows if not r.setup]
    step_compute = step_wait = statistic = None
    counted = max((t.steps for t in totals), default=0)
    # a restarted rank's processes each began with a set-up step: its last process's steps alone, whose set-up
    # the traces hold
    steady = _steady_means(an, an.totals(last_process=True), first) if counted > len(rows) else None
    if steady is not None:
        # Sampled runs trace the first steps and every hundredth: their median is mostly warm-up. The
        # metrics count every step; the traced set-up step is taken out of them.
        step_time, step_compute, step_wait, setup_out, over = steady
        statistic = "mean"
        if setup_out:
            step_from = f"mean of the {over} steps after the set-up step (metrics, every step; {len(rows)} traced)"
        else:
            step_from = f"mean of all {over} steps (metrics, every step, the first's set-up included; {len(rows)} traced)"
    elif len(usable) >= 3:
        statistic = "median"
        step_time = statistics.median(r.duration_s for r in usable)
        step_from = f"median of {len(usable)} traced steps" + (f" (step {first[0]}, which holds set-up, left out)" if first is not None else "")
        # The split over the same steps and by the same statistic, so that it reads against the step
        # time: a mean that took in the first step's set-up could exceed the step itself.
        comp = [r.mean_compute_s for r in usable if r.mean_compute_s is not None]
        wait = [r.mean_wait_s for r in usable if r.mean_wait_s is not None]
        step_compute = statistics.median(comp) if comp else None
        step_wait = statistics.median(wait) if wait else None
    elif totals:
        step_time = sum(t.total_s / t.steps for t in totals) / len(totals)
        step_from = f"mean over all {max(t.steps for t in totals)} steps (metrics, set-up in the first included)"
    elif rows:
        step_time = sum(r.duration_s for r in rows) / len(rows)
        step_from = f"mean of {len(rows)} traced steps"
    else:
        step_time, step_from = None, None
    samples = tokens = None
    if totals and all(t.samples for t in totals):
        samples = sum(t.samples for t in totals) / max(t.steps for t in totals)  # type: ignore[misc]
    if totals and all(t.tokens for t in totals):
        tokens = sum(t.tokens for t in totals) / max(t.steps for t in totals)  # type: ignore[misc]
    overlap = []
    for rank in sorted(an.last_snapshot):
        snap = an.last_snapshot[rank]
        comm = {str(p.attributes.get(n.M_MODEL)): float(p.value) for p in snap.metrics.get(n.DDP_BACKWARD_COMM.name, ())}  # type: ignore[arg-type]
        over = {str(p.attributes.get(n.M_MODEL)): float(p.value) for p in snap.metrics.get(n.DDP_BACKWARD_OVERLAP.name, ())}  # type: ignore[arg-type]
        for model, c in sorted(comm.items()):
            o = over.get(model, 0.0)
            overlap.append(OverlapRow(rank=rank, model=model, comm_s=c, overlap_s=o, share=(o / c) if c > 0 else None))
    all_async = sum(sc[1] for sc in an.step_coll.values())
    all_coll = sum(sc[2] for sc in an.step_coll.values())
    if overlap:
        shares = [o.share for o in overlap if o.share is not None]
        mean_share = sum(shares) / len(shares) if shares else 0.0
        overlap_note = (
            f"DDP's own measure (metrics, sampled by DDP): {mean_share * 100:.0f}% of backward communication "
            "overlapped backward compute, on average over the ranks"
        )
    elif all_coll > 0:
        overlap_note = (
            "no overlap measure (only DDP reports one); async collectives are "
            f"{all_async / all_coll * 100:.0f}% of the traced collective time, an upper bound on what overlapped compute"
        )
    else:
        overlap_note = "no overlap measure (only DDP reports one) and no traced collectives"
    if rows:
        step_ranks = sorted({r for ranks in an.rank_steps.values() for r in ranks})
        source = (
            f"{len(rows)} traced step{'s' if len(rows) != 1 else ''} (train.rank_step spans of rank{'s' if len(step_ranks) > 1 else ''} "
            f"{fmt_ranks(step_ranks)})" + ("; totals: metrics, every step" if totals else "; no step metrics")
        )
    elif totals:
        source = "no traced steps; totals: metrics, every step"
    else:
        source = "no step data"
    return StepsTable(
        source=source,
        rows=rows,
        totals=totals,
        step_time_s=step_time,
        step_time_from=step_from,
        step_statistic=statistic,
        step_compute_s=step_compute,
        step_wait_s=step_wait,
        samples_per_step=samples,
        tokens_per_step=tokens,
        overlap=overlap,
        overlap_note=overlap_note,
    )


def _steady_means(an: Analyzer, totals: list, first: tuple | None) -> tuple[float, float, float, bool, int] | None:
    """(step time, compute, wait, set-up left out, steps) from the metrics' totals: per rank the totals less its
    traced set-up step (where the totals hold it: a set-up step explicit steps took over is not a training
    step, and is in none), over the other steps; the slowest rank's step time (ranks wait for each other),
    the split of that rank. None without totals."""
    setup = an.rank_steps.get(first, {}) if first is not None else {}
    best = None
    for t in totals:
        if not t.steps:
            continue
        s = setup.get(t.rank)
        total, compute, wait, steps = t.total_s, t.compute_s, t.wait_s, t.steps
        subtract = s is not None and s.counted and steps > 1
        out = subtract or (s is not None and not s.counted)
        if subtract:
            total -= s.duration_s
            compute -= s.compute_s or 0.0
            wait -= s.wait_s or 0.0
            steps -= 1
        row = (total / steps, max(compute, 0.0) / steps, max(wait, 0.0) / steps, out, steps)
        if best is None or row[0] > best[0]:
            best = row
    return best
