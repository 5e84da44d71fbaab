"""Functional collectives (``torch.distributed._functional_collectives``) on the ``fake`` backend.

The ``fake`` backend completes at once and, unlike gloo, its works do not hold their outputs: an output
dropped unwaited really is freed, which is what the weak-reference path needs. Tensor parallel training over
real gloo ranks (waits through views, CommDebugMode's counts) is in test_training_paths.py.
"""

from __future__ import annotations

import gc
import os
import time

import pytest
import torch
import torch.distributed._functional_collectives as funcol

import otel_torchdist
from otel_torchdist import names as n
from otel_torchdist.capture import funcol as capture

from .harness import collective_spans, read_spans


def _spans(folder: str) -> list[dict]:
    otel_torchdist.uninstrument()
    spans = collective_spans(read_spans(os.path.join(folder, "traces.rank0.jsonl")))
    return sorted(spans, key=lambda s: int(s["startTimeUnixNano"]))


def test_keyword_call_records_group_payload_and_reduce_op(fake_pg, instrumented):
    folder = instrumented()
    x = torch.ones(4, 8)
    # DTensor's own spelling: every parameter but the tensor by keyword
    out = funcol.all_reduce(x, reduceOp="avg", group=fake_pg)
    assert isinstance(out, funcol.AsyncCollectiveTensor)
    out.wait()
    funcol.reduce_scatter_single(torch.ones(8, 2), "max", 0, fake_pg).wait()
    funcol.all_gather_single(torch.ones(2, 3), gather_dim=0, group=fake_pg).wait()
    funcol.broadcast(torch.ones(5), src=2, group=fake_pg).wait()
    ar, rs, ag, bc = _spans(folder)
    assert ar["name"] == "all_reduce"
    assert ar["attributes"][n.COLL_REDUCE_OP] == "avg"
    assert ar["attributes"][n.COLL_MESSAGE_SIZE] == 4 * 8 * 4
    assert ar["attributes"][n.COLL_SHAPES] == ["[4, 8]"]
    assert rs["attributes"][n.COLL_REDUCE_OP] == "max"
    assert rs["attributes"][n.COLL_MESSAGE_SIZE] == 8 * 2 * 4  # the pre-scatter input
    assert ag["attributes"][n.COLL_MESSAGE_SIZE] == 2 * 3 * 4 * 4  # the gathered output: input x group size
    assert bc["attributes"][n.COLL_ROOT] == 2
    for s in (ar, rs, ag, bc):
        assert s["attributes"][n.COLL_END_SOURCE] == "wait"
        assert s["attributes"][n.COLL_FRAMEWORK] == "funcol"
        assert s["attributes"][n.FUNCOL_WAIT_S] >= 0
    assert [s["attributes"][n.COLL_SEQ] for s in (ar, rs, ag, bc)] == sorted({s["attributes"][n.COLL_SEQ] for s in (ar, rs, ag, bc)})
    assert not capture._pending


def test_record_ends_at_the_wait_not_at_the_call(fake_pg, instrumented):
    folder = instrumented()
    out = funcol.all_reduce(torch.ones(16), "sum", fake_pg)
    time.sleep(0.05)
    issued_and_slept = time.time_ns()
    torch.testing.assert_close(out + 0, torch.ones(16))  # an op on it waits
    (span,) = _spans(folder)
    assert int(span["endTimeUnixNano"]) >= issued_and_slept - 5_000_000  # clock slack: 5 ms
    assert span["attributes"][n.COLL_END_SOURCE] == "wait"


def test_coalesced_call_is_one_record_ended_by_its_last_wait(fake_pg, instrumented):
    folder = instrumented()
    a, b = funcol.all_reduce_coalesced([torch.ones(3), torch.ones(5)], "sum", fake_pg)
    a.wait()
    assert len(capture._pending) == 1, "the second output still holds the record open"
    b.wait()
    assert not capture._pending
    (span,) = _spans(folder)
    assert span["name"] == "all_reduce_coalesced"
    assert span["attributes"][n.COLL_TENSORS] == 2
    assert span["attributes"][n.COLL_MESSAGE_SIZE] == (3 + 5) * 4
    assert span["attributes"][n.COLL_END_SOURCE] == "wait"


def test_output_freed_unwaited_ends_its_record_then_as_unfinished(fake_pg, instrumented):
    folder = instrumented()
    out = funcol.all_gather_single(torch.ones(2), 0, fake_pg)
    assert len(capture._pending) == 1
    del out
    gc.collect()
    assert not capture._pending, "the storage's weak reference ended the record"
    freed = time.time_ns()
    time.sleep(0.02)
    funcol.all_reduce(torch.ones(2), "sum", fake_pg).wait()  # a later record, whatever address it gets
    dropped, later = _spans(folder)
    assert dropped["attributes"][n.COLL_END_SOURCE] == "unfinished"
    assert int(dropped["endTimeUnixNano"]) <= freed + 5_000_000  # ended at the free, not at uninstrument()
    assert later["attributes"][n.COLL_END_SOURCE] == "wait"


def test_result_and_exception_pass_through(fake_pg, instrumented):
    x = torch.arange(6.0)
    plain = funcol.all_reduce(x, "sum", fake_pg)
    plain_value = plain.wait().clone()
    folder = instrumented()
    out = funcol.all_reduce(x, "sum", fake_pg)
    assert type(out) is type(plain)
    torch.testing.assert_close(out.wait(), plain_value)
    with pytest.raises(Exception) as raised:
        funcol.all_reduce(x, "no-such-op", fake_pg)
    otel_torchdist.uninstrument()
    with pytest.raises(type(raised.value)):
        funcol.all_reduce(x, "no-such-op", fake_pg)
    spans = collective_spans(read_spans(os.path.join(folder, "traces.rank0.jsonl")))
    failed = [s for s in spans if s["attributes"].get(n.ERROR_TYPE)]
    assert len(spans) == 2 and len(failed) == 1


def test_a_function_whose_signature_moved_is_left_uncaptured_not_fatal():
    from otel_torchdist import health

    def all_reduce(tensor, op, pg):  # no 'group' or 'tag' parameter: what a future torch might have
        return tensor

    errors = health.errors().get("capture", 0)
    assert capture._wrap("all_reduce", funcol)(all_reduce) is all_reduce
    assert health.errors()["capture"] == errors + 1


def test_broadcast_root_is_a_rank_of_the_group(instrumented):
    """funcol's src is a rank of its group (the C++ op's root rank): recorded as the global rank."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=2, world_size=4)
    try:
        folder = instrumented()
        upper = dist.new_group([2, 3])  # group ranks 0, 1 are global ranks 2, 3
        funcol.broadcast(torch.ones(5), src=1, group=upper).wait()
        otel_torchdist.uninstrument()
        (bc,) = collective_spans(read_spans(os.path.join(folder, "traces.rank2.jsonl")))
        assert bc["attributes"][n.COLL_ROOT] == 3
    finally:
        dist.destroy_process_group()


def test_meshes_equal_over_different_groups_keep_their_own_group(fake_pg, instrumented):
    """A DeviceMesh equals another over the same ranks whatever process groups it holds: each call is
    still filed under its own mesh's group, with that group's sequence numbers."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    folder = instrumented()
    pg_a = dist.new_group([0, 1, 2, 3], group_desc="pg_a")
    pg_b = dist.new_group([0, 1, 2, 3], group_desc="pg_b")
    mesh_a, mesh_b = DeviceMesh.from_group(pg_a, "cpu"), DeviceMesh.from_group(pg_b, "cpu")
    assert mesh_a == mesh_b  # torch's equality: ranks, layout, device, names
    funcol.all_reduce(torch.ones(8), "sum", mesh_a).wait()
    funcol.all_reduce(torch.ones(8), "sum", mesh_b).wait()
    first = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    second = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    assert first == second and first.get_group(1) is not second.get_group(1)
    funcol.all_reduce(torch.ones(8), "sum", (first, 1)).wait()  # DTensor's (mesh, dim) form
    funcol.all_reduce(torch.ones(8), "sum", (second, 1)).wait()
    names = [s["attributes"][n.COLL_GROUP_NAME] for s in _spans(folder)]
    expected = [g.group_name for g in (pg_a, pg_b, first.get_group(1), second.get_group(1))]
    assert names == expected


def test_a_failed_wait_ends_its_record_with_the_error(fake_pg, instrumented):
    """The wait raises (a peer gone, a timeout): the exception reaches the caller and the record carries it.
    (The fake backend's works cannot fail: torch's wait_tensor is stood in for by one that raises, wrapped as
    the library wraps it.)"""
    folder = instrumented()
    out = funcol.all_reduce(torch.ones(8), "sum", fake_pg)

    def timed_out(tensor):
        raise RuntimeError("Timed out waiting 3000ms for recv operation to complete")

    with pytest.raises(RuntimeError, match="Timed out"):
        capture._wrap_wait(timed_out)(out.elem)
    assert not capture._pending
    (span,) = _spans(folder)
    assert span["attributes"][n.COLL_END_SOURCE] == "wait"
    assert span["status"]["code"] in (2, "STATUS_CODE_ERROR") and "Timed out" in span["status"]["message"]


def test_a_traced_call_runs_no_collective_and_makes_no_record(fake_pg, instrumented):
    """Under fake tensors (a memory or runtime estimate) or make_fx, funcol runs no collective."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    folder = instrumented()
    with FakeTensorMode():
        funcol.all_reduce(torch.ones(1024), "sum", fake_pg)
    make_fx(lambda x: funcol.all_gather_single(x, 0, fake_pg) + 1)(torch.ones(16))
    funcol.all_reduce(torch.ones(4), "sum", fake_pg).wait()  # and a real one
    assert [(s["name"], s["attributes"][n.COLL_MESSAGE_SIZE]) for s in _spans(folder)] == [("all_reduce", 16)]


def test_on_a_gpu_backend_the_record_does_not_end_at_the_wait(fake_pg, instrumented):
    """On NCCL, wait_tensor only makes the stream wait: the record is filed for the completion hook (and
    ended by its report), or ends at enqueue where there is none. (The fake group stands in for an NCCL one:
    its completion kind is set as attach() sets an NCCL group's.)"""
    from otel_torchdist.capture import groups, nccl

    folder = instrumented()
    gi = groups.info(fake_pg)
    gi.completion = groups.COMPLETION_NCCL_HOOK
    try:
        out = funcol.all_reduce(torch.ones(8), "sum", fake_pg)
        assert not capture._pending and len(gi.pending) == 1
        out.wait()  # not its end
        (seq,) = gi.pending
        nccl._join(gi, seq, 70_000, time.perf_counter_ns(), None)
        gi.completion = groups.COMPLETION_ENQUEUE
        funcol.all_reduce(torch.ones(8), "sum", fake_pg).wait()
    finally:
        gi.completion = groups.COMPLETION_FUTURE
    ends = [(s["attributes"][n.COLL_END_SOURCE], s["attributes"][n.COLL_DURATION]) for s in _spans(folder)]
    assert [e for e, _ in ends] == ["nccl_completion_hook", "enqueue"] and ends[0][1] == pytest.approx(70e-6)


def test_dtensors_shard_to_shard_off_cpu_is_recorded(fake_pg, instrumented):
    """``Shard(i) -> Shard(j)`` on a GPU mesh calls ``torch.ops._dtensor.shard_dim_alltoall``, a C++ op that
    reaches no function of funcol's. (A mesh of the fake group stands in for a GPU one: its device type is
    set to cuda, which is all that picks the op's path; the op itself runs on the fake group.)"""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Shard, _collective_utils, placement_types

    folder = instrumented()
    mesh = DeviceMesh.from_group(fake_pg, "cpu")
    mesh._device_type = "cuda"
    for module in (placement_types, _collective_utils):  # placements hold it by name
        assert hasattr(module.shard_dim_alltoall, "__otel_torchdist_wrapped__")
    out = Shard(0)._to_new_shard_dim(torch.ones(8, 4), mesh, 0, [32, 4], 1)
    assert tuple(out.shape) == (32, 1)
    cpu = DeviceMesh.from_group(fake_pg, "cpu")  # on CPU torch all-gathers through funcol instead
    _collective_utils.shard_dim_alltoall(torch.ones(8, 4), 0, 1, cpu, 0)
    got = [(s["name"], s["attributes"][n.COLL_KIND], s["attributes"][n.COLL_MESSAGE_SIZE], s["attributes"][n.COLL_END_SOURCE])
           for s in _spans(folder)]  # fmt: skip
    assert got == [("shard_dim_alltoall", "all_to_all", 128, "return"), ("all_gather_single", "all_gather", 512, "wait")]


def test_deep_mode_on_a_gpu_backend_does_not_end_at_the_wait(fake_pg, instrumented):
    """The deep mode (compiled graphs' functional ops) files its NCCL records for the completion hook too.
    (The fake group stands in for an NCCL one, as above.)"""
    from otel_torchdist.capture import groups

    folder = instrumented()
    gi = groups.info(fake_pg)
    gi.completion = groups.COMPLETION_ENQUEUE
    try:
        with otel_torchdist.deep_capture():
            out = torch.ops._c10d_functional.all_reduce(torch.ones(8), "sum", fake_pg.group_name)
            torch.ops._c10d_functional.wait_tensor(out)
    finally:
        gi.completion = groups.COMPLETION_FUTURE
    assert not capture._pending
    assert [(s["attributes"][n.COLL_SOURCE], s["attributes"][n.COLL_END_SOURCE]) for s in _spans(folder)] == [("deep", "enqueue")]



def test_a_torch_with_only_resolve_group_name_resolves_the_group(fake_pg, monkeypatch):
    """torch before 2.12 resolves a functional collective's group by name only (no ``_resolve_group``): on
    an H200 with torch 2.11 no functional collective was recorded ("could not describe"). That torch's
    module, as the capture sees it (this torch's own calls need its ``_resolve_group``)."""
    from types import SimpleNamespace

    from otel_torchdist.capture import groups

    monkeypatch.setattr(capture, "_group_cache", {})
    older = SimpleNamespace(_resolve_group_name=funcol._resolve_group_name)
    assert capture._group_info(older, fake_pg, "") is groups.info(fake_pg)


def test_the_tracing_check_says_what_funcols_own_says():
    """The capture's check binds funcol's C lookups once and asks the pre-dispatch proxy only under
    pre-dispatch tracing: the same answer in eager, make_fx (plain, pre-dispatch, symbolic) and fake mode;
    a torch whose _are_we_tracing reads anything else gets its own function."""
    from types import SimpleNamespace

    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    check = capture._tracing_check(funcol)
    assert check is not funcol._are_we_tracing
    seen = []

    def f(x):
        seen.append((check(), funcol._are_we_tracing()))
        return x + 1

    f(torch.ones(2))
    for how in ({}, {"pre_dispatch": True}, {"tracing_mode": "symbolic"}):
        make_fx(f, **how)(torch.ones(2))
    with FakeTensorMode():
        f(torch.ones(2))
    assert seen == [(False, False)] + [(True, True)] * 4

    def other() -> bool:
        return torch.is_grad_enabled()

    assert capture._tracing_check(SimpleNamespace(_are_we_tracing=other)) is other


def test_a_compiled_model_without_submodules_is_named_in_the_deep_mode(fake_pg, instrumented):
    """aot_eager runs the compiled graph as a GraphModule of a generated subclass (GraphModuleImpl): skipped
    as a compiler's graph, whatever its class is called, so the collective names the model compiled."""

    class NoSubmodules(torch.nn.Module):
        def forward(self, x):
            return funcol.all_reduce(x * 2, "sum", fake_pg)

    folder = instrumented()
    torch._dynamo.reset()
    compiled = torch.compile(NoSubmodules(), backend="aot_eager")
    with otel_torchdist.step(1), otel_torchdist.deep_capture():
        compiled(torch.ones(4))
    spans = _spans(folder)
    assert spans and {s["attributes"][n.COLL_MODULE] for s in spans} == {"NoSubmodules"}


def test_the_first_functional_collective_is_not_timed_with_torchs_import_of_dynamo(tmp_path):
    """Torch's first functional collective imports torch._dynamo (seconds, on this machine 3-5 s): it was
    inside the first call's duration, one outlier that set a short run's bandwidth. A fresh interpreter, as
    a training process is."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        f"""
        import sys
        import torch, torch.distributed as dist
        import torch.distributed._functional_collectives as funcol
        from torch.testing._internal.distributed.fake_pg import FakeStore
        import otel_torchdist
        otel_torchdist.instrument(run_dir={str(tmp_path)!r}, run_id="first", metrics_exporter=("file",),
                                  traces_exporter="file", summary="none")
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
        print("dynamo before", "torch._dynamo" in sys.modules)
        funcol.all_reduce(torch.ones(4), "sum", dist.group.WORLD).wait()
        otel_torchdist.uninstrument()
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "dynamo before False" in done.stdout  # else the test measures nothing
    (span,) = [s for s in collective_spans(read_spans(str(tmp_path / "first" / "traces.rank0.jsonl")))]
    assert span["attributes"][n.COLL_DURATION] < 0.5, span["attributes"][n.COLL_DURATION]


def test_permute_tensor_is_a_sendrecv_of_its_whole_tensor_not_an_all_to_all(fake_pg, instrumented):
    """Every rank sends all of its tensor to one peer (context parallel's ring rotation): bus factor 1, as
    nccl-tests' sendrecv; all-to-all's (n-1)/n understated its busbw by n/(n-1)."""
    folder = instrumented()
    funcol.permute_tensor(torch.ones(9), [1, 2, 3, 0], fake_pg).wait()
    (span,) = _spans(folder)
    a = span["attributes"]
    assert a[n.COLL_KIND] == "permute" and a[n.COLL_MESSAGE_SIZE] == 36
    if a.get(n.COLL_BUSBW) is not None:
        assert a[n.COLL_BUSBW] == pytest.approx(a[n.COLL_ALGBW])
