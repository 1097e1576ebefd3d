"""Softmax over the last axis: the whole-row kernel and the split-row chain (partial, combine,
apply), FP32 inside, the output rounded once to its type.

What each call computes (``x`` a tile buffer ``[rows, cols]`` row-major, FP16 or FP32; ``exp`` is
evaluated in float64 and rounded to FP32, ``rowwise.exp32``):

- ``SoftmaxCall``: per row ``m = max(x)``, ``s = sum(exp(x - m))`` (FP32, column order),
  ``y = exp(x - m) * (1 / s)`` rounded to ``dtype``. A NaN anywhere in a row makes the row NaN; a
  row of ``-inf`` gives NaN (as numpy and torch).
- ``SoftmaxPartialCall``: a row piece's ``[rows, 2]`` FP32 ``(m, s)``, as above on the piece.
- ``SoftmaxCombineCall``: a row's ``parts`` partials ``[parts, rows, 2]`` (part-major) merged in
  part order: ``M = max_p m_p``, ``S = sum_p s_p * exp(m_p - M)`` (FP32), giving ``[rows, 2]`` FP32
  ``(M, S)``. With one part it returns the partial unchanged (``exp(0) = 1``).
- ``SoftmaxApplyCall``: ``y = exp(x - M) * (1 / S)`` on a piece ``[rows, cols]`` with the row's
  combined ``stats`` ``[rows, 2]`` FP32.

So ``SoftmaxCall`` is partial, combine with one part and apply, bit for bit.

Every call takes ``scale`` (positive, default 1): the softmax of ``scale * x``, attention's
``1/sqrt(d)`` folded in (``graph.core.Softmax``). The max stays the max of ``x`` (for a positive
scale ``max(scale * x) = scale * max(x)``); every exp argument ``x - m`` becomes ``(x - m) * scale``
(FP32; with ``scale = 1`` that multiply is exact, so the unscaled results are unchanged bit for
bit), and the combine rescales each part by ``exp((m_p - M) * scale)``.

Cycle formulas: FITTED (ipu-stack hardware figures, REFERENCES.md, "Transformer kernels on
IPU21", FP16). Two worker schedules (``rowwise.RowCost``), two variants per type; dispatch takes
the cheaper:

- ``softmax_rows_*``: each worker whole rows, ``ceil(rows/6)`` rounds:
  ``294 + ceil(rows/6) * (192 + ceil(cols/16) * 257)`` (``SOFTMAX_COST``). Fitted on "softmax,
  whole rows" 8 rows x 64 keys (2,736), "whole row" 1 row x 768 (12,822) and "rows split over
  workers ... (whole rows: 25,350)" 7 or 8 rows x 768: the per-group cost solved exactly from the
  two 768-key points (22,614 / 1,408 = 16.06 cycles per key, rounded to 257 per 16 keys), the
  setup taken as the AMP kernel's 294 and the per-row term from 1 x 768. Residuals: 8 x 64 -2
  (2,734), 1 x 768 0, 7 and 8 x 768 0. 1 x 768's later revision (12,258) is over-priced by 564
  (+4.6%); "25 valid of 64 padded" (2,634) is a masked kernel, not modelled.
- ``softmax_split_*``: ``rows // 6`` rounds of whole rows, then the other rows each cut over the
  six workers: a cut row costs ``3,062 + ceil(ceil(cols/6)/16) * 257``. The per-row term is fitted
  exactly on "segmented softmax, 729 keys" (5,412: one row cut over the workers, residual 0; the
  later revision 5,232 is over-priced by 180, +3.4%), with setup and group cost shared with the
  whole-row fit. Cross-check (not fitted): "rows split over workers, 7 / 8 rows x 768 padded keys",
  20,226 / 20,244 measured, modelled 17,940 / 23,058 (-11.3% / +13.9%); the measured kernel
  balances both counts alike, which a per-row formula cannot.

DERIVED (no public figure for the split pair): the partial (max pass, then exp and sum) and the
apply (exp, scale, store) each evaluate one exp per element, which dominates the whole-row
kernel's per-element cost: each is priced with the whole-row coefficients (an upper bound; the
pair costs about twice the whole-row kernel, the price of splitting a row over tiles). FP32
operands: the arithmetic is FP32 either way and the exp dominates, so the same coefficients
(ASSUMED). The combine: ``REDUCE_SETUP + reduce_work(fp32, 2 rows, 3 parts)`` (max, rescale and
add per part, the reduction loop of ``cycles.py``) plus ``rows * parts`` exps at the whole-row
kernel's per-key rate on the six workers.

The scale's share, DERIVED (no public figure for a scaled softmax): nothing per element. An exp
kernel reduces its argument as ``exp(y) = exp2(y * log2(e))``, so it already multiplies every
argument by a constant; the scale folds into that constant (``scale * log2(e)``), the way
FlashAttention-2 folds its softmax scale (``softmax_scale_log2`` and ``scale_apply_exp2`` in
``csrc/flash_attn/src/softmax.h``). What remains is per row: the row's max times that constant,
one FP32 multiply by one worker, ``SOFTMAX_SCALE_ROW`` (one issue slot in six while all six workers
run) added to each row's cost in both schedules, and to the combine's per row. ASSUMED: that the
fitted kernel's exp does that range reduction (its instruction stream is not published). Against
the separate Mul it replaces (a pointwise pass over ``[B, H, T, T]``, about one cycle per element
plus its setup and any layout conversion), this is ``rows / 6 * 6`` cycles per tile.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..errors import check
from ..graph.dtypes import DType
from ..target import Target
from . import rowwise as rw
from .calls import describe
from .codelets import CodeletSource, _param, _vec, body, codelet_key, render
from .cycles import REDUCE_SETUP, ceil_div, reduce_work
from .reference import _f32, _result, operand, round_to
from .registry import Variant

FP32 = DType.FP32
ROW_STATS = 2        # (max, sum of exp) per row


def _scale(call) -> None:
    s = call.scale
    check(isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s) and s > 0,
          f"{type(call).__name__}: scale must be a positive finite number, got {s!r}")


# ---- calls ------------------------------------------------------------------------------

@dataclass(frozen=True)
class SoftmaxCall:
    """Whole-row softmax of ``scale * x[rows, cols]`` (``dtype`` fp16/fp32) over ``cols``; input
    ``x``, output ``y`` ``[rows, cols]`` ``dtype``."""

    rows: int
    cols: int
    dtype: DType
    scale: float = 1.0
    primitive: ClassVar[str] = "softmax"
    __str__ = describe

    def __post_init__(self):
        rw.positive(self, rows=self.rows, cols=self.cols)
        rw.row_dtype(self, dtype=self.dtype)
        _scale(self)

    def operand_types(self) -> tuple[list[DType], list[DType]]:
        return [self.dtype], [self.dtype]

    def key(self) -> str:
        return f"softmax_{self.dtype}"


@dataclass(frozen=True)
class SoftmaxPartialCall:
    """``[rows, 2]`` FP32 ``(max, sum exp((x - max) * scale))`` of a row piece ``x[rows, cols]``."""

    rows: int
    cols: int
    dtype: DType
    scale: float = 1.0
    primitive: ClassVar[str] = "softmax_partial"
    __str__ = describe

    def __post_init__(self):
        rw.positive(self, rows=self.rows, cols=self.cols)
        rw.row_dtype(self, dtype=self.dtype)
        _scale(self)

    def operand_types(self) -> tuple[list[DType], list[DType]]:
        return [self.dtype], [FP32]

    def key(self) -> str:
        return f"softmax_partial_{self.dtype}"


@dataclass(frozen=True)
class SoftmaxCombineCall:
    """Merge ``parts`` partials ``[parts, rows, 2]`` FP32 of each row into ``[rows, 2]`` FP32
    ``(M, S)``. Inputs ``partials``; or, with ``own`` (a part index), ``mine`` ``[rows, 2]`` (that
    part, computed on this tile) and ``partials`` ``[parts - 1, rows, 2]`` (the others in part
    order): the merge is the same, in part order."""

    rows: int
    parts: int
    own: int = -1                     # -1: all parts in `partials`; else this tile's part, in `mine`
    scale: float = 1.0                # each part's sum rescaled by exp((m_p - M) * scale)
    primitive: ClassVar[str] = "softmax_combine"
    __str__ = describe

    def __post_init__(self):
        rw.positive(self, rows=self.rows, parts=self.parts)
        rw.own_part(self, self.own, self.parts)
        _scale(self)

    def operand_types(self) -> tuple[list[DType], list[DType]]:
        return [FP32] * (2 if self.own >= 0 else 1), [FP32]

    def key(self) -> str:
        return "softmax_combine_fp32" + ("_own" if self.own >= 0 else "")


@dataclass(frozen=True)
class SoftmaxApplyCall:
    """``y = exp((x - M) * scale) * (1 / S)`` on a piece ``x[rows, cols]`` (``dtype``) with ``stats``
    ``[rows, 2]`` FP32 ``(M, S)``; inputs ``x``, ``stats``; output ``y`` ``[rows, cols]``."""

    rows: int
    cols: int
    dtype: DType
    scale: float = 1.0
    primitive: ClassVar[str] = "softmax_apply"
    __str__ = describe

    def __post_init__(self):
        rw.positive(self, rows=self.rows, cols=self.cols)
        rw.row_dtype(self, dtype=self.dtype)
        _scale(self)

    def operand_types(self) -> tuple[list[DType], list[DType]]:
        return [self.dtype, FP32], [self.dtype]

    def key(self) -> str:
        return f"softmax_apply_{self.dtype}"


# ---- cycles -----------------------------------------------------------------------------

# FITTED (ipu-stack hardware figures, REFERENCES.md); see the docstring.
SOFTMAX_SETUP = 294              # as the AMP kernel's setup (cycles.AMP_SETUP's source)
SOFTMAX_ROW_WHOLE = 192          # per row on one worker (1 x 768: 12,822)
SOFTMAX_ROW_SPLIT = 3062         # per row cut over the workers (segmented, 729 keys: 5,412)
SOFTMAX_GROUP = 16               # keys per group
SOFTMAX_GROUP_CYCLES = 257       # per group per worker (from 7/8 x 768 whole rows 25,350 and 1 x 768)
SOFTMAX_COST = rw.RowCost(SOFTMAX_SETUP, SOFTMAX_ROW_WHOLE, SOFTMAX_ROW_SPLIT, SOFTMAX_GROUP, SOFTMAX_GROUP_CYCLES)
COMBINE_ADDENDS_PER_PART = 3     # max, rescale and add per value and part
# DERIVED (module docstring): a scale's share, per row: one FP32 multiply (the row's max times the
# exp's folded constant) by one worker, one issue slot in six while all six workers run.
SOFTMAX_SCALE_ROW = 6
SCALED_COST = dataclasses.replace(SOFTMAX_COST, row_whole=SOFTMAX_ROW_WHOLE + SOFTMAX_SCALE_ROW,
                                  row_split=SOFTMAX_ROW_SPLIT + SOFTMAX_SCALE_ROW)


def softmax_cycles(call: SoftmaxCall | SoftmaxPartialCall | SoftmaxApplyCall, target: Target, schedule: str) -> int:
    """Whole-row softmax, and (DERIVED) its partial and apply, plus a scale's share (DERIVED): see
    the module docstring."""
    cost = SOFTMAX_COST if call.scale == 1.0 else SCALED_COST
    return cost.cycles(call.rows, call.cols, call.dtype, target.workers, schedule)


def combine_cycles(call: SoftmaxCombineCall, target: Target) -> int:
    exps = ceil_div(ceil_div(call.rows * call.parts, target.workers), SOFTMAX_GROUP) * SOFTMAX_GROUP_CYCLES
    scaled = ceil_div(call.rows, target.workers) * SOFTMAX_SCALE_ROW if call.scale != 1.0 else 0
    return (REDUCE_SETUP + reduce_work(FP32, ROW_STATS * call.rows, COMBINE_ADDENDS_PER_PART * call.parts,
                                       target.workers) + exps + scaled)


# ---- numpy semantics --------------------------------------------------------------------

def _rows(x: np.ndarray, call) -> np.ndarray:
    return _f32(operand(x, call.dtype, call.rows * call.cols, "x")).reshape(-1, call.rows, call.cols)


def _exp_of(d: np.ndarray, scale: float) -> np.ndarray:
    """``exp(d * scale)`` of FP32 differences ``d`` (the FP32 product, then ``rw.exp32``)."""
    return rw.exp32(d * rw.F32(scale))


def piece_stats(v: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """``[..., rows, 2]`` FP32 ``(m, s)`` of FP32 rows ``v[..., rows, cols]``."""
    m = rw.nan_max(v)
    with np.errstate(over="ignore", invalid="ignore"):
        s = rw.seq_sum(_exp_of(v - m[..., None], scale))
    return np.stack([m, s], axis=-1)


def merge_stats(parts: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """``[..., parts, rows, 2]`` -> ``[..., rows, 2]`` ``(M, S)``, in part order."""
    m = rw.nan_max(parts[..., 0], axis=-2)
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = parts[..., 1] * _exp_of(parts[..., 0] - m[..., None, :], scale)
        return np.stack([m, rw.seq_sum(scaled, axis=-2)], axis=-1)


def normalise(v: np.ndarray, stats: np.ndarray, dtype: DType, scale: float = 1.0) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        e = _exp_of(v - stats[..., 0:1], scale)
        return round_to(e * (rw.F32(1.0) / stats[..., 1:2]), dtype)


def softmax(call: SoftmaxCall, x: np.ndarray) -> np.ndarray:
    v = _rows(x, call)
    stats = merge_stats(piece_stats(v, call.scale)[:, None], call.scale)
    y = normalise(v, stats, call.dtype, call.scale)
    return _result(y.reshape(-1, call.rows * call.cols), np.asarray(x).shape[:-1])


def partial(call: SoftmaxPartialCall, x: np.ndarray) -> np.ndarray:
    stats = piece_stats(_rows(x, call), call.scale)
    return _result(stats.reshape(-1, call.rows * ROW_STATS), np.asarray(x).shape[:-1])


def combine(call: SoftmaxCombineCall, *ins: np.ndarray) -> np.ndarray:
    """``stats`` ``[rows * 2]`` from ``partials`` (or, with ``own``, ``mine`` and the other parts)."""
    mine, partials = ins if call.own >= 0 else (None, *ins)
    others = operand(partials, FP32, (call.parts - (call.own >= 0)) * call.rows * ROW_STATS, "partials")
    if mine is not None:
        mine = operand(mine, FP32, call.rows * ROW_STATS, "mine")
    stats = merge_stats(rw.with_own(others, mine, call.own, call.parts, call.rows, ROW_STATS), call.scale)
    return _result(stats.reshape(-1, call.rows * ROW_STATS), np.asarray(partials).shape[:-1])


def apply(call: SoftmaxApplyCall, x: np.ndarray, stats: np.ndarray) -> np.ndarray:
    s = operand(stats, FP32, call.rows * ROW_STATS, "stats").reshape(-1, call.rows, ROW_STATS)
    y = normalise(_rows(x, call), s, call.dtype, call.scale)
    return _result(y.reshape(-1, call.rows * call.cols), np.asarray(x).shape[:-1])


# ---- codelets ---------------------------------------------------------------------------

def _scale_param(call) -> tuple:
    return (_param("scale", float(np.float32(call.scale)), "float"),)


def softmax_codelet(call: SoftmaxCall, variant: Variant, schedule: str) -> CodeletSource:
    key = codelet_key(variant.name, call)
    size = call.rows * call.cols
    fields = (_vec("input", "x", call.dtype, size), _vec("output", "y", call.dtype, size),
              _param("rows", call.rows), _param("cols", call.cols)) + _scale_param(call)
    code = body("softmax", stage="rows", schedule=rw.schedule(schedule), out=call.dtype.cpp)
    return render(key, code, fields, f"softmax over rows of cols, FP32 max and sum, {call.dtype} out")


def partial_codelet(call: SoftmaxPartialCall, variant: Variant, schedule: str) -> CodeletSource:
    """Rows over workers whatever the schedule (per-row outputs, one summation order)."""
    key = codelet_key(variant.name, call)
    fields = (_vec("input", "x", call.dtype, call.rows * call.cols),
              _vec("output", "partial", FP32, call.rows * ROW_STATS),
              _param("rows", call.rows), _param("cols", call.cols)) + _scale_param(call)
    return render(key, body("softmax", stage="partial"), fields,
                  "partial softmax statistics (max, sum exp(x - max)) of a row piece, FP32")


def combine_codelet(call: SoftmaxCombineCall, variant: Variant) -> CodeletSource:
    key = codelet_key(variant.name, call)
    own = call.own >= 0
    fields = (((_vec("input", "mine", FP32, call.rows * ROW_STATS),) if own else ())
              + (_vec("input", "partials", FP32, (call.parts - own) * call.rows * ROW_STATS),
                 _vec("output", "stats", FP32, call.rows * ROW_STATS),
                 _param("rows", call.rows), _param("parts", call.parts))
              + ((_param("own", call.own),) if own else ()) + _scale_param(call))
    return render(key, body("softmax", stage="combine", width=ROW_STATS, own=own), fields,
                  "merge (max, sum) softmax partials of each row, FP32")


def apply_codelet(call: SoftmaxApplyCall, variant: Variant, schedule: str) -> CodeletSource:
    key = codelet_key(variant.name, call)
    size = call.rows * call.cols
    fields = (_vec("input", "x", call.dtype, size), _vec("input", "stats", FP32, call.rows * ROW_STATS),
              _vec("output", "y", call.dtype, size),
              _param("rows", call.rows), _param("cols", call.cols)) + _scale_param(call)
    code = body("softmax", stage="apply", schedule=rw.schedule(schedule), out=call.dtype.cpp)
    return render(key, code, fields, f"softmax apply with the row's FP32 (max, sum), {call.dtype} out")


# ---- variant rows -----------------------------------------------------------------------

def variants() -> list[Variant]:
    from .registry import BOTH, SPECIAL

    rows = []
    for d in rw.ROW_DTYPES:
        rows += rw.schedule_variants("softmax", "softmax", d, (), softmax_cycles, softmax, softmax_codelet,
                                     "whole-row softmax")
        rows += rw.schedule_variants("softmax_partial", "softmax_partial", d, (), softmax_cycles, partial,
                                     partial_codelet, "(max, sum exp) of a row piece")
        rows += rw.schedule_variants("softmax_apply", "softmax_apply", d, (), softmax_cycles, apply, apply_codelet,
                                     "softmax apply with the row's combined (max, sum)")
    rows.append(Variant("softmax_combine", "softmax_combine", BOTH, SPECIAL, (), combine_cycles, combine,
                        combine_codelet, doc="merge a row's softmax partials"))
    return rows
