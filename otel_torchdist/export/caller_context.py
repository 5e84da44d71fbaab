"""What capture/caller.py takes from OpenTelemetry: the caller's current context on the training thread, and its
resolution into the span a record's span hangs from, on the drain. Public OpenTelemetry APIs only."""

from __future__ import annotations

from typing import Any

from opentelemetry import context as _context
from opentelemetry import trace as _trace

from ..capture import caller
from ..capture import step_context as S

get_current = _context.get_current


def span_context(ctx: Any, step: tuple | None = None) -> Any:
    """The valid SpanContext of the current span in ``ctx`` (a record's PARENT), or None; None too when it is
    the rank's span of ``step`` itself (made current inside ``otel_torchdist.step()``), or the program's span
    the step began in (a span around the loop, or the iteration's around ``step_begin()``): the step's own
    context then applies, framework spans included, and the step's sampling (under a job's span, every
    collective of every step was that span's child, traced, and the steps' own spans were empty)."""
    if ctx is None or step is not None and ctx is step[S.AROUND]:
        return None
    sc = _trace.get_current_span(ctx).get_span_context()
    if not sc.is_valid:
        return None
    if step is not None:
        if sc.span_id == step[S.SPAN] and sc.trace_id == step[S.TRACE]:
            return None
        around = step[S.AROUND]
        if around is not None:
            began_in = _trace.get_current_span(around).get_span_context()
            if began_in.span_id == sc.span_id and began_in.trace_id == sc.trace_id:
                return None
    return sc


def install() -> None:
    """Give capture these two (capture/caller.py), before anything records."""
    caller.install(get_current, span_context)
