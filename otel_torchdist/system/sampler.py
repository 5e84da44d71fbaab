"""The system component: one daemon thread that samples every ``system_interval`` seconds.

Each sample reads the process and host (psutil), the CUDA allocator and NVML for the GPUs this rank
uses, folds data-loader waits, checks the warnings, and swaps in a new list of points that every metric
export and ``/metrics`` scrape returns as is. The training thread only pays for the patched
``DataLoader`` ``next()``, ``autocast`` entry and ``GradScaler.update`` (see ``dataloader.py``, ``amp.py``).

Which GPUs this rank uses: none until this process has initialized CUDA itself (the sampler never does);
then the device that was current on the training thread when the process group came up, plus every
device on which torch's allocator holds memory. NVML is loaded the first time there is such a GPU.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from time import perf_counter
from typing import Any

import torch
import torch.distributed as dist

from .. import health
from .. import names as n
from ..telemetry import MetricData, NumberPoint, SpanData
from ..patching import Patcher
from ..runtime import Component
from ..ids import new_span_id, new_trace_id
from . import amp, cuda, dataloader, describe, process
from .gpu import GpuReading, NvmlSampler
from .series import labels
from .warn import GpuWarning, WarningState

_log = logging.getLogger("otel_torchdist")

THREAD_NAME = "otel-torchdist-system"
JOIN_TIMEOUT = 2.0


class SystemTelemetry(Component):
    name = "system"

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self.host = socket.gethostname()
        self.rt: Any = None
        self.patcher = Patcher()
        self.process = process.ProcessSampler(self.host)
        self.allocator = cuda.AllocatorSampler()
        self.gpus = NvmlSampler(self.host)
        self.waits: dataloader.DataloaderWait | None = None
        self.warnings = WarningState(cfg.warn_gpu_utilization, cfg.warn_gpu_utilization_window, cfg.warn_memory_fraction)
        self.last_sample_seconds: float | None = None
        """Wall time the sampler thread spent on its last sample."""
        self._points: list[MetricData] = []  # replaced whole by each sample, never mutated
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._visible = 0
        self._start_device: int | None = None
        self._attributes: dict[str, Any] = {}
        self._nvml_failed = False
        self._unmatched: set[int] = set()
        self._description = ""
        self._host_resources: dict[str, Any] = {}

    # ------------------------------------------------------------------------------ Component API
    def resource_attributes(self) -> dict[str, Any]:
        # On the training thread, so its current CUDA device is the one to read.
        self._visible = cuda.visible_count()
        gpus: list[tuple[str, int]] = []
        if self._visible and torch.cuda.is_initialized():
            self._start_device = torch.cuda.current_device()
            props = torch.cuda.get_device_properties(self._start_device)
            gpus.append((props.name, props.total_memory))
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else None
        self._attributes = describe.resource_attributes(
            describe.node_count(os.environ, world), self._visible, gpus, torch.version.cuda, describe.nccl_version()
        )
        return dict(self._attributes)

    def start(self, rt: Any) -> None:
        self.rt = rt
        self.waits = dataloader.DataloaderWait(rt.pipeline.bounds)
        amp.STATE.reset(self.cfg.system_interval)
        try:
            self.patcher.apply(amp.patches())
        except Exception as exc:
            health.error("system", "could not patch the mixed-precision hooks", exc)
        if not self._visible:
            _log.info("otel-torchdist: no CUDA GPU visible to this process; GPU metrics off, process and host metrics on")
        self._host_resources = self._guarded("describe the host", process.describe) or {}
        self._describe()
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()

    def metric_data(self) -> list[MetricData]:
        if self.rt is None:
            return []
        base = self.rt.pipeline.base_labels
        out = list(self._points)
        if self.waits is not None:
            out += self.waits.metric_data(base)
        scale = amp.STATE.scale
        if scale is not None:
            out.append(MetricData(n.AMP_GRAD_SCALE, [NumberPoint(labels(n.AMP_GRAD_SCALE, base), scale)]))
        return out

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(JOIN_TIMEOUT)
        self.patcher.restore()
        if self.waits is not None:
            self.waits.stop()
        if self.rt is None:
            return
        amp.STATE.harvest()
        if thread is not None and not thread.is_alive():
            self.gpus.shutdown()  # not under a read still running
        self._guarded("describe the run", self._describe)

    # ---------------------------------------------------------------------------------- sampling
    def _run(self) -> None:
        while True:
            t0 = perf_counter()
            self._guarded("sample", self.sample)
            self.last_sample_seconds = perf_counter() - t0
            if self._stop.wait(self.cfg.system_interval):
                return

    def sample(self) -> None:
        """One sample of everything (the sampler thread's work; also callable directly)."""
        base = self.rt.pipeline.base_labels
        points: list[MetricData] = []
        points += self._guarded("sample the process", self.process.sample, base) or []
        stats = self._guarded("read the CUDA allocator", self._allocator_stats) or {}
        devices = self._devices(stats)
        used = {d: stats[d] for d in devices if d in stats}
        points += self._guarded("build CUDA allocator metrics", self.allocator.sample, base, used) or []
        readings = self._guarded("read the GPUs", self._read_gpus, devices) or []
        points += self._guarded("build GPU metrics", self.gpus.metric_data, readings, base) or []
        self._guarded("check GPU warnings", self.check_warnings, readings, time.monotonic())
        if self.waits is not None:
            self._guarded("fold data-loader waits", self.waits.fold)
        self._points = points
        self._guarded("describe the run", self._describe)

    def _guarded(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:
            health.error("system", f"the system sampler could not {what}", exc)
            return None

    def _allocator_stats(self) -> dict[int, dict[str, Any]]:
        return cuda.allocator_stats(self._visible) if self._visible else {}

    def _devices(self, stats: dict[int, dict[str, Any]]) -> list[int]:
        """The devices this rank uses, given every visible device's allocator statistics."""
        if not stats:
            return []
        devices = set(cuda.in_use(stats))
        if self._start_device is not None:
            devices.add(self._start_device)
        return sorted(devices)

    def _read_gpus(self, devices: list[int]) -> list[GpuReading]:
        if not devices or self._nvml_failed:
            return []
        if self.gpus.nvml is None:
            reason = self.gpus.start()
            if reason is not None:
                self._nvml_failed = True
                _log.info("otel-torchdist: NVML unavailable (%s); no GPU metrics, process and host metrics on", reason)
                return []
        readings = []
        seen: set[int] = set()
        for d in devices:
            target = self.gpus.target(d, functools.partial(torch.cuda.get_device_properties, d))
            if target is None:
                if d not in self._unmatched:
                    self._unmatched.add(d)
                    _log.info("otel-torchdist: CUDA device %d matches no NVML GPU (MIG?); no GPU metrics for it", d)
                continue
            if target.nvml_index not in seen:
                seen.add(target.nvml_index)
                readings.append(self.gpus.read(target))
        return readings

    # ---------------------------------------------------------------------------------- warnings
    def check_warnings(self, readings: list[GpuReading], now: float) -> list[GpuWarning]:
        """Decide on ``readings`` taken at monotonic time ``now`` and emit what starts an episode."""
        found = self.warnings.observe(readings, now)
        for w in found:
            self._emit(w, now)
        return found

    def _emit(self, w: GpuWarning, now: float) -> None:
        end_ns = time.time_ns()
        start_ns = end_ns - int(max(0.0, now - w.started) * 1e9)
        attrs = [(n.WARNING_KIND, w.kind), (n.WARNING_MESSAGE, w.message)]
        span = SpanData(
            name=n.SPAN_WARNING,
            trace_id=new_trace_id(),
            span_id=new_span_id(),
            parent_span_id=None,
            start_ns=start_ns,
            end_ns=end_ns,
            attributes=attrs,
            events=[(n.WARNING_EVENT, end_ns, list(attrs))],
        )
        self.rt.pipeline.outbox.emit_span(span)
        _log.warning("otel-torchdist: %s", w.message)

    # -------------------------------------------------------------------------------- description
    def _describe(self) -> None:
        rt = self.rt
        if rt is None or rt.folder is None or rt.identity is None:
            return
        state = amp.STATE
        doc = describe.description(
            rt.identity,
            self._attributes,
            self._host_resources,
            self._visible,
            self.gpus.describe(),
            self.gpus.driver_version,
            state.autocast,
            state.scaler,
        )
        text = repr(doc)
        if text == self._description:
            return
        try:
            describe.write(rt.folder, rt.identity.rank, doc)
        except OSError as exc:
            health.error("run_folder", "cannot write the run description", exc)
            return
        self._description = text
