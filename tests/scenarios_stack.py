"""The training behind tests/test_stack_metrics.py: the demo's three models (DDP, FSDP2, tensor parallel) one
step each per iteration, paced, for as long as the test needs a steady run, configured only through the
standard variables the test sets (the OTLP endpoint, protocol and metric export interval), as a user's job is.

Rank 1 straggles a little every iteration (the straggler rules must name it) and, once, 60 s in, arrives
2.5 s late at a barrier (a hang past the 1 s threshold: the hang panels and rule must see it). The loop ends
when ``args["control"]/stop`` exists or after ``max_seconds``.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist


def training(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset

    import otel_torchdist
    from otel_torchdist.demo import _build

    otel_torchdist.instrument(
        run_dir=os.path.join(out, "runs"), run_id=args["run_id"], summary="none", prometheus_host="127.0.0.1",
        prometheus_port=0, hang_threshold=1.0, **args.get("options", {}),
    )  # fmt: skip
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    pair = dist.new_group(list(range(ws)))  # a second process group, so the dashboards see two groups
    models = [(name, *_build(name, torch.device("cpu"), ws)) for name in ("ddp", "fsdp", "tp")]
    gen = torch.Generator().manual_seed(100 + rank)
    # DDP's batches come from a DataLoader (the data-loader wait panel reads its fetches)
    loader = DataLoader(TensorDataset(torch.randn(256, 64, generator=gen), torch.randn(256, 8, generator=gen)), batch_size=16)
    batches = iter(loader)
    otel_torchdist.set_total_steps(1_000_000)
    control = args["control"]
    started = time.monotonic()
    deadline = started + args["max_seconds"]
    iterations, hung = 0, False
    while True:
        # Both decisions are taken together: a rank that went into the hang's barrier on its own clock while
        # the other ran one more all_reduce deadlocked the two (gloo matches collectives by order, not kind).
        flags = torch.tensor([float(os.path.exists(os.path.join(control, "stop")) or time.monotonic() > deadline),
                              float(time.monotonic() - started > 60)])  # fmt: skip
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        if flags[0].item() > 0:
            break
        if not hung and flags[1].item() > 0:
            hung = True
            if rank == 1:
                time.sleep(2.5)
            dist.barrier()
        if rank == 1:
            time.sleep(args["straggle_s"])
        for name, net, opt, same_batch in models:
            if name == "ddp":
                x, y = next(batches, (None, None))
                if x is None:
                    batches = iter(loader)
                    x, y = next(batches)
            else:
                g = torch.Generator().manual_seed(iterations) if same_batch else gen
                x, y = torch.randn(16, 64, generator=g), torch.randn(16, 8, generator=g)
            loss = nn.functional.mse_loss(net(x), y)
            opt.zero_grad()
            loss.backward()
            if name == "ddp":
                otel_torchdist.record_step(loss=loss.item(), learning_rate=opt.param_groups[0]["lr"], samples=len(x), tokens=len(x) * 64)
            opt.step()
        # Every iteration: the panels' p99 of these ops over a 20 s window is then a quantile of ~100 calls,
        # not the slowest of the ~25 a call every 5 iterations gave (one slow call moved it 3x).
        gathered = torch.empty(2 * ws)
        dist.all_gather_single(gathered, torch.tensor([loss.item(), float(iterations)]))
        dist.broadcast(torch.ones(512), src=0, group=pair)
        iterations += 1
        time.sleep(args["pace_s"])
    dist.barrier()
    otel_torchdist.uninstrument()
    dist.destroy_process_group()
    return {"iterations": iterations, "hung": hung}
