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
        if fetch is not None:  # a batch (not the end of the epoch): from t0 on, the next iteration's
            try:
                fetch(t0, self)
            except Exception as exc:
                health.error("steps", "could not end a training step at a batch fetch", exc)
        if TIMED[0]:
            WAITS.append(perf_counter_ns() - t0)
        return data

    return __next__


def patches() -> list[Patch]:
    from torch.utils.data import dataloader

    return [Patch(dataloader._BaseDataLoaderIter, "__next__", _wrap_next)]
