"""Optimizer steps as ``optimizer.step`` spans, through torch.optim's global step hooks.

Every ``torch.optim`` optimizer (default, foreach, fused), ZeroRedundancyOptimizer and optimizers applied
in backward run their ``step`` inside ``Optimizer.profile_hook_step``, which calls the global pre/post
hooks. Steps nest (ZeRO's wraps its local optimizer's; a subclass calling ``super().step()`` fires the hooks
twice): a per-thread depth keeps only the outermost, and names the inner optimizer. While a step runs, the
framework context makes it the parent of the collectives it issues (ZeRO's parameter broadcasts) and sets
their phase to ``optimizer``.
"""

from __future__ import annotations

import functools
import sys
import threading
import weakref
from time import perf_counter_ns
from typing import Any

from .. import health
from . import caller, context, framework_spans
from . import record as R
from . import step_context as S

_tls = threading.local()
_handles: list[Any] = []
# The step tracker's on_optimizer_step (steps.py), called (first, t_start, t_end, in_backward, optimizer) after each
# outermost step; first: that optimizer's first step. It returns the deferred close of the training step
# the optimizer step ends, which goes to the drain inside the optimizer step's own entry: one queued
# tuple per training step instead of two.
closer: list[Any] = [None]
_FINISHED = R.reserve("optimizer_step")  # drain/optimizer.py's finished (a traced step's)
_TIMED = R.reserve("optimizer_timed")  # drain/optimizer.py's timed (an untraced step's: its duration only)
_SAMPLED = S.SAMPLED
# The framework context inside an untraced optimizer step outside any other framework context (the common
# case): its collectives' phase is "optimizer" and their parent the training step.
_UNTRACED_CTX = context.EMPTY[:2] + ("optimizer", None, None) + context.EMPTY[5:]
_getframe = sys._getframe
_graph_task_id = R._graph_task_id


class _Seen:
    """What the hooks keep per optimizer: its steps so far and its parameter count."""

    __slots__ = ("count", "groups", "params")

    def __init__(self) -> None:
        self.count = 0
        self.groups = -1
        self.params = 0


# id(optimizer) -> _Seen, dropped when the optimizer is collected: a plain dict read per step, where a
# WeakKeyDictionary made a weak reference in Python on every lookup.
_seen: dict[int, _Seen] = {}


def _state(optimizer: Any) -> _Seen:
    key = id(optimizer)
    seen = _seen.get(key)
    if seen is None:
        seen = _seen[key] = _Seen()
        try:
            weakref.finalize(optimizer, _seen.pop, key, None)
        except TypeError:
            pass  # not weak-referenceable: kept for the process
    return seen


def steps_of(optimizer: Any) -> int:
    """How many steps of ``optimizer`` the hooks saw end."""
    seen = _seen.get(id(optimizer))
    return 0 if seen is None else seen.count


def steps_ended() -> int:
    """How many outermost optimizer steps ended on this thread (a wrapper that never called
    Optimizer.__init__, PostLocalSGDOptimizer say, steps through its inner optimizer's hooks only)."""
    running = getattr(_tls, "running", None)
    return 0 if running is None else running.ended


def skipped(optimizer: Any, t_start: int) -> None:
    """GradScaler skipped ``optimizer``'s step (inf or NaN gradients: an fp16 run does, at its start and
    whenever its scale grows too far): no hook ran, but the iteration is over, and so is its training step."""
    on_step = closer[0]
    running = getattr(_tls, "running", None)
    if on_step is None or (running is not None and running.depth):
        return  # inside another optimizer's step: that step's end closes it
    close = on_step(steps_of(optimizer) == 0, t_start, perf_counter_ns(), _graph_task_id() != -1, optimizer)
    if close is not None:
        R.queue(close)


def install() -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    _handles.append(register_optimizer_step_pre_hook(_pre))
    _handles.append(register_optimizer_step_post_hook(_post))


def remove() -> None:
    for handle in _handles:
        handle.remove()
    _handles.clear()


class _Running:
    """This thread's outermost optimizer step in progress (one object per thread: slot reads, where each
    attribute of a threading.local is a dictionary lookup). What the step's span needs is kept in slots,
    not in tuples: each tuple a step makes is one more object for the garbage collector to count."""

    __slots__ = (
        "depth", "frame", "token", "optimizer", "inner", "user", "step", "trace", "span", "parent", "t_start", "closures",
        "ended",
    )

    def __init__(self) -> None:
        self.depth = 0
        self.frame = self.token = self.optimizer = self.inner = self.user = self.step = None
        self.trace = self.span = self.parent = None
        self.t_start = 0
        self.closures: list[tuple[int, int]] = []
        self.ended = 0  # outermost steps ended on this thread (steps_ended)


def _encloses(outer: Any, frame: Any) -> bool:
    while frame is not None:
        if frame is outer:
            return True
        frame = frame.f_back
    return False


def _pre(optimizer, args, kwargs) -> None:
    try:
        try:
            st = _tls.running
        except AttributeError:
            st = _tls.running = _Running()
        # The frame that called the hook (torch's step wrapper) runs until the step ends: a step that finds
        # one open outside its own stack knows that step raised, so its post hook never ran.
        hook_frame = _getframe(1)
        if st.depth:
            if _encloses(st.frame, hook_frame.f_back):
                st.depth += 1
                if type(optimizer) is not type(st.optimizer):
                    st.inner = type(optimizer).__name__
                return
            R.TLS.ctx = st.token
        st.depth = 1
        tls = R.TLS
        user, fw, step = caller.get_current() or None, tls.ctx, R.STEP[0]
        if user is None and fw is None and step is not None and not step[_SAMPLED]:
            # framework_spans.untraced's common case, in place: the optimizer.step span is never built, so it
            # gets no id (the collectives the step issues fall back to the training step as their parent).
            tls.ctx = _UNTRACED_CTX
            st.trace = None
        else:
            if framework_spans.untraced(user, fw, step):
                trace = span = parent = None
            else:
                trace, span, parent = framework_spans.open_span((user, fw, step))
            base = fw or context.EMPTY
            tls.ctx = (base[0], base[1], "optimizer", trace, span, base[5])
            st.trace, st.span, st.parent, st.user, st.step = trace, span, parent, user, step  # read when traced
        st.frame = hook_frame
        st.token = fw
        st.optimizer = optimizer
        st.inner = None
        if st.closures:
            st.closures = []
        st.t_start = perf_counter_ns()
        if len(args) > 1 or kwargs:
            # The hook's args are the step's own, the optimizer first: step(self, closure=None).
            closure = args[1] if len(args) > 1 else kwargs.get("closure")
            if callable(closure):
                return _with_closure(st, closure, args, kwargs)
    except Exception as exc:
        health.error("optimizer", "could not start an optimizer.step record", exc)
    return None  # a value returned from a pre-hook replaces the step's arguments


def _with_closure(st: _Running, closure: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``optimizer.step(closure)`` (Lightning, LBFGS): the closure runs the forward and backward passes, which
    are the training step's, not the optimizer's. While it runs, the context is the one outside the step
    (its collectives are children of the training step, in their own phases); its calls are timed, and the
    optimizer.step span begins when the first returns."""
    token = st.token

    @functools.wraps(closure)
    def closure_of_the_step(*a: Any, **k: Any) -> Any:
        tls = R.TLS
        inside = tls.ctx
        tls.ctx = token
        t0 = perf_counter_ns()
        try:
            return closure(*a, **k)
        finally:
            st.closures.append((t0, perf_counter_ns()))
            tls.ctx = inside

    if len(args) > 1:
        return (args[0], closure_of_the_step, *args[2:]), kwargs
    return args, {**kwargs, "closure": closure_of_the_step}


def _post(optimizer, args, kwargs) -> None:
    try:
        try:
            st = _tls.running
        except AttributeError:
            return  # no pre hook ran on this thread: it ran before instrument()
        depth = st.depth
        if depth != 1:
            if depth:  # an inner step's end
                st.depth = depth - 1
            return  # else its pre hook ran before instrument()
        t_end = perf_counter_ns()
        st.depth = 0
        st.ended += 1
        R.TLS.ctx = st.token
        seen = _seen.get(id(optimizer)) or _state(optimizer)
        count = seen.count = seen.count + 1
        t_start = st.t_start
        if st.closures:  # the optimizer's own work, after its closure (forward and backward) first returned
            t_start = st.closures[0][1]
            st.closures = []
        in_backward = _graph_task_id() != -1
        on_step = closer[0]
        close = None if on_step is None else on_step(count == 1, t_start, t_end, in_backward, optimizer)
        # Flat values only, described on the drain thread: nothing here for the garbage collector to follow.
        trace = st.trace
        if trace is None:  # an untraced step (see _pre): its duration only
            R.queue((_TIMED, type(optimizer).__name__, t_start, t_end, close))
            st.frame = st.optimizer = None
        else:
            groups = optimizer.param_groups
            if len(groups) != seen.groups:
                # Parameters join an optimizer through add_param_group: counted again when the groups change.
                seen.params = sum(p.numel() for g in groups for p in g["params"])
                seen.groups = len(groups)
            R.queue((
                _FINISHED, type(optimizer).__name__, t_start, t_end, close, st.inner, count, in_backward, seen.groups,
                seen.params, st.user, st.token, st.step, trace, st.span, st.parent,
            ) + _hyper(groups))  # fmt: skip
            st.frame = st.optimizer = st.user = st.step = None
    except Exception as exc:
        health.error("optimizer", "could not finish an optimizer.step record", exc)


def _hyper(groups: list[dict]) -> tuple:
    """Each group's lr, momentum and betas as they are for this step, flat."""
    out: tuple = ()
    for g in groups:
        lr, momentum, betas = g.get("lr"), g.get("momentum"), g.get("betas")
        if lr.__class__ is not float:
            lr = _now(lr)
        out += (lr, momentum, betas)
    return out


def _now(value: Any) -> Any:
    """A CPU tensor's value now (a scheduler may change it before the drain reads it); a device tensor is
    read on the drain thread, since reading it here would wait for the device."""
    device = getattr(value, "device", None)
    if device is not None and device.type == "cpu":
        try:
            return float(value)
        except (TypeError, ValueError, RuntimeError):  # not one number: the drain leaves it out
            return None
    return value
