"""The user's functions, called in the training process when the library detects something live: a hang
(with the ranks that never came), a straggler verdict, a slow step, a non-finite loss given to record_step.

    handle = otel_torchdist.on("hang", lambda event: faulthandler.dump_traceback())
    handle.remove()

Detection happens on the library's own threads (watchdog, drain, straggler exchange) or, for the loss, on
the training thread inside ``record_step``; none of them runs a callback. ``fire`` only puts the event on a
bounded queue (a full queue drops it, counted as ``callback_event``). A dispatcher thread takes the events
in order and runs each registered function on a thread of its own, waiting at most ``TIMEOUT`` seconds for
it: a function that raises is logged once and counted (``callback``); one that blocks is left running and
the dispatcher goes on with the next event; while ``MAX_STUCK`` calls are still running, further calls are
dropped and counted (``callback_stuck``) instead of piling up threads.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from . import health

TIMEOUT = 10.0  # seconds the dispatcher waits for one callback before going on without it
MAX_STUCK = 4  # callbacks still running past TIMEOUT before further calls are dropped
_log = logging.getLogger("otel_torchdist")


@dataclass(frozen=True)
class HangEvent:
    """A collective has been in flight on this rank past the hang threshold."""

    rank: int
    op: str
    group: str
    seq: int
    waited_s: float
    missing_ranks: tuple[int, ...]  # ranks of the group that had not started it (empty: unknown or none)
    missing: tuple[str, ...]  # for each of them, what it last started and when it last reported


@dataclass(frozen=True)
class StragglerEvent:
    """The straggler exchange named a slow rank (score above 0.2) for a window of steps."""

    rank: int
    slowest_rank: int
    score: float
    scores: dict[int, float] = field(default_factory=dict)
    window: int = 0


@dataclass(frozen=True)
class SlowStepEvent:
    """A step took more than ``slow_step_factor`` times the median of the recent steps."""

    rank: int
    step: int
    duration_s: float
    median_s: float


@dataclass(frozen=True)
class NonFiniteLossEvent:
    """``record_step(loss=...)`` was given NaN or an infinity."""

    rank: int
    step: int
    loss: float


EVENTS = {"hang": HangEvent, "straggler": StragglerEvent, "slow_step": SlowStepEvent, "nonfinite_loss": NonFiniteLossEvent}


class Handle:
    """What ``on`` returns: ``remove()`` unregisters the function."""

    def __init__(self, event: str, fn: Callable[[Any], Any]) -> None:
        self.event, self.fn = event, fn

    def remove(self) -> None:
        with _lock:
            if self in _registered[self.event]:
                _registered[self.event].remove(self)


_lock = threading.Lock()
_registered: dict[str, list[Handle]] = {name: [] for name in EVENTS}
_queue: queue.Queue = queue.Queue(maxsize=64)
_dispatcher: list[threading.Thread | None] = [None]
_stuck = [0]  # calls running past TIMEOUT


def on(event: str, fn: Callable[[Any], Any]) -> Handle:
    """Call ``fn(event)`` when ``event`` happens in this process: "hang", "straggler", "slow_step" or
    "nonfinite_loss" (the event objects: HangEvent, StragglerEvent, SlowStepEvent, NonFiniteLossEvent).
    Registrations hold before and across instrument()/uninstrument()."""
    if event not in EVENTS:
        raise ValueError(f"unknown event {event!r}: one of {', '.join(EVENTS)}")
    if not callable(fn):
        raise TypeError(f"the callback for {event!r} must be callable, not {type(fn).__name__}")
    handle = Handle(event, fn)
    with _lock:
        _registered[event].append(handle)
    return handle


def fire(event: str, payload: Any) -> None:
    """From any thread; never blocks and never raises."""
    with _lock:
        if not _registered[event]:
            return
        if _dispatcher[0] is None or not _dispatcher[0].is_alive():
            _dispatcher[0] = threading.Thread(target=_dispatch, name="otel-torchdist-callbacks", daemon=True)
            _dispatcher[0].start()
    try:
        _queue.put_nowait((event, payload))
    except queue.Full:
        health.dropped("callback_event")


def _dispatch() -> None:
    while True:
        event, payload = _queue.get()
        with _lock:
            handles = list(_registered[event])
        for handle in handles:
            _call(handle, payload)


def _call(handle: Handle, payload: Any) -> None:
    if _stuck[0] >= MAX_STUCK:
        health.dropped("callback_stuck")
        return
    done = threading.Event()

    def run() -> None:
        try:
            handle.fn(payload)
        except BaseException as exc:  # a callback's SystemExit or KeyboardInterrupt is not this thread's to raise
            health.error("callback", f"the {handle.event} callback {_name(handle.fn)} raised", exc)
        finally:
            done.set()
            with _lock:
                if late[0]:
                    _stuck[0] -= 1

    late = [False]
    threading.Thread(target=run, name=f"otel-torchdist-callback-{handle.event}", daemon=True).start()
    if not done.wait(TIMEOUT):
        with _lock:
            if not done.is_set():
                late[0] = True
                _stuck[0] += 1
        if late[0]:
            health.error("callback_timeout", f"the {handle.event} callback {_name(handle.fn)} did not return within {TIMEOUT:.0f} s; left running")


def _name(fn: Callable) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)
