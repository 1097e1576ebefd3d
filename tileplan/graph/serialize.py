"""Graphs to and from plain JSON-able dicts (the package keeps its model this way)."""

from __future__ import annotations

import dataclasses
import math

from ..errors import TileplanError
from .core import OP_KINDS, Graph, Role, Tensor
from .dtypes import DType


def graph_to_dict(g: Graph) -> dict:
    tensors = []
    for name in sorted(g.tensors):
        t = g.tensors[name]
        tensors.append({"name": t.name, "shape": list(t.shape), "dtype": t.dtype.value, "role": t.role.value,
                        "scale": t.scale, "layout": str(t.layout) if t.layout is not None else None})
    ops = []
    for op in g.ops:
        d = {"name": op.name, "kind": op.kind, "inputs": list(op.inputs), "output": op.output}
        for f in dataclasses.fields(op):
            if f.name not in ("name", "inputs", "output"):
                d[f.name] = getattr(op, f.name)
        ops.append(d)
    d = {"name": g.name, "target": g.target, "tensors": tensors, "ops": ops,
         "outputs": [t.name for t in g.by_role(Role.OUTPUT)]}
    if g.imported:         # what the importer converted (``Graph.boundary_shape`` reads declared shapes here)
        d["imported"] = g.imported
    if g.folded:           # values as repr strings: -inf and NaN are not JSON numbers
        d["folded"] = {k: repr(v) for k, v in sorted(g.folded.items())}
    unread = sorted(n for n, t in g.tensors.items() if t.role in (Role.INPUT, Role.PARAMETER) and t.size
                    and not g.consumers[n])
    if unread:             # read only by ops folded at plan time (``planner.rewrite``)
        d["unread"] = unread
    return d


def graph_from_dict(d: dict) -> Graph:
    """The graph a package was compiled from (explicit layouts are kept by name only)."""
    try:
        tensors = [Tensor(t["name"], tuple(t["shape"]), DType(t["dtype"]),
                          Role.INTERMEDIATE if t["role"] == "output" else Role(t["role"]), int(t["scale"]))
                   for t in d["tensors"]]
        ops = []
        for o in d["ops"]:
            cls = OP_KINDS[o["kind"]]
            extra = {k: v for k, v in o.items() if k not in ("name", "kind", "inputs", "output")}
            ops.append(cls(o["name"], tuple(o["inputs"]), o["output"], **extra))
        folded = {k: float(v) for k, v in d.get("folded", {}).items()}
        g = Graph.build(d["name"], tensors, ops, outputs=d["outputs"], target=d.get("target"), folded=folded,
                        unread=frozenset(d.get("unread", ())))
        g.imported = _imported(d.get("imported", {}), g)
        return g
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise TileplanError(f"the package's model.json is damaged: {exc}") from None


def _imported(d, g: Graph) -> dict:
    """model.json's ``imported``, its declared shapes checked: each holds as many elements as its graph
    tensor (a reshape at the package boundary, never a resize); a name the graph lacks (a tensor the
    planner folded away) names nothing a user can give, and is dropped."""
    if not isinstance(d, dict):
        raise TypeError("'imported' is not an object")
    shapes = d.get("declared_shapes", {})
    if not isinstance(shapes, dict):
        raise TypeError("'imported.declared_shapes' is not an object")
    kept = {}
    for name, shape in shapes.items():
        t = g.tensors.get(name)
        if t is None:
            continue
        if not isinstance(shape, list) or not all(type(x) is int and x >= 0 for x in shape) \
                or len(shape) > 64 or math.prod(shape) != t.size:
            raise ValueError(f"declared shape {shape!r} of {name!r} does not fit the graph's tensor")
        kept[name] = shape
    return {**d, "declared_shapes": kept} if kept else {k: v for k, v in d.items() if k != "declared_shapes"}
