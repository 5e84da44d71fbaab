"""Running what the training thread deferred (capture/record.py's ``DEFERRED``): an entry's first item is
the index its drain function was registered under (``drained``, ``drained_as``), or the function itself."""

from __future__ import annotations

from typing import Any

from ..capture.record import DRAINED


def function(entry: tuple) -> Any:
    """The function a deferred entry calls."""
    fn = entry[0]
    return DRAINED[fn] if fn.__class__ is int else fn


def run(pipeline: Any, entry: tuple) -> None:
    """Run a deferred entry (on the drain thread)."""
    fn = entry[0]
    (DRAINED[fn] if fn.__class__ is int else fn)(pipeline, *entry[1:])
