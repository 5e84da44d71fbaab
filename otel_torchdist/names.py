"""Every telemetry name otel-torchdist emits: span names, attribute keys, metric names and units.

Names are a schema. Dashboards, alert rules and the ``otel-torchdist`` analyzer select on them, so they
live here and nowhere else, and ``tests/test_names.py`` freezes the emitted set: renaming anything here
is a breaking change that must update that test, ``dashboards/`` and ``deploy/`` together.

Conventions (OpenTelemetry style in code, Prometheus names derived):

* Resource and span attributes are lowercase, dotted, namespaced under ``torchdist.`` unless an
  OpenTelemetry semantic convention already names the thing (``service.*``, ``host.name``,
  ``process.pid``, ``exception.*``, ``error.type``).
* Metric attributes are short (``op``, ``group``, ``rank``, ``run``) because they become Prometheus labels
  that people type in PromQL.
* Metric units go in ``unit=`` (UCUM: ``s``, ``By``, ``{call}``), never in the name; the Prometheus name
  is derived by :func:`prometheus_name`, the same way the OpenTelemetry Collector's Prometheus exporter
  derives it, so direct ``/metrics`` scraping and the Collector path give identical series names.
"""

from __future__ import annotations

from dataclasses import dataclass

# --------------------------------------------------------------------------------------------------
# Instrumentation scope
SCOPE_NAME = "otel_torchdist"

# --------------------------------------------------------------------------------------------------
# Resource attributes (one set per process)
SERVICE_NAME = "service.name"
SERVICE_INSTANCE_ID = "service.instance.id"
HOST_NAME = "host.name"
PROCESS_PID = "process.pid"
RUN_ID = "torchdist.run.id"
RANK = "torchdist.rank"
LOCAL_RANK = "torchdist.local_rank"
WORLD_SIZE = "torchdist.world_size"
LOCAL_WORLD_SIZE = "torchdist.local_world_size"
NODE_RANK = "torchdist.node_rank"
BACKEND = "torchdist.backend"
TORCH_VERSION = "torchdist.torch.version"
RESTART_COUNT = "torchdist.restart_count"
LIBRARY_VERSION = "torchdist.library.version"

RESOURCE_ATTRIBUTES = (
    SERVICE_NAME,
    SERVICE_INSTANCE_ID,
    HOST_NAME,
    PROCESS_PID,
    RUN_ID,
    RANK,
    LOCAL_RANK,
    WORLD_SIZE,
    LOCAL_WORLD_SIZE,
    NODE_RANK,
    BACKEND,
    TORCH_VERSION,
    RESTART_COUNT,
    LIBRARY_VERSION,
)

# --------------------------------------------------------------------------------------------------
# Span names. A collective's span is named after the API that was called (low cardinality: a fixed set).
COLLECTIVE_SPAN_NAMES = (
    "all_reduce",
    "all_reduce_coalesced",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "_all_gather_base",
    "all_gather_coalesced",
    "all_gather_object",
    "all_gather_single_coalesced",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "_reduce_scatter_base",
    "reduce_scatter_single_coalesced",
    "broadcast",
    "broadcast_object_list",
    "_broadcast_coalesced",
    "reduce",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "monitored_barrier",
    "send",
    "recv",
    "isend",
    "irecv",
    "send_object_list",
    "recv_object_list",
    "batch_isend_irecv",
)

# --------------------------------------------------------------------------------------------------
# Span attributes of a collective
COLL_OP = "torchdist.collective.op"  # the API that was called, e.g. all_gather_into_tensor
COLL_KIND = "torchdist.collective.kind"  # its nccl-tests family, e.g. all_gather
COLL_BACKEND = "torchdist.collective.backend"
COLL_GROUP_NAME = "torchdist.group.name"
COLL_GROUP_DESC = "torchdist.group.desc"
COLL_GROUP_SIZE = "torchdist.group.size"
COLL_GROUP_RANK = "torchdist.group.rank"
COLL_GROUP_RANKS = "torchdist.group.ranks"  # member global ranks, only for small groups
COLL_DTYPE = "torchdist.collective.dtype"
COLL_SHAPES = "torchdist.collective.shapes"
COLL_NUMEL = "torchdist.collective.numel"
COLL_TENSORS = "torchdist.collective.tensors"
COLL_MESSAGE_SIZE = "torchdist.collective.message_size"  # S in bytes, nccl-tests' definition
COLL_BYTES_SENT = "torchdist.collective.bytes_sent"
COLL_BYTES_RECEIVED = "torchdist.collective.bytes_received"
COLL_REDUCE_OP = "torchdist.collective.reduce_op"
COLL_ROOT = "torchdist.collective.root"  # global rank of the root
COLL_PEER = "torchdist.collective.peer"  # global rank of the peer (p2p)
COLL_PEERS = "torchdist.collective.peers"  # batch_isend_irecv: every peer
COLL_ASYNC = "torchdist.collective.async"
COLL_SEQ = "torchdist.collective.seq"
COLL_DURATION = "torchdist.collective.duration_s"
COLL_ALGBW = "torchdist.collective.algbw_gbps"  # GB/s = 1e9 bytes/s, as nccl-tests prints
COLL_BUSBW = "torchdist.collective.busbw_gbps"
COLL_END_SOURCE = "torchdist.collective.end_source"
COLL_COALESCED_OPS = "torchdist.collective.coalesced_ops"
COLL_SOURCE = "torchdist.collective.source"  # which capture path saw it: c10d, pg, coalescing, ...
ERROR_TYPE = "error.type"
EXCEPTION_EVENT = "exception"
EXCEPTION_TYPE = "exception.type"
EXCEPTION_MESSAGE = "exception.message"

COLLECTIVE_SPAN_ATTRIBUTES = (
    COLL_OP,
    COLL_KIND,
    COLL_BACKEND,
    COLL_GROUP_NAME,
    COLL_GROUP_DESC,
    COLL_GROUP_SIZE,
    COLL_GROUP_RANK,
    COLL_GROUP_RANKS,
    COLL_DTYPE,
    COLL_SHAPES,
    COLL_NUMEL,
    COLL_TENSORS,
    COLL_MESSAGE_SIZE,
    COLL_BYTES_SENT,
    COLL_BYTES_RECEIVED,
    COLL_REDUCE_OP,
    COLL_ROOT,
    COLL_PEER,
    COLL_PEERS,
    COLL_ASYNC,
    COLL_SEQ,
    COLL_DURATION,
    COLL_ALGBW,
    COLL_BUSBW,
    COLL_END_SOURCE,
    COLL_COALESCED_OPS,
    COLL_SOURCE,
    ERROR_TYPE,
)

# How a record's end time was observed (values of COLL_END_SOURCE).
END_RETURN = "return"  # a blocking call returned: the collective is complete
END_FUTURE = "future"  # the Work's future completed (a backend thread signalled completion)
END_WAIT = "wait"  # Work.wait() returned; the backend offers no earlier completion signal (gloo p2p)
END_NCCL_HOOK = "nccl_completion_hook"  # ProcessGroupNCCL's completion hook, GPU-timed
END_ENQUEUE = "enqueue"  # only the launch was observed (GPU backend without completion timing)
END_UNFINISHED = "unfinished"  # never observed to complete (work dropped, or process exiting)
END_SOURCES = (END_RETURN, END_FUTURE, END_WAIT, END_NCCL_HOOK, END_ENQUEUE, END_UNFINISHED)

# --------------------------------------------------------------------------------------------------
# Metric attributes (become Prometheus labels)
M_OP = "op"
M_GROUP = "group"
M_RANK = "rank"
M_RUN = "run"
M_KIND = "kind"  # telemetry self-metrics: what was dropped / which component failed

# --------------------------------------------------------------------------------------------------
# Metrics


@dataclass(frozen=True)
class Metric:
    name: str
    instrument: str  # "histogram" | "counter" | "gauge"
    unit: str
    description: str
    attributes: tuple[str, ...]


COLLECTIVE_LABELS = (M_RUN, M_RANK, M_OP, M_GROUP)

COLLECTIVE_DURATION = Metric(
    "torchdist.collective.duration",
    "histogram",
    "s",
    "Time from a collective's issue to its observed completion.",
    COLLECTIVE_LABELS,
)
COLLECTIVE_CALLS = Metric(
    "torchdist.collective.calls",
    "counter",
    "{call}",
    "Collectives completed (successfully or not).",
    COLLECTIVE_LABELS,
)
COLLECTIVE_BYTES = Metric(
    "torchdist.collective.bytes",
    "counter",
    "By",
    "Message size S (nccl-tests' definition) summed over collectives; rate(bytes)/rate(duration_sum) is algbw.",
    COLLECTIVE_LABELS,
)
COLLECTIVE_BUS_BYTES = Metric(
    "torchdist.collective.bus_bytes",
    "counter",
    "By",
    "S times nccl-tests' bus factor, summed; rate(bus_bytes)/rate(duration_sum) is busbw.",
    COLLECTIVE_LABELS,
)
COLLECTIVE_ERRORS = Metric(
    "torchdist.collective.errors",
    "counter",
    "{call}",
    "Collectives that raised.",
    COLLECTIVE_LABELS,
)
TELEMETRY_DROPPED = Metric(
    "torchdist.telemetry.dropped",
    "counter",
    "{item}",
    "Telemetry items dropped to protect training (kind=record|span|span_batch|metric_batch).",
    (M_RUN, M_RANK, M_KIND),
)
TELEMETRY_ERRORS = Metric(
    "torchdist.telemetry.errors",
    "counter",
    "{error}",
    "Internal telemetry failures that were logged once and swallowed (kind=component).",
    (M_RUN, M_RANK, M_KIND),
)

METRICS = (
    COLLECTIVE_DURATION,
    COLLECTIVE_CALLS,
    COLLECTIVE_BYTES,
    COLLECTIVE_BUS_BYTES,
    COLLECTIVE_ERRORS,
    TELEMETRY_DROPPED,
    TELEMETRY_ERRORS,
)

# Seconds. Spans 10 µs (a small CPU collective) to 10 min (a hang being noticed).
DURATION_BUCKETS = (
    1e-5,
    2.5e-5,
    5e-5,
    1e-4,
    2.5e-4,
    5e-4,
    1e-3,
    2.5e-3,
    5e-3,
    1e-2,
    2.5e-2,
    5e-2,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    600.0,
)

# --------------------------------------------------------------------------------------------------
# OpenTelemetry -> Prometheus names, the Collector's way (prometheus/otlptranslator with suffixes on).

_UNIT_SUFFIX = {
    "s": "seconds",
    "ms": "milliseconds",
    "By": "bytes",
    "1": "ratio",
    "%": "percent",
    "Hz": "hertz",
    "W": "watts",
    "J": "joules",
    "Cel": "celsius",
    "By/s": "bytes_per_second",
}


def prometheus_name(metric: Metric) -> str:
    """The Prometheus family name of ``metric`` (without ``_bucket``/``_sum``/``_count``)."""
    name = metric.name.replace(".", "_").replace("-", "_")
    unit = metric.unit
    if not unit.startswith("{"):
        suffix = _UNIT_SUFFIX.get(unit)
        if suffix is None:
            raise ValueError(f"no Prometheus suffix known for unit {unit!r} of {metric.name}")
        if suffix == "ratio" and metric.instrument != "gauge":
            suffix = ""
        if suffix and not name.endswith("_" + suffix):
            name = f"{name}_{suffix}"
    if metric.instrument == "counter":
        name += "_total"
    return name


def prometheus_series_names() -> set[str]:
    """Every series name a scrape of ``/metrics`` can show (histograms expand to three)."""
    out: set[str] = set()
    for m in METRICS:
        base = prometheus_name(m)
        if m.instrument == "histogram":
            out.update({base + "_bucket", base + "_sum", base + "_count"})
        else:
            out.add(base)
    return out
