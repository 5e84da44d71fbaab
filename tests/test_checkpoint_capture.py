"""The checkpoint capture's own edges (the spans of real DCP saves and loads: tests/test_training_paths.py)."""

from __future__ import annotations

import concurrent.futures
import os

import torch

import otel_torchdist
from otel_torchdist import names as n
from otel_torchdist.capture import checkpoint

from .harness import read_spans


def test_a_state_dict_holding_a_cycle_is_counted_once():
    state: dict = {"w": torch.ones(4), "sub": {}}
    state["sub"]["parent"] = state  # a reference cycle (an object graph a user's state holds)
    assert checkpoint._tensor_bytes(state) == (16, 1)  # it looped for ever, in the training thread


def test_a_cancelled_async_save_still_ends_its_span(fake_pg, instrumented):
    """The future async_save returned is cancelled: its span ends, with the cancellation. (A stand-in
    async_save returns a real future, then cancelled, through the wrapper the library puts on DCP's.)"""
    folder = instrumented()
    pending: concurrent.futures.Future = concurrent.futures.Future()
    save = checkpoint._wrap("save", n.SPAN_CHECKPOINT_SAVE, True)(lambda state_dict, **kwargs: pending)
    assert save({"w": torch.ones(2)}, checkpoint_id="/nowhere") is pending
    pending.cancel()
    otel_torchdist.uninstrument()
    (span,) = [s for s in read_spans(os.path.join(folder, "traces.rank0.jsonl")) if s["name"] == n.SPAN_CHECKPOINT_SAVE]
    assert "Cancelled" in span["status"]["message"]
