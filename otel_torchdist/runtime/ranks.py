"""The threads a rank runs with the others once its identity is known: the straggler exchange, one root span
per step across ranks, the hang watchdog and the hang board; their leaving the store before it goes, and
their coming back with a process group made after ``destroy_process_group()``."""

from __future__ import annotations

from typing import Any

from .. import health, steps
from ..capture import dataloader as dataloader_capture
from ..config import Config
from ..drain import hang_board, step_roots, stragglers, watchdog
from ..drain.pipeline import Pipeline
from ..identity import Identity


class RankThreads:
    def __init__(self, cfg: Config, pipeline: Pipeline, tracker: steps.StepTracker) -> None:
        self.cfg = cfg
        self.pipeline = pipeline
        self.steps = tracker
        self.exchange: stragglers.Exchange | None = None
        self.roots: step_roots.StepRoots | None = None
        self.watchdog: watchdog.Watchdog | None = None
        self.board: hang_board.HangBoard | None = None
        self.left = False  # the store threads ended with their process group (leave_store)

    def start(self, ident: Identity, rt: Any) -> None:
        cfg, pipeline, tracker = self.cfg, self.pipeline, self.steps
        self._start_store_threads(ident)
        tracker.attach(pipeline, ident.trace_key, ident.rank, ident.world_size)
        dataloader_capture.FETCH[0] = tracker.on_fetch
        self.watchdog = watchdog.Watchdog(rt, cfg.hang_threshold)
        pipeline.metric_sources.append(self.watchdog.metric_data)
        self._start_board(ident)
        self.watchdog.start()

    def rejoin(self, ident: Identity, rank: int, world_size: int) -> None:
        """A process group made after ``destroy_process_group()`` ended the store threads: they start again
        on its store, when this rank is the same rank of a world of the same size (the identity the run's
        telemetry carries); else they stay off, and the log says so."""
        if not self.left:
            return
        self.left = False
        if (rank, world_size) != (ident.rank, ident.world_size):
            health.warn_once(
                "rejoin", "a process group with rank %d of %d after rank %d of %d was destroyed: the straggler "
                "exchange, step roots and hang board stay off", rank, world_size, ident.rank, ident.world_size,
            )  # fmt: skip
            return
        self._start_store_threads(ident)
        self._start_board(ident)

    def _start_store_threads(self, ident: Identity) -> None:
        cfg, pipeline, tracker = self.cfg, self.pipeline, self.steps
        every = cfg.straggler_exchange_steps
        if every and ident.distributed and 1 < ident.world_size <= stragglers.MAX_WORLD:
            self.exchange = stragglers.Exchange(pipeline, ident.trace_key, ident.rank, ident.world_size, every)
            tracker.exchange = self.exchange
            self.exchange.start()
        # The lowest traced rank emits each traced step's root (rank 0 unless trace_ranks leaves it out).
        traced = [r for r in range(ident.world_size) if cfg.traces_rank(r)] if ident.world_size > 1 else [0]
        tracker.root_rank = traced[0] if traced else 0
        if ident.distributed and ident.world_size > 1 and cfg.traces_rank(ident.rank) and stragglers.default_tcp_store() is not None:
            self.roots = step_roots.StepRoots(pipeline, ident.trace_key, ident.rank, traced)
            tracker.roots = self.roots
            self.roots.start()

    def _start_board(self, ident: Identity) -> None:
        if ident.distributed and ident.world_size > 1 and stragglers.default_tcp_store() is not None:
            self.board = hang_board.HangBoard(ident.trace_key, ident.rank, ident.world_size, self.watchdog.interval)
            self.watchdog.board = self.board
            self.board.start()

    def leave_store(self, budget: float) -> None:
        """End the threads with a connection of their own to the process group's store (the straggler
        exchange, the step roots) before the store can go away: a client blocked in a store that is destroyed
        aborts the process. The last steps' times reach rank 0 first (and their roots go out); a root closed
        later is emitted as rank 0 saw it."""
        self.left = True
        if self.exchange is not None:
            self.exchange.stop()
        if self.board is not None:
            self.board.stop()
        if self.roots is not None:
            self.pipeline.drain()
            self.roots.stop(min(1.0, budget))
