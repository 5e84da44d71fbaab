"""The analysis as typed, versioned records: what ``analyze --json`` prints and the renderers read.

``SCHEMA`` and ``VERSION`` head every JSON document. Adding a field keeps the version; renaming or removing
one, or changing a field's meaning, bumps it. Times are seconds, sizes bytes, bandwidths GB/s (1e9 bytes/s,
as nccl-tests prints them). Every table says which data it came from (``source``): metrics are complete,
traces hold the sampled steps only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

SCHEMA = "otel-torchdist.analysis"
VERSION = 1
COMPARE_SCHEMA = "otel-torchdist.compare"
COMPARE_VERSION = 1


@dataclass(kw_only=True)
class RunInfo:
    path: str
    run_ids: list[str]
    world_size: int | None
    """From the ranks' resources (``torchdist.world_size``)."""
    ranks: list[int]
    """Ranks that left any telemetry here."""
    missing_ranks: list[int]
    """Ranks below the world size that left none."""
    backend: str | None
    hosts: list[str]
    trace_ranks: list[int]
    metric_ranks: list[int]
    spans: int
    collective_spans: int
    traced_steps: list[int]
    metric_snapshots: int
    files: int
    lines: int
    skipped_lines: int
    problems: list[str] = field(default_factory=list)
    """Lines or files that could not be used, one sentence each."""
    notes: list[str] = field(default_factory=list)
    """What is missing and what that means for the tables."""


@dataclass(kw_only=True)
class OpRow:
    op: str
    kind: str | None
    group: str
    group_size: int | None
    rank: int | None
    """None: all ranks together; a rank for the per-rank rows (noise level 2)."""
    ranks: int
    count: int
    """Records: one per rank per call (all ranks together unless ``rank`` is set)."""
    calls_per_rank: float
    errors: int
    total_bytes: int
    mean_message_size: float
    total_s: float
    """The time of the calls that completed (a failed or unfinished call's is no transfer's)."""
    mean_s: float
    p50_s: float | None
    p99_s: float | None
    quantiles_from: str | None
    """``spans`` (within 1%, over the traced calls) or ``histogram`` (interpolated in the duration buckets)."""
    algbw_gbps: float | None
    """sum(S) / sum(t)."""
    busbw_gbps: float | None
    """algbw times nccl-tests' bus factor for ``kind`` and ``group_size``."""
    bus_factor: float | None
    source: str
    """``metrics`` (complete), ``spans`` (traced calls only) or ``metrics+spans`` (some ranks each)."""


@dataclass(kw_only=True)
class SizeRow:
    """Bandwidth of one op at one message size (a power-of-two bucket of S), from spans."""

    op: str
    kind: str | None
    group_size: int | None
    size_floor: int
    """Messages of size_floor <= S < 2 * size_floor bytes."""
    count: int
    mean_message_size: float
    total_s: float
    algbw_gbps: float | None
    busbw_gbps: float | None


@dataclass(kw_only=True)
class OpsTable:
    source: str
    rows: list[OpRow]
    per_rank: list[OpRow] = field(default_factory=list)
    by_size: list[SizeRow] = field(default_factory=list)


@dataclass(kw_only=True)
class ModuleOp:
    op: str
    phase: str
    count: int
    mean_message_size: float
    mean_s: float


@dataclass(kw_only=True)
class ModuleRow:
    module: str
    """``Global`` for everything, else the module's FQN as recorded (FSDP unit, tensor-parallel module)."""
    depth: int
    counts: dict[str, int]
    """Phase to count, counting what submodules issued (CommDebugMode's counting)."""
    total: int
    ops: list[ModuleOp] = field(default_factory=list)
    """Per op and phase (noise level 2)."""


@dataclass(kw_only=True)
class ShardingRow:
    name: str
    module: str | None
    count: int
    """How many such spans (identical descriptions) the shown rank recorded."""
    parameters: int | None = None
    original_shapes: list[str] | None = None
    sharded_shapes: list[str] | None = None
    placements_before: list[str] | None = None
    placements_after: list[str] | None = None
    mesh_shape: list[int] | None = None
    mesh_dims: list[str] | None = None
    plan: list[str] | None = None


@dataclass(kw_only=True)
class ModulesTable:
    source: str
    rank: int | None
    """The rank whose counts are shown (the lowest with spans)."""
    phases: list[str]
    rows: list[ModuleRow]
    consistent: bool
    """Whether every rank recorded the same counts per module, phase and op."""
    per_rank_totals: list[dict[str, int]] = field(default_factory=list)
    sharding: list[ShardingRow] = field(default_factory=list)
    """Sharding spans of the shown rank (noise level 1 and up)."""


@dataclass(kw_only=True)
class StragglerRow:
    rank: int
    steps: int
    """Traced steps the step columns average over (the run's first step, which holds set-up, left out)."""
    mean_step_s: float | None
    mean_compute_s: float | None
    mean_wait_s: float | None
    wait_share: float | None
    total_compute_s: float | None
    """All steps, from metrics (includes set-up in the first step)."""
    total_wait_s: float | None
    matched: int
    """Collectives matched with the other ranks by (group, sequence number)."""
    mean_late_s: float | None
    """Mean of (this rank's start - the earliest start) over the matched collectives."""
    max_late_s: float | None
    last_arrivals: int
    """Matched collectives this rank was the last to start."""
    score: float | None
    """(median compute - lowest median compute of any rank) / median step time: how much of a step the
    others spend waiting for this rank (the library's straggler score, stragglers.scores, over these steps;
    medians, so that one odd step does not name a rank that is not slow)."""
    median_compute_s: float | None = None
    median_step_s: float | None = None


@dataclass(kw_only=True)
class Stragglers:
    source: str
    rows: list[StragglerRow]
    slowest_rank: int | None
    verdict: str
    matched: int
    """Collectives matched across all their group's ranks."""
    partial: int
    """Collectives seen on only some of their group's ranks."""
    max_skew_s: float | None
    mean_skew_s: float | None
    exchange_slowest: int | None
    """The library's own verdict at its last straggler exchange (metric), when there was one."""


@dataclass(kw_only=True)
class StepCell:
    rank: int
    duration_s: float
    compute_s: float | None
    wait_s: float | None


@dataclass(kw_only=True)
class StepRow:
    step: int
    ranks: int
    duration_s: float
    """The longest rank's step."""
    mean_compute_s: float | None
    mean_wait_s: float | None
    comm_share: float | None
    """Mean wait / mean step time: the share of the step spent in collectives."""
    async_share: float | None
    """Share of collective time in async collectives (which can overlap compute: an upper bound)."""
    collectives: int
    slowest_rank: int | None
    """The rank with the most compute in this step."""
    start_ns: int
    trace_id: str
    """The step's trace (the same on every rank): look it up in Jaeger or Tempo."""
    cells: list[StepCell] = field(default_factory=list)
    """Every rank's values (noise level 1 and up)."""
    occurrence: int = 0
    """How many times this step number began before (a program that numbers its epochs' steps from 0 again)."""
    setup: bool = False
    """The run's first step, which holds set-up (imports, initialisation, the model's construction)."""

    @property
    def label(self) -> str:
        """``12``; ``12#2`` for the third step numbered 12 (numbering restarted): what ``plot --step`` takes."""
        return f"{self.step}" + (f"#{self.occurrence}" if self.occurrence else "")


@dataclass(kw_only=True)
class StepTotals:
    rank: int
    steps: int
    total_s: float
    compute_s: float
    wait_s: float
    samples: float | None = None
    tokens: float | None = None


@dataclass(kw_only=True)
class OverlapRow:
    rank: int
    model: str
    comm_s: float
    overlap_s: float
    share: float | None


@dataclass(kw_only=True)
class StepsTable:
    source: str
    rows: list[StepRow]
    totals: list[StepTotals]
    """Per rank, from metrics: every step."""
    step_time_s: float | None
    """Representative step time: median of traced steps (first step left out) when there are 3 or more,
    else the metrics' mean."""
    step_time_from: str | None
    step_compute_s: float | None = None
    """Compute per rank-step over the steps the step time is taken over, by the same statistic."""
    step_wait_s: float | None = None
    """Collective wait per rank-step over those steps."""
    step_statistic: str | None = None
    """``median`` (of traced steps) or ``mean`` (the metrics' totals, every step): of the step time and its split."""
    samples_per_step: float | None
    """All ranks together, from the samples recorded with ``record_step`` (metrics)."""
    tokens_per_step: float | None
    overlap: list[OverlapRow]
    """DDP's own measure of backward communication overlapped with compute (metrics), per rank."""
    overlap_note: str


@dataclass(kw_only=True)
class HangRank:
    ranks: list[int]
    """Ranks that share these values."""
    started: int | None
    completed: int | None
    in_flight_s: float | None = None


@dataclass(kw_only=True)
class HangGroup:
    group: str
    members: list[int]
    ranks: list[HangRank]
    stuck_seq: int | None
    op: str | None
    never_arrived: list[int]
    waiting: list[int]
    no_data: list[int]
    verdict: str | None


@dataclass(kw_only=True)
class HangSpanRow:
    rank: int
    op: str
    group: str
    seq: int | None
    waited_s: float
    resolved: bool = False
    """The collective completed later (the rank's last completed sequence number passed it): slow, not stuck."""


@dataclass(kw_only=True)
class FailureRow:
    rank: int
    op: str
    group: str
    seq: int | None
    duration_s: float
    error: str


@dataclass(kw_only=True)
class HangReport:
    source: str
    groups: list[HangGroup]
    hangs: list[HangSpanRow]
    failures: list[FailureRow]
    failures_total: int
    verdict: str


@dataclass(kw_only=True)
class GpuSeries:
    rank: int
    gpu: str
    model: str | None
    times_ns: list[int]
    utilization: list[float]


@dataclass(kw_only=True)
class WarningRow:
    rank: int
    kind: str
    message: str


@dataclass(kw_only=True)
class Report:
    schema: str = SCHEMA
    version: int = VERSION
    noise_level: int = 0
    run: RunInfo
    ops: OpsTable
    modules: ModulesTable
    stragglers: Stragglers
    steps: StepsTable
    hangs: HangReport
    gpu: list[GpuSeries]
    warnings: list[WarningRow]
    warnings_total: int


@dataclass(kw_only=True)
class CompareSide:
    path: str
    run_ids: list[str]
    world_size: int | None
    step_time_s: float | None
    step_time_from: str | None
    throughput: float | None
    throughput_unit: str
    """``samples/s`` (recorded samples) or ``rank-steps/s`` (ranks / step time: equal per-rank batches)."""


@dataclass(kw_only=True)
class OpDelta:
    op: str
    group: str
    busbw_a: float | None
    busbw_b: float | None
    change: float | None
    """busbw_b / busbw_a - 1."""
    mean_s_a: float | None
    mean_s_b: float | None
    source_a: str | None = None
    """The row's ``source`` in A (``metrics``, ``spans`` or ``metrics+spans``)."""
    source_b: str | None = None


@dataclass(kw_only=True)
class CompareReport:
    schema: str = COMPARE_SCHEMA
    version: int = COMPARE_VERSION
    a: CompareSide
    b: CompareSide
    step_speedup: float | None
    """t_A / t_B: how many times faster a step of B is."""
    throughput_speedup: float | None
    """throughput_B / throughput_A."""
    rank_ratio: float | None
    """N_B / N_A."""
    strong_efficiency: float | None
    """Same global work per step (strong scaling): (t_A / t_B) / (N_B / N_A)."""
    weak_efficiency: float | None
    """Same work per rank (weak scaling): t_A / t_B, ideal 1 (step time constant as ranks grow)."""
    arithmetic: list[str]
    ops: list[OpDelta]
    notes: list[str] = field(default_factory=list)


def to_data(obj: Any) -> Any:
    """A report as plain JSON-able data (dataclasses to dicts, in field order)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_data(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): to_data(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_data(v) for v in obj]
    if isinstance(obj, float) and obj != obj:
        return None
    return obj
