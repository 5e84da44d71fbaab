"""Warnings about this rank's GPUs, decided from samples: sustained low utilization, memory near the limit.

Each warning is an *episode*: it is raised once when the condition starts and not again until the
condition has ended and come back. Knobs (``otel_torchdist.config``; 0 disables a warning):

* ``warn_gpu_utilization`` / ``warn_gpu_utilization_window``: every sample of a GPU's utilization stayed
  below the fraction for the whole window (one sample at or above it ends the episode);
* ``warn_memory_fraction``: NVML's memory in use went above that fraction of the GPU's total (the
  episode ends when it drops below the fraction minus :data:`MEMORY_HYSTERESIS`, so usage hovering at
  the line does not warn at every sample).

:class:`WarningState` is pure (readings and a clock in, warnings out); the sampler turns its answers into
a ``torchdist.warning`` span with a ``torchdist.warning`` event, and a log line.
"""

from __future__ import annotations

from dataclasses import dataclass

from .gpu import GpuReading

LOW_GPU_UTILIZATION = "low_gpu_utilization"
MEMORY_NEAR_LIMIT = "memory_near_limit"
MEMORY_HYSTERESIS = 0.05


@dataclass(frozen=True, slots=True)
class GpuWarning:
    kind: str
    message: str
    started: float  # monotonic seconds at which the condition began


class WarningState:
    def __init__(self, utilization: float, window: float, memory_fraction: float) -> None:
        self.utilization = utilization
        self.window = window
        self.memory_fraction = memory_fraction
        self._low_since: dict[str, float] = {}  # uuid -> first low sample of the current episode
        self._low_warned: set[str] = set()
        self._memory_high: set[str] = set()

    def observe(self, readings: list[GpuReading], now: float) -> list[GpuWarning]:
        out: list[GpuWarning] = []
        for r in readings:
            out += self._utilization(r, now) + self._memory(r, now)
        return out

    def _utilization(self, r: GpuReading, now: float) -> list[GpuWarning]:
        if not self.utilization or r.utilization is None:
            return []
        if r.utilization >= self.utilization:
            self._low_since.pop(r.uuid, None)
            self._low_warned.discard(r.uuid)
            return []
        since = self._low_since.setdefault(r.uuid, now)
        if r.uuid in self._low_warned or now - since < self.window:
            return []
        self._low_warned.add(r.uuid)
        return [
            GpuWarning(
                LOW_GPU_UTILIZATION,
                f"GPU {r.gpu} ({r.model}) utilization stayed below {self.utilization:.0%} for {now - since:.3g} s "
                f"(now {r.utilization:.0%}): it is mostly waiting, often on data loading, host-side work or "
                "communication",
                since,
            )
        ]

    def _memory(self, r: GpuReading, now: float) -> list[GpuWarning]:
        if not self.memory_fraction or r.memory_used is None or not r.memory_total:
            return []
        used = r.memory_used / r.memory_total
        if r.uuid in self._memory_high:
            if used < self.memory_fraction - MEMORY_HYSTERESIS:
                self._memory_high.discard(r.uuid)
            return []
        if used <= self.memory_fraction:
            return []
        self._memory_high.add(r.uuid)
        return [
            GpuWarning(
                MEMORY_NEAR_LIMIT,
                f"GPU {r.gpu} ({r.model}) memory in use is {used:.1%} of {r.memory_total / 2**30:.1f} GiB, above "
                f"{self.memory_fraction:.0%}: the next allocation peak may run out of memory",
                now,
            )
        ]
