"""Spans the framework captures produce (optimizer steps, sharding, checkpoints): cheap on the training
thread, built on the background thread.

On the training thread a capture takes a :func:`snapshot` of where it stands (the caller's OpenTelemetry
span, the framework context, the training step: three references) and, when its work is done, hands a
description to :func:`span_later`; the drain thread resolves the trace, applies sampling and encodes.
A capture whose children must point at it (an optimizer step's collectives) fixes its span id up front
with :func:`open_span`.
"""

from __future__ import annotations

from typing import Any

from .. import names as n
from ..telemetry import SpanData
from ..drain.spans import new_span_id, new_trace_id
from . import record as R
from .caller import get_current as _get_current
from .caller import span_context


def snapshot() -> tuple[Any, tuple | None, tuple | None]:
    return _get_current() or None, R.TLS.ctx, R.STEP[0]


def untraced(user: Any, fw: tuple | None, step: tuple | None) -> bool:
    """Whether a span opened under this context would be dropped at the drain, so need not be made: no
    span of the caller's and no framework span above it, in a training step that is not traced (the drain
    decides alike, Pipeline.parent_of)."""
    return user is None and (fw is None or fw[3] is None) and step is not None and not step[3]


def open_span(snap: tuple) -> tuple[int, int, int | None]:
    """(trace id, span id, parent span id) for a span whose children are recorded before it ends."""
    user, fw, step = snap
    ctx = span_context(user, step)
    if ctx is not None:
        return ctx.trace_id, new_span_id(), ctx.span_id
    if fw is not None and fw[3] is not None:
        return fw[3], new_span_id(), fw[4]
    if step is not None:
        return step[1], new_span_id(), step[2]
    return new_trace_id(), new_span_id(), None


def span_later(
    name: str,
    t_start: int,
    t_end: int,
    attributes: list[tuple[str, Any]],
    snap: tuple,
    opened: tuple[int, int, int | None] | None = None,
    error: str | None = None,
    events: list | None = None,
    then: Any = None,
) -> None:
    """Queue a span from ``t_start`` to ``t_end`` (perf_counter_ns). ``then(pipeline)`` runs first, on the
    drain thread (metric updates)."""
    R.defer(build, name, t_start, t_end, attributes, snap, opened, error, events, then)


@R.drained
def build(pipeline, name, t_start, t_end, attributes, snap, opened, error, events, then) -> None:
    if then is not None:
        then(pipeline)
    if opened is None:
        trace_id, parent, sampled = pipeline.parent_of(*snap)
        span_id = new_span_id()
    else:
        trace_id, span_id, parent = opened
        sampled = pipeline.sampled(trace_id, *snap)
    step = snap[2]
    if not sampled:
        if name != n.SPAN_WARNING:
            return
        trace_id, span_id, parent = new_trace_id(), new_span_id(), None  # a warning is never sampled away
    elif step is not None and name != n.SPAN_WARNING:
        stats = pipeline.step_stats.get(step[0])
        if stats is None and step[0] > pipeline.last_closed_step:
            stats = pipeline.open_step_stats(step[0])
        if stats is not None and not pipeline.admit(stats, step, span_id, parent):
            return
    if callable(attributes):  # described only when sampled
        attributes = attributes()
    off = pipeline.offset_ns
    start = t_start + off
    end = max(t_end + off, start)
    if opened is not None:  # over the collectives it issued that ended after it returned (Pipeline.process)
        end = max(end, pipeline.children_ends.pop(span_id, 0))
    span = SpanData(name, trace_id, span_id, parent, start, end, attributes, error=error)
    if events:
        span.events.extend(events)
    if opened is not None:  # its later collectives are checked against its end
        ends = pipeline.framework_ends
        if len(ends) >= 4096:
            ends.clear()
        ends[span_id] = span.end_ns
    pipeline.add_span(span)
