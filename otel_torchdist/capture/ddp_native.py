"""DDP recorded by the native process group: no comm hook, so DDP keeps its own bucket path.

A DDP built (or found) while instrumented, on a gloo group (CPU) or an NCCL group whose completion hook is
in (nccl.py), with no comm hook, and with the native part built (``otel_torchdist.native``), has its reducer
handed a ``TimedGroup`` over its group instead of the trampoline comm hook of ddp.py. The reducer issues
every collective of its own through it: each gradient bucket's all-reduce, the unused-parameter map's
all-reduce (``find_unused_parameters``, a static graph's first iteration), the broadcasts of a bucket
rebuild. The C++ side records each one (times, sizes, sequence number, the step index from the step slot,
the autograd graph task) and this module turns the entries into the records every other capture makes, on
the drain thread.

A bucket is an all-reduce of floating-point values issued inside a backward pass. The reducer launches a
backward's buckets in index order, each once, so a bucket's index is its place among its backward's
all-reduces on that group. Whether it is the last is known once the backward is over: a backward's buckets
are held until another backward on the group issues one, the step changes, or ``HOLD_NS`` pass, then
released together. That numbering only shows in spans: the buckets of an untraced step (nearly all, at the
default sampling) are not held, and the native part makes their records itself (``take_split()``). The
model's ``process_group``, and everything Python does with it, stay the real group; DDP's parameters are
what they are without otel-torchdist (no hook, no pass of ours).

On NCCL a collective's future completes at enqueue, so an entry there ends when the group's completion
hook reports its sequence number (``report()``: the GPU's duration and the watchdog's completion time), as
the Python records of nccl.py do; until then it is in flight, where the hang watchdog looks. On a GPU this
spares the device thread that runs DDP's backward a Python comm hook per bucket and its wait for the GIL.

What the comm hook gives and this does not: the caller's own OpenTelemetry span at the bucket (the
reducer runs it in C++; bucket spans hang under the step's span) and the parameter count of a bucket.
"""

from __future__ import annotations

import itertools
import logging
import weakref
from typing import Any

import torch
import torch.distributed as dist

from .. import bandwidth as bw
from .. import health
from .. import names as n
from . import context, groups
from . import record as R
from . import step_context as S

_log = logging.getLogger("otel_torchdist")
SOURCE = "ddp_reducer"
HOLD_NS = 5_000_000_000  # a backward's buckets wait at most this long for the backward to be known over

# Entry fields, as timed_group.cpp's entry_tuple() writes them.
(E_GID, E_OP, E_T0, E_T1, E_NBYTES, E_NUMEL, E_NTENSORS, E_DTYPE, E_SEQ, E_ROOT, E_REDOP, E_STEP, E_TASK, E_ERROR,
 E_BATCH, E_OWNER, E_GPU_NS, E_HOOKED) = range(18)
_OPS = {0: ("all_reduce", bw.ALL_REDUCE), 1: ("broadcast", bw.BROADCAST)}
_UNKNOWN_OP = ("unknown", bw.ALL_REDUCE)
# What training sees of a failure inside the reducer (a C++ exception, raised from backward as RuntimeError);
# the message is the backend's own.
_ERROR_TYPE = "RuntimeError"
_RECENT, _RECENT_MASK = R.RECENT_STEPS, len(R.RECENT_STEPS) - 1
_SERIAL = S.SERIAL
_REDOPS = {int(v): v for v in dist.ReduceOp.RedOpType.__members__.values()}
_END_FUTURE = n.END_FUTURE

# The loaded native module while instrumented with it, else None.
_mod: Any = None
# DDP -> the TimedGroup its reducer holds (while instrumented).
_attached: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_hinted = False
_owners = itertools.count(1)  # a number per model: two DDP models on one group hold their passes apart
_SPARSE_CAPABLE = (torch.nn.Embedding, torch.nn.EmbeddingBag)
_hint_wanted = False  # native="auto" found no build: say once, when a DDP could have used it, how to build it


def active() -> bool:
    return _mod is not None


def activate(mode: str, capacity: int) -> None:
    """Load the native part for this instrument() (``mode``: config ``native``); a failure is logged, never
    raised: DDP is then captured through its comm hook."""
    global _mod, _hint_wanted
    _hint_wanted = False
    if mode == "off":
        return
    from .. import native

    try:
        mod = native.load(build=mode == "build")
    except Exception as exc:  # a failed build or load costs the hook path, never the job
        health.error("native", "the native part could not be loaded; DDP is captured through its comm hook", exc)
        return
    if mod is None:
        _hint_wanted = True
        return
    try:
        mod.set_capacity(capacity)
        mod.take()  # entries of an earlier instrument() cycle (a model left attached at exit): not this run's
        mod.abandon()  # and those in flight then (on NCCL, reports that never came after that cycle's end)
        mod.take_dropped()
        slots = memoryview(mod.slots()).cast("q")
        slots[0] = R.STEP[0][S.SERIAL] + 1 if R.STEP[0] is not None else 0
    except Exception as exc:
        health.error("native", "the native part could not be set up; DDP is captured through its comm hook", exc)
        return
    try:
        # What take_split() reads: the step contexts, the models' (filled in as models attach), names
        mod.split_setup(R.RECENT_STEPS, _RECENT_MASK, _models, _PHASES[1], _REDOPS,
                        ("all_reduce", bw.ALL_REDUCE, SOURCE, n.END_FUTURE, n.END_NCCL_HOOK))  # fmt: skip
    except Exception as exc:
        health.error("native", "the native part could not be set up; DDP is captured through its comm hook", exc)
        return
    R.SLOTS = slots
    _held.clear()
    _mod = mod


def module() -> Any:
    """The native module while it is loaded for this instrument(), else None."""
    return _mod


def deactivate(restore: bool) -> None:
    """End of instrument(): give attached reducers their real group back when ``restore``."""
    global _mod
    if _mod is None:
        return
    if restore:
        for ddp in list(_attached):
            try:
                # the model's group, which is the one its reducer's native group passes to unless the model
                # was moved while otel-torchdist was closing
                ddp.reducer._update_process_group(ddp.process_group)
            except Exception as exc:
                health.error("ddp", "could not give a DDP reducer its process group back", exc)
        _attached.clear()
    R.SLOTS[0] = 0
    R.SLOTS = R.NO_SLOTS
    _mod = None


def eligible(ddp: Any) -> bool:
    """A model on CPU over a gloo group, or on CUDA over an NCCL group (gloo's CUDA path keeps the comm hook:
    its buckets were never run through the native group on a GPU)."""
    group = ddp.process_group
    try:
        if group is None:
            return False
        where = (getattr(ddp, "device_type", None), group._get_backend_name())
        if where != ("cpu", "gloo") and where != ("cuda", "nccl"):
            return False
        # sparse gradients (sparse embeddings) are bucketed alone and reduced another way: the comm hook
        return not any(getattr(m, "sparse", False) for m in ddp.module.modules() if isinstance(m, _SPARSE_CAPABLE))
    except Exception:
        return False


def attach(ddp: Any) -> bool:
    """Hand ``ddp``'s reducer a TimedGroup over its group; False where the comm hook must do instead."""
    if getattr(ddp, "reducer", None) is None or not eligible(ddp):
        return False
    if _mod is None:
        if _hint_wanted and not _hinted:
            _hint()
        return False
    if ddp._get_ddp_logging_data().get("comm_hook"):
        return False  # a hook is in already: it issues the buckets, not the reducer's group
    gi = groups.info(ddp.process_group)
    if gi is None:
        return False
    hooked = gi.completion == groups.COMPLETION_NCCL_HOOK
    if ddp.device_type == "cuda" and not hooked:
        return False  # no completion hook on the group: the comm hook's records say they are enqueue-timed
    owner = next(_owners)
    model = context.class_name(ddp.module)  # as the comm hook path names it (ddp.model_name)
    _models[owner] = (context.derive(framework="ddp", module=model, phase="forward"),
                      context.derive(framework="ddp", module=model, phase="backward"))  # fmt: skip
    timed = _mod.TimedGroup(ddp.process_group, gi.gid, owner, hooked)
    ddp.reducer._update_process_group(timed)  # swaps the reducer's group under its lock, nothing else
    _attached[ddp] = timed
    return True


def _hint() -> None:
    global _hinted
    _hinted = True
    _log.info(
        "otel-torchdist: DDP's buckets are recorded through a comm hook, which costs DDP a pass over each "
        "bucket (about 1.5 %% of a small model's step on CPU, 0.3-0.4 ms a step on a GPU); `otel-torchdist "
        "build-native` builds the native capture that spares it (docs/performance.md)"
    )


def is_attached(ddp: Any) -> bool:
    return ddp in _attached


def forget(ddp: Any) -> None:
    """The model's reducer no longer holds its TimedGroup (another group was handed to it)."""
    _attached.pop(ddp, None)


# ------------------------------------------------------------------------------------------ the drain
class _Backward:
    """The buckets one backward pass (or one pass of DDP's Join hook) issued on one group so far, each as
    (sequence number, start, arrival, record) to sort into issue order. ``key``: (graph task, step,
    batch), which tells one pass from the next."""

    __slots__ = ("key", "step", "records", "last_t")

    def __init__(self, key: tuple, step: int) -> None:
        self.key, self.step, self.records, self.last_t = key, step, [], 0


_held: dict[int, _Backward] = {}  # model number -> its backward being held
_contexts: dict[tuple, tuple] = {}
_models: dict[int, tuple] = {}  # model number -> the (forward, backward) contexts of its collectives


def _step_context(serial: int, tracker: Any) -> tuple | None:
    """R.STEP's tuple for the ``serial``-th step of this rank, as the training thread had it (steps.py
    keeps the last 4096 in R.RECENT_STEPS): a step further back than that has ended long ago, and its
    collectives are recorded outside any step."""
    ctx = _RECENT[serial & _RECENT_MASK]
    return ctx if ctx is not None and ctx[_SERIAL] == serial else None


def _bucket_context(owner: int, index: int, nbytes: int, last: bool) -> tuple:
    key = (owner, index, nbytes, last)
    ctx = _contexts.get(key)
    if ctx is None:
        if len(_contexts) > 4096:
            _contexts.clear()
        extras = (n.DDP_BUCKET_INDEX, index, n.DDP_BUCKET_BYTES, nbytes, n.DDP_BUCKET_LAST, last)
        model = _models.get(owner, _PHASES)[1][context.MODULE]
        ctx = _contexts[key] = context.derive(framework="ddp", module=model, phase="backward", extras=extras)
    return ctx


_PHASES = (context.derive(framework="ddp", phase="forward"), context.derive(framework="ddp", phase="backward"))


def _record(e: tuple, tracker: Any, end: str | None) -> list:
    """The record of an entry (record.py's fields, in one literal: this runs per collective on the drain);
    a hooked entry's end is the completion hook's."""
    op, kind = _OPS.get(e[E_OP], _UNKNOWN_OP)
    gpu_ns = e[E_GPU_NS]
    if end is _END_FUTURE and e[E_HOOKED]:
        end = n.END_NCCL_HOOK if e[E_ERROR] is None else n.END_RETURN  # a failed call fails at issue
    numel, ntensors, redop, root, error, task = e[E_NUMEL], e[E_NTENSORS], e[E_REDOP], e[E_ROOT], e[E_ERROR], e[E_TASK]
    step = e[E_STEP] - 1  # the slot holds the step's serial + 1; 0 outside steps
    if step >= 0:
        ctx = _RECENT[step & _RECENT_MASK]
        if ctx is None or ctx[_SERIAL] != step:
            ctx = _step_context(step, tracker)
    else:
        ctx = None
    return [
        op, kind, SOURCE, e[E_GID], e[E_SEQ] if e[E_SEQ] >= 0 else None, e[E_T0], e[E_T1], e[E_NBYTES], e[E_DTYPE],
        (1, numel) if ntensors == 1 else (), numel, ntensors, True, (None, root) if root >= 0 else None, None,
        _REDOPS.get(redop) if redop >= 0 else None, end, (_ERROR_TYPE, error) if error is not None else None,
        None, None, gpu_ns if gpu_ns >= 0 else None, False, _models.get(e[E_OWNER], _PHASES)[task != -1], task != -1, ctx,
    ]  # fmt: skip


def _is_bucket(e: tuple) -> bool:
    """A gradient bucket's all-reduce: the reducer's other all-reduce is the unused-parameter map (ints).
    Issued in a backward pass, or by DDP's Join hook on a rank out of inputs (zero buckets, no backward)."""
    dtype = e[E_DTYPE]
    return e[E_OP] == 0 and e[E_ERROR] is None and dtype is not None and dtype.is_floating_point


def _release(owner: int, held: _Backward, out: list) -> None:
    records = held.records
    # Entries come in the order they completed (a small bucket may finish first): sorted by sequence number,
    # then start; the arrival number keeps records themselves from being compared.
    records.sort()
    last = len(records) - 1
    for i, (_, _, _, rec) in enumerate(records):
        rec[R.CTX] = _bucket_context(owner, i, rec[R.NBYTES], i == last)  # phase backward, as the comm hook says
        out.append(tuple(rec))  # a tuple, as every record: spans.site_block caches by its slices


def take(tracker: Any, now: int, force: bool = False) -> list[tuple]:
    """Records of the collectives completed since the last call, in the order the pipeline processes them;
    a backward's buckets once the backward is known to be over (``force``: all of them now)."""
    mod = _mod
    if mod is None:
        return []
    out: list[tuple] = []
    dropped = mod.take_dropped()
    if dropped:
        R._dropped[0] += dropped
    slot = R.SLOTS[0]
    # Untraced steps' gradient buckets come as records (only the metrics see them, so their place in their
    # backward pass is not waited for); the rest as entries.
    fast, entries = mod.take_split()
    out.extend(fast)
    for e in entries:
        rec = _record(e, tracker, n.END_FUTURE)
        if not _is_bucket(e):
            out.append(tuple(rec))
            continue
        owner = e[E_OWNER]
        key = (e[E_TASK], e[E_STEP], e[E_BATCH])
        held = _held.get(owner)
        if held is not None and held.key != key:
            _release(owner, _held.pop(owner), out)
            held = None
        if held is None:
            held = _held[owner] = _Backward(key, e[E_STEP])
        records = held.records
        records.append((e[E_SEQ], e[E_T0], len(records), rec))
        held.last_t = e[E_T1]
    if not _held:
        return out
    flying = None
    for owner in list(_held):
        held = _held[owner]
        if not force:
            if held.step == slot and now - held.last_t <= HOLD_NS:
                continue
            # A bucket of the pass still in flight: the pass is not over (a stalled rank, or on NCCL a
            # report the completion hook has not made yet, though the step has moved on).
            if flying is None:
                flying = {(e[E_OWNER], (e[E_TASK], e[E_STEP], e[E_BATCH])) for e in mod.in_flight()}
            if (owner, held.key) in flying:
                continue
        _release(owner, _held.pop(owner), out)
    return out


def in_flight() -> list[tuple]:
    """Records of the collectives issued through a TimedGroup and not completed (for the hang watchdog)."""
    mod = _mod
    if mod is None:
        return []
    return [tuple(_record(e, None, None)) for e in mod.in_flight()]


def abandon(tracker: Any) -> list[list]:
    """At close: what is still in flight, as records to complete as unfinished (taken out of the log, so a
    late completion is not recorded a second time)."""
    mod = _mod
    if mod is None:
        return []
    return [_record(e, tracker, n.END_UNFINISHED) for e in mod.abandon()]


__all__ = ["SOURCE", "activate", "module", "attach", "deactivate", "forget", "in_flight", "is_attached", "take", "abandon"]
