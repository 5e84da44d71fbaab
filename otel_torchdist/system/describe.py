"""The run's own description: what hardware and software this rank ran on, and how the job was laid out.

Two outputs. On the resource (asked for once, before export starts, so only what is known then):
``torchdist.node_count``, ``torchdist.cuda.version``, ``torchdist.nccl.version``, ``torchdist.gpu.count``
and, when this rank already uses a GPU, ``torchdist.gpu.models`` / ``torchdist.gpu.memory_bytes``. What
does not apply is left out (a CPU-only build has no CUDA version, a CPU rank no GPU attributes).

In the run folder, ``run-description.rank<R>.json``: everything above plus backend, world and local world
size, rank, local and node rank, host, process id, versions (torch, CUDA, NCCL, Python, NVIDIA driver),
the host's CPUs and memory, ``CUDA_VISIBLE_DEVICES``, each GPU this rank uses (NVML index, UUID, model,
PCI bus id, memory) and mixed precision once seen (autocast device and dtype, GradScaler class). Things
learned after start (a GPU first used, autocast entered) rewrite the file in place (atomically).

The node count comes from the launcher, in this order: ``GROUP_WORLD_SIZE`` (torchrun's node count),
``SLURM_STEP_NUM_NODES``, ``SLURM_NNODES``, else world size / ``LOCAL_WORLD_SIZE`` when that divides
evenly (every node runs as many ranks as this one); unknown otherwise, and then omitted.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from typing import Any

import torch

from .. import names as n
from ..export.sinks import write_json_whole
from .._version import __version__


def _int(environ: Mapping[str, str], name: str) -> int | None:
    try:
        value = int(environ.get(name, ""))
    except ValueError:
        return None
    return value if value > 0 else None


def node_count(environ: Mapping[str, str], world_size: int | None) -> int | None:
    for name in ("GROUP_WORLD_SIZE", "SLURM_STEP_NUM_NODES", "SLURM_NNODES"):
        count = _int(environ, name)
        if count is not None:
            return count
    world = world_size or _int(environ, "WORLD_SIZE")
    local = _int(environ, "LOCAL_WORLD_SIZE")
    if world and local and world % local == 0:
        return world // local
    return None


def nccl_version() -> str | None:
    if not torch.version.cuda:
        return None
    try:
        import torch.distributed as dist

        if not dist.is_nccl_available():
            return None
        version = torch.cuda.nccl.version()
    except Exception:
        return None
    return ".".join(str(x) for x in version) if isinstance(version, tuple) else str(version)


def resource_attributes(
    nodes: int | None, gpu_count: int, gpus: list[tuple[str, int]], cuda_version: str | None, nccl: str | None
) -> dict[str, Any]:
    """``gpus``: (model, total memory in bytes) of each GPU this rank uses."""
    attrs: dict[str, Any] = {}
    if nodes is not None:
        attrs[n.NODE_COUNT] = nodes
    if cuda_version:
        attrs[n.CUDA_VERSION] = cuda_version
    if nccl:
        attrs[n.NCCL_VERSION] = nccl
    if gpu_count > 0:
        attrs[n.GPU_COUNT] = gpu_count
    if gpus:
        attrs[n.GPU_MODELS] = [model for model, _ in gpus]
        attrs[n.GPU_MEMORY] = [int(memory) for _, memory in gpus]
    return attrs


def description(
    ident: Any,
    attributes: dict[str, Any],
    host: dict[str, Any],
    gpu_count: int,
    gpus: list[dict[str, Any]],
    driver: str | None,
    autocast: tuple[str, str] | None,
    scaler: str | None,
) -> dict[str, Any]:
    mixed = None
    if autocast is not None or scaler is not None:
        mixed = {
            "autocast_device": autocast[0] if autocast else None,
            "autocast_dtype": autocast[1] if autocast else None,
            "grad_scaler": scaler,
        }
    attrs = dict(attributes)
    if autocast is not None:
        attrs[n.AMP_DTYPE] = autocast[1]
    return {
        "run": ident.run_id,
        "rank": ident.rank,
        "local_rank": ident.local_rank,
        "node_rank": ident.node_rank,
        "world_size": ident.world_size,
        "local_world_size": ident.local_world_size,
        "node_count": attributes.get(n.NODE_COUNT),
        "backend": ident.backend,
        "host": ident.host,
        "pid": os.getpid(),
        "versions": {
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "nccl": attributes.get(n.NCCL_VERSION),
            "python": platform.python_version(),
            "nvidia_driver": driver,
            "otel_torchdist": __version__,
        },
        "host_resources": host,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "gpu_count": gpu_count,
        "gpus": gpus,
        "mixed_precision": mixed,
        "attributes": attrs,
    }


def write(folder: str, rank: int, doc: dict[str, Any]) -> str:
    path = os.path.join(folder, f"run-description.rank{rank}.json")
    write_json_whole(path, doc, indent=1)
    return path
