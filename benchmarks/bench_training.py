"""Training-step overhead: DDP, FSDP2 and tensor parallel, plain vs instrumented vs the alternatives.

    python benchmarks/bench_training.py [--steps 30] [--rounds 15] [--nproc 2] [--pin]

Two gloo ranks on this machine train a small MLP. Each round runs every variant in turn, timing each of
``--steps`` steps after warm-up; a round's figure for a variant is its median step (a shared machine's
stalls hit single steps, not the median). The table gives, over rounds, the median, min and max of those
figures, and the overhead: the median over rounds of variant / plain within the same round, with the
middle half of those paired ratios, so the noise of the machine is on the page. An instrumented round
first runs the steps the default sampling traces in full (``trace_first_steps``, 10), so the rows show
the steady state of a long run (1 step in 100 traced); the DDP row "every step traced" shows what a
traced step costs. The plain DDP has no comm hook, as DDP runs unless told otherwise; since
``instrument()`` takes over hook-less DDPs built earlier, each round builds a fresh one and times it, and
the loops that use it (CommDebugMode, torch.profiler), before that round's first ``instrument()``.
"instrumented" is DDP with the default settings, which with the native part built (the benchmark builds it
when missing) records the reducer through the native process group, no comm hook; "instr. (comm hook)"
is the path without it (``native="off"``): the trampoline comm hook. "torch Python hook" is the same model
with torch's own ``default_hooks.allreduce_hook`` registered by hand, uninstrumented: the cost of any
Python comm hook, which the trampoline is (a comm hook also costs DDP a pass over each bucket: without one
the reducer scales the gradients while copying them in). For
DDP it also times the same loop under CommDebugMode and under torch.profiler (CPU activities), the tools
otel-torchdist is meant to replace, and reports how many times more they add. Each path ends its round
with "plain, again": the plain step timed once more (for DDP a fresh plain model, built after the round's
last ``uninstrument()``), whose "overhead" against the first is the machine's own noise floor.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn


STEADY = 11  # warm-up steps of an instrumented round: past the 10 the default sampling traces in full


def _mlp(width: int = 512) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 64))


def _fsdp_mlp() -> nn.Module:
    """The MLP with FSDP2 on each Linear and on the whole."""
    from torch.distributed.fsdp import fully_shard

    m = _mlp()
    for layer in (m[0], m[2], m[4]):
        fully_shard(layer)
    fully_shard(m)
    return m


def _time(step, steps: int, warmup: int = 3) -> tuple[float, float]:
    """The median of ``steps`` timed steps after ``warmup``, in ms: wall time, and the CPU time of the
    training thread (this one: forward, the CPU autograd engine's backward, comm hooks, optimizer)."""
    for _ in range(warmup):
        step()
    times, cpu = [], []
    clock, thread_clock = time.perf_counter, time.thread_time
    for _ in range(steps):
        start, start_cpu = clock(), thread_clock()
        step()
        cpu.append(thread_clock() - start_cpu)
        times.append(clock() - start)
    return statistics.median(times) * 1e3, statistics.median(cpu) * 1e3


def _worker(rank: int, nproc: int, port: int, args: argparse.Namespace, out: str) -> None:
    import otel_torchdist
    from torch.nn.parallel import DistributedDataParallel as DDP

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if args.pin and hasattr(os, "sched_setaffinity"):
        # The rank and every thread it starts (gloo's, ours) on one core: what they cost each other shows.
        os.sched_setaffinity(0, {rank % (os.cpu_count() or 1)})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=nproc)
    folder = tempfile.mkdtemp(prefix="otel-torchdist-bench-")
    options = dict(run_dir=folder, summary="none", prometheus_port=0)
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(rank))

    def train_step(model, opt):
        def step():
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()

        return step

    results: dict[str, dict[str, list[float]]] = {}

    # ---- DDP: the plain model is built uninstrumented, fresh each round; the instrumented one gets the bucket hook.
    import gc

    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    python_hook = DDP(_mlp())
    python_hook.register_comm_hook(None, allreduce_hook)
    python_hook_step = train_step(python_hook, torch.optim.SGD(python_hook.parameters(), lr=0.01))
    # Built instrumented without the native part, a model keeps the bucket trampoline (the reducer takes one
    # hook, for good); one built plain is given the native group under its reducer by each instrument().
    otel_torchdist.instrument(**options, native="off")
    hooked = DDP(_mlp())
    hooked_step = train_step(hooked, torch.optim.SGD(hooked.parameters(), lr=0.01))
    otel_torchdist.uninstrument()
    native_ddp = DDP(_mlp())
    native_step = train_step(native_ddp, torch.optim.SGD(native_ddp.parameters(), lr=0.01))
    rows = results["DDP"] = {
        "plain": [],
        "instrumented": [],
        "every step traced": [],
        "instr. (comm hook)": [],
        "torch Python hook": [],
        "CommDebugMode": [],
        "torch.profiler": [],
        "plain, again": [],
    }
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.profiler import ProfilerActivity, profile

    for _ in range(args.rounds):
        plain_ddp = plain_step = None
        gc.collect()  # the last round's plain model, adopted by instrument() since (DDP sits in reference cycles)
        plain_ddp = DDP(_mlp())
        plain_step = train_step(plain_ddp, torch.optim.SGD(plain_ddp.parameters(), lr=0.01))
        rows["plain"].append(_time(plain_step, args.steps))

        # One CommDebugMode per step: one across several forward/backward passes trips over its own
        # module stack (IndexError in _fw_set_module_hook).
        def debug_step():
            with CommDebugMode():
                plain_step()

        rows["CommDebugMode"].append(_time(debug_step, args.steps))
        with profile(activities=[ProfilerActivity.CPU]):
            rows["torch.profiler"].append(_time(plain_step, args.steps))
        rows["torch Python hook"].append(_time(python_hook_step, args.steps))
        otel_torchdist.instrument(**options)
        rows["instrumented"].append(_time(native_step, args.steps, STEADY))
        otel_torchdist.uninstrument()
        otel_torchdist.instrument(**options, trace_every_steps=1)
        rows["every step traced"].append(_time(native_step, args.steps))
        otel_torchdist.uninstrument()
        otel_torchdist.instrument(**options, native="off")
        rows["instr. (comm hook)"].append(_time(hooked_step, args.steps, STEADY))
        otel_torchdist.uninstrument()
        # The noise floor: plain against itself. A model of its own, built now: instrument(native="off") gave
        # the round's plain model the trampoline hook for good.
        again = DDP(_mlp())
        rows["plain, again"].append(_time(train_step(again, torch.optim.SGD(again.parameters(), lr=0.01)), args.steps))
        again = None

    # ---- FSDP2
    plain_fsdp = _fsdp_mlp()
    plain_step = train_step(plain_fsdp, torch.optim.SGD(plain_fsdp.parameters(), lr=0.01))
    rows = results["FSDP2"] = {"plain": [], "instrumented": [], "plain, again": []}
    for _ in range(args.rounds):
        rows["plain"].append(_time(plain_step, args.steps))
        otel_torchdist.instrument(**options)
        rows["instrumented"].append(_time(plain_step, args.steps, STEADY))
        otel_torchdist.uninstrument()
        rows["plain, again"].append(_time(plain_step, args.steps))

    # ---- tensor parallel
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (nproc,))

    class TP(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.up = nn.Linear(64, 512)
            self.down = nn.Linear(512, 64)

        def forward(self, inp):
            return self.down(torch.relu(self.up(inp)))

    plain_tp = parallelize_module(TP(), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    plain_step = train_step(plain_tp, torch.optim.SGD(plain_tp.parameters(), lr=0.01))
    otel_torchdist.instrument(**options)
    tracked_tp = parallelize_module(TP(), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    tracked_step = train_step(tracked_tp, torch.optim.SGD(tracked_tp.parameters(), lr=0.01))
    otel_torchdist.uninstrument()
    rows = results["TP"] = {"plain": [], "instrumented": [], "plain, again": []}
    from otel_torchdist.capture import context

    for _ in range(args.rounds):
        rows["plain"].append(_time(plain_step, args.steps))
        otel_torchdist.instrument(**options)
        # uninstrument() took the module hooks parallelize_module gave the model under instrument(); a job
        # instrumented once keeps them, so they go back on for the timing.
        context.TRACKER.track(tracked_tp)
        rows["instrumented"].append(_time(tracked_step, args.steps, STEADY))
        otel_torchdist.uninstrument()
        rows["plain, again"].append(_time(plain_step, args.steps))

    if rank == 0:
        with open(out, "w") as f:
            import json

            json.dump(results, f)
    dist.destroy_process_group()


def _table(path: str, rows: dict[str, list[float]], plain_wall: list[float] | None = None) -> None:
    """One path's rows: median, min, max over rounds, and the overhead paired with plain within rounds."""
    plain = rows["plain"]
    for variant, values in rows.items():
        line = f"{path:<8} {variant:<18} {statistics.median(values):10.3f} {min(values):8.3f} {max(values):8.3f}"
        if variant != "plain":
            ratios = [(v / b - 1) * 100 for v, b in zip(values, plain)]
            q1, _, q3 = statistics.quantiles(ratios, n=4)
            line += f" {statistics.median(ratios):+8.1f}%  {q1:+6.1f}..{q3:+5.1f}%"
            if plain_wall is not None:
                slowdown = statistics.median((v - b) / w * 100 for v, b, w in zip(values, plain, plain_wall))
                line += f"  {slowdown:+7.1f}%"
        print(line)


def _handoff_us(rounds: int = 2000) -> float:
    """One thread waking another and being woken back, in us: what a GIL hand-off to a backend thread
    (a Python comm hook's callback) costs on this machine."""
    import threading

    ping, pong = threading.Event(), threading.Event()

    def other():
        for _ in range(rounds):
            ping.wait()
            ping.clear()
            pong.set()

    thread = threading.Thread(target=other)
    thread.start()
    start = time.perf_counter()
    for _ in range(rounds):
        ping.set()
        pong.wait()
        pong.clear()
    thread.join()
    return (time.perf_counter() - start) / rounds * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="timed steps per round (default 30)")
    parser.add_argument("--rounds", type=int, default=15, help="rounds (default 15)")
    parser.add_argument("--nproc", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--pin", action="store_true", help="pin each rank, with all its threads, to one core")
    args = parser.parse_args(argv)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tempfile.mktemp(suffix=".json")
    from otel_torchdist import native

    native.load(build=True)  # the default path for DDP on gloo, once built (otel-torchdist build-native)
    mp.start_processes(_worker, args=(args.nproc, port, args, out), nprocs=args.nproc, start_method="spawn")
    import json

    results = json.load(open(out))
    print(f"# thread wake-up round trip on this machine: {_handoff_us():.0f} us")
    print(f"# {args.nproc} gloo ranks, MLP 64-512-512-64, batch 32, median of {args.steps} steps x {args.rounds} rounds")
    print(f"{'path':<8} {'variant':<18} {'median ms':>10} {'min':>8} {'max':>8} {'overhead':>9}  {'middle half':>15}")
    for path, rows in results.items():
        _table(path, {variant: [wall for wall, _ in values] for variant, values in rows.items()})
    print("# the training thread's CPU time per step (not waiting, not preempted), median ms; slowdown: the CPU")
    print("# time it added, paired within rounds, over the plain step's wall time (it runs on the step's critical path)")
    print(f"{'path':<8} {'variant':<18} {'median ms':>10} {'min':>8} {'max':>8} {'overhead':>9}  {'middle half':>15}  {'slowdown':>8}")
    for path, rows in results.items():
        _table(path, {variant: [c for _, c in values] for variant, values in rows.items()}, [w for w, _ in rows["plain"]])
    ddp = results["DDP"]

    def added(variant: str) -> float:  # ms per step of wall time, paired within rounds
        return statistics.median(v[0] - b[0] for v, b in zip(ddp[variant], ddp["plain"]))

    ours = added("instrumented")
    for tool in ("CommDebugMode", "torch.profiler"):
        theirs = added(tool)
        if ours <= 0:
            ratio = "otel-torchdist added nothing measurable"
        elif theirs <= 0:
            ratio = f"{tool} added nothing measurable: wall time here is noise at this size"
        else:
            ratio = f"{theirs / ours:.1f}x"
        print(f"added per DDP step: otel-torchdist {ours * 1e3:.0f} us, {tool} {theirs * 1e3:.0f} us ({ratio})")
    print(f"added per DDP step by any Python comm hook (torch's allreduce_hook): {added('torch Python hook') * 1e3:.0f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
