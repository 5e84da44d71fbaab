"""Optimizer steps as ``optimizer.step`` spans, through torch.optim's global step hooks.

Every ``torch.optim`` optimizer (default, foreach, fused), ZeroRedundancyOptimizer and optimizers applied
in backward run their ``step`` inside ``Optimizer.profile_hook_step``, which calls the global pre/post
hooks. Steps nest (ZeRO's wraps its local optimizer's; a subclass calling ``super().step()`` fires the hooks
twice): a per-thread depth keeps only the outermost, and names the inner optimizer. While a step runs, the
framework context makes it the parent of the collectives it issues (ZeRO's parameter broadcasts) and sets
their phase to ``optimizer``.
"""

from __future__ import annotations

import sys
import threading
import weakref
from time import perf_counter_ns
from typing import Any

from .. import health
from .. import names as n
from . import context, emit
from . import record as R

_tls = threading.local()
_handles: list[Any] = []
_step_counts: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_listeners: list[Any] = []  # called (optimizer, t_start, t_end) after each outermost step (steps.py)


def install() -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    _handles.append(register_optimizer_step_pre_hook(_pre))
    _handles.append(register_optimizer_step_post_hook(_post))


def remove() -> None:
    for handle in _handles:
        handle.remove()
    _handles.clear()


def _stack_depth() -> int:
    frame, depth = sys._getframe(2), 0
    while frame is not None:
        frame = frame.f_back
        depth += 1
    return depth


def _pre(optimizer, args, kwargs) -> None:
    try:
        depth = getattr(_tls, "depth", 0)
        stack = _stack_depth()
        if depth and stack <= _tls.stack:
            # Not nested in the step we think is running: that step raised, so its post hook never ran.
            context.pop(_tls.token)
            depth = 0
        _tls.depth = depth + 1
        if depth:
            if type(optimizer) is not type(_tls.optimizer):
                _tls.inner = type(optimizer).__name__
            return
        snap = emit.snapshot()
        opened = emit.open_span(snap)
        _tls.optimizer = optimizer
        _tls.inner = None
        _tls.snap = snap
        _tls.opened = opened
        _tls.token = context.push(phase="optimizer", parent=(opened[0], opened[1]))
        _tls.stack = stack
        _tls.t_start = perf_counter_ns()
    except Exception as exc:
        health.error("optimizer", "could not start an optimizer.step record", exc)
    # None: returning a value from a pre-hook would replace the step's arguments.


def _post(optimizer, args, kwargs) -> None:
    try:
        depth = getattr(_tls, "depth", 1) - 1
        _tls.depth = max(depth, 0)
        if depth:
            return
        t_end = perf_counter_ns()
        context.pop(_tls.token)
        count = _step_counts.get(optimizer, 0) + 1
        _step_counts[optimizer] = count
        attrs = describe(optimizer, _tls.inner, count)
        cls = type(optimizer).__name__
        t_start = _tls.t_start
        emit.span_later(
            n.SPAN_OPTIMIZER_STEP,
            t_start,
            t_end,
            attrs,
            _tls.snap,
            _tls.opened,
            then=lambda pipeline: pipeline.framework.observe(
                n.OPTIMIZER_STEP_DURATION, (cls,), (t_end - t_start) / 1e9
            ),
        )
        _tls.optimizer = _tls.snap = None
        for listener in _listeners:
            listener(optimizer, t_start, t_end)
    except Exception as exc:
        health.error("optimizer", "could not finish an optimizer.step record", exc)


_param_counts: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def describe(optimizer: Any, inner: str | None, step_index: int) -> list[tuple[str, Any]]:
    groups = optimizer.param_groups
    cached = _param_counts.get(optimizer)
    shape = tuple(len(g["params"]) for g in groups)
    if cached is None or cached[0] != shape:
        cached = (shape, sum(p.numel() for g in groups for p in g["params"]))
        _param_counts[optimizer] = cached
    attrs: list[tuple[str, Any]] = [
        (n.OPT_CLASS, type(optimizer).__name__),
        (n.OPT_PARAM_GROUPS, len(groups)),
        (n.OPT_PARAMS, cached[1]),
        (n.OPT_STEP, step_index),
        (n.OPT_IN_BACKWARD, R.in_backward()),
    ]
    if inner:
        attrs.append((n.OPT_INNER_CLASS, inner))
    lrs = [_number(g.get("lr")) for g in groups]
    if all(v is not None for v in lrs):
        attrs.append((n.OPT_LR, tuple(lrs)))
    momenta = [_number(g.get("momentum")) for g in groups]
    if all(v is not None for v in momenta) and "momentum" in groups[0]:
        attrs.append((n.OPT_MOMENTUM, tuple(momenta)))
    if "betas" in groups[0]:
        attrs.append((n.OPT_BETAS, tuple(",".join(str(_number(b)) for b in g["betas"]) for g in groups)))
    return attrs


def _number(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(value)  # lr may be a tensor (capturable / fused optimizers)
    except (TypeError, ValueError):
        return None
