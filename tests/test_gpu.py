"""NCCL paths: only where a CUDA GPU is present (CI has none; these skip with the reason)."""

from __future__ import annotations

import os

import pytest
import torch

from otel_torchdist import names as n

from .harness import read_spans, run_ranks

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU and NCCL (none on this machine)"),
]


def test_nccl_collectives_are_gpu_timed_by_the_completion_hook(tmp_path):
    out = str(tmp_path / "job")
    run_ranks("nccl_timing", 1, out)
    spans = read_spans(os.path.join(out, "runs", "nccl", "traces.rank0.jsonl"))
    big = [s for s in spans if s["attributes"][n.COLL_MESSAGE_SIZE] == 256 << 20]
    assert big, spans
    for s in big:
        assert s["attributes"][n.COLL_END_SOURCE] == "nccl_completion_hook"
        assert s["attributes"][n.COLL_BACKEND] == "nccl"
        # 256 MiB cannot be reduced in the ~10 us an enqueue takes
        assert s["attributes"][n.COLL_DURATION] > 1e-4
