"""Real 2-rank gloo DDP jobs whose script sets global SDK providers with exporters of its own (not OTLP):
``instrument()`` with no options sends everything through them, and every rank's spans form whole trees."""

from __future__ import annotations

import json
import os

from otel_torchdist import names as n

from .harness import run_ranks
from .scenarios_otel import SERVICE


def _spans(out: str, world: int) -> list[dict]:
    spans = []
    for rank in range(world):
        with open(os.path.join(out, f"spans.rank{rank}.jsonl")) as f:
            spans += [dict(json.loads(line), rank=rank) for line in f]
    return spans


def _last_metrics(out: str, rank: int) -> dict[str, list[dict]]:
    with open(os.path.join(out, f"metrics.rank{rank}.jsonl")) as f:
        last = [json.loads(line) for line in f][-1]
    by_name: dict[str, list[dict]] = {}
    for p in last:
        by_name.setdefault(p["name"], []).append(p)
    return by_name


def _children(spans: list[dict], parent: dict) -> list[dict]:
    return [s for s in spans if s["parent"] == parent["span"] and s["trace"] == parent["trace"]]


def test_global_providers_get_each_step_of_every_rank_as_one_tree(tmp_path):
    out = str(tmp_path / "out")
    run_ranks("scenarios_otel:global_providers", 2, out, {"steps": 4})
    spans = _spans(out, 2)
    ids = {(s["trace"], s["span"]) for s in spans}
    for s in spans:
        assert s["resource"]["service.name"] == SERVICE  # the script's Resource, not the library's own
        assert s["attributes"][n.RANK] == s["rank"]
        assert s["parent"] is None or (s["trace"], s["parent"]) in ids, f"dangling parent: {s['name']} on rank {s['rank']}"
    roots = [s for s in spans if s["name"] == n.SPAN_STEP]
    assert roots and {s["rank"] for s in roots} == {0}
    for root in roots:
        rank_steps = _children(spans, root)
        assert sorted(s["rank"] for s in rank_steps) == [0, 1], root["attributes"][n.STEP]
    # The optimizer-closed steps 1..4: each rank's DDP gradient all-reduce lies in that rank's step.
    traced = [r for r in roots if 1 <= r["attributes"][n.STEP] <= 4]
    for root in traced:
        for rank_step in _children(spans, root):
            under = [s for s in spans if s["trace"] == root["trace"] and s["rank"] == rank_step["rank"]]
            assert any(s["name"] == "allreduce" or s["name"] == "all_reduce" for s in under), [s["name"] for s in under]

    for rank in range(2):
        metrics = _last_metrics(out, rank)
        calls = {p["attributes"][n.M_OP]: p for p in metrics[n.COLLECTIVE_CALLS.name]}
        durations = {p["attributes"][n.M_OP]: p for p in metrics[n.COLLECTIVE_DURATION.name]}
        assert calls and set(calls) == set(durations)
        for op, point in calls.items():
            assert point["attributes"][n.M_RANK] == str(rank) and point["resource"]["service.name"] == SERVICE
            assert durations[op]["count"] == point["value"], op  # every duration recorded, none sampled away


def test_explicit_steps_inside_the_scripts_spans_are_children_of_them_and_linked_to_the_step(tmp_path):
    out = str(tmp_path / "out")
    run_ranks("scenarios_otel:global_providers", 2, out, {"steps": 3, "user_spans": True})
    spans = _spans(out, 2)
    by_id = {(s["trace"], s["span"]): s for s in spans}
    for s in spans:
        assert s["parent"] is None or (s["trace"], s["parent"]) in by_id, f"dangling parent: {s['name']} on rank {s['rank']}"
    for rank in range(2):
        iterations = [s for s in spans if s["name"] == "iteration" and s["rank"] == rank]
        assert len(iterations) == 3
        for i, it in enumerate(iterations, 1):
            (step,) = [s for s in spans if s["name"] == n.SPAN_RANK_STEP and s["attributes"][n.STEP] == i and s["rank"] == rank]
            under = {s["name"] for s in _children(spans, step)}
            assert {"my.forward", n.SPAN_OPTIMIZER_STEP} <= under, under
            (link,) = step["links"]
            if i == 1:
                # Step 1 was open from instrument() on (DDP's set-up is in it, in the step's shared trace): it
                # stays there, under the step's root, and links to the iteration span it was marked in.
                assert link == [it["trace"], it["span"]] and step["parent"] is not None
                assert by_id[(step["trace"], step["parent"])]["name"] == n.SPAN_STEP
                continue
            assert (step["trace"], step["parent"]) == (it["trace"], it["span"])
            root = by_id[tuple(link)]  # the step's root, made by rank 0 in the step's shared trace
            assert root["name"] == n.SPAN_STEP and root["rank"] == 0
            assert root["attributes"][n.STEP] == step["attributes"][n.STEP]
