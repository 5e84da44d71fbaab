"""When an OTLP export is tried again: the rules of the OpenTelemetry Python SDK's OTLP exporters.

HTTP: 429, 502, 503 and 504 are retried (the specification's retryable codes); gRPC: CANCELLED,
DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED, OUT_OF_RANGE and DATA_LOSS. At most six tries, 1, 2, 4, 8,
16 s apart, each with ±20 % jitter, or after the delay the server asks for (``Retry-After``; gRPC's
``RetryInfo``), as long as that fits the export's deadline; a shut-down exporter stops waiting at once.

One difference, on purpose: a connection that cannot be made (HTTP's connection errors, gRPC's UNAVAILABLE)
is tried once more at once (a pooled connection the collector closed) and then given up, where the SDK waits
out its backoff up to the export's timeout. A collector that is down for good would otherwise hold the export
thread, and every flush of the run's end, for ten seconds a batch; its batches are dropped and counted at once
instead (docs/reliability.md).

Nothing here knows the transport: :func:`send` runs one try given to it until it succeeds, fails for good, runs
out of time or the exporter stops.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timezone
from email.utils import parsedate_to_datetime

MAX_TRIES = 6
RETRYABLE_HTTP = frozenset({429, 502, 503, 504})
RETRYABLE_GRPC = frozenset({"CANCELLED", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED", "OUT_OF_RANGE", "DATA_LOSS"})


@dataclass(frozen=True)
class Outcome:
    """One try: ``ok``; else whether it may be tried again, after ``delay`` seconds when the server said, and
    why it failed (for the log line)."""

    ok: bool
    retryable: bool = False
    reason: str = ""
    delay: float | None = None
    unreachable: bool = False  # no connection could be made: tried once more at once, then given up


def backoff(attempt: int) -> float:
    return 2**attempt * random.uniform(0.8, 1.2)


def send(attempt: Callable[[float], Outcome], deadline: float, stop: threading.Event) -> Outcome:
    """Try ``attempt(seconds_left)`` until it succeeds, fails for good, ``deadline`` (monotonic) would pass
    before the next try, or ``stop`` is set. Returns the last outcome."""
    outcome = Outcome(False, reason="no time left")
    unreachable = 0
    n = 0
    while n < MAX_TRIES:
        left = deadline - time.monotonic()
        if left <= 0:
            return outcome
        outcome = attempt(left)
        if outcome.unreachable:
            unreachable += 1
            if unreachable == 2 or stop.is_set():
                return outcome
            continue  # once more, at once
        if outcome.ok or not outcome.retryable or n + 1 == MAX_TRIES:
            return outcome
        wait = outcome.delay if outcome.delay is not None else backoff(n)
        if wait > deadline - time.monotonic() or stop.wait(wait):
            return outcome
        n += 1
    return outcome


def retry_after(value: str | None) -> float | None:
    """A ``Retry-After`` header (RFC 9110: seconds, or an HTTP date) as seconds from now, or None."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
        return max(seconds, 0.0) if math.isfinite(seconds) else None
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # asctime's form (and "-0000") carry no zone: an HTTP date is GMT (RFC 9110)
        when = when.replace(tzinfo=timezone.utc)
    return max(when.timestamp() - time.time(), 0.0)
