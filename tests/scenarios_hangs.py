"""Hangs whose missing ranks the hang board must name, inside real gloo ranks (tests/test_hang_board.py).

Every rank runs two collectives on the world group (all_reduce #1, barrier #2), lets the hang board publish,
then calls one more all_reduce: on the world group, or with ``args["pairs"]`` on its pair ({0, 1}, {2, 3}).
``args["late"]`` maps a rank to the seconds it sleeps first (it has not started the collective while the
others wait in it past the 1 s threshold); ``args["stopped"]`` names a rank that freezes itself with
SIGSTOP instead (alive, its connections open, but its watchdog and board threads stopped, as a process stuck
in a driver call or swapped out would be) until rank 0 sends it SIGCONT ``args["stopped_s"]`` seconds later.
"""

from __future__ import annotations

import datetime
import logging
import os
import signal
import threading
import time

import torch
import torch.distributed as dist

import otel_torchdist


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def late(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    lines = _Lines()
    logging.getLogger("otel_torchdist").addHandler(lines)
    events: list = []
    otel_torchdist.on_hang(lambda e: events.append({"op": e.op, "group": e.group, "seq": e.seq, "missing_ranks": list(e.missing_ranks), "missing": list(e.missing)}))
    # a callback that raises and one that blocks change nothing for training, the watchdog or the others
    otel_torchdist.on_hang(lambda e: 1 / 0)
    otel_torchdist.on_hang(lambda e: time.sleep(3600))
    dist.init_process_group("gloo", rank=rank, world_size=ws, timeout=datetime.timedelta(seconds=60))
    otel_torchdist.instrument(
        run_dir=os.path.join(out, "runs"), run_id=args["run_id"], traces_exporter="file", metrics_exporter=("file",),
        summary="none", drain_interval=0.05, system_metrics=False, hang_threshold=1.0, metric_export_interval=0.5,
        span_schedule_delay=0.5, straggler_exchange_steps=0,
    )  # fmt: skip
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])] if args.get("pairs") else None
    dist.all_reduce(torch.ones(4))
    dist.barrier()
    if args.get("p2p") and rank < 2:  # ranks 0 and 1 only: gloo numbers these on the two of them
        t, peer = torch.ones(4), 1 - rank
        (dist.send if rank == 0 else dist.recv)(t, peer)
        (dist.isend if rank == 0 else dist.irecv)(t, peer).wait()
        for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, t.clone(), peer), dist.P2POp(dist.irecv, t, peer)]):
            work.wait()
    time.sleep(1.5)  # every board has published once
    stopped = args.get("stopped")
    if rank == stopped:
        with open(os.path.join(out, f"pid.rank{rank}.tmp"), "w") as f:
            f.write(str(os.getpid()))
        os.replace(os.path.join(out, f"pid.rank{rank}.tmp"), os.path.join(out, f"pid.rank{rank}"))
        os.kill(os.getpid(), signal.SIGSTOP)
    elif rank == 0 and stopped is not None:
        pid_file = os.path.join(out, f"pid.rank{stopped}")
        while not os.path.exists(pid_file):
            time.sleep(0.05)
        pid = int(open(pid_file).read())
        threading.Timer(args["stopped_s"], os.kill, (pid, signal.SIGCONT)).start()
    time.sleep(args.get("late", {}).get(str(rank), 0.0))
    group = pairs[rank // 2] if pairs else None
    dist.all_reduce(torch.ones(4), group=group)
    dist.barrier()
    otel_torchdist.uninstrument()
    dist.destroy_process_group()
    time.sleep(0.2)  # the callbacks run on the dispatcher's thread
    return {"hang_lines": [line for line in lines.lines if "in flight for" in line], "hang_events": events}


def _start(rank: int, ws: int, out: str, run_id: str, timeout: float) -> _Lines:
    lines = _Lines()
    logging.getLogger("otel_torchdist").addHandler(lines)
    dist.init_process_group("gloo", rank=rank, world_size=ws, timeout=datetime.timedelta(seconds=timeout))
    otel_torchdist.instrument(
        run_dir=os.path.join(out, "runs"), run_id=run_id, traces_exporter="file", metrics_exporter=("file",),
        summary="none", drain_interval=0.05, system_metrics=False, hang_threshold=1.0, straggler_exchange_steps=0,
    )  # fmt: skip
    dist.all_reduce(torch.ones(4))
    dist.barrier()
    time.sleep(1.5)  # every board has published once
    return lines


def other_op(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """Rank 0 calls all_reduce #3, rank 1 broadcast #3: blocking calls, both wait until gloo gives up."""
    lines = _start(rank, ws, out, "other-op", 5.0)
    try:
        if rank == 0:
            dist.all_reduce(torch.ones(4))
        else:
            dist.broadcast(torch.ones(4), src=1)
    except RuntimeError:
        pass
    otel_torchdist.uninstrument()
    return {"hang_lines": [line for line in lines.lines if "in flight for" in line]}


def recv_late(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """Rank 0 sends to rank 1 4 s late: rank 1 waits in its recv (a hung point-to-point call), the others in
    the all-reduce after it."""
    lines = _start(rank, ws, out, "recv-late", 30.0)
    batch = args.get("batch")
    if rank == 0:
        time.sleep(4.0)
        dist.send(torch.ones(4), dst=1)
    elif rank == 1 and batch:  # a pipeline schedule's (1F1B) form of it
        for work in dist.batch_isend_irecv([dist.P2POp(dist.irecv, torch.ones(4), 0)]):
            work.wait()
    elif rank == 1:
        dist.recv(torch.ones(4), src=0)
    dist.all_reduce(torch.ones(4))
    otel_torchdist.uninstrument()
    dist.destroy_process_group()
    return {"hang_lines": [line for line in lines.lines if "in flight for" in line]}


def p2p_numbers(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """3 ranks, ranks 0 and 1 exchanging every kind of point-to-point call on the world and a subgroup, all
    three in a monitored barrier: how many collectives each rank counts on each group."""
    from otel_torchdist.capture import groups

    _start(rank, ws, out, "p2p-numbers", 30.0)  # an all_reduce and a barrier
    sub = dist.new_group([0, 1, 2])
    dist.all_reduce(torch.ones(4), group=sub)
    if rank < 2:
        t, peer, pg = torch.ones(4), 1 - rank, groups.info(None).pg
        (dist.send_object_list if rank == 0 else dist.recv_object_list)([{"a": 1}] if rank == 0 else [None], peer)
        (dist.send_object_list if rank == 0 else dist.recv_object_list)([{"a": 1}] if rank == 0 else [None], peer, use_batch=True)
        (dist.send if rank == 0 else dist.recv)(t, peer, group=sub)
        (pg.send(tensors=[t], dstRank=1, tag=0) if rank == 0 else pg.recv(tensors=[t], srcRank=0, tag=0)).wait()
        dist.send(t, 1) if rank == 0 else dist.recv(t)  # from any source
        (dist.isend if rank == 0 else dist.irecv)(t, peer).wait()
        for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, t.clone(), peer), dist.P2POp(dist.irecv, t, peer)]):
            work.wait()
    dist.monitored_barrier()
    dist.all_reduce(torch.ones(4))
    dist.all_reduce(torch.ones(4), group=sub)
    counts = {label: [groups.info(g).last_started(), groups.info(g).collectives_started()] for label, g in (("world", None), ("sub", sub))}
    otel_torchdist.uninstrument()
    dist.destroy_process_group()
    return counts


def isend_overlap(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """Rank 0 isends, computes 2.5 s, then waits; rank 1's recv returns at once: no hang anywhere (gloo's
    send work has no completion signal before wait())."""
    lines = _start(rank, ws, out, "isend-overlap", 30.0)
    if rank == 0:
        work = dist.isend(torch.ones(4), dst=1)
        time.sleep(2.5)
        work.wait()
    else:
        dist.recv(torch.ones(4), src=0)
        time.sleep(3.0)  # not waiting in the barrier meanwhile: that would be a hang of its own
    dist.barrier()
    otel_torchdist.uninstrument()
    dist.destroy_process_group()
    return {"hang_lines": [line for line in lines.lines if "in flight for" in line]}
