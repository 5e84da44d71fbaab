"""The reducer's process group (capture/ddp_reducer.py), the parts a gloo job cannot make happen on cue.

The real path (a gloo DDP whose reducer all-reduces its unused-parameter map and broadcasts a rebuilt
layout through the group) runs in tests/test_training_paths.py; here, a collective that fails: torch's own
futures, no process group needed.
"""

from __future__ import annotations

import pytest
import torch

from otel_torchdist import bandwidth as bw
from otel_torchdist import names as n
from otel_torchdist.capture import completion, ddp_reducer
from otel_torchdist.capture import record as R


def test_a_failed_collective_reaches_the_reducer_and_its_record():
    fut = torch.futures.Future()
    rec = R.new("all_reduce", bw.ALL_REDUCE, ddp_reducer.SOURCE, 0)
    join = ddp_reducer._Join(rec)
    completion._inflight[id(join)] = join
    work = ddp_reducer._Waited(fut.then(join.reduced))
    queued = len(R.QUEUE)
    try:
        fut.set_exception(RuntimeError("peer 1 went away"))
        with pytest.raises(RuntimeError, match="peer 1 went away"):
            work.wait()  # what the reducer's wait raises, as the real work's would
        assert len(R.QUEUE) == queued + 1
        done = R.QUEUE[-1]
        assert done[R.ERROR] == ("RuntimeError", "peer 1 went away")
        assert done[R.END] == n.END_FUTURE and done[R.T_END] > 0
        assert id(join) not in completion._inflight  # the hang watchdog no longer waits for it
    finally:
        while len(R.QUEUE) > queued:
            R.QUEUE.pop()


def test_a_completed_collective_hands_the_reducer_its_value():
    fut = torch.futures.Future()
    rec = R.new("broadcast", bw.BROADCAST, ddp_reducer.SOURCE, 0)
    join = ddp_reducer._Join(rec)
    work = ddp_reducer._Waited(fut.then(join.reduced))
    queued = len(R.QUEUE)
    try:
        value = [torch.arange(3, dtype=torch.int32)]
        fut.set_result(value)
        assert work.wait() is True
        assert work.get_future().value() is value
        assert R.QUEUE[-1][R.ERROR] is None and R.QUEUE[-1][R.END] == n.END_FUTURE
    finally:
        while len(R.QUEUE) > queued:
            R.QUEUE.pop()
