"""The owner map: which tile holds which elements of a tensor, as numpy arrays.

A tensor is seen as 2-D (rows = all leading dimensions folded, cols = the last
one) and its elements are numbered by their flat row-major index. An ``OwnerMap``
lists intervals ``[start, stop)`` of that index, the tile holding each and the
local element offset at which ``start`` is stored on that tile. Every interval is
contiguous in the tile's local buffer. A replicated layout lists each element
``replicas`` times, on distinct tiles.

Owner maps are canonical: intervals are sorted by (start, tile), and two intervals
that are adjacent both logically and in one tile's buffer are merged (so a block
that spans whole rows is one interval, not one per row).

The ``*_problem`` functions below are the vectorised checks behind
``Layout.verify``: each returns a one-line description of the first problem found,
or ``None``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..errors import TileplanError

LOCAL_FORMATS = ("rows", "panels")   # row-major pieces; AMP panel format


class LayoutError(TileplanError):
    """A layout that does not fit its tensor or its target; the message names the layout."""


class TileIntervals(NamedTuple):
    """The intervals one tile holds, in local buffer order."""
    start: np.ndarray   # first logical element of each interval
    stop: np.ndarray    # one past the last
    offset: np.ndarray  # local element offset of ``start``


def exclusive_cumsum(values: np.ndarray) -> np.ndarray:
    """``[0, v0, v0+v1, ...]`` without the grand total (same length as ``values``)."""
    out = np.zeros(len(values), dtype=np.int64)
    np.cumsum(values[:-1], out=out[1:])
    return out


def expand_ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The concatenation of ``arange(s, s + n)`` for each (s, n), without a Python loop."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    shift = np.asarray(starts, dtype=np.int64) - exclusive_cumsum(lengths)
    return np.repeat(shift, lengths) + np.arange(total, dtype=np.int64)


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique`` for integer arrays by sort + diff (faster than numpy 2's hash-based unique)."""
    a = np.sort(values, kind="stable")
    return a[np.concatenate(([True], a[1:] != a[:-1]))] if len(a) else a


def stacked_offsets(tile: np.ndarray, length: np.ndarray) -> np.ndarray:
    """Local offsets when items are stacked on their tiles in the order given.

    Item ``i`` goes after every earlier item on the same tile: its offset is the
    sum of their lengths.
    """
    order = np.argsort(tile, kind="stable")
    t, n = tile[order], np.asarray(length, dtype=np.int64)[order]
    before = exclusive_cumsum(n)
    first = np.ones(len(t), dtype=bool)
    first[1:] = t[1:] != t[:-1]
    group_start = np.maximum.accumulate(np.where(first, np.arange(len(t)), 0))
    out = np.empty(len(t), dtype=np.int64)
    out[order] = before - before[group_start]
    return out


@dataclass(frozen=True, eq=False)
class OwnerMap:
    tile: np.ndarray      # int32 [n]  owning tile of each interval
    start: np.ndarray     # int64 [n]  first logical element (flat row-major index)
    stop: np.ndarray      # int64 [n]  one past the last
    offset: np.ndarray    # int64 [n]  local element offset on that tile at which `start` is stored
    size: int             # elements of the tensor
    replicas: int = 1     # how many times each element is held
    local_format: str = "rows"   # "rows" (row-major pieces) or "panels" (AMP panels)

    def __post_init__(self):
        arrays = {name: np.array(getattr(self, name), dtype=dt) for name, dt in
                  (("tile", np.int32), ("start", np.int64), ("stop", np.int64), ("offset", np.int64))}
        n = {len(a) for a in arrays.values()}
        if len(n) != 1 or any(a.ndim != 1 for a in arrays.values()):
            raise ValueError(f"owner map arrays must be 1-D of one length, got "
                             f"{ {k: a.shape for k, a in arrays.items()} }")
        if self.local_format not in LOCAL_FORMATS:
            raise ValueError(f"unknown local format {self.local_format!r}")
        t, s = arrays["tile"], arrays["start"]
        if len(s) > 1 and not np.all((s[1:] > s[:-1]) | ((s[1:] == s[:-1]) & (t[1:] > t[:-1]))):
            order = np.lexsort((t, s))
            arrays = {k: a[order] for k, a in arrays.items()}
        for name, a in arrays.items():     # private copies, frozen: owner maps are cached and shared
            a.flags.writeable = False
            object.__setattr__(self, name, a)
        object.__setattr__(self, "size", int(self.size))
        object.__setattr__(self, "replicas", int(self.replicas))

    @classmethod
    def build(cls, tile, start, stop, offset, size: int, replicas: int = 1,
              local_format: str = "rows") -> "OwnerMap":
        """An owner map from raw intervals, merging those adjacent both logically and locally."""
        tile = np.asarray(tile, dtype=np.int32)
        start, stop, offset = (np.asarray(a, dtype=np.int64) for a in (start, stop, offset))
        if len(tile) > 1:
            order = np.lexsort((offset, tile))
            t, s, e, o = tile[order], start[order], stop[order], offset[order]
            join = (t[1:] == t[:-1]) & (s[1:] == e[:-1]) & (o[1:] == o[:-1] + (e[:-1] - s[:-1]))
            if join.any():
                head = np.flatnonzero(np.concatenate(([True], ~join)))
                last = np.concatenate((head[1:] - 1, [len(t) - 1]))
                tile, start, stop, offset = t[head], s[head], e[last], o[head]
        return cls(tile, start, stop, offset, size, replicas, local_format)

    # ---- questions -----------------------------------------------------------

    def __len__(self) -> int:
        return len(self.tile)

    @property
    def lengths(self) -> np.ndarray:
        return self.stop - self.start

    def owners(self) -> np.ndarray:
        """The tiles holding anything, sorted."""
        return np.unique(self.tile)

    def max_tile(self) -> int:
        return int(self.tile.max()) if len(self) else -1

    def elements_per_tile(self, tiles: int) -> np.ndarray:
        """int64 [tiles]: elements held by each tile."""
        self._check_tiles(tiles)
        return np.bincount(self.tile, weights=self.lengths, minlength=tiles).astype(np.int64)

    def bytes_per_tile(self, tiles: int, itemsize: int) -> np.ndarray:
        """int64 [tiles]: local buffer bytes on each tile, max(offset + length) x itemsize.

        Equals the elements held times itemsize when the buffer has no padding
        (``local_problem`` checks that every layout's buffers are dense).
        """
        self._check_tiles(tiles)
        end = np.zeros(tiles, dtype=np.int64)
        np.maximum.at(end, self.tile, self.offset + self.lengths)
        return end * itemsize

    def intervals_on(self, tile: int) -> TileIntervals:
        """The intervals held by one tile, in local buffer order."""
        idx = np.flatnonzero(self.tile == tile)
        idx = idx[np.argsort(self.offset[idx], kind="stable")]
        return TileIntervals(self.start[idx], self.stop[idx], self.offset[idx])

    def _check_tiles(self, tiles: int) -> None:
        if self.max_tile() >= tiles:
            raise LayoutError(f"owner map uses tile {self.max_tile()} but only {tiles} tiles were given")

    def __repr__(self) -> str:
        return (f"OwnerMap({len(self)} intervals on {len(self.owners())} tiles, size={self.size}, "
                f"replicas={self.replicas}, {self.local_format})")


# ---- vectorised checks (used by Layout.verify) -----------------------------------


def coverage_problem(om: OwnerMap) -> str | None:
    """Every element held exactly ``replicas`` times, on distinct tiles; no empty interval."""
    length = om.lengths
    if len(om) and (length <= 0).any():
        i = int(np.argmax(length <= 0))
        return f"interval [{om.start[i]}, {om.stop[i]}) on tile {om.tile[i]} is empty"
    if len(om) and (om.start.min() < 0 or om.stop.max() > om.size):
        i = int(np.argmax((om.start < 0) | (om.stop > om.size)))
        return (f"interval [{om.start[i]}, {om.stop[i]}) on tile {om.tile[i]} lies outside "
                f"the tensor's {om.size} elements")
    points = sorted_unique(np.concatenate(([0, om.size], om.start, om.stop)))
    seg = points[:-1]
    held = (np.searchsorted(om.start, seg, side="right")
            - np.searchsorted(np.sort(om.stop), seg, side="right"))
    bad = held != om.replicas
    if bad.any():
        i = int(np.argmax(bad))
        what = "once" if om.replicas == 1 else f"{om.replicas} times"
        return f"elements [{points[i]}, {points[i + 1]}) are held {held[i]} times, expected {what}"
    if om.replicas > 1 and len(om) > 1:
        order = np.lexsort((om.start, om.tile))
        t, s, e = om.tile[order], om.start[order], om.stop[order]
        twice = (t[1:] == t[:-1]) & (s[1:] < e[:-1])
        if twice.any():
            i = int(np.argmax(twice))
            return f"tile {t[i]} holds elements [{s[i + 1]}, {min(e[i], e[i + 1])}) more than once"
    return None


def local_problem(om: OwnerMap) -> str | None:
    """Each tile's intervals fill its local buffer from offset 0 without gaps or overlaps."""
    if not len(om):
        return None
    order = np.lexsort((om.offset, om.tile))
    t, o, n = om.tile[order], om.offset[order], om.lengths[order]
    first = np.ones(len(t), dtype=bool)
    first[1:] = t[1:] != t[:-1]
    if (o[first] != 0).any():
        i = int(np.flatnonzero(first & (o != 0))[0])
        return f"the local buffer of tile {t[i]} starts at element offset {o[i]}, not 0"
    broken = ~first[1:] & (o[1:] != o[:-1] + n[:-1])
    if broken.any():
        i = int(np.argmax(broken))
        kind = "overlap" if o[i + 1] < o[i] + n[i] else "leave a gap"
        return f"intervals on tile {t[i]} {kind} in its local buffer at element offset {o[i] + n[i]}"
    return None


def alignment_problem(om: OwnerMap, unit: int, itemsize: int) -> str | None:
    """Interval boundaries are multiples of ``unit`` elements (the tensor's end excepted)."""
    if unit <= 1 or not len(om):
        return None
    bad = (om.start % unit != 0) | ((om.stop % unit != 0) & (om.stop != om.size))
    if bad.any():
        i = int(np.argmax(bad))
        edge = om.start[i] if om.start[i] % unit else om.stop[i]
        return (f"interval [{om.start[i]}, {om.stop[i]}) on tile {om.tile[i]} has a boundary at element "
                f"{edge} (byte {edge * itemsize}), not a multiple of {unit} elements ({unit * itemsize} bytes)")
    return None


def capacity_problem(om: OwnerMap, tiles: int, itemsize: int, capacity: int) -> str | None:
    """No tile holds more than ``capacity`` bytes."""
    held = om.bytes_per_tile(tiles, itemsize)
    if len(held) and held.max() > capacity:
        t = int(np.argmax(held))
        return f"tile {t} would hold {held[t]:,} bytes, over its {capacity:,} usable bytes"
    return None
