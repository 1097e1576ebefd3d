"""What the ONNX and torch importers share: bf16 handling, the one unsupported-nodes error,
Transposes of any permutation and reductions over any axes as the ops tileplan plans."""

from __future__ import annotations

import math

from ..errors import TileplanError
from .core import Op, Reshape, Transpose

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
