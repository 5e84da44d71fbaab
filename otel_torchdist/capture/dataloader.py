"""Every batch a DataLoader hands out: ``torch.utils.data.dataloader._BaseDataLoaderIter.__next__``, the
one ``__next__`` behind every DataLoader iterator (single- and multi-process, and the loaders Lightning,
Accelerate and transformers wrap). One wrapper serves two readers:

* the step tracker (``steps.py``): a batch is an iteration's first act, so it ends the training step an
  optimizer step left open (``FETCH``, with the iterator: which loader it came from);
* the system sampler (``system/dataloader.py``): with system metrics on, the time each ``next()`` waited
  (``WAITS``, folded into ``torchdist.dataloader.wait_time`` off the training thread). A ``next()`` that
  ends the epoch (``StopIteration``) or raises is not a batch and is not timed; its exception passes
  through untouched.

The training thread pays a list read per batch, and two clock reads and a deque append when waits are
timed. Under ``torch.compile`` the wrapper steps aside, and so it does for a loader read inside another's
fetch (a dataset that iterates a DataLoader of its own): the outer fetch is the batch, and its wait.
"""

from __future__ import annotations

import functools
import threading
from collections import deque
from time import perf_counter_ns
from typing import Any, Callable

import torch

from .. import health
from ..patching import Patch

# Waits not yet folded. Bounded so a stalled sampler cannot grow memory: 2**18 batches between two folds
# is over 50,000 batches a second at the default 5 s interval.
WAITS: deque[int] = deque(maxlen=1 << 18)
TIMED = [False]  # whether waits are timed (the system sampler runs)
FETCH: list[Callable[[int, Any], None] | None] = [None]  # the step tracker's on_fetch, while it wants fetches

_is_compiling = torch.compiler.is_compiling


_tls = threading.local()  # .inside: a fetch of this thread is running (a loader reading another: one wait)


def _wrap_next(original: Any) -> Any:
    @functools.wraps(original)
    def __next__(self: Any) -> Any:
        fetch = FETCH[0]
        if fetch is None and not TIMED[0] or _is_compiling() or getattr(_tls, "inside", False):
            return original(self)
        t0 = perf_counter_ns()
        _tls.inside = True
        try:
            data = original(self)
        finally:
            _tls.inside = False
        _took(fetch, t0, self, t0)  # a batch (not the end of the epoch): from t0 on, the next iteration's
        return data

    return __next__


def _took(fetch: Callable[[int, Any], None] | None, at: int, source: Any, t0: int) -> None:
    """A batch was handed out: tell the step tracker (the next iteration runs from ``at``) and time the wait
    that began at ``t0``."""
    if fetch is not None:
        try:
            fetch(at, source)
        except Exception as exc:
            health.error("steps", "could not end a training step at a batch fetch", exc)
    if TIMED[0]:
        WAITS.append(perf_counter_ns() - t0)


def patches() -> list[Patch]:
    from torch.utils.data import dataloader

    return [Patch(dataloader._BaseDataLoaderIter, "__next__", _wrap_next)]


def _wrap_iter(original: Any) -> Any:
    """A loader that hands out batches from a generator reading another loader one batch ahead (Accelerate's
    DataLoaderShard, which Hugging Face's Trainer uses too): its hand-out is the batch, not the inner fetch,
    which comes an iteration early and not at all before an epoch's last batch (whose iteration was counted
    in the step before it)."""

    @functools.wraps(original)
    def __iter__(self: Any) -> Any:
        batches = original(self)
        key = None
        try:
            while True:
                fetch = FETCH[0]
                if fetch is None and not TIMED[0] or _is_compiling() or getattr(_tls, "inside", False):
                    try:
                        batch = next(batches)
                    except StopIteration:
                        return
                    yield batch
                    continue
                t0 = perf_counter_ns()
                _tls.inside = True  # the inner loader's fetch steps aside: this hand-out is the batch
                try:
                    batch = next(batches)
                except StopIteration:
                    return
                finally:
                    _tls.inside = False
                if key is None:  # known as its inner loader would be (steps.loader_key)
                    key = _Batches(getattr(self, "_index_sampler", None), getattr(self, "dataset", None))
                # at the batch in hand: the hand-out's own collectives (the epoch's RNG broadcast, a
                # dispatcher's batch broadcast) were issued in the step still open, and stay inside it
                _took(fetch, perf_counter_ns(), key, t0)
                yield batch
        finally:
            batches.close()  # a loop left early closes the loader's generator, as iterating it directly does

    return __iter__


class _Batches:
    __slots__ = ("_index_sampler", "_dataset")

    def __init__(self, index_sampler: Any, dataset: Any) -> None:
        self._index_sampler = index_sampler
        self._dataset = dataset


def accelerate_patches() -> list[Patch]:
    from accelerate import data_loader

    loaders = [getattr(data_loader, name) for name in ("DataLoaderShard", "DataLoaderDispatcher") if hasattr(data_loader, name)]
    return [Patch(loader, "__iter__", _wrap_iter) for loader in loaders]
