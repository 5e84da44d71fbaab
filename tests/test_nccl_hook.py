"""When the NCCL completion hook may be added to a group, and what is left at the end.

ProcessGroupNCCL cannot exist without a GPU, so these tests use a stand-in that keeps its contract as seen
on an H200 (torch 2.11, NCCL 2.28): one hook for a group's life, timing switched on for works issued after
``_enable_collectives_timing()`` only, and a hook thread that asks every completed work for its CUDA-event
duration, which for an untimed work throws and aborts the communicators (the training dies). The real
thing is exercised by tests/test_gpu.py and benchmarks/gpu_check.py on a GPU machine.
"""

from __future__ import annotations

import re
import threading
import time
from datetime import datetime, timedelta
from types import SimpleNamespace

import pytest

import otel_torchdist
from otel_torchdist import health
from otel_torchdist import names as n
from otel_torchdist.capture import groups, nccl
from otel_torchdist.capture import record as R


class NcclLikeGroup:
    """Stands in for ProcessGroupNCCL (see the module's docstring)."""

    group_name = "9"
    group_desc = "nccl-like"

    def __init__(self) -> None:
        self.seq = 0
        self.p2p_seq = 0  # point-to-point work counts apart (ProcessGroupNCCL's seqP2P_)
        self.started: dict[tuple[str, int], int] = {}  # (count, seq) -> when the work was made (in the call)
        self.timing = False
        self.hook = None
        self.in_flight: dict[int, bool] = {}  # seq -> issued with timing on
        self.aborted = None
        self.cpu = SimpleNamespace(seq=0)
        self.cpu._get_sequence_number_for_group = lambda: self.cpu.seq

    def size(self) -> int:
        return 1

    def rank(self) -> int:
        return 0

    def _get_sequence_number_for_group(self) -> int:
        return self.seq

    def _enable_collectives_timing(self) -> None:
        self.timing = True

    def _get_backend_name(self) -> str:
        return "nccl"  # the group's default backend (what init_process_group() picks on a GPU machine)

    def _get_backend(self, device):
        # "cpu:gloo,cuda:nccl": a call on CPU tensors runs on a backend with its own numbering
        assert str(device) == "cpu"
        return self.cpu

    def cpu_call(self) -> None:
        """A collective on CPU tensors: the CPU backend counts it, NCCL does not."""
        self.cpu.seq += 1

    def _register_on_completion_hook(self, hook) -> None:
        if self.hook is not None:
            raise RuntimeError("ProcessGroupNCCL OnCompletion hook already registered")
        self.hook = hook

    def issue(self) -> int:
        self.seq += 1
        self.in_flight[self.seq] = self.timing
        self.started["coll", self.seq] = time.perf_counter_ns()
        return self.seq

    def issue_batch(self) -> int:
        """A batch_isend_irecv: one COALESCED work numbered on the point-to-point count."""
        self.p2p_seq += 1
        self.started["p2p", self.p2p_seq] = time.perf_counter_ns()
        return self.p2p_seq

    def finish(self, seq: int, op: str = "ALLREDUCE") -> None:
        """The watchdog sees the work done and hands it to the hook thread."""
        timed = self.in_flight.pop(seq)
        if self.hook is None:
            return
        if not timed:
            self.aborted = f"getDuration only works if timing was enabled (work {seq})"
            return
        self.hook(self.info(op, seq, self.started["coll", seq]))

    def finish_batch(self, seq: int) -> None:
        self.hook(self.info("COALESCED", seq, self.started["p2p", seq]))

    @staticmethod
    def info(op: str, seq: int, started_ns: int, active_us: int = 80) -> SimpleNamespace:
        # this torch's WorkInfo times: steady_clock time points, a timedelta since CLOCK_MONOTONIC's epoch
        done = timedelta(microseconds=time.perf_counter_ns() // 1000)
        return SimpleNamespace(op_type=SimpleNamespace(name=op), seq=seq, time_started=timedelta(microseconds=started_ns // 1000),
                               time_finished=done, active_duration=timedelta(microseconds=active_us))  # fmt: skip


@pytest.fixture
def group():
    pg = NcclLikeGroup()
    gi = groups.GroupInfo(pg)
    gi.backend = "nccl"  # dist.get_backend() knows no stand-in
    gi.completion = groups.COMPLETION_ENQUEUE
    gi.gid = len(groups.BY_ID)
    groups.BY_ID.append(gi)
    groups._groups[pg] = gi
    R.QUEUE.clear()
    health.reset()
    nccl.enable(True)  # the Python hook, whatever an earlier instrument() chose
    nccl._START_CHECK[0] = 0
    yield pg, gi
    nccl._START_CHECK[0] = 0
    groups._groups.pop(pg, None)
    nccl._hooked.pop(pg, None)
    gi.pending.clear()  # a record left pending would be exported as unfinished by the next test's end
    gi.early.clear()
    R.QUEUE.clear()


@pytest.fixture
def named(monkeypatch):
    """A stand-in group registered under the backend name ``dist.get_backend`` gives it (torch's own
    get_backend knows no stand-in: it is told what it would say for a real group)."""
    made = []

    def make(backend: str):
        pg = NcclLikeGroup()
        real = groups.dist.get_backend
        monkeypatch.setattr(groups.dist, "get_backend", lambda g=None: backend if g is pg else real(g))
        gi = groups.GroupInfo(pg)
        gi.gid = len(groups.BY_ID)
        groups.BY_ID.append(gi)
        groups._groups[pg] = gi
        made.append((pg, gi))
        return pg, gi

    R.QUEUE.clear()
    nccl.enable(True)
    nccl._START_CHECK[0] = 0
    yield make
    nccl._START_CHECK[0] = 0
    for pg, gi in made:
        groups._groups.pop(pg, None)
        nccl._hooked.pop(pg, None)
        gi.pending.clear()
        gi.early.clear()
    R.QUEUE.clear()


def test_a_group_made_without_a_backend_is_hooked_as_the_backend_torch_picked(named):
    """``init_process_group()`` with no backend: torch names it "undefined" and runs NCCL on a GPU machine."""
    pg, gi = named("undefined")
    assert gi.backend == "nccl"
    nccl.attach(gi)
    assert gi.completion == groups.COMPLETION_NCCL_HOOK and pg.hook is not None


def test_a_group_made_without_a_backend_on_a_gpu_machine_tells_its_cpu_calls_apart(named, monkeypatch):
    """On a GPU machine ``init_process_group()`` makes a group of two backends, "cpu:gloo,cuda:nccl", that
    names itself "nccl": a collective on CPU tensors must not be filed for NCCL's hook. (torch's record of
    the group's device map is set as torch sets it there: no GPU here.)"""
    from otel_torchdist.capture import c10d

    real = groups.GroupInfo

    def made(pg):
        monkeypatch.setitem(c10d._world.pg_backend_config, pg, "cpu:gloo,cuda:nccl")
        return real(pg)

    monkeypatch.setattr(groups, "GroupInfo", made)
    pg, gi = named("undefined")
    assert gi.backend == "nccl" and gi.cpu_backend is pg.cpu
    nccl.attach(gi)
    cpu = R.new("all_reduce", "all_reduce", "test", gi.gid)
    pg.cpu_call()
    c10d._finish(cpu, None)
    assert [(r[R.SEQ], r[R.END]) for r in R.QUEUE] == [(None, n.END_RETURN)] and not gi.pending


def test_the_run_names_the_backend_torch_picked(gloo_alone_undefined):
    from otel_torchdist import identity

    assert str(groups.dist.get_backend()) == "undefined"
    assert groups.GroupInfo(groups.dist.group.WORLD).backend == "gloo"  # no GPU here: gloo
    assert identity.resolve("unit").backend == "gloo"


@pytest.fixture
def gloo_alone_undefined():
    """A 1-rank group made as ``init_process_group()`` without a backend makes it (gloo on this machine)."""
    assert not groups.dist.is_initialized()
    groups.dist.init_process_group(store=groups.dist.HashStore(), rank=0, world_size=1)
    yield groups.dist.group.WORLD
    groups.dist.destroy_process_group()


def test_a_cpu_call_on_a_group_of_two_backends_is_not_taken_for_nccl_work(named):
    """"cpu:gloo,cuda:nccl": NCCL's number does not move for a call on CPU tensors, so it would file the
    record under the number of NCCL's last work, replacing that work's record or waiting for ever; it
    completes as on gloo instead, without NCCL's number, and NCCL's work still ends by the hook."""
    from otel_torchdist.capture import c10d

    pg, gi = named("cpu:gloo,cuda:nccl")
    assert gi.cpu_backend is pg.cpu
    nccl.attach(gi)
    gpu = _new(pg, gi)
    c10d._finish(gpu, None)
    assert _pending(gi) == {gpu[R.SEQ]: gpu}
    cpu = R.new("all_reduce", "all_reduce", "test", gi.gid)
    pg.cpu_call()
    c10d._finish(cpu, None)
    assert [(r[R.SEQ], r[R.END]) for r in R.QUEUE] == [(None, n.END_RETURN)]
    assert _pending(gi) == {gpu[R.SEQ]: gpu}
    pg.finish(gpu[R.SEQ])
    assert [(r[R.SEQ], r[R.END]) for r in R.QUEUE][1:] == [(gpu[R.SEQ], n.END_NCCL_HOOK)]
    # and the next NCCL call is NCCL's again
    again = _new(pg, gi)
    c10d._finish(again, None)
    assert _pending(gi) == {again[R.SEQ]: again}


def _pending(gi) -> dict:
    return {seq: rec for seq, (rec, _, _) in gi.pending.items()}


def _new(pg, gi) -> list:
    rec = R.new("all_reduce", "all_reduce", "test", gi.gid)
    rec[R.T_START] = time.perf_counter_ns()  # as the wrapper stamps it, before the call
    rec[R.SEQ] = pg.issue()
    return rec


def _issue(pg, gi) -> list:
    rec = _new(pg, gi)
    if gi.completion == groups.COMPLETION_NCCL_HOOK:
        nccl.expect(gi, rec)
    return rec


def test_a_fresh_group_is_hooked_after_its_timing_is_on(group):
    pg, gi = group
    nccl.attach(gi)
    assert pg.timing and pg.hook is not None
    assert gi.completion == groups.COMPLETION_NCCL_HOOK
    rec = _issue(pg, gi)
    pg.finish(rec[R.SEQ])
    (done,) = R.QUEUE
    assert done[R.END] == n.END_NCCL_HOOK and done[R.GPU_NS] == 80_000
    assert pg.aborted is None


def test_a_group_that_already_ran_collectives_is_not_hooked(group, caplog):
    """instrument() mid-training: a work issued before timing was on would abort the job at its completion."""
    pg, gi = group
    earlier = pg.issue()  # in flight (or not yet reaped by the watchdog) when instrument() runs
    nccl.attach(gi)
    assert pg.hook is None and not pg.timing
    assert gi.completion == groups.COMPLETION_ENQUEUE
    pg.finish(earlier)
    assert pg.aborted is None
    assert "ran collectives before instrument()" in caplog.text and gi.label in caplog.text


def test_instrumenting_again_reuses_the_groups_one_hook(group):
    pg, gi = group
    nccl.attach(gi)
    nccl.flush_pending(0.0)  # uninstrument(): the hook stays, its slot empties
    before = R.new("all_reduce", "all_reduce", "test", gi.gid)
    before[R.SEQ] = pg.issue()
    pg.finish(before[R.SEQ])  # completes while uninstrumented: nothing recorded, nothing raised
    assert not R.QUEUE
    again = groups.GroupInfo(pg)
    again.backend, again.gid = "nccl", gi.gid
    nccl.attach(again)  # a second register would raise in torch
    assert again.completion == groups.COMPLETION_NCCL_HOOK
    rec = _issue(pg, again)
    pg.finish(rec[R.SEQ])
    assert [r[R.END] for r in R.QUEUE] == [n.END_NCCL_HOOK]
    assert pg.aborted is None


def test_the_end_waits_for_reports_of_finished_work_and_no_longer(group):
    pg, gi = group
    nccl.attach(gi)
    finished, hung = _issue(pg, gi), _issue(pg, gi)
    # the watchdog polls every 100 ms: the finished work is reported a moment after the loop ends
    threading.Timer(0.15, pg.finish, args=(finished[R.SEQ],)).start()
    t0 = time.monotonic()
    nccl.flush_pending(1.0)
    waited = time.monotonic() - t0
    ends = {r[R.SEQ]: r[R.END] for r in R.QUEUE}
    assert ends == {finished[R.SEQ]: n.END_NCCL_HOOK, hung[R.SEQ]: n.END_UNFINISHED}
    assert 0.15 <= waited < 1.5


def test_a_work_reported_before_its_record_was_filed_is_still_joined(group):
    """A tiny op can finish, and the watchdog report it, between the call's return and the wrapper filing
    its record: the report waits for the record instead of leaving it 'unfinished' at the end."""
    pg, gi = group
    nccl.attach(gi)
    rec = _new(pg, gi)
    pg.finish(rec[R.SEQ])
    assert not R.QUEUE
    nccl.expect(gi, rec)
    assert [r[R.END] for r in R.QUEUE] == [n.END_NCCL_HOOK]
    assert not gi.early and not gi.pending


@pytest.mark.parametrize("clock", ["steady", "system"])
def test_a_record_ends_when_the_watchdog_saw_its_work_done_not_when_the_hook_ran(group, clock):
    """The hook thread may run a report long after the watchdog saw the work done (it waits for the GIL).
    torch hands the hook the watchdog's time as a steady_clock time point, a timedelta since CLOCK_MONOTONIC's
    epoch (this project's torch: WorkInfo.time_finished's pybind11 signature says so), or in older torch as
    a system_clock one, a datetime. The CUDA-event duration comes as a timedelta too, in microseconds."""
    import torch._C._distributed_c10d as c10d

    prop = vars(c10d.WorkInfo).get("time_finished") if hasattr(c10d, "WorkInfo") else None
    if prop is not None:  # this torch's form is one of the two read here
        signature = getattr(prop.fget, "__doc__", "") or ""
        assert "-> datetime.timedelta" in signature or "-> datetime.datetime" in signature, signature
    pg, gi = group
    nccl.attach(gi)
    rec = _issue(pg, gi)
    done = time.perf_counter_ns() - 50_000_000  # 50 ms before the hook runs
    when = timedelta(microseconds=done // 1000) if clock == "steady" else datetime.now() - timedelta(milliseconds=50)
    pg.hook(SimpleNamespace(op_type=SimpleNamespace(name="ALLREDUCE"), seq=rec[R.SEQ], time_finished=when,
                            active_duration=timedelta(microseconds=65)))  # fmt: skip
    assert [r[R.END] for r in R.QUEUE] == [n.END_NCCL_HOOK]
    assert abs(rec[R.T_END] - done) < 2_000_000
    assert rec[R.GPU_NS] == 65_000  # exactly: total_seconds() * 1e9 gives 64 999


def test_a_send_does_not_complete_the_collective_sharing_its_number(group):
    pg, gi = group
    nccl.attach(gi)
    rec = _issue(pg, gi)
    # a send's work carries the number of the group's last collective (point-to-point counts apart)
    pg.hook(SimpleNamespace(op_type=SimpleNamespace(name="SEND"), seq=rec[R.SEQ], time_finished=datetime.now(),
                            active_duration=timedelta(microseconds=5)))  # fmt: skip
    assert not R.QUEUE and _pending(gi) == {rec[R.SEQ]: rec}


# ----------------------------------------------- a point-to-point batch numbered like a collective
# ProcessGroupNCCL numbers point-to-point work on a count of its own; a batch_isend_irecv completes as one
# COALESCED work on that count, and WorkInfo does not say it is point-to-point. Its time_started (stamped
# when the work is made, inside the call that issues it) tells it from the collective of the same number.


def _calibrated(pg, gi) -> None:
    """A collective's report seen to start inside its call: the stamp is trusted from now on."""
    rec = _issue(pg, gi)
    pg.finish(rec[R.SEQ])
    assert nccl._START_CHECK[0] == 1
    R.QUEUE.clear()


_APART = 0.0002  # the stamp reaches Python in microseconds: works made apart by more than that


def _batch_numbered_as(pg, seq: int) -> int:
    pg.p2p_seq = seq - 1
    return pg.issue_batch()


@pytest.mark.parametrize("when", ["before the call", "after the call"])
def test_a_point_to_point_batch_does_not_end_the_collective_sharing_its_number(group, when):
    pg, gi = group
    nccl.attach(gi)
    _calibrated(pg, gi)
    if when == "before the call":  # a pipeline's batch issued first, still running when the collective is
        batch = _batch_numbered_as(pg, pg.seq + 1)
        time.sleep(_APART)
        rec = _issue(pg, gi)
    else:  # issued after the collective, and done before it
        rec = _issue(pg, gi)
        time.sleep(_APART)
        batch = _batch_numbered_as(pg, rec[R.SEQ])
    assert batch == rec[R.SEQ]
    pg.finish_batch(batch)
    assert not R.QUEUE and _pending(gi) == {rec[R.SEQ]: rec}
    time.sleep(0.002)
    pg.finish(rec[R.SEQ])
    assert [r[R.END] for r in R.QUEUE] == [n.END_NCCL_HOOK] and not gi.pending
    assert rec[R.T_END] - rec[R.T_START] >= 2_000_000  # its own end, not the batch's


def test_a_batch_reported_before_the_collective_of_its_number_was_filed_is_not_taken_for_it(group):
    pg, gi = group
    nccl.attach(gi)
    _calibrated(pg, gi)
    batch = _batch_numbered_as(pg, pg.seq + 1)
    pg.finish_batch(batch)  # in the early table, under the number the next collective will have
    assert gi.early
    time.sleep(_APART)
    rec = _issue(pg, gi)
    assert rec[R.SEQ] == batch and not R.QUEUE and _pending(gi) == {rec[R.SEQ]: rec}
    pg.finish(rec[R.SEQ])
    assert [r[R.END] for r in R.QUEUE] == [n.END_NCCL_HOOK] and not gi.pending and not gi.early


def test_of_two_early_reports_of_one_number_the_records_own_is_taken(group):
    pg, gi = group
    nccl.attach(gi)
    _calibrated(pg, gi)
    batch = _batch_numbered_as(pg, pg.seq + 1)
    time.sleep(_APART)
    rec = _new(pg, gi)
    pg.finish(rec[R.SEQ])  # the collective's report, before its record is filed...
    pg.finish_batch(batch)  # ...and the batch's, under the same number
    assert len(gi.early[rec[R.SEQ]]) == 2
    nccl.expect(gi, rec)
    assert [r[R.END] for r in R.QUEUE] == [n.END_NCCL_HOOK] and not gi.pending and not gi.early
    assert rec[R.GPU_NS] == 80_000


def test_a_coalesced_collective_is_still_joined(group):
    """A coalescing block's work (or torch's internal coalescing of uneven lists) is COALESCED too, made
    inside its call: its record's."""
    pg, gi = group
    nccl.attach(gi)
    _calibrated(pg, gi)
    rec = _issue(pg, gi)
    pg.finish(rec[R.SEQ], op="COALESCED")
    assert [r[R.END] for r in R.QUEUE] == [n.END_NCCL_HOOK] and not gi.pending


def test_a_collective_issued_inside_a_coalescing_block_takes_the_blocks_work(group):
    """Inside ``_coalescing_manager`` an op that torch does not queue (a broadcast) runs as called, but
    ProcessGroupNCCL makes one COALESCED work for the block at its end, after the op's record was filed."""
    from otel_torchdist.capture import c10d

    pg, gi = group
    nccl.attach(gi)
    _calibrated(pg, gi)
    rec = _new(pg, gi)
    pg.in_flight.pop(rec[R.SEQ])
    c10d._coalesce_state[pg] = []  # what _coalescing_manager holds for the group while its block runs
    try:
        c10d._finish(rec, None)
    finally:
        del c10d._coalesce_state[pg]
    time.sleep(_APART)
    pg.hook(pg.info("COALESCED", rec[R.SEQ], time.perf_counter_ns()))  # the block's work, made at its end
    assert [r[R.END] for r in R.QUEUE] == [n.END_NCCL_HOOK] and not gi.pending


@pytest.mark.parametrize("report", ["after the block's record", "before the block's record"])
def test_the_ops_of_a_coalescing_block_share_its_number_and_its_work(group, report):
    """Two ops torch does not queue, run inside one block, read the block's number, as the block's own
    record does: one report (the block's work) ends them all; the second op's record once replaced the
    first's, which then waited for ever (a false hang). The watchdog may report the block's work before the
    wrapper files the block's record."""
    from otel_torchdist.capture import c10d

    pg, gi = group
    nccl.attach(gi)
    _calibrated(pg, gi)
    seq = pg.issue()
    pg.in_flight.pop(seq)
    ops = []
    c10d._coalesce_state[pg] = []
    try:
        for _ in range(2):
            rec = R.new("broadcast", "broadcast", "test", gi.gid)
            rec[R.T_START], rec[R.SEQ] = time.perf_counter_ns(), seq
            c10d._finish(rec, None)
            ops.append(rec)
    finally:
        del c10d._coalesce_state[pg]
    block = R.new("coalesced", "coalesced", "test", gi.gid)
    block[R.T_START], block[R.SEQ] = time.perf_counter_ns(), seq
    time.sleep(_APART)
    work = pg.info("COALESCED", seq, time.perf_counter_ns())  # made at the block's end
    if report == "before the block's record":
        pg.hook(work)
        assert [r[R.OP] for r in R.QUEUE] == ["broadcast", "broadcast"]
        nccl.expect(gi, block)
    else:
        nccl.expect(gi, block)
        assert len(nccl.pending_records(gi)) == 3
        time.sleep(_APART)
        pg.finish_batch(_batch_numbered_as(pg, seq))  # a later batch of that number: not the block's
        assert not R.QUEUE
        pg.hook(work)
    assert sorted(r[R.OP] for r in R.QUEUE) == ["broadcast", "broadcast", "coalesced"]
    assert all(r[R.END] == n.END_NCCL_HOOK for r in R.QUEUE) and not gi.pending and not gi.early


def test_before_any_collective_shows_the_clocks_agree_a_coalesced_report_joins_on_its_number(group):
    """Until then the stamp is not trusted: a report is never left out on a clock that may be another."""
    pg, gi = group
    nccl.attach(gi)
    batch = _batch_numbered_as(pg, 1)
    time.sleep(_APART)
    rec = _issue(pg, gi)
    pg.finish_batch(batch)
    assert nccl._START_CHECK[0] == 0
    assert [r[R.SEQ] for r in R.QUEUE] == [rec[R.SEQ]] and not gi.pending  # ended by the batch's report


def test_a_collective_started_outside_its_call_turns_the_check_off_with_a_warning(group, caplog):
    """A torch whose stamp is on another clock: every report joins on its number, as before the check."""
    pg, gi = group
    nccl.attach(gi)
    rec = _issue(pg, gi)
    pg.in_flight.pop(rec[R.SEQ])
    pg.hook(pg.info("ALLREDUCE", rec[R.SEQ], rec[R.T_START] - 10_000_000_000))
    assert nccl._START_CHECK[0] == -1 and [r[R.END] for r in R.QUEUE] == [n.END_NCCL_HOOK]
    assert "started outside its call" in caplog.text
    # The call began exactly 10 s after the stamp; it ends whenever this (possibly busy) machine got to the hook.
    called = re.search(r"number %d: called \+(\d+) us \.\. \+(\d+) us from its work's start" % rec[R.SEQ], caplog.text)
    assert called and int(called[1]) == 10_000_000 <= int(called[2]) < 20_000_000, caplog.text
    rec = _issue(pg, gi)
    pg.hook(pg.info("COALESCED", rec[R.SEQ], rec[R.T_START] - 10_000_000_000))
    assert [r[R.END] for r in R.QUEUE][1:] == [n.END_NCCL_HOOK] and not gi.pending


def test_a_report_without_a_start_joins_on_its_number(group):
    pg, gi = group
    nccl.attach(gi)
    _calibrated(pg, gi)
    rec = _issue(pg, gi)
    pg.in_flight.pop(rec[R.SEQ])
    info = pg.info("COALESCED", rec[R.SEQ], 0)
    info.time_started = timedelta(0)  # not stamped
    pg.hook(info)
    assert [r[R.END] for r in R.QUEUE] == [n.END_NCCL_HOOK] and not gi.pending


def test_reports_of_works_never_recorded_do_not_pile_up(group):
    pg, gi = group
    nccl.attach(gi)
    for _ in range(1000):
        pg.finish(pg.issue())  # issued around the wrappers (a C++ caller)
    assert len(gi.early) <= 64


# ------------------------------------------------------------------- meeting a group before its first work
@pytest.fixture
def attach_seen():
    """What a completion attacher sees when the library first meets each group: (group, collectives it had
    already issued). The NCCL hook can only be added at 0 (a real gloo group stands in: its sequence numbers
    count the same way, and so do the C++ collectives DDP's constructor issues past every Python wrapper)."""
    seen: list = []

    def attacher(gi):
        seen.append((gi.pg, gi.last_started()))

    groups.register_completion_attacher(attacher)
    yield seen
    groups._completion_attachers.remove(attacher)


def test_a_group_is_met_when_it_is_created_before_any_collective(instrumented, attach_seen):
    import torch.distributed as dist

    instrumented()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert attach_seen == [(dist.group.WORLD, 0)]
        sub = dist.new_group([0])
        assert attach_seen[-1] == (sub, 0)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("given", ["process_group", "device_mesh"])
def test_ddp_meets_its_group_before_its_constructor_broadcasts(instrumented, attach_seen, given):
    """A group no wrapper saw made (DeviceMesh binds new_group and split_group at its import), handed to
    DDP as ``process_group`` or as a 1-D ``device_mesh`` (``mesh["dp"]``): met before the constructor's C++
    collectives, not at the first collective a wrapper sees, too late for NCCL's completion hook."""
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    from torch.distributed.device_mesh import DeviceMesh

    instrumented()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        sub = c10d.new_group.__wrapped__([0])
        assert all(pg is not sub for pg, _ in attach_seen)
        how = {"process_group": sub} if given == "process_group" else {"device_mesh": DeviceMesh.from_group(sub, "cpu")}
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4), **how)
        assert (sub, 0) in attach_seen
        assert sub._get_sequence_number_for_group() > 0  # the constructor did issue its C++ collectives
        del model
    finally:
        dist.destroy_process_group()


def test_instrument_after_the_group_exists_meets_it_at_once(gloo_alone, instrumented, attach_seen):
    instrumented()
    assert attach_seen == [(gloo_alone, 0)]


def test_a_later_instrument_points_the_live_groups_python_hook_at_itself(group):
    """The group outlives uninstrument() with its GroupInfo: instrument() again points its hook back at it."""
    pg, gi = group
    nccl.attach(gi)
    nccl.flush_pending(0.0)  # uninstrument()
    nccl.enable(True)  # instrument() again: the same live group, never attached anew
    rec = _issue(pg, gi)
    pg.finish(rec[R.SEQ])
    assert [r[R.END] for r in R.QUEUE] == [n.END_NCCL_HOOK] and not gi.pending


def test_nccl_completion_disabled_leaves_groups_enqueue_timed(group, instrumented):
    """disabled_captures=("nccl_completion",): no timing switched on, no hook; the records end at enqueue.
    instrument() without it hooks the next group again."""
    pg, gi = group
    instrumented(run_id="no-nccl-hook", disabled_captures=("nccl_completion",))
    nccl.attach(gi)
    assert pg.hook is None and not pg.timing
    assert gi.completion == groups.COMPLETION_ENQUEUE
    rec = _issue(pg, gi)  # as the wrapper does: an enqueue-timed group's record is not filed for the hook
    pg.finish(rec[R.SEQ])
    assert not gi.pending and pg.aborted is None
    otel_torchdist.uninstrument()
    instrumented(run_id="nccl-hook-again")
    fresh = NcclLikeGroup()  # one that ran nothing yet (a group that did is never hooked)
    again = groups.GroupInfo(fresh)
    again.backend, again.gid = "nccl", gi.gid
    nccl.attach(again)
    assert fresh.timing and fresh.hook is not None
    assert again.completion == groups.COMPLETION_NCCL_HOOK


def test_a_collective_captured_into_a_cuda_graph_ends_at_enqueue(group, monkeypatch, caplog):
    """ProcessGroupNCCL queues no work of a capture for its watchdog (``enqueue`` is false while the stream
    captures), so the hook never reports it: it waited for ever (a false hang, ``unfinished`` at the end).
    A GPU's capture state stood in for (no CUDA here)."""
    pg, gi = group
    nccl.attach(gi)
    monkeypatch.setattr(nccl, "_stream_capturing", lambda: True)
    rec = _issue(pg, gi)
    pg.in_flight.pop(rec[R.SEQ])  # never reported
    assert [r[R.END] for r in R.QUEUE] == [n.END_ENQUEUE] and not gi.pending
    assert "captured into a CUDA graph" in caplog.text
    monkeypatch.setattr(nccl, "_stream_capturing", lambda: False)
    rec = _issue(pg, gi)
    pg.finish(rec[R.SEQ])
    assert [r[R.END] for r in R.QUEUE] == [n.END_ENQUEUE, n.END_NCCL_HOOK]
