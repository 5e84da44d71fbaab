"""The per-module and per-phase counts (like CommDebugMode), from spans."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from ... import names as n
from ..report import ModuleOp, ModuleRow, ModulesTable

if TYPE_CHECKING:
    from . import Analyzer


def _natural(fqn: str) -> list[tuple[int, int | str]]:
    """``layers.2`` before ``layers.10``."""
    return [(0, int(p)) if p.isdigit() else (1, p) for p in fqn.split(".")]


def build(an: Analyzer) -> ModulesTable:
    if not an.mod_counts:
        return ModulesTable(source="no collective spans", rank=None, phases=[], rows=[], consistent=True)
    shown = min(an.mod_counts)
    counts = an.mod_counts[shown]
    seen_phases = {phase for (_, phase, _) in counts}
    phases = [p for p in n.PHASES if p in seen_phases] + sorted(seen_phases - set(n.PHASES))
    names: set[str] = set()
    for module, _, _ in counts:
        if module:
            parts = module.split(".")
            names.update(".".join(parts[: i + 1]) for i in range(len(parts)))
    rows = [_module_row(an, "Global", 0, counts, lambda m: True)]
    for name in sorted(names, key=_natural):
        rows.append(
            _module_row(an, name, name.count(".") + 1, counts, lambda m, name=name: bool(m) and (m == name or m.startswith(name + ".")))
        )
    signature = {r: {k: v[0] for k, v in c.items()} for r, c in an.mod_counts.items()}
    consistent = all(sig == signature[shown] for sig in signature.values())
    sharding_rank = shown if shown in an.sharding else (min(an.sharding) if an.sharding else None)
    sharding = list(an.sharding.get(sharding_rank, {}).values()) if (an.noise >= 1 and sharding_rank is not None) else []
    traced = len(an.rank_steps)
    return ModulesTable(
        source=(
            f"collective spans of rank {shown} ({traced} traced step{'s' if traced != 1 else ''} and the spans "
            "outside steps); a module counts what its submodules issued, as CommDebugMode counts"
        ),
        rank=shown,
        phases=phases,
        rows=rows,
        consistent=consistent,
        per_rank_totals=[{"rank": r, "collectives": int(sum(v[0] for v in c.values()))} for r, c in sorted(an.mod_counts.items())],
        sharding=sharding,
    )


def _module_row(an: Analyzer, name: str, depth: int, counts, match) -> ModuleRow:
    per_phase: Counter[str] = Counter()
    ops: dict[tuple[str, str], list[float]] = {}
    for (module, phase, op), (count, nbytes, dur, timed) in counts.items():
        if not match(module):
            continue
        per_phase[phase] += int(count)
        if an.noise >= 2:
            o = ops.setdefault((op, phase), [0, 0, 0.0, 0])
            o[0] += count
            o[1] += nbytes
            o[2] += dur
            o[3] += timed
    return ModuleRow(
        module=name,
        depth=depth,
        counts=dict(per_phase),
        total=sum(per_phase.values()),
        ops=[
            # size and time of the calls that completed, as the ops table says them
            ModuleOp(op=op, phase=phase, count=int(c), mean_message_size=b / t if t else 0.0, mean_s=d / t if t else 0.0)
            for (op, phase), (c, b, d, t) in sorted(ops.items())
        ],
    )
