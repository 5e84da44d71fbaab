"""Spans the framework captures produce (optimizer steps, sharding, checkpoints), the training thread's half:
cheap here, built on the drain thread (drain/framework_spans.py).

A capture takes a :func:`snapshot` of where it stands (the caller's OpenTelemetry context, the framework
context, the training step: three references) and, when its work is done, hands a description to
:func:`span_later`; the drain resolves the trace, applies sampling and admission. A capture whose children
must point at it (an optimizer step's collectives) fixes its span id up front with :func:`open_span`.
"""

from __future__ import annotations

from typing import Any

from ..ids import new_span_id, new_trace_id
from . import caller
from . import record as R
from . import step_context as S
from .context import PARENT_SPAN, PARENT_TRACE

BUILD = R.reserve("framework_span")  # drain/framework_spans.py's build


def snapshot() -> tuple[Any, tuple | None, tuple | None]:
    return caller.get_current() or None, R.TLS.ctx, R.STEP[0]


def untraced(user: Any, fw: tuple | None, step: tuple | None) -> bool:
    """Whether a span opened under this context would be dropped at the drain, so need not be made: no
    span of the caller's (but the one the step began in) and no framework span above it, in a training step
    that is not traced (the drain decides alike, Pipeline.parent_of)."""
    return (
        step is not None and not step[S.SAMPLED] and (user is None or user is step[S.AROUND])
        and (fw is None or fw[PARENT_TRACE] is None)
    )  # fmt: skip


def open_span(snap: tuple) -> tuple[int, int, int | None]:
    """(trace id, span id, parent span id) for a span whose children are recorded before it ends."""
    user, fw, step = snap
    ctx = caller.span_context(user, step)
    if ctx is not None:
        return ctx.trace_id, new_span_id(), ctx.span_id
    if fw is not None and fw[PARENT_TRACE] is not None:
        return fw[PARENT_TRACE], new_span_id(), fw[PARENT_SPAN]
    if step is not None:
        return step[S.TRACE], new_span_id(), step[S.SPAN]
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
    then: tuple = (),
) -> None:
    """Queue a span from ``t_start`` to ``t_end`` (perf_counter_ns). ``then``: metric updates the drain
    applies first, sampled or not (see record.update_metrics)."""
    R.queue((BUILD, name, t_start, t_end, attributes, snap, opened, error, events, then))
