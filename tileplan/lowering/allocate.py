"""SRAM allocation per tile: addresses for every buffer, honouring lifetimes and regions.

Tile memory is ``[0, sram_bytes)``: the reserve (runtime, code, vertex state)
sits at the bottom of the standard region ``[0, standard_bytes)``, the
interleaved region is ``[standard_bytes, sram_bytes)``. Buffers that prefer the
interleaved region (AMP weight operands, resident parameters) go there first
and fall back to the standard region; the others go to the standard region
first and spill into the interleaved one, as ``estimate.memory`` assumes.

Per tile, buffers are placed largest first (then by first step and name), each
at the lowest 8-byte aligned address where it overlaps no buffer that is live
at the same time (first fit decreasing). The planner counts bytes, not gaps: a
plan within a few percent of a tile's capacity can still fail here on
fragmentation, and the error then names the tile, the buffer and the bytes. Tiles with the same buffer sizes get the same placement, so
the placement is computed once per distinct size profile. Aliased buffers
(a copy that moves nothing, a cast that takes over its dead input) share
their root buffer's address and extend its lifetime.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import TileplanError
from ..estimate.memory import alias_roots, buffer_lifetimes, buffer_tile_bytes
from ..program import alias_root


@dataclass
class Allocation:
    names: list[str]
    addr: np.ndarray          # int64 [nbuf, tiles], -1 where the buffer has no bytes on the tile
    size: np.ndarray          # int64 [nbuf, tiles]
    peak: np.ndarray          # int64 [tiles]: highest address used + 1, less the reserve


def allocate(program, target, aliases: dict[str, str] | None = None,
             sizes: dict[str, np.ndarray] | None = None) -> Allocation:
    aliases = dict(aliases or {})
    names = sorted(program.buffers)
    tiles = target.tiles
    spans = buffer_lifetimes(program)
    size = np.zeros((len(names), tiles), dtype=np.int64)
    for i, n in enumerate(names):
        size[i] = sizes[n] if sizes and n in sizes else buffer_tile_bytes(program.buffers[n], tiles, target.alignment)

    roots, root_size, rspan = alias_roots(names, spans, dict(zip(names, size)), aliases)
    ridx = {n: i for i, n in enumerate(roots)}
    rsize = np.stack([root_size[n] for n in roots]) if roots else np.zeros((0, tiles), dtype=np.int64)
    prefer_il = np.array([program.buffers[n].region == "interleaved" for n in roots])
    order = sorted(range(len(roots)), key=lambda i: (-int(rsize[i].max()), rspan[roots[i]][0], roots[i]))
    raddr = np.full((len(roots), tiles), -1, dtype=np.int64)
    # One placement per distinct size profile.
    profiles, inverse = np.unique(rsize.T, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    regions = {"standard": (target.reserve_bytes, target.standard_bytes),
               "interleaved": (target.standard_bytes, target.sram_bytes)}
    failed = {}
    for p, got in _place_profiles(profiles, order, roots, prefer_il, [rspan[r] for r in roots], regions, target):
        if isinstance(got, str):
            failed[p] = got
        else:
            raddr[:, inverse == p] = got[:, None]
    if failed:                                  # the first profile that does not fit, as placed one by one
        p = min(failed)
        raise TileplanError(f"tile {int(np.flatnonzero(inverse == p)[0])}: {failed[p]}")
    addr = np.full((len(names), tiles), -1, dtype=np.int64)
    for i, n in enumerate(names):
        addr[i] = np.where(size[i] > 0, raddr[ridx[alias_root(n, aliases)]], -1)
    top = np.where(raddr >= 0, raddr + rsize, 0).max(axis=0) if len(roots) else np.zeros(tiles, np.int64)
    return Allocation(names, addr, size, top)


def _place_profiles(profiles, order, roots, prefer_il, spans, regions, target):
    """Yield ``(profile, addresses by root)`` for every size profile (``profiles[p][i]``: root ``i``'s
    bytes on the tiles of profile ``p``), placing the roots in ``order``, first fit, or ``(profile,
    error)`` (a message without the tile) for a profile that does not fit.

    Profiles are taken in lexicographic order of their sizes in placement order, and each starts
    from the placements of the one before where both agree: first fit is a function of the buffers
    placed so far, so two profiles whose first ``k`` sizes agree place those ``k`` buffers at the same
    addresses (a tower's tiles share many of their larger buffers). The placements past the shared
    ones are undone, last first, and made again for the new profile. Buffers are kept per region
    (each lies in one), which halves what every first fit scans."""
    placed = {reg: _Placed(len(order)) for reg in regions}
    sizes = profiles[:, order]
    stack: list[tuple[int, str, int, int]] = []       # placements: (position in order, region, start, end)
    addrs = np.full(len(roots), -1, dtype=np.int64)
    prev, stuck = None, None                           # stuck: (position, error) where the last profile failed
    for p in (np.lexsort(sizes.T[::-1]).tolist() if sizes.shape[1] else range(len(profiles))):
        row = sizes[p]
        d = np.flatnonzero(row != prev) if prev is not None else np.zeros(1, np.int64)
        k = int(d[0]) if d.size else row.size         # the placements profile ``p`` shares
        prev = row
        if stuck is not None and k > stuck[0]:
            yield p, stuck[1]                         # the same buffers before it: the same failure
            continue
        stuck = None
        while stack and stack[-1][0] >= k:
            pos, reg, at, end = stack.pop()
            placed[reg].remove(at, end, *spans[order[pos]])
            addrs[order[pos]] = -1
        for pos in range(k, row.size):
            n = int(row[pos])
            if n == 0:
                continue
            i = order[pos]
            a, b = spans[i]
            for reg in ("interleaved", "standard") if prefer_il[i] else ("standard", "interleaved"):
                lo, hi = regions[reg]
                at = _first_fit(placed[reg], lo, hi, n, a, b, target.alignment)
                if at is not None:
                    break
            else:
                live = _live_peak([e for pl in placed.values() for e in pl], a, b)
                over = n + live - target.usable_bytes
                why = (f"{over:,} bytes over" if over > 0 else
                       "no free gap that large in either region (fragmented)")
                stuck = (pos, f"buffer {roots[i]!r} ({n:,} bytes, {'interleaved' if prefer_il[i] else 'standard'} "
                              f"preferred) does not fit: up to {live:,} bytes are live beside it and the tile has "
                              f"{target.usable_bytes:,} usable bytes; {why}")
                break
            placed[reg].add(at, at + n, a, b)
            stack.append((pos, reg, at, at + n))
            addrs[i] = at
        yield p, (stuck[1] if stuck is not None else addrs.copy())


class _Placed:
    """The buffers placed on a tile so far: int64 columns start, end (bytes), first and last step,
    kept sorted by (start, end), the order first fit scans them in."""

    def __init__(self, capacity: int):
        self.cols = np.zeros((4, max(capacity, 1)), dtype=np.int64)
        self.key = np.zeros(max(capacity, 1), dtype=np.int64)       # start * 2**32 + end, ascending
        self.n = 0

    def add(self, start: int, end: int, first: int, last: int) -> None:
        k = (start << 32) + end
        at = int(np.searchsorted(self.key[:self.n], k, "right"))
        self.cols[:, at + 1:self.n + 1] = self.cols[:, at:self.n].copy()
        self.key[at + 1:self.n + 1] = self.key[at:self.n].copy()
        self.cols[:, at] = (start, end, first, last)
        self.key[at] = k
        self.n += 1

    def remove(self, start: int, end: int, first: int, last: int) -> None:
        """Take out a buffer ``add`` placed (the last one of its key and lifetime)."""
        k = (start << 32) + end
        lo, hi = (int(x) for x in np.searchsorted(self.key[:self.n], [k, k + 1]))
        at = next(j for j in range(hi - 1, lo - 1, -1)
                  if self.cols[2, j] == first and self.cols[3, j] == last)
        self.cols[:, at:self.n - 1] = self.cols[:, at + 1:self.n].copy()
        self.key[at:self.n - 1] = self.key[at + 1:self.n].copy()
        self.n -= 1

    def __iter__(self):
        return iter(map(tuple, self.cols[:, :self.n].T.tolist()))


def _first_fit(placed: _Placed, lo: int, hi: int, n: int, a: int, b: int, align: int) -> int | None:
    """Lowest aligned address in [lo, hi) for n bytes clear of every placed buffer live during [a, b].

    Vectorised first fit: with the busy intervals in (start, end) order, the candidate address before
    busy interval k is the aligned end of the furthest-reaching interval before it (or ``lo``); the
    first candidate that ends before interval k starts wins, else the one after them all."""
    o, q, s, e = placed.cols[:, :placed.n]
    live = (s <= b) & (a <= e) & (q > lo) & (o < hi)
    at0 = -(-lo // align) * align
    o, q = o[live], q[live]
    if not o.size:
        return at0 if at0 + n <= hi else None
    reach = np.maximum.accumulate(np.maximum(-(-q // align) * align, at0))
    cand = np.concatenate(([at0], reach[:-1]))
    fits = np.flatnonzero(cand + n <= o)
    at = int(cand[fits[0]]) if fits.size else int(reach[-1])
    return at if at + n <= hi else None


def _live_peak(placed, a: int, b: int) -> int:
    """The most bytes placed buffers hold at once during steps [a, b]."""
    return max((sum(q - o for o, q, s0, e0 in placed if s0 <= t <= e0) for t in range(a, b + 1)), default=0)
