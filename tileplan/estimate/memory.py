"""Memory liveness per tile and class.

A buffer is live from the first step that touches it to the last, except:
``parameter`` buffers (resident, written once by the host) live throughout;
``input`` buffers (host inputs) from the start; ``output`` buffers to the end.
Each buffer's bytes on a tile are rounded up to the 8-byte alignment the
allocator keeps.

Classes: buffers that prefer the interleaved region (AMP weight operands,
resident parameters) count there; the rest count in the standard region until
its usable part (standard less the reserve) is full, and spill into the
interleaved region after that. This is the allocator's policy
(``lowering.allocate``), so estimate and allocation agree.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..program import ComputeStep, ExchangeStep, Program, alias_root


@dataclass(frozen=True, eq=False)
class Memory:
    standard: np.ndarray      # int64 [tiles]: peak bytes in the standard region
    interleaved: np.ndarray   # int64 [tiles]: peak bytes in the interleaved region
    total: np.ndarray         # int64 [tiles]: peak bytes over both
    by_kind: dict             # kind -> int64 [tiles]: peak bytes of that kind (resident, transient, ...)


def buffer_tile_bytes(buf, tiles: int, alignment: int = 8) -> np.ndarray:
    return _tile_bytes(buf.layout, tuple(buf.shape), buf.dtype, tiles, alignment)


@functools.lru_cache(maxsize=1024)
def _tile_bytes(layout, shape, dtype, tiles, alignment):
    if hasattr(layout, "bytes_per_tile"):
        b = layout.bytes_per_tile(shape, dtype, tiles)
    else:
        b = layout.owner_map(shape, dtype, tiles).bytes_per_tile(tiles, dtype.itemsize)
    out = -(-np.asarray(b, dtype=np.int64) // alignment) * alignment
    out.flags.writeable = False
    return out


def buffer_lifetimes(program: Program, unused: set | None = None) -> dict[str, tuple[int, int]]:
    """Buffer name -> (first step, last step) by use, before the kind rules. A buffer no step
    touches gets (0, 0) by use; ``unused``, when given, collects those names (``alias_roots``)."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}

    def touch(name, i):
        first.setdefault(name, i)
        last[name] = i

    for i, step in enumerate(program.steps):
        if isinstance(step, ComputeStep):
            for name in step.buffers:
                touch(name, i)
        elif isinstance(step, ExchangeStep):
            for c in step.copies:
                touch(c.src, i)
                touch(c.dst, i)
    n = max(len(program.steps), 1)
    spans = {}
    for name, buf in program.buffers.items():
        a, b = first.get(name, 0), last.get(name, 0)
        if unused is not None and name not in first and buf.kind not in ("parameter", "input", "output"):
            unused.add(name)
        if buf.kind == "parameter":
            a, b = 0, n - 1
        elif buf.kind == "input":
            a = 0
        elif buf.kind == "output":
            b = n - 1
        spans[name] = (a, b)
    return spans


def alias_roots(names, spans: dict, sizes: dict, aliases: dict[str, str],
                unused=frozenset()) -> tuple[list, dict, dict]:
    """Buffers that share memory counted once: (the root buffers in ``names`` order, per root the
    largest per-tile size of the buffers on it, per root the union of their lifetimes).
    ``aliases``: buffer -> the buffer whose memory it shares (a copy that moved nothing).

    Design decision: a buffer no step touches (``unused``: a view in the middle of a chain of
    copies that moved nothing, such as a Slice's window between a fused GEMM's biased product and
    the projection's output) adds its bytes to its root but not its lifetime. Its by-use lifetime
    (0, 0) would stretch the root back to the program's first step: on the 27-layer SigLIP tower at
    batch 2 that kept every layer's fused QKV product (6,912 bytes a tile) live from the start, up
    to 186 KB a tile more, and the most bytes live at once exceeded the tile's usable bytes on 434
    of the allocation's 440 size profiles (the allocator reported the first as fragmentation)."""
    roots = [n for n in names if alias_root(n, aliases) == n]
    size = {n: np.array(sizes[n], dtype=np.int64) for n in roots}
    span = {n: None if n in unused else list(spans[n]) for n in roots}
    for n in names:
        r = alias_root(n, aliases)
        if r != n:
            size[r] = np.maximum(size[r], sizes[n])
            if n not in unused:
                span[r] = list(spans[n]) if span[r] is None else [min(span[r][0], spans[n][0]),
                                                                  max(span[r][1], spans[n][1])]
    return roots, size, {n: tuple(v) if v is not None else tuple(spans[n]) for n, v in span.items()}


def program_memory(program: Program, target) -> Memory:
    """Peak bytes per tile, class and kind over the program's steps; buffers in
    ``program.aliases`` count once, on the buffer whose memory they share (as the allocator
    places them)."""
    tiles = target.tiles
    nsteps = max(len(program.steps), 1)
    names = list(program.buffers)
    sizes = {n: buffer_tile_bytes(program.buffers[n], tiles, target.alignment) for n in names}
    unused: set = set()
    roots, rsize, spans = alias_roots(names, buffer_lifetimes(program, unused), sizes, program.aliases, unused)
    # Difference arrays over steps, [steps + 1, tiles] per class, stacked: the interleaved region,
    # the standard one, then each kind (one array and one cumulative sum for all: a GEMM catalogue
    # costs every detailed candidate's program here, and their arrays are small, so the number of
    # numpy calls is the cost).
    kinds = {k: 2 + i for i, k in enumerate(sorted({program.buffers[n].kind for n in roots}))}
    diff = np.zeros((2 + len(kinds), nsteps + 1, tiles), dtype=np.int64)
    for name in roots:
        buf = program.buffers[name]
        a, b = spans[name]
        tb = rsize[name]
        for row in (0 if buf.region == "interleaved" else 1, kinds[buf.kind]):
            diff[row, a] += tb
            diff[row, b + 1] -= tb
    live = np.cumsum(diff, axis=1, out=diff)[:, :-1]    # (in place: a tower's program has thousands of steps)
    il, st = live[0], live[1]
    cap = target.usable_standard_bytes
    spill = np.maximum(st - cap, 0)
    std = st - spill
    inter = il + spill
    total = std + inter
    by_kind = dict(zip(kinds, live[2:].max(axis=1)))
    return Memory(std.max(axis=0), inter.max(axis=0), total.max(axis=0), by_kind)
