"""Elementwise candidates (Add, GeLU, Cast, fused bias-Add + GeLU) and their programs.

An elementwise op runs where its output lies: for each activation layout of
the output tensor, every tile computes its own pieces, and the activation
inputs must arrive in the same layout (same element intervals on the same
tiles). A bias row (an Add operand of shape ``[N]`` broadcast over rows) is
read from a copy replicated on every tile (``replicated``).

Activation layouts use 8-element units (``Intervals(T, align=8 * itemsize)``)
so that one layout gives the same element intervals for FP32, FP16 and FP8:
a Cast keeps its pieces on the same tiles and moves nothing.

A bias Add whose only consumer is a GeLU may fuse with it into one
``bias_gelu`` pass: a candidate of the Add that writes the GeLU's output (the
sum is never stored); the GeLU then takes its ``absorbed`` candidate.

A bias Add that is a split-K GEMM's only consumer (``fusable_bias``) may instead
be done by the GEMM's reduction (``planner.gemm``, ``GemmChoice.bias``): the GEMM
writes the Add's output and the Add takes an ``absorbed`` candidate.
"""

from __future__ import annotations

import numpy as np

from ..graph.core import Add, Cast, GeLU, Graph, MatMul, Op, Role, Tensor
from ..graph.dtypes import DType
from ..kernels.calls import AddCall, BiasGeLUCall, CastCall, GeLUCall
from ..layout import Intervals, WholeRows
from ..layout.gemm_grid import Grid
from ..estimate.program import Buffer, ComputeStep, Operand, Program
from .gemm import _vertex


def activation_layouts(t: Tensor, tiles: int) -> list:
    """The boundary layouts offered for an activation tensor (or its pinned explicit layout)."""
    if t.layout is not None:
        return [t.layout]
    return [WholeRows(tiles), intervals(tiles, t.dtype)]


def intervals(tiles: int, dtype: DType) -> Intervals:
    return Intervals(tiles, align=8 * dtype.itemsize)


def same_elements(layout, dtype: DType):
    """The layout that gives a tensor of ``dtype`` the same element intervals as ``layout`` does."""
    if isinstance(layout, Intervals) and layout.align % 8 == 0 and layout.align // 8 in (1, 2, 4):
        unit = layout.align // 8            # bytes per element of the dtype it was made for
        return Intervals(layout.owners, align=layout.align // unit * dtype.itemsize)
    return layout


def replicated(shape, tiles: int) -> Grid:
    """A whole tensor held on every tile, row-major from offset 0 (a broadcast operand)."""
    rows, cols = int(np.prod(shape[:-1])), int(shape[-1])
    return Grid.of((0, rows), (0, cols), np.arange(tiles).reshape(1, 1, tiles))


def is_row_broadcast(graph: Graph, op: Op) -> int | None:
    """For an Add: the index of the operand that numpy broadcasts over the leading dimensions of the
    other (a bias row ``[N]``, or any ``[..., P, N]`` repeated over a batch), else None."""
    if not isinstance(op, Add):
        return None
    a, b = graph.inputs_of(op)
    out = graph.output_of(op)
    for idx, t in ((1, b), (0, a)):
        other = a if idx == 1 else b
        if t.shape == out.shape or other.shape != out.shape:
            continue
        core = tuple(t.shape)
        while len(core) > 1 and core[0] == 1:
            core = core[1:]
        if tuple(out.shape[len(out.shape) - len(core):]) == core:
            return idx
    return None


def broadcast_period(graph: Graph, op: Op) -> int:
    """Elements after which a broadcast operand repeats along the output's flat index."""
    idx = is_row_broadcast(graph, op)
    return graph.inputs_of(op)[idx].size


def check_supported(graph: Graph, op: Op) -> None:
    if isinstance(op, Add):
        a, b = graph.inputs_of(op)
        if a.shape != b.shape and is_row_broadcast(graph, op) is None:
            raise op.err(f"broadcasting {list(a.shape)} with {list(b.shape)} is supported where one operand "
                         f"repeats over the leading dimensions of the other (a bias row, a batch broadcast)")


def _pieces(om) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    return om.tile, om.start, om.stop, om.offset


def _row_split(start: int, stop: int, cols: int):
    """[start, stop) of a flat row-major range -> (rows, cols, first column, element offset) runs:
    a partial head row, whole rows, a partial tail row."""
    out = []
    pos = start
    if pos % cols and pos < stop:
        end = min(stop, (pos // cols + 1) * cols)
        out.append((1, end - pos, pos % cols, pos - start))
        pos = end
    whole = (stop - pos) // cols
    if whole:
        out.append((whole, cols, 0, pos - start))
        pos += whole * cols
    if pos < stop:
        out.append((1, stop - pos, 0, pos - start))
    return out


def build_program(graph: Graph, op: Op, layout, in_bufs: list[Buffer], out_buf: Buffer, target,
                  fused_gelu: GeLU | None = None) -> Program:
    """One compute step: each tile's pieces of the output, from the same pieces of the inputs."""
    prog = Program()
    for b in in_bufs + [out_buf]:
        prog.add_buffer(b)
    out_t = graph.tensors[out_buf.tensor]
    om = layout.owner_map(out_t.shape, out_t.dtype, target.tiles)
    tile, start, stop, offset = _pieces(om)
    bias_idx = is_row_broadcast(graph, op)
    dense = [b for i, b in enumerate(in_bufs) if i != bias_idx]
    for b in dense:
        bom = b.layout.owner_map(b.shape, b.dtype, target.tiles)
        if not (np.array_equal(bom.tile, tile) and np.array_equal(bom.start, start)
                and np.array_equal(bom.stop, stop)):
            raise ValueError(f"{op.name}: input {b.name} is not laid out like the output {out_buf.name}")
    vertices = []
    cols = broadcast_period(graph, op) if bias_idx is not None else out_t.cols
    for t, s, e, o in zip(tile.tolist(), start.tolist(), stop.tolist(), offset.tolist()):
        if isinstance(op, Add) and bias_idx is not None:
            x = dense[0]
            bias = in_bufs[bias_idx]
            for rows, width, c0, rel in _row_split(s, e, cols):
                if fused_gelu is not None:
                    call = BiasGeLUCall(rows, width, out_t.dtype, fused_gelu.approximate)
                else:
                    call = AddCall(rows, width, out_t.dtype, "row_broadcast")
                ins = [Operand(x.name, o + rel, rows * width), Operand(bias.name, c0, width)]
                vertices.append(_vertex(t, call, tuple(ins), (Operand(out_buf.name, o + rel, rows * width),), target))
            continue
        n = e - s
        if isinstance(op, Add):
            call = AddCall(1, n, out_t.dtype, "dense")
        elif isinstance(op, GeLU):
            call = GeLUCall(n, out_t.dtype, op.approximate)
        elif isinstance(op, Cast):
            src = graph.inputs_of(op)[0]
            call = CastCall(n, src.dtype, out_t.dtype,
                            src.scale if src.dtype is DType.FP8 else 0,
                            out_t.scale if out_t.dtype is DType.FP8 else 0)
        else:
            raise TypeError(op)
        ins = tuple(Operand(b.name, o, n) for b in dense)
        vertices.append(_vertex(t, call, ins, (Operand(out_buf.name, o, n),), target))
    prog.steps.append(ComputeStep(f"{op.name}.compute", tuple(vertices)))
    return prog


def fusable_gelu(graph: Graph, op: Op) -> GeLU | None:
    """The GeLU a bias Add may fuse with: the Add's only consumer, same dtype, and the sum not an output."""
    if not isinstance(op, Add) or is_row_broadcast(graph, op) is None:
        return None
    out = graph.output_of(op)
    users = graph.consumers.get(out.name, [])
    if out.role is Role.OUTPUT or len(users) != 1 or not isinstance(users[0], GeLU):
        return None
    return users[0]


def fusable_bias(graph: Graph, op: Op) -> tuple[Add, str] | None:
    """The bias Add a MatMul's reduction may do, and its bias tensor: the Add is the MatMul's only
    consumer, the product is not an output and has no pinned layout (it is never stored), the other
    operand is a parameter row of N elements (leading dimensions 1) broadcast over the rows, and the
    Add keeps the product's type (FP16 or FP32, unscaled: the reduction adds the bias before its one
    rounding). Whether the bias is read from its replicated storage is the planner's to check."""
    if not isinstance(op, MatMul):
        return None
    out = graph.output_of(op)
    users = graph.consumers.get(out.name, [])
    if out.role is Role.OUTPUT or out.layout is not None or len(users) != 1 or not isinstance(users[0], Add):
        return None
    add = users[0]
    idx = is_row_broadcast(graph, add)
    if idx is None:
        return None
    bias, other = graph.inputs_of(add)[idx], graph.inputs_of(add)[1 - idx]
    res = graph.output_of(add)
    if other.name != out.name or bias.role is not Role.PARAMETER:
        return None
    if any(d != 1 for d in bias.shape[:-1]) or bias.shape[-1] != out.shape[-1]:
        return None
    if not (bias.dtype is out.dtype is res.dtype) or out.dtype not in (DType.FP16, DType.FP32):
        return None
    if bias.scale or out.scale or res.scale:
        return None
    return add, bias.name
