"""Spans the framework captures describe (optimizer steps, sharding, checkpoints), built on the drain thread
from what capture/framework_spans.py queued: the trace they belong to, sampling and the step's admission.
"""

from __future__ import annotations

from .. import names as n
from ..capture import record as R
from ..capture import step_context as S
from ..ids import new_span_id, new_trace_id
from ..telemetry import SpanData
from .framework_metrics import apply


@R.drained_as("framework_span")
def build(pipeline, name, t_start, t_end, attributes, snap, opened, error, events, then) -> None:
    if then:
        apply(pipeline, then)
    if opened is None:
        trace_id, parent, sampled = pipeline.parent_of(*snap)
        span_id = new_span_id()
    else:
        trace_id, span_id, parent = opened
        sampled = pipeline.sampled(trace_id, *snap)
    _caller, _framework, step = snap  # capture/framework_spans.snapshot
    if not sampled:
        if name != n.SPAN_WARNING:
            return
        trace_id, span_id, parent = new_trace_id(), new_span_id(), None  # a warning is never sampled away
    elif step is not None and name != n.SPAN_WARNING:
        serial = step[S.SERIAL]
        stats = pipeline.step_stats.get(serial)
        if stats is None and serial > pipeline.last_closed_step:
            stats = pipeline.open_step_stats(serial)
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
    pipeline.outbox.add_span(span)
