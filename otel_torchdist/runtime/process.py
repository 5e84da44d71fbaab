"""The process's one current Runtime, and its end: ``atexit``, multiprocessing's exit finalizers (for
``torch.multiprocessing.spawn`` workers, which skip ``atexit``), and forks, which are not ranks."""

from __future__ import annotations

import atexit
import multiprocessing.util
import os
from typing import TYPE_CHECKING

from .. import health, signals

if TYPE_CHECKING:
    from . import Runtime

_current: list[Runtime] = []
_exit_hooked = [False]


def current() -> Runtime | None:
    return _current[0] if _current else None


def install(rt: Runtime) -> None:
    _current[:] = [rt]
    if not _exit_hooked[0]:
        _exit_hooked[0] = True
        atexit.register(_at_exit)
        multiprocessing.util.Finalize(None, _at_exit, exitpriority=100)
        os.register_at_fork(after_in_child=_forked_child)


def exit_before_providers() -> None:
    """Flush at exit before the application's OpenTelemetry providers shut down: an SDK provider made after
    instrument() registered its own exit hook later, which ran first (atexit runs the last registered first)
    and shut the provider down before the library handed it its last spans and metrics."""
    if _exit_hooked[0]:
        atexit.unregister(_at_exit)
        atexit.register(_at_exit)


def _forked_child() -> None:
    """A fork of an instrumented process (a DataLoader worker, a multiprocessing child) is not a rank: it
    inherits the runtime but none of its threads, and must neither flush nor summarize at its exit (it
    would race the parent for the run folder's files) nor take SIGTERM for the parent."""
    _current.clear()
    signals.forget_in_child()


def remove() -> Runtime | None:
    rt = current()
    _current.clear()
    return rt


def _at_exit() -> None:
    rt = current()
    if rt is None:
        return
    try:
        rt.close(restore=False)
    except Exception as exc:
        health.error("flush", "could not flush telemetry at exit", exc)
