"""Where a collective came from: the framework context every record carries.

Framework captures (DDP's comm hook, FSDP's parameter groups, DTensor's redistribute, the optimizer hooks,
module hooks) set a thread-local context for the code they wrap; every record created meanwhile keeps a
reference to it (one tuple, shared by all records in that stretch, so the hot path pays one attribute
read). The context is a flat tuple:

    (framework, module, phase, parent_trace_id, parent_span_id, extras)

``extras`` is a flat ``key, value, ...`` tuple of span attributes (DDP bucket facts, FSDP action). A
pushed context inherits every field it does not set from the one it covers, so a DTensor redistribute
inside a module's forward keeps the module.
"""

from __future__ import annotations

import weakref
from typing import Any

from .record import TLS

FRAMEWORK = 0
MODULE = 1
PHASE = 2
PARENT_TRACE = 3
PARENT_SPAN = 4
EXTRAS = 5

EMPTY = (None, None, None, None, None, ())


def derive(
    framework: str | None = None,
    module: str | None = None,
    phase: str | None = None,
    parent: tuple[int, int] | None = None,
    extras: tuple = (),
) -> tuple:
    """The context :func:`push` would enter, without entering it (for a record made on the spot)."""
    base = TLS.ctx or EMPTY
    return (
        framework or base[FRAMEWORK],
        module or base[MODULE],
        phase or base[PHASE],
        parent[0] if parent else base[PARENT_TRACE],
        parent[1] if parent else base[PARENT_SPAN],
        extras or base[EXTRAS],
    )


def push(
    framework: str | None = None,
    module: str | None = None,
    phase: str | None = None,
    parent: tuple[int, int] | None = None,
    extras: tuple = (),
) -> tuple | None:
    """Enter a context; returns the token :func:`pop` needs."""
    old = TLS.ctx
    TLS.ctx = derive(framework, module, phase, parent, extras)
    return old


def pop(token: tuple | None) -> None:
    TLS.ctx = token


def current() -> tuple | None:
    return TLS.ctx


# --------------------------------------------------------------------------------------- module tracking
class ModuleTracker:
    """Per-module forward hooks on the modules of models a framework parallelized (tensor parallel).

    Only those modules get hooks (not every module in the process, as a global hook would), so models
    that issue no collectives in forward pay nothing. The pre-hook is prepended and the post-hook appended,
    so the context covers the framework's own input and output hooks: the collectives a ``RowwiseParallel``
    output hook issues belong to that module, as CommDebugMode counts them. Module names are
    ``RootClass.fqn`` (the root alone: ``RootClass``), CommDebugMode's convention.
    """

    def __init__(self) -> None:
        self._handles: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> its two handles

    def track(self, root: Any) -> None:
        """Hook ``root`` and its submodules, named from ``root``; an outer root renames what an inner one
        (``parallelize_module`` calling ``distribute_module``) hooked first."""
        root_name = type(root).__name__
        for fqn, module in root.named_modules():
            old = self._handles.pop(module, None)
            if old is not None:
                for handle in old:
                    handle.remove()
            name = f"{root_name}.{fqn}" if fqn else root_name
            self._handles[module] = (
                module.register_forward_pre_hook(_pre_hook(name), prepend=True),
                module.register_forward_hook(_post_hook(), always_call=True),
            )

    def remove(self) -> None:
        for handles in list(self._handles.values()):
            for handle in handles:
                try:
                    handle.remove()
                except Exception:
                    pass
        self._handles = weakref.WeakKeyDictionary()


def _pre_hook(name: str):
    def pre(module, args):
        stack = getattr(TLS, "module_tokens", None)
        if stack is None:
            stack = TLS.module_tokens = []
        stack.append(push(module=name, phase="forward"))
        # None: a forward pre-hook that returns a value replaces the module's input.

    return pre


def _post_hook():
    def post(module, args, output):
        stack = getattr(TLS, "module_tokens", None)
        if stack:
            pop(stack.pop())
        # Must return None: a returned value would replace the module's output.

    return post


TRACKER = ModuleTracker()
