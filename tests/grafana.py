"""What Grafana does to a dashboard's Prometheus query before Prometheus sees it, for the tests that run the
queries of dashboards/ against a real Prometheus.

Grafana (12) sends a panel's query as a range query from the dashboard's time range, with a step and the
built-in variables worked out from the panel's width, the query's *Min step* and the data source's *scrape
interval* (``timeInterval``); template variables are replaced first, the query's Min step included:

* ``$__interval``: the time range divided by the panel's max data points (its width in pixels), rounded to
  one of Grafana's steps (1s, 2s, 5s, 10s, 15s, 20s, 30s, 1m, 2m, 5m, ...), and at least the Min step when
  the query has one, else the data source's scrape interval. It is also the range query's step.
* ``$__rate_interval``: ``max($__interval + S, 4 * S)``, where S is the query's Min step when it has one,
  else the data source's scrape interval.
* ``$__range`` (``$__range_s``, ``$__range_ms``): the time range.
* template variables: a single value as it is; a multi-value or *All* selection inside a regex matcher as
  ``(a|b)`` with regex characters escaped.

Grafana's own implementation is not used (its licence keeps it out of this project's builds); this module is
the one place the suite encodes that behaviour, checked against the values Grafana's documentation gives in
tests/test_grafana.py.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, "y": 31536000.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")

# Grafana's rounding of an automatic interval: the nice step nearest to it, picked by these upper bounds.
_ROUNDING = [
    (0.015, 0.01), (0.035, 0.02), (0.075, 0.05), (0.15, 0.1), (0.35, 0.2), (0.75, 0.5), (1.5, 1.0),
    (3.5, 2.0), (7.5, 5.0), (12.5, 10.0), (17.5, 15.0), (25.0, 20.0), (45.0, 30.0), (90.0, 60.0),
    (210.0, 120.0), (450.0, 300.0), (750.0, 600.0), (1050.0, 900.0), (1500.0, 1200.0), (2700.0, 1800.0),
    (5400.0, 3600.0), (9000.0, 7200.0), (16200.0, 10800.0), (32400.0, 21600.0), (86400.0, 43200.0),
]  # fmt: skip

# A 24-column dashboard row on a 1920-pixel screen: a panel of width w gets about 75 pixels a column.
PIXELS_PER_COLUMN = 75


def parse_duration(text: str) -> float:
    """Seconds in a Grafana/Prometheus duration (``5s``, ``1m30s``, ``500ms``)."""
    text = text.strip()
    parts = _DURATION.findall(text)
    if not parts or "".join(a + b for a, b in parts) != text:
        raise ValueError(f"not a duration: {text!r}")
    return sum(float(number) * _UNITS[unit] for number, unit in parts)


def format_duration(seconds: float) -> str:
    """A Prometheus duration for ``seconds`` (``4m``, ``1m5s``, ``500ms``)."""
    ms = int(round(seconds * 1000))
    if ms <= 0:
        raise ValueError(f"not a positive duration: {seconds}")
    out = ""
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        if ms >= size:
            out += f"{ms // size}{unit}"
            ms %= size
    return out


def round_interval(seconds: float) -> float:
    for bound, step in _ROUNDING:
        if seconds < bound:
            return step
    return 86400.0 * max(1, round(seconds / 86400.0))


@dataclass
class Query:
    """One query as Grafana sends it: the expression with everything substituted, its range and step."""

    expr: str
    start: float
    end: float
    step: float
    interval: float
    rate_interval: float


@dataclass
class Dashboard:
    """A dashboard's time range and variables as a user set them, on a Prometheus data source whose scrape
    interval is ``scrape_interval``."""

    scrape_interval: str = "5s"
    time_range: float = 1800.0  # the dashboards open on the last 30 minutes
    variables: dict[str, str] = field(default_factory=dict)

    def builtins(self, interval: float, rate_interval: float) -> dict[str, str]:
        return {
            "__interval": format_duration(interval),
            "__interval_ms": str(int(round(interval * 1000))),
            "__rate_interval": format_duration(rate_interval),
            "__range": format_duration(self.time_range),
            "__range_s": str(int(round(self.time_range))),
            "__range_ms": str(int(round(self.time_range * 1000))),
        }

    def intervals(self, panel: dict, target: dict) -> tuple[float, float]:
        """(``$__interval``, ``$__rate_interval``) in seconds for one query of ``panel``."""
        min_step_text = target.get("interval") or panel.get("interval") or ""
        min_step = parse_duration(substitute(min_step_text, self.variables)) if min_step_text else None
        scrape = min_step if min_step is not None else parse_duration(self.scrape_interval)
        width = panel.get("gridPos", {}).get("w", 24) * PIXELS_PER_COLUMN
        max_points = panel.get("maxDataPoints") or width
        interval = max(round_interval(self.time_range / max_points), scrape)
        return interval, max(interval + scrape, 4 * scrape)

    def query(self, panel: dict, target: dict, end: float) -> Query:
        """``target`` of ``panel`` as Grafana sends it when the dashboard's range ends at ``end``."""
        interval, rate_interval = self.intervals(panel, target)
        expr = substitute(target["expr"], self.variables, self.builtins(interval, rate_interval))
        # Grafana aligns a range query's start and end to its step.
        start = math.floor((end - self.time_range) / interval) * interval
        return Query(expr, start, math.floor(end / interval) * interval, interval, interval, rate_interval)

    def expression(self, expr: str) -> str:
        """A variable's or an ad-hoc expression with this dashboard's variables (built-ins as for a full-width
        panel)."""
        interval, rate_interval = self.intervals({}, {})
        return substitute(expr, self.variables, self.builtins(interval, rate_interval))


# A name of digits only ($1 in label_replace) is no variable: Grafana leaves a name it does not know as it is.
_VARIABLE = re.compile(r"\$\{(?!\d+\})(\w+)(?::(\w+))?\}|\[\[(\w+)\]\]|\$(?!\d+\b)(\w+)")


def used_variables(expr: str) -> set[str]:
    return {a or c or d for a, _, c, d in _VARIABLE.findall(expr)}


def substitute(expr: str, variables: dict[str, str], builtins: dict[str, str] | None = None) -> str:
    """Replace Grafana variables (``$x``, ``${x}``, ``${x:raw}``, ``[[x]]``) the way Grafana does; an unknown
    one raises, as a query with one left in would fail in Prometheus."""
    builtins = builtins or {}

    def value(m: re.Match) -> str:
        name = m.group(1) or m.group(3) or m.group(4)
        if name in builtins:
            return builtins[name]
        if name not in variables:
            raise KeyError(f"${name} is neither a dashboard variable nor a Grafana built-in")
        return variables[name]

    return _VARIABLE.sub(value, expr)


def regex_value(values: list[str]) -> str:
    """A multi-value variable set to All, as Grafana writes it into a Prometheus regex matcher."""
    escaped = [re.sub(r"([\\.+*?^$()\[\]{}|])", r"\\\\\1", v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"
