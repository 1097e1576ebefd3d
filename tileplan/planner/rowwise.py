"""The Rowwise family: LayerNorm, Softmax and reductions over the last axis.

A row-wise op needs all of a row: its input and output are in ``WholeRows`` (contiguous row
ranges, one owner per row), the same rows on the same tiles, and one kernel call per tile runs
that tile's rows (``kernels.layernorm``, ``kernels.softmax``, ``kernels.rowreduce``, which pick
the worker schedule). LayerNorm's gamma and beta are read replicated on every tile (resident
parameters, as a bias row). The fused residual Add + LayerNorm kernel (``LayerNormCall(residual=
True)``) is registered but not yet offered: it writes two values (the residual stream and the
norm), which selection's one-layout-per-value model does not express yet; by the published
figures it is not always cheaper anyway (``kernels.layernorm``).

A reduction's output ``[..., 1]`` has one element per input row, so ``WholeRows`` places it on the
same tiles. Softmax over another axis, and reductions without ``keepdims``, are rewritten before
planning (``planner.rewrite``).
"""

from __future__ import annotations

import numpy as np

from ..graph.core import LayerNorm, ReduceMax, ReduceMean, ReduceSum, Softmax
from ..kernels.layernorm import LayerNormCall
from ..kernels.rowreduce import RowReduceCall
from ..kernels.softmax import SoftmaxCall
from ..layout import WholeRows
from ..estimate.detailed import cost_program
from ..program import ComputeStep, Operand, Program
from .candidates import Candidate, activation_inputs
from .elementwise import replicated
from .gemm import _vertex

# One row per op: the kernel call on a tile's ``rows x cols``.
ROW_CALLS = {
    LayerNorm: lambda op, rows, cols, dtype: LayerNormCall(rows, cols, dtype, op.epsilon),
    Softmax: lambda op, rows, cols, dtype: SoftmaxCall(rows, cols, dtype),
    ReduceSum: lambda op, rows, cols, dtype: RowReduceCall(rows, cols, dtype, "sum"),
    ReduceMean: lambda op, rows, cols, dtype: RowReduceCall(rows, cols, dtype, "mean"),
    ReduceMax: lambda op, rows, cols, dtype: RowReduceCall(rows, cols, dtype, "max"),
}


def row_layouts(t, tiles: int) -> list:
    """The row layouts a row-wise op may read: whole rows over every tile (or the pinned layout)."""
    if t.layout is not None:
        if not isinstance(t.layout, WholeRows):
            return []
        return [t.layout]
    return [WholeRows(tiles)]


def candidates(ctx, op) -> list[Candidate]:
    g, target = ctx.graph, ctx.target
    x, y = g.inputs_of(op)[0], g.output_of(op)
    if isinstance(op, Softmax) and op.axis not in (-1, len(x.shape) - 1):
        raise op.err(f"softmax over axis {op.axis} reaches the planner; it runs over the last axis")
    out = []
    for lay in row_layouts(x, target.tiles):
        if y.layout is not None and y.layout != lay:
            continue
        out.append(_candidate(ctx, op, lay))
    if not out:
        raise op.err(f"a row-wise op needs whole rows; the pinned layout of {x.name!r} or {y.name!r} does not "
                     "keep rows whole")
    return out


def _candidate(ctx, op, lay) -> Candidate:
    g, target = ctx.graph, ctx.target
    x, y = g.inputs_of(op)[0], g.output_of(op)
    cols = x.shape[-1]
    prog = Program()
    src = prog.add_buffer(ctx.tensor_buffer(x.name, lay))
    extra = [prog.add_buffer(ctx.tensor_buffer(n, replicated(g.tensors[n].shape, target.tiles)))
             for n in op.inputs[1:]]
    dst = prog.add_buffer(ctx.tensor_buffer(y.name, lay))
    per_row = y.size // x.rows                    # output elements per row: cols, or 1 for a reduction
    om = lay.owner_map(x.shape, x.dtype, target.tiles)
    vertices = []
    for t, s, e in zip(om.tile.tolist(), om.start.tolist(), om.stop.tolist()):
        rows = (e - s) // cols
        call = ROW_CALLS[type(op)](op, rows, cols, x.dtype)
        ins = (Operand(src.name, 0, rows * cols),) + tuple(Operand(b.name, 0, cols) for b in extra)
        vertices.append(_vertex(t, call, ins, (Operand(dst.name, 0, rows * per_row),), ctx.caches))
    prog.steps.append(ComputeStep(f"{op.name}.rows", tuple(vertices)))
    d = cost_program(prog, target)
    by_name = {x.name: lay, **{n: replicated(g.tensors[n].shape, target.tiles) for n in op.inputs[1:]}}
    return Candidate(op.name, tuple(by_name[n] for n in activation_inputs(ctx.storage, op)), lay,
                     f"{op.kind} on {lay}", d.estimate, d.estimate, prog, np.zeros(target.tiles, dtype=np.int64))
