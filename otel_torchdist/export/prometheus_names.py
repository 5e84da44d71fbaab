"""OpenTelemetry metric names as Prometheus names, as the Collector's Prometheus exporter builds them
(prometheus/otlptranslator, "underscore escaping with suffixes"): split the name into tokens, add the
unit's suffix unless already a token, "_total" for counters, "_ratio" for gauges of unit "1". The ranks'
own ``/metrics`` use them, so scraping a rank and scraping the Collector give the same series."""

from __future__ import annotations

from ..names import METRICS, Metric

_UNIT_SUFFIX = {
    "d": "days",
    "h": "hours",
    "min": "minutes",
    "s": "seconds",
    "ms": "milliseconds",
    "us": "microseconds",
    "ns": "nanoseconds",
    "By": "bytes",
    "KiBy": "kibibytes",
    "MiBy": "mebibytes",
    "GiBy": "gibibytes",
    "KBy": "kilobytes",
    "MBy": "megabytes",
    "GBy": "gigabytes",
    "m": "meters",
    "V": "volts",
    "A": "amperes",
    "J": "joules",
    "W": "watts",
    "g": "grams",
    "Cel": "celsius",
    "Hz": "hertz",
    "1": "",
    "%": "percent",
}
_PER_UNIT = {"s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week", "mo": "month", "y": "year"}


def _unit_suffixes(unit: str) -> tuple[str, str]:
    main, _, per = unit.partition("/")
    main, per = main.strip(), per.strip()
    main_suffix = _UNIT_SUFFIX.get(main, main) if main and "{" not in main and "}" not in main else ""
    per_suffix = ""
    if per and "{" not in per and "}" not in per:
        per_suffix = "per_" + _PER_UNIT.get(per, per)
    return _clean(main_suffix), _clean(per_suffix)


def _clean(text: str) -> str:
    out = "".join(c if (c.isascii() and (c.isalnum() or c == ":")) else "_" for c in text)
    while "__" in out:
        out = out.replace("__", "_")
    return out.lstrip("_")


def prometheus_name(metric: Metric) -> str:
    """The Prometheus family name of ``metric`` (without ``_bucket``/``_sum``/``_count``)."""
    tokens = [t for t in "".join(c if (c.isascii() and (c.isalnum() or c == ":")) else " " for c in metric.name).split()]
    main, per = _unit_suffixes(metric.unit)
    if main in tokens:
        main = ""
    if per == "per_":
        per = ""
    else:
        per = per.rstrip("_")
        if per in tokens:
            per = ""
    if per:
        main = main.rstrip("_")
    if main:
        tokens.append(main)
    if per:
        tokens.append(per)
    if metric.instrument == "counter":
        tokens = [t for t in tokens if t != "total"] + ["total"]
    if metric.unit == "1" and metric.instrument == "gauge":
        tokens = [t for t in tokens if t != "ratio"] + ["ratio"]
    name = "_".join(tokens)
    return "_" + name if name[:1].isdigit() else name


def prometheus_series_names(metrics: tuple[Metric, ...] = ()) -> set[str]:
    """Every series name a scrape of ``/metrics`` can show for ``metrics`` (default: all)."""
    out: set[str] = set()
    for m in metrics or METRICS:
        base = prometheus_name(m)
        if m.instrument == "histogram":
            out.update({base + "_bucket", base + "_sum", base + "_count"})
        else:
            out.add(base)
    return out
