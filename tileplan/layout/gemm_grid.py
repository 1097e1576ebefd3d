"""``Grid``: a GEMM's private block layout (operands, partials, reduced result).

A ``Grid`` cuts a 2-D view of a tensor into blocks by ``row_bounds`` x
``col_bounds`` and says which tiles hold each block (``holders``, one row of
``replicas`` tiles per block, -1 where a block is not held at all: a serial step
or a partial holds only part of the tensor). On a tile, the blocks it holds are
stacked in block order (row-block major), each block starting at an 8-byte
aligned offset. Within a block the format is either row-major (``grain == 0``)
or AMP panels: ``ceil(width / grain)`` panels of ``grain`` columns, each
``height x grain`` row-major (the last panel may be narrower). In panel space
(``panel_space``) column bounds must be multiples of ``grain`` but for the matrix's
end (``aligned_bounds``): only the last column block may end in a partial panel,
the matrix's own (see ``layout.panels``).

Grids are never offered at an op boundary; they are what a GEMM's
preparation exchange writes and its vertices read.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import numpy as np

from .owner_map import OwnerMap, expand_ranges, exclusive_cumsum


@dataclass(frozen=True)
class Grid:
    row_bounds: tuple[int, ...]
    col_bounds: tuple[int, ...]
    holders: bytes                    # int64 [row block, col block, replica] -> tile or -1, as raw bytes
                                      # (hashable and cheap for grids of thousands of replicated blocks)
    replicas: int = 1
    grain: int = 0                    # 0: row-major blocks; > 0: AMP panels of `grain` columns
    align_bytes: int = 8
    panel_space: bool = False         # panels addressed panel-major (see layout.PackedPanels): one interval
                                      # per (block, panel) instead of one per (block, panel, row)

    def __post_init__(self):
        nr, nc = len(self.row_bounds) - 1, len(self.col_bounds) - 1
        if len(self.holders) != 8 * nr * nc * self.replicas:
            raise ValueError(f"Grid holders has {len(self.holders) // 8} entries, expected {nr}x{nc}x{self.replicas}")
        if self.grain and self.panel_space and any(b % self.grain for b in self.col_bounds[1:-1]):
            raise ValueError(f"Grid in panel space: column bounds {list(self.col_bounds)} cut inside a panel of "
                             f"{self.grain}")

    @classmethod
    def of(cls, row_bounds, col_bounds, holders: np.ndarray, grain: int = 0, panel_space: bool = False) -> "Grid":
        h = np.asarray(holders, dtype=np.int64)
        if h.ndim == 2:
            h = h[:, :, None]
        return cls(tuple(int(b) for b in row_bounds), tuple(int(b) for b in col_bounds),
                   np.ascontiguousarray(h, dtype="<i8").tobytes(), int(h.shape[2]), int(grain), 8, bool(panel_space))

    @property
    def index_space(self) -> str:
        return f"panels{self.grain}" if self.grain and self.panel_space else "rows"

    @property
    def local_format(self) -> str:
        return "panels" if self.grain else "rows"

    @property
    def shape_blocks(self) -> tuple[int, int]:
        return len(self.row_bounds) - 1, len(self.col_bounds) - 1

    def holder_array(self) -> np.ndarray:
        nr, nc = self.shape_blocks
        return np.frombuffer(self.holders, dtype="<i8").reshape(nr, nc, self.replicas)

    def __str__(self) -> str:
        nr, nc = self.shape_blocks
        fmt = f" p{self.grain}" if self.grain else ""
        return f"Grid({nr}x{nc} r{self.replicas}{fmt})"

    @functools.cached_property
    def tag(self) -> str:
        """The grid in a buffer name: ``str``'s block counts and a digest of its bounds and holders
        (``str`` alone is the same for two grids that place the same blocks on other tiles)."""
        nr, nc = self.shape_blocks
        fields = repr((self.row_bounds, self.col_bounds, self.replicas, self.grain, self.align_bytes, self.panel_space))
        digest = hashlib.blake2b(fields.encode() + self.holders, digest_size=4).hexdigest()
        return f"Grid{nr}x{nc}r{self.replicas}{f'p{self.grain}' if self.grain else ''}.{digest}"

    # ---- owner map -------------------------------------------------------------

    def block_offsets(self, itemsize: int) -> np.ndarray:
        """int64 [nr, nc, r]: local element offset of each held block on its tile (-1 where not held)."""
        return self._placement(itemsize)[0]

    @functools.lru_cache(maxsize=64)
    def _placement(self, itemsize: int):
        rb, cb = np.asarray(self.row_bounds), np.asarray(self.col_bounds)
        h = self.holder_array()
        heights = np.diff(rb)[:, None, None]
        widths = np.diff(cb)[None, :, None]
        unit = max(1, self.align_bytes // itemsize)
        size = np.broadcast_to(heights * widths, h.shape)
        padded = -(-size // unit) * unit
        flat_t, flat_n = h.reshape(-1), padded.reshape(-1)
        held = flat_t >= 0
        off = np.full(flat_t.shape, -1, dtype=np.int64)
        idx = np.flatnonzero(held)
        order = idx[np.argsort(flat_t[idx], kind="stable")]
        t, n = flat_t[order], flat_n[order]
        before = exclusive_cumsum(n)
        first = np.ones(len(t), dtype=bool)
        first[1:] = t[1:] != t[:-1]
        gstart = np.maximum.accumulate(np.where(first, np.arange(len(t)), 0))
        off[order] = before - before[gstart] if len(t) else before
        return off.reshape(h.shape), padded

    def owner_map(self, shape, dtype, tiles: int) -> OwnerMap:
        return _grid_owner_map(self, tuple(shape), dtype.itemsize)

    def bytes_per_tile(self, shape, dtype, tiles: int) -> np.ndarray:
        """Local bytes per tile including block alignment padding."""
        off, padded = self._placement(dtype.itemsize)
        h = self.holder_array()
        end = np.zeros(tiles, dtype=np.int64)
        held = h >= 0
        np.maximum.at(end, h[held], (off + padded)[held])
        return end * dtype.itemsize


@functools.lru_cache(maxsize=32)        # block grids can hold millions of intervals: keep few
def _grid_owner_map(grid: Grid, shape: tuple[int, ...], itemsize: int) -> OwnerMap:
    cols = shape[-1]
    size = int(np.prod(shape))
    rb, cb = np.asarray(grid.row_bounds, dtype=np.int64), np.asarray(grid.col_bounds, dtype=np.int64)
    h = grid.holder_array()
    off = grid.block_offsets(itemsize)
    bi, bj, rr = np.nonzero(h >= 0)
    tiles = h[bi, bj, rr]
    boff = off[bi, bj, rr]
    r0, r1 = rb[bi], rb[bi + 1]
    c0, c1 = cb[bj], cb[bj + 1]
    height, width = r1 - r0, c1 - c0
    g = grid.grain
    npan = -(-width // g) if g else np.ones_like(width)
    if not g:
        # One interval per block row.
        e = np.repeat(np.arange(len(bi)), height)
        row = expand_ranges(r0, height)
        local_row = row - np.repeat(r0, height)
        start = row * cols + c0[e]
        stop = start + width[e]
        offset = boff[e] + local_row * width[e]
        return OwnerMap.build(tiles[e], start, stop, offset, size, grid.replicas, "rows")
    if grid.panel_space:
        # Panel-major index space (layout.panels): rows r0..r1 of panel p are one interval, of
        # height x w_p elements (w_p = g, or the narrower partial panel at the matrix's end).
        rows = int(np.prod(shape[:-1]))
        e = np.repeat(np.arange(len(bi)), npan)
        p = expand_ranges(np.zeros(len(bi), dtype=np.int64), npan)
        panel = c0[e] // g + p
        pw = np.minimum(g, c1[e] - panel * g)
        start = panel * rows * g + r0[e] * pw
        stop = start + height[e] * pw
        offset = boff[e] + p * height[e] * g
        return OwnerMap.build(tiles[e], start, stop, offset, size, grid.replicas, "panels")
    # Panels: one interval per (block, panel, row).
    e = np.repeat(np.arange(len(bi)), npan)
    p = expand_ranges(np.zeros(len(bi), dtype=np.int64), npan)
    pc0 = c0[e] + p * g
    pw = np.minimum(g, c1[e] - pc0)
    h_e = height[e]
    # Panels before p in the block occupy height * g elements each (the last panel is the narrowest).
    poff = boff[e] + p * h_e * g
    e2 = np.repeat(np.arange(len(e)), h_e)
    row = expand_ranges(r0[e], h_e)
    local_row = row - np.repeat(r0[e], h_e)
    start = row * cols + pc0[e2]
    stop = start + pw[e2]
    offset = poff[e2] + local_row * pw[e2]
    return OwnerMap.build(tiles[e][e2], start, stop, offset, size, grid.replicas, "panels")


def balanced_bounds(n: int, parts: int) -> np.ndarray:
    """``parts + 1`` bounds splitting ``n`` into balanced parts (the first ones one larger)."""
    base, extra = divmod(n, parts)
    sizes = np.full(parts, base, dtype=np.int64)
    sizes[:extra] += 1
    return np.concatenate(([0], np.cumsum(sizes)))


def aligned_bounds(n: int, parts: int, unit: int) -> np.ndarray:
    """Bounds in multiples of ``unit`` elements (the end excepted), as balanced as that allows."""
    units = -(-n // unit)
    b = balanced_bounds(units, min(parts, units)) * unit
    b[-1] = n
    return b
