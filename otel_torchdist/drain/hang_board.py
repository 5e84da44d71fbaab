"""Who never arrived: every rank's collective progress on a board in the store, read when a collective hangs.

Each rank publishes, on a thread of its own with a store connection of its own (never a collective: a hung
group cannot carry it, and gloo and NCCL alike have a TCPStore), where it is on every process group: the
sequence number it last started and last saw complete, and the oldest collective it has in flight (op,
sequence number, age), under ``otel_torchdist/<run>/progress/rank<R>``, at most once a second (less often
on large jobs: a world of W ranks publishes every W/2000 s, so the store takes at most about 2 000 writes a
second) and only when the watchdog has looked again.

When the watchdog finds a collective in flight past the hang threshold, it asks the board which ranks of
that group have not started it: one read of the group's keys, bounded by ``LOOKUP_TIMEOUT``. The ranks
compare how many of the group's collectives each has started (torch's sequence numbers less the numbers
gloo gives the point-to-point calls of the two ranks that take part: GroupInfo.collective_number). A rank
that is behind, or that never reported, has not started it; a rank that is in the same collective number
with another op is named too (the ranks called different collectives). For a hung point-to-point call the
board tells where its peer is, without a verdict: it does not know what the peer has posted.
What each of them last started, and how long ago it last reported (a rank that stopped reporting is dead or
stuck outside Python), goes into the watchdog's log line, its span and a metric.
"""

from __future__ import annotations

import datetime
import json
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

from .. import health

LOOKUP_TIMEOUT = 3.0  # seconds the watchdog waits for the board's answer
STORE_TIMEOUT = datetime.timedelta(seconds=2)  # one store operation: a store gone never stalls the thread longer


@dataclass(frozen=True)
class Missing:
    """A rank of the group that has not started the collective."""

    rank: int
    detail: str  # what it last started, and when it last reported


def missing_ranks(progress: dict[int, dict | None], ranks: tuple[int, ...], me: int, label: str, number: int, op: str, now: float) -> list[Missing]:
    """The ranks of ``ranks`` (global) that have not started the group's collective number ``number``
    (``op``; GroupInfo.collective_number) on group ``label``, from each rank's published progress (None:
    never published). With ``number`` None (a point-to-point call's peer), where each rank is."""
    out = []
    for rank in ranks:
        if rank == me:
            continue
        report = progress.get(rank)
        if report is None:
            out.append(Missing(rank, "never reported its progress (not instrumented, or gone before its first report)"))
            continue
        ago = f"reported {max(now - report['time'], 0.0):.1f} s ago"
        started, _, inflight, count = report["groups"].get(label, (0, 0, None, 0))
        where = _describe(report["groups"])
        if number is None:
            out.append(Missing(rank, f"{where}; {ago}"))
        elif count < number:
            aside = "" if count == started else f" (collective #{count}, its point-to-point calls aside)"
            out.append(Missing(rank, f"last started #{started} on {label}{aside}; {where}; {ago}"))
        elif inflight is not None and inflight[3] == number and inflight[0] != op:
            out.append(Missing(rank, f"started #{inflight[1]} on {label} as {inflight[0]}, not {op}; {where}; {ago}"))
    return out


def _describe(groups: dict[str, list]) -> str:
    """Where a rank is: the collective it has been in longest, or nothing in flight."""
    inflight = [(entry[2][2], label, entry[2]) for label, entry in groups.items() if entry[2] is not None]
    if not inflight:
        return "no collective in flight"
    age, label, (op, seq, *_) = max(inflight)
    return f"in {op} #{seq} on {label} for {age:.1f} s"


class HangBoard:
    def __init__(self, trace_key: str, rank: int, world: int, interval: float) -> None:
        self.trace_key = trace_key  # the run id and elastic attempt: a restart reads no stale board
        self.rank = rank
        self.interval = max(interval, 1.0, world / 2000.0)
        self._latest: dict | None = None  # the watchdog's last look, not yet published
        self._requests: queue.Queue = queue.Queue(maxsize=16)
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._client: Any = None
        self._thread = threading.Thread(target=self._run, name="otel-torchdist-hang-board", daemon=True)

    def _key(self, rank: int) -> str:
        return f"otel_torchdist/{self.trace_key}/progress/rank{rank}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ends the thread and its store connection before the store can go away (destroy_process_group)."""
        self._stopping.set()
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=STORE_TIMEOUT.total_seconds() + 1)

    def update(self, groups: dict[str, list]) -> None:
        """The watchdog's look at this rank: ``{group label: [started, completed, [op, seq, age, collective
        number] | None, collectives started]}`` (sequence numbers are torch's, which on gloo count the
        point-to-point calls of the ranks that take part only; collective numbers leave those out)."""
        self._latest = {"time": time.time(), "groups": groups}

    def lookup(self, label: str, ranks: tuple[int, ...], number: int | None, op: str) -> list[Missing] | None:
        """The ranks of the group that have not started its collective ``number`` (where ``ranks`` are, for
        ``number`` None: missing_ranks); None when the board cannot tell
        within ``LOOKUP_TIMEOUT`` (no store, the store gone, the board stopped)."""
        if self._stopping.is_set() or not self._thread.is_alive():
            return None
        answer: list = []
        done = threading.Event()
        try:
            self._requests.put_nowait((label, ranks, number, op, answer, done))
        except queue.Full:
            return None
        self._wake.set()
        return answer[0] if done.wait(LOOKUP_TIMEOUT) and answer else None

    # ----------------------------------------------------------------------------------- thread
    def _run(self) -> None:
        from .stragglers import connect_store

        published = 0.0
        try:
            while not self._stopping.is_set():
                self._wake.wait(self.interval)
                self._wake.clear()
                if self._stopping.is_set():
                    return
                try:
                    if self._client is None:
                        self._client = connect_store(STORE_TIMEOUT)
                    self._answer_requests()
                    latest = self._latest
                    if latest is not None and time.monotonic() - published >= self.interval:
                        self._latest = None
                        self._client.set(self._key(self.rank), json.dumps(latest))
                        published = time.monotonic()
                except Exception as exc:
                    health.error("hang_board", "the hang board could not reach the store; hangs are reported without the missing ranks", exc)
                    return
        finally:
            self._client = None
            self._stopping.set()

    def _answer_requests(self) -> None:
        while True:
            try:
                label, ranks, number, op, answer, done = self._requests.get_nowait()
            except queue.Empty:
                return
            try:
                keys = {r: self._key(r) for r in ranks}
                # one round trip when every rank has reported (the usual case), else one per rank
                present = list(ranks) if self._client.check(list(keys.values())) else [r for r in ranks if self._client.check([keys[r]])]
                values = self._client.multi_get([keys[r] for r in present]) if present else []
                progress: dict[int, dict | None] = {r: json.loads(v) for r, v in zip(present, values)}
                answer.append(missing_ranks(progress, ranks, self.rank, label, number, op, time.time()))
            finally:
                done.set()

