"""Freeze the telemetry schema: dashboards, alert rules and the analyzer select on these names.

A failure here means a name changed. If that is intended, update this test *and* dashboards/, deploy/
and the docs in the same change.
"""

from __future__ import annotations

from otel_torchdist import config, names as n
from otel_torchdist.capture import c10d, ops
from otel_torchdist.export import prometheus_names as pn


def test_collective_span_names_are_frozen():
    assert set(n.COLLECTIVE_SPAN_NAMES) == {
        "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor", "all_gather_single",
        "_all_gather_base", "all_gather_coalesced", "all_gather_object", "all_gather_single_coalesced",
        "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "_reduce_scatter_base",
        "reduce_scatter_single_coalesced", "broadcast", "broadcast_object_list", "_broadcast_coalesced",
        "reduce", "gather", "gather_object", "scatter", "scatter_object_list", "all_to_all",
        "all_to_all_single", "barrier", "monitored_barrier", "send", "recv", "isend", "irecv",
        "send_object_list", "recv_object_list", "batch_isend_irecv", "all_gather_tensor",
        "all_gather_single_autograd", "all_gather_tensor_autograd", "reduce_scatter_single_autograd",
        "reduce_scatter_tensor_autograd", "all_to_all_single_autograd", "all_gather_into_tensor_coalesced",
        "reduce_scatter_tensor_coalesced", "permute_tensor", "shard_dim_alltoall", "all_gather_into_tensor",
    }  # fmt: skip


def test_every_captured_op_has_a_frozen_span_name():
    emitted = {spec.name for spec in ops.C10D_OPS}
    emitted |= {name for name, _ in c10d._COALESCED.values()}
    emitted |= {"isend", "irecv", "broadcast", "scatter"}  # ProcessGroup-level captures
    from otel_torchdist.capture import deep, funcol

    emitted |= set(funcol._SPECS)
    emitted |= {deep.span_name(op) for op in deep._OPS}
    assert emitted <= set(n.COLLECTIVE_SPAN_NAMES)


def test_span_attribute_keys_are_frozen():
    assert set(n.COLLECTIVE_SPAN_ATTRIBUTES) == {
        "torchdist.collective.op", "torchdist.collective.kind", "torchdist.collective.backend",
        "torchdist.group.name", "torchdist.group.desc", "torchdist.group.label", "torchdist.group.size", "torchdist.group.rank",
        "torchdist.group.ranks", "torchdist.collective.dtype", "torchdist.collective.shapes",
        "torchdist.collective.numel", "torchdist.collective.tensors", "torchdist.collective.message_size",
        "torchdist.collective.bytes_sent", "torchdist.collective.bytes_received",
        "torchdist.collective.reduce_op", "torchdist.collective.root", "torchdist.collective.peer",
        "torchdist.collective.peers", "torchdist.collective.async", "torchdist.collective.seq",
        "torchdist.collective.duration_s", "torchdist.collective.algbw_gbps", "torchdist.collective.busbw_gbps",
        "torchdist.collective.end_source", "torchdist.collective.wait_s", "torchdist.collective.coalesced_ops", "torchdist.collective.source",
        "error.type",
    }  # fmt: skip
    assert n.END_SOURCES == ("return", "future", "wait", "nccl_completion_hook", "enqueue", "unfinished")


def test_resource_attribute_keys_are_frozen():
    assert n.RESOURCE_ATTRIBUTES == (
        "service.name", "service.instance.id", "host.name", "process.pid", "torchdist.run.id",
        "torchdist.rank", "torchdist.local_rank", "torchdist.world_size", "torchdist.local_world_size",
        "torchdist.node_rank", "torchdist.backend", "torchdist.torch.version", "torchdist.restart_count",
        "torchdist.library.version",
    )  # fmt: skip


C = ("run", "rank", "op", "group")
R = ("run", "rank")
G = ("run", "rank", "gpu", "uuid", "model", "host")
# name, instrument, unit, labels, Prometheus family name
FROZEN_METRICS = {
    ("torchdist.collective.duration", "histogram", "s", C, "torchdist_collective_duration_seconds"),
    ("torchdist.collective.calls", "counter", "{call}", C, "torchdist_collective_calls_total"),
    ("torchdist.collective.bytes", "counter", "By", C, "torchdist_collective_bytes_total"),
    ("torchdist.collective.bus_bytes", "counter", "By", C, "torchdist_collective_bus_bytes_total"),
    ("torchdist.collective.errors", "counter", "{call}", C, "torchdist_collective_errors_total"),
    ("torchdist.telemetry.dropped", "counter", "{item}", R + ("kind",), "torchdist_telemetry_dropped_total"),
    ("torchdist.telemetry.errors", "counter", "{error}", R + ("kind",), "torchdist_telemetry_errors_total"),
    ("torchdist.optimizer.step.duration", "histogram", "s", R + ("optimizer",), "torchdist_optimizer_step_duration_seconds"),
    ("torchdist.model.parameters", "gauge", "{parameter}", R + ("model", "kind"), "torchdist_model_parameters"),
    ("torchdist.model.parameter_bytes", "gauge", "By", R + ("model",), "torchdist_model_parameter_bytes"),
    ("torchdist.ddp.forward_compute_time", "gauge", "s", R + ("model",), "torchdist_ddp_forward_compute_time_seconds"),
    ("torchdist.ddp.backward_compute_time", "gauge", "s", R + ("model",), "torchdist_ddp_backward_compute_time_seconds"),
    ("torchdist.ddp.backward_comm_time", "gauge", "s", R + ("model",), "torchdist_ddp_backward_comm_time_seconds"),
    ("torchdist.ddp.backward_overlap_time", "gauge", "s", R + ("model",), "torchdist_ddp_backward_overlap_time_seconds"),
    ("torchdist.ddp.buckets", "gauge", "{bucket}", R + ("model",), "torchdist_ddp_buckets"),
    ("torchdist.checkpoint.duration", "histogram", "s", R + ("op",), "torchdist_checkpoint_duration_seconds"),
    ("torchdist.checkpoint.bytes", "counter", "By", R + ("op",), "torchdist_checkpoint_bytes_total"),
    ("torchdist.step.duration", "histogram", "s", R, "torchdist_step_duration_seconds"),
    ("torchdist.steps", "counter", "{step}", R, "torchdist_steps_total"),
    ("torchdist.step.compute_time", "counter", "s", R, "torchdist_step_compute_time_seconds_total"),
    ("torchdist.step.collective_wait_time", "counter", "s", R, "torchdist_step_collective_wait_time_seconds_total"),
    ("torchdist.step.current", "gauge", "{step}", R, "torchdist_step_current"),
    ("torchdist.straggler.score", "gauge", "1", R, "torchdist_straggler_score_ratio"),
    ("torchdist.straggler.slowest_rank", "gauge", "{rank}", R, "torchdist_straggler_slowest_rank"),
    ("torchdist.collective.inflight_age", "gauge", "s", R + ("group",), "torchdist_collective_inflight_age_seconds"),
    ("torchdist.collective.hangs", "counter", "{collective}", C, "torchdist_collective_hangs_total"),
    ("torchdist.collective.hang.missing_rank", "gauge", "{collective}", R + ("op", "group", "missing_rank"), "torchdist_collective_hang_missing_rank"),
    ("torchdist.group.last_started_seq", "gauge", "{collective}", R + ("group",), "torchdist_group_last_started_seq"),
    ("torchdist.group.last_completed_seq", "gauge", "{collective}", R + ("group",), "torchdist_group_last_completed_seq"),
    ("torchdist.train.loss", "gauge", "{loss}", R, "torchdist_train_loss"),
    ("torchdist.train.learning_rate", "gauge", "{learning_rate}", R, "torchdist_train_learning_rate"),
    ("torchdist.train.samples", "counter", "{sample}", R, "torchdist_train_samples_total"),
    ("torchdist.train.tokens", "counter", "{token}", R, "torchdist_train_tokens_total"),
    ("torchdist.train.sample_throughput", "gauge", "{sample}/s", R, "torchdist_train_sample_throughput_per_second"),
    ("torchdist.train.token_throughput", "gauge", "{token}/s", R, "torchdist_train_token_throughput_per_second"),
    ("torchdist.train.eta", "gauge", "s", R, "torchdist_train_eta_seconds"),
    ("torchdist.gpu.utilization", "gauge", "1", G, "torchdist_gpu_utilization_ratio"),
    ("torchdist.gpu.memory.used", "gauge", "By", G, "torchdist_gpu_memory_used_bytes"),
    ("torchdist.gpu.memory.total", "gauge", "By", G, "torchdist_gpu_memory_total_bytes"),
    ("torchdist.gpu.power", "gauge", "W", G, "torchdist_gpu_power_watts"),
    ("torchdist.gpu.temperature", "gauge", "Cel", G, "torchdist_gpu_temperature_celsius"),
    ("torchdist.gpu.sm_clock", "gauge", "Hz", G, "torchdist_gpu_sm_clock_hertz"),
    ("torchdist.gpu.pcie.throughput", "gauge", "By/s", G + ("direction",), "torchdist_gpu_pcie_throughput_bytes_per_second"),
    ("torchdist.gpu.nvlink.io", "counter", "By", G + ("direction",), "torchdist_gpu_nvlink_io_bytes_total"),
    ("torchdist.gpu.throttled", "gauge", "{state}", G + ("reason",), "torchdist_gpu_throttled"),
    ("torchdist.gpu.ecc.errors", "counter", "{error}", G + ("type",), "torchdist_gpu_ecc_errors_total"),
    ("torchdist.cuda.memory.allocated", "gauge", "By", R + ("device",), "torchdist_cuda_memory_allocated_bytes"),
    ("torchdist.cuda.memory.reserved", "gauge", "By", R + ("device",), "torchdist_cuda_memory_reserved_bytes"),
    ("torchdist.cuda.memory.peak", "gauge", "By", R + ("device",), "torchdist_cuda_memory_peak_bytes"),
    ("torchdist.cuda.oom_retries", "counter", "{retry}", R + ("device",), "torchdist_cuda_oom_retries_total"),
    ("torchdist.process.cpu.time", "counter", "s", R, "torchdist_process_cpu_time_seconds_total"),
    ("torchdist.process.cpu.utilization", "gauge", "{cpu}", R, "torchdist_process_cpu_utilization"),
    ("torchdist.process.memory.rss", "gauge", "By", R, "torchdist_process_memory_rss_bytes"),
    ("torchdist.process.open_fds", "gauge", "{fd}", R, "torchdist_process_open_fds"),
    ("torchdist.host.network.io", "counter", "By", R + ("host", "direction"), "torchdist_host_network_io_bytes_total"),
    ("torchdist.dataloader.wait_time", "histogram", "s", R, "torchdist_dataloader_wait_time_seconds"),
    ("torchdist.amp.grad_scale", "gauge", "{scale}", R, "torchdist_amp_grad_scale"),
}  # fmt: skip


def test_metric_names_units_labels_and_prometheus_names_are_frozen():
    got = {(m.name, m.instrument, m.unit, m.attributes, pn.prometheus_name(m)) for m in n.METRICS}
    assert got == FROZEN_METRICS
    assert len({m.name for m in n.METRICS}) == len(n.METRICS)
    assert len({pn.prometheus_name(m) for m in n.METRICS}) == len(n.METRICS)


def test_prometheus_series_names_expand_histograms():
    assert pn.prometheus_series_names(n.COLLECTIVE_METRICS + n.TELEMETRY_METRICS) == {
        "torchdist_collective_duration_seconds_bucket",
        "torchdist_collective_duration_seconds_sum",
        "torchdist_collective_duration_seconds_count",
        "torchdist_collective_calls_total",
        "torchdist_collective_bytes_total",
        "torchdist_collective_bus_bytes_total",
        "torchdist_collective_errors_total",
        "torchdist_telemetry_dropped_total",
        "torchdist_telemetry_errors_total",
    }


def test_span_names_and_attributes_of_training_paths_and_steps_are_frozen():
    assert n.TRAINING_SPAN_NAMES == (
        "optimizer.step", "ddp.init", "sharding.fully_shard", "sharding.fsdp_wrap", "sharding.distribute_tensor",
        "sharding.redistribute", "sharding.distribute_module", "sharding.parallelize_module", "checkpoint.save",
        "checkpoint.load",
    )
    assert n.STEP_SPAN_NAMES == (
        "train.step", "train.rank_step", "train.forward", "train.backward", "collective.hang", "torchdist.warning"
    )  # fmt: skip
    assert n.exported_span_name("all_reduce", 3) == "all_reduce rank=3" and n.exported_span_name("train.step", 3) == "train.step"
    assert n.span_base_name("train.rank_step rank=12") == "train.rank_step" and n.span_base_name("all_reduce") == "all_reduce"
    every = n.SOURCE_ATTRIBUTES + n.TRAINING_SPAN_ATTRIBUTES + n.STEP_SPAN_ATTRIBUTES + n.RUN_DESCRIPTION_ATTRIBUTES
    assert len(set(every)) == len(every)
    assert all(key.startswith("torchdist.") for key in every)
    assert set(every) == {
        "torchdist.collective.phase", "torchdist.collective.module", "torchdist.collective.framework",
        "torchdist.ddp.bucket.index", "torchdist.ddp.bucket.bytes", "torchdist.ddp.bucket.parameters",
        "torchdist.ddp.bucket.last", "torchdist.fsdp.action", "torchdist.funcol.wait_s",
        "torchdist.optimizer.class", "torchdist.optimizer.inner_class", "torchdist.optimizer.param_groups",
        "torchdist.optimizer.parameters", "torchdist.optimizer.lr", "torchdist.optimizer.momentum",
        "torchdist.optimizer.betas", "torchdist.optimizer.step_index", "torchdist.optimizer.in_backward",
        "torchdist.model.class", "torchdist.model.parameters", "torchdist.model.trainable_parameters",
        "torchdist.model.parameter_bytes", "torchdist.ddp.bucket_cap_mb", "torchdist.ddp.find_unused_parameters",
        "torchdist.ddp.gradient_as_bucket_view", "torchdist.ddp.static_graph", "torchdist.ddp.broadcast_buffers",
        "torchdist.ddp.comm_hook", "torchdist.sharding.module", "torchdist.sharding.modules",
        "torchdist.sharding.parameters", "torchdist.sharding.original_shapes", "torchdist.sharding.sharded_shapes",
        "torchdist.sharding.placements_before", "torchdist.sharding.placements_after", "torchdist.sharding.mesh_shape",
        "torchdist.sharding.mesh_dim_names", "torchdist.sharding.plan", "torchdist.checkpoint.id",
        "torchdist.checkpoint.bytes", "torchdist.checkpoint.tensors", "torchdist.checkpoint.async",
        "torchdist.step", "torchdist.step.source", "torchdist.step.occurrence", "torchdist.step.setup", "torchdist.step.uncounted",
        "torchdist.step.ranks_timed",
        "torchdist.step.duration_s", "torchdist.step.compute_s", "torchdist.step.collective_wait_s",
        "torchdist.step.collectives", "torchdist.step.message_bytes", "torchdist.step.loss",
        "torchdist.step.learning_rate", "torchdist.step.samples", "torchdist.step.tokens", "torchdist.phase",
        "torchdist.hang.waited_s", "torchdist.hang.threshold_s", "torchdist.hang.missing_ranks", "torchdist.hang.missing",
        "torchdist.warning.kind",
        "torchdist.warning.message", "torchdist.node_count", "torchdist.cuda.version", "torchdist.nccl.version",
        "torchdist.gpu.models", "torchdist.gpu.memory_bytes", "torchdist.gpu.count", "torchdist.amp.dtype",
    }  # fmt: skip


def test_prometheus_name_translation_table():
    # Cases from prometheus/otlptranslator's documented behaviour (the Collector's Prometheus exporter).
    cases = [
        (n.Metric("http.server.request.duration", "histogram", "s", "", ()), "http_server_request_duration_seconds"),
        (n.Metric("a.b_seconds", "histogram", "s", "", ()), "a_b_seconds"),
        (n.Metric("requests.count", "counter", "1", "", ()), "requests_count_total"),
        (n.Metric("memory.usage", "gauge", "By", "", ()), "memory_usage_bytes"),
        (n.Metric("x.bytes", "counter", "By", "", ()), "x_bytes_total"),
        (n.Metric("x.total.bytes", "counter", "By", "", ()), "x_bytes_total"),
        (n.Metric("x.calls", "counter", "{call}", "", ()), "x_calls_total"),
        (n.Metric("gpu.util", "gauge", "1", "", ()), "gpu_util_ratio"),
        (n.Metric("gpu.util.ratio", "gauge", "1", "", ()), "gpu_util_ratio"),
        (n.Metric("disk.io", "gauge", "By/s", "", ()), "disk_io_bytes_per_second"),
        (n.Metric("requests", "gauge", "{request}/s", "", ()), "requests_per_second"),
        (n.Metric("x..y__z", "gauge", "Cel", "", ()), "x_y_z_celsius"),
        (n.Metric("2xx.rate", "gauge", "1", "", ()), "_2xx_rate_ratio"),
    ]
    for metric, expected in cases:
        assert pn.prometheus_name(metric) == expected


def test_environment_variables_are_frozen():
    assert set(config.ENV_VARS) == {
        "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "OTEL_EXPORTER_OTLP_HEADERS",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_METRICS_HEADERS", "OTEL_EXPORTER_OTLP_TIMEOUT",
        "OTEL_EXPORTER_OTLP_COMPRESSION", "OTEL_EXPORTER_OTLP_CERTIFICATE", "OTEL_EXPORTER_OTLP_CLIENT_KEY",
        "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "OTEL_EXPORTER_OTLP_INSECURE",
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT",
        "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION",
        "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE",
        "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", "OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY",
        "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE", "OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE",
        "OTEL_EXPORTER_OTLP_TRACES_INSECURE", "OTEL_EXPORTER_OTLP_METRICS_INSECURE", "OTEL_TRACES_EXPORTER",
        "OTEL_METRICS_EXPORTER", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG", "OTEL_METRIC_EXPORT_INTERVAL",
        "OTEL_BSP_SCHEDULE_DELAY", "OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
        "OTEL_EXPORTER_PROMETHEUS_HOST", "OTEL_EXPORTER_PROMETHEUS_PORT", "OTEL_SDK_DISABLED",
        "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT",
        "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_ATTRIBUTE_COUNT_LIMIT", "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT",
        "OTEL_TORCHDIST_PROMETHEUS", "OTEL_TORCHDIST_GLOBAL_METER_PROVIDER", "OTEL_TORCHDIST_RUN_DIR", "OTEL_TORCHDIST_RUN_ID", "OTEL_TORCHDIST_FILE_MAX_BYTES", "OTEL_TORCHDIST_MAX_QUEUED_RECORDS",
        "OTEL_TORCHDIST_DRAIN_INTERVAL_MS", "OTEL_TORCHDIST_FLUSH_TIMEOUT_MS", "OTEL_TORCHDIST_METRICS_RANK_LABEL",
        "OTEL_TORCHDIST_SUMMARY", "OTEL_TORCHDIST_METRICS_AGGREGATION", "OTEL_TORCHDIST_NODE_NAME",
        "OTEL_TORCHDIST_NODE_METRICS_INTERVAL_MS", "OTEL_TORCHDIST_HISTOGRAM_BUCKETS", "OTEL_TORCHDIST_SYSTEM_METRICS", "OTEL_TORCHDIST_SYSTEM_INTERVAL_MS",
        "OTEL_TORCHDIST_RUN_FOLDER_COPY",
        "OTEL_TORCHDIST_WARN_GPU_UTILIZATION", "OTEL_TORCHDIST_WARN_GPU_UTILIZATION_WINDOW_MS",
        "OTEL_TORCHDIST_WARN_MEMORY_FRACTION", "OTEL_TORCHDIST_TRACE_FIRST_STEPS", "OTEL_TORCHDIST_MAX_SPANS_PER_STEP", "OTEL_TORCHDIST_TRACE_EVERY_STEPS", "OTEL_TORCHDIST_TRACE_RANKS",
        "OTEL_TORCHDIST_HANG_THRESHOLD_MS", "OTEL_TORCHDIST_STRAGGLER_EXCHANGE_STEPS",
        "OTEL_TORCHDIST_WARN_SLOW_STEP_FACTOR", "OTEL_TORCHDIST_COMPILE_CAPTURE", "OTEL_TORCHDIST_NATIVE",
        "OTEL_TORCHDIST_NCCL_HOOK", "OTEL_TORCHDIST_DISABLED_CAPTURES",
        "OTEL_TORCHDIST_LOG_LEVEL",
    }  # fmt: skip
    assert config.ELSEWHERE == ("OTEL_TORCHDIST_NATIVE_DIR",)
    own = [v for v in config.ENV_VARS if not v.startswith(("OTEL_EXPORTER_", "OTEL_TRACES_", "OTEL_METRIC", "OTEL_BSP_"))]
    assert all(
        v.startswith(config.PREFIX) or v in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_SDK_DISABLED")
        or v.endswith(("_LENGTH_LIMIT", "_COUNT_LIMIT"))
        for v in own
    )
