"""SRAM allocation per tile: addresses for every buffer, honouring lifetimes and regions.

Tile memory is ``[0, sram_bytes)``: the reserve (runtime, code, vertex state)
sits at the bottom of the standard region ``[0, standard_bytes)``, the
interleaved region is ``[standard_bytes, sram_bytes)``. Buffers that prefer the
interleaved region (AMP weight operands, resident parameters) go there first
and fall back to the standard region; the others go to the standard region
first and spill into the interleaved one, as ``estimate.memory`` assumes.

Per tile, buffers are placed in one order (``placement_order``), each at the
lowest 8-byte aligned address where it overlaps no buffer that is live at the
same time (first fit). Tiles with the same buffer sizes get the same
placement, so the placement is computed once per distinct size profile.
Aliased buffers (a copy that moves nothing, a cast that takes over its dead
input) share their root buffer's address and extend its lifetime.

Design decision: the order is long-lived buffers first (those live over the
whole program: resident parameters, pre-arranged weights, inputs and outputs
used from the first step to the last), then the rest, each part largest first
(then by first step and name). A long-lived buffer placed among shorter ones
lands in whatever gap their lifetimes leave, and every later buffer has to
fit around it for the whole program; placed first, the long-lived ones pack
at the bottom of their region and the rest share what is above. Measured
against an exact packer (CP-SAT, ``tests/lowering/test_allocate_exact.py``)
on 688 random cases of 5 to 13 buffers with max live bytes 70-100% of the
capacity (all of which it places), first fit missed a placement the exact packer found in 24 cases
largest first, 21 long-lived first, 24 long-lived first then by lifetime
length, 19 long-lived first then by bytes x steps; the lowest max-live
fraction of a miss was 0.918 long-lived first, 0.854 for the last two, so
long-lived first then by size misses least on the tight cases, and none
under 90% of the capacity. On the small 4-layer tower shrunk until it stops
fitting, the four orders need within 0.3% of each other. (The 27-layer SigLIP
tower at batch 2, which once failed here, failed on lifetimes, not on the
order: an unused alias stretched buffers back to the first step,
``estimate.memory.alias_roots``; with that fixed its peak is 89.8% of a tile
and either order places it.)

The planner counts bytes, not gaps: a plan within a few percent of a tile's
capacity can still fail here on fragmentation. The error then names the tile,
the buffer, each region's largest free gap while it is live, the tile's peak
(the most bytes live at one step: over the usable bytes, no placement could
fit; under them, first fit fragmented) and the largest buffers live then.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import TileplanError
from ..estimate.memory import alias_roots, buffer_lifetimes, buffer_tile_bytes
from ..program import alias_root


class Unplaced(TileplanError):
    """The allocator could not place a tile's buffers: ``tile``, its ``peak`` (the most bytes live at
    one step) and ``short``, the bytes the placement lacked (over the usable bytes, those above them;
    fragmented, the failing buffer's bytes less the largest free gap while it is live). What
    ``lowering.compile.compile_fitting`` re-plans from."""

    def __init__(self, message: str, tile: int = -1, peak: int = 0, short: int = 0):
        super().__init__(message)
        self.tile, self.peak, self.short = tile, peak, short

    def __reduce__(self):
        return Unplaced, (str(self), self.tile, self.peak, self.short)


@dataclass(frozen=True)
class _Miss:
    """A size profile that did not fit: the message (without the tile) and the bytes the failing
    buffer lacked (its size less the largest free gap in its regions while it is live)."""

    message: str
    short: int


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
    unused: set = set()
    spans = buffer_lifetimes(program, unused)
    size = np.zeros((len(names), tiles), dtype=np.int64)
    for i, n in enumerate(names):
        size[i] = sizes[n] if sizes and n in sizes else buffer_tile_bytes(program.buffers[n], tiles, target.alignment)

    roots, root_size, rspan = alias_roots(names, spans, dict(zip(names, size)), aliases, unused)
    ridx = {n: i for i, n in enumerate(roots)}
    rsize = np.stack([root_size[n] for n in roots]) if roots else np.zeros((0, tiles), dtype=np.int64)
    prefer_il = np.array([program.buffers[n].region == "interleaved" for n in roots])
    largest = rsize.max(axis=1) if len(roots) else []
    rspans = [rspan[r] for r in roots]
    orders = (placement_order(largest, rspans, roots, max(len(program.steps), 1)),
              sorted(range(len(roots)), key=lambda i: (-int(largest[i]), rspans[i][0], roots[i])))
    raddr = np.full((len(roots), tiles), -1, dtype=np.int64)
    # One placement per distinct size profile.
    profiles, inverse = np.unique(rsize.T, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    regions = {"standard": (target.reserve_bytes, target.standard_bytes),
               "interleaved": (target.standard_bytes, target.sram_bytes)}
    # Design decision: a profile that the long-lived-first order cannot place is placed again
    # largest first (the order before it). Neither order dominates: on random cases long-lived
    # first misses fewer (21 against 24 of 688), yet the 4096-square FP16 GEMM's serial-K chunks
    # place only largest first. Profiles either order places keep the first's addresses.
    todo, failed = list(range(len(profiles))), {}
    for order in orders:
        failed = {}
        for k, got in _placements(profiles[todo], order, roots, prefer_il, rspans, regions, target):
            p = todo[k]
            if isinstance(got, _Miss):
                failed[p] = got
            else:
                raddr[:, inverse == p] = got[:, None]
        todo = sorted(failed)
        if not todo:
            break
    if failed:                                  # the first profile that does not fit, as placed one by one
        p = min(failed)
        tile = int(np.flatnonzero(inverse == p)[0])
        message, peak = _failure(failed[p].message, tile, rsize[:, tile], roots, rspans,
                                 max(len(program.steps), 1), target)
        short = peak - target.usable_bytes if peak > target.usable_bytes else failed[p].short
        raise Unplaced(message, tile, peak, max(short, target.alignment))
    addr = np.full((len(names), tiles), -1, dtype=np.int64)
    for i, n in enumerate(names):
        addr[i] = np.where(size[i] > 0, raddr[ridx[alias_root(n, aliases)]], -1)
    top = np.where(raddr >= 0, raddr + rsize, 0).max(axis=0) if len(roots) else np.zeros(tiles, np.int64)
    return Allocation(names, addr, size, top)


def placement_order(size, spans, roots, steps: int) -> list[int]:
    """The order roots are placed in, the same on every tile (indices into ``roots``): those live over
    the whole program first, then the rest; each part by descending ``size`` (a root's largest bytes
    on any tile), then first step and name. ``spans``: each root's (first, last) step; ``steps``: the
    program's (the module docstring says why)."""
    def key(i):
        a, b = spans[i]
        return ((a, b) != (0, steps - 1), -int(size[i]), a, roots[i])
    return sorted(range(len(roots)), key=key)


# From this many size profiles on (a SigLIP tower on 1,472 tiles: 208), the second half of them is
# placed in a forked process while this one places the first (``_placements``). Below it (a layer, a
# 64-tile model) placement takes well under a second and a fork would cost more than it saves.
FORK_PROFILES = 128


def _placements(profiles, order, roots, prefer_il, spans, regions, target):
    """``_place_profiles`` over every size profile, taken in lexicographic order of their sizes in
    placement order (consecutive profiles differ least there).

    Design decision: a profile's placement does not depend on where the incremental placement
    started (``_place_profiles`` re-places whatever a change could move, so each profile gets the
    addresses first fit gives it alone), so with at least ``FORK_PROFILES`` profiles the second half
    of that order is placed in a forked process (``tileplan.forked``) beside the first, from
    scratch, using the machine's second core: the same addresses, the tower's allocation in about
    half the time. A process that may not fork (a daemonic worker) places them all itself."""
    import multiprocessing
    sizes = profiles[:, order]
    seq = np.lexsort(sizes.T[::-1]).tolist() if sizes.shape[1] else list(range(len(profiles)))
    args = (profiles, order, roots, prefer_il, spans, regions, target)
    if len(seq) < FORK_PROFILES or multiprocessing.current_process().daemon:
        yield from _place_profiles(*args, seq)
        return
    from ..forked import Forked
    half = len(seq) // 2
    rest = Forked(lambda: list(_place_profiles(*args, seq[half:])), (), "the allocation's second half")
    try:
        yield from _place_profiles(*args, seq[:half])
        yield from rest()
    finally:
        rest.cancel()


def _place_profiles(profiles, order, roots, prefer_il, spans, regions, target, seq):
    """Yield ``(profile, addresses by root)`` for the size profiles ``seq`` (``profiles[p][i]``: root
    ``i``'s bytes on the tiles of profile ``p``), placing the roots in ``order``, first fit, or
    ``(profile, error)`` (a message without the tile) for a profile that does not fit.

    The first profile is placed from scratch, each later one from the one before: a root keeps the previous profile's address unless its size differs or a move
    of a root placed before it and live at the same time could change its first fit
    (``_Moves.affect``: first fit sees only those buffers). A tower's tiles differ in a few buffers,
    so most of each profile is the one before. Buffers are kept per region (each lies in one) with
    their position in ``order``; a first fit sees the ones before it."""
    placed = {reg: _Placed(len(order)) for reg in regions}
    sizes = profiles[:, order]
    entry: list = [None] * len(order)                  # position -> (region, start, end) placed there
    prev = np.full(len(order), -1, dtype=np.int64)      # the sizes ``entry`` holds (-1: none, unknown)
    addrs = np.full(len(roots), -1, dtype=np.int64)
    moves = _Moves(len(order))
    for p in seq:
        row = sizes[p]
        moves.clear()
        error = None
        changed = np.flatnonzero(row != prev)
        start = int(changed[0]) if changed.size else row.size     # (before it: where the last put it)
        for pos in (np.flatnonzero((row[start:] != prev[start:]) | (row[start:] > 0)) + start).tolist():
            n, i = int(row[pos]), order[pos]
            a, b = spans[i]
            tried = ("interleaved", "standard") if prefer_il[i] else ("standard", "interleaved")
            if n == prev[pos] and not moves.affect(entry[pos], a, b, tried[0]):
                continue                                 # where the previous profile put it
            new = None                                   # (its own old entry: not before it)
            if n:
                for reg in tried:
                    lo, hi = regions[reg]
                    at = _first_fit(placed[reg], lo, hi, n, a, b, target.alignment, before=pos)
                    if at is not None:
                        break
                else:
                    error = _does_not_fit(placed, roots[i], n, prefer_il[i], a, b, pos, target)
                    prev[pos:] = -1                      # the rest of the profile: not placed
                    break
                new = (reg, at, at + n)
            addrs[i] = new[1] if new else -1
            prev[pos] = n
            old = entry[pos]
            if new != old:
                if old is not None and new is not None and old[0] == new[0]:
                    placed[old[0]].move(old[1], old[2], new[1], new[2], a, b, pos)
                else:
                    if old is not None:
                        placed[old[0]].remove(old[1], old[2], pos)
                    if new is not None:
                        placed[new[0]].add(new[1], new[2], a, b, pos)
                entry[pos] = new
                moves.record(old, new, a, b)
        yield p, (error if error is not None else addrs.copy())


def _does_not_fit(placed, root: str, n: int, prefer_il: bool, a: int, b: int, pos: int, target) -> _Miss:
    """Why ``root`` (``n`` bytes, live during [a, b], at ``pos`` in the placement order) finds no gap:
    the bytes live beside it among the buffers placed before it, and each region's largest free gap
    while it is live (``allocate`` adds the tile's own peak, which tells fragmentation from excess)."""
    rows = [e for pl in placed.values() for e in pl.rows() if e[4] < pos]
    live = _live_peak([e[:4] for e in rows], a, b)
    bounds = {"standard": (target.reserve_bytes, target.standard_bytes),
              "interleaved": (target.standard_bytes, target.sram_bytes)}
    largest = {reg: _largest_gap(placed[reg], lo, hi, a, b, pos, target.alignment)
               for reg, (lo, hi) in bounds.items() if hi > lo}
    gaps = ", ".join(f"{gap:,} in the {reg}" for reg, gap in largest.items())
    return _Miss(f"buffer {root!r} ({n:,} bytes, {'interleaved' if prefer_il else 'standard'} preferred) does not "
            f"fit: up to {live:,} bytes are live beside it and the tile has {target.usable_bytes:,} usable "
            f"bytes; the largest free gaps while it is live: {gaps} region", n - max(largest.values(), default=0))


def _largest_gap(placed, lo: int, hi: int, a: int, b: int, pos: int, align: int) -> int:
    """The largest aligned free extent in [lo, hi) clear of the buffers placed before ``pos`` and live
    during [a, b]."""
    best, at = 0, -(-lo // align) * align
    for o, q, s0, e0, p in sorted(placed.rows()):
        if p < pos and s0 <= b and a <= e0 and q > lo and o < hi:
            best = max(best, o - at)
            at = max(at, -(-q // align) * align)
    return max(best, hi - at, 0)


def _failure(message: str, tile: int, sizes: np.ndarray, roots, spans, steps: int, target) -> tuple[str, int]:
    """The allocator's error for ``tile`` (``sizes``: its bytes by root): ``message`` (``_does_not_fit``)
    with the tile's peak, the most bytes its buffers hold at one step, which says whether no
    placement could fit them (over the usable bytes) or first fit fragmented the tile (under them),
    and the largest buffers live at that step; and that peak."""
    delta = np.zeros(steps + 1, dtype=np.int64)
    for i in np.flatnonzero(sizes).tolist():
        delta[spans[i][0]] += sizes[i]
        delta[spans[i][1] + 1] -= sizes[i]
    live = np.cumsum(delta)[:steps]
    step = int(np.argmax(live))
    peak = int(live[step])
    held = [i for i in np.flatnonzero(sizes).tolist() if spans[i][0] <= step <= spans[i][1]]
    top = sorted(held, key=lambda i: (-int(sizes[i]), roots[i]))[:3]
    largest = ", ".join(f"{roots[i]!r} {int(sizes[i]):,}" for i in top)
    if peak > target.usable_bytes:
        why = (f"its buffers need {peak:,} bytes at once at step {step}, {peak - target.usable_bytes:,} over "
               f"the usable bytes, whatever the placement")
    else:
        why = (f"its peak is {peak:,} bytes at step {step} ({peak / target.usable_bytes:.1%} of the usable "
               f"bytes): the placement fragmented the free space")
    return f"tile {tile}: {message}; {why} (largest live then: {largest} bytes)", peak


class _Moves:
    """The roots that moved (or changed size) so far in one profile: per region, the extents they
    left and took, with their lifetimes, and which steps any of them is live at.

    Design decision: a later root is placed again only where a move can change its first fit, the
    lowest free aligned address (``_first_fit``) among the earlier buffers live with it, rather than
    wherever an earlier root live with it moved. Its address ``A`` (``n`` bytes, region ``R``) stays
    the lowest free one if no buffer now in ``R`` overlaps ``[A, A + n)`` and no buffer left ``R``
    starting below ``A + n`` (only those could have blocked a lower address); and if ``R`` is its
    second region, no buffer left its first (where it did not fit). On a tower most moves are of
    buffers far from the ones placed after them, which then keep their address."""

    def __init__(self, capacity: int):
        cap = 2 * max(capacity, 1)
        # per region: start, end, left (1: the extent a root left, 0: the one it took), first, last step
        self.cols = {reg: np.zeros((5, cap), dtype=np.int64) for reg in ("standard", "interleaved")}
        self.n = dict.fromkeys(self.cols, 0)
        self.steps = 0             # bit t: some moved root is live at step t (an int: tested in O(1) calls)

    def clear(self) -> None:
        if self.steps:
            self.n = dict.fromkeys(self.cols, 0)
            self.steps = 0

    def record(self, old, new, a: int, b: int) -> None:
        """A root live during steps [a, b] moved from ``old`` to ``new`` (``(region, start, end)``, or None)."""
        for extent, left in ((old, 1), (new, 0)):
            if extent is not None:
                reg = extent[0]
                self.cols[reg][:, self.n[reg]] = (extent[1], extent[2], left, a, b)
                self.n[reg] += 1
        self.steps |= (1 << (b + 1)) - (1 << a)

    def affect(self, entry, a: int, b: int, first: str) -> bool:
        """Can the moves change the first fit of the root placed at ``entry`` (``(region, start, end)``;
        None: no bytes), live during [a, b], whose first region is ``first``?"""
        if entry is None or not self.steps & ((1 << (b + 1)) - (1 << a)):
            return False
        reg, s, e = entry
        cs, ce, left, ca, cb = self.cols[reg][:, :self.n[reg]]
        if ((ca <= b) & (cb >= a) & (cs < e) & ((ce > s) | (left == 1))).any():
            return True
        if reg == first:
            return False
        cs, ce, left, ca, cb = self.cols[first][:, :self.n[first]]
        return bool(((ca <= b) & (cb >= a) & (left == 1)).any())


class _Placed:
    """The buffers placed on a tile so far: int64 columns start, end (bytes), first and last step, and
    position (in the placement order), kept sorted by (start, end), the order first fit scans them in."""

    def __init__(self, capacity: int):
        self.cols = np.zeros((5, max(capacity, 1)), dtype=np.int64)
        self.key = np.zeros(max(capacity, 1), dtype=np.int64)       # start * 2**32 + end, ascending
        self.n = 0

    def add(self, start: int, end: int, first: int, last: int, position: int = 0) -> None:
        k = (start << 32) + end
        at = int(np.searchsorted(self.key[:self.n], k, "right"))
        self.cols[:, at + 1:self.n + 1] = self.cols[:, at:self.n].copy()
        self.key[at + 1:self.n + 1] = self.key[at:self.n].copy()
        self.cols[:, at] = (start, end, first, last, position)
        self.key[at] = k
        self.n += 1

    def remove(self, start: int, end: int, position: int) -> None:
        """Take out the buffer ``add`` placed at ``start``, ``end`` and ``position``."""
        at = self._index(start, end, position)
        self.cols[:, at:self.n - 1] = self.cols[:, at + 1:self.n].copy()
        self.key[at:self.n - 1] = self.key[at + 1:self.n].copy()
        self.n -= 1

    def move(self, start: int, end: int, new_start: int, new_end: int, first: int, last: int,
             position: int) -> None:
        """``remove`` the buffer at ``start``, ``end`` and ``position``, then ``add`` it at ``new_start``,
        ``new_end``: the same rows, shifting only those between its old and its new place (a buffer
        that moves seldom moves far in the address order), not everything after either."""
        at = self._index(start, end, position)
        k = (new_start << 32) + new_end
        to = int(np.searchsorted(self.key[:self.n], k, "right")) - int(self.key[at] <= k)   # (as ``add`` after)
        if to > at:
            self.cols[:, at:to] = self.cols[:, at + 1:to + 1].copy()
            self.key[at:to] = self.key[at + 1:to + 1].copy()
        elif to < at:
            self.cols[:, to + 1:at + 1] = self.cols[:, to:at].copy()
            self.key[to + 1:at + 1] = self.key[to:at].copy()
        self.cols[:, to] = (new_start, new_end, first, last, position)
        self.key[to] = k

    def _index(self, start: int, end: int, position: int) -> int:
        """Where the buffer placed at ``start``, ``end`` and ``position`` is (buffers of disjoint lifetimes
        may share bytes: the first at those bytes, most often, or one of the few after it)."""
        k = (start << 32) + end
        keys = self.key[:self.n]
        lo = int(keys.searchsorted(k))
        if self.cols[4, lo] == position:
            return lo
        hi = int(keys.searchsorted(k + 1))
        return lo + int(np.flatnonzero(self.cols[4, lo:hi] == position)[0])

    def rows(self):
        return iter(map(tuple, self.cols[:, :self.n].T.tolist()))

    def __iter__(self):
        return iter(map(tuple, self.cols[:4, :self.n].T.tolist()))


def _first_fit(placed: _Placed, lo: int, hi: int, n: int, a: int, b: int, align: int,
               before: int | None = None) -> int | None:
    """Lowest aligned address in [lo, hi) for n bytes clear of every placed buffer live during [a, b]
    (``before``: of those placed at an earlier position).

    Vectorised first fit: with the busy intervals in (start, end) order, the candidate address before
    busy interval k is the aligned end of the furthest-reaching interval before it (or ``lo``); the
    first candidate that ends before interval k starts wins, else the one after them all."""
    o, q, s, e, at_pos = placed.cols[:, :placed.n]
    live = (s <= b) & (a <= e) & (q > lo) & (o < hi)
    if before is not None:
        live &= at_pos < before
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
