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
- A reduction without ``keepdims`` keeps its unit axis and a Reshape drops it (``<op>.squeeze``):
  the row-wise kernel writes one value per row, on the row's tile.
"""

from __future__ import annotations

import dataclasses

from ..graph.core import Graph, MatMul, Reduce, Reshape, Role, Softmax, Transpose


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


def canonical(graph: Graph) -> Graph:
    ops, added = [], False
    for op in graph.ops:
        if isinstance(op, Softmax):
            rewritten = _softmax_last(graph, op)
            if rewritten:
                ops.extend(rewritten)
                added = True
                continue
        if isinstance(op, Reduce) and not op.keepdims:
            kept = f"{op.output}.kept"
            ops.append(dataclasses.replace(op, output=kept, keepdims=True))
            ops.append(Reshape(f"{op.name}.squeeze", (kept,), op.output, shape=graph.tensors[op.output].shape))
            added = True
            continue
        if not isinstance(op, MatMul):
            ops.append(op)
            continue
        inputs, flags = list(op.inputs), {}
        for idx, flag in ((0, "transpose_a"), (1, "transpose_b")):
            t = graph.tensors[op.inputs[idx]]
            if getattr(op, flag) and t.role is not Role.PARAMETER:
                n = len(t.shape)
                perm = tuple(range(n - 2)) + (n - 1, n - 2)
                out = f"{t.name}.T{op.name}"
                ops.append(Transpose(f"{op.name}.{flag}", (t.name,), out, perm=perm))
                inputs[idx] = out
                flags[flag] = False
        if flags:
            added = True
            op = dataclasses.replace(op, inputs=tuple(inputs), **flags)
        ops.append(op)
    if not added:
        return graph
    tensors = [t for t in graph.tensors.values()]
    outputs = [t.name for t in graph.by_role(Role.OUTPUT)]
    out = Graph.build(graph.name, tensors, ops, outputs=outputs, target=graph.target, pins=graph.pins)
    out.imported = dict(graph.imported)          # what the importer converted travels with the graph
    return out
