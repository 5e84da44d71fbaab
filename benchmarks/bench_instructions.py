"""Instructions, not seconds: what otel-torchdist and the alternatives add, counted by callgrind.

    python benchmarks/bench_instructions.py [--steps 40] [--calls 4000] [--idle 20] [--batch 32] [--only ddp|hot]
                                            [--variants "DDP plain,DDP instrumented,..."]

Needs valgrind (``apt-get install valgrind``); takes about 20 minutes on 2 cores. On a shared or small
machine wall time moves by more than a 1 % effect (see docs/performance.md), while the instructions a
piece of code executes do not depend on what else runs there. So this benchmark runs two processes under
callgrind and counts every thread's instructions per section of work (``callgrind_control --zero`` before
it, ``--dump`` after). Each measurement is two sections of different lengths, ``n/4`` and ``n`` steps (or
calls); their difference divided by the difference in length is the cost per step, without the fixed costs
(a flush's metric export, the profiler's start and stop, callgrind's own requests).

* DDP (1 gloo rank, the MLP of bench_training.py): plain (no comm hook: what DDP does unless told
  otherwise), DDP's builtin C++ ``ALLREDUCE`` hook, the leanest Python comm hook possible (scale,
  all-reduce, hand the tensor back: what any Python comm hook costs), a Python process group under the
  reducer instead of a hook (no scaling pass, but Python called from C++ per bucket), the native part's
  C++ process group under the reducer alone (``otel_torchdist/native``, built when missing), torch's Python
  ``allreduce_hook``, CommDebugMode and torch.profiler (CPU activities, its ``__exit__``, which processes the events,
  counted) on the plain model, then instrumented with the default settings (the native process group under
  the reducer) in steady state and with every step traced, and through the comm hook (``native="off"``);
  FSDP2 plain and instrumented. A comm hook, any comm hook, costs DDP a pass over each bucket:
  without one the reducer scales gradients by 1/world size while copying them into the bucket; with one
  it copies them as they are and the hook divides the bucket. otel-torchdist's timers (drain, export,
  system metrics) are held back in these sections; a flush after each counts the deferred work of its
  steps ("deferred"), and the idle section counts what the timers cost at rest, per second, default
  settings. The timer threads that still tick when held back (span export's 1 s tick, the Prometheus
  server's poll, the hang watchdog's scan) tick per second of wall time, and a step under callgrind takes
  many times its real time: the threads busy in a section where the training thread sleeps are those
  timers, and what they did during the steps ("timers") is taken out of all threads.
* The hot path (fake backend, 1024-element ``all_reduce``): per configuration, plain calls, the training
  thread's instrumented calls and the flush that drains and exports them (the deferred cost), per
  collective and in units of one plain call (the default settings also without the native part, whose C++
  takes the c10d wrapper's common case); the same for a functional collective (``funcol.all_reduce`` and its
  wait, what DTensor and tensor parallel issue) with the default settings.

Counts include the interpreter's garbage collections wherever they fall, so they move a little between
runs. Instructions are not time: a cache miss or a thread hand-off (each DDP bucket's completion runs
Python on gloo's thread, under the GIL) costs time no instruction count shows. Read this beside
bench_training.py, not instead of it.
"""

from __future__ import annotations

import argparse
import gc
import glob
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

STEP = 20  # collectives per training step in the hot path's default-sampling section


def _callgrind(option: str) -> None:
    """Ask callgrind to act on this process; returns once it has (callgrind_control waits for it)."""
    subprocess.run(["callgrind_control", option, str(os.getpid())], check=True, stdout=subprocess.DEVNULL)


def _section(label: str, work) -> None:
    """Count ``work``: zero every thread's counters, run it, dump them tagged ``label``.

    The garbage collector runs first, so that a section holds the collections its own allocations set off
    and not a full one the process's whole history was due: a full collection walks every object of the
    process (torch's 300 k), 2 M instructions, which in a flush section moves a DDP step's deferred work by
    66 k."""
    gc.collect()
    _callgrind("--zero")
    work()
    _callgrind("--dump=" + label)


# ------------------------------------------------------------------------------------------ DDP child
# Everything otel-torchdist does on a timer waits past the sections, so that the flush that ends each one
# is where the deferred work of its steps is counted; what the timers cost on their own is the idle section.
QUIET = dict(drain_interval=3600.0, span_schedule_delay=3600.0, metric_export_interval=3600.0, system_interval=3600.0,
             slow_step_factor=1e9)  # fmt: skip
# The step after a section boundary is slow (callgrind_control's runs, the flush): a slow-step warning (its
# log line and warning span) would land in whichever section's flush the warnings' one-per-hundred-steps
# limit let through. A factor no step reaches keeps the per-step check and never warns.
TIMERS_S = 11.0  # seconds of the section that finds the timer threads (busy while the training thread sleeps;
# the hang watchdog scans every 10 s at most)


def _ddp_child(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.profiler import ProfilerActivity, profile

    import otel_torchdist
    from otel_torchdist import runtime
    from bench_training import STEADY, _fsdp_mlp, _mlp

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    options = dict(run_dir=tempfile.mkdtemp(prefix="otel-torchdist-bench-"), summary="none", prometheus_port=0)
    x = torch.randn(args.batch, 64, generator=torch.Generator().manual_seed(0))

    def trainer(model):
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

        def step():
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()

        return step

    def steps(step, n):
        for _ in range(n):
            step()

    def wanted(label):
        return args.variants is None or label in args.variants

    def counted(label, step, flush=None, warm=0):
        """Two sections of different lengths: their difference is the cost per step, without fixed costs."""
        if not wanted(label):
            return
        steps(step, warm)
        for n in _lengths(args.steps):
            _section(f"{label}:{n}:steps", lambda: steps(step, n))
            if flush is not None:
                _section(f"{label}:{n}:flush", flush)

    def instrumented(label, step, **extra):
        if not wanted(label):
            return
        otel_torchdist.instrument(**options, **QUIET, **extra)
        flush = lambda: runtime.current().flush(600)  # noqa: E731
        steps(step, STEADY)  # past the steps the default sampling traces in full
        flush()
        counted(label, step, flush)
        # The timer threads that still tick while held back (span export's 1 s tick, the Prometheus server's
        # poll, the hang watchdog's scan) tick per second of wall time, and a step under callgrind takes many
        # times its real time. The threads busy while nothing else runs are those timers: _report_ddp takes
        # them out of the steps.
        _section(f"{label}:0:timers", lambda: time.sleep(TIMERS_S))
        otel_torchdist.uninstrument()

    plain_step = trainer(DDP(_mlp()))  # measured before any instrument(), which would give it the trampoline
    counted("DDP plain", plain_step, warm=3)

    builtin = DDP(_mlp())
    builtin._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
    counted("DDP builtin C++ hook", trainer(builtin), warm=3)

    python_hook = DDP(_mlp())
    python_hook.register_comm_hook(None, allreduce_hook)
    counted("DDP torch Python hook", trainer(python_hook), warm=3)

    # The least any Python comm hook can do: take the bucket, scale it (by the reciprocal of the group size, as DDP
    # without a hook does), all-reduce it, and hand DDP the tensor through a Python callback (the reducer accepts
    # only a Python object).
    def _reduced(fut):
        return fut.value()[0]

    def leanest_hook(group, bucket):
        tensor = bucket.buffer()
        tensor.mul_(1.0 / group.size())
        return group.allreduce([tensor], lean_options).get_future().then(_reduced)

    lean_options = dist.AllreduceOptions()
    lean_options.reduceOp = dist.ReduceOp.SUM
    lean = DDP(_mlp())
    lean.register_comm_hook(dist.group.WORLD, leanest_hook)
    counted("DDP leanest Python hook", trainer(lean), warm=3)

    # The other way to see DDP's buckets: no comm hook (so no scaling pass), a Python process group under the
    # reducer instead. Its all-reduce reaches Python from C++, and the reducer gets a work whose future is a
    # Python callback's, so that the completion is stamped before the training thread goes on.
    class _Waited(dist._Work):
        def __init__(self, fut):
            super().__init__()
            self._fut = fut

        def get_future(self):
            return self._fut

        def wait(self, timeout=None):
            self._fut.wait()
            return True

    def _value(fut):
        return fut.value()

    class ReducerGroup(dist.ProcessGroup):
        def __init__(self, real):
            super().__init__(real.rank(), real.size())
            self._real = real
            cpu = torch.device("cpu")
            self._register_backend(cpu, dist.ProcessGroup.BackendType.GLOO, real._get_backend(cpu))
            self._set_default_backend(dist.ProcessGroup.BackendType.GLOO)

        def allreduce(self, tensors, opts):
            return _Waited(self._real.allreduce(tensors, opts).get_future().then(_value))

    if wanted("DDP Python process group"):
        under_reducer = DDP(_mlp())
        reducer_group = ReducerGroup(dist.group.WORLD)  # held: the reducer's reference keeps no Python object
        under_reducer.reducer._update_process_group(reducer_group)
        counted("DDP Python process group", trainer(under_reducer), warm=3)

    # The native part alone (otel_torchdist/native, built with `otel-torchdist build-native`): its process group
    # under the reducer, no comm hook, nothing else of otel-torchdist; the flush takes its entries.
    if wanted("DDP native process group"):
        from otel_torchdist import native

        mod = native.load(build=True)
        under_native = DDP(_mlp())
        native_group = mod.TimedGroup(dist.group.WORLD, 0)
        under_native.reducer._update_process_group(native_group)
        counted("DDP native process group", trainer(under_native), flush=mod.take, warm=3)

    def debug_step():
        # One CommDebugMode per step: one across several steps trips over its own module stack.
        with CommDebugMode():
            plain_step()

    counted("DDP CommDebugMode", debug_step, warm=3)

    if wanted("DDP torch.profiler"):
        with profile(activities=[ProfilerActivity.CPU]):  # the profiler's one-time set-up, outside the count
            steps(plain_step, 3)
        for n in _lengths(args.steps):
            def profiled(n=n):
                with profile(activities=[ProfilerActivity.CPU]):  # its __exit__ processes the events: counted
                    steps(plain_step, n)

            _section(f"DDP torch.profiler:{n}:steps", profiled)

    # Built instrumented without the native part, a model gets the bucket trampoline (for good: the reducer
    # takes one hook); instrumented with it (the default once built), the native group under its reducer.
    otel_torchdist.instrument(**options, native="off")
    hooked_step = trainer(DDP(_mlp()))
    otel_torchdist.uninstrument()
    native_step = trainer(DDP(_mlp()))
    instrumented("DDP instrumented", native_step)
    instrumented("DDP every step traced", native_step, trace_every_steps=1)
    instrumented("DDP instrumented via comm hook", hooked_step, native="off")

    fsdp_step = trainer(_fsdp_mlp())
    counted("FSDP2 plain", fsdp_step, warm=3)
    instrumented("FSDP2 instrumented", fsdp_step)

    if wanted("idle"):  # the timers at rest, default settings: drain, span export, metric export, system metrics
        otel_torchdist.instrument(**options)
        time.sleep(2.0)
        _section("idle", lambda: time.sleep(args.idle))
        otel_torchdist.uninstrument()
    dist.destroy_process_group()


def _lengths(steps: int) -> tuple[int, int]:
    return max(1, steps // 4), steps


# ------------------------------------------------------------------------------------- hot-path child
def _hot_child(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import otel_torchdist
    from otel_torchdist import runtime
    from bench_hot_path import _loop

    torch.set_num_threads(1)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    t = torch.ones(1024)
    folder = tempfile.mkdtemp(prefix="otel-torchdist-bench-")

    def loop(n: int, step_every: int = 0) -> None:
        _loop(n, n, t, step_every=step_every)  # looks dist.all_reduce up per call: instrument() replaces it

    def count(variant: str, run, extra: dict) -> None:
        """Sections of ``run(n)`` plain, then instrumented (``extra`` options) and the flush after them."""
        for n in _lengths(args.calls):
            _section(f"{variant} plain:{n}:steps", lambda: run(n))
        otel_torchdist.instrument(
            run_dir=folder,
            run_id=f"bench-{variant}",
            metrics_exporter=("file",),
            traces_exporter="file",
            span_queue_size=args.calls + 11 * STEP,  # everything a section and its warm-up queue fits
            max_queued_records=args.calls + 11 * STEP,
            summary="none",
            system_metrics=False,
            straggler_exchange_steps=0,
            **QUIET,
            **extra,
        )
        flush = lambda: runtime.current().flush(600)  # noqa: E731
        run(11 * STEP)  # warm: group facts, call-site caches, past the 10 fully traced steps
        flush()
        for n in _lengths(args.calls):
            _section(f"{variant} hot:{n}:steps", lambda: run(n))
            _section(f"{variant} hot:{n}:flush", flush)
        otel_torchdist.uninstrument()

    loop(200)
    variants = {
        "always_on": ({"traces_sampler": "always_on", "max_spans_per_step": 0}, 0),
        "default": ({}, STEP),
        "always_off": ({"traces_sampler": "always_off"}, 0),
        "python": ({"native": "off"}, STEP),  # the c10d wrapper's Python body for every call
    }
    for variant, (extra, step_every) in variants.items():
        count(variant, lambda n, every=step_every: loop(n, every), extra)

    # Functional collectives, what DTensor and tensor parallel issue: all_reduce and its wait, default settings.
    import torch.distributed._functional_collectives as funcol

    group = dist.group.WORLD

    def funcol_loop(n: int) -> None:
        all_reduce, step_end, step_begin = funcol.all_reduce, otel_torchdist.step_end, otel_torchdist.step_begin
        for i in range(n):  # looked up per section: instrument() replaces it
            all_reduce(t, "sum", group).wait()
            if i % STEP == 0:
                step_end()
                step_begin()

    funcol_loop(200)
    count("funcol", funcol_loop, {})
    dist.destroy_process_group()


# ------------------------------------------------------------------------------------------ the parent
_PART = re.compile(r"\.(\d+)-(\d+)$")


def _read(folder: str) -> tuple[dict[str, int], dict[str, int], dict[str, dict[str, int]]]:
    """{label: instructions of the main thread}, {label: instructions of all threads}, and {label: {thread:
    instructions}} from the dumps."""
    main: dict[str, int] = {}
    every: dict[str, int] = {}
    threads: dict[str, dict[str, int]] = {}
    dumps = [(int(m.group(1)), m.group(2), p) for p in glob.glob(os.path.join(folder, "cg.*")) if (m := _PART.search(p))]
    for _, thread, path in sorted(dumps):  # in the order of the sections; the termination dump has no part
        label = count = None
        with open(path) as f:
            for line in f:
                if line.startswith("desc: Trigger: dump "):
                    label = line[len("desc: Trigger: dump ") :].strip()
                elif line.startswith("summary:"):
                    count = int(line.split()[1])
                    break
        if label is None or count is None:
            continue
        every[label] = every.get(label, 0) + count
        by_thread = threads.setdefault(label, {})
        by_thread[thread] = by_thread.get(thread, 0) + count
        if thread == "01":
            main[label] = main.get(label, 0) + count
    return main, every, threads


def _run_children(args: argparse.Namespace) -> dict[str, tuple[dict[str, int], dict[str, int], dict[str, dict[str, int]]]]:
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))
    work = tempfile.mkdtemp(prefix="otel-torchdist-callgrind-")
    procs = {}
    for child in ("ddp", "hot") if args.only is None else (args.only,):
        folder = os.path.join(work, child)
        os.makedirs(folder)
        cmd = [
            "valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={folder}/cg.%p",
            sys.executable, os.path.abspath(__file__), "--child", child,
            "--steps", str(args.steps), "--calls", str(args.calls), "--idle", str(args.idle), "--batch", str(args.batch),
        ] + (["--variants", ",".join(args.variants)] if args.variants else [])  # fmt: skip
        log = open(os.path.join(folder, "log.txt"), "w")
        procs[child] = (subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), folder, log)
    results = {}
    for child, (proc, folder, log) in procs.items():
        proc.wait()
        log.close()
        if proc.returncode != 0:
            sys.stderr.write(open(os.path.join(folder, "log.txt")).read()[-4000:])
            raise SystemExit(f"the {child} run under callgrind failed (exit {proc.returncode}); its log is above")
        results[child] = _read(folder)
    shutil.rmtree(work, ignore_errors=True)
    return results


def _per_unit(counts: dict[str, int], total: int) -> dict[tuple[str, str], float]:
    """{(variant, "steps"|"flush"): instructions per step (or per call)} from the two section lengths."""
    short, long = _lengths(total)
    out = {}
    for label in counts:
        variant, n, kind = label.rsplit(":", 2)
        if int(n) == long:
            out[(variant, kind)] = (counts[label] - counts[f"{variant}:{short}:{kind}"]) / (long - short)
    return out


def _pct(x: float, base: float) -> str:
    return f"{(x / base - 1) * 100:+7.1f}%"


def _report(args: argparse.Namespace, results: dict) -> None:
    import torch

    version = subprocess.run(["valgrind", "--version"], capture_output=True, text=True).stdout.strip()
    print(f"# instructions counted by callgrind ({version}); {platform.machine()}, Python {platform.python_version()}, torch {torch.__version__}")

    if "ddp" in results:
        _report_ddp(args, results["ddp"])
    if "hot" in results:
        _report_hot(args, results["hot"])


def _report_ddp(args: argparse.Namespace, counts: tuple[dict[str, int], dict[str, int], dict[str, dict[str, int]]]) -> None:
    main, every, threads = counts
    idle = every.pop("idle", None)
    main.pop("idle", None)
    on_thread, whole = _per_unit(main, args.steps), _per_unit(every, args.steps)
    short, long = _lengths(args.steps)
    print(f"# 1 gloo rank, MLP 64-512-512-64, batch {args.batch}; per step, from sections of {short} and {long} steps")
    print(f"{'variant':<31} {'training thread':>15} {'added':>8} {'deferred':>9} {'timers':>7} {'all threads':>12} {'added':>8}")

    # The threads that worked while an instrumented variant's training thread slept are otel-torchdist's
    # timers (the training thread and gloo's are idle then).
    timer_threads = {
        label.rsplit(":", 2)[0]: {t for t, count in by_thread.items() if count and t != "01"}
        for label, by_thread in threads.items()
        if label.endswith(":0:timers")
    }
    ticks = {
        label: sum(count for t, count in threads[label].items() if t in timer_threads.get(label.rsplit(":", 2)[0], ()))
        for label in every
        if label in threads
    }
    timer_share = _per_unit(ticks, args.steps)

    def timers(variant: str) -> float:
        """What the timer threads did per step while the steps ran (and the flush after them)."""
        return timer_share.get((variant, "steps"), 0.0) + timer_share.get((variant, "flush"), 0.0)

    def total(variant: str) -> float:  # all threads, the deferred work included, the timers' ticks not
        return whole[(variant, "steps")] + whole.get((variant, "flush"), 0.0) - timers(variant)

    def has(*variants: str) -> bool:  # counted in this run (see --variants)
        return all((variant, "steps") in on_thread for variant in variants)

    for variant, kind in on_thread:
        if kind != "steps":
            continue
        plain = variant.split()[0] + " plain"
        compared = variant != plain and has(plain)
        mine = on_thread[(variant, "steps")]
        line = f"{variant:<31} {mine / 1e6:13.3f} M"
        line += f" {_pct(mine, on_thread[(plain, 'steps')])}" if compared else f" {'':>8}"
        line += f" {whole.get((variant, 'flush'), 0.0) / 1e6:7.3f} M {timers(variant) / 1e3:5.0f} k {total(variant) / 1e6:10.3f} M"
        line += f" {_pct(total(variant), total(plain))}" if compared else ""
        print(line)

    if has("DDP plain", "DDP instrumented"):
        print(
            f"training thread, per DDP step: otel-torchdist {(on_thread[('DDP instrumented', 'steps')] - on_thread[('DDP plain', 'steps')]) / 1e3:.0f} k "
            "instructions over plain DDP (default settings)"
        )
        print(
            f"all threads, per DDP step: otel-torchdist {(total('DDP instrumented') - total('DDP plain')) / 1e3:.0f} k "
            "instructions over plain DDP, the deferred work included"
        )
    if has("DDP plain", "DDP leanest Python hook", "DDP instrumented via comm hook"):
        floor = on_thread[("DDP leanest Python hook", "steps")]
        print(
            f"training thread, per DDP step, through the comm hook: otel-torchdist {(on_thread[('DDP instrumented via comm hook', 'steps')] - floor) / 1e3:.0f} k "
            f"instructions over the leanest Python comm hook, which is {(floor - on_thread[('DDP plain', 'steps')]) / 1e3:.0f} k "
            "over plain DDP"
        )
    for tool in ("DDP CommDebugMode", "DDP torch.profiler"):
        if has("DDP plain", "DDP instrumented", tool):
            ours, theirs = total("DDP instrumented") - total("DDP plain"), total(tool) - total("DDP plain")
            ratio = f"{theirs / ours:.1f}x" if ours > 0 else "otel-torchdist added nothing"
            print(f"added per DDP step, all threads: otel-torchdist {ours / 1e6:.2f} M, {tool[4:]} {theirs / 1e6:.2f} M ({ratio})")
    if any(timers(v) for v, kind in on_thread if kind == "steps"):
        print(
            "timers: what otel-torchdist's timer threads (those busy while the training thread sleeps) did while the "
            "steps ran, slowed down many times under callgrind; taken out of all threads (at real speed they cost the "
            "idle row's instructions per second)"
        )
    if idle is not None:
        print(f"timers at rest (default settings, all threads): {idle / args.idle / 1e6:.2f} M instructions per second")


def _report_hot(args: argparse.Namespace, counts: tuple[dict[str, int], dict[str, int], dict[str, dict[str, int]]]) -> None:
    main, every, _ = counts
    on_thread, whole = _per_unit(main, args.calls), _per_unit(every, args.calls)
    short, long = _lengths(args.calls)
    print(f"# fake backend, 1024-element all_reduce; per collective, from sections of {short} and {long} calls")
    print(f"{'variant':<44} {'instructions':>13} {'plain calls':>12}")
    labels = {
        "always_on": "100% traced",
        "default": f"default sampling, a step every {STEP} calls",
        "always_off": "metrics only (sampler always_off)",
        "python": "default sampling, without the native part (native=off)",
    }
    for variant, label in labels.items():
        plain = on_thread[(f"{variant} plain", "steps")]
        added_here = on_thread[(f"{variant} hot", "steps")] - plain
        deferred = whole[(f"{variant} hot", "flush")]
        print(f"{label}:")
        rows = (
            ("plain dist.all_reduce", plain),
            ("added on the training thread", added_here),
            ("deferred: metrics, spans, OTLP/JSON file", deferred),
            ("whole (added + deferred)", added_here + deferred),
        )
        for name, value in rows:
            print(f"{'  ' + name:<44} {value:13.0f} {value / plain:12.2f}")
    plain = on_thread[("funcol plain", "steps")]
    added_here = on_thread[("funcol hot", "steps")] - plain
    deferred = whole[("funcol hot", "flush")]
    print("functional collective (funcol.all_reduce and its wait), default sampling, a step every 20 calls:")
    for name, value in (
        ("plain funcol.all_reduce + wait", plain),
        ("added on the training thread", added_here),
        ("deferred: metrics, spans, OTLP/JSON file", deferred),
        ("whole (added + deferred)", added_here + deferred),
    ):
        print(f"{'  ' + name:<44} {value:13.0f} {value / plain:12.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="DDP/FSDP2 steps per section (default 40)")
    parser.add_argument("--calls", type=int, default=4000, help="collectives per hot-path section (default 4000)")
    parser.add_argument("--idle", type=float, default=20.0, help="seconds of the idle section (default 20)")
    parser.add_argument("--batch", type=int, default=32, help="DDP/FSDP2 batch size (default 32)")
    parser.add_argument("--only", choices=("ddp", "hot"), help="run one part: the training steps or the hot path")
    parser.add_argument(
        "--variants",
        type=lambda text: [v.strip() for v in text.split(",")],
        help='the training-step variants to count, by their names in the table, comma-separated (default all; '
        '"idle" is the timers at rest), e.g. "DDP plain,DDP leanest Python hook,DDP instrumented"',
    )
    parser.add_argument("--child", choices=("ddp", "hot"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child == "ddp":
        _ddp_child(args)
        return 0
    if args.child == "hot":
        _hot_child(args)
        return 0
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("needs valgrind with callgrind_control on PATH (apt-get install valgrind)", file=sys.stderr)
        return 2
    start = time.monotonic()
    results = _run_children(args)
    _report(args, results)
    print(f"# {time.monotonic() - start:.0f} s under callgrind")
    return 0


if __name__ == "__main__":
    sys.exit(main())
