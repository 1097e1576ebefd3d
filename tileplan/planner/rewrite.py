"""Graph rewrites the planner makes before it plans (the rewritten graph is the one planned,
packaged in model.json and validated; it computes exactly what the original does).

- A MatMul that transposes an activation operand (``transpose_a``/``transpose_b`` on a tensor
  that is not a parameter: a key in ``Q K^T``) reads it through an explicit ``Transpose`` of its
  last two axes, named ``<op>.transpose_a``/``.transpose_b`` and writing ``<tensor>.T<op>``; the
  MatMul then reads the transposed tensor untransposed. The Transpose family plans it as a
  rearrangement (column blocks exchanged, transposed on tile), costed against everything else by
  selection. A transposed *parameter* stays a flag: the host stores it transposed.
"""

from __future__ import annotations

import dataclasses

from ..graph.core import Graph, MatMul, Role, Transpose


def canonical(graph: Graph) -> Graph:
    ops, added = [], False
    for op in graph.ops:
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
    return Graph.build(graph.name, tensors, ops, outputs=outputs, target=graph.target)
