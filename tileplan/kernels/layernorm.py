"""LayerNorm over the last axis, with FP32 statistics: the whole-row kernel (optionally with the
residual Add fused in) and the split-row chain (moments of a row piece, combine, apply).

What each call computes (``x`` a tile buffer ``[rows, cols]`` row-major, FP16 or FP32; ``gamma``
and ``beta`` ``[cols]`` of the same type; arithmetic in FP32; one rounding to the output type):

- ``LayerNormCall``: ``y = ((v - mean) * rstd) * gamma + beta`` per row, ``v = x`` or, with
  ``residual``, ``v = round(x + r)`` (the residual Add rounded to ``dtype`` as an unfused Add would
  store it). Fused Add + LayerNorm writes both ``sum = v`` (the residual stream, which the next
  residual Add reads) and ``y``. Statistics: ``mean = S / n`` with ``S`` the FP32 sum in column
  order, ``M2 = sum((v - mean)^2)`` in column order (two passes: no cancellation of a large mean),
  ``rstd = 1 / sqrt(M2 / n + eps)`` (biased variance, as ONNX LayerNormalization and torch).
- ``RowMomentsCall``: a row piece's partial statistics ``(n, mean, M2)`` as three FP32 values per
  row, ``[rows, 3]``, computed as above on the piece (``n = cols`` of the piece, exact in FP32).
  This is Chan et al.'s combinable form (count, mean and sum of squared deviations): merging pieces
  never subtracts two large sums, unlike ``(sum, sum of squares)``, which loses every digit of the
  variance of rows whose mean is large against their spread. With ``residual`` it also writes the
  piece's ``sum = round(x + r)`` and takes the moments of that sum.
- ``MomentsCombineCall``: a row's ``parts`` partials ``[parts, rows, 3]`` (part-major: the order
  the pieces arrive in, piece 0 = the row's first columns) merged in part order by Chan's update in
  FP32 (``nt = n + nb; d = mean_b - mean; mean += d * (nb / nt); M2 = (M2 + M2_b) + (d * d) *
  ((n * nb) / nt); n = nt``), giving ``[rows, 2]`` FP32 ``(mean, rstd)``,
  ``rstd = 1 / sqrt(M2 / n + eps)``. With one part it gives exactly the whole-row statistics.
- ``LayerNormApplyCall``: ``y = ((x - mean) * rstd) * gamma + beta`` for a piece ``[rows, cols]``
  with the row statistics ``[rows, 2]`` FP32 and the piece's ``gamma``/``beta`` slices ``[cols]``.

So ``LayerNormCall`` is moments, combine with one part and apply, bit for bit (tests check it); a
split row differs from a whole one only by the FP32 rounding of Chan's merge.

Cycle formulas: FITTED (ipu-stack hardware figures, REFERENCES.md, "Transformer kernels on
IPU21": LayerNorm whole rows, Add + LayerNorm fused, row moments, LayerNorm apply, each measured at
1 x 144, 1 x 576, 1 x 1152 and 3 x 1152, FP16). All four points of each kernel lie exactly on
``setup + rows * (row_split + ceil(ceil(cols / 6) / 8) * group_cycles)``: three coefficients,
solved exactly from the four points (a least-squares fit with zero residual). The measured rows
(1 and 3) are below six, so each row is cut over the six workers and rows run one after another
(3 x 1152 costs three 1 x 1152 rows less two setups). Each kernel has two variants, one per
schedule of ``rowwise.RowCost`` (``*_rows_*``: each worker whole rows; ``*_split_*``: ``rows // 6``
rounds of whole rows, the rest cut over the workers), and dispatch takes the cheaper; the measured
points are the split schedule's. Residuals (modelled
minus measured) are 0 on every published point except the later 1 x 1152 revisions, which these
formulas do not follow (one point per revision, no shape to fit): LayerNorm 7,140 vs later 6,732
(+408, +6.1%), row moments 3,366 vs later 2,976 (+390, +13.1%).

- whole row: ``LN_COST``, 129 + rows (1,395 + 234 * groups), 39 cycles per 8 elements of the tile;
- fused Add + LayerNorm: ``ADD_LN_COST``, 132 + rows (1,452 + 300 * groups);
- row moments: ``MOMENTS_COST``, 126 + rows (1,080 + 90 * groups);
- apply: ``APPLY_COST``, 774 + rows (456 + 144 * groups);

with ``groups = ceil(ceil(cols/6)/8)``. By these figures the fused kernel is not always cheaper
than the Add then LayerNorm (``pointwise.binary_vector_cycles``): it wins on 1 x 144, ties on 1 x 1152
and loses on 3 x 1152 (26,088 vs 3,948 + 21,162), so fusing is a candidate to cost, not a rewrite.
ASSUMED (no measurement): a whole row on one worker costs
the same per-row term as a cut row (an upper bound: it needs no rendezvous), and its groups are
``ceil(cols/8)``. DERIVED for FP32 operands: a 64-bit load holds 4 halves or 2 floats, so a group
is 4 elements (the per-element term doubles, as the FP32 Add in ``cycles.py``). DERIVED for
moments with a fused residual: the moments plus what fusing the Add costs the whole-row kernel
(``ADD_LN_COST - LN_COST``: 3 setup, 57 per row, 66 per group). Moments combine: DERIVED from the
reduction loop of ``cycles.py`` (``reduce_work``): ``REDUCE_SETUP + reduce_work(fp32, 2 rows,
3 parts)``, Chan's update being about three multiply-adds on each of the two values per part;
the square root and reciprocal per row are taken as included (no public figure).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..graph.dtypes import DType
from ..target import Target
from . import rowwise as rw
from .calls import describe
from .codelets import CodeletSource, _param, _vec, body, codelet_key, render
from .cycles import REDUCE_SETUP, reduce_work
from .reference import _f32, _result, operand, round_to
from .registry import Predicate, Variant

FP32 = DType.FP32
STAT_WIDTH = 3       # (n, mean, M2) per row of a RowMomentsCall
ROW_STATS = 2        # (mean, rstd) per row of a MomentsCombineCall


# ---- calls ------------------------------------------------------------------------------

@dataclass(frozen=True)
class LayerNormCall:
    """Whole-row LayerNorm of ``x[rows, cols]`` (``dtype`` fp16/fp32) with ``gamma``, ``beta``
    ``[cols]`` (``dtype``), FP32 statistics, ``eps`` added to the biased variance. Inputs ``x``,
    (``r`` ``[rows, cols]`` when ``residual``), ``gamma``, ``beta``; outputs (``sum`` ``[rows,
    cols]`` when ``residual``), ``y`` ``[rows, cols]``, all ``dtype``."""

    rows: int
    cols: int
    dtype: DType
    eps: float = 1e-5
    residual: bool = False            # fused Add: normalise round(x + r), also write it as `sum`
    primitive: ClassVar[str] = "layernorm"
    __str__ = describe

    def __post_init__(self):
        rw.positive(self, rows=self.rows, cols=self.cols)
        rw.row_dtype(self, dtype=self.dtype)
        rw.epsilon(self, self.eps)
        rw.flag(self, residual=self.residual)

    def operand_types(self) -> tuple[list[DType], list[DType]]:
        d = self.dtype
        return [d] * (4 if self.residual else 3), [d] * (2 if self.residual else 1)

    def key(self) -> str:
        return f"layernorm_{self.dtype}" + ("_residual" if self.residual else "")


@dataclass(frozen=True)
class RowMomentsCall:
    """Partial FP32 statistics of a row piece ``x[rows, cols]``: ``[rows, 3]`` FP32 ``(n, mean,
    M2)``. Inputs ``x`` (and ``r`` when ``residual``); outputs (``sum`` ``[rows, cols]`` ``dtype``
    when ``residual``), ``moments``."""

    rows: int
    cols: int
    dtype: DType
    residual: bool = False            # fused Add: moments of round(x + r), also written as `sum`
    primitive: ClassVar[str] = "row_moments"
    __str__ = describe

    def __post_init__(self):
        rw.positive(self, rows=self.rows, cols=self.cols)
        rw.row_dtype(self, dtype=self.dtype)
        rw.flag(self, residual=self.residual)

    def operand_types(self) -> tuple[list[DType], list[DType]]:
        d = self.dtype
        return [d] * (2 if self.residual else 1), ([d] if self.residual else []) + [FP32]

    def key(self) -> str:
        return f"row_moments_{self.dtype}" + ("_residual" if self.residual else "")


@dataclass(frozen=True)
class MomentsCombineCall:
    """Merge ``parts`` partials ``[parts, rows, 3]`` FP32 of each row into ``[rows, 2]`` FP32
    ``(mean, rstd)``, ``rstd = 1 / sqrt(M2 / n + eps)``. Inputs ``partials``; or, with ``own`` (a
    part index), ``mine`` ``[rows, 3]`` (that part, computed on this tile) and ``partials`` ``[parts
    - 1, rows, 3]`` (the others in part order): the merge is the same, in part order."""

    rows: int
    parts: int
    eps: float = 1e-5
    own: int = -1                     # -1: all parts in `partials`; else this tile's part, in `mine`
    primitive: ClassVar[str] = "moments_combine"
    __str__ = describe

    def __post_init__(self):
        rw.positive(self, rows=self.rows, parts=self.parts)
        rw.epsilon(self, self.eps)
        rw.own_part(self, self.own, self.parts)

    def operand_types(self) -> tuple[list[DType], list[DType]]:
        return [FP32] * (2 if self.own >= 0 else 1), [FP32]

    def key(self) -> str:
        return "moments_combine_fp32" + ("_own" if self.own >= 0 else "")


@dataclass(frozen=True)
class LayerNormApplyCall:
    """``y = ((x - mean) * rstd) * gamma + beta`` on a piece ``x[rows, cols]`` (``dtype``), with
    ``stats`` ``[rows, 2]`` FP32 ``(mean, rstd)`` and the piece's ``gamma``, ``beta`` ``[cols]``
    (``dtype``). Inputs ``x``, ``stats``, ``gamma``, ``beta``; output ``y`` ``[rows, cols]``."""

    rows: int
    cols: int
    dtype: DType
    primitive: ClassVar[str] = "layernorm_apply"
    __str__ = describe

    def __post_init__(self):
        rw.positive(self, rows=self.rows, cols=self.cols)
        rw.row_dtype(self, dtype=self.dtype)

    def operand_types(self) -> tuple[list[DType], list[DType]]:
        return [self.dtype, FP32, self.dtype, self.dtype], [self.dtype]

    def key(self) -> str:
        return f"layernorm_apply_{self.dtype}"


# ---- cycles -----------------------------------------------------------------------------

FP16_GROUP, FP32_GROUP = 8, 4          # elements per 64-bit load pair: 8 halves, 4 floats (DERIVED)
# FITTED (ipu-stack hardware figures, REFERENCES.md): setup, per row, per group; see the docstring.
LN_COST = rw.RowCost(setup=129, row_whole=1395, row_split=1395, group=FP16_GROUP, group_cycles=234,
                     fp32_group=FP32_GROUP)
ADD_LN_COST = rw.RowCost(setup=132, row_whole=1452, row_split=1452, group=FP16_GROUP, group_cycles=300,
                         fp32_group=FP32_GROUP)
MOMENTS_COST = rw.RowCost(setup=126, row_whole=1080, row_split=1080, group=FP16_GROUP, group_cycles=90,
                          fp32_group=FP32_GROUP)
APPLY_COST = rw.RowCost(setup=774, row_whole=456, row_split=456, group=FP16_GROUP, group_cycles=144,
                        fp32_group=FP32_GROUP)
# DERIVED: moments with the residual Add fused in = moments + (fused LayerNorm - LayerNorm).
ADD_MOMENTS_COST = rw.RowCost(
    setup=MOMENTS_COST.setup + ADD_LN_COST.setup - LN_COST.setup,
    row_whole=MOMENTS_COST.row_whole + ADD_LN_COST.row_whole - LN_COST.row_whole,
    row_split=MOMENTS_COST.row_split + ADD_LN_COST.row_split - LN_COST.row_split,
    group=FP16_GROUP, group_cycles=MOMENTS_COST.group_cycles + ADD_LN_COST.group_cycles - LN_COST.group_cycles,
    fp32_group=FP32_GROUP)
COMBINE_ADDENDS_PER_PART = 3           # Chan's update: about three multiply-adds per value and part


def layernorm_cycles(call: LayerNormCall, target: Target, schedule: str) -> int:
    cost = ADD_LN_COST if call.residual else LN_COST
    return cost.cycles(call.rows, call.cols, call.dtype, target.workers, schedule)


def moments_cycles(call: RowMomentsCall, target: Target, schedule: str) -> int:
    cost = ADD_MOMENTS_COST if call.residual else MOMENTS_COST
    return cost.cycles(call.rows, call.cols, call.dtype, target.workers, schedule)


def combine_cycles(call: MomentsCombineCall, target: Target) -> int:
    return REDUCE_SETUP + reduce_work(FP32, ROW_STATS * call.rows, COMBINE_ADDENDS_PER_PART * call.parts,
                                      target.workers)


def apply_cycles(call: LayerNormApplyCall, target: Target, schedule: str) -> int:
    return APPLY_COST.cycles(call.rows, call.cols, call.dtype, target.workers, schedule)


# ---- numpy semantics --------------------------------------------------------------------

def _rows(x: np.ndarray, dtype: DType, rows: int, cols: int, what: str) -> np.ndarray:
    """``x`` as FP32 ``[batch, rows, cols]``."""
    return _f32(operand(x, dtype, rows * cols, what)).reshape(-1, rows, cols)


def _residual_sum(call, x: np.ndarray, r: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
    """``(v, stored)``: the FP32 values normalised and, with a residual, the rounded sum as stored."""
    v = _rows(x, call.dtype, call.rows, call.cols, "x")
    if not call.residual:
        return v, None
    if r is None:
        raise ValueError(f"{call}: a fused residual Add needs its operand r")
    with np.errstate(over="ignore", invalid="ignore"):
        stored = round_to(v + _rows(r, call.dtype, call.rows, call.cols, "r"), call.dtype)
    return _f32(stored), stored


def piece_moments(v: np.ndarray) -> np.ndarray:
    """``[..., rows, 3]`` FP32 ``(n, mean, M2)`` of FP32 rows ``v[..., rows, cols]`` (two passes)."""
    n = rw.F32(v.shape[-1])
    with np.errstate(over="ignore", invalid="ignore"):
        mean = rw.seq_sum(v) / n
        d = v - mean[..., None]
        m2 = rw.seq_sum(d * d)
    return np.stack([np.full_like(mean, n), mean, m2], axis=-1)


def merge_moments(parts: np.ndarray, eps: float) -> np.ndarray:
    """``[..., parts, rows, 3]`` partials -> ``[..., rows, 2]`` FP32 ``(mean, rstd)``, Chan's update
    in part order."""
    n, mean, m2 = (parts[..., 0, :, i] for i in range(STAT_WIDTH))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for p in range(1, parts.shape[-3]):
            nb, mean_b, m2_b = (parts[..., p, :, i] for i in range(STAT_WIDTH))
            nt = n + nb
            d = mean_b - mean
            mean = mean + d * (nb / nt)
            m2 = (m2 + m2_b) + (d * d) * ((n * nb) / nt)
            n = nt
        rstd = rw.F32(1.0) / np.sqrt(m2 / n + rw.F32(eps))
    return np.stack([mean, rstd], axis=-1)


def normalise(v: np.ndarray, stats: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """``((v - mean) * rstd) * gamma + beta`` in FP32; ``stats[..., rows, 2]``, ``gamma``/``beta`` FP32."""
    with np.errstate(over="ignore", invalid="ignore"):
        return ((v - stats[..., 0:1]) * stats[..., 1:2]) * gamma[:, None, :] + beta[:, None, :]


def _params(call, gamma, beta) -> tuple[np.ndarray, np.ndarray]:
    return (_f32(operand(gamma, call.dtype, call.cols, "gamma")),
            _f32(operand(beta, call.dtype, call.cols, "beta")))


def layernorm(call: LayerNormCall, x: np.ndarray, *rest: np.ndarray):
    """``y`` (or ``(sum, y)`` with ``residual``); inputs ``x, [r,] gamma, beta``."""
    r, gamma, beta = rest if call.residual else (None, *rest)
    batch = np.asarray(x).shape[:-1]
    v, stored = _residual_sum(call, x, r)
    stats = merge_moments(piece_moments(v)[:, None], call.eps)
    g, b = _params(call, gamma, beta)
    y = _result(round_to(normalise(v, stats, g, b), call.dtype).reshape(-1, call.rows * call.cols), batch)
    if call.residual:
        return _result(stored.reshape(-1, call.rows * call.cols), batch), y
    return y


def moments(call: RowMomentsCall, x: np.ndarray, r: np.ndarray | None = None):
    """``moments`` ``[rows * 3]`` FP32 (or ``(sum, moments)`` with ``residual``)."""
    batch = np.asarray(x).shape[:-1]
    v, stored = _residual_sum(call, x, r)
    out = _result(piece_moments(v).reshape(-1, call.rows * STAT_WIDTH), batch)
    if call.residual:
        return _result(stored.reshape(-1, call.rows * call.cols), batch), out
    return out


def combine(call: MomentsCombineCall, *ins: np.ndarray) -> np.ndarray:
    """``stats`` ``[rows * 2]`` FP32 from ``partials`` ``[parts * rows * 3]`` FP32 (or, with ``own``,
    ``mine`` ``[rows * 3]`` and ``partials`` ``[(parts - 1) * rows * 3]``)."""
    mine, partials = ins if call.own >= 0 else (None, *ins)
    others = operand(partials, FP32, (call.parts - (call.own >= 0)) * call.rows * STAT_WIDTH, "partials")
    if mine is not None:
        mine = operand(mine, FP32, call.rows * STAT_WIDTH, "mine")
    p = rw.with_own(others, mine, call.own, call.parts, call.rows, STAT_WIDTH)
    stats = merge_moments(p, call.eps)
    return _result(stats.reshape(-1, call.rows * ROW_STATS), np.asarray(partials).shape[:-1])


def apply(call: LayerNormApplyCall, x: np.ndarray, stats: np.ndarray, gamma: np.ndarray,
          beta: np.ndarray) -> np.ndarray:
    v = _rows(x, call.dtype, call.rows, call.cols, "x")
    s = operand(stats, FP32, call.rows * ROW_STATS, "stats").reshape(-1, call.rows, ROW_STATS)
    g, b = _params(call, gamma, beta)
    y = round_to(normalise(v, s, g, b), call.dtype)
    return _result(y.reshape(-1, call.rows * call.cols), np.asarray(x).shape[:-1])


# ---- codelets ---------------------------------------------------------------------------

def layernorm_codelet(call: LayerNormCall, variant: Variant, schedule: str) -> CodeletSource:
    key = codelet_key(variant.name, call)
    size, d = call.rows * call.cols, call.dtype
    fields = ((_vec("input", "x", d, size),) + ((_vec("input", "r", d, size),) if call.residual else ())
              + (_vec("input", "gamma", d, call.cols), _vec("input", "beta", d, call.cols))
              + ((_vec("output", "sum", d, size),) if call.residual else ()) + (_vec("output", "y", d, size),)
              + (_param("rows", call.rows), _param("cols", call.cols),
                 _param("eps", float(np.float32(call.eps)), "float")))
    code = body("layernorm", stage="rows", residual=call.residual, schedule=rw.schedule(schedule), out=d.cpp)
    what = "round(x + r), written as sum, then " if call.residual else ""
    return render(key, code, fields, f"{what}LayerNorm over rows of cols, FP32 statistics (two passes), "
                                     f"{d} out")


def moments_codelet(call: RowMomentsCall, variant: Variant, schedule: str) -> CodeletSource:
    """Rows over workers whatever the schedule: the outputs are per row, and the statistics of a row
    are computed in one order by one worker (the priced schedule is the hardware kernel's)."""
    key = codelet_key(variant.name, call)
    size, d = call.rows * call.cols, call.dtype
    fields = ((_vec("input", "x", d, size),) + ((_vec("input", "r", d, size),) if call.residual else ())
              + ((_vec("output", "sum", d, size),) if call.residual else ())
              + (_vec("output", "moments", FP32, call.rows * STAT_WIDTH),
                 _param("rows", call.rows), _param("cols", call.cols)))
    code = body("layernorm", stage="moments", residual=call.residual, out=d.cpp)
    return render(key, code, fields, "partial FP32 row statistics (n, mean, M2) of a row piece, two passes")


def combine_codelet(call: MomentsCombineCall, variant: Variant) -> CodeletSource:
    key = codelet_key(variant.name, call)
    own = call.own >= 0
    fields = (((_vec("input", "mine", FP32, call.rows * STAT_WIDTH),) if own else ())
              + (_vec("input", "partials", FP32, (call.parts - own) * call.rows * STAT_WIDTH),
                 _vec("output", "stats", FP32, call.rows * ROW_STATS),
                 _param("rows", call.rows), _param("parts", call.parts))
              + ((_param("own", call.own),) if own else ())
              + (_param("eps", float(np.float32(call.eps)), "float"),))
    what = " (this tile's part apart)" if own else ""
    return render(key, body("layernorm", stage="combine", width=STAT_WIDTH, own=own), fields,
                  f"merge (n, mean, M2) partials{what} of each row into (mean, rstd), FP32")


def apply_codelet(call: LayerNormApplyCall, variant: Variant, schedule: str) -> CodeletSource:
    key = codelet_key(variant.name, call)
    size, d = call.rows * call.cols, call.dtype
    fields = (_vec("input", "x", d, size), _vec("input", "stats", FP32, call.rows * ROW_STATS),
              _vec("input", "gamma", d, call.cols), _vec("input", "beta", d, call.cols),
              _vec("output", "y", d, size),
              _param("rows", call.rows), _param("cols", call.cols))
    code = body("layernorm", stage="apply", schedule=rw.schedule(schedule), out=d.cpp)
    return render(key, code, fields, f"LayerNorm apply with FP32 (mean, rstd) per row, {d} out")


# ---- variant rows -----------------------------------------------------------------------

def variants() -> list[Variant]:
    from .registry import BOTH, SPECIAL

    no_res = Predicate("no fused residual (residual is False)", lambda c, t: not c.residual)
    res = Predicate("a fused residual Add (residual is True)", lambda c, t: c.residual)
    rows = []
    for d in rw.ROW_DTYPES:
        rows += rw.schedule_variants("layernorm", "layernorm", d, (no_res,), layernorm_cycles, layernorm,
                                     layernorm_codelet, "whole-row LayerNorm, FP32 statistics")
        rows += rw.schedule_variants("add_layernorm", "layernorm", d, (res,), layernorm_cycles, layernorm,
                                     layernorm_codelet, "residual Add fused into a whole-row LayerNorm")
        rows += rw.schedule_variants("row_moments", "row_moments", d, (no_res,), moments_cycles, moments,
                                     moments_codelet, "partial (n, mean, M2) of a row piece")
        rows += rw.schedule_variants("add_row_moments", "row_moments", d, (res,), moments_cycles, moments,
                                     moments_codelet, "residual Add fused into the moments of a row piece")
        rows += rw.schedule_variants("layernorm_apply", "layernorm_apply", d, (), apply_cycles, apply,
                                     apply_codelet, "LayerNorm apply with the row's (mean, rstd)")
    rows.append(Variant("moments_combine", "moments_combine", BOTH, SPECIAL, (), combine_cycles, combine,
                        combine_codelet, doc="Chan's merge of a row's partial moments"))
    return rows
