"""An optimizer step, on the drain thread: its duration histogram, its span in traced steps (described only
then: learning rates, momenta, betas) and the close of the training step it ended, all from the flat
values capture/optim.py queued."""

from __future__ import annotations

import functools
from typing import Any

from .. import names as n
from ..capture import record as R
from .framework_spans import build

_durations: dict[str, tuple] = {}  # optimizer class -> (FrameworkMetrics, its bound duration histogram)


@R.drained_as("optimizer_timed")
def timed(pipeline, cls: str, t_start: int, t_end: int, close: tuple | None) -> None:
    """An optimizer step of an untraced training step: its duration, then the close of the training step
    it ended, if it did."""
    try:
        metrics = pipeline.framework
        bound = _durations.get(cls)
        if bound is None or bound[0] is not metrics:
            bound = _durations[cls] = (metrics, metrics.histogram(n.OPTIMIZER_STEP_DURATION, (cls,)))
        with metrics.lock:
            bound[1].observe((t_end - t_start) / 1e9)
    finally:
        if close is not None:  # the training step this optimizer step closed (drain/step_close.py)
            R.DRAINED[close[0]](pipeline, *close[1:])


@R.drained_as("optimizer_step")
def finished(
    pipeline, cls, t_start, t_end, close, inner, count, in_backward, ngroups, nparams, user, fw, step, trace, span,
    parent, *hyper
) -> None:
    """An optimizer step of a traced training step: its span, then what ``timed`` does (its duration, the
    close), whatever the span's building did."""
    try:
        attrs = functools.partial(describe, cls, inner, count, in_backward, ngroups, nparams, hyper)
        snap, opened = (user, fw, step), (trace, span, parent)
        build(pipeline, n.SPAN_OPTIMIZER_STEP, t_start, t_end, attrs, snap, opened, None, None, None)
    finally:
        timed(pipeline, cls, t_start, t_end, close)


def describe(
    cls: str, inner: str | None, step_index: int, in_backward: bool, ngroups: int, nparams: int, hyper: tuple
) -> list[tuple[str, Any]]:
    attrs: list[tuple[str, Any]] = [
        (n.OPT_CLASS, cls),
        (n.OPT_PARAM_GROUPS, ngroups),
        (n.OPT_PARAMS, nparams),
        (n.OPT_STEP, step_index),
        (n.OPT_IN_BACKWARD, in_backward),
    ]
    if inner:
        attrs.append((n.OPT_INNER_CLASS, inner))
    lrs = [_number(v) for v in hyper[0::3]]
    if lrs and all(v is not None for v in lrs):
        attrs.append((n.OPT_LR, tuple(lrs)))
    momenta = [_number(v) for v in hyper[1::3]]
    if momenta and all(v is not None for v in momenta):
        attrs.append((n.OPT_MOMENTUM, tuple(momenta)))
    betas = hyper[2::3]
    if betas and all(b is not None for b in betas):
        attrs.append((n.OPT_BETAS, tuple(",".join(str(_number(b)) for b in pair) for pair in betas)))
    return attrs


def _number(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(value)  # lr may be a tensor (capturable / fused optimizers)
    except (TypeError, ValueError):
        return None
