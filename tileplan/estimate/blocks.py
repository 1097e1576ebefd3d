"""Copies between two grids of the same blocks, block by block.

A GEMM's partials move to their reducers this way (``P -> Pr``): both grids cut
the tensor at the same row and column bounds and hold every block once (the
destination may leave some out: a reducer reads its own partial in place),
row-major and dense, so each block is one contiguous run in both tiles'
memories. The row-by-row copy plan of such a copy (one fragment per block row:
over a million for the SigLIP batch-4 MLP) merges back into exactly these runs,
so the detailed estimate prices the blocks (``detailed._block_move_cost``) and
lowering expands them (``lowering.block_moves``), each at a small fraction of
the row-by-row work.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..layout.gemm_grid import Grid
from .exchange import Transfers, fragments_to_transfers


@dataclass(frozen=True, eq=False)
class BlockMove:
    """One row per block: move ``nbytes`` from ``src_off`` on ``src_tile`` to ``dst_off`` on ``dst_tile``."""

    src_tile: np.ndarray      # int64 [blocks], block order (row-block major)
    dst_tile: np.ndarray
    src_off: np.ndarray       # int64 byte offset of the block in its buffer's piece
    dst_off: np.ndarray
    nbytes: np.ndarray        # int64 bytes of the block
    grids: tuple              # (source Grid, destination Grid, shape, itemsize): for ``row_fragments``
    needs_rearrangement = None     # same blocks, same format: never a pack or unpack

    @property
    def is_identity(self) -> bool:
        """Nothing moves: every block stays on its tile at its offset."""
        return bool(np.all((self.src_tile == self.dst_tile) & (self.src_off == self.dst_off)))

    def traffic(self, src_buf: int = 0, dst_buf: int = 0, *, identity: bool = False,
                merge: bool = False) -> tuple[Transfers, Transfers]:
        """(exchange rows, on-tile runs), as ``step_traffic`` makes them but one row per block for the
        exchange (``merge``: merged, as the detailed estimate prices them); ``identity`` also lowers a
        copy that moves nothing (on-tile runs of every block)."""
        if self.is_identity and not identity:
            return Transfers.empty(), Transfers.empty()
        loc = self.src_tile == self.dst_tile
        cols = (self.src_tile, self.src_off, self.dst_tile, self.dst_off, self.nbytes)
        ex = ~loc
        out_ex = fragments_to_transfers(*(c[ex] for c in cols), src_buf, dst_buf, merge=merge) if ex.any() \
            else Transfers.empty()
        out_loc = fragments_to_transfers(*(c[loc] for c in cols), src_buf, dst_buf, multicast=False) \
            if loc.any() else Transfers.empty()
        return out_ex, out_loc

    def row_fragments(self) -> int:
        """The exchange fragments of the row-by-row copy plan: maximal runs of block rows, in logical
        order, logically adjacent, on one (source, destination) tile pair and contiguous in both
        memories; on-tile runs are not exchange."""
        src, dst, shape, item = self.grids
        rb, cb = np.asarray(src.row_bounds, np.int64), np.asarray(src.col_bounds, np.int64)
        rows = int(rb[-1])
        width = np.diff(cb)
        block_row = np.searchsorted(rb, np.arange(rows), side="right") - 1          # [rows]
        local_row = np.arange(rows) - rb[block_row]
        ts, td = (g.holder_array()[:, :, 0][block_row] for g in (src, dst))          # [rows, nc]
        sa, da = ((g.block_offsets(item)[:, :, 0][block_row] + local_row[:, None] * width[None, :]).reshape(-1)
                  for g in (src, dst))
        ts, td = ts.reshape(-1), td.reshape(-1)
        n = np.broadcast_to(width[None, :], (rows, len(width))).reshape(-1)
        start = (np.arange(rows)[:, None] * int(cb[-1]) + cb[None, :-1]).reshape(-1)    # logical element
        kept = td >= 0                # rows of blocks the destination holds: the plan's fragments
        ts, td, sa, da, n, start = ts[kept], td[kept], sa[kept], da[kept], n[kept], start[kept]
        joins = np.zeros(ts.size, dtype=bool)
        joins[1:] = ((ts[1:] == ts[:-1]) & (td[1:] == td[:-1]) & (sa[1:] == sa[:-1] + n[:-1])
                     & (da[1:] == da[:-1] + n[:-1]) & (start[1:] == start[:-1] + n[:-1]))
        return int(np.count_nonzero(~joins & (ts != td)))


def block_move(src, dst) -> BlockMove | None:
    """The block move of a copy between two buffers, or None when the copy is not one (then use the
    row-by-row plan): both ``Grid`` layouts with the same bounds covering the whole tensor, row-major,
    every block the destination holds held once by each, the same shape."""
    a, b = src.layout, dst.layout
    if not (isinstance(a, Grid) and isinstance(b, Grid)) or tuple(src.shape) != tuple(dst.shape):
        return None
    if (a.row_bounds != b.row_bounds or a.col_bounds != b.col_bounds or a.replicas != 1 or b.replicas != 1
            or a.grain or b.grain or a.align_bytes != b.align_bytes):
        return None
    shape = tuple(src.shape)
    rb, cb = np.asarray(a.row_bounds, np.int64), np.asarray(a.col_bounds, np.int64)
    if (not shape or int(cb[-1]) != shape[-1] or int(rb[-1]) * int(cb[-1]) != int(np.prod(shape))
            or rb[0] != 0 or cb[0] != 0 or (np.diff(rb) <= 0).any() or (np.diff(cb) <= 0).any()):
        return None
    ts, td = (g.holder_array()[:, :, 0].reshape(-1) for g in (a, b))
    wanted = td >= 0                 # blocks the destination does not hold are not copied
    if (ts[wanted] < 0).any():
        return None
    item = src.dtype.itemsize
    so, do = (g.block_offsets(item)[:, :, 0].reshape(-1) * item for g in (a, b))
    n = (np.diff(rb)[:, None] * np.diff(cb)[None, :]).reshape(-1) * item
    return BlockMove(ts[wanted], td[wanted], so[wanted], do[wanted], n[wanted], (a, b, shape, item))
