"""Coarse estimates: every option of a GEMM chunk at once, as numpy arrays (one row per option).

The planner (``planner.gemm.coarse_rows``) enumerates a boundary combination's
options (grids x tile orders x reductions x partials types x serial K steps);
``coarse_parts`` prices them all at once: byte-volume exchange prices (the
paired rate where an order multicasts to complete tile pairs), the kernel that
dispatch picks on the largest block and on the last K block, one sync per
exchange phase, and a conservative memory figure (the blocks alive in each
phase; the boundary pieces are added per combination). The cycles rank options;
they are not a bound. ``g`` is the planner's ``GemmShape`` (read by attribute).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..kernels import default_registry
from ..kernels.calls import MatMulCall
from ..kernels.cycles import REDUCE_SETUP, reduce_work
from .exchange import pair_aligned
from ..layout.panels import panel_count

_BLOCK_CACHE: dict = {}      # (target, in_dtype, partial types, B format, grain) -> (n, k, partials) -> lines
_REDUCE_CACHE: dict = {}     # (target, partial types, out dtype, scale, bias, epilogue) -> piece -> extra cycles


def k_unit(g) -> int:
    """K blocks start on 64-bit boundaries of A's rows (the AMP loads A rows 64 bits at a time)."""
    return 8 // g.in_dtype.itemsize if g.in_dtype.itemsize < 8 else 1


class CoarseParts(NamedTuple):
    """The boundary-free part of an option row's coarse figures: what every boundary combination of a
    GEMM shares. ``planner.gemm.coarse_rows`` adds a combination's boundary bytes to ``memory`` and
    its A row cuts (``cut_cycles``) to ``cycles``."""

    cycles: np.ndarray        # int64, without the extra transfers of A's cut row pieces
    memory: np.ndarray        # int64, without the boundary pieces
    interleaved: np.ndarray   # int64
    cut_runs: np.ndarray      # int64 A's row pieces a cut inside a row can split (0 when K is not split)
    k: np.ndarray             # int64 K elements per block
    b_prep: np.ndarray        # int64 the part of ``cycles`` that brings B's blocks
    a_prep: np.ndarray        # int64 the part of ``cycles`` that brings A's blocks (exchange and on-tile copies)


def widest_block_n(g, gn) -> np.ndarray:
    """The widest column block: whole panels as aligned_bounds deals them (a partial last panel
    counts as one panel and only ever narrows the last block), capped at N."""
    n = (-(-panel_count(g.N, g.grain) // gn) * g.grain) if g.panels else -(-g.N // gn)
    return np.minimum(n, g.N)


def cut_cycles(target, parts: CoarseParts, sk, a_cut_density: float) -> np.ndarray:
    """The boundary-dependent cycles: an A boundary layout cut inside rows (Intervals) splits some
    row pieces in two, one more transfer each, in each of the ``sk`` preparation exchanges (the caller
    skips this for a boundary that cuts no row)."""
    cuts = np.ceil(parts.cut_runs * np.minimum(1.0, parts.k * a_cut_density)).astype(np.int64)
    return cuts * (target.receive_control_cycles + 1) * sk


def coarse_parts(g, target, grid, order, red, ptype, sk, amp=None) -> CoarseParts:
    """The boundary-free figures per option row; ``amp``: the rows' matmul cycles when the caller
    has them (``amp_cycles`` of their grids), else computed. ``b_prep`` says what of the cycles
    brings B's blocks (pre-arranged weights skip it: ``planner.gemm._pre_rows``), ``a_prep`` what
    brings A's (a grid-aligned A skips it: ``planner.gemm.coarse_rows``' ``held_a``)."""
    gb, gm, gn, gkk = grid.T
    per_group = -(-g.batch // gb)
    m = -(-g.M // gm)
    n = widest_block_n(g, gn)
    unit = k_unit(g)
    units = -(-g.K // unit)
    kq = gkk * sk                                   # K blocks in all
    k = -(-units // kq) * unit
    ia = g.in_dtype.itemsize
    pbytes = np.array([t.itemsize for t in g.partial_types()])[ptype]
    ob = g.out_dtype.itemsize
    a_blk = m * k * ia * (per_group if g.a_batched else 1)
    b_blk = k * n * ia * (per_group if g.b_batched else 1)
    c_blk = m * n * ob * per_group
    p_blk = m * n * pbytes * per_group
    bw, pbw = target.exchange_bytes_per_cycle, target.paired_bytes_per_cycle
    # Transfers, not just bytes: each fragment pays ceil(bytes / lane) plus the receive control cycles,
    # and only 8-byte multiples can use the paired lane.
    # A arrives as one run per row piece when K is split (row pieces are not contiguous), else about
    # one run per source tile. Its multicast lands on complete tile pairs when the order puts its
    # replicas (j) on adjacent tiles and gn is even. About 1/gk of A's fragments start on a tile that
    # also holds their block (the activation layouts hold A's rows in the grid's tile order): that
    # tile copies its piece on-tile and only its partner takes the rest of the multicast unpaired
    # (estimate.exchange.split_for_pairs), a share of a tile's bytes too small to price here.
    rows_here = -(-(g.batch * g.M if g.a_batched else g.M) // target.tiles)
    a_split = gkk * sk > 1
    a_runs = np.where(a_split, m * (per_group if g.a_batched else 1), -(-m // rows_here))
    a_bytes = -(-a_blk // a_runs)
    a_paired = np.where((order == 1) & (gn % 2 == 0) & pair_aligned(0, 0, a_bytes), 1.0, 0.0)
    ctrl = target.receive_control_cycles
    a_cycles = (a_runs * (a_paired * -(-a_bytes // pbw) + (1.0 - a_paired) * -(-a_bytes // bw) + ctrl)).astype(np.int64)
    cut_runs = np.where(a_split, a_runs, 0)         # see cut_cycles
    # B: one run per panel, or per row of a row-major block split over columns.
    b_runs = -(-n // g.grain) if g.panels else np.where(gn > 1, k * (per_group if g.b_batched else 1), 1)
    b_bytes = -(-b_blk // b_runs)
    b_rate = np.where((order == 2) & (gm % 2 == 0) & pair_aligned(0, 0, b_bytes), pbw, bw)
    b_cycles = b_runs * (-(-b_bytes // b_rate) + ctrl)
    local_runs = np.where(gkk > 1, rows_here, 1)
    a_local = local_runs * target.local_copy_call_cycles + \
        -(-(rows_here * k * ia) // target.local_copy_bytes_per_cycle)
    prep = (a_cycles + b_cycles + a_local) * sk
    if amp is None:
        amp = amp_cycles(g, target, grid, ptype, sk)
    has_red = red > 0
    piece = np.where(red == 2, -(-m // gkk), m)
    red_recv = np.where(has_red, (gkk - 1) * piece * n * pbytes * per_group, 0)
    red_cyc = np.where(has_red, REDUCE_SETUP + _reduce_work(g, target, ptype, piece * n, gkk) * per_group, 0)
    out_recv = np.where(has_red, piece * n * ob * per_group, c_blk)
    syncs = target.sync_cycles * (1 + sk + has_red.astype(np.int64))
    cycles = prep + amp + -(-red_recv // bw) + red_cyc + -(-out_recv // bw) + syncs
    reducer_in = np.where(red == 1, gkk * p_blk, np.where(red == 2, gkk * piece * n * pbytes * per_group, 0))
    # Memory by phase (buffers live from the first step that touches them to the last): the operand
    # blocks of one serial step and the partials during the matmuls; then the partials, the pieces
    # each reducer gathers and its reduced piece. Boundary pieces are added on top by the caller.
    reduced = piece * n * ob * per_group
    memory = np.where(has_red, np.maximum(a_blk + b_blk + p_blk, p_blk + reducer_in + reduced), a_blk + b_blk + c_blk)
    return CoarseParts(cycles.astype(np.int64), memory.astype(np.int64), np.asarray(b_blk, dtype=np.int64),
                       np.asarray(cut_runs, dtype=np.int64), np.broadcast_to(k, cycles.shape).astype(np.int64),
                       np.broadcast_to(b_cycles * sk, cycles.shape).astype(np.int64),
                       np.broadcast_to((a_cycles + a_local) * sk, cycles.shape).astype(np.int64))


def reduction_bias_cycles(g, target, grid, red, ptype) -> np.ndarray:
    """Per row, the cycles a bias row adds to the reduction when the reducers add it (one more
    addend, ``kernels.cycles.reduce_cycles``; read from the replicated bias on the reducer's own
    tile, so no exchange and no memory): ``coarse_parts``' reduction term with ``gk + 1`` addends
    less the one with ``gk``. Zero for rows without a reduction."""
    gb, gm, gn, gkk = np.asarray(grid).T
    per_group = -(-g.batch // gb)
    m = -(-g.M // gm)
    piece = np.where(red == 2, -(-m // gkk), m)
    elems = piece * widest_block_n(g, gn)
    extra = _reduce_work(g, target, ptype, elems, gkk + 1) - _reduce_work(g, target, ptype, elems, gkk)
    return np.where(red > 0, extra * per_group, 0).astype(np.int64)


def reduction_epilogue_cycles(g, target, grid, red, ptype, bias: bool, fields: dict) -> np.ndarray:
    """Per row, the cycles a fused epilogue (``fields``: ``ReduceCall``'s gelu, cast_to, cast_scale)
    adds to the reducers of its piece (``piece`` rows of the widest column block, ``gk`` partials):
    the reduction kernel dispatch picks with the epilogue less the one without (both with the bias
    row when ``bias``), from the kernels' own formulas, once per distinct piece. Zero without a
    reduction.

    Which reduce variants accept a call depends on its types and epilogue flags, not on its
    element count or partials (``kernels.variants.reduce_variant``'s predicates), so the accepted
    variants are found once per partials type and each distinct piece is priced by them alone,
    the fastest winning as in ``dispatch`` (a test checks the two agree). Prices are kept per
    target and GEMM types across calls (``_REDUCE_CACHE``): the layers of a tower, the two forms
    of fused QKV and the bench's repeats price the same pieces."""
    from ..kernels.calls import ReduceCall
    gb, gm, gn, gkk = np.asarray(grid).T
    per_group = -(-g.batch // gb)
    m = -(-g.M // gm)
    piece = np.where(red == 2, -(-m // gkk), m)
    cols = widest_block_n(g, gn)
    reg = default_registry()
    types = g.partial_types()
    keys = np.stack(np.broadcast_arrays(piece, cols, gkk, ptype), 1)
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    extra = np.zeros(len(uniq), dtype=np.int64)
    flags = tuple(sorted(fields.items()))
    cache = _REDUCE_CACHE.setdefault((target, types, g.out_dtype, g.c_scale, bias, flags), {})
    accepted: dict[tuple[int, bool], list] = {}
    for i, (rows, n, parts, p) in enumerate(uniq.tolist()):
        if rows <= 0 or parts < 2:
            continue
        found = cache.get((rows, n, parts, p))
        if found is None:
            calls = [ReduceCall(rows * n, parts, types[p], g.out_dtype, -g.c_scale, n if bias else 0, True,
                                **(fields if fused else {})) for fused in (False, True)]
            cycles = []
            for fused, call in enumerate(calls):
                variants = accepted.get((p, bool(fused)))
                if variants is None:
                    variants = accepted[p, bool(fused)] = [
                        v for v in reg.variants(call.primitive, target.family) if v.accepts(call, target)
                    ] or [reg.dispatch(call, target)]          # none accepts: dispatch's NoVariantError
                cycles.append(min(v.cycles(call, target) for v in variants))
            found = cache[rows, n, parts, p] = cycles[1] - cycles[0]
        extra[i] = found
    return np.where(red > 0, extra[inverse.reshape(-1)] * per_group, 0).astype(np.int64)


def _reduce_work(g, target, ptype, elems, addends) -> np.ndarray:
    """Per row, ``kernels.cycles.reduce_work`` (the reduction loop without its setup) for the row's
    partials type (``ptype`` indexes ``g.partial_types()``): the kernels' own formula, vectorised."""
    ptype = np.broadcast_to(np.asarray(ptype), np.shape(elems))
    out = np.zeros(np.shape(elems), dtype=np.int64)
    for i, t in enumerate(g.partial_types()):
        out = np.where(ptype == i, reduce_work(t, elems, addends, target.workers), out)
    return out


def amp_cycles(g, target, grid, ptype, sk) -> np.ndarray:
    """Per row, the matmul step's cycles: ``sk`` calls per batch element of the group. The
    kernel dispatch picks for the largest block and for the last K block (its tail may not
    fill the AMP's 64-bit loads and fall back to the vector unit); the slower one sets the step.
    Depends on the grid, the partials type and sk only, not on the order or the boundaries."""
    gb, gm, gn, gkk = np.asarray(grid).T
    per_group = -(-g.batch // gb)
    m = -(-g.M // gm)
    n = widest_block_n(g, gn)
    unit = k_unit(g)
    units = -(-g.K // unit)
    kq = gkk * sk
    k = -(-units // kq) * unit
    k_last = g.K - (units - units // np.minimum(kq, units)) * unit
    partials = np.where(gkk > 1, ptype, g.partial_types().index(g.out_dtype))
    return np.maximum(matmul_block_cycles(g, target, m, n, k, partials),
                      matmul_block_cycles(g, target, m, n, k_last, partials)) * per_group * sk


def matmul_block_cycles(g, target, m, n, k, partials) -> np.ndarray:
    """Per row, the cycles of the matmul kernel dispatch picks for an ``m x k @ k x n`` block with
    partials ``g.partial_types()[partials]``: the detailed estimate's own kernels.

    Which variants accept a block does not depend on its rows, and every matmul formula is
    linear in them (``a + b * m``), so each variant is priced at m = 1 and m = 2 once per
    distinct (n, k, partials) and the rows are evaluated as lines; the fastest accepted
    variant wins, as in ``dispatch`` (a test checks the two agree)."""
    m, n, k, partials = (np.asarray(x, dtype=np.int64) for x in np.broadcast_arrays(m, n, k, partials))
    key = ((n << 20 | k) << 2) | partials                       # block sides < 2**20, partials types < 4
    shapes, inverse = np.unique(key, return_inverse=True)
    inverse = inverse.reshape(-1)
    ptypes = g.partial_types()
    fmt, grain = ("panels", g.grain) if g.panels else ("rows", 0)
    cache = _BLOCK_CACHE.setdefault((target, g.in_dtype, ptypes, fmt, grain), {})
    mask = (1 << 20) - 1
    registry = default_registry()
    table = []
    for s in shapes.tolist():
        lines = cache.get(s)
        if lines is None:
            one, two = (MatMulCall(rows, s >> 22 & mask, s >> 2 & mask, g.in_dtype, ptypes[s & 3], "interleaved",
                                   fmt, 0, grain) for rows in (1, 2))
            accepted = [v for v, reasons in registry.candidates(one, target) if not reasons]
            lines = cache[s] = [(v.cycles(one, target), v.cycles(two, target) - v.cycles(one, target))
                                for v in accepted]             # (cycles at m=1, per extra row)
        table.append(lines)
    width = max(len(t) for t in table)
    big = np.iinfo(np.int64).max // 4
    base = np.full((len(table), width), big, dtype=np.int64)
    slope = np.zeros((len(table), width), dtype=np.int64)
    for i, lines in enumerate(table):
        for j, (a, b) in enumerate(lines):
            base[i, j], slope[i, j] = a, b
    return (base[inverse] + slope[inverse] * (m - 1)[:, None]).min(axis=1)


