"""Table of the c10d entry points we capture: how to find the group, the payload and the root of each.

One :class:`OpSpec` per public function of ``torch.distributed``. The message size rule follows
nccl-tests (see :mod:`otel_torchdist.bandwidth`):

* ``sum``: S is the total size of the ``payload`` parameters (for all_gather that is the gathered output,
  for reduce_scatter the pre-scatter input, for all_to_all the send buffer);
* ``times_n``: S is the per-rank tensor times the group size (gather, scatter: the whole array);
* ``inner``: the function moves its bytes through nested collectives (the ``*_object`` functions
  serialize to tensors first); S is the sum of what those nested calls move;
* ``batch``: batch_isend_irecv, S is the larger of the bytes sent and received (one direction of a
  send/recv pair, as nccl-tests' sendrecv counts it);
* ``none``: barriers.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch

from .. import bandwidth as bw
from . import record as R

REQUIRED = object()
MAX_SHAPES = 8  # shapes listed on a span; the count is always given


@dataclass(frozen=True)
class OpSpec:
    name: str
    kind: str
    size: str  # sum | times_n | inner | batch | none
    payload: tuple[str, ...] = ()
    group: str | None = "group"
    async_param: str | None = "async_op"
    redop: str | None = None
    root: tuple[str, str | None] | None = None  # (global-rank param, group-rank param)
    root_default: int | None = None  # the global rank torch takes when neither root parameter is given
    peer: tuple[str, str | None] | None = None
    params: tuple[tuple[str, Any], ...] | None = None  # for builtins without a Python signature


C10D_OPS: tuple[OpSpec, ...] = (
    OpSpec("all_reduce", bw.ALL_REDUCE, "sum", ("tensor",), redop="op"),
    OpSpec("all_reduce_coalesced", bw.ALL_REDUCE, "sum", ("tensors",), redop="op"),
    OpSpec("all_gather", bw.ALL_GATHER, "sum", ("tensor_list",)),
    OpSpec("all_gather_into_tensor", bw.ALL_GATHER, "sum", ("output_tensor",)),
    OpSpec("all_gather_single", bw.ALL_GATHER, "sum", ("output_tensor",)),
    OpSpec("_all_gather_base", bw.ALL_GATHER, "sum", ("output_tensor",)),
    OpSpec("all_gather_coalesced", bw.ALL_GATHER, "sum", ("output_tensor_lists",)),
    OpSpec("all_gather_object", bw.ALL_GATHER, "inner", async_param=None),
    OpSpec("reduce_scatter", bw.REDUCE_SCATTER, "sum", ("input_list",), redop="op"),
    OpSpec("reduce_scatter_tensor", bw.REDUCE_SCATTER, "sum", ("input",), redop="op"),
    OpSpec("reduce_scatter_single", bw.REDUCE_SCATTER, "sum", ("input",), redop="op"),
    OpSpec("_reduce_scatter_base", bw.REDUCE_SCATTER, "sum", ("input",), redop="op"),
    OpSpec("broadcast", bw.BROADCAST, "sum", ("tensor",), root=("src", "group_src")),
    OpSpec("broadcast_object_list", bw.BROADCAST, "inner", async_param=None, root=("src", "group_src"), root_default=0),
    OpSpec("reduce", bw.REDUCE, "sum", ("tensor",), redop="op", root=("dst", "group_dst")),
    OpSpec("gather", bw.GATHER, "times_n", ("tensor",), root=("dst", "group_dst"), root_default=0),
    OpSpec("gather_object", bw.GATHER, "inner", async_param=None, root=("dst", "group_dst"), root_default=0),
    OpSpec("scatter", bw.SCATTER, "times_n", ("tensor",), root=("src", "group_src"), root_default=0),
    OpSpec("scatter_object_list", bw.SCATTER, "inner", async_param=None, root=("src", "group_src"), root_default=0),
    OpSpec("all_to_all", bw.ALL_TO_ALL, "sum", ("input_tensor_list",)),
    OpSpec("all_to_all_single", bw.ALL_TO_ALL, "sum", ("input",)),
    OpSpec("barrier", bw.BARRIER, "none"),
    OpSpec("monitored_barrier", bw.BARRIER, "none", async_param=None),
    OpSpec("send", bw.SEND_RECV, "sum", ("tensor",), async_param=None, peer=("dst", "group_dst")),
    OpSpec("recv", bw.SEND_RECV, "sum", ("tensor",), async_param=None, peer=("src", "group_src")),
    OpSpec("send_object_list", bw.SEND_RECV, "inner", async_param=None, peer=("dst", "group_dst")),
    OpSpec("recv_object_list", bw.SEND_RECV, "inner", async_param=None, peer=("src", "group_src")),
    OpSpec("batch_isend_irecv", bw.SEND_RECV, "batch", ("p2p_op_list",), group=None, async_param=None),
    OpSpec(
        "_broadcast_coalesced",
        bw.BROADCAST,
        "sum",
        ("tensors",),
        group="process_group",
        async_param=None,
        root=(None, "src"),  # a rank of the group: the C++ op takes it as the root rank as is
        params=(("process_group", REQUIRED), ("tensors", REQUIRED), ("buffer_size", REQUIRED), ("src", 0)),
    ),
)

OPS_BY_NAME = {spec.name: spec for spec in C10D_OPS}
ROOT_DEFAULTS = {spec.name: spec.root_default for spec in C10D_OPS if spec.root_default is not None}


class Binder:
    """Maps ``(args, kwargs)`` of one function to a tuple of its parameters in order, defaults filled."""

    __slots__ = ("names", "defaults", "n", "bind")

    def __init__(self, spec: OpSpec, fn: Any) -> None:
        if spec.params is not None:
            pairs = spec.params
        else:
            sig = inspect.signature(fn)
            pairs = tuple(
                (p.name, REQUIRED if p.default is inspect.Parameter.empty else p.default)
                for p in sig.parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            )
        self.names = names = tuple(name for name, _ in pairs)
        self.defaults = defaults = tuple(default for _, default in pairs)
        self.n = count = len(pairs)

        def bind(args: tuple, kwargs: dict) -> tuple:
            """All parameters in order, defaults filled in."""
            n = len(args)
            if not kwargs:
                return args + defaults[n:] if n < count else args
            return args + tuple(kwargs.get(names[i], defaults[i]) for i in range(n, count))

        self.bind = bind

    def index(self, name: str | None) -> int | None:
        if name is None:
            return None
        return self.names.index(name)


def sparse_nbytes(t) -> int:
    """A sparse tensor has no ``nbytes``: what it holds is its indices and values (what gloo's sparse
    all-reduce sends from each rank)."""
    if t.layout == torch.sparse_coo:
        return t._indices().nbytes + t._values().nbytes
    if t.layout in (torch.sparse_csr, torch.sparse_bsr):
        return t.crow_indices().nbytes + t.col_indices().nbytes + t.values().nbytes
    if t.layout in (torch.sparse_csc, torch.sparse_bsc):
        return t.ccol_indices().nbytes + t.row_indices().nbytes + t.values().nbytes
    raise ValueError(f"no byte size for a tensor of layout {t.layout}")


def describe(values, rec: list) -> None:
    """Fill ``rec``'s size, dtype, shapes, numel and tensor count from tensors or (nested) lists of them."""
    total = 0
    numel = 0
    count = 0
    shapes: list[int] = []  # flattened: ndim, dims...
    listed = 0
    dtype = None
    stack = list(reversed(values))  # depth-first, in order: the first tensor gives the dtype
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            try:
                total += x.nbytes
            except RuntimeError:
                total += sparse_nbytes(x)
            numel += x.numel()
            count += 1
            if dtype is None:
                dtype = x.dtype
            if listed < MAX_SHAPES:
                listed += 1
                shape = x.shape
                shapes.append(len(shape))
                shapes.extend(shape)
        elif isinstance(x, (list, tuple)):
            stack.extend(reversed(x))
    rec[R.NBYTES] = total
    rec[R.NUMEL] = numel
    rec[R.NTENSORS] = count
    rec[R.DTYPE] = dtype
    rec[R.SHAPES] = tuple(shapes)


def describe_tensor(t, rec: list) -> None:
    """The single-tensor fast path of :func:`describe`."""
    try:
        rec[R.NBYTES] = t.nbytes
    except RuntimeError:
        rec[R.NBYTES] = sparse_nbytes(t)
    rec[R.NUMEL] = t.numel()
    rec[R.NTENSORS] = 1
    rec[R.DTYPE] = t.dtype
    shape = tuple(t.shape)
    rec[R.SHAPES] = (len(shape),) + shape


def payload_bytes(values) -> int:
    total = 0
    stack = list(values)
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            total += x.nbytes
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
    return total


def describe_batch(p2p_ops, rec: list) -> None:
    """batch_isend_irecv: one record for the batch, S = max(bytes sent, bytes received)."""
    sent = received = 0
    peers = []
    tensors = []
    for p2p in p2p_ops:
        t = p2p.tensor
        tensors.append(t)
        is_send = getattr(p2p.op, "__name__", "") == "isend"
        if is_send:
            sent += t.nbytes
        else:
            received += t.nbytes
        peers.append(f"{'send' if is_send else 'recv'}:{p2p.peer}")
    describe(tensors, rec)
    rec[R.NBYTES] = max(sent, received)
    rec[R.EXTRA] = ("bytes_sent", sent, "bytes_received", received, "peers", ",".join(peers))
