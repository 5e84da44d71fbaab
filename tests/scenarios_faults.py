"""Process-side faults inside real ranks: failures, signals, collective errors, threads, long runs.

Spawned by ``tests/launcher.py`` (``scenarios_faults:NAME``), except ``torchrun_job``, which torchrun starts
itself: ``torchrun ... -m tests.scenarios_faults OUT MODE``.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import sys
import threading
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

import otel_torchdist


def _instrument(out: str, run_id: str | None, **extra: Any) -> None:
    options = dict(
        run_dir=os.path.join(out, "runs"),
        traces_exporter="file",
        metrics_exporter=("file",),
        summary="none",
        drain_interval=0.05,
        system_metrics=False,
        straggler_exchange_steps=0,
        trace_every_steps=1,
    )
    if run_id is not None:
        options["run_id"] = run_id
    options.update(extra)
    otel_torchdist.instrument(**options)


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


def _error(exc: BaseException) -> list[str]:
    # gloo's C++ checks put a timestamp in the message: compare what follows it.
    return [type(exc).__name__, re.sub(r"\[rank\d+\]:\[\w\d+ [\d:.]+ ", "[...]", str(exc))]


# ------------------------------------------------------------------------------------------ torchrun
def torchrun_job(out: str, mode: str) -> None:
    """``fail``: DDP training; on the first attempt rank 1 raises in step 3 (torchrun stops rank 0 with
    SIGTERM while it waits in that step's all-reduce, then restarts both). ``stuck``: rank 1 waits in an
    all_reduce rank 0 never joins, until the test sends torchrun SIGTERM."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    # The agent's store keeps attempt 0's gloo addresses under the same keys, and a restarted rank can
    # read a dead peer's (torch 2.13, gloo, --max-restarts): a prefix per attempt keeps them apart.
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    base = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=not agent_store and rank == 0
    )
    dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt{attempt}", base), rank=rank, world_size=world)
    _instrument(out, None, flush_timeout=3.0)
    marker = os.path.join(out, f"started.rank{rank}.attempt{attempt}")
    if mode == "stuck":
        for _ in range(2):
            dist.all_reduce(torch.ones(4))
        open(marker, "w").close()
        if rank == 0:
            time.sleep(120)  # in Python: the signal handler runs here
        else:
            dist.all_reduce(torch.ones(4))  # in C++ until gloo's 30 min timeout
        return
    model = DDP(_mlp())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    open(marker, "w").close()
    for step in range(1, 6):
        out_ = model(torch.randn(8, 16))
        if attempt == 0 and rank == 1 and step == 3:
            raise ValueError("planted failure on rank 1 at step 3")
        out_.sum().backward()
        opt.step()
        opt.zero_grad()
    with open(os.path.join(out, f"done.rank{rank}.attempt{attempt}"), "w") as f:
        json.dump({"steps": 5}, f)
    otel_torchdist.uninstrument()
    dist.destroy_process_group()


# --------------------------------------------------------------------------------- collective errors
def collective_errors(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """Each bad call made twice, uninstrumented then instrumented: the exceptions must be the same."""
    bad_calls = {
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(torch.zeros(3), torch.ones(2)),
        "all_gather": lambda: dist.all_gather([torch.zeros(2)], torch.ones(2)),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(torch.zeros(3), torch.ones(2)),
    }
    plain: dict[str, list[str]] = {}
    seen: dict[str, list[str]] = {}
    try:
        dist.all_reduce(torch.ones(2))
    except Exception as exc:
        plain["no_group"] = _error(exc)
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    for name, call in bad_calls.items():
        try:
            call()
        except Exception as exc:
            plain[name] = _error(exc)
    _instrument(out, f"errors-ws{ws}", hang_threshold=30.0)
    for name, call in bad_calls.items():
        try:
            call()
        except Exception as exc:
            seen[name] = _error(exc)
            seen[name + ":raised_in"] = [os.path.basename(c.co_filename) for c in _frames(exc.__traceback__)][-1:]
    # A timeout: rank 0 never joins rank 1's all_reduce on a group with a 2 s timeout.
    short = dist.new_group(timeout=datetime.timedelta(seconds=2))
    if rank == 1:
        t0 = time.monotonic()
        try:
            dist.all_reduce(torch.ones(4), group=short)
        except Exception as exc:
            seen["timeout"] = _error(exc)
            seen["timeout_after"] = [f"{time.monotonic() - t0:.1f}"]
    else:
        time.sleep(3)
    dist.barrier()
    dist.destroy_process_group()
    try:
        dist.all_reduce(torch.ones(2))
    except Exception as exc:
        seen["no_group"] = _error(exc)
    otel_torchdist.uninstrument()
    return {"plain": plain, "seen": seen}


def _frames(tb):
    while tb is not None:
        yield tb.tb_frame.f_code
        tb = tb.tb_next


# ---------------------------------------------------------------------------------------------- threads
def threads(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """Four threads, each on its own group with its own tensor size, all_reduce at once while the main
    thread trains DDP (whose reducer and autograd threads issue and complete its all-reduces)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", rank=rank, world_size=ws)
    count, nthreads, steps = args["count"], args["threads"], args["steps"]
    _instrument(out, f"threads-ws{ws}", span_queue_size=100_000, max_spans_per_step=0, span_batch_size=2048)
    group_list = [dist.new_group(group_desc=f"thread{i}") for i in range(nthreads)]
    model = DDP(_mlp())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = threading.Barrier(nthreads + 1)
    wrong: list[str] = []

    def worker(i: int) -> None:
        start.wait()
        numel = 8 * (i + 1)
        for k in range(count):
            t = torch.full((numel,), float(k))
            dist.all_reduce(t, group=group_list[i])
            if t[0].item() != k * ws:
                wrong.append(f"thread {i} call {k}: {t[0].item()}")

    workers = [threading.Thread(target=worker, args=(i,)) for i in range(nthreads)]
    for w in workers:
        w.start()
    start.wait()
    for _ in range(steps):
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
        opt.zero_grad()
    for w in workers:
        w.join()
    buckets = model._get_ddp_logging_data().get("num_buckets_reduced", None)
    otel_torchdist.uninstrument()
    dist.destroy_process_group()
    return {"wrong": wrong, "buckets": buckets}


# ------------------------------------------------------------------------------------------------- soak
def soak(total: int, out: str) -> dict:
    """``total`` all_reduces on the fake backend in one process, with an optimizer step every 100 (default
    step sampling) and then without steps; resident memory, threads and descriptors sampled on the way."""
    import psutil
    from torch.testing._internal.distributed.fake_pg import FakeStore

    proc = psutil.Process()
    dist.init_process_group("fake", rank=0, world_size=4, store=FakeStore())
    before = {"threads": threading.active_count(), "fds": proc.num_fds()}
    rss: list[list[float]] = []
    for cycle in range(3):  # instrument/uninstrument cycles leak nothing either
        _instrument(out, f"soak{cycle}", trace_every_steps=100, metric_export_interval=1.0, span_schedule_delay=0.5)
        otel_torchdist.uninstrument()
    # Sampled: steps 1-10, and the step that never ends (the second half), whose spans are capped.
    every = total // 200 + 1
    _instrument(out, "soak", trace_every_steps=every, metric_export_interval=1.0, span_schedule_delay=0.5)
    p = torch.nn.Parameter(torch.ones(16))
    opt = torch.optim.SGD([p], lr=0.0)
    t = torch.ones(1024)
    t0 = time.perf_counter()
    for i in range(1, total + 1):
        dist.all_reduce(t)
        if i <= total // 2 and i % 100 == 0:
            opt.step()
        if i % (total // 20) == 0:
            rss.append([i, proc.memory_info().rss / 2**20])
    seconds = time.perf_counter() - t0
    during = {"threads": threading.active_count(), "fds": proc.num_fds()}
    from otel_torchdist import health

    otel_torchdist.uninstrument()
    drops, errors = health.drops(), health.errors()
    after = {"threads": threading.active_count(), "fds": proc.num_fds()}
    dist.destroy_process_group()
    return {"rss_mb": rss, "before": before, "during": during, "after": after, "seconds": seconds, "drops": drops, "errors": errors}


def exiting(out: str, endpoint: str) -> None:
    """One rank whose program ends in an uncaught exception while its spans go to a backend that never
    answers: the exit handler's flush waits on it (``flush_timeout``), and the test sends SIGTERM then."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    _instrument(out, "exiting", traces_exporter="otlp", endpoint=endpoint, flush_timeout=3.0)
    for _ in range(3):
        dist.all_reduce(torch.ones(4))
    open(os.path.join(out, "ready"), "w").close()
    raise RuntimeError("planted: the program ends with an exception")


if __name__ == "__main__":
    if sys.argv[1] == "soak":
        print(json.dumps(soak(int(sys.argv[2]), sys.argv[3])))
    elif sys.argv[1] == "exiting":
        exiting(sys.argv[2], sys.argv[3])
    else:
        torchrun_job(sys.argv[1], sys.argv[2])
