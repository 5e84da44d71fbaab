"""The NCCL completion hook in C++ (``nccl_hook="native"``, native/timed_group.cpp): torch's hook thread
files each completion without Python, and the drain joins it with its record.

ProcessGroupNCCL cannot exist without a GPU: the hook's body is driven through the native part's test seam
(``complete_as_hook``: what the registered function does with a WorkInfo), with the stand-in group of
tests/test_nccl_hook.py for the Python side, and the registration itself is checked against a real
process group that refuses it (gloo, as every backend but NCCL does). The real thing is exercised by
tests/test_gpu.py and benchmarks/gpu_collective_cost.py on a GPU machine.
"""

from __future__ import annotations

import pytest

from otel_torchdist import health
from otel_torchdist import names as n
from otel_torchdist import native
from otel_torchdist.capture import groups, nccl
from otel_torchdist.capture import record as R

from .test_nccl_hook import NcclLikeGroup, _issue, _new

SEND = 12  # c10d::OpType::SEND
COALESCED = 17  # c10d::OpType::COALESCED


@pytest.fixture
def hooked(native_built):
    """A stand-in NCCL group whose completion hook is the C++ one (its slot made by the test seam)."""
    mod = native.load()
    pg = NcclLikeGroup()
    gi = groups.GroupInfo(pg)
    gi.backend, gi.completion, gi.gid = "nccl", groups.COMPLETION_NCCL_HOOK, len(groups.BY_ID)
    groups.BY_ID.append(gi)
    groups._groups[pg] = gi
    hook = mod.test_hook(gi.gid)
    nccl._hooked[pg] = [gi, (mod, hook)]
    nccl._native_hooks[0] = mod
    mod.take_completions()
    R.QUEUE.clear()
    health.reset()
    nccl._START_CHECK[0] = 0
    yield mod, hook, pg, gi
    nccl._START_CHECK[0] = 0
    mod.set_hook_group(hook, -1)
    nccl._hooked.pop(pg, None)
    nccl._native_hooks[0] = None
    groups._groups.pop(pg, None)
    gi.pending.clear()
    gi.early.clear()
    R.QUEUE.clear()


def test_a_completion_ends_its_record_when_the_drain_takes_it(hooked):
    mod, hook, pg, gi = hooked
    rec = _issue(pg, gi)
    mod.complete_as_hook(hook, rec[R.SEQ], 123_456_789, 80e-6)
    assert not R.QUEUE  # filed in C++: nothing ran in Python
    nccl.take_completions()
    (done,) = R.QUEUE
    assert done[R.SEQ] == rec[R.SEQ] and done[R.END] == n.END_NCCL_HOOK
    assert done[R.T_END] == 123_456_789  # steady_clock is the records' clock (CLOCK_MONOTONIC)
    assert done[R.GPU_NS] == 80_000
    assert not gi.pending and not gi.early


def test_a_completion_before_its_record_is_filed_waits_for_it(hooked):
    mod, hook, pg, gi = hooked
    rec = _new(pg, gi)
    mod.complete_as_hook(hook, rec[R.SEQ], 1_000, 5e-6)
    nccl.take_completions()
    assert not R.QUEUE and rec[R.SEQ] in gi.early
    nccl.expect(gi, rec)
    assert [r[R.END] for r in R.QUEUE] == [n.END_NCCL_HOOK] and rec[R.GPU_NS] == 5_000


def test_a_send_is_never_joined(hooked):
    mod, hook, pg, gi = hooked
    rec = _issue(pg, gi)
    mod.complete_as_hook(hook, rec[R.SEQ], 1_000, 5e-6, op=SEND)  # a send carries the last collective's number
    nccl.take_completions()
    assert not R.QUEUE and rec[R.SEQ] in gi.pending


def test_a_point_to_point_batch_does_not_end_the_collective_sharing_its_number(hooked):
    """The C++ hook files a COALESCED work with its start (tests/test_nccl_hook.py says why): one that
    started before its record's call is another count's (a batch_isend_irecv's)."""
    mod, hook, pg, gi = hooked
    first = _issue(pg, gi)
    mod.complete_as_hook(hook, first[R.SEQ], first[R.T_START] + 50_000, 5e-6, t0_ns=first[R.T_START] + 1)
    nccl.take_completions()
    assert nccl._START_CHECK[0] == 1  # a collective's work started inside its call: the stamp is trusted
    R.QUEUE.clear()
    rec = _issue(pg, gi)
    batch_start = rec[R.T_START] - 3_000_000
    mod.complete_as_hook(hook, rec[R.SEQ], rec[R.T_START] + 10_000, 9e-6, op=COALESCED, t0_ns=batch_start)
    nccl.take_completions()
    assert not R.QUEUE and rec[R.SEQ] in gi.pending
    mod.complete_as_hook(hook, rec[R.SEQ], rec[R.T_START] + 90_000, 70e-6, op=COALESCED, t0_ns=rec[R.T_START] + 1)
    nccl.take_completions()
    assert [r[R.END] for r in R.QUEUE] == [n.END_NCCL_HOOK] and rec[R.GPU_NS] == 70_000 and not gi.pending


def test_uninstrumented_the_hook_files_nothing_and_a_later_instrument_points_it_anew(hooked):
    mod, hook, pg, gi = hooked
    nccl.flush_pending(0.0)  # uninstrument(): the hook stays with the group, pointing nowhere
    mod.complete_as_hook(hook, pg.issue(), 1_000, 5e-6)
    items, dropped = mod.take_completions()
    assert items == [] and dropped == 0
    again = groups.GroupInfo(pg)
    again.backend, again.gid = "nccl", len(groups.BY_ID)
    groups.BY_ID.append(again)
    R.QUEUE.clear()
    nccl.attach(again)  # the group's one hook, now reporting as the new group id
    assert again.completion == groups.COMPLETION_NCCL_HOOK
    rec = _issue(pg, again)
    mod.complete_as_hook(hook, rec[R.SEQ], 2_000, 7e-6)
    nccl.take_completions()
    assert [r[R.END] for r in R.QUEUE] == [n.END_NCCL_HOOK] and rec[R.GPU_NS] == 7_000


def test_a_later_instrument_points_the_live_groups_hook_at_itself(hooked):
    """The group outlives uninstrument() with its GroupInfo (and gid): instrument() again must point its
    one hook back at it, or every record of the group would wait for an end that never comes."""
    mod, hook, pg, gi = hooked
    nccl.flush_pending(0.0)  # uninstrument()
    nccl.enable(True, native=True)  # instrument() again: the same live group
    try:
        rec = _issue(pg, gi)
        mod.complete_as_hook(hook, rec[R.SEQ], 2_000, 7e-6)
        nccl.take_completions()
        assert [r[R.END] for r in R.QUEUE] == [n.END_NCCL_HOOK] and not gi.pending
        R.QUEUE.clear()
        nccl.flush_pending(0.0)
        nccl.enable(False)  # and again with the hook disabled: enqueue-timed
        assert gi.completion == groups.COMPLETION_ENQUEUE
        mod.complete_as_hook(hook, pg.issue(), 3_000, 1e-6)
        assert mod.take_completions() == ([], 0)
    finally:
        nccl.enable(True)


def test_a_step_close_sees_the_records_completed_before_it_was_queued(hooked, instrumented):
    """A completion the hook thread files while the drain takes the others (it needs no GIL) comes with
    the closes queued after it: a close counted in a round runs after every record completed before it."""
    from otel_torchdist import runtime

    mod, hook, pg, gi = hooked
    instrumented(run_id="native-nccl-hook-order")
    late = _issue(pg, gi)
    seen: list = []
    close = R.reserve("test.native_nccl_hook.close")
    R.DRAINED[close] = lambda pipeline: seen.append(late[R.SEQ] in gi.pending)
    take = nccl.take_completions

    def taking_while_the_hook_files():
        take()
        if not seen and late[R.SEQ] in gi.pending and not R.DEFERRED:
            mod.complete_as_hook(hook, late[R.SEQ], late[R.T_START] + 1_000, 1e-6)  # the hook thread...
            R.DEFERRED.append((close,))  # ...then the training thread closes the step

    nccl.take_completions = taking_while_the_hook_files
    try:
        runtime.current().pipeline.drain()
    finally:
        nccl.take_completions = take
    assert seen == [False]  # the close ran once, after the record's completion was joined


def test_the_end_takes_the_last_completions_and_exports_the_rest_unfinished(hooked):
    mod, hook, pg, gi = hooked
    finished, hung = _issue(pg, gi), _issue(pg, gi)
    mod.complete_as_hook(hook, finished[R.SEQ], 3_000, 1e-6)
    nccl.flush_pending(0.0)
    assert {r[R.SEQ]: r[R.END] for r in R.QUEUE} == {finished[R.SEQ]: n.END_NCCL_HOOK, hung[R.SEQ]: n.END_UNFINISHED}


def test_the_drain_joins_them_each_round(hooked, instrumented):
    mod, hook, pg, gi = hooked
    instrumented(run_id="native-nccl-hook")
    from otel_torchdist import runtime

    rec = _issue(pg, gi)
    mod.complete_as_hook(hook, rec[R.SEQ], rec[R.T_START] + 40_000, 30e-6)
    runtime.current().pipeline.drain()
    assert not gi.pending and rec[R.END] == n.END_NCCL_HOOK and not R.QUEUE  # joined, queued, processed


def test_registering_on_a_group_without_the_hook_raises_and_attach_falls_back_to_python(native_built, gloo_alone):
    import torch.distributed as dist

    mod = native.load()
    with pytest.raises(RuntimeError, match="(?i)completion hook|onCompletion"):
        mod.hook_group(dist.group.WORLD, 0)  # torch's own refusal: the registration reached the backend
    pg = NcclLikeGroup()  # not a ProcessGroup: the C++ hook cannot take it
    gi = groups.GroupInfo(pg)
    gi.backend, gi.gid = "nccl", len(groups.BY_ID)
    groups.BY_ID.append(gi)
    nccl.enable(True, native=True)
    try:
        nccl.attach(gi)
    finally:
        nccl.enable(True)
    assert pg.hook is not None and pg.timing and gi.completion == groups.COMPLETION_NCCL_HOOK
    rec = _issue(pg, gi)
    pg.finish(rec[R.SEQ])
    assert [r[R.END] for r in R.QUEUE if r[R.SEQ] == rec[R.SEQ]] == [n.END_NCCL_HOOK]
    nccl.flush_pending(0.0)
    R.QUEUE.clear()


def test_a_group_is_numbered_before_its_completion_hook_is_registered(gloo_alone, monkeypatch):
    """The C++ hook reports as the group id it was registered with; registered with a group not yet
    numbered (-1), it dropped every completion as an uninstrumented group's (records ended unfinished on an
    H200). The attacher runs inside groups.info(), the one place groups are met."""
    seen = []
    monkeypatch.setattr(groups, "_completion_attachers", [lambda gi: seen.append((gi.gid, 0 <= gi.gid < len(groups.BY_ID) and groups.BY_ID[gi.gid] is gi))])
    groups.forget(gloo_alone)
    gi = groups.info(gloo_alone)
    assert seen == [(gi.gid, True)] and gi.gid >= 0
