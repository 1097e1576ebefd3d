"""The on-tile 2-D transpose: call record, cycle formula, numpy semantics, codelet and variant row.

``TransposeCall(rows, cols, dtype)``: ``in[rows, cols]`` row-major -> ``out[cols, rows]`` row-major,
raw elements (no arithmetic, any type). What a Transpose of the last two axes runs on each tile
after its exchange has brought the ``[rows, cols]`` column block of the input (``planner.views``).

Cycles: DERIVED. The same data movement as the AMP-left pack (each element loaded once and stored
once at its new place), which ipu-stack publishes at about one cycle per element
(``kernels.cycles.pack_elements_cycles``: kernel launch plus one cycle per element). poplibs'
``Transpose2d`` vertex is also a per-element load/store loop; no public IPU21 measurement of
this exact kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..graph.dtypes import DType
from ..target import Target
from .calls import _dtype, _positive, describe
from .codelets import CodeletSource, _param, _vec, body, codelet_key, render
from .reference import _result, operand
from .registry import BOTH, SPECIAL, Variant



@dataclass(frozen=True)
class TransposeCall:
    rows: int
    cols: int
    dtype: DType
    primitive: ClassVar[str] = "transpose"
    __str__ = describe

    def __post_init__(self):
        _positive(self, rows=self.rows, cols=self.cols)
        _dtype(self, dtype=self.dtype)

    @property
    def size(self) -> int:
        return self.rows * self.cols

    def operand_types(self) -> tuple[list[DType], list[DType]]:
        return [self.dtype], [self.dtype]

    def key(self) -> str:
        return f"transpose_{self.dtype}"


def transpose_cycles(call: TransposeCall, target: Target) -> int:
    """``launch + rows * cols``: DERIVED (module docstring)."""
    from .cycles import pack_elements_cycles
    return pack_elements_cycles(call.size, target)


def transpose(call: TransposeCall, x: np.ndarray) -> np.ndarray:
    x2 = operand(x, call.dtype, call.size, "in")
    out = x2.reshape(-1, call.rows, call.cols).transpose(0, 2, 1).reshape(-1, call.size)
    return _result(np.ascontiguousarray(out), np.asarray(x).shape[:-1])


def transpose_codelet(call: TransposeCall, variant) -> CodeletSource:
    key = codelet_key(variant.name, call)
    fields = (_vec("input", "in", call.dtype, call.size), _vec("output", "out", call.dtype, call.size),
              _param("rows", call.rows), _param("cols", call.cols))
    return render(key, body("transpose"), fields,
                  f"[rows, cols] -> [cols, rows] transpose ({call.dtype}, raw elements)")


def variants() -> list[Variant]:
    return [Variant("transpose_2d", "transpose", BOTH, SPECIAL, (), transpose_cycles, transpose,
                    transpose_codelet, doc="on-tile 2-D transpose")]
