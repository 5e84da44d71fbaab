"""The loops people write, run for real (``tests/scenarios_frameworks.py``, 2 gloo ranks, gradient
accumulation over 2 micro-batches, every step traced): Lightning (``optimizer.step(closure)``,
``self.log(sync_dist=True)``), Accelerate (``accumulate``), Hugging Face's ``Trainer`` and a
torchtitan-style loop (FSDP2, explicit steps). Lightning, Accelerate and transformers come from the
``frameworks`` extra; a test whose package cannot be imported is skipped and says so."""

from __future__ import annotations

import importlib.util
import os

import pytest

from otel_torchdist import names as n

from .harness import last_metrics, read_spans, run_ranks, trace_layout_problems

ACCUMULATE = 2
CASES = {
    "lightning": "lightning",
    "accelerate": "accelerate",
    "hf_trainer": "transformers",
    "titan_style": None,
}
RUN_IDS = {"lightning": "lightning", "accelerate": "accelerate", "hf_trainer": "hf-trainer", "titan_style": "titan"}


@pytest.fixture(scope="module", params=list(CASES))
def loop(request, tmp_path_factory):
    scenario = request.param
    package = CASES[scenario]
    if package is not None and importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed (pip install -e '.[frameworks]')")
    out = str(tmp_path_factory.mktemp(scenario))
    results = run_ranks(f"scenarios_frameworks:{scenario}", 2, out, {}, timeout=280)
    folder = os.path.join(out, "runs", RUN_IDS[scenario])
    spans = [read_spans(os.path.join(folder, f"traces.rank{r}.jsonl")) for r in range(2)]
    metrics = [last_metrics(os.path.join(folder, f"metrics.rank{r}.jsonl")) for r in range(2)]
    return {"name": scenario, "results": results, "spans": spans, "metrics": metrics, "folder": folder}


def _children(spans: list[dict], parent: dict) -> list[dict]:
    return sorted((s for s in spans if s.get("parentSpanId") == parent["spanId"]), key=lambda s: int(s["startTimeUnixNano"]))


def test_traces_read_right_in_jaeger(loop):
    # one tree per step across ranks: no orphan, no span id twice, every child inside its parent
    assert trace_layout_problems(loop["spans"][0] + loop["spans"][1]) == []


def test_a_step_per_optimizer_step(loop):
    for rank in range(2):
        (point,) = loop["metrics"][rank][n.STEPS_METRIC.name]
        assert int(point.get("asInt", point.get("asDouble", 0))) == loop["results"][rank]["optimizer_steps"]


def test_every_micro_batch_has_its_forward_and_backward_then_the_optimizer(loop):
    for rank in range(2):
        spans = loop["spans"][rank]
        steps = [s for s in spans if s["name"] == n.SPAN_RANK_STEP and s["attributes"].get(n.STEP_COLLECTIVES) is not None]
        counted = [s for s in steps if s["attributes"][n.STEP] <= loop["results"][rank]["optimizer_steps"]]
        assert counted
        for step in counted:
            kids = _children(spans, step)
            order = [s["name"] for s in kids if s["name"] in (*n.SPAN_PHASES.values(), n.SPAN_OPTIMIZER_STEP)]
            assert order == ["train.forward", "train.backward"] * ACCUMULATE + [n.SPAN_OPTIMIZER_STEP], (loop["name"], order)


def test_no_training_work_is_counted_as_the_optimizers(loop):
    for rank in range(2):
        spans = loop["spans"][rank]
        colls = [s for s in spans if n.COLL_OP in s["attributes"]]
        assert colls
        assert [s["name"] for s in colls if s["attributes"].get(n.COLL_PHASE) == "optimizer"] == []
        by_id = {s["spanId"]: s for s in spans}
        under_optimizer = [s["name"] for s in colls if by_id.get(s.get("parentSpanId"), {}).get("name") == n.SPAN_OPTIMIZER_STEP]
        assert under_optimizer == []
        # the gradients' reduction happens in backward: DDP's all-reduce, FSDP's reduce-scatter
        grads = [s for s in colls if s["name"] in ("all_reduce", "reduce_scatter_single") and s["attributes"].get(n.COLL_PHASE) == "backward"]
        assert grads, loop["name"]


@pytest.mark.parametrize("loop", ["lightning"], indirect=True)
def test_lightnings_logged_syncs_are_no_models_forward(loop):
    """``self.log(sync_dist=True)`` in training_step: Lightning calls training_step from its wrapper's
    forward inside DDP's, and the module found on the stack named the collectives ``phase=forward`` of
    ``DistributedDataParallel.module``. They are the step's own (phase other, no module); a module found
    under DDP is named as the user wrote the model."""
    for rank in range(2):
        colls = [s["attributes"] for s in loop["spans"][rank] if n.COLL_OP in s["attributes"]]
        logged = [a for a in colls if a[n.COLL_OP] in ("barrier", "all_reduce") and a.get(n.COLL_PHASE) != "backward"]
        assert logged and all(a.get(n.COLL_PHASE, "other") == "other" and not a.get(n.COLL_MODULE) for a in logged), logged
        assert not [a for a in colls if "DistributedDataParallel" in str(a.get(n.COLL_MODULE, ""))]


def test_accelerates_loader_that_fetches_ahead_gives_a_step_per_optimizer_step(tmp_path):
    """DataLoaderShard reads its loader a batch ahead and hands out an epoch's last batch without a fetch:
    that iteration was counted in the step before it (6 steps for 8 optimizer steps over two epochs). A
    hand-out's own collectives (a shuffled epoch's RNG broadcast) stay inside the step they are in, and an
    evaluation over the training set (BatchSamplerShard on both loaders) is in no training step."""
    if importlib.util.find_spec("accelerate") is None:
        pytest.skip("accelerate is not installed (pip install -e '.[frameworks]')")
    results = run_ranks("scenarios_frameworks:accelerate_epochs", 2, str(tmp_path), {}, timeout=280)
    folder = os.path.join(str(tmp_path), "runs", "accelerate-epochs")
    every = []
    for rank in range(2):
        (point,) = last_metrics(os.path.join(folder, f"metrics.rank{rank}.jsonl"))[n.STEPS_METRIC.name]
        assert int(point["asInt"]) == results[rank]["optimizer_steps"] > 4
        spans = read_spans(os.path.join(folder, f"traces.rank{rank}.jsonl"))
        steps = {s["spanId"] for s in spans if s["name"] == n.SPAN_RANK_STEP}
        per_step = [sum(1 for s in spans if s.get("parentSpanId") == step and s["name"] == n.SPAN_OPTIMIZER_STEP) for step in steps]
        assert per_step.count(1) == results[rank]["optimizer_steps"], per_step
        gathered = [s for s in spans if s["name"] == "all_gather"]  # accelerator.gather on gloo
        assert gathered and not [s for s in gathered if s.get("parentSpanId") in steps]
        every += spans
    assert trace_layout_problems(every) == []
