"""What a rank says about its run: the line that announces where its telemetry goes, and at the end the
summary (the run folder's summary.rank<N>.json, the table on stderr, a warning for what was lost)."""

from __future__ import annotations

import logging
import os
import sys
import time

from .. import health
from .. import names as n
from .. import summary as _summary
from ..config import Config
from ..drain.pipeline import Pipeline
from ..identity import Identity
from ..steps import StepTracker
from .outlets import Outlets, write_json

_log = logging.getLogger("otel_torchdist")


def speaks(cfg: Config, ident: Identity) -> bool:
    return cfg.summary == "all" or (cfg.summary == "rank0" and ident.rank == 0)


def announce(cfg: Config, ident: Identity, destinations: list[str]) -> None:
    msg = (
        f"otel-torchdist: run {ident.run_id}, rank {ident.rank}/{ident.world_size} ({ident.backend}); "
        + "; ".join(destinations)
    )
    if speaks(cfg, ident):
        say(msg)
    else:
        _log.info(msg)


def summarize(cfg: Config, ident: Identity, pipeline: Pipeline, tracker: StepTracker, outlets: Outlets, started_at: float) -> None:
    table = _summary.rows(pipeline.collective_series())
    drops = health.drops()
    errors = health.errors()
    step_stats = _summary.steps(pipeline.framework, tracker)
    write_json(
        outlets.folder,
        f"summary.rank{ident.rank}.json",
        {
            "run": ident.run_id,
            "rank": ident.rank,
            "collectives": table,
            "steps": step_stats,
            "dropped": drops,
            "errors": errors,
        },
    )
    lost = {k: v for k, v in (drops or {}).items() if v and k not in n.POLICY_DROPS}
    if lost:
        _log.warning(
            "otel-torchdist: telemetry dropped on this rank to protect training: %s",
            ", ".join(f"{v} {k}" for k, v in sorted(lost.items())),
        )
    if not speaks(cfg, ident):
        return
    footer = _summary.step_lines(step_stats) + [
        f"telemetry dropped: {sum(drops.values())} ({', '.join(f'{k} {v}' for k, v in drops.items()) or 'none'}); "
        f"internal errors: {sum(errors.values())}"
    ]
    footer += outlets.destinations
    if outlets.folder:
        footer.append(f"run folder: {os.path.abspath(outlets.folder)}")
    header = (
        f"otel-torchdist summary: run {ident.run_id}, rank {ident.rank} of {ident.world_size} "
        f"({ident.backend}), {time.monotonic() - started_at:.1f} s instrumented"
    )
    try:
        say(_summary.render(header, table, footer))
    except Exception:
        pass


def say(text: str) -> None:
    """One write per message: print() writes the text and its newline separately, and a warning the
    export thread logs in between lands in the middle of the line."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()
