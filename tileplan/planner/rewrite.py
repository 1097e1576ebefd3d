"""Graph rewrites the planner makes before it plans (the rewritten graph is the one planned,
packaged in model.json and validated; it computes exactly what the original does).

- A MatMul that transposes an activation operand (``transpose_a``/``transpose_b`` on a tensor
  that is not a parameter: a key in ``Q K^T``) reads it through an explicit ``Transpose`` of its
  last two axes, named ``<op>.transpose_a``/``.transpose_b`` and writing ``<tensor>.T<op>``; the
  MatMul then reads the transposed tensor untransposed. The Transpose family plans it as a
  rearrangement (column blocks exchanged, transposed on tile), costed against everything else by
  selection. A transposed *parameter* stays a flag: the host stores it transposed.
- A Softmax over another axis than the last runs over the last: Transposes bring the axis there
  (leading axes permuted keeping the last, then the last two swapped, the two forms the Transpose
  family plans) and take it back; named ``<op>.to_last*`` and ``<op>.from_last*``.
- A Slice with a step other than 1 (reversed or strided) on the last axis runs on the one before:
  the last two axes swapped (``<op>.to_rows``), sliced, and swapped back (``<op>.from_rows``); a
  1-D input is a row first (``<op>.row``, ``<op>.unrow``). The View family gathers the picked rows.
- A reduction without ``keepdims`` keeps its unit axis and a Reshape drops it (``<op>.squeeze``):
  the row-wise kernel writes one value per row, on the row's tile.
- A MatMul whose operands broadcast their batch dimensions against each other (``[3, 1, M, K]``
  with ``[1, 2, K, N]``: some batch axes only in A, some only in B, some shared) becomes the one
  batched product the Gemm family plans, ``[S, a*M, K] @ [S, K, b*N]`` (S the shared batch, a the
  axes only A has, b the axes only B has), between Transposes and Reshapes of the operands
  (``<op>.bcast_a*``, ``<op>.bcast_b*``) and of the result (``<op>.bcast_c*``). Nothing is
  expanded: the axes one operand lacks fold into the other's rows or columns. A parameter that
  would need the rearrangement is refused (the host would store it rearranged; not built).
- A Cast that changes neither the type nor the FP8 scale (ONNX's Cast to the type it has) is a
  relabelling: a Reshape to its own shape, under the Cast's name (no kernel converts nothing).

- Folding at plan time (``_fold``, first): an op whose result is zero-size, or whose inputs are all
  zero-size or folded (a reduction over an empty axis: ReduceSum's empty set is 0, ReduceMax's
  -inf; a MatMul with K = 0 is zeros), is evaluated here with its own ``reference()`` and leaves
  the graph, as a compiler folds a constant. A zero-size tensor occupies no tile memory and moves
  no bytes, so nothing of it reaches the device: a folded graph output is carried by the package
  as host data (``Graph.folded``: one value, since every element of such a result is the same),
  written by the host program, with zero cycles; a folded tensor that is not an output is dropped.
  A graph may fold entirely (no op left: an empty tile program). Zero-size inputs and parameters
  stay declared (the host has nothing to write). An op left on the device that reads a folded
  non-empty tensor is refused (the package does not upload constants to tiles). A non-empty
  input or parameter that only folded ops read stays declared, read by nothing on the tiles
  (``Graph.build``'s ``unread``; model.json lists it).

- A Concat drops its zero-size parts (they hold nothing); with one part left it is a Reshape to
  its own shape, under the Concat's name.

- Ops that compute the same thing (kind, attributes, inputs, output type) are one op
  (``_shared``): the later ones' readers read the first one's output.

Each rule is a function of one op kind in ``RULES``, returning the ops that replace it (or None);
``canonical`` applies them in graph order.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..errors import TileplanError
from ..graph.core import Binary, Cast, Concat, Graph, MatMul, Reduce, Reshape, Role, Slice, Softmax, Tensor, Transpose
from ..graph.dtypes import dequantise, quantise
from . import elementwise as ew


def _fold(graph: Graph) -> tuple[list, dict[str, float], set[str]]:
    """The ops left for the device, the folded graph outputs with their value, and the tensors
    folding removed (see the module docstring)."""
    known = {n: np.zeros(t.shape) for n, t in graph.tensors.items()
             if t.role in (Role.INPUT, Role.PARAMETER) and t.size == 0}
    kept, made = [], set()
    for op in graph.ops:
        out = graph.output_of(op)
        if out.size and not all(i in known for i in op.inputs):
            kept.append(op)
            continue
        y = np.zeros(out.shape)
        if out.size:
            y = np.asarray(op.reference(*(known[i] for i in op.inputs)), np.float64).reshape(out.shape)
            y = dequantise(quantise(y, out.dtype, out.scale, op.saturate), out.dtype, out.scale)
            if not np.array_equal(y, np.full(y.shape, y.flat[0]), equal_nan=True):
                raise op.err(f"its result {out.name!r} is a compile-time constant of more than one value; "
                             "tileplan folds only one-value constants")
        known[op.output] = y
        made.add(op.output)
    if not made:
        return graph.ops, {}, set()
    outputs = {t.name for t in graph.by_role(Role.OUTPUT)}
    for op in kept:
        for i in op.inputs:
            if i in made and known[i].size:          # (a zero-size part of a Concat holds nothing)
                raise op.err(f"reads {i!r}, which is folded at plan time (every element "
                             f"{known[i].flat[0] if known[i].size else 'none'}); tileplan does not upload "
                             "folded constants to tiles")
    folded = {n: float(known[n].flat[0]) if known[n].size else 0.0 for n in sorted(made & outputs)}
    return kept, folded, made - outputs


def _softmax_last(graph: Graph, op: Softmax) -> list | None:
    x = graph.tensors[op.inputs[0]]
    n = len(x.shape)
    axis = op.axis % n
    if axis == n - 1:
        return None
    ops, cur, back = [], op.inputs[0], []
    if axis != n - 2:                 # bring the axis to n - 2, keeping the last axis in place
        perm = tuple(a for a in range(n - 1) if a != axis) + (axis, n - 1)
        ops.append(Transpose(f"{op.name}.to_last0", (cur,), f"{op.output}.to_last0", perm=perm))
        cur = f"{op.output}.to_last0"
        inverse = tuple(perm.index(a) for a in range(n))
        back.append(("from_last1", inverse))
    swap = tuple(range(n - 2)) + (n - 1, n - 2)
    ops.append(Transpose(f"{op.name}.to_last1", (cur,), f"{op.output}.to_last1", perm=swap))
    ops.append(dataclasses.replace(op, inputs=(f"{op.output}.to_last1",), output=f"{op.output}.last", axis=-1))
    cur = f"{op.output}.last"
    steps = [("from_last0", swap)] + back
    for i, (name, perm) in enumerate(steps):
        out = op.output if i == len(steps) - 1 else f"{op.output}.{name}"
        ops.append(Transpose(f"{op.name}.{name}", (cur,), out, perm=perm))
        cur = out
    return ops


def _strided_last(graph: Graph, op: Slice) -> list | None:
    x = graph.tensors[op.inputs[0]]
    n = len(x.shape)
    if op.step == 1 or op.axis % n != n - 1:
        return None
    ops, cur = [], op.inputs[0]
    if n == 1:
        ops.append(Reshape(f"{op.name}.row", (cur,), f"{op.output}.row", shape=(1, x.shape[0])))
        cur = f"{op.output}.row"
    m = max(n, 2)
    swap = tuple(range(m - 2)) + (m - 1, m - 2)
    ops.append(Transpose(f"{op.name}.to_rows", (cur,), f"{op.output}.to_rows", perm=swap))
    ops.append(dataclasses.replace(op, inputs=(f"{op.output}.to_rows",), output=f"{op.output}.rows", axis=m - 2))
    last = op.output if n > 1 else f"{op.output}.col"
    ops.append(Transpose(f"{op.name}.from_rows", (f"{op.output}.rows",), last, perm=swap))
    if n == 1:
        ops.append(Reshape(f"{op.name}.unrow", (last,), op.output, shape=graph.tensors[op.output].shape))
    return ops


def _keep_unit_axis(graph: Graph, op: Reduce) -> list | None:
    if op.keepdims:
        return None
    kept = f"{op.output}.kept"
    return [dataclasses.replace(op, output=kept, keepdims=True),
            Reshape(f"{op.name}.squeeze", (kept,), op.output, shape=graph.tensors[op.output].shape)]


def _matmul(graph: Graph, op: MatMul) -> list | None:
    originals = [graph.tensors[n] for n in op.inputs]
    shapes = [list(x) for x in op.operand_shapes(originals)]
    ops, inputs, flags = [], list(op.inputs), {}
    for idx, flag in ((0, "transpose_a"), (1, "transpose_b")):
        t = originals[idx]
        if getattr(op, flag) and t.role is not Role.PARAMETER:
            n = len(t.shape)
            perm = tuple(range(n - 2)) + (n - 1, n - 2)
            out = f"{t.name}.T{op.name}"
            ops.append(Transpose(f"{op.name}.{flag}", (t.name,), out, perm=perm))
            inputs[idx] = out
            flags[flag] = False
    if flags:
        op = dataclasses.replace(op, inputs=tuple(inputs), **flags)
    broadcast = _batch_broadcast(graph, op, shapes, originals)
    if broadcast is not None:
        return ops + broadcast
    return ops + [op] if flags else None


def _batch_broadcast(graph: Graph, op: MatMul, shapes: list[list[int]], originals: list[Tensor]) -> list | None:
    """The rearranged form of a MatMul with batch axes only one operand has beside others (None
    when the Gemm family plans it as it is: B one matrix, or A's batch none or all of B's).
    ``shapes`` are the operands as multiplied (transposes applied) and ``originals`` the tensors
    they come from. The list holds the ops and the
    tensors they write, declared with the dtype and scale of what they rearrange."""
    a, b = shapes
    nd = max(len(a), len(b)) - 2
    pa, pb = [1] * (nd - len(a) + 2) + a[:-2], [1] * (nd - len(b) + 2) + b[:-2]
    kind = ["1" if x == y == 1 else "S" if x == y else "A" if y == 1 else "B" if x == 1 else "?"
            for x, y in zip(pa, pb)]
    if "?" in kind:
        return None                  # MatMul.infer names the dimensions that do not broadcast
    has = {k: k in kind for k in "SAB"}
    if (not has["B"] and not has["S"]) or (not has["A"] and not (has["S"] and has["B"])):
        return None
    pos = {k: [i for i, x in enumerate(kind) if x == k] for k in "SAB"}
    size = {k: math.prod((pb if k == "B" else pa)[i] for i in pos[k]) for k in "SAB"}
    M, K, N = a[-2], a[-1], b[-1]
    lead = [size["S"]] if has["S"] else []
    out = graph.tensors[op.output]
    made: list = []

    def step(tag: str, x: str, like: Tensor, out_shape: tuple, final: bool = False, **kw) -> str:
        """A Transpose (``perm``) or Reshape (``shape``) of ``x`` writing ``<output>.bcast_<tag>``."""
        name = op.output if final else f"{op.output}.bcast_{tag}"
        if not final:
            made.append(Tensor(name, tuple(out_shape), like.dtype, scale=like.scale))
        made.append((Transpose if "perm" in kw else Reshape)(f"{op.name}.bcast_{tag}", (x,), name, **kw))
        return name

    def arrange(idx: int, order: list[int], shape: tuple[int, ...], tag: str) -> str:
        """Operand ``idx`` with its axes in ``order`` (batch positions; -2, -1 its matrix axes;
        the unit batch axes it has first), reshaped to ``shape``."""
        name, shp, t = op.inputs[idx], shapes[idx], originals[idx]
        off = nd - (len(shp) - 2)
        moved = [p - off if p >= 0 else len(shp) + p for p in order]
        perm = [i for i in range(len(shp) - 2) if i not in moved] + moved
        moves = [p for p in perm if shp[p] != 1] != sorted(p for p in perm if shp[p] != 1)
        if t.role is Role.PARAMETER and (moves or tuple(shp) != shape):
            raise TileplanError(f"op {op.name!r} (matmul): batch broadcasting of {a} with {b} would "
                                f"rearrange the parameter {t.name!r}; that is not supported")
        if moves:                    # (unit axes need no Transpose: the Reshape drops them)
            name = step(f"{tag}0", name, t, tuple(shp[p] for p in perm), perm=tuple(perm))
        else:
            perm = list(range(len(shp)))
        if tuple(shp[p] for p in perm) != shape:
            name = step(f"{tag}1", name, t, shape, shape=shape)
        return name

    a_in = arrange(0, pos["S"] + pos["A"] + [-2, -1], tuple(lead + [size["A"] * M, K]), "a")
    b_in = arrange(1, pos["S"] + [-2] + pos["B"] + [-1], tuple(lead + [K, size["B"] * N]), "b")
    prod = f"{op.output}.bcast_c0"
    made.append(Tensor(prod, tuple(lead + [size["A"] * M, size["B"] * N]), out.dtype, scale=out.scale))
    made.append(dataclasses.replace(op, inputs=(a_in, b_in), output=prod))
    # [S, a*M, b*N] -> [S..., A..., M, B..., N] -> the output's axis order -> its shape (unit axes)
    placed = pos["S"] + pos["A"] + [-2] + pos["B"] + [-1]
    split = [(pb if p in pos["B"] else pa)[p] if p >= 0 else (M if p == -2 else N) for p in placed]
    want = [p for p in range(nd) if kind[p] != "1"] + [-2, -1]
    perm = tuple(placed.index(p) for p in want)
    cur = step("c1", prod, out, tuple(split), shape=tuple(split))
    permuted = tuple(split[p] for p in perm)
    cur = step("c2", cur, out, permuted, final=permuted == tuple(out.shape), perm=perm)
    if permuted != tuple(out.shape):
        step("c3", cur, out, out.shape, final=True, shape=tuple(out.shape))
    return made


def _middle_broadcast(graph: Graph, op: Binary) -> list | None:
    """A pointwise op whose operand repeats over a middle axis (``[1, 4, 16, 16]`` with
    ``[1, 4, 1, 16]``): the broadcast axes brought to the front by a Transpose of the full operand
    (the last axis stays: a leading permutation the Transpose family plans), the broadcast operand
    reshaped to match (moving unit axes relabels nothing), the op then a row broadcast, and the
    result transposed back.

    Design decision: rearrange the full operand rather than expand the broadcast one (an expanded
    parameter would be uploaded repeated; an expanded activation is an op tileplan has not got).
    A broadcast over the last axis together with others is not handled here (refused by the
    Pointwise family, naming the shapes)."""
    ins = graph.inputs_of(op)
    out = graph.output_of(op)
    try:
        ew.broadcast_form(graph, op)
        return None
    except TileplanError:
        pass
    n = len(out.shape)
    for idx in (1, 0):
        t, other = ins[idx], ins[1 - idx]
        if other.shape != out.shape or len(t.shape) > n:
            continue
        padded = (1,) * (n - len(t.shape)) + tuple(t.shape)
        if padded[-1] != out.shape[-1]:
            continue
        spread = [a for a in range(n - 1) if padded[a] == 1 and out.shape[a] > 1]
        perm = tuple(spread + [a for a in range(n) if a not in spread])
        inverse = tuple(perm.index(a) for a in range(n))
        moved = tuple(out.shape[a] for a in perm)
        front = f"{op.output}.bcast_front"
        row = f"{op.output}.bcast_row"
        res = f"{op.output}.bcast_out"
        operands = [front, front]
        operands[idx] = row
        return [Tensor(front, moved, other.dtype, scale=other.scale),
                Tensor(row, tuple(padded[a] for a in perm), t.dtype, scale=t.scale),
                Tensor(res, moved, out.dtype, scale=out.scale),
                Transpose(f"{op.name}.bcast_front", (other.name,), front, perm=perm),
                Reshape(f"{op.name}.bcast_row", (t.name,), row, shape=tuple(padded[a] for a in perm)),
                dataclasses.replace(op, inputs=tuple(operands), output=res),
                Transpose(f"{op.name}.bcast_back", (res,), op.output, perm=inverse)]
    return None


def _identity_cast(graph: Graph, op: Cast) -> list | None:
    src, dst = graph.tensors[op.inputs[0]], graph.tensors[op.output]
    if (src.dtype, src.scale) != (dst.dtype, dst.scale):
        return None
    return [Reshape(op.name, op.inputs, op.output, shape=dst.shape)]


def _nonempty_parts(graph: Graph, op: Concat) -> list | None:
    parts = tuple(i for i in op.inputs if graph.tensors[i].size)
    if len(parts) == len(op.inputs):
        return None
    if len(parts) == 1:
        return [Reshape(op.name, parts, op.output, shape=graph.tensors[op.output].shape)]
    return [dataclasses.replace(op, inputs=parts)]


RULES = ((Softmax, _softmax_last), (Reduce, _keep_unit_axis), (MatMul, _matmul), (Cast, _identity_cast),
         (Slice, _strided_last), (Concat, _nonempty_parts), (Binary, _middle_broadcast))


def _shared(graph: Graph, ops: list, declared: dict[str, Tensor]) -> tuple[list, set[str]]:
    """Ops that compute what an earlier op computes (the same kind, attributes and inputs, and an
    output of the same shape, type and scale) dropped, their readers reading the earlier output:
    the fixtures' and exporters' three casts of one LayerNorm output for Q, K and V become one.
    A graph output is always kept. Returns the ops and the tensor names no op writes now."""
    outputs = {t.name for t in graph.by_role(Role.OUTPUT)}
    alias: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    kept = []
    for op in ops:
        if any(i in alias for i in op.inputs):
            op = dataclasses.replace(op, inputs=tuple(alias.get(i, i) for i in op.inputs))
        out = declared.get(op.output) or graph.tensors.get(op.output)
        key = (type(op), op.inputs, tuple((f.name, repr(getattr(op, f.name))) for f in dataclasses.fields(op)
                                          if f.name not in ("name", "inputs", "output")),
               (out.shape, out.dtype, out.scale) if out is not None else None)
        if out is not None and key in seen and op.output not in outputs:
            alias[op.output] = seen[key]
            continue
        seen.setdefault(key, op.output)
        kept.append(op)
    return kept, set(alias)


def canonical(graph: Graph) -> Graph:
    device_ops, folded, dropped = _fold(graph)
    ops, declared, changed = [], [], device_ops is not graph.ops
    for op in device_ops:
        rule = next((fn for kind, fn in RULES if isinstance(op, kind)), None)
        rewritten = rule(graph, op) if rule is not None else None
        if rewritten:
            ops.extend(x for x in rewritten if not isinstance(x, Tensor))
            declared.extend(x for x in rewritten if isinstance(x, Tensor))
            changed = True
        else:
            ops.append(op)
    ops, gone = _shared(graph, ops, {t.name: t for t in declared})
    if not changed and not gone:
        return graph
    tensors = [t for t in list(graph.tensors.values()) + declared if t.name not in gone and t.name not in dropped]
    outputs = [t.name for t in graph.by_role(Role.OUTPUT)]
    read = {i for op in ops for i in op.inputs}
    unread = frozenset(t.name for t in tensors if t.role in (Role.INPUT, Role.PARAMETER) and t.name not in read)
    out = Graph.build(graph.name, tensors, ops, outputs=outputs, target=graph.target, pins=graph.pins,
                      folded=folded or graph.folded, unread=unread)
    out.imported = dict(graph.imported)          # what the importer converted travels with the graph
    return out
