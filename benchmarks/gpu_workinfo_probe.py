"""What ProcessGroupNCCL's completion hook reports for each kind of work (a GPU machine; without one it says so).

    python benchmarks/gpu_workinfo_probe.py [--out benchmarks/results/gpu-workinfo.json]

One rank on NCCL, collective timing on and a bare Python hook registered before the first collective (no
otel_torchdist): an all_reduce, a coalesced block of two all_reduces, a batch_isend_irecv to itself, an
all_reduce and a second batch. For each call it keeps its window on the records' clock (perf_counter_ns
before and after) and the group's sequence number after it (what records carry); for each report, the op
type, the number, and time_started / time_finished on the same clock, and which call's window holds its
time_started.

What it settles (benchmarks/results/2026-11-27b-session.md): which number a batch of sends and receives
carries (NCCL's point-to-point count, reported as COALESCED, as ProcessGroupNCCL's source reads), and whether
time_started falls inside its call's window, which would tell a misnumbered report from its record's own.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import datetime, timedelta
from time import perf_counter_ns

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_check import _init, _port, write_report  # noqa: E402


def _on_records_clock(when) -> int | None:
    """A WorkInfo time on perf_counter_ns's clock (a steady-clock timedelta in this torch, a datetime before)."""
    if isinstance(when, timedelta):
        return (when.days * 86_400 + when.seconds) * 1_000_000_000 + when.microseconds * 1_000
    if isinstance(when, datetime):
        return perf_counter_ns() - (time.time_ns() - int(when.timestamp() * 1e9))
    return None


def probe() -> dict:
    torch.cuda.set_device(0)
    _init("nccl", 0, 1, _port())
    pg = dist.group.WORLD
    reports: list = []
    pg._enable_collectives_timing()
    pg._register_on_completion_hook(
        lambda info: reports.append((info.op_type.name, int(info.seq), info.time_started, info.time_finished))
    )
    a, b = torch.ones(1 << 20, device="cuda"), torch.ones(1 << 20, device="cuda")
    sent, got = torch.ones(1 << 10, device="cuda"), torch.zeros(1 << 10, device="cuda")

    def coalesced():
        with dist._coalescing_manager(pg, device=a.device):
            dist.all_reduce(a)
            dist.all_reduce(b)

    def batch():
        ops = [dist.P2POp(dist.isend, sent, 0), dist.P2POp(dist.irecv, got, 0)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    calls = []
    # (a lone send to itself would wait for its receive queued behind it on the same stream: batched only)
    for label, fn in (("all_reduce", lambda: dist.all_reduce(a)), ("coalesced", coalesced), ("batch_isend_irecv", batch),
                      ("all_reduce", lambda: dist.all_reduce(a)), ("batch_isend_irecv", batch)):  # fmt: skip
        t0 = perf_counter_ns()
        fn()
        t1 = perf_counter_ns()
        calls.append({"call": label, "t0": t0, "t1": t1, "group_seq_after": int(pg._get_sequence_number_for_group())})
        torch.cuda.synchronize()
    time.sleep(0.5)  # the watchdog looks every 100 ms
    dist.destroy_process_group()  # waits for the hook to have seen every work
    base = calls[0]["t0"]
    out = []
    for op, seq, started, finished in reports:
        t_start, t_end = _on_records_clock(started), _on_records_clock(finished)
        inside = [c["call"] for c in calls if t_start is not None and c["t0"] <= t_start <= c["t1"]]
        out.append({"op_type": op, "seq": seq, "started_us": None if t_start is None else (t_start - base) / 1e3,
                    "finished_us": None if t_end is None else (t_end - base) / 1e3, "started_inside": inside,
                    "time_started_type": type(started).__name__})  # fmt: skip
    windows = [{"call": c["call"], "from_us": (c["t0"] - base) / 1e3, "to_us": (c["t1"] - base) / 1e3,
                "group_seq_after": c["group_seq_after"]} for c in calls]  # fmt: skip
    return {"torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())), "calls": windows, "reports": out}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "gpu-workinfo.json"))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() or not dist.is_nccl_available():
        print("gpu_workinfo_probe: skipped: needs a CUDA GPU and NCCL (none on this machine)")
        return 0
    report = probe()
    for c in report["calls"]:
        print(f"call   {c['call']:<18} {c['from_us']:>10.1f} .. {c['to_us']:>10.1f} us   group seq after {c['group_seq_after']}")
    for r in report["reports"]:
        print(f"report {r['op_type']:<18} seq {r['seq']:>3}   started {r['started_us']} us, finished {r['finished_us']} us"
              f"   ({r['time_started_type']}; started inside {r['started_inside'] or 'no call'})")  # fmt: skip
    write_report(args.out, report)
    print(f"gpu_workinfo_probe: report in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
