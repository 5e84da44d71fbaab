"""The ``otel-torchdist`` command: run the demo, and analyze, compare, plot and export runs.

Each subcommand is a thin layer over :mod:`otel_torchdist.analysis`: load the run, build the tables, render
them. Exit status: 0 when something was produced (even if parts of the input had to be skipped: they are
listed), 1 when the input holds nothing usable, 2 for a command line that does not parse.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from ._version import __version__

RUN_HELP = (
    "A run folder (<run_dir>/<run id>, holding every rank's traces.rank<R>.jsonl and metrics.rank<R>.jsonl), "
    "or an OTLP/JSON trace file such as one downloaded from Jaeger."
)
NOISE_HELP = (
    "How much detail to show, as CommDebugMode's noise_level: 0 the tables, 1 adds sharding spans, every "
    "rank and every step, 2 adds per-op detail per module, per rank and per message size (default 0)."
)


def _positive(flag: str):
    def parse(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} takes a whole number, got {raw!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{flag} must be at least 1, got {value}")
        return value

    return parse


def _noise(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--noise-level takes 0, 1 or 2, got {raw!r}") from None
    if value not in (0, 1, 2):
        raise argparse.ArgumentTypeError(f"--noise-level takes 0, 1 or 2, got {value}")
    return value


def _step(raw: str) -> tuple[int, int | None]:
    """``N``, or ``N#K`` for the K-th repeat of a number (analyze's label: epochs restart their numbers)."""
    number, sep, repeat = raw.strip().partition("#")
    try:
        return int(number), (int(repeat) if sep else None)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--step takes a step number, or N#K for a repeated number's K-th repeat, got {raw!r}"
        ) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="otel-torchdist",
        description=(
            "Observe distributed PyTorch training with OpenTelemetry. Run the demo to see it work, then analyze, "
            "compare, plot or export any run folder that otel_torchdist.instrument() wrote."
        ),
    )
    parser.add_argument("--version", action="version", version=f"otel-torchdist {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = sub.add_parser(
        "demo",
        help="Run a small instrumented multi-rank training on this machine and show what its telemetry says.",
        description=(
            "Start --nproc ranks on this machine (gloo on CPU, NCCL when every rank has a GPU) and train small "
            "models for --steps steps with otel-torchdist instrumenting every collective: DistributedDataParallel, "
            "FSDP2 (fully_shard), tensor parallel (ColwiseParallel/RowwiseParallel on a device mesh), each with its "
            "optimizer. The demo ends with the analysis of every rank's telemetry and where it went: the run "
            "folder, and the OTLP endpoint too when OTEL_EXPORTER_OTLP_ENDPOINT is set (the run folder keeps its "
            "copy of both, for the analysis)."
        ),
    )
    demo.add_argument("--nproc", type=_positive("--nproc"), default=2, help="Number of ranks to start (default 2).")
    demo.add_argument(
        "--steps", type=_positive("--steps"), default=20, help="Training steps per model (default 20)."
    )
    demo.add_argument(
        "--model",
        choices=("ddp", "fsdp", "tp", "all"),
        default="all",
        help=(
            "Which parallelism to train with: ddp, fsdp (FSDP2), tp (tensor parallel), or all three in sequence "
            "in the same run (default all: on two CPU cores it takes about as long as ddp alone)."
        ),
    )
    demo.add_argument(
        "--run-dir",
        default="otel-torchdist-runs",
        help="Folder under which the run folder is created (default ./otel-torchdist-runs).",
    )
    demo.add_argument(
        "--backend",
        choices=("gloo", "nccl"),
        default=None,
        help="Process group backend (default: nccl when every rank has a GPU, else gloo).",
    )

    analyze = sub.add_parser(
        "analyze",
        help="Print every table of a run: per op, per module and phase, stragglers, steps, hangs.",
        description=(
            "Read every rank's telemetry in RUN and print: collectives per op (count, message size, total, mean, "
            "p50 and p99 latency, nccl-tests' algbw and busbw, bytes-weighted); collectives per module and phase "
            "as CommDebugMode counts them; a per-rank straggler table (arrival skew at collectives matched across "
            "ranks by group and sequence number, compute and wait per step, a score, the slowest rank named); "
            "communication against compute per step with the overlap where it is measurable; and a hang report "
            "(each group's last started and completed sequence numbers per rank, collective.hang spans, the ranks "
            "that never arrived). Every table says whether it comes from the metrics (every call) or the traces "
            "(sampled steps). Unusable lines are skipped and listed."
        ),
    )
    analyze.add_argument("run", metavar="RUN", help=RUN_HELP)
    analyze.add_argument(
        "--json", action="store_true", help="Print the same tables as one JSON document (typed, versioned records)."
    )
    analyze.add_argument("--noise-level", type=_noise, default=0, metavar="{0,1,2}", help=NOISE_HELP)

    compare = sub.add_parser(
        "compare",
        help="Compare two runs: step time, throughput, speedup, scaling efficiency, per-op bandwidth.",
        description=(
            "Measure RUN_B against RUN_A (the baseline): step time, throughput, the speedup, and for runs with "
            "different world sizes the strong-scaling and weak-scaling efficiency with the arithmetic written out, "
            "then each op's bus bandwidth in both runs and its change."
        ),
    )
    compare.add_argument("run_a", metavar="RUN_A", help="The baseline run. " + RUN_HELP)
    compare.add_argument("run_b", metavar="RUN_B", help="The run to measure against it, in the same forms.")
    compare.add_argument("--json", action="store_true", help="Print the comparison as one JSON document.")

    plot = sub.add_parser(
        "plot",
        help="Draw PNG charts of a run: a step's timeline, busbw by size, step heat map, GPU utilization.",
        description=(
            "Write PNG charts of RUN into the folder given with -o: timeline.png (every rank's timeline of one "
            "traced step), busbw_by_size.png (bus bandwidth per op by message size), step_heatmap.png (step time "
            "and collective wait per rank and step) and gpu_utilization.png (when the run has GPU metrics; "
            "otherwise it says so and skips that chart)."
        ),
    )
    plot.add_argument("run", metavar="RUN", help=RUN_HELP)
    plot.add_argument("-o", "--output", required=True, metavar="DIR", help="Folder to write the PNG files to (created if needed).")
    plot.add_argument(
        "--step",
        type=_step,
        default=None,
        help="The traced step to draw the timeline of: N, or N#K as analyze labels a repeated number (default: the median one).",
    )

    export = sub.add_parser(
        "export",
        help="Convert a run to a Chrome/Perfetto trace (one track per rank).",
        description=(
            "Write RUN as a Trace Event Format JSON file for ui.perfetto.dev or chrome://tracing: one process track "
            "per rank, its steps, phases, optimizer steps and blocking collectives on the training thread, async "
            "collectives and sharding spans as async slices beside them."
        ),
    )
    export.add_argument("run", metavar="RUN", help=RUN_HELP)
    export.add_argument("--perfetto", metavar="OUT.json", help="Write the Chrome/Perfetto trace to this file.")

    build = sub.add_parser(
        "build-native",
        help="Compile the native capture of DDP (C++) for the installed torch, once.",
        description=(
            "Compile otel-torchdist's native part against the installed torch (a C++ compiler and ninja needed; "
            "about a minute): DDP on gloo and on NCCL is then recorded without a comm hook, sparing DDP a pass over "
            "every bucket. The build goes to a cache folder (OTEL_TORCHDIST_NATIVE_DIR, default ~/.cache/otel-torchdist/native), "
            "one per torch version; instrument() loads it when it is there."
        ),
    )
    build.add_argument("--verbose", action="store_true", help="Show the compiler's commands and output.")
    build.add_argument("--check", action="store_true", help="Only say whether it is built for this torch (exit 1 if not).")
    return parser


class _Failed(Exception):
    """Nothing usable: print the message, exit 1."""


def _analyze_or_fail(path: str, noise_level: int = 0):
    from .analysis import RunNotFound, analyze_path

    try:
        return analyze_path(path, noise_level=noise_level)
    except RunNotFound as exc:
        raise _Failed(str(exc)) from None


def _print_json(data) -> None:
    json.dump(data, sys.stdout, indent=1)
    sys.stdout.write("\n")


def cmd_demo(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from .demo import DemoArgs, run

    try:
        run(DemoArgs(nproc=args.nproc, steps=args.steps, model=args.model, run_dir=args.run_dir, backend=args.backend))
    except ValueError as exc:
        parser.error(str(exc))
    return 0


def cmd_analyze(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from .analysis import render_text, to_data

    report = _analyze_or_fail(args.run, args.noise_level)
    if args.json:
        _print_json(to_data(report))
    else:
        print(render_text.render(report))
    return 0


def cmd_compare(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from .analysis import render_text, to_data
    from .analysis.compare import compare

    a = _analyze_or_fail(args.run_a)
    b = _analyze_or_fail(args.run_b)
    result = compare(a, b)
    if args.json:
        _print_json(to_data(result))
    else:
        print(render_text.compare(result))
    return 0


def cmd_plot(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from .analysis.plot import StepNotTraced, plot_run

    try:
        import matplotlib  # noqa: F401  (only this command needs it: an extra, not a training dependency)
    except ImportError:
        raise _Failed("plot needs matplotlib, which a plain install leaves out: pip install 'otel-torchdist[plot]'") from None
    if os.path.exists(args.output) and not os.path.isdir(args.output):
        parser.error(f"-o/--output must be a folder, and {args.output} is a file")
    report = _analyze_or_fail(args.run, noise_level=1)
    try:
        step, repeat = args.step or (None, None)
        result = plot_run(args.run, args.output, report, step=step, occurrence=repeat)
    except StepNotTraced as exc:
        parser.error(str(exc))
    except OSError as exc:
        raise _Failed(f"cannot write the charts into {args.output}: {exc.strerror or exc}") from None
    for path in result.written:
        print(f"wrote {path}" + (f" (step {result.step_label})" if path.endswith("timeline.png") else ""))
    for why in result.skipped:
        print(f"skipped {why}")
    return 0 if result.written else 1


def _files_of(path: str) -> list[str]:
    """The files an analysis of ``path`` may read (the file, or every file under the folder)."""
    if os.path.isfile(path):
        return [path]
    return [os.path.join(root, name) for root, _, names in os.walk(path) for name in names]


def cmd_export(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from .analysis import RunNotFound
    from .analysis.perfetto import export

    if not args.perfetto:
        parser.error("export needs --perfetto OUT.json (the only export format so far)")
    out = args.perfetto
    if os.path.isdir(out):
        parser.error(f"--perfetto must name a file, and {out} is a folder")
    if os.path.exists(out) and any(os.path.samefile(out, f) for f in _files_of(args.run)):
        parser.error(f"--perfetto {out} is one of the files it would read: name another")
    # Written beside it and moved into place whole: a run with nothing to export, or a failure half-way,
    # leaves a file that was there as it was.
    partial = os.path.join(os.path.dirname(os.path.abspath(out)), f".{os.path.basename(out)}.{os.getpid()}.partial")
    try:
        result = export(args.run, partial)
    except (RunNotFound, OSError) as exc:
        if os.path.exists(partial):
            os.remove(partial)
        if isinstance(exc, RunNotFound):
            raise _Failed(str(exc)) from None
        raise _Failed(f"cannot write {out}: {exc.strerror or exc}") from None
    for p in result.problems[:10]:
        print(f"skipped: {p}", file=sys.stderr)
    if not result.slices:
        os.remove(partial)
        raise _Failed(f"{args.run} holds no spans to export (metrics only?): {out} not written")
    os.replace(partial, out)
    print(
        f"wrote {args.perfetto}: {result.slices} slices of {len(result.ranks)} rank{'s' if len(result.ranks) != 1 else ''} "
        f"(one track per rank); open it at https://ui.perfetto.dev"
    )
    return 0


def cmd_build_native(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from . import native

    if args.check:
        if not native.is_built():
            raise _Failed(f"not built for this torch: no {native.library_path()} (run otel-torchdist build-native)")
        try:
            native.load()
        except native.NativeBuildError as exc:
            raise _Failed(f"{exc} (run otel-torchdist build-native)") from None
        print(f"built: {native.library_path()}")
        return 0
    started = time.monotonic()
    try:
        path = native.build(verbose=args.verbose)
        native.load()
    except native.NativeBuildError as exc:
        raise _Failed(str(exc)) from None
    print(f"built {path} in {time.monotonic() - started:.0f} s; instrument() uses it for DDP, the common collective call, the metrics and encoding spans")
    return 0


COMMANDS = {
    "demo": cmd_demo,
    "analyze": cmd_analyze,
    "compare": cmd_compare,
    "plot": cmd_plot,
    "export": cmd_export,
    "build-native": cmd_build_native,
}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command = COMMANDS.get(args.command)
    if command is None:
        parser.print_help(sys.stderr)
        return 2
    sub = parser._subparsers._group_actions[0].choices[args.command]  # type: ignore[union-attr]
    try:
        return command(args, sub)
    except _Failed as exc:
        print(f"otel-torchdist {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `otel-torchdist analyze RUN | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
