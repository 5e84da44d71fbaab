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
  is derived by ``export/prometheus_names.py``, the same way the OpenTelemetry Collector's Prometheus exporter
  derives it, so direct ``/metrics`` scraping and the Collector path give identical series names.
"""

from __future__ import annotations

import re
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

# Run description (system telemetry): what the run was, recorded once per rank.
NODE_COUNT = "torchdist.node_count"
CUDA_VERSION = "torchdist.cuda.version"
NCCL_VERSION = "torchdist.nccl.version"
GPU_MODELS = "torchdist.gpu.models"  # one entry per GPU this rank uses
GPU_MEMORY = "torchdist.gpu.memory_bytes"  # total memory of those GPUs, one entry per GPU
GPU_COUNT = "torchdist.gpu.count"  # GPUs visible to this process
AMP_DTYPE = "torchdist.amp.dtype"  # autocast dtype when detected
RUN_DESCRIPTION_ATTRIBUTES = (NODE_COUNT, CUDA_VERSION, NCCL_VERSION, GPU_MODELS, GPU_MEMORY, GPU_COUNT, AMP_DTYPE)

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
    # functional collectives (DTensor, tensor parallel), by the Python function called
    "all_gather_tensor",
    "all_gather_single_autograd",
    "all_gather_tensor_autograd",
    "reduce_scatter_single_autograd",
    "reduce_scatter_tensor_autograd",
    "all_to_all_single_autograd",
    "all_gather_into_tensor_coalesced",
    "reduce_scatter_tensor_coalesced",
    "permute_tensor",
    "shard_dim_alltoall",  # DTensor's Shard(i) -> Shard(j) off CPU (a C++ op of its own)
    # compiled graphs (deep capture), by the functional op
    "all_gather_into_tensor",
)

# --------------------------------------------------------------------------------------------------
# Span attributes of a collective
COLL_OP = "torchdist.collective.op"  # the API that was called, e.g. all_gather_into_tensor
COLL_KIND = "torchdist.collective.kind"  # its nccl-tests family, e.g. all_gather
COLL_BACKEND = "torchdist.collective.backend"
COLL_GROUP_NAME = "torchdist.group.name"
COLL_GROUP_DESC = "torchdist.group.desc"
COLL_GROUP_LABEL = "torchdist.group.label"  # the metrics' `group` label value (past 256 groups: overflow)
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
COLL_ALGBW = "torchdist.collective.algbw_gbps"  # GB/s = 1e9 bytes/s, as nccl-tests prints; none without a completion seen
COLL_BUSBW = "torchdist.collective.busbw_gbps"
COLL_END_SOURCE = "torchdist.collective.end_source"
COLL_WAIT_S = "torchdist.collective.wait_s"  # end_source wait: how long the wait() it was timed to blocked
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
    COLL_GROUP_LABEL,
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
    COLL_WAIT_S,
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

# Where a collective came from (attributes on collective spans, set by the framework captures).
COLL_PHASE = "torchdist.collective.phase"  # forward | backward | optimizer | checkpoint | other
COLL_MODULE = "torchdist.collective.module"  # FQN of the module (FSDP unit) that issued it
COLL_FRAMEWORK = "torchdist.collective.framework"  # c10d | ddp | fsdp | fsdp1 | dtensor | funcol | compiled
DDP_BUCKET_INDEX = "torchdist.ddp.bucket.index"
DDP_BUCKET_BYTES = "torchdist.ddp.bucket.bytes"
DDP_BUCKET_PARAMS = "torchdist.ddp.bucket.parameters"
DDP_BUCKET_LAST = "torchdist.ddp.bucket.last"
FSDP_ACTION = "torchdist.fsdp.action"  # unshard | reduce_scatter (post-backward: HSDP's all-reduce too)
FUNCOL_WAIT_S = "torchdist.funcol.wait_s"  # how long the wait_tensor that completed it blocked
PHASES = ("forward", "backward", "optimizer", "checkpoint", "other")
FRAMEWORKS = ("c10d", "ddp", "fsdp", "fsdp1", "dtensor", "funcol", "compiled")
SOURCE_ATTRIBUTES = (
    COLL_PHASE,
    COLL_MODULE,
    COLL_FRAMEWORK,
    DDP_BUCKET_INDEX,
    DDP_BUCKET_BYTES,
    DDP_BUCKET_PARAMS,
    DDP_BUCKET_LAST,
    FSDP_ACTION,
    FUNCOL_WAIT_S,
)

# --------------------------------------------------------------------------------------------------
# Training-path spans: optimizer steps, model wrapping and sharding
SPAN_OPTIMIZER_STEP = "optimizer.step"
SPAN_DDP_INIT = "ddp.init"
SPAN_FULLY_SHARD = "sharding.fully_shard"  # FSDP2
SPAN_FSDP_WRAP = "sharding.fsdp_wrap"  # FSDP1
SPAN_DISTRIBUTE_TENSOR = "sharding.distribute_tensor"
SPAN_REDISTRIBUTE = "sharding.redistribute"
SPAN_DISTRIBUTE_MODULE = "sharding.distribute_module"
SPAN_PARALLELIZE_MODULE = "sharding.parallelize_module"
SPAN_CHECKPOINT_SAVE = "checkpoint.save"  # torch.distributed.checkpoint
SPAN_CHECKPOINT_LOAD = "checkpoint.load"
TRAINING_SPAN_NAMES = (
    SPAN_OPTIMIZER_STEP,
    SPAN_DDP_INIT,
    SPAN_FULLY_SHARD,
    SPAN_FSDP_WRAP,
    SPAN_DISTRIBUTE_TENSOR,
    SPAN_REDISTRIBUTE,
    SPAN_DISTRIBUTE_MODULE,
    SPAN_PARALLELIZE_MODULE,
    SPAN_CHECKPOINT_SAVE,
    SPAN_CHECKPOINT_LOAD,
)

OPT_CLASS = "torchdist.optimizer.class"
OPT_INNER_CLASS = "torchdist.optimizer.inner_class"  # ZeRO's local optimizer
OPT_PARAM_GROUPS = "torchdist.optimizer.param_groups"
OPT_PARAMS = "torchdist.optimizer.parameters"
OPT_LR = "torchdist.optimizer.lr"  # one per parameter group
OPT_MOMENTUM = "torchdist.optimizer.momentum"
OPT_BETAS = "torchdist.optimizer.betas"  # "b1,b2" per parameter group
OPT_STEP = "torchdist.optimizer.step_index"
OPT_IN_BACKWARD = "torchdist.optimizer.in_backward"
MODEL_CLASS = "torchdist.model.class"
MODEL_PARAMS = "torchdist.model.parameters"
MODEL_TRAINABLE = "torchdist.model.trainable_parameters"
MODEL_PARAM_BYTES = "torchdist.model.parameter_bytes"
DDP_BUCKET_CAP_MB = "torchdist.ddp.bucket_cap_mb"
DDP_FIND_UNUSED = "torchdist.ddp.find_unused_parameters"
DDP_GRAD_AS_BUCKET_VIEW = "torchdist.ddp.gradient_as_bucket_view"
DDP_STATIC_GRAPH = "torchdist.ddp.static_graph"
DDP_BROADCAST_BUFFERS = "torchdist.ddp.broadcast_buffers"
DDP_COMM_HOOK = "torchdist.ddp.comm_hook"
SHARD_MODULE = "torchdist.sharding.module"  # FQN of the module being sharded / parallelized
SHARD_MODULES = "torchdist.sharding.modules"  # how many modules were wrapped
SHARD_PARAMS = "torchdist.sharding.parameters"  # a sharding unit's own parameters, unsharded (not its inner units')
SHARD_ORIGINAL_SHAPES = "torchdist.sharding.original_shapes"
SHARD_SHARDED_SHAPES = "torchdist.sharding.sharded_shapes"
SHARD_PLACEMENTS_BEFORE = "torchdist.sharding.placements_before"
SHARD_PLACEMENTS_AFTER = "torchdist.sharding.placements_after"
SHARD_MESH_SHAPE = "torchdist.sharding.mesh_shape"
SHARD_MESH_DIMS = "torchdist.sharding.mesh_dim_names"
SHARD_PLAN = "torchdist.sharding.plan"  # parallelize_module: "fqn=Style" entries
CKPT_ID = "torchdist.checkpoint.id"  # checkpoint_id / storage path
CKPT_BYTES = "torchdist.checkpoint.bytes"  # tensor bytes this rank saved or loaded
CKPT_TENSORS = "torchdist.checkpoint.tensors"
CKPT_ASYNC = "torchdist.checkpoint.async"
TRAINING_SPAN_ATTRIBUTES = (
    OPT_CLASS,
    OPT_INNER_CLASS,
    OPT_PARAM_GROUPS,
    OPT_PARAMS,
    OPT_LR,
    OPT_MOMENTUM,
    OPT_BETAS,
    OPT_STEP,
    OPT_IN_BACKWARD,
    MODEL_CLASS,
    MODEL_PARAMS,
    MODEL_TRAINABLE,
    MODEL_PARAM_BYTES,
    DDP_BUCKET_CAP_MB,
    DDP_FIND_UNUSED,
    DDP_GRAD_AS_BUCKET_VIEW,
    DDP_STATIC_GRAPH,
    DDP_BROADCAST_BUFFERS,
    DDP_COMM_HOOK,
    SHARD_MODULE,
    SHARD_MODULES,
    SHARD_PARAMS,
    SHARD_ORIGINAL_SHAPES,
    SHARD_SHARDED_SHAPES,
    SHARD_PLACEMENTS_BEFORE,
    SHARD_PLACEMENTS_AFTER,
    SHARD_MESH_SHAPE,
    SHARD_MESH_DIMS,
    SHARD_PLAN,
    CKPT_ID,
    CKPT_BYTES,
    CKPT_TENSORS,
    CKPT_ASYNC,
)

# --------------------------------------------------------------------------------------------------
# Steps, stragglers and hangs
SPAN_STEP = "train.step"  # the shared root of one step's trace (rank 0 emits it, or the lowest rank trace_ranks keeps)
SPAN_RANK_STEP = "train.rank_step"  # one per rank and step, child of the root
SPAN_PHASES = {"forward": "train.forward", "backward": "train.backward"}  # a phase inside a rank's step, by phase
SPAN_PHASE_BEFORE = "train.phase"  # what every phase span was named before (runs of earlier versions)
SPAN_HANG = "collective.hang"  # a collective in flight beyond the threshold
SPAN_WARNING = "torchdist.warning"  # a warning with no better home (low GPU utilization, ...)
STEP_SPAN_NAMES = (SPAN_STEP, SPAN_RANK_STEP, *SPAN_PHASES.values(), SPAN_HANG, SPAN_WARNING)

# A span's name as exported carries its rank, so that Jaeger's trace view shows whose span each row is
# without opening it: "all_reduce rank=3". Bounded by the world size (the ranks), as the rank label of the
# metrics is. The step's root is every rank's: it has none.
RANK_IN_NAME = " rank=%d"
CROSS_RANK_SPANS = frozenset({SPAN_STEP})
_RANK_SUFFIX = re.compile(r" rank=\d+$")


def exported_span_name(name: str, rank: int | None) -> str:
    return name if rank is None or name in CROSS_RANK_SPANS else name + RANK_IN_NAME % rank


def span_base_name(exported: str) -> str:
    """The name without its rank: what the constants above say (exported_span_name's inverse)."""
    return _RANK_SUFFIX.sub("", exported)

STEP = "torchdist.step"  # the step index
STEP_SOURCE = "torchdist.step.source"  # optimizer | explicit
STEP_OCCURRENCE = "torchdist.step.occurrence"  # times this step number began before on the rank (when > 0)
STEP_SETUP = "torchdist.step.setup"  # true on the rank's first step, which holds its set-up
# true on a traced step the step metrics leave out: the tail after the last optimizer step, the set-up step
# explicit steps took over (it never had an optimizer step)
STEP_UNCOUNTED = "torchdist.step.uncounted"
STEP_RANKS_TIMED = "torchdist.step.ranks_timed"  # on train.step: the ranks whose step times its interval covers
STEP_DURATION = "torchdist.step.duration_s"
STEP_COMPUTE = "torchdist.step.compute_s"  # step time not spent blocked in collectives
STEP_COLLECTIVE_WAIT = "torchdist.step.collective_wait_s"  # time blocked in collectives (calls, wait())
STEP_COLLECTIVES = "torchdist.step.collectives"
STEP_BYTES = "torchdist.step.message_bytes"
STEP_LOSS = "torchdist.step.loss"
STEP_LR = "torchdist.step.learning_rate"
STEP_SAMPLES = "torchdist.step.samples"
STEP_TOKENS = "torchdist.step.tokens"
PHASE_NAME = "torchdist.phase"  # on phase spans (SPAN_PHASES): forward | backward
HANG_WAITED = "torchdist.hang.waited_s"
HANG_THRESHOLD = "torchdist.hang.threshold_s"
HANG_MISSING_RANKS = "torchdist.hang.missing_ranks"  # global ranks of the group that have not started it
HANG_MISSING_DETAIL = "torchdist.hang.missing"  # per missing rank: what it last started, when it last reported
WARNING_KIND = "torchdist.warning.kind"
WARNING_MESSAGE = "torchdist.warning.message"
WARNING_EVENT = "torchdist.warning"
HANG_EVENT = "collective.hang"
HANG_MISSING_EVENT = "collective.hang.missing_ranks"
WARNING_KINDS = ("low_gpu_utilization", "slow_step", "memory_near_limit", "ddp_config", "hang")
STEP_SPAN_ATTRIBUTES = (
    STEP,
    STEP_SOURCE,
    STEP_OCCURRENCE,
    STEP_SETUP,
    STEP_UNCOUNTED,
    STEP_RANKS_TIMED,
    STEP_DURATION,
    STEP_COMPUTE,
    STEP_COLLECTIVE_WAIT,
    STEP_COLLECTIVES,
    STEP_BYTES,
    STEP_LOSS,
    STEP_LR,
    STEP_SAMPLES,
    STEP_TOKENS,
    PHASE_NAME,
    HANG_WAITED,
    HANG_THRESHOLD,
    HANG_MISSING_RANKS,
    HANG_MISSING_DETAIL,
    WARNING_KIND,
    WARNING_MESSAGE,
)

# --------------------------------------------------------------------------------------------------
# Metric attributes (become Prometheus labels)
M_OP = "op"
M_GROUP = "group"
GROUP_OVERFLOW = "overflow"  # the `group` of the collectives of groups past capture/groups.MAX_SERIES_GROUPS
M_RANK = "rank"
M_RUN = "run"
M_KIND = "kind"  # telemetry self-metrics: what was dropped / which component failed
M_OPTIMIZER = "optimizer"  # optimizer class
M_MODEL = "model"  # wrapped model class
M_PARAM_KIND = "kind"  # model parameters: total | trainable
M_GPU = "gpu"  # GPU index as NVML numbers it (DCGM's "gpu")
M_UUID = "uuid"  # GPU UUID (DCGM's "UUID")
M_GPU_MODEL = "model"  # GPU model name (DCGM's "modelName")
M_HOST = "host"  # host name (DCGM's "Hostname")
M_DIRECTION = "direction"  # transmit | receive
M_MISSING_RANK = "missing_rank"  # a rank that has not started a hung collective
M_REASON = "reason"  # GPU throttle reason
M_ERROR_KIND = "type"  # corrected | uncorrected
M_DEVICE = "device"  # torch CUDA device index
M_CKPT_OP = "op"  # checkpoint: save | load

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
    "Time from a collective's issue to its observed completion, of the calls that completed (a failed or unfinished call counts in calls, not here).",
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
    "Message size S (nccl-tests' definition) summed over collectives (not those that failed or were never seen "
    "to finish); rate(bytes)/rate(duration_sum) is algbw.",
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
# Kinds of torchdist.telemetry.dropped that are limits the user set (policy), not telemetry lost to protect
# training: the run's end-of-run warning and the alert leave them out.
DROPPED_STEP_LIMIT = "span_step_limit"  # max_spans_per_step
DROPPED_FILE_ROTATED = "span_file_rotated"  # file_max_bytes: the run folder's oldest spans deleted
POLICY_DROPS = (DROPPED_STEP_LIMIT, DROPPED_FILE_ROTATED)
TELEMETRY_DROPPED = Metric(
    "torchdist.telemetry.dropped",
    "counter",
    "{item}",
    "Telemetry items not exported, to protect training, or refused by the collector (kind=record|span|"
    "span_batch|metric_batch|metric_point|span_step_limit|span_file_rotated|straggler_window).",
    (M_RUN, M_RANK, M_KIND),
)
TELEMETRY_ERRORS = Metric(
    "torchdist.telemetry.errors",
    "counter",
    "{error}",
    "Internal telemetry failures that were logged once and swallowed (kind=component).",
    (M_RUN, M_RANK, M_KIND),
)

COLLECTIVE_METRICS = (COLLECTIVE_DURATION, COLLECTIVE_CALLS, COLLECTIVE_BYTES, COLLECTIVE_BUS_BYTES, COLLECTIVE_ERRORS)
TELEMETRY_METRICS = (TELEMETRY_DROPPED, TELEMETRY_ERRORS)

# ---- training paths: optimizer, models, DDP
RANK_LABELS = (M_RUN, M_RANK)
OPTIMIZER_STEP_DURATION = Metric(
    "torchdist.optimizer.step.duration",
    "histogram",
    "s",
    "Time inside optimizer.step(), outermost call only.",
    (M_RUN, M_RANK, M_OPTIMIZER),
)
MODEL_PARAMETERS = Metric(
    "torchdist.model.parameters",
    "gauge",
    "{parameter}",
    "Parameters of a model wrapped by DDP or FSDP (kind=total|trainable), as seen on this rank before sharding.",
    (M_RUN, M_RANK, M_MODEL, M_PARAM_KIND),
)
MODEL_PARAMETER_BYTES = Metric(
    "torchdist.model.parameter_bytes",
    "gauge",
    "By",
    "Bytes of a wrapped model's parameters before sharding.",
    (M_RUN, M_RANK, M_MODEL),
)
DDP_FORWARD_COMPUTE = Metric(
    "torchdist.ddp.forward_compute_time",
    "gauge",
    "s",
    "DDP's own average forward compute time (its logging data, sampled).",
    (M_RUN, M_RANK, M_MODEL),
)
DDP_BACKWARD_COMPUTE = Metric(
    "torchdist.ddp.backward_compute_time",
    "gauge",
    "s",
    "DDP's own average backward compute time (its logging data, sampled).",
    (M_RUN, M_RANK, M_MODEL),
)
DDP_BACKWARD_COMM = Metric(
    "torchdist.ddp.backward_comm_time",
    "gauge",
    "s",
    "DDP's own average backward communication time (its logging data, sampled).",
    (M_RUN, M_RANK, M_MODEL),
)
DDP_BACKWARD_OVERLAP = Metric(
    "torchdist.ddp.backward_overlap_time",
    "gauge",
    "s",
    "DDP's own average time backward compute and communication overlapped (its logging data, sampled).",
    (M_RUN, M_RANK, M_MODEL),
)
DDP_BUCKETS = Metric(
    "torchdist.ddp.buckets",
    "gauge",
    "{bucket}",
    "Gradient buckets DDP reduces per step (after its bucket rebuild).",
    (M_RUN, M_RANK, M_MODEL),
)
CHECKPOINT_DURATION = Metric(
    "torchdist.checkpoint.duration",
    "histogram",
    "s",
    "Time in torch.distributed.checkpoint save / load on this rank (op=save|load).",
    (M_RUN, M_RANK, M_CKPT_OP),
)
CHECKPOINT_BYTES = Metric(
    "torchdist.checkpoint.bytes",
    "counter",
    "By",
    "Tensor bytes this rank saved / loaded through torch.distributed.checkpoint (op=save|load).",
    (M_RUN, M_RANK, M_CKPT_OP),
)
TRAINING_PATH_METRICS = (
    OPTIMIZER_STEP_DURATION,
    MODEL_PARAMETERS,
    MODEL_PARAMETER_BYTES,
    DDP_FORWARD_COMPUTE,
    DDP_BACKWARD_COMPUTE,
    DDP_BACKWARD_COMM,
    DDP_BACKWARD_OVERLAP,
    DDP_BUCKETS,
    CHECKPOINT_DURATION,
    CHECKPOINT_BYTES,
)

# ---- steps, stragglers, hangs, user step metrics
STEP_DURATION_METRIC = Metric(
    "torchdist.step.duration",
    "histogram",
    "s",
    "Wall time of each training step on this rank.",
    RANK_LABELS,
)
STEPS_METRIC = Metric("torchdist.steps", "counter", "{step}", "Training steps completed.", RANK_LABELS)
STEP_COMPUTE_TIME = Metric(
    "torchdist.step.compute_time",
    "counter",
    "s",
    "Step time not spent blocked in collectives. Under DDP the slow rank is the one with the most.",
    RANK_LABELS,
)
STEP_COLLECTIVE_WAIT_TIME = Metric(
    "torchdist.step.collective_wait_time",
    "counter",
    "s",
    "Step time blocked in collectives (blocking calls and wait()). The slow rank waits least.",
    RANK_LABELS,
)
STEP_CURRENT = Metric("torchdist.step.current", "gauge", "{step}", "Index of the last completed step.", RANK_LABELS)
STRAGGLER_SCORE = Metric(
    "torchdist.straggler.score",
    "gauge",
    "1",
    "How much of the recent step time the others spent waiting for this rank (0: never the last to arrive).",
    RANK_LABELS,
)
STRAGGLER_SLOWEST = Metric(
    "torchdist.straggler.slowest_rank",
    "gauge",
    "{rank}",
    "The rank with the highest straggler score in the last exchange (-1 before the first).",
    RANK_LABELS,
)
COLLECTIVE_INFLIGHT_AGE = Metric(
    "torchdist.collective.inflight_age",
    "gauge",
    "s",
    "Age of the oldest collective in flight on this group (0 when none).",
    (M_RUN, M_RANK, M_GROUP),
)
COLLECTIVE_HANGS = Metric(
    "torchdist.collective.hangs",
    "counter",
    "{collective}",
    "Collectives that stayed in flight longer than the hang threshold.",
    COLLECTIVE_LABELS,
)
COLLECTIVE_HANG_MISSING = Metric(
    "torchdist.collective.hang.missing_rank",
    "gauge",
    "{collective}",
    "While a collective hangs on this rank: its sequence number, for each rank of the group that has not started it.",
    (M_RUN, M_RANK, M_OP, M_GROUP, M_MISSING_RANK),
)
GROUP_SEQ_STARTED = Metric(
    "torchdist.group.last_started_seq",
    "gauge",
    "{collective}",
    "Sequence number of the last collective this rank started on the group.",
    (M_RUN, M_RANK, M_GROUP),
)
GROUP_SEQ_COMPLETED = Metric(
    "torchdist.group.last_completed_seq",
    "gauge",
    "{collective}",
    "Sequence number of the last collective this rank saw complete on the group.",
    (M_RUN, M_RANK, M_GROUP),
)
# Dimensionless values that are not ratios get an annotation unit: unit "1" would add "_ratio".
TRAIN_LOSS = Metric("torchdist.train.loss", "gauge", "{loss}", "Loss recorded for the last step.", RANK_LABELS)
TRAIN_LR = Metric(
    "torchdist.train.learning_rate", "gauge", "{learning_rate}", "Learning rate recorded for the last step.", RANK_LABELS
)
TRAIN_SAMPLES = Metric("torchdist.train.samples", "counter", "{sample}", "Samples processed.", RANK_LABELS)
TRAIN_TOKENS = Metric("torchdist.train.tokens", "counter", "{token}", "Tokens processed.", RANK_LABELS)
TRAIN_SAMPLE_RATE = Metric(
    "torchdist.train.sample_throughput", "gauge", "{sample}/s", "Samples per second over the last step.", RANK_LABELS
)
TRAIN_TOKEN_RATE = Metric(
    "torchdist.train.token_throughput", "gauge", "{token}/s", "Tokens per second over the last step.", RANK_LABELS
)
TRAIN_ETA = Metric(
    "torchdist.train.eta", "gauge", "s", "Estimated time to the last step, when the total is known.", RANK_LABELS
)
STEP_METRICS = (
    STEP_DURATION_METRIC,
    STEPS_METRIC,
    STEP_COMPUTE_TIME,
    STEP_COLLECTIVE_WAIT_TIME,
    STEP_CURRENT,
    STRAGGLER_SCORE,
    STRAGGLER_SLOWEST,
    COLLECTIVE_INFLIGHT_AGE,
    COLLECTIVE_HANGS,
    COLLECTIVE_HANG_MISSING,
    GROUP_SEQ_STARTED,
    GROUP_SEQ_COMPLETED,
    TRAIN_LOSS,
    TRAIN_LR,
    TRAIN_SAMPLES,
    TRAIN_TOKENS,
    TRAIN_SAMPLE_RATE,
    TRAIN_TOKEN_RATE,
    TRAIN_ETA,
)

# ---- GPU, process and host (labels follow dcgm-exporter's: gpu, UUID, modelName, Hostname)
GPU_LABELS = (M_RUN, M_RANK, M_GPU, M_UUID, M_GPU_MODEL, M_HOST)
GPU_UTILIZATION = Metric("torchdist.gpu.utilization", "gauge", "1", "GPU utilization, 0..1 (NVML).", GPU_LABELS)
GPU_MEMORY_USED = Metric("torchdist.gpu.memory.used", "gauge", "By", "GPU memory in use (NVML).", GPU_LABELS)
GPU_MEMORY_TOTAL = Metric("torchdist.gpu.memory.total", "gauge", "By", "GPU memory in all (NVML).", GPU_LABELS)
GPU_POWER = Metric("torchdist.gpu.power", "gauge", "W", "GPU power draw (NVML).", GPU_LABELS)
GPU_TEMPERATURE = Metric("torchdist.gpu.temperature", "gauge", "Cel", "GPU temperature (NVML).", GPU_LABELS)
GPU_SM_CLOCK = Metric("torchdist.gpu.sm_clock", "gauge", "Hz", "GPU SM clock (NVML).", GPU_LABELS)
GPU_PCIE_THROUGHPUT = Metric(
    "torchdist.gpu.pcie.throughput",
    "gauge",
    "By/s",
    "PCIe throughput sampled by NVML (direction=transmit|receive).",
    GPU_LABELS + (M_DIRECTION,),
)
GPU_NVLINK_IO = Metric(
    "torchdist.gpu.nvlink.io",
    "counter",
    "By",
    "NVLink bytes since the sampler started (direction=transmit|receive).",
    GPU_LABELS + (M_DIRECTION,),
)
GPU_THROTTLED = Metric(
    "torchdist.gpu.throttled",
    "gauge",
    "{state}",
    "1 while NVML reports the throttle reason active, else 0.",
    GPU_LABELS + (M_REASON,),
)
GPU_ECC_ERRORS = Metric(
    "torchdist.gpu.ecc.errors",
    "counter",
    "{error}",
    "ECC errors NVML counts (type=corrected|uncorrected).",
    GPU_LABELS + (M_ERROR_KIND,),
)
CUDA_LABELS = (M_RUN, M_RANK, M_DEVICE)
CUDA_ALLOCATED = Metric("torchdist.cuda.memory.allocated", "gauge", "By", "torch CUDA allocator: allocated.", CUDA_LABELS)
CUDA_RESERVED = Metric("torchdist.cuda.memory.reserved", "gauge", "By", "torch CUDA allocator: reserved.", CUDA_LABELS)
CUDA_PEAK = Metric("torchdist.cuda.memory.peak", "gauge", "By", "torch CUDA allocator: peak allocated.", CUDA_LABELS)
CUDA_OOM_RETRIES = Metric(
    "torchdist.cuda.oom_retries", "counter", "{retry}", "torch CUDA allocator: OOM retries.", CUDA_LABELS
)
PROCESS_CPU_TIME = Metric("torchdist.process.cpu.time", "counter", "s", "CPU time of this process.", RANK_LABELS)
PROCESS_CPU_UTILIZATION = Metric(
    "torchdist.process.cpu.utilization", "gauge", "{cpu}", "CPU use of this process in cores, over the last sample.", RANK_LABELS
)
PROCESS_RSS = Metric("torchdist.process.memory.rss", "gauge", "By", "Resident memory of this process.", RANK_LABELS)
PROCESS_OPEN_FDS = Metric("torchdist.process.open_fds", "gauge", "{fd}", "Open file descriptors.", RANK_LABELS)
HOST_NETWORK_IO = Metric(
    "torchdist.host.network.io",
    "counter",
    "By",
    "Bytes through the host's network interfaces since the sampler started (direction=transmit|receive).",
    (M_RUN, M_RANK, M_HOST, M_DIRECTION),
)
DATALOADER_WAIT = Metric(
    "torchdist.dataloader.wait_time",
    "histogram",
    "s",
    "Time the training loop waited for each batch (each DataLoader next()).",
    RANK_LABELS,
)
AMP_GRAD_SCALE = Metric("torchdist.amp.grad_scale", "gauge", "{scale}", "GradScaler's current scale.", RANK_LABELS)
SYSTEM_METRICS = (
    GPU_UTILIZATION,
    GPU_MEMORY_USED,
    GPU_MEMORY_TOTAL,
    GPU_POWER,
    GPU_TEMPERATURE,
    GPU_SM_CLOCK,
    GPU_PCIE_THROUGHPUT,
    GPU_NVLINK_IO,
    GPU_THROTTLED,
    GPU_ECC_ERRORS,
    CUDA_ALLOCATED,
    CUDA_RESERVED,
    CUDA_PEAK,
    CUDA_OOM_RETRIES,
    PROCESS_CPU_TIME,
    PROCESS_CPU_UTILIZATION,
    PROCESS_RSS,
    PROCESS_OPEN_FDS,
    HOST_NETWORK_IO,
    DATALOADER_WAIT,
    AMP_GRAD_SCALE,
)

METRICS = COLLECTIVE_METRICS + TELEMETRY_METRICS + TRAINING_PATH_METRICS + STEP_METRICS + SYSTEM_METRICS
# Counters whose totals are the process's or the device's, not an instrumentation's: they go on by
# themselves across uninstrument() and instrument() (the MeterProvider bridge adds the earlier
# instrumentations' totals to the others, which start again from 0).
PROCESS_TOTALS = (TELEMETRY_DROPPED, TELEMETRY_ERRORS, GPU_ECC_ERRORS, CUDA_OOM_RETRIES, PROCESS_CPU_TIME)

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
