"""Configuration: keyword options > OTEL_* variables > defaults; bad values name the setting."""

from __future__ import annotations

import pytest

from otel_torchdist import config
from otel_torchdist.config import environment


def test_defaults():
    cfg = config.load({}, environ={})
    assert cfg.service_name == "torch-distributed"
    assert cfg.protocol == "http/protobuf"
    assert cfg.resolved_traces_exporter() == ("file",)
    assert cfg.resolved_metrics_exporters() == ("file", "prometheus")
    assert cfg.metric_export_interval == 60.0
    assert cfg.prometheus_port == 9464


def test_standard_variables_are_read():
    env = {
        "OTEL_SERVICE_NAME": "trainer",
        "OTEL_RESOURCE_ATTRIBUTES": "team=ml,job%20name=llm%2C7b,service.name=ignored",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20abc,x-tenant=7",
        "OTEL_TRACES_SAMPLER": "traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.25",
        "OTEL_METRIC_EXPORT_INTERVAL": "5000",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "3",
    }
    cfg = config.load({}, environ=env)
    assert cfg.service_name == "trainer"
    assert cfg.resource_attributes == {"team": "ml", "job%20name": "llm,7b"}  # values decoded, keys not (the SDK's way)
    assert cfg.endpoint == "http://collector:4317"
    assert cfg.protocol == "grpc"
    assert cfg.headers == {"authorization": "Bearer abc", "x-tenant": "7"}
    assert (cfg.traces_sampler, cfg.traces_sampler_arg) == ("traceidratio", 0.25)
    assert cfg.metric_export_interval == 5.0
    assert cfg.timeout == 3.0
    assert cfg.resolved_traces_exporter() == ("otlp",)
    assert cfg.resolved_metrics_exporters() == ("otlp", "prometheus")


def test_service_name_from_resource_attributes_when_not_set_directly():
    cfg = config.load({}, environ={"OTEL_RESOURCE_ATTRIBUTES": "service.name=from-attrs"})
    assert cfg.service_name == "from-attrs"


def test_keyword_options_win_and_mappings_merge():
    env = {"OTEL_SERVICE_NAME": "env", "OTEL_RESOURCE_ATTRIBUTES": "a=1,b=2", "OTEL_TRACES_SAMPLER": "always_off"}
    cfg = config.load({"service_name": "kw", "resource_attributes": {"b": "3"}}, environ=env)
    assert cfg.service_name == "kw"
    assert cfg.resource_attributes == {"a": "1", "b": "3"}
    assert cfg.traces_sampler == "always_off"


@pytest.mark.parametrize(
    "var,value",
    [
        ("OTEL_TORCHDIST_RUN_ID", "run/../../etc"),
        ("OTEL_TORCHDIST_SUMMARY", "everyone"),
        ("OTEL_TORCHDIST_MAX_QUEUED_RECORDS", "lots"),
        ("OTEL_TORCHDIST_FILE_MAX_BYTES", "256M"),  # MB or MiB? Refused, not guessed
        ("OTEL_TORCHDIST_FILE_MAX_BYTES", "1.5GB"),
        ("OTEL_TORCHDIST_FILE_MAX_BYTES", "-1"),
        # past what threading can wait (it raised OverflowError from uninstrument() or a thread): a week at most
        ("OTEL_TORCHDIST_FLUSH_TIMEOUT_MS", "1e13"),
        ("OTEL_TORCHDIST_DRAIN_INTERVAL_MS", "1e13"),
        ("OTEL_TORCHDIST_SYSTEM_INTERVAL_MS", "1e13"),
        ("OTEL_TORCHDIST_HISTOGRAM_BUCKETS", "0.1,,0.2"),
        ("OTEL_TORCHDIST_PROMETHEUS", "perhaps"),
        ("OTEL_TORCHDIST_DISABLED_CAPTURES", "ddp,optimizer"),  # the optimizer's steps close training steps
    ],
)
def test_bad_variable_raises_value_error_naming_it(var, value):
    with pytest.raises(ValueError) as info:
        config.load({}, environ={var: value})
    assert var in str(info.value)
    assert repr(value) in str(info.value)


def _warnings(fn):
    import logging

    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("otel_torchdist")  # may not propagate once the library set up its logging
    logger.addHandler(handler)
    environment._ignored_once.clear()  # said once a process: another test may have said it already
    try:
        return fn(), [r.getMessage() for r in records]
    finally:
        logger.removeHandler(handler)


@pytest.mark.parametrize(
    "var,value,option",
    [
        ("OTEL_METRIC_EXPORT_INTERVAL", "soon", "metric_export_interval"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "-5", "metric_export_interval"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "0.001", "metric_export_interval"),  # a thread spinning: a unit mistake
        ("OTEL_BSP_SCHEDULE_DELAY", "5s", "span_schedule_delay"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon", "protocol"),
        ("OTEL_TRACES_SAMPLER", "sometimes", "traces_sampler"),
        ("OTEL_TRACES_SAMPLER", "parentbased_jaeger_remote", "traces_sampler"),
        ("OTEL_TRACES_SAMPLER_ARG", "2.5", "traces_sampler_arg"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://collector:21", "endpoint"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:99999", "endpoint"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://[::1:4318", "endpoint"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://[zz]:4318", "endpoint"),
        ("OTEL_EXPORTER_PROMETHEUS_PORT", "http", "prometheus_port"),
        ("OTEL_EXPORTER_PROMETHEUS_PORT", "70000", "prometheus_port"),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "0", "span_queue_size"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "1e10", "timeout"),
        ("OTEL_SDK_DISABLED", "maybe", "disabled"),
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/nonexistent/ca.pem", "certificate"),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "brotli", "compression"),
        ("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "sometimes", "metrics_temporality"),
        ("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "-1", "attribute_value_length_limit"),
    ],
)
def test_a_bad_standard_variable_is_ignored_with_a_warning_naming_it(var, value, option):
    """A training job never stops over a variable every OpenTelemetry component of the process reads: what
    the SDK cannot use either is said once and the default applies (tests/test_env_sdk.py compares with
    what the SDK itself does)."""
    cfg, said = _warnings(lambda: config.load({}, environ={var: value}))
    assert getattr(cfg, option) == getattr(config.Config(), option)
    assert any(var in line and repr(value) in line for line in said), said


def test_a_batch_larger_than_the_queue_is_said():
    """OTEL_BSP_MAX_QUEUE_SIZE=100 with the default batch of 512: the SDK's BatchSpanProcessor refuses the
    pair; the library took it without a word."""
    cfg, said = _warnings(lambda: config.load({}, environ={"OTEL_BSP_MAX_QUEUE_SIZE": "100"}))
    assert (cfg.span_queue_size, cfg.span_batch_size) == (100, 512)
    assert any("OTEL_BSP_MAX_EXPORT_BATCH_SIZE) 512 is larger than span_queue_size (OTEL_BSP_MAX_QUEUE_SIZE) 100" in line
               for line in said), said


@pytest.mark.parametrize(
    "var,value,option,expected",
    [
        ("OTEL_EXPORTER_OTLP_HEADERS", "novalue,a=b", "headers", {"a": "b"}),  # the bad item alone is left out
        ("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=abc%0Adef,a=b", "headers", {"a": "b"}),  # no request carries a line break
        ("OTEL_EXPORTER_OTLP_HEADERS", "trace-bin=AAA,a=b", "headers", {"a": "b"}),
        ("OTEL_RESOURCE_ATTRIBUTES", "team=ml,bad", "resource_attributes", {"team": "ml"}),
        ("OTEL_METRICS_EXPORTER", "otlp,graphite", "metrics_exporter", ("otlp",)),
        ("OTEL_TRACES_EXPORTER", "zipkin,console", "traces_exporter", ("console",)),
    ],
)
def test_the_usable_part_of_a_standard_variable_is_kept(var, value, option, expected):
    cfg, said = _warnings(lambda: config.load({}, environ={var: value}))
    assert getattr(cfg, option) == expected
    assert any(var in line for line in said), said


@pytest.mark.parametrize(
    "option,value",
    [
        ("protocol", "udp"),
        ("metric_export_interval", 0),
        ("metric_export_interval", "5"),
        ("span_queue_size", 1.5),
        ("prometheus_port", -1),
        ("headers", {"a": 1}),
        ("endpoint", "collector"),  # no scheme is fine...
        ("run_id", ""),
        ("disabled", "yes"),
    ],
)
def test_bad_option_raises_value_error_naming_it(option, value):
    if option == "endpoint":
        assert config.load({option: value}, environ={}).endpoint == "collector"  # ...host alone is accepted
        return
    with pytest.raises(ValueError) as info:
        config.load({option: value}, environ={})
    assert option in str(info.value)


def test_unknown_option_is_refused_with_the_valid_ones_listed():
    with pytest.raises(TypeError, match="unknown option.*servce_name.*valid options are: service_name"):
        config.load({"servce_name": "x"}, environ={})


def test_metrics_exporter_list_and_none():
    cfg = config.load({}, environ={"OTEL_METRICS_EXPORTER": "prometheus"})
    assert cfg.resolved_metrics_exporters() == ("prometheus",)
    # The per-rank /metrics is the library's own: no OTEL_METRICS_EXPORTER turns it off (a distro's default
    # "otlp" did); OTEL_TORCHDIST_PROMETHEUS=false does.
    cfg = config.load({"metrics_exporter": "none"}, environ={})
    assert cfg.resolved_metrics_exporters() == ("prometheus",)
    assert config.load({}, environ={"OTEL_METRICS_EXPORTER": "otlp"}).resolved_metrics_exporters() == ("otlp", "prometheus")
    cfg = config.load({}, environ={"OTEL_METRICS_EXPORTER": "none", "OTEL_TORCHDIST_PROMETHEUS": "false"})
    assert cfg.resolved_metrics_exporters() == ()


def test_log_level_variable_any_case():
    assert config.load({}, environ={"OTEL_TORCHDIST_LOG_LEVEL": "info"}).log_level == "INFO"
    assert config.load({}, environ={"OTEL_TORCHDIST_LOG_LEVEL": "DEBUG"}).log_level == "DEBUG"
    with pytest.raises(ValueError, match="OTEL_TORCHDIST_LOG_LEVEL"):
        config.load({}, environ={"OTEL_TORCHDIST_LOG_LEVEL": "loud"})


# Values any string option may legitimately hold: a service name, a run folder, a run id, a node or a host name
# can be "nan". Everything else must be refused by name.
_FREE_FORM = {"service_name", "run_dir", "run_id", "node_name", "endpoint", "traces_endpoint", "metrics_endpoint", "prometheus_host"}


@pytest.mark.parametrize("option", config.OPTION_NAMES)
def test_every_option_refuses_a_wrong_type_by_name(option):
    for wrong in (object(), ["x"], float("inf")):
        with pytest.raises(ValueError) as info:
            config.load({option: wrong}, environ={})
        assert str(info.value).startswith(f"{option}: "), info.value


@pytest.mark.parametrize("var,option", [(var, name) for var, name, _ in config._ENV if not config.shared(var)])
def test_every_variable_of_ours_refuses_garbage_by_name(var, option):
    for garbage in ("¿garbage?", "1e999", "-1"):
        if option in _FREE_FORM and garbage != "¿garbage?" or option in ("service_name", "run_dir"):
            continue
        with pytest.raises(ValueError) as info:
            config.load({}, environ={var: garbage})
        assert str(info.value).startswith(f"{var}={garbage!r}: "), info.value


@pytest.mark.parametrize("var", [var for var, _, _ in config._ENV if config.shared(var)])
def test_no_standard_variable_stops_the_job(var):
    for garbage in ("¿garbage?", "1e999", "-1", "=,=,", "0"):
        config.load({}, environ={var: garbage})


def test_disabled_reads_nothing_else():
    env = {"OTEL_SDK_DISABLED": "True", "OTEL_TORCHDIST_SUMMARY": "everyone", "OTEL_TORCHDIST_SUMARY": "x"}
    assert config.load({}, environ=env).disabled
    assert not config.load({}, environ={"OTEL_SDK_DISABLED": "1"}).disabled  # as the SDK reads it: true only


def test_blank_variables_count_as_unset():
    # The OTel specification: an empty value is the same as an unset variable.
    assert config.load({}, environ={var: " " for var in config.ENV_VARS}) == config.load({}, environ={})


def test_tls_files_must_exist_when_given(tmp_path):
    with pytest.raises(ValueError, match="certificate: must be the path"):
        config.load({"certificate": "/nonexistent/ca.pem"}, environ={})
    pem = tmp_path / "ca.pem"
    pem.write_text("-----BEGIN CERTIFICATE-----\n")
    assert config.load({"certificate": str(pem)}, environ={}).certificate == str(pem)


def test_per_signal_otlp_settings_override_the_generic_ones(tmp_path):
    from otel_torchdist.export.sinks import OtlpGrpcSink, OtlpHttpSink

    ca, traces_ca = tmp_path / "ca.pem", tmp_path / "traces-ca.pem"
    for f in (ca, traces_ca):
        f.write_text("-----BEGIN CERTIFICATE-----\n")
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector:4318",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "7",
        "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "3",
        "OTEL_EXPORTER_OTLP_CERTIFICATE": str(ca),
        "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": str(traces_ca),
        "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "gzip",
        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20all,x-a=1",
        "OTEL_EXPORTER_OTLP_METRICS_HEADERS": "authorization=Bearer%20metrics",
        "OTEL_EXPORTER_OTLP_METRICS_INSECURE": "true",
    }
    cfg = config.load({}, environ=env)
    assert (cfg.for_signal("timeout", "traces"), cfg.for_signal("timeout", "metrics")) == (7.0, 3.0)
    assert cfg.for_signal("certificate", "traces") == str(traces_ca)
    assert cfg.for_signal("certificate", "metrics") == str(ca)
    assert cfg.for_signal("headers", "metrics") == {"authorization": "Bearer metrics"}  # replaces, as in the SDK
    traces, metrics = OtlpHttpSink(cfg, "traces", "http/protobuf"), OtlpHttpSink(cfg, "metrics", "http/protobuf")
    assert (traces.verify, traces.compression, traces.timeout) == (str(traces_ca), "gzip", 7.0)
    assert (metrics.verify, metrics.compression, metrics.timeout) == (str(ca), "none", 3.0)
    assert traces.headers["authorization"] == "Bearer all" and metrics.headers["authorization"] == "Bearer metrics"
    grpc_env = {**env, "OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317"}
    grpc_traces, grpc_metrics = OtlpGrpcSink(config.load({}, environ=grpc_env), "traces"), OtlpGrpcSink(config.load({}, environ=grpc_env), "metrics")
    try:
        # Without a scheme, TLS unless INSECURE says true, as the SDK decides: the metrics-only INSECURE
        # applies to metrics alone.
        assert (grpc_traces.insecure, grpc_metrics.insecure) == (False, True)
    finally:
        grpc_traces.shutdown()
        grpc_metrics.shutdown()


def test_a_misspelled_variable_is_named_with_the_likely_one():
    _, said = _warnings(lambda: config.load({}, environ={"OTEL_TORCHDIST_TRACE_FIRST_STEP": "3", "OTEL_TORCHDIST_RUN_ID": "ok"}))
    (line,) = said
    assert "OTEL_TORCHDIST_TRACE_FIRST_STEP (did you mean OTEL_TORCHDIST_TRACE_FIRST_STEPS?)" in line


def test_run_dir_expands_the_home_folder():
    import os

    assert config.load({}, environ={"OTEL_TORCHDIST_RUN_DIR": "~/runs"}).run_dir == os.path.expanduser("~/runs")


def test_headers_that_requests_can_carry_are_kept():
    cfg = config.load({}, environ={"OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Basic%20YWJj%3D%3D,x-scope_orgID=t.1"})
    assert cfg.headers == {"authorization": "Basic YWJj==", "x-scope_orgid": "t.1"}  # names lowercased, as in the SDK


@pytest.mark.parametrize("raw,expected", [("268435456", 256 << 20), ("256MiB", 256 << 20), ("1GB", 10**9), ("64 kib", 65536), ("0", 0)])
def test_file_size_limit_takes_a_unit(raw, expected):
    assert config.load({}, environ={"OTEL_TORCHDIST_FILE_MAX_BYTES": raw}).file_max_bytes == expected


def test_disabled_captures_by_variable_or_option():
    assert config.load({}, environ={"OTEL_TORCHDIST_DISABLED_CAPTURES": "DDP, fsdp"}).disabled_captures == ("ddp", "fsdp")
    assert config.load({"disabled_captures": "dtensor"}, environ={}).disabled_captures == ("dtensor",)
    assert config.load({}, environ={}).disabled_captures == ()
    with pytest.raises(ValueError, match="disabled_captures"):
        config.load({"disabled_captures": ("ddp", "steps")}, environ={})
