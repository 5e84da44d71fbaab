"""torch's CUDA caching allocator, per device this rank uses: allocated, reserved, peak, OOM retries.

Only read once this process has initialized CUDA itself (``torch.cuda.is_initialized()``): the sampler
never initializes CUDA, which would pin a context on a device and poison later ``fork()`` calls. Reading
the stats copies a small struct under the allocator's own mutex (no CUDA call, no device sync).
"""

from __future__ import annotations

from typing import Any

import torch

from .. import names as n
from ..telemetry import MetricData, NumberPoint
from .series import Deltas, labels


def visible_count() -> int:
    """CUDA devices visible to this process (NVML-based in torch: it does not initialize CUDA)."""
    try:
        return torch.cuda.device_count()
    except Exception:
        return 0


def allocator_stats(count: int) -> dict[int, dict[str, Any]]:
    """The allocator's statistics of every visible device (nothing until this process initialized CUDA)."""
    if not torch.cuda.is_initialized():
        return {}
    return {d: torch.cuda.memory_stats_as_nested_dict(d) for d in range(count)}


def in_use(stats: dict[int, dict[str, Any]]) -> list[int]:
    """Devices on which this process's allocator holds memory."""
    return [d for d, s in stats.items() if s.get("reserved_bytes", {}).get("all", {}).get("current", 0) > 0]


class AllocatorSampler:
    def __init__(self) -> None:
        self._retries = Deltas()

    def sample(self, base: dict[str, str], stats: dict[int, dict[str, Any]]) -> list[MetricData]:
        """Points for the devices in ``stats`` (those this rank uses)."""
        allocated, reserved, peak, retries = [], [], [], []
        for d, s in sorted(stats.items()):
            if not s:
                continue
            lab = labels(n.CUDA_ALLOCATED, base, d)
            allocated.append(NumberPoint(lab, int(s["allocated_bytes"]["all"]["current"])))
            reserved.append(NumberPoint(lab, int(s["reserved_bytes"]["all"]["current"])))
            peak.append(NumberPoint(lab, int(s["allocated_bytes"]["all"]["peak"])))
            retries.append(NumberPoint(lab, int(self._retries.feed(d, s.get("num_alloc_retries", 0)))))
        if not allocated:
            return []
        return [
            MetricData(n.CUDA_ALLOCATED, allocated),
            MetricData(n.CUDA_RESERVED, reserved),
            MetricData(n.CUDA_PEAK, peak),
            MetricData(n.CUDA_OOM_RETRIES, retries),
        ]
