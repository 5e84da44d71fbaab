"""NCCL paths: only where a CUDA GPU is present (CI has none; these skip with the reason)."""

from __future__ import annotations

import os

import pytest
import torch

from otel_torchdist import names as n

from .harness import collective_spans, read_spans, run_ranks

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU and NCCL (none on this machine)"),
]


def test_nccl_collectives_are_gpu_timed_by_the_completion_hook(tmp_path):
    out = str(tmp_path / "job")
    run_ranks("nccl_timing", 1, out)
    spans = collective_spans(read_spans(os.path.join(out, "runs", "nccl", "traces.rank0.jsonl")))
    big = [s for s in spans if s["attributes"][n.COLL_MESSAGE_SIZE] == 256 << 20]
    assert big, spans
    for s in big:
        wall = (int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"])) / 1e9
        assert s["attributes"][n.COLL_END_SOURCE] == "nccl_completion_hook"
        assert s["attributes"][n.COLL_BACKEND] == "nccl"
        # each call was queued behind ~50 ms of GPU sleep: a span ended at enqueue would last microseconds
        assert wall > 0.02, s
        # the duration attribute is the kernel's own time (CUDA events), not the wait behind the sleep
        assert 0 < s["attributes"][n.COLL_DURATION] < wall
