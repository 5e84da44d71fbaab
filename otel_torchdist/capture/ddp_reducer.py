"""The reducer's own collectives on a gloo DDP: the unused-parameter map and the bucket rebuild.

Besides the buckets (recorded by the trampoline comm hook, ddp.py), DDP's C++ reducer issues collectives no
Python patch reaches: with ``find_unused_parameters=True`` (or a static graph's first iteration) it
all-reduces the map of parameters used in the step, and when it rebuilds its buckets (once, early in
training) it broadcasts the new layout from rank 0. torch.profiler sees them; without this module the
record counts would not agree. So the reducer of a DDP on a gloo group is handed a Python
``ProcessGroup`` that passes every call to the model's real group and records it. Buckets do not pass
through it (the reducer gives them to the comm hook), so a step pays nothing for it unless the map is
all-reduced: one Python call and one callback per backward then. The model's ``process_group``, and
everything Python does with it, stay the real group.

Completion is stamped in a callback on the work's future, and the reducer is handed a work whose future is
that callback's: the reducer's wait then ends after the stamp. Handing it the real work would let the
training thread, woken by the completion, take the GIL back before the callback got it (in a 2-rank run one
step in seven stamped a collective up to 0.7 ms after backward had returned).

This is also where buckets could be recorded without a comm hook, sparing DDP the hook's scaling pass. It
does not pay: a Python ``ProcessGroup`` method called from the reducer costs more than the pass saves
(docs/performance.md, *DDP: what the training thread pays*). NCCL groups are left alone (nothing here
could test them).
"""

from __future__ import annotations

import weakref
from time import perf_counter_ns
from typing import Any

import torch
import torch.distributed as dist

from .. import bandwidth as bw
from .. import health
from .. import names as n
from . import c10d as c10d_capture
from . import completion, context, groups
from . import record as R
from .c10d import _parent_span
from .ops import describe

_inflight = completion._inflight
_GLOO = dist.ProcessGroup.BackendType.GLOO
SOURCE = "ddp_reducer"

# True while instrumented (ddp.patches() sets it): a model keeps its reducer group after uninstrument(),
# which must then pass calls through and record nothing.
_LIVE = False


def eligible(group: Any) -> bool:
    """A group whose collectives all run on gloo (CPU tensors, or gloo's CUDA support)."""
    try:
        return group is not None and group._get_backend_name() == "gloo"
    except Exception:
        return False


class _Waited(dist._Work):
    """The work the reducer gets: done once the record's end is stamped (see the module's docstring)."""

    def __init__(self, fut: torch.futures.Future) -> None:
        super().__init__()
        self._fut = fut

    def get_future(self) -> torch.futures.Future:
        return self._fut

    def wait(self, timeout: Any = None) -> bool:
        self._fut.wait()  # raises the collective's error, as the real work's wait would
        return True


class _Join(completion._Join):
    """A record until its one work completes; hands the reducer the work's value."""

    __slots__ = ()

    def __init__(self, rec: list) -> None:
        self.rec, self.remaining, self.source, self.lock = rec, 1, n.END_FUTURE, None

    def reduced(self, fut: torch.futures.Future) -> Any:
        t_end = perf_counter_ns()
        try:
            value = fut.value()
        except BaseException as exc:
            try:
                self.done(n.END_FUTURE, exc)
            except Exception as inner:
                health.error("ddp", "could not complete a DDP reducer record", inner)
            raise  # the reducer sees the failure
        try:
            rec = self.rec
            _inflight.pop(id(self), None)
            rec[R.T_END] = t_end
            rec[R.END] = n.END_FUTURE
            R.push(rec)
        except Exception as exc:
            health.error("ddp", "could not complete a DDP reducer record", exc)
        return value


class ReducerGroup(dist.ProcessGroup):
    """Hands the reducer's calls to ``real`` and records them (``allreduce`` and ``broadcast``, all the
    reducer issues; anything else goes straight to the real group's backends, registered here too)."""

    def __init__(self, real: Any, info: groups.GroupInfo) -> None:
        super().__init__(real.rank(), real.size())
        registered = False
        for device in real._device_types:
            try:
                backend = real._get_backend(device)
            except Exception:
                continue  # e.g. CUDA on a CPU-only build
            self._register_backend(device, _GLOO, backend)
            registered = True
        if not registered:
            raise RuntimeError("the group has no gloo backend to register")
        self._set_default_backend(_GLOO)
        self.real = real
        self.info = info

    # ---------------------------------------------------------------------------- the reducer's calls
    # Not for Dynamo: under torch.compile(DDP(...)) the reducer rebuilds its buckets from a frame Dynamo is
    # tracing, and Dynamo would try to compile these, called from C++, and fail on the process group.
    @torch.compiler.disable
    def allreduce(self, tensors: list, opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.AllreduceOptions()
        return self._pass("all_reduce", bw.ALL_REDUCE, self.real.allreduce, tensors, opts, opts.reduceOp, None)

    @torch.compiler.disable
    def broadcast(self, tensors: list, opts: Any = None) -> Any:
        opts = opts if opts is not None else dist.BroadcastOptions()
        return self._pass("broadcast", bw.BROADCAST, self.real.broadcast, tensors, opts, None, (None, opts.rootRank))

    # ------------------------------------------------------------------------------------------ records
    def _pass(self, op: str, kind: str, call: Any, tensors: list, opts: Any, redop: Any, root: Any) -> Any:
        """Issue the reducer's call on the real group, recorded: the unused-parameter map's all-reduce, a
        bucket rebuild's broadcasts."""
        if not _LIVE or R.TLS.outer is not None:
            return call(tensors, opts)
        try:
            rec = R.new(op, kind, SOURCE, self.info.gid)
            describe(tensors, rec)
            rec[R.ASYNC] = True
            rec[R.REDOP] = redop
            rec[R.ROOT] = root
            rec[R.PARENT] = _parent_span()
            rec[R.CTX] = context.derive(framework="ddp", phase="backward" if rec[R.BWD] else "forward")
        except Exception as exc:
            health.error("ddp", f"could not describe a DDP reducer {op}", exc)
            return call(tensors, opts)
        return self._issue(rec, call, tensors, opts)

    def _issue(self, rec: list, call: Any, tensors: list, opts: Any) -> Any:
        R.TLS.outer = rec  # the real group's own methods, patched or seen by deep capture, record nothing more
        rec[R.T_START] = perf_counter_ns()
        try:
            work = call(tensors, opts)
        except BaseException as exc:
            R.TLS.outer = None
            c10d_capture._fail(rec, exc)
            raise
        R.TLS.outer = None
        try:
            gi = self.info
            rec[R.SEQ] = self.real._get_sequence_number_for_group() if gi.seq_supported else gi.next_seq()
            join = _Join(rec)
            _inflight[id(join)] = join  # the hang watchdog sees it until it completes
            return _Waited(work.get_future().then(join.reduced))
        except Exception as exc:
            health.error("ddp", "could not follow a DDP reducer call", exc)
            return work


# id(DDP) -> its ReducerGroup, held here: the reducer's own reference keeps no Python object alive, and a
# ReducerGroup without one falls back to its registered backends, recording nothing.
BY_MODEL: dict[int, ReducerGroup] = {}


def attach(ddp: Any) -> bool:
    """Give ``ddp``'s reducer a ReducerGroup over its group; False where it cannot take one."""
    group = ddp.process_group
    info = groups.info(group) if eligible(group) else None
    if info is None:
        return False
    key = id(ddp)
    wrapper = ReducerGroup(group, info)
    ddp.reducer._update_process_group(wrapper)  # swaps the reducer's group under its lock, nothing else
    if key not in BY_MODEL:
        weakref.finalize(ddp, BY_MODEL.pop, key, None)
    BY_MODEL[key] = wrapper
    return True


__all__ = ["ReducerGroup", "attach", "eligible", "BY_MODEL", "SOURCE"]
