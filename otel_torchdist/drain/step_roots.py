"""The cross-rank root of a traced step, timed over every rank's part of it.

The lowest traced rank (rank 0 unless ``trace_ranks`` leaves it out; "rank 0" below) emits a traced step's
root span (``train.step``), the parent of every rank's ``train.rank_step``.
Timed from rank 0's step alone, another rank's step that began earlier or ended later would lie outside its
parent (Jaeger draws it past the root's end). So each rank publishes its traced steps' start and end under a
key of the process group's TCPStore, from a thread of its own with a client connection of its own (never
a collective, never the training thread, as ``stragglers.py`` does), and rank 0 emits each root once every
rank's times are in, from the earliest start to the latest end: the root covers its children by
construction, whatever the clocks. A rank that does not answer within ``WAIT`` seconds, or a store that
cannot be reached, only narrows that root to the ranks that did (``torchdist.step.ranks_timed`` says how
many); a full queue emits the root as rank 0 saw it. Only traced steps pay: a few per hundred steps.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from .. import health
from .. import names as n
from .stragglers import connect_store, stop_worker

WAIT = 5.0  # seconds rank 0 waits for the other ranks' times of one step
POLL = 0.05
QUEUE = 64


class StepRoots:
    def __init__(self, pipeline: Any, trace_key: str, rank: int, traced_ranks: list[int]) -> None:
        self.pipeline = pipeline
        self.trace_key = trace_key
        self.rank = rank
        self.others = [r for r in traced_ranks if r != rank]  # the ranks whose steps are traced (trace_ranks)
        self._queue: queue.Queue = queue.Queue(maxsize=QUEUE)
        self._stopping = threading.Event()
        self._deadline: float | None = None  # at stop: when waiting for other ranks ends
        self._client: Any = None
        self._broken = False
        self._thread = threading.Thread(target=self._run, name="otel-torchdist-step-roots", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def add(self, shared_trace: int, start: int, end: int, root: Any = None) -> None:
        """A traced step closed on this rank (drain thread): its times, and on rank 0 its root span to emit."""
        if self._stopping.is_set() and not self._thread.is_alive():
            if root is not None:
                self.pipeline.outbox.add_span(root)  # too late to hear from the others: as rank 0 saw it
            return
        try:
            self._queue.put_nowait((shared_trace, start, end, root))
        except queue.Full:
            if root is not None:
                self.pipeline.outbox.add_span(root)
            else:
                health.dropped("step_times")

    def stop(self, wait: float) -> None:
        """Publish what is queued and emit the roots waiting, giving the other ranks up to ``wait`` seconds."""
        self._deadline = time.monotonic() + wait
        stop_worker(self._thread, self._stopping, self._queue, wait + 1.0)

    # ----------------------------------------------------------------------------------- thread
    def _key(self, trace: int, rank: int) -> str:
        return f"otel_torchdist/{self.trace_key}/roots/{trace:032x}/rank{rank}"

    def _run(self) -> None:
        try:
            while True:
                try:
                    item = self._queue.get(timeout=0.5 if self._stopping.is_set() else None)
                except queue.Empty:
                    return
                if item is None:
                    if self._queue.empty():
                        return
                    continue
                self._one(*item)
        finally:
            self._client = None

    def _one(self, trace: int, start: int, end: int, root: Any) -> None:
        client = self._connected()
        if root is None:
            if client is not None:
                try:
                    client.set(self._key(trace, self.rank), f"{start},{end}")
                except Exception as exc:
                    self._broke(exc)
            return
        timed = 1
        if client is not None:
            try:
                times = self._gather(client, trace)
            except Exception as exc:
                self._broke(exc)
                times = []
            for a, b in times:
                start, end = min(start, a), max(end, b)
            timed += len(times)
        root.start_ns, root.end_ns = start, end
        root.attributes.append((n.STEP_RANKS_TIMED, timed))
        self.pipeline.outbox.add_span(root)

    def _gather(self, client: Any, trace: int) -> list[tuple[int, int]]:
        """The other ranks' (start, end) of the step: waits until all are in, or up to WAIT (less at stop)."""
        keys = [self._key(trace, r) for r in self.others]
        deadline = time.monotonic() + WAIT
        while not client.check(keys):
            limit = deadline if self._deadline is None else min(deadline, self._deadline)
            if time.monotonic() >= limit:
                keys = [k for k in keys if client.check([k])]
                break
            time.sleep(POLL)
        if not keys:
            return []
        values = client.multi_get(keys)
        for key in keys:
            client.delete_key(key)
        out = []
        for raw in values:
            a, b = raw.decode().split(",")
            out.append((int(a), int(b)))
        return out

    def _connected(self) -> Any:
        if self._client is None and not self._broken:
            try:
                self._client = connect_store()
            except Exception as exc:
                self._broke(exc)
        return self._client

    def _broke(self, exc: Exception) -> None:
        """No store (or it went away): roots as rank 0 saw them from now on."""
        self._broken = True
        self._client = None
        health.error("step_roots", "the step roots cannot hear from the other ranks; roots are timed from rank 0 alone", exc)
