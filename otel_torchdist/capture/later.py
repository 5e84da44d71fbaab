"""Install a capture when the program imports what it captures, not before.

FSDP, DTensor and distributed checkpoint pull in sympy and much of torch.distributed: importing them
costs about a second per process. A DDP-only program never imports them, so their captures wait: a
finder at the front of ``sys.meta_path`` lets the normal import of the trigger module run, then installs
the capture (its imports are already done). Anything that goes wrong here is counted and the import goes
on unchanged: telemetry must never break a user's import. ``cancel`` removes the finder.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable
from typing import Any

from .. import health


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.hooks: dict[str, list[Callable[[], None]]] = {}
        self._busy = threading.local()

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self.hooks or getattr(self._busy, "name", None) == fullname:
            return None
        try:
            self._busy.name = fullname
            spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        except Exception:
            return None
        finally:
            self._busy.name = None
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _ThenRun(spec.loader, lambda: self._fire(fullname))
        return spec

    def _fire(self, fullname: str) -> None:
        for hook in self.hooks.pop(fullname, []):
            try:
                hook()
            except Exception as exc:
                health.error("capture", f"a capture waiting for {fullname} could not be installed", exc)
        if not self.hooks:
            cancel()


class _ThenRun(importlib.abc.Loader):
    """The module's own loader, then the hooks; the module keeps its own loader afterwards."""

    def __init__(self, loader: Any, then: Callable[[], None]) -> None:
        self._loader = loader
        self._then = then

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        spec = getattr(module, "__spec__", None)
        if spec is not None:
            spec.loader = self._loader
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self._loader
        self._loader.exec_module(module)
        self._then()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


_finder: list[_Finder] = []
_lock = threading.Lock()


def when_imported(module: str, hook: Callable[[], None]) -> None:
    """Run ``hook`` now if ``module`` is imported already, else right after the program imports it."""
    if module in sys.modules:
        hook()
        return
    with _lock:
        if not _finder:
            _finder.append(_Finder())
            sys.meta_path.insert(0, _finder[0])
        _finder[0].hooks.setdefault(module, []).append(hook)


def cancel() -> None:
    with _lock:
        if _finder:
            finder = _finder.pop()
            finder.hooks.clear()
            try:
                sys.meta_path.remove(finder)
            except ValueError:
                pass
