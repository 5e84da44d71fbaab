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

import sys
import weakref
from typing import Any

from .record import BWD as _BWD
from .record import CTX as _CTX
from .record import STEPCTX as _STEPCTX
from .record import TLS
from .record import in_backward as _in_backward
from .step_context import SAMPLED as _SAMPLED

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
_CALL_FRAMES = frozenset(("_call_impl", "_wrapped_call_impl"))


def _outermost_module_called(frame: Any = None) -> Any:
    """The outermost ``nn.Module`` whose ``__call__`` is on this thread's stack (the model the training loop
    called) from ``frame`` (default: the caller's) up, or None."""
    import torch.nn as nn

    outer = None
    if frame is None:
        frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name in _CALL_FRAMES:
            owner = frame.f_locals.get("self")
            if isinstance(owner, nn.Module):
                outer = owner
        frame = frame.f_back
    return outer


_STACK_NAMES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> its name, from its first sight


def on_stack(rec: list) -> None:
    """A collective of a traced step that no framework context names (``dist.all_reduce`` or a functional
    collective in a model's forward, a compiled model's collectives in deep mode): the innermost module whose
    call is on this thread's stack, named as CommDebugMode names it (the outermost module called, then the
    path to it). Traced steps only (outside steps the native fast path stays on, and names none): the stack
    is walked per collective up to the nearest module call, a few frames (the whole stack once per module, to
    name it)."""
    step = rec[_STEPCTX]
    if step is None or not step[_SAMPLED]:
        return
    ctx = rec[_CTX]
    if ctx is None or ctx[MODULE] is None:
        found = stack_context(ctx, rec[_BWD])
        if found is not None:
            rec[_CTX] = found


NODE_KEY = "otel_torchdist.module"  # in a custom autograd function's node: the module that applied it


def node_module() -> str | None:
    """In backward, the module whose forward applied the custom autograd function running now (capture/
    functions.py marks them in traced steps), or None."""
    import torch

    node = torch._C._current_autograd_node()
    return node.metadata.get(NODE_KEY) if node is not None else None


_GRAPH_MODULE: list = []


def _graph_module() -> type:
    """torch.fx.GraphModule (whose instances are of generated subclasses: ``GraphModuleImpl``)."""
    if not _GRAPH_MODULE:
        from torch.fx import GraphModule

        _GRAPH_MODULE.append(GraphModule)
    return _GRAPH_MODULE[0]


def stack_context(ctx: tuple | None, in_backward: bool) -> tuple | None:
    """``ctx`` with the module found on the stack (see :func:`on_stack`), or in backward the module that
    applied the autograd function running now (:func:`node_module`); None where there is none."""
    name = node_module() if in_backward else None
    if name is None:
        frame = sys._getframe(2)
        module = None
        while frame is not None:
            code = frame.f_code
            if code.co_name in _CALL_FRAMES:
                module = frame.f_locals.get("self")
                if not isinstance(module, _graph_module()):  # a compiler's graph: the model compiled is above
                    break
            elif code.co_name == "wrapped_forward" and "lightning" in code.co_filename:
                # Lightning runs training_step as the model's forward (its forward redirection): code of the
                # step itself (self.log's syncs), no module's forward
                return None
            frame = frame.f_back
        if frame is None:
            return None
        try:
            name = _STACK_NAMES.get(module)
        except TypeError:
            return None
        if name is None:
            name = _STACK_NAMES[module] = _stack_name(module, frame)
    base = ctx or EMPTY
    phase = base[PHASE] or ("backward" if in_backward else "forward")
    return (base[FRAMEWORK], name, phase, base[PARENT_TRACE], base[PARENT_SPAN], base[EXTRAS])


def _unwrapped(module: Any) -> Any:
    """The model a wrapper holds, named as the user wrote it: torch.compile's OptimizedModule, DDP."""
    while True:
        inner = getattr(module, "_orig_mod", None)
        if inner is None and type(module).__name__ == "DistributedDataParallel":
            inner = getattr(module, "module", None)
        if inner is None or inner is module:
            return module
        module = inner


def _stack_name(module: Any, frame: Any) -> str:
    outer = _outermost_module_called(frame)
    if outer is None:  # never `or`: a module's truth is its len() where it has one (OptimizedModule)
        outer = module
    root = _unwrapped(outer)
    base = class_name(root)
    if module is outer or module is root or _unwrapped(module) is root:
        return base
    path = next((p for p, m in root.named_modules() if m is module), None)
    return f"{base}.{path}" if path else class_name(module)


def class_name(module: Any) -> str:
    """The model's own class name: fully_shard swaps a module's class for ``FSDP<Class>`` (FSDPModule, Class)."""
    cls = type(module)
    bases = cls.__bases__
    if len(bases) >= 2 and cls.__name__ == f"FSDP{bases[-1].__name__}":
        return bases[-1].__name__
    return cls.__name__


class ModuleTracker:
    """Per-module forward hooks on the modules of models a framework parallelized (tensor parallel).

    Only those modules get hooks (not every module in the process, as a global hook would), so models
    that issue no collectives in forward pay nothing. The pre-hook is prepended and the post-hook appended,
    so the context covers the framework's own input and output hooks: the collectives a ``RowwiseParallel``
    output hook issues belong to that module, as CommDebugMode counts them.

    Names are CommDebugMode's: the class of the model the training loop calls, then the module's path in it
    (``MLP.net2``; the model alone: ``MLP``). The tracked module may be any part of that model (tensor
    parallel applies a style to each ``Linear``; a model may be parallelized block by block, or before
    ``instrument()`` and found then), so a tracked tree is named at its first forward, from the outermost
    module being called on the stack at that moment.
    """

    def __init__(self) -> None:
        self._handles: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> its two handles
        self._roots: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> (tracked root ref, path)
        self._names: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> name, once resolved

    def track(self, root: Any) -> None:
        """Hook ``root`` and its submodules; an outer root re-hooks what an inner one hooked first."""
        ref = weakref.ref(root)
        for fqn, module in root.named_modules():
            old = self._handles.pop(module, None)
            if old is not None:
                for handle in old:
                    handle.remove()
            self._roots[module] = (ref, fqn)
            self._names.pop(module, None)
            self._handles[module] = (
                module.register_forward_pre_hook(self._pre_hook, prepend=True),
                module.register_forward_hook(_post_hook, always_call=True),
            )

    def tracked(self, module: Any) -> bool:
        return module in self._handles

    def _pre_hook(self, module, args):
        if _compiling():
            return  # traced by Dynamo: no graph break (the deep mode names compiled collectives from the stack)
        name = self._names.get(module)
        if name is None:
            name = self._resolve(module)
        stack = getattr(TLS, "module_tokens", None)
        if stack is None:
            stack = TLS.module_tokens = []
        # A module run inside backward is activation checkpointing's recomputation: its collectives are
        # backward's (CommDebugMode counts them so).
        stack.append(push(module=name, phase="backward" if _in_backward() else "forward"))
        # None: a forward pre-hook that returns a value replaces the module's input.

    def _resolve(self, module) -> str:
        """Name ``module``'s tracked tree from the model being called now."""
        ref, fqn = self._roots.get(module, (None, ""))
        root = ref() if ref is not None else None
        if root is None:
            return class_name(module)
        base = class_name(root)
        outer = _outermost_module_called()
        if outer is not None:
            outer = getattr(outer, "_orig_mod", outer)  # torch.compile's OptimizedModule: the model it compiled
        if outer is not None and outer is not root:
            path = next((p for p, m in outer.named_modules() if m is root), None)
            if path:
                base = f"{class_name(outer)}.{path}"
        for sub_fqn, sub in root.named_modules():
            entry = self._roots.get(sub)
            if entry is not None and entry[0] is ref:
                self._names[sub] = f"{base}.{sub_fqn}" if sub_fqn else base
        return self._names.get(module) or (f"{base}.{fqn}" if fqn else base)

    def remove(self) -> None:
        for handles in list(self._handles.values()):
            for handle in handles:
                try:
                    handle.remove()
                except Exception:
                    pass
        self._handles = weakref.WeakKeyDictionary()
        self._roots = weakref.WeakKeyDictionary()
        self._names = weakref.WeakKeyDictionary()


def _compiling() -> bool:
    """torch.compiler.is_compiling(), which Dynamo answers True while it traces (the tracker's hooks then do
    nothing, as the eager wrappers do)."""
    global _compiling
    import torch

    _compiling = torch.compiler.is_compiling
    return _compiling()


def _post_hook(module, args, output):
    if _compiling():
        return
    stack = getattr(TLS, "module_tokens", None)
    if stack:
        token = stack.pop()
        ctx = TLS.ctx
        pop(token)
        if ctx is not None and ctx[MODULE] is not None:
            _watch_backward(ctx[MODULE], output)
    # Must return None: a returned value would replace the module's output.


def _first_needing_grad(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value if value.requires_grad else None
    if isinstance(value, (tuple, list)):
        for item in value:
            found = _first_needing_grad(item)
            if found is not None:
                return found
    return None


def _watch_backward(name: str, output: Any) -> None:
    """The module's backward as a context too, by CommDebugMode's rule: from the moment the gradient of its
    output is computed, a collective belongs to the module whose backward began last, until the backward pass
    ends (a tensor hook, only where the output needs a gradient). So the collectives tensor parallel issues in
    backward (ColwiseParallel's input gradient, the reduce-scatter of a sequence-parallel input) carry the
    module CommDebugMode charges them to."""
    out = _first_needing_grad(output)
    if out is not None:
        out.register_hook(lambda grad: _enter_backward(name))


def _enter_backward(name: str) -> None:
    import torch

    task = torch._C._current_graph_task_id()
    state = getattr(TLS, "backward", None)
    if state is None or state[0] != task:
        # A new backward pass. A state left from an earlier one (its end ran on another thread) still holds
        # the context this thread had before any backward.
        base = state[1] if state is not None else TLS.ctx
        TLS.backward = state = (task, base)
        try:
            from torch.autograd import Variable

            Variable._execution_engine.queue_callback(_end_backward)
        except Exception:
            pass
    TLS.ctx = state[1]
    push(module=name, phase="backward")


def _end_backward() -> None:
    state = getattr(TLS, "backward", None)
    if state is not None:
        TLS.ctx = state[1]
        TLS.backward = None


TRACKER = ModuleTracker()
