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


@pytest.mark.parametrize("hook,backend", [("python", "nccl"), ("native", "nccl"), ("python", None)])
def test_nccl_collectives_are_gpu_timed_by_the_completion_hook(tmp_path, hook, backend, request):
    """The hook in Python, and in C++ (``nccl_hook="native"``: no Python on torch's hook thread); and a
    group made by ``init_process_group()`` without a backend (torch names it "undefined")."""
    if hook == "native":
        request.getfixturevalue("native_built")
    out = str(tmp_path / "job")
    (result,) = run_ranks("nccl_timing", 1, out, {"nccl_hook": hook, "backend": backend})
    assert result["native_hooks"] == (1 if hook == "native" else 0)
    spans = collective_spans(read_spans(os.path.join(out, "runs", "nccl", "traces.rank0.jsonl")))
    big = [s for s in spans if s["attributes"][n.COLL_MESSAGE_SIZE] == 256 << 20]
    assert big, spans
    for s in big:
        wall = (int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"])) / 1e9
        assert s["attributes"][n.COLL_END_SOURCE] == "nccl_completion_hook"
        assert s["attributes"][n.COLL_BACKEND] == "nccl"  # not "undefined"
        # each call was queued behind ~50 ms of GPU sleep: a span ended at enqueue would last microseconds
        assert wall > 0.02, s
        # the duration attribute is the kernel's own time (CUDA events), not the wait behind the sleep
        assert 0 < s["attributes"][n.COLL_DURATION] < wall


@pytest.mark.parametrize("hook", ["python", "native"])
def test_ddp_on_nccl_is_recorded_by_the_native_group_and_gpu_timed(tmp_path, native_built, hook):
    """No comm hook (DDP keeps its own bucket path and numbers), each bucket ended by the completion hook
    (in C++ too: ``nccl_hook="native"`` ends the native group's entries without Python)."""
    out = str(tmp_path / "job")
    (result,) = run_ranks("nccl_ddp", 1, out, {"steps": 5, "nccl_hook": hook})
    assert result["attached"] and not result["comm_hook"]
    assert result["native_hooks"] == (1 if hook == "native" else 0)
    assert result["same"]  # the parameters trained through DDP are those trained without it, bit for bit
    spans = read_spans(os.path.join(out, "runs", "nccl-ddp", "traces.rank0.jsonl"))
    steps = {s["traceId"]: s["attributes"][n.STEP] for s in spans if s["name"] == n.SPAN_RANK_STEP}
    by_step: dict = {}
    for s in spans:
        if s["attributes"].get(n.COLL_SOURCE) == "ddp_reducer" and s["name"] == "all_reduce":
            by_step.setdefault(steps.get(s["traceId"]), []).append(s)
    assert sorted(by_step) == sorted(steps.values()) and len(by_step) == 5, by_step.keys()
    for step, found in by_step.items():
        a = [s["attributes"] for s in found]
        assert all(x[n.COLL_END_SOURCE] == "nccl_completion_hook" and x[n.COLL_BACKEND] == "nccl" for x in a), a
        assert all(0 < x[n.COLL_DURATION] <= (int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"])) / 1e9 + 1e-3 for x, s in zip(a, found))
        if step >= 2:  # after DDP's bucket rebuild: two buckets, the gradients' bytes
            assert [x[n.DDP_BUCKET_INDEX] for x in a] == [0, 1] and [x[n.DDP_BUCKET_LAST] for x in a] == [False, True], a
            assert sum(x[n.COLL_MESSAGE_SIZE] for x in a) == 4 * (16 * 64 + 64 + 64 * 64 + 64 + 64 * 4 + 4)


@pytest.mark.parametrize("hook", ["python", "native"])
def test_a_point_to_point_batch_does_not_end_the_collective_of_its_number(tmp_path, hook, request):
    """ProcessGroupNCCL numbers point-to-point work apart; a batch_isend_irecv's report (one COALESCED work)
    carries a number the group's collectives also get. Each all_reduce ends at its own completion (joined
    on its number by a report of the batch, it would end before it began), and the stamp that tells them
    apart (WorkInfo.time_started) is on the records' clock."""
    if hook == "native":
        request.getfixturevalue("native_built")
    out = str(tmp_path / "job")
    (result,) = run_ranks("nccl_p2p_numbering", 1, out, {"nccl_hook": hook})
    assert result["start_check"] == 1  # a collective's work was seen to start inside its call
    assert result["native_hooks"] == (1 if hook == "native" else 0)
    spans = sorted((s for s in collective_spans(read_spans(os.path.join(out, "runs", "nccl-p2p", "traces.rank0.jsonl")))
                    if s["name"] == "all_reduce"), key=lambda s: int(s["startTimeUnixNano"]))  # fmt: skip
    assert len(spans) == 3, spans
    for s in spans:
        assert s["attributes"][n.COLL_END_SOURCE] == "nccl_completion_hook"
        assert int(s["endTimeUnixNano"]) > int(s["startTimeUnixNano"]), s
    for s in spans[1:]:  # queued behind the GPU sleep: a batch's end would come before the call
        assert (int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"])) / 1e9 > 0.02, s


def test_functional_collectives_on_nccl_end_by_the_completion_hook(tmp_path):
    """DTensor and tensor parallel's functional collectives: on a GPU ``wait_tensor`` returns once the stream
    waits, long before the collective ends; the record ends by the completion hook."""
    out = str(tmp_path / "job")
    run_ranks("nccl_funcol", 1, out, {})
    spans = collective_spans(read_spans(os.path.join(out, "runs", "nccl-funcol", "traces.rank0.jsonl")))
    assert len(spans) == 2, spans
    for s in spans:
        assert s["attributes"][n.COLL_END_SOURCE] == "nccl_completion_hook", s
        assert (int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"])) / 1e9 > 0.02, s  # after the GPU sleep


def test_a_collective_captured_into_a_cuda_graph_does_not_wait_for_a_report(tmp_path):
    """CUDA graphs with the completion hook's timing on: the graph's results are torch's, the captured
    all_reduce ends at enqueue and nothing stays waiting for the report that no capture gets."""
    out = str(tmp_path / "job")
    (result,) = run_ranks("nccl_graph_capture", 1, out, {})
    assert result["value"] == result["expected"] and result["pending"] == 0 and not result["errors"], result
    spans = sorted(collective_spans(read_spans(os.path.join(out, "runs", "nccl-graph", "traces.rank0.jsonl"))),
                   key=lambda s: int(s["startTimeUnixNano"]))  # fmt: skip
    assert [s["attributes"][n.COLL_END_SOURCE] for s in spans] == ["nccl_completion_hook"] * 3 + ["enqueue"]
