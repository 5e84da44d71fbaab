"""GPU and system telemetry, and the run's own description.

Importing this package registers the ``system`` component with the runtime (``otel_torchdist.runtime``
imports it itself); ``system_metrics=False`` (``OTEL_TORCHDIST_SYSTEM_METRICS=false``) turns it off.
Once the process group exists, each rank:

* puts the run description on its resource (node count, CUDA and NCCL versions, GPU count, models and
  memory: ``describe.py``) and writes the full description to ``run-description.rank<R>.json`` in the
  run folder;
* starts one daemon thread, ``otel-torchdist-system``, that samples every ``system_interval`` seconds
  (``OTEL_TORCHDIST_SYSTEM_INTERVAL_MS``, default 5 s): NVML for each GPU this rank uses (``gpu.py``), the
  CUDA allocator (``cuda.py``), this process and the host's network (``process.py``);
* times every DataLoader ``next()`` (``dataloader.py``) and notes the autocast dtype and GradScaler's
  scale (``amp.py``) through patches that ``uninstrument()`` restores to the identical originals;
* warns, once per episode, about GPUs idling or near their memory limit (``warn.py``): a
  ``torchdist.warning`` span with its event, and a log line.

Metric names and labels are the ``GPU, process and host`` section of ``otel_torchdist.names``; GPU labels
follow dcgm-exporter's (``gpu`` as NVML numbers it, ``uuid``, ``model``, ``host``). Counters count from the
sampler's first reading (CPU time: from process start). Without a GPU or without NVML there are no GPU
series, one INFO log line, and no GPU queries at all. Every failure is counted in
``torchdist.telemetry.errors{kind="system"}`` and logged once; training never sees it. Costs and the
``/metrics`` lines to expect: ``docs/system-telemetry.md``.
"""

from __future__ import annotations

from typing import Any

from ..runtime import COMPONENTS
from .sampler import THREAD_NAME, SystemTelemetry

__all__ = ["THREAD_NAME", "SystemTelemetry", "component"]


def component(cfg: Any) -> SystemTelemetry | None:
    """The runtime's factory: a :class:`SystemTelemetry`, or None when ``cfg.system_metrics`` is off."""
    return SystemTelemetry(cfg) if cfg.system_metrics else None


if component not in COMPONENTS:
    COMPONENTS.append(component)
