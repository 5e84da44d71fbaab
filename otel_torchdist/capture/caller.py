"""The caller's OpenTelemetry context: taken on the training thread as it is, resolved off it.

A record keeps the caller's current ``Context``, or None when that context is empty, as it is in a loop with
no span of its own: the drain resolves it into the span context a span's parent comes from. Capture knows no
OpenTelemetry: the export side puts its two functions here when instrumentation starts (:func:`install`,
``export/caller_context.py``: OpenTelemetry's ``context.get_current()`` and the resolution), and until then
there is no caller's context. Read ``caller.get_current`` at the call, not bound at import, so the installed
one is the one called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _none(*_: Any) -> None:
    return None


get_current: Callable[[], Any] = _none  # the caller's current Context: one call, nothing resolved here
span_context: Callable[..., Any] = _none  # (Context or None, step context or None) -> SpanContext or None


def install(current: Callable[[], Any], resolve: Callable[..., Any]) -> None:
    """The export side's ``get_current`` and ``span_context`` (see export/caller_context.py)."""
    global get_current, span_context
    get_current, span_context = current, resolve


def current() -> Any:
    """The caller's current Context, or None when it holds nothing."""
    return get_current() or None
