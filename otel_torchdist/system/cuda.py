"""torch's CUDA caching allocator, per device this rank uses: allocated, reserved, peak, OOM retries.

Only read once this process has initialized CUDA itself (``torch.cuda.is_initialized()``): the sampler
never initializes CUDA, which would pin a context on a device and poison later ``fork()`` calls. Reading
the stats copies a small struct under the allocator's own mutex (no CUDA call, no device sync).
"""

from __future__ import annotations

from typing import Any

import torch

from .. import names as n
from ..otlp import MetricData, NumberPoint
from .series import Deltas, labels


def visible_count() -> int:
    """CUDA devices visible to this process (NVML-based in torch: it does not initialize CUDA)."""
    try:
        return torch.cuda.device_count()
    except Exception:
        return 0


def _stats(device: int) -> dict[str, Any]:
    return torch.cuda.memory_stats_as_nested_dict(device)


def devices_in_use(count: int) -> list[int]:
    """Devices on which this process's allocator holds memory (empty until CUDA is initialized)."""
    if not torch.cuda.is_initialized():
        return []
    return [d for d in range(count) if _stats(d).get("reserved_bytes", {}).get("all", {}).get("current", 0) > 0]


class AllocatorSampler:
    def __init__(self) -> None:
        self._retries = Deltas()

    def sample(self, base: dict[str, str], devices: list[int]) -> list[MetricData]:
        if not devices or not torch.cuda.is_initialized():
            return []
        allocated, reserved, peak, retries = [], [], [], []
        for d in devices:
            s = _stats(d)
            if not s:
                continue
            lab = labels(n.CUDA_ALLOCATED, base, d)
            allocated.append(NumberPoint(lab, int(s["allocated_bytes"]["all"]["current"])))
            reserved.append(NumberPoint(lab, int(s["reserved_bytes"]["all"]["current"])))
            peak.append(NumberPoint(lab, int(s["allocated_bytes"]["all"]["peak"])))
            retries.append(NumberPoint(lab, int(self._retries.feed(d, s.get("num_alloc_retries", 0)))))
        return [
            MetricData(n.CUDA_ALLOCATED, allocated),
            MetricData(n.CUDA_RESERVED, reserved),
            MetricData(n.CUDA_PEAK, peak),
            MetricData(n.CUDA_OOM_RETRIES, retries),
        ]
