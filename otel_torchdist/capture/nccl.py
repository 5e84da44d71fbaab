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
"""

from __future__ import annotations

import logging
import time
from datetime import datetime
from time import perf_counter_ns
from typing import Any

from .. import health
from .. import names as n
from . import groups
from . import record as R
from .record import complete

_log = logging.getLogger(__name__)


def attach(gi: groups.GroupInfo) -> None:
    if "nccl" not in gi.backend:
        return
    pg = gi.pg
    register = getattr(pg, "_register_on_completion_hook", None)
    enable = getattr(pg, "_enable_collectives_timing", None)
    if register is None or enable is None:
        health.warn_once("nccl-hook-missing", "this torch has no NCCL completion hook; NCCL records are enqueue-timed")
        return
    try:
        enable()
        register(lambda info, gi=gi: _on_complete(gi, info))
    except Exception as exc:
        health.warn_once(
            "nccl-hook-" + gi.name,
            "could not register the NCCL completion hook on group %s (%s); its records are enqueue-timed",
            gi.label,
            exc,
        )
        return
    gi.completion = groups.COMPLETION_NCCL_HOOK


def _to_perf_ns(when: Any) -> int:
    """Map a WorkInfo wall-clock time onto the perf_counter_ns axis records use."""
    if isinstance(when, datetime):
        wall_ns = int(when.timestamp() * 1e9)
    elif isinstance(when, (int, float)):
        wall_ns = int(when)
    else:
        return perf_counter_ns()
    return perf_counter_ns() - (time.time_ns() - wall_ns)


def _on_complete(gi: groups.GroupInfo, info: Any) -> None:
    # Runs on ProcessGroupNCCL's hook thread: never raise into it.
    try:
        with gi.lock:
            rec = gi.pending.pop(int(info.seq), None)
        if rec is None:
            return
        active = getattr(info, "active_duration", None)
        if active is not None:
            rec[R.GPU_NS] = int(active.total_seconds() * 1e9)
        complete(rec, n.END_NCCL_HOOK, _to_perf_ns(getattr(info, "time_finished", None)))
    except Exception as exc:
        health.error("completion", "could not complete an NCCL record from the completion hook", exc)


def flush_pending() -> None:
    """Records whose completion never arrived (process ending) are exported as unfinished."""
    for gi in groups.all_groups():
        with gi.lock:
            recs = list(gi.pending.values())
            gi.pending.clear()
        for rec in recs:
            complete(rec, n.END_UNFINISHED)


groups.register_completion_attacher(attach)
