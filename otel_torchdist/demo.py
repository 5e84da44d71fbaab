"""A small multi-rank training, instrumented: the project's main job and its first demonstration.

``otel-torchdist demo`` starts ``--nproc`` ranks on this machine (gloo on CPU, NCCL when there is a GPU per
rank), trains a small MLP with DistributedDataParallel plus the collectives a training loop usually adds
(a loss all-reduce, a metrics all-gather, a parameter broadcast at start), and ends with each rank's
telemetry in the run folder and rank 0's summary on the terminal.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DemoArgs:
    nproc: int = 2
    steps: int = 20
    model: str = "ddp"
    run_dir: str = "otel-torchdist-runs"
    backend: str | None = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pick_backend(nproc: int) -> str:
    if torch.cuda.is_available() and torch.cuda.device_count() >= nproc:
        return "nccl"
    return "gloo"


def _progress(step: int, total: int, loss: float, started: float) -> None:
    width = 30
    done = int(width * step / total)
    rate = step / max(time.monotonic() - started, 1e-9)
    line = f"  [{'#' * done}{'.' * (width - done)}] step {step}/{total}  loss {loss:.4f}  {rate:.1f} steps/s"
    if sys.stderr.isatty():
        sys.stderr.write("\r" + line + ("\n" if step == total else ""))
    elif step == total or step % max(total // 4, 1) == 0:
        sys.stderr.write(line + "\n")  # a log file gets a few whole lines, not a wall of carriage returns
    sys.stderr.flush()


def worker(rank: int, args: DemoArgs, port: int, backend: str) -> None:
    import torch.distributed as dist
    import torch.nn as nn

    import otel_torchdist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank))
    os.environ["WORLD_SIZE"] = str(args.nproc)
    otel_torchdist.instrument(run_dir=args.run_dir)
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=args.nproc)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8)).to(device)
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1000 + rank)
    started = time.monotonic()
    for step in range(1, args.steps + 1):
        x = torch.randn(32, 64, generator=gen).to(device)
        y = torch.randn(32, 8, generator=gen).to(device)
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        avg = loss.detach().clone()
        dist.all_reduce(avg)  # the usual "mean loss across ranks" for logging
        avg /= args.nproc
        if step % 5 == 0:
            stats = torch.tensor([loss.item(), float(step)], device=device)
            gathered = torch.empty(2 * args.nproc, device=device)
            dist.all_gather_single(gathered, stats)
        if rank == 0:
            _progress(step, args.steps, avg.item(), started)
    dist.barrier()
    dist.destroy_process_group()


def run(args: DemoArgs) -> str:
    """Run the demo; returns the run folder."""
    import torch.multiprocessing as mp

    from .identity import new_run_id

    backend = args.backend or pick_backend(args.nproc)
    run_id = os.environ.get("OTEL_TORCHDIST_RUN_ID") or new_run_id()
    os.environ["OTEL_TORCHDIST_RUN_ID"] = run_id
    os.environ.setdefault("OTEL_METRIC_EXPORT_INTERVAL", "5000")
    port = _free_port()
    print(
        f"otel-torchdist demo: {args.nproc} ranks, {backend}, {args.steps} steps of a DDP-trained MLP (run {run_id})",
        file=sys.stderr,
        flush=True,
    )
    mp.spawn(worker, args=(args, port, backend), nprocs=args.nproc, join=True)
    folder = os.path.abspath(os.path.join(args.run_dir, run_id))
    if os.path.isdir(folder):
        files = sorted(os.listdir(folder))
        print(f"\nTelemetry of every rank is in {folder}:", file=sys.stderr)
        for name in files:
            print(f"  {name}  ({os.path.getsize(os.path.join(folder, name))} bytes)", file=sys.stderr)
        print(
            "Open a traces.rank*.jsonl file in Jaeger's UI (Search > Upload JSON), or send the next run to a stack:\n"
            "  OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318 otel-torchdist demo   (see deploy/README.md)",
            file=sys.stderr,
        )
    return folder
