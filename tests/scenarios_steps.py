"""Steps, stragglers and hangs inside real gloo ranks."""

from __future__ import annotations

import datetime
import os
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

import otel_torchdist


def _instrument(out: str, run_id: str, **extra: Any) -> None:
    options = dict(
        run_dir=os.path.join(out, "runs"),
        run_id=run_id,
        traces_exporter="file",
        metrics_exporter=("file",),
        summary="none",
        drain_interval=0.05,
        system_metrics=False,
    )
    options.update(extra)
    otel_torchdist.instrument(**options)


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


def steps(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """Five DDP steps with user values; steps 1, 2 and 4 are traced (first 2, then every 2nd)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", rank=rank, world_size=ws)
    extra = args.get("extra", {})
    _instrument(out, args.get("run", f"steps-ws{ws}"), trace_first_steps=2, trace_every_steps=2, straggler_exchange_steps=0, **extra)
    model = DDP(_mlp())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    otel_torchdist.set_total_steps(20)
    fed = []
    for i in range(1, 6):
        x = torch.randn(32, 16)
        loss = model(x).square().mean()
        loss.backward()
        value = round(1.0 / i, 6)
        otel_torchdist.record_step(loss=value, learning_rate=0.05, samples=32, tokens=32 * 128)
        fed.append(value)
        opt.step()
        opt.zero_grad()
    # an evaluation loop without an optimizer, steps marked explicitly
    with torch.no_grad():
        for i in range(100, 103):
            with otel_torchdist.step(i):
                dist.all_reduce(torch.ones(8))
    otel_torchdist.uninstrument()
    dist.destroy_process_group()
    return {"fed_loss": fed}


def sampled_by_ratio(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """OTEL_TRACES_SAMPLER=traceidratio 0.5 over twelve explicit steps."""
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    os.environ["OTEL_TRACES_SAMPLER"] = "traceidratio"
    os.environ["OTEL_TRACES_SAMPLER_ARG"] = "0.5"
    _instrument(out, "ratio", straggler_exchange_steps=0)
    for i in range(1, 13):
        with otel_torchdist.step(i):
            dist.all_reduce(torch.ones(4))
    otel_torchdist.uninstrument()
    dist.destroy_process_group()
    return {}


def _wait_for_windows(count: int, timeout: float = 60) -> int:
    from otel_torchdist import runtime

    exchange = runtime.current().exchange
    deadline = time.monotonic() + timeout
    while exchange.completed < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return exchange.completed


def _gauges() -> dict:
    from otel_torchdist import names as n
    from otel_torchdist import runtime

    fw = runtime.current().pipeline.framework
    return {"slowest": fw.get(n.STRAGGLER_SLOWEST, ()), "score": fw.get(n.STRAGGLER_SCORE, ())}


def stragglers(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """Phase 1: DDP, rank args.ddp_slow computes longer before backward. Phase 2: a plain loop, rank
    args.plain_slow is late to an all_reduce. Ten steps each; the ranks swap times every ten steps."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", rank=rank, world_size=ws)
    verdicts: list = []
    otel_torchdist.on("straggler", lambda e: verdicts.append({"rank": e.rank, "slowest": e.slowest_rank, "score": e.score, "window": e.window}))
    _instrument(out, f"stragglers-ws{ws}", straggler_exchange_steps=10)
    # 200 ms: on a loaded 2-core machine running 3 ranks, CPU contention alone moves a rank by 10-30 ms a step
    delay = args.get("delay", 0.2)
    model = DDP(_mlp())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(10):
        out_ = model(torch.randn(8, 16))
        if rank == args["ddp_slow"]:
            time.sleep(delay)  # extra compute before backward: DDP's all-reduce makes everyone wait
        out_.sum().backward()
        opt.step()
        opt.zero_grad()
    done = _wait_for_windows(1)
    phase1 = {**_gauges(), "windows": done}
    # Done with this optimizer: the next one leads the steps from its first step. (With both alive, the
    # second would take over at its second step, the phase change costing one step boundary.)
    del opt
    plain = _mlp()
    opt2 = torch.optim.SGD(plain.parameters(), lr=0.01)
    for _ in range(10):
        plain(torch.randn(8, 16)).sum().backward()
        if rank == args["plain_slow"]:
            time.sleep(delay)
        for p in plain.parameters():
            dist.all_reduce(p.grad)
        opt2.step()
        opt2.zero_grad()
    done = _wait_for_windows(2)
    phase2 = {**_gauges(), "windows": done}
    otel_torchdist.uninstrument()
    dist.destroy_process_group()
    time.sleep(0.2)  # the callbacks run on the dispatcher's thread
    return {"ddp": phase1, "plain": phase2, "verdicts": verdicts}


def hang(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """Rank 0 skips an all_reduce; the others wait in it until gloo's timeout."""
    dist.init_process_group("gloo", rank=rank, world_size=ws, timeout=datetime.timedelta(seconds=args["timeout"]))
    _instrument(
        out,
        f"hang-ws{ws}",
        hang_threshold=args["threshold"],
        metric_export_interval=0.5,
        span_schedule_delay=0.5,
        straggler_exchange_steps=0,
    )
    dist.all_reduce(torch.ones(4))
    dist.all_reduce(torch.ones(4))
    result: dict = {}
    if rank == 0:
        time.sleep(args["timeout"] + 2)  # skip it, and stay away until the others have given up
    else:
        t0 = time.monotonic()
        try:
            dist.all_reduce(torch.ones(4))
        except RuntimeError as exc:
            result["raised_after"] = time.monotonic() - t0
            result["error"] = str(exc)[:200]
        # What left this process while it was stuck: the traces file as it stood when the call gave up.
        path = os.path.join(out, "runs", f"hang-ws{ws}", f"traces.rank{rank}.jsonl")
        result["traces_while_stuck"] = open(path).read() if os.path.exists(path) else ""
    otel_torchdist.uninstrument()
    dist.destroy_process_group()
    return result


def ddp_hang(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """DDP recorded by the native group: rank 0 stops after two steps; the others' next backward waits in
    its bucket's all-reduce, issued by DDP's reducer in C++, until gloo's timeout."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from otel_torchdist.capture import ddp_native

    dist.init_process_group("gloo", rank=rank, world_size=ws, timeout=datetime.timedelta(seconds=args["timeout"]))
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(rank))
    # The same hang uninstrumented first, on a group of its own with a short timeout: what training sees.
    short = dist.new_group(list(range(ws)), timeout=datetime.timedelta(seconds=2))
    reference = DDP(_mlp(), process_group=short)
    for _ in range(2):
        reference(x).square().mean().backward()
    uninstrumented_error = None
    if rank == 0:
        time.sleep(2 + 1)
    else:
        try:
            reference(x).square().mean().backward()
        except Exception as exc:
            uninstrumented_error = f"{type(exc).__name__}: {str(exc)[:300]}"
    dist.barrier()
    _instrument(out, f"ddp-hang-ws{ws}", native="auto", hang_threshold=args["threshold"], span_schedule_delay=0.5,
                metric_export_interval=0.5, straggler_exchange_steps=0)  # fmt: skip
    model = DDP(_mlp())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    result: dict = {"attached": ddp_native.is_attached(model), "uninstrumented_error": uninstrumented_error}
    for _ in range(2):  # the second forward rebuilds the buckets (the reducer's broadcasts)
        model(x).square().mean().backward()
        opt.step()
    if rank == 0:
        time.sleep(args["timeout"] + 2)  # skip the next step, and stay away until the others have given up
    else:
        t0 = time.monotonic()
        try:
            model(x).square().mean().backward()
        except RuntimeError as exc:
            result["raised_after"] = time.monotonic() - t0
            result["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        path = os.path.join(out, "runs", f"ddp-hang-ws{ws}", f"traces.rank{rank}.jsonl")
        result["traces_while_stuck"] = open(path).read() if os.path.exists(path) else ""
    otel_torchdist.uninstrument()
    dist.destroy_process_group()
    return result


def numbering(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """Every way a program numbers its steps, one after another, every step traced: set-up (implicit step 1),
    explicit 0-based steps, an epoch numbered again from 0, evaluation steps between, then 1-based steps."""
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    _instrument(out, "numbering", trace_first_steps=100, trace_every_steps=1, straggler_exchange_steps=0)
    dist.all_reduce(torch.ones(4))  # before the loop: the set-up step
    plan = [("train", range(0, 3)), ("eval", range(0, 2)), ("train", range(0, 3)), ("train", range(1, 4))]
    for _kind, numbers in plan:
        for i in numbers:
            with otel_torchdist.step(i):
                dist.all_reduce(torch.ones(8))
    otel_torchdist.uninstrument()
    dist.destroy_process_group()
    return {"steps": sum(len(r) for _, r in plan)}


def send_overlapping_compute(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """Rank 0 posts an isend, computes 0.3 s, then waits; rank 1 receives at once, then computes 0.1 s: gloo's
    send completes only at wait(), yet rank 0 was blocked for a moment only (a pipeline stage's sends)."""
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    traced = args["traced"]  # untraced: the native part's metric fold takes the records
    _instrument(out, f"overlap-{traced}", trace_first_steps=10 * traced, trace_every_steps=traced, straggler_exchange_steps=0)
    blocked = 0.0
    for i in range(1, 4):
        with otel_torchdist.step(i):
            t = torch.ones(1024)
            if rank == 0:
                work = dist.isend(t, 1)
                time.sleep(0.3)
                t0 = time.perf_counter()
                work.wait()
            else:
                t0 = time.perf_counter()
                dist.irecv(t, 0).wait()
            blocked += time.perf_counter() - t0
            if rank == 1:
                time.sleep(0.1)
    otel_torchdist.uninstrument()
    dist.destroy_process_group()
    return {"blocked": blocked}


def reinit(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """destroy_process_group(), then a new process group (on a store of its own port): the threads that talk
    to the store stop with the first and start again with the second."""
    import threading

    import logging

    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    logging.getLogger("otel_torchdist").addHandler(handler)
    _instrument(out, f"reinit-ws{ws}", hang_threshold=30.0, straggler_exchange_steps=5)
    threads = []
    for again, init_method in enumerate((None, f"tcp://127.0.0.1:{port + 1}")):
        me = ws - 1 - rank if again and args.get("swap") else rank  # the second world numbers the ranks the other way
        dist.init_process_group("gloo", rank=me, world_size=ws, **({"init_method": init_method} if init_method else {}))
        dist.all_reduce(torch.ones(4))
        threads.append(sorted(t.name for t in threading.enumerate() if t.name.startswith("otel-torchdist")))
        dist.destroy_process_group()
    otel_torchdist.uninstrument()
    return {"threads": threads, "said": said}


def user_span_steps(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """Explicit steps inside a span of the program's own (an SDK TracerProvider): each rank's step is a child
    of its own iteration span, in that span's trace."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    trace.set_tracer_provider(TracerProvider())
    tracer = trace.get_tracer("user")
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    _instrument(out, "user-span-steps")
    for s in range(1, 5):
        with tracer.start_as_current_span("my_iteration"), otel_torchdist.step(s):
            dist.all_reduce(torch.ones(64))
    otel_torchdist.uninstrument()
    dist.destroy_process_group()
    return {}
