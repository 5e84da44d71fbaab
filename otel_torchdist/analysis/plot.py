"""PNG charts of a run (matplotlib, Agg backend, no display needed).

* ``timeline.png``: every rank's timeline of one traced step (``--step``, else the median one): the step,
  its phases, the optimizer step and each collective, colored by op.
* ``busbw_by_size.png``: nccl-tests' bus bandwidth per op against message size (power-of-two buckets of S,
  bytes-weighted), from the spans.
* ``step_heatmap.png``: step time and the share of it spent waiting in collectives, per rank and traced step.
* ``gpu_utilization.png``: GPU utilization over time per rank and GPU, from the metrics, when the run has
  GPU metrics; otherwise it is skipped and the reason is returned.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .. import names as n
from .loader import discover, gc_paused, iter_records
from .records import Collective, Phase, Problem, RankStep, Span
from .report import Report, StepRow
from .stats import fmt_ranks

_PHASE_COLORS = {"forward": "#9ecae1", "backward": "#fdae6b", "data_wait": "#d9d9d9"}
_OP_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#ff7f0e")


@dataclass(kw_only=True)
class PlotResult:
    written: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    """One sentence per chart not drawn, saying why."""
    step: int | None = None
    step_label: str | None = None
    """As analyze labels the step: ``12``, or ``12#1`` for the number's first repeat."""


class StepNotTraced(ValueError):
    """``--step`` names a step that has no spans."""


def _label(text: str) -> str:
    """matplotlib leaves labels starting with "_" out of legends (``_broadcast_coalesced``)."""
    return " " + text if text.startswith("_") else text


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(fig)
    return fig


def pick_step(report: Report, step: int | None, occurrence: int | None = None) -> StepRow | None:
    """``occurrence`` None: the number's first traced occurrence."""
    rows = report.steps.rows
    if step is not None:
        for r in rows:
            if r.step == step and (occurrence is None or r.occurrence == occurrence):
                return r
        traced = fmt_ranks(sorted({r.step for r in rows})) or "none"
        repeats = [r.label for r in rows if r.occurrence]
        if repeats:
            traced += "; repeated numbers: " + ", ".join(repeats[:10]) + (" ..." if len(repeats) > 10 else "")
        asked = step if occurrence is None else f"{step}#{occurrence}"
        raise StepNotTraced(f"--step {asked} was not traced in this run (traced steps: {traced})")
    if not rows:
        return None
    usable = [r for r in rows if not r.setup] or rows
    ordered = sorted(usable, key=lambda r: r.duration_s)
    return ordered[len(ordered) // 2]


def plot_run(path: str, out_dir: str, report: Report, *, step: int | None = None,
             occurrence: int | None = None) -> PlotResult:
    """Draw every chart of the run at ``path`` (already analyzed into ``report``, noise level 1) into ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    result = PlotResult()
    chosen = pick_step(report, step, occurrence)
    if chosen is None:
        result.skipped.append("timeline.png: no traced steps (train.rank_step spans) in this run")
    else:
        result.step, result.step_label = chosen.step, chosen.label
        records = _step_records(path, chosen)
        result.written.append(_timeline(records, chosen, os.path.join(out_dir, "timeline.png")))
    if any(r.busbw_gbps for r in report.ops.by_size):
        result.written.append(_busbw(report, os.path.join(out_dir, "busbw_by_size.png")))
    else:
        result.skipped.append("busbw_by_size.png: no collective spans with a payload and a bus bandwidth")
    if report.steps.rows and any(r.cells for r in report.steps.rows):
        result.written.append(_heatmap(report, os.path.join(out_dir, "step_heatmap.png")))
    else:
        result.skipped.append("step_heatmap.png: no traced steps (train.rank_step spans) in this run")
    if report.gpu:
        result.written.append(_gpu(report, os.path.join(out_dir, "gpu_utilization.png")))
    else:
        result.skipped.append(
            "gpu_utilization.png: no GPU metrics in this run (torchdist.gpu.utilization: CPU-only, or NVML unavailable)"
        )
    return result


def _step_records(path: str, row: StepRow) -> list:
    """Every rank's spans of the step: those of its part (``train.rank_step``), by its trace and interval. A
    rank's step is in the step's shared trace, or, begun inside a span of the program's, in that span's
    trace (each rank its own). Two reads of the files, so a long run is never held in memory."""
    problems: list[Problem] = []
    with gc_paused():
        parts = {
            r.rank: (r.trace_id, r.start_ns, r.end_ns)
            for r in iter_records(discover(path), problems, metrics=False)
            if isinstance(r, RankStep) and r.step == row.step and r.occurrence == row.occurrence
        }
        out = []
        for r in iter_records(discover(path), problems, metrics=False):
            if isinstance(r, (Collective, RankStep, Phase, Span)):
                part = parts.get(r.rank)
                if part is not None and r.trace_id == part[0] and part[1] <= r.start_ns <= part[2]:
                    out.append(r)
        return out


def _timeline(records: list, row: StepRow, out: str) -> str:
    fig = timeline_figure(records, row)
    fig.savefig(out)
    return out


def timeline_figure(records: list, row: StepRow):
    steps = [r for r in records if isinstance(r, RankStep)]
    ranks = sorted({r.rank for r in records})
    t0 = min((r.start_ns for r in records if hasattr(r, "start_ns")), default=row.start_ns)
    ms = lambda t: (t - t0) / 1e6  # noqa: E731
    fig = _figure(11, 1.2 + 0.9 * len(ranks))
    ax = fig.add_subplot(1, 1, 1)
    ops = sorted({r.op for r in records if isinstance(r, Collective)})
    colors = {op: _OP_COLORS[i % len(_OP_COLORS)] for i, op in enumerate(ops)}
    labelled: set[str] = set()

    def bar(y, start, end, height, color, label=None, **kw):
        if label and label not in labelled:
            labelled.add(label)
            label = _label(label)
        else:
            label = None
        ax.barh(y, max(ms(end) - ms(start), 1e-3), left=ms(start), height=height, color=color, label=label, **kw)

    for s in steps:
        bar(s.rank, s.start_ns, s.end_ns, 0.84, "#f0f0f0", "step", edgecolor="#999999", linewidth=0.6)
    for r in records:
        # The y axis is inverted (rank 0 on top): a smaller y is drawn higher.
        if isinstance(r, Phase):
            bar(r.rank - 0.2, r.start_ns, r.end_ns, 0.36, _PHASE_COLORS.get(r.phase, "#cccccc"), r.phase)
        elif isinstance(r, Span) and r.name == n.SPAN_OPTIMIZER_STEP:
            bar(r.rank - 0.2, r.start_ns, r.end_ns, 0.36, "#74c476", "optimizer.step")
        elif isinstance(r, Collective):
            bar(r.rank + 0.2, r.start_ns, r.end_ns, 0.36, colors[r.op], r.op, alpha=0.85)
    ax.set_yticks(ranks)
    ax.set_yticklabels([f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("ms since the step's first start (phases above, collectives below)")
    ax.set_title(f"Step {row.label}: {row.duration_s * 1e3:.1f} ms, {row.ranks} ranks")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def _busbw(report: Report, out: str) -> str:
    fig = _figure(8, 5)
    ax = fig.add_subplot(1, 1, 1)
    by_op: dict[tuple[str, int], list] = {}
    for s in report.ops.by_size:
        if s.busbw_gbps:
            by_op.setdefault((s.op, s.group_size or 0), []).append(s)
    sizes: dict[str, int] = {}
    for op, _ in by_op:
        sizes[op] = sizes.get(op, 0) + 1
    for i, ((op, ranks), rows) in enumerate(sorted(by_op.items())):
        rows.sort(key=lambda r: r.size_floor)
        color = _OP_COLORS[i % len(_OP_COLORS)]
        label = _label(op) + (f" ({ranks} ranks)" if sizes[op] > 1 else "")
        for k, run in enumerate(adjacent_runs(rows)):
            # A line only joins neighbouring power-of-two buckets: across empty octaves it would draw a trend
            # that was never measured. Lone sizes are points.
            ax.plot([r.mean_message_size for r in run], [r.busbw_gbps for r in run], marker="o", color=color,
                    linestyle="-" if len(run) > 1 else "none", label=label if k == 0 else None)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size S (bytes, nccl-tests' definition)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title("busbw by message size (bytes-weighted per power-of-two bucket, traced calls;\n"
                 "lines join neighbouring buckets only)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out)
    return out


def adjacent_runs(rows: list) -> list[list]:
    """``rows`` (sorted by ``size_floor``, powers of two) split where a bucket is not twice the previous one."""
    runs: list[list] = []
    for r in rows:
        if runs and r.size_floor == 2 * runs[-1][-1].size_floor:
            runs[-1].append(r)
        else:
            runs.append([r])
    return runs


def _heatmap(report: Report, out: str) -> str:
    import numpy as np

    rows = report.steps.rows
    ranks = sorted({c.rank for r in rows for c in r.cells})
    index = {r: i for i, r in enumerate(ranks)}
    step_ms = np.full((len(ranks), len(rows)), np.nan)
    wait = np.full((len(ranks), len(rows)), np.nan)
    for j, r in enumerate(rows):
        for c in r.cells:
            step_ms[index[c.rank], j] = c.duration_s * 1e3
            if c.wait_s is not None and c.duration_s > 0:
                wait[index[c.rank], j] = c.wait_s / c.duration_s * 100
    fig = _figure(min(16, max(6, 0.25 * len(rows) + 3)), 2.5 + 0.6 * len(ranks) * 2)
    # The color scale spans the bulk of the steady-state steps: from the fastest to the 95th percentile,
    # the set-up step and the rare slow ones (a new model's first step) clipped above it and named, since
    # one 50x step on a scale from 0 would leave every other step the same dark color.
    steady_cols = [j for j, r in enumerate(rows) if not r.setup] or list(range(len(rows)))
    finite = step_ms[:, steady_cols][np.isfinite(step_ms[:, steady_cols])]
    # At most 4x the median too: among a few steps the 95th percentile is the slowest one's (0.7..7204 ms).
    low, high = (
        (float(finite.min()), float(min(np.percentile(finite, 95), 4 * np.median(finite)))) if finite.size else (None, None)
    )
    if low is not None and high - low < 1e-3:
        low, high = low * 0.9, high * 1.1 + 1e-3
    step_title = "step time (ms)"
    if low is not None:
        step_title += f", color scale {low:.1f}..{high:.1f} ms"
        above = [j for j in range(len(rows)) if np.nanmax(step_ms[:, j]) > high * 1.0001]
        if above:
            names = ", ".join(rows[j].label + (" (set-up)" if rows[j].setup else "") for j in above[:8])
            step_title += f"; above it, clipped: step {names}" + (f" and {len(above) - 8} more" if len(above) > 8 else "")
    for k, (data, title, cmap, bottom, top) in enumerate(
        (
            (step_ms, step_title, "viridis", low, high),
            (wait, "time waiting in collectives (% of the step)", "magma", 0.0, 100.0),
        )
    ):
        ax = fig.add_subplot(2, 1, k + 1)
        im = ax.imshow(data, aspect="auto", cmap=cmap, interpolation="nearest", vmin=bottom, vmax=top)
        ax.set_title(title, fontsize=10)
        ax.set_yticks(range(len(ranks)))
        ax.set_yticklabels([f"rank {r}" for r in ranks], fontsize=8)
        step_labels = [r.label for r in rows]
        every = max(1, len(rows) // 25)
        ax.set_xticks(range(0, len(rows), every))
        ax.set_xticklabels(step_labels[::every], fontsize=8)
        ax.set_xlabel("traced step")
        fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(out)
    return out


def _gpu(report: Report, out: str) -> str:
    fig = _figure(9, 4.5)
    ax = fig.add_subplot(1, 1, 1)
    t0 = min(s.times_ns[0] for s in report.gpu if s.times_ns)
    for i, s in enumerate(report.gpu):
        ax.plot([(t - t0) / 1e9 for t in s.times_ns], [u * 100 for u in s.utilization], marker=".",
                color=_OP_COLORS[i % len(_OP_COLORS)], label=f"rank {s.rank} gpu {s.gpu}")
    ax.set_ylim(0, 105)
    ax.set_xlabel("seconds since the first metric export")
    ax.set_ylabel("GPU utilization (%)")
    ax.set_title("GPU utilization (NVML, at each metric export)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(out)
    return out
