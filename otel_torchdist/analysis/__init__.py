"""Offline analysis of a run's telemetry: what ``otel-torchdist analyze / compare / plot / export`` do.

Layered as PyTorch's Flight Recorder analyzer is: a **loader** (``loader.py``) streams a run folder, or an
OTLP/JSON trace file downloaded from Jaeger, into typed records (``records.py``); **builders**
(``builders/``, ``compare.py``) are pure functions of those records that produce typed, versioned tables
(``report.py``); **renderers** print them as text (``render_text.py``), JSON (``report.to_data``), PNG
charts (``plot.py``) or a Chrome/Perfetto trace (``perfetto.py``). One ``noise_level`` knob (0-2) adds
detail to every renderer: 1 adds sharding spans and per-rank step cells, 2 per-op detail per module, per
rank and per message size.

    from otel_torchdist.analysis import analyze_path, render_text
    report = analyze_path("otel-torchdist-runs/20261122-031846-807d1b")
    print(render_text.render(report))

Large runs stream: files are read a line at a time (the ranks' files in turn) and aggregated as they go;
what is kept is a row per op and group, a quantile sketch per op, counts per module, one row per traced
step and the collectives not yet matched across ranks.
"""

from __future__ import annotations

from . import render_text
from .builders import Analyzer, analyze_records
from .loader import ReadStats, RunNotFound, Source, discover, gc_paused, iter_records
from .records import Problem
from .report import SCHEMA, VERSION, Report, to_data

__all__ = [
    "Analyzer",
    "Problem",
    "Report",
    "RunNotFound",
    "SCHEMA",
    "Source",
    "VERSION",
    "analyze_path",
    "analyze_records",
    "discover",
    "iter_records",
    "render_text",
    "to_data",
]


def analyze_path(path: str, *, noise_level: int = 0) -> Report:
    """Read every rank's telemetry at ``path`` (a run folder or a trace file) and build the report.

    Raises :class:`RunNotFound` when there is nothing readable at all; anything less (cut lines, foreign
    JSON, missing ranks) is reported in ``report.run.problems`` and ``report.run.notes``.
    """
    source = discover(path)
    problems: list[Problem] = []
    stats = ReadStats()
    analyzer = Analyzer(path=path, noise_level=noise_level)
    with gc_paused():
        for rec in iter_records(source, problems, stats):
            analyzer.add(rec)
    if stats.empty_files and len(stats.empty_files) == len(source.of("traces", "metrics", "otlp")):
        raise RunNotFound(
            f"{path}: every telemetry file is empty ({', '.join(sorted(_base(p) for p in stats.empty_files))}): "
            "the ranks may still be running (metrics are written every OTEL_METRIC_EXPORT_INTERVAL, 60 s by "
            "default) or were killed before their first export"
        )
    for p in stats.empty_files:
        problems.append(Problem(path=p, message="empty: this rank wrote nothing here (yet)"))
    if not analyzer.n_spans and not analyzer.n_snapshots:
        detail = "; ".join(str(p) for p in problems[:3])
        raise RunNotFound(f"{path} holds no usable spans or metrics" + (f" ({detail})" if detail else ""))
    return analyzer.finish(problems, files=stats.files_read, lines=stats.lines, skipped=stats.skipped_lines)


def _base(path: str) -> str:
    import os

    return os.path.basename(path)
