"""What instrumenting costs a DDP step on NCCL, and which part costs it (needs a CUDA GPU).

    python benchmarks/gpu_ddp_overhead.py [--steps 200] [--rounds 2] [--out FILE.json]

World size 1, one process per variant and round, the variants interleaved round by round, for two models:
``small`` (two linear layers, a ~1 ms step: the library's per-step cost shows) and ``medium`` (four
4096x4096 layers, a step of several ms). The variants separate the library's costs:

- ``plain``: no library.
- ``plain_timing``: no library, NCCL collective timing switched on (what the completion hook needs):
  torch's CUDA events per collective and its hook thread.
- ``instrumented``: ``instrument()`` before the process group, as the docs ask (the NCCL hook attached).
- ``instrumented_no_hook``: the same without the NCCL completion hook (records enqueue-timed).
- ``plain_python_hook``: no library, torch's own Python ``allreduce_hook`` registered as DDP's comm hook
  (what any Python comm hook costs: the library's DDP capture is one).
- ``instrumented_no_ddp``: ``instrument()`` without the DDP capture (its buckets are not recorded).

- ``instrumented_comm_hook``: ``instrument(native="off")``: DDP's buckets through the library's Python comm
  hook, as without the native part (``otel-torchdist build-native``), where ``instrumented`` has the native
  process group record them when the part is built.
- ``instrumented_slow_drain``: ``instrument()`` with the drain thread waking every 60 s instead of 0.2 s, so
  it does not run during the timed steps (whether the drain's work on other threads slows the steps).

``--variants`` picks some (default: the first four), ``--models`` the models. ``--profile DIR``: each
instrumented process then runs its steps again under yappi (wall clock, every thread, C functions too) and
writes ``DIR/<variant>-<model>.txt``, the busiest functions of each thread (needs ``pip install yappi``).

Each process reports the median and mean of its timed steps (each step ends with ``torch.cuda.synchronize``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_check import _init, _run, time_steps  # noqa: E402

VARIANTS = ("plain", "plain_timing", "instrumented", "instrumented_no_hook", "plain_python_hook", "instrumented_no_ddp",
            "instrumented_slow_drain", "instrumented_comm_hook")  # fmt: skip
MODELS = ("small", "medium")
# instrument()'s options of the variants that set any
OPTIONS = {"instrumented_slow_drain": {"drain_interval": 60.0}, "instrumented_no_ddp": {"disabled_captures": ("ddp",)},
           "instrumented_comm_hook": {"native": "off"}}  # fmt: skip


def _model(kind: str) -> tuple[torch.nn.Module, torch.Tensor]:
    nn = torch.nn
    if kind == "small":
        return nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024)), torch.randn(256, 1024)
    layers = [m for _ in range(4) for m in (nn.Linear(4096, 4096), nn.ReLU())]
    return nn.Sequential(*layers), torch.randn(1024, 4096)


def _steps(kind: str, steps: int, python_hook: bool, warmup: int = 30) -> list[float]:
    torch.manual_seed(0)
    module, x = _model(kind)
    model = torch.nn.parallel.DistributedDataParallel(module.cuda())
    if python_hook:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        model.register_comm_hook(None, allreduce_hook)
    return time_steps(model, torch.optim.SGD(model.parameters(), lr=1e-4), x.cuda(), steps, warmup)


def profile_threads(run, path: str, top: int = 25) -> None:
    """``run()`` under yappi's wall clock, every thread: each thread's busiest functions (own time) to ``path``.
    Wall time, so a thread waiting for the GIL inside a function shows there."""
    import yappi

    yappi.clear_stats()
    yappi.set_clock_type("wall")
    yappi.start(builtins=True, profile_threads=True)
    try:
        run()
    finally:
        yappi.stop()
    with open(path, "w") as f:
        for thread in sorted(yappi.get_thread_stats(), key=lambda t: -t.ttot):
            f.write(f"\n== thread {thread.name} (id {thread.id}, tid {thread.tid}): {thread.ttot:.4f} s, {thread.sched_count} scheduled\n")
            stats = yappi.get_func_stats(filter={"ctx_id": thread.id}).sort("tsub")
            for i, fs in enumerate(stats):
                if i >= top:
                    break
                f.write(f"{fs.tsub:10.5f} own {fs.ttot:10.5f} total {fs.ncall:8d} calls  {fs.module}:{fs.lineno} {fs.name}\n")
    yappi.clear_stats()


def _count_ddp_paths() -> dict:
    """Count calls of the DDP capture's paths from now on (the comm hook, its general path, a bucket's facts
    made): wrappers put in the module before the model that the next steps build registers its hook."""
    from otel_torchdist.capture import ddp

    counts = {}
    for name in ("otel_torchdist_ddp_hook", "_general", "_bucket", "_derive"):
        counts[name] = 0

        def counted(*args, _orig=getattr(ddp, name), _name=name, **kwargs):
            counts[_name] += 1
            return _orig(*args, **kwargs)

        setattr(ddp, name, counted)
    return counts


def _variant(rank: int, port: int, folder: str, queue) -> None:
    variant, kind, steps = os.environ["DDP_OVERHEAD_CASE"].split(":")
    torch.cuda.set_device(0)
    instrumented = variant.startswith("instrumented")
    if instrumented:
        import otel_torchdist
        from otel_torchdist.capture import groups

        if variant == "instrumented_no_hook":
            groups._completion_attachers.clear()  # this process only: the NCCL hook is never attached
        extra = OPTIONS.get(variant, {})
        otel_torchdist.instrument(run_dir=folder, run_id=f"{variant}-{kind}", summary="none", **extra)
    _init("nccl", 0, 1, port)
    if variant == "plain_timing":
        dist.distributed_c10d._get_default_group()._enable_collectives_timing()
    times = _steps(kind, int(steps), variant == "plain_python_hook")
    profile_dir = os.environ.get("DDP_OVERHEAD_PROFILE")
    if profile_dir and instrumented:
        path = os.path.join(profile_dir, f"{variant}-{kind}.txt")
        counts = _count_ddp_paths()
        profile_threads(lambda: _steps(kind, int(steps), False, warmup=0), path)
        with open(path, "a") as f:  # calls per step of the DDP capture's paths: a bucket's facts are made once
            f.write("\n== DDP capture calls per step: " + json.dumps({k: v / int(steps) for k, v in counts.items()}) + "\n")
    if instrumented:
        otel_torchdist.uninstrument()
    dist.destroy_process_group()
    queue.put((variant, {"model": kind, "median_ms": statistics.median(times) * 1e3, "mean_ms": statistics.mean(times) * 1e3}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variants", default=",".join(VARIANTS[:4]), help="comma-separated, from: " + ", ".join(VARIANTS))
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated, from: " + ", ".join(MODELS))
    parser.add_argument("--profile", metavar="DIR", help="profile each instrumented process's steps again under yappi into DIR")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "gpu-ddp-overhead.json"))
    args = parser.parse_args(argv)
    variants, models = args.variants.split(","), args.models.split(",")
    unknown = sorted(set(variants) - set(VARIANTS)) + sorted(set(models) - set(MODELS))
    if unknown:
        parser.error(f"unknown variant or model: {', '.join(unknown)}")
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
        os.environ["DDP_OVERHEAD_PROFILE"] = os.path.abspath(args.profile)  # the spawned processes inherit it
    if not torch.cuda.is_available():
        print("gpu_ddp_overhead: SKIPPED: no CUDA GPU here (torch.cuda.is_available() is False); nothing was measured")
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for kind in models:
            for round_ in range(args.rounds):
                for variant in variants:
                    os.environ["DDP_OVERHEAD_CASE"] = f"{variant}:{kind}:{args.steps}"  # the spawned process reads it
                    name, result = _run(_variant, 1, folder)
                    if "error" in result:
                        print(f"FAIL {variant} {kind}: {result['error']}", flush=True)
                        continue
                    rows.append({"variant": name, "round": round_, **result})
                    print(f"{kind:6} round {round_} {name:22} median {result['median_ms']:.3f} ms  mean {result['mean_ms']:.3f} ms", flush=True)
    for kind in models:
        plain = [r["median_ms"] for r in rows if r["model"] == kind and r["variant"] == "plain"]
        plain = statistics.mean(plain) if plain else None
        for variant in variants:
            if variant == "plain":
                continue
            mine = [r["median_ms"] for r in rows if r["model"] == kind and r["variant"] == variant]
            if plain and mine:
                delta = statistics.mean(mine) - plain
                print(f"{kind:6} {variant:22} {delta * 1e3:+8.1f} us a step ({delta / plain:+.1%}) against plain")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
