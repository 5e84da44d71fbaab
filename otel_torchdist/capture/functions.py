"""Custom autograd functions' backward collectives: which module's forward made them.

Hand-written model parallelism (Megatron's kind) issues its backward collectives from the ``backward`` of an
``autograd.Function`` applied in a module's forward (the input-gradient all-reduce of a column-parallel
linear). No module is running then. In traced steps, each ``Function.apply`` leaves the module whose forward
applied it (``context.stack_context``) in its autograd node's metadata, and a collective issued while that
node runs backward takes it (``context.node_module``). Untraced steps pay one check per ``apply``.
"""

from __future__ import annotations

from typing import Any

import torch

from ..patching import Patch
from . import context
from . import record as R
from . import step_context as S
from .c10d import _is_compiling

_STEP = R.STEP


def _mark(out: Any) -> None:
    if isinstance(out, (tuple, list)):  # the first output autograd tracks (top-k's indices first: not tracked)
        out = next((t for t in out if isinstance(t, torch.Tensor) and t.grad_fn is not None), None)
    node = getattr(out, "grad_fn", None)
    if node is None:
        return
    ctx = R.TLS.ctx
    if ctx is not None and ctx[context.MODULE] is not None:
        name = ctx[context.MODULE]
    else:
        found = context.stack_context(ctx, False)
        if found is None:
            return
        name = found[context.MODULE]
    node.metadata[context.NODE_KEY] = name


def _wrap_apply(orig: Any) -> Any:
    func = orig.__func__

    def apply(cls, *args, **kwargs):
        out = func(cls, *args, **kwargs)
        step = _STEP[0]
        if step is not None and step[S.SAMPLED] and not _is_compiling():
            try:
                _mark(out)
            except Exception:
                pass  # the module is a span attribute: never worth a failed forward
        return out

    apply.__wrapped__ = func
    return classmethod(apply)


def patches() -> list[Patch]:
    return [Patch(torch.autograd.Function, "apply", _wrap_apply)]
