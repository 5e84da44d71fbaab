"""DTensor's sharding steps on the ``fake`` backend, in the test process.

Tensor parallel training over real gloo ranks (spans' shapes and placements, CommDebugMode's counts) is in
test_training_paths.py; here, what a redistribute costs a training step that is not traced.
"""

from __future__ import annotations

import os

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import otel_torchdist
from otel_torchdist import names as n
from otel_torchdist.capture import framework_spans
from otel_torchdist.capture import record as R

from .harness import read_spans


def _queued_span_names() -> list[str]:
    return [entry[1] for entry in list(R.DEFERRED) if entry[0] == framework_spans.BUILD]


def test_redistribute_in_an_untraced_step_queues_no_span_and_keeps_its_collectives_framework(fake_pg, instrumented):
    # Steps count from 1, begun by instrument(): the loop's first step_begin() continues step 1, the last traced.
    folder = instrumented(trace_first_steps=1, trace_every_steps=1000, drain_interval=3600.0)
    mesh = init_device_mesh("cpu", (4,))
    sharded = distribute_tensor(torch.ones(8, 4), mesh, [Shard(0)])
    before = len(_queued_span_names())
    for _ in range(3):  # step 1 traced, steps 2 and 3 not
        otel_torchdist.step_begin()
        sharded.redistribute(mesh, [Replicate()]).to_local()
        otel_torchdist.step_end()
    queued = _queued_span_names()[before:]
    assert queued.count(n.SPAN_REDISTRIBUTE) == 1, queued
    queued_records = [rec for rec in list(R.QUEUE) if rec[R.OP] == "all_gather_single"]
    assert len(queued_records) == 3  # every collective is recorded (metrics are never sampled)
    assert {rec[R.CTX][0] for rec in queued_records} == {"dtensor"}
    otel_torchdist.uninstrument()
    spans = read_spans(os.path.join(folder, "traces.rank0.jsonl"))
    (redistribute,) = [s for s in spans if s["name"] == n.SPAN_REDISTRIBUTE]
    assert redistribute["attributes"][n.SHARD_PLACEMENTS_BEFORE] == ["S(0)"]
    assert redistribute["attributes"][n.SHARD_PLACEMENTS_AFTER] == ["R"]
    assert redistribute["attributes"][n.SHARD_ORIGINAL_SHAPES] == ["[8, 4]"]
    assert redistribute["attributes"][n.SHARD_SHARDED_SHAPES] == ["[2, 4]", "[8, 4]"]
    assert redistribute["attributes"][n.SHARD_MESH_SHAPE] == [4]
    (gather,) = [s for s in spans if s["name"] == "all_gather_single"]
    assert gather["parentSpanId"] == redistribute["spanId"]
    assert gather["attributes"][n.COLL_FRAMEWORK] == "dtensor"
