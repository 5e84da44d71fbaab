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
import difflib
import ipaddress
import logging
import math
import os
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

PREFIX = "OTEL_TORCHDIST_"
_MAX_LISTED_RANKS = 1 << 20  # a trace_ranks range naming more is a typo, not a job

TRACES_EXPORTERS = ("otlp", "file", "console", "none")
METRICS_EXPORTERS = ("otlp", "file", "prometheus", "console", "none")
# Other names an OTEL_*_EXPORTER list may hold: an exporter installed under the SDK's entry-point group of that
# name (a vendor's, zipkin...), exported through an SDK provider the library makes for it.
EXPORTER_GROUPS = {"traces_exporter": "opentelemetry_traces_exporter", "metrics_exporter": "opentelemetry_metrics_exporter"}
TEMPORALITIES = ("cumulative", "delta", "lowmemory")
PROTOCOLS = ("grpc", "http/protobuf", "http/json")
COMPRESSIONS = ("none", "gzip", "deflate")
SAMPLERS = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)
SUMMARY_MODES = ("rank0", "all", "none")
AGGREGATIONS = ("rank", "node")
NATIVE_MODES = ("auto", "off", "build")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


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
    INSECURE}``. Unset (None): the signal uses the generic setting."""

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
    """Warn when a step takes more than this many times the median of recent steps. Env:
    ``OTEL_TORCHDIST_WARN_SLOW_STEP_FACTOR``; 0 disables."""

    compile_capture: str = "off"
    """``sampled``: inside ``otel_torchdist.step()`` blocks of sampled steps, also record the collectives
    of ``torch.compile``d code (deep mode, costly per op). ``off``: only ``otel_torchdist.deep_capture()``
    does. Env: ``OTEL_TORCHDIST_COMPILE_CAPTURE``."""

    native: str = "auto"
    """The native part (C++, ``otel_torchdist/native``) that records DDP's reducer on gloo without a comm
    hook, sparing DDP the hook's pass over every bucket, takes the common ``torch.distributed`` call
    (one plain tensor, blocking) in C++ instead of Python, folds the collectives of unsampled steps into
    the metrics and encodes spans (OTLP protobuf and JSON, the same bytes as the Python encoders).
    ``auto``: used when built (``otel-torchdist build-native``, once per torch version), else DDP is
    captured through its comm hook and every call, record and span handled in Python. ``build``: compile it
    at ``instrument()`` when missing (about a minute; needs a C++ compiler and ninja). ``off``: the comm
    hook and Python always. Env: ``OTEL_TORCHDIST_NATIVE``."""

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
        _choice("protocol", self.protocol, PROTOCOLS)
        for name in ("traces_protocol", "metrics_protocol"):
            if getattr(self, name) is not None:
                _choice(name, getattr(self, name), PROTOCOLS)
        _choice("compression", self.compression, COMPRESSIONS)
        for name, builtin in (("traces_exporter", TRACES_EXPORTERS), ("metrics_exporter", METRICS_EXPORTERS)):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, str):
                value = _split_list(value)
            if not isinstance(value, (tuple, list)) or not value:
                raise OptionError(name, f"must be a name or a non-empty list of names, got {value!r}")
            for item in value:
                if item not in builtin and not installed_exporter(EXPORTER_GROUPS[name], item):
                    raise OptionError(name, f"{item!r} is neither one of {', '.join(builtin)} nor an exporter installed for the OpenTelemetry SDK (entry point group {EXPORTER_GROUPS[name]})")
            setattr(self, name, tuple(value))
        _choice("metrics_temporality", self.metrics_temporality, TEMPORALITIES)
        if self.attribute_value_length_limit is not None:
            _integer("attribute_value_length_limit", self.attribute_value_length_limit, 0)
        _integer("attribute_count_limit", self.attribute_count_limit, 0)
        if self.traces_sampler is not None:
            _choice("traces_sampler", self.traces_sampler, SAMPLERS)
        for name in ("trace_first_steps", "trace_every_steps", "straggler_exchange_steps", "max_spans_per_step"):
            _integer(name, getattr(self, name), 0)
        if self.trace_ranks is not None:
            self.trace_ranks = _check_ranks("trace_ranks", self.trace_ranks)
        if self.hang_threshold is not None:
            _seconds("hang_threshold", self.hang_threshold)
        _number("slow_step_factor", self.slow_step_factor, 0.0, None)
        _choice("compile_capture", self.compile_capture, ("off", "sampled"))
        _choice("native", self.native, NATIVE_MODES)
        _choice("log_level", self.log_level, LOG_LEVELS)
        _number("traces_sampler_arg", self.traces_sampler_arg, 0.0, 1.0)
        for name in ("endpoint", "traces_endpoint", "metrics_endpoint"):
            value = getattr(self, name)
            if value is not None:
                _check_endpoint(name, value)
        for name in ("timeout", "flush_timeout"):
            _seconds(name, getattr(self, name))
        for name in ("metric_export_interval", "span_schedule_delay", "drain_interval"):
            _seconds(name, getattr(self, name), MIN_INTERVAL_S)
        _integer("file_max_bytes", self.file_max_bytes, 0)
        for name in ("span_queue_size", "span_batch_size", "max_queued_records"):
            _integer(name, getattr(self, name), 1)
        _integer("prometheus_port", self.prometheus_port, 0, 65535)
        for name in ("service_name", "run_dir"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise OptionError(name, f"must be a non-empty string, got {value!r}")
        self.run_dir = os.path.expanduser(self.run_dir)  # "~/runs" from an env file: no folder named "~"
        if self.run_id is not None:
            _check_run_id("run_id", self.run_id)
        for name in ("resource_attributes", "headers", "traces_headers", "metrics_headers"):
            value = getattr(self, name)
            if not isinstance(value, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items()
            ):
                raise OptionError(name, f"must be a mapping of str to str, got {value!r}")
        for name in ("headers", "traces_headers", "metrics_headers"):
            _check_headers(name, getattr(self, name))
        for name in ("disabled", "metrics_rank_label", "prometheus", "global_meter_provider"):
            if not isinstance(getattr(self, name), bool):
                raise OptionError(name, f"must be True or False, got {getattr(self, name)!r}")
        for base in ("certificate", "client_key", "client_certificate"):
            for name in (base, "traces_" + base, "metrics_" + base):
                if getattr(self, name) is not None:
                    _check_file(name, getattr(self, name))
        for signal in ("traces", "metrics"):
            if getattr(self, f"{signal}_timeout") is not None:
                _seconds(f"{signal}_timeout", getattr(self, f"{signal}_timeout"))
            if getattr(self, f"{signal}_compression") is not None:
                _choice(f"{signal}_compression", getattr(self, f"{signal}_compression"), COMPRESSIONS)
            value = getattr(self, f"{signal}_insecure")
            if value is not None and not isinstance(value, bool):
                raise OptionError(f"{signal}_insecure", f"must be True, False or None, got {value!r}")
        _check_host("prometheus_host", self.prometheus_host)
        if self.insecure is not None and not isinstance(self.insecure, bool):
            raise OptionError("insecure", f"must be True, False or None, got {self.insecure!r}")
        _choice("summary", self.summary, SUMMARY_MODES)
        _choice("metrics_aggregation", self.metrics_aggregation, AGGREGATIONS)
        if self.histogram_buckets is not None:
            self.histogram_buckets = _check_bounds("histogram_buckets", self.histogram_buckets)
        if self.node_name is not None:
            _check_run_id("node_name", self.node_name)
        _seconds("node_metrics_interval", self.node_metrics_interval, MIN_INTERVAL_S)
        for name in ("system_metrics", "run_folder_copy"):
            if not isinstance(getattr(self, name), bool):
                raise OptionError(name, f"must be True or False, got {getattr(self, name)!r}")
        for name in ("system_interval", "warn_gpu_utilization_window"):
            _seconds(name, getattr(self, name), MIN_INTERVAL_S)
        for name in ("warn_gpu_utilization", "warn_memory_fraction"):
            _number(name, getattr(self, name), 0.0, 1.0)
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
        if name == "headers":
            return dict(getattr(self, f"{signal}_headers") or self.headers)
        value = getattr(self, f"{signal}_{name}")
        return getattr(self, name) if value is None else value

    def resolved_metrics_exporters(self) -> tuple[str, ...]:
        """The library's own metric exporters (empty: none), ``prometheus`` for the per-rank endpoint."""
        if self.metrics_exporter is not None:
            push = tuple(x for x in self.metrics_exporter if x not in ("none", "prometheus"))
        else:
            push = ("otlp",) if (self.endpoint or self.metrics_endpoint) else ("file",)
        return push + (("prometheus",) if self.prometheus else ())


OPTION_NAMES = tuple(f.name for f in dataclasses.fields(Config))
_DEFAULTS = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory() for f in dataclasses.fields(Config)}


def _warn_unknown_variables(env: Mapping[str, str]) -> None:
    """A misspelled variable would be ignored without a word (a misspelled keyword raises TypeError)."""
    unknown = sorted(var for var in env if var.startswith(PREFIX) and var not in ENV_VARS and var not in ELSEWHERE)
    if not unknown:
        return
    said = []
    for var in unknown:
        close = difflib.get_close_matches(var, ENV_VARS, n=1)
        said.append(f"{var} (did you mean {close[0]}?)" if close else var)
    logging.getLogger("otel_torchdist").warning(
        "otel-torchdist: ignoring unknown environment variable%s %s", "s" if len(said) > 1 else "", ", ".join(said)
    )


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
    if options.get("disabled") is True or ("disabled" not in options and _sdk_disabled(env)):
        return Config(disabled=True)  # nothing else is read: disabled means off, whatever else is set
    _warn_unknown_variables(env)
    values: dict[str, Any] = {}
    from_env: dict[str, tuple[str, str]] = {}
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
            continue
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
    values.update(options)
    while True:
        try:
            return Config(**values).validate()
        except OptionError as exc:
            if exc.option not in from_env:
                raise
            var, raw = from_env.pop(exc.option)
            if not shared(var):
                raise ValueError(f"{var}={raw!r}: {exc.reason}") from None
            ignored(var, raw, exc.reason)  # the default instead, and validate again
            del values[exc.option]


def shared(var: str) -> bool:
    """A standard variable, which every OpenTelemetry component of the process reads (not ours alone)."""
    return not var.startswith(PREFIX)


def _sdk_disabled(env: Mapping[str, str]) -> bool:
    """``OTEL_SDK_DISABLED`` as the specification defines it and the SDK reads it: ``true`` in any case."""
    raw = env.get("OTEL_SDK_DISABLED")
    if raw is None:
        return False
    value = raw.strip().lower()
    if value not in ("true", "false", ""):
        ignored("OTEL_SDK_DISABLED", raw, "only true (in any case) disables; any other value means false")
    return value == "true"


_ignored_once: set[tuple[str, str]] = set()


def ignored(var: str, raw: str, reason: str) -> None:
    """Say once that a standard variable's value is not used (the default applies, as in the SDK)."""
    if (var, raw) in _ignored_once:
        return
    _ignored_once.add((var, raw))
    logging.getLogger("otel_torchdist").warning("otel-torchdist: ignoring %s=%r: %s", var, raw, reason)


def installed_exporter(group: str, name: str) -> bool:
    """Whether an exporter named ``name`` is installed for the SDK (entry point ``group``)."""
    from importlib.metadata import entry_points

    try:
        return any(True for _ in entry_points(group=group, name=name))
    except Exception:
        return False


class OptionError(ValueError):
    """A bad value, naming the option (``option``) so :func:`load` can name the variable instead."""

    def __init__(self, option: str, reason: str) -> None:
        super().__init__(f"{option}: {reason}")
        self.option = option
        self.reason = reason


# ------------------------------------------------------------------------------------------------ parsing
def _split_list(raw: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in raw.split(",") if x.strip())


def _parse_kv(raw: str, var: str | None = None) -> dict[str, str]:
    """``k=v,k2=v2``, values percent-decoded. For a standard variable (``var``), as the SDK reads
    OTEL_RESOURCE_ATTRIBUTES: an item without ``=`` or with an empty key is left out with a warning."""
    out: dict[str, str] = {}
    for item in raw.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            if var is None:
                raise ValueError(f"expected comma-separated key=value pairs, got item {item.strip()!r}")
            ignored(var, item.strip(), "not a key=value pair; the other pairs are used")
            continue
        out[key.strip() if var else urllib.parse.unquote(key.strip())] = urllib.parse.unquote(value.strip())
    return out


def _parse_headers(raw: str, var: str) -> dict[str, str]:
    """As the SDK's OTLP exporters read their headers variables (opentelemetry.util.re.parse_env_headers):
    names lowercased, values percent-decoded, a malformed item left out with the SDK's own warning; then a
    header no request could carry (a line break, a -bin name) left out too."""
    from opentelemetry.util.re import parse_env_headers

    pairs: dict[str, str] = {}
    for item in raw.split(","):
        if item.strip():
            parsed = parse_env_headers(item, liberal=True)
            if not parsed:
                ignored(var, item.strip(), "not a name=value header; the other headers are sent")
            pairs.update(parsed)
    out = {}
    for key, value in pairs.items():
        try:
            _check_headers(var, {key: value})
        except OptionError as exc:
            ignored(var, f"{key}=...", exc.reason)
            continue
        out[key] = value
    return out


def _parse_spec_bool(raw: str, var: str | None = None) -> bool:
    """A standard boolean: ``true`` or ``false`` in any case (the specification's only values)."""
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    raise ValueError("expected true or false")


def _parse_exporters(group: str, builtin: tuple[str, ...]):
    """An OTEL_*_EXPORTER list, as the SDK's configurator reads it: comma-separated, ``none`` alone for none;
    names matched in any case; a name that is neither built in nor installed for the SDK left out (the SDK's
    configurator raises there: a training job does not stop over it)."""

    def parse(raw: str, var: str) -> tuple[str, ...]:
        items = [x.strip() for x in raw.split(",") if x.strip()]
        if [x.lower() for x in items] == ["none"]:
            return ("none",)
        out = []
        for item in items:
            if item.lower() in builtin and item.lower() != "none":
                out.append(item.lower())
            elif installed_exporter(group, item):
                out.append(item)
            else:
                ignored(var, item, f"no such exporter (built in: {', '.join(builtin)}; none installed as {item!r} for the OpenTelemetry SDK)")
        if not out:
            raise ValueError("no exporter named in it can be used")
        return tuple(dict.fromkeys(out))

    return parse


def _parse_sampler(raw: str, var: str) -> str:
    low = raw.lower()
    if low not in SAMPLERS:
        raise ValueError(f"the SDK does not recognize this sampler either (built in: {', '.join(SAMPLERS)}); the default sampling applies")
    return low


def _parse_bool(raw: str) -> bool:
    low = raw.lower()
    if low in ("true", "1", "yes", "on"):
        return True
    if low in ("false", "0", "no", "off"):
        return False
    raise ValueError("expected true or false")


def _parse_ms(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("expected a number of milliseconds") from None
    if not value > 0:
        raise ValueError("expected a positive number of milliseconds")
    return value / 1000.0


def _parse_seconds(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("expected a number of seconds") from None
    if not value > 0:
        raise ValueError("expected a positive number of seconds")
    return value


def _parse_int(raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError("expected an integer") from None


_BYTE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}


def _parse_bytes(raw: str) -> int:
    """A byte count: ``268435456``, ``256MiB``, ``1GB`` (KB/MB/GB decimal, KiB/MiB/GiB binary)."""
    m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", raw)
    unit = _BYTE_UNITS.get(m.group(2).lower()) if m else None
    if unit is None:
        raise ValueError("expected a byte count such as 268435456, 256MiB or 1GB")
    return int(m.group(1)) * unit


def _parse_bounds(raw: str) -> tuple[float, ...]:
    items = [x.strip() for x in raw.split(",")]
    try:
        if "" in items:
            raise ValueError
        return tuple(float(x) for x in items)
    except ValueError:
        raise ValueError("expected comma-separated numbers of seconds, with none left empty") from None


def _parse_float(raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise ValueError("expected a number") from None


def _parse_choice(choices: tuple[str, ...]):
    def parse(raw: str) -> str:
        low = raw.lower()
        if low not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return low

    return parse


def _parse_choice_list(choices: tuple[str, ...]):
    def parse(raw: str) -> tuple[str, ...]:
        items = tuple(x.lower() for x in _split_list(raw))
        bad = [x for x in items if x not in choices]
        if bad or not items:
            raise ValueError(f"expected a comma-separated list of {', '.join(choices)}")
        return items

    return parse


def _parse_str(raw: str) -> str:
    return raw


def _std(parse):
    """A parser of ours for a standard variable (called with the variable's name too)."""
    return lambda raw, var: parse(raw)


_ENV: tuple[tuple[str, str, Any], ...] = (
    ("OTEL_SERVICE_NAME", "service_name", _std(_parse_str)),
    ("OTEL_RESOURCE_ATTRIBUTES", "resource_attributes", _parse_kv),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "endpoint", _std(_parse_str)),
    ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "traces_endpoint", _std(_parse_str)),
    ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "metrics_endpoint", _std(_parse_str)),
    ("OTEL_EXPORTER_OTLP_PROTOCOL", "protocol", _std(_parse_choice(PROTOCOLS))),
    ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "traces_protocol", _std(_parse_choice(PROTOCOLS))),
    ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "metrics_protocol", _std(_parse_choice(PROTOCOLS))),
    ("OTEL_EXPORTER_OTLP_HEADERS", "headers", _parse_headers),
    ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "traces_headers", _parse_headers),
    ("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "metrics_headers", _parse_headers),
    ("OTEL_EXPORTER_OTLP_TIMEOUT", "timeout", _std(_parse_seconds)),
    ("OTEL_EXPORTER_OTLP_COMPRESSION", "compression", _std(_parse_choice(COMPRESSIONS))),
    ("OTEL_EXPORTER_OTLP_CERTIFICATE", "certificate", _std(_parse_str)),
    ("OTEL_EXPORTER_OTLP_CLIENT_KEY", "client_key", _std(_parse_str)),
    ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "client_certificate", _std(_parse_str)),
    ("OTEL_EXPORTER_OTLP_INSECURE", "insecure", _parse_spec_bool),
    ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "traces_timeout", _std(_parse_seconds)),
    ("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "metrics_timeout", _std(_parse_seconds)),
    ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "traces_compression", _std(_parse_choice(COMPRESSIONS))),
    ("OTEL_EXPORTER_OTLP_METRICS_COMPRESSION", "metrics_compression", _std(_parse_choice(COMPRESSIONS))),
    ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "traces_certificate", _std(_parse_str)),
    ("OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE", "metrics_certificate", _std(_parse_str)),
    ("OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", "traces_client_key", _std(_parse_str)),
    ("OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY", "metrics_client_key", _std(_parse_str)),
    ("OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE", "traces_client_certificate", _std(_parse_str)),
    ("OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE", "metrics_client_certificate", _std(_parse_str)),
    ("OTEL_EXPORTER_OTLP_TRACES_INSECURE", "traces_insecure", _parse_spec_bool),
    ("OTEL_EXPORTER_OTLP_METRICS_INSECURE", "metrics_insecure", _parse_spec_bool),
    ("OTEL_TRACES_EXPORTER", "traces_exporter", _parse_exporters(EXPORTER_GROUPS["traces_exporter"], TRACES_EXPORTERS)),
    ("OTEL_METRICS_EXPORTER", "metrics_exporter", _parse_exporters(EXPORTER_GROUPS["metrics_exporter"], METRICS_EXPORTERS)),
    ("OTEL_TRACES_SAMPLER", "traces_sampler", _parse_sampler),
    ("OTEL_TRACES_SAMPLER_ARG", "traces_sampler_arg", _std(_parse_float)),  # [0, 1]: validate(), as every bound
    ("OTEL_METRIC_EXPORT_INTERVAL", "metric_export_interval", _std(_parse_ms)),
    ("OTEL_BSP_SCHEDULE_DELAY", "span_schedule_delay", _std(_parse_ms)),
    ("OTEL_BSP_MAX_QUEUE_SIZE", "span_queue_size", _std(_parse_int)),
    ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "span_batch_size", _std(_parse_int)),
    ("OTEL_EXPORTER_PROMETHEUS_HOST", "prometheus_host", _std(_parse_str)),
    ("OTEL_EXPORTER_PROMETHEUS_PORT", "prometheus_port", _std(_parse_int)),
    ("OTEL_SDK_DISABLED", "disabled", _parse_spec_bool),  # read first, by load() (_sdk_disabled)
    ("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "metrics_temporality", _std(_parse_choice(TEMPORALITIES))),
    ("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "attribute_value_length_limit", _std(_parse_int)),
    ("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "attribute_value_length_limit", _std(_parse_int)),
    ("OTEL_ATTRIBUTE_COUNT_LIMIT", "attribute_count_limit", _std(_parse_int)),
    ("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "attribute_count_limit", _std(_parse_int)),
    (PREFIX + "PROMETHEUS", "prometheus", _parse_bool),
    (PREFIX + "GLOBAL_METER_PROVIDER", "global_meter_provider", _parse_bool),
    (PREFIX + "RUN_DIR", "run_dir", _parse_str),
    (PREFIX + "RUN_ID", "run_id", _parse_str),
    (PREFIX + "FILE_MAX_BYTES", "file_max_bytes", _parse_bytes),
    (PREFIX + "MAX_QUEUED_RECORDS", "max_queued_records", _parse_int),
    (PREFIX + "DRAIN_INTERVAL_MS", "drain_interval", _parse_ms),
    (PREFIX + "FLUSH_TIMEOUT_MS", "flush_timeout", _parse_ms),
    (PREFIX + "METRICS_RANK_LABEL", "metrics_rank_label", _parse_bool),
    (PREFIX + "SUMMARY", "summary", _parse_choice(SUMMARY_MODES)),
    (PREFIX + "METRICS_AGGREGATION", "metrics_aggregation", _parse_choice(AGGREGATIONS)),
    (PREFIX + "NODE_NAME", "node_name", _parse_str),
    (PREFIX + "NODE_METRICS_INTERVAL_MS", "node_metrics_interval", _parse_ms),
    (PREFIX + "HISTOGRAM_BUCKETS", "histogram_buckets", _parse_bounds),
    (PREFIX + "TRACE_FIRST_STEPS", "trace_first_steps", _parse_int),
    (PREFIX + "MAX_SPANS_PER_STEP", "max_spans_per_step", _parse_int),
    (PREFIX + "TRACE_EVERY_STEPS", "trace_every_steps", _parse_int),
    (PREFIX + "TRACE_RANKS", "trace_ranks", _parse_str),
    (PREFIX + "HANG_THRESHOLD_MS", "hang_threshold", _parse_ms),
    (PREFIX + "STRAGGLER_EXCHANGE_STEPS", "straggler_exchange_steps", _parse_int),
    (PREFIX + "WARN_SLOW_STEP_FACTOR", "slow_step_factor", _parse_float),
    (PREFIX + "COMPILE_CAPTURE", "compile_capture", _parse_choice(("off", "sampled"))),
    (PREFIX + "NATIVE", "native", _parse_choice(NATIVE_MODES)),
    (PREFIX + "LOG_LEVEL", "log_level", lambda raw: _parse_choice(tuple(x.lower() for x in LOG_LEVELS))(raw).upper()),
    (PREFIX + "SYSTEM_METRICS", "system_metrics", _parse_bool),
    (PREFIX + "RUN_FOLDER_COPY", "run_folder_copy", _parse_bool),
    (PREFIX + "SYSTEM_INTERVAL_MS", "system_interval", _parse_ms),
    (PREFIX + "WARN_GPU_UTILIZATION", "warn_gpu_utilization", _parse_float),
    (PREFIX + "WARN_GPU_UTILIZATION_WINDOW_MS", "warn_gpu_utilization_window", _parse_ms),
    (PREFIX + "WARN_MEMORY_FRACTION", "warn_memory_fraction", _parse_float),
)

ENV_VARS = tuple(var for var, _, _ in _ENV)
# Read outside the configuration: where the native part's builds live (otel_torchdist.native, which
# `otel-torchdist build-native` uses without a Config).
ELSEWHERE = (PREFIX + "NATIVE_DIR",)
"""Every variable :func:`load` reads (the frozen-names test and the docs list them)."""


# ------------------------------------------------------------------------------------------------ checks
def _choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise OptionError(name, f"must be one of {', '.join(choices)}, got {value!r}")


def _check_bounds(name: str, value: Any) -> tuple[float, ...]:
    if not isinstance(value, (tuple, list)) or not value:
        raise OptionError(name, f"must be a non-empty list of seconds, got {value!r}")
    for v in value:
        _number(name, v, 0.0, None, exclusive_min=True)
    if any(b <= a for a, b in zip(value, value[1:])):
        raise OptionError(name, f"must be strictly increasing, got {value!r}")
    return tuple(float(v) for v in value)


def _check_ranks(name: str, value: Any) -> tuple[int, ...]:
    """Normalise a rank selection to the sorted ranks it names."""
    if isinstance(value, str):
        ranks: set[int] = set()
        for item in _split_list(value):
            m = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+))?)?", item)
            if m is None:
                raise OptionError(name, f"must be comma-separated ranks and ranges such as 0-7,64 or 0-1023:64; {item!r} is neither")
            lo = int(m.group(1))
            hi = int(m.group(2)) if m.group(2) is not None else lo
            stride = int(m.group(3)) if m.group(3) is not None else 1
            if hi < lo or stride < 1:
                raise OptionError(name, f"range {item!r} must go up (a-b with a <= b) with a stride of at least 1")
            if (hi - lo) // stride >= _MAX_LISTED_RANKS:
                raise OptionError(name, f"range {item!r} names more than {_MAX_LISTED_RANKS} ranks")
            ranks.update(range(lo, hi + 1, stride))
        if not ranks:
            raise OptionError(name, f"names no rank: {value!r}")
        return tuple(sorted(ranks))
    if isinstance(value, (tuple, list, set, frozenset, range)) and value:
        for v in value:
            _integer(name, v, 0)
        return tuple(sorted(set(value)))
    raise OptionError(name, f"must be a rank list such as '0-7,64' or a non-empty list of ranks, got {value!r}")


def _number(name: str, value: Any, lo: float | None, hi: float | None, exclusive_min: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise OptionError(name, f"must be a finite number, got {value!r}")
    if lo is not None and (value <= lo if exclusive_min else value < lo):
        raise OptionError(name, f"must be {'>' if exclusive_min else '>='} {lo}, got {value!r}")
    if hi is not None and value > hi:
        raise OptionError(name, f"must be <= {hi}, got {value!r}")


MAX_SECONDS = 7 * 24 * 3600.0
"""The longest duration a setting takes: a week (threading refuses waits past about 292 years, and
anything near that is a unit mistake)."""
MIN_INTERVAL_S = 0.001
"""The shortest interval of a periodic job (export, drain, sampling): shorter is a unit mistake that would
spin a thread."""


def _seconds(name: str, value: Any, lo: float = 0.0) -> None:
    """A duration in seconds (its env variable, if any, is in milliseconds and already converted)."""
    _number(name, value, 0.0, MAX_SECONDS, exclusive_min=True)
    if value < lo:
        raise OptionError(name, f"must be at least {lo * 1e3:g} ms, got {value * 1e3:g} ms")


# Header names: HTTP's token characters; values: visible ASCII, space and tab (gRPC metadata allows no more,
# and a line break would end the header early). Keys ending in -bin carry binary values over gRPC only.
_HEADER_NAME = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+")
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e]*")


def _check_headers(name: str, value: Mapping[str, str]) -> None:
    for key, v in value.items():
        if not _HEADER_NAME.fullmatch(key):
            raise OptionError(name, f"header name {key!r} may only hold letters, digits and !#$%&'*+.^_`|~-")
        if key.lower().endswith("-bin"):
            raise OptionError(name, f"header {key!r}: names ending in -bin are binary gRPC metadata, not supported")
        if not _HEADER_VALUE.fullmatch(v):
            raise OptionError(name, f"header {key!r} has a value with a line break, control or non-ASCII character: {v!r}")


def _integer(name: str, value: Any, lo: int, hi: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise OptionError(name, f"must be an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        raise OptionError(name, f"must be in [{lo}, {hi if hi is not None else 'inf'}], got {value!r}")


def _check_endpoint(name: str, value: Any) -> None:
    if not isinstance(value, str):
        raise OptionError(name, f"must be a URL string, got {value!r}")
    try:
        parsed = urllib.parse.urlparse(value if "://" in value else "http://" + value)
        host = parsed.hostname
    except ValueError as exc:  # "Invalid IPv6 URL": an unclosed bracket
        raise OptionError(name, f"must be an http(s) URL such as http://localhost:4318 ({exc}), got {value!r}") from None
    if parsed.scheme not in ("http", "https") or not host or not _valid_host(host):
        raise OptionError(name, f"must be an http(s) URL such as http://localhost:4318, got {value!r}")
    try:
        parsed.port
    except ValueError:
        raise OptionError(name, f"has an invalid port: {value!r}") from None


def _valid_host(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
        return True
    except ValueError:
        pass
    labels = host.rstrip(".").split(".")
    return all(
        0 < len(label) <= 63 and label[0] != "-" and label[-1] != "-" and all(c.isascii() and (c.isalnum() or c in "-_") for c in label)
        for label in labels
    )


def _check_host(name: str, value: Any) -> None:
    if not isinstance(value, str) or not value or not _valid_host(value):
        raise OptionError(name, f"must be a host name or IP address such as 0.0.0.0 or 127.0.0.1, got {value!r}")


def _check_file(name: str, value: Any) -> None:
    """TLS material is read when the exporter is built, possibly minutes later: refuse a bad path now."""
    if not isinstance(value, str) or not value:
        raise OptionError(name, f"must be the path of a PEM file, got {value!r}")
    if not os.path.isfile(value) or not os.access(value, os.R_OK):
        raise OptionError(name, f"must be the path of a readable PEM file; {value!r} is not one")


def _check_run_id(name: str, value: Any) -> None:
    if not isinstance(value, str) or not value or len(value) > 128:
        raise OptionError(name, f"must be a non-empty string of at most 128 characters, got {value!r}")
    if any(not (c.isalnum() or c in "-_.") for c in value):
        raise OptionError(name, f"may only hold letters, digits, '-', '_' and '.', got {value!r}")
