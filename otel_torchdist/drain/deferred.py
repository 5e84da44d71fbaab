"""Running what the training thread deferred (capture/record.py's ``DEFERRED``): an entry's first item is
the index its drain function was registered under (``reserve``, ``drained_as``)."""

from __future__ import annotations

from typing import Any

from ..capture.record import DRAINED


def function(entry: tuple) -> Any:
    """The function a deferred entry calls."""
    return DRAINED[entry[0]]


def run(pipeline: Any, entry: tuple) -> None:
    """Run a deferred entry (on the drain thread)."""
    DRAINED[entry[0]](pipeline, *entry[1:])
