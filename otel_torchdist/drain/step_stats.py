"""What the drain keeps of a training step until it closes: its collectives' busy intervals (their union is
the step's communication time), count and bytes, and the spans it has admitted."""

from __future__ import annotations


def union_seconds(intervals: list[tuple[int, int]], lo: int, hi: int) -> float:
    """Length of the union of ``intervals`` (ns) clipped to ``[lo, hi]``, in seconds."""
    total = 0
    end = lo
    for a, b in sorted(intervals):  # comparisons, not max() and min(): 8 -> 3 us for a step of 20 collectives
        if a < end:
            a = end
        if b > hi:
            b = hi
        if b > a:
            total += b - a
            end = b
    return total / 1e9


def _merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


class Intervals:
    """A step's in-flight intervals, in bounded memory: a step of a million collectives (a loop that never
    steps an optimizer) must not keep a million pairs. Past ``CAP`` pairs they are merged; if still more
    than half remain, all but the earliest ``HEAD`` (which may start before the step) and the latest
    ``KEEP`` are folded into a total, after which an interval is counted only from where that folded
    region ends. Exact below ``CAP / 2`` disjoint intervals per step; beyond, an interval overlapping the
    folded region (a collective issued long before, completing late) is counted from that region's end."""

    CAP, HEAD, KEEP = 8192, 16, 1024
    __slots__ = ("head", "tail", "folded", "folded_end")

    def __init__(self) -> None:
        self.head: list[tuple[int, int]] = []
        self.tail: list[tuple[int, int]] = []
        self.folded = 0
        self.folded_end: int | None = None

    def __len__(self) -> int:
        return len(self.head) + len(self.tail)

    def append(self, interval: tuple[int, int]) -> None:
        self.tail.append(interval)
        if len(self.tail) >= self.CAP:
            self.compact()

    def _clipped_tail(self) -> list[tuple[int, int]]:
        end = self.folded_end
        if end is None:
            return self.tail
        return [(max(a, end), b) for a, b in self.tail if b > end]

    def compact(self) -> None:
        merged = _merge(self.head + self._clipped_tail())
        self.head = merged[: self.HEAD]
        rest = merged[self.HEAD :]
        if len(rest) <= self.CAP // 2:
            self.tail = rest
            return
        old, self.tail = rest[: -self.KEEP], rest[-self.KEEP :]
        self.folded += sum(b - a for a, b in old)
        self.folded_end = old[-1][1]

    def latest_end(self) -> int:
        ends = [b for _, b in self.tail] + [b for _, b in self.head]
        return max(ends, default=self.folded_end or 0)

    def union_seconds(self, lo: int, hi: int) -> float:
        if self.folded_end is None and not self.head:  # nothing compacted: the common step
            return union_seconds(self.tail, lo, hi)
        return union_seconds(self.head + self._clipped_tail(), lo, hi) + self.folded / 1e9


class StepStats(Intervals):
    """What the drain thread gathers about one step until the step closes (of the records Pipeline.process
    takes; the native fold keeps its own, native/fold.cpp): its collectives' in-flight intervals (it is its
    own Intervals: one object per step), count and bytes, and the spans it admitted under
    ``max_spans_per_step`` (with the parents they point at, which are admitted beyond the cap)."""

    __slots__ = ("collectives", "nbytes", "spans", "parents", "capped", "opened")

    def __init__(self, opened: int = 0) -> None:
        super().__init__()
        self.opened = opened  # its place in the order steps were opened (Pipeline.open_step_stats)
        self.collectives = 0
        self.nbytes = 0
        self.spans = 0
        self.parents: set[int] | None = None  # made by the first admitted span with a parent (traced steps)
        self.capped = False

    def totals(self, lo: int, hi: int, stretch: bool) -> tuple[int, int, float, int]:
        """(collectives, bytes, seconds in flight within ``[lo, hi]``, hi) at the step's close; ``stretch``:
        hi moved to the latest end of its intervals when later (the native store's take_step answers the same
        for the records it folded)."""
        count = self.collectives
        if stretch and count:
            hi = max(hi, self.latest_end())
        return count, self.nbytes, self.union_seconds(lo, hi) if count else 0.0, hi
