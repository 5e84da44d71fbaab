"""Training steps: one trace per step across all ranks, and each rank's step time split into compute and
time in collectives.

**Steps.** By default an optimizer step closes a training step (the next begins right after it; the
first begins when the rank's identity is known, so it includes set-up). In a loop that fetches batches
from a DataLoader, the step an optimizer step ends stays open until the next batch is fetched, so what
the iteration does after ``optimizer.step()`` (a logged loss all-reduced) is in its step.
``with otel_torchdist.step():`` (or ``step_begin()`` / ``step_end()``) marks steps explicitly, for loops
without an optimizer; once a program does, optimizer steps stop closing steps.

**One trace per step.** Every rank derives step N's trace id, and the id of its root span, from the run
id and N (SHAKE-128, ``step_ids``), so all ranks' spans of step N land in one trace without any
communication: rank 0 emits the root ``train.step``, every rank a ``train.rank_step`` under it holding
that rank's collectives, optimizer step and phases. Sampling is decided from the step alone, the same way on every rank: the
configured ``OTEL_TRACES_SAMPLER`` applied to the trace id, or by default the first
``trace_first_steps`` steps and every ``trace_every_steps``-th. Metrics are never sampled.

**Compute and collective time.** The drain collects, per step, the intervals its collectives were in flight
on this rank (issue to completion: ``drain/step_stats.py``) and closes the step (``drain/step_close.py``);
this module is the training thread's part: finding steps and their ids. Their union is the step's *collective wait*; the rest
is *compute*. Under DDP the all-reduce evens out step times across ranks, so the slow rank is the one
whose collectives wait least for the others: its compute is the largest (``drain/stragglers.py`` compares
ranks).
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import logging
import math
import struct
import threading
import weakref
from collections import deque
from time import perf_counter_ns
from typing import Any

from . import callbacks, health
from .capture import caller
from .capture import record as R
from .capture import step_context as S
from .patching import Patch

_log = logging.getLogger("otel_torchdist")
_RECENT_MASK = len(R.RECENT_STEPS) - 1
_STEP, _RECENT_STEPS = R.STEP, R.RECENT_STEPS  # lists never replaced: bound once for the per-step paths


STEPS_PER_BLOCK = 64
_RANK_MIX, _MASK64 = 0x9E3779B97F4A7C15, (1 << 64) - 1
_streams: dict[tuple[str, int], bytes] = {}
_UNPACK = [struct.Struct(f">{4 * n}Q").unpack_from for n in range(STEPS_PER_BLOCK + 1)]  # n steps' words


def step_ids(key: str, index: int, rank: int) -> tuple[int, int, int]:
    """(trace id, root span id, this rank's step span id) of step ``index``: the same on every rank.

    Steps come in blocks of 64: block ``b = index // 64`` is the SHAKE-128 stream of ``"{key}:steps:{b}"``,
    32 bytes per step at ``32 * (index % 64)``: the trace id (16, big-endian), the root span id (8) and the
    step's rank base (8), which XOR ``rank * 0x9E3779B97F4A7C15`` (mod 2**64, a bijection: no two ranks
    share a step span id) makes this rank's step span id. One hash for 64 steps, where a hash per step and
    per rank cost the drain ~1.3 us a step."""
    block, i = divmod(index, STEPS_PER_BLOCK)
    high, low, root, base = _UNPACK[1](_stream(key, block), 32 * i)
    return (high << 64 | low) or 1, root or 1, (base ^ (rank * _RANK_MIX & _MASK64)) or 1


def block_table(key: str, block: int, rank: int, first: int = 0, count: int = STEPS_PER_BLOCK) -> dict[int, tuple]:
    """``step_ids`` of ``count`` steps of ``block`` from its ``first`` (steps ``64 * block + first`` on), as the
    step tracker's table holds them: step number -> (trace id, this rank's span id, False, root span id), the
    third the sampling decision, left to the caller. One unpacking of their part of the block's stream."""
    words = _UNPACK[count](_stream(key, block), 32 * first)
    mix = rank * _RANK_MIX & _MASK64
    start = STEPS_PER_BLOCK * block + first
    return {
        i: ((high << 64 | low) or 1, (base ^ mix) or 1, False, root or 1)
        for i, high, low, root, base in zip(range(start, start + count), words[0::4], words[1::4], words[2::4], words[3::4])
    }


def _stream(key: str, block: int) -> bytes:
    stream = _streams.get((key, block))
    if stream is None:
        if len(_streams) > 16:
            _streams.clear()
        seed = b"%s:steps:%d" % (key.encode(), block)
        stream = _streams[(key, block)] = hashlib.shake_128(seed).digest(32 * STEPS_PER_BLOCK)
    return stream


class Occurrences:
    """How many times each step number was begun before on this rank, in memory that grows with the
    numbering's jumps, not with the steps: level k holds, as merged intervals, the numbers begun more than k
    times, so each level lies inside the one below and a number's count is found by bisecting the levels.
    A loop counting up extends one interval; an epoch that restarts at 0 opens a level."""

    __slots__ = ("levels", "hint", "top")

    def __init__(self) -> None:
        self.levels: list[list[list[int]]] = []
        self.hint = 0  # the level the previous number went to: the next one usually follows it there
        self.top: list = [_INF, _INF]  # level 0's last interval (numbers begun, the highest in it); none yet

    def add(self, index: int) -> int:
        """Count one more beginning of step ``index``; returns how many there were before it."""
        top = self.top
        if index == top[1] + 1:  # one past every number begun: counting up, the common case
            top[1] = index
            return 0
        k = self._add(index)
        self.top = self.levels[0][-1]
        return k

    def _add(self, index: int) -> int:
        levels = self.levels
        k = self.hint
        if k < len(levels):
            last = levels[k][-1]
            if index == last[1] + 1 and (k == 0 or _holds(levels[k - 1], index)):
                last[1] = index  # counting up: the common case
                return k
        lo, hi = 0, len(levels)
        while lo < hi:
            mid = (lo + hi) // 2
            if _holds(levels[mid], index):
                lo = mid + 1
            else:
                hi = mid
        if lo == len(levels):
            levels.append([[index, index]])
        else:
            intervals = levels[lo]
            self._insert(intervals, bisect.bisect_right(intervals, [index, _INF]) - 1, index)
        self.hint = lo
        return lo

    @staticmethod
    def _insert(intervals: list[list[int]], i: int, index: int) -> None:
        """Put ``index`` (not in ``intervals``; ``i`` the interval before it, or -1) in, merging neighbours."""
        before = intervals[i] if i >= 0 and intervals[i][1] == index - 1 else None
        after = intervals[i + 1] if i + 1 < len(intervals) and intervals[i + 1][0] == index + 1 else None
        if before is not None and after is not None:
            before[1] = after[1]
            del intervals[i + 1]
        elif before is not None:
            before[1] = index
        elif after is not None:
            after[0] = index
        else:
            intervals.insert(i + 1, [index, index])


_INF = float("inf")


def loader_key(iterator: Any) -> tuple:
    """What a batch's DataLoader is known by: its dataset and how it draws batches from it. A training loader
    made anew every epoch keeps its key; an evaluation loader differs by its dataset, its batch size or its
    order (a sequential sampler where training shuffles), even over the training set. Ids of objects the
    loader keeps alive, and types: nothing held."""
    batches = getattr(iterator, "_index_sampler", None)
    if batches is None:
        return (id(iterator),)
    if not hasattr(batches, "sampler") and hasattr(batches, "batch_sampler"):
        batches = batches.batch_sampler  # Accelerate's BatchSamplerShard: the batch sampler it shards
    sampler = getattr(batches, "sampler", batches)
    return (
        id(getattr(iterator, "_dataset", None)), type(batches), getattr(batches, "batch_size", None),
        getattr(batches, "drop_last", None), type(sampler), getattr(sampler, "shuffle", None),
    )  # fmt: skip


def _picked(index: int, occurrence: int, first: int, every: int) -> bool:
    """The library's own choice of traced steps: the first ``first`` steps once (numbering that restarts
    every epoch does not trace every epoch's start), and every ``every``-th."""
    return (index <= first and not occurrence) or (every > 0 and index % every == 0)


def _holds(intervals: list[list[int]], index: int) -> bool:
    i = bisect.bisect_right(intervals, [index, _INF]) - 1
    return i >= 0 and intervals[i][0] <= index <= intervals[i][1]


_TAKEOVER = "takeover"  # what _closes returns (true) when another optimizer takes the lead
TAKEOVER_STEPS = 2  # in a row without the lead: a new phase (the lead replaced), or a WGAN critic (steps follow it)


class _Recent:
    """The last ``size`` step durations and their median. The median each step's close compares with is
    refreshed every ``REFRESH`` steps once the window holds ``2 * REFRESH`` (a sorted window kept up to date
    every step cost the drain more than the rest of the step's close; a median a few steps old tells a slow
    step as well)."""

    REFRESH = 16
    __slots__ = ("order", "_median", "_left")

    def __init__(self, size: int) -> None:
        self.order: deque[float] = deque(maxlen=size)
        self._median: float | None = None
        self._left = 0  # steps until the median is refreshed

    def __len__(self) -> int:
        return len(self.order)

    def append(self, value: float) -> float | None:
        """Add ``value``; returns the median of the window before it, as of at most REFRESH steps ago."""
        left = self._left
        if left:
            self._left = left - 1
        else:
            self._median = self.median()
            if len(self.order) >= 2 * self.REFRESH:
                self._left = self.REFRESH - 1
        self.order.append(value)
        return self._median

    def median(self) -> float | None:
        """The window's median now."""
        values = sorted(self.order)
        k = len(values)
        if not k:
            return None
        mid = k // 2
        return values[mid] if k % 2 else (values[mid - 1] + values[mid]) / 2


class StepTracker:
    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self.trace_key: str | None = None
        self.rank = 0
        self.world = 1
        self.explicit = False
        self.index = 0  # the step's number, as the program gave it (or counted from 1)
        self.serial = 0  # steps begun on this rank: the key of a step inside the library (numbers may repeat)
        self.occurrences = Occurrences()
        self.open = False
        self.t_start = 0
        self.source = "optimizer"
        self.user: dict[str, float] | None = None  # made by the first record() of a step
        self.total: int | None = None
        self.backward: list[tuple[int, int]] = []  # a traced step's backward passes (phase spans)
        # The ids of the coming steps, made by the drain thread ahead (index -> (trace id, rank span id,
        # sampled, root span id) of its first occurrence): the ids and the sampling decision per step off the
        # training thread. Replaced, not cleared, when the run id changes (see prepare_ids).
        self._ids: dict[int, tuple] = {}
        self._ids_top = 0  # the highest step number whose ids the table was given
        self._prepared = (0, 0)  # (index, serial) at the last prepare_ids
        self.deep: Any = None
        self.pipeline: Any = None
        self.exchange: Any = None
        self.roots: Any = None  # step_roots.StepRoots: the cross-rank root's times (world > 1)
        self.root_rank = 0  # the rank that emits the steps' roots: the lowest that traces (runtime/ranks.py)
        self.setup: tuple[int, float, float, float] | None = None  # the set-up step: number, duration, compute, wait
        # A loop that fetches its batches from a DataLoader: an optimizer step leaves its training step open
        # (pending: its end, and whether it was warm-up) until the next batch is fetched, so that what the
        # iteration does after optimizer.step() (a logged loss all-reduced) stays in its step. Only where
        # the two last iterations each fetched a batch: a batch read once (a peek at a shape), or a batch
        # used for several optimizer steps, would keep steps open over the next iteration.
        self.pending: tuple[int, bool] | None = None
        self._fetched = False  # a batch since the last optimizer step
        self._fetched_before = False  # a batch between the two optimizer steps before
        self.gap = False  # no step open since another loader's batch closed one (an evaluation)
        self._setup_index: int | None = None  # the set-up step's number, when explicit steps ended it (_ids_of)
        self.loader: tuple | None = None  # the training loader (on_fetch's source of the last optimizer step's batch)
        self._source: tuple | None = None  # the loader (loader_key) of the last batch, and when its run of batches began
        self._source_t = 0
        self._lock = threading.RLock()
        self._recent = _Recent(101)
        self._bound: tuple | None = None  # the step series, bound in the pipeline's FrameworkMetrics (drain/step_close.py)
        self._last_slow_warning = -10**9
        self._began_in: Any = None  # the caller's context the last step began in (_around)
        # The optimizer whose steps close training steps, and what the others did since its last (_closes).
        self._lead: Any = None  # weak reference
        self._settled = False
        self._last_other: Any = None  # weak reference
        self._others: dict[int, int] = {}
        # The lead (weak reference) while it is settled and no other optimizer stepped since its last step:
        # its next step closes the training step without _closes's call. None otherwise.
        self._steady: Any = None

    # -------------------------------------------------------------------------------- lifecycle
    def attach(self, pipeline: Any, trace_key: str, rank: int, world: int) -> None:
        """``trace_key``: the run id, with the elastic attempt when there is one (Identity.trace_key)."""
        with self._lock:
            self.pipeline = pipeline
            pipeline.step_tracker = self
            self.trace_key, self.rank, self.world = trace_key, rank, world
            self._ids, self._ids_top, self._prepared = {}, 0, (0, 0)
            if not self.explicit and not self.open:
                self.begin(source="optimizer")

    def close(self) -> None:
        with self._lock:
            self._settle()
            if self.open:
                self.end(final=True)

    def fail(self, etype: str, message: str) -> None:
        """An exception is ending the program: close the open step as failed (its span says why)."""
        with self._lock:
            self.pending = None  # after its optimizer step, still its iteration: that step failed
            if self.open:
                self.end(final=True, error=(etype, message))

    def sampled(self, index: int, trace_id: int, occurrence: int = 0) -> bool:
        rule = self._rule()
        if rule is not None:
            return _picked(index, occurrence, *rule)
        pipeline = self.pipeline
        if not pipeline.traced:
            return False
        sampler = pipeline.sampler
        if not sampler.narrows:
            return sampler.root(trace_id)  # the library's own exporters: OTEL_TRACES_SAMPLER picks the steps
        # Through a provider, its sampler may drop a step the library picked (ProviderSampler).
        return _picked(index, occurrence, self.cfg.trace_first_steps, self.cfg.trace_every_steps) and sampler.root(trace_id)

    def _rule(self) -> tuple[int, int] | None:
        """(first steps, every n-th step) when the library's own choice of steps alone decides which are
        traced; None when tracing is off or a sampler replaces or narrows that choice (``sampled``)."""
        pipeline = self.pipeline
        if pipeline is not None:
            if not pipeline.traced:
                return None
            sampler = pipeline.sampler
            if sampler is not None and (sampler.narrows or self.cfg.traces_sampler is not None):
                return None
        return self.cfg.trace_first_steps, self.cfg.trace_every_steps

    def begin(
        self, index: int | None = None, source: str = "explicit", t_start: int | None = None, parent: tuple | None = None
    ) -> int:
        """``parent``: (trace id, span id, sampled) of the caller's span around an explicit step, whose child the
        rank's step span then is (in the caller's trace, linked to the step's shared root)."""
        with self._lock:
            if self.pending is not None and source == "explicit":
                self._settle(perf_counter_ns())  # explicit steps take over from an iteration's open step
            self.gap = False
            took_over = self.open and source == "explicit" and self.source == "optimizer" and (index is None or int(index) == self.index)
            if took_over:
                # An explicit step numbered like the open optimizer-closed one (or not numbered) would share
                # its trace and span ids: what that one holds so far (set-up before the loop) becomes part of
                # the explicit step, which keeps its start, so that the set-up's spans lie inside their
                # parent. (Unnumbered, it ended that one and began at 2: step 1 never existed.)
                self.source = source
                index = self.index
            else:
                if self.open:
                    # Switching to explicit steps: the open optimizer-closed step never got its optimizer step.
                    if source == "explicit" and self.source == "optimizer" and self.serial == 1:
                        self._setup_index = self.index  # the set-up step: its number's first traced use is the loop's
                    self._end(perf_counter_ns(), source == "explicit" and self.source == "optimizer", None, False)
                index = self.index + 1 if index is None else int(index)
                index = self._begin(index, source, perf_counter_ns() if t_start is None else t_start)
            ctx = R.STEP[0]
            if took_over and ctx is not None:
                # The explicit step begins here, in the caller's context of now (the set-up step it takes
                # over began before the program's spans, at the first process group).
                ctx = ctx[: S.AROUND] + (self._around(),) + ctx[S.AROUND + 1 :]
                R.STEP[0] = R.RECENT_STEPS[ctx[S.SERIAL] & _RECENT_MASK] = ctx
            if parent is not None and ctx is not None:
                # Under the caller's span; it still names the shared root (a link).
                ctx = S.under(ctx, *parent, took_over)
                R.STEP[0] = R.RECENT_STEPS[ctx[S.SERIAL] & _RECENT_MASK] = ctx
            return index

    def _begin(self, index: int, source: str, t_start: int) -> int:
        """begin() with the lock held and every argument given (the optimizer's path calls it per step)."""
        self.index = index
        self.source = source
        self.t_start = t_start
        self.user = None
        if self.backward:
            self.backward = []
        self.open = True
        if self.trace_key is None:
            R.STEP[0] = None  # identity not known yet: no shared trace possible
            R.SLOTS[0] = 0
            return index
        self.serial = serial = self.serial + 1
        occurrence = self.occurrences.add(index)
        ids = self._ids.pop(index, None) if not occurrence else None
        if ids is None:
            ids = self._ids_of(index, occurrence)
        trace = ids[0]
        # capture/step_context.py's fields, in one literal (every step)
        _STEP[0] = _RECENT_STEPS[serial & _RECENT_MASK] = (
            serial, trace, ids[1], ids[2], ids[3], None, trace, index, occurrence, self._around()
        )  # fmt: skip
        R.SLOTS[0] = serial + 1  # 0 is "no step" (the native capture reads it)
        return index

    def _around(self) -> Any:
        """The step's AROUND (capture/step_context.py): the caller's context, where the last step began in it
        too (a span around the loop, a job's); None for a span that began since (an iteration's: a step that
        begins inside it, at its optimizer step or its batch, leaves the rest of the iteration to it)."""
        current = caller.get_current() or None
        began_in, self._began_in = self._began_in, current
        return current if current is not None and current is began_in else None

    def _ids_of(self, index: int, occurrence: int) -> tuple[int, int, bool, int]:
        """(trace id, this rank's span id, sampled, root span id) of the ``occurrence``-th repeat of step
        number ``index``: every rank that numbers its steps alike derives the same, and no two steps of a
        run share them, however the program numbers its steps (0- or 1-based, restarting every epoch,
        evaluation steps between training steps, explicit steps after the set-up one)."""
        key = self.trace_key if not occurrence else f"{self.trace_key}#{occurrence}"
        trace, root, rank_span = step_ids(key, index, self.rank)
        # A 0-based loop's step 1 repeats the number of the set-up step before it: sampled as a first step
        sampled_as = 0 if occurrence == 1 and index == self._setup_index else occurrence
        return (trace, rank_span, self.sampled(index, trace, sampled_as), root)

    def end(
        self,
        t_end: int | None = None,
        final: bool = False,
        error: tuple[str, str] | None = None,
        warmup: bool = False,
    ) -> None:
        """Close the open step. ``final``: an optimizer-closed step that ends without its optimizer step
        (at exit, or when explicit steps take over) is traced but not counted as a step. ``warmup``: an
        optimizer's first step (lazy initialisation, state allocation) is never called slow."""
        with self._lock:
            if self.open:
                self._end(perf_counter_ns() if t_end is None else t_end, final, error, warmup)

    def _end(self, t_end: int, final: bool, error: tuple[str, str] | None, warmup: bool) -> None:
        """end() of an open step, with the lock held and every argument given."""
        close = self._closing(t_end, final, error, warmup)
        if close is not None:
            R.queue(close)

    def _closing(
        self, t_end: int, final: bool, error: tuple[str, str] | None, warmup: bool, stretch: bool = False
    ) -> tuple | None:
        """Mark the open step closed (lock held); returns the deferred entry of its close for the drain
        (see record.queue), or None when there is nothing to build (identity unknown, not attached)."""
        ctx = _STEP[0]
        _STEP[0] = None
        R.SLOTS[0] = 0
        self.open = False
        if ctx is None or self.pipeline is None:
            return None
        user = self.user
        if user is not None:
            user = tuple(user.get(key) for key in USER_KEYS)
        # Flat values only (the step context and the intervals are tuples of numbers): nothing for the
        # garbage collector to follow while the step waits for the drain.
        backward = self.backward
        return (
            _CLOSE_STEP, ctx, self.t_start, t_end, self.source, user, tuple(backward) if backward else (), final, error,
            warmup, stretch,
        )  # fmt: skip

    def on_optimizer_step(self, first: bool, t_start: int, t_end: int, in_backward: bool, optimizer: Any = None) -> tuple | None:
        """An optimizer step ended: it closes the current training step (unless steps are explicit) and
        opens the next. ``first``: that optimizer's first step, whose step is warm-up. Returns the closed
        step's deferred entry, which the optimizer capture queues inside its own. With several optimizers
        stepping each iteration, only one closes steps (see ``_closes``)."""
        if self.explicit or in_backward:  # optimizer-in-backward steps each parameter, not the loop
            return None
        steady = self._steady
        # The settled lead stepping with no other optimizer since its last step (the common loop) closes the
        # step: _closes's answer, without its call, once per step.
        if optimizer is not None and (steady is None or steady() is not optimizer):
            closes = self._closes(optimizer)
            if not closes:
                return None
            first = first or closes is _TAKEOVER  # a new phase's first step holds its set-up: warm-up too
        lock = self._lock
        lock.acquire()  # not `with`: its protocol costs more than the two calls, once per training step
        try:
            fetched, self._fetched = self._fetched, False
            defer, self._fetched_before = fetched and self._fetched_before, fetched
            if fetched:
                self.loader = self._source  # the training loader: the one this iteration's batch came from
            if self.gap:
                # No step open since another loader's batch (on_fetch): this iteration's batches came from a
                # loader other than the last training one (made anew for an epoch), or it fetched none after
                # an evaluation. Its step runs from that loader's first batch, or is its optimizer step.
                self.gap = False
                self._begin(self.index + 1, "optimizer", self._source_t if fetched else t_start)
            if self.pending is not None:
                # An optimizer step's step still open, and no batch since: the loop stopped fetching. It ends
                # here (what ran since is in it).
                first = first or self.pending[1]
                self.pending = None
            elif defer:
                # A loop fetching a batch per iteration (this one and the last): the iteration goes on until the
                # next batch is fetched (on_fetch closes its step then).
                self.pending = (t_end, first)
                return None
            close = self._closing(t_end, False, None, first) if self.open else None
            self._begin(self.index + 1, "optimizer", t_end)
        finally:
            lock.release()
        return close

    def on_fetch(self, t: int, iterator: Any = None) -> None:
        """A DataLoader handed out a batch whose fetch began at ``t`` (training thread): the iteration an
        optimizer step ended is over, its step closes at ``t``, and the next begins there when the batch
        comes from the training loader. A batch of another loader (an evaluation between optimizer steps)
        begins none: evaluation is no training step, until the training loader's next batch."""
        source = loader_key(iterator)
        if source != self._source:
            self._source, self._source_t = source, t
        self._fetched = True
        if self.explicit or self.pending is None and (not self.gap or source != self.loader):
            return
        lock = self._lock
        lock.acquire()
        try:
            pending, self.pending = self.pending, None
            close = None
            if pending is not None and self.open:
                close = self._closing(t, False, None, pending[1])
                self.gap = True
            if self.gap and source == self.loader:
                self.gap = False
                self._begin(self.index + 1, "optimizer", t)
        finally:
            lock.release()
        if close is not None:
            R.queue(close)

    def _settle(self, final_t: int | None = None) -> None:
        """An optimizer step's training step still open (waiting for the next fetch) ends now, counted, as
        explicit steps take over or the capture ends (lock held). At the end it is closed at its optimizer
        step's end, stretched over the collectives it issued since (close_step), not over what the program
        did after its last iteration."""
        pending, self.pending = self.pending, None
        if pending is None or not self.open:
            return
        t_end = pending[0] if final_t is None else final_t
        close = self._closing(t_end, False, None, pending[1], stretch=final_t is None)
        if close is not None:
            R.queue(close)

    def _closes(self, optimizer: Any) -> Any:
        closes = self._lead_closes(optimizer)
        self._steady = self._lead if self._settled and self._last_other is None and not self._others else None
        return closes

    def _lead_closes(self, optimizer: Any) -> Any:
        """Whether this optimizer's step ends the training step: the *lead*'s does, so that a GAN's two
        optimizers (or parameter groups split over two) do not count each iteration twice. The first
        optimizer to step leads until it steps again: if others stepped in between, the iteration ends with
        the last of them, which leads from then on. Another optimizer that steps TAKEOVER_STEPS times while
        the lead does not (the lead was replaced) takes over, as does any once the lead is collected."""
        lead = self._lead() if self._lead is not None else None
        if lead is None:
            self._lead, self._settled, self._last_other = weakref.ref(optimizer), False, None
            self._others.clear()
            return True
        if optimizer is lead:
            other = self._last_other() if self._last_other is not None else None
            self._last_other = None
            self._others.clear()
            if not self._settled:
                self._settled = True
                if other is not None:
                    self._lead = weakref.ref(other)  # the iteration ends with the other optimizer's step
                    return False
            return True
        self._last_other = weakref.ref(optimizer)
        count = self._others[id(optimizer)] = self._others.get(id(optimizer), 0) + 1
        if count < TAKEOVER_STEPS:
            return False
        self._lead, self._settled, self._last_other = weakref.ref(optimizer), True, None
        self._others.clear()
        return _TAKEOVER

    def prepare_ids(self) -> None:
        """On the drain thread: make the contexts of the coming steps, so that begin() finds them.

        The drain calls it after each round that closed steps. Counting up, the table is kept at least
        IDS_AHEAD steps ahead, from the highest number made so far, filled to the end of a SHAKE block
        (``step_ids``) at a time: one unpacking of 64 steps' ids, where a step at a time cost each step's
        close four calls. Numbers that jump or go down (evaluation steps numbered apart) refill it only once
        half of it is behind them."""
        table = self._ids  # before the run id: attach() sets the run id, then a new table
        index, serial = self.index, self.serial
        seen_index, seen_serial = self._prepared
        self._prepared = (index, serial)
        last = index + IDS_AHEAD
        if self.trace_key is None or last in table:
            return
        top = self._ids_top
        # Counting up past the table's top: the numbers went up by as many as the steps begun since the last
        # call (a drain round may come many steps later, the training thread past the table), or the table
        # is still ahead of them.
        if top < last and (
            (seen_index < index and index - seen_index == serial - seen_serial) or (index < top and top in table)
        ):
            end = last | (STEPS_PER_BLOCK - 1)  # the end of last's block
            self._fill(max(top, index) + 1, end)
            self._ids_top = end
            return
        if index + IDS_AHEAD // 2 in table:
            return
        # list() copies the keys in C: a step begun meanwhile on the training thread pops from the table,
        # which would break an iteration over the dict itself.
        for stale in [k for k in list(table) if k <= index]:  # numbers an explicit step skipped
            table.pop(stale, None)
        # Past every number made: a jump. Only a few ahead, until the numbers are seen to count up (steps
        # numbered by samples jump every step, and a full table each time would be IDS_AHEAD ids a step).
        end = index + IDS_AFTER_JUMP if index >= top else last
        run = None  # the first of the numbers missing since the last one found
        for i in range(index + 1, end + 2):
            if i <= end and i not in table:
                if run is None:
                    run = i
            elif run is not None:
                self._fill(run, i - 1)  # a run of missing numbers, one unpacking per block
                run = None
        self._ids_top = max(top, end)

    def _fill(self, first: int, last: int) -> None:
        """The table's entries of steps ``first`` to ``last`` (their first occurrence), as _ids_of makes them."""
        table, key, rank = self._ids, self.trace_key, self.rank
        rule = self._rule()
        for block in range(first // STEPS_PER_BLOCK, last // STEPS_PER_BLOCK + 1):
            lo = max(first, block * STEPS_PER_BLOCK)
            hi = min(last, block * STEPS_PER_BLOCK + STEPS_PER_BLOCK - 1)
            entries = block_table(key, block, rank, lo - block * STEPS_PER_BLOCK, hi - lo + 1)
            if rule is None:
                traced = [i for i, entry in entries.items() if self.sampled(i, entry[0], 0)]
            else:  # _picked of first occurrences: the first steps, and the multiples of every
                picked_first, every = rule
                traced = list(range(lo, min(hi, picked_first) + 1))
                if every > 0:
                    start = max(lo, picked_first + 1)
                    traced += range(start + -start % every, hi + 1, every)
            for i in traced:
                trace, rank_span, _, root = entries[i]
                entries[i] = (trace, rank_span, True, root)
            table.update(entries)

    def record(self, **values: float | None) -> None:
        with self._lock:
            for key, value in values.items():
                if value is None:
                    continue
                value = float(value)
                if key == "loss" and not math.isfinite(value):
                    callbacks.fire("nonfinite_loss", callbacks.NonFiniteLossEvent(self.rank, self.index, value))
                if self.user is None:
                    self.user = {}
                if key in ("samples", "tokens"):
                    self.user[key] = self.user.get(key, 0.0) + value
                else:
                    self.user[key] = value

    def note_backward(self, t_start: int, t_end: int) -> None:
        if self.open:
            self.backward.append((t_start, t_end))


IDS_AHEAD = 512  # steps whose contexts the drain keeps ready: a drain interval's steps, for steps down to ~1 ms
IDS_AFTER_JUMP = 8  # after a jump in the numbering, until it is seen to count up
USER_KEYS = ("loss", "learning_rate", "samples", "tokens")
_CLOSE_STEP = R.reserve("close_step")  # drain/step_close.py's close_step


# ------------------------------------------------------------------------------------------- backward
TRACKER: list[StepTracker | None] = [None]


def _wrap_backward(orig):
    def backward(*args, **kwargs):
        tracker = TRACKER[0]
        step = R.STEP[0]
        if tracker is None or step is None or not step[S.SAMPLED]:  # backward phases are spans: traced steps only
            return orig(*args, **kwargs)
        t0 = perf_counter_ns()
        try:
            return orig(*args, **kwargs)
        finally:
            try:
                tracker.note_backward(t0, perf_counter_ns())
            except Exception as exc:
                health.error("steps", "could not time a backward pass", exc)

    backward.__wrapped__ = orig
    backward.__doc__ = orig.__doc__
    backward.__name__ = orig.__name__
    return backward


def _wrap_scaler_step(orig):
    """``GradScaler.step``: a step it skips calls no optimizer hook, yet ends the iteration's training step."""
    from torch.compiler import is_compiling

    from .capture import optim

    @functools.wraps(orig)
    def step(self, optimizer, *args, **kwargs):
        if TRACKER[0] is None or is_compiling():
            return orig(self, optimizer, *args, **kwargs)
        before, t0 = optim.steps_ended(), perf_counter_ns()
        result = orig(self, optimizer, *args, **kwargs)
        try:
            if optim.steps_ended() == before:
                optim.skipped(optimizer, t0)
        except Exception as exc:
            health.error("steps", "could not close the training step of a step GradScaler skipped", exc)
        return result

    return step


def patches() -> list[Patch]:
    import torch.autograd
    from torch.amp import grad_scaler

    return [Patch(torch.autograd, "backward", _wrap_backward), Patch(grad_scaler.GradScaler, "step", _wrap_scaler_step)]
