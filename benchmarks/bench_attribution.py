"""What attribution costs: framework context on the hot path, module tracking, and the deep (compile) mode.

    python benchmarks/bench_attribution.py [--calls 20000] [--repeats 7]

All on the ``fake`` backend (collectives cost only their Python path), interleaved rounds, median/min/max:

* collective inside a framework context (what DDP buckets, FSDP units, optimizer steps set) vs outside;
* module tracking (the hooks put on tensor-parallel models): cost per module call, forward only and forward
  with backward (the output's gradient hook that makes a module's backward a context);
* a collective no framework names, in a traced step: finding its module on the stack (``context.on_stack``);
* ``autograd.Function.apply`` (capture/functions.py): its check in an untraced step;
* the deep mode that sees compiled collectives: cost per plain aten op and per collective.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.testing._internal.distributed.fake_pg import FakeStore


def _per_call(fn, calls: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - start) / calls / 1e3


def _stats(values: list[float]) -> str:
    return f"{statistics.median(values):8.2f} {min(values):8.2f} {max(values):8.2f}"


class _Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


class _Issuer(nn.Module):
    """A module four calls deep, whose forward looks up a collective record's module as the c10d and
    functional captures do (a record made once: the lookup alone is timed)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Sequential(nn.Sequential(_Lookup())))

    def forward(self, calls: int, traced: bool) -> float:
        return self.inner((calls, traced))


class _Lookup(nn.Module):
    def forward(self, job: tuple) -> float:
        from otel_torchdist.capture import context
        from otel_torchdist.capture import record as R

        calls, traced = job
        rec = R.new("all_reduce", "all_reduce", "c10d", 0)
        rec[R.STEPCTX] = (1, 1, 1, traced)  # the step's serial, trace, span, traced flag
        start = time.perf_counter_ns()
        for _ in range(calls):
            rec[R.CTX] = None
            context.on_stack(rec)
        return (time.perf_counter_ns() - start) / calls / 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)

    import otel_torchdist
    from otel_torchdist import runtime
    from otel_torchdist.capture import context
    from otel_torchdist.capture.deep import deep_capture

    torch.set_num_threads(1)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    otel_torchdist.instrument(
        run_dir=tempfile.mkdtemp(prefix="otel-torchdist-bench-"),
        run_id="attribution",
        traces_sampler="always_off",
        metrics_exporter=("file",),
        traces_exporter="file",
        drain_interval=3600.0,
        max_queued_records=10**7,
        summary="none",
        system_metrics=False,
    )
    pipeline = runtime.current().pipeline
    t = torch.ones(1024)
    a = torch.ones(64)
    layers = 32
    model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(layers)])
    tracked = nn.Sequential(*[nn.Linear(16, 16) for _ in range(layers)])
    context.TRACKER.track(tracked)
    x = torch.randn(2, 16)
    issuer = _Issuer()
    rows: dict[str, list[float]] = {k: [] for k in (
        "collective, no context", "collective, framework context", "added by the context",
        "module forward, plain", "module forward, tracked", "added per module call",
        "module fwd+bwd, plain", "module fwd+bwd, tracked", "added per module fwd+bwd",
        "on_stack, untraced step", "on_stack, traced step", "added per collective (module lookup)",
        "Function.apply, plain", "Function.apply, instrumented", "added per apply (untraced step)",
        "aten add, plain", "aten add, deep mode", "added per aten op",
        "collective, plain capture", "collective, deep mode on", "added per collective (deep mode)",
    )}  # fmt: skip
    chunk = 2000
    for _ in range(args.repeats):
        no_ctx = with_ctx = 0.0
        for _ in range(args.calls // chunk):
            no_ctx += _per_call(lambda: dist.all_reduce(t), chunk)
            token = context.push(framework="ddp", phase="backward", extras=("torchdist.ddp.bucket.index", 0))
            with_ctx += _per_call(lambda: dist.all_reduce(t), chunk)
            context.pop(token)
            pipeline.drain()
        k = args.calls // chunk
        rows["collective, no context"].append(no_ctx / k)
        rows["collective, framework context"].append(with_ctx / k)
        rows["added by the context"].append((with_ctx - no_ctx) / k)
        plain = _per_call(lambda: model(x), 500) / layers
        hooked = _per_call(lambda: tracked(x), 500) / layers
        rows["module forward, plain"].append(plain)
        rows["module forward, tracked"].append(hooked)
        rows["added per module call"].append(hooked - plain)
        xg = x.clone().requires_grad_()
        plain = _per_call(lambda: model(xg).sum().backward(), 200) / layers
        hooked = _per_call(lambda: tracked(xg).sum().backward(), 200) / layers
        rows["module fwd+bwd, plain"].append(plain)
        rows["module fwd+bwd, tracked"].append(hooked)
        rows["added per module fwd+bwd"].append(hooked - plain)
        untraced, traced = (issuer(chunk, step) for step in (False, True))
        rows["on_stack, untraced step"].append(untraced)
        rows["on_stack, traced step"].append(traced)
        rows["added per collective (module lookup)"].append(traced - untraced)
        plain_apply = torch.autograd.Function.__dict__["apply"].__func__.__wrapped__
        ag = a.clone().requires_grad_()
        plain = _per_call(lambda: plain_apply(_Identity, ag), args.calls)
        patched = _per_call(lambda: _Identity.apply(ag), args.calls)
        rows["Function.apply, plain"].append(plain)
        rows["Function.apply, instrumented"].append(patched)
        rows["added per apply (untraced step)"].append(patched - plain)
        plain = _per_call(lambda: torch.add(a, a), args.calls)
        with deep_capture():
            deep = _per_call(lambda: torch.add(a, a), args.calls)
        rows["aten add, plain"].append(plain)
        rows["aten add, deep mode"].append(deep)
        rows["added per aten op"].append(deep - plain)
        plain = _per_call(lambda: dist.all_reduce(t), chunk)
        with deep_capture():
            deep = _per_call(lambda: dist.all_reduce(t), chunk)
        pipeline.drain()
        rows["collective, plain capture"].append(plain)
        rows["collective, deep mode on"].append(deep)
        rows["added per collective (deep mode)"].append(deep - plain)
    otel_torchdist.uninstrument()
    dist.destroy_process_group()
    print(f"# fake backend, {args.calls} calls x {args.repeats} rounds, {layers}-layer Linear model for module calls")
    print(f"{'variant':<40} {'median':>8} {'min':>8} {'max':>8}   (us)")
    for name, values in rows.items():
        print(f"{name:<40} {_stats(values)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
