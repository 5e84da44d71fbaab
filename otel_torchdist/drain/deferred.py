"""Running what the training thread deferred (capture/record.py's ``DEFERRED``): an entry's first item is
the index its drain function was registered under (``reserve``, ``drained_as``), the rest its arguments
after the pipeline. The drain runs one as ``DRAINED[entry[0]](pipeline, *entry[1:])``, in place (once per
training step: a helper's call would be one more per step)."""

from __future__ import annotations

from typing import Any

from ..capture.record import DRAINED


def function(entry: tuple) -> Any:
    """The function a deferred entry calls."""
    return DRAINED[entry[0]]
