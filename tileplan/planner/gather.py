"""The Gather family: rows of a parameter table by activation indices (an embedding lookup).

Design decision: the table is split by columns, not rows. Tile ``j`` holds the column block
``[c_j, c_j+1)`` of every table row and every index (the indices are few: one per token, read
replicated as a broadcast operand is), and writes the same column block of every output row.
Whatever the indices are at run time, each tile finds its rows locally: no run-time exchange
depends on the data (the indices are copied, whole, to the tiles holding a block, and only those) (a row split would send each looked-up row from whichever tile holds it, an
exchange the compiler cannot plan). This is the column form of poplibs' ``multiSlice``. The block
width is the smallest whole number of 8-byte words that spreads the columns over the tiles (so a
BERT-base table, 30,522 x 768 FP16, takes 4 columns a tile over 192 tiles: 244 KB each). The output
lies in the same column blocks; the selection converts it for its consumers.
"""

from __future__ import annotations

import numpy as np

from ..estimate.detailed import cost_program
from ..graph.core import Gather, Graph, Op, Tensor
from ..kernels.gather import GatherCall
from ..layout.gemm_grid import Grid
from ..program import ComputeStep, Operand, Program, Vertex
from .candidates import Candidate, Storage


def column_bounds(width: int, itemsize: int, tiles: int) -> tuple[int, ...]:
    """Column block bounds: blocks of whole 8-byte words (the last block takes the remainder), as
    few columns a tile as spread them over at most ``tiles`` tiles."""
    unit = max(1, 8 // itemsize)
    per = max(unit, -(-width // tiles))
    per = -(-per // unit) * unit
    return tuple(range(0, width, per)) + (width,)


def _grid(rows: int, bounds: tuple[int, ...]) -> Grid:
    blocks = len(bounds) - 1
    return Grid.of((0, rows), bounds, np.arange(blocks).reshape(1, blocks))


def storage(graph: Graph, op: Gather, idx: int, t: Tensor, target) -> Storage | None:
    """The table in column blocks, resident (the indices are an activation: no storage)."""
    if idx != 0:
        return None
    return Storage(_grid(t.shape[0], column_bounds(t.shape[1], t.dtype.itemsize, target.tiles)), True)


def candidates(ctx, op: Op) -> list[Candidate]:
    g, target = ctx.graph, ctx.target
    table, idx = g.inputs_of(op)
    out = g.output_of(op)
    rows, (vocab, width) = idx.size, table.shape
    bounds = column_bounds(width, table.dtype.itemsize, target.tiles)
    out_lay = _grid(rows, bounds)
    # The indices on the tiles that hold a column block only (a replicated grid over those tiles).
    blocks = len(bounds) - 1
    idx_lay = Grid.of((0, idx.rows), (0, idx.cols), np.arange(blocks).reshape(1, 1, blocks))
    prog = Program()
    tb = prog.add_buffer(ctx.tensor_buffer(table.name, ctx.storage[table.name].layout))
    ib = prog.add_buffer(ctx.tensor_buffer(idx.name, idx_lay))
    ob = prog.add_buffer(ctx.tensor_buffer(out.name, out_lay))
    vertices, made = [], {}
    for j, (c0, c1) in enumerate(zip(bounds, bounds[1:])):
        w = c1 - c0
        if w not in made:
            call = GatherCall(rows, w, vocab, table.dtype)
            made[w] = (call,) + ctx.caches.kernel(call)
        call, variant, cycles = made[w]
        vertices.append(Vertex(j, call, (Operand(tb.name, 0, vocab * w), Operand(ib.name, 0, rows)),
                               (Operand(ob.name, 0, rows * w),), variant, cycles))
    prog.steps.append(ComputeStep(f"{op.name}.gather", tuple(vertices)))
    d = cost_program(prog, target)
    desc = f"gather of {rows} rows from {table.name!r} in {len(bounds) - 1} column blocks"
    return [Candidate(op.name, (idx_lay,), out_lay, desc, d.estimate, d.estimate, prog,
                      np.zeros(target.tiles, dtype=np.int64))]
