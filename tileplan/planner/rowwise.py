"""The Rowwise family: LayerNorm, Softmax and reductions over the last axis.

A row-wise op needs all of a row's statistics. Two layouts keep them reachable:

- ``WholeRows``: each row on one tile (contiguous row ranges, one owner per row), input and
  output the same rows on the same tiles, one kernel call per tile (``kernels.layernorm``,
  ``kernels.softmax``, ``kernels.rowreduce``, which pick the worker schedule).
- ``SplitRows(owners, parts)`` (``layout.split_rows``), for LayerNorm and Softmax: each row cut
  into ``parts`` column pieces on ``parts`` neighbouring tiles, so that a tensor with fewer rows
  than tiles (729 tokens on 1472 tiles) reaches the idle ones. Four supersteps (``SPLIT_CHAINS``:
  one row per op): the partial FP32 statistics of each piece (``RowMomentsCall``,
  ``SoftmaxPartialCall``); an exchange of the partials within each row's tiles (a copy between
  the layout's two ``partials`` grids, costed and lowered as every copy is, ``estimate.exchange``:
  each tile receives the other parts, and keeps its own where its partial kernel wrote it); the
  combine on every tile of the row (``MomentsCombineCall``, ``SoftmaxCombineCall`` with ``own``:
  each tile merges its own part and the others in part order, so every tile has the same
  statistics); the apply on each piece (``LayerNormApplyCall``, ``SoftmaxApplyCall``). Offered only where whole
  rows leave tiles idle (fewer rows than tiles); the parts tried are ``SPLIT_PARTS`` (as many row
  groups as fit), and the ``SPLIT_KEEP`` fastest fragments are kept for selection, which compares
  them with ``WholeRows``, conversions included. Reductions keep whole rows.

LayerNorm's gamma and beta are read replicated on every tile (resident parameters, as a bias row;
a split piece reads its columns' slice). The fused residual Add + LayerNorm kernel
(``LayerNormCall(residual=True)``) is registered but not yet offered: it writes two values (the
residual stream and the norm), which selection's one-layout-per-value model does not express yet;
by the published figures it is not always cheaper anyway (``kernels.layernorm``).

A reduction's output ``[..., 1]`` has one element per input row, so ``WholeRows`` places it on the
same tiles. Softmax over another axis, and reductions without ``keepdims``, are rewritten before
planning (``planner.rewrite``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..graph.core import LayerNorm, ReduceMax, ReduceMean, ReduceSum, Softmax
from ..graph.dtypes import DType
from ..kernels import layernorm as ln
from ..kernels import softmax as sm
from ..kernels.layernorm import LayerNormCall
from ..kernels.rowreduce import RowReduceCall
from ..kernels.softmax import SoftmaxCall
from ..layout import SplitRows, WholeRows, rows_cols
from ..layout.split_rows import COLUMN_UNIT
from ..estimate.detailed import cost_program
from ..program import Buffer, ComputeStep, Copy, ExchangeStep, Operand, Program
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




@dataclass(frozen=True)
class SplitChain:
    """The two-stage kernels of a row-wise op whose rows may be split over tiles."""

    width: int           # FP32 values per row of a piece's partials
    stats: int           # FP32 values per row of the combined statistics
    partial: Callable    # (op, rows, cols, dtype) -> call: x piece -> partials [rows, width]
    combine: Callable    # (op, rows, parts, own) -> call: own part [rows, width], the others [parts - 1,
                         # rows, width] -> stats [rows, stats]
    apply: Callable      # (op, rows, cols, dtype) -> call: x piece, stats, parameter slices -> y piece


# One row per op that splits rows: its chain (kernels.layernorm, kernels.softmax).
SPLIT_CHAINS = {
    LayerNorm: SplitChain(ln.STAT_WIDTH, ln.ROW_STATS,
                          lambda op, rows, cols, dtype: ln.RowMomentsCall(rows, cols, dtype),
                          lambda op, rows, parts, own: ln.MomentsCombineCall(rows, parts, op.epsilon, own),
                          lambda op, rows, cols, dtype: ln.LayerNormApplyCall(rows, cols, dtype)),
    Softmax: SplitChain(sm.ROW_STATS, sm.ROW_STATS,
                        lambda op, rows, cols, dtype: sm.SoftmaxPartialCall(rows, cols, dtype),
                        lambda op, rows, parts, own: sm.SoftmaxCombineCall(rows, parts, own),
                        lambda op, rows, cols, dtype: sm.SoftmaxApplyCall(rows, cols, dtype)),
}
SPLIT_PARTS = (2, 3, 4, 6, 8, 12, 16, 24, 32)   # column pieces per row tried
SPLIT_KEEP = 2                                  # SplitRows fragments kept per op (the fastest)


def row_layouts(x, y, tiles: int, op) -> list:
    """The row layouts a row-wise op may run on (input and output alike): whole rows over every
    tile and, for an op with a split chain whose rows are fewer than the tiles, ``split_layouts``;
    or the layout the model file pins on its input or output (none when the two pins differ or
    the pin does not keep the rows' statistics reachable)."""
    splits = type(op) in SPLIT_CHAINS
    pins = list(dict.fromkeys(t.layout for t in (x, y) if t.layout is not None))
    if pins:
        lay = pins[0]
        ok = len(pins) == 1 and (isinstance(lay, WholeRows) or (splits and isinstance(lay, SplitRows)))
        return [lay] if ok else []
    return [WholeRows(tiles)] + (split_layouts(x.shape, tiles) if splits else [])


def split_layouts(shape, tiles: int) -> list[SplitRows]:
    """``SplitRows`` for a tensor whose rows leave tiles idle: per count of parts in ``SPLIT_PARTS``
    (no more than the row's 8-element units), as many row groups as fit (at most one per row)."""
    rows, cols = rows_cols(tuple(shape))
    if rows >= tiles:
        return []                       # whole rows already reach every tile
    units = -(-cols // COLUMN_UNIT)
    return [SplitRows(min(rows, tiles // p), p) for p in SPLIT_PARTS if p <= min(units, tiles)]


def candidates(ctx, op) -> list[Candidate]:
    g, target = ctx.graph, ctx.target
    x, y = g.inputs_of(op)[0], g.output_of(op)
    if isinstance(op, Softmax) and op.axis not in (-1, len(x.shape) - 1):
        raise op.err(f"softmax over axis {op.axis} reaches the planner; it runs over the last axis")
    out, split = [], []
    for lay in row_layouts(x, y, target.tiles, op):
        if isinstance(lay, SplitRows):
            split.append(_split_candidate(ctx, op, lay))
        else:
            out.append(_candidate(ctx, op, lay))
    pinned = x.layout is not None or y.layout is not None
    split.sort(key=lambda c: (c.estimate.cycles, c.estimate.total_memory))
    out += split if pinned else split[:SPLIT_KEEP]
    if not out:
        raise op.err(f"a row-wise op needs whole rows (or, for LayerNorm and Softmax, split rows); the pinned "
                     f"layouts of {x.name!r} and {y.name!r} differ or do not keep rows whole")
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


def _split_candidate(ctx, op, lay: SplitRows) -> Candidate:
    """The four supersteps of a split row (module docstring) on ``lay``, input and output alike."""
    g, target = ctx.graph, ctx.target
    x, y = g.inputs_of(op)[0], g.output_of(op)
    chain = SPLIT_CHAINS[type(op)]
    prog = Program()
    src = prog.add_buffer(ctx.tensor_buffer(x.name, lay))
    rep = {n: replicated(g.tensors[n].shape, target.tiles) for n in op.inputs[1:]}
    params = [prog.add_buffer(ctx.tensor_buffer(n, rep[n])) for n in op.inputs[1:]]
    dst = prog.add_buffer(ctx.tensor_buffer(y.name, lay))
    _, parts = lay.split(x.shape)
    own_lay, others_lay = lay.partials(x.shape, chain.width)
    pshape = (x.rows, parts * chain.width)
    own = prog.add_buffer(Buffer(f"{op.name}.partials@{lay}", own_lay, pshape, DType.FP32))
    others = prog.add_buffer(Buffer(f"{op.name}.others@{lay}", others_lay, pshape, DType.FP32))
    stats = prog.add_buffer(Buffer(f"{op.name}.stats@{lay}", lay.row_stats(x.shape, chain.stats),
                                   (x.rows, chain.stats), DType.FP32))
    partial, combine, apply = [], [], []
    for t, _, part, rows, cols, c0 in zip(*(a.tolist() for a in lay.pieces(x.shape))):
        piece = Operand(src.name, 0, rows * cols)
        mine = Operand(own.name, 0, rows * chain.width)
        row_stats = Operand(stats.name, 0, rows * chain.stats)
        partial.append(_vertex(t, chain.partial(op, rows, cols, x.dtype), (piece,), (mine,), ctx.caches))
        combine.append(_vertex(t, chain.combine(op, rows, parts, part),
                               (mine, Operand(others.name, 0, (parts - 1) * rows * chain.width)), (row_stats,),
                               ctx.caches))
        apply.append(_vertex(t, chain.apply(op, rows, cols, x.dtype),
                             (piece, row_stats) + tuple(Operand(b.name, c0, cols) for b in params),
                             (Operand(dst.name, 0, rows * cols),), ctx.caches))
    prog.steps += [ComputeStep(f"{op.name}.partial", tuple(partial)),
                   ExchangeStep(f"{op.name}.partials", (Copy(own.name, others.name),)),
                   ComputeStep(f"{op.name}.combine", tuple(combine)),
                   ComputeStep(f"{op.name}.apply", tuple(apply))]
    d = cost_program(prog, target)
    by_name = {x.name: lay, **rep}
    transient = d.memory.by_kind.get("transient", np.zeros(target.tiles, dtype=np.int64))
    return Candidate(op.name, tuple(by_name[n] for n in activation_inputs(ctx.storage, op)), lay,
                     f"{op.kind} on {lay}: partials, exchange, combine, apply", d.estimate, d.estimate, prog,
                     transient)
