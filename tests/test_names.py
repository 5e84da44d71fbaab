"""Freeze the telemetry schema: dashboards, alert rules and the analyzer select on these names.

A failure here means a name changed. If that is intended, update this test *and* dashboards/, deploy/
and the docs in the same change.
"""

from __future__ import annotations

from otel_torchdist import config, names as n
from otel_torchdist.capture import c10d, ops


def test_collective_span_names_are_frozen():
    assert set(n.COLLECTIVE_SPAN_NAMES) == {
        "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor", "all_gather_single",
        "_all_gather_base", "all_gather_coalesced", "all_gather_object", "all_gather_single_coalesced",
        "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "_reduce_scatter_base",
        "reduce_scatter_single_coalesced", "broadcast", "broadcast_object_list", "_broadcast_coalesced",
        "reduce", "gather", "gather_object", "scatter", "scatter_object_list", "all_to_all",
        "all_to_all_single", "barrier", "monitored_barrier", "send", "recv", "isend", "irecv",
        "send_object_list", "recv_object_list", "batch_isend_irecv",
    }  # fmt: skip


def test_every_captured_op_has_a_frozen_span_name():
    emitted = {spec.name for spec in ops.C10D_OPS}
    emitted |= {name for name, _ in c10d._COALESCED.values()}
    emitted |= {"isend", "irecv", "broadcast", "scatter"}  # ProcessGroup-level captures
    assert emitted <= set(n.COLLECTIVE_SPAN_NAMES)


def test_span_attribute_keys_are_frozen():
    assert set(n.COLLECTIVE_SPAN_ATTRIBUTES) == {
        "torchdist.collective.op", "torchdist.collective.kind", "torchdist.collective.backend",
        "torchdist.group.name", "torchdist.group.desc", "torchdist.group.size", "torchdist.group.rank",
        "torchdist.group.ranks", "torchdist.collective.dtype", "torchdist.collective.shapes",
        "torchdist.collective.numel", "torchdist.collective.tensors", "torchdist.collective.message_size",
        "torchdist.collective.bytes_sent", "torchdist.collective.bytes_received",
        "torchdist.collective.reduce_op", "torchdist.collective.root", "torchdist.collective.peer",
        "torchdist.collective.peers", "torchdist.collective.async", "torchdist.collective.seq",
        "torchdist.collective.duration_s", "torchdist.collective.algbw_gbps", "torchdist.collective.busbw_gbps",
        "torchdist.collective.end_source", "torchdist.collective.coalesced_ops", "torchdist.collective.source",
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


def test_metric_names_units_and_labels_are_frozen():
    got = {(m.name, m.instrument, m.unit, m.attributes) for m in n.METRICS}
    coll = ("run", "rank", "op", "group")
    own = ("run", "rank", "kind")
    assert got == {
        ("torchdist.collective.duration", "histogram", "s", coll),
        ("torchdist.collective.calls", "counter", "{call}", coll),
        ("torchdist.collective.bytes", "counter", "By", coll),
        ("torchdist.collective.bus_bytes", "counter", "By", coll),
        ("torchdist.collective.errors", "counter", "{call}", coll),
        ("torchdist.telemetry.dropped", "counter", "{item}", own),
        ("torchdist.telemetry.errors", "counter", "{error}", own),
    }


def test_prometheus_names_are_derived_like_the_collector():
    assert n.prometheus_series_names() == {
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


def test_prometheus_name_translation_table():
    cases = [
        (n.Metric("a.b", "histogram", "s", "", ()), "a_b_seconds"),
        (n.Metric("a.b_seconds", "histogram", "s", "", ()), "a_b_seconds"),
        (n.Metric("x.bytes", "counter", "By", "", ()), "x_bytes_total"),
        (n.Metric("x.traffic", "counter", "By", "", ()), "x_traffic_bytes_total"),
        (n.Metric("x.calls", "counter", "{call}", "", ()), "x_calls_total"),
        (n.Metric("gpu.util", "gauge", "1", "", ()), "gpu_util_ratio"),
        (n.Metric("gpu.power", "gauge", "W", "", ()), "gpu_power_watts"),
    ]
    for metric, expected in cases:
        assert n.prometheus_name(metric) == expected


def test_environment_variables_are_frozen():
    assert set(config.ENV_VARS) == {
        "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "OTEL_EXPORTER_OTLP_HEADERS",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_METRICS_HEADERS", "OTEL_EXPORTER_OTLP_TIMEOUT",
        "OTEL_EXPORTER_OTLP_COMPRESSION", "OTEL_EXPORTER_OTLP_CERTIFICATE", "OTEL_EXPORTER_OTLP_CLIENT_KEY",
        "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "OTEL_EXPORTER_OTLP_INSECURE", "OTEL_TRACES_EXPORTER",
        "OTEL_METRICS_EXPORTER", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG", "OTEL_METRIC_EXPORT_INTERVAL",
        "OTEL_BSP_SCHEDULE_DELAY", "OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
        "OTEL_EXPORTER_PROMETHEUS_HOST", "OTEL_EXPORTER_PROMETHEUS_PORT", "OTEL_SDK_DISABLED",
        "OTEL_TORCHDIST_RUN_DIR", "OTEL_TORCHDIST_RUN_ID", "OTEL_TORCHDIST_MAX_QUEUED_RECORDS",
        "OTEL_TORCHDIST_DRAIN_INTERVAL_MS", "OTEL_TORCHDIST_FLUSH_TIMEOUT_MS", "OTEL_TORCHDIST_METRICS_RANK_LABEL",
        "OTEL_TORCHDIST_SUMMARY",
    }  # fmt: skip
    own = [v for v in config.ENV_VARS if not v.startswith(("OTEL_EXPORTER_", "OTEL_TRACES_", "OTEL_METRIC", "OTEL_BSP_"))]
    assert all(v.startswith(config.PREFIX) or v in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_SDK_DISABLED") for v in own)
