"""Telemetry's own failures: logged once per kind, counted, swallowed.

Everything that can go wrong inside otel-torchdist (an argument we could not describe, a dead backend, a
full queue) ends here instead of in the training loop. The counts are exported as
``torchdist.telemetry.errors`` and ``torchdist.telemetry.dropped``.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter


log = logging.getLogger("otel_torchdist")

_lock = threading.Lock()
_errors: Counter[str] = Counter()
_dropped: Counter[str] = Counter()
_logged: set[str] = set()


def error(kind: str, message: str, exc: BaseException | None = None, *, quiet: bool = False) -> None:
    """Count an internal failure of ``kind``; log it the first time only.

    ``quiet=True`` only counts: for callers that say it better themselves (the OTLP and file sinks log the
    first failure and the recovery of each destination), so one failure is not reported twice.
    """
    with _lock:
        _errors[kind] += 1
        first = not quiet and kind not in _logged
        if not quiet:
            _logged.add(kind)
    if first:
        log.warning(
            "otel-torchdist: %s (%s%s); training continues, further %s errors are only counted",
            message,
            type(exc).__name__ if exc else kind,
            f": {exc}" if exc else "",
            kind,
        )
        if exc is not None:
            log.debug("otel-torchdist %s failure detail", kind, exc_info=exc)


def warn_once(key: str, message: str, *args) -> None:
    with _lock:
        if key in _logged:
            return
        _logged.add(key)
    log.warning("otel-torchdist: " + message, *args)


def dropped(kind: str, n: int = 1) -> None:
    with _lock:
        _dropped[kind] += n


def errors() -> dict[str, int]:
    with _lock:
        return dict(_errors)


# (kind, read, clear) for drops counted elsewhere: the record queue counts its own on the hot path, without
# a lock.
_counted_elsewhere: list = []


def count_drops_of(kind: str, read, clear) -> None:
    """Report ``read()`` as drops of ``kind`` too (registered by the module that counts them); ``clear()``
    zeroes that count with the others (:func:`reset`)."""
    _counted_elsewhere.append((kind, read, clear))


def drops() -> dict[str, int]:
    with _lock:
        out = dict(_dropped)
    for kind, read, _ in _counted_elsewhere:
        n = read()
        if n:
            out[kind] = out.get(kind, 0) + n
    return out


def reset() -> None:
    with _lock:
        _errors.clear()
        _dropped.clear()
        _logged.clear()
    for _, _, clear in _counted_elsewhere:
        clear()
