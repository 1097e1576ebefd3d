"""The row-gather kernel: rows of a table block by integer indices (an embedding lookup), in one
module: call record, cycle formula, numpy semantics, Poplar codelet and variant row.

A call copies, for each of ``rows`` indices, ``width`` elements of the table's row ``idx[i]``
from a local ``[table_rows, width]`` block (a column block of the table) into row ``i`` of a
local ``[rows, width]`` output block. The table block and the indices are on the tile: nothing is
exchanged at run time, whatever the indices are (``planner.gather``).

Cycle source: DERIVED. Per row: the index load, its bounds check and the row address
(``GATHER_ROW_CYCLES = 6``: a load, a compare-and-branch, a multiply-add and a pointer set-up,
one cycle each in a worker's loop, plus one for the loop), then the row copied at the local copy
rate (``target.local_copy_bytes_per_cycle``, as ``copy_local``); the six workers split the rows;
the launch is ``target.local_copy_call_cycles`` (the six-worker copy call). No public measurement
of poplibs' ``MultiSlice`` vertex was used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..errors import TileplanError
from ..graph.dtypes import DType
from ..target import Target
from .calls import _dtype, _positive, describe
from .codelets import CodeletSource, _param, _vec, body, codelet_key, render
from .pointwise import ceil_div
from .registry import BOTH, SPECIAL, Predicate, Variant
from .reference import _result, operand

GATHER_ROW_CYCLES = 6


@dataclass(frozen=True)
class GatherCall:
    """``out[i, :] = table[idx[i], :]`` for ``rows`` indices of a ``[table_rows, width]`` block
    (``idx[i] < 0``: row ``idx[i] + table_rows``)."""

    rows: int
    width: int
    table_rows: int
    dtype: DType
    primitive: ClassVar[str] = "gather"
    __str__ = describe

    def __post_init__(self):
        _positive(self, rows=self.rows, width=self.width, table_rows=self.table_rows)
        _dtype(self, dtype=self.dtype)

    def operand_types(self) -> tuple[list[DType], list[DType]]:
        return [self.dtype, DType.INT32], [self.dtype]

    def key(self) -> str:
        return f"gather_{self.dtype}"


def gather_cycles(call: GatherCall, target: Target) -> int:
    """``launch + workers * ceil(rows / workers) * (6 + ceil(width * itemsize / copy rate))``: DERIVED
    (module docstring)."""
    row = GATHER_ROW_CYCLES + ceil_div(call.width * call.dtype.itemsize, target.local_copy_bytes_per_cycle)
    w = target.workers
    return target.local_copy_call_cycles + w * ceil_div(call.rows, w) * row


def gather(call: GatherCall, table: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """The rows picked (a negative index counts from the end); an index outside ``[-rows, rows)`` is
    refused (the codelet would write zeros: a wrong answer the IPU model does not hide)."""
    t = operand(table, call.dtype, call.table_rows * call.width, "table")
    i = operand(idx, DType.INT32, call.rows, "indices")
    bad = (i < -call.table_rows) | (i >= call.table_rows)
    if bad.any():
        raise TileplanError(f"gather: index {int(i[bad].flat[0])} is outside the table's {call.table_rows} rows")
    i = i % call.table_rows                       # a negative index counts from the end
    t3 = t.reshape(-1, call.table_rows, call.width)
    out = np.stack([t3[k if t3.shape[0] > 1 else 0][i[k]] for k in range(i.shape[0])])
    return _result(out.reshape(i.shape[0], call.rows * call.width), np.asarray(idx).shape[:-1])


def gather_codelet(call: GatherCall, variant) -> CodeletSource:
    key = codelet_key(variant.name, call)
    fields = (_vec("input", "table", call.dtype, call.table_rows * call.width),
              _vec("input", "idx", DType.INT32, call.rows),
              _vec("output", "out", call.dtype, call.rows * call.width),
              _param("rows", call.rows), _param("width", call.width), _param("tableRows", call.table_rows))
    code = body("gather", dtype=call.dtype.cpp)
    return render(key, code, fields, f"row gather of a {call.dtype} table block by int32 indices")


FLOAT_TABLE = Predicate("dtype is fp16 or fp32", lambda c, t: c.dtype in (DType.FP16, DType.FP32))


def variants() -> list[Variant]:
    return [Variant("gather_rows", "gather", BOTH, SPECIAL, (FLOAT_TABLE,), gather_cycles, gather, gather_codelet,
                    doc="rows of a table block by int32 indices")]


__all__ = ["GatherCall", "variants"]
