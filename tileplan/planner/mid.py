"""The MidGraph: chosen fragments plus explicit conversion nodes, whole-device.

``MidGraph.build`` walks the ops in order; before each op, every activation
input not already in the layout the chosen candidate reads gets a conversion
node (an exchange of the tensor into that layout; a converted copy made once is
reused by later consumers). An absorbed op gets none: the op it fused with (its
bias Add, or its GEMM's reduction) already wrote its output. The concatenated
program of all nodes is what the detailed estimate costs for the whole graph and
what lowering compiles.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..estimate.detailed import cost_program
from ..program import Program
from ..graph.core import Role
from . import elementwise as ew
from .candidates import activation_inputs


@dataclass
class MidNode:
    kind: str                 # "op" | "conversion"
    name: str
    op: str | None
    candidate: Any            # Candidate for ops
    tensor: str | None = None
    src: Any = None
    dst: Any = None
    program: Program | None = None
    estimate: Any = None


@dataclass
class MidGraph:
    nodes: list[MidNode]
    program: Program
    layouts: dict[str, list]   # tensor -> layouts it is materialised in (first: where it is born)

    @classmethod
    def build(cls, ctx, cands, picks: dict[str, int]) -> "MidGraph":
        g = ctx.graph
        where: dict[str, list] = {}
        for name, t in g.tensors.items():
            if t.role is Role.INPUT:
                where[name] = [ew.input_layout(t, ctx.target.tiles)]
            elif name in ctx.storage and not ctx.storage[name].private:
                where[name] = [ctx.storage[name].layout]
        nodes: list[MidNode] = []
        program = Program()
        output_of = {op.name: op.output for op in g.ops}
        for op in g.ops:
            cand = cands[op.name][picks[op.name]]
            for tensor, want in zip(activation_inputs(ctx.storage, op), () if cand.absorbed else cand.ins):
                have = where[tensor]
                if want in have:
                    continue
                conv = ctx.conversion_program(tensor, have[0], want)
                est = cost_program(conv, ctx.target).estimate
                nodes.append(MidNode("conversion", f"convert {tensor}: {have[0]} -> {want}", op.name, None,
                                     tensor, have[0], want, conv, est))
                program.extend(conv)
                have.append(want)
            out_layout = cand.out
            if cand.fused:
                # A fused candidate (bias Add + GeLU, or a GEMM adding the bias in its reduction)
                # writes the output of the op it fused with, which takes an absorbed candidate.
                where[output_of[cand.fused]] = [out_layout.layout]
            elif not cand.absorbed:
                where[op.output] = [out_layout]
            from .catalogue import program_of
            prog = program_of(ctx, cand)
            nodes.append(MidNode("op", op.name, op.name, cand, op.output, None, out_layout, prog, cand.estimate))
            if prog is not None:
                program.extend(prog)
        return cls(nodes, program, where)
