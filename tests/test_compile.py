"""Under torch.compile the wrappers step aside: no graph break, and the compiled code still runs."""

from __future__ import annotations

import torch
import torch.distributed as dist


def _step(x):
    y = x * 2
    dist.all_reduce(y)
    z = torch.empty(8)
    dist.all_gather_into_tensor(z, y)
    return z + 1


def test_no_graph_break_added(fake_pg, instrumented):
    torch._dynamo.reset()
    plain = torch._dynamo.explain(_step)(torch.ones(2))
    instrumented()
    torch._dynamo.reset()
    wrapped = torch._dynamo.explain(_step)(torch.ones(2))
    assert wrapped.graph_break_count == plain.graph_break_count == 0, [str(r) for r in wrapped.break_reasons]
    assert wrapped.graph_count == plain.graph_count == 1
    # Dynamo saw through the wrapper to the original, and remapped it to functional collectives.
    graph_code = "\n".join(g.code for g in wrapped.graphs)
    assert "_c10d_functional" in graph_code or "all_reduce" in graph_code


def test_compiled_function_runs_instrumented(fake_pg, instrumented):
    instrumented()
    torch._dynamo.reset()
    compiled = torch.compile(_step, backend="aot_eager")
    assert torch.equal(compiled(torch.ones(2)), _step(torch.ones(2)))


class _TP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net1 = torch.nn.Linear(16, 32)
        self.net2 = torch.nn.Linear(32, 16)

    def forward(self, x):
        return self.net2(torch.relu(self.net1(x)))


def test_no_graph_break_added_to_a_tensor_parallel_model(fake_pg, instrumented):
    """The module tracker's hooks (tensor parallel's modules) did nothing Dynamo could trace: 6 graph
    breaks where the uninstrumented model has none. Under compilation they step aside."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = parallelize_module(_TP(), mesh, {"net1": ColwiseParallel(), "net2": RowwiseParallel()})
    x = torch.randn(4, 16, requires_grad=True)
    torch._dynamo.reset()
    plain = torch._dynamo.explain(model)(x)
    instrumented()
    torch._dynamo.reset()
    wrapped = torch._dynamo.explain(model)(x)
    assert wrapped.graph_break_count == plain.graph_break_count == 0, [str(r.reason) for r in wrapped.break_reasons]
    assert wrapped.graph_count == plain.graph_count
