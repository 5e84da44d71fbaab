"""``OTEL_TRACES_SAMPLER`` semantics, decided from the trace id alone.

The ratio decision compares the trace id's low 64 bits with ``ratio * 2**64``, as the SDK's
``TraceIdRatioBased`` does. Because it looks only at the trace id, ranks that share a trace id (one trace
per training step) all keep or all drop the same traces, with no communication.
"""

from __future__ import annotations

_MAX = 1 << 64


class Sampler:
    narrows = False  # replaces the library's step choice when configured (steps.StepTracker.sampled)
    exemplars = True  # a span it keeps is exported: metrics may point at it

    def __init__(self, name: str, arg: float) -> None:
        self.name = name
        self.parent_based = name.startswith("parentbased_")
        root = name.removeprefix("parentbased_")
        if root == "always_on":
            self.bound = _MAX
        elif root == "always_off":
            self.bound = 0
        else:
            self.bound = int(arg * _MAX)

    def root(self, trace_id: int) -> bool:
        return (trace_id & (_MAX - 1)) < self.bound

    def decide(self, trace_id: int, parent_sampled: bool | None) -> bool:
        """``parent_sampled`` is None for a root span."""
        if parent_sampled is not None and self.parent_based:
            return parent_sampled
        return self.root(trace_id)
