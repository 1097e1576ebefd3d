"""Conversions between layouts: pure copy plans, then a reference executor.

``plan_copy(src, dst, itemsize)`` intersects two owner maps with sorted starts and
``np.searchsorted``: every destination interval is cut at every source boundary,
and each resulting fragment gets exactly one source interval.

Choosing a source when the source is replicated: the replica on the destination
tile itself if there is one (an on-tile copy, no exchange), otherwise the replica
on the lowest-numbered tile. This is deterministic; it does not balance senders.
A replicated destination gets one fragment per replica.

Fragments that are adjacent logically and in both buffers, with the same source
and destination tiles, are merged into one. The plan's rows are sorted by
(src_tile, dst_tile, start).

A conversion between local formats (``rows`` <-> ``panels``) is still a plan of
contiguous fragments, but ``needs_rearrangement`` says so: lowering must then use
a pack/unpack kernel rather than expand the plan into many small copies.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ..graph.dtypes import DType
from .layouts import Layout, Shape
from .owner_map import LayoutError, OwnerMap, exclusive_cumsum, expand_ranges, sorted_unique


class PairTraffic(NamedTuple):
    """Totals per (source tile, destination tile), sorted by (src, dst)."""
    src: np.ndarray        # int32 source tile
    dst: np.ndarray        # int32 destination tile
    nbytes: np.ndarray     # int64 bytes moved between the pair
    fragments: np.ndarray  # int64 contiguous fragments between the pair
    local: np.ndarray      # bool  src == dst (an on-tile copy)


@dataclass(frozen=True, eq=False)
class CopyPlan:
    """One row per fragment: copy logical elements [start, stop) between two tiles."""

    src_tile: np.ndarray     # int32 tile the fragment is read from
    dst_tile: np.ndarray     # int32 tile it is written to
    start: np.ndarray        # int64 first logical element
    stop: np.ndarray         # int64 one past the last
    src_offset: np.ndarray   # int64 local element offset of `start` on the source tile
    dst_offset: np.ndarray   # int64 local element offset of `start` on the destination tile
    itemsize: int
    size: int                # elements of the tensor
    needs_rearrangement: tuple[str, str] | None = None   # (src_format, dst_format) when they differ
    nbytes: np.ndarray = field(init=False)   # int64 bytes of each fragment
    local: np.ndarray = field(init=False)    # bool  src_tile == dst_tile: on-tile copy, no exchange

    def __post_init__(self):
        for name in ("src_tile", "dst_tile", "start", "stop", "src_offset", "dst_offset"):
            dt = np.int32 if name.endswith("tile") else np.int64
            a = np.asarray(getattr(self, name), dtype=dt)
            if a is getattr(self, name) and a.flags.writeable:
                a = a.view()        # freeze a view, not the caller's array
            a.flags.writeable = False
            object.__setattr__(self, name, a)
        nbytes = (self.stop - self.start) * self.itemsize
        local = self.src_tile == self.dst_tile
        for name, a in (("nbytes", nbytes), ("local", local)):
            a.flags.writeable = False
            object.__setattr__(self, name, a)

    def __len__(self) -> int:
        return len(self.start)

    def __str__(self) -> str:
        moved = ~self.local
        s = (f"CopyPlan({len(self)} fragments: {int(self.nbytes[moved].sum()):,} B exchanged in "
             f"{int(moved.sum())}, {int(self.nbytes[self.local].sum()):,} B local")
        if self.needs_rearrangement:
            s += f", {self.needs_rearrangement[0]}->{self.needs_rearrangement[1]}"
        return s + ")"

    # ---- questions -----------------------------------------------------------

    @property
    def is_identity(self) -> bool:
        """Nothing moves: every fragment is on-tile and stays at its offset."""
        return bool(np.all(self.local & (self.src_offset == self.dst_offset)))

    @property
    def exchange_bytes(self) -> int:
        return int(self.nbytes[~self.local].sum())

    def pairs(self, include_local: bool = False) -> PairTraffic:
        """Bytes and fragment counts per (src, dst) tile pair; local copies only if asked."""
        keep = np.ones(len(self), dtype=bool) if include_local else ~self.local
        s, d, n = self.src_tile[keep], self.dst_tile[keep], self.nbytes[keep]
        if not len(s):
            e32, e64 = np.zeros(0, np.int32), np.zeros(0, np.int64)
            return PairTraffic(e32, e32, e64, e64, np.zeros(0, bool))
        head = np.flatnonzero(np.concatenate(([True], (s[1:] != s[:-1]) | (d[1:] != d[:-1]))))
        return PairTraffic(s[head], d[head], np.add.reduceat(n, head),
                           np.diff(np.append(head, len(s))).astype(np.int64), s[head] == d[head])

    pair_bytes = pairs        # both give the full PairTraffic(src, dst, nbytes, fragments, local)
    pair_fragments = pairs

    def send_bytes(self, tiles: int) -> np.ndarray:
        """int64 [tiles]: bytes each tile sends over the exchange (local copies excluded)."""
        return self._per_tile(self.src_tile, self.nbytes, ~self.local, tiles)

    def recv_bytes(self, tiles: int) -> np.ndarray:
        return self._per_tile(self.dst_tile, self.nbytes, ~self.local, tiles)

    def send_fragments(self, tiles: int) -> np.ndarray:
        return self._per_tile(self.src_tile, None, ~self.local, tiles)

    def recv_fragments(self, tiles: int) -> np.ndarray:
        return self._per_tile(self.dst_tile, None, ~self.local, tiles)

    def local_bytes(self, tiles: int) -> np.ndarray:
        """int64 [tiles]: bytes each tile copies within itself."""
        return self._per_tile(self.src_tile, self.nbytes, self.local, tiles)

    @staticmethod
    def _per_tile(tile, weights, mask, tiles: int) -> np.ndarray:
        t = tile[mask]
        if len(t) and int(t.max()) >= tiles:
            raise LayoutError(f"copy plan uses tile {int(t.max())} but only {tiles} tiles were given")
        w = None if weights is None else weights[mask]
        return np.bincount(t, weights=w, minlength=tiles).astype(np.int64)

    # ---- reference executor (tests) ------------------------------------------

    def execute(self, src_buffers: dict[int, np.ndarray],
                dst_buffers: dict[int, np.ndarray] | None = None) -> dict[int, np.ndarray]:
        """Copy every fragment; ``dst_buffers`` are written in place (missing ones are
        allocated, zero-filled, as large as the plan needs). Returns the destination buffers."""
        dst_buffers = {} if dst_buffers is None else dst_buffers
        if not len(self):
            return dst_buffers
        length = self.stop - self.start
        dtype = next(iter(src_buffers.values())).dtype
        need = np.zeros(int(self.dst_tile.max()) + 1, dtype=np.int64)
        np.maximum.at(need, self.dst_tile, self.dst_offset + length)
        for t in np.flatnonzero(need):
            if int(t) not in dst_buffers:
                dst_buffers[int(t)] = np.zeros(int(need[t]), dtype=dtype)
        src_flat, src_base = _flatten(src_buffers)
        dst_flat, dst_base = _flatten(dst_buffers)
        src_idx = expand_ranges(src_base[self.src_tile] + self.src_offset, length)
        dst_idx = expand_ranges(dst_base[self.dst_tile] + self.dst_offset, length)
        dst_flat[dst_idx] = src_flat[src_idx]
        for t, buf in dst_buffers.items():
            buf[...] = dst_flat[dst_base[t]: dst_base[t] + len(buf)]
        return dst_buffers


def _flatten(buffers: dict[int, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """All buffers concatenated, and the base index of each tile's buffer (by tile number)."""
    tiles = sorted(buffers)
    base = np.zeros(max(tiles) + 1, dtype=np.int64)
    lengths = np.array([len(buffers[t]) for t in tiles], dtype=np.int64)
    base[tiles] = exclusive_cumsum(lengths)
    return np.concatenate([buffers[t] for t in tiles]), base


def plan_copy(src: OwnerMap, dst: OwnerMap, itemsize: int) -> CopyPlan:
    """The fragments that turn ``src`` into ``dst`` (both verified owner maps of one tensor)."""
    if src.size != dst.size:
        raise LayoutError(f"cannot convert between owner maps of {src.size} and {dst.size} elements")
    fmt = None if src.local_format == dst.local_format else (src.local_format, dst.local_format)
    empty = np.zeros(0, dtype=np.int64)
    if not len(dst):
        return CopyPlan(empty, empty, empty, empty, empty, empty, itemsize, dst.size, fmt)

    if not len(src):
        raise LayoutError(f"the source holds none of the {src.size} elements; verify the source layout")

    # Cut each destination interval at every source boundary strictly inside it.
    cuts = sorted_unique(np.concatenate((src.start, src.stop)))
    lo = np.searchsorted(cuts, dst.start, side="right")
    inner = np.maximum(np.searchsorted(cuts, dst.stop, side="left") - lo, 0)
    j = np.repeat(np.arange(len(dst)), inner + 1)                  # destination interval of each fragment
    k = np.arange(len(j), dtype=np.int64) - np.repeat(exclusive_cumsum(inner + 1), inner + 1)
    at = lo[j] + k                                                 # index of the cut ending fragment k
    start = np.where(k == 0, dst.start[j], cuts[at - 1])            # (at - 1 = -1 only where k == 0)
    stop = np.where(k == inner[j], dst.stop[j], cuts[np.minimum(at, len(cuts) - 1)])

    i = _choose_source(src, start, stop, dst.tile[j], cuts)
    s_tile, d_tile = src.tile[i], dst.tile[j]
    s_off = src.offset[i] + (start - src.start[i])
    d_off = dst.offset[j] + (start - dst.start[j])
    return _merged(s_tile, d_tile, start, stop, s_off, d_off, itemsize, dst.size, fmt)


def _choose_source(src: OwnerMap, start, stop, dst_tile, cuts) -> np.ndarray:
    """The source interval of each fragment: the replica on the destination tile, else the lowest tile."""
    if src.replicas == 1:
        i = np.maximum(np.searchsorted(src.start, start, side="right") - 1, 0)
        ok = (src.start[i] <= start) & (stop <= src.stop[i])
    else:
        # Each elementary segment between source cuts is held by `replicas` source intervals.
        first_seg = np.searchsorted(cuts, src.start)
        spans = np.searchsorted(cuts, src.stop) - first_seg
        holder = np.repeat(np.arange(len(src)), spans)
        seg = np.repeat(first_seg - exclusive_cumsum(spans), spans) + np.arange(len(holder))
        order = np.lexsort((src.tile[holder], seg))                # by segment, then lowest tile
        holder, seg = holder[order], seg[order]
        held = np.bincount(seg, minlength=len(cuts))
        frag_seg = np.searchsorted(cuts, start, side="right") - 1
        ok = (frag_seg >= 0) & (held[np.maximum(frag_seg, 0)] == src.replicas)
        cand = holder[np.minimum(exclusive_cumsum(held)[np.maximum(frag_seg, 0)][:, None]
                                 + np.arange(src.replicas), len(holder) - 1)]   # [fragments, r]
        mine = src.tile[cand] == dst_tile[:, None]
        i = cand[np.arange(len(cand)), np.where(mine.any(axis=1), mine.argmax(axis=1), 0)]
    if not ok.all():
        f = int(np.argmax(~ok))
        raise LayoutError(f"the source does not hold elements [{start[f]}, {stop[f]}) exactly "
                          f"{src.replicas} time(s); verify the source layout")
    return i


def _merged(s_tile, d_tile, start, stop, s_off, d_off, itemsize, size, fmt) -> CopyPlan:
    """Sort by (src_tile, dst_tile, start) and merge fragments contiguous in all three spaces."""
    span_t, span_s = int(max(s_tile.max(), d_tile.max())) + 1, size + 1
    if span_t * span_t * span_s < 2 ** 62:                         # one int64 key sorts faster
        order = np.argsort((s_tile.astype(np.int64) * span_t + d_tile) * span_s + start, kind="stable")
    else:
        order = np.lexsort((start, d_tile, s_tile))
    s_tile, d_tile, start, stop, s_off, d_off = (a[order] for a in (s_tile, d_tile, start, stop, s_off, d_off))
    n = stop - start
    join = ((s_tile[1:] == s_tile[:-1]) & (d_tile[1:] == d_tile[:-1]) & (start[1:] == stop[:-1])
            & (s_off[1:] == s_off[:-1] + n[:-1]) & (d_off[1:] == d_off[:-1] + n[:-1]))
    if join.any():
        head = np.flatnonzero(np.concatenate(([True], ~join)))
        tail = np.concatenate((head[1:] - 1, [len(start) - 1]))
        s_tile, d_tile, start, s_off, d_off, stop = (s_tile[head], d_tile[head], start[head],
                                                     s_off[head], d_off[head], stop[tail])
    return CopyPlan(s_tile, d_tile, start, stop, s_off, d_off, itemsize, size, fmt)


def convert(src: Layout, dst: Layout, shape: Shape, dtype: DType, tiles: int) -> CopyPlan:
    """The copy plan from ``src`` to ``dst`` for one tensor (cached: plans are read-only)."""
    return _cached_convert(src, dst, tuple(int(d) for d in shape), dtype, int(tiles))


@functools.lru_cache(maxsize=32)       # a plan may hold millions of fragments: keep few
def _cached_convert(src: Layout, dst: Layout, shape: Shape, dtype: DType, tiles: int) -> CopyPlan:
    return plan_copy(src.owner_map(shape, dtype, tiles), dst.owner_map(shape, dtype, tiles), dtype.itemsize)


# ---- host write / read through a layout ------------------------------------------


def _by_tile(om: OwnerMap):
    """(tile, starts, lengths, offsets) for each owner, in ascending tile order."""
    order = np.lexsort((om.offset, om.tile))
    t = om.tile[order]
    head = np.flatnonzero(np.concatenate(([True], t[1:] != t[:-1]))) if len(t) else np.zeros(0, int)
    bounds = np.append(head, len(t))
    for a, b in zip(bounds[:-1], bounds[1:]):
        idx = order[a:b]
        yield int(t[a]), om.start[idx], om.lengths[idx], om.offset[idx]


def scatter(values: np.ndarray, om: OwnerMap) -> dict[int, np.ndarray]:
    """Host write: each owner's local buffer (zero-filled padding, if any) from flat ``values``."""
    flat = np.asarray(values).reshape(-1)
    if flat.size != om.size:
        raise LayoutError(f"scatter: {flat.size} values for an owner map of {om.size} elements")
    out = {}
    for tile, starts, lengths, offsets in _by_tile(om):
        buf = np.zeros(int((offsets + lengths).max()), dtype=flat.dtype)
        buf[expand_ranges(offsets, lengths)] = flat[expand_ranges(starts, lengths)]
        out[tile] = buf
    return out


def gather(buffers: dict[int, np.ndarray], om: OwnerMap, size: int | None = None) -> np.ndarray:
    """Host read: the flat tensor from the owners' local buffers.

    Replicas are assumed equal; the copy on the lowest-numbered tile is returned.
    """
    if size is not None and size != om.size:
        raise LayoutError(f"gather: asked for {size} elements from an owner map of {om.size}")
    if not buffers:
        raise LayoutError("gather: no buffers")
    out = np.zeros(om.size, dtype=next(iter(buffers.values())).dtype)
    for tile, starts, lengths, offsets in reversed(list(_by_tile(om))):
        if tile not in buffers:
            raise LayoutError(f"gather: no buffer for tile {tile}")
        out[expand_ranges(starts, lengths)] = buffers[tile][expand_ranges(offsets, lengths)]
    return out
