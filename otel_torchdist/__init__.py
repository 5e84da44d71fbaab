"""otel-torchdist: OpenTelemetry traces and metrics for distributed PyTorch training.

    import otel_torchdist
    otel_torchdist.instrument()      # before or after init_process_group
    ...train...
    otel_torchdist.uninstrument()    # optional: process exit flushes too

Every collective (``torch.distributed`` and its process groups) becomes a span and metrics tagged with
rank, process group and op, with nccl-tests' message size and bus bandwidth. Options: see
:class:`otel_torchdist.config.Config` (keyword options override ``OTEL_*`` environment variables).
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from ._version import __version__
from .callbacks import HangEvent, NonFiniteLossEvent, SlowStepEvent, StragglerEvent, on
from .logs import get_logger, rank_zero_info, rank_zero_only, rank_zero_warning

__all__ = [
    "instrument",
    "uninstrument",
    "flush",
    "step",
    "step_begin",
    "step_end",
    "record_step",
    "set_total_steps",
    "deep_capture",
    "on",
    "on_hang",
    "HangEvent",
    "StragglerEvent",
    "SlowStepEvent",
    "NonFiniteLossEvent",
    "get_logger",
    "rank_zero_info",
    "rank_zero_warning",
    "rank_zero_only",
    "TorchDistributedInstrumentor",
    "__version__",
]


def __getattr__(name: str) -> Any:
    # torch is imported when instrumenting, not with the package: the CLI's analysis commands run without it
    if name == "TorchDistributedInstrumentor":
        from .instrumentor import TorchDistributedInstrumentor

        return TorchDistributedInstrumentor
    raise AttributeError(f"module 'otel_torchdist' has no attribute {name!r}")


def instrument(**options: Any) -> None:
    """Start capturing. Keyword options override environment variables; see ``otel_torchdist.config``.

    Raises ``ValueError`` naming the option or variable when a setting is invalid (nothing is patched
    then). Calling it again while instrumented only warns.
    """
    from .instrumentor import TorchDistributedInstrumentor

    TorchDistributedInstrumentor().instrument(**options)


def uninstrument() -> None:
    """Restore every patched attribute, flush telemetry, stop background threads and servers."""
    from .instrumentor import TorchDistributedInstrumentor

    TorchDistributedInstrumentor().uninstrument()


def _tracker():
    steps = sys.modules.get("otel_torchdist.steps")  # not imported: nothing instrumented yet
    return steps.TRACKER[0] if steps is not None else None  # the running runtime's step tracker, or None


def step_begin(n: int | None = None, *, total: int | None = None) -> int | None:
    """Start training step ``n`` (default: the next one). Marking steps turns off optimizer-closed steps.

    Begun inside a span of yours, this rank's step span is that span's child (in its trace)."""
    tracker = _tracker()
    if tracker is None:
        return None
    tracker.explicit = True
    if total is not None:
        tracker.total = int(total)
    return tracker.begin(n, source="explicit", parent=_otel_spans().current_span_ids())


def _otel_spans():
    from .export import otel_spans

    return otel_spans


def step_end() -> None:
    """End the current step (its spans and metrics are built in the background)."""
    tracker = _tracker()
    if tracker is not None:
        tracker.end()


@contextlib.contextmanager
def step(n: int | None = None, *, total: int | None = None):
    """``with otel_torchdist.step(n):`` marks one training (or evaluation) step explicitly.

    All ranks' spans of step ``n`` share one trace; inside a span of yours, this rank's step span is its child
    instead, linked to the step's shared root. In a traced step, the step's span is the current span inside
    the block: spans you start there are its children. ``total`` (the number of steps) enables the ETA
    metric. With ``compile_capture="sampled"``, compiled code's collectives are recorded in sampled steps.
    """
    tracker = _tracker()
    if tracker is None:
        yield
        return
    from .capture import record
    from .capture import step_context as S

    step_begin(n, total=total)
    ctx = record.STEP[0]
    traced = ctx is not None and ctx[S.SAMPLED]
    token = _otel_spans().attach_span(ctx[S.TRACE], ctx[S.SPAN], True) if traced else None
    deep = None
    if traced and tracker.cfg.compile_capture == "sampled":
        from .capture.deep import deep_capture as _deep

        deep = _deep()
        deep.__enter__()
    try:
        yield
    finally:
        if deep is not None:
            deep.__exit__(None, None, None)
        if token is not None:
            _otel_spans().detach(token)
        step_end()


def record_step(
    *,
    loss: float | None = None,
    learning_rate: float | None = None,
    samples: float | None = None,
    tokens: float | None = None,
) -> None:
    """Values of the current step: loss and learning rate (gauges), samples and tokens (summed; with the
    step time they give throughput). Also set as attributes of the step's span."""
    tracker = _tracker()
    if tracker is not None:
        tracker.record(loss=loss, learning_rate=learning_rate, samples=samples, tokens=tokens)


def set_total_steps(total: int) -> None:
    """The run's number of steps, for the ETA metric."""
    tracker = _tracker()
    if tracker is not None:
        tracker.total = int(total)


def deep_capture():
    """Context manager: also record the collectives of ``torch.compile``d code run inside it.

    Costs every op a dispatch-mode round trip, so use it on the steps you want to look at.
    """
    from .capture.deep import deep_capture as _deep_capture

    return _deep_capture()


def flush(timeout: float | None = None) -> bool:
    """Send everything recorded so far now. True when every exporter accepted it within the timeout."""
    from . import runtime

    rt = runtime.current()
    return rt.flush(timeout) if rt is not None else True


def on_hang(fn):
    """``on("hang", fn)``: ``fn(HangEvent)`` when a collective hangs on this rank, with the ranks that never came."""
    return on("hang", fn)
