"""Every relative link in the user docs leads somewhere: the file exists and, for a Markdown page, the
heading its anchor names does too (GitHub's anchors). A page moved or a heading renamed fails here."""

from __future__ import annotations

import glob
import os
import re

import pytest

from .harness import REPO

PAGES = sorted(
    [os.path.join(REPO, p) for p in ("README.md", "CHANGELOG.md", "deploy/README.md")]
    + glob.glob(os.path.join(REPO, "docs", "*.md"))
)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(path: str) -> set[str]:
    out = set()
    in_code = False
    for line in open(path):
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: os.path.relpath(p, REPO))
def test_relative_links_resolve(page):
    broken = []
    for target in LINK.findall(open(page).read()):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto
        path, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not os.path.exists(resolved):
            broken.append(target)
        elif anchor and resolved.endswith(".md") and anchor not in _anchors(resolved):
            broken.append(target)
    assert not broken, broken
