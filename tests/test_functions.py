"""Custom autograd functions remember the module whose forward applied them (capture/functions.py), so that a
collective their backward issues names that module."""

from __future__ import annotations

import torch

from otel_torchdist.capture import context


class _TopK(torch.autograd.Function):
    """Returns (indices, values): the first output is not differentiable (no autograd node)."""

    @staticmethod
    def forward(ctx, x):
        values, indices = x.topk(2)
        ctx.mark_non_differentiable(indices)
        return indices, values

    @staticmethod
    def backward(ctx, grad_indices, grad_values):
        return grad_values.new_zeros(4)


class _Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 1

    @staticmethod
    def backward(ctx, grad):
        return grad


class _Net(torch.nn.Module):
    def forward(self, x):
        return _Identity.apply(x), _TopK.apply(x)[1]


def test_a_functions_node_names_its_module_whatever_output_comes_first(fake_pg, instrumented):
    instrumented()
    p = torch.nn.Parameter(torch.randn(4))
    torch.optim.SGD([p], lr=0.1).step()  # a training step, traced (trace_every_steps=1)
    single, values = _Net()(p)
    assert single.grad_fn.metadata.get(context.NODE_KEY) == "_Net"
    assert values.grad_fn.metadata.get(context.NODE_KEY) == "_Net"  # tagged on the first output autograd tracks
