"""The process's one current Runtime, and its end: ``atexit``, multiprocessing's exit finalizers (for
``torch.multiprocessing.spawn`` workers, which skip ``atexit``), and forks, which are not ranks until they
make a process group."""

from __future__ import annotations

import atexit
import multiprocessing.util
import os
import sys
import threading
from typing import TYPE_CHECKING

from .. import health, signals
from ..capture import record

if TYPE_CHECKING:
    from . import Runtime

_current: list[Runtime] = []
_inherited: list[Runtime] = []  # in a fork: the parent's runtime, its patches still in place
_exit_hooked = [False]
_finalized_in = [0]  # the process whose multiprocessing finalizers hold _at_exit

# Module locks a thread of the parent may have held at the fork (held for ever in the child otherwise).
_LOCKS = (
    ("otel_torchdist.health", "_lock"),
    ("otel_torchdist.capture.groups", "_lock"),
    ("otel_torchdist.capture.completion", "_pending_lock"),
    ("otel_torchdist.native", "_lock"),
    ("otel_torchdist.callbacks", "_lock"),
    ("otel_torchdist.export.otel_metrics", "_by_provider_lock"),
)


def current() -> Runtime | None:
    return _current[0] if _current else None


def install(rt: Runtime) -> None:
    _current[:] = [rt]
    _inherited.clear()
    if not _exit_hooked[0]:
        _exit_hooked[0] = True
        atexit.register(_at_exit)
        os.register_at_fork(after_in_child=_forked_child)
    if _finalized_in[0] != os.getpid():
        # a multiprocessing child started by fork clears the finalizers it inherited, and skips atexit
        _finalized_in[0] = os.getpid()
        multiprocessing.util.Finalize(None, _at_exit, exitpriority=100)


def inherited() -> bool:
    return bool(_inherited)


def abandon_inherited() -> None:
    """instrument() or uninstrument() in a fork: the parent's patches out first."""
    while _inherited:
        _inherited.pop().abandon()


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
    would race the parent for the run folder's files) nor take SIGTERM for the parent. One that makes a
    process group becomes a rank of its own (Runtime.on_process_group); what was queued is the parent's."""
    if _current:
        _inherited[:] = _current
    _current.clear()
    signals.forget_in_child()
    record.QUEUE.clear()
    record.DEFERRED.clear()
    record.STEP[0] = None
    for module, name in _LOCKS:
        if module in sys.modules:
            setattr(sys.modules[module], name, threading.Lock())
    health.reset()  # the parent's counts are the parent's to report


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
