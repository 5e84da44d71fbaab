"""This process and its host: CPU time and use (the process's own clock), and through psutil resident memory,
open files and network bytes.

Network bytes are summed over the host's interfaces except loopback (ranks on one host talk over ``lo``,
which is not network traffic) and counted from the sampler's first reading, so the counter starts at 0.
"""

from __future__ import annotations

from time import monotonic, process_time
from typing import Any

import psutil

from .. import names as n
from ..identity import process_start_time
from ..telemetry import MetricData, NumberPoint
from .series import Deltas, labels


def _loopback(nic: str) -> bool:
    return nic == "lo" or nic.startswith("lo") or nic.lower().startswith("loopback")


# A CPU reading whose clock bracket is wider than this is not a window's edge: the GIL went away between them.
_BRACKET_S = 0.001


def _cpu_and_clock() -> tuple[float, float | None]:
    """This process's CPU seconds (all threads, to the nanosecond) and the monotonic time they were read at.

    The reading is bracketed by the clock and taken again when the bracket is wide: a stamp late against its
    reading lengthens one window and shortens the next (6.5 cores read on a 2-core machine at 50 ms, with
    psutil's 10 ms ticks and the stamp taken after its file read). No time (None) when no bracket was narrow.
    """
    for _ in range(4):
        t0 = monotonic()
        cpu = process_time()
        t1 = monotonic()
        if t1 - t0 < _BRACKET_S:
            return cpu, (t0 + t1) / 2
    return cpu, None


class ProcessSampler:
    def __init__(self, host: str) -> None:
        self.host = host
        self._proc = psutil.Process()
        # CPU time counts from the process's start, not from instrument(): its counter says so.
        self._start_ns = int(process_start_time() * 1e9)
        self._net = Deltas()
        self._last_cpu: tuple[float, float] | None = None  # (cpu seconds, monotonic seconds)
        self._has_fds = hasattr(self._proc, "num_fds")  # POSIX only

    def sample(self, base: dict[str, str]) -> list[MetricData]:
        proc = self._proc
        cpu, now = _cpu_and_clock()
        with proc.oneshot():
            rss = proc.memory_info().rss
            fds = proc.num_fds() if self._has_fds else None
        rank = labels(n.PROCESS_CPU_TIME, base)
        out = [
            MetricData(n.PROCESS_CPU_TIME, [NumberPoint(rank, cpu)], start_ns=self._start_ns),
            MetricData(n.PROCESS_RSS, [NumberPoint(rank, int(rss))]),
        ]
        if now is not None:  # else the window stays open from its last good edge, and the next sample closes it
            if self._last_cpu is not None and now > self._last_cpu[1]:
                cores = max(0.0, (cpu - self._last_cpu[0]) / (now - self._last_cpu[1]))
                out.append(MetricData(n.PROCESS_CPU_UTILIZATION, [NumberPoint(rank, cores)]))
            self._last_cpu = (cpu, now)
        if fds is not None:
            out.append(MetricData(n.PROCESS_OPEN_FDS, [NumberPoint(rank, int(fds))]))
        sent = received = 0
        for nic, c in psutil.net_io_counters(pernic=True).items():
            if not _loopback(nic):
                sent += c.bytes_sent
                received += c.bytes_recv
        out.append(
            MetricData(
                n.HOST_NETWORK_IO,
                [
                    NumberPoint(labels(n.HOST_NETWORK_IO, base, self.host, "transmit"), int(self._net.feed("tx", sent))),
                    NumberPoint(labels(n.HOST_NETWORK_IO, base, self.host, "receive"), int(self._net.feed("rx", received))),
                ],
            )
        )
        return out


def describe() -> dict[str, Any]:
    """Host facts for the run description."""
    return {"cpu_count": psutil.cpu_count(), "memory_bytes": psutil.virtual_memory().total}
