"""Configuration: keyword options to ``instrument()`` > environment variables > defaults.

Every knob is a field of :class:`Config` below, documented where it is defined, with the environment
variable that sets it. Standard ``OTEL_*`` variables mean what the OpenTelemetry specification (and, where
the two differ, the OpenTelemetry Python SDK running in the same process) says they mean. Variables that
only otel-torchdist reads share the prefix ``OTEL_TORCHDIST_``.

The environment is read once, when ``instrument()`` is called. The standard variables are read as the
OpenTelemetry Python SDK in the same process reads them: a value the SDK accepts is accepted, and one it
cannot use is ignored with a warning naming the variable (a training job never stops over a variable it
shares with every other OpenTelemetry component of the process). ``OTEL_SDK_DISABLED=true`` (and only
``true``, in any case) disables the library before anything else is read. A bad ``OTEL_TORCHDIST_*``
variable or keyword option raises ``ValueError`` naming it and what was expected: those are the library's
own, and nothing is silently replaced by a default.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from . import values
from .environment import (
    _ENV,
    ELSEWHERE,
    ENV_VARS,
    ignored,
    installed_exporter,
    sdk_disabled,
    shared,
    warn_unknown_variables,
)
from .values import (
    AGGREGATIONS,
    CAPTURES,
    COMPRESSIONS,
    EXPORTER_GROUPS,
    LOG_LEVELS,
    METRICS_EXPORTERS,
    MIN_INTERVAL_S,
    NATIVE_MODES,
    NCCL_HOOKS,
    PREFIX,
    PROTOCOLS,
    SAMPLERS,
    SUMMARY_MODES,
    TEMPORALITIES,
    TRACES_EXPORTERS,
    OptionError,
    split_list,
)


@dataclass(kw_only=True)
class Config:
    service_name: str = "torch-distributed"
    """``service.name`` of every rank's resource. Env: ``OTEL_SERVICE_NAME`` (wins over a ``service.name``
    given in ``OTEL_RESOURCE_ATTRIBUTES``)."""

    resource_attributes: dict[str, str] = field(default_factory=dict)
    """Extra resource attributes. Env: ``OTEL_RESOURCE_ATTRIBUTES`` (``k=v,k2=v2``, values URL-decoded).
    The keyword option is merged over the variable."""

    endpoint: str | None = None
    """OTLP endpoint for traces and metrics. Env: ``OTEL_EXPORTER_OTLP_ENDPOINT``. For HTTP the signal path
    (``/v1/traces``, ``/v1/metrics``) is appended. With no endpoint at all, telemetry goes to the run folder
    (see ``run_dir``)."""

    traces_endpoint: str | None = None
    """Env: ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``; used as given (no path appended), per the spec."""

    metrics_endpoint: str | None = None
    """Env: ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT``; used as given (no path appended), per the spec."""

    protocol: str = "http/protobuf"
    """``grpc``, ``http/protobuf`` or ``http/json``. Env: ``OTEL_EXPORTER_OTLP_PROTOCOL`` (and the per-signal
    ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` / ``..._METRICS_PROTOCOL``). The spec's default is http/protobuf
    (port 4318); the Collector's gRPC port is 4317."""

    traces_protocol: str | None = None
    metrics_protocol: str | None = None

    headers: dict[str, str] = field(default_factory=dict)
    """Headers sent with every OTLP request (auth tokens). Env: ``OTEL_EXPORTER_OTLP_HEADERS`` (``k=v,k2=v2``,
    URL-decoded, names lowercased, as the SDK parses them). The per-signal
    ``OTEL_EXPORTER_OTLP_{TRACES,METRICS}_HEADERS`` (``traces_headers``, ``metrics_headers``) replace them for
    their signal, as in the SDK."""

    traces_headers: dict[str, str] = field(default_factory=dict)
    metrics_headers: dict[str, str] = field(default_factory=dict)

    timeout: float = 10.0
    """Seconds one OTLP export may take before it is abandoned (and its batch counted as dropped).
    Env: ``OTEL_EXPORTER_OTLP_TIMEOUT``. In seconds, as the OpenTelemetry Python SDK in the same process reads
    it (the spec says milliseconds; both parties must agree on one meaning)."""

    compression: str = "none"
    """``gzip``, ``deflate`` or ``none``. Env: ``OTEL_EXPORTER_OTLP_COMPRESSION``. Over HTTP at zlib's fastest level (1):
    about 1.2 ms of the export thread's CPU for 512 collective spans, against 5.5 ms at gzip's default."""

    certificate: str | None = None
    """CA bundle to verify a TLS endpoint. Env: ``OTEL_EXPORTER_OTLP_CERTIFICATE``."""

    client_key: str | None = None
    """Client key for mTLS. Env: ``OTEL_EXPORTER_OTLP_CLIENT_KEY``."""

    client_certificate: str | None = None
    """Client certificate for mTLS. Env: ``OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE``."""

    insecure: bool | None = None
    """gRPC only: plaintext even without an ``http://`` scheme. Env: ``OTEL_EXPORTER_OTLP_INSECURE``."""

    traces_timeout: float | None = None
    metrics_timeout: float | None = None
    traces_compression: str | None = None
    metrics_compression: str | None = None
    traces_certificate: str | None = None
    metrics_certificate: str | None = None
    traces_client_key: str | None = None
    metrics_client_key: str | None = None
    traces_client_certificate: str | None = None
    metrics_client_certificate: str | None = None
    traces_insecure: bool | None = None
    metrics_insecure: bool | None = None
    """Per-signal overrides of the six settings above, as the spec defines them. Env:
    ``OTEL_EXPORTER_OTLP_{TRACES,METRICS}_{TIMEOUT,COMPRESSION,CERTIFICATE,CLIENT_KEY,CLIENT_CERTIFICATE,
    INSECURE}``. Unset (None): the signal uses the generic setting. A per-signal variable set to a value the
    SDK cannot use gives its signal the default, not the generic setting, as in the SDK."""

    # Per-signal fields whose variable was set to a value the SDK cannot use (``load`` fills it): their signal
    # takes the default, as the SDK's exporters do once the per-signal variable is set.
    _refused: ClassVar[frozenset[str]] = frozenset()

    traces_exporter: tuple[str, ...] | None = None
    """Where spans go, any of ``otlp``, ``file`` (OTLP JSON lines in the run folder), ``console``, ``none``,
    or the name of a span exporter installed for the OpenTelemetry SDK (its ``opentelemetry_traces_exporter``
    entry point), comma-separated in the env. Env: ``OTEL_TRACES_EXPORTER``. Default: ``otlp`` when an
    endpoint is configured, else ``file``. Not used when spans go through a TracerProvider of the
    application's."""

    metrics_exporter: tuple[str, ...] | None = None
    """Where metrics are pushed, any of ``otlp``, ``file``, ``console``, ``none``, or the name of a metric
    exporter installed for the SDK (``opentelemetry_metrics_exporter``), comma-separated in the env; a
    ``prometheus`` entry is accepted and changes nothing (see ``prometheus``). Env: ``OTEL_METRICS_EXPORTER``.
    Default: ``otlp`` when an endpoint is configured, else ``file``. Not used when metrics go through a
    MeterProvider of the application's."""

    global_meter_provider: bool = True
    """Record the library's metrics in the application's global MeterProvider when it set one. Off, they go to
    the library's own metric exporters even then (the run folder, OTLP, ``/metrics``), which costs far less: an
    SDK histogram takes every collective's duration at about 12 µs each (docs/performance.md). A
    ``meter_provider=`` given to ``instrument()`` is always used. Env:
    ``OTEL_TORCHDIST_GLOBAL_METER_PROVIDER``."""

    prometheus: bool = True
    """Serve this rank's ``/metrics`` (see ``prometheus_port``), whatever ``OTEL_METRICS_EXPORTER`` says (a
    distro's default ``otlp`` does not turn it off). Env: ``OTEL_TORCHDIST_PROMETHEUS``."""

    metrics_temporality: str = "cumulative"
    """Aggregation temporality of the counters and histograms the library's own OTLP metric exporter pushes:
    ``cumulative``, ``delta`` or ``lowmemory`` (delta for both: they are synchronous instruments). Env:
    ``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE``. The run folder and ``/metrics`` stay cumulative."""

    attribute_value_length_limit: int | None = None
    """Longest string attribute value of a span the library's own exporters send; longer ones are cut, as the
    SDK cuts them. Env: ``OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT``, else ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT``.
    Default: no limit."""

    event_attribute_value_length_limit: int | None = None
    """Longest string attribute value of a span's events and links (an exception's message, a warning's) the
    library's own exporters send. Env: ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT`` alone: the SDK applies the
    span-only variable to a span's own attributes, not to its events' and links'. Default: no limit."""

    attribute_count_limit: int = 128
    """Most attributes a span the library's own exporters send may carry (the rest are left out, as the SDK
    leaves them out). Env: ``OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT``, else ``OTEL_ATTRIBUTE_COUNT_LIMIT``."""

    traces_sampler: str | None = None
    """Which traces to keep, for the library's own exporters (through a provider of the application's, that
    provider's sampler decides). Env: ``OTEL_TRACES_SAMPLER``; a name the SDK does not know either is
    ignored with a warning, as the SDK ignores it. The decision is a pure function of the trace id,
    and every rank derives a step's trace id from the run id and step number, so all ranks keep the same
    steps. Unset, steps are kept by ``trace_first_steps`` / ``trace_every_steps`` and everything outside
    steps is kept (``parentbased_always_on``). Sampling never thins the metrics."""

    traces_sampler_arg: float = 1.0
    """Ratio for the ``*traceidratio`` samplers, 0..1. Env: ``OTEL_TRACES_SAMPLER_ARG``."""

    trace_first_steps: int = 10
    """Without ``OTEL_TRACES_SAMPLER``: trace the first this many steps... Env:
    ``OTEL_TORCHDIST_TRACE_FIRST_STEPS``."""

    trace_every_steps: int = 100
    """...and then every this-many-th step (1: every step; 0: none after the first ones). Env:
    ``OTEL_TORCHDIST_TRACE_EVERY_STEPS``."""

    trace_ranks: str | tuple[int, ...] | None = None
    """Ranks that export spans; the others export none (metrics, the hang watchdog's reports, warnings
    and a failing step's span are kept on every rank). Comma-separated ranks and ranges ``a-b``
    (inclusive), a range with a stride ``a-b:s``; e.g. ``0-7,1024`` (the first node and one rank of
    another), ``0-16383:1024``. A list of ints from Python. Default: every rank. What a traced step's
    trace costs grows with the ranks that trace it (docs/scale.md, *Knobs*). Env:
    ``OTEL_TORCHDIST_TRACE_RANKS``."""

    hang_threshold: float | None = None
    """Seconds a collective may stay in flight before the watchdog reports it (event, log line, metric),
    while the process is still alive. Env: ``OTEL_TORCHDIST_HANG_THRESHOLD_MS``. Default: half the default
    process group's timeout, at most 300 s, so the report comes before the backend gives up."""

    straggler_exchange_steps: int = 50
    """Every this many steps the ranks swap their compute and wait times through the process group's
    key-value store (never a collective: the user's collectives are not reordered) and each rank exports
    the straggler score and the slowest rank. Env: ``OTEL_TORCHDIST_STRAGGLER_EXCHANGE_STEPS``; 0 turns the
    exchange off (Prometheus can still rank the per-rank compute and wait metrics). Off above 1024 ranks."""

    slow_step_factor: float = 3.0
    """Warn when a step takes more than this many times the median of recent steps (the last 101, the
    median refreshed every 16 steps). Env: ``OTEL_TORCHDIST_WARN_SLOW_STEP_FACTOR``; 0 disables."""

    compile_capture: str = "off"
    """``sampled``: inside ``otel_torchdist.step()`` blocks of sampled steps, also record the collectives
    of ``torch.compile``d code (deep mode, costly per op). ``off``: only ``otel_torchdist.deep_capture()``
    does. Env: ``OTEL_TORCHDIST_COMPILE_CAPTURE``."""

    native: str = "auto"
    """The native part (C++, ``otel_torchdist/native``) that records DDP's reducer on gloo and on NCCL
    without a comm hook, sparing DDP the hook's pass over every bucket (on a GPU, 0.3-0.5 ms of a 1 ms
    step), takes the common ``torch.distributed`` call
    (one plain tensor, blocking) in C++ instead of Python, folds the collectives of unsampled steps into
    the metrics and encodes spans (OTLP protobuf and JSON, the same bytes as the Python encoders).
    ``auto``: used when built (``otel-torchdist build-native``, once per torch version), else DDP is
    captured through its comm hook and every call, record and span handled in Python. ``build``: compile it
    at ``instrument()`` when missing (about a minute; needs a C++ compiler and ninja). ``off``: the comm
    hook and Python always. Env: ``OTEL_TORCHDIST_NATIVE``."""

    nccl_hook: str = "python"
    """Where ProcessGroupNCCL's completion hook (NCCL records' GPU-true end and duration) runs. ``python``: a
    Python function, which torch's hook thread must take the GIL for, for every collective (about 45 µs of
    the training thread a collective on an H200's host). ``native``: in the native part's C++, no Python on
    that thread; the drain joins its reports with their records. It needs the native part built (else the
    Python hook, with a warning); it has passed this project's CPU tests and not yet a GPU run, so it is not
    the default yet. Env: ``OTEL_TORCHDIST_NCCL_HOOK``."""

    disabled_captures: tuple[str, ...] = ()
    """Framework captures to leave out, by name: ``ddp`` (DDP's gradient buckets, its construction span and
    statistics), ``fsdp``, ``funcol`` (functional collectives: DTensor's and tensor parallel's), ``functions``
    (custom autograd functions' modules), ``dtensor``, ``checkpoint`` (distributed checkpoint), ``backward``
    (backward-pass phase spans, and the training step a GradScaler-skipped optimizer step ends),
    ``dataloader``, ``nccl_completion`` (ProcessGroupNCCL's completion hook, which gives NCCL records their
    GPU-true end and CUDA-event duration). What only that capture sees is
    lost: DDP's buckets, which its reducer issues in C++, and functional collectives go unrecorded; FSDP's
    collectives (``torch.distributed`` calls) are still recorded without their unit, DTensor's (functional
    collectives) without their sharding span; without ``nccl_completion`` NCCL records end at enqueue
    (``end_source="enqueue"``: the launch's duration, no bandwidth). For a capture that costs a job more
    than its telemetry is worth: on NCCL, the DDP capture's comm hook without the native part slows steps of
    about a millisecond, and the completion hook costs each NCCL collective about 45 µs of the training
    thread on an H200's host, 3 µs without it (docs/performance.md). Env:
    ``OTEL_TORCHDIST_DISABLED_CAPTURES``, comma-separated."""

    log_level: str = "WARNING"
    """Level of otel-torchdist's own log lines (prefixed ``[otel-torchdist rank=R]``). Env:
    ``OTEL_TORCHDIST_LOG_LEVEL``."""

    metric_export_interval: float = 60.0
    """Seconds between pushes of metrics to OTLP or the run folder. Env: ``OTEL_METRIC_EXPORT_INTERVAL``
    (milliseconds, per the spec). The Prometheus endpoint is always current."""

    span_schedule_delay: float = 5.0
    """Seconds between span batch exports. Env: ``OTEL_BSP_SCHEDULE_DELAY`` (milliseconds)."""

    span_queue_size: int = 2048
    """Spans waiting for export at most; beyond it spans are dropped and counted
    (``torchdist_telemetry_dropped_total{kind="span"}``). Env: ``OTEL_BSP_MAX_QUEUE_SIZE``."""

    max_spans_per_step: int = 10000
    """Most spans one rank exports for one training step (0 = no limit): collectives and framework spans
    (sharding, optimizer, checkpoint) alike, in the order the background drain takes them (collectives as
    they end, a drain's framework spans after its collectives), plus the spans those kept point at as
    parent (so no kept span is an orphan); the step's own spans and warnings are not counted. The rest of
    a traced step is counted (``torchdist_telemetry_dropped_total{kind="span_step_limit"}``), not traced.
    Keeps a loop that never closes a step (no optimizer, no ``otel_torchdist.step()``) from tracing every
    collective of the run. Env: ``OTEL_TORCHDIST_MAX_SPANS_PER_STEP``."""

    span_batch_size: int = 512
    """Spans per export request at most. Env: ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE``."""

    prometheus_host: str = "0.0.0.0"
    """Address the per-rank ``/metrics`` endpoint binds. Env: ``OTEL_EXPORTER_PROMETHEUS_HOST``.
    Default all interfaces: training nodes are normally scraped by a Prometheus on another host, and the
    endpoint only shows op names, sizes and timings (never tensor contents). Set ``127.0.0.1`` to keep it
    local."""

    prometheus_port: int = 9464
    """Base port of ``/metrics``; each rank listens on base + local rank. Env:
    ``OTEL_EXPORTER_PROMETHEUS_PORT``. If the port is taken the rank warns and falls back to a free port,
    which it writes to the run folder's Prometheus target file. ``0`` always picks a free port."""

    disabled: bool = False
    """Make ``instrument()`` a no-op. Env: ``OTEL_SDK_DISABLED`` (``true`` in any case; any other value is
    false, as the specification and the SDK read it)."""

    run_dir: str = "otel-torchdist-runs"
    """Root of the run folders: each run writes ``<run_dir>/<run id>/`` (resource, Prometheus targets,
    summary, and the OTLP JSON lines of the file exporters). Env: ``OTEL_TORCHDIST_RUN_DIR``."""

    run_folder_copy: bool = True
    """Keep the run's telemetry in the run folder whatever the exporters: the traced steps' spans and the
    metrics (``traces.rank<R>.jsonl``, ``metrics.rank<R>.jsonl``, bounded by ``file_max_bytes``), so that
    ``otel-torchdist analyze``, ``compare`` and ``plot`` work on every run, one sent to a stack or through
    an application's providers included. False: only the exporters named receive it. Env:
    ``OTEL_TORCHDIST_RUN_FOLDER_COPY``."""

    file_max_bytes: int = 256 << 20
    """Largest size of each JSON-lines file in the run folder (``traces.rank<R>.jsonl``,
    ``metrics.rank<R>.jsonl``), in bytes; 0 = no limit. A file that would grow past it is renamed to
    ``traces.rank<R>.1.jsonl`` (replacing the previous one) and a new file is started, as log rotation does,
    so a rank's run folder holds at most twice this per signal however long the run (a single line longer
    than the limit is still written whole, into a file of its own). The spans of a
    replaced file are counted (``torchdist_telemetry_dropped_total{kind="span_file_rotated"}``); metric
    lines are cumulative snapshots, so a replaced metrics file loses only history. Env:
    ``OTEL_TORCHDIST_FILE_MAX_BYTES`` (bytes, or with a unit: ``256MiB``, ``1GB``)."""

    run_id: str | None = None
    """The run id shared by all ranks of one job. Env: ``OTEL_TORCHDIST_RUN_ID``; else ``TORCHELASTIC_RUN_ID``
    or ``SLURM_JOB_ID`` when set; else rank 0 makes one and shares it through the process group's store."""

    max_queued_records: int = 65536
    """Collective records waiting for the background thread at most; beyond it they are dropped and counted
    (``kind="record"``). Env: ``OTEL_TORCHDIST_MAX_QUEUED_RECORDS``."""

    drain_interval: float = 0.2
    """Seconds between passes of the background thread that turns records into metrics and spans. Env:
    ``OTEL_TORCHDIST_DRAIN_INTERVAL_MS`` (milliseconds)."""

    flush_timeout: float = 5.0
    """Seconds ``uninstrument()`` and process exit may spend flushing telemetry, at most. Env:
    ``OTEL_TORCHDIST_FLUSH_TIMEOUT_MS`` (milliseconds)."""

    metrics_rank_label: bool = True
    """Put the ``rank`` label on every metric data point. Off, the points carry no ``rank``, but this alone
    saves no series: each rank stays its own Prometheus target (``instance``) and OTLP resource
    (``service.instance.id``). It helps only where a later stage sums across ranks after dropping those
    (docs/scale.md, *Knobs*); the per-rank dashboard views need the label. Env:
    ``OTEL_TORCHDIST_METRICS_RANK_LABEL``."""

    metrics_aggregation: str = "rank"
    """``rank``: every rank exports its own metrics. ``node``: the ranks of a node hand their metrics to
    the node's local rank 0 (``LOCAL_RANK``, which torchrun sets) through files in the run folder, and only
    it exports them, summed (counters, histograms) or combined as each gauge says
    (``export.node.NODE_MERGE``), labelled ``host`` instead of ``rank``: one Prometheus target and one OTLP
    stream per node, a node's worth fewer series. Spans stay per rank. Env:
    ``OTEL_TORCHDIST_METRICS_AGGREGATION``."""

    node_name: str | None = None
    """The node a rank is on, for ``metrics_aggregation="node"``: ranks with the same name are summed
    together, and their run folder must be shared. Default: the host name. Set it where ranks of one
    machine run in containers with their own host names (e.g. Kubernetes' ``spec.nodeName``). Env:
    ``OTEL_TORCHDIST_NODE_NAME``."""

    node_metrics_interval: float = 5.0
    """Seconds between the hand-overs of a rank's metrics to its node's exporting rank (with
    ``metrics_aggregation="node"``): how old a node's figures may be. Env:
    ``OTEL_TORCHDIST_NODE_METRICS_INTERVAL_MS`` (milliseconds)."""

    histogram_buckets: tuple[float, ...] | None = None
    """Upper bounds, in seconds, of every duration histogram's buckets (collectives, steps, optimizer steps,
    data-loader waits, checkpoints), strictly increasing; ``+Inf`` is always added. Default: the 23 of
    ``names.DURATION_BUCKETS``, 10 µs to 10 min. Each bound is one Prometheus series per histogram label
    set, so fewer bounds are fewer series (docs/scale.md, *Knobs*); every rank of a job must use the same.
    Env: ``OTEL_TORCHDIST_HISTOGRAM_BUCKETS`` (comma-separated seconds, e.g. ``0.001,0.01,0.1,1,10,60``)."""

    summary: str = "rank0"
    """Who prints the end-of-run summary: ``rank0``, ``all`` or ``none``. Env: ``OTEL_TORCHDIST_SUMMARY``."""

    system_metrics: bool = True
    """Sample GPU (NVML), CUDA allocator, process and host metrics on a background thread. Env:
    ``OTEL_TORCHDIST_SYSTEM_METRICS``. Without GPUs or NVML there are simply no GPU series."""

    system_interval: float = 5.0
    """Seconds between system samples. Env: ``OTEL_TORCHDIST_SYSTEM_INTERVAL_MS`` (milliseconds)."""

    warn_gpu_utilization: float = 0.2
    """Warn (event, log line) when a GPU's utilization stays below this fraction for a whole
    ``warn_gpu_utilization_window``. Env: ``OTEL_TORCHDIST_WARN_GPU_UTILIZATION``; 0 disables."""

    warn_gpu_utilization_window: float = 120.0
    """Seconds of sustained low utilization before warning. Env:
    ``OTEL_TORCHDIST_WARN_GPU_UTILIZATION_WINDOW_MS`` (milliseconds)."""

    warn_memory_fraction: float = 0.95
    """Warn when GPU memory in use exceeds this fraction of the total. Env:
    ``OTEL_TORCHDIST_WARN_MEMORY_FRACTION``; 0 disables."""

    def validate(self) -> Config:
        """Check every field; raise ValueError naming the keyword option at fault."""
        values.choice("protocol", self.protocol, PROTOCOLS)
        for name in ("traces_protocol", "metrics_protocol"):
            if getattr(self, name) is not None:
                values.choice(name, getattr(self, name), PROTOCOLS)
        values.choice("compression", self.compression, COMPRESSIONS)
        for name, builtin in (("traces_exporter", TRACES_EXPORTERS), ("metrics_exporter", METRICS_EXPORTERS)):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, str):
                value = split_list(value)
            if not isinstance(value, (tuple, list)) or not value:
                raise OptionError(name, f"must be a name or a non-empty list of names, got {value!r}")
            for item in value:
                if item not in builtin and not installed_exporter(EXPORTER_GROUPS[name], item):
                    raise OptionError(name, f"{item!r} is neither one of {', '.join(builtin)} nor an exporter installed for the OpenTelemetry SDK (entry point group {EXPORTER_GROUPS[name]})")
            setattr(self, name, tuple(value))
        values.choice("metrics_temporality", self.metrics_temporality, TEMPORALITIES)
        for name in ("attribute_value_length_limit", "event_attribute_value_length_limit"):
            if getattr(self, name) is not None:
                values.integer(name, getattr(self, name), 0)
        values.integer("attribute_count_limit", self.attribute_count_limit, 0)
        if self.traces_sampler is not None:
            values.choice("traces_sampler", self.traces_sampler, SAMPLERS)
        for name in ("trace_first_steps", "trace_every_steps", "straggler_exchange_steps", "max_spans_per_step"):
            values.integer(name, getattr(self, name), 0)
        if self.trace_ranks is not None:
            self.trace_ranks = values.check_ranks("trace_ranks", self.trace_ranks)
        if self.hang_threshold is not None:
            values.seconds("hang_threshold", self.hang_threshold)
        values.number("slow_step_factor", self.slow_step_factor, 0.0, None)
        values.choice("compile_capture", self.compile_capture, ("off", "sampled"))
        values.choice("native", self.native, NATIVE_MODES)
        values.choice("nccl_hook", self.nccl_hook, NCCL_HOOKS)
        if isinstance(self.disabled_captures, str):
            self.disabled_captures = split_list(self.disabled_captures)
        if not isinstance(self.disabled_captures, (tuple, list)):
            raise OptionError("disabled_captures", f"must be a list of capture names, got {self.disabled_captures!r}")
        for item in self.disabled_captures:
            values.choice("disabled_captures", item, CAPTURES)
        self.disabled_captures = tuple(self.disabled_captures)
        values.choice("log_level", self.log_level, LOG_LEVELS)
        values.number("traces_sampler_arg", self.traces_sampler_arg, 0.0, 1.0)
        for name in ("endpoint", "traces_endpoint", "metrics_endpoint"):
            value = getattr(self, name)
            if value is not None:
                values.check_endpoint(name, value)
        for name in ("timeout", "flush_timeout"):
            values.seconds(name, getattr(self, name))
        for name in ("metric_export_interval", "span_schedule_delay", "drain_interval"):
            values.seconds(name, getattr(self, name), MIN_INTERVAL_S)
        values.integer("file_max_bytes", self.file_max_bytes, 0)
        for name in ("span_queue_size", "span_batch_size", "max_queued_records"):
            values.integer(name, getattr(self, name), 1)
        values.integer("prometheus_port", self.prometheus_port, 0, 65535)
        for name in ("service_name", "run_dir"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise OptionError(name, f"must be a non-empty string, got {value!r}")
        self.run_dir = os.path.expanduser(self.run_dir)  # "~/runs" from an env file: no folder named "~"
        if self.run_id is not None:
            values.check_run_id("run_id", self.run_id)
        for name in ("resource_attributes", "headers", "traces_headers", "metrics_headers"):
            value = getattr(self, name)
            if not isinstance(value, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items()
            ):
                raise OptionError(name, f"must be a mapping of str to str, got {value!r}")
        for name in ("headers", "traces_headers", "metrics_headers"):
            values.check_headers(name, getattr(self, name))
        for name in ("disabled", "metrics_rank_label", "prometheus", "global_meter_provider"):
            if not isinstance(getattr(self, name), bool):
                raise OptionError(name, f"must be True or False, got {getattr(self, name)!r}")
        for base in ("certificate", "client_key", "client_certificate"):
            for name in (base, "traces_" + base, "metrics_" + base):
                if getattr(self, name) is not None:
                    values.check_file(name, getattr(self, name))
        for signal in ("traces", "metrics"):
            if getattr(self, f"{signal}_timeout") is not None:
                values.seconds(f"{signal}_timeout", getattr(self, f"{signal}_timeout"))
            if getattr(self, f"{signal}_compression") is not None:
                values.choice(f"{signal}_compression", getattr(self, f"{signal}_compression"), COMPRESSIONS)
            value = getattr(self, f"{signal}_insecure")
            if value is not None and not isinstance(value, bool):
                raise OptionError(f"{signal}_insecure", f"must be True, False or None, got {value!r}")
        values.check_host("prometheus_host", self.prometheus_host)
        if self.insecure is not None and not isinstance(self.insecure, bool):
            raise OptionError("insecure", f"must be True, False or None, got {self.insecure!r}")
        values.choice("summary", self.summary, SUMMARY_MODES)
        values.choice("metrics_aggregation", self.metrics_aggregation, AGGREGATIONS)
        if self.histogram_buckets is not None:
            self.histogram_buckets = values.check_bounds("histogram_buckets", self.histogram_buckets)
        if self.node_name is not None:
            values.check_run_id("node_name", self.node_name)
        values.seconds("node_metrics_interval", self.node_metrics_interval, MIN_INTERVAL_S)
        for name in ("system_metrics", "run_folder_copy"):
            if not isinstance(getattr(self, name), bool):
                raise OptionError(name, f"must be True or False, got {getattr(self, name)!r}")
        for name in ("system_interval", "warn_gpu_utilization_window"):
            values.seconds(name, getattr(self, name), MIN_INTERVAL_S)
        for name in ("warn_gpu_utilization", "warn_memory_fraction"):
            values.number(name, getattr(self, name), 0.0, 1.0)
        return self

    # ---------------------------------------------------------------------------- derived settings
    def traces_rank(self, rank: int) -> bool:
        """Whether ``rank`` exports spans (``trace_ranks``)."""
        return self.trace_ranks is None or rank in self.trace_ranks

    def resolved_traces_exporter(self) -> tuple[str, ...]:
        """Where the library's own span exporters send spans (empty: nowhere)."""
        if self.traces_exporter is not None:
            return tuple(x for x in self.traces_exporter if x != "none")
        return ("otlp",) if (self.endpoint or self.traces_endpoint) else ("file",)

    def for_signal(self, name: str, signal: str) -> Any:
        """``name`` (timeout, compression, certificate, client_key, client_certificate, insecure, headers)
        as it applies to ``signal`` (``traces`` or ``metrics``): the per-signal setting when given."""
        if f"{signal}_{name}" in self._refused:
            return dict(_DEFAULTS[name]) if name == "headers" else _DEFAULTS[name]
        if name == "headers":
            return dict(getattr(self, f"{signal}_headers") or self.headers)
        value = getattr(self, f"{signal}_{name}")
        return getattr(self, name) if value is None else value

    def with_run_folder_copy(self, exporters: tuple[str, ...]) -> tuple[str, ...]:
        """``exporters`` and the run folder's copy (``file``) where ``run_folder_copy`` keeps one."""
        return tuple(dict.fromkeys((*exporters, "file"))) if self.run_folder_copy else exporters

    def resolved_metrics_exporters(self) -> tuple[str, ...]:
        """The library's own metric exporters (empty: none), ``prometheus`` for the per-rank endpoint."""
        if self.metrics_exporter is not None:
            push = tuple(x for x in self.metrics_exporter if x not in ("none", "prometheus"))
        else:
            push = ("otlp",) if (self.endpoint or self.metrics_endpoint) else ("file",)
        return push + (("prometheus",) if self.prometheus else ())


OPTION_NAMES = tuple(f.name for f in dataclasses.fields(Config))
_SIGNAL_FIELDS = frozenset(
    f"{signal}_{name}"
    for signal in ("traces", "metrics")
    for name in ("timeout", "compression", "certificate", "client_key", "client_certificate", "insecure", "headers")
)
_SIGNAL_HEADERS = ("traces_headers", "metrics_headers")
_DEFAULTS = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory() for f in dataclasses.fields(Config)}


def load(options: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Build the configuration: keyword ``options`` over ``environ`` (default ``os.environ``) over defaults."""
    options = dict(options or {})
    env = os.environ if environ is None else environ
    unknown = sorted(set(options) - set(OPTION_NAMES))
    if unknown:
        raise TypeError(
            f"instrument() got unknown option(s) {', '.join(unknown)}; valid options are: {', '.join(OPTION_NAMES)}"
        )
    # None is "not given" for a setting whose default is None: the environment (or the default) decides it.
    options = {k: v for k, v in options.items() if v is not None or _DEFAULTS[k] is not None}
    if options.get("disabled") is True or ("disabled" not in options and sdk_disabled(env)):
        return Config(disabled=True)  # nothing else is read: disabled means off, whatever else is set
    warn_unknown_variables(env)
    values: dict[str, Any] = {}
    from_env: dict[str, tuple[str, str]] = {}
    refused: set[str] = set()
    for var, name, parse in _ENV:
        raw = env.get(var)
        if raw is None or raw.strip() == "" or var == "OTEL_SDK_DISABLED":
            continue
        try:
            values[name] = parse(raw.strip()) if not shared(var) else parse(raw.strip(), var)
        except ValueError as exc:
            if not shared(var):
                raise ValueError(f"{var}={raw!r}: {exc}") from None
            ignored(var, raw, str(exc))
            refused.add(name)
            continue
        if name in _SIGNAL_HEADERS and not values[name]:
            refused.add(name)  # no usable header in it: the SDK sends none, not the generic ones
        from_env[name] = (var, raw)  # the later of two variables for one field wins: the per-signal one
    if env.get("OTEL_RESOURCE_DETECTORS", "").strip() and not env.get("OTEL_EXPERIMENTAL_RESOURCE_DETECTORS", "").strip():
        ignored("OTEL_RESOURCE_DETECTORS", env["OTEL_RESOURCE_DETECTORS"], "the OpenTelemetry Python SDK reads OTEL_EXPERIMENTAL_RESOURCE_DETECTORS instead")
    # OTEL_SERVICE_NAME wins over service.name inside OTEL_RESOURCE_ATTRIBUTES (spec).
    resource = dict(values.get("resource_attributes", {}))
    if "service_name" not in values and resource.get("service.name"):
        values["service_name"] = resource["service.name"]
        from_env["service_name"] = from_env.get("resource_attributes", ("OTEL_RESOURCE_ATTRIBUTES", ""))
    resource.pop("service.name", None)
    values["resource_attributes"] = resource
    for name in ("resource_attributes", "headers", "traces_headers", "metrics_headers"):
        if name in options and isinstance(options[name], Mapping) and name in values:
            options[name] = {**values[name], **options[name]}
    for name in options:
        from_env.pop(name, None)
        refused.discard(name)
    values.update(options)
    while True:
        try:
            cfg = Config(**values).validate()
            if cfg.span_batch_size > cfg.span_queue_size:
                # The SDK's BatchSpanProcessor refuses this pair (a ValueError in its configurator); here a
                # batch is never larger than the queue, so spans go every span_schedule_delay.
                logging.getLogger("otel_torchdist").warning(
                    "otel-torchdist: span_batch_size (OTEL_BSP_MAX_EXPORT_BATCH_SIZE) %d is larger than span_queue_size "
                    "(OTEL_BSP_MAX_QUEUE_SIZE) %d, a pair the OpenTelemetry SDK refuses: the queue is exported whole "
                    "every span_schedule_delay (OTEL_BSP_SCHEDULE_DELAY), and spans beyond it are dropped",
                    cfg.span_batch_size, cfg.span_queue_size,
                )  # fmt: skip
            signal_refused = frozenset(refused & _SIGNAL_FIELDS)
            if signal_refused:
                cfg._refused = signal_refused
            return cfg
        except OptionError as exc:
            if exc.option not in from_env:
                raise
            var, raw = from_env.pop(exc.option)
            if not shared(var):
                raise ValueError(f"{var}={raw!r}: {exc.reason}") from None
            ignored(var, raw, exc.reason)  # the default instead, and validate again
            refused.add(exc.option)
            del values[exc.option]


__all__ = [  # with the environment's and the values' names the rest of the library reads through this package
    "Config", "OptionError", "load", "shared", "OPTION_NAMES", "ENV_VARS", "ELSEWHERE", "PREFIX",
    "EXPORTER_GROUPS", "METRICS_EXPORTERS", "TRACES_EXPORTERS",
]  # fmt: skip
