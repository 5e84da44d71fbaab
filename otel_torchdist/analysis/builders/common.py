"""What more than one table's builder uses."""

from __future__ import annotations

import re

from ..stats import Sketch

DEFAULT_GROUP = "default_pg"


class OpAgg:
    __slots__ = ("count", "errors", "bytes", "dur", "timed", "sketch")

    def __init__(self) -> None:
        self.count = 0
        self.errors = 0
        self.bytes = 0
        self.dur = 0.0
        self.timed = 0  # the calls in dur: those that completed (a failed or unfinished call's time is no transfer's)
        self.sketch = Sketch()


def short_error(message: str, limit: int = 120) -> str:
    """An exception message without the C++ source location gloo and NCCL put in front."""
    text = re.sub(r"\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*", "", message).strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."
