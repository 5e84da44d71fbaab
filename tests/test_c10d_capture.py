"""Real 2- and 4-rank gloo jobs calling every c10d entry point: one true record per call per rank.

One job per world size (``scenarios.all_ops``) runs every check's calls; the tests below read what each
rank exported to its run folder and compare it with expectations written out in the scenario from
nccl-tests' definitions, and with two independent oracles that watched the same calls: CommDebugMode
(dispatcher level) and torch.profiler (gloo's own events).
"""

from __future__ import annotations

import os
from collections import Counter

import pytest

import torch
import torch.distributed as dist

import otel_torchdist
from otel_torchdist import names as n

from .harness import collective_spans, last_metrics, read_spans, run_ranks

WORLD_SIZES = (2, 4)


@pytest.fixture(scope="module", params=WORLD_SIZES, ids=lambda ws: f"ws{ws}")
def job(request, tmp_path_factory):
    ws = request.param
    out = str(tmp_path_factory.mktemp(f"ops{ws}"))
    results = run_ranks("all_ops", ws, out)
    folder = os.path.join(out, "runs", f"ops-ws{ws}")
    spans = [
        [s for s in read_spans(os.path.join(folder, f"traces.rank{r}.jsonl")) if n.COLL_OP in s["attributes"]]
        for r in range(ws)
    ]  # collectives only: the step spans around them are tested in test_steps.py
    return {"ws": ws, "results": results, "spans": spans, "folder": folder}


def _main_spans(spans):
    """The spans of the per-entry-point section (not the oracle block), in call order."""
    return sorted(
        (s for s in spans if s["attributes"][n.COLL_GROUP_DESC] != "oracle"), key=lambda s: int(s["startTimeUnixNano"])
    )


def _pairs(job):
    for rank in range(job["ws"]):
        expected = job["results"][rank]["expected"]
        got = _main_spans(job["spans"][rank])
        yield rank, expected, got


def test_one_record_per_call_per_rank(job):
    for rank, expected, got in _pairs(job):
        assert [s["name"] for s in got] == [e["op"] for e in expected], f"rank {rank}"


def test_message_size_follows_nccl_tests(job):
    for rank, expected, got in _pairs(job):
        for e, s in zip(expected, got):
            a = s["attributes"]
            assert a[n.COLL_MESSAGE_SIZE] == e["S"], f"rank {rank} {e['op']}: S"
            if "bytes_sent" in e:
                assert a[n.COLL_BYTES_SENT] == e["bytes_sent"]
                assert a[n.COLL_BYTES_RECEIVED] == e["bytes_received"]
            if "coalesced_ops" in e:
                assert a[n.COLL_COALESCED_OPS] == e["coalesced_ops"]
            assert a[n.COLL_SOURCE] == e.get("source", "c10d"), f"rank {rank} {e['op']}: source"


def test_group_rank_root_and_peer(job):
    ws = job["ws"]
    for rank, expected, got in _pairs(job):
        for e, s in zip(expected, got):
            a = s["attributes"]
            label = f"rank {rank} {e['op']}"
            assert a[n.COLL_GROUP_DESC] == e["group"], label
            assert a[n.COLL_GROUP_SIZE] == e.get("group_size", ws), label
            if "group_rank" in e:
                assert a[n.COLL_GROUP_RANK] == e["group_rank"], label
            elif e["group"] == "default_pg":
                assert a[n.COLL_GROUP_RANK] == rank, label
                assert a[n.COLL_GROUP_RANKS] == list(range(ws)), label
            assert a.get(n.COLL_ROOT) == e["root"], label
            assert a.get(n.COLL_PEER) == e["peer"], label
            assert a[n.COLL_ASYNC] is e["async_"], label
            assert s["resource"][n.RANK] == rank


def test_async_collective_is_timed_to_completion_not_to_wait(job):
    for rank, expected, got in _pairs(job):
        for e, s in zip(expected, got):
            a = s["attributes"]
            seconds = (int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"])) / 1e9
            assert a[n.COLL_DURATION] == pytest.approx(seconds, abs=1e-6)
            if e["end"] is not None:
                assert a[n.COLL_END_SOURCE] == e["end"], f"rank {rank} {e['op']}"
            if "max_seconds" in e:
                # The wait() came 0.4 s after the call; the collective itself takes milliseconds.
                assert seconds < e["max_seconds"], f"rank {rank}: async {e['op']} was charged the wait ({seconds:.3f}s)"


def test_exception_reraised_unchanged_with_error_span(job):
    for rank, expected, got in _pairs(job):
        result = job["results"][rank]
        assert result["instrumented_error"] == result["plain_error"]
        errors = [s for s in got if s.get("status", {}).get("code") == 2]
        assert [e["error"] for e in expected] == [s.get("status", {}).get("code") == 2 for s in got]
        assert len(errors) == 2  # the plain call (seen at the ProcessGroup level) and the instrumented one
        for span in errors:
            assert span["attributes"][n.ERROR_TYPE] == "RuntimeError"
            assert result["plain_error"][1] in span["status"]["message"]
            (event,) = span["events"]
            assert event["name"] == "exception"
            assert {a["key"] for a in event["attributes"]} == {n.EXCEPTION_TYPE, n.EXCEPTION_MESSAGE}


def test_bandwidth_uses_nccl_tests_bus_factors(job):
    ws = job["ws"]
    factor = {
        "all_reduce": 2 * (ws - 1) / ws,
        "all_gather": (ws - 1) / ws,
        "reduce_scatter": (ws - 1) / ws,
        "all_to_all": (ws - 1) / ws,
        "broadcast": 1.0,
        "reduce": 1.0,
        "send_recv": 1.0,
    }
    checked = 0
    for rank, expected, got in _pairs(job):
        for s in got:
            a = s["attributes"]
            if a[n.COLL_KIND] not in factor or a[n.COLL_GROUP_SIZE] != ws or a[n.COLL_DURATION] <= 0:
                continue
            if n.ERROR_TYPE in a or a[n.COLL_END_SOURCE] in (n.END_UNFINISHED, n.END_ENQUEUE):
                assert n.COLL_ALGBW not in a and n.COLL_BUSBW not in a  # no transfer time seen
                continue
            algbw = a[n.COLL_MESSAGE_SIZE] / a[n.COLL_DURATION] / 1e9
            assert a[n.COLL_ALGBW] == pytest.approx(algbw, rel=1e-9)
            assert a[n.COLL_BUSBW] == pytest.approx(algbw * factor[a[n.COLL_KIND]], rel=1e-9)
            checked += 1
    assert checked > 20


# Which dispatcher op CommDebugMode counts, and which gloo event torch.profiler records, for each call.
COMM_DEBUG_OP = {
    "all_reduce": "c10d.allreduce_",
    "broadcast": "c10d.broadcast_",
    "all_gather_into_tensor": "c10d._allgather_base_",
    "reduce_scatter_tensor": "c10d._reduce_scatter_base_",
    "all_to_all_single": "c10d.alltoall_base_",
    "all_gather": "c10d.allgather_",
    "reduce": "c10d.reduce_",
    "gather": "c10d.gather_",
    "scatter": "c10d.scatter_",
}
GLOO_EVENT = {
    "all_reduce": "gloo:all_reduce",
    "reduce_scatter_tensor": "gloo:all_reduce",  # gloo implements it as an all-reduce
    "broadcast": "gloo:broadcast",
    "all_gather_into_tensor": "gloo:all_gather",
    "all_gather": "gloo:all_gather",
    "all_to_all_single": "gloo:all_to_all",
    "reduce": "gloo:reduce",
    "gather": "gloo:gather",
    "scatter": "gloo:scatter",
}


def test_counts_agree_with_comm_debug_mode_and_profiler(job):
    for rank in range(job["ws"]):
        ours = Counter(s["name"] for s in job["spans"][rank] if s["attributes"][n.COLL_GROUP_DESC] == "oracle")
        result = job["results"][rank]
        assert sum(ours.values()) == 3 * len(result["oracle_mix"])
        via_debug_mode = Counter()
        via_profiler = Counter()
        for op, count in ours.items():
            via_debug_mode[COMM_DEBUG_OP[op]] += count
            via_profiler[GLOO_EVENT[op]] += count
        assert dict(via_debug_mode) == result["comm_debug_counts"], f"rank {rank}"
        assert dict(via_profiler) == result["profiler_counts"], f"rank {rank}"


def test_resource_identifies_rank_and_shared_run(job):
    ws = job["ws"]
    instance_ids = set()
    for rank in range(ws):
        resources = {tuple(sorted(s["resource"].items())) for s in job["spans"][rank]}
        assert len(resources) == 1
        res = job["spans"][rank][0]["resource"]
        assert res[n.RANK] == rank
        assert res[n.WORLD_SIZE] == ws
        assert res[n.RUN_ID] == f"ops-ws{ws}"
        assert res[n.BACKEND] == "gloo"
        assert res[n.TORCH_VERSION].startswith("2.")
        assert res[n.SERVICE_NAME]
        assert res[n.HOST_NAME]
        instance_ids.add(res[n.SERVICE_INSTANCE_ID])
    assert len(instance_ids) == ws


def test_metrics_agree_with_spans(job):
    from .harness import last_metrics

    for rank in range(job["ws"]):
        metrics = last_metrics(os.path.join(job["folder"], f"metrics.rank{rank}.jsonl"))
        spans = job["spans"][rank]
        by_key = Counter((s["name"], _label(s)) for s in spans)
        bytes_by_key = Counter()
        for s in spans:
            bytes_by_key[(s["name"], _label(s))] += 0  # every key: the counters have one for each
            a = s["attributes"]
            if n.ERROR_TYPE not in a and a[n.COLL_END_SOURCE] != n.END_UNFINISHED:  # bytes count what moved
                bytes_by_key[(s["name"], _label(s))] += a[n.COLL_MESSAGE_SIZE]
        calls = {(p["attributes"]["op"], p["attributes"]["group"]): int(p["asInt"]) for p in metrics[n.COLLECTIVE_CALLS.name]}
        nbytes = {(p["attributes"]["op"], p["attributes"]["group"]): int(p["asInt"]) for p in metrics[n.COLLECTIVE_BYTES.name]}
        assert calls == dict(by_key)
        assert nbytes == dict(bytes_by_key)
        errors = {k: int(p["asInt"]) for p in metrics[n.COLLECTIVE_ERRORS.name] for k in [(p["attributes"]["op"], p["attributes"]["group"])] if int(p["asInt"])}
        assert errors == {("broadcast", "default_pg"): 2}
        # The duration histogram holds the calls that completed: a failed call's time (the two broadcasts') is
        # no transfer's, and took a row's bandwidth down with it.
        timed, timed_s = Counter(), Counter()
        for s in spans:
            a = s["attributes"]
            if n.ERROR_TYPE not in a and a[n.COLL_END_SOURCE] != n.END_UNFINISHED:
                timed[(s["name"], _label(s))] += 1
                timed_s[(s["name"], _label(s))] += a[n.COLL_DURATION]
        hist = {(p["attributes"]["op"], p["attributes"]["group"]): p for p in metrics[n.COLLECTIVE_DURATION.name]}
        assert set(hist) == set(by_key)
        for key, count in timed.items():
            assert int(hist[key]["count"]) == count
            assert sum(int(c) for c in hist[key]["bucketCounts"]) == count
            assert float(hist[key]["sum"]) == pytest.approx(timed_s[key], rel=1e-6, abs=1e-9)
        assert int(hist[("broadcast", "default_pg")]["count"]) == by_key[("broadcast", "default_pg")] - 2
        for p in metrics[n.COLLECTIVE_CALLS.name]:
            assert p["attributes"]["rank"] == str(rank)
            assert p["attributes"]["run"] == f"ops-ws{job['ws']}"


def _label(span):
    """The span names its metrics' ``group`` label itself, so a span joins its series without guessing."""
    return span["attributes"][n.COLL_GROUP_LABEL]

def test_the_reduce_op_is_named_as_torch_names_it():
    """A ReduceOp member, a functional collective's string, and a ReduceOp object made with a factor
    (``PREMUL_SUM``, which FSDP2's reduce-scatter uses with a gradient divide factor, has no ``name``)."""
    import torch.distributed as dist

    from otel_torchdist.drain.spans import redop_name

    assert [redop_name(op) for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG, "sum", dist.ReduceOp.PREMUL_SUM(0.5))] == [
        "sum", "avg", "sum", "premul_sum",
    ]  # fmt: skip


# ------------------------------------------------------------ call forms, on a 4-rank fake group (rank 0)
def _fake_spans(folder: str) -> list[dict]:
    spans = [s for s in read_spans(os.path.join(folder, "traces.rank0.jsonl")) if n.COLL_OP in s["attributes"]]
    return sorted(spans, key=lambda s: int(s["startTimeUnixNano"]))


def test_a_process_groups_own_overloads_keep_their_root(fake_pg, instrumented):
    """``ProcessGroup.broadcast(tensor, root, timeout)`` / ``(tensors, opts)`` and ``scatter(output, inputs,
    root)`` / ``(outputs, inputs, opts)``, positional or by keyword; options left out: their root, 0."""
    from datetime import timedelta

    import torch
    import torch.distributed.distributed_c10d as c10d

    import otel_torchdist

    folder = instrumented(run_id="pg-roots")
    pg, t = fake_pg, torch.ones(8)
    opts = c10d.BroadcastOptions()
    opts.rootRank = 3
    scatter_opts = c10d.ScatterOptions()
    scatter_opts.rootRank = 1
    for call in (
        lambda: pg.broadcast(t, 2),
        lambda: pg.broadcast(t, 2, timedelta(seconds=30)),
        lambda: pg.broadcast(t, root=2),
        lambda: pg.broadcast([t], opts),
        lambda: pg.broadcast([t], opts=opts),
        lambda: pg.broadcast([t]),
        lambda: pg.scatter(torch.empty(8), [], 2),  # rank 0 is not the root: no inputs
        lambda: pg.scatter([torch.empty(8)], [], scatter_opts),
    ):
        call().wait()
    otel_torchdist.uninstrument()
    got = [(s["name"], s["attributes"].get(n.COLL_ROOT)) for s in _fake_spans(folder)]
    assert got == [("broadcast", 2)] * 3 + [("broadcast", 3)] * 2 + [("broadcast", 0), ("scatter", 2), ("scatter", 1)]


def test_torchs_default_root_is_recorded(fake_pg, instrumented):
    """gather, scatter and the object collectives without ``dst``/``src`` (or their group forms) use global rank 0."""
    import torch
    import torch.distributed as dist

    import otel_torchdist

    folder = instrumented(run_id="default-roots")
    dist.gather(torch.ones(8), [torch.empty(8) for _ in range(4)])
    dist.scatter(torch.empty(8), [torch.ones(8) for _ in range(4)])
    dist.gather(torch.ones(8), [torch.empty(8) for _ in range(4)], dst=0)
    otel_torchdist.uninstrument()
    assert [(s["name"], s["attributes"].get(n.COLL_ROOT)) for s in _fake_spans(folder)] == [
        ("gather", 0), ("scatter", 0), ("gather", 0),
    ]  # fmt: skip


def test_an_async_coalesced_call_completes_with_the_future_it_returns(fake_pg, instrumented):
    """``all_reduce_coalesced`` / ``all_gather_coalesced`` with ``async_op=True`` return a Future, not a Work:
    the record completes with it (it was left waiting for a Work.wait() that never came: a false hang report,
    then ``unfinished`` at the end)."""
    import torch
    import torch.distributed as dist

    import otel_torchdist
    from otel_torchdist.capture import completion

    folder = instrumented(run_id="async-coalesced")
    fut = dist.all_reduce_coalesced([torch.ones(8), torch.ones(4)], async_op=True)
    fut.wait()
    fut = dist.all_gather_coalesced([[torch.empty(8)] for _ in range(4)], [torch.ones(8)], async_op=True)
    fut.wait()
    assert not completion.in_flight()
    otel_torchdist.uninstrument()
    got = [(s["name"], s["attributes"][n.COLL_END_SOURCE], s["attributes"][n.COLL_MESSAGE_SIZE]) for s in _fake_spans(folder)]
    assert got == [("all_reduce_coalesced", "future", 48), ("all_gather_coalesced", "future", 128)]


def test_a_group_destroyed_unseen_gives_its_name_back(instrumented):
    """``destroy_process_group`` imported by name before ``instrument()`` is torch's own: the library does not
    see the destroy. Destroying the default group restarts torch's group names, so the next group takes the
    old one's name: the old one is forgotten then, and the new one keeps the label dashboards select on."""
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import otel_torchdist

    folder = instrumented(run_id="destroyed-unseen")
    unseen = dist.destroy_process_group.__wrapped__  # what a name imported before instrument() holds
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    dist.all_reduce(torch.ones(4))
    unseen()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    try:
        dist.all_reduce(torch.ones(4))
    finally:
        dist.destroy_process_group()
    otel_torchdist.uninstrument()
    assert [s["attributes"][n.COLL_GROUP_LABEL] for s in _fake_spans(folder)] == ["default_pg", "default_pg"]


def test_a_record_of_several_works_stays_in_flight_until_the_last():
    """Until its last work completes, the hang watchdog must still see it."""
    import torch

    from otel_torchdist.capture import completion
    from otel_torchdist.capture import record as R

    rec = R.new("batch_isend_irecv", "send_recv", "test", 0)
    rec[R.T_START] = 1
    first, second = torch.futures.Future(), torch.futures.Future()
    completion.track(rec, [first, second])
    first.set_result(None)
    assert [r for r, _ in completion.in_flight()] == [rec] and rec[R.T_END] == 0
    second.set_result(None)
    assert not completion.in_flight() and rec[R.T_END] > 0
    R.QUEUE.clear()


@pytest.mark.parametrize("native", ["off", "build"])
def test_a_receive_from_any_source_names_its_sender(tmp_path, native, request):
    """``dist.recv(t)`` without ``src``: the peer is the rank torch returns (the native fast path hands
    such a call to the Python body, which reads it)."""
    if native == "build":
        request.getfixturevalue("native_built")
    out = str(tmp_path / "job")
    results = run_ranks("recv_any_source", 2, out, {"native": native})
    assert results[1]["sender"] == 0
    spans = read_spans(os.path.join(out, "runs", "recv-any", "traces.rank1.jsonl"))
    (recv,) = [s for s in spans if s["name"] == "recv"]
    assert recv["attributes"][n.COLL_PEER] == 0


@pytest.mark.parametrize("native", ["off", "auto"])
def test_a_sparse_all_reduce_is_recorded_with_what_it_holds(native, gloo_alone, instrumented):
    """A sparse tensor has no nbytes: its all_reduce went unrecorded ("could not describe"). S is what the
    rank contributes, its indices and values (gloo's sparse all-reduce gathers them)."""
    from .harness import collective_spans

    folder = instrumented(native=native)
    sparse = torch.sparse_coo_tensor(torch.tensor([[0, 2]]), torch.tensor([1.0, 2.0]), (4,)).coalesce()
    with otel_torchdist.step(1):
        dist.all_reduce(sparse)
    otel_torchdist.uninstrument()
    (span,) = collective_spans(read_spans(os.path.join(folder, "traces.rank0.jsonl")))
    a = span["attributes"]
    assert a[n.COLL_MESSAGE_SIZE] == 2 * 8 + 2 * 4 and a[n.COLL_DTYPE] == "float32"


@pytest.mark.parametrize("native", ["auto", "off"])
def test_groups_past_the_cap_share_one_series(fake_pg, instrumented, monkeypatch, native):
    """A program that makes a group per step (and destroys it) got 30 series a group for the rest of the run,
    in /metrics, every metric export and the summary: 60 071 series and a 6.4 MB scrape after 2 000 steps.
    Past MAX_SERIES_GROUPS groups the metrics count them under one group; nothing is lost from the totals."""
    from otel_torchdist.capture import groups

    monkeypatch.setattr(groups, "MAX_SERIES_GROUPS", 3)
    folder = instrumented(native=native, trace_first_steps=0, trace_every_steps=0)
    dist.all_reduce(torch.ones(4))
    for i in range(6):
        g = dist.new_group([0, 1, 2, 3])
        for _ in range(i + 1):
            dist.all_reduce(torch.ones(4), group=g)
        dist.destroy_process_group(g)
    otel_torchdist.uninstrument()
    points = last_metrics(os.path.join(folder, "metrics.rank0.jsonl"))[n.COLLECTIVE_CALLS.name]
    calls = {p["attributes"][n.M_GROUP]: int(p["asInt"]) for p in points}
    assert calls == {"default_pg": 1, "pg1": 1, "pg2": 2, n.GROUP_OVERFLOW: 3 + 4 + 5 + 6}


def test_a_never_waited_work_is_evicted_and_recorded_unfinished(monkeypatch):
    """A work with no completion signal but wait() (gloo's sends and receives) is held until it is waited;
    one never waited is held until MAX_PENDING_WAITS are pending, then recorded unfinished: bounded, and
    nothing lost. (Plain objects stand for gloo's works: holding them is what is tested.)"""
    from otel_torchdist.capture import completion
    from otel_torchdist.capture import record as R

    monkeypatch.setattr(completion, "MAX_PENDING_WAITS", 3)
    monkeypatch.setattr(completion, "_pending_waits", {})
    monkeypatch.setattr(R, "QUEUE", type(R.QUEUE)())
    monkeypatch.setattr(R, "_limit", [100])

    class Work:  # no get_future, no add_done_callback: only wait()
        pass

    works = [Work() for _ in range(5)]
    recs = [R.new("isend", "send_recv", "c10d", 0) for _ in works]
    for rec, work in zip(recs, works):
        completion.track(rec, [work])
    assert list(completion._pending_waits) == works[2:]  # the two oldest let go
    assert [r[R.END] for r in recs[:2]] == [n.END_UNFINISHED] * 2 and len(R.QUEUE) == 2
    completion.on_wait_entered(works[4])
    completion.on_wait_returned(works[4])
    assert recs[4][R.END] == n.END_WAIT and works[4] not in completion._pending_waits


def test_the_spans_of_groups_past_the_cap_carry_the_metrics_label(fake_pg, instrumented, monkeypatch):
    """A span's torchdist.group.label joins it to its series: analyze counted the traced calls of groups past
    the cap twice, once in the overflow series and once from their spans under their own label."""
    from otel_torchdist.analysis import loader, builders
    from otel_torchdist.capture import groups

    monkeypatch.setattr(groups, "MAX_SERIES_GROUPS", 3)
    folder = instrumented()
    for _ in range(6):
        with otel_torchdist.step():
            g = dist.new_group([0, 1, 2, 3])
            dist.all_reduce(torch.ones(4), group=g)
            dist.destroy_process_group(g)
    otel_torchdist.uninstrument()
    labels = Counter(s["attributes"][n.COLL_GROUP_LABEL] for s in collective_spans(read_spans(os.path.join(folder, "traces.rank0.jsonl"))))
    assert labels == {"pg1": 1, "pg2": 1, n.GROUP_OVERFLOW: 4}, labels
    rows = builders.analyze_records(loader.iter_records(loader.discover(folder), [])).ops.rows
    assert sum(r.count for r in rows) == 6, [(r.group, r.count) for r in rows]
