"""Bounded Pareto frontiers over (cycles, memory).

``frontier(cycles, memory, bound)`` returns the indices of the non-dominated
entries (fewer cycles or less memory than every other), thinned to ``bound``
entries when crowded. Thinning walks the frontier in cycle order and keeps
evenly spaced entries, but always keeps the extremes: the fastest entry and the
entries with the least standard, interleaved and total memory (pass the extra
memory columns as ``extremes``). The merged shortlist of several frontiers is
bounded again by calling ``frontier`` on the union.
"""

from __future__ import annotations

import numpy as np

DEFAULT_BOUND = 32
PRUNE_FROM = 8192         # rows; fewer are sorted at once (cheaper than the anchor passes)


def _least(col: np.ndarray, cycles: np.ndarray) -> int:
    """The entry with the least ``col``, ties broken by fewer cycles, then the lower index."""
    tied = np.flatnonzero(col == col.min())
    return int(tied[np.argmin(cycles[tied])])       # argmin: the first of equal cycles, the lower index


def _undominated(cycles: np.ndarray, memory: np.ndarray, anchors: int = 9) -> np.ndarray:
    """Indices, ascending, of a superset of the Pareto set: the entries no anchor dominates (no more
    cycles, no more memory, and fewer of one). The anchors minimise weighted sums of the normalised
    columns; each pass keeps only the survivors, so with hundreds of thousands of coarse rows and a
    dozen frontier entries the exact sort in ``pareto`` sees a few hundred."""
    idx = np.arange(cycles.size)
    if cycles.size <= PRUNE_FROM:
        return idx
    c, m = cycles, memory
    cn = (c - c.min()) / max(float(np.ptp(c)), 1.0)
    mn = (m - m.min()) / max(float(np.ptp(m)), 1.0)
    for w in np.linspace(0.0, 1.0, anchors):
        a = int(np.argmin(w * cn + (1.0 - w) * mn))
        ca, ma = c[a], m[a]
        alive = (c < ca) | (m < ma) | ((c == ca) & (m == ma))
        idx, c, m, cn, mn = idx[alive], c[alive], m[alive], cn[alive], mn[alive]
    return idx


def pareto(cycles: np.ndarray, memory: np.ndarray) -> np.ndarray:
    """Indices of the non-dominated points, in ascending cycle order (ties: less memory first, then
    the lower index)."""
    cycles, memory = np.asarray(cycles), np.asarray(memory)
    if cycles.size == 0:
        return np.zeros(0, dtype=np.int64)
    sub = _undominated(cycles, memory)
    order = sub[np.lexsort((sub, memory[sub], cycles[sub]))]
    m = memory[order]
    best_before = np.minimum.accumulate(np.concatenate(([np.iinfo(np.int64).max], m[:-1])))
    keep = m < best_before
    return order[keep]


def frontier(cycles, memory, bound: int = DEFAULT_BOUND, extremes: tuple = ()) -> np.ndarray:
    """Bounded frontier: Pareto set over (cycles, memory), at most ``bound`` entries (>= the extremes)."""
    cycles = np.asarray(cycles, dtype=np.int64)
    memory = np.asarray(memory, dtype=np.int64)
    front = pareto(cycles, memory)
    must = {int(front[0])} if front.size else set()
    for col in (memory,) + tuple(np.asarray(e, dtype=np.int64) for e in extremes):
        if col.size:
            must.add(_least(col, cycles))      # the least-memory entry of this class
    extra = np.array(sorted(must - set(front.tolist())), dtype=np.int64)
    if front.size + extra.size <= bound:
        out = np.concatenate((front, extra))
    else:
        room = max(bound - len(must), 0)
        rest = np.array([i for i in front.tolist() if i not in must], dtype=np.int64)
        if room and rest.size:
            pick = np.unique(np.round(np.linspace(0, rest.size - 1, min(room, rest.size))).astype(np.int64))
            rest = rest[pick]
        else:
            rest = rest[:0]
        out = np.concatenate((np.array(sorted(must), dtype=np.int64), rest))
    return out[np.lexsort((out, memory[out], cycles[out]))]
