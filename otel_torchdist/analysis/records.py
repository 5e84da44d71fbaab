"""Typed records the loader makes of OTLP/JSON, one per span or metric snapshot.

They are the only input of the builders (``builders.py``), so a builder can be tested with records made
by hand and never sees JSON. Attribute keys come from :mod:`otel_torchdist.names`; a record keeps only
what some table needs. Times are nanoseconds since the epoch (the spans' own clock), durations seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True, kw_only=True)
class Problem:
    """Something in the input that could not be used, and where."""

    path: str
    """The file (or the run folder itself)."""
    line: int | None = None
    """1-based line number, when the problem is a line."""
    message: str
    """A sentence saying what is wrong and what was done about it."""

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else self.path
        return f"{where}: {self.message}"


@dataclass(slots=True, kw_only=True)
class RankResource:
    """The OpenTelemetry resource of one rank's process (from a request or ``resource.rank<R>.json``)."""

    rank: int
    world_size: int | None = None
    run_id: str | None = None
    backend: str | None = None
    host: str | None = None


@dataclass(slots=True, kw_only=True)
class Collective:
    """One collective as one rank recorded it (a span with ``torchdist.collective.*`` attributes)."""

    rank: int
    op: str
    """The API called (span name), e.g. ``all_gather_into_tensor``."""
    kind: str | None
    """Its nccl-tests family (``bandwidth.KINDS``)."""
    group: str
    """The group as metric labels name it: its description, else ``pg<name>``."""
    group_name: str
    """The process group's name: the same on every member rank, so (group_name, seq) matches ranks."""
    group_size: int | None
    group_ranks: tuple[int, ...] | None
    seq: int | None
    message_size: int
    start_ns: int
    end_ns: int
    duration_s: float
    is_async: bool = False
    phase: str | None = None
    module: str | None = None
    framework: str | None = None
    end_source: str | None = None
    dtype: str | None = None
    trace_id: str = ""
    span_id: str = ""
    parent_id: str | None = None
    error: str | None = None


@dataclass(slots=True, kw_only=True)
class RankStep:
    """One rank's part of one training step (``train.rank_step``)."""

    rank: int
    step: int
    trace_id: str
    span_id: str
    start_ns: int
    end_ns: int
    duration_s: float
    occurrence: int = 0
    """How many times the rank began this step number before (epochs numbered again, evaluation steps)."""
    setup: bool = False
    """The rank's first step, which holds its set-up."""
    counted: bool = True
    """In the step metrics' totals (``torchdist.step.uncounted`` absent)."""
    compute_s: float | None = None
    wait_s: float | None = None
    collectives: int | None = None
    message_bytes: int | None = None
    samples: float | None = None
    tokens: float | None = None
    loss: float | None = None


@dataclass(slots=True, kw_only=True)
class Phase:
    """A phase span (``train.forward``, ``train.backward``) inside a rank's step."""

    rank: int
    phase: str
    trace_id: str
    parent_id: str | None
    start_ns: int
    end_ns: int


@dataclass(slots=True, kw_only=True)
class Hang:
    """A ``collective.hang`` span: a collective in flight beyond the watchdog's threshold."""

    rank: int
    op: str
    group: str
    group_name: str
    seq: int | None
    waited_s: float
    threshold_s: float | None
    start_ns: int
    end_ns: int
    group_ranks: tuple[int, ...] | None = None
    """The group's member global ranks (hang spans carry them: the rank that never arrived is among them)."""
    missing_ranks: tuple[int, ...] | None = None
    """The ranks the hang board saw not starting the collective when it was reported (``torchdist.hang.missing_ranks``)."""


@dataclass(slots=True, kw_only=True)
class WarningRecord:
    """A ``torchdist.warning`` span or span event."""

    rank: int
    kind: str
    message: str
    time_ns: int


@dataclass(slots=True, kw_only=True)
class Span:
    """Any other span: ``train.step``, ``optimizer.step``, ``sharding.*``, ``ddp.init``, ``checkpoint.*``."""

    rank: int
    name: str
    trace_id: str
    span_id: str
    parent_id: str | None
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


@dataclass(slots=True, kw_only=True)
class Histogram:
    count: int
    sum: float
    bounds: tuple[float, ...]
    bucket_counts: tuple[int, ...]
    min: float | None = None
    max: float | None = None


@dataclass(slots=True, kw_only=True)
class MetricPoint:
    attributes: dict[str, Any]
    value: float | Histogram


@dataclass(slots=True, kw_only=True)
class MetricSnapshot:
    """One export of one rank's metrics (cumulative: the last snapshot holds the run's totals)."""

    rank: int
    time_ns: int
    metrics: dict[str, list[MetricPoint]]
    """Metric name (``names.Metric.name``) to its data points."""
    instance: str = ""
    """The process's ``service.instance.id``: a rank an elastic restart ran again has one per attempt."""


Record = RankResource | Collective | RankStep | Phase | Hang | WarningRecord | Span | MetricSnapshot
