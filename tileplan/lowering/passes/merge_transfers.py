"""Merge adjacent fragments into one transfer.

Expansion emits one transfer per logical fragment of each copy plan. Runs
that continue each other in both the source and the destination tile's
memory, between the same two tiles, become one transfer (and identical runs
to several tiles one multicast), which saves the per-transfer control cycles.

Copy by copy, as the detailed estimate prices them (``estimate.detailed.step_traffic``): a
copy's runs are merged in its buffers' own offsets, which makes the merge the same for every
copy with the same plan (a tower's 27 layers: merged once, placed per layer by the buffers'
addresses; ``Exchange.parts``). A table without its copies (a tile program built by hand) is
merged as one. The result depends on the table only, so a table shared by several steps is
merged once.
"""

from __future__ import annotations

from ...estimate.exchange import Transfers, fragments_to_transfers
from ..tile_program import EXCHANGE_FIELDS, Exchange, Placement


def _merged(t: Transfers) -> Transfers:
    return fragments_to_transfers(t.src_tile, t.src_off, t.dst_tile, t.dst_off, t.nbytes, merge=True)


def run(state):
    tp = state.tile_program
    placement = state.placement or Placement(state.pool, state.numbers, tp.addr, tp.size)
    done: dict[tuple, tuple] = {}       # ids of a table's pooled columns -> (the table, kept alive; merged)
    per_copy: dict[int, tuple] = {}     # id of a copy's relative rows -> (the rows, kept alive; merged)
    for i, step in enumerate(tp.steps):
        if not isinstance(step, Exchange) or (not step.parts and len(step.transfers) == 0):
            continue
        t = step.transfers
        if step.parts:
            expanded = sum(len(p[0]) for p in step.parts)
            for rows, sid, did in step.parts:
                if id(rows) not in per_copy:
                    per_copy[id(rows)] = (rows, _merged(rows))
            merged, origin, sources = placement([(per_copy[id(rows)][1], sid, did) for rows, sid, did in step.parts])
        else:
            key = tuple(id(getattr(t, f)) for f in EXCHANGE_FIELDS)
            if key not in done:
                done[key] = (t, state.pool.transfers(_merged(t)))
            merged = done[key][1]
            origin = sources = None
        fragments = (expanded if step.parts else len(t)) if step.fragments is None else step.fragments
        if len(merged) < fragments:
            state.log.append(f"merge_transfers: {step.name}: {fragments} fragments -> {len(merged)} transfers")
        tp.steps[i] = Exchange(step.name, merged, origin=origin, sources=sources)
    return state
