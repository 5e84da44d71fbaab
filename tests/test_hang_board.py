"""The live hang report names the ranks that never came (otel_torchdist/drain/hang_board.py): real gloo ranks, one
or two of them late to a collective or frozen, the waiting ranks' log line, span event and metric read back.
Each job's ranks sleep a few seconds on purpose; the pure matching rules are tested first, without ranks."""

from __future__ import annotations

import os

import pytest

from otel_torchdist.drain import hang_board
from otel_torchdist import names as n

from .harness import attrs, read_metric_lines, read_spans, run_ranks

# ------------------------------------------------------------------------------------------- matching
NOW = 1000.0


def _report(started: int, inflight=None, age: float = 0.5, label: str = "default_pg", p2p: int = 0) -> dict:
    if inflight is not None:
        inflight = [*inflight, inflight[1] - p2p]  # its collective number
    return {"time": NOW - age, "groups": {label: [started, started - 1, inflight, started - p2p]}}


def test_a_rank_behind_on_the_group_has_not_started_it_and_says_where_it_is():
    progress = {0: _report(3, ["all_reduce", 3, 2.0]), 1: _report(2), 2: _report(3, ["all_reduce", 3, 2.0])}
    (missing,) = hang_board.missing_ranks(progress, (0, 1, 2), 0, "default_pg", 3, "all_reduce", NOW)
    assert missing.rank == 1
    assert missing.detail == "last started #2 on default_pg; no collective in flight; reported 0.5 s ago"


def test_a_rank_that_never_reported_or_stopped_reporting_is_named_with_its_silence():
    progress = {0: _report(3), 1: None, 2: _report(1, age=42.0)}
    missing = hang_board.missing_ranks(progress, (0, 1, 2), 0, "default_pg", 3, "all_reduce", NOW)
    assert [m.rank for m in missing] == [1, 2]
    assert "never reported" in missing[0].detail and "reported 42.0 s ago" in missing[1].detail


def test_a_rank_in_another_collective_with_the_same_number_is_named():
    progress = {0: _report(3, ["all_reduce", 3, 2.0]), 1: _report(3, ["barrier", 3, 2.0])}
    (missing,) = hang_board.missing_ranks(progress, (0, 1), 0, "default_pg", 3, "all_reduce", NOW)
    assert missing.rank == 1 and missing.detail.startswith("started #3 on default_pg as barrier, not all_reduce")


def test_a_rank_stuck_on_another_group_says_so():
    progress = {0: _report(3), 1: {"time": NOW, "groups": {"default_pg": [2, 2, None, 2], "pg1": [7, 6, ["broadcast", 7, 9.5, 7], 7]}}}
    (missing,) = hang_board.missing_ranks(progress, (0, 1), 0, "default_pg", 3, "all_reduce", NOW)
    assert "in broadcast #7 on pg1 for 9.5 s" in missing.detail


def test_ranks_ahead_or_in_it_are_not_missing():
    progress = {0: _report(3, ["all_reduce", 3, 2.0]), 1: _report(4), 2: _report(3, ["all_reduce", 3, 1.0])}
    assert hang_board.missing_ranks(progress, (0, 1, 2), 0, "default_pg", 3, "all_reduce", NOW) == []


def test_ranks_compare_collectives_without_the_point_to_point_calls_gloo_numbers_on_two_ranks_only():
    """Ranks 0 and 1 exchanged four point-to-point calls, rank 2 took no part: torch's numbers on gloo are 7
    and 3 for the same all_reduce, their collective numbers 3 alike."""
    progress = {1: _report(6, p2p=4), 2: _report(3, ["all_reduce", 3, 2.0])}
    (missing,) = hang_board.missing_ranks(progress, (0, 1, 2), 0, "default_pg", 3, "all_reduce", NOW)
    assert missing.rank == 1
    assert missing.detail.startswith("last started #6 on default_pg (collective #2, its point-to-point calls aside); ")
    progress = {0: _report(7, ["all_reduce", 7, 2.0], p2p=4), 1: _report(7, ["broadcast", 7, 2.0], p2p=4)}
    (missing,) = hang_board.missing_ranks(progress, (0, 1, 2), 2, "default_pg", 3, "all_reduce", NOW)
    assert missing.rank == 1 and missing.detail.startswith("started #7 on default_pg as broadcast, not all_reduce")


def test_a_groups_collective_numbers_leave_its_point_to_point_calls_out(fake_pg):
    """Numbers 3, 6 and 7 were point-to-point calls (one, then a batch of two): the collectives 1, 2, 4, 5, 8
    are the group's first to fifth; past the marks kept, a number older than them is unknown."""
    from otel_torchdist.capture import groups

    gi = groups.info(None)
    gi.p2p_called(2, 3)
    gi.p2p_called(5, 7)
    gi.p2p_called(9, 9)  # a call that moved nothing (NCCL counts them apart)
    assert [gi.collective_number(s) for s in (1, 2, 4, 5, 8)] == [1, 2, 3, 4, 5]
    assert gi.p2p_moved == 3 and gi.collectives_started() == gi.last_started() - 3
    for seq in range(10, 10 + 2 * groups.P2P_MARKS, 2):
        gi.p2p_called(seq, seq + 1)
    assert gi.collective_number(8) is None and gi.collective_number(10 + 2 * groups.P2P_MARKS) == 10 + 2 * groups.P2P_MARKS - (3 + groups.P2P_MARKS)


# ------------------------------------------------------------------------------------------ real ranks
def _job(tmp_path_factory, ws: int, args: dict) -> dict:
    out = str(tmp_path_factory.mktemp(f"hangboard{ws}"))
    results = run_ranks("scenarios_hangs:late", ws, out, args, timeout=180)
    folder = os.path.join(out, "runs", args["run_id"])
    hangs, missing = [], []
    for r in range(ws):
        hangs.append([s for s in read_spans(os.path.join(folder, f"traces.rank{r}.jsonl")) if s["name"] == n.SPAN_HANG])
        points = set()
        for doc in read_metric_lines(os.path.join(folder, f"metrics.rank{r}.jsonl")):
            for rm in doc["resourceMetrics"]:
                for sm in rm["scopeMetrics"]:
                    for m in sm["metrics"]:
                        if m["name"] == n.COLLECTIVE_HANG_MISSING.name:
                            for dp in m["gauge"]["dataPoints"]:
                                a = attrs(dp["attributes"])
                                points.add((a[n.M_OP], a[n.M_GROUP], a[n.M_MISSING_RANK], int(dp.get("asInt", dp.get("asDouble")))))
        missing.append(points)
    return {"results": results, "hangs": hangs, "missing": missing}


def _missing_event(span: dict) -> dict:
    (event,) = [e for e in span["events"] if e["name"] == n.HANG_MISSING_EVENT]
    return attrs(event["attributes"])


def test_two_ranks_the_waiting_rank_names_the_late_one_live(tmp_path_factory):
    job = _job(tmp_path_factory, 2, {"run_id": "late2", "late": {"1": 4.0}})
    (hang,) = job["hangs"][0]
    assert hang["attributes"][n.HANG_MISSING_RANKS] == [1]
    event = _missing_event(hang)
    assert event[n.HANG_MISSING_RANKS] == [1]
    (detail,) = event[n.HANG_MISSING_DETAIL]
    assert detail.startswith("last started #2 on default_pg; no collective in flight; reported ")
    (line,) = job["results"][0]["hang_lines"]
    assert "all_reduce on group default_pg (sequence number 3)" in line and "not started by rank 1 (last started #2" in line
    assert job["missing"][0] == {("all_reduce", "default_pg", "1", 3)}
    assert job["hangs"][1] == [] and job["results"][1]["hang_lines"] == []
    # the training process's own callback got it too (beside one that raised and one that never returns)
    (event,) = job["results"][0]["hang_events"]
    assert (event["op"], event["group"], event["seq"], event["missing_ranks"]) == ("all_reduce", "default_pg", 3, [1])
    assert event["missing"] == [detail]
    assert job["results"][1]["hang_events"] == []


def test_four_ranks_two_late_ranks_on_different_groups_are_each_named_by_their_peer(tmp_path_factory):
    job = _job(tmp_path_factory, 4, {"run_id": "late4", "pairs": True, "late": {"1": 4.0, "3": 4.0}})
    for waiting, late in ((0, 1), (2, 3)):
        (hang,) = job["hangs"][waiting]
        group = hang["attributes"][n.COLL_GROUP_LABEL]
        assert hang["attributes"][n.HANG_MISSING_RANKS] == [late], hang["attributes"]
        (line,) = job["results"][waiting]["hang_lines"]
        assert f"not started by rank {late} (last started #0 on {group}" in line
        assert {(op, g, r) for op, g, r, _ in job["missing"][waiting]} == {("all_reduce", group, str(late))}
    assert job["hangs"][1] == job["hangs"][3] == []


def test_three_ranks_point_to_point_calls_of_two_of_them_do_not_confuse_who_is_missing(tmp_path_factory):
    """Ranks 0 and 1 exchange four point-to-point calls, which gloo numbers on those two only; then rank 1
    is late. Compared on torch's numbers, rank 0 named rank 2 too, and rank 2 named nobody."""
    job = _job(tmp_path_factory, 3, {"run_id": "p2p3", "p2p": True, "late": {"1": 4.0}})
    for waiting, seq in ((0, 7), (2, 3)):
        (hang,) = job["hangs"][waiting]
        assert hang["attributes"][n.COLL_SEQ] == seq
        assert hang["attributes"][n.HANG_MISSING_RANKS] == [1], hang["attributes"]
        (line,) = job["results"][waiting]["hang_lines"]
        assert "not started by rank 1 (last started #6 on default_pg (collective #2, its point-to-point calls aside); " in line
    assert job["hangs"][1] == []


def test_a_rank_waiting_in_a_receive_has_not_started_the_next_collective(tmp_path):
    """Its receive was counted when it returned, so the rank stuck in it published one collective too many
    and was never named."""
    results = run_ranks("scenarios_hangs:recv_late", 3, str(tmp_path), {}, timeout=120)
    (line,) = results[2]["hang_lines"]
    assert "not started by rank 0 (last started #2 on default_pg; no collective in flight;" in line, line
    assert "; rank 1 (last started #3 on default_pg (collective #2, its point-to-point calls aside); in recv #3 on default_pg for " in line


def test_every_kind_of_point_to_point_call_leaves_the_ranks_counting_the_same_collectives(tmp_path):
    """Object lists (plain and batched), a subgroup, ProcessGroup.send/recv by keyword, a receive from any
    source, isend/irecv, a batch, and gloo's monitored barrier (point-to-point calls in C++ that move rank
    0's number by 4 and the others' by 2): torch's numbers differ between ranks, the collective counts not."""
    results = run_ranks("scenarios_hangs:p2p_numbers", 3, str(tmp_path), {}, timeout=120)
    # world: _start's all_reduce and barrier, the monitored barrier, an all_reduce; sub: two all_reduces
    assert [r["world"][1] for r in results] == [4, 4, 4] and [r["sub"][1] for r in results] == [2, 2, 2], results
    assert results[0]["world"][0] != results[2]["world"][0] != results[1]["world"][0]


def test_three_ranks_a_frozen_rank_is_named_with_how_long_it_has_been_silent(tmp_path_factory):
    job = _job(tmp_path_factory, 3, {"run_id": "frozen3", "stopped": 2, "stopped_s": 5.0})
    for waiting in (0, 1):
        (hang,) = job["hangs"][waiting]
        assert hang["attributes"][n.HANG_MISSING_RANKS] == [2]
        (line,) = job["results"][waiting]["hang_lines"]
        assert "not started by rank 2 (last started #2 on default_pg; no collective in flight; reported" in line
        silent = float(line.split("reported ")[1].split(" s ago")[0])
        assert silent >= 1.0  # its board stopped with it: its last report is older than the hang threshold


def test_ranks_in_different_blocking_collectives_name_each_other(tmp_path):
    """A blocking call learns its sequence number when it returns: the board published None for it, so a rank
    in another op on the same number was never named."""
    results = run_ranks("scenarios_hangs:other_op", 2, str(tmp_path), {}, timeout=120)
    (line0,) = results[0]["hang_lines"]
    assert "not started by rank 1 (started #3 on default_pg as broadcast, not all_reduce" in line0
    (line1,) = results[1]["hang_lines"]
    assert "not started by rank 0 (started #3 on default_pg as all_reduce, not broadcast" in line1


@pytest.mark.parametrize("op", ["recv", "batch_isend_irecv"])
def test_a_hung_receive_says_where_its_peer_is_and_no_verdict(tmp_path, op):
    """Only the peer takes part in a point-to-point call: the board says where it is, not that it has not
    started it (it cannot know what the peer posted). A batch (1F1B's form of it) said nothing of its peer."""
    results = run_ranks("scenarios_hangs:recv_late", 2, str(tmp_path), {"batch": op != "recv"}, timeout=120)
    (line,) = results[1]["hang_lines"]
    assert line.startswith(f"collective {op} on group default_pg (sequence number 3) has been in flight for "), line
    assert "; its peer rank 0: no collective in flight; reported " in line and "not started" not in line, line
    assert results[0]["hang_lines"] == []
    (hang,) = [s for s in read_spans(os.path.join(str(tmp_path), "runs", "recv-late", "traces.rank1.jsonl")) if s["name"] == n.SPAN_HANG]
    assert hang["attributes"][n.COLL_PEER] == 0  # whom it waits on, without reading the message


def test_an_isend_overlapping_compute_and_waited_later_is_no_hang(tmp_path):
    """gloo's send work has no completion signal before wait(): it was timed from its issue and reported
    hung while the rank computed; it is timed from the moment wait() is entered."""
    results = run_ranks("scenarios_hangs:isend_overlap", 2, str(tmp_path), {}, timeout=120)
    assert results[0]["hang_lines"] == results[1]["hang_lines"] == []


def test_groups_of_one_description_get_the_same_labels_on_every_rank(fake_pg, instrumented):
    """Labels were given in the order a rank first used its groups: with A = [1, 2] and B = [0, 1], both
    "tp", rank 1 labelled A "tp" and B "tp:<name>", rank 0 (not in A) B "tp", and the board compared B's
    progress on one rank with A's on another. A group made without this rank takes its description too."""
    import torch.distributed as dist

    from otel_torchdist.capture import groups

    instrumented()
    a = dist.new_group([1, 2], group_desc="tp")
    b = dist.new_group([0, 1], group_desc="tp")
    assert a is dist.GroupMember.NON_GROUP_MEMBER
    assert groups.info(b).label == f"tp:{b.group_name}"  # what rank 1, in both, calls B
