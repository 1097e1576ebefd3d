"""Fused QKV: one GEMM, three consumers, as a planner decision.

An encoder layer's Q, K and V projections are three GEMMs reading one activation (the LayerNorm
output, or its one FP8 cast) with weights of the same K, type and scale. The fused alternative is
one GEMM of the weights concatenated along N (``[K, Nq + Nk + Nv]``) followed by one ``Slice``
per projection, each writing the projection's own output under the projection's name, so the
rest of the graph is unchanged. Its GEMM has three times the columns (more grids fill the tiles,
one preparation exchange of A instead of three); its Slices are windows of the GEMM's output
layout, copied where they lie (``planner.views.slice_candidates``).

Where it lives (a decision): the two forms are two graphs, each planned whole by the same
catalogue and selection, and the plan keeps the one with fewer modelled cycles (``plan.plan``,
``qkv="auto"``); ``"fused"`` or ``"separate"`` forces one. Every group of a graph is fused or
none is: the groups of a layer stack are alike, and two whole plans cost twice one, where one
plan per subset of groups would cost 2^groups. ``Plan.qkv`` records the choice and both
estimates; plan.json and the reports print them.

The weights are concatenated when the package's parameter values are written
(``package_params``, called by ``lowering.compile``): the user's arrays stay as they are, and
the package's ``params.npz`` holds the fused weight under the fused op's name. A model without
parameter values (TOML) validates on seeded values of the fused weight, as of any parameter.

A group: MatMuls with the same activation A (not transposed), each B a parameter matrix read by
that MatMul only, with one transpose flag, dtype and FP8 scale, and outputs of one dtype and
scale; no pins on them and no pinned output layouts. At least two.

Biases: when every member's product is read only by a bias Add of a parameter vector (``[N]``, the
product's type, read by that Add only), the biases are concatenated too, into one Add on the fused
product before the Slices (each Slice then writes its member's Add output). The fused GEMM's bias
Add may then fuse into its reduction like any GEMM's (``catalogue.bias_fusion``), where three Adds
over the projections' outputs were three pointwise passes (1,584 cycles each on the SigLIP
layer). The package holds the concatenated bias under ``FusedGroup.bias``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..errors import TileplanError
from ..graph.core import Add, Graph, MatMul, Role, Slice, Tensor

QKV_MODES = ("auto", "fused", "separate")


def check_qkv(value, where: str = "qkv") -> str:
    if value not in QKV_MODES:
        raise TileplanError(f"{where} must be {' or '.join(repr(m) for m in QKV_MODES)}, got {value!r}")
    return value


@dataclass(frozen=True)
class FusedGroup:
    """One fused GEMM: ``op`` (its name) reads ``weight``, the ``sources`` concatenated along N
    (``axis``: -1, or -2 for weights stored transposed), and the Slices named as ``members`` give
    each member's output."""

    op: str
    weight: str
    members: tuple[str, ...]
    sources: tuple[str, ...]
    axis: int
    bias: str | None = None                 # the concatenated bias (None: the members' Adds stay)
    bias_sources: tuple[str, ...] = ()

    def to_json(self) -> dict:
        out = {"op": self.op, "weight": self.weight, "members": list(self.members), "sources": list(self.sources),
               "axis": self.axis}
        if self.bias is not None:
            out.update(bias=self.bias, bias_sources=list(self.bias_sources))
        return out


def groups(graph: Graph, pinned: set[str] = frozenset()) -> list[list[MatMul]]:
    """The fusable groups of MatMuls, in graph order (see the module docstring)."""
    by_key: dict[tuple, list[MatMul]] = {}
    for op in graph.ops:
        if not isinstance(op, MatMul) or op.transpose_a or op.name in pinned:
            continue
        a, b, c = graph.inputs_of(op) + [graph.output_of(op)]
        if (a.role is Role.PARAMETER or b.role is not Role.PARAMETER or len(b.shape) != 2
                or len(graph.consumers[b.name]) != 1 or c.layout is not None):
            continue
        key = (a.name, op.transpose_b, b.dtype, b.scale, c.dtype, c.scale)
        by_key.setdefault(key, []).append(op)
    return [ops for ops in by_key.values() if len(ops) >= 2]


def bias_add(graph: Graph, op: MatMul, pinned: set[str] = frozenset()) -> tuple[Add, Tensor] | None:
    """The bias Add a group member's product goes through, with its bias, when it can join the fused
    GEMM's concatenated bias (see the module docstring); None otherwise."""
    c = graph.output_of(op)
    readers = graph.consumers.get(c.name, [])
    if len(readers) != 1 or c.role is Role.OUTPUT or not isinstance(readers[0], Add) or readers[0].name in pinned:
        return None
    add = readers[0]
    if add.inputs[0] == add.inputs[1]:
        return None
    b = graph.tensors[add.inputs[1] if add.inputs[0] == c.name else add.inputs[0]]
    if (b.role is not Role.PARAMETER or b.shape != (c.shape[-1],) or len(graph.consumers[b.name]) != 1
            or b.dtype is not c.dtype or b.scale or graph.output_of(add).layout is not None):
        return None
    return add, b


def fused_graph(graph: Graph, pinned: set[str] = frozenset()) -> tuple[Graph, list[FusedGroup]] | None:
    """The graph with every group fused (None when it has none)."""
    found = groups(graph, pinned)
    if not found:
        return None
    replace: dict[str, list] = {}
    made, dropped, fused = [], set(), []
    for ops in found:
        biases = [bias_add(graph, op, pinned) for op in ops]
        biases = biases if all(biases) else None
        first = ops[0]
        ws = [graph.tensors[op.inputs[1]] for op in ops]
        axis = -2 if first.transpose_b else -1
        widths = [w.shape[axis] for w in ws]
        k = ws[0].shape[-1 if first.transpose_b else 0]
        name = f"{first.name}.fused"
        wname, out = f"{name}.w", f"{name}.out"
        wshape = (sum(widths), k) if first.transpose_b else (k, sum(widths))
        c = graph.output_of(first)
        made.append(Tensor(wname, wshape, ws[0].dtype, Role.PARAMETER, ws[0].scale))
        made.append(Tensor(out, c.shape[:-1] + (sum(widths),), c.dtype, scale=c.scale))
        seq: list = [MatMul(name, (first.inputs[0], wname), out, transpose_b=first.transpose_b)]
        bname = None
        if biases is not None:              # one bias Add on the fused product, then the Slices
            bname, sliced = f"{name}.b", f"{name}.biased"
            made.append(Tensor(bname, (sum(widths),), biases[0][1].dtype, Role.PARAMETER))
            made.append(Tensor(sliced, c.shape[:-1] + (sum(widths),), c.dtype, scale=c.scale))
            seq.append(Add(f"{name}.bias", (out, bname), sliced))
            for (add, b), op in zip(biases, ops):
                replace[add.name] = []
                dropped.update((b.name, op.output))
        bounds = np.concatenate(([0], np.cumsum(widths))).tolist()
        sliced_from = seq[-1].output        # the product, or its biased sum
        outs = [op.output for op in ops] if biases is None else [add.output for add, _ in biases]
        seq += [Slice(op.name, (sliced_from,), o, axis=-1, start=lo, stop=hi)
                for op, o, lo, hi in zip(ops, outs, bounds, bounds[1:])]
        replace[first.name] = seq
        for op in ops[1:]:
            replace[op.name] = []
        dropped.update(w.name for w in ws)
        fused.append(FusedGroup(name, wname, tuple(op.name for op in ops), tuple(w.name for w in ws), axis,
                                bname, tuple(b.name for _, b in biases) if biases is not None else ()))
    ops = [x for op in graph.ops for x in replace.get(op.name, [op])]
    tensors = [t for n, t in graph.tensors.items() if n not in dropped] + made
    outputs = [t.name for t in graph.by_role(Role.OUTPUT)]
    out = Graph.build(graph.name, tensors, ops, outputs=outputs, target=graph.target, pins=graph.pins,
                      weights=graph.weights, folded=graph.folded)
    out.imported = dict(graph.imported)
    return out, fused


def package_params(fused: list[dict] | None, params: dict | None) -> dict | None:
    """The parameter values a package of a fused plan holds: the user's, with each group's weights
    replaced by their concatenation along N (a new dict; the user's arrays are not touched).
    ``fused``: ``Plan.qkv["fused"]`` (the groups, ``FusedGroup.to_json``), or None."""
    if not params or not fused:
        return params
    out = dict(params)
    for g in fused:
        axis = -2 if g.get("axis", -1) == -2 else -1
        out[g["weight"]] = _concatenated(out, g, g["sources"], "weights", axis)
        if g.get("bias"):
            out[g["bias"]] = _concatenated(out, g, g["bias_sources"], "biases", -1)
    return out


def _concatenated(values: dict, group: dict, names: list[str], what: str, axis: int) -> np.ndarray:
    """The group's ``names`` taken out of ``values`` and concatenated along ``axis``, in the first's type."""
    missing = [s for s in names if s not in values]
    if missing:
        raise TileplanError(f"fused GEMM {group['op']!r}: the parameter values lack {missing} (its {what})")
    dtype = np.asarray(values[names[0]]).dtype
    return np.concatenate([np.asarray(values.pop(s)) for s in names], axis=axis).astype(dtype)
