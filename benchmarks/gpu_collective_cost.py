"""What instrumenting costs one collective on NCCL, in CPU time (needs a CUDA GPU).

    python benchmarks/gpu_collective_cost.py [--calls 20000] [--rounds 3] [--variants ...] [--profile DIR] [--out FILE.json]

World size 1, one process per variant and round, the variants interleaved round by round:

- ``plain``: no library.
- ``plain_timing``: no library, NCCL collective timing switched on (``_enable_collectives_timing()``, what
  the completion hook needs: a CUDA event pair per collective, read by the watchdog).
- ``plain_hook``: no library, timing on and a Python completion hook that does nothing (what any Python
  hook costs: ProcessGroupNCCL's hook thread takes the GIL for each collective).
- ``instrumented_no_hook``: ``instrument(disabled_captures=("nccl_completion",))``: without the completion
  hook (records enqueue-timed).
- ``instrumented``: ``instrument()`` before the process group, as the docs ask: the NCCL completion hook
  attached.
- ``instrumented_native_hook``: the same with ``nccl_hook="native"``: the completion hook in the native
  part's C++, no Python on torch's hook thread (``otel-torchdist build-native`` first).

Instrumented variants run the default sampling with a training step marked every 20 calls, as
``bench_hot_path.py`` marks them. Each process warms up, then times ``--calls`` all_reduces of 1024 floats
on the GPU: the calling thread's wall time per call (what the training loop feels: NCCL enqueues and
returns), and the whole process's CPU time per call from the first call to the end of the GPU's work and,
instrumented, of ``otel_torchdist.flush()`` (every thread: the completion hook's, the drain's, the
export's). The same figures on the CPU machines' ``fake`` backend are ``bench_hot_path.py``'s.

Without CUDA it says so and measures nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_check import _init, _run, write_report  # noqa: E402

VARIANTS = ("plain", "plain_timing", "plain_hook", "instrumented_no_hook", "instrumented", "instrumented_native_hook")
STEP = 20
WARMUP = 2000


def _calls(n: int, t: torch.Tensor) -> None:
    import otel_torchdist

    all_reduce, step_end, step_begin = dist.all_reduce, otel_torchdist.step_end, otel_torchdist.step_begin
    for i in range(n):
        all_reduce(t)
        if i % STEP == 0:
            step_end()
            step_begin()


def _variant(rank: int, port: int, folder: str, queue) -> None:
    variant, calls = os.environ["COLLECTIVE_COST_CASE"].split(":")
    calls = int(calls)
    torch.cuda.set_device(0)
    import otel_torchdist

    instrumented = variant.startswith("instrumented")
    if instrumented:
        off = ("nccl_completion",) if variant == "instrumented_no_hook" else ()
        hook = "native" if variant == "instrumented_native_hook" else "python"
        otel_torchdist.instrument(run_dir=folder, run_id="collective-cost", summary="none", disabled_captures=off, nccl_hook=hook)
    _init("nccl", 0, 1, port)
    if variant in ("plain_timing", "plain_hook"):
        pg = dist.distributed_c10d._get_default_group()
        pg._enable_collectives_timing()
        if variant == "plain_hook":
            pg._register_on_completion_hook(lambda info: None)
    t = torch.ones(1024, device="cuda")
    _calls(WARMUP, t)
    torch.cuda.synchronize()
    if instrumented:
        otel_torchdist.flush()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    _calls(calls, t)
    wall = time.perf_counter() - wall0
    torch.cuda.synchronize()
    if instrumented:
        otel_torchdist.flush()
    cpu = time.process_time() - cpu0
    profile_dir = os.environ.get("COLLECTIVE_COST_PROFILE")
    if profile_dir and variant != "plain":
        from gpu_ddp_overhead import profile_threads

        def again() -> None:
            _calls(calls, t)
            torch.cuda.synchronize()
            if instrumented:
                otel_torchdist.flush()

        profile_threads(again, os.path.join(profile_dir, f"{variant}.txt"))
    if instrumented:
        otel_torchdist.uninstrument()
    dist.destroy_process_group()
    queue.put((variant, {"wall_us": wall / calls * 1e6, "cpu_us": cpu / calls * 1e6}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, from: " + ", ".join(VARIANTS))
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "gpu-collective-cost.json"))
    parser.add_argument("--profile", metavar="DIR", help="run each process's calls again under yappi (every thread) into DIR/<variant>.txt")
    args = parser.parse_args(argv)
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
        os.environ["COLLECTIVE_COST_PROFILE"] = os.path.abspath(args.profile)
    if not torch.cuda.is_available() or not dist.is_nccl_available():
        print("gpu_collective_cost: skipped: needs a CUDA GPU and NCCL (none on this machine)")
        return 0
    results: dict[str, list[dict]] = {v: [] for v in args.variants.split(",")}
    if "plain" not in results or any(v not in VARIANTS for v in results):
        parser.error(f"--variants: plain and any of {', '.join(VARIANTS[1:])}")
    with tempfile.TemporaryDirectory(prefix="otel-torchdist-gpu-") as folder:
        for r in range(args.rounds):
            for variant in results:
                os.environ["COLLECTIVE_COST_CASE"] = f"{variant}:{args.calls}"
                name, result = _run(_variant, 1, folder)
                if "error" in result:
                    print(f"FAIL {variant}: {result['error']}")
                    return 1
                results[name].append(result)
                print(f"round {r} {name:<20} wall {result['wall_us']:7.2f} us a call   process CPU {result['cpu_us']:7.2f} us a call")
    summary: dict[str, dict] = {}
    print(f"{'median, us a call':<22} {'wall':>8} {'added':>8} {'cpu':>8} {'added':>8}")
    plain = {key: statistics.median(x[key] for x in results["plain"]) for key in ("wall_us", "cpu_us")}
    for variant, runs in results.items():
        got = {key: statistics.median(x[key] for x in runs) for key in ("wall_us", "cpu_us")}
        summary[variant] = {**got, **{f"added_{k}": got[k] - plain[k] for k in got}}
        print(f"{variant:<22} {got['wall_us']:8.2f} {got['wall_us'] - plain['wall_us']:+8.2f} {got['cpu_us']:8.2f} "
              f"{got['cpu_us'] - plain['cpu_us']:+8.2f}")  # fmt: skip
    report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "calls": args.calls,
              "rounds": results, "median": summary}  # fmt: skip
    write_report(args.out, report)
    print(f"gpu_collective_cost: report in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
