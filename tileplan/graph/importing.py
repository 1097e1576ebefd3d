"""What the ONNX and torch importers share: bf16 handling, the one unsupported-nodes error,
Transposes of any permutation and reductions over any axes as the ops tileplan plans, and a
patch-embedding convolution as a GEMM over patches."""

from __future__ import annotations

import math

from ..errors import TileplanError
from .core import Add, MatMul, Op, Reshape, Slice, Transpose

CAST_BF16 = ("fp16",)       # what --cast-bf16 converts bf16 models to
BF16_HELP = ("the IPU has no bf16 arithmetic: convert the model to FP16 with --cast-bf16 fp16 "
             "(load_model(..., cast_bf16='fp16'))")


def check_cast_bf16(cast_bf16: str | None) -> None:
    if cast_bf16 is not None and cast_bf16 not in CAST_BF16:
        raise TileplanError(f"--cast-bf16 {cast_bf16!r}: bf16 models convert to {', '.join(CAST_BF16)}")


def unsupported_error(what: str, found: dict[str, list[str]], supported: str) -> TileplanError:
    """One error for every unsupported node: ``3 unsupported nodes: A (2: a1, a2), B (1: b)``."""
    count = sum(len(v) for v in found.values())
    kinds = ", ".join(f"{k} ({len(v)}: {', '.join(v)})" for k, v in found.items())
    return TileplanError(f"{count} unsupported {what}{'s' if count != 1 else ''}: {kinds}; {supported}")


def transpose_ops(name: str, x: str, y: str, perm: tuple[int, ...]) -> list[Op]:
    """``transpose(x, perm)`` as the rearrangements tileplan plans: a permutation of the leading axes
    keeping the last, a swap of the last two axes, and a permutation of the leading axes again.

    A perm that keeps the last axis, or swaps the last two, is one op. Any other perm moves the
    axis that must end last next to the last (``<y>.lead``), swaps the two (``<y>.swap``), then
    orders the leading axes; steps that would be the identity are left out.
    """
    n = len(perm)
    last = n - 1
    if perm[-1] == last or n < 2:
        return [Transpose(name, (x,), y, perm=perm)]
    a = perm[-1]
    lead = [d for d in range(n) if d not in (a, last)] + [a, last]
    swap = list(range(n - 2)) + [last, n - 2]
    order = lead[:n - 2] + [last, a]                    # original axes after lead + swap
    final = [order.index(p) for p in perm[:-1]] + [last]
    steps = [(p, tag) for p, tag in ((lead, "lead"), (swap, "swap"), (final, "final"))
             if p != list(range(n))]
    ops, src = [], x
    for k, (p, tag) in enumerate(steps):
        last_step = k == len(steps) - 1
        out = y if last_step else f"{y}.{tag}"
        ops.append(Transpose(name if last_step else f"{name}.{tag}", (src,), out, perm=tuple(p)))
        src = out
    return ops


def reduce_ops(cls: type[Op], name: str, x: str, y: str, shape: tuple[int, ...], axes: tuple[int, ...],
               out_shape: tuple[int, ...]) -> list[Op]:
    """A reduction over any set of axes as what tileplan plans: the reduced axes moved last
    (``transpose_ops``, ``<y>.perm``), flattened into one (a Reshape ``<y>.flat``), reduced over the
    last axis keeping a unit axis (``<y>.reduced``), then a Reshape to ``out_shape`` (the importer's
    keepdims form). Steps that change nothing are left out; the last op is ``name`` writing ``y``."""
    n = len(shape)
    axes = tuple(sorted({a % n for a in axes}))
    rest = [d for d in range(n) if d not in axes]
    ops: list[Op] = []
    cur, cur_shape = x, tuple(shape)
    perm = tuple(rest + list(axes))
    if perm != tuple(range(n)):
        ops += transpose_ops(f"{name}.perm", cur, f"{y}.perm", perm)
        cur, cur_shape = f"{y}.perm", tuple(shape[p] for p in perm)
    flat = tuple(shape[d] for d in rest) + (math.prod(shape[a] for a in axes),)
    if flat != cur_shape:
        ops.append(Reshape(f"{name}.flat", (cur,), f"{y}.flat", shape=flat))
        cur, cur_shape = f"{y}.flat", flat
    reduced = flat[:-1] + (1,)
    if reduced == tuple(out_shape):
        return ops + [cls(name, (cur,), y, keepdims=True)]
    ops.append(cls(f"{name}.reduced", (cur,), f"{y}.reduced", keepdims=True))
    return ops + [Reshape(name, (f"{y}.reduced",), y, shape=tuple(out_shape))]


def patch_conv_refusal(x_shape: tuple[int, ...], w_shape: tuple[int, ...], *, stride, padding, dilation,
                       groups: int) -> str | None:
    """Why a 2-D convolution is not a patch embedding tileplan imports (None when it is).

    Design decision: tileplan has no convolution kernel. The convolution vision transformers open
    with (one patch a token: kernel == stride, no padding, dilation 1, groups 1) reads every input
    element exactly once, so it *is* a GEMM over the patches (``patch_conv_ops``), which the planner
    already tiles; any other convolution overlaps or skips input elements and is refused with what
    differs rather than lowered to a slow im2col.
    """
    if len(x_shape) != 4 or len(w_shape) != 4:
        return (f"input {list(x_shape)} and weight {list(w_shape)}; tileplan imports 2-D convolutions of "
                "NCHW inputs")
    kernel = tuple(int(k) for k in w_shape[2:])
    pads = [int(p) for p in padding]
    if int(groups) != 1:
        return f"groups={groups}; tileplan imports convolutions with groups=1 (patch embeddings)"
    if tuple(int(s) for s in stride) != kernel:
        return (f"stride {[int(s) for s in stride]} differs from the kernel {list(kernel)}; tileplan imports "
                "convolutions whose stride equals the kernel (patch embeddings)")
    if any(pads):
        return f"padding {pads}; tileplan imports unpadded convolutions (patch embeddings)"
    if any(int(d) != 1 for d in dilation):
        return f"dilation {[int(d) for d in dilation]}; tileplan imports convolutions with dilation 1"
    if x_shape[1] != w_shape[1]:
        return f"input has {x_shape[1]} channels, the weight {w_shape[1]}"
    if x_shape[2] < kernel[0] or x_shape[3] < kernel[1]:
        return f"image {list(x_shape[2:])} is smaller than the kernel {list(kernel)}"
    return None


def patch_conv_ops(name: str, x: str, x_shape: tuple[int, ...], weight: str, bias: str | None,
                   kernel: tuple[int, int], channels: int, y: str, *, tokens: bool) -> tuple[list[Op], tuple[int, ...]]:
    """A patch-embedding convolution (``patch_conv_refusal`` says None) as tileplan ops:
    ``x[B, C, H, W]`` -> Reshape ``<y>.split`` ``[B, C, h, kh, w, kw]`` -> Transpose ``<y>.patches``
    ``[B, h, w, C, kh, kw]`` -> Reshape ``<y>.rows`` ``[B*h*w, C*kh*kw]`` -> MatMul by ``weight``
    (the convolution's weight re-laid at import as ``[D, C*kh*kw]``, read with ``transpose_b``, as
    ``nn.Linear``'s) -> bias Add -> a Reshape writing ``y``: ``[B, h*w, D]`` with ``tokens`` (the
    conv's output flattened and transposed, what vision transformers do next: the transpose pair
    cancels), else the convolution's ``[B, D, h, w]`` (Reshape ``[B, h, w, D]`` and a Transpose).
    Returns the ops (the last named ``name`` writing ``y``) and ``y``'s shape.

    Design decision: the graph keeps the pixel input ``[B, C, H, W]`` (what the user feeds and what
    ``tileplan validate`` checks) and the patch gather is a Reshape/Transpose/Reshape the planner
    costs like any other rearrangement; the Transpose keeps the last axis (``kw``), a permutation of
    rows the View family moves whole.
    """
    b, c, hh, ww = x_shape
    kh, kw = kernel
    h, w = hh // kh, ww // kw
    ops: list[Op] = []
    # An image that is not a whole number of patches (SigLIP So400m/14 at 384 px: 27 patches of 14
    # and 6 pixels over): the convolution never reads the last rows and columns, so the patches
    # come from the image cropped by Slices ``<y>.crop_h`` / ``<y>.crop_w``.
    for axis, (size, k, tag) in enumerate(((hh, kh, "h"), (ww, kw, "w")), start=2):
        if size % k:
            ops.append(Slice(f"{name}.crop_{tag}", (x,), f"{y}.crop_{tag}", axis=axis, start=0, stop=size // k * k))
            x = f"{y}.crop_{tag}"
    ops += [
        Reshape(f"{name}.split", (x,), f"{y}.split", shape=(b, c, h, kh, w, kw)),
        *transpose_ops(f"{name}.patches", f"{y}.split", f"{y}.patches", (0, 2, 4, 1, 3, 5)),
        Reshape(f"{name}.rows", (f"{y}.patches",), f"{y}.rows", shape=(b * h * w, c * kh * kw)),
    ]
    out = f"{y}.matmul"
    ops.append(MatMul(f"{name}.matmul", (f"{y}.rows", weight), out, transpose_b=True))
    if bias is not None:
        ops.append(Add(f"{name}.bias", (out, bias), f"{y}.biased"))
        out = f"{y}.biased"
    d = channels
    if tokens:
        ops.append(Reshape(name, (out,), y, shape=(b, h * w, d)))
        return ops, (b, h * w, d)
    ops.append(Reshape(f"{name}.grid", (out,), f"{y}.grid", shape=(b, h, w, d)))
    ops += transpose_ops(name, f"{y}.grid", y, (0, 3, 1, 2))
    return ops, (b, d, h, w)


def live_ops(ops: list[Op], outputs: list[str]) -> list[Op]:
    """The ops a graph output depends on, in their order.

    Design decision: what no output reads is dropped at import, as an exporter's dead values
    (``nn.MultiheadAttention``'s averaged attention weights, computed for ``need_weights`` and
    discarded by HF's pooling head) would otherwise be planned, costed and run."""
    need = set(outputs)
    kept = []
    for op in reversed(ops):
        if op.output in need:
            kept.append(op)
            need.update(op.inputs)
    return kept[::-1]
