"""Tile-level kernel calls: what one vertex invocation on one tile computes.

A call is a small frozen value naming a primitive and the shapes and types of
its tile-local operands. The planner, the estimates, lowering and the IPU model
all talk to the kernels through calls: ``dispatch(call, target)`` picks the
variant, the variant prices the call (``cycles``), defines its numpy semantics
(``reference``) and emits its Poplar codelet (``codelet``).

Operands are flat, row-major tile buffers. Every call has:

- ``primitive``: the registry key (``"matmul"``, ``"reduce"``, ...);
- ``operand_types()``: the element types of its inputs and outputs, in field order
  (what the IPU model reads and writes);
- ``key()``: a short stable string naming the specialisation, that is, every
  field that changes the generated C++ (types, formats, modes) but not the
  shapes, which are vertex fields. Codelet files are named after it.

Scales are powers of two (``2**scale``), as in ``tileplan.graph.dtypes``.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from typing import ClassVar

import numpy as np

from ..errors import check
from ..graph.dtypes import DType

WEIGHT_REGIONS = ("interleaved", "standard")


class _Byte:
    """The element type of a raw byte operand (``CopyCall``): a dtype-like with ``numpy`` and ``itemsize``."""

    numpy = np.dtype(np.uint8)
    itemsize = 1


BYTE = _Byte()
B_FORMATS = ("rows", "panels")
GELU_FORMS = ("tanh", "erf")


# The checks format their message only on failure: calls are made by the hundred thousand.
def _positive(call: object, **dims: int) -> None:
    for name, value in dims.items():
        if not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
            check(False, f"{type(call).__name__}: {name} must be a positive integer, got {value!r}")


def _dtype(call: object, **types: object) -> None:
    for name, value in types.items():
        if not isinstance(value, DType):
            check(False, f"{type(call).__name__}: {name} must be a DType, got {value!r}")


def _one_of(call: object, name: str, value: str, allowed: tuple[str, ...]) -> None:
    check(value in allowed, f"{type(call).__name__}: {name} must be one of {', '.join(allowed)}, got {value!r}")


def describe(call: object) -> str:
    """One line: the primitive and every field that differs from its default,
    e.g. ``matmul(m=184, n=48, k=288, in_dtype=fp8, partials=fp16)``."""
    shown = [f"{f.name}={getattr(call, f.name)}" for f in fields(call)
             if f.default is MISSING or getattr(call, f.name) != f.default]
    return f"{call.primitive}({', '.join(shown)})"


@dataclass(frozen=True)
class MatMulCall:
    """``C[m, n] = A[m, k] @ B[k, n]`` on one tile.

    A is row-major. B is row-major (``b_format="rows"``, ``grain=0``) or AMP
    panels (``"panels"``: ``ceil(n / grain)`` panels, each a ``k x grain``
    row-major block, the last one ``k x (n - (panels-1)*grain)`` when ``grain``
    does not divide ``n``: a partial panel, no padding; ``k * n`` elements in
    all, in the panel-major order of ``layout.panels``). Products accumulate in FP32; the sum is multiplied by
    ``2**out_scale`` and rounded to ``partials``. With ``accumulate`` the AMP
    starts from partials already in memory (a third input ``cin``, normally the
    same bytes as the output): ``C = round(Cin + 2**out_scale * A @ B)``, as
    poplibs' 1x1 convolution vertices do when they are not told to zero their
    partials; serial K splits use it.
    """

    m: int
    n: int
    k: int
    in_dtype: DType
    partials: DType
    weights_region: str = "interleaved"   # where B lives: "interleaved" or "standard"
    b_format: str = "rows"
    out_scale: int = 0
    grain: int = 0                        # panel width in elements; 0 when B is row-major
    accumulate: bool = False              # add into the partials read from ``cin``
    primitive: ClassVar[str] = "matmul"
    __str__ = describe

    def __post_init__(self):
        _positive(self, m=self.m, n=self.n, k=self.k)
        _dtype(self, in_dtype=self.in_dtype, partials=self.partials)
        _one_of(self, "weights_region", self.weights_region, WEIGHT_REGIONS)
        _one_of(self, "b_format", self.b_format, B_FORMATS)
        if self.b_format == "panels":
            check(isinstance(self.grain, int) and self.grain > 0,
                  f"MatMulCall: b_format 'panels' needs a positive grain, got {self.grain!r}")
        else:
            check(self.grain == 0, f"MatMulCall: grain {self.grain} is only meaningful with b_format 'panels'")

    @property
    def panels(self) -> int:
        """Number of B panels (``ceil(n / grain)``); 0 for row-major B."""
        return -(-self.n // self.grain) if self.grain else 0

    def operand_types(self) -> tuple[list[DType], list[DType]]:
        return [self.in_dtype, self.in_dtype] + ([self.partials] if self.accumulate else []), [self.partials]

    def key(self) -> str:
        return f"matmul_{self.in_dtype}_{self.partials}_{self.b_format}" + ("_acc" if self.accumulate else "")


@dataclass(frozen=True)
class ReduceCall:
    """Sum ``parts`` partial arrays of ``n`` elements each (one contiguous buffer
    ``[parts, n]``), accumulating in FP32 in part order; the sum is multiplied by
    ``2**out_scale`` and rounded to ``out_dtype``.

    With ``bias_cols > 0`` a second input, a bias row of ``bias_cols`` elements of
    ``out_dtype``, is one more addend: the ``n`` elements are ``n / bias_cols``
    rows of ``bias_cols`` and element ``i`` adds ``bias[i % bias_cols]`` after the
    last partial, in the same FP32 sum, before the scaling and the one rounding
    (a GEMM's bias Add done by its split-K reduction).

    Epilogues (the GEMM's following ops done by its reducers, each rounding as the unfused op
    would store its result): with ``gelu`` ("tanh" or "erf"; needs a bias row) the rounded sum goes
    through GeLU in FP32 and is rounded to ``out_dtype`` again (a bias Add then GeLU); with
    ``cast_to`` (FP8) the result is then cast to FP8 with the power-of-two scale ``cast_scale``,
    saturating (a following Cast), and the output operand is FP8."""

    n: int
    parts: int
    in_dtype: DType
    out_dtype: DType
    out_scale: int = 0
    bias_cols: int = 0                    # width of the bias row added to every row; 0: no bias
    own: bool = False                     # two partial inputs: the reducer's own partial [n], read in
                                          # place and summed first, then the other [parts - 1, n]
    gelu: str = ""                        # GeLU epilogue form ("tanh", "erf"); "": none
    cast_to: DType | None = None          # epilogue cast of the result (FP8); None: out_dtype is stored
    cast_scale: int = 0                   # its scale exponent (stored = value / 2**cast_scale)
    primitive: ClassVar[str] = "reduce"
    __str__ = describe

    def __post_init__(self):
        _positive(self, n=self.n, parts=self.parts)
        _dtype(self, in_dtype=self.in_dtype, out_dtype=self.out_dtype)
        check(isinstance(self.bias_cols, int) and not isinstance(self.bias_cols, bool) and self.bias_cols >= 0,
              f"ReduceCall: bias_cols must be a non-negative integer, got {self.bias_cols!r}")
        check(self.bias_cols == 0 or self.n % self.bias_cols == 0,
              f"ReduceCall: a bias row of {self.bias_cols} elements does not divide n={self.n} into rows")
        check(isinstance(self.own, bool) and (not self.own or self.parts >= 2),
              f"ReduceCall: own={self.own!r} needs a bool and at least two parts (parts={self.parts})")
        if self.gelu:
            _one_of(self, "gelu", self.gelu, GELU_FORMS)
            check(self.bias_cols > 0, "ReduceCall: a GeLU epilogue needs a bias row (bias_cols > 0)")
        check(self.cast_to is None or self.cast_to is DType.FP8,
              f"ReduceCall: cast_to must be None or fp8, got {self.cast_to!r}")
        check(self.cast_scale == 0 or self.cast_to is not None,
              f"ReduceCall: cast_scale {self.cast_scale} given without a cast_to")

    @property
    def addends(self) -> int:
        """Arrays summed per element: the partials, and the bias row when there is one."""
        return self.parts + (1 if self.bias_cols else 0)

    @property
    def stored(self) -> DType:
        """The output operand's type: the epilogue cast's, else ``out_dtype``."""
        return self.cast_to or self.out_dtype

    def operand_types(self) -> tuple[list[DType], list[DType]]:
        return ([self.in_dtype] * (2 if self.own else 1) + ([self.out_dtype] if self.bias_cols else []),
                [self.stored])

    def key(self) -> str:
        return (f"reduce_{self.in_dtype}_{self.out_dtype}" + ("_bias" if self.bias_cols else "")
                + ("_own" if self.own else "") + (f"_gelu_{self.gelu}" if self.gelu else "")
                + (f"_to_{self.cast_to}" if self.cast_to else ""))


@dataclass(frozen=True)
class GeLUCall:
    """GeLU of ``n`` elements (``tanh`` or exact ``erf`` form), computed in FP32,
    rounded to ``dtype``."""

    n: int
    dtype: DType
    approximate: str = "tanh"
    primitive: ClassVar[str] = "gelu"
    __str__ = describe

    def __post_init__(self):
        _positive(self, n=self.n)
        _dtype(self, dtype=self.dtype)
        _one_of(self, "approximate", self.approximate, GELU_FORMS)

    def operand_types(self) -> tuple[list[DType], list[DType]]:
        return [self.dtype], [self.dtype]

    def key(self) -> str:
        return f"gelu_{self.dtype}_{self.approximate}"


@dataclass(frozen=True)
class BiasGeLUCall:
    """Fused ``gelu(a[rows, cols] + bias[cols])`` in one pass; the sum is rounded
    to ``dtype`` in registers before the GeLU, as the unfused Add would store it, and
    the GeLU is rounded to ``dtype`` as the unfused GeLU would store it.

    With ``cast_to`` (FP8) the result is then cast to FP8 with the power-of-two scale
    ``cast_scale``, saturating (a following Cast), and the output operand is FP8.
    ``aligned``: ``a``, ``bias`` and the output start on 8-byte boundaries (the caller
    knows the operand offsets; the aligned kernel path needs them, with rows of whole
    64-bit words)."""

    rows: int
    cols: int
    dtype: DType
    approximate: str = "tanh"
    cast_to: DType | None = None
    cast_scale: int = 0
    aligned: bool = False
    primitive: ClassVar[str] = "bias_gelu"
    __str__ = describe

    def __post_init__(self):
        _positive(self, rows=self.rows, cols=self.cols)
        _dtype(self, dtype=self.dtype)
        _one_of(self, "approximate", self.approximate, GELU_FORMS)
        check(self.cast_to is None or self.cast_to is DType.FP8,
              f"BiasGeLUCall: cast_to must be None or fp8, got {self.cast_to!r}")
        check(self.cast_scale == 0 or self.cast_to is not None,
              f"BiasGeLUCall: cast_scale {self.cast_scale} given without a cast_to")
        check(isinstance(self.aligned, bool), f"BiasGeLUCall: aligned must be a bool, got {self.aligned!r}")

    @property
    def size(self) -> int:
        return self.rows * self.cols

    @property
    def stored(self) -> DType:
        """The output operand's type: the epilogue cast's, else ``dtype``."""
        return self.cast_to or self.dtype

    def operand_types(self) -> tuple[list[DType], list[DType]]:
        return [self.dtype, self.dtype], [self.stored]

    def key(self) -> str:
        return f"bias_gelu_{self.dtype}_{self.approximate}" + (f"_to_{self.cast_to}" if self.cast_to else "")


@dataclass(frozen=True)
class CastCall:
    """Convert ``n`` elements. The value is ``stored * 2**in_scale``; into FP8 it
    is divided by ``2**out_scale`` and saturated to +-240 (NaN stays NaN, 0x80).
    Scales apply to FP8 sides only (as ``dtypes.quantise``/``dequantise``), so a
    non-zero scale on an FP16/FP32 side is refused rather than ignored. ``saturate=False``
    (FP8 out only): values past +-240 become NaN instead."""

    n: int
    in_dtype: DType
    out_dtype: DType
    in_scale: int = 0
    out_scale: int = 0
    saturate: bool = True
    primitive: ClassVar[str] = "cast"
    __str__ = describe

    def __post_init__(self):
        _positive(self, n=self.n)
        _dtype(self, in_dtype=self.in_dtype, out_dtype=self.out_dtype)
        check(self.in_scale == 0 or self.in_dtype is DType.FP8,
              f"CastCall: in_scale {self.in_scale} given for a {self.in_dtype} input (scales are FP8 only)")
        check(self.out_scale == 0 or self.out_dtype is DType.FP8,
              f"CastCall: out_scale {self.out_scale} given for a {self.out_dtype} output (scales are FP8 only)")
        check(self.saturate or self.out_dtype is DType.FP8,
              f"CastCall: saturate=False given for a {self.out_dtype} output (FP8 only)")

    def operand_types(self) -> tuple[list[DType], list[DType]]:
        return [self.in_dtype], [self.out_dtype]

    def key(self) -> str:
        return f"cast_{self.in_dtype}_{self.out_dtype}" + ("" if self.saturate else "_nan")


@dataclass(frozen=True)
class PackCall:
    """Row-major ``[rows, cols]`` -> AMP panels: ``ceil(cols / grain)`` panels,
    each a ``rows x grain`` row-major block, panels one after another."""

    rows: int
    cols: int
    dtype: DType
    grain: int
    primitive: ClassVar[str] = "pack"
    __str__ = describe

    def __post_init__(self):
        _positive(self, rows=self.rows, cols=self.cols, grain=self.grain)
        _dtype(self, dtype=self.dtype)

    @property
    def size(self) -> int:
        return self.rows * self.cols

    def operand_types(self) -> tuple[list[DType], list[DType]]:
        return [self.dtype], [self.dtype]

    def key(self) -> str:
        return f"{self.primitive}_{self.dtype}"


@dataclass(frozen=True)
class UnpackCall(PackCall):
    """AMP panels -> row-major ``[rows, cols]``; the inverse of ``PackCall`` (same fields)."""

    primitive: ClassVar[str] = "unpack"


@dataclass(frozen=True)
class CopyCall:
    """Copy ``nbytes`` bytes from one tile-local buffer to another."""

    nbytes: int
    primitive: ClassVar[str] = "copy"
    __str__ = describe

    def __post_init__(self):
        _positive(self, nbytes=self.nbytes)

    def operand_types(self) -> tuple[list, list]:
        return [BYTE], [BYTE]

    def key(self) -> str:
        return "copy"


Call = MatMulCall | ReduceCall | GeLUCall | BiasGeLUCall | CastCall | PackCall | UnpackCall | CopyCall
