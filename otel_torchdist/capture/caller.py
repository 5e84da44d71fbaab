"""The caller's OpenTelemetry context: taken on the training thread as it is, resolved off it.

A record keeps the caller's current ``Context`` (``opentelemetry.context.get_current()``, one call), or None
when that context is empty, as it is in a loop with no span of its own: the drain resolves it into the span
context a span's parent comes from. Only public OpenTelemetry APIs, and nothing but a reference on the
training thread.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import context as _context
from opentelemetry import trace as _trace

from . import step_context as S

get_current = _context.get_current


def current() -> Any:
    """The caller's current Context, or None when it holds nothing."""
    return get_current() or None


def span_context(ctx: Any, step: tuple | None = None) -> Any:
    """The valid SpanContext of the current span in ``ctx`` (a record's PARENT), or None; None too when it is
    the rank's span of ``step`` itself (made current inside ``otel_torchdist.step()``): the step's own
    context then applies, framework spans included."""
    if ctx is None:
        return None
    sc = _trace.get_current_span(ctx).get_span_context()
    if not sc.is_valid or (step is not None and sc.span_id == step[S.SPAN] and sc.trace_id == step[S.TRACE]):
        return None
    return sc
