"""Trace and span ids, made wherever a span begins (the training thread, the drain, the watchdog).

One generator for the process: ``random.getrandbits`` is fast and thread-safe, and ids need only be unique,
not secret (the OpenTelemetry SDK's default generator is the same).
"""

from __future__ import annotations

import random

getrandbits = random.Random().getrandbits  # the drain's span encoder calls it inline, for the call it saves


def new_trace_id() -> int:
    return getrandbits(128) or 1


def new_span_id() -> int:
    return getrandbits(64) or 1
