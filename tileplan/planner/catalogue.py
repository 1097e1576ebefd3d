"""The GEMM catalogue: boundary combinations x grids, coarse rows, frontiers, detailed survivors.

For one MatMul, every boundary combination (A's layout, B's when it is an
activation, C's) is a *chunk*: its options (grids x orders x reductions x
partials types) are costed at once as numpy rows (``gemm.coarse_rows``);
options over tile memory are dropped before anything is built; a bounded
Pareto frontier over (coarse cycles, coarse memory) keeps the survivors, which
get their fragment program built and costed in detail. Chunks run in a process
pool when ``jobs > 1`` and are merged in chunk order (deterministic).

A MatMul followed by a bias Add it may do in its reduction (``elementwise.fusable_bias``,
with the bias in its replicated storage) has a second set of chunks: the same A and B
layouts, the Add's output layouts for C, and only options with a reduction (``gk > 1``),
each reducer adding the bias (``GemmChoice.bias``). Their candidates write the Add's
output (their output is ``Fused``: the product is never stored) and carry
``fused=<the Add>``; ``plan`` gives the Add its absorbed candidates. Both kinds stay
in the catalogue: the whole-graph selection decides (bias in the reduction then a
plain GeLU, or the GEMM then a fused bias-GeLU, ...).

A MatMul whose B is a parameter in compact resident storage read by this op only
(``prearrangeable``) has pre-arranged chunks too: the same boundary combinations, options
read with B stored as their grid reads it (``gemm.prearranged_b``: replicated over the row
blocks that need it), so their preparation never exchanges B. Their candidates carry that
storage (``Candidate.weights``) and its bytes per tile over the whole program
(``Candidate.resident``): selection decides, under every tile's memory, which weights are
pre-arranged.

A MatMul whose reducers may also do the ops after it (``epilogue_fusion``: [bias Add, GeLU,]
Cast to FP8, ``planner.epilogue``) has epilogue chunks: the chain's last output layouts for C,
options with a reduction only (``GemmChoice.epilogue``). The kinds are orthogonal: with
pre-arranged weights the epilogue chunks come twice too, so a candidate may read B
pre-arranged and fuse its epilogue.

A tensor one GEMM's fragments write (its product, its bias Add's output, its epilogue chain's
last output) and another GEMM reads alone as its A may cross that boundary grid-aligned: laid
out as the reader's grid reads A (``gemm.a_grid``). Both catalogues offer those layouts besides
the neutral ones (``aligned_layouts``: the reader's fastest unreplicated grid), the writer's as C, the
reader's as A in chunks of that grid alone, whose preparation moves nothing for A; selection
compares them with the neutral layouts like any boundary.

Every dropped option that reached the frontier stage stays available as a
runner-up with the reason it lost: ``over memory``, ``dominated`` (another
option of its chunk is no slower and no larger) or ``thinned`` (the frontier was
crowded), or, for survivors that were detailed but not kept for selection,
``slower than <winner> by N cycles``.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import queue
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from ..errors import TileplanError
from ..forked import child_init
from ..estimate.cost import Estimate
from ..estimate.detailed import cost_program
from ..graph.core import MatMul
from ..graph.pins import ORDERS
from ..layout.gemm_grid import Grid
from ..layout.owner_map import sorted_unique
from . import cachecodec, canon
from . import elementwise as ew
from .candidates import Candidate, Fused, RunnerUp
from .epilogue import Chain, gemm_chain
from .frontier import frontier
from .gemm import GemmShape, a_copies, a_grid, build_program, coarse_rows, coarse_table

KEEP_PER_CHUNK = 6          # detailed candidates per boundary combination kept for selection
DETAIL_BUDGET = 8           # frontier entries costed in detail per chunk: the fastest by coarse cycles,
                            # plus the least-memory entries of each class
BIAS_DETAIL_BUDGET = 4      # the same for a chunk of the bias-in-reduction kind: its fastest entries only
PRE_DETAIL_BUDGET = 4       # the same for a chunk of pre-arranged weights: its fastest entries only
RUNNERS_UP = 8              # coarse runner-ups kept per chunk for the report
CATALOGUE_KINDS = "plain, bias in the reduction, fused epilogues, pre-arranged B x each; grid-aligned A and C"
                            # in the plan cache key: what a cached catalogue holds (one written before
                            # a kind existed is not read)
POOL_MIN_WORK = 8192        # detailed choices x tiles below which the catalogue stays in-process
POOL_MIN_TILES = 256        # targets below this plan their GEMMs' catalogues in-process: a whole catalogue
                            # costs less than starting a worker (the 64-tile smoke plan takes ~40 ms)


def bias_fusion(ctx, op: MatMul) -> tuple | None:
    """(the bias Add, its bias tensor) when the MatMul's reduction may do the Add: the graph allows
    it (``elementwise.fusable_bias``) and the bias is resident, replicated on every tile."""
    found = ew.fusable_bias(ctx.graph, op)
    if found is None:
        return None
    add, bias = found
    st = ctx.storage.get(bias)
    if st is None or not st.private or st.layout != ew.replicated(ctx.graph.tensors[bias].shape, ctx.target.tiles):
        return None
    return add, bias


def prearrangeable(ctx, op: MatMul) -> bool:
    """The MatMul's B may be pre-arranged: the plan lets the planner choose the storage
    (``ctx.weights``, not ``"compact"``), and B is a parameter in its compact resident storage
    (``Packed`` or ``PackedPanels``), no layout pinned by the model file, read by this op only."""
    from ..layout import Packed, PackedPanels
    if ctx.weights == "compact":
        return False
    b = op.inputs[1]
    st = ctx.storage.get(b)
    t = ctx.graph.tensors[b]
    return (st is not None and st.private and isinstance(st.layout, (Packed, PackedPanels)) and t.layout is None
            and len(ctx.graph.consumers.get(b, [])) == 1)


def prearranged_context(ctx, op: MatMul, shape, choice):
    """(the context with op's B pre-arranged for ``choice`` (``gemm.prearranged_b``), that storage)."""
    from .candidates import Storage
    from .gemm import prearranged_b
    grid = prearranged_b(shape, choice)
    st = Storage(grid, True, ctx.storage[op.inputs[1]].transpose)
    return ctx.with_storage(op.inputs[1], st), st


def epilogue_fusion(ctx, op: MatMul) -> Chain | None:
    """The epilogue chain the MatMul's reducers may do (``epilogue.gemm_chain``), when its bias, if
    it has one, is resident and replicated (``bias_fusion``)."""
    chain = gemm_chain(ctx.graph, op)
    if chain is None or (chain.bias is not None and bias_fusion(ctx, op) is None):
        return None
    return chain


def fusion_for(ctx, op: MatMul, choice):
    """What a choice's fragment fuses: its epilogue chain, its (bias Add, bias) pair, or None."""
    if choice.epilogue is not None:
        return epilogue_fusion(ctx, op)
    return bias_fusion(ctx, op) if choice.bias else None


def boundary_combinations(ctx, op: MatMul, bias: bool = False, chain: Chain | None = None) -> list[tuple]:
    """(A, B, C) layouts: A and B as the operands allow, C the product's activation layouts, or
    with ``bias`` the layouts of the bias Add's output (which the fragment then writes), or with an
    epilogue ``chain`` those of its last output. Grid-aligned layouts besides: A as this GEMM's
    fastest grids read it when a GEMM may write A (``aligned_producer``), C as the next GEMM's
    read it when that GEMM reads C as its A (``aligned_layouts``)."""
    g = ctx.graph
    ta, tb = g.inputs_of(op)
    tc = g.output_of(chain.last) if chain is not None else g.output_of(bias_fusion(ctx, op)[0]) if bias \
        else g.output_of(op)
    a_opts, b_opts, c_opts = _neutral(ctx, op, tc)
    if aligned_producer(ctx, ta.name) is not None:
        a_opts = a_opts + aligned_layouts(ctx, op)
    reader = canon.a_reader(g, tc.name)
    if reader is not None:
        c_opts = c_opts + aligned_layouts(ctx, reader)
    return list(itertools.product(a_opts, b_opts, c_opts))


def _neutral(ctx, op: MatMul, tc) -> tuple[list, list, list]:
    """The A, B and C layouts of ``boundary_combinations`` without the grid-aligned ones."""
    ta, tb = ctx.graph.inputs_of(op)
    tiles = ctx.target.tiles
    a_opts = [None] if ctx.storage.get(ta.name, None) and ctx.storage[ta.name].private \
        else ew.activation_layouts(ta, tiles)
    b_opts = [None] if ctx.storage.get(tb.name, None) and ctx.storage[tb.name].private \
        else ew.activation_layouts(tb, tiles)
    return a_opts, b_opts, ew.activation_layouts(tc, tiles)


# ---- grid-aligned boundaries -----------------------------------------------------------------
#
# Design decision: a tensor one GEMM's fragment writes (its product, its bias Add's output, or its
# epilogue chain's last output) and another GEMM reads as its A, alone, may be laid out at the
# boundary as the reader's grid reads A (``gemm.a_grid``: each A block on every tile that
# multiplies it). The reader's preparation then moves nothing for A; the writer's output exchange
# sends each block to those tiles instead of to a neutral layout. Which grids: the reader's
# ALIGNED_GRIDS fastest distinct unreplicated (grid, order) options without serial K by its plain
# coarse rows on its first neutral boundary combination (``aligned_choices``; both GEMMs'
# catalogues work them out alike, so they offer the same layouts); a reader's chunk with an aligned A keeps only that grid and order
# (another grid would convert the blocks again). Selection compares them with the neutral layouts
# like any other boundary: a writer and a reader that disagree pay a conversion.

ALIGNED_GRIDS = 1           # grid-aligned A layouts offered per reading GEMM
ALIGNED_MAX_REPLICAS = 1    # tiles holding each A block in an aligned layout (``aligned_choices``)
ALIGNED_DETAIL_BUDGET = 2   # frontier entries costed in detail per chunk with a grid-aligned A or C


def written(ctx, op: MatMul) -> list[str]:
    """The tensors ``op``'s fragments may write: its product, its bias Add's output (``bias_fusion``),
    its epilogue chain's last output (``epilogue_fusion``)."""
    out = [op.output]
    fusion, chain = bias_fusion(ctx, op), epilogue_fusion(ctx, op)
    if fusion is not None:
        out.append(fusion[0].output)
    if chain is not None:
        out.append(chain.last.output)
    return out


def aligned_producer(ctx, name: str) -> MatMul | None:
    """The GEMM whose fragments may write ``name`` grid-aligned for the MatMul reading it as A (``written``;
    ``canon.may_read_aligned`` is the structural test that includes this one), or None."""
    reader = canon.a_reader(ctx.graph, name)
    if reader is None or not canon.may_read_aligned(ctx.graph, reader):
        return None
    cur = name
    for _ in range(4):
        p = ctx.graph.producers.get(cur)
        if isinstance(p, MatMul):
            return p if name in written(ctx, p) else None
        if p is None or not p.inputs:
            return None
        cur = next((i for i in p.inputs if ctx.graph.tensors[i].role.value == "intermediate"), None)
        if cur is None:
            return None
    return None


def aligned_choices(ctx, op: MatMul) -> list:
    """The grid choices (``gemm.GemmChoice``) whose A layouts ``op``'s writer may produce: the
    ``ALIGNED_GRIDS`` fastest distinct (grid, order) options without serial K that hold each A block
    at most ``ALIGNED_MAX_REPLICAS`` times, by the plain coarse rows of ``op``'s first neutral
    boundary combination (with B pre-arranged where it may be). Remembered per context.

    Design decision: unreplicated grids only (``ALIGNED_MAX_REPLICAS``: a grid whose column blocks
    all read one A block replicates it). The writer's output exchange then sends each block once,
    as it does to a neutral layout, and the reader's preparation, which would have multicast it,
    moves nothing for A. Replicated grids were tried: the writer sends every replica itself, which
    costs about what the reader saves (fixtures/gemm_chain_fp16.toml: 70,596 cycles with the best
    grid reading A twice, 66,488 unreplicated, 72,024 neutral; one reading it 8 times lost to
    neutral by 10%), and they widened the selection (the small encoder layer's CP-SAT proof, the
    bench's search oracle, took 58 s instead of 13 s)."""
    memo = ctx.__dict__.setdefault("_aligned", {})
    if op.name not in memo:
        shape = GemmShape.of(ctx.graph, op, ctx.target)
        a_opts, b_opts, c_opts = _neutral(ctx, op, ctx.graph.output_of(op))
        combo = (a_opts[0], b_opts[0], c_opts[0])
        in_bytes, out_bytes, cuts = boundary_figures(ctx, op, shape, combo)
        rows = coarse_rows(shape, ctx.target, in_bytes, out_bytes, cuts, pre=prearrangeable(ctx, op))
        ok = np.flatnonzero(rows.fits & (rows.sk == 1) & (a_copies(shape, rows.grid) <= ALIGNED_MAX_REPLICAS))
        picked, seen = [], set()
        for i in ok[np.argsort(rows.cycles[ok], kind="stable")].tolist():
            if len(picked) >= ALIGNED_GRIDS:
                break
            key = (tuple(rows.grid[i].tolist()), int(rows.order[i]))
            if key not in seen:
                seen.add(key)
                picked.append(rows.choice(shape, i))
        memo[op.name] = (picked, [a_grid(shape, c) for c in picked])
    return memo[op.name][0]


def aligned_layouts(ctx, op: MatMul) -> list:
    """The grid-aligned layouts of ``op``'s A (``aligned_choices``' ``gemm.a_grid``, remembered with them)."""
    aligned_choices(ctx, op)
    return ctx.__dict__["_aligned"][op.name][1]


def held_a(ctx, op: MatMul, layout) -> tuple | None:
    """``coarse_rows``' ``held_a`` of an A boundary ``layout``: the (grid, order) of the aligned choice
    that reads A so, or None for a neutral layout."""
    if not isinstance(layout, Grid):
        return None
    for c, grid in zip(aligned_choices(ctx, op), aligned_layouts(ctx, op)):
        if grid == layout:
            return (c.gb, c.gm, c.gn, c.gk), ORDERS.index(c.order)
    return None


@dataclass
class Chunk:
    """One boundary combination: its coarse rows and which of them get a detailed estimate."""

    combo: tuple
    ins: tuple
    rows: object = None          # gemm.CoarseRows
    keep: np.ndarray | None = None
    runners: list = field(default_factory=list)
    error: str | None = None
    bias: bool = False           # options that add the bias in their reduction (output: the bias Add's)
    pre: bool = False            # options that read B pre-arranged (``gemm.prearranged_b``)
    chain: Chain | None = None   # options whose reducers do this epilogue chain (output: its last op's)

    @property
    def out(self):
        """The output layout its candidates give the product: ``Fused`` when they write the Add's output
        (or the epilogue chain's, marked with the chain)."""
        if self.chain is not None:
            return Fused(self.combo[2], self.chain.tag)
        return Fused(self.combo[2]) if self.bias else self.combo[2]


def boundary_figures(ctx, op, shape, combo) -> tuple[int, int, float]:
    """(A's boundary bytes, C's boundary bytes on the fullest tile, A's cuts inside rows per element)."""
    la, lb, lc = combo
    a_layout = la if la is not None else ctx.tensor_buffer(op.inputs[0], la).layout
    in_bytes = int(ctx.tile_bytes(op.inputs[0], a_layout).max())
    out_bytes = int(ctx.tile_bytes(op.output, lc).max())
    a_om = a_layout.owner_map(ctx.graph.tensors[op.inputs[0]].shape, ctx.graph.tensors[op.inputs[0]].dtype,
                              ctx.target.tiles)
    cuts = a_om.start[a_om.start > 0]
    return in_bytes, out_bytes, float(np.count_nonzero(cuts % shape.K)) / max(a_om.size, 1)


def _select(ctx, op, shape, combo, figures=None, table=None, bias: bool = False, pre: bool = False,
            chain: Chain | None = None) -> Chunk | None:
    """Coarse rows of one boundary combination, its bounded frontier and the entries to detail (None
    for a grid-aligned A whose grid has no option of this kind: a bias kind needs a reduction)."""
    la, lb, lc = combo
    in_bytes, out_bytes, a_cut_density = figures or boundary_figures(ctx, op, shape, combo)
    own = held_a(ctx, op, la)
    rows = coarse_rows(shape, ctx.target, in_bytes, out_bytes, a_cut_density, table, bias, pre,
                       chain.epilogue if chain is not None else None, own)
    if own is not None and not len(rows.cycles):
        return None                       # (this kind has no option of the aligned grid: no chunk)
    chunk = Chunk(combo, tuple(l for l in (la, lb) if l is not None), rows, bias=bias, pre=pre, chain=chain)
    aligned = own is not None or isinstance(lc, Grid)        # a grid-aligned A or C
    bias = bias or chain is not None or aligned     # a fused kind or an aligned boundary: its fastest entries only
    fits = np.flatnonzero(rows.fits)
    if fits.size == 0:
        chunk.error = _overflow(rows, shape, op, ctx.target)
        return chunk
    front = fits[frontier(rows.cycles[fits], rows.memory[fits], ctx.frontier_bound,
                          extremes=(rows.interleaved[fits],))]
    by_speed = front[np.lexsort((front, rows.cycles[front]))]
    # The least-memory entries are the fallbacks when memory is tight; the bias-in-reduction kind is a
    # speed option, so its chunks detail their fastest entries only (the plain kind keeps the fallbacks).
    least = set() if bias or pre else \
        {int(front[np.lexsort((front, rows.cycles[front], col[front]))[0]]) for col in (rows.memory, rows.interleaved)}
    budget = ALIGNED_DETAIL_BUDGET if aligned else PRE_DETAIL_BUDGET if pre else \
        BIAS_DETAIL_BUDGET if bias else DETAIL_BUDGET
    chunk.keep = np.array(sorted(set(by_speed[:budget].tolist()) | least), dtype=np.int64)
    # Runner-ups that never reached the detailed stage: frontier entries beyond the detail budget,
    # then the fastest options the frontier dropped.
    # (``np.setdiff1d``'s result, without its ``np.unique``, whose first call imports numpy.ma: about
    # 4% of a cold 64-tile plan's CPU)
    on_front = sorted_unique(front)
    on_front = on_front[~np.isin(on_front, chunk.keep)]
    off = np.ones(len(rows.cycles), dtype=bool)
    off[front] = False
    off_front = fits[off[fits]]
    budget_rule = f"{budget} fastest" + ("" if bias or pre else " and the least-memory entries")
    for group, why in ((on_front, f"on the coarse frontier, outside the detail budget ({budget_rule})"),
                       (off_front, "off the coarse frontier: dominated (another grid is no slower and no larger) "
                                   "or thinned from a crowded frontier")):
        for i in _fastest(group, rows.cycles, RUNNERS_UP).tolist():
            choice = rows.choice(shape, i)
            coarse = Estimate(compute=int(rows.cycles[i]), total_memory=int(rows.memory[i]))
            chunk.runners.append(RunnerUp(Candidate(op.name, chunk.ins, chunk.out, describe(choice, pre), coarse,
                                                    coarse, None, np.zeros(0, dtype=np.int64), choice=choice,
                                                    detailed=False, weights=PRE if pre else None), why))
    return chunk


def _fastest(idx: np.ndarray, cycles: np.ndarray, count: int) -> np.ndarray:
    """The ``count`` entries of ``idx`` with the fewest cycles, ties in ``idx`` order (a stable sort's
    head, without sorting hundreds of thousands of rows)."""
    c = cycles[idx]
    if len(c) > count:
        cut = np.partition(c, count - 1)[count - 1]
        idx, c = idx[c <= cut], c[c <= cut]
    return idx[np.argsort(c, kind="stable")][:count]


PRE = "pre-arranged"      # a coarse runner-up's ``weights`` marker: it would read B pre-arranged


def describe(choice, pre: bool) -> str:
    return f"{choice}, B pre-arranged" if pre else str(choice)


def _detail(args) -> list:
    """Detailed estimates of some grid choices in every boundary combination that kept them.

    Runs in a pool worker or in-process. A choice's core program is built once and shared by its
    combinations (``gemm.build_program``); from a worker the results travel back without their
    programs (thousands of vertices each, costly to pickle) and ``program_of`` rebuilds the one
    selection picks."""
    ctx, op, work, keep_programs = args
    shape = GemmShape.of(ctx.graph, op, ctx.target)
    out = []
    for (choice, pre), combos in work:
        fusion = fusion_for(ctx, op, choice)
        used, weights, resident = ctx, None, None
        if pre:
            used, st = prearranged_context(ctx, op, shape, choice)
            weights, resident = st.layout, used.tile_bytes(op.inputs[1], st.layout)
        for combo in combos:
            prog = fragment(used, op, shape, choice, combo, fusion)
            d = cost_program(prog, ctx.target)
            out.append((combo, choice, pre, d.estimate, transient_of(used, d, choice, combo, fusion),
                        interleaved_of(used, d, prog), weights, resident, prog if keep_programs else None))
    return out


def interleaved_of(ctx, cost, prog) -> np.ndarray:
    """int64 [tiles]: a detailed GEMM candidate's transient bytes in the interleaved region (its peak
    there less the resident parameters it reads from the region), for the selection's check of
    the region beside the total."""
    il = np.asarray(cost.memory.interleaved, dtype=np.int64)
    for b in prog.buffers.values():
        if b.kind == "parameter" and b.region == "interleaved":
            il = il - ctx.tile_bytes(b.tensor or b.name, ctx.storage[b.tensor or b.name].layout)
    return np.maximum(il, 0)


def transient_of(ctx, cost, choice, combo, fusion) -> np.ndarray:
    """int64 [tiles]: a detailed GEMM candidate's transient bytes for the selection. With the bias
    in its reduction its output is Fused: the Add's output it writes counts here (as the
    bias-GeLU fusion counts the GeLU's output); with an epilogue (``fusion`` its chain), the chain's
    last output."""
    transient = cost.memory.by_kind.get("transient", np.zeros(ctx.target.tiles, dtype=np.int64))
    if choice.epilogue is not None:
        transient = transient + ctx.tile_bytes(fusion.last.output, combo[2])
    elif choice.bias:
        transient = transient + ctx.tile_bytes(fusion[0].output, combo[2])
    return transient


def fragment(ctx, op, shape, choice, combo, fusion=None):
    """The fragment program of one GEMM candidate on its boundary layouts; with ``choice.bias`` it
    reads the bias from its resident storage and writes the bias Add's output (``fusion``: the
    op's ``bias_fusion``, when the caller has it)."""
    la, lb, lc = combo
    out, bias_buf = op.output, None
    if choice.epilogue is not None:
        chain = fusion if isinstance(fusion, Chain) else epilogue_fusion(ctx, op)
        out = chain.last.output
        bias_buf = ctx.tensor_buffer(chain.bias, None) if choice.bias else None
    elif choice.bias:
        add, bias = fusion or bias_fusion(ctx, op)
        out, bias_buf = add.output, ctx.tensor_buffer(bias, None)
    return build_program(shape, choice, ctx.tensor_buffer(op.inputs[0], la), ctx.tensor_buffer(op.inputs[1], lb),
                         ctx.tensor_buffer(out, lc), ctx.target, bias_buf, ctx.caches)


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


def _chunks(ctx, op, shape, bias: bool = False, combos=None, tick=None, pre: bool = False,
            chain: Chain | None = None) -> list[Chunk]:
    """The chunks of one kind (plain, or the bias in the reduction): every boundary combination,
    from one coarse table shared by them (built for the largest boundary bytes among them).
    ``tick()`` is called after each chunk is costed (the progress display)."""
    combos = boundary_combinations(ctx, op, bias) if combos is None else combos
    figures = [boundary_figures(ctx, op, shape, c) for c in combos]
    table = coarse_table(shape, ctx.target, max(i + o for i, o, _ in figures), bias, pre,
                         chain.epilogue if chain is not None else None)
    if not len(table.grid):
        return []
    out = []
    for c, f in zip(combos, figures):
        chunk = _select(ctx, op, shape, c, f, table, bias, pre, chain)
        if chunk is not None:
            out.append(chunk)
        if tick is not None:
            tick()
    return out


_PROGRESS_QUEUE = None      # in a pool worker: where its catalogue's progress goes (``worker_pool``)


def _worker_init(progress=None) -> None:
    """A pool worker runs as any forked child of tileplan does (``tileplan.forked.child_init``: no cycle
    collector, SIGINT ignored, SIGTERM's default, dies with its parent). ``progress``: the queue its
    catalogues' ``(op, done, total)`` ticks go to."""
    global _PROGRESS_QUEUE
    _PROGRESS_QUEUE = progress
    child_init()


def worker_pool(workers: int, progress=None) -> ProcessPoolExecutor:
    """The catalogue's process pool (``stop_pool`` ends it on any exception); ``progress``: a
    queue of the pool's start method the workers send their catalogues' progress to."""
    return ProcessPoolExecutor(max_workers=workers, initializer=_worker_init, initargs=(progress,))


def _queued_progress(part: int, op: str, done: int, total: int) -> None:
    _PROGRESS_QUEUE.put((op, part, done, total))


def stop_pool(pool: ProcessPoolExecutor) -> None:
    """End a pool now: cancel what has not started, terminate the workers, reap them (no orphans, no
    wait for tasks in progress)."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        try:
            proc.terminate()
        except (OSError, ValueError, AttributeError):
            pass
    for proc in procs:
        try:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        except (OSError, ValueError, AttributeError, AssertionError):
            pass


@dataclass(frozen=True)
class Kind:
    """One kind of a GEMM's chunks (the module docstring's kinds): the plain one; the bias in the
    reduction (``bias``: C takes the Add's output layouts, options with a reduction only, none
    when K is too short to split); a fused epilogue ``chain`` (the reducers also do the GeLU
    and/or the Cast, ``planner.epilogue``); each also with B pre-arranged (``pre``: the same
    boundary combinations, B stored as each grid reads it; orthogonal to the fused kinds)."""

    bias: bool = False
    pre: bool = False
    chain: Chain | None = None


def kinds(ctx, op: MatMul) -> list[Kind]:
    """The kinds of ``op``'s catalogue, in catalogue order (its candidates and runner-ups list them so)."""
    fusion, chain = bias_fusion(ctx, op), epilogue_fusion(ctx, op)
    own = [Kind()] + ([Kind(bias=True)] if fusion is not None else []) \
        + ([Kind(bias=chain.bias is not None, chain=chain)] if chain is not None else [])
    return own + [dataclasses.replace(k, pre=True) for k in own] if prearrangeable(ctx, op) else own


def gemm_candidates(ctx, op: MatMul) -> list[Candidate]:
    """``op``'s catalogue: every kind's candidates (``kind_candidates``); the first kind's error when
    no kind has one."""
    kept, lost, errors = kind_candidates(ctx, op, kinds(ctx, op))
    _some_kept(op, kept, errors)
    ctx.runner_ups = getattr(ctx, "runner_ups", {})
    ctx.runner_ups[op.name] = lost
    return kept


def _some_kept(op: MatMul, kept: list[Candidate], errors: list[str]) -> None:
    """A catalogue with no candidate is an error: its first boundary combination's, else a general one."""
    if not kept:
        raise TileplanError(errors[0] if errors else f"op {op.name!r}: no GEMM candidate")


def kind_candidates(ctx, op: MatMul, which: list[Kind]) -> tuple[list[Candidate], list[RunnerUp], list[str]]:
    """The candidates, runner-ups and errors (a boundary combination that fits no grid) of the
    ``which`` kinds of ``op``'s catalogue, in catalogue order. Kinds share no detailed work (their
    grid choices differ: ``GemmChoice.bias``, ``epilogue``, or the pre-arranged flag), so a
    catalogue costed kind by kind, in several processes, is the catalogue costed at once."""
    shape = GemmShape.of(ctx.graph, op, ctx.target)
    fusion = bias_fusion(ctx, op)
    made: dict = {}          # (bias, chain) -> its combinations, which a pre-arranged kind shares
    for k in which:
        if (k.bias, k.chain) not in made:
            made[k.bias, k.chain] = boundary_combinations(ctx, op, k.bias, k.chain)
    combos = {k: made[k.bias, k.chain] for k in which}
    # Progress: one unit per chunk costed, then one per part of the detailed work.
    count = [0, sum(len(c) for c in combos.values()) + 1]

    def tick(units: int = 1, total: int | None = None) -> None:
        count[0] += units
        count[1] = count[1] if total is None else total
        if ctx.progress is not None:
            ctx.progress(op.name, count[0], count[1])

    tick(0)
    chunks = []
    for k in which:
        chunks += _chunks(ctx, op, shape, bias=k.bias, combos=combos[k], tick=tick, pre=k.pre, chain=k.chain)
    # A kind with no feasible grid costs no chunk.
    count[0] = sum(len(c) for c in combos.values())
    # The detailed work, by grid choice: each choice is built once for all the chunks that kept it.
    wanted: dict = {}
    for ch in chunks:
        if ch.error is None:
            for i in ch.keep.tolist():
                wanted.setdefault((ch.rows.choice(shape, i), ch.pre), []).append(ch.combo)
    work = sorted(wanted.items(), key=lambda kv: (str(kv[0][0]), kv[0][1]))
    # The pool pays for itself only on big grids: worker start-up and pickling cost more than a
    # few small detailed estimates (POOL_MIN_WORK: choices x tiles).
    pooled = ctx.jobs > 1 and len(work) > 1 and len(work) * ctx.target.tiles >= POOL_MIN_WORK
    parts = [work[k::ctx.jobs] for k in range(ctx.jobs)] if pooled else [work]
    tasks = [(ctx, op, part, not pooled) for part in parts if part]
    tick(0, count[0] + len(tasks))
    detailed: dict = {}
    if pooled:
        pool = worker_pool(len(tasks))
        try:
            for k, res in enumerate(pool.map(_detail, tasks)):
                detailed.update({(combo, choice, pre): r for combo, choice, pre, *r in res})
                tick()
        except BaseException:
            stop_pool(pool)
            raise
        pool.shutdown()
    else:
        for k, t in enumerate(tasks):
            detailed.update({(combo, choice, pre): r for combo, choice, pre, *r in _detail(t)})
            tick()
    results = []
    for ch in chunks:
        if ch.error is not None:
            results.append(([], [], ch.error))
            continue
        survivors = []
        for i in ch.keep.tolist():
            choice = ch.rows.choice(shape, i)
            est, transient, interleaved, weights, resident, prog = detailed[(ch.combo, choice, ch.pre)]
            coarse = Estimate(compute=int(ch.rows.cycles[i]), total_memory=int(ch.rows.memory[i]))
            survivors.append(Candidate(op.name, ch.ins, ch.out, describe(choice, ch.pre), coarse, est, prog, transient,
                                       choice=choice, boundary=ch.combo,
                                       fused=ch.chain.last.name if ch.chain is not None
                                       else fusion[0].name if ch.bias else None,
                                       through=ch.chain.through if ch.chain is not None else (),
                                       weights=weights, resident=resident, interleaved=interleaved))
        results.append((survivors, ch.runners, None))
    kept: list[Candidate] = []
    lost: list[RunnerUp] = []
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
                lost.append(RunnerUp(c, (f"detailed {c.estimate.cycles:,} cycles, {c.estimate.total_memory:,} B: "
                                         f"dominated by {best.desc} ({best.estimate.cycles:,} cycles)")
                                     if best else "dropped"))
        lost.extend(runners)
    return kept, lost, errors


class Catalogues:
    """Every GEMM's catalogue, started when constructed and collected by ``result``.

    GEMMs with one planning problem (``canon.op_key``: the q, k, v and output projections of a
    layer, every layer of a tower) share one catalogue: the first of them in op order is costed
    (or read from the plan ``cache``), the others get its candidates re-targeted
    (``canon.retarget``: names mapped, programs left for ``program_of`` to rebuild), which is
    what costing them again would give. ``share=False`` costs every GEMM (the tests' reference).

    With ``jobs > 1`` and several catalogues to cost on a big target, the catalogues run in the
    pool's workers kind by kind (``submit``: boundary selection and detailed costing both), largest
    GEMM first, while the caller plans the elementwise ops; a single GEMM splits its detailed work over
    the pool instead (``gemm_candidates``). Pooled candidates come back without their programs
    (``program_of`` rebuilds the picked ones); the result does not depend on which worker ran
    what, nor on the cache."""

    def __init__(self, ctx, ops: list[MatMul], share: bool = True, cache=None):
        self.ctx, self.ops, self.cache = ctx, ops, cache
        self.pool = None
        self.queue = None                      # the pool's progress ticks (a progress display only)
        self.finished: set[str] = set()
        self.ticks: dict[str, dict[int, tuple[int, int]]] = {}   # op -> part -> its latest (done, total)
        self.futures: dict = {}
        self.keys = {op.name: canon.op_key(ctx.graph, ctx.storage, op) for op in ops}
        self.source: dict[str, str] = {}       # op -> the op whose catalogue it reads
        first: dict[str, str] = {}
        for op in ops:
            self.source[op.name] = first.setdefault(self.keys[op.name], op.name) if share else op.name
        self.reps = [op for op in ops if self.source[op.name] == op.name]
        self.cached: dict[str, tuple] = {}
        if cache is not None:
            self.cache_keys = {op.name: cache_key(ctx, cache, self.keys[op.name]) for op in self.reps}
            for op in self.reps:
                got = cached_catalogue(ctx, cache, self.cache_keys[op.name], op)
                if got is not None:
                    self.cached[op.name] = got
        todo = [op for op in self.reps if op.name not in self.cached]
        if ctx.jobs > 1 and len(todo) > 1 and ctx.target.tiles >= POOL_MIN_TILES:
            size = {op.name: _work(ctx, op) for op in todo}
            if ctx.progress is not None:        # the workers' chunk counts, read in result()
                import multiprocessing
                self.queue = multiprocessing.get_context().Queue()
            self.pool = worker_pool(min(ctx.jobs, len(todo)), self.queue)
            try:
                split = split_kinds(len(todo), min(ctx.jobs, len(todo)))
                for op in sorted(todo, key=lambda op: -size[op.name]):
                    self.futures[op.name] = submit(self.pool, ctx, op, split)
            except BaseException:
                self.cancel()
                raise

    def result(self) -> dict[str, list[Candidate]]:
        ctx = self.ctx
        out: dict[str, list[Candidate]] = {}
        try:
            for op in self.reps:
                if op.name in self.cached:
                    out[op.name], ctx.runner_ups[op.name] = self.cached[op.name]
                elif self.pool is None:
                    out[op.name] = gemm_candidates(ctx, op)
                else:
                    out[op.name], ctx.runner_ups[op.name] = collected(op, self.futures[op.name], self._wait)
                if ctx.progress is not None and (self.pool is not None or op.name in self.cached):
                    self.finished.add(op.name)
                    ctx.progress(op.name, 1, 1)
                if self.cache is not None and op.name not in self.cached:
                    _store(self.cache, self.cache_keys[op.name], ctx, op, out[op.name], ctx.runner_ups.get(op.name, []))
        except BaseException:
            self.cancel()
            raise
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None
        self._close_queue()
        for op in self.ops:
            src = self.source[op.name]
            if src == op.name:
                continue
            rn = canon.renaming(canon.op_names(ctx.graph, ctx.graph.op(src)), ctx.graph, op)
            out[op.name] = [canon.retarget(c, rn, op.name, False) for c in out[src]]
            ctx.runner_ups[op.name] = [canon.retarget_runner_up(r, rn, op.name) for r in ctx.runner_ups.get(src, [])]
            if ctx.progress is not None:
                ctx.progress(op.name, 1, 1)
        return {op.name: out[op.name] for op in self.ops}

    def _wait(self, future):
        """A pooled catalogue's result; meanwhile, the ticks the workers send are shown."""
        while True:
            try:
                return future.result(timeout=0.1 if self.queue is not None else None)
            except TimeoutError:
                pass
            finally:
                self._drain()

    def _drain(self) -> None:
        """Show the queued ticks (a late tick of a catalogue already shown finished is dropped)."""
        while self.queue is not None:
            try:
                tick = self.queue.get_nowait()
            except queue.Empty:
                return
            op, part, done, total = tick
            if op not in self.finished:      # (an op's figures: the sums over its parts, ``submit``)
                parts = self.ticks.setdefault(op, {})
                parts[part] = (done, total)
                self.ctx.progress(op, sum(d for d, _ in parts.values()), sum(t for _, t in parts.values()))

    def cancel(self) -> None:
        """Stop the pool at once (an exception, SIGINT or SIGTERM in the caller): no orphaned worker."""
        if self.pool is not None:
            stop_pool(self.pool)
            self.pool = None
        self._close_queue()

    def _close_queue(self) -> None:
        if self.queue is not None:
            self.queue.close()
            self.queue.cancel_join_thread()
            self.queue = None


def _work(ctx, op) -> int:
    """The order pooled catalogues are submitted in (largest first, so the pool's workers end
    together): a GEMM's multiply-adds, times its batch once more. DERIVED from the SigLIP layer's
    seven catalogues, costed one by one: per multiply-add an unbatched GEMM's took 0.5-0.9 ns, an
    attention GEMM's (16 heads) 2.5-5.3 ns (its grids also split the heads, and each detailed
    program has a block per head), so by multiply-adds alone the two longest (the attention
    GEMMs, 1.6 s and 3.3 s of 12.7 s) went last and one worker ran on alone for two seconds."""
    g = GemmShape.of(ctx.graph, op, ctx.target)
    return g.batch * g.batch * g.M * g.N * g.K


def cache_key(ctx, cache, op_key: str) -> dict:
    """The plan cache's key of a GEMM catalogue: its planning problem (``canon.op_key``), the target,
    the frontier bound, the candidate kinds and the parameter storage option."""
    return cache.full_key(op_key, canon.target_key(ctx.target),
                          {"frontier_bound": ctx.frontier_bound, "kinds": CATALOGUE_KINDS, "weights": ctx.weights})


def cached_catalogue(ctx, cache, key: dict, op) -> tuple[list[Candidate], list[RunnerUp]] | None:
    """``op``'s catalogue from the plan cache (kept candidates, runner-ups), re-targeted to its names;
    None when the cache has none, or one that does not fit ``op`` (then with the cache's one warning).

    The entry's types are the codec's to check (``cachecodec.CATALOGUE``); what is checked here is
    that its names are the reading op's: as many as ``canon.op_names`` gives it (the renaming maps
    them position by position), and every op a candidate names (its own, the op whose output it
    writes, the ops it does the work of) one of them, so renamed it is an op of this graph. Anything
    else would send the planner after a name the graph does not have."""
    got = cache.load(key, cachecodec.CATALOGUE, ctx.target.tiles)
    if got is None:
        return None
    names, new = got["names"], canon.op_names(ctx.graph, op)
    if len(names) != len(new):
        return cache.reject(key, f"it names {len(names)} ops and tensors, the op {op.name!r} has {len(new)}", True)
    rn = canon.renaming(names, ctx.graph, op)
    ops = {o.name for o in ctx.graph.ops}
    stored = set(names)
    for c in got["kept"] + [r.candidate for r in got["lost"]]:
        for name in (c.op, c.fused, *c.through):
            if name is not None and (name not in stored or rn.op(name) not in ops):
                return cache.reject(key, f"a candidate names {name[:80]!r}, not an op of {op.name!r}'s neighbourhood", True)
    return ([canon.retarget(c, rn, op.name, False) for c in got["kept"]],
            [canon.retarget_runner_up(r, rn, op.name) for r in got["lost"]])


def _store(cache, key: dict, ctx, op, kept: list[Candidate], lost: list[RunnerUp]) -> None:
    cache.store(key, {"names": canon.op_names(ctx.graph, op), "kept": [_compact(c) for c in kept],
                      "lost": [_compact_runner_up(r) for r in lost]})


def warm(graphs: list[tuple], cache) -> int:
    """Cost, in one pool, every catalogue of ``graphs`` (``(ctx, its GEMM ops)`` pairs) that ``cache``
    lacks (one per planning problem), and store them; returns how many. Two graphs planned one after the other
    (the two QKV forms, ``plan.plan``) then read all their catalogues from the cache: the second
    graph's own GEMMs (the fused QKV GEMM) are costed beside the first graph's instead of after
    them, in one pool instead of two, largest first. What each graph reads is what costing it
    gives (the cache's own guarantee). Needs ``jobs > 1`` and a big target, as ``Catalogues``."""
    todo, seen = [], set()
    for ctx, ops in graphs:
        for op in ops:
            key = cache_key(ctx, cache, canon.op_key(ctx.graph, ctx.storage, op))
            text = json.dumps(key, sort_keys=True)
            if text in seen:
                continue
            seen.add(text)
            if not cache.has(key):            # (a damaged entry is left for its reader to warn about)
                todo.append((ctx, op, key))
    ctx0 = graphs[0][0]
    if len(todo) < 2 or ctx0.jobs < 2 or ctx0.target.tiles < POOL_MIN_TILES:
        return 0
    todo.sort(key=lambda t: -_work(t[0], t[1]))         # largest first, as Catalogues
    pool = worker_pool(min(ctx0.jobs, len(todo)))
    try:
        split = split_kinds(len(todo), min(ctx0.jobs, len(todo)))
        futures = [(ctx, op, key, submit(pool, ctx, op, split)) for ctx, op, key in todo]
        for ctx, op, key, parts in futures:
            kept, lost = collected(op, parts)
            _store(cache, key, ctx, op, kept, lost)
    except BaseException:
        stop_pool(pool)
        raise
    pool.shutdown()
    return len(todo)


def _compact(cand: Candidate) -> Candidate:
    """A candidate as the plan cache keeps it: without its fragment program (``program_of``
    rebuilds it from the grid choice)."""
    return dataclasses.replace(cand, program=None)


def _compact_runner_up(r: RunnerUp) -> RunnerUp:
    return RunnerUp(_compact(r.candidate), r.why)


def _catalogue(ctx, op: MatMul, which: list[Kind], part: int) -> tuple[list[Candidate], list[RunnerUp], list[str]]:
    """Part ``part`` of a GEMM's catalogue, its ``which`` kinds (``kind_candidates``), in a pool worker:
    in-process, returned without programs."""
    ctx.jobs = 1
    if _PROGRESS_QUEUE is not None:
        ctx.progress = functools.partial(_queued_progress, part)
    kept, lost, errors = kind_candidates(ctx, op, which)
    return [_compact(c) for c in kept], [_compact_runner_up(r) for r in lost], errors


def submit(pool, ctx, op: MatMul, split: bool) -> list:
    """``op``'s catalogue in ``pool``: one task, or with ``split`` one per kind (``kinds``); the futures,
    in kind order.

    Design decision: with fewer catalogues than twice the workers (``split_kinds``) each is split by
    kind, so the workers end together however unequal the GEMMs are: a SigLIP b4 MLP's up
    projection (bias, GeLU and FP8 cast in its epilogue kinds) took 2.5 times its down projection,
    and one worker ran on alone for most of the plan. With more, whole catalogues balance the
    workers already, and splitting would cost more: a kind's cores are built again in the worker
    that costs it (the SigLIP layer's eight catalogues: about 5 s more CPU, 45 s against 39-40 s, and no faster)."""
    if not split:
        return [pool.submit(_catalogue, ctx, op, kinds(ctx, op), 0)]
    return [pool.submit(_catalogue, ctx, op, [k], part) for part, k in enumerate(kinds(ctx, op))]


def split_kinds(catalogues: int, workers: int) -> bool:
    """Whether a pool of ``workers`` costs ``catalogues`` catalogues kind by kind (``submit``)."""
    return catalogues < 2 * workers


def collected(op: MatMul, futures: list, wait=None) -> tuple[list[Candidate], list[RunnerUp]]:
    """The catalogue ``submit`` started: every part's candidates and runner-ups, in kind order (the
    catalogue costed at once: ``kind_candidates``), or the first part's error when none has a
    candidate. ``wait``: how to wait for a future (default ``Future.result``)."""
    kept, lost, errors = [], [], []
    for f in futures:
        k, r, e = wait(f) if wait is not None else f.result()
        kept += k
        lost += r
        errors += e
    _some_kept(op, kept, errors)
    return kept, lost


def program_of(ctx, cand: Candidate):
    """A candidate's fragment program: a GEMM's rebuilt when it came back from a pool worker (or the
    cache, or another op's catalogue) without it; a re-targeted candidate's renamed from its
    template (``canon.retarget``, ``Candidate.renamed_program``). Rebuilt programs are kept in the
    context by what they depend on (op key, op, grid choice, boundary layouts)."""
    if cand.program is not None:
        return cand.program
    if cand.template is not None:
        return cand.renamed_program
    if cand.choice is None:
        return None
    # GEMMs with one planning problem and one grid choice (a tower's projections) build the
    # program once; the others rename it.
    g = ctx.graph
    op = g.op(cand.op)
    memo = ctx.__dict__.setdefault("_fragments", {})
    key = (canon.op_key(g, ctx.storage, op), cand.choice, cand.boundary)
    hit = memo.get(key)
    if hit is None:
        prog = fragment(ctx, op, GemmShape.of(g, op, ctx.target), cand.choice, cand.boundary)
        hit = memo[key] = (op, prog, {op.name: prog})
    src, prog, by_op = hit
    own = by_op.get(op.name)
    if own is None:
        own = by_op[op.name] = canon.rename_program(prog, canon.Renaming(canon.op_names(g, src),
                                                                         canon.op_names(g, op)))
    return own
