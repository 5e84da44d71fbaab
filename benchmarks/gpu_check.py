"""GPU verification, for a machine with a CUDA GPU: what the CPU machines this project is built on cannot show.

    python benchmarks/gpu_check.py [--out benchmarks/results/gpu-check.json]

Without CUDA it prints why it skipped and exits 0. With one (or more) GPUs it checks, each in its own
processes, and prints one line per check and a JSON report:

1. **NCCL, world size 1**: all_reduce and all_gather_into_tensor of 1 MiB to 256 MiB, each span's duration
   (the completion hook's CUDA-event time) held against CUDA events recorded around the same call on the
   current stream behind a GPU sleep, timed independently of the library.
2. **gloo on CUDA tensors, 2 ranks**: all_reduce and broadcast of CUDA tensors are recorded (op, bytes,
   device) and complete.
3. **No device synchronization added**: torch.profiler counts cudaDeviceSynchronize, cudaStreamSynchronize
   and cudaEventSynchronize calls in 50 NCCL all_reduces plain and instrumented; the counts must match.
4. **NVML sampling**: the library's GPU utilization and memory gauges next to what pynvml reads directly.
5. **A DDP step's overhead**: median step of a DDP model (NCCL, world size 1), plain, instrumented, plain
   again, each in a process of its own.
6. **Where that overhead comes from** (unless ``--no-breakdown``): ``benchmarks/gpu_ddp_overhead.py`` on the
   small model, plain against torch's own Python comm hook, the library (its native part records DDP's
   buckets when built: ``otel-torchdist build-native`` first), the library through its Python comm hook
   (``native="off"``) and the library without its DDP capture, three rounds; with yappi installed, a
   per-thread profile of each instrumented variant next to the report. Reported, not judged.
7. **One NCCL collective's cost** (unless ``--no-breakdown``): ``benchmarks/gpu_collective_cost.py``, one
   round: plain, an empty Python completion hook, the library without its completion hook
   (``disabled_captures=("nccl_completion",)``), the library, and the library with its hook in C++
   (``nccl_hook="native"``). Reported, not judged.

A failed check prints FAIL and the script exits 1. The last run's figures are in docs/performance.md (the
GPU row) and benchmarks/results/ (the newest *-gpu-check.md).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import socket
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES = [1 << 20, 16 << 20, 256 << 20]
BREAKDOWN = "plain,plain_python_hook,instrumented,instrumented_comm_hook,instrumented_no_ddp"
SYNC_CALLS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_report(path: str, report: dict) -> None:
    """The JSON report at ``path``, its folder made first (a new ``--out`` folder must not fail after the
    GPU work has run)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=1, default=str)


def _init(backend: str, rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))  # fmt: skip
    dist.init_process_group(backend, rank=rank, world_size=world)


def _instrument(folder: str, run_id: str, **extra) -> None:
    import otel_torchdist

    otel_torchdist.instrument(run_dir=folder, run_id=run_id, traces_exporter="file", metrics_exporter=("file",),
                              summary="none", trace_first_steps=0, trace_every_steps=1, **extra)  # fmt: skip


def _value(v: dict):
    # OTLP/JSON writes 64-bit integers as strings
    kind, value = next(iter(v.items()))
    return int(value) if kind in ("intValue", "asInt") else value


def _spans(folder: str, run_id: str) -> list[dict]:
    out = []
    for path in glob.glob(os.path.join(folder, run_id, "traces.rank*.jsonl")):
        for line in open(path):
            for rs in json.loads(line)["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for s in ss["spans"]:
                        attrs = {a["key"]: _value(a["value"]) for a in s["attributes"]}
                        out.append({"name": s["name"], "attributes": attrs, "start": int(s["startTimeUnixNano"]), "end": int(s["endTimeUnixNano"])})
    return out


# ------------------------------------------------------------------------------------------- checks
def nccl_vs_cuda_events(rank: int, port: int, folder: str, queue) -> None:
    """1: NCCL world size 1, span durations against CUDA events.

    A GPU sleep is queued before each call, so the events time the GPU's work and not the host's time to
    issue the call (an idle GPU would count that too). At world size 1 an in-place all_reduce has nothing to
    move; all_gather_into_tensor copies S bytes, so its time grows with S.
    """
    torch.cuda.set_device(0)
    _instrument(folder, "nccl-events")
    _init("nccl", 0, 1, port)
    events = []
    for size in SIZES:
        t = torch.ones(size // 4, device="cuda")
        out = torch.empty_like(t)
        for op in ("all_reduce", "all_gather_into_tensor"):
            for _ in range(5):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda._sleep(2_000_000)
                start.record()
                if op == "all_reduce":
                    dist.all_reduce(t)
                else:
                    dist.all_gather_into_tensor(out, t)
                end.record()
                events.append((op, size, start, end))
        del t, out
    torch.cuda.synchronize()
    measured = [(op, size, s.elapsed_time(e) / 1000.0) for op, size, s, e in events]
    import otel_torchdist

    otel_torchdist.uninstrument()
    dist.destroy_process_group()
    spans = _spans(folder, "nccl-events")
    rows = []
    for op in ("all_reduce", "all_gather_into_tensor"):
        for size in SIZES:
            mine = [s["attributes"] for s in spans if s["attributes"].get("torchdist.collective.op") == op
                    and s["attributes"].get("torchdist.collective.message_size") == size]  # fmt: skip
            ours = sorted(a["torchdist.collective.duration_s"] for a in mine)
            theirs = sorted(d for o, s, d in measured if o == op and s == size)
            rows.append({"op": op, "bytes": size, "span_median_s": statistics.median(ours) if ours else None,
                         "cuda_events_median_s": statistics.median(theirs), "calls": len(ours),
                         "end_sources": sorted({str(a.get("torchdist.collective.end_source")) for a in mine})})  # fmt: skip
    queue.put(("nccl_vs_cuda_events", rows))


def gloo_cuda_tensors(rank: int, port: int, folder: str, queue) -> None:
    """2: two gloo ranks on CUDA tensors."""
    torch.cuda.set_device(rank % torch.cuda.device_count())
    _instrument(folder, "gloo-cuda")
    _init("gloo", rank, 2, port)
    t = torch.ones(1 << 18, device="cuda")
    for _ in range(3):
        dist.all_reduce(t)
        dist.broadcast(t, src=0)
    torch.cuda.synchronize()
    ok = bool(torch.allclose(t, torch.full_like(t, 8.0)))
    import otel_torchdist

    otel_torchdist.uninstrument()
    dist.destroy_process_group()
    if rank == 0:
        spans = [s for s in _spans(folder, "gloo-cuda") if "torchdist.collective.op" in s["attributes"]]
        counts: dict = {}
        for s in spans:
            key = s["attributes"]["torchdist.collective.op"]
            counts[key] = counts.get(key, 0) + 1
        queue.put(("gloo_cuda_tensors", {"result_correct": ok, "spans_by_op": counts,
                                         "bytes": sorted({s["attributes"].get("torchdist.collective.message_size") for s in spans})}))  # fmt: skip


def _sync_calls(instrumented: bool, folder: str) -> dict:
    from torch.profiler import ProfilerActivity, profile

    t = torch.ones(1 << 20, device="cuda")
    for _ in range(5):
        dist.all_reduce(t)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(50):
            dist.all_reduce(t)
        torch.cuda.synchronize()  # once, by this script, in both runs
    counts = {name: 0 for name in SYNC_CALLS}
    for e in prof.events():
        if e.name in counts:
            counts[e.name] += 1
    return counts


def no_sync_added(rank: int, port: int, folder: str, queue) -> None:
    """3: device synchronizations, plain vs instrumented."""
    torch.cuda.set_device(0)
    _init("nccl", 0, 1, port)
    plain = _sync_calls(False, folder)
    dist.destroy_process_group()
    _instrument(folder, "sync")
    _init("nccl", 0, 1, port + 1)
    instrumented = _sync_calls(True, folder)
    import otel_torchdist

    otel_torchdist.uninstrument()
    dist.destroy_process_group()
    queue.put(("no_sync_added", {"plain": plain, "instrumented": instrumented}))


def nvml_sampling(rank: int, port: int, folder: str, queue) -> None:
    """4: the library's NVML gauges next to pynvml's own reading of the same GPU, the same moment."""
    import pynvml

    torch.cuda.set_device(0)
    _instrument(folder, "nvml", system_interval=0.5, metric_export_interval=0.5)
    _init("nccl", 0, 1, port)
    a = torch.randn(4096, 4096, device="cuda")
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        a = a @ a
        a = a / a.norm()
    torch.cuda.synchronize()
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    # version 2 leaves out the driver's reserved memory, as nvidia-smi and the library do
    direct = {"memory_used_bytes": pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2).used,
              "utilization": pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100}  # fmt: skip
    import otel_torchdist

    otel_torchdist.uninstrument()
    dist.destroy_process_group()
    ours: dict = {}
    for line in open(glob.glob(os.path.join(folder, "nvml", "metrics.rank0.jsonl"))[0]):
        for rm in json.loads(line)["resourceMetrics"]:
            for sm in rm["scopeMetrics"]:
                for m in sm["metrics"]:
                    if m["name"] in ("torchdist.gpu.utilization", "torchdist.gpu.memory.used"):
                        points = (m.get("gauge") or m.get("sum"))["dataPoints"]
                        ours.setdefault(m["name"], []).extend(float(p["asDouble"]) if "asDouble" in p else int(p["asInt"]) for p in points)
    # the series over the busy seconds: the busiest sample and the last memory reading
    queue.put(("nvml_sampling", {"library": {"utilization_max": max(ours.get("torchdist.gpu.utilization") or [None]),
                                             "memory_used_last": (ours.get("torchdist.gpu.memory.used") or [None])[-1]},
                                 "pynvml": direct}))  # fmt: skip


def time_steps(model, opt, x, steps: int, warmup: int) -> list[float]:
    """Seconds of each DDP step after ``warmup`` (each ends with the GPU's work: ``torch.cuda.synchronize``)."""
    times = []
    for i in range(warmup + steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def _ddp_steps() -> float:
    import torch.nn as nn

    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024)).cuda())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(256, 1024, device="cuda")
    return statistics.median(time_steps(model, opt, x, 200, 30))


def ddp_plain(rank: int, port: int, folder: str, queue) -> None:
    torch.cuda.set_device(0)
    _init("nccl", 0, 1, port)
    queue.put(("ddp_plain", _ddp_steps()))
    dist.destroy_process_group()


def ddp_instrumented(rank: int, port: int, folder: str, queue) -> None:
    """Instrumented before the group exists, as the docs ask: its NCCL collectives are hooked from the first."""
    import otel_torchdist

    torch.cuda.set_device(0)
    otel_torchdist.instrument(run_dir=folder, run_id="ddp", summary="none")
    _init("nccl", 0, 1, port)
    queue.put(("ddp_instrumented", _ddp_steps()))
    otel_torchdist.uninstrument()
    dist.destroy_process_group()


# 5, a DDP step's overhead: median step of 200 after 30 of warm-up, plain and instrumented in processes of their own
CHECKS = [(nccl_vs_cuda_events, 1), (gloo_cuda_tensors, 2), (no_sync_added, 1), (nvml_sampling, 1),
          (ddp_plain, 1), (ddp_instrumented, 1), (ddp_plain, 1)]  # fmt: skip


def verdict(name: str, result) -> tuple[bool, str]:
    if name == "nccl_vs_cuda_events":
        # the events also hold two cross-stream waits (current stream -> NCCL's and back): a few microseconds
        bad = [r for r in result if r["span_median_s"] is None or r["end_sources"] != ["nccl_completion_hook"]
               or abs(r["span_median_s"] - r["cuda_events_median_s"]) > max(0.1 * r["cuda_events_median_s"], 20e-6)]  # fmt: skip
        return not bad, "; ".join(f"{r['op']} {r['bytes'] >> 20} MiB: span {r['span_median_s']} s vs events {r['cuda_events_median_s']:.6f} s" for r in result)
    if name == "gloo_cuda_tensors":
        return result["result_correct"] and result["spans_by_op"].get("all_reduce", 0) >= 6, json.dumps(result)
    if name == "no_sync_added":
        return result["plain"] == result["instrumented"], json.dumps(result)
    if name == "nvml_sampling":
        used, util = result["library"]["memory_used_last"], result["library"]["utilization_max"]
        near = used is not None and abs(used - result["pynvml"]["memory_used_bytes"]) < 0.2 * result["pynvml"]["memory_used_bytes"]
        return near and util is not None and util > 0.5, json.dumps(result)
    if name in ("ddp_plain", "ddp_instrumented"):
        return True, f"median step {result * 1e3:.3f} ms"
    return False, "unknown check"


def _run(fn, world: int, folder: str) -> tuple[str, object]:
    import queue as queues

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _port()
    procs = [ctx.Process(target=fn, args=(r, port, folder, queue)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                return queue.get(timeout=1)
            except queues.Empty:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    return fn.__name__, {"error": f"a process of the check died (exit codes {dead}): see its output above"}
        return fn.__name__, {"error": "no result within 300 s"}
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "gpu-check.json"))
    parser.add_argument("--no-breakdown", action="store_true", help="skip checks 6 and 7 (gpu_ddp_overhead.py, gpu_collective_cost.py)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_check: SKIPPED: no CUDA GPU here (torch.cuda.is_available() is False); nothing was measured")
        return 0
    report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())), "checks": {}}
    failed = False
    with tempfile.TemporaryDirectory() as folder:
        for fn, world in CHECKS:
            name, result = _run(fn, world, folder)
            try:
                ok, line = (False, result["error"]) if isinstance(result, dict) and "error" in result else verdict(name, result)
            except Exception as exc:  # a check's report this script did not expect: say so, run the others
                ok, line = False, f"{exc!r} reading {json.dumps(result, default=str)}"
            failed |= not ok
            report["checks"].setdefault(name, []).append({"ok": ok, "result": result})
            print(f"{'ok  ' if ok else 'FAIL'} {name}: {line}", flush=True)
            write_report(args.out, report)  # after every check: a later one that hangs loses nothing
    plain = [c["result"] for c in report["checks"].get("ddp_plain", []) if c["ok"]]
    ours = [c["result"] for c in report["checks"].get("ddp_instrumented", []) if c["ok"]]
    if plain and ours:
        print(f"     DDP step overhead: {ours[0] / statistics.mean(plain) - 1:+.1%} (instrumented against the mean of the plain runs around it)")
    if not args.no_breakdown:
        # 6: where the DDP step's overhead comes from (benchmarks/results/2026-11-26b-gpu-check.md): reported, not judged
        import subprocess

        here = os.path.dirname(os.path.abspath(__file__))
        out_dir = os.path.dirname(os.path.abspath(args.out))
        command = [sys.executable, os.path.join(here, "gpu_ddp_overhead.py"), "--models", "small", "--variants", BREAKDOWN,
                   "--rounds", "3", "--out", os.path.join(out_dir, "gpu-ddp-overhead.json")]  # fmt: skip
        try:
            import yappi  # noqa: F401

            command += ["--profile", out_dir]
        except ImportError:
            print("     (pip install yappi for a per-thread profile of the instrumented DDP steps)")
        print("     DDP step overhead, by part:", flush=True)
        subprocess.run(command, timeout=600)
        # 7: one NCCL collective's cost, with and without the completion hook: reported, not judged
        print("     an NCCL collective's cost, by part:", flush=True)
        command = [sys.executable, os.path.join(here, "gpu_collective_cost.py"), "--rounds", "1", "--calls", "10000",
                   "--variants", "plain,plain_hook,instrumented_no_hook,instrumented,instrumented_native_hook",
                   "--out", os.path.join(out_dir, "gpu-collective-cost.json")]  # fmt: skip
        subprocess.run(command, timeout=300)
    print(f"gpu_check: report in {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
