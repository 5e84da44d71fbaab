"""FSDP2 (``fully_shard``) and FSDP1: which unit issued each all-gather and reduce-scatter, and the sharding.

Both FSDPs issue their collectives through ``torch.distributed`` functions, which the c10d capture
records; what they lack is the unit. FSDP2: ``FSDPParamGroup.unshard`` (all-gathers, including prefetches,
which FSDP2 issues by calling ``unshard`` on the *target* group, so they are attributed to that unit) and
``FSDPParamGroup.post_backward`` (reduce-scatters, HSDP all-reduces) set the framework context to the
group's module FQN for their duration. FSDP1: its runtime's ``_unshard`` and ``_reduce_grad`` functions do
the same with the handle's module (``summon_full_params`` and full state dicts too, in the caller's phase).
``FSDPParamGroup.__init__`` (every ``fully_shard`` call, however the user imported it) and
``FullyShardedDataParallel.__init__`` become sharding spans with the parameters' unsharded and sharded
shapes and the mesh.
"""

from __future__ import annotations

import weakref
from time import perf_counter_ns
from typing import Any

from .. import health
from .. import names as n
from ..patching import Patch
from . import context, ddp
from . import record as R

_MAX_SHAPES = 64
_fsdp1_names: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # wrapped module -> FQN


_group_names: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # FSDPParamGroup -> its full name


def _group_name(group: Any) -> str:
    """The group's module as a full path from the root, ``RootClass.fqn`` (``Transformer.layers.0``), the
    convention of the module tracker (context.py) and CommDebugMode: FSDP2's own FQN is relative to the
    root (``layers.0``; under a Sequential root, a bare ``0``)."""
    name = _group_names.get(group)
    if name is not None:
        return name
    fqn = group._module_fqn
    modules = group.modules
    root = _root_class(modules[0]) if modules else None
    if fqn:
        name = ", ".join(f"{root}.{f}" if root else f for f in fqn.split(", "))
    else:
        name = root or (context.class_name(modules[0]) if modules else "<root>")
    if fqn is not None:  # named by the root's lazy initialisation: final
        _group_names[group] = name
    return name


def _root_class(module: Any) -> str | None:
    """The class of the root ``fully_shard`` module above ``module`` (its state context lists the root's
    state first), or None before the root's lazy initialisation."""
    try:
        states = module._get_fsdp_state()._state_ctx.all_states
        return context.class_name(states[0]._modules[0]) if states else None
    except Exception:
        return None


def _wrap_group_method(action: str):
    def make(orig):
        def method(self, *args, **kwargs):
            try:
                token = context.push(
                    framework="fsdp",
                    module=_group_name(self),
                    phase="backward" if R.in_backward() or action != "unshard" else "forward",
                    extras=(n.FSDP_ACTION, action),
                )
            except Exception as exc:
                health.error("fsdp", "could not attribute an FSDP collective", exc)
                return orig(self, *args, **kwargs)
            try:
                return orig(self, *args, **kwargs)
            finally:
                context.pop(token)

        method.__wrapped__ = orig
        return method

    return make


def _mesh_attributes(mesh: Any) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    try:
        out.append((n.SHARD_MESH_SHAPE, tuple(int(x) for x in mesh.shape)))
        if mesh.mesh_dim_names:
            out.append((n.SHARD_MESH_DIMS, tuple(str(x) for x in mesh.mesh_dim_names)))
    except Exception:
        pass
    return out


def _shape(size: Any) -> str:
    return str(list(size))


def _wrap_group_init(orig):
    def __init__(self, params, modules, mesh_info, *args, **kwargs):
        t_start = perf_counter_ns()
        orig(self, params, modules, mesh_info, *args, **kwargs)
        try:
            fsdp_params = self.fsdp_params[:_MAX_SHAPES]
            attrs: list[tuple[str, Any]] = [
                (n.SHARD_MODULE, ",".join(type(m).__name__ for m in modules)),
                (n.SHARD_MODULES, len(modules)),
                (n.SHARD_PARAMS, sum(p.numel() for p in params)),
                (n.SHARD_ORIGINAL_SHAPES, tuple(_shape(p._orig_size) for p in fsdp_params)),
                (n.SHARD_SHARDED_SHAPES, tuple(_shape(p.sharded_size) for p in fsdp_params)),
            ] + _mesh_attributes(mesh_info.mesh)
            for module in modules:
                ddp.record_model(module, t_start, perf_counter_ns(), n.SPAN_FULLY_SHARD, attrs, gauges=False)
        except Exception as exc:
            health.error("fsdp", "could not record a fully_shard", exc)

    __init__.__wrapped__ = orig
    return __init__


# ------------------------------------------------------------------------------------------------- FSDP1
def _fsdp1_module_name(handle: Any) -> str:
    module = getattr(handle, "_fully_sharded_module", None)
    if module is None:
        return "<unknown>"
    return _fsdp1_names.get(module) or type(module).__name__


def _wrap_runtime_fn(action: str, runtime: bool = True):
    """``runtime``: FSDP1's forward/backward runtime (the phase is forward or backward); else its unshards
    outside that runtime (``summon_full_params``, full state dicts), which keep the caller's phase."""

    def make(orig):
        def fn(state, handle, *args, **kwargs):
            try:
                if runtime:
                    phase = "backward" if R.in_backward() or action != "unshard" else "forward"
                else:
                    phase = None
                token = context.push(
                    framework="fsdp1",
                    module=_fsdp1_module_name(handle),
                    phase=phase,
                    extras=(n.FSDP_ACTION, action),
                )
            except Exception as exc:
                health.error("fsdp", "could not attribute an FSDP1 collective", exc)
                return orig(state, handle, *args, **kwargs)
            try:
                return orig(state, handle, *args, **kwargs)
            finally:
                context.pop(token)

        fn.__wrapped__ = orig
        return fn

    return make


def _wrap_fsdp1_init(orig):
    def __init__(self, module, *args, **kwargs):
        t_start = perf_counter_ns()
        orig(self, module, *args, **kwargs)
        try:
            # Names of the units below this one, relative to it (FSDP's own FQNs, as FSDP2 names its
            # groups); an outer wrap, built after its inner ones, renames them.
            root_name = type(module).__name__
            for fqn, sub in self.named_modules():
                inner = getattr(sub, "_fsdp_wrapped_module", None)
                if inner is not None:
                    clean = fqn.replace("_fsdp_wrapped_module.", "").replace("._fsdp_wrapped_module", "")
                    clean = clean.removesuffix("_fsdp_wrapped_module").rstrip(".")
                    _fsdp1_names[inner] = f"{root_name}.{clean}" if clean else root_name  # a full path
            handle = getattr(self, "_handle", None)
            # the unit's own parameters, unsharded (its handle's), as FSDP2's groups count theirs: not those of
            # the units inside it, whether auto-wrapped or wrapped before it (then already sharded)
            flat = handle.flat_param if handle is not None else None
            attrs: list[tuple[str, Any]] = [(n.SHARD_MODULE, root_name), (n.SHARD_PARAMS, sum(flat._numels) if flat is not None else 0)]
            if flat is not None:
                attrs += [
                    (n.SHARD_ORIGINAL_SHAPES, tuple(_shape(s) for s in flat._shapes[:_MAX_SHAPES])),
                    (n.SHARD_SHARDED_SHAPES, (_shape(flat.shape),)),
                ]
            pg = getattr(self, "process_group", None)
            if pg is not None:
                attrs.append((n.SHARD_MESH_SHAPE, (pg.size(),)))
            ddp.record_model(module, t_start, perf_counter_ns(), n.SPAN_FSDP_WRAP, attrs, gauges=False)
        except Exception as exc:
            health.error("fsdp", "could not record an FSDP1 wrap", exc)

    __init__.__wrapped__ = orig
    return __init__


def patches() -> list[Patch]:
    out: list[Patch] = []
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

        out += [
            Patch(FSDPParamGroup, "__init__", _wrap_group_init),
            Patch(FSDPParamGroup, "unshard", _wrap_group_method("unshard")),
            Patch(FSDPParamGroup, "post_backward", _wrap_group_method("reduce_scatter")),
        ]
    except ImportError:
        pass
    try:
        from torch.distributed.fsdp import _runtime_utils, _unshard_param_utils
        from torch.distributed.fsdp.fully_sharded_data_parallel import FullyShardedDataParallel

        out += [
            Patch(_runtime_utils, "_unshard", _wrap_runtime_fn("unshard")),
            # summon_full_params and full state dicts call the runtime's _unshard by the name they imported
            Patch(_unshard_param_utils, "_unshard", _wrap_runtime_fn("unshard", runtime=False)),
            Patch(_runtime_utils, "_reduce_grad", _wrap_runtime_fn("reduce_scatter")),
            Patch(FullyShardedDataParallel, "__init__", _wrap_fsdp1_init),
        ]
    except ImportError:
        pass
    return out
