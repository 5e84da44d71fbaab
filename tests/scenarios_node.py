"""Ranks of two simulated nodes (ranks 0-1 on ``node-a``, 2-3 on ``node-b``) exporting metrics per node."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

ALL_REDUCES = 7
BROADCASTS = 3
STEPS = 4


def node_metrics(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """Known collectives and steps, then keep /metrics up until the test drops ``args["go"]`` (120 s at most)."""
    import otel_torchdist

    per_node = ws // 2
    # One machine standing in for two: the launcher's LOCAL_RANK is the global rank, the node name is given.
    os.environ["LOCAL_RANK"] = str(rank % per_node)
    os.environ["LOCAL_WORLD_SIZE"] = str(per_node)
    otel_torchdist.instrument(
        run_dir=os.path.join(out, "runs"),
        run_id=args["run_id"],
        metrics_exporter=("file", "prometheus"),
        metrics_aggregation="node",
        node_name="node-a" if rank < per_node else "node-b",
        node_metrics_interval=0.2,
        traces_exporter="file",
        prometheus_host="127.0.0.1",
        prometheus_port=0,
        system_metrics=False,
        summary="none",
        drain_interval=0.05,
    )
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    for i in range(STEPS):
        with otel_torchdist.step(i + 1):
            otel_torchdist.record_step(loss=float(rank), tokens=100 * (rank + 1))
    for _ in range(ALL_REDUCES):
        dist.all_reduce(torch.ones(1024))
    for _ in range(BROADCASTS):
        dist.broadcast(torch.ones(256), src=0)
    otel_torchdist.flush(10)
    deadline = time.monotonic() + 120
    while not os.path.exists(args["go"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    dist.barrier()  # every rank has been scraped before any ends
    otel_torchdist.uninstrument()
    dist.destroy_process_group()
    return {}
