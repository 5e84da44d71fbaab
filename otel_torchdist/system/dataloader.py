"""Time the training loop waits for its next batch: every ``next()`` on a DataLoader iterator.

Patched at ``torch.utils.data.dataloader._BaseDataLoaderIter.__next__``, the one ``__next__`` behind
every DataLoader iterator (single- and multi-process). The training thread pays two
``perf_counter_ns()`` reads and a deque append per batch; the sampler folds the waits into the
``torchdist.dataloader.wait_time`` histogram off the hot path, and so does every metric export. A
``next()`` that ends the epoch (``StopIteration``) or raises is not a batch and is not counted; its
exception passes through untouched. Under ``torch.compile`` the wrapper steps aside.
"""

from __future__ import annotations

import functools
import threading
from collections import deque
from time import perf_counter_ns
from typing import Any

import torch

from .. import names as n
from ..telemetry import MetricData
from ..patching import Patch
from ..metrics import Histogram
from .series import labels

# Waits not yet folded. Bounded so a stalled sampler cannot grow memory: 2**18 batches between two folds
# is over 50,000 batches a second at the default 5 s interval.
WAITS: deque[int] = deque(maxlen=1 << 18)

_is_compiling = torch.compiler.is_compiling


def _wrap_next(original: Any) -> Any:
    @functools.wraps(original)
    def __next__(self: Any) -> Any:
        if _is_compiling():
            return original(self)
        t0 = perf_counter_ns()
        data = original(self)
        WAITS.append(perf_counter_ns() - t0)
        return data

    return __next__


def patches() -> list[Patch]:
    from torch.utils.data import dataloader

    return [Patch(dataloader._BaseDataLoaderIter, "__next__", _wrap_next)]


class DataloaderWait:
    def __init__(self, bounds: tuple[float, ...] = n.DURATION_BUCKETS) -> None:
        self.histogram = Histogram(bounds)
        self._lock = threading.Lock()  # between the sampler and exporters; the training thread never takes it
        WAITS.clear()

    def fold(self) -> None:
        with self._lock:
            h = self.histogram
            while WAITS:
                try:
                    ns = WAITS.popleft()
                except IndexError:
                    break
                h.observe(ns / 1e9)

    def metric_data(self, base: dict[str, str]) -> list[MetricData]:
        self.fold()
        with self._lock:
            if not self.histogram.count:
                return []
            return [MetricData(n.DATALOADER_WAIT, [self.histogram.point(labels(n.DATALOADER_WAIT, base))])]
