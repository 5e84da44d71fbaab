"""Ranks of the export-fault tests (tests/test_faults_export.py): training while the backend is absent,
dies and comes back, never answers or answers slowly, and with planted tensor values, TLS and auth.

Each scenario trains with collectives whose results it checks against plain arithmetic, and returns what
the test asserts on: timings (``time.time()``, comparable with the test process), drop counts as the
library itself counts them (``health.drops()``), flush results and queue sizes sampled during the run.
Phases that the test must drive from outside (kill a receiver, restart it) are separated by marker files
in the job folder.
"""

from __future__ import annotations

import os
import struct
import time
import urllib.request
from typing import Any

import torch
import torch.distributed as dist

SECRET = 1234.5678
"""The value planted in every tensor of the security scenario (not a value any timing or size could take)."""


def _instrument(out: str, **options: Any) -> None:
    import otel_torchdist

    base = dict(
        run_dir=os.path.join(out, "runs"),
        summary="all",
        trace_every_steps=1,
        drain_interval=0.02,
        system_metrics=False,
    )
    base.update(options)
    otel_torchdist.instrument(**base)


def _instrument_otlp(out: str, rank: int, args: dict, **options: Any) -> None:
    """Export over OTLP to ``args["endpoints"][rank]`` = [endpoint, protocol], spans every 50 ms."""
    endpoint, protocol = args["endpoints"][rank]
    _instrument(out, run_id=args["run_id"], endpoint=endpoint, protocol=protocol, span_schedule_delay=0.05, **options)


def _mark(out: str, name: str) -> None:
    with open(os.path.join(out, name), "w") as f:
        f.write(str(time.time()))


def _wait_file(out: str, name: str, timeout: float = 120) -> None:
    path = os.path.join(out, name)
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the test never wrote {name}")
        time.sleep(0.02)


def _train(rank: int, ws: int, iterations: int, numel: int, pause: float = 0.0) -> float:
    """``iterations`` all_reduces of ``numel`` floats; returns the checksum of the reduced tensors."""
    checksum = 0.0
    for i in range(iterations):
        t = torch.full((numel,), float((rank + 1) * (i + 1)))
        dist.all_reduce(t)
        checksum += float(t.sum())
        if pause:
            time.sleep(pause)
    return checksum


def expected_checksum(ws: int, iterations: int, numel: int) -> float:
    """What :func:`_train` returns when every all_reduce summed correctly (same on every rank)."""
    return float(sum((i + 1) * ws * (ws + 1) // 2 * numel for i in range(iterations)))


def _scrape(url: str, openmetrics: bool = False) -> str:
    headers = {"Accept": "application/openmetrics-text; version=1.0.0"} if openmetrics else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
        return r.read().decode()


# ------------------------------------------------------------------------------------ backend absent
def backend_absent(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """Train against an OTLP endpoint where nothing listens; rank r uses ``args["endpoints"][r]``."""
    import otel_torchdist
    from otel_torchdist import health, runtime

    _instrument_otlp(
        out,
        rank,
        args,
        metrics_exporter=("otlp", "prometheus"),
        prometheus_host="127.0.0.1",
        prometheus_port=0,
        metric_export_interval=0.1,  # many export attempts, each one failing
    )
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    checksum = _train(rank, ws, args["iterations"], 8, pause=0.01)
    flushed = otel_torchdist.flush()
    drops = health.drops()
    metrics_text = _scrape(runtime.current().prometheus.url)
    dist.barrier()
    _note_library_exit(out, rank)
    t_last = time.time()  # end of training: from here on only the library's teardown runs
    dist.destroy_process_group()
    return {"checksum": checksum, "flushed": flushed, "drops": drops, "metrics_text": metrics_text, "t_last": t_last}


# ----------------------------------------------------------------------------- backend dies, returns
PHASE_SIZES = {"before": 111, "outage": 222, "after": 333}
"""Elements per all_reduce in each phase, so the spans of each phase are told apart by message size."""


def backend_outage(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """Train before, during and after an outage of the receiver the test kills and restarts."""
    import otel_torchdist
    from otel_torchdist import health

    _instrument_otlp(out, rank, args, metrics_exporter=("otlp",), metric_export_interval=0.2)
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    n = args["iterations"]
    checksums = {}
    checksums["before"] = _train(rank, ws, n, PHASE_SIZES["before"])
    flushed_before = _flush_until_ok(30)
    _mark(out, f"before.rank{rank}")
    _wait_file(out, "killed")

    checksums["outage"] = _train(rank, ws, n, PHASE_SIZES["outage"])
    flushed_outage = otel_torchdist.flush(5)
    drops_outage = health.drops()
    _mark(out, f"outage.rank{rank}")
    _wait_file(out, "restarted")

    checksums["after"] = _train(rank, ws, n, PHASE_SIZES["after"])
    t0 = time.time()
    flushed_after = _flush_until_ok(60)
    resumed_after = time.time() - t0
    dist.barrier()
    result = {
        "checksums": checksums,
        "flushed": [flushed_before, flushed_outage, flushed_after],
        "resumed_after_s": resumed_after,
        "drops_outage": drops_outage,
        "drops_end": health.drops(),
    }
    otel_torchdist.uninstrument()
    dist.destroy_process_group()
    return result


def _flush_until_ok(timeout: float) -> bool:
    import otel_torchdist

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if otel_torchdist.flush(5):
            return True
        time.sleep(0.2)
    return False


# ------------------------------------------------------------------------ black hole, slow receiver
def backend_stuck(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """A burst of collectives while every export call of this rank is stuck (black hole) or slow.

    Rank r exports traces to ``args["traces"][r]`` and metrics to ``args["metrics"][r]`` ([endpoint,
    protocol] each). Before the burst the rank waits until an export call is in flight (the export lock is
    held), so the burst runs while the exporter is stuck.
    """
    import psutil

    from otel_torchdist import health, runtime
    from otel_torchdist.capture import record

    (traces_endpoint, traces_protocol), (metrics_endpoint, metrics_protocol) = args["traces"][rank], args["metrics"][rank]
    _instrument(
        out,
        run_id=args["run_id"],
        traces_endpoint=traces_endpoint,
        traces_protocol=traces_protocol,
        metrics_endpoint=metrics_endpoint,
        metrics_protocol=metrics_protocol,
        traces_exporter="otlp",
        metrics_exporter=("otlp",),
        timeout=args["otlp_timeout"],
        flush_timeout=args["flush_timeout"],
        span_queue_size=args["span_queue_size"],
        max_queued_records=args["max_queued_records"],
        span_batch_size=64,
        span_schedule_delay=0.05,
        metric_export_interval=60.0,  # spans first: the call that gets stuck holds a batch of them
    )
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    _note_library_exit(out, rank)
    pipeline = runtime.current().pipeline
    _train(rank, ws, 20, 4)
    deadline = time.monotonic() + 30
    while not pipeline.outbox.span_lock._lock.locked() and time.monotonic() < deadline:
        time.sleep(0.01)
    stuck_before = pipeline.outbox.span_lock._lock.locked()
    proc = psutil.Process()
    samples = []
    t_burst = time.time()
    rss0 = proc.memory_info().rss
    checksum = 0.0
    for i in range(args["burst"]):
        t = torch.full((4,), float(rank + 1))
        dist.all_reduce(t)
        checksum += float(t[0])
        if i % 100 == 0:
            samples.append([pipeline.outbox.queued_spans(), len(record.QUEUE), proc.memory_info().rss - rss0])
    t_last = time.time()
    samples.append([pipeline.outbox.queued_spans(), len(record.QUEUE), proc.memory_info().rss - rss0])
    result = {
        "checksum": checksum,
        "stuck_before": stuck_before,
        "stuck_after": pipeline.outbox.span_lock._lock.locked(),
        "samples": samples,
        "burst_s": t_last - t_burst,
        "drops": health.drops(),
        "t_last": t_last,
    }
    dist.destroy_process_group()
    return result


def ddp_black_hole(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """A short DDP run exporting over OTLP/HTTP to a collector that accepts connections and never answers,
    then destroy_process_group() and exit: each flush point of the end finds its own post stuck."""
    _instrument(out, run_id="ddp-hole", endpoint=args["endpoint"], flush_timeout=args["flush_timeout"], timeout=30.0)
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        model(torch.ones(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
    _note_library_exit(out, rank)
    t_last = time.time()
    dist.destroy_process_group()
    return {"t_last": t_last}


def _note_library_exit(out: str, rank: int) -> None:
    """Write ``time.time()`` to ``exit.rank<R>`` once otel-torchdist's exit flush is over (multiprocessing's
    exit finalizers run by decreasing priority: the library's has 100)."""
    import multiprocessing.util

    multiprocessing.util.Finalize(None, _mark, args=(out, f"exit.rank{rank}"), exitpriority=1)


# ------------------------------------------------------------------------------------------ secrets
def _payload(dtype=torch.float32, n: int = 8) -> torch.Tensor:
    return torch.full((n,), SECRET, dtype=dtype)


SECRET_OBJECT = {"weight": SECRET, "text": f"{SECRET}", "raw": struct.pack("<d", SECRET)}


def planted_values(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """Every collective kind carries tensors (and objects) full of SECRET; exporters per ``args["options"][r]``.

    Afterwards the rank saves its own /metrics text and waits (``go``) so the test can probe where the
    /metrics socket is bound.
    """
    import otel_torchdist
    from otel_torchdist import runtime

    _instrument(out, run_id=args["run_id"], system_metrics=True, span_schedule_delay=0.1, **args["options"][rank])
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    v = _payload
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws
    with otel_torchdist.step(1):
        t = v()
        dist.all_reduce(t)
        dist.all_reduce(v(torch.float64))
        dist.all_reduce(v(n=1), async_op=True).wait()
        dist.broadcast(v(), src=0)
        dist.reduce(v(), dst=1)
        dist.all_gather([torch.empty(8) for _ in range(ws)], v())
        dist.all_gather_into_tensor(torch.empty(8 * ws), v())
        dist.reduce_scatter(torch.empty(8), [v() for _ in range(ws)])
        dist.reduce_scatter_tensor(torch.empty(8), v(n=8 * ws))
        dist.all_to_all([torch.empty(8) for _ in range(ws)], [v() for _ in range(ws)])
        dist.all_to_all_single(torch.empty(8 * ws), v(n=8 * ws))
        dist.gather(v(), [torch.empty(8) for _ in range(ws)] if rank == 0 else None, dst=0)
        dist.scatter(torch.empty(8), [v() for _ in range(ws)] if rank == 0 else None, src=0)
        dist.all_reduce_coalesced([v(), v(n=4)])
        with dist._coalescing_manager():
            dist.all_reduce(v())
            dist.all_reduce(v(n=4))
    with otel_torchdist.step(2):
        for r in dist.batch_isend_irecv([dist.P2POp(dist.isend, v(), nxt), dist.P2POp(dist.irecv, torch.empty(8), prv)]):
            r.wait()
        if rank == 0:
            dist.send(v(), dst=1)
            dist.isend(v(), dst=1).wait()
            dist.send_object_list([SECRET_OBJECT], dst=1)
        elif rank == 1:
            dist.recv(torch.empty(8), src=0)
            dist.irecv(torch.empty(8), src=0).wait()
            got = [None]
            dist.recv_object_list(got, src=0)
            assert got == [SECRET_OBJECT]
        gathered: list[Any] = [None] * ws
        dist.all_gather_object(gathered, SECRET_OBJECT)
        objs = [SECRET_OBJECT if rank == 0 else None]
        dist.broadcast_object_list(objs, src=0)
        dist.gather_object(SECRET_OBJECT, [None] * ws if rank == 0 else None, dst=0)
        scattered = [None]
        dist.scatter_object_list(scattered, [SECRET_OBJECT] * ws if rank == 0 else None, src=0)
        assert scattered == [SECRET_OBJECT]
        dist.barrier()
    assert torch.allclose(t, torch.full((8,), SECRET * ws))
    flushed = otel_torchdist.flush(10)
    endpoint = runtime.current().prometheus
    with open(os.path.join(out, f"scrape.rank{rank}.txt"), "w") as f:
        f.write(_scrape(endpoint.url.replace(endpoint.scrape_host(), "127.0.0.1")))
        f.write(_scrape(endpoint.url.replace(endpoint.scrape_host(), "127.0.0.1"), openmetrics=True))
    with open(os.path.join(out, f"listening.rank{rank}"), "w") as f:
        f.write(f"{os.getpid()} {endpoint.host} {endpoint.port}")
    _wait_file(out, "go")
    otel_torchdist.uninstrument()
    dist.destroy_process_group()
    return {"flushed": flushed}


# ------------------------------------------------------------------------------------------ TLS, auth
def tls_and_auth(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """Export configured only through OTEL_EXPORTER_OTLP_* variables (``args["env"][r]``), then again with
    the wrong CA (``args["wrong_env"][r]``): the first must arrive, the second fail cleanly."""
    import otel_torchdist
    from otel_torchdist import health

    os.environ.update(args["env"][rank])
    _instrument(out, run_id=args["run_id"], span_schedule_delay=0.1)
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    checksum = _train(rank, ws, 5, 16)
    flushed_good = _flush_until_ok(20)
    otel_torchdist.uninstrument()
    before = health.drops()

    for var in args["env"][rank]:
        os.environ.pop(var)
    os.environ.update(args["wrong_env"][rank])
    _instrument(out, run_id=args["run_id"] + "-wrong-ca", span_schedule_delay=0.1)
    checksum_wrong = _train(rank, ws, 5, 16)
    flushed_wrong = otel_torchdist.flush(5)
    after = health.drops()
    otel_torchdist.uninstrument()
    dist.destroy_process_group()
    return {
        "checksums": [checksum, checksum_wrong],
        "flushed": [flushed_good, flushed_wrong],
        "drops_good": before,
        "drops_wrong": {k: v - before.get(k, 0) for k, v in after.items()},
    }
