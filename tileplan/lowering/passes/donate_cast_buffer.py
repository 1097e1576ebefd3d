"""Donate a dead buffer to a cast's output.

A cast whose input buffer is not read after the cast, holds at least as many
bytes on every tile as the output, and is an intermediate (not a host input,
parameter or output) gives its memory to the output: the cast runs in place.
It is only done where each tile runs at most one vertex of the cast and both
pieces start at offset 0, so no vertex writes bytes another vertex reads.
"""

from __future__ import annotations

import numpy as np

from ...estimate.memory import buffer_lifetimes, buffer_tile_bytes
from ...program import ComputeStep


def run(state):
    prog, target = state.program, state.target
    spans = buffer_lifetimes(prog)
    for i, step in enumerate(prog.steps):
        if not isinstance(step, ComputeStep) or step.primitives != {"cast"}:
            continue
        # A renamed step (a tower's later layers) is read through its source's vertices.
        root, names = step.source if step.source is not None else (step, None)
        ins = {v.ins[0].buffer for v in root.vertices}
        outs = {v.outs[0].buffer for v in root.vertices}
        if len(ins) != 1 or len(outs) != 1:
            continue
        src, dst = ins.pop(), outs.pop()
        src, dst = (prog.buffers[b if names is None else names[b]] for b in (src, dst))
        tiles = [v.tile for v in root.vertices]
        if len(set(tiles)) != len(tiles) or any(v.ins[0].offset or v.outs[0].offset for v in root.vertices):
            continue
        if src.kind not in ("tensor", "transient") or dst.kind not in ("tensor", "transient"):
            continue
        if spans[src.name][1] != i or src.name in state.aliases or dst.name in state.aliases:
            continue
        if any(a == src.name or a == dst.name for a in state.aliases.values()):
            continue
        if src.dtype.itemsize < dst.dtype.itemsize:
            continue
        need = buffer_tile_bytes(dst, target.tiles, target.alignment)
        have = buffer_tile_bytes(src, target.tiles, target.alignment)
        if np.any(need > have):
            continue
        state.aliases[dst.name] = src.name
        state.log.append(f"donate_cast_buffer: {dst.name} takes over {src.name} at {step.name}")
    return state
