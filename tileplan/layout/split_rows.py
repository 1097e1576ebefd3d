"""``SplitRows``: rows spread over several tiles, each row cut into contiguous column pieces.

A row-wise op (LayerNorm, Softmax) needs all of a row's statistics. ``WholeRows`` keeps each row
on one tile, so a tensor with fewer rows than tiles leaves tiles idle (729 tokens on 1472 tiles:
half of them). ``SplitRows(owners, parts)`` cuts the rows into ``owners`` balanced row ranges
(row groups) and each row into ``parts`` balanced column pieces, piece ``j`` of group ``i`` on tile
``first_tile + i * parts + j``: a row's tiles are neighbours, so with two parts they are the tile
pair (2p, 2p+1). On its tile a piece is stored row-major (``rows_i x cols_j``).

Column bounds fall on 8-element units (as the activation ``Intervals`` do, so FP32, FP16 and FP8
pieces of one layout hold the same elements and every FP16 piece row starts on an 8-byte boundary
when the row length is a multiple of 8), the last piece taking the tail. A tensor with fewer rows
than ``owners`` gets one group per row; one too narrow for ``parts`` units gets fewer parts; no
piece is empty.

The two-stage kernels of a split row exchange FP32 partials within each row group. The layout
says where they live (``partials``): each tile's partials ``[rows_i, width]`` as block ``(i, j)``
of a ``[rows, parts * width]`` tensor, and the exchanged copy: every block of group ``i`` on the
group's other ``parts - 1`` tiles, stacked in part order (``[parts - 1, rows_i, width]``, what the
combine kernels read beside the tile's own part, so nothing is copied on a tile); ``row_stats``
places the combined ``[rows_i, width]`` statistics on every tile of the group. These are
``Blocks`` layouts, private to the op (never offered at a boundary).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..graph.dtypes import DType
from .layouts import Blocks, Layout, balanced_bounds, rows_cols
from .owner_map import LayoutError

COLUMN_UNIT = 8          # elements: piece boundaries fall on multiples of 8 (the tail excepted)


@dataclass(frozen=True)
class SplitRows(Layout):
    """``owners`` row groups x ``parts`` column pieces, piece (i, j) on tile ``first_tile + i*parts + j``."""

    owners: int
    parts: int
    first_tile: int = 0

    def __post_init__(self):
        for name in ("owners", "parts"):
            v = getattr(self, name)
            if not (isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v > 0):
                raise LayoutError(f"SplitRows: {name} must be a positive integer, got {v!r}")
        if self.parts < 2:
            raise LayoutError(f"SplitRows: parts must be at least 2 (a row on one tile is WholeRows), "
                              f"got {self.parts}")
        if not (isinstance(self.first_tile, (int, np.integer)) and self.first_tile >= 0):
            raise LayoutError(f"SplitRows: first_tile must be a non-negative integer, got {self.first_tile!r}")

    def __str__(self) -> str:
        at = f"@{self.first_tile}" if self.first_tile else ""
        return f"SplitRows({self.owners}x{self.parts}{at})"

    # ---- geometry --------------------------------------------------------------------

    def split(self, shape) -> tuple[int, int]:
        """(row groups, parts) actually used for a tensor of ``shape`` (capped: no empty piece)."""
        rows, cols = rows_cols(tuple(shape))
        return min(self.owners, rows), min(self.parts, -(-cols // COLUMN_UNIT))

    def row_bounds(self, shape) -> np.ndarray:
        rows, _ = rows_cols(tuple(shape))
        return balanced_bounds(rows, self.split(shape)[0])

    def col_bounds(self, shape) -> np.ndarray:
        _, cols = rows_cols(tuple(shape))
        units = -(-cols // COLUMN_UNIT)
        return np.minimum(balanced_bounds(units, self.split(shape)[1]) * COLUMN_UNIT, cols)

    def tile_grid(self, shape) -> np.ndarray:
        """int64 [groups, parts]: the tile of each piece."""
        g, p = self.split(shape)
        return self.first_tile + np.arange(g * p, dtype=np.int64).reshape(g, p)

    def pieces(self, shape) -> tuple[np.ndarray, ...]:
        """Per piece, in tile order: (tile, group, part, rows, cols, first column), int64 arrays."""
        rb, cb = np.diff(self.row_bounds(shape)), np.diff(self.col_bounds(shape))
        grid = self.tile_grid(shape)
        group, part = np.divmod(np.arange(grid.size, dtype=np.int64), grid.shape[1])
        return grid.reshape(-1), group, part, rb[group], cb[part], self.col_bounds(shape)[part]

    def blocks(self, shape) -> Blocks:
        """The same distribution as a ``Blocks`` grid (one tile per block)."""
        return _blocks(self, tuple(shape))

    def partials(self, shape, width: int) -> tuple[Blocks, Blocks]:
        """(each tile's partials, the other parts' partials on each tile) for a ``[rows, parts *
        width]`` FP32 tensor of per-piece statistics: see the module docstring."""
        return _partials(self, tuple(shape), int(width))

    def row_stats(self, shape, width: int) -> Blocks:
        """The combined statistics ``[rows, width]`` of each row group on every tile of the group."""
        return _row_stats(self, tuple(shape), int(width))

    # ---- Layout ----------------------------------------------------------------------

    def _shape_problem(self, shape):
        if self.split(shape)[1] < 2:
            return (f"rows of {shape[-1]} columns do not make 2 pieces of {COLUMN_UNIT}-element units "
                    "(keep them whole: WholeRows)")
        return None

    def _build(self, shape, dtype: DType, tiles: int):
        return self.blocks(shape)._build(shape, dtype, tiles)


@functools.lru_cache(maxsize=64)
def _blocks(lay: SplitRows, shape) -> Blocks:
    return Blocks(tuple(lay.row_bounds(shape).tolist()), tuple(lay.col_bounds(shape).tolist()),
                  lay.tile_grid(shape)[:, :, None])


@functools.lru_cache(maxsize=64)
def _partials(lay: SplitRows, shape, width: int) -> tuple[Blocks, Blocks]:
    grid = lay.tile_grid(shape)
    g, p = grid.shape
    rb = tuple(lay.row_bounds(shape).tolist())
    cb = tuple(range(0, (p + 1) * width, width))
    own = Blocks(rb, cb, grid[:, :, None])
    if p < 2:
        raise LayoutError(f"{lay}: a tensor of shape {list(shape)} has one piece per row: no partials to exchange")
    others = np.stack([np.delete(grid, j, axis=1) for j in range(p)], axis=1)     # [g, p, p - 1]
    return own, Blocks(rb, cb, others)


@functools.lru_cache(maxsize=64)
def _row_stats(lay: SplitRows, shape, width: int) -> Blocks:
    grid = lay.tile_grid(shape)
    return Blocks(tuple(lay.row_bounds(shape).tolist()), (0, width), grid[:, None, :])

