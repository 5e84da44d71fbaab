"""Mixed precision, seen cheaply: the autocast dtype (noted once) and GradScaler's scale.

Autocast state is thread-local, so the sampler thread cannot ask for it. ``autocast.__enter__`` is
patched to note the first *enabled* autocast's device type and dtype (``torch.autocast`` and
``torch.cuda.amp.autocast`` both go through it); after that the wrapper costs one attribute test.

``GradScaler.update`` (and FSDP's ``ShardedGradScaler.update``, which overrides it, when its module was
imported before the process group came up) is patched to note the scale after the original ran; its result and exceptions pass through untouched. ``get_scale()`` would be
a ``.item()``, a full CPU-GPU sync, on a CUDA scaler every step, so it is not called: a CPU scale is read
directly, and a CUDA scale is copied to pinned memory without blocking at most once per sampling
interval, on the training thread's own stream, and picked up at a later ``update()`` once its event has
completed (so on GPU the gauge trails the scale by one such interval). The sampler thread never touches
the scale tensor.
"""

from __future__ import annotations

import functools
import sys
import time
from typing import Any

import torch

from .. import health
from ..patching import Patch
from ..drain.spans import dtype_name

_is_compiling = torch.compiler.is_compiling


class AmpState:
    def __init__(self) -> None:
        self.reset(5.0)

    def reset(self, interval: float) -> None:
        self.autocast: tuple[str, str] | None = None  # (device type, dtype) of the first enabled autocast
        self.scale: float | None = None
        self.scaler: str | None = None  # class name of the last scaler seen updating
        self.interval = interval
        self._host: Any = None
        self._event: Any = None
        self._last_copy = float("-inf")

    def note_autocast(self, ctx: Any) -> None:
        if getattr(ctx, "_enabled", False):
            self.autocast = (str(ctx.device), dtype_name(ctx.fast_dtype))

    def note_scaler(self, scaler: Any) -> None:
        scale = getattr(scaler, "_scale", None)
        if scale is None or not getattr(scaler, "_enabled", True):
            return
        self.scaler = type(scaler).__name__
        if scale.device.type == "cpu":
            self.scale = float(scale.item())
        elif scale.device.type == "cuda":
            self._poll_cuda(scale)

    def _poll_cuda(self, scale: Any) -> None:
        if self._event is not None:
            if not self._event.query():
                return
            self.scale = float(self._host.item())  # pinned host memory the finished copy wrote: no sync
            self._event = None
        now = time.monotonic()
        if now - self._last_copy < self.interval:
            return
        if self._host is None or self._host.dtype != scale.dtype:
            self._host = torch.empty(scale.shape, dtype=scale.dtype, pin_memory=True)
        stream = torch.cuda.current_stream(scale.device)
        self._host.copy_(scale, non_blocking=True)
        event = torch.cuda.Event()
        event.record(stream)
        self._event = event
        self._last_copy = now

    def harvest(self) -> None:
        """Pick up a finished copy (called at stop, on the training thread; never waits)."""
        try:
            if self._event is not None and self._event.query():
                self.scale = float(self._host.item())
                self._event = None
        except Exception:
            pass


STATE = AmpState()


def _wrap_enter(original: Any) -> Any:
    @functools.wraps(original)
    def __enter__(self: Any) -> Any:
        if STATE.autocast is None and not _is_compiling():
            try:
                STATE.note_autocast(self)
            except Exception as exc:
                health.error("system", "could not read the autocast dtype", exc)
        return original(self)

    return __enter__


def _wrap_update(original: Any) -> Any:
    @functools.wraps(original)
    def update(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        if not _is_compiling():
            try:
                STATE.note_scaler(self)
            except Exception as exc:
                health.error("system", "could not read GradScaler's scale", exc)
        return result

    return update


def patches() -> list[Patch]:
    from torch.amp import autocast_mode, grad_scaler

    table = [
        Patch(autocast_mode.autocast, "__enter__", _wrap_enter),
        Patch(grad_scaler.GradScaler, "update", _wrap_update),
    ]
    # Importing FSDP costs about half a second: patch its scaler only when the script already imported it.
    sharded_grad_scaler = sys.modules.get("torch.distributed.fsdp.sharded_grad_scaler")
    if sharded_grad_scaler is not None and "update" in sharded_grad_scaler.ShardedGradScaler.__dict__:
        table.append(Patch(sharded_grad_scaler.ShardedGradScaler, "update", _wrap_update))
    return table
