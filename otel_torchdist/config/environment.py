"""The environment: every variable :func:`~otel_torchdist.config.load` reads, how each is parsed, and how a
standard variable's bad value is ignored (as the OpenTelemetry Python SDK ignores it) where an
``OTEL_TORCHDIST_*`` one raises."""

from __future__ import annotations

import difflib
import logging
import re
import urllib.parse
from collections.abc import Mapping
from typing import Any

from . import values
from .values import (
    AGGREGATIONS,
    CAPTURES,
    COMPRESSIONS,
    EXPORTER_GROUPS,
    LOG_LEVELS,
    METRICS_EXPORTERS,
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


def warn_unknown_variables(env: Mapping[str, str]) -> None:
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


def shared(var: str) -> bool:
    """A standard variable, which every OpenTelemetry component of the process reads (not ours alone)."""
    return not var.startswith(PREFIX)


def sdk_disabled(env: Mapping[str, str]) -> bool:
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
            values.check_headers(var, {key: value})
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


def _parse_int_ms(raw: str) -> float:
    # The SDK's BatchSpanProcessor reads its delay with int(): a fraction is not a value it uses.
    try:
        int(raw)
    except ValueError:
        raise ValueError("expected a whole number of milliseconds") from None
    return _parse_ms(raw)


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
        items = tuple(x.lower() for x in split_list(raw))
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
    ("OTEL_BSP_SCHEDULE_DELAY", "span_schedule_delay", _std(_parse_int_ms)),
    ("OTEL_BSP_MAX_QUEUE_SIZE", "span_queue_size", _std(_parse_int)),
    ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "span_batch_size", _std(_parse_int)),
    ("OTEL_EXPORTER_PROMETHEUS_HOST", "prometheus_host", _std(_parse_str)),
    ("OTEL_EXPORTER_PROMETHEUS_PORT", "prometheus_port", _std(_parse_int)),
    ("OTEL_SDK_DISABLED", "disabled", _parse_spec_bool),  # read first, by load() (sdk_disabled)
    ("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "metrics_temporality", _std(_parse_choice(TEMPORALITIES))),
    ("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "attribute_value_length_limit", _std(_parse_int)),
    ("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "attribute_value_length_limit", _std(_parse_int)),
    ("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "event_attribute_value_length_limit", _std(_parse_int)),
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
    (PREFIX + "NCCL_HOOK", "nccl_hook", _parse_choice(NCCL_HOOKS)),
    (PREFIX + "DISABLED_CAPTURES", "disabled_captures", _parse_choice_list(CAPTURES)),
    (PREFIX + "LOG_LEVEL", "log_level", lambda raw: _parse_choice(tuple(x.lower() for x in LOG_LEVELS))(raw).upper()),
    (PREFIX + "SYSTEM_METRICS", "system_metrics", _parse_bool),
    (PREFIX + "RUN_FOLDER_COPY", "run_folder_copy", _parse_bool),
    (PREFIX + "SYSTEM_INTERVAL_MS", "system_interval", _parse_ms),
    (PREFIX + "WARN_GPU_UTILIZATION", "warn_gpu_utilization", _parse_float),
    (PREFIX + "WARN_GPU_UTILIZATION_WINDOW_MS", "warn_gpu_utilization_window", _parse_ms),
    (PREFIX + "WARN_MEMORY_FRACTION", "warn_memory_fraction", _parse_float),
)

ENV_VARS = tuple(dict.fromkeys(var for var, _, _ in _ENV))
# Read outside the configuration: where the native part's builds live (otel_torchdist.native, which
# `otel-torchdist build-native` uses without a Config).
ELSEWHERE = (PREFIX + "NATIVE_DIR",)
"""Every variable :func:`load` reads (the frozen-names test and the docs list them)."""

