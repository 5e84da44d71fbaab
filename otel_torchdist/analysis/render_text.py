"""Text renderers: the report as terminal tables, every section headed by where its numbers came from."""

from __future__ import annotations

from ..summary import human_bytes, human_rate
from .report import CompareReport, HangReport, ModulesTable, OpsTable, Report, StepsTable, Stragglers
from .builders.common import short_error
from .stats import fmt_ranks

MAX_STEP_ROWS = 20
MAX_RANK_ROWS = 16


def _ms(x: float | None, width: int = 9, digits: int = 2) -> str:
    return f"{x * 1e3:>{width}.{digits}f}" if x is not None else f"{'-':>{width}}"


def _gb(x: float | None, width: int = 11) -> str:
    return f"{human_rate(x):>{width}}"


def _pct(x: float | None, width: int = 6) -> str:
    return f"{x * 100:>{width - 1}.0f}%" if x is not None else f"{'-':>{width}}"


def header(report: Report, title: str = "otel-torchdist analyze") -> list[str]:
    run = report.run
    ranks = f"{len(run.ranks)} rank{'s' if len(run.ranks) != 1 else ''}"
    if run.world_size and run.world_size != len(run.ranks):
        ranks += f" of {run.world_size}"
    ids = ", ".join(run.run_ids) or run.path
    lines = [f"{title}: run {ids}, {ranks}" + (f" ({run.backend})" if run.backend else "")]
    traced = run.traced_steps
    steps = f"{len(traced)} traced step{'s' if len(traced) != 1 else ''}" + (f" ({_steps_span(traced)})" if traced else "")
    lines.append(
        f"  read {run.files} file{'s' if run.files != 1 else ''}, {run.lines} line{'s' if run.lines != 1 else ''}: {run.spans} spans "
        f"({run.collective_spans} collectives, {steps}), {run.metric_snapshots} metric export{'s' if run.metric_snapshots != 1 else ''}"
    )
    for note in run.notes:
        lines.append(f"  note: {note}")
    shown = run.problems[:10]
    for p in shown:
        lines.append(f"  skipped: {p}")
    if len(run.problems) > len(shown):
        lines.append(f"  ... and {len(run.problems) - len(shown)} more problems (--json lists them all)")
    return lines


def _steps_span(steps: list[int]) -> str:
    if len(steps) <= 6:
        return fmt_ranks(steps)
    return f"{fmt_ranks(steps[:3])}, ..., {fmt_ranks(steps[-2:])}"


# ------------------------------------------------------------------------------------------- ops
def ops(table: OpsTable, noise_level: int = 0) -> list[str]:
    lines = ["", f"Collectives by op ({table.source})"]
    if not table.rows:
        return lines + ["  no collectives"]
    lines.append(
        f"  {'op':<28} {'group':<14} {'calls':>7} {'/rank':>7} {'avg size':>10} {'total ms':>10} {'mean ms':>9} "
        f"{'p50 ms':>9} {'p99 ms':>9} {'algbw':>11} {'busbw':>11}"
    )
    for r in table.rows:
        approx = "~" if r.quantiles_from == "histogram" else " "
        lines.append(
            f"  {r.op:<28} {r.group:<14} {r.count:>7} {r.calls_per_rank:>7.1f} {human_bytes(r.mean_message_size):>10} "
            f"{r.total_s * 1e3:>10.2f} {r.mean_s * 1e3:>9.3f} {_ms(r.p50_s, 8, 3)}{approx}{_ms(r.p99_s, 8, 3)}{approx}"
            f"{_gb(r.algbw_gbps)} {_gb(r.busbw_gbps)}"
            + (f"  ({r.errors} failed)" if r.errors else "")  # past the columns: the table stays aligned
        )
    lines.append(
        "  calls: one per rank per call, all ranks; algbw = sum(S) / sum(t); busbw = algbw x nccl-tests' bus factor "
        "(all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast, reduce, send/recv 1; "
        "n = group size)" + ("; ~ = interpolated in histogram buckets" if any(r.quantiles_from == "histogram" for r in table.rows) else "")
    )
    if noise_level >= 2 and table.per_rank:
        lines.append("  per rank:")
        for r in table.per_rank:
            lines.append(
                f"    rank {r.rank:<4} {r.op:<28} {r.group:<14} {r.count:>7} {human_bytes(r.mean_message_size):>10} "
                f"{r.total_s * 1e3:>10.2f} {r.mean_s * 1e3:>9.3f} {_gb(r.busbw_gbps)}  ({r.source})"
            )
    if noise_level >= 2 and table.by_size:
        lines.append("  by message size (spans):")
        for s in table.by_size:
            lines.append(
                f"    {s.op:<28} {s.group_size or '?':>3} ranks {human_bytes(s.size_floor):>10} .. {human_bytes(2 * s.size_floor):>10} {s.count:>7} calls "
                f"{_gb(s.algbw_gbps)} {_gb(s.busbw_gbps)}"
            )
    return lines


# --------------------------------------------------------------------------------------- modules
def modules(table: ModulesTable, noise_level: int = 0) -> list[str]:
    lines = ["", f"Collectives by module and phase ({table.source})"]
    if not table.rows:
        return lines + ["  no collective spans"]
    phases = table.phases
    lines.append(f"  {'module':<40}" + "".join(f" {p:>9}" for p in phases) + f" {'total':>7}")
    for row in table.rows:
        name = ("  " * row.depth + row.module)[:40]
        lines.append(f"  {name:<40}" + "".join(f" {row.counts.get(p, 0):>9}" for p in phases) + f" {row.total:>7}")
        if noise_level >= 2:
            for op in row.ops:
                lines.append(
                    f"  {'  ' * (row.depth + 1)}{op.op} ({op.phase}): {op.count}, avg {human_bytes(op.mean_message_size)}, "
                    f"{op.mean_s * 1e3:.3f} ms"
                )
    if len(table.per_rank_totals) > 1:
        if table.consistent:
            lines.append(f"  every rank ({len(table.per_rank_totals)}) recorded the same counts")
        else:
            totals = ", ".join(f"rank {t['rank']}: {t['collectives']}" for t in table.per_rank_totals[:8])
            lines.append(f"  the ranks recorded different counts ({totals}; --json has each rank's)")
    if noise_level >= 1:
        lines.append("  sharding:" if table.sharding else "  sharding: no sharding spans")
        for s in table.sharding:
            parts = [s.name, s.module or ""]
            if s.parameters is not None:
                parts.append(f"{s.parameters} parameters")
            if s.original_shapes:
                parts.append(f"{', '.join(s.original_shapes[:3])} -> {', '.join(s.sharded_shapes[:3]) if s.sharded_shapes else '?'}")
            if s.placements_after:
                before = ", ".join(s.placements_before) if s.placements_before else "-"
                parts.append(f"placements {before} -> {', '.join(s.placements_after)}")
            if s.plan:
                parts.append("plan " + ", ".join(s.plan))
            if s.mesh_shape:
                parts.append(f"mesh {s.mesh_shape}" + (f" {s.mesh_dims}" if s.mesh_dims else ""))
            lines.append("    " + "  ".join(p for p in parts if p) + (f"  (x{s.count})" if s.count > 1 else ""))
    return lines


# ------------------------------------------------------------------------------------ stragglers
def stragglers(table: Stragglers, noise_level: int = 0) -> list[str]:
    lines = ["", f"Stragglers ({table.source})"]
    lines.append(
        f"  {'rank':>5} {'steps':>6} {'step ms':>9} {'compute ms':>11} {'wait ms':>9} {'wait':>6} "
        f"{'late ms mean/max':>17} {'last':>9} {'score':>7}   {'all steps (metrics): compute / wait s':<20}"
    )
    rows = table.rows
    if len(rows) > MAX_RANK_ROWS and noise_level < 1:
        rows = sorted(rows, key=lambda r: -(r.score or 0))[: MAX_RANK_ROWS // 2]
    for r in rows:
        late = f"{_ms(r.mean_late_s, 7)} /{_ms(r.max_late_s, 7)}" if r.matched else f"{'-':>17}"
        last = f"{r.last_arrivals}/{r.matched}" if r.matched else "-"
        score = f"{r.score:>7.3f}" if r.score is not None else f"{'-':>7}"
        totals = (
            f"{r.total_compute_s:.2f} / {r.total_wait_s:.2f}" if r.total_compute_s is not None and r.total_wait_s is not None else "-"
        )
        lines.append(
            f"  {r.rank:>5} {r.steps:>6} {_ms(r.mean_step_s)} {_ms(r.mean_compute_s, 11)} {_ms(r.mean_wait_s)} "
            f"{_pct(r.wait_share)} {late} {last:>9} {score}   {totals}"
        )
    if len(rows) < len(table.rows):
        lines.append(f"  ... {len(table.rows) - len(rows)} more ranks (the highest scores are shown; --noise-level 1 lists all)")
    if table.matched:
        lines.append(
            f"  arrival skew over {table.matched} matched collectives: mean {table.mean_skew_s * 1e3:.2f} ms, "  # type: ignore[operator]
            f"max {table.max_skew_s * 1e3:.2f} ms"  # type: ignore[operator]
            + (f"; {table.partial} seen on only some of their ranks" if table.partial else "")
        )
    lines.append(f"  verdict: {table.verdict}")
    return lines


# ----------------------------------------------------------------------------------------- steps
def _step_label(r) -> str:
    """The step's label (StepRow.label); ``1*`` for the set-up step."""
    return r.label + ("*" if r.setup else "")


def steps(table: StepsTable, noise_level: int = 0) -> list[str]:
    lines = ["", f"Steps: communication vs compute ({table.source})"]
    rows = table.rows
    if rows:
        lines.append(
            f"  {'step':>6} {'ranks':>5} {'step ms':>9} {'compute ms':>11} {'wait ms':>9} {'comm':>6} {'async':>6} "
            f"{'colls':>6} {'slowest':>8}"
        )
        keep = range(len(rows))
        if len(rows) > MAX_STEP_ROWS and noise_level < 1:
            slow = sorted(range(len(rows)), key=lambda i: -rows[i].duration_s)[:5]
            keep = set(range(10)) | set(slow)  # row indices: step numbers may repeat
        shown = [r for i, r in enumerate(rows) if i in keep]
        prev = None
        for i, r in enumerate(rows):
            if i not in keep:
                continue
            if prev is not None and i != prev + 1:
                lines.append(f"  {'...':>6}")
            prev = i
            lines.append(
                f"  {_step_label(r):>6} {r.ranks:>5} {_ms(r.duration_s)} {_ms(r.mean_compute_s, 11)} {_ms(r.mean_wait_s)} "
                f"{_pct(r.comm_share)} {_pct(r.async_share)} {r.collectives:>6} "
                f"{(str(r.slowest_rank) if r.slowest_rank is not None else '-'):>8}"
            )
            if noise_level >= 1 and r.cells:
                cells = "  ".join(
                    f"r{c.rank} {c.duration_s * 1e3:.1f}/{(c.compute_s or 0) * 1e3:.1f}/{(c.wait_s or 0) * 1e3:.1f}" for c in r.cells
                )
                lines.append(f"  {'':>6}   step/compute/wait ms: {cells}")
        if len(shown) < len(rows):
            lines.append(f"  ({len(rows) - len(shown)} steps not shown: the first 10 and the 5 slowest are; --noise-level 1 shows all)")
        if any(r.setup for r in shown):
            lines.append("  * holds the ranks' set-up (imports, initialisation, building the model): left out of the medians")
        lines.append(
            "  comm = mean wait / mean step time; async = share of collective time in async collectives (can overlap "
            "compute); slowest = most compute"
        )
    else:
        lines.append("  no traced steps")
    if table.step_time_s is not None:
        line = f"  step time: {table.step_time_s * 1e3:.2f} ms ({table.step_time_from})"
        if table.step_compute_s is not None and table.step_wait_s is not None:
            line += f"; of it ({table.step_statistic}s) {table.step_compute_s * 1e3:.2f} ms compute, {table.step_wait_s * 1e3:.2f} ms in collectives"
        lines.append(line)
    for t in table.totals[:MAX_RANK_ROWS]:
        mean = t.total_s / t.steps if t.steps else 0.0
        lines.append(
            f"  rank {t.rank}, all {t.steps} steps (metrics): {t.total_s:.3f} s, {mean * 1e3:.2f} ms a step; "
            f"{t.compute_s:.3f} s compute, {t.wait_s:.3f} s in collectives ({t.wait_s / t.total_s * 100 if t.total_s else 0:.0f}%)"
        )
    if len(table.totals) > MAX_RANK_ROWS:
        lines.append(f"  ... {len(table.totals) - MAX_RANK_ROWS} more ranks (--json)")
    if table.samples_per_step:
        lines.append(f"  samples per step (all ranks): {table.samples_per_step:g}")
    lines.append(f"  overlap: {table.overlap_note}")
    return lines


# ----------------------------------------------------------------------------------------- hangs
def hangs(table: HangReport, noise_level: int = 0) -> list[str]:
    lines = ["", f"Hangs: sequence numbers per group ({table.source})"]
    if table.groups:
        lines.append(f"  {'group':<20} {'ranks':<14} {'last started':>13} {'last completed':>15} {'in flight':>10}")
        for g in table.groups:
            for r in g.ranks:
                flight = f"{r.in_flight_s:.1f} s" if r.in_flight_s else ""
                s = "-" if r.started is None else str(r.started)
                c = "-" if r.completed is None else str(r.completed)
                lines.append(f"  {g.group:<20} {fmt_ranks(r.ranks):<14} {s:>13} {c:>15} {flight:>10}")
            if g.no_data:
                lines.append(f"  {g.group:<20} {fmt_ranks(g.no_data):<14} {'no data':>13}")
    for h in table.hangs[: 20 if noise_level < 1 else None]:
        lines.append(
            f"  collective.hang: rank {h.rank} {h.op} on {h.group}, sequence number {h.seq}, reported after {h.waited_s:.1f} s"
            + (" (it completed later)" if h.resolved else "")
        )
    for f in table.failures[: 10 if noise_level < 1 else None]:
        lines.append(f"  failed: rank {f.rank} {f.op} on {f.group} after {f.duration_s:.1f} s: {short_error(f.error, 160)}")
    if table.failures_total > len(table.failures):
        lines.append(f"  ... {table.failures_total} failed collectives in all")
    lines.append(f"  verdict: {table.verdict}")
    return lines


def gpu(report: Report) -> list[str]:
    if not report.gpu:
        return ["", "GPU utilization: no GPU metrics in this run (CPU-only, or NVML unavailable)"]
    lines = ["", "GPU utilization (metrics)"]
    for s in report.gpu[:MAX_RANK_ROWS]:
        u = s.utilization
        lines.append(
            f"  rank {s.rank} gpu {s.gpu}" + (f" ({s.model})" if s.model else "")
            + f": mean {sum(u) / len(u) * 100:.0f}%, min {min(u) * 100:.0f}%, max {max(u) * 100:.0f}% over {len(u)} samples"
        )
    return lines


def warnings(report: Report) -> list[str]:
    if not report.warnings_total:
        return []
    lines = ["", f"Warnings ({report.warnings_total})"]
    for w in report.warnings[:10]:
        lines.append(f"  rank {w.rank} {w.kind}: {w.message[:200]}")
    return lines


def render(report: Report) -> str:
    """Every section of ``otel-torchdist analyze``."""
    nl = report.noise_level
    lines = header(report)
    lines += ops(report.ops, nl)
    lines += modules(report.modules, nl)
    lines += stragglers(report.stragglers, nl)
    lines += steps(report.steps, nl)
    lines += hangs(report.hangs, nl)
    lines += gpu(report)
    lines += warnings(report)
    return "\n".join(lines)


def summary(report: Report) -> str:
    """The short form the demo ends with: the op table, the step split and the verdicts."""
    lines = header(report, "otel-torchdist summary")
    lines += ops(report.ops)
    st = report.steps
    if st.step_time_s is not None:
        line = f"  steps: {st.step_time_s * 1e3:.1f} ms ({st.step_time_from})"
        if st.step_compute_s is not None and st.step_wait_s is not None:
            line += f"; of a step ({st.step_statistic}s) {st.step_compute_s * 1e3:.1f} ms compute, {st.step_wait_s * 1e3:.1f} ms in collectives"
        lines.append(line)
    mod = report.modules
    if mod.rows and len(mod.rows) > 1:
        lines.append(
            "  by module (rank {}): ".format(mod.rank)
            + ", ".join(f"{r.module} {r.total}" for r in mod.rows[1:] if r.depth == 1)[:300]
        )
    lines.append(f"  stragglers: {report.stragglers.verdict}")
    lines.append(f"  hangs: {report.hangs.verdict}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------- compare
def compare(report: CompareReport) -> str:
    a, b = report.a, report.b
    lines = [f"otel-torchdist compare: A = {', '.join(a.run_ids) or a.path}, B = {', '.join(b.run_ids) or b.path}"]
    lines.append(f"  {'':<22} {'A':>14} {'B':>14}")
    lines.append(f"  {'ranks':<22} {a.world_size or '-':>14} {b.world_size or '-':>14}")
    lines.append(f"  {'step time ms':<22} {_ms(a.step_time_s, 14)} {_ms(b.step_time_s, 14)}")
    thr = lambda x: f"{x:>14.2f}" if x is not None else f"{'-':>14}"  # noqa: E731
    lines.append(f"  {'throughput ' + a.throughput_unit:<22} {thr(a.throughput)} {thr(b.throughput)}")
    lines.append(f"  step time from: A {a.step_time_from or 'no steps'}; B {b.step_time_from or 'no steps'}")
    for line in report.arithmetic:
        lines.append(f"  {line}")
    if report.ops:
        lines.append("")
        lines.append(f"  {'op':<28} {'group':<14} {'busbw A':>10} {'busbw B':>10} {'change':>8} {'mean ms A':>10} {'mean ms B':>10}")
        for d in report.ops:
            change = f"{d.change * 100:+.0f}%" if d.change is not None else "-"
            lines.append(
                f"  {d.op:<28} {d.group:<14} {_gb(d.busbw_a, 10)} {_gb(d.busbw_b, 10)} {change:>8} "
                f"{_ms(d.mean_s_a, 10, 3)} {_ms(d.mean_s_b, 10, 3)}"
            )
        lines.append("  busbw: nccl-tests' bus bandwidth, bytes-weighted over each run")
    for note in report.notes:
        lines.append(f"  note: {note}")
    return "\n".join(lines)
