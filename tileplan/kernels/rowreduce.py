"""Row reductions over the last axis (ReduceSum, ReduceMean, ReduceMax), FP32 accumulation, and
their split-row pair (an FP32 partial per row piece, then a combine).

What each call computes (``x`` a tile buffer ``[rows, cols]`` row-major, FP16 or FP32):

- ``RowReduceCall(fn)``: per row ``sum`` = the FP32 sum in column order, ``mean`` = that sum
  divided by ``cols`` in FP32, ``max`` = the maximum (a NaN makes it NaN); output ``[rows]``
  rounded to ``dtype``.
- ``RowReducePartialCall(fn)``: a row piece's ``[rows]`` FP32 partial: its sum (``sum`` and
  ``mean``) or maximum (``max``), not rounded.
- ``RowReduceCombineCall(fn)``: ``parts`` partials ``[parts, rows]`` FP32 (part-major) summed in
  part order or maximised, ``mean`` divided by ``total_cols`` (the whole row's length) in FP32;
  output ``[rows]`` rounded to ``dtype``. A whole-row ``RowReduceCall`` is a partial and a combine
  with one part, bit for bit.

Cycle formulas: DERIVED from the Add formula of ``pointwise.py`` and the reduction formula of
``cycles.py`` (ipu-stack's
hardware-fitted ``f16_add_cycles`` and ``f16_reduction_cycles``; no public figure for a row
reduction). Accumulating a row into an FP32 register is one 64-bit load and add per vector, the
work of the aligned Add's per-element term: six workers stream ``ADD_VECTOR_STEP`` (24) elements
per 24 cycles, so a worker streams 4 halves (2 floats) per 24 cycles. A row costs the Add's
per-row pointer reset ``ADD_ROW_RESET`` (234, which also covers the horizontal sum and the store);
a row cut over the six workers adds the merge of their six FP32 partials, priced as the FP32
reduction loop ``reduce_work(fp32, 1, 6)`` (126). Setup: ``ADD_VECTOR_SETUP`` (492). Two variants,
one per schedule of ``rowwise.RowCost`` (dispatch takes the cheaper):

    rows:  492 + ceil(rows / 6) * (234 + ceil(cols / 4) * 24)
    split: 492 + (rows // 6) * (234 + ceil(cols / 4) * 24) + (rows % 6) * (360 + ceil(ceil(cols / 6) / 4) * 24)

(FP32: 2 elements a group). Max costs as sum (one vector max per load); mean adds one multiply per
row, inside the per-row term. The partial is the same loop without the output rounding (same
price); the combine is the reduction loop on ``rows`` FP32 values of ``parts`` addends:
``REDUCE_SETUP + reduce_work(fp32, rows, parts)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..errors import check
from ..graph.dtypes import DType
from ..target import Target
from . import rowwise as rw
from .calls import describe
from .codelets import CodeletSource, _param, _vec, body, codelet_key, render
from .cycles import REDUCE_SETUP, reduce_work
from .pointwise import ADD_ROW_RESET, ADD_VECTOR_SETUP, ADD_VECTOR_STEP
from .reference import _f32, _result, operand, round_to
from .registry import Variant

FP32 = DType.FP32
FNS = ("sum", "mean", "max")
VECTOR_LANES = {DType.FP16: 4, DType.FP32: 2}   # elements per 64-bit vector
WORKERS_MERGED = 6                             # partials merged when a row is cut over the workers


def _fn(call: object, fn: object) -> None:
    check(fn in FNS, f"{type(call).__name__}: fn must be one of {', '.join(FNS)}, got {fn!r}")


@dataclass(frozen=True)
class RowReduceCall:
    """``fn`` (sum, mean, max) of each row of ``x[rows, cols]`` (``dtype`` fp16/fp32) in FP32;
    input ``x``, output ``out`` ``[rows]`` ``dtype``."""

    rows: int
    cols: int
    dtype: DType
    fn: str = "sum"
    primitive: ClassVar[str] = "row_reduce"
    __str__ = describe

    def __post_init__(self):
        rw.positive(self, rows=self.rows, cols=self.cols)
        rw.row_dtype(self, dtype=self.dtype)
        _fn(self, self.fn)

    def operand_types(self) -> tuple[list[DType], list[DType]]:
        return [self.dtype], [self.dtype]

    def key(self) -> str:
        return f"row_reduce_{self.fn}_{self.dtype}"


@dataclass(frozen=True)
class RowReducePartialCall:
    """FP32 partial ``[rows]`` of a row piece ``x[rows, cols]``: the sum (``fn`` sum or mean) or
    the maximum (``max``)."""

    rows: int
    cols: int
    dtype: DType
    fn: str = "sum"
    primitive: ClassVar[str] = "row_reduce_partial"
    __str__ = describe

    def __post_init__(self):
        rw.positive(self, rows=self.rows, cols=self.cols)
        rw.row_dtype(self, dtype=self.dtype)
        _fn(self, self.fn)

    def operand_types(self) -> tuple[list[DType], list[DType]]:
        return [self.dtype], [FP32]

    def key(self) -> str:
        return f"row_reduce_partial_{'max' if self.fn == 'max' else 'sum'}_{self.dtype}"


@dataclass(frozen=True)
class RowReduceCombineCall:
    """Combine ``parts`` FP32 partials ``[parts, rows]`` of each row (``mean`` divides by
    ``total_cols``) into ``out`` ``[rows]`` ``dtype``."""

    rows: int
    parts: int
    total_cols: int
    dtype: DType
    fn: str = "sum"
    primitive: ClassVar[str] = "row_reduce_combine"
    __str__ = describe

    def __post_init__(self):
        rw.positive(self, rows=self.rows, parts=self.parts, total_cols=self.total_cols)
        rw.row_dtype(self, dtype=self.dtype)
        _fn(self, self.fn)

    def operand_types(self) -> tuple[list[DType], list[DType]]:
        return [FP32], [self.dtype]

    def key(self) -> str:
        return f"row_reduce_combine_{self.fn}_{self.dtype}"


# ---- cycles -----------------------------------------------------------------------------

# DERIVED from cycles.py's Add and reduction formulas; see the docstring.
ROWREDUCE_COST = rw.RowCost(setup=ADD_VECTOR_SETUP, row_whole=ADD_ROW_RESET,
                            row_split=ADD_ROW_RESET + reduce_work(FP32, 1, WORKERS_MERGED, WORKERS_MERGED),
                            group=VECTOR_LANES[DType.FP16], group_cycles=ADD_VECTOR_STEP,
                            fp32_group=VECTOR_LANES[DType.FP32])


def rowreduce_cycles(call: RowReduceCall | RowReducePartialCall, target: Target, schedule: str) -> int:
    return ROWREDUCE_COST.cycles(call.rows, call.cols, call.dtype, target.workers, schedule)


def combine_cycles(call: RowReduceCombineCall, target: Target) -> int:
    return REDUCE_SETUP + reduce_work(FP32, call.rows, call.parts, target.workers)


# ---- numpy semantics --------------------------------------------------------------------

def _partial32(fn: str, v: np.ndarray, axis: int = -1) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return rw.nan_max(v, axis) if fn == "max" else rw.seq_sum(v, axis)


def _finish(fn: str, acc: np.ndarray, cols: int, dtype: DType) -> np.ndarray:
    if fn == "mean":
        acc = acc / rw.F32(cols)
    return round_to(acc, dtype)


def rowreduce(call: RowReduceCall, x: np.ndarray) -> np.ndarray:
    v = _f32(operand(x, call.dtype, call.rows * call.cols, "x")).reshape(-1, call.rows, call.cols)
    return _result(_finish(call.fn, _partial32(call.fn, v), call.cols, call.dtype), np.asarray(x).shape[:-1])


def partial(call: RowReducePartialCall, x: np.ndarray) -> np.ndarray:
    v = _f32(operand(x, call.dtype, call.rows * call.cols, "x")).reshape(-1, call.rows, call.cols)
    return _result(_partial32(call.fn, v), np.asarray(x).shape[:-1])


def combine(call: RowReduceCombineCall, partials: np.ndarray) -> np.ndarray:
    p = operand(partials, FP32, call.parts * call.rows, "partials").reshape(-1, call.parts, call.rows)
    acc = _partial32(call.fn, p, axis=-2)
    return _result(_finish(call.fn, acc, call.total_cols, call.dtype), np.asarray(partials).shape[:-1])


# ---- codelets ---------------------------------------------------------------------------

def rowreduce_codelet(call: RowReduceCall, variant: Variant, schedule: str) -> CodeletSource:
    """Rows over workers whatever the schedule (per-row outputs, one summation order)."""
    key = codelet_key(variant.name, call)
    fields = (_vec("input", "x", call.dtype, call.rows * call.cols), _vec("output", "out", call.dtype, call.rows),
              _param("rows", call.rows), _param("cols", call.cols))
    code = body("rowreduce", stage="rows", fn=call.fn, mean=call.fn == "mean", out=call.dtype.cpp)
    return render(key, code, fields, f"row {call.fn} in FP32, {call.dtype} out")


def partial_codelet(call: RowReducePartialCall, variant: Variant, schedule: str) -> CodeletSource:
    key = codelet_key(variant.name, call)
    fields = (_vec("input", "x", call.dtype, call.rows * call.cols), _vec("output", "partial", FP32, call.rows),
              _param("rows", call.rows), _param("cols", call.cols))
    fn = "max" if call.fn == "max" else "sum"
    return render(key, body("rowreduce", stage="partial", fn=fn), fields, f"FP32 row {fn} of a row piece")


def combine_codelet(call: RowReduceCombineCall, variant: Variant) -> CodeletSource:
    key = codelet_key(variant.name, call)
    fields = (_vec("input", "partials", FP32, call.parts * call.rows), _vec("output", "out", call.dtype, call.rows),
              _param("rows", call.rows), _param("parts", call.parts), _param("totalCols", call.total_cols))
    fn = "max" if call.fn == "max" else "sum"
    code = body("rowreduce", stage="combine", fn=fn, mean=call.fn == "mean", out=call.dtype.cpp)
    return render(key, code, fields, f"combine FP32 row {call.fn} partials, {call.dtype} out")


# ---- variant rows -----------------------------------------------------------------------

def variants() -> list[Variant]:
    from .registry import BOTH, SPECIAL, is_

    rows = []
    for d in rw.ROW_DTYPES:
        rows += rw.schedule_variants("row_reduce", "row_reduce", d, (), rowreduce_cycles, rowreduce,
                                     rowreduce_codelet, "row sum, mean or max, FP32 accumulation")
        rows += rw.schedule_variants("row_reduce_partial", "row_reduce_partial", d, (), rowreduce_cycles, partial,
                                     partial_codelet, "FP32 row sum or max of a row piece")
        rows.append(Variant(f"row_reduce_combine_{d}", "row_reduce_combine", BOTH, SPECIAL, (is_("dtype", d),),
                            combine_cycles, combine, combine_codelet, doc="combine a row's FP32 partials"))
    return rows
