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

from typing import Any

from ._version import __version__
from .instrumentor import TorchDistributedInstrumentor

__all__ = ["instrument", "uninstrument", "flush", "deep_capture", "TorchDistributedInstrumentor", "__version__"]


def instrument(**options: Any) -> None:
    """Start capturing. Keyword options override environment variables; see ``otel_torchdist.config``.

    Raises ``ValueError`` naming the option or variable when a setting is invalid (nothing is patched
    then). Calling it again while instrumented only warns.
    """
    TorchDistributedInstrumentor().instrument(**options)


def uninstrument() -> None:
    """Restore every patched attribute, flush telemetry, stop background threads and servers."""
    TorchDistributedInstrumentor().uninstrument()


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
