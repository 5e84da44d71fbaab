"""The native part (otel_torchdist/native): built with ``otel-torchdist build-native``, it records DDP's
reducer on gloo without a comm hook (capture/ddp_native.py). test_training_paths.py runs its DDP jobs with
it and with the comm hook; here: its lifecycle, its failures, what it drops, and a hang inside the reducer."""

from __future__ import annotations

import os

from pathlib import Path

import pytest
import torch

from otel_torchdist import names as n
from otel_torchdist import native
from otel_torchdist.capture import record as R

from .harness import last_metrics, library_log, read_spans, run_ranks


def _train(model, steps: int) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        model(torch.randn(8, 16, generator=gen)).square().mean().backward()
        opt.step()
        opt.zero_grad()


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))


# ------------------------------------------------------------------------------------------ building
def test_check_and_build_errors_name_what_is_missing(tmp_path, monkeypatch, capsys):
    from otel_torchdist import cli

    monkeypatch.setenv("OTEL_TORCHDIST_NATIVE_DIR", str(tmp_path / "native"))
    assert cli.main(["build-native", "--check"]) == 1
    err = capsys.readouterr().err
    assert "not built for this torch" in err and str(tmp_path / "native") in err and "otel-torchdist build-native" in err
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    assert cli.main(["build-native"]) == 1
    err = capsys.readouterr().err
    assert "missing a C++ compiler" in err and "no-such-compiler" in err and "set CXX" in err


def test_builds_are_kept_apart_by_torch_python_and_source(tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_TORCHDIST_NATIVE_DIR", str(tmp_path))
    name = native.build_dir().name
    assert name.startswith(f"torch{torch.__version__}".replace("+", "_"))
    assert "cpython" in name or "pypy" in name
    # the sources' digest: a changed source or header never loads an older build
    import hashlib

    whole = hashlib.sha256(b"".join(s.read_bytes() for s in native.SOURCES + native.HEADERS)).hexdigest()[:12]
    assert name.endswith(whole)
    assert {s.name for s in native.SOURCES + native.HEADERS} == {"timed_group.cpp", "hot_path.cpp", "encode.cpp", "fold.cpp", "common.h"}
    assert {p.name for p in Path(native.__file__).parent.iterdir() if p.suffix in (".cpp", ".h")} == {
        s.name for s in native.SOURCES + native.HEADERS
    }  # every file the build reads


def test_the_setting_is_checked_by_name(monkeypatch):
    from otel_torchdist.config import Config, OptionError

    with pytest.raises(OptionError, match="native"):
        Config(native="sometimes").validate()


def test_without_a_build_ddp_takes_the_comm_hook_and_says_how_to_spare_it(tmp_path, monkeypatch, gloo_alone, instrumented):
    from torch.nn.parallel import DistributedDataParallel as DDP

    from otel_torchdist.capture import ddp as ddp_capture
    from otel_torchdist.capture import ddp_native

    monkeypatch.setenv("OTEL_TORCHDIST_NATIVE_DIR", str(tmp_path / "empty"))
    monkeypatch.setattr(native, "_loaded", None)  # an earlier test of this process may have loaded it
    with library_log() as lines:
        instrumented(run_id="no-build", log_level="INFO")
        model = DDP(_mlp())
    assert not ddp_native.active() and not ddp_native.is_attached(model)
    assert model in ddp_capture._state  # the trampoline comm hook
    assert [line for line in lines if "otel-torchdist build-native" in line]


def test_a_disabled_ddp_capture_leaves_ddp_alone(gloo_alone, instrumented):
    """``disabled_captures=("ddp",)``: no native group, no comm hook, no DDP span; the rest is recorded."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    import otel_torchdist
    from otel_torchdist.capture import ddp as ddp_capture
    from otel_torchdist.capture import ddp_native

    folder = instrumented(run_id="no-ddp", disabled_captures=("ddp",))
    model = DDP(_mlp())
    assert not ddp_native.is_attached(model) and model not in ddp_capture._state
    assert not model._get_ddp_logging_data().get("comm_hook")
    _train(model, 3)
    otel_torchdist.uninstrument()
    names = [s["name"] for s in read_spans(os.path.join(folder, "traces.rank0.jsonl"))]
    assert n.SPAN_DDP_INIT not in names and "all_reduce" not in names
    assert names.count(n.SPAN_OPTIMIZER_STEP) == 3 and n.SPAN_RANK_STEP in names


# ----------------------------------------------------------------------------------- in one process
def test_attached_while_instrumented_and_given_back_after(native_built, gloo_alone, instrumented):
    from torch.nn.parallel import DistributedDataParallel as DDP

    import otel_torchdist
    from otel_torchdist.capture import ddp_native

    folder = instrumented(run_id="native-life")
    model = DDP(_mlp())
    assert ddp_native.is_attached(model)
    _train(model, 3)
    otel_torchdist.uninstrument()
    mod = native.load()
    assert not ddp_native.active() and not ddp_native.is_attached(model)
    _train(model, 2)  # the reducer has its own group back: nothing passes through the native one
    assert mod.take() == [] and mod.in_flight() == []
    spans = read_spans(os.path.join(folder, "traces.rank0.jsonl"))
    steps = {s["traceId"]: s for s in spans if s["name"] == n.SPAN_RANK_STEP}
    buckets = [s for s in spans if s["attributes"].get(n.COLL_SOURCE) == "ddp_reducer" and s["name"] == "all_reduce"]
    assert len(buckets) == 3  # one bucket a step on this small model
    for s in buckets:
        step = steps[s["traceId"]]  # under the step it was issued in
        assert s["parentSpanId"] == step["spanId"]
        assert int(step["startTimeUnixNano"]) <= int(s["startTimeUnixNano"]) <= int(s["endTimeUnixNano"]) <= int(step["endTimeUnixNano"])
        assert s["attributes"][n.DDP_BUCKET_INDEX] == 0 and s["attributes"][n.DDP_BUCKET_LAST] is True
    # instrumented again: the model is found and attached again
    instrumented(run_id="native-again")
    assert ddp_native.is_attached(model)


def test_a_failing_call_raises_unchanged_and_is_recorded_failed(native_built, gloo_alone, instrumented):
    import torch.distributed as dist

    from otel_torchdist.capture import ddp_native, groups

    instrumented(run_id="native-fail")
    mod = native.load()
    timed = mod.TimedGroup(dist.group.WORLD, groups.info(dist.group.WORLD).gid)
    bad = [torch.ones(4), torch.ones(5)]  # gloo takes one tensor per call on CPU
    with pytest.raises(Exception) as real:
        dist.group.WORLD.allreduce(bad).wait()
    with pytest.raises(type(real.value)) as ours:
        timed.allreduce(bad).wait()
    assert str(ours.value) == str(real.value)
    (rec,) = [r for r in ddp_native.take(None, 0, force=True) if r[R.ERROR] is not None]
    assert rec[R.NBYTES] == 4 * 9 and rec[R.NTENSORS] == 2 and rec[R.OP] == "all_reduce" and rec[R.T_END] >= rec[R.T_START]


def test_entries_beyond_the_capacity_are_dropped_and_counted(native_built, gloo_alone, instrumented):
    from torch.nn.parallel import DistributedDataParallel as DDP

    from otel_torchdist import runtime
    from otel_torchdist.capture import record

    instrumented(run_id="native-drop", drain_interval=3600.0)
    model = DDP(_mlp())
    _train(model, 2)  # past the bucket rebuild (two broadcasts of the reducer's own)
    runtime.current().flush(30)
    mod = native.load()
    mod.set_capacity(2)
    before = record.dropped_records()
    try:
        _train(model, 5)  # a bucket a step: 5 entries, 2 kept
    finally:
        mod.set_capacity(65536)
    runtime.current().flush(30)
    assert record.dropped_records() - before == 3


def test_records_are_tuples_whose_span_attributes_are_cached_per_site(native_built, gloo_alone, instrumented):
    """A traced step's bucket spans share one encoded attribute block per call site, as other records do:
    that cache keys on slices of the record, which a list (unhashable) would silently defeat."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from otel_torchdist import runtime

    from otel_torchdist.drain import spans
    from otel_torchdist.capture import ddp_native, groups

    instrumented(run_id="native-sites", drain_interval=3600.0)
    model = DDP(_mlp())
    _train(model, 4)
    recs = ddp_native.take(runtime.current().pipeline.step_tracker, 0, force=True)
    buckets = [r for r in recs if r[R.CTX] is not None and r[R.CTX][0] == "ddp"]
    assert len(buckets) >= 3
    for rec in recs:
        assert type(rec) is tuple
        gi = groups.BY_ID[rec[R.GROUP]]
        assert spans.site_block(rec, gi) is spans.site_block(rec, gi)


# ---------------------------------------------------------------------------------- a hang in C++
@pytest.fixture(scope="module")
def hang_job(tmp_path_factory, native_built):
    out = str(tmp_path_factory.mktemp("ddphang"))
    results = run_ranks("scenarios_steps:ddp_hang", 2, out, {"threshold": 1.5, "timeout": 6})
    folder = os.path.join(out, "runs", "ddp-hang-ws2")
    return {"results": results, "folder": folder}


def test_a_bucket_stuck_in_the_reducer_is_reported_while_it_waits(hang_job):
    result = hang_job["results"][1]
    assert hang_job["results"][0]["attached"] and result["attached"]
    assert result["raised_after"] > 5  # stuck in the reducer's all-reduce until gloo's timeout
    assert "collective.hang" in result["traces_while_stuck"]  # reported before the call gave up
    spans = read_spans(os.path.join(hang_job["folder"], "traces.rank1.jsonl"))
    (hang,) = [s for s in spans if s["name"] == n.SPAN_HANG]
    a = hang["attributes"]
    assert a[n.COLL_OP] == "all_reduce" and a[n.COLL_GROUP_DESC] == "default_pg"
    assert 1.5 <= a[n.HANG_WAITED] < 3.0
    # the all-reduce that failed at gloo's timeout is that one (same sequence number), its error recorded
    (failed,) = [s for s in spans if s["name"] == "all_reduce" and s.get("status", {}).get("code") == 2]
    assert failed["attributes"][n.COLL_SEQ] == a[n.COLL_SEQ]
    assert failed["attributes"][n.COLL_SOURCE] == "ddp_reducer" and failed["attributes"][n.COLL_PHASE] == "backward"
    assert failed["attributes"][n.COLL_MESSAGE_SIZE] == 4 * sum(p.numel() for p in _mlp().parameters())  # its bucket
    assert failed["attributes"]["error.type"] == "RuntimeError" and "Timed out" in failed["status"]["message"]
    assert failed["attributes"][n.COLL_DURATION] > 5
    # what training saw is what it sees uninstrumented (that run's timeout was 2 s)
    assert result["error"] == result["uninstrumented_error"].replace("2000ms", "6000ms") and "Timed out" in result["error"]
    metrics = last_metrics(os.path.join(hang_job["folder"], "metrics.rank1.jsonl"))
    hangs = [p for p in metrics[n.COLLECTIVE_HANGS.name] if p["attributes"]["op"] == "all_reduce"]
    assert sum(int(p["asInt"]) for p in hangs) == 1


def test_two_models_on_one_group_numbered_apart_and_step_zero_kept(native_built, gloo_alone, instrumented):
    """An encoder and a head wrapped apart, one loss, explicitly marked steps from 0: each model's pass is
    numbered on its own (one bucket each: index 0, last), and step 0's buckets are in step 0's trace."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    import otel_torchdist
    from otel_torchdist.capture import ddp_native

    folder = instrumented(run_id="native-two")
    torch.manual_seed(0)
    encoder, head = DDP(torch.nn.Linear(16, 32)), DDP(torch.nn.Linear(32, 4))
    assert ddp_native.is_attached(encoder) and ddp_native.is_attached(head)
    opt = torch.optim.SGD(list(encoder.parameters()) + list(head.parameters()), lr=0.1)
    for i in range(3):
        with otel_torchdist.step(i):
            head(encoder(torch.ones(8, 16))).square().mean().backward()
            opt.step()
    otel_torchdist.uninstrument()
    spans = read_spans(os.path.join(folder, "traces.rank0.jsonl"))
    steps = {s["traceId"]: s["attributes"][n.STEP] for s in spans if s["name"] == n.SPAN_RANK_STEP}
    buckets = [s for s in spans if s["attributes"].get(n.COLL_SOURCE) == "ddp_reducer" and s["name"] == "all_reduce"]
    by_step = {}
    for s in buckets:
        by_step.setdefault(steps[s["traceId"]], []).append(s)
    assert sorted(by_step) == [0, 1, 2]
    for step, found in by_step.items():
        assert sorted(s["attributes"][n.DDP_BUCKET_BYTES] for s in found) == [4 * (32 * 4 + 4), 4 * (16 * 32 + 32)], step
        assert all(s["attributes"][n.DDP_BUCKET_INDEX] == 0 and s["attributes"][n.DDP_BUCKET_LAST] for s in found), step


def test_sparse_gradients_keep_the_comm_hook(native_built, gloo_alone, instrumented):
    from torch.nn.parallel import DistributedDataParallel as DDP

    from otel_torchdist.capture import ddp as ddp_capture
    from otel_torchdist.capture import ddp_native

    instrumented(run_id="native-sparse")
    model = DDP(torch.nn.Sequential(torch.nn.Embedding(10, 4, sparse=True), torch.nn.Linear(4, 2)))
    assert not ddp_native.is_attached(model) and model in ddp_capture._state
    model(torch.tensor([[1, 2], [3, 4]])).sum().backward()  # trains


def test_a_drain_interval_of_many_fast_steps_keeps_every_bucket_in_its_step(native_built, gloo_alone, instrumented):
    """The native capture's entries name their step by serial, found again on the drain among the last steps
    begun: 600 steps between two drains (steps of 0.3 ms at the default 200 ms) keep their buckets in their
    steps, untraced steps' buckets make no span (they were exported as collectives outside any step, a span
    each, past 256 steps)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    import otel_torchdist
    from otel_torchdist.capture import ddp_native

    folder = instrumented(run_id="native-fast", trace_every_steps=100, drain_interval=3600.0)
    model = DDP(_mlp())
    assert ddp_native.is_attached(model)
    _train(model, 600)
    otel_torchdist.uninstrument()
    spans = read_spans(os.path.join(folder, "traces.rank0.jsonl"))
    traced = {s["traceId"]: s["attributes"][n.STEP] for s in spans if s["name"] == n.SPAN_RANK_STEP}
    buckets = [s for s in spans if s["attributes"].get(n.COLL_SOURCE) == "ddp_reducer" and s["name"] == "all_reduce"]
    assert len(traced) == 10 + 6  # the first 10 and every 100th
    assert buckets and all(s["traceId"] in traced for s in buckets)
    assert sorted({traced[s["traceId"]] for s in buckets}) == sorted(traced.values())


# ------------------------------------------------------------- NCCL's completion hook, without a GPU
# On NCCL the native group's entries end with the completion hook's report (a ProcessGroupNCCL watchdog
# thread's call, which cannot exist without a GPU: tests/test_gpu.py runs the real one). Here a gloo group
# stands in for the NCCL one and the test makes the hook's calls itself, through nccl._on_complete.
def _report(gi, seq: int, gpu_ns: int = 7_000):
    from datetime import timedelta
    from time import perf_counter_ns
    from types import SimpleNamespace

    from otel_torchdist.capture import nccl

    # this torch's WorkInfo times: steady_clock time points, a timedelta since CLOCK_MONOTONIC's epoch
    info = SimpleNamespace(op_type=SimpleNamespace(name="ALLREDUCE"), seq=seq, active_duration=timedelta(microseconds=gpu_ns / 1000),
                           time_finished=timedelta(microseconds=perf_counter_ns() // 1000))  # fmt: skip
    nccl._on_complete(gi, info)


def _hooked_ddp(module, monkeypatch, warm: int, **ddp_options):
    """A DDP whose native group waits for the completion hook's reports, as on an NCCL group, trained ``warm``
    steps with each report made and the records taken: (model, group info, native module)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torch.distributed as dist
    from otel_torchdist.capture import ddp_native, groups

    gi, mod = groups.info(dist.group.WORLD), native.load()
    monkeypatch.setattr(gi, "completion", groups.COMPLETION_NCCL_HOOK)  # as meeting an NCCL group sets it
    model = DDP(module, **ddp_options)
    monkeypatch.setattr(gi, "completion", groups.COMPLETION_FUTURE)  # the test's own collectives: gloo's
    assert ddp_native.is_attached(model) and not model._get_ddp_logging_data().get("comm_hook")
    _train(model, warm)
    for e in mod.in_flight():
        _report(gi, e[ddp_native.E_SEQ])
    ddp_native.take(None, 0, force=True)
    return model, gi, mod


def test_a_hooked_entry_waits_for_its_report_which_may_come_first(native_built, gloo_alone, instrumented):
    import torch.distributed as dist

    from otel_torchdist.capture import ddp_native, groups

    instrumented(run_id="native-hooked", drain_interval=3600.0)
    mod, gi = native.load(), groups.info(dist.group.WORLD)
    timed = mod.TimedGroup(dist.group.WORLD, gi.gid, 0, True)
    t = torch.ones(4)
    timed.allreduce([t]).wait()
    (flying,) = mod.in_flight()
    seq = flying[ddp_native.E_SEQ]
    assert seq == dist.group.WORLD._get_sequence_number_for_group() and mod.waiting() == 1 and mod.take() == []
    _report(gi, seq, gpu_ns=7_000)
    assert mod.waiting() == 0 and mod.in_flight() == []
    (rec,) = ddp_native.take(None, 0, force=True)
    assert rec[R.END] == n.END_NCCL_HOOK and rec[R.GPU_NS] == 7_000 and rec[R.SEQ] == seq and rec[R.NBYTES] == 16
    assert rec[R.T_END] >= rec[R.T_START]
    # the hook thread saw the next one done before the issuing thread read its number: kept, then taken
    _report(gi, seq + 1, gpu_ns=9_000)
    assert gi.early.pop(seq + 1)[0][0] == 9_000  # filed for a Python record as well
    timed.allreduce([t]).wait()
    assert mod.in_flight() == []
    (rec,) = ddp_native.take(None, 0, force=True)
    assert rec[R.SEQ] == seq + 1 and rec[R.GPU_NS] == 9_000 and rec[R.END] == n.END_NCCL_HOOK
    # a report for no entry of the native group leaves a Python record's path as it was
    dist.all_reduce(t)
    assert mod.take() == [] and mod.waiting() == 0


def test_a_hooked_backward_is_held_until_its_last_bucket_is_reported(native_built, gloo_alone, instrumented, monkeypatch):
    """DDP's buckets on NCCL are reported by the hook thread up to a watchdog poll after the step has moved on:
    a backward whose last bucket is not reported yet is held, so indices and the last flag stay right."""
    import otel_torchdist
    from otel_torchdist import runtime
    from otel_torchdist.capture import ddp_native

    from .scenarios_training import _mlp as _three_layers

    folder = instrumented(run_id="native-hooked-ddp", drain_interval=3600.0)
    # two buckets once rebuilt (the second step): past the rebuild
    model, gi, mod = _hooked_ddp(_three_layers(), monkeypatch, 2, bucket_cap_mb=0.01)
    pipeline = runtime.current().pipeline
    _train(model, 1)
    flying = sorted(mod.in_flight(), key=lambda e: e[ddp_native.E_SEQ])
    buckets = [e for e in flying if ddp_native._is_bucket(e)]
    assert len(buckets) == 2 and mod.waiting() == len(flying)
    _report(gi, buckets[0][ddp_native.E_SEQ], gpu_ns=1_000)
    _train(model, 1)  # the step moved on; its buckets are in flight
    from time import perf_counter_ns

    assert [r for r in ddp_native.take(pipeline.step_tracker, perf_counter_ns()) if r[R.CTX][0] == "ddp"] == []
    _report(gi, buckets[1][ddp_native.E_SEQ], gpu_ns=3_000)
    got = [r for r in ddp_native.take(pipeline.step_tracker, perf_counter_ns()) if r[R.CTX] is not None and r[R.CTX][0] == "ddp"]
    assert [r[R.SEQ] for r in got] == [e[ddp_native.E_SEQ] for e in buckets]
    assert all(r[R.END] == n.END_NCCL_HOOK for r in got) and [r[R.GPU_NS] for r in got] == [1_000, 3_000]
    for e in mod.in_flight():  # the last step's, reported after its end: the exit flush waits for them
        _report(gi, e[ddp_native.E_SEQ])
    otel_torchdist.uninstrument()
    spans = read_spans(os.path.join(folder, "traces.rank0.jsonl"))
    steps = {s["traceId"]: s["attributes"][n.STEP] for s in spans if s["name"] == n.SPAN_RANK_STEP}
    by_step: dict = {}
    for s in spans:
        if s["attributes"].get(n.COLL_SOURCE) == "ddp_reducer" and s["name"] == "all_reduce" and s["traceId"] in steps:
            by_step.setdefault(steps[s["traceId"]], []).append(s["attributes"])
    last = by_step[max(by_step)]  # the last step's, taken by the drain at uninstrument()
    assert [a[n.DDP_BUCKET_INDEX] for a in last] == [0, 1] and [a[n.DDP_BUCKET_LAST] for a in last] == [False, True]
    assert all(a[n.COLL_END_SOURCE] == n.END_NCCL_HOOK for a in last)


def test_an_untraced_steps_buckets_are_made_natively_as_python_makes_them(native_built, gloo_alone, instrumented, monkeypatch):
    """take_split() makes untraced steps' bucket records in C++: field for field what ddp_native._record makes
    of the same entry, with the model's backward context (no bucket numbering: no span will show it)."""
    from otel_torchdist.capture import ddp_native

    instrumented(run_id="native-split", drain_interval=3600.0, trace_first_steps=0, trace_every_steps=1000)
    model, gi, mod = _hooked_ddp(_mlp(), monkeypatch, 3)  # hooked: its entries wait for a report, readable first
    _train(model, 2)  # untraced steps (the sampler traces none of the first 1000)
    flying = sorted(mod.in_flight(), key=lambda e: e[ddp_native.E_SEQ])
    assert len(flying) == 2 and all(ddp_native._is_bucket(e) for e in flying)
    for i, e in enumerate(flying):
        _report(gi, e[ddp_native.E_SEQ], gpu_ns=5_000 + i)
    fast, rest = mod.take_split()
    assert rest == [] and len(fast) == 2
    for got, e in zip(sorted(fast, key=lambda r: r[R.SEQ]), flying):
        assert type(got) is tuple and got[R.STEPCTX] is not None and got[R.STEPCTX][3] is False
        done = list(e)
        done[ddp_native.E_T1], done[ddp_native.E_GPU_NS], done[ddp_native.E_HOOKED] = got[R.T_END], got[R.GPU_NS], True
        want = ddp_native._record(tuple(done), None, n.END_FUTURE)
        want[R.CTX] = ddp_native._models[e[ddp_native.E_OWNER]][1]
        assert got == tuple(want)
        assert got[R.END] == n.END_NCCL_HOOK and got[R.GPU_NS] >= 5_000 and got[R.CTX][0] == "ddp"


def test_the_native_group_keeps_each_devices_backend(native_built):
    """A group of two backends ("cpu:gloo,cuda:nccl", what init_process_group() makes on a GPU machine):
    what the native group does not record reaches the backend of the tensors' device. Registered under the
    group's one default type, both devices got the same backend. (A fake backend stands in for NCCL.)"""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeProcessGroup

    store, kinds = dist.HashStore(), dist.ProcessGroup.BackendType
    pg = dist.ProcessGroup(store, 0, 1)
    pg._register_backend(torch.device("cpu"), kinds.GLOO, dist.ProcessGroupGloo(store, 0, 1))
    pg._register_backend(torch.device("cuda"), kinds.CUSTOM, FakeProcessGroup._create_internal(0, 1))
    pg._set_default_backend(kinds.CUSTOM)
    timed = native.load().TimedGroup(pg, 0, 0, False)
    assert [timed._get_backend(torch.device(d)).name() for d in ("cpu", "cuda")] == ["gloo", "fake"]
