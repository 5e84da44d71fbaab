"""Callbacks in the training process (otel_torchdist.on): each event reaches the user's function off the
thread that detected it, and a function that raises or blocks breaks nothing. The hang and straggler events
are tested with real ranks (tests/test_hang_board.py, tests/test_steps.py); slow steps and non-finite losses
here, on the fake process group."""

from __future__ import annotations

import threading
import time

import pytest

import otel_torchdist
from otel_torchdist import callbacks, health


@pytest.fixture
def registered():
    handles = []

    def on(event, fn):
        handles.append(otel_torchdist.on(event, fn))
        return handles[-1]

    yield on
    for handle in handles:
        handle.remove()


def _wait(predicate, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the callback was not called"
        time.sleep(0.01)


def test_registration_refuses_an_unknown_event_or_a_non_callable():
    with pytest.raises(ValueError, match="unknown event 'hung': one of hang, straggler, slow_step, nonfinite_loss"):
        otel_torchdist.on("hung", print)
    with pytest.raises(TypeError, match="must be callable"):
        otel_torchdist.on("hang", "print")


def test_the_function_runs_off_the_firing_thread_and_can_be_removed(registered):
    got = []
    handle = registered("slow_step", lambda e: got.append((e, threading.current_thread().name)))
    event = callbacks.SlowStepEvent(0, 7, 3.0, 1.0)
    callbacks.fire("slow_step", event)
    _wait(lambda: got)
    assert got == [(event, "otel-torchdist-callback-slow_step")]
    handle.remove()
    callbacks.fire("slow_step", event)
    time.sleep(0.2)
    assert len(got) == 1


def test_a_raising_callback_is_counted_and_the_next_events_still_arrive(registered):
    got = []
    registered("nonfinite_loss", lambda e: 1 / 0)
    registered("nonfinite_loss", got.append)
    before = health.errors().get("callback", 0)
    for step in (1, 2):
        callbacks.fire("nonfinite_loss", callbacks.NonFiniteLossEvent(0, step, float("nan")))
    _wait(lambda: len(got) == 2)
    assert [e.step for e in got] == [1, 2]
    assert health.errors().get("callback", 0) == before + 2


def test_a_blocking_callback_is_left_behind_within_the_bound(registered, monkeypatch):
    monkeypatch.setattr(callbacks, "TIMEOUT", 0.2)
    release = threading.Event()
    got = []
    registered("straggler", lambda e: release.wait(10))
    registered("straggler", got.append)
    stuck_before = callbacks._stuck[0]
    t0 = time.monotonic()
    for window in (1, 2):
        callbacks.fire("straggler", callbacks.StragglerEvent(0, 1, 0.5, {0: 0.0, 1: 0.5}, window))
    _wait(lambda: len(got) == 2)
    assert time.monotonic() - t0 < 2.0  # two bounded waits, not the callback's 10 s
    assert callbacks._stuck[0] == stuck_before + 2
    release.set()
    _wait(lambda: callbacks._stuck[0] == stuck_before)


def test_firing_never_blocks_and_a_full_queue_drops_counted(registered, monkeypatch):
    monkeypatch.setattr(callbacks, "TIMEOUT", 5.0)
    release = threading.Event()
    registered("hang", lambda e: release.wait(10))
    before = health.drops().get("callback_event", 0)
    event = callbacks.HangEvent(0, "all_reduce", "default_pg", 3, 2.0, (1,), ("rank 1 ...",))
    t0 = time.monotonic()
    for _ in range(200):
        callbacks.fire("hang", event)
    assert time.monotonic() - t0 < 0.5
    assert health.drops().get("callback_event", 0) > before
    release.set()


def test_a_slow_step_calls_the_slow_step_callback(fake_pg, instrumented, registered):
    import torch
    import torch.distributed as dist

    got = []
    registered("slow_step", got.append)
    instrumented(run_id="slow-callback", trace_every_steps=1000)
    for i in range(1, 12):
        with otel_torchdist.step(i):
            dist.all_reduce(torch.ones(4))
            time.sleep(0.35 if i == 9 else 0.01)
    otel_torchdist.uninstrument()
    _wait(lambda: got)
    (event,) = got
    assert event.step == 9 and event.duration_s > 0.3 and event.median_s < 0.1 and event.rank == 0


def test_a_non_finite_loss_calls_its_callback_from_record_step(fake_pg, instrumented, registered):
    import torch
    import torch.distributed as dist

    got = []
    registered("nonfinite_loss", got.append)
    instrumented(run_id="nan-callback")
    for i, loss in enumerate((0.5, float("nan"), 0.4, float("inf")), start=1):
        with otel_torchdist.step(i):
            dist.all_reduce(torch.ones(4))
            otel_torchdist.record_step(loss=loss)
    otel_torchdist.uninstrument()
    _wait(lambda: len(got) == 2)
    assert [(e.step, str(e.loss)) for e in got] == [(2, "nan"), (4, "inf")]
