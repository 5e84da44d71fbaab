"""docs/configuration.md and docs/telemetry.md are what docs/reference.py makes of the code today: a
configuration field, environment variable, span, attribute or metric added, renamed or re-documented
without rerunning ``python docs/reference.py`` fails here."""

from __future__ import annotations

import dataclasses
import importlib.util
import os

import pytest

from otel_torchdist import config
from otel_torchdist import names as n

from .harness import REPO
from otel_torchdist.export.prometheus_names import prometheus_name

_spec = importlib.util.spec_from_file_location("docs_reference", os.path.join(REPO, "docs", "reference.py"))
reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reference)


@pytest.mark.parametrize("page", sorted(reference.PAGES))
def test_the_page_is_what_the_code_says(page):
    with open(os.path.join(REPO, "docs", page)) as f:
        written = f.read()
    assert written == reference.pages()[page], f"docs/{page} is stale: run `python docs/reference.py`"


def test_every_field_variable_and_metric_is_in_the_references():
    pages = reference.pages()
    for f in dataclasses.fields(config.Config):
        assert f"| `{f.name}` |" in pages["configuration.md"]
    for variable, _, _ in config._ENV:
        assert f"`{variable}`" in pages["configuration.md"]
    for metric in n.METRICS:
        assert f"`{prometheus_name(metric)}`" in pages["telemetry.md"]


def test_every_test_the_reliability_page_names_exists():
    """docs/reliability.md names the test behind each row: a renamed or removed test fails here."""
    import glob
    import re

    with open(os.path.join(REPO, "docs", "reliability.md")) as f:
        named = set(re.findall(r"`(test_[a-z0-9_]+)`", f.read()))
    defined = set()
    for path in glob.glob(os.path.join(REPO, "tests", "*.py")):
        with open(path) as f:
            defined.update(re.findall(r"^def (test_[a-z0-9_]+)\(", f.read(), re.M))
    assert named and not sorted(named - defined)
