"""A small multi-rank training, instrumented: the project's main job and its first demonstration.

``otel-torchdist demo`` starts ``--nproc`` ranks on this machine (gloo on CPU, NCCL when there is a GPU per
rank) and trains small MLPs the ways distributed training usually does, each with its optimizer and the
collectives a training loop adds (a loss all-reduce for logging, a metrics all-gather every 5 steps):

* ``ddp``: DistributedDataParallel (parameter broadcast at start, gradient buckets all-reduced in
  backward), SGD;
* ``fsdp``: FSDP2, ``fully_shard`` on each linear layer and the root (all-gathers in forward and backward,
  reduce-scatters in backward), Adam;
* ``tp``: tensor parallel, ``ColwiseParallel`` / ``RowwiseParallel`` on a 1-D device mesh (functional
  collectives through DTensor), AdamW;
* ``all``: the three in sequence, in the same run (steps are numbered on across them).

Every step is traced (the demo is short) unless ``OTEL_TRACES_SAMPLER`` or the
``OTEL_TORCHDIST_TRACE_*`` variables choose otherwise. Telemetry goes to the configured OTLP endpoint,
else to the run folder; with an endpoint, metrics are also written to the run folder so the closing
analysis has complete numbers. The demo ends with :mod:`otel_torchdist.analysis`'s summary of the run
folder and where everything went.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch

MODELS = ("ddp", "fsdp", "tp")
CHOICES = MODELS + ("all",)
TITLES = {"ddp": "DDP", "fsdp": "FSDP2", "tp": "tensor parallel"}
_SAMPLING_ENV = ("OTEL_TRACES_SAMPLER", "OTEL_TORCHDIST_TRACE_FIRST_STEPS", "OTEL_TORCHDIST_TRACE_EVERY_STEPS")
_ENDPOINT_ENV = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
)


@dataclass(frozen=True, kw_only=True)
class DemoArgs:
    nproc: int = 2
    """Ranks to start on this machine."""
    steps: int = 20
    """Training steps per model."""
    model: str = "all"
    """``ddp``, ``fsdp``, ``tp`` or ``all`` (the three in sequence, in one run)."""
    run_dir: str = "otel-torchdist-runs"
    """Root of the run folders."""
    backend: str | None = None
    """``gloo`` or ``nccl``; None picks NCCL when every rank has a GPU."""


def models_of(choice: str) -> tuple[str, ...]:
    if choice == "all":
        return MODELS
    if choice not in MODELS:
        raise ValueError(f"--model must be one of {', '.join(CHOICES)}, got {choice!r}")
    return (choice,)


def describe(choice: str) -> str:
    names = [TITLES[m] for m in models_of(choice)]
    if len(names) == 1:
        return f"a {names[0]}-trained MLP"
    return "MLPs trained with " + ", ".join(names[:-1]) + " and " + names[-1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pick_backend(nproc: int) -> str:
    if torch.cuda.is_available() and torch.cuda.device_count() >= nproc:
        return "nccl"
    return "gloo"


def _progress(label: str, step: int, total: int, loss: float, started: float) -> None:
    width = 30
    done = int(width * step / total)
    rate = step / max(time.monotonic() - started, 1e-9)
    line = f"  {label:<5} [{'#' * done}{'.' * (width - done)}] step {step}/{total}  loss {loss:.4f}  {rate:.1f} steps/s"
    if sys.stderr.isatty():
        sys.stderr.write("\r" + line + ("\n" if step == total else ""))
    elif step == total or step % max(total // 4, 1) == 0:
        sys.stderr.write(line + "\n")  # a log file gets a few whole lines, not a wall of carriage returns
    sys.stderr.flush()


def _mlp(device: torch.device) -> torch.nn.Module:
    import torch.nn as nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8)).to(device)


class TPMLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net1 = torch.nn.Linear(64, 256)
        self.relu = torch.nn.ReLU()
        self.net2 = torch.nn.Linear(256, 8)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def _build(model: str, device: torch.device, nproc: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, bool]:
    """(model, optimizer, whether every rank must see the same batch)."""
    if model == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = DDP(_mlp(device), bucket_cap_mb=0.1)
        return ddp, torch.optim.SGD(ddp.parameters(), lr=0.05), False
    from torch.distributed.device_mesh import init_device_mesh

    if model == "fsdp":
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device.type, (nproc,), mesh_dim_names=("dp",))
        net = _mlp(device)
        for layer in (net[0], net[2], net[4]):
            fully_shard(layer, mesh=mesh)
        fully_shard(net, mesh=mesh)
        return net, torch.optim.Adam(net.parameters(), lr=0.01), False
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh(device.type, (nproc,), mesh_dim_names=("tp",))
    net = parallelize_module(TPMLP().to(device), mesh, {"net1": ColwiseParallel(), "net2": RowwiseParallel()})
    # Tensor parallel: every rank of the mesh works on the same batch.
    return net, torch.optim.AdamW(net.parameters(), lr=0.01), True


def _train(model: str, rank: int, args: DemoArgs, device: torch.device, first_step: int) -> None:
    import torch.distributed as dist
    import torch.nn as nn

    net, opt, same_batch = _build(model, device, args.nproc)
    gen = torch.Generator().manual_seed(1000 if same_batch else 1000 + rank)
    started = time.monotonic()
    for step in range(1, args.steps + 1):
        x = torch.randn(32, 64, generator=gen).to(device)
        y = torch.randn(32, 8, generator=gen).to(device)
        loss = nn.functional.mse_loss(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        avg = loss.detach().clone()
        dist.all_reduce(avg)  # the usual "mean loss across ranks" for logging
        avg /= args.nproc
        if (first_step + step) % 5 == 0:
            stats = torch.tensor([loss.item(), float(step)], device=device)
            gathered = torch.empty(2 * args.nproc, device=device)
            dist.all_gather_single(gathered, stats)
        if rank == 0:
            _progress(model, step, args.steps, avg.item(), started)


def worker(rank: int, args: DemoArgs, port: int, backend: str, options: dict[str, Any]) -> None:
    import torch.distributed as dist

    import otel_torchdist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank))
    os.environ["WORLD_SIZE"] = str(args.nproc)
    os.environ["LOCAL_WORLD_SIZE"] = str(args.nproc)
    otel_torchdist.instrument(run_dir=args.run_dir, **options)
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=args.nproc, device_id=device if device.type == "cuda" else None)
    for i, model in enumerate(models_of(args.model)):
        _train(model, rank, args, device, i * args.steps)
    dist.barrier()
    otel_torchdist.uninstrument()  # flush every rank's files before the parent reads them
    dist.destroy_process_group()


def instrument_options(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """The demo's keyword options to ``instrument()``; the environment still decides what they leave open."""
    env = os.environ if environ is None else environ
    options: dict[str, Any] = {"summary": "none"}  # the demo prints the analysis of every rank instead
    if not any(env.get(v) for v in _SAMPLING_ENV):
        options["trace_every_steps"] = 1  # a short run: trace every step
    if any(env.get(v) for v in _ENDPOINT_ENV) and not env.get("OTEL_METRICS_EXPORTER"):
        # Metrics to the collector and, complete, to the run folder for the closing analysis (even with the
        # run folder's copy turned off).
        options["metrics_exporter"] = ("otlp", "file", "prometheus")
    return options


def run(args: DemoArgs) -> str:
    """Run the demo; returns the run folder."""
    import torch.multiprocessing as mp

    from .identity import new_run_id

    models_of(args.model)
    backend = args.backend or pick_backend(args.nproc)
    if backend == "nccl" and (not torch.cuda.is_available() or torch.cuda.device_count() < args.nproc):
        raise ValueError(f"--backend nccl needs a GPU per rank: --nproc {args.nproc}, GPUs: {torch.cuda.device_count()}")
    run_id = os.environ.get("OTEL_TORCHDIST_RUN_ID") or new_run_id()
    os.environ["OTEL_TORCHDIST_RUN_ID"] = run_id
    os.environ.setdefault("OTEL_METRIC_EXPORT_INTERVAL", "5000")
    port = _free_port()
    each = " each" if args.model == "all" else ""
    folder = os.path.abspath(os.path.join(args.run_dir, run_id))
    options = instrument_options()
    print(
        f"otel-torchdist demo: {args.nproc} rank{'s' if args.nproc != 1 else ''}, {backend}, {args.steps} steps{each} of {describe(args.model)} "
        f"(run {run_id})\n  {destinations(folder, options)}",
        file=sys.stderr,
        flush=True,
    )
    mp.spawn(worker, args=(args, port, backend, options), nprocs=args.nproc, join=True)
    _report(folder, args.nproc, options)
    return folder


def destinations(folder: str, options: dict[str, Any]) -> str:
    """Where the ranks' traces and metrics go, as the configuration (environment and ``options``) says, the
    run folder's copy (``run_folder_copy``) included, as the exporters are built (export/sinks.py)."""
    from . import config

    cfg = config.load({k: v for k, v in options.items() if k in config.OPTION_NAMES})
    where = []
    for signal, exporters in (
        ("traces", cfg.with_run_folder_copy(cfg.resolved_traces_exporter())),
        ("metrics", cfg.with_run_folder_copy(cfg.resolved_metrics_exporters())),
    ):
        parts = []
        for exporter in exporters:
            if exporter == "otlp":
                protocol = getattr(cfg, f"{signal}_protocol") or cfg.protocol
                parts.append(f"OTLP ({protocol}) to {getattr(cfg, f'{signal}_endpoint') or cfg.endpoint}")
            elif exporter == "file":
                parts.append(f"OTLP/JSON lines in {folder}")
            elif exporter == "prometheus":
                port = f"port {cfg.prometheus_port} + local rank" if cfg.prometheus_port else "a free port each"
                parts.append(f"Prometheus /metrics on every rank ({port})")
            else:
                parts.append(exporter)
        where.append(f"{signal}: " + (", ".join(parts) or "none"))
    return "; ".join(where)


def _report(folder: str, nproc: int, options: dict[str, Any]) -> None:
    """The analysis of every rank's files, then where everything went."""
    from .analysis import analyze_path, render_text
    from .analysis.loader import RunNotFound

    print("", file=sys.stderr)
    try:
        report = analyze_path(folder)
    except RunNotFound as exc:
        print(f"otel-torchdist summary: no telemetry in the run folder ({exc})", file=sys.stderr)
    else:
        print(render_text.summary(report), file=sys.stderr)
    print("", file=sys.stderr)
    print(f"Where it went: {destinations(folder, options)}", file=sys.stderr)
    if os.path.isdir(folder):
        print(f"Telemetry of every rank is in {folder}:", file=sys.stderr)
        for name in sorted(os.listdir(folder)):
            print(f"  {name}  ({os.path.getsize(os.path.join(folder, name))} bytes)", file=sys.stderr)
        targets = _prometheus_targets(folder, nproc)
        if targets:
            print(f"While it ran, each rank served Prometheus /metrics: {', '.join(targets)}", file=sys.stderr)
    print(
        "Next: otel-torchdist analyze RUN (every table), plot RUN -o DIR (charts), export RUN --perfetto out.json\n"
        "(ui.perfetto.dev); open a traces.rank*.jsonl file in Jaeger's UI (Search > Upload JSON), or send the next\n"
        "run to a stack: OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318 otel-torchdist demo (see deploy/README.md in the project's source)",
        file=sys.stderr,
    )


def _prometheus_targets(folder: str, nproc: int) -> list[str]:
    import json

    out = []
    for rank in range(nproc):
        path = os.path.join(folder, f"prometheus-targets.rank{rank}.json")
        try:
            with open(path) as f:
                for entry in json.load(f):
                    out.extend(f"http://{t}/metrics" for t in entry.get("targets", ()))
        except (OSError, ValueError, AttributeError, TypeError):
            continue
    return out
