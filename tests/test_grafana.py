"""tests/grafana.py, the suite's one model of Grafana's query substitution, held to what Grafana documents:
$__rate_interval = max($__interval + scrape interval, 4 x scrape interval), the query's Min step standing in
for the scrape interval when set, $__interval = time range / max data points rounded to Grafana's steps and
never below that minimum."""

from __future__ import annotations

import pytest

from . import grafana

PANEL = {"gridPos": {"w": 12}}  # half a row: 900 pixels


@pytest.mark.parametrize(
    ("text", "seconds"), [("5s", 5), ("1m", 60), ("1m30s", 90), ("500ms", 0.5), ("2h", 7200), ("4m", 240)]
)
def test_durations_read_and_write_as_prometheus_writes_them(text, seconds):
    assert grafana.parse_duration(text) == seconds
    assert grafana.format_duration(seconds) == text


@pytest.mark.parametrize("bad", ["", "5", "5x", "1m 5s", "-5s"])
def test_a_malformed_duration_is_refused(bad):
    with pytest.raises(ValueError):
        grafana.parse_duration(bad)


@pytest.mark.parametrize(
    ("raw", "rounded"), [(0.9, 1), (2.0, 2), (4.0, 5), (11, 10), (16, 15), (24, 20), (40, 30), (80, 60), (200, 120), (400, 300)]
)
def test_automatic_intervals_round_to_grafanas_steps(raw, rounded):
    assert grafana.round_interval(raw) == rounded


def test_rate_interval_is_four_scrape_intervals_on_a_short_range():
    # Grafana's documented example: a 15 s scrape interval gives $__rate_interval = 1m on a short range.
    interval, rate = grafana.Dashboard(scrape_interval="15s", time_range=900).intervals(PANEL, {})
    assert (interval, rate) == (15, 60)


def test_rate_interval_is_interval_plus_scrape_once_the_range_is_long():
    # 24 h over 900 pixels: 96 s, rounded to 2m; 2m + 15s > 4 x 15s
    interval, rate = grafana.Dashboard(scrape_interval="15s", time_range=86400).intervals(PANEL, {})
    assert (interval, rate) == (120, 135)


def test_a_queries_min_step_replaces_the_scrape_interval_and_may_be_a_variable():
    dashboard = grafana.Dashboard(scrape_interval="5s", variables={"resolution": "1m"})
    assert dashboard.intervals(PANEL, {}) == (5, 20)
    assert dashboard.intervals(PANEL, {"interval": "$resolution"}) == (60, 240)
    assert dashboard.intervals({**PANEL, "interval": "30s"}, {}) == (30, 120)


def test_query_substitutes_variables_and_builtins_and_aligns_the_range_to_its_step():
    dashboard = grafana.Dashboard(scrape_interval="5s", variables={"run": "r1", "rank": "(0|1)", "resolution": "1m"})
    target = {"expr": 'rate(x{run="$run", rank=~"${rank}"}[$__rate_interval]) + [[run]] $__range $__interval', "interval": "$resolution"}
    q = dashboard.query(PANEL, target, end=10_000.5)
    assert q.expr == 'rate(x{run="r1", rank=~"(0|1)"}[4m]) + r1 30m 1m'
    assert (q.step, q.end, q.end - q.start) == (60, 9960, 1800)


def test_an_unknown_variable_fails_loudly():
    with pytest.raises(KeyError, match=r"\$nope"):
        grafana.Dashboard().expression("x{a=\"$nope\"}")


def test_all_of_a_multi_value_variable_becomes_an_escaped_alternation():
    assert grafana.regex_value(["0"]) == "0"
    assert grafana.regex_value(["default_pg", "pg.1"]) == "(default_pg|pg\\\\.1)"
    assert grafana.used_variables("$a ${b} ${c:raw} [[d]] $__rate_interval") == {"a", "b", "c", "d", "__rate_interval"}
    assert grafana.substitute('label_replace(x, "a", "$1", "b", "(.+)")', {}) == 'label_replace(x, "a", "$1", "b", "(.+)")'
