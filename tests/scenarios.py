"""Code that runs inside each rank of a real multi-process gloo job (see ``tests/launcher.py``).

Each scenario returns a JSON-able dict the test asserts on. Expected message sizes are written out here
from nccl-tests' definitions with plain arithmetic, independently of otel_torchdist's own tables.
"""

from __future__ import annotations

import os
import pickle
import time
from collections import Counter
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

F32 = 4  # bytes per float32 element
LONG = 8  # bytes per int64 element


def _native_nccl_hooks() -> int:
    """Process groups whose NCCL completion hook is the C++ one (nccl_hook="native")."""
    from otel_torchdist.capture import nccl

    return sum(1 for slot in nccl._hooked.values() if slot[1] is not None)


def _instrument(out: str, rank: int, **extra: Any) -> None:
    import otel_torchdist

    options = dict(
        run_dir=os.path.join(out, "runs"),
        run_id=extra.pop("run_id", "test-run"),
        traces_exporter="file",
        metrics_exporter=("file",),
        summary="none",
        trace_every_steps=1,  # these tests read every span back
        drain_interval=0.05,
    )
    options.update(extra)
    otel_torchdist.instrument(**options)


def _pickled_len(obj: Any) -> int:
    return len(pickle.dumps(obj))


# --------------------------------------------------------------------------------------------- all ops
def all_ops(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """Every c10d entry point once (or more), with the expected record of each call."""
    _instrument(out, rank, run_id=f"ops-ws{ws}")
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    expected: list[dict[str, Any]] = []

    def expect(op, size, *, async_=False, root=None, peer=None, group="default_pg", end=None, error=False, **kw):
        expected.append(
            dict(op=op, S=size, async_=async_, root=root, peer=peer, group=group, end=end, error=error, **kw)
        )

    t8 = lambda: torch.ones(8)  # noqa: E731  32 bytes
    t4 = lambda: torch.ones(4)  # noqa: E731  16 bytes
    B = 8 * F32

    # --- the oracle block: ops that map one-to-one onto a c10d dispatcher op, on their own group
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.profiler import ProfilerActivity, profile

    oracle = dist.new_group(list(range(ws)), group_desc="oracle")
    mix = ["all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single",
           "all_gather", "reduce", "gather", "scatter", "all_reduce", "all_reduce", "broadcast"]
    oracle_calls = {
        "all_reduce": lambda: dist.all_reduce(t8(), group=oracle),
        "broadcast": lambda: dist.broadcast(t8(), group_src=0, group=oracle),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(torch.empty(8 * ws), t8(), group=oracle),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(torch.empty(8), torch.ones(8 * ws), group=oracle),
        "all_to_all_single": lambda: dist.all_to_all_single(torch.empty(8 * ws), torch.ones(8 * ws), group=oracle),
        "all_gather": lambda: dist.all_gather([torch.empty(8) for _ in range(ws)], t8(), group=oracle),
        "reduce": lambda: dist.reduce(t8(), group_dst=0, group=oracle),
        "gather": lambda: dist.gather(t8(), [torch.empty(8) for _ in range(ws)] if rank == 0 else None, group_dst=0, group=oracle),
        "scatter": lambda: dist.scatter(torch.empty(8), [t8() for _ in range(ws)] if rank == 0 else None, group_src=0, group=oracle),
    }
    with profile(activities=[ProfilerActivity.CPU]) as prof, CommDebugMode() as cdm:
        for i in range(3):
            for name in mix:
                oracle_calls[name]()
    comm_debug_counts = {str(k): v for k, v in cdm.get_comm_counts().items()}
    profiler_counts = dict(Counter(e.name for e in prof.events() if e.name.startswith("gloo:")))

    # --- every entry point, with what its record must say
    dist.all_reduce(t8())
    expect("all_reduce", B, end="return")

    work = dist.all_reduce(t8(), async_op=True)
    time.sleep(0.4)  # the collective finishes long before wait(): it must not be charged the sleep
    work.wait()
    expect("all_reduce", B, async_=True, end="future", max_seconds=0.2)

    dist.all_gather([torch.empty(8) for _ in range(ws)], t8())
    expect("all_gather", B * ws)
    dist.all_gather_into_tensor(torch.empty(8 * ws), t8())
    expect("all_gather_into_tensor", B * ws)
    dist.all_gather_single(torch.empty(8 * ws), t8())
    expect("all_gather_single", B * ws)
    c10d._all_gather_base(torch.empty(8 * ws), t8())
    expect("_all_gather_base", B * ws)
    obj = {"rank": rank}  # same pickled length on every rank below 10
    gathered: list[Any] = [None] * ws
    dist.all_gather_object(gathered, obj)
    assert gathered == [{"rank": r} for r in range(ws)]
    expect("all_gather_object", ws * LONG + ws * _pickled_len(obj))

    dist.reduce_scatter(torch.empty(8), [t8() for _ in range(ws)])
    expect("reduce_scatter", B * ws)
    dist.reduce_scatter_tensor(torch.empty(8), torch.ones(8 * ws))
    expect("reduce_scatter_tensor", B * ws)
    dist.reduce_scatter_single(torch.empty(8), torch.ones(8 * ws))
    expect("reduce_scatter_single", B * ws)
    c10d._reduce_scatter_base(torch.empty(8), torch.ones(8 * ws))
    expect("_reduce_scatter_base", B * ws)

    dist.broadcast(t8(), src=0)
    expect("broadcast", B, root=0)
    dist.broadcast(t8(), group_src=ws - 1)
    expect("broadcast", B, root=ws - 1)
    payload = {"lr": 0.1}
    objs = [payload if rank == 0 else None]
    dist.broadcast_object_list(objs, src=0)
    assert objs == [payload]
    expect("broadcast_object_list", 1 * LONG + _pickled_len(payload), root=0)
    dist.reduce(t8(), dst=1)
    expect("reduce", B, root=1)
    dist.gather(t8(), [torch.empty(8) for _ in range(ws)] if rank == 0 else None, dst=0)
    expect("gather", B * ws, root=0)
    out_objs = [None] * ws if rank == 0 else None
    dist.gather_object(obj, out_objs, dst=0)
    expect("gather_object", ws * LONG + ws * _pickled_len(obj), root=0)
    dist.scatter(torch.empty(8), [t8() for _ in range(ws)] if rank == 0 else None, src=0)
    expect("scatter", B * ws, root=0)
    scattered = [None]
    dist.scatter_object_list(scattered, [{"x": i} for i in range(ws)] if rank == 0 else None, src=0)
    assert scattered == [{"x": rank}]
    expect("scatter_object_list", LONG + ws * _pickled_len({"x": 0}) + ws * LONG, root=0)

    dist.all_to_all([torch.empty(8) for _ in range(ws)], [t8() for _ in range(ws)])
    expect("all_to_all", B * ws)
    dist.all_to_all_single(torch.empty(8 * ws), torch.ones(8 * ws))
    expect("all_to_all_single", B * ws)

    dist.barrier()
    expect("barrier", 0)
    dist.monitored_barrier()
    expect("monitored_barrier", 0)

    # point to point: pairs (0,1), (2,3), ...
    partner = rank + 1 if rank % 2 == 0 else rank - 1
    if rank % 2 == 0:
        dist.send(t8(), dst=partner)
        expect("send", B, peer=partner)
        dist.recv(torch.empty(8), src=partner)
        expect("recv", B, peer=partner)
    else:
        dist.recv(torch.empty(8), src=partner)
        expect("recv", B, peer=partner)
        dist.send(t8(), dst=partner)
        expect("send", B, peer=partner)
    if rank % 2 == 0:
        req = dist.isend(t8(), dst=partner)
        expect("isend", B, async_=True, peer=partner, end="wait", source="process_group")
    else:
        req = dist.irecv(torch.empty(8), src=partner)
        expect("irecv", B, async_=True, peer=partner, end="wait", source="process_group")
    req.wait()
    ops = [
        dist.P2POp(dist.isend, t8(), (rank + 1) % ws),
        dist.P2POp(dist.irecv, torch.empty(8), (rank - 1) % ws),
    ]
    for r in dist.batch_isend_irecv(ops):
        r.wait()
    expect("batch_isend_irecv", B, async_=True, bytes_sent=B, bytes_received=B)
    if rank % 2 == 0:
        dist.send_object_list([payload], dst=partner)
    else:
        got = [None]
        dist.recv_object_list(got, src=partner)
        assert got == [payload]
    expect("send_object_list" if rank % 2 == 0 else "recv_object_list", LONG + _pickled_len(payload), peer=partner)
    if rank % 2 == 0:  # the same through batch_isend_irecv: its bytes count too
        dist.send_object_list([payload], dst=partner, use_batch=True)
    else:
        got = [None]
        dist.recv_object_list(got, src=partner, use_batch=True)
        assert got == [payload]
    expect("send_object_list" if rank % 2 == 0 else "recv_object_list", LONG + _pickled_len(payload), peer=partner)

    # coalesced
    dist.all_reduce_coalesced([t8(), t4()])
    expect("all_reduce_coalesced", B + 4 * F32)
    dist.all_gather_coalesced([[torch.empty(8), torch.empty(4)] for _ in range(ws)], [t8(), t4()])
    expect("all_gather_coalesced", ws * (B + 4 * F32))
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(t8())
        dist.all_reduce(t4())
    cm.wait()
    expect("all_reduce_coalesced", B + 4 * F32, async_=True, source="coalescing_manager", coalesced_ops=2)
    with dist._coalescing_manager():
        dist.all_gather_into_tensor(torch.empty(8 * ws), t8())
        dist.all_gather_into_tensor(torch.empty(4 * ws), t4())
    expect("all_gather_single_coalesced", ws * (B + 4 * F32), source="coalescing_manager", coalesced_ops=2)
    dist._broadcast_coalesced(c10d._get_default_group(), [t8(), t4()], 1024, 0)
    expect("_broadcast_coalesced", B + 4 * F32, root=0)
    # torch queues only all_reduce, all_gather_single and reduce_scatter_single in a coalescing block:
    # anything else runs as it is called, and is recorded as such
    with dist._coalescing_manager():
        dist.broadcast(t8(), src=0)
        expect("broadcast", B, root=0)
        dist.all_gather([torch.empty(8) for _ in range(ws)], t8())
        expect("all_gather", B * ws)
        dist.barrier()
        expect("barrier", 0)

    # the other namespace
    c10d.all_reduce(t8())
    expect("all_reduce", B)

    # a subgroup of the last two ranks: sizes, group ranks, and group-relative roots
    sub_ranks = [ws - 2, ws - 1]
    sub = dist.new_group(sub_ranks, group_desc="pair")
    if rank in sub_ranks:
        dist.all_reduce(t8(), group=sub)
        expect("all_reduce", B, group="pair", group_size=2, group_rank=sub_ranks.index(rank))
        dist.broadcast(t8(), group=sub, group_src=1)
        expect("broadcast", B, root=ws - 1, group="pair", group_size=2)
        dist._broadcast_coalesced(sub, [t8()], 1024, 1)  # src: a rank of the group (DDP's on a subgroup)
        expect("_broadcast_coalesced", B, root=ws - 1, group="pair", group_size=2)
    else:
        dist.all_reduce(t8(), group=sub)  # not a member: returns without communicating, nothing to record

    # an error: raised unchanged, recorded with its status
    original = dist.broadcast.__wrapped__
    try:
        original(t8(), src=ws + 5)
    except Exception as exc:
        plain_error = (type(exc).__name__, str(exc))
    # Even the unwrapped function is seen, one level down, by the ProcessGroup method capture.
    expect("broadcast", B, root=ws + 5, error=True, source="process_group", async_=True)
    try:
        dist.broadcast(t8(), src=ws + 5)
    except Exception as exc:
        instrumented_error = (type(exc).__name__, str(exc))
    expect("broadcast", B, root=ws + 5, error=True)

    dist.barrier()
    expect("barrier", 0)
    import otel_torchdist

    otel_torchdist.uninstrument()
    dist.destroy_process_group()
    return {
        "expected": expected,
        "comm_debug_counts": comm_debug_counts,
        "profiler_counts": profiler_counts,
        "oracle_mix": mix,
        "plain_error": plain_error,
        "instrumented_error": instrumented_error,
    }


# ------------------------------------------------------------------------------------------ OTLP export
def export_otlp(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """A few collectives exported over OTLP; rank r uses ``args["endpoints"][r]`` = [endpoint, protocol] or
    [endpoint, protocol, compression]."""
    from opentelemetry.sdk.trace import TracerProvider

    import otel_torchdist

    endpoint, protocol, *compression = args["endpoints"][rank]
    otel_torchdist.instrument(
        endpoint=endpoint,
        protocol=protocol,
        compression=compression[0] if compression else "none",
        run_id=args["run_id"],
        service_name="otlp-test",
        metrics_exporter=("otlp",),
        summary="none",
        trace_every_steps=1,  # these tests read every span back
        drain_interval=0.05,
    )
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    for _ in range(3):
        dist.all_reduce(torch.ones(256))
    dist.broadcast(torch.ones(16), src=0)
    dist.all_gather_into_tensor(torch.empty(16 * ws), torch.ones(16))
    # A span of the user's own: our collective span must be its child.
    tracer = TracerProvider().get_tracer("user-code")
    with tracer.start_as_current_span("user.eval") as user_span:
        dist.all_reduce(torch.ones(4))
        ctx = user_span.get_span_context()
    flushed = otel_torchdist.flush(10)
    otel_torchdist.uninstrument()
    dist.destroy_process_group()
    return {"user_trace_id": f"{ctx.trace_id:032x}", "user_span_id": f"{ctx.span_id:016x}", "flushed": flushed}


# ------------------------------------------------------------------------------------------- Prometheus
def serve_metrics(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """Known collectives, then keep /metrics up until the test drops ``args["go"]`` (at most 120 s)."""
    import otel_torchdist

    otel_torchdist.instrument(
        run_dir=os.path.join(out, "runs"),
        run_id=args["run_id"],
        metrics_exporter=("file", "prometheus"),
        traces_exporter="file",
        prometheus_host="127.0.0.1",
        prometheus_port=args["base_port"],
        span_schedule_delay=0.2,
        summary="none",
        trace_every_steps=1,  # these tests read every span back
        drain_interval=0.05,
    )
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    for _ in range(args["all_reduces"]):
        dist.all_reduce(torch.ones(1024))
    for _ in range(args["broadcasts"]):
        dist.broadcast(torch.ones(256), src=0)
    otel_torchdist.flush(10)
    deadline = time.monotonic() + 120
    while not os.path.exists(args["go"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    otel_torchdist.uninstrument()
    dist.destroy_process_group()
    return {}


# -------------------------------------------------------------------------------------------- lifecycle
def instrument_after_init_no_uninstrument(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """instrument() after init_process_group and no uninstrument(): process exit must finish the job.

    (destroy_process_group() is still called: gloo itself aborts now and then at exit without it.)
    """
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    _instrument(out, rank, run_id="late")
    for _ in range(5):
        dist.all_reduce(torch.ones(64))
    dist.broadcast(torch.ones(8), src=1)
    dist.destroy_process_group()
    return {}


def agreed_run_id(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """No run id configured anywhere: the ranks agree on one through the store, without a collective."""
    import otel_torchdist
    from otel_torchdist import runtime

    otel_torchdist.instrument(run_dir=os.path.join(out, "runs"), traces_exporter="file", metrics_exporter=("file",), summary="none", trace_every_steps=1)
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    seq_before = dist.group.WORLD._get_sequence_number_for_group()
    ident = runtime.current().identity
    dist.all_reduce(torch.ones(4))
    otel_torchdist.uninstrument()
    # again on the same group, rank 0 last: the others find the first cycle's key in the store
    if rank == 0:
        time.sleep(0.5)
    otel_torchdist.instrument(run_dir=os.path.join(out, "runs"), traces_exporter="file", metrics_exporter=("file",), summary="none")
    again = runtime.current().identity.run_id
    otel_torchdist.uninstrument()
    dist.destroy_process_group()
    return {"run_id": ident.run_id, "again": again, "instance": ident.instance_id, "seq_before_first_collective": seq_before}


def nccl_ddp(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """DDP on NCCL recorded by the native group (GPU machines only), trained beside the same model without DDP."""
    import copy

    from torch.nn.parallel import DistributedDataParallel as DDP

    import otel_torchdist
    from otel_torchdist.capture import ddp_native

    from .scenarios_training import _mlp

    _instrument(out, rank, run_id="nccl-ddp", native="build", nccl_hook=args.get("nccl_hook", "python"))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=ws)
    plain = _mlp().cuda()
    model = DDP(copy.deepcopy(plain), bucket_cap_mb=0.01)  # two buckets once rebuilt
    hooked = bool(model._get_ddp_logging_data().get("comm_hook"))
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, plain)]
    gen = torch.Generator(device="cuda").manual_seed(rank)
    for _ in range(args.get("steps", 5)):
        x = torch.randn(8, 16, device="cuda", generator=gen)
        for m, opt in zip((model, plain), opts):
            m(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
    torch.cuda.synchronize()
    same = ws == 1 and all(torch.equal(a, b) for a, b in zip(model.module.parameters(), plain.parameters()))
    attached = ddp_native.is_attached(model)
    native_hooks = _native_nccl_hooks()
    otel_torchdist.uninstrument()
    dist.destroy_process_group()
    return {"attached": attached, "comm_hook": hooked, "same": same, "native_hooks": native_hooks}


def recv_any_source(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """Rank 0 sends, rank 1 receives from any source (``src=None``): torch returns the sender's rank."""
    import otel_torchdist

    _instrument(out, rank, run_id="recv-any", native=args.get("native", "auto"))
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    t = torch.full((4,), float(rank))
    sender = None
    if rank == 0:
        dist.send(t, dst=1)
    else:
        sender = dist.recv(t)
    otel_torchdist.uninstrument()
    dist.destroy_process_group()
    return {"sender": sender}


def nccl_timing(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """A big all_reduce on NCCL, timed by the completion hook (GPU machines only)."""
    hook = args.get("nccl_hook", "python")
    _instrument(out, rank, run_id="nccl", nccl_hook=hook, native="build" if hook == "native" else "auto")
    torch.cuda.set_device(rank)
    # backend None: init_process_group() as many scripts call it (torch says "undefined" and picks NCCL)
    dist.init_process_group(args.get("backend", "nccl"), rank=rank, world_size=ws)
    t = torch.ones(64 << 20, device="cuda")  # 256 MiB of float32
    for _ in range(3):
        # queued behind ~50 ms of GPU work: the call returns at enqueue, the GPU finishes after the sleep
        torch.cuda._sleep(100_000_000)
        dist.all_reduce(t)
    torch.cuda.synchronize()
    import otel_torchdist

    native_hooks = _native_nccl_hooks()
    otel_torchdist.uninstrument()
    dist.destroy_process_group()
    return {"native_hooks": native_hooks}


def nccl_p2p_numbering(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """batch_isend_irecv (to itself) numbered on NCCL's point-to-point count, then all_reduces whose numbers
    the batches' reports already carry (GPU machines only): each all_reduce must end at its own completion."""
    hook = args.get("nccl_hook", "python")
    _instrument(out, rank, run_id="nccl-p2p", nccl_hook=hook, native="build" if hook == "native" else "auto")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=ws)
    from otel_torchdist.capture import nccl

    a = torch.ones(64 << 20, device="cuda")
    sent, got = torch.ones(1024, device="cuda"), torch.zeros(1024, device="cuda")

    def settle() -> None:
        torch.cuda.synchronize()
        time.sleep(0.5)  # the watchdog polls every 100 ms, the drain runs every 200: its reports are joined

    dist.all_reduce(a)  # collective 1: its report shows the stamp on the records' clock
    settle()
    for _ in range(3):  # point-to-point works 1..3 (or 0..2): their reports wait under numbers 1..3
        for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, sent, rank), dist.P2POp(dist.irecv, got, rank)]):
            work.wait()
        settle()
    for _ in range(2):  # collectives 2 and 3: queued behind ~50 ms of GPU sleep
        torch.cuda._sleep(100_000_000)
        dist.all_reduce(a)
    settle()
    import otel_torchdist

    start_check = nccl._START_CHECK[0]
    native_hooks = _native_nccl_hooks()
    otel_torchdist.uninstrument()
    dist.destroy_process_group()
    return {"native_hooks": native_hooks, "start_check": start_check}


def nccl_graph_capture(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """An all_reduce captured into a CUDA graph and replayed (GPU machines only), as torch's CUDA graph docs
    do it: the collective's timing stays on through the capture, and the capture's record ends at enqueue
    (ProcessGroupNCCL hands its watchdog no work of a capture, so no report will come)."""
    from otel_torchdist import health
    from otel_torchdist.capture import groups

    _instrument(out, rank, run_id="nccl-graph")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=ws, device_id=torch.device("cuda", rank))
    t = torch.ones(1024, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm-up on a side stream before capture
            dist.all_reduce(t)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # captured, not run: each replay doubles t, then sums it over the ranks
        t.mul_(2)
        dist.all_reduce(t)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    value = t[0].item()
    time.sleep(0.5)  # the watchdog's reports of the warm-up
    import otel_torchdist

    pending = sum(len(gi.pending) for gi in groups.all_groups())
    errors = health.errors()  # a copy already
    otel_torchdist.uninstrument()
    # no destroy_process_group(): after a capture of NCCL work it can hang in ncclCommDestroy (torch issue
    # 115388); the process's exit ends the group
    return {"value": value, "expected": float(ws**3 * (2 * ws) ** 3), "pending": pending, "errors": errors}


def nccl_funcol(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """Functional collectives on NCCL, queued behind GPU sleep (GPU machines only): their wait_tensor only
    makes the stream wait, so each record must end by the completion hook, after the sleep."""
    import torch.distributed._functional_collectives as funcol

    _instrument(out, rank, run_id="nccl-funcol")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=ws)
    t = torch.ones(16 << 20, device="cuda")
    for _ in range(2):
        torch.cuda._sleep(100_000_000)
        funcol.all_reduce(t, "sum", dist.group.WORLD).wait()
    torch.cuda.synchronize()
    time.sleep(0.5)  # the watchdog's reports
    import otel_torchdist

    otel_torchdist.uninstrument()
    dist.destroy_process_group()
    return {}
