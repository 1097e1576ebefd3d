"""Exchange transfers and their cycles: the one exchange cost model.

A copy plan (``tileplan.layout.convert.CopyPlan``) lists logical fragments. What
the exchange executes are *transfers*: runs of bytes contiguous in both the
source and the destination tile's memory (adjacent fragments merged), and a run
sent once to several destinations is one multicast transfer. ``Transfers``
holds them as numpy arrays, one row per (transfer, destination).

Cycle model (docs/targets.md), used identically by the detailed
estimate, lowering and the IPU model:

- per tile, send cycles = sum over the transfers it sends of
  ``ceil(bytes / lane) + send_control``; receive cycles = sum over the transfers
  it receives of ``ceil(bytes / lane) + receive_control``;
- ``lane`` is ``exchange_bytes_per_cycle`` (4), or ``paired_bytes_per_cycle`` (8)
  for a paired transfer: its destinations come in complete tile pairs
  (2p, 2p+1), both endpoints 8-byte aligned and an even word count (bytes % 8 == 0);
  a paired sender borrows its partner's transmit lane, so the partner tile is
  charged the same send cycles;
- a tile's exchange cycles are max(send, receive); the phase lasts as long as
  the slowest tile, plus one global sync (``sync_cycles``) per exchange phase.
Local fragments (source tile == destination tile) are not exchange: they are
on-tile copies costed as a compute-side ``copy`` kernel.

Several IPUs (``target.ipus > 1``; IPU i holds tiles ``[i * tiles_per_ipu, (i + 1)
* tiles_per_ipu)``): a transfer whose source and destination lie on different IPUs
still costs its tiles the lane cycles above, and also loads the IPU-Links:

- ``link_bytes`` sums an exchange's cross-IPU bytes per (source IPU, destination
  IPU) pair: additive over the copies of one phase, like the per-tile cycles;
- ``link_cycles`` routes each pair over the topology (``all-to-all``: its own
  connection; ``ring``: the shorter way round, clockwise on a tie, one connection
  per hop) and charges each directed connection ``ceil(bytes /
  link_bytes_per_cycle)``; the links' time is the busiest connection's plus
  ``link_latency_cycles`` per hop of the longest route used;
- the phase lasts ``max(slowest tile, links)`` (``phase_cycles``), and a phase with
  any cross-IPU transfer pays ``sync_cycles_multi`` instead of ``sync_cycles``
  (``phase_sync``).

Design decision: a multicast row crossing IPUs is charged on the links once per
destination tile, not once per destination IPU: whether the fabric fans a
multicast out after the link is not public, and the conservative charge keeps the
estimate an upper bound there. On one IPU every link figure is zero, so one-IPU
plans and cycles are exactly what they were without the link model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class Transfers:
    """Exchange transfers, one row per (transfer, destination); byte offsets are buffer-relative."""

    group: np.ndarray      # int64: transfer id (rows with one id are one multicast send)
    src_tile: np.ndarray   # int32
    src_buf: np.ndarray    # int32: buffer id (program-local)
    src_off: np.ndarray    # int64: byte offset within the source buffer's piece on src_tile
    dst_tile: np.ndarray   # int32
    dst_buf: np.ndarray    # int32
    dst_off: np.ndarray    # int64
    nbytes: np.ndarray     # int64

    def __len__(self) -> int:
        return int(self.group.size)

    @classmethod
    def empty(cls) -> "Transfers":
        z = np.zeros(0, dtype=np.int64)
        return cls(z, z.astype(np.int32), z.astype(np.int32), z, z.astype(np.int32), z.astype(np.int32), z, z)

    @classmethod
    def concat(cls, parts: "list[Transfers]") -> "Transfers":
        parts = [p for p in parts if len(p)]
        if not parts:
            return cls.empty()
        out, base = [], 0
        for p in parts:
            out.append(p._shift_groups(base))
            base += int(p.group.max()) + 1
        return cls(*(np.concatenate([getattr(p, f) for p in out]) for f in _FIELDS))

    def _shift_groups(self, base: int) -> "Transfers":
        return Transfers(self.group + base, *(getattr(self, f) for f in _FIELDS[1:]))

    @property
    def transfer_count(self) -> int:
        if not len(self):
            return 0
        g = self.group
        if (g[1:] >= g[:-1]).all():          # rows in group order (as fragments_to_transfers makes them)
            return int(np.count_nonzero(g[1:] != g[:-1])) + 1
        return int(np.unique(g).size)


_FIELDS = ("group", "src_tile", "src_buf", "src_off", "dst_tile", "dst_buf", "dst_off", "nbytes")


def fragments_to_transfers(src_tile, src_off, dst_tile, dst_off, nbytes, src_buf=0, dst_buf=0,
                           *, merge: bool = True, multicast: bool = True) -> Transfers:
    """Logical fragments (byte offsets) -> transfers.

    ``merge`` joins fragments that continue each other in both memories on the
    same (source, destination) pair; ``multicast`` makes one send of identical
    source runs going to several tiles.
    """
    n = np.asarray(nbytes, dtype=np.int64)
    st, sb, so, dt, db, do = (np.broadcast_to(np.asarray(c, dtype=np.int64), n.shape) for c in
                              (src_tile, src_buf, src_off, dst_tile, dst_buf, dst_off))
    if n.size == 0:
        return Transfers.empty()
    fits = st.max(initial=0) < 2048 and dt.max(initial=0) < 2048 and sb.max(initial=0) < 256 \
        and db.max(initial=0) < 256 and so.max(initial=0) < (1 << 20) and n.max(initial=0) <= (1 << 20)
    if merge:
        if fits:      # one int64 key: (src tile, dst tile, src buf, dst buf, src offset)
            order = _argsort((((st << 11 | dt) << 16 | sb << 8 | db) << 20) | so)
        else:
            order = np.lexsort((so, db, sb, dt, st))
        st, sb, so, dt, db, do, n = (a[order] for a in (st, sb, so, dt, db, do, n))
        cont = np.zeros(n.size, dtype=bool)
        cont[1:] = ((st[1:] == st[:-1]) & (dt[1:] == dt[:-1]) & (sb[1:] == sb[:-1]) & (db[1:] == db[:-1])
                    & (so[1:] == so[:-1] + n[:-1]) & (do[1:] == do[:-1] + n[:-1]))
        heads = np.flatnonzero(~cont)
        if heads.size < n.size:
            n = np.add.reduceat(n, heads)
            st, sb, so, dt, db, do = (a[heads] for a in (st, sb, so, dt, db, do))
    if multicast:
        if fits:      # one int64 key: (src tile, src buf, src offset, bytes)
            key = (((st << 8 | sb) << 20 | so) << 21) | n
            order = np.argsort(key, kind="stable")      # rows with one key get one group in any order
            ks = key[order]
            new = np.ones(n.size, dtype=bool)
            new[1:] = ks[1:] != ks[:-1]
        else:
            order = np.lexsort((n, so, sb, st))
            new = np.ones(n.size, dtype=bool)
            new[1:] = (st[order][1:] != st[order][:-1]) | (sb[order][1:] != sb[order][:-1]) | \
                (so[order][1:] != so[order][:-1]) | (n[order][1:] != n[order][:-1])
        group = np.empty(n.size, dtype=np.int64)
        group[order] = np.cumsum(new) - 1
    else:
        group = np.arange(n.size, dtype=np.int64)
    order = _argsort(group << 11 | dt) if fits else np.lexsort((dt, group))
    out = Transfers(group[order], st[order].astype(np.int32), sb[order].astype(np.int32), so[order],
                    dt[order].astype(np.int32), db[order].astype(np.int32), do[order], n[order])
    return split_for_pairs(out) if multicast else out


def pair_aligned(src_off, dst_off, nbytes):
    """The paired-exchange rule's alignment: both endpoints 8-byte aligned and an even word count.
    The one place it is written: the detailed estimate, the coarse model and the floor ask here."""
    return (np.asarray(src_off) % 8 == 0) & (np.asarray(dst_off) % 8 == 0) & (np.asarray(nbytes) % 8 == 0)


def _paired_rows(tr: Transfers) -> np.ndarray:
    """Per row: it is aligned for 64-bit exchange and its destination's partner tile (2p, 2p+1) is
    another row of the same transfer, aligned too. Rows are sorted by (group, destination tile),
    so the two rows of a pair are neighbours."""
    aligned = pair_aligned(tr.src_off, tr.dst_off, tr.nbytes)
    dst = tr.dst_tile.astype(np.int64)
    same_prev = np.zeros(len(tr), dtype=bool)
    same_prev[1:] = ((tr.group[1:] == tr.group[:-1]) & (dst[:-1] % 2 == 0) & (dst[1:] == dst[:-1] + 1)
                     & aligned[1:] & aligned[:-1])
    return same_prev | np.concatenate((same_prev[1:], [False]))


def split_for_pairs(tr: Transfers) -> Transfers:
    """A multicast whose destinations are partly complete tile pairs is sent twice: once to the
    complete pairs (a paired transfer, 8 B/cycle on the receive side) and once to the other
    destinations. A multicast from a tile that holds a replica of its own block, to that block's
    other holders, is the common case: the source's partner loses its pair."""
    if len(tr) == 0:
        return tr
    ok = _paired_rows(tr)
    heads = np.flatnonzero(np.concatenate(([True], tr.group[1:] != tr.group[:-1])))
    both = np.logical_or.reduceat(ok, heads) & np.logical_or.reduceat(~ok, heads)
    apart = np.repeat(both, np.diff(np.append(heads, len(tr)))) & ~ok
    if not apart.any():
        return tr
    order = np.argsort(tr.group * 2 + apart, kind="stable")       # destinations stay sorted in each part
    key = (tr.group * 2 + apart)[order]
    group = np.cumsum(np.concatenate(([True], key[1:] != key[:-1]))) - 1
    return Transfers(group, *(getattr(tr, f)[order] for f in _FIELDS[1:]))


def _argsort(key: np.ndarray) -> np.ndarray:
    """``np.argsort(key)``, faster on the nearly sorted keys fragments come in: a stable sort gives the
    same order where the keys are distinct; where some repeat, the default sort keeps the order what it
    has always been."""
    order = np.argsort(key, kind="stable")
    ks = key[order]
    return np.argsort(key) if (ks[1:] == ks[:-1]).any() else order


def paired_mask(tr: Transfers) -> np.ndarray:
    """Per row: does this row's transfer qualify for paired (64-bit) exchange?"""
    if len(tr) == 0:
        return np.zeros(0, dtype=bool)
    # Destinations in complete pairs: each group holds both 2p and 2p+1 for every pair it touches.
    ok = _paired_rows(tr)
    # A group is paired only if every row of it is.
    bad = np.zeros(int(tr.group.max()) + 1, dtype=bool)
    bad[tr.group[~ok]] = True
    return ~bad[tr.group]


def tile_sum(tile: np.ndarray, values: np.ndarray, tiles: int) -> np.ndarray:
    """int64 [tiles]: ``values`` summed per tile (``np.add.at``, by bincount: exact below 2**53)."""
    if len(tile) == 0:
        return np.zeros(tiles, dtype=np.int64)
    return np.bincount(tile, weights=values, minlength=tiles).astype(np.int64)


def tile_exchange_cycles(tr: Transfers, target, tiles: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(send cycles, receive cycles) per tile for one exchange phase."""
    tiles = target.tiles if tiles is None else tiles
    if len(tr) == 0:
        return np.zeros(tiles, dtype=np.int64), np.zeros(tiles, dtype=np.int64)
    paired = paired_mask(tr)
    lane = np.where(paired, target.paired_bytes_per_cycle, target.exchange_bytes_per_cycle)
    cyc = -(-tr.nbytes // lane)
    recv = tile_sum(tr.dst_tile, cyc + target.receive_control_cycles, tiles)
    first = np.ones(len(tr), dtype=bool)
    first[1:] = tr.group[1:] != tr.group[:-1]
    s_cyc = cyc[first] + target.send_control_cycles
    partner = tr.src_tile[first] ^ 1
    borrowed = paired[first] & (partner < tiles)
    send = tile_sum(tr.src_tile[first], s_cyc, tiles) + tile_sum(partner[borrowed], s_cyc[borrowed], tiles)
    return send, recv



def link_bytes(tr: Transfers, target) -> np.ndarray:
    """int64 [ipus * ipus]: the exchange's bytes from IPU a to IPU b at ``a * ipus + b`` (the
    diagonal, traffic within an IPU, stays zero). One zero on a one-IPU target."""
    n = target.ipus
    if n == 1 or len(tr) == 0:
        return np.zeros(n * n, dtype=np.int64)
    per = target.tiles_per_ipu
    a = tr.src_tile.astype(np.int64) // per
    b = tr.dst_tile.astype(np.int64) // per
    cross = a != b
    return tile_sum((a * n + b)[cross], tr.nbytes[cross], n * n)


def _route(a: int, b: int, n: int, topology: str) -> list[tuple[int, int]]:
    """The directed connections a transfer from IPU a to IPU b crosses."""
    if topology == "all-to-all":
        return [(a, b)]
    d = (b - a) % n                       # ring: the shorter way, clockwise on a tie
    step, hops = (1, d) if d <= n - d else (-1, n - d)
    return [((a + k * step) % n, (a + (k + 1) * step) % n) for k in range(hops)]


def link_cycles(pairs: np.ndarray, target) -> int:
    """The links' time in one exchange phase, from its ``link_bytes`` (summed over its copies):
    the busiest directed connection's ``ceil(bytes / link_bytes_per_cycle)`` plus
    ``link_latency_cycles`` per hop of the longest route used; 0 with no cross-IPU byte."""
    n = target.ipus
    used = np.flatnonzero(pairs)
    if used.size == 0:
        return 0
    load: dict[tuple[int, int], int] = {}
    hops = 0
    for k in used.tolist():
        route = _route(k // n, k % n, n, target.topology)
        hops = max(hops, len(route))
        for edge in route:
            load[edge] = load.get(edge, 0) + int(pairs[k])
    busiest = max(load.values())
    return -(-busiest // target.link_bytes_per_cycle) + hops * target.link_latency_cycles


def phase_cycles(send: np.ndarray, recv: np.ndarray, pairs: np.ndarray, target) -> int:
    """An exchange phase's cycles: its slowest tile (max of send and receive) or its links."""
    return max(int(np.maximum(send, recv).max(initial=0)), link_cycles(pairs, target))


def phase_sync(moves: bool, pairs: np.ndarray, target) -> int:
    """An exchange phase's sync: none when it moves nothing, the multi-IPU sync when any byte
    crosses IPUs, else the one-IPU sync."""
    if not moves:
        return 0
    return target.sync_cycles_multi if pairs.any() else target.sync_cycles
