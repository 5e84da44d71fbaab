"""The c10d wrapper's common case in C++, while the native part is loaded (``native/hot_path.cpp``).

A collective on one plain tensor, called outside any other captured call, with a known group, on a backend
whose blocking call returns complete, is described, called, stamped and queued by the native part: the
same record as the Python body writes (``tests/test_native_hot.py`` compares them field by field), at a
fraction of the interpreter's cost. Every other call (a nested one, a tensor subclass, a coalescing
block, an asynchronous call's completion, a failure to describe) goes to the Python body. The wrapper's
cheap exits stay in Python, so ``torch.compile`` traces the wrapper as before and never meets C++.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch
import torch.distributed.distributed_c10d as c10d_module

from .. import health
from .. import names as n
from . import c10d, caller, groups
from . import record as R


def activate(mod: ModuleType | None) -> None:
    """Hand the eligible wrappers of this instrument() to the native part ``mod`` (None: Python only)."""
    if mod is None:
        return
    try:
        mod.hot_setup(
            {
                "tls": R.TLS,
                "blocking": R.BLOCKING,
                "queue": R.QUEUE,
                "limit": R._limit,
                "dropped": R._dropped,
                "step": R.STEP,
                "context": caller.get_current,
                "groups": groups._groups,
                "world": c10d_module._world,
                "coalesce": c10d._coalesce_state,
                "tensor_type": torch.Tensor,
                "source": c10d.SOURCE_C10D,
                "future": groups.COMPLETION_FUTURE,
                "end_return": n.END_RETURN,
                "finish": c10d._finish,
                "fail": c10d._fail,
                "report": c10d._finish_failed,
            }
        )
        for cell, spec, binder, orig, body in c10d.HOT:
            cell[0] = mod.hot_op(orig, body, binder.names, binder.defaults, spec.name, spec.kind, *_layout(spec, binder))
    except Exception as exc:
        deactivate()
        health.error("native", "the native fast path could not be set up; collectives are captured in Python", exc)
        return
    c10d._hot_call = mod.hot_call


def _layout(spec: Any, binder: Any) -> tuple[tuple[int, ...], tuple[bool, ...]]:
    """Parameter positions (group, async, reduce op, tensor, root pair, peer pair; -1 for none) and flags."""

    def at(name: str | None) -> int:
        i = binder.index(name)
        return -1 if i is None else i

    root = spec.root or (None, None)
    peer = spec.peer or (None, None)
    positions = (
        at(spec.group), at(spec.async_param), at(spec.redop), at(spec.payload[0]),
        at(root[0]), at(root[1]), at(peer[0]), at(peer[1]),
    )  # fmt: skip
    flags = (spec.root is not None, spec.peer is not None, spec.size == "times_n", spec.name in c10d._COALESCED)
    return positions, flags


def deactivate() -> None:
    """uninstrument(): every wrapper back to its Python body, and the table emptied (the next instrument()'s
    wrappers register anew). ``c10d._hot_call`` stays: a thread that read its wrapper's op just before
    still calls it (the module stays loaded for the process anyway)."""
    for cell, *_ in c10d.HOT:
        cell[0] = None
    c10d.HOT.clear()


__all__ = ["activate", "deactivate"]
