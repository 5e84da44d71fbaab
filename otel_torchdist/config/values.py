"""What each option may be: the choices, the checks :meth:`Config.validate` applies, and the error that
names the option."""

from __future__ import annotations

import ipaddress
import math
import os
import re
import urllib.parse
from collections.abc import Mapping
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
NCCL_HOOKS = ("python", "native")
# The framework captures a program may leave out (runtime._framework_captures names them alike). Not the
# torch.distributed calls, nor the optimizer, whose steps close training steps.
CAPTURES = ("ddp", "fsdp", "funcol", "functions", "dtensor", "checkpoint", "backward", "dataloader", "nccl_completion")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def split_list(raw: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in raw.split(",") if x.strip())


class OptionError(ValueError):
    """A bad value, naming the option (``option``) so :func:`load` can name the variable instead."""

    def __init__(self, option: str, reason: str) -> None:
        super().__init__(f"{option}: {reason}")
        self.option = option
        self.reason = reason


def choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise OptionError(name, f"must be one of {', '.join(choices)}, got {value!r}")


def check_bounds(name: str, value: Any) -> tuple[float, ...]:
    if not isinstance(value, (tuple, list)) or not value:
        raise OptionError(name, f"must be a non-empty list of seconds, got {value!r}")
    for v in value:
        number(name, v, 0.0, None, exclusive_min=True)
    if any(b <= a for a, b in zip(value, value[1:])):
        raise OptionError(name, f"must be strictly increasing, got {value!r}")
    return tuple(float(v) for v in value)


def check_ranks(name: str, value: Any) -> tuple[int, ...]:
    """Normalise a rank selection to the sorted ranks it names."""
    if isinstance(value, str):
        ranks: set[int] = set()
        for item in split_list(value):
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
            integer(name, v, 0)
        return tuple(sorted(set(value)))
    raise OptionError(name, f"must be a rank list such as '0-7,64' or a non-empty list of ranks, got {value!r}")


def number(name: str, value: Any, lo: float | None, hi: float | None, exclusive_min: bool = False) -> None:
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


def seconds(name: str, value: Any, lo: float = 0.0) -> None:
    """A duration in seconds (its env variable, if any, is in milliseconds and already converted)."""
    number(name, value, 0.0, MAX_SECONDS, exclusive_min=True)
    if value < lo:
        raise OptionError(name, f"must be at least {lo * 1e3:g} ms, got {value * 1e3:g} ms")


# Header names: HTTP's token characters; values: visible ASCII, space and tab (gRPC metadata allows no more,
# and a line break would end the header early). Keys ending in -bin carry binary values over gRPC only.
_HEADER_NAME = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+")
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e]*")


def check_headers(name: str, value: Mapping[str, str]) -> None:
    for key, v in value.items():
        if not _HEADER_NAME.fullmatch(key):
            raise OptionError(name, f"header name {key!r} may only hold letters, digits and !#$%&'*+.^_`|~-")
        if key.lower().endswith("-bin"):
            raise OptionError(name, f"header {key!r}: names ending in -bin are binary gRPC metadata, not supported")
        if not _HEADER_VALUE.fullmatch(v):
            raise OptionError(name, f"header {key!r} has a value with a line break, control or non-ASCII character: {v!r}")


def integer(name: str, value: Any, lo: int, hi: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise OptionError(name, f"must be an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        raise OptionError(name, f"must be in [{lo}, {hi if hi is not None else 'inf'}], got {value!r}")


def check_endpoint(name: str, value: Any) -> None:
    if not isinstance(value, str):
        raise OptionError(name, f"must be a URL string, got {value!r}")
    try:
        parsed = urllib.parse.urlparse(value if "://" in value else "http://" + value)
        host = parsed.hostname
    except ValueError as exc:  # "Invalid IPv6 URL": an unclosed bracket
        raise OptionError(name, f"must be an http(s) URL such as http://localhost:4318 ({exc}), got {value!r}") from None
    if parsed.scheme not in ("http", "https") or not host or not valid_host(host):
        raise OptionError(name, f"must be an http(s) URL such as http://localhost:4318, got {value!r}")
    try:
        parsed.port
    except ValueError:
        raise OptionError(name, f"has an invalid port: {value!r}") from None


def valid_host(host: str) -> bool:
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


def check_host(name: str, value: Any) -> None:
    if not isinstance(value, str) or not value or not valid_host(value):
        raise OptionError(name, f"must be a host name or IP address such as 0.0.0.0 or 127.0.0.1, got {value!r}")


def check_file(name: str, value: Any) -> None:
    """TLS material is read when the exporter is built, possibly minutes later: refuse a bad path now."""
    if not isinstance(value, str) or not value:
        raise OptionError(name, f"must be the path of a PEM file, got {value!r}")
    if not os.path.isfile(value) or not os.access(value, os.R_OK):
        raise OptionError(name, f"must be the path of a readable PEM file; {value!r} is not one")


def check_run_id(name: str, value: Any) -> None:
    if not isinstance(value, str) or not value or len(value) > 128:
        raise OptionError(name, f"must be a non-empty string of at most 128 characters, got {value!r}")
    if any(not (c.isalnum() or c in "-_.") for c in value):
        raise OptionError(name, f"may only hold letters, digits, '-', '_' and '.', got {value!r}")

