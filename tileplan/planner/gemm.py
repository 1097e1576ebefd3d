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
  piece), and the partials type (the output type, or FP32 for FP16 inputs);
- with ``gk > 1``, whether the reducers also add the bias row of a following
  bias Add (``GemmChoice.bias``): each reducer reads the bias slice of its column
  block from the bias's replicated storage as one more addend of its FP32 sum, and
  the fragment writes the Add's output; the Add is absorbed (``catalogue``).

Preparation (A and B to their grid blocks, one exchange), AMP compute,
reduction (exchange + compute) and the final conversion of C to its boundary
layout are one fragment program (``tileplan.program``), costed as one.
A grid whose per-tile operands exceed tile memory is rejected before anything
is built (``coarse_rows`` marks it infeasible).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import numpy as np

from ..errors import TileplanError
from ..graph.core import Graph, MatMul
from ..graph.dtypes import DType
from ..kernels.calls import MatMulCall, ReduceCall
from ..layout.gemm_grid import Grid, aligned_bounds, balanced_bounds
from ..layout.owner_map import expand_ranges
from ..layout.panels import panel_count, panels_fit
from ..estimate.caches import Caches, shared as shared_caches
from ..estimate.coarse import (CoarseParts, amp_cycles, coarse_parts, cut_cycles, k_unit, reduction_bias_cycles,
                              reduction_epilogue_cycles)
from ..program import Buffer, ComputeStep, Copy, ExchangeStep, Operand, Operands, Program, Vertex

from ..graph.pins import ORDERS  # noqa: E402  ("bijl", "bilj", "bjli")


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
        """B is read as AMP panels: a resident parameter stored as ``PackedPanels`` (at least one
        whole panel, rows without a sub-word tail; the last panel may be partial)."""
        return self.b_param and panels_fit(self.N, self.grain, self.in_dtype.itemsize)

    def partial_types(self) -> tuple[DType, ...]:
        return (self.out_dtype, DType.FP32) if self.in_dtype is DType.FP16 and self.out_dtype is DType.FP16 \
            else (self.out_dtype,)


@dataclass(frozen=True)
class Epilogue:
    """What a GEMM's reducers do after the sum and the bias (``planner.epilogue``): a GeLU
    (``gelu``: its form; needs the bias) and a Cast to FP8 with the scale ``cast_scale``
    (``cast``); the kernel's ``ReduceCall`` fields of the same names."""

    gelu: str = ""
    cast: bool = False
    cast_scale: int = 0

    def __str__(self) -> str:
        parts = ([f"GeLU ({self.gelu})"] if self.gelu else []) + (["cast to fp8"] if self.cast else [])
        return " and ".join(parts)

    def fields(self) -> dict:
        """The ``ReduceCall`` epilogue fields."""
        return {"gelu": self.gelu, "cast_to": DType.FP8 if self.cast else None,
                "cast_scale": self.cast_scale if self.cast else 0}


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
    sk: int = 1                      # serial K steps: each tile walks its K range in sk chunks
    bias: bool = False               # the reducers add the following bias Add's row (gk > 1 only)
    epilogue: Epilogue | None = None # the reducers also do the following GeLU and/or Cast (gk > 1 only)

    def __post_init__(self):
        if self.bias and self.gk == 1:
            raise ValueError(f"{self}: a bias in the reduction needs a reduction (gk > 1)")
        if self.epilogue is not None and (self.gk == 1 or (self.epilogue.gelu and not self.bias)):
            raise ValueError(f"{self}: an epilogue needs a reduction (gk > 1), a GeLU one the bias too")

    @property
    def tiles_used(self) -> int:
        return self.gb * self.gm * self.gn * self.gk

    def __str__(self) -> str:
        red = "" if self.reduction == "none" else f" {self.reduction}"
        b = f"{self.gb}x" if self.gb > 1 else ""
        serial = f" serial-K {self.sk}" if self.sk > 1 else ""
        bias = ", bias fused into the reduction" if self.bias else ""
        epi = f", {self.epilogue} in the reduction" if self.epilogue is not None else ""
        return f"grid {b}{self.gm}x{self.gn}x{self.gk} {self.order}{red}{serial} {self.partials}{bias}{epi}"


def tile_of(choice: GemmChoice) -> np.ndarray:
    """int64 [gb, gm, gn, gk]: the physical tile of each grid cell under the choice's order."""
    dims = {"b": choice.gb, "i": choice.gm, "j": choice.gn, "l": choice.gk}
    order = choice.order
    t = np.arange(choice.tiles_used, dtype=np.int64).reshape([dims[a] for a in order])
    return t.transpose([order.index(a) for a in "bijl"])


# ---- enumeration and coarse costing (vectorised over grids) ---------------------------


def grid_options(g: GemmShape, tiles: int) -> np.ndarray:
    """int64 [n, 4]: every (gb, gm, gn, gk) with product <= tiles and non-empty blocks.

    Columns are split in whole panels when B is read as panels (the last column block
    ends in the matrix's partial panel, if any); K blocks hold at least 8 elements (an
    AMP input group) unless K itself is smaller.
    """
    max_n = panel_count(g.N, g.grain) if g.panels else g.N
    max_k = max(1, -(-g.K // max(8, k_unit(g))))
    gb, gk, gm = (a.reshape(-1) for a in np.meshgrid(np.arange(1, min(g.batch, tiles) + 1),
                                                     np.arange(1, min(max_k, tiles) + 1),
                                                     np.arange(1, min(g.M, tiles) + 1), indexing="ij"))
    ok = gb * gk * gm <= tiles
    gb, gk, gm = gb[ok], gk[ok], gm[ok]
    top = np.minimum(max_n, tiles // (gb * gk * gm))            # gn = 1 .. top for each (gb, gk, gm)
    gn = expand_ranges(np.ones(top.size, dtype=np.int64), top)
    out = np.stack([np.repeat(gb, top), np.repeat(gm, top), gn, np.repeat(gk, top)], 1).astype(np.int64)
    out = out[np.lexsort((out[:, 2], out[:, 1], out[:, 3], out[:, 0]))]     # (gb, gk, gm, gn) order
    # Keep grids that use at least a quarter of the tiles, or the largest ones for small GEMMs.
    used = out.prod(1)
    keep = used >= min(tiles // 4, int(used.max()) if len(used) else 0)
    return out[keep]


SERIAL_K = (2, 3, 4, 6, 8, 12, 16)     # serial K steps tried for grids whose blocks do not fit


# Every boundary combination of a GEMM enumerates the same grids, and their matmul cycles do not
# depend on the boundaries: both are computed once per GEMM shape (and serial K step).
@functools.lru_cache(maxsize=16)
def _grid_options(g: GemmShape, tiles: int) -> np.ndarray:
    out = grid_options(g, tiles)
    out.flags.writeable = False
    return out


@functools.lru_cache(maxsize=64)
def _grid_amp(g: GemmShape, target, sk: int) -> np.ndarray:
    """int64 [partials type, grid]: the matmul step's cycles of every grid option (``amp_cycles``)."""
    grids = _grid_options(g, target.tiles)
    out = np.stack([amp_cycles(g, target, grids, np.full(len(grids), p), sk)
                    for p in range(len(g.partial_types()))])
    out.flags.writeable = False
    return out


@dataclass(frozen=True, eq=False)
class CoarseRows:
    """Coarse figures, one row per (grid, order, reduction, partials, serial K) option."""

    grid: np.ndarray        # int64 [n, 4]
    order: np.ndarray       # int64 index into ORDERS
    reduction: np.ndarray   # int64: 0 none, 1 gather, 2 rows
    partials: np.ndarray    # int64 index into g.partial_types()
    sk: np.ndarray          # int64 serial K steps
    cycles: np.ndarray      # int64
    memory: np.ndarray      # int64 worst tile bytes (conservative)
    interleaved: np.ndarray # int64 bytes of AMP weight operands per tile
    fits: np.ndarray        # bool
    bias: bool = False      # every row adds the bias in its reduction (GemmChoice.bias)
    pre: bool = False       # every row reads B pre-arranged (``prearranged_b``)
    epilogue: Epilogue | None = None   # every row's reducers do this epilogue (GemmChoice.epilogue)

    def choice(self, g: GemmShape, i: int) -> GemmChoice:
        gb, gm, gn, gk = (int(x) for x in self.grid[i])
        red = ("none", "gather", "rows")[int(self.reduction[i])]
        return GemmChoice(gb, gm, gn, gk, ORDERS[int(self.order[i])], red, g.partial_types()[int(self.partials[i])],
                          int(self.sk[i]), self.bias, self.epilogue)


def coarse_rows(g: GemmShape, target, in_bytes_per_tile: int, out_bytes_per_tile: int,
                a_cut_density: float = 0.0, table: "CoarseTable | None" = None, bias: bool = False,
                pre: bool = False, epilogue: Epilogue | None = None, held_a: tuple | None = None) -> CoarseRows:
    """Every option of one boundary combination, costed at once (numpy, one row per option).

    Exchange: bytes each tile receives (A block + B block; partials; the C block
    to its boundary layout) over the exchange rate, the paired rate for the
    operand an order multicasts to adjacent tiles; the matmul kernel dispatch
    picks (AMP, or the vector-unit fallback) on the largest block and on the
    last K block, whichever is slower; one sync per exchange phase. Memory
    (conservative): boundary pieces plus every operand, partial and result block
    alive at once. Options that do not fit are tried again with serial K splits
    (``SERIAL_K``): 1/sk of the operand blocks at a time, sk exchanges and sk
    AMP calls, the later ones accumulating into the partials in place.

    The boundary-free part of every row is the GEMM's ``coarse_table``, shared by its
    boundary combinations (``table``: one built for at least these boundary bytes). With ``bias``
    the rows are the options whose reducers also add the bias (``gk > 1`` only); with ``pre`` the
    options that read B pre-arranged (``prearranged_b``: no B exchange; with serial K every chunk's
    B block resident). With ``held_a`` (``(gb, gm, gn, gk)`` and an ``ORDERS`` index) the boundary
    holds A as that grid and order read it (``a_grid``: a grid-aligned boundary): only that grid's
    options without serial K, without the cycles that bring A's blocks (its preparation copy moves
    nothing).
    """
    io = in_bytes_per_tile + out_bytes_per_tile
    t = table if table is not None else coarse_table(g, target, io, bias, pre, epilogue)
    if (t.bias, t.pre, t.epilogue) != (bias, pre, epilogue):
        raise ValueError(f"coarse table built with bias={t.bias}, pre={t.pre}, epilogue={t.epilogue}, asked for "
                         f"bias={bias}, pre={pre}, epilogue={epilogue}")
    if io > t.retry_bytes:
        raise ValueError(f"coarse table built for {t.retry_bytes} boundary bytes, asked for {io}")
    memory = t.memory + io
    fits = (memory <= target.usable_bytes) & (t.interleaved <= target.interleaved_bytes)
    # A serial K row stays when the option it splits does not fit at once with these boundaries.
    keep = t.parent < 0
    retried = np.flatnonzero(~keep)
    keep[retried] = ~fits[t.parent[retried]]
    if held_a is not None:
        keep &= (t.sk == 1) & (t.grid == np.asarray(held_a[0])).all(axis=1) & (t.order == held_a[1])
    # Every row kept (no serial K row's parent fits): views of the table, not copies of its columns.
    sel = slice(None) if keep.all() else np.flatnonzero(keep)
    cycles = t.cycles[sel]
    if held_a is not None:
        cycles = cycles - t.a_prep[sel]
    elif a_cut_density:
        cycles = cycles + cut_cycles(target, t.parts(sel), t.sk[sel], a_cut_density)
    return CoarseRows(t.grid[sel], t.order[sel], t.reduction[sel], t.partials[sel], t.sk[sel], cycles,
                      memory[sel], t.interleaved[sel], fits[sel], t.bias, t.pre, t.epilogue)


@dataclass(frozen=True, eq=False)
class CoarseTable:
    """Every option of a GEMM without its boundaries: the serial K rows of the options that do not
    fit with ``retry_bytes`` of boundary pieces on a tile (``parent``: the option a row splits, -1
    for an option at once), their boundary-free cycles and memory (``estimate.coarse.coarse_parts``).
    With ``bias`` only options with a reduction, each adding the bias in it. With ``pre`` the options
    that read B pre-arranged (``prearranged_b``): B's preparation moves nothing, and with serial K
    every chunk's B block stays resident."""

    retry_bytes: int
    grid: np.ndarray
    order: np.ndarray
    reduction: np.ndarray
    partials: np.ndarray
    sk: np.ndarray
    parent: np.ndarray
    cycles: np.ndarray
    memory: np.ndarray
    interleaved: np.ndarray
    cut_runs: np.ndarray
    k: np.ndarray
    b_prep: np.ndarray
    a_prep: np.ndarray
    bias: bool = False
    pre: bool = False
    epilogue: Epilogue | None = None

    def parts(self, sel: np.ndarray) -> CoarseParts:
        return CoarseParts(self.cycles[sel], self.memory[sel], self.interleaved[sel], self.cut_runs[sel],
                           self.k[sel], self.b_prep[sel], self.a_prep[sel])


@functools.lru_cache(maxsize=16)
def coarse_table(g: GemmShape, target, retry_bytes: int, bias: bool = False, pre: bool = False,
                 epilogue: Epilogue | None = None) -> CoarseTable:
    # Each kind is made from the table of the kinds below it, so the pre-arranged tables share the
    # compact ones' rows (a fused kind's reducer pricing, the costly part, is done once per GEMM).
    if pre:
        return _pre_rows(coarse_table(g, target, retry_bytes, bias, False, epilogue), g)
    if epilogue is not None:
        return _epilogue_rows(coarse_table(g, target, retry_bytes, bias), g, target, epilogue)
    if bias:
        return _bias_rows(coarse_table(g, target, retry_bytes), g, target)
    grids = _grid_options(g, target.tiles)
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
    gidx = np.concatenate([i for i, *_ in rows]) if rows else np.zeros(0, np.int64)
    order = np.concatenate([np.full(len(i), o) for i, o, _, _ in rows]).astype(np.int64)
    red = np.concatenate([np.full(len(i), r) for i, _, r, _ in rows]).astype(np.int64)
    ptype = np.concatenate([np.full(len(i), p) for i, _, _, p in rows]).astype(np.int64)
    sk = np.ones(len(grid), dtype=np.int64)
    parts = coarse_parts(g, target, grid, order, red, ptype, sk, _grid_amp(g, target, 1)[ptype, gidx])
    fits = (parts.memory + retry_bytes <= target.usable_bytes) & (parts.interleaved <= target.interleaved_bytes)
    # Serial K splits for the options that may not fit at once (one batch element per tile).
    units = -(-g.K // k_unit(g))
    retry = np.flatnonzero(~fits & (grid[:, 0] == g.batch))
    extra = [(retry[units // (grid[retry, 3] * s) >= 1], s) for s in SERIAL_K]
    extra = [(i, s) for i, s in extra if i.size]
    parent = np.full(len(grid), -1, dtype=np.int64)
    if extra:
        idx = np.concatenate([i for i, _ in extra])
        sk2 = np.concatenate([np.full(i.size, s, dtype=np.int64) for i, s in extra])
        amp2 = np.concatenate([_grid_amp(g, target, s)[ptype[i], gidx[i]] for i, s in extra])
        p2 = coarse_parts(g, target, grid[idx], order[idx], red[idx], ptype[idx], sk2, amp2)
        grid, order, red, ptype = (np.concatenate((a, a[idx])) for a in (grid, order, red, ptype))
        sk, parent = np.concatenate((sk, sk2)), np.concatenate((parent, idx))
        parts = CoarseParts(*(np.concatenate((a, b)) for a, b in zip(parts, p2)))
    return _frozen(CoarseTable(retry_bytes, grid, order, red, ptype, sk, parent, *parts))


def _frozen(t: CoarseTable) -> CoarseTable:
    """The table with read-only columns: it is cached, and its boundary combinations' rows are views of it."""
    for f in dataclasses.fields(t):
        v = getattr(t, f.name)
        if isinstance(v, np.ndarray):
            v.flags.writeable = False
    return t


def _pre_rows(t: CoarseTable, g: GemmShape) -> CoarseTable:
    """The pre-arranged table from the compact one of its kind (plain, bias, epilogue; ``prearranged_b``),
    row for row: without the cycles
    that bring B's blocks, and with every serial K chunk's B block resident at once (``sk`` of
    them; the one in use is counted already). Which options need serial K does not change: at
    once, the B block is the same bytes either way."""
    extra = t.interleaved * (t.sk - 1)
    return _frozen(dataclasses.replace(t, cycles=t.cycles - t.b_prep, memory=t.memory + extra,
                                       interleaved=t.interleaved * t.sk, b_prep=np.zeros_like(t.b_prep), pre=True))


def _bias_rows(t: CoarseTable, g: GemmShape, target) -> CoarseTable:
    """The bias-in-reduction table from the plain one: its rows with a reduction (serial K rows
    too, their parents renumbered), each paying the bias's addend (``reduction_bias_cycles``);
    memory, and which options need serial K, do not change (the bias is resident)."""
    sel = np.flatnonzero(t.reduction > 0)
    renumber = np.full(len(t.grid), -1, dtype=np.int64)
    renumber[sel] = np.arange(sel.size)
    parent = np.where(t.parent[sel] >= 0, renumber[np.maximum(t.parent[sel], 0)], -1)
    cycles = t.cycles[sel] + reduction_bias_cycles(g, target, t.grid[sel], t.reduction[sel], t.partials[sel])
    return _frozen(CoarseTable(t.retry_bytes, t.grid[sel], t.order[sel], t.reduction[sel], t.partials[sel],
                               t.sk[sel], parent, cycles, t.memory[sel], t.interleaved[sel], t.cut_runs[sel],
                               t.k[sel], t.b_prep[sel], t.a_prep[sel], bias=True))


def _epilogue_rows(t: CoarseTable, g: GemmShape, target, epilogue: Epilogue) -> CoarseTable:
    """The epilogue table from the table of its bias kind (with or without the bias): its rows with
    a reduction, each paying what the epilogue adds to its reducers (``reduction_epilogue_cycles``);
    memory and serial K as there (the epilogue works in registers)."""
    sel = np.flatnonzero(t.reduction > 0)
    renumber = np.full(len(t.grid), -1, dtype=np.int64)
    renumber[sel] = np.arange(sel.size)
    parent = np.where(t.parent[sel] >= 0, renumber[np.maximum(t.parent[sel], 0)], -1)
    cycles = t.cycles[sel] + reduction_epilogue_cycles(g, target, t.grid[sel], t.reduction[sel], t.partials[sel],
                                                       t.bias, epilogue.fields())
    return _frozen(CoarseTable(t.retry_bytes, t.grid[sel], t.order[sel], t.reduction[sel], t.partials[sel],
                               t.sk[sel], parent, cycles, t.memory[sel], t.interleaved[sel], t.cut_runs[sel],
                               t.k[sel], t.b_prep[sel], t.a_prep[sel], bias=t.bias, epilogue=epilogue))


# ---- the fragment program of one candidate -----------------------------------------------


def _batch_groups(batch: int, gb: int) -> np.ndarray:
    return np.repeat(np.arange(gb), np.diff(balanced_bounds(batch, gb)))


_A, _B, _C = "<A>", "<B>", "<C>"   # placeholders for the boundary buffers in a cached core program


def build_program(g: GemmShape, choice: GemmChoice, a_buf: Buffer, b_buf: Buffer, c_buf: Buffer,
                  target, bias_buf: Buffer | None = None, caches: Caches | None = None) -> Program:
    """The fragment program of one candidate: its boundary buffers around the grid's core.

    The core (grid buffers, vertices, internal exchanges) depends only on the GEMM
    and the choice, not on the boundary layouts, so it is built once and shared by
    every boundary combination (the compute steps are the same objects); ``caches`` (the planning
    context's, default ``estimate.caches.shared(target)``) keeps it.

    With ``choice.bias``, ``bias_buf`` is the bias row's resident buffer (replicated:
    every tile holds the whole row, row-major from offset 0), which the reducers read,
    and ``c_buf`` the bias Add's output.
    """
    if choice.bias != (bias_buf is not None):
        raise ValueError(f"{g.op}: {choice} needs a bias buffer exactly when it adds the bias")
    # Serial K with B pre-arranged: the matmuls read each chunk from the weights' own storage.
    in_place = choice.sk > 1 and b_buf.kind == "parameter" and b_buf.layout == prearranged_b(g, choice)
    if in_place and b_buf.name != g.b:
        raise ValueError(f"{g.op}: pre-arranged weights must be the resident buffer {g.b!r}, got {b_buf.name!r}")
    core, _ = _core(g, choice, caches or shared_caches(target), bias_buf.name if bias_buf is not None else None,
                    in_place)
    names = {_A: a_buf.name, _B: b_buf.name, _C: c_buf.name}
    prog = Program()
    for b in (a_buf, b_buf, c_buf) + ((bias_buf,) if bias_buf is not None else ()):
        prog.add_buffer(b)
    for name, b in core.buffers.items():
        prog.add_buffer(b)
    for step in core.steps:
        if isinstance(step, ExchangeStep) and any(c.src in names or c.dst in names for c in step.copies):
            step = ExchangeStep(step.name, tuple(Copy(names.get(c.src, c.src), names.get(c.dst, c.dst))
                                                 for c in step.copies))
        prog.steps.append(step)
    return prog


def _core(g: GemmShape, choice: GemmChoice, caches: Caches, bias: str | None,
          in_place: bool = False) -> tuple[Program, tuple]:
    """(core program, the (first column, columns) of each reducer vertex's block), kept in ``caches``. A
    choice with the bias in its reduction is its plain choice's core with the reducers also reading
    the bias (``_add_bias``): only the reduction step differs, the rest is shared."""
    def build():
        if choice.bias or choice.epilogue is not None:
            plain, cols = _core(g, dataclasses.replace(choice, bias=False, epilogue=None), caches, None, in_place)
            return _add_bias(g, plain, cols, bias, caches, choice.epilogue), cols
        return _build_core(g, choice, caches, in_place)
    return caches.core((g, choice, bias, in_place), build)


def _add_bias(g: GemmShape, plain: Program, cols: tuple, bias: str | None, caches: Caches,
              epilogue: Epilogue | None = None) -> Program:
    """The core of a choice that adds the bias in its reduction, from its plain choice's core: each
    reducer vertex also reads the bias columns of its block, ``cols[v] = (first column, columns)``,
    from the replicated bias buffer (every tile holds the whole row from offset 0) and adds them
    to every row of its piece (``ReduceCall.bias_cols``). Every other step is the plain one.

    With an ``epilogue`` (``bias`` may then be None) the reducers also do it (``ReduceCall``'s
    epilogue fields); with its cast the reduced buffer holds FP8 (same grid; each block's offset
    placed for the new type), which the output exchange then carries."""
    out = Program(dict(plain.buffers))
    extra = epilogue.fields() if epilogue is not None else {}
    moved = {}                       # (tile, old element offset) -> new offset in the FP8 reduced buffer
    if extra.get("cast_to") is not None:
        old = plain.buffers[f"{g.op}.Cr"]
        new = out.buffers[old.name] = dataclasses.replace(old, dtype=extra["cast_to"], scale=extra["cast_scale"])
        h = old.layout.holder_array()
        held = h >= 0
        moved = dict(zip(zip(h[held].tolist(), old.layout.block_offsets(old.dtype.itemsize)[held].tolist()),
                         new.layout.block_offsets(new.dtype.itemsize)[held].tolist()))
    calls: dict = {}                 # (plain call, bias columns) -> (call, variant, cycles)
    for step in plain.steps:
        if isinstance(step, ComputeStep) and step.name == f"{g.op}.reduce":
            red = []
            for v, (c0, n) in zip(step.vertices, cols, strict=True):
                hit = calls.get((v.call, n))
                if hit is None:
                    call = dataclasses.replace(v.call, bias_cols=n if bias is not None else 0, **extra)
                    hit = calls[(v.call, n)] = (call,) + caches.kernel(call)
                outs = tuple(dataclasses.replace(o, offset=moved[(v.tile, o.offset)]) for o in v.outs) \
                    if moved else v.outs
                ins = v.ins + ((Operand(bias, c0, n),) if bias is not None else ())
                red.append(Vertex(v.tile, hit[0], ins, outs, hit[1], hit[2]))
            step = ComputeStep(step.name, tuple(red))
        out.steps.append(step)
    return out


def _build_core(g: GemmShape, choice: GemmChoice, caches: Caches, in_place: bool = False) -> tuple[Program, tuple]:
    """The fragment program: prep exchange, AMP compute, reduction, output conversion; and the
    (first column, columns) of each reducer vertex's block (empty when ``gk == 1``).

    ``a_buf``/``b_buf`` are the operands' boundary (or resident) buffers and
    ``c_buf`` the result's boundary buffer; their layouts are the candidate's.

    With a serial K split (``sk > 1``) each tile walks its K range in ``sk``
    chunks: per chunk one exchange brings the next A and B blocks and the AMP
    adds the chunk's product into the partials it wrote for the earlier chunks
    (an accumulating matmul, in place). With ``in_place`` (serial K, B pre-arranged: the resident
    buffer ``g.b`` laid out as ``prearranged_b``) the exchanges bring A only and the matmuls read
    each B chunk from the weights' storage.
    """
    target = caches.target
    prog = Program()
    T = tile_of(choice)
    gb, gm, gn, gk, sk = choice.gb, choice.gm, choice.gn, choice.gk, choice.sk
    group = _batch_groups(g.batch, gb)
    mb = balanced_bounds(g.M, gm)
    kb = aligned_bounds(g.K, gk * sk, k_unit(g))           # K block q = l * sk + s
    nkb = len(kb) - 1
    nb = _col_bounds(g, gn)
    batch_b = g.batch if g.b_batched else 1
    name = g.op
    ptype = choice.partials if gk > 1 else g.out_dtype

    # Holders per grid cell, independent of the serial step.
    a_hold = _a_holders(g, choice, T, group)
    b_hold = _b_holders(g, choice, T, group)
    a_rows = _a_rows(g, mb)
    b_rows = _b_rows(g, kb)

    def step_grids(s: int):
        """A and B grids of serial step s: K block l*sk+s of every cell, nothing else held."""
        ah = np.full((a_hold.shape[0], nkb, a_hold.shape[2]), -1, dtype=np.int64)
        ah[:, s::sk] = a_hold
        bh = np.full((batch_b * nkb, gn, b_hold.shape[2]), -1, dtype=np.int64)
        bh.reshape(batch_b, nkb, gn, -1)[:, s::sk] = b_hold.reshape(batch_b, gk, gn, -1)
        return Grid.of(a_rows, kb, ah), _b_grid(g, b_rows, nb, bh), ah, bh

    # Result pieces: (b, i, p) row pieces x j, p over the reducing partners.
    pieces = gk if choice.reduction == "rows" else 1
    piece_b = [balanced_bounds(int(mb[i + 1] - mb[i]), pieces) for i in range(gm)]   # local to block i
    cells = [(b, i, p) for b in range(g.batch) for i in range(gm) for p in range(pieces)]
    c_rows = np.asarray([b * g.M + mb[i] + piece_b[i][p] for b, i, p in cells] + [g.batch * g.M])
    c_hold = np.stack([T[group[b], i, :, p] for b, i, p in cells])
    # The AMP's output: partials rows (b, i, p, l) when K is split over tiles, else the result itself.
    if gk > 1:
        heights = np.array([piece_b[i][p + 1] - piece_b[i][p] for b, i, p in cells for _ in range(gk)])
        out_rows = np.concatenate(([0], np.cumsum(heights)))
        out_hold = np.stack([T[group[b], i, :, l] for b, i, p in cells for l in range(gk)])
        out_shape = (int(out_rows[-1]), g.N)
    else:
        out_rows, out_hold, out_shape = c_rows, c_hold, g.c2
    dense = ptype.itemsize                      # no padding: a tile's pieces form one m x n block
    out_grid = Grid(*_grid_fields(Grid.of(out_rows, nb, out_hold)), align_bytes=dense)
    OUT = prog.add_buffer(Buffer(f"{name}.P" if gk > 1 else f"{name}.C", out_grid, out_shape, ptype,
                                 scale=0 if gk > 1 else g.c_scale))
    out_off = out_grid.block_offsets(ptype.itemsize)
    scale = g.a_scale + g.b_scale - (0 if gk > 1 else g.c_scale)

    stored_off = prearranged_b(g, choice).block_offsets(g.in_dtype.itemsize) if in_place else None
    for s in range(sk):
        a_grid, b_grid, ah, bh = step_grids(s)
        suffix = f"{s}" if sk > 1 else ""
        A = prog.add_buffer(Buffer(f"{name}.A{suffix}", a_grid, g.a2, g.in_dtype, scale=g.a_scale))
        a_off = a_grid.block_offsets(g.in_dtype.itemsize)
        if in_place:
            prog.steps.append(ExchangeStep(f"{name}.prep{suffix}", (Copy(_A, A.name),)))
            B, b_off = Buffer(g.b, b_grid, g.b2, g.in_dtype), stored_off
        else:
            B = prog.add_buffer(Buffer(f"{name}.B{suffix}", b_grid, g.b2, g.in_dtype, region="interleaved",
                                       scale=g.b_scale))
            prog.steps.append(ExchangeStep(f"{name}.prep{suffix}", (Copy(_A, A.name), Copy(_B, B.name))))
            b_off = b_grid.block_offsets(g.in_dtype.itemsize)
        # The grid's cells in (batch, i, j, l) order, their figures as arrays first, then one vertex per cell.
        B_, I_, J_, L_ = (x.ravel() for x in np.meshgrid(np.arange(g.batch), np.arange(gm), np.arange(gn),
                                                          np.arange(gk), indexing="ij"))
        Q_ = L_ * sk + s
        grp = group[B_]
        # Replica order of the holders: A blocks over (group,) j; B blocks over (group,) i.
        ai = J_ if g.a_batched else grp * gn + J_
        bi = I_ if g.b_batched else grp * gm + I_
        blk = ((B_ * gm + I_) * pieces) * gk + L_ if gk > 1 else B_ * gm + I_   # piece 0
        ms, ns, ks = np.diff(mb)[I_], np.diff(nb)[J_], np.diff(kb)[Q_]
        a_at = a_off[(B_ if g.a_batched else 0) * gm + I_, Q_, ai]
        b_at = b_off[(B_ if g.b_batched else 0) * nkb + Q_, J_, bi]
        o_at = out_off[blk, J_, 0]
        acc = s > 0                              # later serial steps add into the partials
        calls: dict = {}
        a_ops, b_ops, o_ops = Operands(A.name), Operands(B.name), Operands(OUT.name)
        amp = []
        for t, m, n, k, ao, bo, oo in zip(T[grp, I_, J_, L_].tolist(), ms.tolist(), ns.tolist(), ks.tolist(),
                                          a_at.tolist(), b_at.tolist(), o_at.tolist()):
            hit = calls.get((m, n, k))
            if hit is None:
                call = MatMulCall(m, n, k, g.in_dtype, ptype, "interleaved", "panels" if g.panels else "rows",
                                  scale, g.grain if g.panels else 0, acc)
                hit = calls[(m, n, k)] = (call,) + caches.kernel(call)
            out = o_ops(oo, m * n)
            ins = (a_ops(ao, m * k), b_ops(bo, k * n)) + ((out,) if acc else ())
            amp.append(Vertex(t, hit[0], ins, (out,), hit[1], hit[2]))
        prog.steps.append(ComputeStep(f"{name}.amp{suffix}", tuple(amp)))

    Cg = OUT
    if gk > 1:
        c_grid = Grid.of(c_rows, nb, c_hold)
        Cg = prog.add_buffer(Buffer(f"{name}.Cr", c_grid, g.c2, g.out_dtype, scale=g.c_scale))
        # Each reducer reads its own partial in place (``ReduceCall.own``): the reducers' buffer holds
        # the other gk - 1 pieces of each cell, and no on-tile copy brings the own one over.
        red_hold = np.stack([T[group[b], i, :, p] if l != p else np.full(gn, -1, dtype=np.int64)
                             for b, i, p in cells for l in range(gk)])
        p_red = Grid(*_grid_fields(Grid.of(out_rows, nb, red_hold)), align_bytes=dense)
        R = prog.add_buffer(Buffer(f"{name}.Pr", p_red, out_shape, ptype))
        prog.steps.append(ExchangeStep(f"{name}.reduce.exchange", (Copy(OUT.name, R.name),)))
        r_off = p_red.block_offsets(ptype.itemsize)
        c_off = c_grid.block_offsets(g.out_dtype.itemsize)
        red, cols = [], []
        calls: dict = {}                      # elements -> (call, variant, cycles)
        o_ops, r_ops, c_ops = Operands(OUT.name), Operands(R.name), Operands(Cg.name)
        widths = np.diff(nb).tolist()
        for ci, (b, i, p) in enumerate(cells):
            h = int(piece_b[i][p + 1] - piece_b[i][p])
            if h == 0:
                continue
            other = ci * gk + (1 if p == 0 else 0)
            for j, t, n, own_at, others_at, c_at in zip(range(gn), T[group[b], i, :, p].tolist(), widths,
                                                         out_off[ci * gk + p, :, 0].tolist(),
                                                         r_off[other, :, 0].tolist(), c_off[ci, :, 0].tolist()):
                hit = calls.get(h * n)
                if hit is None:
                    call = ReduceCall(h * n, gk, ptype, g.out_dtype, -g.c_scale, own=True)
                    hit = calls[h * n] = (call,) + caches.kernel(call)
                own, others = o_ops(own_at, h * n), r_ops(others_at, (gk - 1) * h * n)
                red.append(Vertex(t, hit[0], (own, others), (c_ops(c_at, h * n),), hit[1], hit[2]))
                cols.append((int(nb[j]), n))
        prog.steps.append(ComputeStep(f"{name}.reduce", tuple(red)))

    prog.steps.append(ExchangeStep(f"{name}.out", (Copy(Cg.name, _C),)))
    return prog, tuple(cols) if gk > 1 else ()


def _a_holders(g: GemmShape, choice: GemmChoice, T: np.ndarray, group: np.ndarray) -> np.ndarray:
    """int64 [a-batch * gm, gk, replicas]: the tiles multiplying each A block (row block i, K block
    l): every column block (j) of every batch group that reads it."""
    gb, gm, gn, gk = choice.gb, choice.gm, choice.gn, choice.gk
    if g.a_batched:
        return np.stack([T[group[b]].transpose(0, 2, 1) for b in range(g.batch)]).reshape(g.batch * gm, gk, gn)
    return T.transpose(1, 3, 0, 2).reshape(gm, gk, gb * gn)


def _a_rows(g: GemmShape, mb: np.ndarray) -> np.ndarray:
    batch_a = g.batch if g.a_batched else 1
    return np.concatenate([b * g.M + mb[:-1] for b in range(batch_a)] + [[batch_a * g.M]])


def a_copies(g: GemmShape, grid: np.ndarray) -> np.ndarray:
    """Per grid option ``(gb, gm, gn, gk)``, the tiles that read each A block: its column blocks, and
    its batch groups when a shared A meets a batched B."""
    gb, gm, gn, gk = np.asarray(grid, dtype=np.int64).T
    return gn * (gb if g.batch > 1 and not g.a_batched else 1)


def a_grid(g: GemmShape, choice: GemmChoice) -> Grid:
    """The layout in which a choice without serial K reads A: its A blocks, each on every tile that
    multiplies it (``_build_core``'s A buffer). An A stored so (a grid-aligned boundary:
    ``planner.catalogue.aligned_layouts``) needs no preparation exchange: the copy moves nothing."""
    if choice.sk != 1:
        raise ValueError(f"{g.op}: {choice} reads A in serial K chunks, no one grid")
    hold = _a_holders(g, choice, tile_of(choice), _batch_groups(g.batch, choice.gb))
    return Grid.of(_a_rows(g, balanced_bounds(g.M, choice.gm)), aligned_bounds(g.K, choice.gk, k_unit(g)), hold)


def _b_holders(g: GemmShape, choice: GemmChoice, T: np.ndarray, group: np.ndarray) -> np.ndarray:
    """int64 [b-batch * gk, gn, replicas]: the tiles multiplying each B block (K block l, column
    block j): every row block (i) of every batch group that reads it."""
    gb, gm, gn, gk = choice.gb, choice.gm, choice.gn, choice.gk
    if g.b_batched:
        return np.stack([T[group[b]].transpose(2, 1, 0) for b in range(g.batch)]).reshape(g.batch * gk, gn, gm)
    return T.transpose(3, 2, 0, 1).reshape(gk, gn, gb * gm)


def _b_rows(g: GemmShape, kb: np.ndarray) -> np.ndarray:
    batch_b = g.batch if g.b_batched else 1
    return np.concatenate([b * g.K + kb[:-1] for b in range(batch_b)] + [[batch_b * g.K]])


def _col_bounds(g: GemmShape, gn: int) -> np.ndarray:
    return aligned_bounds(g.N, gn, g.grain) if g.panels else balanced_bounds(g.N, gn)


def _b_grid(g: GemmShape, b_rows, nb, holders) -> Grid:
    return Grid.of(b_rows, nb, holders, grain=g.grain if g.panels else 0, panel_space=g.panels)


def prearranged_b(g: GemmShape, choice: GemmChoice) -> Grid | None:
    """The pre-arranged storage of a parameter B (poplin's ``inputRHSIsPreArranged``): the choice's
    own B blocks, each on every tile that multiplies it (replicated over the grid's row blocks, and
    batch groups of a shared B, where the grid reads it so), every serial K chunk of a tile's K
    range at once. With one K chunk it is the grid's B buffer itself, so the preparation copy
    moves nothing (``estimate.detailed.moves_nothing``); with serial K the matmuls read their
    chunk from it in place (``_build_core``). Either way no run exchanges the weights again.
    None when B is not a parameter."""
    if not g.b_param:
        return None
    hold = _b_holders(g, choice, tile_of(choice), _batch_groups(g.batch, choice.gb))
    if choice.sk > 1:                 # K block q = l * sk + s is held where block l of the grid is
        batch_b = g.batch if g.b_batched else 1
        hold = np.repeat(hold.reshape(batch_b, choice.gk, *hold.shape[1:]), choice.sk, axis=1)
        hold = hold.reshape(batch_b * choice.gk * choice.sk, *hold.shape[2:])
    kb = aligned_bounds(g.K, choice.gk * choice.sk, k_unit(g))
    return _b_grid(g, _b_rows(g, kb), _col_bounds(g, choice.gn), hold)


def _grid_fields(grid: Grid) -> tuple:
    return grid.row_bounds, grid.col_bounds, grid.holders, grid.replicas, grid.grain


def _vertex(tile, call, ins, outs, caches: Caches) -> Vertex:
    """A vertex running the kernel variant dispatch picks for ``call`` (``caches.kernel``)."""
    name, cycles = caches.kernel(call)
    return Vertex(tile, call, ins, outs, name, cycles)
