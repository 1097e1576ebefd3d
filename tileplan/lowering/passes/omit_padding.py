"""Omit padding that is never read.

Grid blocks start 8-byte aligned, so a tile's piece of a block buffer may end
in alignment padding after its last block, and the estimate rounds every
buffer up to the alignment. No vertex and no transfer reads those bytes: the
allocation size becomes the end of the last element actually held.
"""

from __future__ import annotations

import numpy as np


def run(state):
    from ...estimate.memory import buffer_tile_bytes
    prog, target = state.program, state.target
    sizes: dict = {}          # (layout, shape, dtype) -> (exact, padded): a tower's layers share them
    for name in sorted(prog.buffers):
        buf = prog.buffers[name]
        key = (buf.layout, tuple(buf.shape), buf.dtype)
        if key not in sizes:
            om = buf.owner_map(target.tiles)
            sizes[key] = (om.bytes_per_tile(target.tiles, buf.dtype.itemsize),
                          buffer_tile_bytes(buf, target.tiles, target.alignment))
        exact, padded = sizes[key]
        if np.any(exact < padded):
            state.sizes[name] = exact
            state.log.append(f"omit_padding: {name} saves {int((padded - exact).max())} bytes on its worst tile")
    return state
