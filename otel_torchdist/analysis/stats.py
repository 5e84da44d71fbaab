"""Small streaming statistics: quantiles in constant memory, histogram quantiles, interval unions."""

from __future__ import annotations

import math

from .. import bandwidth as bw


class Sketch:
    """Quantiles of a stream of non-negative values in constant memory, within 1% of the true value.

    Values fall in logarithmic buckets ``(g^(i-1), g^i]`` with ``g = 1.02``; a quantile is the bucket of the
    nearest-rank sample, reported as ``2 g^i / (g + 1)``, at most ``(g-1)/(g+1)`` (under 1%) from any value
    in the bucket (the scheme of DDSketch). Half a million durations from 1 µs to 10 min use about 700 buckets.
    """

    GAMMA = 1.02
    _INV_LOG = 1.0 / math.log(GAMMA)
    __slots__ = ("buckets", "zeros", "count", "min", "max")

    def __init__(self) -> None:
        self.buckets: dict[int, int] = {}
        self.zeros = 0
        self.count = 0
        self.min = math.inf
        self.max = -math.inf

    def add(self, x: float) -> None:
        self.count += 1
        if x < self.min:
            self.min = x
        if x > self.max:
            self.max = x
        if x <= 1e-12:
            self.zeros += 1
            return
        i = math.ceil(math.log(x) * self._INV_LOG)
        self.buckets[i] = self.buckets.get(i, 0) + 1

    def merge(self, other: Sketch) -> None:
        self.count += other.count
        self.zeros += other.zeros
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)
        for i, c in other.buckets.items():
            self.buckets[i] = self.buckets.get(i, 0) + c

    def quantile(self, q: float) -> float | None:
        """The nearest-rank ``q`` quantile (0 < q <= 1), or None when empty."""
        if self.count == 0:
            return None
        rank = max(1, math.ceil(q * self.count))
        if rank <= self.zeros:
            return 0.0
        cum = self.zeros
        for i in sorted(self.buckets):
            cum += self.buckets[i]
            if cum >= rank:
                value = 2.0 * self.GAMMA**i / (self.GAMMA + 1.0)
                return min(max(value, self.min), self.max)
        return self.max


def histogram_quantile(q: float, bounds: tuple[float, ...], counts: tuple[int, ...] | list[int]) -> float | None:
    """Prometheus' ``histogram_quantile`` over explicit-bound buckets (linear inside a bucket)."""
    total = sum(counts)
    if total == 0 or not bounds:
        return None
    rank = q * total
    cum = 0
    for i, c in enumerate(counts):
        if cum + c >= rank and c > 0:
            if i >= len(bounds):  # the +Inf bucket: the highest finite bound, as Prometheus does
                return bounds[-1]
            lower = bounds[i - 1] if i > 0 else 0.0
            return lower + (bounds[i] - lower) * (rank - cum) / c
        cum += c
    return bounds[-1]


def kind_of(op: str) -> str | None:
    """nccl-tests family of a collective by its API name, for metrics without spans to say it."""
    name = op.lower()
    for needle, kind in (
        ("barrier", bw.BARRIER),
        ("all_reduce", bw.ALL_REDUCE),
        ("allreduce", bw.ALL_REDUCE),
        ("reduce_scatter", bw.REDUCE_SCATTER),
        ("all_gather", bw.ALL_GATHER),
        ("allgather", bw.ALL_GATHER),
        ("all_to_all", bw.ALL_TO_ALL),
        ("permute", bw.PERMUTE),
        ("broadcast", bw.BROADCAST),
        ("send", bw.SEND_RECV),
        ("recv", bw.SEND_RECV),
        ("scatter", bw.SCATTER),
        ("gather", bw.GATHER),
        ("reduce", bw.REDUCE),
    ):
        if needle in name:
            return kind
    return None


def bus_factor(kind: str | None, n: int | None) -> float | None:
    if kind is None or not n or n <= 0:
        return None
    try:
        return bw.bus_factor(kind, n)
    except ValueError:
        return None


def bandwidth(kind: str | None, n: int | None, total_bytes: float, total_s: float) -> tuple[float | None, float | None]:
    """(algbw, busbw) in GB/s, bytes-weighted: ``sum(S) / sum(t)``, times nccl-tests' bus factor."""
    if total_bytes <= 0 or total_s <= 0 or kind == bw.BARRIER:
        return None, None
    alg = total_bytes / total_s / 1e9
    factor = bus_factor(kind, n)
    return alg, (alg * factor if factor is not None else None)


def fmt_ranks(ranks: list[int] | tuple[int, ...] | set[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2, 5``."""
    out = []
    items = sorted(set(ranks))
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        out.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return ", ".join(out)
