"""Training paths inside real gloo ranks: DDP, FSDP2, FSDP1, tensor parallel, optimizers, sharding."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

# Imported by name at module level, before instrument(), as training scripts do: instrument() finds and
# patches these bindings too.
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


def _instrument(out: str, run_id: str, **extra: Any) -> None:
    import otel_torchdist

    otel_torchdist.instrument(
        run_dir=os.path.join(out, "runs"),
        run_id=run_id,
        traces_exporter="file",
        metrics_exporter=("file",),
        summary="none",
        trace_every_steps=1,  # these tests read every span back
        drain_interval=0.05,
        system_metrics=False,
        **extra,
    )


def _finish() -> None:
    import otel_torchdist

    otel_torchdist.uninstrument()
    dist.destroy_process_group()


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))


def _sparse_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(50, 16, sparse=True), nn.Flatten(), nn.Linear(16 * 4, 4))


def _train(model: nn.Module, steps: int, rank: int, opt=None) -> list[torch.Tensor]:
    opt = opt or torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        x = torch.randn(8, 16, generator=gen)
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


# ------------------------------------------------------------------------------------------------ DDP
def ddp(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """The same DDP training uninstrumented, instrumented, and instrumented with a user comm hook."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", rank=rank, world_size=ws)
    steps = args.get("steps", 3)
    native = args.get("native", "off")
    plain = _train(DDP(_mlp(), bucket_cap_mb=0.01), steps, rank)
    _instrument(out, f"ddp-{native}-ws{ws}", native=native)
    model = DDP(_mlp(), bucket_cap_mb=0.01)
    from torch.profiler import ProfilerActivity, profile

    from otel_torchdist.capture import ddp_native

    attached = ddp_native.is_attached(model)
    with profile(activities=[ProfilerActivity.CPU]) as prof:  # the oracle for the bucket all-reduces
        instrumented = _train(model, steps, rank)
    profiler_all_reduces = sum(1 for e in prof.events() if e.name == "gloo:all_reduce")
    profiler_broadcasts = sum(1 for e in prof.events() if e.name == "gloo:broadcast")  # the bucket rebuild
    sizes = model._get_ddp_logging_data().get("rebuilt_bucket_sizes", "")
    calls: list[int] = []

    def user_hook(state, bucket):
        calls.append(bucket.index())
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        return allreduce_hook(state, bucket)

    hook_group = dist.new_group(list(range(ws)), group_desc="hooked")
    hooked = DDP(_mlp(), bucket_cap_mb=0.01, process_group=hook_group)
    # find_unused_parameters=True with nothing unused: a warning once DDP has seen enough iterations
    wasteful = DDP(_mlp(), find_unused_parameters=True, process_group=dist.new_group(list(range(ws)), group_desc="wasteful"))
    _train(wasteful, 13, rank)
    hooked.register_comm_hook(hook_group, user_hook)
    second_registration = None
    try:
        hooked.register_comm_hook(None, user_hook)
    except RuntimeError as exc:
        second_registration = str(exc)
    with_hook = _train(hooked, steps, rank)
    # A model moved to another group (elastic shrinking, say): its buckets follow it, as DDP's own would.
    moved = DDP(_mlp(), bucket_cap_mb=0.01, process_group=dist.new_group(list(range(ws)), group_desc="before_move"))
    _train(moved, 1, rank)
    moved._update_process_group(dist.new_group(list(range(ws)), group_desc="moved"))
    _train(moved, 2, rank)
    import otel_torchdist
    from otel_torchdist.capture import record

    otel_torchdist.uninstrument()
    _train(model, 1, rank)  # the trampoline stays on the model: it must go on working, recording nothing
    recorded_after = len(record.QUEUE)
    dist.destroy_process_group()
    return {
        "native_attached": attached,
        "profiler_broadcasts": profiler_broadcasts,
        "recorded_after_uninstrument": recorded_after,
        "identical": all(torch.equal(a, b) for a, b in zip(plain, instrumented)),
        "identical_with_hook": all(torch.equal(a, b) for a, b in zip(plain, with_hook)),
        "rebuilt_bucket_sizes": [int(x) for x in sizes.split(",")] if sizes else [],
        "steps": steps,
        "hook_calls": len(calls),
        "profiler_all_reduces": profiler_all_reduces,
        "second_registration": second_registration,
    }


# ---------------------------------------------------------------------------------------------- FSDP
def fsdp2(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """fully_shard on an MLP's blocks and root; the oracles watch the same steps."""
    from torch.distributed.fsdp import fully_shard
    from torch.profiler import ProfilerActivity, profile

    dist.init_process_group("gloo", rank=rank, world_size=ws)
    _instrument(out, f"fsdp2-ws{ws}")
    model = _mlp()
    for block in (model[0], model[2], model[4]):
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        _train(model, args.get("steps", 2), rank, opt)
    counts = Counter(e.name for e in prof.events() if e.name.startswith("gloo:"))
    _finish()
    return {"profiler_counts": dict(counts), "original_shapes": [list(p.shape) for p in _mlp().parameters()]}


def fsdp1(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import StateDictType
    from torch.profiler import ProfilerActivity, profile
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    dist.init_process_group("gloo", rank=rank, world_size=ws)
    _instrument(out, f"fsdp1-ws{ws}")
    model = FSDP(_mlp(), auto_wrap_policy=ModuleWrapPolicy({nn.Linear}), device_id=torch.device("cpu"))
    _train(model, args.get("steps", 2), rank)
    # Unshards outside the training runtime, counted by torch.profiler too
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with FSDP.summon_full_params(model):
            pass
        with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT):
            model.state_dict()
    counts = Counter(e.name for e in prof.events() if e.name.startswith("gloo:"))
    _finish()
    return {"profiler_counts": dict(counts)}


# --------------------------------------------------------------------------------- tensor parallel
class TPMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net1 = nn.Linear(16, 32)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(32, 16)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def tensor_parallel(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """A Colwise/Rowwise TP MLP, forward and backward, inside CommDebugMode: its counts are the oracle.

    ``args["order"]``: "after" (parallelized once instrumented), "before" (parallelized, then instrumented:
    the usual order) or "local_import" (parallelize_module imported inside a function before instrument(),
    so the library's wrapper never sees the call, only tensor parallel's own distribute_module calls);
    ``args["input_grad"]``: the input requires grad, so ColwiseParallel's backward all-reduces it;
    ``args["checkpoint"]``: "reentrant" or "non_reentrant" activation checkpointing around the model, whose
    recomputation in backward issues the forward's all-reduce again (early stop off: all of it)."""
    from torch.distributed.device_mesh import init_device_mesh

    order = args.get("order", "after")
    run = args.get("run", "tp")
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    mesh = init_device_mesh("cpu", (ws,), mesh_dim_names=("tp",))
    plan = {"net1": ColwiseParallel(), "net2": RowwiseParallel()}
    if order == "before":
        model = parallelize_module(TPMLP(), mesh, plan)
        _instrument(out, f"{run}-ws{ws}")
    elif order == "local_import":
        from torch.distributed.tensor.parallel import parallelize_module as parallelize_here

        _instrument(out, f"{run}-ws{ws}")
        model = parallelize_here(TPMLP(), mesh, plan)
    else:
        _instrument(out, f"{run}-ws{ws}")
        model = parallelize_module(TPMLP(), mesh, plan)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(7)).requires_grad_(args.get("input_grad", False))
    checkpoint = args.get("checkpoint")
    if checkpoint:
        import torch.utils.checkpoint as ckpt

        def run_once():
            with ckpt.set_checkpoint_early_stop(False):
                ckpt.checkpoint(model, x, use_reentrant=checkpoint == "reentrant").sum().backward()
    else:

        def run_once():
            model(x).sum().backward()

    comm_counts, module_counts = _comm_debug_counts(run_once, args.get("steps", 2))
    # sharding spans: a 8x4 tensor under Shard(0), Shard(1), Replicate
    full = torch.arange(32, dtype=torch.float32).reshape(8, 4)
    shard0 = distribute_tensor(full, mesh, [Shard(0)])
    distribute_tensor(full, mesh, [Shard(1)])
    distribute_tensor(full, mesh, [Replicate()])
    shard0.redistribute(mesh, [Replicate()])
    funcol_marks = _funcol_waits(mesh)
    _finish()
    return {"comm_counts": dict(comm_counts), "module_counts": module_counts, "funcol": funcol_marks}


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))

    def forward(self, x):
        b, s, _ = x.shape
        # -1 heads: under tensor parallel each rank holds its share of the heads
        q, k, v = (w(x).view(b, s, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.w1, self.w2 = nn.Linear(dim, 4 * dim, bias=False), nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x):
        return self.w2(nn.functional.silu(self.w1(x)))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.attn_norm, self.attn = nn.RMSNorm(dim), Attention(dim, heads)
        self.ffn_norm, self.ffn = nn.RMSNorm(dim), FeedForward(dim)

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        return x + self.ffn(self.ffn_norm(x))


class Transformer(nn.Module):
    def __init__(self, dim: int = 32, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(Block(dim, heads) for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def _tp_sp_plan() -> dict:
    """torchtitan's plan for a block: sequence parallel norms, tensor parallel attention and feed-forward."""
    from torch.distributed.tensor.parallel import PrepareModuleInput, SequenceParallel

    gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    return {
        "attn_norm": SequenceParallel(),
        "attn": gather,
        "attn.wq": ColwiseParallel(),
        "attn.wk": ColwiseParallel(),
        "attn.wv": ColwiseParallel(),
        "attn.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "ffn": gather,
        "ffn.w1": ColwiseParallel(),
        "ffn.w2": RowwiseParallel(output_layouts=Shard(1)),
    }


def transformer(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """A two-block transformer, tensor + sequence parallel (``args["mesh"] == "tp"``, every rank one tensor
    parallel group) or FSDP2 over tensor parallel on a 2-D mesh (``"dp_tp"``: 2 x 2 on 4 ranks),
    parallelized before instrument() (the usual order), trained inside CommDebugMode: its counts are the
    oracle."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.profiler import ProfilerActivity, profile

    layout = args.get("mesh", "tp")
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    model = Transformer()
    if layout == "tp":
        tp = init_device_mesh("cpu", (ws,), mesh_dim_names=("tp",))
    else:
        mesh = init_device_mesh("cpu", (2, ws // 2), mesh_dim_names=("dp", "tp"))
        tp = mesh["tp"]
    for layer in model.layers:
        parallelize_module(layer, tp, _tp_sp_plan())
    if layout == "dp_tp":
        for layer in model.layers:
            fully_shard(layer, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
    run = f"transformer-{layout}-ws{ws}"
    _instrument(out, run)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(100 + rank)

    def step():
        x = torch.randn(2, 8 // tp.size(), 32, generator=gen)  # this rank's share of the sequence
        model(x).square().mean().backward()

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        comm_counts, module_counts = _comm_debug_counts(step, args.get("steps", 2))
    opt.step()  # the norms' partial gradients are all-reduced here, outside CommDebugMode
    _finish()
    return {"comm_counts": dict(comm_counts), "module_counts": module_counts, "fsdp_labels": _fsdp_labels(prof)}


def _comm_debug_counts(step, steps: int) -> tuple[dict, dict]:
    """``step()`` run ``steps`` times, each inside a fresh CommDebugMode (one across two forward/backward
    passes trips over its own module stack, IndexError in _fw_set_module_hook, instrumented or not); its
    total and per-module, per-phase counts summed."""
    from torch.distributed.tensor.debug import CommDebugMode

    module_counts: dict = {}
    comm_counts: Counter = Counter()
    for _ in range(steps):
        with CommDebugMode() as cdm:
            step()
        comm_counts.update({str(k): v for k, v in cdm.get_comm_counts().items()})
        for module, phases in cdm.comm_module_counts.items():
            for phase, ops in phases.items():
                for op, c in ops.items():
                    slot = module_counts.setdefault(module, {}).setdefault(phase, {})
                    slot[str(op)] = slot.get(str(op), 0) + c
    return dict(comm_counts), module_counts


def ddp_comm_debug(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """DDP trained inside CommDebugMode."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", rank=rank, world_size=ws)
    native = args.get("native", "off")
    _instrument(out, f"ddp-cdm-{native}-ws{ws}", native=native)
    model = DDP(_mlp(), bucket_cap_mb=0.01)
    gen = torch.Generator().manual_seed(100 + rank)
    comm_counts, module_counts = _comm_debug_counts(lambda: model(torch.randn(8, 16, generator=gen)).sum().backward(), args.get("steps", 2))
    _finish()
    return {"comm_counts": comm_counts, "module_counts": module_counts}


def _fsdp_labels(prof) -> list[tuple[str, str, str]]:
    """(unit, phase, op) of each collective op torch.profiler saw inside FSDP2's own labelled ranges
    ("FSDP::all_gather (layers.0)", "FSDP::backward_prefetch for layers.0", "FSDP::post_backward_reduce
    (layers.1)"): the unit FSDP itself says the collective served."""
    import re

    collective = re.compile(r"^(c10d|_c10d_functional)::_?(all_?reduce|all_?gather|reduce_scatter)")
    out = []
    for event in prof.events():
        if not collective.match(event.name):
            continue
        unit = phase = None
        parent = event.cpu_parent
        while parent is not None:
            if collective.match(parent.name):
                break  # the same collective one dispatch level down, or the c10d op a functional one calls
            label = re.match(r"FSDP::(\w+?)(?: for (\S+)| \((.*)\))?$", parent.name)
            if label:
                step, target, fqn = label.groups()
                if unit is None and (target is not None or fqn is not None):
                    unit = target if target is not None else fqn
                if phase is None and ("backward" in step or "forward" in step):
                    phase = "backward" if "backward" in step else "forward"
            parent = parent.cpu_parent
        else:
            if unit is not None:
                out.append((unit, phase, event.name))
    return out


def _funcol_waits(mesh) -> dict:
    """Bare functional collectives whose wait arrives through a view, or never arrives."""
    import time

    import torch.distributed._functional_collectives as funcol

    marks = {}
    group = mesh.get_group()
    x = torch.ones(8, 4)
    marks["view_issued"] = time.time_ns()
    out = funcol.all_reduce(x, "sum", group)
    viewed = out.view(32)  # an AsyncCollectiveTensor wrapping a *view*: its wait names the view
    time.sleep(0.05)
    marks["view_sum"] = float(viewed.sum())  # waits here
    marks["view_waited"] = time.time_ns()
    dropped = funcol.all_gather_tensor(torch.ones(2), 0, group)
    del dropped  # never waited
    return marks


# ------------------------------------------------------------------------------------------ optimizers
def optimizers(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    dist.init_process_group("gloo", rank=rank, world_size=ws)
    _instrument(out, f"optim-ws{ws}")
    steps = args.get("steps", 3)
    made = {}
    model = _mlp()
    made["SGD"] = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    made["Adam-foreach"] = torch.optim.Adam(model.parameters(), lr=0.01, foreach=True)
    made["Adam-fused"] = torch.optim.Adam(model.parameters(), lr=0.01, fused=True)
    made["ZeRO"] = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=0.01)

    class Subclassed(torch.optim.SGD):
        def step(self, closure=None):
            return super().step(closure)

    made["Subclassed"] = Subclassed(model.parameters(), lr=0.1)
    order = []
    for label, opt in made.items():
        for _ in range(steps):
            model(torch.randn(4, 16)).sum().backward()
            opt.step()
            opt.zero_grad()
            order.append(label)
    # A step that raises must not leave the capture thinking it is still inside it.
    class Broken(torch.optim.SGD):
        def step(self, closure=None):
            raise RuntimeError("broken step")

    try:
        Broken(model.parameters(), lr=0.1).step()
    except RuntimeError:
        pass
    model(torch.randn(4, 16)).sum().backward()
    made["SGD"].step()
    _finish()
    return {"order": order, "steps": steps}


# ------------------------------------------------------------------------------------ torch.compile
def compiled(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    import otel_torchdist

    dist.init_process_group("gloo", rank=rank, world_size=ws)
    _instrument(out, f"compile-ws{ws}")

    def step(x):
        y = x * 2
        dist.all_reduce(y)
        z = torch.empty(8 * ws)
        dist.all_gather_into_tensor(z, y)
        return z.sum()

    fn = torch.compile(step, backend="aot_eager")
    x = torch.ones(8)
    fn(x)  # compiles; outside the deep mode compiled collectives are invisible
    graphs_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    with otel_torchdist.deep_capture():
        results = [fn(x).item() for _ in range(3)]
    graphs_after = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    # a compiled DDP model: the forward wrapper steps aside (Dynamo guarded on its bookkeeping and failed)
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    ddp = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)))
    model = torch.compile(ddp, backend="aot_eager")
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    losses = []
    for i in range(3):
        loss = model(torch.full((4, 16), float(i + 1))).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    _finish()
    return {"graphs_before": graphs_before, "graphs_after": graphs_after, "results": results, "ddp_losses": losses}


class _CopyToRegion(torch.autograd.Function):
    """Megatron's _CopyToModelParallelRegion: identity in forward, the gradient all-reduced in backward."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class _ReduceFromRegion(torch.autograd.Function):
    """Megatron's _ReduceFromModelParallelRegion: all-reduced in forward, identity in backward."""

    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


class ColumnParallel(nn.Module):
    """Megatron's ColumnParallelLinear by hand: its weight its own, its input's gradient all-reduced."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(16, 16) / 4)

    def forward(self, x):
        return nn.functional.linear(_CopyToRegion.apply(x), self.weight)


class RowParallel(nn.Module):
    """Megatron's RowParallelLinear by hand: its output all-reduced in forward."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(16, 16) / 4)

    def forward(self, x):
        return _ReduceFromRegion.apply(nn.functional.linear(x, self.weight))


class Gather(nn.Module):
    """A functional all-gather in forward, outside any tensor parallel style."""

    def forward(self, x):
        import torch.distributed._functional_collectives as funcol

        gathered = funcol.all_gather_tensor(x.detach(), 0, dist.group.WORLD)
        return x + gathered.view(-1, *x.shape).mean(0)


class HandParallel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Linear(16, 16)  # so the column-parallel input needs a gradient, as inside a model
        self.col = ColumnParallel()
        self.gather = Gather()
        self.row = RowParallel()
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.row(self.gather(self.col(self.embed(x)))))


def hand_parallel(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """Collectives a model issues itself (no framework names them), eager inside CommDebugMode, then the
    same model compiled, in the deep mode."""
    import otel_torchdist

    dist.init_process_group("gloo", rank=rank, world_size=ws)
    _instrument(out, f"hand-ws{ws}")
    model = HandParallel()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(100 + rank)

    def step():
        model(torch.randn(4, 16, generator=gen)).square().mean().backward()

    comm_counts, module_counts = _comm_debug_counts(lambda: (step(), opt.step(), opt.zero_grad()), args.get("steps", 2))
    compiled = torch.compile(model, backend="aot_eager")
    with otel_torchdist.deep_capture():
        for _ in range(2):
            compiled(torch.randn(4, 16, generator=gen)).square().mean().backward()
            opt.step()
            opt.zero_grad()
    from otel_torchdist import health

    errors = health.errors()
    _finish()
    return {"comm_counts": comm_counts, "module_counts": module_counts, "capture_errors": errors}


# ------------------------------------------------------------------------- checkpoint, optimizer in bwd
def checkpoint_and_optimizer_in_backward(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.optim import _apply_optimizer_in_backward

    dist.init_process_group("gloo", rank=rank, world_size=ws)
    _instrument(out, f"ckpt-ws{ws}")
    model = _mlp()
    state = {"model": model.state_dict()}
    path = os.path.join(out, "ckpt")
    dcp.save(state, checkpoint_id=path)
    dcp.load(state, checkpoint_id=path)
    fut = dcp.async_save({"model": model.state_dict()}, checkpoint_id=os.path.join(out, "ckpt-async"))
    fut.result()
    # optimizer in backward: one SGD step per parameter, inside backward
    model2 = _mlp()
    _apply_optimizer_in_backward(torch.optim.SGD, model2.parameters(), {"lr": 0.1})
    model2(torch.randn(4, 16)).sum().backward()
    nparams = len(list(model2.parameters()))
    _finish()
    return {"bytes": sum(t.nbytes for t in model.state_dict().values()), "params": nparams}


def ddp_built_before_instrument(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", rank=rank, world_size=ws)
    early = DDP(_mlp(), bucket_cap_mb=0.01)
    _instrument(out, f"early-ws{ws}")
    _train(early, 2, rank)
    # BatchNorm statistics: DDP broadcasts its buffers around every forward
    bn_group = dist.new_group(list(range(ws)), group_desc="bn")
    bn = DDP(torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.BatchNorm1d(8)), process_group=bn_group)
    _train(bn, 2, rank)
    import otel_torchdist

    otel_torchdist.uninstrument()
    # uninstrumented again: the model takes a hook as if it had never been instrumented
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    calls = []

    def counting(state, bucket):
        calls.append(bucket.index())
        return allreduce_hook(state, bucket)

    early.register_comm_hook(None, counting)
    _train(early, 1, rank)
    dist.destroy_process_group()
    return {"hook_calls_after_uninstrument": len(calls)}


def ddp_numerics(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """Parameters after training, uninstrumented and instrumented, for DDP as users run it: no comm hook
    (default layout and gradient_as_bucket_view), DDP's builtin C++ all-reduce hook, and the paths where
    the reducer works around the hook: the unused-parameter map, a static graph's delayed all-reduce,
    uneven inputs under Join (whose finished ranks run the hook on zero buckets)."""
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel as DDP

    def joined(model):  # rank r trains 2 + r steps: the ranks done first shadow the others' collectives
        with Join([model]):
            return _train(model, 2 + rank, rank)

    def joined_dividing_by_the_ranks_left(model):  # DDP then divides by the ranks not yet joined
        with Join([model], divide_by_initial_world_size=False):
            return _train(model, 2 + rank, rank)

    def sparse(model):  # an embedding's sparse gradient: the reducer divides it (dense ones: times 1/n)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(100 + rank)
        for _ in range(3):
            loss = model(torch.randint(0, 50, (8, 4), generator=gen)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        return [p.detach().clone() for p in model.parameters()]

    dist.init_process_group("gloo", rank=rank, world_size=ws)
    variants = {
        "no hook": lambda: DDP(_mlp(), bucket_cap_mb=0.01),
        "gradient_as_bucket_view": lambda: DDP(_mlp(), bucket_cap_mb=0.01, gradient_as_bucket_view=True),
        "builtin ALLREDUCE hook": lambda: _with_builtin_hook(DDP(_mlp(), bucket_cap_mb=0.01)),
        "find_unused_parameters": lambda: DDP(_mlp(), bucket_cap_mb=0.01, find_unused_parameters=True),
        "static_graph": lambda: DDP(_mlp(), bucket_cap_mb=0.01, static_graph=True),
        "Join, uneven inputs": lambda: DDP(_mlp(), bucket_cap_mb=0.01, find_unused_parameters=True),
        "Join, divided by the ranks left": lambda: DDP(_mlp(), bucket_cap_mb=0.01),
        "sparse gradients": lambda: DDP(_sparse_mlp()),
    }
    trainers = {
        "Join, uneven inputs": joined,
        "Join, divided by the ranks left": joined_dividing_by_the_ranks_left,
        "sparse gradients": sparse,
    }

    def train(name, model):
        return trainers[name](model) if name in trainers else _train(model, 3, rank)

    native = args.get("native", "off")
    plain = {name: train(name, make()) for name, make in variants.items()}
    _instrument(out, f"numerics-{native}-ws{ws}", native=native)
    instrumented = {name: train(name, make()) for name, make in variants.items()}
    identical = {name: all(torch.equal(a, b) for a, b in zip(plain[name], instrumented[name])) for name in variants}
    import otel_torchdist

    otel_torchdist.uninstrument()
    # Join again, in a run of its own, with torch.profiler as the oracle for its all-reduces.
    from torch.profiler import ProfilerActivity, profile

    _instrument(out, f"join-{native}-ws{ws}", native=native)
    model = variants["Join, uneven inputs"]()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        joined(model)
    _finish()
    profiled = sum(1 for e in prof.events() if e.name == "gloo:all_reduce")
    return {"identical": identical, "join_profiler_all_reduces": profiled, "join_steps": 2 + rank}


def _with_builtin_hook(model):
    model._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
    return model


def unpatched_init(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """The process group made where no patch sees it: through ``init_device_mesh`` (which calls torch's
    own binding of init_process_group), or through a name the program imported before instrument()."""
    from torch.distributed import init_process_group  # bound before instrument(): torch's own function
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(ws))
    _instrument(out, f"unpatched-{args['how']}")
    if args["how"] == "mesh":
        mesh = init_device_mesh("cpu", (ws,), mesh_dim_names=("dp",))
        group = mesh.get_group("dp")
    else:
        init_process_group("gloo", rank=rank, world_size=ws)
        group = None
    for _ in range(5):
        dist.all_reduce(torch.ones(4), group=group)
    _finish()
    return {}
