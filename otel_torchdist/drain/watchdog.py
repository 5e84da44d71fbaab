"""Hang watchdog: name the collective that has been in flight too long, while the process is alive.

A daemon thread looks every ``threshold / 4`` (between 0.25 and 10 s) at what is in flight:

* blocking calls: each wrapper leaves the record of the call it is inside in ``record.BLOCKING`` (by
  thread) while the call runs;
* async work: the registries completion tracking already keeps (futures, Works awaiting ``wait()``,
  functional collectives awaiting ``wait_tensor``, NCCL records awaiting the completion hook).

A collective older than the threshold is reported once: a ``collective.hang`` span (from its issue to
now, with op, group, sequence number and time waited, and a ``collective.hang`` event), a log line and
``torchdist.collective.hangs``; the export thread is woken so it leaves the process at once. With the
hang board (hang_board.py: every rank's progress in the store), the report also names the ranks of the group
that have not started the collective and what each last started (``torchdist.hang.missing_ranks``, a
``collective.hang.missing_ranks`` event, ``torchdist.collective.hang.missing_rank``). Every rank
also exports, per group, the last sequence number it started and the last it saw complete
(``torchdist.group.last_started_seq`` / ``last_completed_seq``) and the age of the oldest collective in
flight: the rank that never arrived is the one whose started sequence number is behind the others'.
"""

from __future__ import annotations

import logging
import threading
from time import perf_counter_ns
from typing import Any

from .. import bandwidth as bw
from .. import callbacks, health
from .. import names as n
from ..capture import completion, ddp_native, funcol, groups, nccl
from ..capture import record as R
from ..capture import step_context as S
from ..ids import new_span_id, new_trace_id
from ..telemetry import MetricData, NumberPoint, SpanData

_log = logging.getLogger("otel_torchdist")


def default_threshold() -> float:
    """Half the default process group's timeout, at most 300 s (gloo's default is 30 min, NCCL's 10)."""
    try:
        import torch
        from torch.distributed import distributed_c10d as c10d

        pg = c10d._world.default_pg
        device = next(iter(pg._device_types), torch.device("cpu"))
        timeout = pg._get_backend(device).options._timeout
        return max(min(300.0, timeout.total_seconds() / 2), 1.0)
    except Exception:
        return 300.0


def _seq(rec: list, gi: groups.GroupInfo) -> int:
    """The record's sequence number; a blocking call in flight learns its own when it returns: its group's."""
    return rec[R.SEQ] if rec[R.SEQ] is not None else gi.last_started()


def _number(rec: list, gi: groups.GroupInfo, seq: int) -> int | None:
    """The record's collective number on its group (GroupInfo.collective_number); None for a point-to-point
    call, which only its peer takes part in."""
    return None if rec[R.KIND] == bw.SEND_RECV else gi.collective_number(seq)


def _peers(rec: list, gi: groups.GroupInfo) -> list[int]:
    """A point-to-point record's peers (global ranks): its one peer, or a batch's (batch_isend_irecv, which
    pipeline schedules post); none for a receive from any source."""
    peer = rec[R.PEER]
    if peer:
        one = peer[0] if peer[0] is not None else gi.global_rank(peer[1])
        return [] if one is None else [one]
    extra = rec[R.EXTRA] or ()
    for i in range(0, len(extra) - 1, 2):
        if extra[i] == "peers":  # "send:1,recv:1", global ranks (ops.describe_batch)
            return sorted({int(p.rsplit(":", 1)[1]) for p in extra[i + 1].split(",") if p})
    return []


def _place(gi: groups.GroupInfo, oldest: tuple[float, list] | None) -> list:
    """This rank's place on ``gi`` for the hang board (HangBoard.update)."""
    started = gi.last_started()
    where = None
    if oldest is not None:
        age, rec = oldest
        seq = _seq(rec, gi)
        where = [rec[R.OP], seq, round(age, 3), _number(rec, gi, seq)]
    return [started, gi.last_completed, where, gi.collectives_started()]


class Watchdog:
    def __init__(self, rt: Any, threshold: float | None) -> None:
        self.rt = rt
        self.threshold = threshold if threshold is not None else default_threshold()
        self.interval = min(max(self.threshold / 4, 0.25), 10.0)
        self._reported: set[int] = set()
        self._ages: dict[str, float] = {}
        self.board: Any = None  # hang_board.HangBoard, when the job has a TCPStore
        self._missing: dict[int, tuple[str, str, int, tuple[int, ...]]] = {}  # id(rec) -> op, group, seq, ranks
        self._since: dict[int, int] = {}  # id(rec) -> when its hang clock started, where not at its issue
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="otel-torchdist-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check()
            except Exception as exc:
                health.error("watchdog", "the hang watchdog hit an error", exc)

    # --------------------------------------------------------------------------------------- check
    def blocking_in_flight(self) -> list[list]:
        """Records of blocking calls some thread is inside right now (R.BLOCKING)."""
        return [rec for rec in list(R.BLOCKING.values()) if rec[R.T_START]]

    def in_flight(self) -> list[list | tuple]:
        records = self.blocking_in_flight()
        since = {}
        for rec, t in completion.in_flight():
            records.append(rec)
            if t != rec[R.T_START]:
                since[id(rec)] = t
        self._since = since  # records timed from something other than their issue (check)
        records += ddp_native.in_flight()
        records += [entry[1] for entry in list(funcol._pending.values())]  # one copy, atomic under the GIL
        for gi in groups.all_groups():
            with gi.lock:
                records += nccl.pending_records(gi)
        return records

    def check(self) -> None:
        now = perf_counter_ns()
        oldest: dict[str, tuple[float, list]] = {}  # group label -> (age, record) of its oldest in flight
        seen: set[int] = set()
        late = []
        for rec in self.in_flight():
            if id(rec) in seen:
                continue
            seen.add(id(rec))
            gi = groups.BY_ID[rec[R.GROUP]]
            age = (now - self._since.get(id(rec), rec[R.T_START])) / 1e9
            if age >= oldest.get(gi.label, (-1.0,))[0]:
                oldest[gi.label] = (age, rec)
            if age > self.threshold and id(rec) not in self._reported:
                late.append((rec, gi, age))
        self._ages = {label: age for label, (age, _) in oldest.items()}
        if self.board is not None:
            # published before a hang is looked up: the other ranks read this rank's place on every group
            self.board.update({gi.label: _place(gi, oldest.get(gi.label)) for gi in groups.all_groups()})
        for rec, gi, age in late:
            self._reported.add(id(rec))
            self._report(rec, gi, age, now)
        self._missing = {key: value for key, value in self._missing.items() if key in seen}
        if len(self._reported) > 10000:
            self._reported = {r for r in self._reported if r in seen}

    def _report(self, rec: list, gi: groups.GroupInfo, age: float, now: int) -> None:
        seq = _seq(rec, gi)
        message = (
            f"collective {rec[R.OP]} on group {gi.label} (sequence number {seq}) has been in flight for "
            f"{age:.1f} s (threshold {self.threshold:.1f} s); last completed on this group: {gi.last_completed}"
        )
        number = _number(rec, gi, seq)
        missing = None
        peers = _peers(rec, gi) if number is None else []
        if self.board is None:
            pass
        elif number is not None:
            missing = self.board.lookup(gi.label, gi.global_ranks, number, rec[R.OP])
        elif peers:
            # only the peers take part: where they are, not whether they posted the matching calls
            places = self.board.lookup(gi.label, tuple(peers), None, rec[R.OP])
            message += "".join(f"; its peer rank {m.rank}: {m.detail}" for m in places or ())
        if missing:
            message += "; not started by " + "; ".join(f"rank {m.rank} ({m.detail})" for m in missing)
            self._missing[id(rec)] = (rec[R.OP], gi.label, seq, tuple(m.rank for m in missing))
        elif missing is not None:
            message += "; every rank of the group has started it"
        _log.warning("%s", message)
        pipeline = self.rt.pipeline
        pipeline.framework.add(n.COLLECTIVE_HANGS, (rec[R.OP], gi.label), 1)
        step = rec[R.STEPCTX]
        trace = step[S.TRACE] if step is not None else new_trace_id()
        parent = step[S.SPAN] if step is not None else None
        off = pipeline.offset_ns
        attrs = [
            (n.COLL_OP, rec[R.OP]),
            (n.COLL_GROUP_NAME, gi.name),
            (n.COLL_GROUP_DESC, gi.desc),
            (n.COLL_GROUP_LABEL, gi.label),
            (n.COLL_GROUP_SIZE, gi.size),
            (n.COLL_GROUP_RANK, gi.rank),
            (n.COLL_GROUP_RANKS, tuple(gi.global_ranks)),  # who should be there: the analysis names who never arrived
            (n.COLL_SEQ, seq),
            (n.HANG_WAITED, age),
            (n.HANG_THRESHOLD, self.threshold),
            (n.WARNING_KIND, "hang"),
            (n.WARNING_MESSAGE, message),
        ]
        ranks = (n.HANG_MISSING_RANKS, tuple(m.rank for m in missing or ()))
        if missing:
            attrs.append(ranks)
        if peers:  # a point-to-point call's: whom it waits on, without reading the message
            attrs.append((n.COLL_PEER, peers[0]) if len(peers) == 1 else (n.COLL_PEERS, tuple(str(p) for p in peers)))
        span = SpanData(n.SPAN_HANG, trace, new_span_id(), parent, rec[R.T_START] + off, now + off, attrs)
        span.events.append((n.HANG_EVENT, now + off, [(n.COLL_SEQ, seq), (n.HANG_WAITED, age)]))
        if missing:
            span.events.append((n.HANG_MISSING_EVENT, now + off, [ranks, (n.HANG_MISSING_DETAIL, tuple(m.detail for m in missing))]))
        pipeline.outbox.emit_span(span)
        pipeline.outbox.export_soon()
        rank = self.rt.identity.rank if self.rt.identity is not None else 0
        callbacks.fire("hang", callbacks.HangEvent(rank, rec[R.OP], gi.label, seq, age, ranks[1], tuple(m.detail for m in missing or ())))

    # ------------------------------------------------------------------------------------- metrics
    def metric_data(self) -> list[MetricData]:
        base = {k: v for k, v in self.rt.pipeline.base_labels.items()}
        started, completed, ages = [], [], []
        for gi in groups.all_groups():
            labels = {**base, n.M_GROUP: gi.label}
            started.append(NumberPoint(labels, gi.last_started()))
            completed.append(NumberPoint(labels, gi.last_completed))
            ages.append(NumberPoint(labels, float(self._ages.get(gi.label, 0.0))))
        missing = [
            NumberPoint({**base, n.M_OP: op, n.M_GROUP: label, n.M_MISSING_RANK: str(rank)}, seq)
            for op, label, seq, ranks in list(self._missing.values())
            for rank in ranks
        ]
        out = [
            MetricData(n.GROUP_SEQ_STARTED, started),
            MetricData(n.GROUP_SEQ_COMPLETED, completed),
            MetricData(n.COLLECTIVE_INFLIGHT_AGE, ages),
        ]
        return out + [MetricData(n.COLLECTIVE_HANG_MISSING, missing)] if missing else out
