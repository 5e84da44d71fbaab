"""Hangs: each rank's last started and completed sequence numbers per group, and the spans of collectives that never ended."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ... import names as n
from ..records import Hang
from ..report import FailureRow, HangGroup, HangRank, HangReport, HangSpanRow, RunInfo
from ..stats import fmt_ranks
from .common import DEFAULT_GROUP, short_error

if TYPE_CHECKING:
    from . import Analyzer


def build(an: Analyzer, run: RunInfo) -> HangReport:
    started: dict[str, dict[int, int]] = {}
    completed: dict[str, dict[int, int]] = {}
    age: dict[str, dict[int, float]] = {}
    from_metrics: set[int] = set()
    for rank, snap in an.last_seq_snapshot.items():
        for p in snap.metrics.get(n.GROUP_SEQ_STARTED.name, ()):
            started.setdefault(str(p.attributes.get(n.M_GROUP)), {})[rank] = int(p.value)  # type: ignore[arg-type]
            from_metrics.add(rank)
        for p in snap.metrics.get(n.GROUP_SEQ_COMPLETED.name, ()):
            completed.setdefault(str(p.attributes.get(n.M_GROUP)), {})[rank] = int(p.value)  # type: ignore[arg-type]
        for p in snap.metrics.get(n.COLLECTIVE_INFLIGHT_AGE.name, ()):
            age.setdefault(str(p.attributes.get(n.M_GROUP)), {})[rank] = float(p.value)  # type: ignore[arg-type]
    from_spans: set[int] = set()
    for (rank, group), seq in an.span_seq.items():
        if rank in from_metrics:
            # a rank's spans that went further than its last metric export: that export is stale (a rank
            # killed between exports), and the spans are the better lower bound
            for table in (started, completed):
                if seq > table.get(group, {}).get(rank, seq):
                    table[group][rank] = seq
            continue
        base = started.setdefault(group, {})
        base[rank] = max(base.get(rank, 0), seq)
        comp = completed.setdefault(group, {})
        comp[rank] = max(comp.get(rank, 0), seq)
        from_spans.add(rank)
    for h in an.hang_spans:  # a hang span proves the rank started that collective
        if h.seq is not None and h.rank not in from_metrics:
            base = started.setdefault(h.group, {})
            base[h.rank] = max(base.get(h.rank, 0), h.seq)
    ws = run.world_size
    groups = []
    verdicts = []
    for label in sorted(started):
        # ranks reporting this label may belong to different groups of the same description (one per mesh
        # slice): partition them by membership where spans told it
        parts: dict[tuple[int, ...] | None, list[int]] = {}
        known = {_members(an, r, label) for r in started[label]} - {None}
        for rank in sorted(started[label]):
            members = _members(an, rank, label) or next((k for k in known if k and rank in k), None)
            if members is None and label == DEFAULT_GROUP and ws:
                members = tuple(range(ws))
            parts.setdefault(members, []).append(rank)
        for members, reporting in parts.items():
            if members is None:
                members = tuple(reporting)  # who else belongs is unknown without spans
            groups.append(_hang_group(an, label, members, started[label], completed.get(label, {}), age.get(label, {})))
            if groups[-1].verdict:
                verdicts.append(groups[-1].verdict)
    hangs = [
        HangSpanRow(rank=h.rank, op=h.op, group=h.group, seq=h.seq, waited_s=h.waited_s,
                    resolved=_resolved(h, completed.get(h.group, {})))
        for h in an.hang_spans
    ]
    failures = [
        FailureRow(rank=c.rank, op=c.op, group=c.group, seq=c.seq, duration_s=c.duration_s, error=c.error or "")
        for c in an.failures
    ]
    if verdicts:
        verdict = "; ".join(verdicts)
    elif hangs or failures:
        verdict = (
            f"no hang left: {len(hangs)} collective.hang report(s) and {an.failures_total} failed collective(s), "
            "but every group's ranks reached the same sequence numbers: the ranks all arrived, the collective "
            "itself was slow or failed"
        )
    elif groups:
        verdict = "no hang: on every group the ranks started and completed the same collectives"
        silent = sorted({r for g in groups for r in g.no_data})
        if silent:
            verdict += (
                f" (among the ranks with data: rank{'s' if len(silent) > 1 else ''} {fmt_ranks(silent)} left none, "
                "so whether they arrived is unknown)"
            )
    else:
        verdict = "no sequence numbers (no group metrics, no collective spans): hangs cannot be judged"
    parts_src = []
    if from_metrics:
        parts_src.append(f"last exported group metrics of rank{'s' if len(from_metrics) > 1 else ''} {fmt_ranks(from_metrics)}")
    if from_spans:
        parts_src.append(
            f"highest sequence number in the spans of rank{'s' if len(from_spans) > 1 else ''} {fmt_ranks(from_spans)} "
            "(traced steps only: a lower bound)"
        )
    source = "; ".join(parts_src) or "no sequence numbers"
    source += f"; {len(an.hang_spans)} collective.hang spans"
    return HangReport(
        source=source,
        groups=groups,
        hangs=hangs,
        failures=failures,
        failures_total=an.failures_total,
        verdict=verdict,
    )


def _resolved(h: Hang, completed: dict[int, int]) -> bool:
    """Whether the collective a hang span reported completed later (the rank's completed seq passed it)."""
    return h.seq is not None and h.rank in completed and completed[h.rank] >= h.seq


def _members(an: Analyzer, rank: int, label: str) -> tuple[int, ...] | None:
    m = an.members.get((rank, label))
    return tuple(sorted(m)) if m else None


def _hang_group(an: Analyzer, label: str, members: tuple[int, ...], started: dict[int, int], completed: dict[int, int],
                age: dict[int, float]) -> HangGroup:
    present = [r for r in members if r in started]
    no_data = [r for r in members if r not in started]
    top = max((started[r] for r in present), default=None)
    in_flight = [r for r in present if started[r] > completed.get(r, started[r])]
    # a hang report counts while its collective had not completed (a slow first collective that completed
    # later is not a hang)
    hang_ranks = {
        h.rank for h in an.hang_spans if h.group == label and h.rank in members and not _resolved(h, completed)
    }
    # a failure matters while its rank still has the group in flight: one the run went on after is history
    failed = {c.rank for c in an.failures if c.group == label and c.rank in members and c.rank in in_flight}
    stuck = bool(in_flight or hang_ranks or failed)
    behind = [r for r in present if top is not None and started[r] < top]
    waiting = sorted(set(in_flight) | hang_ranks | failed)
    op = None
    for h in an.hang_spans:
        if h.group == label and h.seq == top:
            op = h.op
            break
    # rows: ranks sharing (started, completed), compressed
    by_values: dict[tuple[int | None, int | None], list[int]] = {}
    for r in present:
        by_values.setdefault((started[r], completed.get(r)), []).append(r)
    ranks = [
        HangRank(ranks=rs, started=s, completed=c, in_flight_s=max((age.get(r, 0.0) for r in rs), default=None) or None)
        for (s, c), rs in sorted(by_values.items(), key=lambda kv: kv[1][0])
    ]
    verdict = None
    late = _late(an, label, members, top) if top is not None and not (stuck and (behind or no_data)) else None
    if late is not None:
        verdict = late
    elif stuck and top is not None:
        never = behind + no_data
        what = f"{op} " if op else "the collective with "
        if never:
            verdict = (
                f"{label}: rank{'s' if len(never) > 1 else ''} {fmt_ranks(never)} never arrived at {what}sequence "
                f"number {top}"
                + (f" (rank{'s' if len(no_data) > 1 else ''} {fmt_ranks(no_data)} left no data)" if no_data else "")
                + (f"; rank{'s' if len(waiting) > 1 else ''} {fmt_ranks(waiting)} waited in it" if waiting else "")
            )
            waits = [h.waited_s for h in an.hang_spans if h.group == label and h.seq == top]
            if waits:
                verdict += f" (reported after {max(waits):.1f} s)"
            errs = [c.error for c in an.failures if c.group == label]
            if errs:
                verdict += f", then it failed: {short_error(errs[0])}"
        else:
            verdict = (
                f"{label}: every rank reached sequence number {top}, and rank{'s' if len(waiting) > 1 else ''} "
                f"{fmt_ranks(waiting)} still waited in it: slow or failed, not missing a rank"
            )
    elif behind and top is not None:
        ahead = [r for r in present if r not in behind]
        verdict = (
            f"{label}: rank{'s' if len(behind) > 1 else ''} {fmt_ranks(behind)} last seen at sequence number "
            f"{max(started[r] for r in behind)} while rank{'s' if len(ahead) > 1 else ''} {fmt_ranks(ahead)} "
            f"reached {top}, none in flight: ended early (killed, or an exception of its own), or its last data "
            "is older than the others'"
        )
    return HangGroup(
        group=label,
        members=list(members),
        ranks=ranks,
        stuck_seq=top if stuck else None,
        op=op,
        never_arrived=(behind + no_data) if stuck else [],
        waiting=waiting if stuck else [],
        no_data=no_data,
        verdict=verdict,
    )


def _late(an: Analyzer, label: str, members: tuple[int, ...], top: int) -> str | None:
    """Every rank started the group's last collective in the end, but a rank's hang report on it named ranks
    that had not when it was made (the hang board's view): they came late, after the others had given up
    (timed out) or past the threshold. None without such a report."""
    at = [h for h in an.hang_spans if h.group == label and h.seq == top and h.missing_ranks and set(h.missing_ranks) & set(members)]
    if not at:
        return None
    late = sorted({r for h in at for r in h.missing_ranks if r in members})  # type: ignore[union-attr]
    reporters = sorted({h.rank for h in at})
    verdict = (
        f"{label}: rank{'s' if len(late) > 1 else ''} {fmt_ranks(late)} had not started {at[0].op} sequence number "
        f"{top} when rank{'s' if len(reporters) > 1 else ''} {fmt_ranks(reporters)} reported waiting in it "
        f"({max(h.waited_s for h in at):.1f} s, the hang board's view), and started it later: late, not missing"
    )
    errs = [c.error for c in an.failures if c.group == label and c.seq in (top, None)]
    if errs:
        verdict += f"; it failed: {short_error(errs[0])}"
    return verdict
