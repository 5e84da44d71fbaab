"""Every training path in real 2- and 4-rank gloo jobs: DDP, FSDP2, FSDP1, tensor parallel, optimizers.

The jobs live in ``tests/scenarios_training.py``; each runs once per world size (module-scoped fixtures)
and the tests read what every rank exported, comparing with the reducer's own buckets, CommDebugMode and
torch.profiler on the same run.
"""

from __future__ import annotations

import math
import os
from collections import Counter

import pytest

from otel_torchdist import names as n

from .harness import last_metrics, read_spans, run_ranks, trace_layout_problems


def _job(tmp_path_factory, scenario: str, ws: int, run_prefix: str, args: dict | None = None):
    out = str(tmp_path_factory.mktemp(f"{scenario}{ws}"))
    results = run_ranks(f"scenarios_training:{scenario}", ws, out, args or {})
    folder = os.path.join(out, "runs", f"{run_prefix}-ws{ws}")
    spans = [read_spans(os.path.join(folder, f"traces.rank{r}.jsonl")) for r in range(ws)]
    return {"ws": ws, "results": results, "spans": spans, "folder": folder}


def _collectives(spans):
    return [s for s in spans if n.COLL_OP in s["attributes"]]


def _a(span, key):
    return span["attributes"].get(key)


# ------------------------------------------------------------------------------------------------ DDP
# DDP's buckets are recorded two ways (capture/ddp.py): the trampoline comm hook ("hook": native="off") and,
# with the native part built, the native process group under the reducer ("native"). Each job runs both.
MODES = {"hook": "off", "native": "auto"}


@pytest.fixture(scope="module", params=[(2, "hook"), (4, "hook"), (2, "native"), (4, "native")], ids=lambda p: f"ws{p[0]}-{p[1]}")
def ddp_job(request, tmp_path_factory):
    ws, mode = request.param
    if mode == "native":
        request.getfixturevalue("native_built")
    job = _job(tmp_path_factory, "ddp", ws, f"ddp-{MODES[mode]}", {"steps": 3, "native": MODES[mode]})
    job["mode"] = mode
    return job


def test_ddp_results_are_bit_identical_instrumented(ddp_job):
    for result in ddp_job["results"]:
        assert result["native_attached"] is (ddp_job["mode"] == "native")
        assert result["identical"], f"DDP parameters differ instrumented ({ddp_job['mode']})"
        assert result["identical_with_hook"], "a user comm hook changed results"
        assert result["recorded_after_uninstrument"] == 0


@pytest.fixture(scope="module", params=("hook", "native"))
def numerics_job(request, tmp_path_factory):
    if request.param == "native":
        request.getfixturevalue("native_built")
    job = _job(tmp_path_factory, "ddp_numerics", 3, f"numerics-{MODES[request.param]}", {"native": MODES[request.param]})
    job["mode"] = request.param
    return job


def test_ddp_results_are_bit_identical_instrumented_on_three_ranks(numerics_job):
    """A group size that is not a power of two tells scaling by its reciprocal (DDP without a hook) from
    dividing by it (torch's allreduce_hook, DDP's builtin C++ hook): a third of the values differ in the
    last bit. The trampoline must do what the model did uninstrumented; the native group, which leaves the
    reducer's own path as it is, too, where the reducer issues collectives of its own through it."""
    for rank, result in enumerate(numerics_job["results"]):
        assert result["identical"] == {
            "no hook": True,
            "gradient_as_bucket_view": True,
            "builtin ALLREDUCE hook": True,
            "find_unused_parameters": True,
            "static_graph": True,
            "Join, uneven inputs": True,
            "Join, divided by the ranks left": True,
            "sparse gradients": True,
        }, rank


def test_join_records_every_all_reduce(numerics_job):
    """Uneven inputs under Join (rank r trains 2 + r steps, find_unused_parameters=True): a rank done with
    its inputs shadows the others' bucket all-reduces (through the trampoline, or the native group when DDP
    has no hook), their used-parameter map all-reduce (ProcessGroup.allreduce, called directly) and Join's
    own all-reduces. Against torch.profiler on the same run: the native group records every all-reduce;
    the trampoline all but the map all-reduce each rank's reducer issues from C++ in its own backward
    passes, one a step, which no Python hook sees."""
    folder = numerics_job["folder"].replace("numerics-", "join-")
    native = numerics_job["mode"] == "native"
    for rank, result in enumerate(numerics_job["results"]):
        metrics = last_metrics(os.path.join(folder, f"metrics.rank{rank}.jsonl"))
        recorded = sum(int(p["asInt"]) for p in metrics[n.COLLECTIVE_CALLS.name] if p["attributes"]["op"] == "all_reduce")
        unseen = 0 if native else result["join_steps"]
        assert result["join_profiler_all_reduces"] - recorded == unseen, (rank, recorded, result)
    spans = [read_spans(os.path.join(folder, f"traces.rank{r}.jsonl")) for r in range(3)]
    shadowed = [
        [s for s in _collectives(spans[r]) if _a(s, n.COLL_SOURCE) == "process_group" and _a(s, n.COLL_OP) == "all_reduce"]
        for r in range(3)
    ]  # fmt: skip
    # rank 0 finishes two steps before rank 2, rank 1 one step; rank 2 never waits for the others
    assert [len(x) for x in shadowed] == [2, 1, 0]
    assert all(_a(s, n.COLL_FRAMEWORK) == "ddp" and _a(s, n.COLL_PHASE) == "backward" for x in shadowed for s in x)
    if native:
        # Each rank's reducer issued its map all-reduce through the native group, once a backward (int32).
        for rank, result in enumerate(numerics_job["results"]):
            maps = [
                s for s in _collectives(spans[rank])
                if _a(s, n.COLL_SOURCE) == "ddp_reducer" and _a(s, n.COLL_DTYPE) == "int32" and s["name"] == "all_reduce"
            ]  # fmt: skip
            assert len(maps) == result["join_steps"], rank
            assert {_a(s, n.COLL_PHASE) for s in maps} == {"backward"}
        # Every rank passes 2 + 2 times over its buckets: in its own backward passes, then (a rank out of
        # inputs) all-reducing zero buckets through the reducer for each step it shadows. Each pass's
        # buckets are numbered from 0, its last one marked.
        for rank in range(3):
            buckets = sorted(
                (s for s in _collectives(spans[rank])
                 if _a(s, n.COLL_SOURCE) == "ddp_reducer" and _a(s, n.COLL_DTYPE) == "float32"),
                key=lambda s: int(s["startTimeUnixNano"]),
            )  # fmt: skip
            assert sum(1 for s in buckets if _a(s, n.DDP_BUCKET_LAST)) == 2 + 2, rank
            expected = 0
            for s in buckets:
                assert _a(s, n.DDP_BUCKET_INDEX) == expected, rank
                expected = 0 if _a(s, n.DDP_BUCKET_LAST) else expected + 1
            assert expected == 0  # the last pass ended with its last bucket


def test_ddp_bucket_records_match_the_reducers_buckets(ddp_job):
    native = ddp_job["mode"] == "native"
    for rank in range(ddp_job["ws"]):
        result = ddp_job["results"][rank]
        sizes = result["rebuilt_bucket_sizes"]
        assert len(sizes) >= 2, "the test model should need more than one bucket"
        ours = [
            s for s in _collectives(ddp_job["spans"][rank])
            if _a(s, n.COLL_FRAMEWORK) == "ddp" and _a(s, n.COLL_GROUP_DESC) == "default_pg"
        ]  # fmt: skip
        buckets = [s for s in ours if s["name"] == "all_reduce"]
        # The bucket rebuild's broadcasts, which the reducer issues itself: the native group records them.
        rebuild = [s for s in ours if s["name"] == "broadcast"]
        assert len(rebuild) == (result["profiler_broadcasts"] if native else 0) and (rebuild or not native)
        assert all(_a(s, n.COLL_PHASE) == "forward" and _a(s, n.COLL_SOURCE) == "ddp_reducer" for s in rebuild)
        # Iteration 0 reduces one bucket with every gradient; the reducer then rebuilds its buckets.
        assert len(buckets) == result["profiler_all_reduces"]  # torch.profiler saw as many on the same steps
        first = [s for s in buckets if _a(s, n.DDP_BUCKET_BYTES) == sum(sizes)]
        rest = [s for s in buckets if s not in first]
        assert len(first) == 1
        assert len(rest) == len(sizes) * (result["steps"] - 1)
        by_index = Counter((_a(s, n.DDP_BUCKET_INDEX), _a(s, n.DDP_BUCKET_BYTES)) for s in rest)
        assert by_index == {(i, size): result["steps"] - 1 for i, size in enumerate(sizes)}
        for s in buckets:
            assert s["name"] == "all_reduce"
            assert _a(s, n.COLL_PHASE) == "backward"
            assert _a(s, n.COLL_MESSAGE_SIZE) == _a(s, n.DDP_BUCKET_BYTES)
            assert _a(s, n.COLL_END_SOURCE) == "future"
            if native:
                assert _a(s, n.COLL_SOURCE) == "ddp_reducer"
                assert n.DDP_BUCKET_PARAMS not in s["attributes"]  # the reducer's buckets are not Python's to read
            else:
                assert _a(s, n.DDP_BUCKET_PARAMS) >= 1
                assert _a(s, n.COLL_SOURCE) == "ddp_hook"  # recorded by the trampoline itself, not via c10d
        lasts = [s for s in rest if _a(s, n.DDP_BUCKET_LAST)]
        assert {_a(s, n.DDP_BUCKET_INDEX) for s in lasts} == {len(sizes) - 1}


def test_ddp_moved_to_another_group_reduces_its_buckets_there(ddp_job):
    """DistributedDataParallel._update_process_group: the trampoline's all-reduce follows the model (it
    went on reducing over the old group)."""
    source = "ddp_reducer" if ddp_job["mode"] == "native" else "ddp_hook"
    for rank in range(ddp_job["ws"]):
        moved = [s for s in _collectives(ddp_job["spans"][rank]) if _a(s, n.COLL_GROUP_DESC) == "moved"]
        buckets = [s for s in moved if _a(s, n.COLL_SOURCE) == source and s["name"] == "all_reduce"]
        assert len(buckets) >= 2  # a bucket or more in each of the two steps after the move
        assert {_a(s, n.COLL_PHASE) for s in buckets} == {"backward"}


def test_user_comm_hook_keeps_working_and_is_measured(ddp_job):
    ws = ddp_job["ws"]
    for rank in range(ws):
        result = ddp_job["results"][rank]
        hooked = [s for s in _collectives(ddp_job["spans"][rank]) if _a(s, n.COLL_GROUP_DESC) == "hooked"]
        bucket_records = [s for s in hooked if _a(s, n.COLL_FRAMEWORK) == "ddp" and s["name"] == "all_reduce"]
        assert result["hook_calls"] == len(bucket_records) > 0
        assert {_a(s, n.COLL_SOURCE) for s in bucket_records} == {"c10d"}
        # The trampoline's own records and those of the general path say the same things about a bucket.
        own = next(
            s for s in _collectives(ddp_job["spans"][rank])
            if _a(s, n.COLL_GROUP_DESC) == "default_pg" and _a(s, n.COLL_FRAMEWORK) == "ddp" and s["name"] == "all_reduce"
        )  # fmt: skip
        general = bucket_records[-1]
        native_lacks = {n.DDP_BUCKET_PARAMS} if ddp_job["mode"] == "native" else set()
        assert set(own["attributes"]) == set(general["attributes"]) - native_lacks
        for key in (n.COLL_OP, n.COLL_PHASE, n.COLL_ASYNC, n.COLL_DTYPE, n.COLL_REDUCE_OP, n.COLL_END_SOURCE):
            assert _a(own, key) == _a(general, key), key
        assert result["second_registration"] == "register_comm_hook or register_builtin_comm_hook can only be called once."


def test_ddp_configuration_and_model_recorded_once_per_model(ddp_job):
    spans = ddp_job["spans"][0]
    inits = [s for s in spans if s["name"] == n.SPAN_DDP_INIT]
    assert len(inits) == 4  # the plain one was built before instrument(): four instrumented models
    a = inits[0]["attributes"]
    assert a[n.MODEL_CLASS] == "Sequential"
    assert a[n.MODEL_PARAMS] == a[n.MODEL_TRAINABLE] == 16 * 64 + 64 + 64 * 64 + 64 + 64 * 4 + 4
    assert a[n.MODEL_PARAM_BYTES] == 4 * a[n.MODEL_PARAMS]
    assert a[n.DDP_FIND_UNUSED] is False and a[n.DDP_BROADCAST_BUFFERS] is True
    assert a[n.DDP_BUCKET_CAP_MB] == pytest.approx(0.01, rel=1e-3)
    metrics = last_metrics(os.path.join(ddp_job["folder"], "metrics.rank0.jsonl"))
    params = {p["attributes"]["kind"]: int(p["asInt"]) for p in metrics[n.MODEL_PARAMETERS.name]}
    assert params == {"total": a[n.MODEL_PARAMS], "trainable": a[n.MODEL_PARAMS]}
    assert n.DDP_BACKWARD_COMM.name in metrics  # DDP's own logging data, read while training


# ----------------------------------------------------------------------------------------------- FSDP
@pytest.fixture(scope="module", params=(2, 4), ids=lambda ws: f"ws{ws}")
def fsdp2_job(request, tmp_path_factory):
    return _job(tmp_path_factory, "fsdp2", request.param, "fsdp2", {"steps": 2})


def test_fsdp2_collectives_carry_their_unit_and_match_the_profiler(fsdp2_job):
    for rank in range(fsdp2_job["ws"]):
        colls = _collectives(fsdp2_job["spans"][rank])
        assert colls and all(_a(s, n.COLL_FRAMEWORK) == "fsdp" for s in colls)
        units = Counter((s["name"], _a(s, n.COLL_MODULE), _a(s, n.COLL_PHASE)) for s in colls)
        steps = 2
        for unit in ("Sequential.0", "Sequential.2", "Sequential.4"):  # the blocks with parameters, full paths
            assert units[("all_gather_single", unit, "forward")] == steps
            assert units[("all_gather_single", unit, "backward")] == steps  # re-gathered for backward
            assert units[("reduce_scatter_single", unit, "backward")] == steps
        assert sum(units.values()) == len(colls)
        # torch.profiler's gloo events on the same steps (gloo reduce-scatters with an all-reduce)
        profiler = fsdp2_job["results"][rank]["profiler_counts"]
        ours = Counter(s["name"] for s in colls)
        assert profiler == {
            "gloo:all_gather": ours["all_gather_single"],
            "gloo:all_reduce": ours["reduce_scatter_single"],
        }
        for s in colls:
            assert _a(s, n.FSDP_ACTION) == ("unshard" if s["name"] == "all_gather_single" else "reduce_scatter")


def test_fully_shard_recorded_with_unsharded_and_sharded_shapes(fsdp2_job):
    ws = fsdp2_job["ws"]
    shards = [s for s in fsdp2_job["spans"][0] if s["name"] == n.SPAN_FULLY_SHARD]
    assert len(shards) == 3
    originals = [tuple(_a(s, n.SHARD_ORIGINAL_SHAPES)) for s in shards]
    assert originals == [("[64, 16]", "[64]"), ("[64, 64]", "[64]"), ("[4, 64]", "[4]")]
    for s in shards:
        for orig, sharded in zip(_a(s, n.SHARD_ORIGINAL_SHAPES), _a(s, n.SHARD_SHARDED_SHAPES)):
            rows = eval(orig)[0]
            assert eval(sharded)[0] == -(-rows // ws)  # dim 0 split over the ranks, rounded up
        assert _a(s, n.SHARD_MESH_SHAPE) == [ws]


@pytest.fixture(scope="module")
def fsdp1_job(tmp_path_factory):
    return _job(tmp_path_factory, "fsdp1", 2, "fsdp1", {"steps": 2})


def test_fsdp1_collectives_carry_their_unit(fsdp1_job):
    colls = _collectives(fsdp1_job["spans"][0])
    units = Counter((_a(s, n.COLL_MODULE), _a(s, n.FSDP_ACTION), _a(s, n.COLL_PHASE)) for s in colls)
    for unit in ("Sequential.0", "Sequential.2", "Sequential.4"):
        assert units[(unit, "unshard", "forward")] == units[(unit, "unshard", "backward")] == 2  # two steps
        assert units[(unit, "reduce_scatter", "backward")] == 2
        # after training: summon_full_params, then a full state dict, each unshards every unit once
        assert units[(unit, "unshard", "other")] == 2
    assert sum(units.values()) == len(colls) == 24
    assert all(_a(s, n.COLL_FRAMEWORK) == "fsdp1" for s in colls)
    # torch.profiler's gloo events over the unshards after training
    outside = Counter(s["name"] for s in colls if _a(s, n.COLL_PHASE) == "other")
    assert fsdp1_job["results"][0]["profiler_counts"] == {"gloo:all_gather": outside["all_gather"]} == {"gloo:all_gather": 6}
    wraps = [s for s in fsdp1_job["spans"][0] if s["name"] == n.SPAN_FSDP_WRAP]
    # each unit's own parameters: the root wraps only the three inner units (whose FlatParameters, already
    # sharded when it is wrapped, are not its own)
    assert sorted(_a(s, n.SHARD_PARAMS) for s in wraps) == [0, 64 * 4 + 4, 16 * 64 + 64, 64 * 64 + 64]


# ------------------------------------------------------------------------------------ tensor parallel
@pytest.fixture(scope="module", params=(2, 4), ids=lambda ws: f"ws{ws}")
def tp_job(request, tmp_path_factory):
    return _job(tmp_path_factory, "tensor_parallel", request.param, "tp", {"steps": 2})


# Our op names as CommDebugMode names them: functional collectives, and the c10d ops FSDP2 and DDP issue
_FUNCOL = {"all_gather_single": "all_gather_into_tensor", "all_gather_tensor": "all_gather_into_tensor", "reduce_scatter_single": "reduce_scatter_tensor"}
_C10D = {"all_gather_single": "_allgather_base_", "reduce_scatter_single": "_reduce_scatter_base_", "all_reduce": "allreduce_", "broadcast": "broadcast_"}


def _cdm_op(span) -> str:
    if _a(span, n.COLL_FRAMEWORK) in ("fsdp", "ddp", "c10d"):
        return "c10d." + _C10D[span["name"]]
    return "c10d_functional." + _FUNCOL.get(span["name"], span["name"])


def _hierarchical(spans, containers: tuple = ()) -> dict:
    """Our collectives counted per module and phase the way CommDebugMode counts: each module's count
    includes its submodules', and 'Global' holds everything. CommDebugMode's parents are the modules whose
    forward ran: ``containers`` (a ModuleList, never called) are not among them."""
    out: dict = {}
    for s in spans:
        module = _a(s, n.COLL_MODULE)
        phase = _a(s, n.COLL_PHASE)
        op = _cdm_op(s)
        names = ["Global"]
        if module:
            parts = module.split(".")
            names += [".".join(parts[: i + 1]) for i in range(len(parts))]
        for name in (m for m in names if m not in containers):
            slot = out.setdefault(name, {}).setdefault(phase, {})
            slot[op] = slot.get(op, 0) + 1
    return out


def _theirs(result: dict, drop=lambda module, phase, op: False, rename=lambda module: module) -> dict:
    """CommDebugMode's per-module counts with empty phases left out (and ``drop``'s ops)."""
    out: dict = {}
    for module, phases in result["module_counts"].items():
        for phase, ops in phases.items():
            kept = {op: c for op, c in ops.items() if c and not drop(module, phase, op)}
            if kept:
                out.setdefault(rename(module), {})[phase] = kept
    return out


def _training(spans) -> list:
    return [s for s in _collectives(spans) if _a(s, n.COLL_PHASE) in ("forward", "backward")]


def test_tp_per_module_per_phase_counts_equal_comm_debug_modes(tp_job):
    for rank in range(tp_job["ws"]):
        result = tp_job["results"][rank]
        training = _training(tp_job["spans"][rank])
        assert _hierarchical(training) == _theirs(result)
        assert sum(Counter(s["name"] for s in training).values()) == sum(result["comm_counts"].values())


@pytest.fixture(scope="module", params=("before", "local_import", "after", "reentrant", "non_reentrant"))
def tp_grad_job(request, tmp_path_factory):
    """The TP MLP with an input that requires grad (backward all-reduces it), parallelized in each order, and
    under activation checkpointing of each kind."""
    run = f"tp-{request.param.replace('_', '-')}"
    args = {"steps": 2, "input_grad": True, "run": run}
    if request.param.endswith("reentrant"):
        args["checkpoint"] = request.param
    else:
        args["order"] = request.param
    return _job(tmp_path_factory, "tensor_parallel", 2, run, args)


def test_tp_backward_and_any_order_count_per_module_and_phase_as_comm_debug_mode(tp_grad_job):
    """Forward and backward collectives name their module as CommDebugMode does (TPMLP.net2 forward,
    TPMLP.net1 backward), whether the model was parallelized before instrument(), through a
    parallelize_module imported before it, or after it; under activation checkpointing the recomputation's
    all-reduce (TPMLP.net2) is backward's, where it was labelled forward."""
    for rank in range(tp_grad_job["ws"]):
        result = tp_grad_job["results"][rank]
        training = _training(tp_grad_job["spans"][rank])
        theirs = _theirs(result)
        assert theirs.get("TPMLP.net1", {}).get("backward"), theirs  # the oracle sees the backward all-reduce
        assert _hierarchical(training) == theirs
        assert sum(Counter(s["name"] for s in training).values()) == sum(result["comm_counts"].values())


@pytest.fixture(scope="module", params=[("tp", 2), ("dp_tp", 4)], ids=lambda p: f"{p[0]}-ws{p[1]}")
def transformer_job(request, tmp_path_factory):
    """A two-block transformer parallelized before instrument(): tensor + sequence parallel on 2 ranks, and
    FSDP2 over it on a 2 x 2 mesh of 4 ranks."""
    mesh, ws = request.param
    job = _job(tmp_path_factory, "transformer", ws, f"transformer-{mesh}", {"mesh": mesh, "steps": 2})
    job["mesh"] = mesh
    return job


def _fsdp_served(module: str, phase: str, op: str) -> bool:
    """CommDebugMode's counts of what FSDP2 issues: its all-gathers and reduce-scatters, and in its
    post-backward the all-reduce of the gradients tensor parallel leaves partial (the norms' weights; tensor
    parallel itself all-reduces nothing in forward or backward here, the tp run shows it)."""
    return op.startswith("c10d.") or (op == "c10d_functional.all_reduce" and phase == "backward")


def test_transformer_counts_per_module_and_phase_as_comm_debug_mode(transformer_job):
    """Tensor and sequence parallel collectives name their module as CommDebugMode does (the attention's
    input all-gather 'Transformer.layers.0.attn' forward, its gradient's reduce-scatter
    'Transformer.layers.0.attn.wq' backward), with FSDP2 over them too. FSDP2's own collectives name the unit
    they serve, as FSDP's own profiler labels do ('FSDP::all_gather (layers.0)'): CommDebugMode charges
    them to whichever module's backward began last (the block still running for the next block's
    prefetched all-gather, the block's first norm for its reduce-scatter), so there it is not the oracle."""
    for rank in range(transformer_job["ws"]):
        result = transformer_job["results"][rank]
        training = _training(transformer_job["spans"][rank])
        assert _hierarchical(training)["Global"] == _theirs(result)["Global"]  # every collective, every phase
        tp = [s for s in training if _a(s, n.FSDP_ACTION) is None]
        theirs = _theirs(result, drop=_fsdp_served, rename=lambda m: m.replace("FSDPTransformer", "Transformer", 1))
        assert theirs.get("Transformer.layers.0.attn", {}).get("forward"), theirs  # the input all-gather
        assert theirs.get("Transformer.layers.1.ffn.w1", {}).get("backward"), theirs  # its gradient's reduce-scatter
        assert _hierarchical(tp, containers=("Transformer.layers",)) == theirs
        fsdp = Counter((_a(s, n.COLL_MODULE), _a(s, n.COLL_PHASE), s["name"]) for s in training if _a(s, n.FSDP_ACTION))
        profiler_op = {"c10d::_allgather_base_": "all_gather_single", "c10d::_reduce_scatter_base_": "reduce_scatter_single",
                       "_c10d_functional::all_reduce": "all_reduce"}  # fmt: skip
        labels = Counter((f"Transformer.{unit}" if unit else "Transformer", phase, profiler_op[op]) for unit, phase, op in result["fsdp_labels"])
        assert fsdp == labels
        assert bool(fsdp) == (transformer_job["mesh"] == "dp_tp")


@pytest.fixture(scope="module", params=["hook", "native"])
def ddp_cdm_job(request, tmp_path_factory):
    if request.param == "native":
        request.getfixturevalue("native_built")
    native = MODES[request.param]
    job = _job(tmp_path_factory, "ddp_comm_debug", 2, f"ddp-cdm-{native}", {"native": native, "steps": 2})
    job["mode"] = request.param
    return job


def test_ddp_collectives_name_the_model_and_count_as_comm_debug_mode(ddp_cdm_job):
    """DDP's buckets and its bucket rebuild's broadcasts name the model as the user wrote it (Sequential;
    CommDebugMode: DistributedDataParallel), counted per phase as CommDebugMode counts them. A bucket holds
    gradients of several layers: CommDebugMode's split by the layer whose backward was running is not kept
    (it takes hooks on every module of the model). The rebuild's broadcasts, which the reducer issues in
    C++, are seen with the native part only (test_ddp_bucket_records_match_the_reducers_buckets)."""
    for rank in range(2):
        result = ddp_cdm_job["results"][rank]
        spans = _collectives(ddp_cdm_job["spans"][rank])
        assert all(_a(s, n.COLL_MODULE) == "Sequential" and _a(s, n.COLL_FRAMEWORK) == "ddp" for s in spans), spans
        ours = _hierarchical(_training(ddp_cdm_job["spans"][rank]))["Sequential"]
        theirs = _theirs(result)["DistributedDataParallel"]
        if ddp_cdm_job["mode"] == "hook":
            theirs = {p: {op: c for op, c in ops.items() if op != "c10d.broadcast_"} for p, ops in theirs.items()}
            theirs = {p: ops for p, ops in theirs.items() if ops}
        assert ours == theirs and "backward" in ours
        # the setup's broadcast from rank 0 is the model's as well
        assert [_a(s, n.COLL_PHASE) for s in spans if s["name"] == "_broadcast_coalesced"] == ["other"]


def test_collectives_a_model_issues_itself_name_their_module(tmp_path_factory):
    """Hand-written model parallelism of Megatron's kind, in modules no framework wrapped: a row-parallel
    linear's all-reduce in forward, a column-parallel linear's input-gradient all-reduce in the backward of
    its autograd function, and a functional all-gather. Each names the module whose forward issued it or
    applied its function, counted per module and phase as CommDebugMode counts them; compiled, in the deep
    mode, the model compiled."""
    job = _job(tmp_path_factory, "hand_parallel", 2, "hand")
    for rank in range(2):
        assert job["results"][rank]["capture_errors"] == {}
        spans = _collectives(job["spans"][rank])
        eager = [s for s in spans if _a(s, n.COLL_SOURCE) != "deep"]
        theirs = _theirs(job["results"][rank])
        assert theirs["HandParallel.col"] == {"backward": {"c10d.allreduce_": 2}}, theirs
        assert _hierarchical(eager) == theirs
        assert {_a(s, n.COLL_MODULE) for s in eager} == {"HandParallel.col", "HandParallel.gather", "HandParallel.row"}
        compiled = Counter((s["name"], _a(s, n.COLL_MODULE), _a(s, n.COLL_PHASE)) for s in spans if _a(s, n.COLL_SOURCE) == "deep")
        # the compiled backward runs as the compiled function's autograd node: the model's, as in forward
        assert compiled == {
            ("all_reduce", "HandParallel", "forward"): 2,
            ("all_gather_into_tensor", "HandParallel", "forward"): 2,
            ("all_reduce", "HandParallel", "backward"): 2,
        }


def test_functional_collectives_end_at_their_wait_even_through_a_view(tp_job):
    for rank in range(tp_job["ws"]):
        spans = _collectives(tp_job["spans"][rank])
        marks = tp_job["results"][rank]["funcol"]
        training = [s for s in spans if _a(s, n.COLL_PHASE) in ("forward", "backward")]
        assert {_a(s, n.COLL_END_SOURCE) for s in training} <= {"wait", "return"}, "a TP wait was missed"
        viewed = [s for s in spans if int(s["startTimeUnixNano"]) >= marks["view_issued"] and s["name"] == "all_reduce"]
        assert len(viewed) == 1
        assert _a(viewed[0], n.COLL_END_SOURCE) == "wait"
        # ended at the wait, after the 50 ms sleep (clock slack: 10 ms)
        assert marks["view_issued"] + 50e6 <= int(viewed[0]["endTimeUnixNano"]) <= marks["view_waited"] + 10e6
        assert _a(viewed[0], n.FUNCOL_WAIT_S) is not None
        dropped = [s for s in spans if int(s["startTimeUnixNano"]) >= marks["view_waited"]]
        assert [s["name"] for s in dropped] == ["all_gather_tensor"]
        # c10d's work registry keeps the output until it is waited, so nothing completes it: uninstrument()
        # ends it, and says so
        assert _a(dropped[0], n.COLL_END_SOURCE) == "unfinished"


def test_sharding_spans_carry_original_and_shard_shapes(tp_job):
    ws = tp_job["ws"]
    spans = tp_job["spans"][0]
    top = [s for s in spans if s["name"] == n.SPAN_DISTRIBUTE_TENSOR and _a(s, n.SHARD_ORIGINAL_SHAPES) == ["[8, 4]"]]
    by_placement = {tuple(_a(s, n.SHARD_PLACEMENTS_AFTER)): _a(s, n.SHARD_SHARDED_SHAPES) for s in top}
    assert by_placement == {("S(0)",): [f"[{8 // ws}, 4]"], ("S(1)",): [f"[8, {4 // ws}]"], ("R",): ["[8, 4]"]}
    for s in top:
        assert _a(s, n.SHARD_MESH_SHAPE) == [ws] and _a(s, n.SHARD_MESH_DIMS) == ["tp"]
    (plan,) = [s for s in spans if s["name"] == n.SPAN_PARALLELIZE_MODULE and _a(s, n.SHARD_MODULE) == "TPMLP"]
    assert _a(plan, n.SHARD_PLAN) == ["net1=ColwiseParallel", "net2=RowwiseParallel"]
    redis = [s for s in spans if s["name"] == n.SPAN_REDISTRIBUTE and _a(s, n.SHARD_PLACEMENTS_BEFORE) == ["S(0)"]]
    (last,) = [s for s in redis if _a(s, n.SHARD_PLACEMENTS_AFTER) == ["R"] and _a(s, n.SHARD_ORIGINAL_SHAPES) == ["[8, 4]"]]
    assert _a(last, n.SHARD_SHARDED_SHAPES) == [f"[{8 // ws}, 4]", "[8, 4]"]
    # the all-gather it issued is its child
    children = [s for s in spans if s.get("parentSpanId") == last["spanId"]]
    assert [s["name"] for s in children] == ["all_gather_single"]
    assert _a(children[0], n.COLL_FRAMEWORK) == "dtensor"


# ------------------------------------------------------------------------------------------ optimizers
@pytest.fixture(scope="module")
def optim_job(tmp_path_factory):
    return _job(tmp_path_factory, "optimizers", 2, "optim", {"steps": 3})


def test_one_optimizer_step_span_per_step(optim_job):
    spans = optim_job["spans"][0]
    steps = [s for s in spans if s["name"] == n.SPAN_OPTIMIZER_STEP]
    classes = Counter(_a(s, n.OPT_CLASS) for s in steps)
    # SGD 3 (+1 after the failed step), Adam foreach and fused 3 each, ZeRO 3 (not 6), subclass 3 (not 6)
    assert classes == {"SGD": 4, "Adam": 6, "ZeroRedundancyOptimizer": 3, "Subclassed": 3}
    zero = [s for s in steps if _a(s, n.OPT_CLASS) == "ZeroRedundancyOptimizer"]
    assert all(_a(s, n.OPT_INNER_CLASS) == "Adam" for s in zero)
    assert [_a(s, n.OPT_STEP) for s in zero] == [1, 2, 3]
    sgd = [s for s in steps if _a(s, n.OPT_CLASS) == "SGD"]
    assert _a(sgd[0], n.OPT_LR) == [0.1] and _a(sgd[0], n.OPT_MOMENTUM) == [0.9]
    assert _a(sgd[-1], n.OPT_STEP) == 4  # the failed Broken.step did not leave the capture stuck
    adam = [s for s in steps if _a(s, n.OPT_CLASS) == "Adam"]
    assert _a(adam[0], n.OPT_BETAS) == ["0.9,0.999"]
    assert all(_a(s, n.OPT_PARAMS) == 5508 for s in steps)


def test_collectives_inside_a_step_are_its_children(optim_job):
    spans = optim_job["spans"][0]
    by_id = {s["spanId"]: s for s in spans}
    broadcasts = [s for s in spans if s["name"] == "broadcast"]
    assert broadcasts
    for s in broadcasts:
        parent = by_id[s["parentSpanId"]]
        assert parent["name"] == n.SPAN_OPTIMIZER_STEP and _a(parent, n.OPT_CLASS) == "ZeroRedundancyOptimizer"
        assert _a(s, n.COLL_PHASE) == "optimizer"
        assert parent["traceId"] == s["traceId"]


def test_optimizer_step_histogram(optim_job):
    from .harness import last_metrics

    metrics = last_metrics(os.path.join(optim_job["folder"], "metrics.rank0.jsonl"))
    counts = {p["attributes"]["optimizer"]: int(p["count"]) for p in metrics[n.OPTIMIZER_STEP_DURATION.name]}
    assert counts == {"SGD": 4, "Adam": 6, "ZeroRedundancyOptimizer": 3, "Subclassed": 3}


def test_wasteful_ddp_configuration_warns(ddp_job):
    # (a loaded machine may add slow_step warnings: 4 ranks share 2 cores here)
    warnings = [s for s in ddp_job["spans"][0] if s["name"] == n.SPAN_WARNING and _a(s, n.WARNING_KIND) != "slow_step"]
    assert len(warnings) == 1, [w["attributes"] for w in warnings]
    (w,) = warnings
    assert _a(w, n.WARNING_KIND) == "ddp_config"
    assert "find_unused_parameters=True" in _a(w, n.WARNING_MESSAGE)
    assert w["events"][0]["name"] == n.WARNING_EVENT


def test_ddp_built_before_instrument_gets_bucket_records(tmp_path_factory):
    job = _job(tmp_path_factory, "ddp_built_before_instrument", 2, "early")
    colls = _collectives(job["spans"][0])
    buckets = [
        s for s in colls if _a(s, n.COLL_FRAMEWORK) == "ddp" and _a(s, n.COLL_GROUP_DESC) != "bn" and s["name"] == "all_reduce"
    ]  # fmt: skip
    assert len(buckets) == 1 + 2  # one bucket before the reducer rebuilds them, then two
    assert all(_a(s, n.DDP_BUCKET_BYTES) == _a(s, n.COLL_MESSAGE_SIZE) for s in buckets)
    # after uninstrument() the adopted model takes a comm hook (the reducer alone would refuse a second)
    assert job["results"][0]["hook_calls_after_uninstrument"] >= 1
    # DDP's buffer broadcasts around forward are DDP's, in forward (its construction's broadcast is not)
    bn = [s for s in colls if _a(s, n.COLL_GROUP_DESC) == "bn" and _a(s, n.COLL_OP) == "_broadcast_coalesced"]
    assert [(_a(s, n.COLL_FRAMEWORK), _a(s, n.COLL_PHASE)) for s in bn[1:]] == [("ddp", "forward")] * 2


# ------------------------------------------------------------------------------- compile, checkpoint
def test_compiled_collectives_seen_by_the_deep_mode_without_recompiling(tmp_path_factory):
    job = _job(tmp_path_factory, "compiled", 2, "compile")
    for rank in range(2):
        result = job["results"][rank]
        assert result["graphs_after"] == result["graphs_before"] == 1
        assert result["results"] == [64.0] * 3
        compiled = [s for s in _collectives(job["spans"][rank]) if _a(s, n.COLL_FRAMEWORK) != "ddp"]
        ddp = [s for s in _collectives(job["spans"][rank]) if _a(s, n.COLL_FRAMEWORK) == "ddp"]
        assert len(result["ddp_losses"]) == 3 and all(math.isfinite(x) for x in result["ddp_losses"])
        # a bucket or more a step, through the trampoline or the native group (whichever this machine has)
        assert sum(1 for s in ddp if _a(s, n.COLL_SOURCE) in ("ddp_hook", "ddp_reducer") and s["name"] == "all_reduce") >= 3
        colls = [s for s in compiled if _a(s, n.COLL_OP) != "_broadcast_coalesced"]  # DDP's init broadcast
        assert Counter((s["name"], _a(s, n.COLL_MESSAGE_SIZE)) for s in colls) == {
            ("all_reduce", 32): 3,
            ("all_gather_into_tensor", 64): 3,
        }
        for s in colls:
            assert _a(s, n.COLL_SOURCE) == "deep" and _a(s, n.COLL_FRAMEWORK) == "compiled"
            assert _a(s, n.COLL_END_SOURCE) == "wait"


def test_checkpoint_spans_and_optimizer_in_backward(tmp_path_factory):
    job = _job(tmp_path_factory, "checkpoint_and_optimizer_in_backward", 2, "ckpt")
    result = job["results"][0]
    spans = job["spans"][0]
    by_id = {s["spanId"]: s for s in spans}
    saves = [s for s in spans if s["name"] == n.SPAN_CHECKPOINT_SAVE]
    loads = [s for s in spans if s["name"] == n.SPAN_CHECKPOINT_LOAD]
    assert len(saves) == 2 and len(loads) == 1
    assert sorted(_a(s, n.CKPT_ASYNC) for s in saves) == [False, True]
    for s in saves + loads:
        assert _a(s, n.CKPT_BYTES) == result["bytes"] and _a(s, n.CKPT_TENSORS) == 6
    children = [s for s in _collectives(spans) if s.get("parentSpanId") in {x["spanId"] for x in saves + loads}]
    assert children and all(_a(s, n.COLL_PHASE) == "checkpoint" for s in children)
    for s in saves + loads:  # each its own: async_save's run on DCP's executor thread
        assert any(c["parentSpanId"] == s["spanId"] for c in children), (_a(s, n.CKPT_ASYNC), s["name"])
    assert all(by_id[s["parentSpanId"]]["traceId"] == s["traceId"] for s in children)
    from .harness import last_metrics

    metrics = last_metrics(os.path.join(job["folder"], "metrics.rank0.jsonl"))
    counts = {p["attributes"]["op"]: int(p["count"]) for p in metrics[n.CHECKPOINT_DURATION.name]}
    assert counts == {"save": 2, "load": 1}
    steps = [s for s in spans if s["name"] == n.SPAN_OPTIMIZER_STEP]
    assert len(steps) == result["params"]  # one step per parameter, inside backward
    assert all(_a(s, n.OPT_IN_BACKWARD) is True for s in steps)


def test_ddp_with_its_own_mixed_precision_hook_is_recorded_not_refused(instrumented):
    """DDP(mixed_precision=...) registers its own comm hook in __init__: the trampoline stays out (the
    reducer takes one hook) and the model is still recorded, with no error."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecision
    from torch.nn.parallel import DistributedDataParallel as DDP

    import otel_torchdist
    from otel_torchdist import health

    try:
        torch.Stream()  # DDP(mixed_precision=...) makes one for its low-precision copies
    except RuntimeError as exc:
        pytest.skip(f"DDP's mixed precision needs a stream, and this torch cannot make one here: {str(exc).splitlines()[0]}")
    health.reset()
    folder = instrumented(run_id="mixed")
    dist.init_process_group("gloo", store=dist.TCPStore("127.0.0.1", 0, 1, True), rank=0, world_size=1)
    try:
        model = DDP(torch.nn.Linear(4, 4), mixed_precision=MixedPrecision(param_dtype=torch.float16))
        assert model._get_ddp_logging_data()["comm_hook"] == "_reducer_allreduce_and_upcast_hook"
        otel_torchdist.uninstrument()  # (training it needs a GPU: its hook records stream events)
    finally:
        dist.destroy_process_group()
    assert health.errors() == {}
    spans = read_spans(os.path.join(folder, "traces.rank0.jsonl"))
    assert [s["name"] for s in spans].count(n.SPAN_DDP_INIT) == 1


def _reads_right(job: dict) -> list[str]:
    return trace_layout_problems([s for spans in job["spans"] for s in spans])


def test_tensor_parallel_traces_read_right_in_jaeger(tp_job):
    """No orphan, no span id twice, no child outside its parent, across ranks: DTensor's redistribute returns
    before its all-reduce completes, and that all-reduce is still drawn inside a span that covers it."""
    assert _reads_right(tp_job) == []


def test_fsdp2_and_ddp_traces_read_right_in_jaeger(fsdp2_job, ddp_job):
    assert _reads_right(fsdp2_job) == [] and _reads_right(ddp_job) == []


@pytest.mark.parametrize("how", ["mesh", "name"])
def test_a_process_group_made_where_no_patch_sees_it_still_exports(tmp_path, how):
    """init_device_mesh calls its own binding of init_process_group, as does a program that imported the
    name before instrument(): the rank never learnt who it was, its collectives waited in the queue and were
    lost at exit with nothing said (no run folder, no summary). The first group met tells it."""
    out = str(tmp_path)
    run_ranks("scenarios_training:unpatched_init", 2, out, {"how": how})
    folder = os.path.join(out, "runs", f"unpatched-{how}")
    for rank in range(2):
        m = last_metrics(os.path.join(folder, f"metrics.rank{rank}.jsonl"))
        calls = {p["attributes"][n.M_GROUP]: int(p["asInt"]) for p in m[n.COLLECTIVE_CALLS.name]}
        assert calls == {"default_pg": 5}, calls  # a 1-D mesh of the whole world is the default group
