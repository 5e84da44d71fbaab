"""Message size and bandwidth, exactly as nccl-tests defines them (``doc/PERFORMANCE.md``).

``algbw = S / t`` and ``busbw = algbw * factor(kind, n)``, in GB/s (1e9 bytes per second), where ``S`` is
nccl-tests' operation size: for all_gather and reduce_scatter the *full* gathered / pre-scatter array, for
all_to_all the whole send buffer of one rank, for send/recv one direction, for gather and scatter the whole
gathered / scattered array on every rank (nccl-tests' gather.cu and scatter.cu, factor ``(n-1)/n``).
Barriers move no payload: ``S = 0`` and no bandwidth.

An all_to_all with uneven splits: ``S`` is this rank's send buffer. nccl-tests' alltoallv takes the largest
send or receive total of any rank, which one rank cannot see; with even splits the two agree.
"""

from __future__ import annotations

ALL_REDUCE = "all_reduce"
ALL_GATHER = "all_gather"
REDUCE_SCATTER = "reduce_scatter"
ALL_TO_ALL = "all_to_all"
BROADCAST = "broadcast"
REDUCE = "reduce"
GATHER = "gather"
SCATTER = "scatter"
SEND_RECV = "send_recv"
# Functional permute_tensor (context parallel's ring rotation): every rank sends all of its tensor to one
# peer and receives one, nccl-tests' sendrecv pattern (factor 1), yet a collective of the whole group.
PERMUTE = "permute"
BARRIER = "barrier"

KINDS = (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, BROADCAST, REDUCE, GATHER, SCATTER, SEND_RECV, PERMUTE, BARRIER)


def bus_factor(kind: str, n: int) -> float:
    """nccl-tests' busbw factor for a collective of ``kind`` over ``n`` ranks."""
    if n <= 0:
        raise ValueError(f"group size must be positive, got {n}")
    if kind == ALL_REDUCE:
        return 2.0 * (n - 1) / n
    if kind in (ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, GATHER, SCATTER):
        return (n - 1) / n
    if kind in (BROADCAST, REDUCE, SEND_RECV, PERMUTE):
        return 1.0
    if kind == BARRIER:
        return 0.0
    raise ValueError(f"unknown collective kind {kind!r}")


# bus_factor by (kind, ranks), filled as met: the drain reads it per record (and per traced span) inline,
# without a call. A group of no ranks has 0.0 here (bus_factor refuses it).
FACTORS: dict[tuple[str, int], float] = {}


def algbw_gbps(message_size: int, seconds: float) -> float | None:
    """``S / t`` in GB/s; None where it is undefined (no payload or no measurable time)."""
    if message_size <= 0 or seconds <= 0:
        return None
    return message_size / seconds / 1e9


def busbw_gbps(kind: str, n: int, message_size: int, seconds: float) -> float | None:
    alg = algbw_gbps(message_size, seconds)
    if alg is None or kind == BARRIER:
        return None
    return alg * bus_factor(kind, n)
