"""System-telemetry scenarios that run inside each rank of a real gloo job (``tests/launcher.py``).

Each returns what the rank knows independently of otel_torchdist (its host, pid, how many batches it
drew, GradScaler's own ``get_scale()``) so the test can compare the exported telemetry with it.
"""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .scenarios import _instrument

EPOCHS = 2
SAMPLES = 50
BATCH = 8  # 7 batches an epoch, the last one short


def _patch_sites():
    from torch.amp import autocast_mode, grad_scaler
    from torch.utils.data import dataloader

    return [
        (dataloader._BaseDataLoaderIter, "__next__"),
        (grad_scaler.GradScaler, "update"),
        (autocast_mode.autocast, "__enter__"),
    ]


def ddp_amp_training(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """A DDP-wrapped model trained under CPU autocast (bfloat16) with a GradScaler, fed by a DataLoader."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset

    import otel_torchdist

    sites = _patch_sites()
    before = [owner.__dict__[name] for owner, name in sites]
    _instrument(out, rank, run_id=args["run_id"], system_interval=0.05)
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    patched = [owner.__dict__[name] is not original for (owner, name), original in zip(sites, before)]

    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=3)
    loader = DataLoader(TensorDataset(torch.randn(SAMPLES, 8), torch.randn(SAMPLES, 4)), batch_size=BATCH)
    batches = 0
    for _ in range(EPOCHS):
        for x, y in loader:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.mse_loss(model(x).float(), y)
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            batches += 1
    scale = scaler.get_scale()

    otel_torchdist.uninstrument()
    restored = [owner.__dict__[name] is original for (owner, name), original in zip(sites, before)]
    dist.destroy_process_group()
    return {
        "batches": batches,
        "scale": scale,
        "patched": patched,
        "restored": restored,
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }
