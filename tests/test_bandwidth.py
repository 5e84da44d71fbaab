"""nccl-tests' bus bandwidth factors and message size, checked against numbers worked out by hand."""

from __future__ import annotations

import pytest

from otel_torchdist import bandwidth as bw


@pytest.mark.parametrize(
    "kind,n,factor",
    [
        ("all_reduce", 8, 2 * 7 / 8),  # 1.75
        ("all_reduce", 2, 1.0),
        ("all_gather", 8, 7 / 8),
        ("reduce_scatter", 4, 0.75),
        ("all_to_all", 16, 15 / 16),
        ("broadcast", 8, 1.0),
        ("reduce", 8, 1.0),
        ("send_recv", 2, 1.0),
        ("permute", 4, 1.0),
        ("gather", 4, 0.75),
        ("scatter", 4, 0.75),
        ("barrier", 4, 0.0),
        ("all_gather", 1, 0.0),
    ],
)
def test_bus_factor(kind, n, factor):
    assert bw.bus_factor(kind, n) == pytest.approx(factor)


def test_all_reduce_example_from_nccl_tests_doc():
    # 1 GiB all-reduce over 8 ranks in 10 ms: algbw 107.37 GB/s, busbw 187.9 GB/s.
    size = 1 << 30
    assert bw.algbw_gbps(size, 0.01) == pytest.approx(107.374, rel=1e-4)
    assert bw.busbw_gbps("all_reduce", 8, size, 0.01) == pytest.approx(187.904, rel=1e-4)


def test_undefined_bandwidth_is_none_not_a_number():
    assert bw.algbw_gbps(0, 1.0) is None
    assert bw.algbw_gbps(100, 0.0) is None
    assert bw.busbw_gbps("barrier", 4, 0, 1.0) is None


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="unknown collective kind"):
        bw.bus_factor("allreduce", 4)
    with pytest.raises(ValueError, match="group size"):
        bw.bus_factor("all_reduce", 0)
