"""A training step's close, on the drain thread: its duration split into compute and communication wait,
its metrics, its spans (the rank's step, its phases, the cross-rank root) and the slow-step warning.
steps.py (the training thread) queues it."""

from __future__ import annotations

import logging
from typing import Any

from .. import callbacks
from .. import names as n
from ..capture import record as R
from ..capture import step_context as S
from ..ids import new_span_id, new_trace_id
from ..steps import USER_KEYS, StepTracker
from ..telemetry import SpanData

_log = logging.getLogger("otel_torchdist")
_SERIAL, _SAMPLED, _INDEX = S.SERIAL, S.SAMPLED, S.INDEX


@R.drained_as("close_step")
def close_step(pipeline: Any, ctx: tuple, t0: int, t1: int, source, user, backward, final, error, warmup, stretch) -> None:
    # Runs once per training step on the drain thread: locals, and the step's series bound once.
    tracker = pipeline.step_tracker
    serial, sampled, index = ctx[_SERIAL], ctx[_SAMPLED], ctx[_INDEX]
    stats = pipeline.step_stats.pop(serial, None)  # the records process() took (traced steps)
    if serial > pipeline.last_closed_step:
        pipeline.last_closed_step = serial
    if stats is not None and stats.opened > pipeline.closed_opened:
        pipeline.closed_opened = stats.opened
    if pipeline.native_steps is not None:  # and those the native fold took (every other step's)
        count, nbytes, wait, t1 = pipeline.native_steps.take_step(serial, t0, t1, stretch, stats)
    elif stats is not None:
        count, nbytes, wait, t1 = stats.totals(t0, t1, stretch)
    else:
        count, nbytes, wait = 0, 0, 0.0
    duration = (t1 - t0) / 1e9 if t1 > t0 else 0.0
    if wait > duration:
        wait = duration
    compute = duration - wait
    values = None if user is None else {k: v for k, v in zip(USER_KEYS, user) if v is not None}
    # The tail after the last optimizer step is no training step: traced for its collectives, not counted.
    # A step cut short by an exception is always traced: that is where this rank failed.
    if final and source == "optimizer" or error:
        if error or sampled and count:
            info = _info(ctx, t0, t1, source, values, backward, error)
            info["uncounted"] = True
            _emit_step_spans(pipeline, tracker, info, duration, compute, wait, count, nbytes)
        return
    fw = pipeline.framework
    bound = tracker._bound
    if bound is None or bound[0] is not fw:
        bound = tracker._bound = (
            fw,
            fw.histogram(n.STEP_DURATION_METRIC),
            fw.counter(n.STEPS_METRIC),
            fw.counter(n.STEP_COMPUTE_TIME),
            fw.counter(n.STEP_COLLECTIVE_WAIT_TIME),
            fw.gauge(n.STEP_CURRENT),
        )
    with fw.lock:
        bound[1].observe(duration)
        bound[2].value += 1
        bound[3].value += compute
        bound[4].value += wait
        bound[5].value = index
    if values:
        _user_metrics(fw, values, duration)
    recent = tracker._recent
    if serial == 1:
        median = recent.median()
        tracker.setup = (index, duration, compute, wait)  # apart from the steady state (the summary)
    else:
        median = recent.append(duration)
    if tracker.total is not None:  # the median the slow check uses: sorting the window each step costs a close
        fw.set(n.TRAIN_ETA, (), max(tracker.total - index, 0) * (duration if median is None else median))
    if tracker.exchange is not None:
        tracker.exchange.add_step(serial, duration, compute, wait)
    factor = tracker.cfg.slow_step_factor
    slow = factor and not warmup and median is not None and duration > factor * median and len(recent) >= 6
    if slow or sampled:
        info = _info(ctx, t0, t1, source, values, backward, error)
        if slow:
            callbacks.fire("slow_step", callbacks.SlowStepEvent(tracker.rank, index, duration, median))
            _maybe_warn_slow(pipeline, tracker, index, duration, median, info)
        if sampled:
            _emit_step_spans(pipeline, tracker, info, duration, compute, wait, count, nbytes)


def _info(ctx: tuple, t0: int, t1: int, source: str, user: dict | None, backward: tuple, error) -> dict:
    """A closed step, for its spans and its slow-step warning (only those steps pay for the dict)."""
    return {
        "index": ctx[S.INDEX],
        "serial": ctx[S.SERIAL],
        "occurrence": ctx[S.OCCURRENCE],
        "trace": ctx[S.TRACE],
        "rank_span": ctx[S.SPAN],
        "sampled": ctx[S.SAMPLED],
        "root": ctx[S.ROOT],
        "parent": ctx[S.PARENT],
        "shared": ctx[S.SHARED],
        "t_start": t0,
        "t_end": t1,
        "source": source,
        "user": user or {},
        "backward": backward,
        "error": error,
    }


def _user_metrics(fw: Any, user: dict, duration: float) -> None:
    """What otel_torchdist.record() gave the step: loss, learning rate, samples and tokens (and their rates)."""
    if "loss" in user:
        fw.set(n.TRAIN_LOSS, (), user["loss"])
    if "learning_rate" in user:
        fw.set(n.TRAIN_LR, (), user["learning_rate"])
    if "samples" in user:
        fw.add(n.TRAIN_SAMPLES, (), user["samples"])
        if duration > 0:
            fw.set(n.TRAIN_SAMPLE_RATE, (), user["samples"] / duration)
    if "tokens" in user:
        fw.add(n.TRAIN_TOKENS, (), user["tokens"])
        if duration > 0:
            fw.set(n.TRAIN_TOKEN_RATE, (), user["tokens"] / duration)


def _emit_step_spans(pipeline, tracker, info, duration, compute, wait, count, nbytes) -> None:
    index, t0, t1, user = info["index"], info["t_start"], info["t_end"], info["user"]
    off = pipeline.offset_ns
    attrs: list[tuple[str, Any]] = [
        (n.STEP, index),
        (n.STEP_SOURCE, info["source"]),
        (n.STEP_DURATION, duration),
        (n.STEP_COMPUTE, compute),
        (n.STEP_COLLECTIVE_WAIT, wait),
        (n.STEP_COLLECTIVES, count),
        (n.STEP_BYTES, nbytes),
    ]
    if info["occurrence"]:
        attrs.append((n.STEP_OCCURRENCE, info["occurrence"]))
    if info["serial"] == 1:
        attrs.append((n.STEP_SETUP, True))
    if info.get("uncounted"):
        attrs.append((n.STEP_UNCOUNTED, True))
    for key, attr in (
        ("loss", n.STEP_LOSS),
        ("learning_rate", n.STEP_LR),
        ("samples", n.STEP_SAMPLES),
        ("tokens", n.STEP_TOKENS),
    ):
        if key in user:
            attrs.append((attr, user[key]))
    trace, root, rank_span, parent, shared = info["trace"], info["root"], info["rank_span"], info["parent"], info["shared"]
    if parent is not None and trace != shared:  # under the caller's span, in its trace: linked to the step's root
        span = SpanData(n.SPAN_RANK_STEP, trace, rank_span, parent[1], t0 + off, t1 + off, attrs, links=((shared, root, ()),))
    else:  # under the step's root; linked to the caller's span when begun inside one
        span = SpanData(n.SPAN_RANK_STEP, trace, rank_span, root, t0 + off, t1 + off, attrs, remote_parent=tracker.rank != tracker.root_rank)
        if parent is not None:
            span.links = ((parent[0], parent[1], ()),)
    if info["error"]:
        etype, message = info["error"]
        span.error = f"{etype}: {message}"
        span.attributes.append((n.ERROR_TYPE, etype))
        span.events.append((n.EXCEPTION_EVENT, t1 + off, [(n.EXCEPTION_TYPE, etype), (n.EXCEPTION_MESSAGE, message)]))
    pipeline.outbox.add_span(span)
    root_span = None
    if tracker.rank == tracker.root_rank:
        root_span = SpanData(
            n.SPAN_STEP,
            shared,
            root,
            None,
            t0 + off,
            t1 + off,
            [(n.STEP, index), (n.STEP_SOURCE, info["source"]), (n.WORLD_SIZE, tracker.world)]
            + ([(n.STEP_OCCURRENCE, info["occurrence"])] if info["occurrence"] else []),
        )
    if tracker.roots is not None:  # the root covers every rank's step: the root rank emits it once they are in
        tracker.roots.add(shared, t0 + off, t1 + off, root_span)
    elif root_span is not None:
        pipeline.outbox.add_span(root_span)

    # Each backward pass, and before it the forward that led to it: the time since the step began or since
    # the previous backward ended (gradient accumulation: one forward and backward per micro-batch).
    end = t0
    for a, b in sorted(info["backward"]):
        if a > end:
            pipeline.outbox.add_span(
                SpanData(n.SPAN_PHASES["forward"], trace, new_span_id(), rank_span, end + off, a + off, [(n.PHASE_NAME, "forward")])
            )
        pipeline.outbox.add_span(
            SpanData(n.SPAN_PHASES["backward"], trace, new_span_id(), rank_span, a + off, b + off, [(n.PHASE_NAME, "backward")])
        )
        end = max(end, b)


SLOW_STEP_MIN_EXCESS = 0.1  # seconds a slow step must exceed the median by, besides the factor


def _maybe_warn_slow(pipeline: Any, tracker: StepTracker, index: int, duration: float, median, info: dict) -> None:
    # The caller checked the factor, warm-up and history already.
    if duration - median < SLOW_STEP_MIN_EXCESS:
        return  # millisecond steps: a garbage collection is not worth a warning
    serial = info["serial"]  # steps begun, not the program's numbers: those may restart every epoch
    if serial - tracker._last_slow_warning < 100:
        return  # one warning per hundred steps at most
    tracker._last_slow_warning = serial
    message = f"step {index} took {duration:.3f} s, {duration / median:.1f}x the median of recent steps ({median:.3f} s)"
    _log.warning("%s", message)

    off = pipeline.offset_ns
    t = info["t_end"] + off
    trace = info["trace"] if info["sampled"] else new_trace_id()
    parent = info["rank_span"] if info["sampled"] else None
    span = SpanData(
        n.SPAN_WARNING,
        trace,
        new_span_id(),
        parent,
        t,
        t,
        [(n.WARNING_KIND, "slow_step"), (n.WARNING_MESSAGE, message), (n.STEP, index)],
    )
    span.events.append((n.WARNING_EVENT, t, [(n.WARNING_KIND, "slow_step"), (n.WARNING_MESSAGE, message)]))
    pipeline.outbox.add_span(span)
