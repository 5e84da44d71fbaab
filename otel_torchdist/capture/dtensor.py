"""Sharding steps as spans: ``distribute_tensor``, ``DTensor.redistribute``, ``distribute_module``,
``parallelize_module``.

Each span says what happened to the tensor: the original (global) shape and the shard shape this rank
holds ("Original shape (1024, 512), Sharded shape (256, 512)"), placements before and after, and the mesh's
shape and dimension names; a module-level step names the module and, for ``parallelize_module``, the plan.
The collectives a step issues are its children, with framework ``dtensor``. After ``distribute_module`` and
``parallelize_module`` the module tree gets forward hooks (context.ModuleTracker) so tensor-parallel
collectives carry the module that issued them.

These are functions that other modules (tensor parallel's styles, user code) import by name, so every
loaded module that holds the original function is patched, not only where it is defined; modules imported
later get the wrapper through the package attribute.
"""

from __future__ import annotations

import sys
from time import perf_counter_ns
from typing import Any

from .. import health
from .. import names as n
from ..patching import Patch
from . import context, framework_spans
from . import record as R
from .c10d import _is_compiling


def _shapes(*tensors: Any) -> tuple[str, ...]:
    return tuple(str(list(t.shape)) for t in tensors)


def _placements(placements: Any) -> tuple[str, ...]:
    return tuple(str(p) for p in placements or ())


def _mesh(mesh: Any) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    if mesh is None:
        return out
    try:
        out.append((n.SHARD_MESH_SHAPE, tuple(int(x) for x in mesh.shape)))
        if mesh.mesh_dim_names:
            out.append((n.SHARD_MESH_DIMS, tuple(str(x) for x in mesh.mesh_dim_names)))
    except Exception:
        pass
    return out


def _local(dtensor: Any) -> Any:
    return getattr(dtensor, "_local_tensor", dtensor)


def _traced(span_name: str, describe: Any, after: Any = None):
    """Wrap a sharding function: context while it runs (its collectives become children), then a span.

    ``describe(args, kwargs, result)`` gives the span attributes, or a function the drain thread calls for
    them; ``after(args, kwargs, result)`` runs on the training thread after success (module tracking).
    """

    def make(orig):
        def wrapper(*args, **kwargs):
            if _is_compiling() or R.TLS.outer is not None:
                return orig(*args, **kwargs)
            try:
                snap = framework_spans.snapshot()
                if framework_spans.untraced(*snap):
                    # The drain would drop this span, so it is not made (a redistribute per layer and pass
                    # adds up). Its collectives still say dtensor.
                    opened = None
                    token = context.push(framework="dtensor")
                else:
                    opened = framework_spans.open_span(snap)
                    token = context.push(framework="dtensor", parent=(opened[0], opened[1]))
            except Exception as exc:
                health.error("sharding", f"could not start a {span_name} span", exc)
                return orig(*args, **kwargs)
            t_start = perf_counter_ns()
            try:
                result = orig(*args, **kwargs)
            except BaseException as exc:
                context.pop(token)
                if opened is not None:
                    etype, message = R.error_info(exc)
                    framework_spans.span_later(span_name, t_start, perf_counter_ns(), [(n.ERROR_TYPE, etype)], snap, opened,
                                    error=f"{etype.rsplit('.', 1)[-1]}: {message}")  # fmt: skip
                raise
            t_end = perf_counter_ns()
            context.pop(token)
            try:
                if after is not None:
                    after(args, kwargs, result)
                if opened is not None:
                    framework_spans.span_later(span_name, t_start, t_end, describe(args, kwargs, result), snap, opened)
            except Exception as exc:
                health.error("sharding", f"could not record a {span_name} span", exc)
            return result

        wrapper.__wrapped__ = orig
        for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
            try:
                setattr(wrapper, attr, getattr(orig, attr))
            except (AttributeError, TypeError):
                pass
        return wrapper

    return make


def _arg(args: tuple, kwargs: dict, index: int, name: str) -> Any:
    return args[index] if len(args) > index else kwargs.get(name)


def _describe_distribute_tensor(args, kwargs, result):
    tensor = _arg(args, kwargs, 0, "tensor")
    return [
        (n.SHARD_ORIGINAL_SHAPES, _shapes(tensor)),
        (n.SHARD_SHARDED_SHAPES, _shapes(_local(result))),
        (n.SHARD_PLACEMENTS_AFTER, _placements(result.placements)),
    ] + _mesh(result.device_mesh)


def _describe_redistribute(args, kwargs, result):
    # The facts now (shapes, placements, mesh: no tensor, which would outlive its step in the queue), the
    # strings on the drain thread.
    source = args[0]
    facts = (
        tuple(source.shape), tuple(_local(source).shape), tuple(_local(result).shape),
        source.placements, result.placements, result.device_mesh,
    )  # fmt: skip
    return lambda: _redistribute_attributes(*facts)


def _redistribute_attributes(shape, local_before, local_after, before, after, mesh) -> list[tuple[str, Any]]:
    return [
        (n.SHARD_ORIGINAL_SHAPES, (str(list(shape)),)),
        (n.SHARD_SHARDED_SHAPES, (str(list(local_before)), str(list(local_after)))),
        (n.SHARD_PLACEMENTS_BEFORE, _placements(before)),
        (n.SHARD_PLACEMENTS_AFTER, _placements(after)),
    ] + _mesh(mesh)


def _describe_module(args, kwargs, result):
    module = _arg(args, kwargs, 0, "module")
    params = sum(p.numel() for p in module.parameters()) if hasattr(module, "parameters") else 0
    return [
        (n.SHARD_MODULE, type(module).__name__),
        (n.SHARD_MODULES, sum(1 for _ in module.modules())),
        (n.SHARD_PARAMS, params),
    ] + _mesh(_arg(args, kwargs, 1, "device_mesh"))


def _describe_parallelize(args, kwargs, result):
    attrs = _describe_module(args, kwargs, result)
    plan = _arg(args, kwargs, 2, "parallelize_plan")
    if isinstance(plan, dict):
        attrs.append((n.SHARD_PLAN, tuple(f"{fqn}={type(style).__name__}" for fqn, style in plan.items())))
    elif plan is not None:
        attrs.append((n.SHARD_PLAN, (f"={type(plan).__name__}",)))
    return attrs


def _track_module(args, kwargs, result):
    context.TRACKER.track(_arg(args, kwargs, 0, "module"))


def adopt_existing() -> None:
    """Models parallelized before instrument() (the usual order: build, parallelize, then set up telemetry):
    track each model holding DTensor parameters, as parallelize_module's wrapper would have. A model
    only FSDP2 shards (one mesh dimension, every DTensor parameter FSDP's) is left alone: FSDP's own capture
    names its units."""
    tensor_api = sys.modules.get("torch.distributed.tensor")
    if tensor_api is None:
        return  # DTensor never imported: nothing can be parallelized
    import gc

    import torch.nn as nn

    from .ddp import subclasses

    dtensor = tensor_api.DTensor
    # A module refers to its class (tp_traverse of heap types): the collector finds every module in C, in
    # one pass (FSDP2's units among them).
    modules = [obj for obj in gc.get_referrers(*subclasses(nn.Module)) if isinstance(obj, nn.Module)]
    owners = []
    for module in modules:
        if not context.TRACKER.tracked(module):
            own = [p for p in module._parameters.values() if isinstance(p, dtensor)]
            if own:
                owners.append((module, own))
    if not owners:
        return
    fsdp_only = _fsdp_only_params(modules)
    parents = {id(child): module for module in modules for child in module._modules.values() if child is not None}
    roots = {}
    for module, own in owners:
        if not all(id(p) in fsdp_only for p in own):
            # The whole model, as parallelize_module's wrapper tracks what it is given: the modules that only
            # prepare inputs (PrepareModuleInput on an attention block) hold no parameter of their own.
            seen = {id(module)}
            while id(module) in parents and id(parents[id(module)]) not in seen:
                module = parents[id(module)]
                seen.add(id(module))
            roots[id(module)] = module
    for root in roots.values():
        context.TRACKER.track(root)


def _fsdp_only_params(modules: list) -> set[int]:
    """ids of the DTensor parameters FSDP2 shards over one mesh dimension (no tensor parallel in them)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return set()
    out: set[int] = set()
    for unit in modules:
        if isinstance(unit, FSDPModule):
            for p in unit.parameters():
                mesh = getattr(p, "device_mesh", None)
                if mesh is not None and mesh.ndim == 1:
                    out.add(id(p))
    return out


def _binding_patches(original: Any, name: str, make) -> list[Patch]:
    """A Patch for every loaded module that holds ``original`` under ``name``."""
    out = []
    for module in list(sys.modules.values()):
        try:
            if module is not None and module.__dict__.get(name) is original:
                out.append(Patch(module, name, make))
        except Exception:
            continue
    return out


def patches() -> list[Patch]:
    try:
        import torch.distributed.tensor._api as api
        import torch.distributed.tensor.parallel.api as tp_api
        import torch.distributed.tensor.parallel.style  # noqa: F401  (binds distribute_module by name)
    except ImportError:
        return []
    out: list[Patch] = []
    out += _binding_patches(
        api.distribute_tensor, "distribute_tensor", _traced(n.SPAN_DISTRIBUTE_TENSOR, _describe_distribute_tensor)
    )
    out += _binding_patches(
        api.distribute_module,
        "distribute_module",
        _traced(n.SPAN_DISTRIBUTE_MODULE, _describe_module, _track_module),
    )
    out += _binding_patches(
        tp_api.parallelize_module,
        "parallelize_module",
        _traced(n.SPAN_PARALLELIZE_MODULE, _describe_parallelize, _track_module),
    )
    out.append(Patch(api.DTensor, "redistribute", _traced(n.SPAN_REDISTRIBUTE, _describe_redistribute)))
    from torch.distributed.tensor import _collective_utils

    from . import funcol

    # a collective of its own off CPU (funcol.wrap_shard_dim_alltoall); placement_types holds it by name
    out += _binding_patches(_collective_utils.shard_dim_alltoall, "shard_dim_alltoall", funcol.wrap_shard_dim_alltoall)
    return out
