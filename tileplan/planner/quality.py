"""Plan-quality figures shared by the tests and ``tileplan bench``.

- ``spearman``: rank correlation (ties share their average rank).
- ``detailed_survivors``: per GEMM of a plan, every candidate that reached the
  detailed estimate (kept or a runner-up).
- ``coarse_ranking``: per GEMM, the Spearman correlation of the coarse compute
  cycles with the detailed cycles over those survivors (the ones costed with the
  default weight storage, which the coarse model assumes).
- ``amp_floor``: per GEMM, the matmul step of its fastest grid option that fits
  tile memory, alone (no exchange, no reduction): what no plan under the cycle
  model can beat, beside the roofline bound that assumes a perfect AMP.
- ``model_floor``: a lower bound on any plan of a graph in the candidate space
  (matmul, operand exchange and reduction per GEMM grid; elementwise kernels on
  a balanced share): a target below it cannot be met by better search.
- ``search_gap``: the bounded DP's cycles against the optimum of the same
  ``select.Problem`` (the exhaustive oracle, or the unbounded DP when the
  product of choices is too large to enumerate, or CP-SAT's proved optimum when
  even the unbounded DP is out of reach).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..estimate.coarse import amp_cycles, k_unit
from ..kernels import BinaryCall, ReduceCall, dispatch
from ..kernels.cycles import reduce_cycles
from .gemm import a_copies
from .select import Problem, solve_dp, solve_exhaustive


def ranks(x) -> np.ndarray:
    """Ranks from 0, ties sharing their average rank."""
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="stable")
    r = np.empty(x.size)
    r[order] = np.arange(x.size)
    _, group = np.unique(x, return_inverse=True)
    return (np.bincount(group, r) / np.bincount(group))[group]


def spearman(a, b) -> float:
    ra, rb = ranks(a), ranks(b)
    if np.ptp(ra) == 0 or np.ptp(rb) == 0:
        return 1.0 if np.ptp(ra) == np.ptp(rb) else 0.0
    return float(np.corrcoef(ra, rb)[0, 1])


def detailed_survivors(plan, default_storage: bool = False) -> dict[str, list]:
    """Per GEMM: every candidate that reached the detailed estimate (kept or not); with
    ``default_storage`` only those costed with the weights in their default storage (not one a
    plan re-costed with its weights kept in its grid)."""
    out = {}
    for op, cands in plan.candidates.items():
        if cands and cands[0].choice is not None:
            out[op] = [c for c in cands + [r.candidate for r in plan.runner_ups.get(op, [])]
                       if c.detailed and not (default_storage and c.weights is not None)]
    return out


def coarse_ranking(plan, min_distinct: int = 3) -> dict[str, dict]:
    """Per GEMM: ``spearman`` of coarse compute cycles against detailed cycles over its detailed
    survivors (None when fewer than ``min_distinct`` distinct implementations: nothing to rank),
    and how many survivors there were."""
    out = {}
    for op, cands in detailed_survivors(plan, default_storage=True).items():
        distinct = len({c.desc for c in cands})
        rho = (spearman([c.coarse.compute for c in cands], [c.estimate.cycles for c in cands])
               if distinct >= min_distinct else None)
        out[op] = {"spearman": rho, "survivors": len(cands), "distinct": distinct}
    return out


def combinations(problem: Problem) -> int:
    return math.prod(len(problem.choices[op]) for op in problem.ops)


# Past this many choice combinations the exact (unbounded) DP keeps too many paths to finish (the
# small encoder layer has 1.5e20: 1,024 paths take 160 s); CP-SAT then proves the optimum.
MAX_EXACT_DP = 10**9


def search_gap(problem: Problem, paths: int = 16, max_combinations: int = 2_000_000,
               cpsat_seconds: float = 60.0) -> dict:
    """The bounded DP (``paths``) against the optimum: ``solve_exhaustive`` when the product of
    choices is at most ``max_combinations``, the unbounded (exact) DP up to ``MAX_EXACT_DP``, past
    that CP-SAT's solution when it proves it optimal within ``cpsat_seconds`` (else no optimum:
    ``gap`` None and the method says so). ``gap`` is bounded / optimum - 1 (None when nothing
    fits or no optimum is known)."""
    from .cpsat import solve_cpsat
    n = combinations(problem)
    bounded = solve_dp(problem, paths=paths)
    if n <= max_combinations:
        optimum, method = solve_exhaustive(problem), "exhaustive"
    elif n <= MAX_EXACT_DP:
        optimum, method = solve_dp(problem, paths=None), "exact dp (unbounded paths)"
    else:
        optimum, method = solve_cpsat(problem, time_limit=cpsat_seconds), "cp-sat (proved optimal)"
        if optimum is not None and not optimum.exact:
            optimum, method = None, f"cp-sat (not proved optimal in {cpsat_seconds:g} s)"
    gap = None
    if bounded is not None and optimum is not None:
        gap = bounded.cycles / optimum.cycles - 1 if optimum.cycles else 0.0
    return {"paths": paths, "combinations": n, "optimum_method": method,
            "bounded_cycles": bounded.cycles if bounded is not None else None,
            "optimum_cycles": optimum.cycles if optimum is not None else None,
            "gap": gap}


def fitting_rows(shape, target):
    """The coarse option rows of a GEMM (``planner.gemm.coarse_rows``) that fit tile memory with no
    boundary pieces: every option the planner could detail for some boundary combination (boundary
    pieces only add memory). None when none fits."""
    import dataclasses
    from .gemm import coarse_rows
    rows = coarse_rows(shape, target, 0, 0)
    fit = np.flatnonzero(rows.fits)
    if not fit.size:
        return None
    return dataclasses.replace(rows, **{f.name: getattr(rows, f.name)[fit] for f in dataclasses.fields(rows)
                                        if isinstance(getattr(rows, f.name), np.ndarray)})


def amp_floor(plan) -> dict[str, dict]:
    """Per GEMM: the fewest matmul-step cycles of any grid option (every order, reduction and
    serial K split) whose blocks fit tile memory with no boundary pieces, and that option."""
    from ..graph.core import MatMul
    from .gemm import GemmShape
    out = {}
    for op in plan.graph.ops:
        if not isinstance(op, MatMul):
            continue
        shape = GemmShape.of(plan.graph, op, plan.target)
        rows = fitting_rows(shape, plan.target)
        if rows is None:
            continue
        amp = amp_cycles(shape, plan.target, rows.grid, rows.partials, rows.sk)
        best = int(np.argmin(amp))
        out[op.name] = {"cycles": int(amp[best]), "choice": str(rows.choice(shape, best))}
    return out


# ---- the model floor: a lower bound on any plan in the candidate space --------------------------


def _kernel_floor(call_of, n: int, target, span: int) -> int:
    """The fewest cycles of the dispatched kernel on ``n' >= n`` elements (``call_of(n')``): some
    tile holds at least ``n`` of them, and formulas with a tail path can fall when ``n`` grows to
    whole blocks, so every ``n' < n + span`` (``span`` a multiple of every block) is tried."""
    def cycles(x):
        call = call_of(x)
        return dispatch(call, target).cycles(call, target)
    return min(cycles(x) for x in range(n, n + span))


def gemm_floor(shape, target, grid, partials, held: tuple = (1, 1), epilogue=None) -> np.ndarray:
    """Per grid option (``grid`` [n, 4] of (gb, gm, gn, gk); ``partials`` index into
    ``shape.partial_types()``), a lower bound on the cycles of any candidate with that grid, whatever
    its boundaries, tile order, reduction ownership or serial splits of K or N, and whether or not it
    fits tile memory:

    - the matmul step at once (``estimate.coarse.amp_cycles`` with ``sk = 1``: serial steps only add
      kernel setups and round more K and N groups up);
    - the operand exchange: A is needed on ``gn`` tiles per element (``gb * gn`` when a shared A
      meets a batched B) and B on ``gm``; a boundary layout holds each element ``held`` times (1 but
      for replicated storage), so the grid's tiles receive at least ``(copies - held) * bytes`` of
      each (``held``: per operand, a count or one per grid option). A tile takes at most 8 B/cycle
      (a receive pair), and at most one of its two operands
      arrives paired: a partner sharing its A block (same ``i, l``) computes another column block,
      so needs another B block, and the other way round. Per tile that is ``(a + b)/8 +
      min(a, b)/8``; the slowest tile takes at least the mean over the grid's tiles, and ``min(a, b)``
      is at least the smaller of the smallest blocks less what the tile holds;
    - with ``gk > 1``, the reduction: ``(gk - 1)`` partials of every output element leave their
      tile (one may stay on its reducer), each sent once by a tile's 4 B/cycle lane or, paired,
      by two lanes at once (at most ``min(tiles, 2 * used)`` lanes), and a reduction of ``gk``
      addends (``kernels.cycles.reduce_cycles``) on at least ``ceil(M * N / tiles)`` elements;
    - a sync per exchange phase: the preparation's and the reduction's.
    Transfer control cycles, on-tile copies and the output exchange are left out (all >= 0).

    With ``epilogue`` (a ``gemm.Epilogue``) the bound is of the candidates whose reducers also do
    it: the reduction kernel is the fused one (``epilogue_reduce_floor``), and a grid without a
    reduction (``gk == 1``), which cannot, has no such candidate (its bound is huge).
    """
    grid, partials = np.asarray(grid, dtype=np.int64), np.asarray(partials, dtype=np.int64)
    gb, gm, gn, gk = grid.T
    used = gb * gm * gn * gk
    amp = amp_cycles(shape, target, grid, partials, np.ones(len(grid), dtype=np.int64))
    ia = shape.in_dtype.itemsize
    a_bytes, b_bytes = math.prod(shape.a2) * ia, math.prod(shape.b2) * ia
    shared = shape.batch > 1
    copies_a = a_copies(shape, grid)
    copies_b = gm * (gb if shared and not shape.b_batched else 1)
    recv = np.maximum(copies_a - held[0], 0) * a_bytes + np.maximum(copies_b - held[1], 0) * b_bytes
    per_group = shape.batch // gb
    k_min = np.maximum(shape.K // gk - k_unit(shape), 0)
    min_a = (per_group if shape.a_batched else 1) * (shape.M // gm) * k_min * ia
    min_b = (per_group if shape.b_batched else 1) * k_min * (shape.N // gn) * ia
    lone = np.maximum(used * np.minimum(min_a, min_b) - held[0] * a_bytes - held[1] * b_bytes, 0)
    prep = (recv + lone) // (target.paired_bytes_per_cycle * used)
    outputs = shape.batch * shape.M * shape.N
    types = shape.partial_types()
    pbytes = np.array([t.itemsize for t in types])[partials]
    lanes = np.minimum(target.tiles, 2 * used)
    red_ex = (gk - 1) * outputs * pbytes // (target.exchange_bytes_per_cycle * lanes)
    per_tile = -(-outputs // target.tiles)
    pairs, inverse = np.unique(np.stack([gk, partials], 1), axis=0, return_inverse=True)
    red = np.array([(reduce_cycles(ReduceCall(n=per_tile, parts=int(p), in_dtype=types[int(t)],
                                              out_dtype=shape.out_dtype), target) if epilogue is None
                     else epilogue_reduce_floor(per_tile, int(p), types[int(t)], shape.out_dtype, epilogue, target))
                    if p > 1 else 0 for p, t in pairs], dtype=np.int64)[inverse.reshape(-1)]
    # (the preparation's sync only where it must move something: both operands held, it is empty)
    bound = amp + prep + np.where(gk > 1, red_ex + red + target.sync_cycles, 0) + \
        np.where(recv + lone > 0, target.sync_cycles, 0)
    return bound if epilogue is None else np.where(gk > 1, bound, np.iinfo(np.int64).max // 4)


def epilogue_reduce_floor(n: int, parts: int, in_dtype, out_dtype, epilogue, target) -> int:
    """The least cycles of a fused reducer (``planner.epilogue``) on at least ``n`` elements: with a
    GeLU, ``kernels.cycles.reduce_gelu_floor`` (over every block shape); a cast alone, the
    reduction-with-cast formula at ``n`` (it grows with ``n``, as the plain one)."""
    from ..kernels.cycles import reduce_gelu_floor
    f = epilogue.fields()
    if epilogue.gelu:
        return reduce_gelu_floor(n, parts, in_dtype, f["cast_to"], target)
    return reduce_cycles(ReduceCall(n=n, parts=parts, in_dtype=in_dtype, out_dtype=out_dtype, **f), target)


def gemm_op_floor(graph, op, target, storage, fused_adds) -> dict:
    """A GEMM's share: the least ``gemm_floor`` over every grid option and partials type (memory
    ignored, so it holds for serial K and N splits alike)."""
    from .gemm import GemmShape, _grid_options
    shape = GemmShape.of(graph, op, target)
    grids = _grid_options(shape, target.tiles)
    held = _held(graph, op, target, storage, shape, grids)
    best = None
    for p, ptype in enumerate(shape.partial_types()):
        floors = gemm_floor(shape, target, grids, np.full(len(grids), p), held)
        i = int(np.argmin(floors))
        if best is None or floors[i] < best[0]:
            gb, gm, gn, gk = (int(x) for x in grids[i])
            best = (int(floors[i]), f"grid {f'{gb}x' if gb > 1 else ''}{gm}x{gn}x{gk} {ptype}")
    return {"cycles": best[0], "grid": best[1]}


def _held(graph, op, target, storage, shape, grids) -> tuple:
    """``gemm_floor``'s ``held`` of a MatMul's (A, B) per grid option: the tiles that hold each operand
    already. A pinned (Explicit) layout may hold replicas: no credit for what it holds then. A B that
    may be pre-arranged (``catalogue.prearrangeable``) is held wherever any grid reads it: no B
    exchange; an A another GEMM may write grid-aligned (``catalogue.aligned_producer``) on the grids
    whose A layouts may be offered so (``catalogue.ALIGNED_MAX_REPLICAS`` copies of each block)."""
    from . import elementwise as ew
    from .catalogue import ALIGNED_MAX_REPLICAS, aligned_producer, prearrangeable
    ctx = _Storage(graph, storage, target)
    pre = prearrangeable(ctx, op)
    a, b = (target.tiles if t.layout is not None or (t.name in storage and storage[t.name].layout
            == ew.replicated(t.shape, target.tiles)) or (k == 1 and pre) else 1
            for k, t in enumerate(graph.inputs_of(op)))
    if aligned_producer(ctx, op.inputs[0]) is not None:
        return np.where(a_copies(shape, grids) <= ALIGNED_MAX_REPLICAS, target.tiles, a), b
    return a, b


class _Storage:
    """What ``catalogue.prearrangeable`` and ``catalogue.aligned_producer`` read of a planning context:
    the graph, the storage, the target and the parameter storage option (``graph.weights``)."""

    def __init__(self, graph, storage, target):
        self.graph, self.storage, self.target, self.weights = graph, storage, target, graph.weights or "planner"


POINTWISE_SPAN = 96       # a multiple of every pointwise kernel's block (GeLU 96, casts 48 and 12,
                          # unary loops 6 x 1, 2 or 4, the Add's 24 and 12)


def pointwise_op_floor(graph, op, target, storage, fused_adds) -> dict:
    """A pointwise op's share: its kernel on ``ceil(size / tiles)`` elements (a binary op as its
    dense form, a fused bias-GeLU pass costs at least its GeLU loop), or nothing when it may fuse
    (a bias Add into its GEMM's reduction, or with its GeLU)."""
    from ..graph.core import Binary
    from . import elementwise as ew
    out = graph.output_of(op)
    share = -(-out.size // target.tiles)
    if isinstance(op, Binary):
        if op.name in fused_adds or ew.fusable_gelu(graph, op) is not None:
            return {"cycles": 0}
        call_of = lambda n: BinaryCall(1, n, out.dtype, "dense", op.kind)   # noqa: E731
    else:
        call_of = lambda n: ew.pointwise_call(graph, op, n)                  # noqa: E731
    own = _kernel_floor(call_of, share, target, POINTWISE_SPAN)
    fused = _bias_gelu_floor(graph, op, target, share, own)
    return {"cycles": own if fused is None else fused}


def _bias_gelu_floor(graph, op, target, share: int, own: int) -> int | None:
    """A GeLU a bias Add may fuse with (its Add's share is 0): at most its own kernel, at most the
    fused bias-GeLU pass (any variant: the aligned path is faster than the GeLU alone), both on a
    single row of ``n' >= share`` elements (the least of every ``rows x cols`` shape of the
    formulas); and when its Cast to FP8 may join the pass (``fusable_cast``; the Cast's share is
    then 0), at most that plus the Cast's share, or the FP8-output pass. A Cast that joins one gets
    0; None for any other op."""
    from ..graph.core import Cast, GeLU
    from ..graph.dtypes import DType
    from ..kernels import BiasGeLUCall
    from . import elementwise as ew
    producer = graph.producers.get(graph.inputs_of(op)[0].name)
    if isinstance(op, Cast):
        if isinstance(producer, GeLU) and _gelu_joins_bias(graph, producer) and ew.fusable_cast(graph, producer) is op:
            return 0
        return None
    if not isinstance(op, GeLU) or not _gelu_joins_bias(graph, op):
        return None
    dt = graph.output_of(op).dtype
    fused = _kernel_floor(lambda n: BiasGeLUCall(1, n, dt, op.approximate, aligned=True), share, target,
                          POINTWISE_SPAN)
    best = min(own, fused)
    cast = ew.fusable_cast(graph, op)
    if cast is None:
        return best
    scale = graph.output_of(cast).scale
    cast_share = _kernel_floor(lambda n: ew.pointwise_call(graph, cast, n), share, target, POINTWISE_SPAN)
    fp8 = _kernel_floor(lambda n: BiasGeLUCall(1, n, dt, op.approximate, DType.FP8, scale, aligned=True), share,
                        target, POINTWISE_SPAN)
    return min(best + cast_share, fp8)


def _gelu_joins_bias(graph, gelu) -> bool:
    """The GeLU's input comes from a bias Add that may fuse with it (``elementwise.fusable_gelu``)."""
    from . import elementwise as ew
    add = graph.producers.get(graph.inputs_of(gelu)[0].name)
    return add is not None and ew.fusable_gelu(graph, add) is gelu


def view_op_floor(graph, op, target, storage, fused_adds) -> dict:
    """A View's share: nothing (where the layout survives it, it moves nothing)."""
    return {"cycles": 0}


def transpose_op_floor(graph, op, target, storage, fused_adds) -> dict:
    """A Transpose's share: its on-tile kernel on a balanced share of the elements (the local copy
    of a row permutation, or the 2-D transpose); the exchange counts zero, as conversions do."""
    from ..kernels import CopyCall, TransposeCall
    out = graph.output_of(op)
    share = -(-out.size // target.tiles)
    if op.perm[-1] == len(op.perm) - 1:
        call = CopyCall(share * out.dtype.itemsize)
    else:
        call = TransposeCall(1, share, out.dtype)
    return {"cycles": dispatch(call, target).cycles(call, target)}


def gather_op_floor(graph, op, target, storage, fused_adds) -> dict:
    """A Gather's share: its kernel on the candidate's fullest column block (the only candidate
    space there is: ``planner.gather``)."""
    from ..kernels.gather import GatherCall
    from .gather import column_bounds
    table, idx = graph.inputs_of(op)
    bounds = column_bounds(table.shape[1], table.dtype.itemsize, target.tiles)
    width = max(b - a for a, b in zip(bounds, bounds[1:]))
    call = GatherCall(idx.size, width, table.shape[0], table.dtype)
    return {"cycles": dispatch(call, target).cycles(call, target)}


def rowwise_op_floor(graph, op, target, storage, fused_adds) -> dict:
    """A row-wise op's share: its kernels on the fullest tile, whole or split rows
    (``rowwise.floor_cycles``); a LayerNorm a residual Add may fuse into at most the fused pass less
    the Add's share (the pair costs at least the fused pass)."""
    from .rowwise import floor_cycles, fusable_producer
    cycles = floor_cycles(graph, op, target)
    add = fusable_producer(graph, storage, op)
    if add is not None:
        rest = floor_cycles(graph, op, target, fused=True) - pointwise_op_floor(graph, add, target, storage,
                                                                                 fused_adds)["cycles"]
        cycles = min(cycles, max(0, rest))
    return {"cycles": cycles}


FLOORS = {"Rowwise": rowwise_op_floor, "Gemm": gemm_op_floor, "Pointwise": pointwise_op_floor,     # family name -> its share
          "View": view_op_floor, "Transpose": transpose_op_floor, "Gather": gather_op_floor}


_FLOOR_MEMO: dict[tuple, dict] = {}     # (family, canon.op_key, target key, fused, weights) -> an op's share
_FLOOR_MEMO_SIZE = 4096


def model_floor(graph, target, weights: str | None = None) -> dict:
    """A lower bound on the cycles of any plan of ``graph`` on ``target`` in tileplan's candidate
    space, under the same machine model and kernel formulas (no planning needed): per op its
    family's share (``FLOORS``: ``gemm_op_floor``, ``pointwise_op_floor``); conversions between ops
    count zero.

    ``cycles`` is the sum. A target under it is out of reach without a wider candidate space or
    faster kernel formulas. The graph is the planner's (``rewrite.canonical``: a transposed
    activation read through its Transpose, and so on), so the floor bounds what is planned.

    An op's share depends on its planning problem only (``canon.op_key``: its neighbourhood's
    structure and parameter storage, not names or values) and on whether its bias Add fuses, so
    it is computed once per distinct problem and remembered across calls: a tower's 27 layers
    cost one, and the plan's, the bench's and ``tileplan show``'s floors one between them.

    ``weights`` (``planner.storage.resolve_weights``: None is the model file's, else ``"planner"``):
    with ``"compact"`` no B is pre-arranged, so none is credited as held."""
    from . import canon
    from . import elementwise as ew
    from .families import family_of
    from .storage import parameter_storage, resolve_weights
    from .rewrite import canonical
    weights = resolve_weights(graph, weights)
    graph = dataclasses.replace(canonical(graph), weights=weights)
    storage = parameter_storage(graph, target)
    fused_adds = {found[0].name for op in graph.ops if (found := ew.fusable_bias(graph, op)) is not None}
    tkey = canon.target_key(target)
    ops = {}
    for op in graph.ops:
        fam = family_of(op).name
        key = (fam, canon.op_key(graph, storage, op), tkey, op.name in fused_adds, weights, _joins(graph, op))
        share = _FLOOR_MEMO.get(key)
        if share is None:
            share = FLOORS[fam](graph, op, target, storage, fused_adds)
            while _FLOOR_MEMO and len(_FLOOR_MEMO) >= _FLOOR_MEMO_SIZE:
                _FLOOR_MEMO.pop(next(iter(_FLOOR_MEMO)))      # the oldest first
            if _FLOOR_MEMO_SIZE:
                _FLOOR_MEMO[key] = share
        ops[op.name] = dict(share)
    _epilogue_shares(graph, target, storage, ops, tkey)
    return {"ops": ops, "cycles": sum(v["cycles"] for v in ops.values())}


def _joins(graph, op) -> bool:
    """Whether the op may join a fused pass started before it (a GeLU after a fusable bias Add, the
    FP8 Cast after such a GeLU): its share depends on it, and its ``op_key`` does not say."""
    from ..graph.core import GeLU
    from . import elementwise as ew
    if isinstance(op, GeLU):
        return _gelu_joins_bias(graph, op)
    producer = graph.producers.get(graph.inputs_of(op)[0].name) if op.inputs else None
    return isinstance(producer, GeLU) and _gelu_joins_bias(graph, producer) and ew.fusable_cast(graph, producer) is op


def gemm_epilogue_floor(graph, op, target, storage, chain) -> int:
    """The least ``gemm_floor`` of a GEMM's candidates whose reducers do its epilogue ``chain``."""
    from .gemm import GemmShape, _grid_options
    shape = GemmShape.of(graph, op, target)
    grids = _grid_options(shape, target.tiles)
    held = _held(graph, op, target, storage, shape, grids)
    return min(int(gemm_floor(shape, target, grids, np.full(len(grids), p), held, chain.epilogue).min())
               for p in range(len(shape.partial_types())))


def _epilogue_shares(graph, target, storage, ops: dict, tkey) -> None:
    """A GEMM whose reducers may do an epilogue chain (``planner.epilogue``): its share becomes the
    lesser of its own plus the chain ops' shares (the chain done apart) and the least floor of its
    fused candidates (``gemm_epilogue_floor``); the chain ops then count 0 (their work is in it).

    Design decision: the GEMM's share bounds the GEMM together with its chain, whether the plan
    fuses the chain into the reducers (the chain ops cost 0 there) or does it apart (a bias-GeLU
    pass has cycles of its own), so it is compared with the cycles of the whole group, never with
    the GEMM's alone; ``group`` names the ops it covers, the GEMM first, for the reports."""
    from . import canon
    from .epilogue import gemm_chain
    from . import elementwise as ew
    for op in graph.ops:
        chain = gemm_chain(graph, op)
        if chain is None or (chain.bias is not None and storage.get(chain.bias) is not None
                             and storage[chain.bias].layout != ew.replicated(graph.tensors[chain.bias].shape,
                                                                             target.tiles)):
            continue
        absorbed = sum(ops[o.name]["cycles"] for o in chain.ops)
        key = ("epilogue", canon.op_key(graph, storage, op), tkey, graph.weights)   # a tower's layers: one each
        fused = _FLOOR_MEMO.get(key)
        if fused is None:
            fused = gemm_epilogue_floor(graph, op, target, storage, chain)
            if _FLOOR_MEMO_SIZE:
                _FLOOR_MEMO[key] = fused
        ops[op.name] = {**ops[op.name], "cycles": min(ops[op.name]["cycles"] + absorbed, fused),
                        "absorbed": absorbed, "fused": fused, "group": [op.name, *(o.name for o in chain.ops)]}
        for o in chain.ops:
            ops[o.name] = {**ops[o.name], "cycles": 0}


# ---- cycles by family -----------------------------------------------------------------------

def family_label(graph, op) -> str:
    """The bench's grouping of an op: projection GEMMs (a parameter operand), attention GEMMs (two
    activations), softmax, norms, reductions, pointwise, rearrangements (views and transposes)."""
    from ..graph.core import LayerNorm, Role, Softmax
    from .families import family_of
    fam = family_of(op).name
    if fam == "Gemm":
        params = any(t.role is Role.PARAMETER for t in graph.inputs_of(op))
        return "projection GEMMs" if params else "attention GEMMs"
    if fam == "Rowwise":
        return "softmax" if isinstance(op, Softmax) else "norms" if isinstance(op, LayerNorm) else "reductions"
    return {"Pointwise": "pointwise", "View": "rearrangements", "Transpose": "rearrangements"}[fam]


def cycles_by_family(plan) -> dict[str, int]:
    """Per family label, the cycles of the ops' chosen candidates (detailed estimates) and, as
    ``conversions``, of the conversions selection inserted. Their sum can exceed the whole-graph
    estimate by the syncs that grouping independent exchanges saves."""
    out: dict[str, int] = {}
    for node in plan.mid.nodes:
        label = "conversions" if node.kind == "conversion" else family_label(plan.graph, plan.graph.op(node.op))
        out[label] = out.get(label, 0) + int(node.estimate.cycles)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))
