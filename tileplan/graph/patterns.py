"""Exporter decompositions folded back into fused ops: the pattern table both importers share.

Exporters (ONNX below opset 20, ``torch.export`` of hand-written activations such as
Hugging Face's ``NewGELUActivation``) spell some activations as chains of pointwise
ops. The importers first lower every node to tileplan ops (``Pow`` with exponent 2
or 3 becomes Muls, ``Sum`` becomes Adds, ``CastLike``/``Cast``/``Sqrt`` of constants
are folded into constants), then ``fuse(ops, ...)`` rewrites the chains below into
one op. Working on tileplan ops, not on ONNX nodes or FX nodes, makes the table
one mechanism for both importers.

``PATTERNS``, one row a decomposition (the op the anchor is, the matcher, what it
becomes):

- ``gelu-erf``: ``0.5 * x * (1 + Erf(x / sqrt(2)))`` (or ``x * 0.70710677``), the
  Muls in any association and operand order -> ``GeLU(approximate="erf")``.
- ``gelu-tanh``: ``0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))`` with
  ``x**3`` as ``Pow(x, 3)`` or ``x * x * x`` (HF ``gelu_new``; ``gelu_pytorch_tanh``
  arrives as ``aten.gelu(approximate="tanh")`` already) -> ``GeLU(approximate="tanh")``.

- ``softmax``: ``e = Exp(x - ReduceMax(x)); e / ReduceSum(e)``, the reductions over
  one axis keeping it (ONNX's Softmax function body): the last, or another as the importers
  write it (Transposes moving it last, the reduction, a Reshape) -> ``Softmax(axis)``.

- ``scaled-softmax``: ``Softmax(c * x)`` with ``c`` a positive product of scalar constants (Muls
  and Divs by constants, ``x * 0.125``, ``x / sqrt(72)``, through a Cast between float types, as
  HF eager attention casts the scores to FP32 for its softmax), and ``x`` a MatMul's output whose
  operands may be scaled too (``(q * a) @ (k^T * b)``, how exporters split ``1/sqrt(d)`` over q and
  k) -> ``Softmax(softmax_scale=c * a * b)`` on the unscaled product: the MatMul reads the
  unscaled operands. Attention's ``1/sqrt(d)`` was a pointwise pass over the scores ``[B, H, T,
  T]``, the layer's biggest activation (or over q and k); the row-wise kernel folds it into its
  exp argument (``kernels.softmax``). Numerics: the folded form skips rounding the scaled scores
  to their type (more accurate, not bit-identical to the unfused graph); a scale taken off the
  MatMul's operands leaves the product larger by ``1 / (a * b)`` (``sqrt(d)``, 8.5 for d = 72), which
  an FP16 product must still hold (attention scores are far from FP16's 65,504).

- ``softmax-fp32``: ``Cast(Softmax(Cast(x -> fp32)) -> fp16)`` with ``x`` FP16, the Softmax's
  intermediates private -> ``Softmax(x)`` in FP16 writing the outer Cast's output (named after the
  Softmax). Hugging Face eager attention computes its softmax so (``softmax(scores, dtype=float32)
  .to(query.dtype)``); tileplan's FP16 softmax kernel already keeps its statistics in FP32 and
  rounds its result once. Numerics: the FP32 island rounds the probabilities twice (to FP32, then to
  FP16), the fused op once, so the two may differ by one FP16 ulp in rare ties; two passes over the
  scores (the casts) and an FP32 pass instead of an FP16 one are saved (28,000 cycles on the FP8
  SigLIP layer imported from HF).
- ``fp8-matmul``: the quantise-dequantise (QDQ) form of an FP8 GEMM, ``MatMul(dq(a8), dq(b8))``
  with ``dq(v8) = Cast(v8 -> fp16)``, both operands FP8 values (a Cast into FP8 of an activation,
  an FP8 parameter) and the product FP16 -> ``MatMul(a8, b8)``, the AMP's FP8 GEMM with its FP16
  output. A dequantised FP8 *parameter* may be scaled by a power of two, ``dq(w8) * 2**s`` (how a
  torch module writes a per-tensor scale): the exponent becomes the parameter's FP8 scale
  (``Tensor.scale``, the importer's ``rescaled``), so ``w8`` reads as ``q * 2**s`` as before. Numerics:
  identical. FP8 -> FP16 is exact, so the FP16 GEMM on dequantised operands and the FP8 GEMM
  multiply the same values; each rounds its sum once to FP16. torch's CPU matmul has no FP8 form
  with an FP16 result, so this is how a torch factory states an FP8 GEMM (``fixtures/siglip_hf.py``)
  and is validated against torch's own outputs. A dequantised operand read elsewhere, an FP32
  product, or only one FP8 operand stays as written (FP16 GEMM; no mixed-type AMP form).

The GeLU rows become the fitted GeLU kernel: one pass instead of six to eight
pointwise passes and their intermediates; the softmax row the row-wise softmax
kernel (one pass over the row instead of five ops). Constants match within a relative
``CONSTANT_RTOL`` (FP16 constants pass). Every intermediate must have no reader
outside the pattern and not be a graph output, otherwise the ops stay as they are
(they compute the same function, only slower). The fused op is named after the
pattern's last op and writes its output.

Kept as pointwise ops on purpose (no row): quick_gelu ``x * sigmoid(1.702 * x)``
and SiLU ``x * sigmoid(x)`` are a Mul, a Sigmoid and a Mul, which are already
their exact semantics; tileplan has no fused kernel that would be cheaper.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

from .core import (Add, Cast, Div, Erf, Exp, GeLU, MatMul, Mul, Op, ReduceMax, ReduceSum, Reshape, Role, Softmax, Sub,
                   Tanh, Tensor, Transpose)
from .dtypes import DType

CONSTANT_RTOL = 2e-3        # relative tolerance when matching pattern constants


class Declared(NamedTuple):
    """What a row may ask of a tensor (``fuse``'s ``tensor``; a ``core.Tensor`` answers the same)."""

    dtype: DType
    role: Role
    scale: int = 0


@dataclass(frozen=True)
class Match:
    """A matched decomposition: the ops it replaces and the op that replaces them."""

    members: tuple[Op, ...]
    root: Op                   # the last op; the fused op writes its output
    fused: Op
    rewired: tuple[tuple[Op, Op], ...] = ()   # ops outside the members kept in place, reading anew
    rescaled: tuple[tuple[str, int], ...] = ()  # parameters whose FP8 scale becomes this exponent


@dataclass(frozen=True)
class Pattern:
    name: str
    anchor: type[Op]                                  # the op class the matcher starts from
    match: Callable[["_View", Op], Match | None]
    becomes: str                                      # what the row folds into, for the docs


def fuse(ops: list[Op], scalar: Callable[[str], float | None], outputs: list[str],
         tensor: Callable[[str], Tensor | Declared | None] = lambda t: None,
         rescaled: dict[str, int] | None = None) -> list[Op]:
    """``ops`` with every ``PATTERNS`` match replaced by its fused op (in the root's position).

    ``scalar(t)`` is the value of a constant tensor whose elements are all equal (None
    for anything else); ``outputs`` are the graph outputs (never folded away); ``tensor(t)``
    is the importer's declaration of ``t`` (dtype, role, scale; None where unknown, and the rows
    that need it do not match). A row that gives a parameter a new FP8 scale records it in
    ``rescaled`` (name -> exponent), which the importer applies to the declaration.
    A pattern may anchor on the op another pattern makes (``scaled-softmax`` on the Softmax the
    ``softmax`` row folds): the table is applied until nothing more matches.
    """
    while True:
        fused = _fuse_once(ops, scalar, outputs, tensor, {} if rescaled is None else rescaled)
        if len(fused) == len(ops) and all(a is b for a, b in zip(fused, ops)):
            return fused
        ops = fused


def _fuse_once(ops: list[Op], scalar: Callable[[str], float | None], outputs: list[str],
               tensor: Callable[[str], Tensor | Declared | None], rescaled: dict[str, int]) -> list[Op]:
    view = _View(ops, scalar, set(outputs), tensor)
    anchors: dict[type, list[Pattern]] = {}
    for p in PATTERNS:
        anchors.setdefault(p.anchor, []).append(p)
    removed: set[int] = set()
    replaced: dict[int, Op] = {}
    for op in ops:
        if id(op) in removed or id(op) in replaced:
            continue
        for pattern in anchors.get(type(op), ()):
            m = pattern.match(view, op)
            touched = list(m.members) + [old for old, _ in m.rewired] if m is not None else []
            if m is None or any(id(x) in removed or id(x) in replaced for x in touched):
                continue
            removed |= {id(x) for x in m.members}
            replaced[id(m.root)] = m.fused
            replaced.update((id(old), new) for old, new in m.rewired)
            rescaled.update(m.rescaled)
            break
    return [replaced.get(id(op), op) for op in ops if id(op) in replaced or id(op) not in removed]


@dataclass
class _View:
    """Producers and readers of every tensor of an op list, for the matchers."""

    ops: list[Op]
    scalar: Callable[[str], float | None]
    outputs: set[str]
    tensor: Callable[[str], Tensor | Declared | None] = lambda t: None
    producer: dict[str, Op] = field(default_factory=dict)
    consumers: dict[str, list[Op]] = field(default_factory=dict)

    def __post_init__(self):
        for op in self.ops:
            self.producer[op.output] = op
            for t in op.inputs:
                self.consumers.setdefault(t, []).append(op)

    def private(self, t: str) -> bool:
        """Whether ``t`` has exactly one reader and is not a graph output."""
        return len(self.consumers.get(t, [])) == 1 and t not in self.outputs

    def product(self, t: str, root: bool = True) -> tuple[float, Counter, list[Op]]:
        """Flatten the Mul / Div-by-constant tree computing ``t``: (constant factor, factors, ops).

        Only private intermediates are flattened, so a value read elsewhere (the
        activation's input itself) stays a leaf; ``x * x * x`` gives ``{x: 3}``.
        """
        c = self.scalar(t)
        if c is not None:
            return c, Counter(), []
        op = self.producer.get(t)
        if op is None or not (root or self.private(t)):
            return 1.0, Counter({t: 1}), []
        if isinstance(op, Mul):
            c1, f1, n1 = self.product(op.inputs[0], False)
            c2, f2, n2 = self.product(op.inputs[1], False)
            return c1 * c2, f1 + f2, [op] + n1 + n2
        d = self.scalar(op.inputs[1]) if isinstance(op, Div) else None
        if d:
            c1, f1, n1 = self.product(op.inputs[0], False)
            return c1 / d, f1, [op] + n1
        return 1.0, Counter({t: 1}), []

    def single(self, t: str) -> tuple[float, str, list[Op]] | None:
        """``t`` as ``c * v`` for one tensor ``v``: (c, v, the ops), or None."""
        coef, factors, ops = self.product(t)
        if len(factors) != 1 or sum(factors.values()) != 1:
            return None
        (v,) = factors
        return coef, v, ops

    def one_plus(self, t: str) -> Op | None:
        """``t``'s only reader, when it is ``Add(t, 1)`` in either operand order."""
        if not self.private(t):
            return None
        (op,) = self.consumers[t]
        if not isinstance(op, Add):
            return None
        other = op.inputs[1] if op.inputs[0] == t else op.inputs[0]
        return op if close(self.scalar(other), 1.0) else None

    def outer(self, x: str, a: str) -> tuple[Op, list[Op]] | None:
        """The Muls computing ``0.5 * x * a`` downstream of ``a``: (last op, all of them)."""
        t = a
        for _ in range(3):
            if not self.private(t):
                return None
            (op,) = self.consumers[t]
            if not isinstance(op, (Mul, Div)):
                return None
            coef, factors, ops = self.product(op.output)
            if factors == Counter({x: 1, a: 1}) and close(coef, 0.5):
                return op, ops
            t = op.output
        return None

    def finish(self, x: str, fn: Op, inner: list[Op], approximate: str) -> Match | None:
        """Complete ``0.5 * x * (1 + fn(...))`` around ``fn``; check nothing leaks out."""
        add_one = self.one_plus(fn.output)
        if add_one is None:
            return None
        outer = self.outer(x, add_one.output)
        if outer is None:
            return None
        root, outer_ops = outer
        members = tuple(dict.fromkeys(inner + [fn, add_one] + outer_ops))
        ids = {id(m) for m in members}
        for m in members:                      # every intermediate stays inside the pattern
            if m is root:
                continue
            if m.output in self.outputs or any(id(c) not in ids for c in self.consumers.get(m.output, [])):
                return None
        return Match(members, root, GeLU(root.name, (x,), root.output, approximate=approximate))


def _gelu_erf(view: _View, erf: Op) -> Match | None:
    s = erf.inputs[0]
    found = view.single(s) if view.private(s) else None
    if found is None or not close(found[0], 1 / math.sqrt(2)):
        return None
    _, x, inner = found
    return view.finish(x, erf, inner, "erf")


def _gelu_tanh(view: _View, tanh: Op) -> Match | None:
    s = tanh.inputs[0]
    found = view.single(s) if view.private(s) else None
    if found is None or not close(found[0], math.sqrt(2 / math.pi)):
        return None
    _, v, inner = found
    add = view.producer.get(v)
    if not isinstance(add, Add) or not view.private(v):
        return None
    for x, w in (add.inputs, add.inputs[::-1]):
        if not view.private(w):
            continue
        cw, fw, cube = view.product(w)
        if fw == Counter({x: 3}) and close(cw, 0.044715):
            return view.finish(x, tanh, inner + [add] + cube, "tanh")
    return None


def _axis_reduction(view: _View, t: str, cls: type[Op]) -> tuple[str, int, list[Op]] | None:
    """``t`` as a keepdims reduction of one axis of some tensor: ``cls(x)`` over the last axis
    (``(x, -1, ops)``), or the importers' form of another axis ``a`` (``importing.reduce_ops``):
    Transposes moving ``a`` last, the reduction, a Reshape putting the unit axis back at ``a``
    (``(x, a, ops)``). Every intermediate is private. None for anything else."""
    op = view.producer.get(t)
    if isinstance(op, cls):
        return (op.inputs[0], -1, [op]) if op.keepdims else None
    if not isinstance(op, Reshape) or not view.private(op.inputs[0]):
        return None
    red = view.producer.get(op.inputs[0])
    if not isinstance(red, cls) or not red.keepdims:
        return None
    ops, cur, perm = [red, op], red.inputs[0], None
    while isinstance(view.producer.get(cur), Transpose) and view.private(cur):
        tr = view.producer[cur]
        perm = tr.perm if perm is None else tuple(tr.perm[p] for p in perm)
        ops.insert(0, tr)
        cur = tr.inputs[0]
    if perm is None:
        return None
    n, a = len(perm), perm[-1]
    if list(perm[:-1]) != [d for d in range(n) if d != a] or len(op.shape) != n or op.shape[a] != 1:
        return None
    return cur, a, ops


def _softmax(view: _View, exp: Op) -> Match | None:
    """``e = Exp(x - ReduceMax(x)); e / ReduceSum(e)``, both reductions over one axis (keepdims;
    the last, or another in the importers' Transpose form) -> Softmax over that axis."""
    sub = view.producer.get(exp.inputs[0])
    if not isinstance(sub, Sub) or not view.private(sub.output):
        return None
    x, m = sub.inputs
    high = _axis_reduction(view, m, ReduceMax) if view.private(m) else None
    if high is None or high[0] != x:
        return None
    readers = view.consumers.get(exp.output, [])
    if len(readers) != 2 or exp.output in view.outputs:
        return None
    div = next((r for r in readers if isinstance(r, Div)), None)
    if div is None or div.inputs[0] != exp.output or not view.private(div.inputs[1]):
        return None
    total = _axis_reduction(view, div.inputs[1], ReduceSum)
    if total is None or total[0] != exp.output or total[1] != high[1] or total[2][0] not in readers:
        return None
    members = tuple(high[2] + [sub, exp] + total[2] + [div])
    return Match(members, div, Softmax(div.name, (x,), div.output, axis=high[1]))


def _scaled(view: _View, t: str) -> tuple[float, str, list[Op]]:
    """``t`` as ``c * v``: the private Mul / Div-by-constant tree computing it, flattened (``(1, t,
    [])`` when there is none, or when it is not one tensor times constants)."""
    if not view.private(t) or not isinstance(view.producer.get(t), (Mul, Div)):
        return 1.0, t, []
    found = view.single(t)
    if found is None or not found[2] or not (math.isfinite(found[0]) and found[0] > 0):
        return 1.0, t, []
    return found


def _scaled_softmax(view: _View, sm: Softmax) -> Match | None:
    """``Softmax(c * x)``, ``x`` perhaps ``(a * q) @ (b * k)``, through a Cast between float types ->
    ``Softmax(softmax_scale=c * a * b)`` of ``q @ k`` (see the module docstring)."""
    t, rewired = sm.inputs[0], []
    cast = view.producer.get(t)
    if isinstance(cast, Cast) and view.private(t):
        t = cast.inputs[0]
    else:
        cast = None
    coef, x, members = _scaled(view, t)
    mm = view.producer.get(x)
    if isinstance(mm, MatMul) and view.private(x) and x not in view.outputs:
        operands = [_scaled(view, i) for i in mm.inputs]
        if any(ops for _, _, ops in operands):
            coef *= math.prod(c for c, _, _ in operands)
            members += [op for _, _, ops in operands for op in ops]
            rewired.append((mm, dataclasses.replace(mm, inputs=tuple(v for _, v, _ in operands))))
    if not members:
        return None
    if cast is not None:
        rewired.append((cast, dataclasses.replace(cast, inputs=(x,))))
    fused = dataclasses.replace(sm, inputs=(sm.inputs[0] if cast is not None else x,),
                                softmax_scale=sm.softmax_scale * coef)
    return Match(tuple(members), sm, fused, tuple(rewired))


def _softmax_fp32(view: _View, sm: Softmax) -> Match | None:
    """``Cast(Softmax(Cast(x16 -> fp32)) -> fp16)`` -> ``Softmax(x16)`` (see the module docstring)."""
    up = view.producer.get(sm.inputs[0])
    readers = view.consumers.get(sm.output, [])
    if not isinstance(up, Cast) or not view.private(sm.inputs[0]) or not view.private(sm.output) \
            or not isinstance(readers[0], Cast):
        return None
    down = readers[0]
    x, mid, out = (view.tensor(t) for t in (up.inputs[0], sm.inputs[0], down.output))
    if x is None or mid is None or out is None or (x.dtype, mid.dtype, out.dtype) != (DType.FP16, DType.FP32,
                                                                                        DType.FP16):
        return None
    return Match((up, sm, down), down, dataclasses.replace(sm, inputs=(up.inputs[0],), output=down.output))


def _dequantised(view: _View, t: str) -> tuple[str, list[Op], int] | None:
    """MatMul operand ``t`` as a dequantised FP8 value: ``(v8, ops, exponent)`` for ``t = Cast(v8)``
    (exponent 0) or, ``v8`` an FP8 parameter, ``Cast(v8) * 2**s`` (exponent ``v8.scale + s``); every
    intermediate private. None for anything else."""
    exponent, members, cur = 0, [], t
    op = view.producer.get(cur)
    if isinstance(op, Mul) and view.private(cur):
        for x, c in (op.inputs, op.inputs[::-1]):
            s = _power_of_two(view.scalar(c))
            if s is not None and view.private(x) and isinstance(view.producer.get(x), Cast):
                exponent, members, cur = s, [op], x
                break
        else:
            return None
    cast = view.producer.get(cur)
    if not isinstance(cast, Cast) or not view.private(cur):
        return None
    v8 = cast.inputs[0]
    src, out = view.tensor(v8), view.tensor(cur)
    if src is None or out is None or src.dtype is not DType.FP8 or out.dtype is not DType.FP16:
        return None
    if members:                               # the scale folds into the parameter's own
        if src.role is not Role.PARAMETER or view.consumers.get(v8) != [cast]:
            return None
        exponent += src.scale
        if not -32 <= exponent <= 31:
            return None
    return v8, members + [cast], exponent


def _power_of_two(c: float | None) -> int | None:
    """``s`` for ``c == 2**s`` exactly (None otherwise)."""
    if c is None or not math.isfinite(c) or c <= 0:
        return None
    mantissa, e = math.frexp(c)
    return e - 1 if mantissa == 0.5 else None


def _fp8_matmul(view: _View, mm: MatMul) -> Match | None:
    """``MatMul(dq(a8), dq(b8))`` with an FP16 product -> ``MatMul(a8, b8)`` (see the module docstring)."""
    operands = [_dequantised(view, t) for t in mm.inputs]
    if any(o is None for o in operands):
        return None
    out = view.tensor(mm.output)               # untyped (an ONNX model without value_info): FP16 operands'
    if (out.dtype if out is not None else DType.FP16) is not DType.FP16:    # product is FP16 (MatMul.infer)
        return None
    (a8, a_ops, _), (b8, b_ops, _) = operands
    rescaled = tuple((v8, e) for v8, ops, e in operands if isinstance(ops[0], Mul))
    if len({v8 for v8, _ in rescaled}) < len(rescaled):      # one parameter scaled twice
        return None
    fused = dataclasses.replace(mm, inputs=(a8, b8))
    return Match(tuple(a_ops + b_ops) + (mm,), mm, fused, rescaled=rescaled)


PATTERNS: tuple[Pattern, ...] = (
    Pattern("gelu-erf", Erf, _gelu_erf, "GeLU(approximate='erf')"),
    Pattern("gelu-tanh", Tanh, _gelu_tanh, "GeLU(approximate='tanh')"),
    Pattern("softmax", Exp, _softmax, "Softmax(axis)"),
    Pattern("scaled-softmax", Softmax, _scaled_softmax, "Softmax(softmax_scale)"),
    Pattern("softmax-fp32", Softmax, _softmax_fp32, "Softmax in FP16 (FP32 statistics)"),
    Pattern("fp8-matmul", MatMul, _fp8_matmul, "MatMul on the FP8 operands (FP16 product)"),
)


def close(value: float | None, target: float) -> bool:
    return value is not None and math.isclose(value, target, rel_tol=CONSTANT_RTOL)
