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
a split piece reads its columns' slice).

The residual Add fuses into the LayerNorm after it (``LayerNormCall(residual=True)`` on whole rows,
``RowMomentsCall(residual=True)`` on split rows): one pass reads the Add's two inputs and writes
both the sum, which the residual stream still reads, and the norm. Selection keeps one layout per
value, so the fusion is two candidates, as the bias-GeLU one is: the Add's (``residual_candidates``,
offered through the Pointwise family) writes the sum in ``layout.Stored(layout)`` and the norm in
``layout`` (its bytes counted as the Add's transient); the LayerNorm's (``written_by_add``) reads
the sum in ``Stored(layout)`` and costs nothing. Nothing converts into ``Stored`` (``select``), so
the two are chosen together or not at all, and only when the fused pass, conversions included,
is cheaper: by the published figures it wins on short rows, ties on 1 x 1152 and loses on
3 x 1152 (``kernels.layernorm``).

A reduction's output ``[..., 1]`` has one element per input row, so ``WholeRows`` places it on the
same tiles. Softmax over another axis, and reductions without ``keepdims``, are rewritten before
planning (``planner.rewrite``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..graph.core import Add, LayerNorm, ReduceMax, ReduceMean, ReduceSum, Role, Softmax
from ..graph.dtypes import DType
from ..kernels import layernorm as ln
from ..kernels import softmax as sm
from ..kernels.layernorm import LayerNormCall
from ..kernels.rowreduce import RowReduceCall
from ..kernels.softmax import SoftmaxCall
from ..layout import SplitRows, Stored, WholeRows, rows_cols
from ..layout.split_rows import COLUMN_UNIT
from ..estimate.cost import Estimate
from ..estimate.detailed import cost_program
from ..program import Buffer, ComputeStep, Copy, ExchangeStep, Operand, Program
from .candidates import Candidate, activation_inputs
from .elementwise import replicated
from .gemm import _vertex

# One row per op: the kernel call on a tile's ``rows x cols``.
ROW_CALLS = {
    LayerNorm: lambda op, rows, cols, dtype: LayerNormCall(rows, cols, dtype, op.epsilon),
    Softmax: lambda op, rows, cols, dtype: SoftmaxCall(rows, cols, dtype, op.softmax_scale),
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
                        lambda op, rows, cols, dtype: sm.SoftmaxPartialCall(rows, cols, dtype, op.softmax_scale),
                        lambda op, rows, parts, own: sm.SoftmaxCombineCall(rows, parts, own, op.softmax_scale),
                        lambda op, rows, cols, dtype: sm.SoftmaxApplyCall(rows, cols, dtype, op.softmax_scale)),
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
    """``SplitRows`` for a tensor whose rows leave tiles idle: the counts of parts in ``SPLIT_PARTS``
    (no more than the row's 8-element units) that keep one row per group (the kernels' per-row costs
    dominate a tile with several short row pieces), or two parts when none does."""
    rows, cols = rows_cols(tuple(shape))
    if rows >= tiles:
        return []                       # whole rows already reach every tile
    units = -(-cols // COLUMN_UNIT)
    parts = [p for p in SPLIT_PARTS if p <= min(units, tiles // rows)] or [p for p in SPLIT_PARTS[:1] if p <= units]
    return [SplitRows(min(rows, tiles // p), p) for p in parts]


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
    if isinstance(op, LayerNorm):
        out += written_by_add(ctx, op)
    if not out:
        raise op.err(f"a row-wise op needs whole rows (or, for LayerNorm and Softmax, split rows); the pinned "
                     f"layouts of {x.name!r} and {y.name!r} differ or do not keep rows whole")
    return out


def _sources(ctx, prog, op, lay, add):
    """The buffers a row pass reads its rows from, and the one it writes them to besides its output:
    ``((x,), None)``; or, for a residual ``add`` fused in, ``((a, r), sum)`` with the sum (the Add's
    output) stored in ``Stored(lay)``."""
    if add is None:
        return (prog.add_buffer(ctx.tensor_buffer(ctx.graph.inputs_of(op)[0].name, lay)),), None
    srcs = tuple(prog.add_buffer(ctx.tensor_buffer(n, lay)) for n in add.inputs)
    return srcs, prog.add_buffer(ctx.tensor_buffer(add.output, Stored(lay)))


def _finish(ctx, op, lay, prog, add, desc: str) -> Candidate:
    """The candidate of a row pass's program: of ``op``, or, with a residual ``add`` fused in, of the
    Add (it writes the sum in ``Stored(lay)`` and the norm, which counts as its transient, as the
    bias-GeLU fusion counts the GeLU's output; the LayerNorm takes ``written_by_add``)."""
    g, target = ctx.graph, ctx.target
    d = cost_program(prog, target)
    transient = d.memory.by_kind.get("transient", np.zeros(target.tiles, dtype=np.int64))
    if add is None:
        by_name = {g.inputs_of(op)[0].name: lay,
                   **{n: replicated(g.tensors[n].shape, target.tiles) for n in op.inputs[1:]}}
        return Candidate(op.name, tuple(by_name[n] for n in activation_inputs(ctx.storage, op)), lay,
                         f"{op.kind} on {lay}{desc}", d.estimate, d.estimate, prog, transient)
    transient = transient + ctx.tile_bytes(op.output, lay)
    return Candidate(add.name, tuple(lay for _ in activation_inputs(ctx.storage, add)), Stored(lay),
                     f"add + layernorm on {lay}{desc}",
                     d.estimate, d.estimate, prog, transient)


def _candidate(ctx, op, lay, add=None) -> Candidate:
    """Whole rows: one kernel call per tile on its rows (with ``add``: the fused Add + LayerNorm)."""
    g, target = ctx.graph, ctx.target
    x, y = g.inputs_of(op)[0], g.output_of(op)
    cols = x.shape[-1]
    prog = Program()
    srcs, total = _sources(ctx, prog, op, lay, add)
    extra = [prog.add_buffer(ctx.tensor_buffer(n, replicated(g.tensors[n].shape, target.tiles)))
             for n in op.inputs[1:]]
    dst = prog.add_buffer(ctx.tensor_buffer(y.name, lay))
    per_row = y.size // x.rows                    # output elements per row: cols, or 1 for a reduction
    om = lay.owner_map(x.shape, x.dtype, target.tiles)
    vertices = []
    for t, s, e in zip(om.tile.tolist(), om.start.tolist(), om.stop.tolist()):
        rows = (e - s) // cols
        call = ROW_CALLS[type(op)](op, rows, cols, x.dtype)
        if add is not None:
            call = LayerNormCall(rows, cols, x.dtype, op.epsilon, residual=True)
        ins = tuple(Operand(b.name, 0, rows * cols) for b in srcs) + tuple(Operand(b.name, 0, cols) for b in extra)
        outs = ((Operand(total.name, 0, rows * cols),) if add is not None else ()) + \
            (Operand(dst.name, 0, rows * per_row),)
        vertices.append(_vertex(t, call, ins, outs, ctx.caches))
    prog.steps.append(ComputeStep(f"{(add or op).name}.rows", tuple(vertices)))
    return _finish(ctx, op, lay, prog, add, "")


def _split_candidate(ctx, op, lay: SplitRows, add=None) -> Candidate:
    """The four supersteps of a split row (module docstring) on ``lay``, input and output alike (with
    ``add``: the residual Add fused into the moments, which also write the sum)."""
    g, target = ctx.graph, ctx.target
    x, y = g.inputs_of(op)[0], g.output_of(op)
    chain = SPLIT_CHAINS[type(op)]
    name = (add or op).name
    prog = Program()
    srcs, total = _sources(ctx, prog, op, lay, add)
    rep = {n: replicated(g.tensors[n].shape, target.tiles) for n in op.inputs[1:]}
    params = [prog.add_buffer(ctx.tensor_buffer(n, rep[n])) for n in op.inputs[1:]]
    dst = prog.add_buffer(ctx.tensor_buffer(y.name, lay))
    _, parts = lay.split(x.shape)
    own_lay, others_lay = lay.partials(x.shape, chain.width)
    pshape = (x.rows, parts * chain.width)
    own = prog.add_buffer(Buffer(f"{name}.partials@{lay}", own_lay, pshape, DType.FP32))
    others = prog.add_buffer(Buffer(f"{name}.others@{lay}", others_lay, pshape, DType.FP32))
    stats = prog.add_buffer(Buffer(f"{name}.stats@{lay}", lay.row_stats(x.shape, chain.stats),
                                   (x.rows, chain.stats), DType.FP32))
    partial, combine, apply = [], [], []
    shapes: dict = {}          # (rows, cols, part, first column) -> the three vertices of tile 0's kind
    for t, _, part, rows, cols, c0 in zip(*(a.tolist() for a in lay.pieces(x.shape))):
        key = (rows, cols, part, c0)
        if key not in shapes:
            pieces = tuple(Operand(b.name, 0, rows * cols) for b in srcs)
            piece = Operand(total.name, 0, rows * cols) if add is not None else pieces[0]   # the rows normalised
            mine = Operand(own.name, 0, rows * chain.width)
            row_stats = Operand(stats.name, 0, rows * chain.stats)
            call = chain.partial(op, rows, cols, x.dtype)
            if add is not None:
                call = ln.RowMomentsCall(rows, cols, x.dtype, residual=True)
            shapes[key] = (
                _vertex(0, call, pieces, ((piece,) if add is not None else ()) + (mine,), ctx.caches),
                _vertex(0, chain.combine(op, rows, parts, part),
                        (mine, Operand(others.name, 0, (parts - 1) * rows * chain.width)), (row_stats,), ctx.caches),
                _vertex(0, chain.apply(op, rows, cols, x.dtype),
                        (piece, row_stats) + tuple(Operand(b.name, c0, cols) for b in params),
                        (Operand(dst.name, 0, rows * cols),), ctx.caches))
        for step, v in zip((partial, combine, apply), shapes[key]):
            step.append(dataclasses.replace(v, tile=t))
    prog.steps += [ComputeStep(f"{name}.partial", tuple(partial)),
                   ExchangeStep(f"{name}.partials", (Copy(own.name, others.name),)),
                   ComputeStep(f"{name}.combine", tuple(combine)),
                   ComputeStep(f"{name}.apply", tuple(apply))]
    return _finish(ctx, op, lay, prog, add, ": partials, exchange, combine, apply")


# ---- the residual Add fused into the LayerNorm after it ------------------------------------

def fusable_norm(graph, add) -> LayerNorm | None:
    """The LayerNorm a residual Add may fuse into (``LayerNormCall(residual=True)``, or the split
    moments with ``residual``): the Add of two activations of the output's shape (no broadcast), in
    FP16 or FP32 unscaled; one of its consumers a LayerNorm of its output, in its type, whose gamma
    and beta are resident (read from storage, not values converted when it runs); the sum unpinned
    (it is stored in ``Stored(layout)``)."""
    if not isinstance(add, Add):
        return None
    ins, h = graph.inputs_of(add), graph.output_of(add)
    if any(t.shape != h.shape or t.dtype is not h.dtype or t.scale or t.role is Role.PARAMETER for t in ins):
        return None
    if h.dtype not in (DType.FP16, DType.FP32) or h.scale or h.layout is not None:
        return None
    norms = [op for op in graph.consumers.get(h.name, []) if isinstance(op, LayerNorm) and op.inputs[0] == h.name]
    if len(norms) != 1:
        return None
    return norms[0]


def residual_candidates(ctx, op) -> list[Candidate]:
    """The fused Add + LayerNorm candidates of a residual Add (``fusable_norm``): one per row layout
    the LayerNorm offers, as the LayerNorm would cost them (``SPLIT_KEEP`` split ones), when its
    gamma and beta are resident."""
    norm = fusable_norm(ctx.graph, op)
    if norm is None or activation_inputs(ctx.storage, norm) != [norm.inputs[0]]:
        return []
    g, target = ctx.graph, ctx.target
    x, y = g.inputs_of(norm)[0], g.output_of(norm)
    out, split = [], []
    for lay in row_layouts(x, y, target.tiles, norm):
        if isinstance(lay, SplitRows):
            split.append(_split_candidate(ctx, norm, lay, add=op))
        else:
            out.append(_candidate(ctx, norm, lay, add=op))
    split.sort(key=lambda c: (c.estimate.cycles, c.estimate.total_memory))
    return out + split[:SPLIT_KEEP]


def written_by_add(ctx, op) -> list[Candidate]:
    """A LayerNorm whose residual Add may do its work (``residual_candidates``): per layout of those,
    a candidate that reads the sum in ``Stored(layout)`` (only the fused Add writes it) and does
    nothing, its output already written."""
    g = ctx.graph
    x = g.inputs_of(op)[0]
    add = g.producers.get(x.name)
    if add is None or fusable_norm(g, add) is not op or activation_inputs(ctx.storage, op) != [x.name]:
        return []
    lays = [c.out.base for c in residual_candidates(ctx, add)]
    return [Candidate(op.name, (Stored(lay),), lay, f"fused into the residual Add's pass on {lay}",
                      Estimate(), Estimate(), Program(), np.zeros(ctx.target.tiles, dtype=np.int64))
            for lay in lays]


# ---- the family's share of the model floor -------------------------------------------------

def fusable_producer(graph, storage, op):
    """The residual Add whose pass may do ``op``'s work (``written_by_add``), or None."""
    if not isinstance(op, LayerNorm):
        return None
    x = graph.inputs_of(op)[0]
    add = graph.producers.get(x.name)
    if add is None or fusable_norm(graph, add) is not op or activation_inputs(storage, op) != [x.name]:
        return None
    return add


def _cycles(call, target) -> int:
    from ..kernels import dispatch
    return dispatch(call, target).cycles(call, target)


def floor_cycles(graph, op, target, fused: bool = False) -> int:
    """A lower bound on every candidate of ``op`` (``quality.rowwise_op_floor``): the fewest cycles,
    over the layouts ``row_layouts`` offers, of its kernels on the fullest tile: whole rows
    ``ceil(rows / tiles)`` a tile; split rows the partial, combine and apply of the largest piece
    plus the partials exchange's sync (each step's slowest tile is at least the fullest piece's).
    ``fused``: the residual Add + LayerNorm pass instead (``residual_candidates``)."""
    x, y = graph.inputs_of(op)[0], graph.output_of(op)
    best = None
    for lay in row_layouts(x, y, target.tiles, op):
        if isinstance(lay, SplitRows):
            chain = SPLIT_CHAINS[type(op)]
            g, p = lay.split(x.shape)
            rows, cols = int(np.diff(lay.row_bounds(x.shape)).max()), int(np.diff(lay.col_bounds(x.shape)).max())
            partial = ln.RowMomentsCall(rows, cols, x.dtype, residual=True) if fused \
                else chain.partial(op, rows, cols, x.dtype)
            cycles = (_cycles(partial, target) + _cycles(chain.combine(op, rows, p, 0), target)
                      + _cycles(chain.apply(op, rows, cols, x.dtype), target) + target.sync_cycles)
        else:
            rows = -(-x.rows // min(lay.owners, target.tiles))
            call = LayerNormCall(rows, x.shape[-1], x.dtype, op.epsilon, residual=True) if fused \
                else ROW_CALLS[type(op)](op, rows, x.shape[-1], x.dtype)
            cycles = _cycles(call, target)
        best = cycles if best is None else min(best, cycles)
    return best
