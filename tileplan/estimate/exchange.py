"""Exchange transfers and their cycles: the one exchange cost model.

A copy plan (``tileplan.layout.convert.CopyPlan``) lists logical fragments. What
the exchange executes are *transfers*: runs of bytes contiguous in both the
source and the destination tile's memory (adjacent fragments merged), and a run
sent once to several destinations is one multicast transfer. ``Transfers``
holds them as numpy arrays, one row per (transfer, destination).

Cycle model (DESIGN.md, "The target"), used identically by the detailed
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

    def take(self, index: np.ndarray) -> "Transfers":
        return Transfers(*(getattr(self, f)[index] for f in _FIELDS))

    @property
    def transfer_count(self) -> int:
        return int(np.unique(self.group).size) if len(self) else 0


_FIELDS = ("group", "src_tile", "src_buf", "src_off", "dst_tile", "dst_buf", "dst_off", "nbytes")


def fragments_to_transfers(src_tile, src_off, dst_tile, dst_off, nbytes, src_buf=0, dst_buf=0,
                           *, merge: bool = True, multicast: bool = True) -> Transfers:
    """Logical fragments (byte offsets) -> transfers.

    ``merge`` joins fragments that continue each other in both memories on the
    same (source, destination) pair; ``multicast`` makes one send of identical
    source runs going to several tiles.
    """
    n = np.asarray(nbytes, dtype=np.int64)
    cols = [np.broadcast_to(np.asarray(c), n.shape) for c in
            (src_tile, src_buf, src_off, dst_tile, dst_buf, dst_off)]
    st, sb, so, dt, db, do = (c.astype(np.int64) for c in cols)
    if n.size == 0:
        return Transfers.empty()
    if merge:
        order = np.lexsort((so, db, sb, dt, st))
        st, sb, so, dt, db, do, n = (a[order] for a in (st, sb, so, dt, db, do, n))
        cont = np.zeros(n.size, dtype=bool)
        cont[1:] = ((st[1:] == st[:-1]) & (dt[1:] == dt[:-1]) & (sb[1:] == sb[:-1]) & (db[1:] == db[:-1])
                    & (so[1:] == so[:-1] + n[:-1]) & (do[1:] == do[:-1] + n[:-1]))
        heads = np.flatnonzero(~cont)
        n = np.add.reduceat(n, heads)
        st, sb, so, dt, db, do = (a[heads] for a in (st, sb, so, dt, db, do))
    if multicast:
        key = np.stack([st, sb, so, n])
        _, group = np.unique(key, axis=1, return_inverse=True)
        group = group.reshape(-1).astype(np.int64)
    else:
        group = np.arange(n.size, dtype=np.int64)
    order = np.lexsort((dt, group))
    return Transfers(group[order], st[order].astype(np.int32), sb[order].astype(np.int32), so[order],
                     dt[order].astype(np.int32), db[order].astype(np.int32), do[order], n[order])


def paired_mask(tr: Transfers) -> np.ndarray:
    """Per row: does this row's transfer qualify for paired (64-bit) exchange?"""
    if len(tr) == 0:
        return np.zeros(0, dtype=bool)
    aligned = (tr.src_off % 8 == 0) & (tr.dst_off % 8 == 0) & (tr.nbytes % 8 == 0)
    # Destinations in complete pairs: each group holds both 2p and 2p+1 for every pair it touches.
    pair = tr.dst_tile.astype(np.int64) // 2
    key = tr.group * (1 << 32) + pair
    uniq, counts = np.unique(key, return_counts=True)
    complete_pair = counts[np.searchsorted(uniq, key)] == 2
    ok = aligned & complete_pair
    # A group is paired only if every row of it is.
    bad_groups = np.unique(tr.group[~ok])
    return ~np.isin(tr.group, bad_groups)


def tile_exchange_cycles(tr: Transfers, target, tiles: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(send cycles, receive cycles) per tile for one exchange phase."""
    tiles = target.tiles if tiles is None else tiles
    send = np.zeros(tiles, dtype=np.int64)
    recv = np.zeros(tiles, dtype=np.int64)
    if len(tr) == 0:
        return send, recv
    paired = paired_mask(tr)
    lane = np.where(paired, target.paired_bytes_per_cycle, target.exchange_bytes_per_cycle)
    cyc = -(-tr.nbytes // lane)
    np.add.at(recv, tr.dst_tile, cyc + target.receive_control_cycles)
    first = np.ones(len(tr), dtype=bool)
    first[1:] = tr.group[1:] != tr.group[:-1]
    s_cyc = cyc[first] + target.send_control_cycles
    np.add.at(send, tr.src_tile[first], s_cyc)
    borrowed = paired[first]
    np.add.at(send, tr.src_tile[first][borrowed] ^ 1, s_cyc[borrowed])
    return send, recv


def phase_cycles(tr: Transfers, target) -> int:
    """Cycles of one exchange phase excluding its sync: the slowest tile."""
    if len(tr) == 0:
        return 0
    send, recv = tile_exchange_cycles(tr, target)
    return int(np.maximum(send, recv).max())
