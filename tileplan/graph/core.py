"""Model graphs: shaped, typed tensors and the ops MatMul, Add, GeLU and Cast.

A ``Graph`` owns its tensors (by name) and ops (in file order); ``Graph.build``
checks names, infers shapes and dtypes of op outputs, checks them against any
declared shapes, and refuses cycles. Every error names the op and its tensors.

Conventions:
- The last dimension of a tensor is its columns; all leading dimensions fold into
  rows ("rows" below), the view every layout and kernel uses.
- ``MatMul`` follows numpy semantics for leading batch dimensions. Either operand
  may be an activation or a parameter. ``transpose_a``/``transpose_b`` swap the
  last two dimensions of an operand before the product.
- Accepted MatMul types (the AMP's): fp32 x fp32 -> fp32, fp16 x fp16 -> fp16 or
  fp32 (partials type), fp8 x fp8 -> fp16 (FP8 accumulates into FP16 partials).
- ``Add`` broadcasts as numpy does (a bias row is ``[N]`` added to ``[..., N]``);
  both operands and the result share one dtype (fp16 or fp32).
- ``GeLU`` has the ``tanh`` and ``erf`` forms; fp16 or fp32.
- A dimension may be 0 (a zero-size tensor, as in ONNX); what such tensors feed is folded at plan
  time (``planner.rewrite``) into ``Graph.folded`` outputs, never planned onto tiles.
- ``Cast`` converts between fp32, fp16 and fp8; the output tensor's power-of-two
  ``scale`` is applied when casting into FP8 and the input's when casting out.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from .. import checked
from ..errors import TileplanError, check
from .dtypes import DType, quantise
from .numerics import erf, sigmoid


class Role(enum.Enum):
    INPUT = "input"
    PARAMETER = "parameter"
    INTERMEDIATE = "intermediate"
    OUTPUT = "output"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]
    dtype: DType
    role: Role = Role.INTERMEDIATE
    scale: int = 0              # power-of-two exponent: stored value * 2**scale (FP8)
    layout: Any = None          # an explicit boundary layout pinned by the model file

    def __post_init__(self):
        checked.name(self.name, "tensor")
        checked.dims(self.shape, f"tensor {self.name!r}", zero_ok=True)     # zero-size: see Graph.folded
        check(-32 <= self.scale <= 31, f"tensor {self.name!r}: scale exponent {self.scale} is out of range -32..31")

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def rows(self) -> int:
        """All leading dimensions folded together."""
        return math.prod(self.shape[:-1])

    @property
    def cols(self) -> int:
        return self.shape[-1]

    def __str__(self) -> str:
        s = f"{self.name}: {self.dtype}[{'x'.join(map(str, self.shape))}]"
        return s + (f" *2^{self.scale}" if self.scale else "")


@dataclass(frozen=True)
class Op:
    """Base of every op: a name, input tensor names and one output tensor name."""

    name: str
    inputs: tuple[str, ...]
    output: str
    kind: ClassVar[str] = "op"
    arity: ClassVar[int | None] = 1      # how many inputs it takes; None: one or more (Concat)
    saturate: ClassVar[bool] = True      # an FP8 result saturates to +-240 (a Cast may say NaN instead)

    @classmethod
    def arity_problem(cls, inputs) -> str | None:
        """None when ``inputs`` are as many as the op takes, else what is wrong (one phrase)."""
        if cls.arity is None:
            return None if len(inputs) else "takes one or more inputs, got none"
        if len(inputs) != cls.arity:
            return f"takes {cls.arity} input{'s' if cls.arity > 1 else ''}, got {len(inputs)}: {list(inputs)}"
        return None

    def describe(self) -> str:
        return f"{self.kind} {self.name}({', '.join(self.inputs)}) -> {self.output}"

    def err(self, message: str) -> TileplanError:
        return TileplanError(f"op {self.name!r} ({self.kind}): {message}")

    # Overridden by each op.
    def infer(self, ins: list[Tensor]) -> tuple[tuple[int, ...], DType]:
        raise NotImplementedError

    def allowed_output_dtypes(self, ins: list[Tensor]) -> tuple[DType, ...]:
        return (ins[0].dtype,)

    def flops(self, ins: list[Tensor], out: Tensor) -> int:
        return out.size

    def output_scale(self, ins: list[Tensor]) -> int | None:
        """The FP8 scale the output must carry (None: its own, declared or 0). A relabelling or a
        rearrangement of the elements (Reshape, Transpose) keeps its input's stored bytes, so it
        keeps its scale too."""
        return None

    def check_values(self, *ins: np.ndarray) -> None:
        """Refuse input values the op has no meaning for (raising ``self.err``); most ops take any."""

    def reference(self, *ins: np.ndarray) -> np.ndarray:
        """float64 semantics on float64 operands (the values the inputs' types hold); the caller
        rounds the result to the output tensor's type."""
        raise NotImplementedError


@dataclass(frozen=True)
class MatMul(Op):
    transpose_a: bool = False
    transpose_b: bool = False
    kind: ClassVar[str] = "matmul"
    arity: ClassVar[int] = 2

    def operand_shapes(self, ins: list[Tensor]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        a, b = (list(t.shape) for t in ins)
        for t, shp, tr in ((ins[0], a, self.transpose_a), (ins[1], b, self.transpose_b)):
            if len(shp) < 2:
                raise self.err(f"operand {t.name!r} has shape {list(t.shape)}; MatMul needs at least 2 dimensions")
            if tr:
                shp[-1], shp[-2] = shp[-2], shp[-1]
        return tuple(a), tuple(b)

    def mnk(self, ins: list[Tensor]) -> tuple[int, int, int, int]:
        """(batch, M, N, K) with numpy broadcasting of the batch dimensions."""
        a, b = self.operand_shapes(ins)
        batch = self._batch(ins, a, b)
        return math.prod(batch), a[-2], b[-1], a[-1]

    def _batch(self, ins, a, b) -> tuple[int, ...]:
        try:
            return tuple(int(d) for d in _broadcast(a[:-2], b[:-2]))
        except ValueError:
            raise self.err(f"batch dimensions of {ins[0].name!r} {list(a[:-2])} and {ins[1].name!r} "
                           f"{list(b[:-2])} do not broadcast") from None

    def infer(self, ins):
        a, b = self.operand_shapes(ins)
        if a[-1] != b[-2]:
            raise self.err(f"inner dimensions differ: {ins[0].name!r} {list(ins[0].shape)} gives K={a[-1]}, "
                           f"{ins[1].name!r} {list(ins[1].shape)} gives K={b[-2]}")
        if ins[0].dtype is not ins[1].dtype:
            raise self.err(f"operand dtypes differ: {ins[0].name!r} is {ins[0].dtype}, "
                           f"{ins[1].name!r} is {ins[1].dtype}")
        shape = self._batch(ins, a, b) + (a[-2], b[-1])
        return shape, self.allowed_output_dtypes(ins)[0]

    def allowed_output_dtypes(self, ins):
        allowed = {DType.FP32: (DType.FP32,), DType.FP16: (DType.FP16, DType.FP32), DType.FP8: (DType.FP16,)}
        if ins[0].dtype not in allowed:
            raise self.err(f"MatMul takes fp32, fp16 or fp8 operands, {ins[0].name!r} is {ins[0].dtype} (cast first)")
        return allowed[ins[0].dtype]

    def flops(self, ins, out):
        batch, m, n, k = self.mnk(ins)
        return 2 * batch * m * n * k

    def reference(self, a, b):
        if self.transpose_a:
            a = np.swapaxes(a, -1, -2)
        if self.transpose_b:
            b = np.swapaxes(b, -1, -2)
        return np.matmul(a, b)


class Pointwise(Op):
    """Base of the elementwise ops: FP16 or FP32 operands (FP8 is cast first), the result in the
    operands' type, computed exactly in float64 by ``fn`` (the reference) and rounded once."""

    def _float_operands(self, ins: list[Tensor]) -> None:
        for t in ins:
            if t.dtype in (DType.FP8, DType.INT32):
                raise self.err(f"{self.kind} takes fp16 or fp32 operands, {t.name!r} is {t.dtype} (cast first)")
        if len({t.dtype for t in ins}) > 1:
            raise self.err(f"operand dtypes differ: " + ", ".join(f"{t.name!r} is {t.dtype}" for t in ins))

    def fn(self, *xs: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def reference(self, *ins: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return np.asarray(self.fn(*(np.asarray(x, np.float64) for x in ins)), dtype=np.float64)


@dataclass(frozen=True)
class Unary(Pointwise):
    """``y = f(x)`` elementwise."""

    arity: ClassVar[int] = 1

    def infer(self, ins):
        self._float_operands(ins)
        return ins[0].shape, ins[0].dtype


@dataclass(frozen=True)
class Binary(Pointwise):
    """``y = f(a, b)`` with numpy broadcasting of the two operands."""

    arity: ClassVar[int] = 2

    def infer(self, ins):
        a, b = ins
        try:
            shape = tuple(int(d) for d in _broadcast(a.shape, b.shape))
        except ValueError:
            raise self.err(f"shapes of {a.name!r} {list(a.shape)} and {b.name!r} {list(b.shape)} "
                           "do not broadcast") from None
        self._float_operands(ins)
        return shape, a.dtype


# One row per op: (class name, kind, float64 semantics). A new pointwise op is a row here, a row in
# the kernel table (kernels/pointwise.py) and a row in each importer's table.
@dataclass(frozen=True)
class Add(Binary):
    kind: ClassVar[str] = "add"
    fn = staticmethod(np.add)


@dataclass(frozen=True)
class Sub(Binary):
    kind: ClassVar[str] = "sub"
    fn = staticmethod(np.subtract)


@dataclass(frozen=True)
class Mul(Binary):
    kind: ClassVar[str] = "mul"
    fn = staticmethod(np.multiply)


@dataclass(frozen=True)
class Div(Binary):
    kind: ClassVar[str] = "div"
    fn = staticmethod(np.divide)


@dataclass(frozen=True)
class Max(Binary):
    kind: ClassVar[str] = "max"
    fn = staticmethod(np.maximum)


@dataclass(frozen=True)
class Neg(Unary):
    kind: ClassVar[str] = "neg"
    fn = staticmethod(np.negative)


@dataclass(frozen=True)
class Sqrt(Unary):
    kind: ClassVar[str] = "sqrt"
    fn = staticmethod(np.sqrt)


@dataclass(frozen=True)
class Reciprocal(Unary):
    kind: ClassVar[str] = "reciprocal"
    fn = staticmethod(np.reciprocal)


@dataclass(frozen=True)
class Exp(Unary):
    kind: ClassVar[str] = "exp"
    fn = staticmethod(np.exp)


@dataclass(frozen=True)
class Tanh(Unary):
    kind: ClassVar[str] = "tanh"
    fn = staticmethod(np.tanh)


@dataclass(frozen=True)
class Erf(Unary):
    kind: ClassVar[str] = "erf"
    fn = staticmethod(erf)


@dataclass(frozen=True)
class Sigmoid(Unary):
    kind: ClassVar[str] = "sigmoid"
    fn = staticmethod(sigmoid)


@dataclass(frozen=True)
class Relu(Unary):
    kind: ClassVar[str] = "relu"

    @staticmethod
    def fn(x):
        return np.where(x > 0, x, 0.0)      # NaN stays NaN (np.maximum would too; this keeps -0 -> 0)


@dataclass(frozen=True)
class GeLU(Unary):
    approximate: str = "tanh"          # "tanh" or "erf" (exact)
    kind: ClassVar[str] = "gelu"

    def __post_init__(self):
        if self.approximate not in ("tanh", "erf"):
            raise self.err(f"approximate must be 'tanh' or 'erf', got {self.approximate!r}")

    def fn(self, x):
        if self.approximate == "tanh":
            return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
        return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))

    def flops(self, ins, out):
        return 8 * out.size     # tanh form: about 8 arithmetic operations per element


@dataclass(frozen=True)
class Cast(Op):
    """Convert to the output tensor's type (and FP8 scale). ``saturate=False``: FP8 values beyond
    +-240 become NaN (ONNX ``saturate=0``) instead of +-240."""

    saturate: bool = True
    kind: ClassVar[str] = "cast"

    def infer(self, ins):
        return ins[0].shape, ins[0].dtype

    def allowed_output_dtypes(self, ins):
        # Into a float type only (an INT32 tensor is an input the host gives); saturate=false: FP8 only.
        return tuple(d for d in DType if d.is_float) if self.saturate else (DType.FP8,)

    def reference(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x, dtype=np.float64)      # the rounding is the output tensor's type


class Rowwise(Op):
    """Base of the row-wise ops: they reduce or normalise over the last axis (every leading axis is
    a row), with FP32 statistics, the result in the input's type (FP16 or FP32)."""

    def _float_input(self, x: Tensor) -> None:
        if x.dtype in (DType.FP8, DType.INT32):
            raise self.err(f"{self.kind} takes fp16 or fp32, {x.name!r} is {x.dtype} (cast first)")


@dataclass(frozen=True)
class LayerNorm(Rowwise):
    """``(x - mean) / sqrt(var + epsilon) * gamma + beta`` over the last axis (ONNX
    LayerNormalization with ``axis = -1``; importers reshape other axes onto the last one).
    Inputs: x, gamma ``[C]``, beta ``[C]``."""

    epsilon: float = 1e-5
    kind: ClassVar[str] = "layernorm"
    arity: ClassVar[int] = 3

    def __post_init__(self):
        if not isinstance(self.epsilon, (int, float)) or isinstance(self.epsilon, bool) or not self.epsilon >= 0:
            raise self.err(f"epsilon must be a non-negative number, got {self.epsilon!r}")
        object.__setattr__(self, "epsilon", float(self.epsilon))

    def infer(self, ins):
        x, gamma, beta = ins
        self._float_input(x)
        for t in (gamma, beta):
            if tuple(t.shape) != (x.shape[-1],):
                raise self.err(f"{t.name!r} {list(t.shape)} must have shape [{x.shape[-1]}] (the last axis of "
                               f"{x.name!r} {list(x.shape)})")
            if t.dtype is not x.dtype:
                raise self.err(f"{t.name!r} is {t.dtype}, {x.name!r} is {x.dtype}: they must agree")
        return x.shape, x.dtype

    def flops(self, ins, out):
        return 8 * out.size

    def reference(self, x, gamma, beta):
        mean = x.mean(axis=-1, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
        return (x - mean) / np.sqrt(var + self.epsilon) * gamma + beta


@dataclass(frozen=True)
class Softmax(Rowwise):
    """``softmax(softmax_scale * x)`` over ``axis``: ``e = exp(softmax_scale * (x - max(x)))``,
    ``e / sum(e)`` (the planner runs the last axis natively and moves any other onto it with a
    Transpose).

    ``softmax_scale`` (positive, default 1; FlashAttention's name for it) is attention's
    ``1/sqrt(d)`` folded in: HF eager attention and
    ONNX exports multiply (or divide) the scores by a constant before the softmax, a pointwise pass
    over the layer's biggest activation; the importers' pattern table (``patterns.py``,
    ``scaled-softmax``) folds that constant here. For a positive scale ``max(s * x)`` is
    ``s * max(x)``, so the kernel keeps its max of ``x`` and scales the exp argument."""

    axis: int = -1
    softmax_scale: float = 1.0
    kind: ClassVar[str] = "softmax"

    def __post_init__(self):
        s = self.softmax_scale
        if (not isinstance(s, (int, float, np.floating)) or isinstance(s, bool) or not math.isfinite(s)
                or not s > 0):
            raise self.err(f"softmax_scale must be a positive finite number, got {s!r}")
        object.__setattr__(self, "softmax_scale", float(s))

    def infer(self, ins):
        (x,) = ins
        self._float_input(x)
        if not isinstance(self.axis, int) or isinstance(self.axis, bool) or not -len(x.shape) <= self.axis < len(x.shape):
            raise self.err(f"axis {self.axis!r} is out of range for {x.name!r} {list(x.shape)}")
        return x.shape, x.dtype

    def flops(self, ins, out):
        return (5 + (self.softmax_scale != 1.0)) * out.size

    def reference(self, x):
        e = np.exp(self.softmax_scale * (x - x.max(axis=self.axis, keepdims=True)))
        return e / e.sum(axis=self.axis, keepdims=True)


@dataclass(frozen=True)
class Reduce(Rowwise):
    """A reduction over the last axis, ``keepdims`` as ONNX (default: keep a unit axis)."""

    keepdims: bool = True

    def infer(self, ins):
        (x,) = ins
        self._float_input(x)
        if not isinstance(self.keepdims, bool):
            raise self.err(f"keepdims must be true or false, got {self.keepdims!r}")
        shape = x.shape[:-1] + ((1,) if self.keepdims or len(x.shape) == 1 else ())
        return shape, x.dtype

    def reference(self, x):
        if x.shape[-1] == 0:                          # an empty set (see _max); the mean of none is NaN
            with np.errstate(invalid="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                return self.fn(x, axis=-1, keepdims=self.keepdims)
        return self.fn(x, axis=-1, keepdims=self.keepdims)


@dataclass(frozen=True)
class ReduceSum(Reduce):
    kind: ClassVar[str] = "reducesum"
    fn = staticmethod(np.sum)


@dataclass(frozen=True)
class ReduceMean(Reduce):
    kind: ClassVar[str] = "reducemean"
    fn = staticmethod(np.mean)


def _max(x, axis, keepdims):
    """ONNX's ReduceMax: "Reduction over an empty set of values yields minus infinity (if supported by
    the datatype)" (ReduceMax-20; onnx/defs/reduction/utils.h, EMPTY_MIN). ReduceSum's empty set
    yields 0 (numpy's too); ReduceMean's is "undefined" in ONNX, NaN (0/0) here."""
    return np.max(x, axis=axis, keepdims=keepdims, initial=-np.inf)


@dataclass(frozen=True)
class ReduceMax(Reduce):
    kind: ClassVar[str] = "reducemax"
    fn = staticmethod(_max)


def _int_tuple(op: Op, field: str) -> tuple[int, ...]:
    value = getattr(op, field)
    try:
        out = tuple(value)
    except TypeError:
        raise op.err(f"{field} must be a list of integers, got {value!r}") from None
    if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in out):
        raise op.err(f"{field} must be a list of integers, got {list(out)}")
    out = tuple(int(d) for d in out)
    object.__setattr__(op, field, out)
    return out


@dataclass(frozen=True)
class Reshape(Op):
    """A relabelling of the row-major order: the same elements in the same order under ``shape``.
    Importers map Reshape, Flatten, Squeeze, Unsqueeze, Identity and inference Dropout onto it (with
    the output shape resolved: no -1 or 0 entries remain)."""

    shape: tuple[int, ...] = ()
    kind: ClassVar[str] = "reshape"

    def output_scale(self, ins):
        return ins[0].scale

    def __post_init__(self):
        shape = _int_tuple(self, "shape")
        if not shape or any(d < 0 for d in shape):        # a zero: a zero-size result (ONNX's allowzero)
            raise self.err(f"shape must be a non-empty list of non-negative integers, got {list(shape)}")

    def infer(self, ins):
        (x,) = ins
        if math.prod(self.shape) != x.size:
            raise self.err(f"cannot reshape {x.name!r} {list(x.shape)} ({x.size} elements) to {list(self.shape)} "
                           f"({math.prod(self.shape)} elements)")
        return self.shape, x.dtype

    def allowed_output_dtypes(self, ins):
        return (ins[0].dtype,)

    def flops(self, ins, out):
        return 0

    def reference(self, x):
        return np.reshape(x, self.shape)


@dataclass(frozen=True)
class Gather(Op):
    """Rows of a table by integer indices: ``table[indices]`` (``torch.nn.Embedding``, ONNX
    ``Gather`` on axis 0): inputs ``(table [V, D], indices [...])``, output ``[..., D]``. The
    indices are an INT32 tensor the host gives (token ids); a negative index counts from the end (ONNX's
    rule), one outside ``[-V, V)`` is refused by the reference (naming the op), as the IPU model
    refuses it: the codelet writes zeros there.

    Design decision: only a parameter table is planned (an embedding); indices known at import are
    folded by the importers into a parameter slice, so this op exists for activation indices."""

    kind: ClassVar[str] = "gather"
    arity: ClassVar[int] = 2

    def infer(self, ins):
        table, idx = ins
        if len(table.shape) != 2:
            raise self.err(f"the table {table.name!r} {list(table.shape)} must be 2-D [rows, width]")
        if idx.dtype is not DType.INT32:
            raise self.err(f"the indices {idx.name!r} must be int32, got {idx.dtype}")
        if table.dtype not in (DType.FP16, DType.FP32):
            raise self.err(f"the table {table.name!r} must be fp16 or fp32, got {table.dtype}")
        return tuple(idx.shape) + (table.shape[1],), table.dtype

    def allowed_output_dtypes(self, ins):
        return (ins[0].dtype,)

    def flops(self, ins, out):
        return 0

    def check_values(self, table, indices):
        idx = np.asarray(indices)
        rows = np.asarray(table).shape[0]
        bad = (idx < -rows) | (idx >= rows) | (idx != np.round(idx))
        if bad.any():
            raise self.err(f"index {idx[bad].flat[0]:g} of {self.inputs[1]!r} is outside the {rows} rows of "
                           f"{self.inputs[0]!r}")

    def reference(self, table, indices):
        self.check_values(table, indices)
        return np.asarray(table)[np.asarray(indices).astype(np.int64) % np.asarray(table).shape[0]]


@dataclass(frozen=True)
class Transpose(Op):
    """Axis permutation (numpy ``transpose(perm)``): a real rearrangement of the elements."""

    perm: tuple[int, ...] = ()
    kind: ClassVar[str] = "transpose"

    def output_scale(self, ins):
        return ins[0].scale

    def __post_init__(self):
        _int_tuple(self, "perm")

    def infer(self, ins):
        (x,) = ins
        if sorted(self.perm) != list(range(len(x.shape))):
            raise self.err(f"perm {list(self.perm)} is not a permutation of the {len(x.shape)} axes of "
                           f"{x.name!r} {list(x.shape)}")
        return tuple(x.shape[p] for p in self.perm), x.dtype

    def flops(self, ins, out):
        return 0

    def reference(self, x):
        return np.transpose(x, self.perm)


@dataclass(frozen=True)
class Slice(Op):
    """The elements ``start, start + step, ...`` before ``stop`` of one axis (numpy
    ``x[..., start:stop:step, ...]`` with ``start`` and ``stop`` as ``range`` takes them: ``stop``
    may be -1 for a negative step reaching index 0): what ONNX Split and Slice and ATen split /
    split_with_sizes / slice / chunk / unbind become, one Slice per output and sliced axis (a fused
    QKV projection's three heads of ``[..., 3 * H * D]``). With step 1, seen on the 2-D view
    ``[outer, L * inner]`` of its input (``inner`` the elements after the axis), it is the column
    window ``[start * inner, stop * inner)``: the View family plans it as that window of the
    input's layout. Another step (reversed, strided) on an axis before the last picks whole rows
    of the trailing axes: the family gathers them like a Transpose's rows; on the last axis the
    planner moves the axis first (``planner.rewrite``). An empty range gives a zero-size output,
    folded at plan time."""

    axis: int = -1
    start: int = 0
    stop: int = 1
    step: int = 1
    kind: ClassVar[str] = "slice"

    def output_scale(self, ins):
        return ins[0].scale

    def __post_init__(self):
        for f in ("axis", "start", "stop", "step"):
            v = getattr(self, f)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
                raise self.err(f"{f} must be an integer, got {v!r}")
            object.__setattr__(self, f, int(v))
        if self.step == 0:
            raise self.err("step must not be 0")

    def infer(self, ins):
        (x,) = ins
        n = len(x.shape)
        if not -n <= self.axis < n:
            raise self.err(f"axis {self.axis} is out of range for {x.name!r} {list(x.shape)}")
        length = x.shape[self.axis % n]
        legal = (0 <= self.start <= self.stop <= length if self.step > 0 else
                 -1 <= self.stop <= self.start < length)
        if not legal:
            raise self.err(f"range({self.start}, {self.stop}, {self.step}) does not lie in axis {self.axis} of "
                           f"{x.name!r} {list(x.shape)} (length {length})")
        shape = list(x.shape)
        shape[self.axis % n] = len(self.indices())
        return tuple(shape), x.dtype

    @staticmethod
    def positions(r: range) -> dict:
        """``start``, ``stop`` and ``step`` for the positions ``r`` (``range(*slice(..).indices(L))``),
        step 1 where at most one position is taken."""
        if len(r) <= 1:
            first = r[0] if len(r) else 0
            return {"start": first, "stop": first + len(r), "step": 1}
        return {"start": r.start, "stop": r.stop if r.step > 0 else max(r.stop, -1), "step": r.step}

    def indices(self) -> range:
        """The input positions along the axis, in output order."""
        return range(self.start, self.stop, self.step)

    def window(self, shape: tuple[int, ...]) -> tuple[int, int, int]:
        """``(C, c0, w)`` (step 1): the input's 2-D view has ``C`` columns and the slice is columns
        ``[c0, c0 + w)`` of every row."""
        a = self.axis % len(shape)
        inner = math.prod(shape[a + 1:])
        return shape[a] * inner, self.start * inner, (self.stop - self.start) * inner

    def flops(self, ins, out):
        return 0

    def reference(self, x):
        return np.take(x, np.asarray(self.indices(), dtype=np.int64), axis=self.axis % x.ndim)


@dataclass(frozen=True)
class Concat(Op):
    """Its inputs joined along one axis (numpy ``concatenate(ins, axis)``): every other axis the
    same, one dtype. The inverse of Slice: seen on the 2-D view ``[outer, L * inner]`` of its
    output (``inner`` the elements after the axis), input ``i`` is the column window
    ``[c_i, c_i + w_i)`` (``window``); the View family plans it as one copy of each input into
    that window of the output's layout (``planner.views.concat_candidates``). A class token
    joined to patch tokens (``cat([cls, x], dim=1)``) is a Concat of the token axis.

    Design decision: FP8 inputs must share one scale (the output keeps the stored bytes, so it
    keeps the scale); tileplan does not rescale while joining."""

    axis: int = -1
    kind: ClassVar[str] = "concat"
    arity: ClassVar[int | None] = None

    def __post_init__(self):
        if not isinstance(self.axis, (int, np.integer)) or isinstance(self.axis, bool):
            raise self.err(f"axis must be an integer, got {self.axis!r}")
        object.__setattr__(self, "axis", int(self.axis))

    def output_scale(self, ins):
        return ins[0].scale

    def infer(self, ins):
        first = ins[0]
        n = len(first.shape)
        if not -n <= self.axis < n:
            raise self.err(f"axis {self.axis} is out of range for {first.name!r} {list(first.shape)}")
        a = self.axis % n
        for t in ins[1:]:
            if len(t.shape) != n or t.shape[:a] != first.shape[:a] or t.shape[a + 1:] != first.shape[a + 1:]:
                raise self.err(f"inputs {first.name!r} {list(first.shape)} and {t.name!r} {list(t.shape)} differ "
                               f"in an axis other than the joined axis {a}")
            if t.dtype != first.dtype:
                raise self.err(f"inputs {first.name!r} ({first.dtype}) and {t.name!r} ({t.dtype}) differ in dtype")
            if t.scale != first.scale:
                raise self.err(f"inputs {first.name!r} (scale 2^{first.scale}) and {t.name!r} (scale 2^{t.scale}) "
                               "differ in FP8 scale; tileplan joins stored bytes and does not rescale")
        shape = list(first.shape)
        shape[a] = sum(t.shape[a] for t in ins)
        return tuple(shape), first.dtype

    def windows(self, shapes) -> tuple[int, list[tuple[int, int]]]:
        """``(C, [(c0, w), ...])``: the output's 2-D view has ``C`` columns and input ``i`` is its
        columns ``[c0, c0 + w)`` of every row."""
        a = self.axis % len(shapes[0])
        inner = math.prod(shapes[0][a + 1:])
        out, c = [], 0
        for s in shapes:
            out.append((c, s[a] * inner))
            c += s[a] * inner
        return c, out

    def flops(self, ins, out):
        return 0

    def reference(self, *ins):
        return np.concatenate(ins, axis=self.axis % ins[0].ndim)


OP_KINDS: dict[str, type[Op]] = {cls.kind: cls for cls in (MatMul, Add, Sub, Mul, Div, Max, Neg, Sqrt, Reciprocal, Exp,
                                                           Tanh, Erf, Sigmoid, Relu, GeLU, Cast, Reshape, Transpose, Slice,
                                                           Concat, LayerNorm, Softmax, ReduceSum, ReduceMean,
                                                           ReduceMax, Gather)}


def _broadcast(*shapes):
    return np.broadcast_shapes(*(tuple(s) for s in shapes))


WEIGHTS = ("planner", "compact")   # parameter storage: the planner may pre-arrange a GEMM's weights as its
                                   # grid reads them (planner.plan), or every weight stays compact


def check_weights(value, where: str) -> str:
    """``value`` when it names a parameter storage (``WEIGHTS``), else the one error line."""
    if value not in WEIGHTS:
        raise TileplanError(f"{where} must be {' or '.join(repr(w) for w in WEIGHTS)}, got {value!r}")
    return value


@dataclass
class Graph:
    """A model graph. Build it with ``Graph.build``; treat it as immutable after."""

    name: str
    tensors: dict[str, Tensor]
    ops: list[Op]
    target: str | None = None              # the model file's default target
    producers: dict[str, Op] = field(default_factory=dict)
    consumers: dict[str, list[Op]] = field(default_factory=dict)
    pins: tuple = ()                       # the model file's GEMM pins (planner.pins.Pin), a planning input
    weights: str | None = None             # the model file's parameter storage ([plan] weights: one of
                                           # WEIGHTS), a planning input; None: not said (the planner's)
    imported: dict[str, Any] = field(default_factory=dict)   # conversions an importer made (cast_bf16)
    # Graph outputs no op writes: their value, every element the same, was folded at plan time
    # (planner.rewrite: a zero-size result, or a reduction over an empty axis). The package carries
    # them as host data; they occupy no tile memory and take no cycles.
    folded: dict[str, float] = field(default_factory=dict)

    @classmethod
    def build(cls, name: str, tensors: list[Tensor], ops: list[Op], *,
              outputs: list[str] | None = None, target: str | None = None, pins: tuple = (),
              weights: str | None = None, folded: dict[str, float] | None = None,
              unread: frozenset = frozenset()) -> "Graph":
        """Check and complete a graph: declared tensors plus ops whose outputs may be undeclared.

        Op outputs that are not declared get their inferred shape and dtype
        (an op may pin the output dtype by declaring the tensor). Tensors named in
        ``outputs`` (default: every tensor no op consumes) get role OUTPUT. ``folded``: declared
        graph outputs that no op writes, each with its one value (``Graph.folded``). A zero-size
        input or parameter no op reads is allowed (it holds nothing); so is a graph without ops
        when it has folded outputs. ``unread``: inputs and parameters that only ops folded at plan
        time read (``planner.rewrite``): declared, written by nobody's host program, read by none.
        """
        checked.name(name, "model")
        folded = {k: float(v) for k, v in (folded or {}).items()}
        table: dict[str, Tensor] = {}
        for t in tensors:
            if t.name in table:
                raise TileplanError(f"tensor {t.name!r} is declared twice")
            table[t.name] = t
        op_names: set[str] = set()
        producers: dict[str, Op] = {}
        for op in ops:
            checked.name(op.name, "op")
            if op.name in op_names:
                raise TileplanError(f"op name {op.name!r} is used twice")
            op_names.add(op.name)
            problem = op.arity_problem(op.inputs)
            if problem:
                raise op.err(problem)
            if op.output in producers:
                raise op.err(f"output {op.output!r} is already produced by op {producers[op.output].name!r}")
            producers[op.output] = op
        for tname, t in table.items():     # (not `name`: that is the graph's name)
            if t.role in (Role.INPUT, Role.PARAMETER) and tname in producers:
                raise producers[tname].err(f"writes {tname!r}, which is a graph {t.role}")
        for tname in folded:
            if tname not in table or tname in producers or table[tname].role in (Role.INPUT, Role.PARAMETER):
                raise TileplanError(f"folded output {tname!r} must be a declared tensor that no op writes")

        # Dependency order, refusing cycles and unknown tensors.
        for op in ops:
            for i in op.inputs:
                if i not in table and i not in producers:
                    raise op.err(f"input tensor {i!r} is not declared and no op produces it")
        order = _dependency_order(ops, producers)
        by_name = {op.name: op for op in ops}
        ordered = [by_name[n] for n in order]

        for op in ordered:
            ins = [table[i] for i in op.inputs]
            shape, dtype = op.infer(ins)
            declared = table.get(op.output)
            scale = op.output_scale(ins)
            if declared is None:
                role = Role.INTERMEDIATE
                table[op.output] = Tensor(op.output, tuple(shape), dtype, role, scale or 0)
                continue
            if scale is not None and declared.scale != scale:
                raise op.err(f"output {op.output!r} is declared with scale {declared.scale}; it keeps the "
                             f"elements of {op.inputs[0]!r} and so its scale {scale}")
            if tuple(declared.shape) != tuple(shape):
                raise op.err(f"output {op.output!r} is declared with shape {list(declared.shape)} "
                             f"but the op gives {list(shape)}")
            allowed = op.allowed_output_dtypes(ins)
            if declared.dtype not in allowed:
                raise op.err(f"output {op.output!r} is declared {declared.dtype}; from "
                             f"{', '.join(str(t.dtype) for t in ins)} inputs it can be "
                             f"{' or '.join(str(d) for d in allowed)}")

        consumers: dict[str, list[Op]] = {n: [] for n in table}
        for op in ordered:
            for i in op.inputs:
                consumers[i].append(op)
        out_names = list(outputs) if outputs else [n for n, t in table.items()
                                                   if (n in producers or n in folded) and not consumers[n]]
        for n in out_names:
            if n not in table:
                raise TileplanError(f"output {n!r} is not a tensor of the graph")
            if n in folded:
                if consumers[n]:
                    raise consumers[n][0].err(f"reads {n!r}, an output folded at plan time")
            elif n not in producers:
                raise TileplanError(f"output {n!r} is a graph {table[n].role}; no op produces it")
            table[n] = dataclasses.replace(table[n], role=Role.OUTPUT)
        for n, t in table.items():
            if t.role is Role.OUTPUT and n not in out_names:
                table[n] = dataclasses.replace(t, role=Role.INTERMEDIATE)
            if t.role is Role.INTERMEDIATE and n not in producers and n in table:
                raise TileplanError(f"tensor {n!r} is an intermediate but no op produces it "
                                    "(declare it with role 'input' or 'parameter')")
        unused = [n for n, t in table.items() if t.role in (Role.INPUT, Role.PARAMETER) and not consumers[n]
                  and t.size and n not in unread]
        if unused:
            raise TileplanError(f"tensor(s) {', '.join(repr(u) for u in unused)} are declared but no op uses them")
        stray = [n for n in folded if n not in out_names]
        if stray:
            raise TileplanError(f"folded tensor(s) {', '.join(map(repr, stray))} are not graph outputs")
        if not ordered and not folded:
            raise TileplanError("the graph has no ops")
        return cls(name, table, ordered, target, producers, consumers, tuple(pins), weights, folded=folded)

    # ---- queries -------------------------------------------------------------

    def inputs_of(self, op: Op) -> list[Tensor]:
        return [self.tensors[i] for i in op.inputs]

    def output_of(self, op: Op) -> Tensor:
        return self.tensors[op.output]

    def op(self, name: str) -> Op:
        for op in self.ops:
            if op.name == name:
                return op
        raise KeyError(name)

    def folded_value(self, name: str) -> np.ndarray:
        """A folded output's stored values (in its dtype): what the host writes for it."""
        t = self.tensors[name]
        return quantise(np.full(t.shape, self.folded[name]), t.dtype, t.scale)

    def boundary_shape(self, name: str) -> tuple[int, ...]:
        """A graph input's, parameter's or output's shape as the model file declared it, which is the
        shape the package's users give and get (``validate --inputs``, ``--expected``, ``--outputs``).
        Design decision: an importer's 0-d tensor is ``[1]`` inside (it broadcasts the same, and every
        op and layout takes rank >= 1), recorded in ``imported["declared_shapes"]`` so the boundary
        keeps the declared rank; for every other tensor it is the tensor's own shape."""
        declared = self.imported.get("declared_shapes", {})
        return tuple(declared[name]) if name in declared else self.tensors[name].shape

    def by_role(self, role: Role) -> list[Tensor]:
        return [t for t in self.tensors.values() if t.role is role]

    def flops(self, op: Op) -> int:
        return op.flops(self.inputs_of(op), self.output_of(op))

    def op_bytes(self, op: Op) -> int:
        """Bytes an op reads and writes at its boundary."""
        return sum(t.nbytes for t in self.inputs_of(op)) + self.output_of(op).nbytes

    def total_flops(self) -> int:
        return sum(self.flops(op) for op in self.ops)

    def roofline_cycles(self, target) -> float:
        """FLOPs of every MatMul over (tiles x AMP peak for its operand and partials types).

        Elementwise ops run on the vector units, not the AMP, and are left out
        of the bound (as in the reference figures this bound is compared with).
        An FP16 MatMul with an FP32 output runs at the FP16-with-FP32-partials rate.
        """
        total = 0.0
        for op in self.ops:
            if isinstance(op, MatMul):
                dt = self.tensors[op.inputs[0]].dtype
                peak = target.amp_flops(dt, partials=self.tensors[op.output].dtype)
                if peak <= 0:
                    raise op.err(f"target {target.name!r} has no {dt} AMP, so there is no roofline bound")
                total += self.flops(op) / (target.tiles * peak)
        return total


def _dependency_order(ops: list, producers: dict) -> list[str]:
    """The op names in dependency order, ties broken by the order written (the lexicographic
    topological order by position); a cycle is a ``TileplanError`` naming its ops.

    Design decision: a heap-ordered Kahn's algorithm here rather than networkx's
    ``lexicographical_topological_sort`` (the same order): importing networkx cost a quarter of a
    second of every command's start-up for this one sort."""
    import heapq
    position = {op.name: i for i, op in enumerate(ops)}
    succ: dict[str, list[str]] = {op.name: [] for op in ops}
    preds: dict[str, list[str]] = {op.name: [] for op in ops}
    for op in ops:
        for u in dict.fromkeys(producers[i].name for i in op.inputs if i in producers):
            succ[u].append(op.name)
            preds[op.name].append(u)
    waiting = {n: len(p) for n, p in preds.items()}
    ready = [(position[n], n) for n, k in waiting.items() if k == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, n = heapq.heappop(ready)
        order.append(n)
        for v in succ[n]:
            waiting[v] -= 1
            if waiting[v] == 0:
                heapq.heappush(ready, (position[v], v))
    if len(order) < len(ops):
        # Every op left waits on another op left: walk back through them until an op repeats.
        left = {n for n, k in waiting.items() if k > 0}
        walk, seen = [min(left, key=position.__getitem__)], {}
        while walk[-1] not in seen:
            seen[walk[-1]] = len(walk) - 1
            walk.append(next(u for u in preds[walk[-1]] if u in left))
        cycle = walk[seen[walk[-1]]:][::-1]
        raise TileplanError(f"the graph has a cycle through ops {' -> '.join(cycle)}")
    return order
