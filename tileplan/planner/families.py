"""Op families: how each kind of op is distributed over tiles, keyed by op class.

An op's meaning (shape rule, float64 reference) sits with its class in ``tileplan.graph.core``;
how it is distributed sits here, with its family; its kernel sits in one module of
``tileplan.kernels``. A family answers three questions for the planner:

- ``storage(graph, op, idx, tensor, target)``: how a parameter operand is kept (``Storage``),
  or None to leave it to a later consumer (a value born in ``Intervals``);
- ``catalogued``: whether its candidates come from the GEMM catalogue (costed in pool workers,
  ``planner.catalogue``) or from ``candidates(ctx, op)`` in the planning process;

Its share of the model floor is a row of ``quality.FLOORS``, keyed by family name.

Families:

- ``Gemm`` (MatMul): private tile grids; B parameters in resident AMP panels.
- ``Pointwise`` (Add, Sub, Mul, Div, the unary ops, GeLU, Cast): runs where its output lies, every
  activation input in the same element intervals; a broadcast operand (a bias row, a scalar, a
  column) is read replicated on every tile.
- ``Rowwise`` (LayerNorm, Softmax, ReduceSum/Mean/Max over the last axis): ``planner.rowwise``.
- ``View`` (Reshape, Slice, Concat) and ``Transpose``: ``planner.views``.
- ``Gather`` (an embedding: a parameter table's rows by int32 indices): ``planner.gather``.

``family_of(op)`` walks the op's class hierarchy, so a new op is covered by its base class's row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..graph.core import Cast, Concat, Gather, Graph, MatMul, Op, Pointwise, Reshape, Rowwise, Slice, Tensor, Transpose
from ..layout import Intervals, Packed, PackedPanels
from ..layout.panels import panels_fit
from . import elementwise as ew
from . import gather, rowwise, views
from .candidates import Storage


@dataclass(frozen=True)
class Family:
    name: str
    catalogued: bool
    storage: Callable[[Graph, Op, int, Tensor, Any], Storage | None]
    candidates: Callable | None = None      # (ctx, op) -> list[Candidate]; None: from the catalogue


def _no_storage(graph: Graph, op: Op, idx: int, t: Tensor, target) -> None:
    return None


def _rowwise_storage(graph: Graph, op: Op, idx: int, t: Tensor, target) -> Storage | None:
    """LayerNorm's gamma and beta are resident on every tile (each tile normalises whole rows)."""
    return Storage(ew.replicated(t.shape, target.tiles), True) if idx > 0 else None


def _gemm_storage(graph: Graph, op: MatMul, idx: int, t: Tensor, target) -> Storage:
    tiles = target.tiles
    if idx == 1:
        grain = target.grain(t.dtype)
        n = t.shape[-2] if op.transpose_b else t.shape[-1]
        # AMP panels in panel-major index space (one fragment per panel in copies), the last panel
        # partial when grain does not divide N. Rows ending in a sub-word tail (N * itemsize % 8 != 0)
        # would leave the partial panel's rows off the 8-byte boundaries that AMP loads and exchange
        # need: those stay row-major (Packed falls back to Intervals) and the kernel packs B per call.
        # So do matrices narrower than one panel (they could be read as a single partial panel).
        lay = PackedPanels(grain, tiles) if panels_fit(n, grain, t.dtype.itemsize) else Packed(grain, tiles)
        return Storage(lay, True, op.transpose_b)
    return Storage(Intervals(tiles), True, op.transpose_a)


def _pointwise_storage(graph: Graph, op: Op, idx: int, t: Tensor, target) -> Storage | None:
    """A broadcast operand (bias row, scalar, column) is resident on every tile; a dense parameter
    operand is a value born in ``Intervals`` and converted where its consumer wants it."""
    if ew.broadcast_operand(graph, op) == idx:
        return Storage(ew.replicated(t.shape, target.tiles), True)
    return None


def _pointwise_candidates(ctx, op) -> list:
    """Elementwise candidates, and a residual Add's fused Add + LayerNorm ones (``planner.rowwise``)."""
    return ew.candidates(ctx, op) + rowwise.residual_candidates(ctx, op)


GEMM = Family("Gemm", True, _gemm_storage)
POINTWISE = Family("Pointwise", False, _pointwise_storage, _pointwise_candidates)
VIEW = Family("View", False, _no_storage, views.view_candidates)
ROWWISE = Family("Rowwise", False, _rowwise_storage, rowwise.candidates)
TRANSPOSE = Family("Transpose", False, _no_storage, views.transpose_candidates)
SLICE = Family("View", False, _no_storage, views.slice_candidates)
CONCAT = Family("View", False, _no_storage, views.concat_candidates)
GATHER = Family("Gather", False, gather.storage, gather.candidates)

FAMILIES: dict[type, Family] = {
    MatMul: GEMM,             # grids, serial K, reductions
    Pointwise: POINTWISE,     # every elementwise op: Add, Sub, Mul, Div, Neg, ..., GeLU
    Cast: POINTWISE,          # a conversion runs where its output lies, as any elementwise op
    Rowwise: ROWWISE,         # LayerNorm, Softmax, reductions over the last axis: whole rows
    Reshape: VIEW,            # a relabelling: free where the layout survives it
    Transpose: TRANSPOSE,     # a real rearrangement: exchange, then an on-tile copy or transpose
    Slice: SLICE,             # a column window of its input's layout: a relabelling where it is aligned
    Concat: CONCAT,           # each input copied into its column window of the output's layout
    Gather: GATHER,           # table column blocks, indices on their tiles: no data-dependent exchange
}


def family_of(op: Op) -> Family:
    for cls in type(op).__mro__:
        if cls in FAMILIES:
            return FAMILIES[cls]
    raise op.err("tileplan has no op family for this op kind (it cannot be planned)")
