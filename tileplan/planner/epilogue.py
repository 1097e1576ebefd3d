"""Fused epilogues: the ops after a GEMM (or a bias Add) that the same kernel pass may also do.

A chain is a run of single-consumer ops whose intermediate values are never stored:

- after a split-K GEMM, its reducers (``kernels.ReduceCall`` epilogue fields): the bias Add
  (``GemmChoice.bias``, ``elementwise.fusable_bias``), then a GeLU (the published reduction +
  bias-GeLU kernel: a bias is needed), then a Cast to FP8 (``gemm.Epilogue``);
- after a bias Add, the fused bias-GeLU pass (``kernels.BiasGeLUCall``) and its FP8 output (a
  following Cast; ``elementwise.fusable_cast``).

The fused candidate writes the chain's last output (its own output is ``Fused``) and carries
``fused=<the last op>`` and ``through=<the ops between>``. Every absorbed op gets one candidate per
layout the fused candidates write (``absorbed``): the ops in between read and write the ``Fused``
marker, the last one reads it and gives its output the written layout. The markers of a chain carry
its ``tag`` (``Fused.via``), so no op of another chain (a bias-GeLU's GeLU, say) can pick them up.
Each fused kind is a candidate beside the unfused ones: whole-graph selection compares them by cost.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..graph.core import Graph, MatMul, Op, Role
from . import elementwise as ew
from .elementwise import chain_tag
from .gemm import Epilogue


@dataclass(frozen=True)
class Chain:
    """The ops a GEMM's reducers may do after the sum: the bias Add (``bias``: its bias tensor),
    the GeLU and the Cast, as ``ops`` in order, and the kernel epilogue they make (``epilogue``)."""

    ops: tuple[Op, ...]
    bias: str | None
    epilogue: Epilogue

    @property
    def last(self) -> Op:
        return self.ops[-1]

    @property
    def through(self) -> tuple[str, ...]:
        return tuple(op.name for op in self.ops[:-1])

    @property
    def tag(self) -> str:
        return chain_tag("reduce", self.ops)


def _hidden(graph: Graph, op: Op) -> bool:
    """The output of ``op`` may stay in registers: not a graph output, no pinned layout."""
    out = graph.output_of(op)
    return out.role is not Role.OUTPUT and out.layout is None


def gemm_chain(graph: Graph, op: Op) -> Chain | None:
    """The longest chain after a MatMul beyond a bias Add alone: [the bias Add, then its GeLU,] then a
    Cast to FP8. A GeLU needs the bias (the published kernel is reduction + bias-GeLU); a chain of
    only a bias Add is the bias-in-reduction kind (``GemmChoice.bias``), not an epilogue. None when
    nothing beyond the bias fuses."""
    if not isinstance(op, MatMul):
        return None
    ops: list[Op] = []
    bias, gelu, cur = None, "", op
    found = ew.fusable_bias(graph, op)
    if found is not None:
        add, bias = found
        ops.append(add)
        cur = add
        g = ew.fusable_gelu(graph, add)
        if g is not None and _hidden(graph, add):
            ops.append(g)
            gelu, cur = g.approximate, g
    if not _hidden(graph, cur):
        return Chain(tuple(ops), bias, Epilogue(gelu)) if gelu else None
    cast = ew.fusable_cast(graph, cur)
    if cast is not None:
        ops.append(cast)
        return Chain(tuple(ops), bias, Epilogue(gelu, True, graph.output_of(cast).scale))
    return Chain(tuple(ops), bias, Epilogue(gelu)) if gelu else None


def absorbed(ctx, op: Op, producers, into: str) -> list:
    """The absorbed candidates of ``op``: one per (layout, chain) some fused candidate among
    ``producers`` writes ``op``'s output in (``fused``) or passes through ``op`` (``through``), in
    the order first met."""
    finals, passes = {}, {}
    for c in producers:
        if c.fused == op.name:
            finals.setdefault(c.out, None)
        elif op.name in c.through:
            passes.setdefault(c.out, None)
    out = []
    for marks, stored in ((finals, True), (passes, False)):
        for mark in marks:
            out += ew.absorbed_candidates(ctx, op, [mark.layout], into=into, via=mark.via, stored=stored)
    return out
