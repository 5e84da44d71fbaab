"""How a training process ends badly: SIGTERM, or an exception nobody caught.

**Uncaught exception.** ``sys.excepthook`` is chained: the open training step is closed as failed (its
span carries the exception's type and message), then the previous hook prints the traceback unchanged.
The exit handler flushes afterwards. (Under ``torch.multiprocessing.spawn`` the exception is caught by
the spawn wrapper and never reaches the hook: there the step is exported as the unfinished tail.)

**SIGTERM** (torchrun, Slurm, Kubernetes stopping a job): flush telemetry, then die as SIGTERM would.

A Python signal handler runs on the main thread between bytecodes, so a rank stuck in a collective (in
C++) would not run it until the collective gave up, possibly half an hour later. So besides the handler,
the signal's wakeup file descriptor (written by CPython's C-level handler the moment the signal arrives,
whatever the main thread is doing) is watched by a thread of ours: whichever sees SIGTERM first flushes
(bounded by ``flush_timeout``). The main-thread handler then re-raises SIGTERM with the default action, so
the exit status is the usual one; if the main thread is stuck, the watcher ends the process itself
(``os._exit(143)``, the shell's code for death by SIGTERM) once the flush is done. A SIGTERM that lands
while the process is already flushing on its way out (the exit handler after an uncaught exception: under
torchrun a peer's failure brings both) waits for that flush instead of cutting it short: the watcher's
flush returns when the running one has finished, and the main thread's handler, finding the flush under
way on its own thread, lets it finish and then acts on the signal.

Only installed from the main thread, only if SIGTERM's disposition is the default or a Python handler
(which is chained: telemetry is flushed, not closed, and that handler decides what happens), and the wakeup
descriptor only if nobody (asyncio) holds it already. A handler the program sets later is left to decide
alone: the watcher does nothing while SIGTERM's handler is not ours. A forked child drops all of it
(``forget_in_child``). ``uninstall`` puts everything back (off the main thread, what it can: ``_disarm``).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from . import health

_state: dict[str, Any] = {}


_pending: list[tuple[int, Any, Any]] = []  # a SIGTERM held back while this thread finishes closing


def install(
    close: Callable[[], None],
    flush: Callable[[], None],
    on_exception: Callable[[BaseException], None],
    closing_here: Callable[[], bool],
) -> None:
    """``close``: the final flush before the process dies; ``flush``: export what is there and go on (when
    a handler of the program's decides what SIGTERM does, the program may well go on training)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if _state:
        if not _state.get("disarmed"):
            return
        _put_back(stop_watcher=False)  # an uninstall off the main thread left these to this thread
        _state.clear()
    previous_hook = sys.excepthook

    def excepthook(etype: type, value: BaseException, tb: Any) -> None:
        if not issubclass(etype, (KeyboardInterrupt, SystemExit)):
            try:
                on_exception(value)
            except Exception as exc:
                health.error("signal", "could not record the exception that ended the program", exc)
        previous_hook(etype, value, tb)

    sys.excepthook = excepthook
    _state.update(previous_hook=previous_hook, excepthook=excepthook)
    try:
        previous = signal.getsignal(signal.SIGTERM)
    except Exception:
        return
    if previous is signal.SIG_IGN or previous is None:
        return  # someone chose to ignore SIGTERM (or a C handler we cannot chain): leave it
    done = threading.Event()
    lock = threading.Lock()

    def flush_once() -> bool:
        """True for the caller that did the flush."""
        if not lock.acquire(blocking=False):
            done.wait(timeout=30)
            return False
        try:
            close()
        except Exception as exc:
            health.error("signal", "could not flush telemetry on SIGTERM", exc)
        finally:
            done.set()
        return True

    def flush_only() -> None:
        try:
            flush()
        except Exception as exc:
            health.error("signal", "could not flush telemetry on SIGTERM", exc)

    armed = [True]  # False once uninstalled off the main thread, which cannot take the handler back

    def handler(signum: int, frame: Any) -> None:
        if not armed[0]:
            _act(signum, frame, previous)  # as if never installed
            return
        if closing_here():
            # The signal interrupted our own flush on this thread (the exit handler's, say): flushing here
            # would wait on itself. The flush goes on and delivers the signal when done (deliver_pending).
            _pending.append((signum, frame, previous))
            return
        if callable(previous):
            flush_only()
        else:
            flush_once()
        _act(signum, frame, previous)

    signal.signal(signal.SIGTERM, handler)
    _state.update(previous=previous, handler=handler, armed=armed)
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    try:
        old_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except (ValueError, OSError):
        old_fd = None
    if old_fd is None or old_fd != -1:
        if old_fd not in (None, -1):
            signal.set_wakeup_fd(old_fd)  # someone else's (asyncio): leave it, and the watcher out
        os.close(read_fd)
        os.close(write_fd)
        return
    _state.update(read_fd=read_fd, write_fd=write_fd)

    stop = threading.Event()

    def watch() -> None:
        while True:
            try:
                data = os.read(read_fd, 64)
            except OSError:
                return
            if not data or stop.is_set():
                return
            if signal.SIGTERM not in data:
                continue
            try:
                ours = signal.getsignal(signal.SIGTERM) is handler
            except Exception:
                ours = False
            if not ours:
                continue  # the program set its own handler since: what SIGTERM does is its business
            if callable(previous):
                flush_only()  # the program's chained handler decides, when the main thread gets to it
            elif flush_once():
                # The main thread may be stuck in C++; if its handler has not taken over, end it here.
                threading.Event().wait(0.5)
                os._exit(128 + signal.SIGTERM)

    watcher = threading.Thread(target=watch, name="otel-torchdist-sigterm", daemon=True)
    watcher.start()
    _state.update(watcher=watcher, stop=stop)


def _act(signum: int, frame: Any, previous: Any) -> None:
    """What SIGTERM does once telemetry is flushed: the chained handler, else death by SIGTERM."""
    if callable(previous):
        previous(signum, frame)
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def deliver_pending() -> None:
    """After a flush that a SIGTERM interrupted: act on it now, as the handler would have."""
    if not _pending or threading.current_thread() is not threading.main_thread():
        return
    signum, frame, previous = _pending.pop()
    _pending.clear()
    _act(signum, frame, previous)


def _put_back(stop_watcher: bool) -> None:
    """The program's own hook, handler and wakeup descriptor back where they are still ours; the pipe closed."""
    if "excepthook" in _state and sys.excepthook is _state["excepthook"]:
        sys.excepthook = _state["previous_hook"]
    if "handler" in _state and signal.getsignal(signal.SIGTERM) is _state["handler"]:
        signal.signal(signal.SIGTERM, _state["previous"])
    if "write_fd" in _state:
        held = signal.set_wakeup_fd(-1)
        if held != _state["write_fd"]:
            signal.set_wakeup_fd(held)  # someone set theirs since (asyncio): it stays
        if stop_watcher:
            _state["stop"].set()
            os.write(_state["write_fd"], b"\0")  # wakes the watcher's read; it sees the stop flag
            _state["watcher"].join(timeout=1.0)
        os.close(_state["write_fd"])
        os.close(_state["read_fd"])


def uninstall() -> None:
    if not _state or _state.get("disarmed"):
        return
    if threading.current_thread() is not threading.main_thread():
        _disarm()
        return
    try:
        _put_back(stop_watcher=True)
    except Exception as exc:
        health.error("signal", "could not restore the SIGTERM handler", exc)
    _state.clear()


def _disarm() -> None:
    """Off the main thread, where neither a signal handler nor the wakeup descriptor can be changed: the hook
    goes back, the watcher stops, and the handler acts as if it had never been installed; the next install()
    (on the main thread) puts the handler and the descriptor back first. The pipe stays open meanwhile: a
    closed descriptor's number could be another file's by the time a signal writes to it."""
    try:
        if sys.excepthook is _state.get("excepthook"):
            sys.excepthook = _state["previous_hook"]
        _state.pop("excepthook", None)
        if "armed" in _state:
            _state["armed"][0] = False
        if "watcher" in _state:
            _state["stop"].set()
            os.write(_state["write_fd"], b"\0")  # wakes the watcher's read; it sees the stop flag
            _state["watcher"].join(timeout=1.0)
    except Exception as exc:
        health.error("signal", "could not put the SIGTERM handler out of action", exc)
    _state["disarmed"] = True


def forget_in_child() -> None:
    """In a forked child (a DataLoader worker): the wakeup pipe is the parent's, so a SIGTERM sent to the
    child (``Process.terminate()``) would reach the parent's watcher and end the parent; and the handlers
    would flush a runtime the child does not run. The child gets the program's own handlers back (it has
    no watcher thread to stop: threads do not survive a fork)."""
    if not _state:
        return
    try:
        _put_back(stop_watcher=False)
    except Exception:
        pass  # nothing to tell: the child's own handlers may already be in place
    _state.clear()
    _pending.clear()
