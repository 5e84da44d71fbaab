"""Each standard variable, read by the library and by the OpenTelemetry Python SDK in the same environment.

For every row the SDK itself builds the component that reads the variable (``TracerProvider()``,
``BatchSpanProcessor``, the OTLP exporters, ``SpanLimits()``, ``OTELResourceDetector``...) and the test
records what it did: used the value, fell back to its default (with or without a warning), or raised. The
library must then use the same value where the SDK used it, its own default where the SDK fell back, and never
raise: a training job does not stop over a variable it shares with every OpenTelemetry component. (The SDK's
effective settings are read from its objects' attributes, some of them private: this is a test of the SDK's
behaviour, not an API the library relies on.)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import pytest

from otel_torchdist import config


@dataclass
class Row:
    var: str
    value: str
    sdk: Callable[[], Any]  # what the SDK makes of the environment (the value it uses)
    ours: Callable[[config.Config], Any]  # the same, from the library's configuration
    default: Any = None  # the SDK's value when the variable is unset (None: asked of the SDK)


def _sampler() -> str:
    from opentelemetry.sdk.trace import TracerProvider

    return TracerProvider(shutdown_on_exit=False).sampler.get_description()


_DESCRIPTIONS = {
    "always_on": "AlwaysOnSampler",
    "always_off": "AlwaysOffSampler",
    "traceidratio": "TraceIdRatioBased{{{arg}}}",
    "parentbased_always_on": "ParentBased{{root:AlwaysOnSampler,remoteParentSampled:AlwaysOnSampler,remoteParentNotSampled:AlwaysOffSampler,localParentSampled:AlwaysOnSampler,localParentNotSampled:AlwaysOffSampler}}",
    "parentbased_always_off": "ParentBased{{root:AlwaysOffSampler,remoteParentSampled:AlwaysOnSampler,remoteParentNotSampled:AlwaysOffSampler,localParentSampled:AlwaysOnSampler,localParentNotSampled:AlwaysOffSampler}}",
    "parentbased_traceidratio": "ParentBased{{root:TraceIdRatioBased{{{arg}}},remoteParentSampled:AlwaysOnSampler,remoteParentNotSampled:AlwaysOffSampler,localParentSampled:AlwaysOnSampler,localParentNotSampled:AlwaysOffSampler}}",
}


def _our_sampler(cfg: config.Config) -> str:
    # Unset, the library picks steps itself and keeps everything outside them: the SDK's default sampler.
    return _DESCRIPTIONS[cfg.traces_sampler or "parentbased_always_on"].format(arg=cfg.traces_sampler_arg)


def _bsp(attr: str) -> Callable[[], Any]:
    def probe() -> Any:
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        bsp = BatchSpanProcessor(InMemorySpanExporter())
        try:
            return getattr(bsp._batch_processor, attr)
        finally:
            bsp.shutdown()

    return probe


def _metric_interval() -> float:
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader, PeriodicExportingMetricReader

    class Exporter:  # the reader needs an exporter's temporality and aggregation preferences
        _preferred_temporality: dict = {}
        _preferred_aggregation: dict = {}

        def shutdown(self, **kwargs):
            pass

    reader = PeriodicExportingMetricReader(Exporter(), export_interval_millis=None)
    try:
        return reader._export_interval_millis
    finally:
        reader.shutdown()
    del InMemoryMetricReader


def _http_exporter(attr: str) -> Callable[[], Any]:
    def probe() -> Any:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
        try:
            return {
                "endpoint": lambda: exporter._endpoint,
                "timeout": lambda: exporter._client._timeout,
                "compression": lambda: exporter._compression.value,
                "headers": lambda: {k: v for k, v in exporter._client._headers.items() if k not in ("content-type", "user-agent")},
            }[attr]()
        finally:
            exporter.shutdown()

    return probe


def _our_endpoint(cfg: config.Config) -> str:
    from otel_torchdist.export.sinks import _signal_endpoint

    return _signal_endpoint(cfg.endpoint, cfg.traces_endpoint, "http/protobuf", "v1/traces")


def _limits(attr: str) -> Callable[[], Any]:
    def probe() -> Any:
        from opentelemetry.sdk.trace import SpanLimits

        return getattr(SpanLimits(), attr)

    return probe


def _resource() -> dict:
    from opentelemetry.sdk.resources import OTELResourceDetector

    return dict(OTELResourceDetector().detect().attributes)


def _our_resource(cfg: config.Config) -> dict:
    out = dict(cfg.resource_attributes)
    if cfg.service_name != config.Config().service_name:
        out["service.name"] = cfg.service_name
    return out


def _disabled() -> bool:
    from opentelemetry.sdk.trace import TracerProvider

    return TracerProvider(shutdown_on_exit=False)._disabled


def _temporality() -> str:
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics import Counter, Histogram
    from opentelemetry.sdk.metrics.export import AggregationTemporality

    exporter = OTLPMetricExporter()
    try:
        pref = exporter._preferred_temporality
        delta = {k for k, v in pref.items() if v == AggregationTemporality.DELTA}
        return "cumulative" if not delta else "delta" if {Counter, Histogram} <= delta else "?"
    finally:
        exporter.shutdown()


def _our_temporality(cfg: config.Config) -> str:
    return "delta" if cfg.metrics_temporality in ("delta", "lowmemory") else "cumulative"


def _exporters(signal: str) -> Callable[[], Any]:
    def probe() -> Any:
        from opentelemetry.sdk._configuration import _get_exporter_names

        # The SDK resolves "otlp" to the entry point of its OTLP protocol (otlp_proto_grpc by default).
        return sorted("otlp" if name.startswith("otlp_proto_") else name for name in _get_exporter_names(signal))

    return probe


def _our_exporters(field: str) -> Callable[[config.Config], Any]:
    def read(cfg: config.Config) -> Any:
        names = getattr(cfg, field)
        return [] if names in (None, ("none",)) else sorted(x for x in names if x != "none")

    return read


def _signal(name: str) -> Callable[[config.Config], Any]:
    return lambda cfg: cfg.for_signal(name, "traces")


SAMPLER, ARG = "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG"
_OTLP = "OTEL_EXPORTER_OTLP_"
ROWS = [
    *(Row(SAMPLER, v, _sampler, _our_sampler) for v in ("always_on", "ALWAYS_OFF", "parentbased_always_off", "sometimes", "parentbased_jaeger_remote", "xray")),
    Row(SAMPLER + "+" + ARG, "traceidratio,0.25", _sampler, _our_sampler),
    Row(SAMPLER + "+" + ARG, "parentbased_traceidratio,2.5", _sampler, _our_sampler),
    Row(SAMPLER + "+" + ARG, "traceidratio,abc", _sampler, _our_sampler),
    *(Row("OTEL_BSP_SCHEDULE_DELAY", v, _bsp("_schedule_delay"), lambda c: c.span_schedule_delay) for v in ("2500", "5s", "abc", "2500.5")),
    *(Row("OTEL_BSP_MAX_QUEUE_SIZE", v, _bsp("_max_queue_size"), lambda c: c.span_queue_size) for v in ("4096", "lots", "0", "-5")),
    *(Row("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", v, _bsp("_max_export_batch_size"), lambda c: c.span_batch_size) for v in ("256", "1e3")),
    *(Row("OTEL_METRIC_EXPORT_INTERVAL", v, _metric_interval, lambda c: c.metric_export_interval * 1000) for v in ("15000", "60s", "abc", "0", "-1")),
    *(Row("OTEL_EXPORTER_OTLP_TIMEOUT", v, _http_exporter("timeout"), lambda c: c.timeout) for v in ("3", "2.5", "abc")),
    *(Row("OTEL_EXPORTER_OTLP_COMPRESSION", v, _http_exporter("compression"), lambda c: c.compression) for v in ("gzip", "GZIP", "deflate", "none", "brotli")),
    *(Row("OTEL_EXPORTER_OTLP_HEADERS", v, _http_exporter("headers"), lambda c: c.headers) for v in ("a=b,c=d", "Authorization=Bearer%20x", "a=b,bad", "A=B")),
    # A per-signal variable wins over the generic one; one the SDK cannot use gives the default, not the generic
    *(Row(_OTLP + "TIMEOUT+" + _OTLP + "TRACES_TIMEOUT", v, _http_exporter("timeout"), _signal("timeout")) for v in ("3,2", "3,abc")),
    *(Row(_OTLP + "COMPRESSION+" + _OTLP + "TRACES_COMPRESSION", v, _http_exporter("compression"), _signal("compression")) for v in ("gzip,none", "gzip,brotli")),
    *(Row(_OTLP + "HEADERS+" + _OTLP + "TRACES_HEADERS", v, _http_exporter("headers"), _signal("headers")) for v in ("g=1,t=2", "g=1,bad")),
    *(Row("OTEL_EXPORTER_OTLP_ENDPOINT", v, _http_exporter("endpoint"), _our_endpoint) for v in ("http://collector:4318", "http://collector:4318/")),
    *(Row("OTEL_RESOURCE_ATTRIBUTES", v, _resource, _our_resource) for v in ("team=ml,bad", "a=b,,c=d", "a=%20x", "k=", "a=b=c", "service.name=svc")),
    Row("OTEL_SERVICE_NAME", "trainer", _resource, _our_resource),
    *(Row("OTEL_SDK_DISABLED", v, _disabled, lambda c: c.disabled) for v in ("true", "TRUE", " True ", "1", "yes", "false", "garbage")),
    *(Row("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", v, _limits("max_span_attribute_length"), lambda c: c.attribute_value_length_limit) for v in ("16", "0")),
    Row("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "32", _limits("max_span_attribute_length"), lambda c: c.attribute_value_length_limit),
    *(Row("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", v, _limits("max_span_attributes"), lambda c: c.attribute_count_limit) for v in ("16", "0")),
    *(Row("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", v, _temporality, _our_temporality) for v in ("delta", "DELTA", "lowmemory", "cumulative", "sometimes")),
    *(Row("OTEL_TRACES_EXPORTER", v, _exporters("traces"), _our_exporters("traces_exporter")) for v in ("otlp", "otlp,console", " otlp , console ", "none", "console")),
    *(Row("OTEL_METRICS_EXPORTER", v, _exporters("metrics"), _our_exporters("metrics_exporter")) for v in ("otlp", "otlp,console", "none")),
]


def _env(row: Row) -> dict[str, str]:
    if "+" in row.var:
        names = row.var.split("+")
        return dict(zip(names, row.value.split(",")))
    return {row.var: row.value}


def _run_sdk(row: Row, monkeypatch) -> tuple[str, Any]:
    """("ok", value), ("warned", value) or ("raised", exception type name), as the SDK did."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep(logging.WARNING)
    root = logging.getLogger("opentelemetry")
    root.addHandler(handler)
    try:
        with monkeypatch.context() as mp:
            for k, v in _env(row).items():
                mp.setenv(k, v)
            try:
                value = row.sdk()
            except Exception as exc:  # noqa: BLE001 - what the SDK raises is the finding
                return "raised", type(exc).__name__
    finally:
        root.removeHandler(handler)
    return ("warned" if records else "ok"), value


def _sdk_default(row: Row, monkeypatch) -> Any:
    with monkeypatch.context() as mp:
        for k in _env(row):
            mp.delenv(k, raising=False)
        return row.sdk()


@pytest.mark.parametrize("row", ROWS, ids=[f"{r.var}={r.value}" for r in ROWS])
def test_the_library_reads_a_standard_variable_as_the_sdk_does(row, monkeypatch):
    what, sdk_value = _run_sdk(row, monkeypatch)
    cfg = config.load({}, environ=_env(row))  # never raises
    ours = row.ours(cfg)
    if what == "ok":
        assert ours == pytest.approx(sdk_value) if isinstance(sdk_value, float) else ours == sdk_value
        return
    # The SDK could not use it (it warned, or it raised: under opentelemetry-instrument it logs that and
    # goes on without the component). Where it fell back to its default, so does the library; where the
    # value was partly usable (a list, pairs), the usable part must be what the SDK kept.
    default = _sdk_default(row, monkeypatch)
    if what == "warned" and sdk_value != default:
        assert ours == sdk_value
    else:
        assert ours == row.ours(config.load({}, environ={}))


def test_the_table_holds_each_kind_of_sdk_reaction(monkeypatch):
    """The rows cover values the SDK uses, ignores with a warning and refuses by raising."""
    kinds = {_run_sdk(row, monkeypatch)[0] for row in ROWS}
    assert kinds == {"ok", "warned", "raised"}
