"""The GEMM catalogue: boundary combinations x grids, coarse rows, frontiers, detailed survivors.

For one MatMul, every boundary combination (A's layout, B's when it is an
activation, C's) is a *chunk*: its options (grids x orders x reductions x
partials types) are costed at once as numpy rows (``gemm.coarse_rows``);
options over tile memory are dropped before anything is built; a bounded
Pareto frontier over (coarse cycles, coarse memory) keeps the survivors, which
get their fragment program built and costed in detail. Chunks run in a process
pool when ``jobs > 1`` and are merged in chunk order (deterministic).

Every dropped option that reached the frontier stage stays available as a
runner-up with the reason it lost: ``over memory``, ``dominated`` (another
option of its chunk is no slower and no larger) or ``thinned`` (the frontier was
crowded), or, for survivors that were detailed but not kept for selection,
``slower than <winner> by N cycles``.
"""

from __future__ import annotations

import itertools
import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from ..errors import TileplanError
from ..estimate.cost import Estimate
from ..estimate.detailed import cost_program
from ..graph.core import MatMul
from . import elementwise as ew
from .candidates import Candidate
from .frontier import frontier
from .gemm import GemmShape, build_program, coarse_rows

KEEP_PER_CHUNK = 6          # detailed candidates per boundary combination kept for selection
DETAIL_BUDGET = 8           # frontier entries costed in detail per chunk: the fastest by coarse cycles,
                            # plus the least-memory entries of each class
RUNNERS_UP = 8              # coarse runner-ups kept per chunk for the report


def boundary_combinations(ctx, op: MatMul) -> list[tuple]:
    g = ctx.graph
    ta, tb = g.inputs_of(op)
    tc = g.output_of(op)
    tiles = ctx.target.tiles
    a_opts = [None] if ctx.storage.get(ta.name, None) and ctx.storage[ta.name].private \
        else ew.activation_layouts(ta, tiles)
    b_opts = [None] if ctx.storage.get(tb.name, None) and ctx.storage[tb.name].private \
        else ew.activation_layouts(tb, tiles)
    c_opts = ew.activation_layouts(tc, tiles)
    return list(itertools.product(a_opts, b_opts, c_opts))


def _chunk(args):
    """Cost one boundary combination: coarse rows, frontier, detailed survivors (runs in a worker)."""
    ctx, op, combo = args
    g = ctx.graph
    shape = GemmShape.of(g, op, ctx.target)
    la, lb, lc = combo
    a_buf = ctx.tensor_buffer(op.inputs[0], la)
    b_buf = ctx.tensor_buffer(op.inputs[1], lb)
    c_buf = ctx.tensor_buffer(op.output, lc)
    tiles = ctx.target.tiles
    in_bytes = int(ctx.tile_bytes(op.inputs[0], la if la is not None else a_buf.layout).max())
    out_bytes = int(ctx.tile_bytes(op.output, lc).max())
    rows = coarse_rows(shape, ctx.target, in_bytes, out_bytes)
    ins = tuple(l for l in (la, lb) if l is not None)
    fits = np.flatnonzero(rows.fits)
    if fits.size == 0:
        return [], [], _overflow(rows, shape, op, ctx.target)
    front = fits[frontier(rows.cycles[fits], rows.memory[fits], ctx.frontier_bound,
                          extremes=(rows.interleaved[fits],))]
    by_speed = front[np.lexsort((front, rows.cycles[front]))]
    least = {int(front[np.lexsort((front, rows.cycles[front], col[front]))[0]]) for col in (rows.memory, rows.interleaved)}
    keep = np.array(sorted(set(by_speed[:DETAIL_BUDGET].tolist()) | least), dtype=np.int64)
    survivors = []
    for i in keep.tolist():
        choice = rows.choice(shape, i)
        prog = build_program(shape, choice, a_buf, b_buf, c_buf, ctx.target)
        d = cost_program(prog, ctx.target)
        coarse = Estimate(compute=int(rows.cycles[i]), total_memory=int(rows.memory[i]))
        transient = d.memory.by_kind.get("transient", np.zeros(tiles, dtype=np.int64))
        survivors.append(Candidate(op.name, ins, lc, str(choice), coarse, d.estimate, prog, transient,
                                   choice=choice))
    # Runner-ups that never reached the detailed stage: frontier entries beyond the detail budget,
    # then the fastest options the frontier dropped.
    on_front = np.setdiff1d(front, keep)
    off_front = np.setdiff1d(fits, front)
    runners = []
    for group, why in ((on_front, f"on the coarse frontier, outside the detail budget ({DETAIL_BUDGET} fastest "
                                  "and the least-memory entries)"),
                       (off_front, "off the coarse frontier: dominated (another grid is no slower and no larger) "
                                   "or thinned from a crowded frontier")):
        for i in group[np.argsort(rows.cycles[group], kind="stable")][:RUNNERS_UP].tolist():
            choice = rows.choice(shape, i)
            coarse = Estimate(compute=int(rows.cycles[i]), total_memory=int(rows.memory[i]))
            runners.append(Candidate(op.name, ins, lc, str(choice), coarse, coarse, None,
                                     np.zeros(0, dtype=np.int64), choice=choice, detailed=False, lost=why))
    return survivors, runners, None


def _overflow(rows, shape, op, target) -> str:
    """Every option overflows: name the least-overflowing one's tile, class and excess."""
    over_total = rows.memory - target.usable_bytes
    over_il = rows.interleaved - target.interleaved_bytes
    i = int(np.argmin(np.maximum(over_total, over_il)))
    if over_total[i] >= over_il[i]:
        what = (f"total memory: {int(rows.memory[i]):,} bytes, {int(over_total[i]):,} over the "
                f"{target.usable_bytes:,} usable")
    else:
        what = (f"interleaved memory (AMP weight blocks): {int(rows.interleaved[i]):,} bytes, {int(over_il[i]):,} "
                f"over the {target.interleaved_bytes:,} of the region")
    return (f"op {op.name!r} (matmul {shape.M}x{shape.K} @ {shape.K}x{shape.N}): every grid overflows tile memory; "
            f"the least overflowing ({rows.choice(shape, i)}) needs on tile 0, which holds the largest blocks, {what}")


def gemm_candidates(ctx, op: MatMul) -> list[Candidate]:
    combos = boundary_combinations(ctx, op)
    tasks = [(ctx, op, c) for c in combos]
    if ctx.progress is not None:
        ctx.progress(op.name, 0, len(tasks))
    results = []
    if ctx.jobs > 1 and len(tasks) > 1:
        with ProcessPoolExecutor(max_workers=min(ctx.jobs, len(tasks))) as pool:
            for k, r in enumerate(pool.map(_chunk, tasks)):
                results.append(r)
                if ctx.progress is not None:
                    ctx.progress(op.name, k + 1, len(tasks))
    else:
        for k, t in enumerate(tasks):
            results.append(_chunk(t))
            if ctx.progress is not None:
                ctx.progress(op.name, k + 1, len(tasks))
    kept: list[Candidate] = []
    lost: list[Candidate] = []
    errors = []
    for survivors, runners, err in results:
        if err:
            errors.append(err)
            continue
        survivors.sort(key=lambda c: (c.estimate.cycles, c.estimate.total_memory, c.desc))
        # Bounded again: the detailed frontier of the chunk, at most KEEP_PER_CHUNK entries.
        idx = frontier([c.estimate.cycles for c in survivors], [c.estimate.total_memory for c in survivors],
                       KEEP_PER_CHUNK, extremes=([c.estimate.interleaved for c in survivors],
                                                 [c.estimate.standard for c in survivors]))
        chosen = set(idx.tolist())
        best = survivors[min(chosen, key=lambda i: survivors[i].estimate.cycles)] if chosen else None
        for i, c in enumerate(survivors):
            if i in chosen:
                kept.append(c)
            else:
                c.lost = (f"detailed {c.estimate.cycles:,} cycles, {c.estimate.total_memory:,} B: dominated by "
                          f"{best.desc} ({best.estimate.cycles:,} cycles)") if best else "dropped"
                lost.append(c)
        lost.extend(runners)
    if not kept:
        raise TileplanError(errors[0] if errors else f"op {op.name!r}: no GEMM candidate")
    ctx.runner_ups = getattr(ctx, "runner_ups", {})
    ctx.runner_ups[op.name] = lost
    return kept
