"""When did an async collective really finish?

An async call returns at launch; its record is completed later, by the first of:

* its Work's future completing (gloo, mpi, ucc, fake): a backend thread runs our callback at completion,
  so a ``wait()`` that comes long after is not charged to the collective;
* ``Work.wait()`` returning, for Works that have no future (gloo send/recv): the backend exposes no earlier
  completion signal, and the record says so (``end_source="wait"``);
* ProcessGroupNCCL's completion hook (GPU-timed, joined on the sequence number).

Works that are never waited on are evicted after :data:`MAX_PENDING_WAITS` and recorded as unfinished.
"""

from __future__ import annotations

import threading
from time import perf_counter_ns
from typing import Any

from .. import health
from .. import names as n
from . import record as R

MAX_PENDING_WAITS = 4096

_pending_waits: dict[Any, _Join] = {}
_pending_lock = threading.Lock()
_inflight: dict[int, _Join] = {}  # joins completed by a future, for the hang watchdog to see


class _Join:
    """Completes one record after ``remaining`` works finished; the last end time wins."""

    __slots__ = ("rec", "remaining", "source", "lock", "waiting")

    def __init__(self, rec: list, remaining: int) -> None:
        self.rec = rec
        self.remaining = remaining
        self.source = n.END_FUTURE
        self.lock = threading.Lock() if remaining > 1 else None
        self.waiting = 0  # perf_counter_ns when wait() was entered, for a work with no other completion signal

    def done(self, source: str, error: BaseException | None = None) -> None:
        t_end = perf_counter_ns()
        rec = self.rec
        if error is not None and rec[R.ERROR] is None:
            rec[R.ERROR] = R.error_info(error)
        if self.lock is None:
            _inflight.pop(id(self), None)
            self._complete(source, t_end)
            return
        with self.lock:
            if source != n.END_FUTURE and self.source != n.END_UNFINISHED:
                self.source = source  # the weakest observation decides what the record can claim
            self.remaining -= 1
            last = self.remaining == 0
        if last:  # until then in flight, in the hang watchdog's view
            _inflight.pop(id(self), None)
            self._complete(self.source, t_end)

    def _complete(self, source: str, t_end: int) -> None:
        rec = self.rec
        if source == n.END_WAIT and self.waiting:
            # Timed to wait() for want of a completion signal: the step counts only the time wait() blocked as
            # the rank's wait (an isend waited after 300 ms of compute made the compute collective wait).
            rec[R.EXTRA] = (rec[R.EXTRA] or ()) + ("wait_ns", max(0, t_end - self.waiting))
        R.complete(rec, source, t_end)


def track(rec: list, works: list[Any]) -> None:
    """Complete ``rec`` when all of ``works`` have completed."""
    works = [w for w in works if w is not None]
    if not works:
        R.complete(rec, n.END_RETURN)
        return
    join = watch(rec, len(works))
    for work in works:
        get_future = getattr(work, "get_future", None)
        if get_future is None:  # a future already (all_reduce_coalesced(async_op=True) returns one)
            fut = work if callable(getattr(work, "add_done_callback", None)) else None
        else:
            try:
                fut = get_future()
            except Exception:
                fut = None
        if fut is not None:
            fut.add_done_callback(lambda f, j=join: _on_future(j, f))
        else:
            _wait_for(work, join)


def watch(rec: list, works: int = 1) -> _Join:
    """A join for ``rec`` that the hang watchdog sees until it is done; the caller arranges the done."""
    join = _Join(rec, works)
    _inflight[id(join)] = join
    return join


def _on_future(join: _Join, fut: Any) -> None:
    # Runs on a backend thread; must never raise into it.
    try:
        err = None
        try:
            fut.value()
        except Exception as exc:  # the collective failed; the user sees it at wait()
            err = exc
        join.done(n.END_FUTURE, err)
    except Exception as exc:
        health.error("completion", "could not complete an async collective record", exc)


def _wait_for(work: Any, join: _Join) -> None:
    evicted = None
    # Done at wait() at the earliest: the hang watchdog times it from there (in_flight), not from its issue.
    _inflight.pop(id(join), None)
    with _pending_lock:
        _pending_waits[work] = join
        if len(_pending_waits) > MAX_PENDING_WAITS:
            oldest = next(iter(_pending_waits))
            evicted = _pending_waits.pop(oldest)
    if evicted is not None:
        evicted.done(n.END_UNFINISHED)


def on_wait_entered(work: Any) -> None:
    """Called by the patched ``Work.wait`` before the original: from now on the hang watchdog times it."""
    join = _pending_waits.get(work)
    if join is not None and not join.waiting:
        join.waiting = perf_counter_ns()


def on_wait_returned(work: Any, error: BaseException | None = None) -> None:
    """Called by the patched ``Work.wait`` after the original returned (or raised)."""
    if not _pending_waits:
        return
    with _pending_lock:
        join = _pending_waits.pop(work, None)
    if join is not None:
        join.done(n.END_WAIT, error)


def flush_unfinished() -> None:
    """At exit: whatever is still pending never completed as far as we could see."""
    with _pending_lock:
        joins = list(_pending_waits.values())
        _pending_waits.clear()
    for join in joins:
        join.done(n.END_UNFINISHED)


def in_flight() -> list[tuple[list, int]]:
    """(record, since) of the joins not yet done, for the hang watchdog: a future-tracked one since its
    issue; one with no completion signal but wait() (gloo's send/recv) once wait() is entered, since then:
    until then it may well be over (an isend waited after the compute it overlaps)."""
    with _pending_lock:
        waiting = [(j.rec, j.waiting) for j in _pending_waits.values() if j.waiting]
    return [(j.rec, j.rec[R.T_START]) for j in list(_inflight.values())] + waiting


def pending_count() -> int:
    return len(_pending_waits)
