"""GPU-true completion for NCCL: ProcessGroupNCCL's on-completion hook, joined on sequence number.

On NCCL a collective call returns once the kernel is enqueued, and even its future completes at enqueue,
so CPU timestamps say nothing about when the GPU finished. With collective timing enabled
(``pg._enable_collectives_timing()``, the same switch as ``TORCH_NCCL_ENABLE_TIMING``) ProcessGroupNCCL
calls a registered hook from its watchdog thread with a ``WorkInfo``: the sequence number, the
completion time the watchdog observed and ``active_duration`` measured by CUDA events. We join that on the
group's sequence number (what ``_get_sequence_number_for_group()`` returned right after issue).

The hook is a private, deprecated-in-favour-of-Flight-Recorder API, so everything here is feature-detected;
without it records say ``end_source="enqueue"``. Point-to-point work uses a separate sequence that Python
cannot read, so send/recv on NCCL stay enqueue-timed.

That separate count can give a batch of point-to-point ops (``batch_isend_irecv``, one ``COALESCED`` work)
the number of a collective of the same group, and WorkInfo does not say a COALESCED work is
point-to-point. Its ``time_started`` tells them apart: a work is created inside the call that issues it, so
a report whose start lies outside its record's call window (from the call to the record's filing) is
another work's. That stamp is trusted once a collective's report has been seen to start inside its own
call (the clocks agree); if one ever starts outside, the check is off for the process (and a warning says
so), and reports join on number alone, as before.

Two properties of that API shape this module (seen on an H200, torch 2.11, NCCL 2.28):

- The hook thread asks every completed work for its CUDA-event duration, and a work issued before timing
  was enabled throws there: ProcessGroupNCCL aborts its communicators and the training dies. So a group
  that already issued a collective when we first meet it (``instrument()`` called mid-training) is never
  hooked; its records stay enqueue-timed, and a warning says why.
- A group takes one hook for its life and it cannot be removed: a group hooked by an earlier
  ``instrument()`` is re-used (its timing has been on since), and ``uninstrument()`` only empties the slot.
"""

from __future__ import annotations

import logging
import time
import weakref
from datetime import datetime, timedelta
from time import perf_counter_ns
from typing import Any

import torch

from .. import health
from .. import names as n
from . import ddp_native, groups
from . import record as R
from .record import complete

_log = logging.getLogger(__name__)


# process group -> [GroupInfo or None, (native module, hook id) or None]: the slot the group's one hook
# reads (a C++ hook reads its copy of the group id, kept in step by _point)
_hooked: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# disabled_captures=("nccl_completion",): groups are left enqueue-timed (the hook costs each collective
# tens of microseconds of the training thread: benchmarks/gpu_collective_cost.py)
_ENABLED = [True]
# nccl_hook="native": the hook in C++ (native/timed_group.cpp), which runs no Python on torch's hook thread;
# [1]: compile the native part when missing (native="build")
_NATIVE = [False, False]
# the native module while any group's hook is in C++: the drain takes their completions (take_completions)
_native_hooks: list[Any] = [None]


def enable(on: bool, native: bool = False, build: bool = False) -> None:
    """Whether groups met from now on get the completion hook, and in C++ (``native``; compiled first when
    missing with ``build``) or Python. Groups hooked by an earlier instrument() of this process are
    pointed at this one (their one hook reads this instrumentation's group), or left enqueue-timed."""
    _ENABLED[0] = on
    _NATIVE[0], _NATIVE[1] = native, build
    for pg, slot in list(_hooked.items()):
        gi = groups._groups.get(pg)
        if gi is None:
            continue
        if on:
            _point(slot, gi)
            gi.completion = groups.COMPLETION_NCCL_HOOK
        else:
            gi.completion = groups.COMPLETION_ENQUEUE


def _point(slot: list, gi: groups.GroupInfo | None) -> None:
    slot[0] = gi
    if slot[1] is not None:
        mod, hook = slot[1]
        mod.set_hook_group(hook, gi.gid if gi is not None else -1)


def _native_module() -> Any:
    from .. import native

    try:
        mod = native.load(build=_NATIVE[1])
    except Exception as exc:
        health.error("completion", "the native part could not be loaded for the NCCL completion hook; it runs in Python", exc)
        return None
    if mod is None:
        health.warn_once("nccl-hook-native", "nccl_hook=native needs the native part (otel-torchdist build-native); the NCCL completion hook runs in Python")
    return mod


def attach(gi: groups.GroupInfo) -> None:
    if "nccl" not in gi.backend or not _ENABLED[0]:
        return
    pg = gi.pg
    slot = _hooked.get(pg)
    if slot is not None:
        _point(slot, gi)
        gi.completion = groups.COMPLETION_NCCL_HOOK
        return
    register = getattr(pg, "_register_on_completion_hook", None)
    enable = getattr(pg, "_enable_collectives_timing", None)
    if register is None or enable is None:
        health.warn_once("nccl-hook-missing", "this torch has no NCCL completion hook; NCCL records are enqueue-timed")
        return
    if gi.last_started() > 0:
        health.warn_once(
            "nccl-hook-late-" + gi.name,
            "process group %s ran collectives before instrument(): its NCCL records are enqueue-timed (torch's "
            "completion hook cannot be added to a group with untimed work; call instrument() before the first "
            "collective for GPU-true times)",
            gi.label,
        )
        return
    slot: list = [gi, None]
    mod = _native_module() if _NATIVE[0] else None
    try:
        enable()
        if mod is not None:
            try:
                slot[1] = (mod, mod.hook_group(pg, gi.gid))
                _native_hooks[0] = mod
            except Exception as exc:  # torch registered nothing: the Python hook instead
                health.warn_once("nccl-hook-native-failed", "the NCCL completion hook could not run in C++ (%s); it runs in Python", exc)
        if slot[1] is None:
            register(lambda info, slot=slot: _on_complete(slot[0], info))
    except Exception as exc:
        health.warn_once(
            "nccl-hook-" + gi.name,
            "could not register the NCCL completion hook on group %s (%s); its records are enqueue-timed",
            gi.label,
            exc,
        )
        return
    _hooked[pg] = slot
    gi.completion = groups.COMPLETION_NCCL_HOOK


def _ns(span: timedelta) -> int:
    """A timedelta in nanoseconds, exactly (it holds microseconds; total_seconds() * 1e9 can land 1 ns under)."""
    return (span.days * 86_400 + span.seconds) * 1_000_000_000 + span.microseconds * 1_000


def _stamp(when: Any, now: int) -> int | None:
    """A WorkInfo time on the records' clock (perf_counter_ns: CLOCK_MONOTONIC), None when it is not stamped
    or ahead of ``now``. torch's WorkInfo times are steady_clock time points, which pybind11 hands over as a
    timedelta since that clock's epoch (libstdc++'s steady_clock reads CLOCK_MONOTONIC: the records' own
    clock, truncated to the microsecond); older torch's were system_clock times, a datetime, moved by the
    two clocks' difference now."""
    if isinstance(when, timedelta):
        t = _ns(when)
    elif isinstance(when, datetime):
        t = now - (time.time_ns() - int(when.timestamp() * 1e9))
    elif isinstance(when, (int, float)):
        t = now - (time.time_ns() - int(when))
    else:
        return None
    return t if 0 < t <= now else None


def _to_perf_ns(when: Any) -> int:
    """A WorkInfo end time on the records' clock; not stamped, or ahead of the clock: now, when the hook runs
    (which may be well after, once it has the GIL)."""
    now = perf_counter_ns()
    t = _stamp(when, now)
    return now if t is None else t


# A send/recv's WorkInfo.seq is ProcessGroupNCCL's point-to-point count, not the collectives' one the
# records carry: never join those. A batch of them completes as one COALESCED work on that count too:
# see _fits.
_P2P_OPS = frozenset(("SEND", "RECV", "RECVANYSOURCE"))
_COALESCED = "COALESCED"
_EARLY_KEPT = 64  # reports of works never recorded (issued around the wrappers) must not pile up
# Whether WorkInfo.time_started is trusted to tell a report's work from another with its number (the
# module's docstring): 0 not yet known, 1 a collective's report started inside its call, -1 one did not.
_START_CHECK = [0]
_TRUNCATED_NS = 1_000  # torch's stamp reaches Python truncated to the microsecond
_NO_END = 1 << 62


def _fits(rec: list, filed: int, t_start: int | None, coalesced: bool) -> bool:
    """Whether a report of ``rec``'s number, of a work started at ``t_start``, is ``rec``'s (filed at
    ``filed``). Only a COALESCED report can be another's: a point-to-point batch numbered on its own count."""
    if t_start is None or _START_CHECK[0] < 0:
        return True
    inside = rec[R.T_START] - _TRUNCATED_NS <= t_start <= filed
    if coalesced:
        return inside or _START_CHECK[0] == 0
    if inside:
        _START_CHECK[0] = 1
    else:
        _START_CHECK[0] = -1
        health.warn_once(
            "nccl-hook-start",
            "an NCCL completion report's work started outside its call (WorkInfo.time_started is not on the "
            "records' clock with this torch): a batch_isend_irecv's report may end a collective of the same "
            "number early (%s number %s: called %+d us .. %+d us from its work's start)",
            rec[R.OP],
            rec[R.SEQ],
            (rec[R.T_START] - t_start) // 1000,
            (filed - t_start) // 1000 if filed != _NO_END else 0,
        )
    return True


_is_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)  # None: a build without CUDA


def _stream_capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (False where CUDA cannot say)."""
    try:
        return _is_capturing is not None and bool(_is_capturing())
    except Exception:
        return False


def expect(gi: groups.GroupInfo, rec: list, in_block: bool = False) -> None:
    """``rec`` was just issued: its completion comes from the hook (or already came). ``in_block``: issued
    inside a coalescing block, whose one work is made at the block's end (its call window has no end)."""
    if _stream_capturing():
        # ProcessGroupNCCL hands its watchdog no work of a CUDA graph's capture: no report will come (and a
        # replay runs no Python at all, so it is not recorded)
        health.warn_once(
            "nccl-graph-capture",
            "NCCL collectives captured into a CUDA graph are recorded once, at capture, ended at enqueue; "
            "the graph's replays are not recorded",
        )
        complete(rec, n.END_ENQUEUE)
        return
    seq = rec[R.SEQ]
    with gi.lock:
        filed = _NO_END if in_block else perf_counter_ns()
        shared = gi.pending.get(seq)
        if shared is not None:
            # the ops of one coalescing block (and the block's own record, filed at its end) share its number
            # and its one work: the block's report ends them all. The block's record closes the window (a
            # later batch of that number is not the block's)
            gi.pending[seq] = (shared[0], filed if shared[1] == _NO_END and not in_block else shared[1], shared[2] + (rec,))
            return
        for report in gi.early.pop(seq, ()):
            if _fits(rec, filed, report[2], report[3]):
                break
        else:  # none (the others: point-to-point batches' reports)
            gi.pending[seq] = (rec, filed, ())
            return
    _completed(rec, report[0], report[1])


def pending_records(gi: groups.GroupInfo) -> list[list]:
    """The records of ``gi`` waiting for their report (the caller holds ``gi.lock``)."""
    return [rec for first, _, shared in gi.pending.values() for rec in (first, *shared)]


def _on_complete(gi: groups.GroupInfo | None, info: Any) -> None:
    # Runs on ProcessGroupNCCL's hook thread: never raise into it.
    if gi is None:
        return  # uninstrumented: the hook stays with the group
    try:
        op = getattr(info.op_type, "name", None)
        if op in _P2P_OPS:
            return
        active = getattr(info, "active_duration", None)
        gpu_ns = _ns(active) if active is not None else None
        t_end = _to_perf_ns(getattr(info, "time_finished", None))
        t_start = _stamp(getattr(info, "time_started", None), t_end)
        _join(gi, int(info.seq), gpu_ns, t_end, ddp_native.module(), t_start, op == _COALESCED)
    except Exception as exc:
        health.error("completion", "could not complete an NCCL record from the completion hook", exc)


def _join(
    gi: groups.GroupInfo, seq: int, gpu_ns: int | None, t_end: int, native: Any, t_start: int | None = None,
    coalesced: bool = False,
) -> None:
    """Work ``seq`` of ``gi``, started at ``t_start`` (None: not stamped), completed: end its record, or keep
    the report for the record about to be filed. ``native``: the module whose DDP entries may be waiting for
    it (None: the C++ hook asked it already); a COALESCED work is never a DDP bucket's."""
    with gi.lock:
        pending = gi.pending.get(seq)
        if pending is not None:
            if not _fits(pending[0], pending[1], t_start, coalesced):
                return  # a point-to-point batch's: its record completes by its future
            del gi.pending[seq]
            if pending[1] == _NO_END:  # a coalescing block's ops: the block's own record is still to be filed
                _keep(gi, seq, (gpu_ns, t_end, t_start, coalesced))
        else:
            # A DDP bucket's native entry (ddp_native.py) waiting for it; else the native side keeps it
            # for an entry about to be numbered, and it is filed here too for a Python record about to
            # be: whichever comes takes it, and the other copy is never matched (numbers are not reused).
            if native is not None and not coalesced and native.report(gi.gid, seq, t_end, gpu_ns if gpu_ns is not None else -1):
                return
            # the watchdog saw it done before the wrapper had filed it (a tiny op): file the report (two
            # for one number: a collective's and a point-to-point batch's)
            _keep(gi, seq, (gpu_ns, t_end, t_start, coalesced))
            return
    for rec in (pending[0], *pending[2]):
        _completed(rec, gpu_ns, t_end)


def _keep(gi: groups.GroupInfo, seq: int, report: tuple) -> None:
    """File a report for a record of number ``seq`` not filed yet (``gi.lock`` held)."""
    reports = gi.early.get(seq)
    if reports is None:
        if len(gi.early) >= _EARLY_KEPT:
            del gi.early[next(iter(gi.early))]
        reports = gi.early[seq] = []
    reports.append(report)


def take_completions() -> None:
    """Join what the C++ hooks reported since the last call with its records (the drain, each round)."""
    mod = _native_hooks[0]
    if mod is None:
        return
    items, dropped = mod.take_completions()
    if dropped:
        health.error("completion", f"{dropped} NCCL completions were not kept (the drain fell behind): their records end unfinished")
    by_id = groups.BY_ID
    for gid, seq, t_end, gpu_ns, t_start, coalesced in items:
        if 0 <= gid < len(by_id):
            _join(by_id[gid], seq, gpu_ns if gpu_ns >= 0 else None, t_end, None, t_start if t_start > 0 else None, bool(coalesced))


def _completed(rec: list, gpu_ns: int | None, t_end: int) -> None:
    if gpu_ns is not None:
        rec[R.GPU_NS] = gpu_ns
    complete(rec, n.END_NCCL_HOOK, t_end)


def _waiting() -> bool:
    take_completions()
    if any(gi.pending for gi in groups.all_groups()):
        return True
    native = ddp_native.module()
    return native is not None and native.waiting() > 0


def flush_pending(timeout: float) -> None:
    """The process is ending: give the watchdog (it polls every 100 ms) up to ``timeout`` seconds to report
    what already finished on the live groups, then export what is left as unfinished and let the hooks go."""
    deadline = time.monotonic() + timeout
    while _waiting() and time.monotonic() < deadline:
        time.sleep(0.01)
    for gi in list(groups.BY_ID):  # destroyed groups too: their hooks will not come
        with gi.lock:
            recs = pending_records(gi)
            gi.pending.clear()
            gi.early.clear()
        for rec in recs:
            complete(rec, n.END_UNFINISHED)
    for slot in list(_hooked.values()):
        _point(slot, None)


groups.register_completion_attacher(attach)
