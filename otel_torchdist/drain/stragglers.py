"""Which rank is slow: a cheap, infrequent exchange of per-rank step times through the store.

Every ``straggler_exchange_steps`` steps each rank publishes the compute and collective-wait time of its
last window of steps under a key of the process group's TCPStore, through a client connection of its own
on a background thread (never a collective, so the user's collectives are neither delayed nor
reordered). Rank 0 waits for every rank's key (bounded), computes each rank's straggler score and the
slowest rank, and publishes them; every rank reads the result and exports its own score and the slowest
rank. A rank that does not answer in time only costs that window (nobody blocks: the training threads
never touch this).

Score of rank r over a window: (median compute_r - min median compute) / median step time, clipped at 0:
medians, so that one odd step (a checkpoint, a garbage collection, an evaluation) does not name a rank
that is not slow. Under DDP, and in
any loop synchronised by collectives, everyone's step takes as long as the slowest rank's; the slow rank
computes longest and waits least, so its score is the highest and the others' are near 0. Step 1 (set-up,
lazy initialisation, compilation, different on every rank) is left out of the first window.
"""

from __future__ import annotations

import datetime
import json
import logging
import queue
import statistics
import threading
import time
from typing import Any

from .. import callbacks, health
from .. import names as n

_log = logging.getLogger("otel_torchdist")
MAX_WORLD = 1024
TIMEOUT = datetime.timedelta(seconds=30)
POLL = 0.1  # seconds between checks for the other ranks' keys
VERDICT = 0.2  # a score above this names a straggler (log line on rank 0, the straggler callback everywhere)


def default_tcp_store() -> Any:
    """The default process group's TCPStore (under its prefix and wrapper stores), or None."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    try:
        store = c10d._get_default_store()
    except Exception:
        return None
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    return store if isinstance(store, dist.TCPStore) else None


def connect_store(timeout: datetime.timedelta = TIMEOUT) -> Any:
    """A client connection of this thread's own to the default process group's TCPStore, each operation
    bounded by ``timeout``."""
    import torch.distributed as dist

    store = default_tcp_store()
    if store is None:
        raise RuntimeError("the default process group's store is not a TCPStore")
    return dist.TCPStore(store.host, store.port, is_master=False, timeout=timeout, wait_for_workers=False)


def stop_worker(thread: threading.Thread, stopping: threading.Event, work: queue.Queue, timeout: float) -> None:
    """End a store thread fed by ``work``: flag it, wake it with ``None``, wait up to ``timeout`` seconds."""
    stopping.set()
    try:
        work.put_nowait(None)
    except queue.Full:
        pass
    if thread.is_alive() and thread is not threading.current_thread():
        thread.join(timeout=timeout)


class _Stopped(Exception):
    pass


def scores(windows: dict[int, dict[str, float]]) -> tuple[dict[int, float], int]:
    """Straggler score of every rank, and the slowest rank, from each rank's window summary."""
    computes = {r: w["compute_median"] for r, w in windows.items()}
    step = statistics.median(w["duration_median"] for w in windows.values())
    low = min(computes.values())
    result = {r: max((c - low) / step, 0.0) if step > 0 else 0.0 for r, c in computes.items()}
    slowest = max(computes, key=lambda r: (computes[r], -r))
    return result, slowest


def _summary(durations: list[float], computes: list[float], waits: list[float]) -> dict[str, float]:
    return {
        "steps": len(durations),
        "duration": sum(durations),
        "compute": sum(computes),
        "wait": sum(waits),
        "duration_median": statistics.median(durations),
        "compute_median": statistics.median(computes),
    }


class Exchange:
    def __init__(self, pipeline: Any, trace_key: str, rank: int, world: int, every: int) -> None:
        self.pipeline = pipeline
        self.trace_key = trace_key  # the run id, and the elastic attempt: a restart reuses neither keys nor windows
        self.rank = rank
        self.world = world
        self.every = every
        self.window: tuple[list[float], list[float], list[float]] = ([], [], [])
        self._queue: queue.Queue = queue.Queue(maxsize=4)
        self._client: Any = None
        self._stopping = threading.Event()
        self.completed = 0  # windows exchanged
        self._thread = threading.Thread(target=self._run, name="otel-torchdist-stragglers", daemon=True)
        pipeline.framework.set(n.STRAGGLER_SCORE, (), 0.0)
        pipeline.framework.set(n.STRAGGLER_SLOWEST, (), -1)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ends the thread and its store connection before the store can go away (rank 0 hosts it, and a
        client blocked in it while it is destroyed aborts the process)."""
        stop_worker(self._thread, self._stopping, self._queue, 2.0)

    def add_step(self, index: int, duration: float, compute: float, wait: float) -> None:
        """Called by the drain thread when a step closes."""
        if index == 1 or self._stopping.is_set():
            # Step 1 holds each rank's own set-up (arrival skew, lazy init, compilation): not straggling.
            return
        w = self.window
        w[0].append(duration)
        w[1].append(compute)
        w[2].append(wait)
        if index % self.every == 0:
            self.window = ([], [], [])
            try:
                self._queue.put_nowait((index // self.every, _summary(*w)))
            except queue.Full:
                health.dropped("straggler_window")

    # ----------------------------------------------------------------------------------- thread
    def _key(self, window: int, what: str) -> str:
        return f"otel_torchdist/{self.trace_key}/stragglers/{window}/{what}"

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                item = self._queue.get()
                if item is None or self._stopping.is_set():
                    return
                try:
                    if self._client is None:
                        self._client = connect_store()
                    self._exchange(*item)
                except _Stopped:
                    return
                except Exception as exc:
                    health.error("stragglers", "the straggler exchange failed; scores are not updated", exc)
                    if not isinstance(exc, TimeoutError):  # _wait's: a rank late this window; the next may do
                        # No store to talk to, or it went away (its host ended): give up for this run, as the
                        # other store threads do, rather than fail against it every window (torch logs each).
                        return
        finally:
            self._client = None

    def _wait(self, keys: list[str]) -> None:
        """``store.wait`` in short polls, so that ``stop`` is never stuck behind a rank that went away."""
        client = self._client
        deadline = time.monotonic() + TIMEOUT.total_seconds()
        while not client.check(keys):
            if self._stopping.wait(POLL):
                raise _Stopped
            if time.monotonic() > deadline:
                raise TimeoutError(f"no answer within {TIMEOUT.total_seconds():.0f} s for {keys[0]}...")

    def _exchange(self, window: int, totals: dict[str, float]) -> None:
        client = self._client
        client.set(self._key(window, f"rank{self.rank}"), json.dumps(totals))
        result_key = self._key(window, "result")
        if self.rank == 0:
            keys = [self._key(window, f"rank{r}") for r in range(self.world)]
            self._wait(keys)
            values = client.multi_get(keys)
            windows = {r: json.loads(v) for r, v in enumerate(values)}
            per_rank, slowest = scores(windows)
            client.set(result_key, json.dumps({"scores": per_rank, "slowest": slowest}))
            for key in keys:
                client.delete_key(key)
            if window >= 2:
                client.delete_key(self._key(window - 2, "result"))
        self._wait([result_key])
        result = json.loads(client.get(result_key))
        fw = self.pipeline.framework
        fw.set(n.STRAGGLER_SCORE, (), float(result["scores"][str(self.rank)]))
        fw.set(n.STRAGGLER_SLOWEST, (), int(result["slowest"]))
        self.completed += 1
        score = float(result["scores"][str(result["slowest"])])
        if score > VERDICT:
            everyone = {int(r): float(v) for r, v in result["scores"].items()}
            callbacks.fire("straggler", callbacks.StragglerEvent(self.rank, int(result["slowest"]), score, everyone, window))
        if self.rank == 0 and score > VERDICT:
            _log.info("straggler: rank %s (score %.2f) over steps of window %d", result["slowest"],
                      result["scores"][str(result["slowest"])], window)  # fmt: skip
