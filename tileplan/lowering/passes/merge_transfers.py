"""Merge adjacent fragments into one transfer.

Expansion emits one transfer per logical fragment of each copy plan. Runs
that continue each other in both the source and the destination tile's
memory, between the same two tiles, become one transfer (and identical runs
to several tiles one multicast), which saves the per-transfer control cycles.

The result depends on the table only, so a table shared by several steps (a
tower's repeated layers, ``tile_program.ArrayPool``) is merged once.
"""

from __future__ import annotations

from ...estimate.exchange import fragments_to_transfers
from ..tile_program import EXCHANGE_FIELDS, Exchange


def run(state):
    tp = state.tile_program
    done: dict[tuple, tuple] = {}       # ids of a table's pooled columns -> (the table, kept alive; merged)
    for i, step in enumerate(tp.steps):
        if not isinstance(step, Exchange) or len(step.transfers) == 0:
            continue
        t = step.transfers
        key = tuple(id(getattr(t, f)) for f in EXCHANGE_FIELDS)
        if key not in done:
            done[key] = (t, state.pool.transfers(
                fragments_to_transfers(t.src_tile, t.src_off, t.dst_tile, t.dst_off, t.nbytes, merge=True)))
        merged = done[key][1]
        fragments = len(t) if step.fragments is None else step.fragments
        if len(merged) < fragments:
            state.log.append(f"merge_transfers: {step.name}: {fragments} fragments -> {len(merged)} transfers")
        tp.steps[i] = Exchange(step.name, merged)
    return state
