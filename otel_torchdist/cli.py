"""The ``otel-torchdist`` command."""

from __future__ import annotations

import argparse
import sys


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="otel-torchdist",
        description="Observe distributed PyTorch training with OpenTelemetry: run the demo, and more to come.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser(
        "demo",
        help="Run a small instrumented multi-rank training on this machine and show where its telemetry went.",
        description=(
            "Start --nproc ranks on this machine (gloo on CPU, NCCL when every rank has a GPU), train a small "
            "model with DistributedDataParallel for --steps steps with otel-torchdist instrumenting every "
            "collective, then print rank 0's summary and the run folder holding every rank's traces and "
            "metrics. Set OTEL_EXPORTER_OTLP_ENDPOINT to send them to a collector instead."
        ),
    )
    demo.add_argument("--nproc", type=_positive("--nproc"), default=2, help="Number of ranks to start (default 2).")
    demo.add_argument("--steps", type=_positive("--steps"), default=20, help="Training steps per rank (default 20).")
    demo.add_argument(
        "--model",
        choices=("ddp",),
        default="ddp",
        help="Which parallelism to train with (default ddp).",
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
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import DemoArgs, run

        run(DemoArgs(nproc=args.nproc, steps=args.steps, model=args.model, run_dir=args.run_dir, backend=args.backend))
        return 0
    parser.print_help(sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
