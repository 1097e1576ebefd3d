"""GEMM candidates: boundary layouts x private grids, coarse costing, program building.

A MatMul ``C = A @ B`` is seen as ``batch`` GEMMs ``C_b[M, N] = A_b[M, K] @ B_b[K, N]``
(batch dims of A fold into M when B is 2-D). A candidate fixes:

- the boundary layouts: A's input layout, C's output layout (B is a parameter in
  its resident storage, or an activation in an activation layout);
- the private grid ``(gb, gm, gn, gk)``: batch groups x row blocks x column blocks
  x K blocks, ``gb*gm*gn*gk <= tiles``; tile ``tile_of[b, i, j, l]`` computes
  ``A[i, l] @ B[l, j]`` for the batch elements of group b;
- the tile order (which grid axis varies fastest over physical tiles):
  ``bijl`` (K partners adjacent), ``bilj`` (tiles that share an A block adjacent,
  so A multicasts land on complete tile pairs: paired exchange), ``bjli`` (the
  same for B);
- the reduction when ``gk > 1``: ``gather`` (tile l = 0 reduces the whole block)
  or ``rows`` (the block's rows scattered over the gk partners, each reducing one
  piece), and the partials type (the output type, or FP32 for FP16 inputs).

Preparation (A and B to their grid blocks, one exchange), AMP compute,
reduction (exchange + compute) and the final conversion of C to its boundary
layout are one fragment program (``estimate.program``), costed as one.
A grid whose per-tile operands exceed tile memory is rejected before anything
is built (``coarse_rows`` marks it infeasible).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from ..errors import TileplanError
from ..graph.core import Graph, MatMul
from ..graph.dtypes import DType
from ..kernels import dispatch
from ..kernels.calls import MatMulCall, ReduceCall
from ..layout.gemm_grid import Grid, aligned_bounds, balanced_bounds
from ..estimate.program import Buffer, ComputeStep, Copy, ExchangeStep, Operand, Program, Vertex

ORDERS = ("bijl", "bilj", "bjli")
REDUCTIONS = ("gather", "rows")


@dataclass(frozen=True)
class GemmShape:
    """What the planner needs to know of one MatMul."""

    op: str
    a: str
    b: str
    c: str
    batch: int
    M: int
    N: int
    K: int
    a_batched: bool
    b_batched: bool
    in_dtype: DType
    out_dtype: DType
    a_scale: int
    b_scale: int
    c_scale: int
    a_param: bool
    b_param: bool
    transpose_a: bool
    transpose_b: bool
    grain: int

    @classmethod
    def of(cls, graph: Graph, op: MatMul, target) -> "GemmShape":
        ta, tb = graph.inputs_of(op)
        tc = graph.output_of(op)
        a_shape, b_shape = op.operand_shapes([ta, tb])
        a_param, b_param = ta.role.value == "parameter", tb.role.value == "parameter"
        if op.transpose_a and not a_param:
            raise TileplanError(f"op {op.name!r} (matmul): transposing the activation operand {ta.name!r} "
                                "is not supported; transpose it in the model or make it a parameter")
        if op.transpose_b and not b_param:
            raise TileplanError(f"op {op.name!r} (matmul): transposing the activation operand {tb.name!r} "
                                "is not supported; transpose it in the model or make it a parameter")
        batch_a = math.prod(a_shape[:-2])
        batch_b = math.prod(b_shape[:-2])
        if not target.supports(ta.dtype):
            raise TileplanError(f"op {op.name!r} (matmul): target {target.name!r} has no {ta.dtype} AMP")
        if batch_b == 1:
            # B is one matrix: every batch dimension of A folds into M.
            return cls(op.name, ta.name, tb.name, tc.name, 1, batch_a * a_shape[-2], b_shape[-1], a_shape[-1],
                       False, False, ta.dtype, tc.dtype, ta.scale, tb.scale, tc.scale, a_param, b_param,
                       op.transpose_a, op.transpose_b, target.grain(ta.dtype))
        batch = math.prod(tc.shape[:-2])
        if batch_a not in (1, batch) or batch_b != batch:
            raise TileplanError(f"op {op.name!r} (matmul): batch broadcasting of {list(ta.shape)} with "
                                f"{list(tb.shape)} beyond a shared or a missing batch is not supported")
        return cls(op.name, ta.name, tb.name, tc.name, batch, a_shape[-2], b_shape[-1], a_shape[-1],
                   batch_a > 1, True, ta.dtype, tc.dtype, ta.scale, tb.scale, tc.scale, a_param, b_param,
                   op.transpose_a, op.transpose_b, target.grain(ta.dtype))

    @property
    def a2(self) -> tuple[int, int]:
        return ((self.batch if self.a_batched else 1) * self.M, self.K)

    @property
    def b2(self) -> tuple[int, int]:
        return ((self.batch if self.b_batched else 1) * self.K, self.N)

    @property
    def c2(self) -> tuple[int, int]:
        return (self.batch * self.M, self.N)

    @property
    def panels(self) -> bool:
        """B is read as AMP panels: a resident parameter whose columns fill whole panels."""
        return self.b_param and self.N % self.grain == 0

    def partial_types(self) -> tuple[DType, ...]:
        return (self.out_dtype, DType.FP32) if self.in_dtype is DType.FP16 and self.out_dtype is DType.FP16 \
            else (self.out_dtype,)


@dataclass(frozen=True)
class GemmChoice:
    """The private implementation of one GEMM candidate."""

    gb: int
    gm: int
    gn: int
    gk: int
    order: str = "bijl"
    reduction: str = "none"          # "none" (gk == 1), "gather" or "rows"
    partials: DType = DType.FP16

    @property
    def tiles_used(self) -> int:
        return self.gb * self.gm * self.gn * self.gk

    def __str__(self) -> str:
        red = "" if self.reduction == "none" else f" {self.reduction}"
        b = f"{self.gb}x" if self.gb > 1 else ""
        return f"grid {b}{self.gm}x{self.gn}x{self.gk} {self.order}{red} {self.partials}"


def k_unit(g: GemmShape) -> int:
    """K blocks start on 64-bit boundaries of A's rows (the AMP loads A rows 64 bits at a time)."""
    return 8 // g.in_dtype.itemsize if g.in_dtype.itemsize < 8 else 1


def tile_of(choice: GemmChoice) -> np.ndarray:
    """int64 [gb, gm, gn, gk]: the physical tile of each grid cell under the choice's order."""
    dims = {"b": choice.gb, "i": choice.gm, "j": choice.gn, "l": choice.gk}
    order = choice.order
    t = np.arange(choice.tiles_used, dtype=np.int64).reshape([dims[a] for a in order])
    return t.transpose([order.index(a) for a in "bijl"])


# ---- enumeration and coarse costing (vectorised over grids) ---------------------------


def grid_options(g: GemmShape, tiles: int) -> np.ndarray:
    """int64 [n, 4]: every (gb, gm, gn, gk) with product <= tiles and non-empty blocks.

    Columns are split in whole panels when B is read as panels; K blocks hold at
    least 8 elements (an AMP input group) unless K itself is smaller.
    """
    max_n = g.N // g.grain if g.panels else g.N
    max_k = max(1, -(-g.K // max(8, k_unit(g))))
    gbs = [d for d in range(1, min(g.batch, tiles) + 1)]
    rows = []
    for gb in gbs:
        for gk in range(1, min(max_k, tiles // gb) + 1):
            for gm in range(1, min(g.M, tiles // (gb * gk)) + 1):
                top = min(max_n, tiles // (gb * gk * gm))
                gn = np.arange(1, top + 1, dtype=np.int64)
                rows.append(np.stack([np.full_like(gn, gb), np.full_like(gn, gm), gn, np.full_like(gn, gk)], 1))
    out = np.concatenate(rows) if rows else np.zeros((0, 4), dtype=np.int64)
    # Keep grids that use at least a quarter of the tiles, or the largest ones for small GEMMs.
    used = out.prod(1)
    keep = used >= min(tiles // 4, int(used.max()) if len(used) else 0)
    return out[keep]


@dataclass(frozen=True, eq=False)
class CoarseRows:
    """Coarse figures, one row per (grid, order, reduction, partials) option."""

    grid: np.ndarray        # int64 [n, 4]
    order: np.ndarray       # int64 index into ORDERS
    reduction: np.ndarray   # int64: 0 none, 1 gather, 2 rows
    partials: np.ndarray    # int64 index into g.partial_types()
    cycles: np.ndarray      # int64
    memory: np.ndarray      # int64 worst tile bytes (conservative)
    interleaved: np.ndarray # int64 bytes of AMP weight operands per tile
    fits: np.ndarray        # bool

    def choice(self, g: GemmShape, i: int) -> GemmChoice:
        gb, gm, gn, gk = (int(x) for x in self.grid[i])
        red = ("none", "gather", "rows")[int(self.reduction[i])]
        return GemmChoice(gb, gm, gn, gk, ORDERS[int(self.order[i])], red, g.partial_types()[int(self.partials[i])])


def coarse_rows(g: GemmShape, target, in_bytes_per_tile: int, out_bytes_per_tile: int) -> CoarseRows:
    """Every option of one boundary combination, costed at once (numpy, one row per option).

    Exchange: bytes each tile receives (A block + B block; partials; the C block
    to its boundary layout) over the exchange rate, the paired rate for the
    operand an order multicasts to adjacent tiles; the matmul kernel dispatch
    picks (AMP, or the vector-unit fallback) on the largest block and on the
    last K block, whichever is slower; one sync per exchange phase. Memory (conservative): boundary pieces plus
    every operand, partial and result block alive at once.
    """
    grids = grid_options(g, target.tiles)
    n_ptypes = len(g.partial_types())
    gk = grids[:, 3]
    rows = []
    for r in (0, 1, 2):
        sel = (gk == 1) if r == 0 else (gk > 1)
        for o in range(len(ORDERS)):
            for p in range(n_ptypes):
                if r == 0 and g.partial_types()[p] is not g.out_dtype:
                    continue
                idx = np.flatnonzero(sel)
                rows.append((idx, o, r, p))
    grid = np.concatenate([grids[i] for i, *_ in rows]) if rows else np.zeros((0, 4), np.int64)
    order = np.concatenate([np.full(len(i), o) for i, o, _, _ in rows]).astype(np.int64)
    red = np.concatenate([np.full(len(i), r) for i, _, r, _ in rows]).astype(np.int64)
    ptype = np.concatenate([np.full(len(i), p) for i, _, _, p in rows]).astype(np.int64)
    gb, gm, gn, gkk = grid.T
    per_group = np.ceil(g.batch / gb).astype(np.int64)
    m = -(-g.M // gm)
    n = (-(-(g.N // g.grain) // gn) * g.grain) if g.panels else -(-g.N // gn)
    n = np.minimum(n, g.N)
    unit = k_unit(g)
    k = -(-(-(-g.K // unit)) // gkk) * unit
    ia = g.in_dtype.itemsize
    pbytes = np.array([t.itemsize for t in g.partial_types()])[ptype]
    ob = g.out_dtype.itemsize
    a_blk = m * k * ia * (per_group if g.a_batched else 1)
    b_blk = k * n * ia * (per_group if g.b_batched else 1)
    c_blk = m * n * ob * per_group
    p_blk = m * n * pbytes * per_group
    bw, pbw = target.exchange_bytes_per_cycle, target.paired_bytes_per_cycle
    a_rate = np.where((order == 1) & (gn % 2 == 0), pbw, bw)
    b_rate = np.where((order == 2) & (gm % 2 == 0), pbw, bw)
    prep = -(-a_blk // a_rate) + -(-b_blk // b_rate)
    # The kernel dispatch picks for the largest block and for the last K block (its tail may not
    # fill the AMP's 64-bit loads and fall back to the vector unit); the slower one sets the step.
    units = -(-g.K // unit)
    k_last = g.K - (units - units // np.minimum(gkk, units)) * unit
    partials = np.where(gkk > 1, ptype, g.partial_types().index(g.out_dtype))
    amp = np.maximum(matmul_block_cycles(g, target, m, n, k, partials),
                     matmul_block_cycles(g, target, m, n, k_last, partials)) * per_group
    has_red = red > 0
    piece = np.where(red == 2, -(-m // gkk), m)
    red_recv = np.where(has_red, (gkk - 1) * piece * n * pbytes * per_group, 0)
    red_cyc = np.where(has_red, 282 + 6 * -(-(piece * n) // 48) * (11 + 2 * (gkk - 1)) * per_group, 0)
    out_recv = np.where(has_red, piece * n * ob * per_group, c_blk)
    syncs = target.sync_cycles * (2 + has_red.astype(np.int64))
    cycles = prep + amp + -(-red_recv // bw) + red_cyc + -(-out_recv // bw) + syncs
    reducer_in = np.where(red == 1, gkk * p_blk, np.where(red == 2, gkk * piece * n * pbytes * per_group, 0))
    memory = in_bytes_per_tile + out_bytes_per_tile + a_blk + b_blk + np.where(has_red, p_blk + reducer_in, c_blk)
    inter = b_blk
    fits = (memory <= target.usable_bytes) & (inter <= target.interleaved_bytes)
    return CoarseRows(grid, order, red, ptype, cycles.astype(np.int64), memory.astype(np.int64),
                      inter.astype(np.int64), fits)


def matmul_block_cycles(g: GemmShape, target, m, n, k, partials) -> np.ndarray:
    """Per row, the cycles of the matmul kernel dispatch picks for an ``m x k @ k x n`` block with
    partials ``g.partial_types()[partials]``: the detailed estimate's own kernel, evaluated once per
    distinct block shape."""
    m, n, k, partials = (np.asarray(x, dtype=np.int64) for x in np.broadcast_arrays(m, n, k, partials))
    key = (((m << 20 | n) << 20 | k) << 2) | partials          # block sides < 2**20, partials types < 4
    shapes, inverse = np.unique(key, return_inverse=True)
    ptypes = g.partial_types()
    fmt, grain = ("panels", g.grain) if g.panels else ("rows", 0)
    cache = _BLOCK_CACHE.setdefault((target, g.in_dtype, ptypes, fmt, grain), {})
    mask = (1 << 20) - 1
    cycles = np.empty(shapes.size, dtype=np.int64)
    for i, s in enumerate(shapes.tolist()):
        c = cache.get(s)
        if c is None:
            call = MatMulCall(s >> 42, s >> 22 & mask, s >> 2 & mask, g.in_dtype, ptypes[s & 3], "interleaved",
                              fmt, 0, grain)
            c = cache[s] = _kernel(call, target)[1]
        cycles[i] = c
    return cycles[inverse.reshape(-1)]


# ---- the fragment program of one candidate -----------------------------------------------


def _batch_groups(batch: int, gb: int) -> np.ndarray:
    return np.repeat(np.arange(gb), np.diff(balanced_bounds(batch, gb)))


def build_program(g: GemmShape, choice: GemmChoice, a_buf: Buffer, b_buf: Buffer, c_buf: Buffer,
                  target) -> Program:
    """The fragment program: prep exchange, AMP compute, reduction, output conversion.

    ``a_buf``/``b_buf`` are the operands' boundary (or resident) buffers and
    ``c_buf`` the result's boundary buffer; their layouts are the candidate's.
    """
    prog = Program()
    for b in (a_buf, b_buf, c_buf):
        prog.add_buffer(b)
    T = tile_of(choice)
    gb, gm, gn, gk = choice.gb, choice.gm, choice.gn, choice.gk
    group = _batch_groups(g.batch, gb)
    mb = balanced_bounds(g.M, gm)
    kb = aligned_bounds(g.K, gk, k_unit(g))
    nb = aligned_bounds(g.N, gn, g.grain) if g.panels else balanced_bounds(g.N, gn)
    batch_a = g.batch if g.a_batched else 1
    batch_b = g.batch if g.b_batched else 1
    name = g.op

    # A grid: blocks (a-batch, i) x l, replicated over j (and over batch groups when A is shared).
    a_rows = np.concatenate([b * g.M + mb[:-1] for b in range(batch_a)] + [[batch_a * g.M]])
    if g.a_batched:
        a_hold = np.stack([T[group[b], :, :, :].transpose(0, 2, 1) for b in range(g.batch)])  # [b, i, l, j]
        a_hold = a_hold.reshape(batch_a * gm, gk, gn)
    else:
        a_hold = T.transpose(1, 3, 0, 2).reshape(gm, gk, gb * gn)
    a_grid = Grid.of(a_rows, kb, a_hold)
    # B grid: blocks (b-batch, l) x j, replicated over i (and over groups when B is shared).
    b_rows = np.concatenate([b * g.K + kb[:-1] for b in range(batch_b)] + [[batch_b * g.K]])
    if g.b_batched:
        b_hold = np.stack([T[group[b], :, :, :].transpose(2, 1, 0) for b in range(g.batch)])  # [b, l, j, i]
        b_hold = b_hold.reshape(batch_b * gk, gn, gm)
    else:
        b_hold = T.transpose(3, 2, 0, 1).reshape(gk, gn, gb * gm)
    b_grid = Grid.of(b_rows, nb, b_hold, grain=g.grain if g.panels else 0)
    A = prog.add_buffer(Buffer(f"{name}.A", a_grid, g.a2, g.in_dtype, scale=g.a_scale))
    B = prog.add_buffer(Buffer(f"{name}.B", b_grid, g.b2, g.in_dtype, region="interleaved", scale=g.b_scale))
    prog.steps.append(ExchangeStep(f"{name}.prep", (Copy(a_buf.name, A.name), Copy(b_buf.name, B.name))))

    # Result pieces: (b, i, p) row pieces x j, p over the reducing partners.
    pieces = gk if choice.reduction == "rows" else 1
    piece_b = [balanced_bounds(int(mb[i + 1] - mb[i]), pieces) for i in range(gm)]   # local to block i
    c_rows = [b * g.M + mb[i] + piece_b[i][p] for b in range(g.batch) for i in range(gm) for p in range(pieces)]
    c_rows = np.asarray(c_rows + [g.batch * g.M])
    c_hold = np.stack([T[group[b], i, :, p] for b in range(g.batch) for i in range(gm) for p in range(pieces)])
    c_grid = Grid.of(c_rows, nb, c_hold)
    Cg = prog.add_buffer(Buffer(f"{name}.C", c_grid, g.c2, g.out_dtype, scale=g.c_scale))

    ptype = choice.partials
    a_off = a_grid.block_offsets(g.in_dtype.itemsize)
    b_off = b_grid.block_offsets(g.in_dtype.itemsize)
    out_scale_total = g.a_scale + g.b_scale
    vertices = []
    if gk > 1:
        # Partials: logical rows ordered (b, i, p, l) so a reducer's parts are adjacent.
        heights = np.array([piece_b[i][p + 1] - piece_b[i][p] for b in range(g.batch) for i in range(gm)
                            for p in range(pieces) for _ in range(gk)])
        p_rows = np.concatenate(([0], np.cumsum(heights)))
        prod_hold = np.stack([T[group[b], i, :, l] for b in range(g.batch) for i in range(gm)
                              for p in range(pieces) for l in range(gk)])
        red_hold = np.stack([T[group[b], i, :, p] for b in range(g.batch) for i in range(gm)
                             for p in range(pieces) for l in range(gk)])
        p_shape = (int(p_rows[-1]), g.N)
        p_prod = Grid.of(p_rows, nb, prod_hold)
        p_prod = Grid(p_prod.row_bounds, p_prod.col_bounds, p_prod.holders, 1, 0, ptype.itemsize)
        p_red = Grid.of(p_rows, nb, red_hold)
        p_red = Grid(p_red.row_bounds, p_red.col_bounds, p_red.holders, 1, 0, ptype.itemsize)
        P = prog.add_buffer(Buffer(f"{name}.P", p_prod, p_shape, ptype))
        R = prog.add_buffer(Buffer(f"{name}.Pr", p_red, p_shape, ptype))
        out_grid, out_buf = p_prod, P
    else:
        out_grid, out_buf = c_grid, Cg

    out_off = out_grid.block_offsets(out_buf.dtype.itemsize)
    for b in range(g.batch):
        ab = b if g.a_batched else 0
        bb = b if g.b_batched else 0
        for i in range(gm):
            m = int(mb[i + 1] - mb[i])
            for j in range(gn):
                n = int(nb[j + 1] - nb[j])
                for l in range(gk):
                    k = int(kb[l + 1] - kb[l])
                    t = int(T[group[b], i, j, l])
                    a_r = a_hold[ab * gm + i, l] if g.a_batched else a_hold[i, l]
                    ai = int(np.flatnonzero(a_r == t)[0])
                    b_r = b_hold[bb * gk + l, j]
                    bi = int(np.flatnonzero(b_r == t)[0])
                    a_o = int(a_off[ab * gm + i, l, ai])
                    b_o = int(b_off[bb * gk + l, j, bi])
                    if gk > 1:
                        row_blk = ((b * gm + i) * pieces) * gk + l      # piece 0 of this (b, i, l)
                        o_o = int(out_off[row_blk, j, 0])
                        scale = out_scale_total
                        ptype_v = ptype
                    else:
                        o_o = int(out_off[b * gm + i, j, 0])
                        scale = out_scale_total - g.c_scale
                        ptype_v = g.out_dtype
                    call = MatMulCall(m, n, k, g.in_dtype, ptype_v, "interleaved",
                                      "panels" if g.panels else "rows", scale, g.grain if g.panels else 0)
                    vertices.append(_vertex(t, call, (Operand(A.name, a_o, m * k), Operand(B.name, b_o, k * n)),
                                            (Operand(out_buf.name, o_o, m * n),), target))
    prog.steps.append(ComputeStep(f"{name}.amp", tuple(vertices)))

    if gk > 1:
        prog.steps.append(ExchangeStep(f"{name}.reduce.exchange", (Copy(P.name, R.name),)))
        r_off = p_red.block_offsets(ptype.itemsize)
        c_off = c_grid.block_offsets(g.out_dtype.itemsize)
        red = []
        for b in range(g.batch):
            for i in range(gm):
                for p in range(pieces):
                    h = int(piece_b[i][p + 1] - piece_b[i][p])
                    if h == 0:
                        continue
                    for j in range(gn):
                        n = int(nb[j + 1] - nb[j])
                        t = int(T[group[b], i, j, p])
                        blk = ((b * gm + i) * pieces + p) * gk
                        call = ReduceCall(h * n, gk, ptype, g.out_dtype, -g.c_scale)
                        c_blk = (b * gm + i) * pieces + p
                        red.append(_vertex(t, call, (Operand(R.name, int(r_off[blk, j, 0]), gk * h * n),),
                                           (Operand(Cg.name, int(c_off[c_blk, j, 0]), h * n),), target))
        prog.steps.append(ComputeStep(f"{name}.reduce", tuple(red)))

    prog.steps.append(ExchangeStep(f"{name}.out", (Copy(Cg.name, c_buf.name),)))
    return prog


_DISPATCH_CACHE: dict = {}
_BLOCK_CACHE: dict = {}      # (target, in_dtype, partial types, B format, grain) -> packed block shape -> cycles


def _kernel(call, target) -> tuple[str, int]:
    """(variant name, cycles) of the kernel dispatch picks for ``call``, cached."""
    key = (call, target)
    hit = _DISPATCH_CACHE.get(key)
    if hit is None:
        v = dispatch(call, target)
        hit = _DISPATCH_CACHE[key] = (v.name, v.cycles(call, target))
    return hit


def _vertex(tile, call, ins, outs, target) -> Vertex:
    name, cycles = _kernel(call, target)
    return Vertex(tile, call, ins, outs, name, cycles)
