"""What the row-wise kernels (``layernorm``, ``softmax``, ``rowreduce``) share: the six-worker row
schedule their cycle formulas price, sequential FP32 row arithmetic for their numpy semantics, and
the field validation and C++ schedule loop of their calls and codelets.

Worker schedule (what the hardware-measured figures in REFERENCES.md show, "Transformer kernels on
IPU21"): a tile runs six barrel-scheduled workers. A row-wise kernel either gives each worker whole
rows, or cuts one row into six column pieces, one per worker, and combines the workers' partial
statistics after a rendezvous. ``RowCost`` holds a kernel's fitted coefficients and prices either
schedule:

- ``"rows"``: ``ceil(rows / W)`` rounds, each worker one whole row a round;
- ``"split"``: ``rows // W`` rounds of whole rows, one per worker, then the remaining ``rows % W``
  rows one after another, each cut over all ``W`` workers (what "rows split over workers where
  rows >= 6, else within a row" means for any row count: 3 rows are three split rows, 8 rows one
  round of six whole rows and two split rows).

A worker streaming ``group`` elements spends ``group_cycles`` tile cycles while all six run (barrel
scheduling: one issue slot in six). A whole row on one worker costs ``row_whole + ceil(cols / group)
* group_cycles``; a row cut over the workers ``row_split + ceil(ceil(cols / W) / group) *
group_cycles``, its piece being a sixth of the row; ``setup`` is paid once per call. Each
row-wise kernel registers one variant per schedule (``schedule_variants``: ``*_rows_*`` and
``*_split_*``) and dispatch takes the cheaper for the call's shape. The codelets of kernels with
an output per element follow their variant's schedule (a cut row's columns split over the
workers); those with an output per row give each worker whole rows under either schedule.

Numerics: every row statistic is an FP32 sum in column order (``seq_sum``, numpy's sequential
``cumsum``, not its pairwise ``sum``), so the codelets' plain loops give the same bits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Callable

import numpy as np

from ..errors import check
from ..graph.dtypes import DType
from .cycles import ceil_div

SCHEDULES = ("rows", "split")
ROW_DTYPES = (DType.FP16, DType.FP32)    # row-wise kernels read and write FP16 or FP32; cast FP8 first


@dataclass(frozen=True)
class RowCost:
    """Fitted (or derived) coefficients of one row-wise kernel; see the module docstring."""

    setup: int            # once per call: launch, pointers, worker start
    row_whole: int        # per row, when one worker owns the row
    row_split: int        # per row, when the row is cut over all workers (includes their rendezvous)
    group: int            # elements a worker streams per group (FP16)
    group_cycles: int     # tile cycles per group per worker while all workers run
    fp32_group: int = 0   # elements per group for FP32 operands (0: as FP16)

    def group_of(self, dtype: DType) -> int:
        return self.fp32_group if dtype is DType.FP32 and self.fp32_group else self.group

    def whole_row(self, cols: int, dtype: DType) -> int:
        return self.row_whole + ceil_div(cols, self.group_of(dtype)) * self.group_cycles

    def split_row(self, cols: int, dtype: DType, workers: int) -> int:
        return self.row_split + ceil_div(ceil_div(cols, workers), self.group_of(dtype)) * self.group_cycles

    def cycles(self, rows: int, cols: int, dtype: DType, workers: int, schedule: str) -> int:
        if schedule == "rows":
            return self.setup + ceil_div(rows, workers) * self.whole_row(cols, dtype)
        full, rest = divmod(rows, workers)
        return (self.setup + full * self.whole_row(cols, dtype)
                + rest * self.split_row(cols, dtype, workers))


def schedule_variants(name: str, primitive: str, dtype: DType, predicates: tuple, cycles: Callable,
                      reference: Callable, codelet: Callable, doc: str) -> list:
    """Two variant rows of one row-wise kernel, ``{name}_rows_{dtype}`` and ``{name}_split_{dtype}``:
    the same semantics priced (``cycles(call, target, schedule)``) and emitted (``codelet(call,
    variant, schedule)``) for each worker schedule. Dispatch takes the cheaper for the call's shape."""
    from .registry import Predicate, Variant
    from .registry import BOTH, SPECIAL

    dt = Predicate(f"dtype is {dtype}", lambda c, t: c.dtype is dtype)
    what = {"rows": "each worker whole rows", "split": "rows // 6 rounds of whole rows, the rest cut over "
                                                       "the workers"}
    return [Variant(f"{name}_{schedule}_{dtype}", primitive, BOTH, SPECIAL, (dt,) + tuple(predicates),
                    partial(cycles, schedule=schedule), reference, partial(codelet, schedule=schedule),
                    doc=f"{doc}; {what[schedule]}")
            for schedule in SCHEDULES]


# ---- call validation ------------------------------------------------------------------

def positive(call: object, **dims: int) -> None:
    for name, value in dims.items():
        check(isinstance(value, int) and not isinstance(value, bool) and value > 0,
              f"{type(call).__name__}: {name} must be a positive integer, got {value!r}")


def row_dtype(call: object, **types: object) -> None:
    for name, value in types.items():
        check(isinstance(value, DType), f"{type(call).__name__}: {name} must be a DType, got {value!r}")
        check(value in ROW_DTYPES, f"{type(call).__name__}: {name} must be fp16 or fp32 (cast fp8 first), "
                                   f"got {value}")


def flag(call: object, **flags: object) -> None:
    for name, value in flags.items():
        check(isinstance(value, bool), f"{type(call).__name__}: {name} must be a bool, got {value!r}")


def epsilon(call: object, eps: object) -> None:
    check(isinstance(eps, (int, float)) and not isinstance(eps, bool) and math.isfinite(eps) and eps >= 0,
          f"{type(call).__name__}: eps must be a finite number >= 0, got {eps!r}")


def own_part(call: object, own: object, parts: int) -> None:
    """``own`` of a combine call: -1 (every part in one operand) or the index of a part in ``[0, parts)``,
    with at least two parts (the others arrive in their own operand)."""
    check(isinstance(own, int) and not isinstance(own, bool) and (own == -1 or (parts >= 2 and 0 <= own < parts)),
          f"{type(call).__name__}: own must be -1 or a part index in [0, {parts}) with parts >= 2, got {own!r}")


# ---- FP32 row arithmetic (numpy semantics) ----------------------------------------------


def with_own(others: np.ndarray, mine: np.ndarray | None, own: int, parts: int, rows: int,
             width: int) -> np.ndarray:
    """The part-major partials ``[batch, parts, rows, width]`` of a combine: ``others`` alone when
    ``own`` is -1, else ``mine`` ``[batch, rows * width]`` put back at part ``own`` among the
    ``parts - 1`` others."""
    if own < 0:
        return others.reshape(-1, parts, rows, width)
    if mine is None:
        raise ValueError(f"a combine with own part {own} needs that part's partials")
    rest = others.reshape(-1, parts - 1, rows, width)
    return np.insert(rest, own, mine.reshape(-1, rows, width), axis=1)

F32 = np.float32


def seq_sum(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """FP32 sum along ``axis`` in index order (a plain accumulation loop), keeping no axis."""
    return np.take(np.cumsum(x, axis=axis, dtype=F32), -1, axis=axis)


def nan_max(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Maximum along ``axis``; any NaN makes it NaN (the codelets' ``v > m || v != v`` update)."""
    return np.max(x, axis=axis)


def exp32(x: np.ndarray) -> np.ndarray:
    """``exp`` of FP32 values, evaluated in float64 and rounded to FP32 (kernels.reference's rule for
    transcendentals; the codelets compute ``(float)std::exp((double)x)``)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.exp(x.astype(np.float64)).astype(F32)


# ---- codelets ---------------------------------------------------------------------------

def schedule(name: str) -> str:
    """``name`` if it is a row schedule (``templates/rows.cpp.j2`` renders its loop), else an error."""
    check(name in SCHEDULES, f"unknown row schedule {name!r}")
    return name
