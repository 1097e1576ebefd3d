"""The pointwise kernels: binary ops with broadcasting (add, sub, mul, div) and unary ops (neg, sqrt,
reciprocal, exp, tanh, erf, sigmoid), in one module: call records, cycle formulas, numpy semantics,
Poplar codelets and variant rows.

Each op is one row of ``BINARY`` or ``UNARY``: its numpy function (FP32 arithmetic; transcendentals
in float64 rounded to FP32), its C++ expression, and its inner-loop cost from poplibs' table. A new
pointwise op is a row here.

Cycle sources:

- Add: ipu-stack's hardware-fitted IPU21 ``f16_add_cycles`` (published: aligned dense or row
  broadcast ``492 + R ceil(C/24) 24 + 234 (R - 1)``; irregular widths ``450 + 54 ceil(n/12)``).
- Sub, Mul, Div: DERIVED from the Add formulas, the per-element term scaled by poplibs' inner-loop
  cost relative to Add (``lib/popops/popopsCycleEstimators.hpp``, ``binaryOpPerfInfo``: ADD, SUBTRACT
  and MULTIPLY 1 cycle per natural vector; DIVIDE 21 cycles per 4 halves, 10 per 2 floats).
- Unary ops: DERIVED, ipu-stack's elementwise kernel setup (330 cycles, as its GeLU and casts) plus
  poplibs' inner loop (``unaryOpPerfInfo``: cycles per loop of ``unroll`` elements per worker), six
  barrel-scheduled workers: ``330 + workers * ceil(n / (workers * unroll)) * loop``.

Broadcast modes of a binary call (``b`` is the broadcast operand; ``swap`` puts it first in the
op, for ``1 - x`` or ``1 / x``):

- ``dense``: ``b`` has ``rows * cols`` elements, like ``a``;
- ``row_broadcast``: ``b`` has ``cols`` elements, repeated on every row (a bias row);
- ``col_broadcast``: ``b`` has ``rows`` elements, one per row (``[..., M, 1]`` against ``[..., M, N]``);
- ``scalar``: ``b`` has one element.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar, NamedTuple

import numpy as np

from ..graph.dtypes import DType
from ..graph.numerics import erf, sigmoid
from ..target import Target
from .calls import _dtype, _one_of, _positive, describe
from .codelets import CodeletSource, _param, _vec, body, codelet_key, render
from .registry import BOTH, FALLBACK, SPECIAL, Predicate, Variant
from .reference import _f32, _result, operand, round_to

FP16, FP32 = DType.FP16, DType.FP32


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# ---- the op tables ------------------------------------------------------------------

class BinaryFn(NamedTuple):
    numpy: Callable[[np.ndarray, np.ndarray], np.ndarray]   # on FP32 arrays
    cpp: str                                                 # C++ expression of float x, y
    cost: dict                                               # dtype -> per-element cost relative to Add


class UnaryFn(NamedTuple):
    numpy: Callable[[np.ndarray], np.ndarray]                # float64 in, float64 out (rounded to FP32)
    cpp: str                                                 # C++ expression of float x
    loop: dict                                               # dtype -> (cycles per loop, elements per loop)


BINARY: dict[str, BinaryFn] = {
    "add": BinaryFn(np.add, "x + y", {FP16: 1, FP32: 1}),
    "sub": BinaryFn(np.subtract, "x - y", {FP16: 1, FP32: 1}),
    "mul": BinaryFn(np.multiply, "x * y", {FP16: 1, FP32: 1}),
    # DIVIDE: 21 cycles per 4 halves, 10 per 2 floats, against Add's 1 per vector (poplibs).
    "div": BinaryFn(np.divide, "x / y", {FP16: 21, FP32: 10}),
    # MAXIMUM: 4 cycles per 4 halves, 4 per 2 floats, against Add's 1 per vector (poplibs). NaN wins, as
    # numpy's maximum and ONNX Max: fmaxf would drop it.
    "max": BinaryFn(np.maximum, "(x != x || y != y) ? NAN : (x > y ? x : y)", {FP16: 4, FP32: 4}),
}

UNARY: dict[str, UnaryFn] = {
    # poplibs unaryOpPerfInfo: {HALF: (cycles, unroll), FLOAT: (cycles, unroll)}
    "neg": UnaryFn(np.negative, "-x", {FP16: (2, 4), FP32: (2, 2)}),
    "sqrt": UnaryFn(np.sqrt, "std::sqrt(x)", {FP16: (23, 4), FP32: (10, 2)}),
    "reciprocal": UnaryFn(np.reciprocal, "1.0f / x", {FP16: (15, 4), FP32: (6, 2)}),      # INVERSE
    "exp": UnaryFn(np.exp, "std::exp(x)", {FP16: (4, 4), FP32: (6, 2)}),
    "tanh": UnaryFn(np.tanh, "std::tanh(x)", {FP16: (4, 4), FP32: (12, 2)}),
    "erf": UnaryFn(erf, "std::erf(x)", {FP16: (16, 1), FP32: (18, 1)}),
    "relu": UnaryFn(lambda x: np.where(x > 0, x, 0.0), "x > 0.0f ? x : 0.0f", {FP16: (3, 4), FP32: (3, 2)}),
    "sigmoid": UnaryFn(sigmoid, "1.0f / (1.0f + std::exp(-x))",
                       {FP16: (6, 4), FP32: (12, 2)}),
}

BINARY_MODES = ("dense", "row_broadcast", "col_broadcast", "scalar")


# ---- call records -------------------------------------------------------------------

@dataclass(frozen=True)
class BinaryCall:
    """``fn(a[rows, cols], b)`` (``fn(b, a)`` with ``swap``), ``b`` broadcast by ``mode``; computed
    in FP32, rounded once to ``dtype``."""

    rows: int
    cols: int
    dtype: DType
    mode: str = "dense"
    fn: str = "add"
    swap: bool = False
    primitive: ClassVar[str] = "binary"
    __str__ = describe

    def __post_init__(self):
        _positive(self, rows=self.rows, cols=self.cols)
        _dtype(self, dtype=self.dtype)
        _one_of(self, "mode", self.mode, BINARY_MODES)
        _one_of(self, "fn", self.fn, tuple(BINARY))

    @property
    def size(self) -> int:
        return self.rows * self.cols

    @property
    def b_size(self) -> int:
        return {"dense": self.size, "row_broadcast": self.cols, "col_broadcast": self.rows,
                "scalar": 1}[self.mode]

    def operand_types(self) -> tuple[list[DType], list[DType]]:
        return [self.dtype, self.dtype], [self.dtype]

    def key(self) -> str:
        return f"binary_{self.fn}_{self.dtype}_{self.mode}" + ("_swap" if self.swap else "")


@dataclass(frozen=True)
class UnaryCall:
    """``fn(x)`` of ``n`` elements in FP32 (transcendentals correctly rounded to FP32), rounded once
    to ``dtype``."""

    n: int
    dtype: DType
    fn: str
    primitive: ClassVar[str] = "unary"
    __str__ = describe

    def __post_init__(self):
        _positive(self, n=self.n)
        _dtype(self, dtype=self.dtype)
        _one_of(self, "fn", self.fn, tuple(UNARY))

    def operand_types(self) -> tuple[list[DType], list[DType]]:
        return [self.dtype], [self.dtype]

    def key(self) -> str:
        return f"unary_{self.fn}_{self.dtype}"


# ---- cycles -------------------------------------------------------------------------

ADD_VECTOR_SETUP = 492        # ipu-stack f16_add_cycles, aligned path
ADD_VECTOR_STEP = 24          # elements per row step (six workers x four halves)
ADD_ROW_RESET = 234           # pointer reset per repeated broadcast row
ADD_PAIR_SETUP = 450          # irregular widths: pair loop
ADD_PAIR_STEP = 12            # elements per pair-loop wave (six workers x two halves)
ADD_PAIR_CYCLES = 54          # cycles per pair-loop wave
UNARY_SETUP = 330             # ipu-stack's elementwise kernel setup (gelu_f16.S, casts)


def _rows_cols(call: BinaryCall) -> tuple[int, int]:
    """The loop structure: dense and scalar operands run as one row of every element; a broadcast row
    or column restarts the inner loop on every row."""
    return (1, call.size) if call.mode in ("dense", "scalar") else (call.rows, call.cols)


def binary_vector_cycles(call: BinaryCall, target: Target) -> int:
    """Add FP16: ``492 + R * ceil(C/24) * 24 + 234 * (R - 1)``: published (ipu-stack
    ``f16_add_cycles``, aligned dense or row broadcast; dense counts as one row of all elements).

    FP32: DERIVED, a 64-bit vector holds 2 floats instead of 4 halves, so the per-element term
    doubles. Other ops: DERIVED, the per-element term times ``BINARY[fn].cost`` (poplibs). A scalar
    operand is held in a register (priced as dense); a broadcast column restarts each row like a
    broadcast row does (priced as a row broadcast: DERIVED, no public measurement)."""
    rows, cols = _rows_cols(call)
    width = cols * (2 if call.dtype is DType.FP32 else 1)
    per = BINARY[call.fn].cost[call.dtype]
    return (ADD_VECTOR_SETUP + rows * ceil_div(width, ADD_VECTOR_STEP) * ADD_VECTOR_STEP * per
            + ADD_ROW_RESET * (rows - 1))


def binary_pair_work(size: int, dtype: DType, fn: str = "add") -> int:
    """The pair loop without its setup: ``54 * ceil(n/12)`` per FP16 element pair wave (twice for FP32),
    times the op's cost relative to Add."""
    per = 2 if dtype is DType.FP32 else 1
    return ceil_div(size, ADD_PAIR_STEP) * ADD_PAIR_CYCLES * per * BINARY[fn].cost[dtype]


def binary_pair_cycles(call: BinaryCall, target: Target) -> int:
    """Add FP16: ``450 + 54 * ceil(n/12)``: published (ipu-stack ``f16_add_cycles``, irregular
    widths). FP32: DERIVED, twice the per-element term. Other ops: DERIVED, times their cost."""
    return ADD_PAIR_SETUP + binary_pair_work(call.size, call.dtype, call.fn)


def unary_cycles(call: UnaryCall, target: Target) -> int:
    """``330 + workers * ceil(n / (workers * unroll)) * loop``: DERIVED (module docstring)."""
    loop, unroll = UNARY[call.fn].loop[call.dtype]
    w = target.workers
    return UNARY_SETUP + w * ceil_div(call.n, w * unroll) * loop


# ---- numpy semantics ----------------------------------------------------------------

def binary(call: BinaryCall, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a2 = _f32(operand(a, call.dtype, call.size, "a")).reshape(-1, call.rows, call.cols)
    b2 = _f32(operand(b, call.dtype, call.b_size, "b"))
    shape = {"dense": (call.rows, call.cols), "row_broadcast": (1, call.cols),
             "col_broadcast": (call.rows, 1), "scalar": (1, 1)}[call.mode]
    b2 = b2.reshape((-1,) + shape)
    x, y = (b2, a2) if call.swap else (a2, b2)
    with np.errstate(all="ignore"):
        out = BINARY[call.fn].numpy(x, y).astype(np.float32)
    return _result(round_to(out.reshape(-1, call.size), call.dtype), np.asarray(a).shape[:-1])


def unary(call: UnaryCall, x: np.ndarray) -> np.ndarray:
    x2 = _f32(operand(x, call.dtype, call.n, "in"))
    with np.errstate(all="ignore"):
        y = UNARY[call.fn].numpy(x2.astype(np.float64)).astype(np.float32)
    return _result(round_to(y, call.dtype), np.asarray(x).shape[:-1])


# ---- codelets -----------------------------------------------------------------------

def binary_codelet(call: BinaryCall, variant) -> CodeletSource:
    """The op's C++ expression (``BINARY[fn].cpp``, of floats ``x`` and ``y``) in the loop of
    ``templates/binary.cpp.j2``, which reads ``b`` by the call's mode."""
    key = codelet_key(variant.name, call)
    fields = (_vec("input", "a", call.dtype, call.size), _vec("input", "b", call.dtype, call.b_size),
              _vec("output", "out", call.dtype, call.size), _param("rows", call.rows), _param("cols", call.cols))
    code = body("binary", mode=call.mode, swap=call.swap, out=call.dtype.cpp, expr=BINARY[call.fn].cpp)
    order = "b op a" if call.swap else "a op b"
    return render(key, code, fields, f"{call.fn}: {order} ({call.mode}) in FP32, {call.dtype} out")


def unary_codelet(call: UnaryCall, variant) -> CodeletSource:
    key = codelet_key(variant.name, call)
    fields = (_vec("input", "in", call.dtype, call.n), _vec("output", "out", call.dtype, call.n),
              _param("n", call.n))
    code = body("unary", out=call.dtype.cpp, expr=UNARY[call.fn].cpp)
    return render(key, code, fields, f"{call.fn} in FP32, {call.dtype} out")


# ---- variant rows -------------------------------------------------------------------

FLOAT_TYPES = Predicate("dtype is fp16 or fp32", lambda c, t: c.dtype in (FP16, FP32))
VECTOR_ALIGNED = Predicate("the repeated run (dense and scalar: all elements; a broadcast row or column: "
                           "cols) fills whole 64-bit vectors",
                           lambda c, t: _rows_cols(c)[1] * c.dtype.itemsize % 8 == 0)


def variants() -> list[Variant]:
    return [
        # Binary: 64-bit vector loop when aligned, pair loop otherwise (dispatch takes the cheaper).
        Variant("binary_vector", "binary", BOTH, SPECIAL, (FLOAT_TYPES, VECTOR_ALIGNED),
                binary_vector_cycles, binary, binary_codelet),
        Variant("binary_pairs", "binary", BOTH, FALLBACK, (FLOAT_TYPES,),
                binary_pair_cycles, binary, binary_codelet),
        Variant("unary", "unary", BOTH, SPECIAL, (FLOAT_TYPES,), unary_cycles, unary, unary_codelet),
    ]


__all__ = ["BINARY", "UNARY", "BinaryCall", "UnaryCall", "variants"]
