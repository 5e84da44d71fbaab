"""Rank-tagged logging: every otel-torchdist log line says which rank wrote it.

Lines look like ``[otel-torchdist rank=3] WARNING exporting traces to ... is failing (...)``. The level
comes from ``OTEL_TORCHDIST_LOG_LEVEL`` (default WARNING), read when ``instrument()`` is called. The
``otel_torchdist`` logger has its own stderr handler and does not propagate, so a training script's
logging configuration neither loses these lines nor prints them twice; attach handlers to it to route
them elsewhere.

Training code gets the rank too, under its own name: ``get_logger("train")`` is Python's ``train`` logger
with a stderr handler writing ``[rank=0] WARNING train: ...`` (it does not propagate; its level is yours to
set, Python's default WARNING otherwise), and ``rank_zero_info`` / ``rank_zero_warning`` (logger
``train``) / ``rank_zero_only`` keep a message (or a function) to global rank 0.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from typing import Any, Callable

ROOT = "otel_torchdist"
_rank: list[int | None] = [None]


def current_rank() -> int:
    if _rank[0] is not None:
        return _rank[0]
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except Exception:
        pass
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def set_rank(rank: int) -> None:
    _rank[0] = rank


class _RankFilter(logging.Filter):
    def __init__(self, library: bool = True) -> None:
        super().__init__()
        self.library = library

    def filter(self, record: logging.LogRecord) -> bool:
        record.torchdist_rank = current_rank()
        if self.library and isinstance(record.msg, str) and record.msg.startswith(_OLD_PREFIX):
            record.msg = record.msg[len(_OLD_PREFIX) :]  # the handler's prefix says it already
        return True


_OLD_PREFIX = "otel-torchdist: "


_handler: list[logging.Handler] = []


def configure(level: str = "WARNING") -> logging.Logger:
    """Install the rank-prefixing handler on the ``otel_torchdist`` logger (once) and set its level."""
    logger = logging.getLogger(ROOT)
    if not _handler:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[otel-torchdist rank=%(torchdist_rank)s] %(levelname)s %(message)s"))
        handler.addFilter(_RankFilter())
        logger.addHandler(handler)
        logger.propagate = False
        _handler.append(handler)
    logger.setLevel(level)
    return logger


_user_handlers: dict[str, logging.Handler] = {}


def get_logger(name: str) -> logging.Logger:
    """Python's logger ``name``, its lines prefixed with the rank and named by ``name``, not by this library."""
    logger = logging.getLogger(name)
    if name not in _user_handlers and not name.startswith(ROOT):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[rank=%(torchdist_rank)s] %(levelname)s %(name)s: %(message)s"))
        handler.addFilter(_RankFilter(library=False))
        logger.addHandler(handler)
        logger.propagate = False  # a configured root would print each line a second time, without the rank
        _user_handlers[name] = handler
    return logger


def rank_zero_only(fn: Callable) -> Callable:
    """Decorator: run ``fn`` on global rank 0 only (None elsewhere)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if current_rank() == 0:
            return fn(*args, **kwargs)
        return None

    return wrapper


def rank_zero_info(message: str, *args: Any) -> None:
    if current_rank() == 0:
        get_logger("train").info(message, *args)


def rank_zero_warning(message: str, *args: Any) -> None:
    if current_rank() == 0:
        get_logger("train").warning(message, *args)
