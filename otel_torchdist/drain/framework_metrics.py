"""Metric updates the framework captures queue as data (capture/record.py's ``update_metrics``, or a framework
span's ``then``), applied on the drain thread to its framework metrics."""

from __future__ import annotations

from ..capture import record as R

_HOW = frozenset((R.SET, R.ADD, R.OBSERVE))


@R.drained_as("metric_updates")
def apply(pipeline, updates: tuple) -> None:
    metrics = pipeline.framework
    for how, metric, labels, value in updates:
        if how in _HOW:
            getattr(metrics, how)(metric, labels, value)
