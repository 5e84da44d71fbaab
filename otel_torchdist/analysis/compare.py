"""Two runs side by side: step time, throughput, speedup, scaling efficiency, per-op bandwidth.

The scaling arithmetic, with N ranks and step time t (A the baseline, B the other run):

* speedup per step ``S = t_A / t_B``;
* strong scaling (the same global batch split over more ranks): ideal ``S = N_B / N_A``, efficiency
  ``E_strong = S / (N_B / N_A)``;
* weak scaling (the same batch per rank, so the global batch grows with N): ideal ``t_B = t_A``,
  efficiency ``E_weak = t_A / t_B``, and throughput grows by ``(N_B / t_B) / (N_A / t_A)``.

Which applies depends on how the batch was set, which the telemetry does not know unless the runs
recorded samples (``otel_torchdist.record_step(samples=...)``): then throughput is samples per second and
its ratio is the measured speedup. Both readings are printed, with the numbers put in.
"""

from __future__ import annotations

from .report import CompareReport, CompareSide, OpDelta, Report


def _side(report: Report) -> CompareSide:
    st = report.steps
    n = report.run.world_size or (len(report.run.ranks) or None)
    if st.step_time_s and st.samples_per_step:
        throughput, unit = st.samples_per_step / st.step_time_s, "samples/s"
    elif st.step_time_s and n:
        throughput, unit = n / st.step_time_s, "rank-steps/s"
    else:
        throughput, unit = None, "rank-steps/s"
    return CompareSide(
        path=report.run.path,
        run_ids=report.run.run_ids,
        world_size=n,
        step_time_s=st.step_time_s,
        step_time_from=st.step_time_from,
        throughput=throughput,
        throughput_unit=unit,
    )


def compare(a: Report, b: Report) -> CompareReport:
    """B measured against A (the baseline)."""
    sa, sb = _side(a), _side(b)
    notes: list[str] = []
    arithmetic: list[str] = []
    step_speedup = throughput_speedup = ratio = strong = weak = None
    if sa.step_time_s and sb.step_time_s:
        step_speedup = sa.step_time_s / sb.step_time_s
        arithmetic.append(
            f"speedup per step: t_A / t_B = {sa.step_time_s * 1e3:.2f} ms / {sb.step_time_s * 1e3:.2f} ms = {step_speedup:.3f}"
        )
    else:
        notes.append("a run has no step time (no traced steps and no step metrics): no speedup")
    if sa.throughput_unit != sb.throughput_unit:
        notes.append("only one run recorded samples: throughput is compared as ranks per step time")
        sa.throughput = sa.world_size / sa.step_time_s if (sa.world_size and sa.step_time_s) else None
        sb.throughput = sb.world_size / sb.step_time_s if (sb.world_size and sb.step_time_s) else None
        sa.throughput_unit = sb.throughput_unit = "rank-steps/s"
    if sa.throughput and sb.throughput:
        throughput_speedup = sb.throughput / sa.throughput
        arithmetic.append(
            f"throughput: B / A = {sb.throughput:.2f} / {sa.throughput:.2f} {sa.throughput_unit} = {throughput_speedup:.3f}"
            + ("" if sa.throughput_unit == "samples/s" else " (assumes the same batch per rank: weak scaling)")
        )
    if sa.world_size and sb.world_size and step_speedup is not None:
        ratio = sb.world_size / sa.world_size
        if sa.world_size != sb.world_size:
            strong = step_speedup / ratio
            weak = step_speedup
            arithmetic.append(
                f"strong scaling (same global batch): ideal speedup N_B / N_A = {sb.world_size} / {sa.world_size} = "
                f"{ratio:.3f}; efficiency = {step_speedup:.3f} / {ratio:.3f} = {strong * 100:.1f}%"
            )
            arithmetic.append(
                f"weak scaling (same batch per rank): ideal t_B = t_A; efficiency = t_A / t_B = {weak * 100:.1f}%; "
                f"throughput x{(sb.world_size / sb.step_time_s) / (sa.world_size / sa.step_time_s):.3f} "  # type: ignore[operator]
                f"(ideal x{ratio:.3f})"
            )
            if sa.throughput_unit == "samples/s" and throughput_speedup is not None:
                arithmetic.append(
                    f"measured (samples recorded): throughput x{throughput_speedup:.3f} for x{ratio:.3f} ranks = "
                    f"{throughput_speedup / ratio * 100:.1f}% scaling efficiency"
                )
        else:
            arithmetic.append(f"same world size ({sa.world_size} ranks): no scaling arithmetic, only the speedup")
    ops_a = {(r.op, r.group): r for r in a.ops.rows}
    ops_b = {(r.op, r.group): r for r in b.ops.rows}
    deltas = []
    for key in list(ops_a) + [k for k in ops_b if k not in ops_a]:
        ra, rb = ops_a.get(key), ops_b.get(key)
        bw_a = ra.busbw_gbps if ra else None
        bw_b = rb.busbw_gbps if rb else None
        deltas.append(
            OpDelta(
                op=key[0],
                group=key[1],
                busbw_a=bw_a,
                busbw_b=bw_b,
                change=(bw_b / bw_a - 1.0) if (bw_a and bw_b is not None) else None,
                mean_s_a=ra.mean_s if ra else None,
                mean_s_b=rb.mean_s if rb else None,
                source_a=ra.source if ra else None,
                source_b=rb.source if rb else None,
            )
        )
    mixed = sorted({f"{d.op} ({d.source_a} in A, {d.source_b} in B)" for d in deltas
                    if d.source_a and d.source_b and d.source_a != d.source_b})
    if mixed:
        # Spans cover the traced calls only (and their slower first step), metrics every call: the two
        # sides' means and bandwidths are of different calls.
        notes.append("op rows from different sources, so of different calls (metrics: every call; spans: the "
                     "traced calls only): " + ", ".join(mixed))
    if a.run.world_size and b.run.world_size and a.run.world_size != b.run.world_size:
        notes.append("bus bandwidth already accounts for the group size, so it compares across world sizes; algbw does not")
    return CompareReport(
        a=sa,
        b=sb,
        step_speedup=step_speedup,
        throughput_speedup=throughput_speedup,
        rank_ratio=ratio,
        strong_efficiency=strong,
        weak_efficiency=weak,
        arithmetic=arithmetic,
        ops=deltas,
        notes=notes,
    )
