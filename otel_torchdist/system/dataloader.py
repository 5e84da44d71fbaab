"""Time the training loop waits for its next batch: the waits ``capture/dataloader.py`` times on every
``next()`` of a DataLoader iterator while system metrics are on, folded into the
``torchdist.dataloader.wait_time`` histogram off the hot path (by the sampler and every metric export)."""

from __future__ import annotations

import threading

from .. import names as n
from ..capture.dataloader import TIMED, WAITS
from ..drain.metrics import Histogram
from ..telemetry import MetricData
from .series import labels


class DataloaderWait:
    def __init__(self, bounds: tuple[float, ...] = n.DURATION_BUCKETS) -> None:
        self.histogram = Histogram(bounds)
        self._lock = threading.Lock()  # between the sampler and exporters; the training thread never takes it
        WAITS.clear()
        TIMED[0] = True

    def stop(self) -> None:
        TIMED[0] = False

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
