"""Small helpers every system sampler shares: labels in the schema's order, counters from raw readings."""

from __future__ import annotations

from typing import Any

from .. import names as n

_BASE = (n.M_RUN, n.M_RANK)


def labels(metric: n.Metric, base: dict[str, str], *values: Any) -> dict[str, str]:
    """``metric``'s labels in the order ``metric.attributes`` lists them.

    Every system metric starts with ``run`` and ``rank``, taken from ``base`` (``rank`` is absent when the
    rank label is switched off); ``values`` fill the rest of ``metric.attributes`` in order.
    """
    assert metric.attributes[:2] == _BASE and len(values) == len(metric.attributes) - 2, metric.name
    out = {k: base[k] for k in _BASE if k in base}
    for key, value in zip(metric.attributes[2:], values):
        out[key] = str(value)
    return out


class Deltas:
    """Counters built from raw cumulative readings: the sum of the increases seen since the first reading.

    A source that resets or wraps (a driver reload, ``reset_accumulated_memory_stats``) adds nothing for
    that interval instead of sending the counter backwards.
    """

    def __init__(self) -> None:
        self._last: dict[Any, float] = {}
        self._total: dict[Any, float] = {}

    def feed(self, key: Any, raw: float) -> float:
        last = self._last.get(key)
        self._last[key] = raw
        total = self._total.get(key, 0)
        if last is not None and raw > last:
            total += raw - last
        self._total[key] = total
        return total
