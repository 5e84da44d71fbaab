"""Symmetric patch / unpatch from one table.

A :class:`Patch` names an attribute and how to build its replacement from the original. :class:`Patcher`
applies a table of them and restores each attribute to the *identical* original object, the one found in
the owner's own ``__dict__`` (for pybind classes ``getattr`` returns an unbound builtin that is not the
stored object, and putting that back would break ``self`` binding).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

_log = logging.getLogger(__name__)

_MISSING = object()


@dataclass(frozen=True)
class Patch:
    owner: Any
    """A module or a class."""
    name: str
    make: Callable[[Any], Any]
    """Takes the original attribute, returns the replacement."""


class Patcher:
    def __init__(self) -> None:
        # owner, name, original, replacement, whether the original lived in owner's own __dict__
        self._applied: list[tuple[Any, str, Any, Any, bool]] = []

    @property
    def applied(self) -> list[tuple[Any, str, Any, Any]]:
        return [entry[:4] for entry in self._applied]

    def apply(self, patches: Iterable[Patch]) -> None:
        """Apply every patch, or none: a failure restores what was already applied, then re-raises."""
        done_before = len(self._applied)
        try:
            for patch in patches:
                original, own = _own_attribute(patch.owner, patch.name)
                if original is _MISSING:
                    continue  # this torch version lacks it; nothing to capture there
                replacement = patch.make(original)
                setattr(patch.owner, patch.name, replacement)
                self._applied.append((patch.owner, patch.name, original, replacement, own))
        except BaseException:
            self._restore(done_before)
            raise

    def restore(self) -> None:
        self._restore(0)

    def _restore(self, keep: int) -> None:
        while len(self._applied) > keep:
            owner, name, original, replacement, own = self._applied.pop()
            current, _ = _own_attribute(owner, name)
            if current is not replacement:
                _log.warning(
                    "otel-torchdist: %s.%s was replaced by someone else after instrument(); restoring the original",
                    getattr(owner, "__name__", owner),
                    name,
                )
            if own:
                setattr(owner, name, original)
            else:
                delattr(owner, name)  # it was inherited: uncover the base class's attribute again


def _own_attribute(owner: Any, name: str) -> tuple[Any, bool]:
    """The stored attribute and whether ``owner`` holds it itself (classes: not inherited)."""
    if isinstance(owner, type):
        if name in owner.__dict__:
            return owner.__dict__[name], True
        for klass in owner.__mro__[1:]:
            if name in klass.__dict__:
                return klass.__dict__[name], False
        return _MISSING, False
    return getattr(owner, name, _MISSING), True
