"""Detailed estimates: per-tile costing of a fragment program (survivors only).

Compute steps: per tile, the sum of its vertices' cycles (each vertex is a
six-worker call whose formula already spreads the work over the workers); the
step lasts as long as the slowest tile. Exchange steps: the copy plans of every
copy in the step are cut into fragments by exact interval intersection, merged
into transfers (``estimate.exchange``), and priced per tile; fragments whose
source and destination tile agree are on-tile copies, priced with the ``copy``
kernel in a compute set right after the exchange. Memory: ``estimate.memory``.

``cost_program`` returns an ``Estimate`` plus the per-step breakdown that the
report and the estimate-versus-simulation comparison use.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from ..layout.convert import plan_copy
from ..layout.panels import panel_coords
from .cost import Estimate
from .exchange import (Transfers, fragments_to_transfers, link_bytes, pair_aligned, phase_cycles, phase_sync,
                       tile_exchange_cycles, tile_sum)
from .memory import program_memory
from ..program import ComputeStep, ExchangeStep, Program, alias_root


@dataclass(frozen=True)
class StepCost:
    name: str
    kind: str                 # "compute" | "exchange" | "local_copy"
    cycles: int               # slowest tile (exchange: without the sync)
    sync: int                 # sync cycles charged to this step
    bytes: int                # bytes moved (exchange) or copied (local)
    step: int = -1            # the index of the program step it costs (an exchange may give two)


@dataclass
class Detailed:
    estimate: Estimate
    steps: list[StepCost] = field(default_factory=list)
    tile_memory: np.ndarray | None = None     # int64 [tiles]: peak bytes per tile
    memory: object = None                     # estimate.memory.Memory: per tile, per class and kind


def step_traffic(program: Program, step: ExchangeStep, tiles: int, buf_ids: dict[str, int] | None = None,
                 *, merge: bool = True, identity_runs: bool = False) -> tuple[Transfers, Transfers]:
    """(exchange transfers, on-tile copy runs) of one exchange step; offsets are buffer-relative bytes.

    A copy whose every fragment stays at its offset on its tile is an identity:
    the destination buffer aliases the source and nothing runs; with
    ``identity_runs`` (the destination is already a view of other memory: a
    Concat's window of its output) its fragments are on-tile copy runs, as
    lowering makes them (``lowering.lower._unaliased_identity_runs``). Otherwise
    same-tile fragments are on-tile copy runs (the ``copy`` kernel, one vertex
    per run) and the rest are exchange transfers.
    """
    ex_parts, loc_parts = [], []
    for cp in step.copies:
        src, dst = program.buffers[cp.src], program.buffers[cp.dst]
        item = src.dtype.itemsize
        plan = plan_for(src, dst, tiles)
        if len(plan.start) == 0 or (plan.is_identity and not plan.needs_rearrangement and not identity_runs):
            continue           # the destination aliases the source (lowering.passes.eliminate_noop_copies)
        nbytes = (plan.stop - plan.start) * item
        so, do = plan.src_offset * item, plan.dst_offset * item
        sid = buf_ids[cp.src] if buf_ids else 0
        did = buf_ids[cp.dst] if buf_ids else 0
        loc = plan.src_tile == plan.dst_tile
        moved = loc
        if moved.any():
            loc_parts.append(fragments_to_transfers(plan.src_tile[moved], so[moved], plan.dst_tile[moved],
                                                    do[moved], nbytes[moved], sid, did, multicast=False))
        ex = ~loc
        if ex.any():
            ex_parts.append(fragments_to_transfers(plan.src_tile[ex], so[ex], plan.dst_tile[ex], do[ex],
                                                   nbytes[ex], sid, did, merge=merge))
    return Transfers.concat(ex_parts), Transfers.concat(loc_parts)


def moves_nothing(src, dst, tiles: int) -> bool:
    """The copy keeps every element on its tile at its offset: the destination can alias the source.

    Answers from the blocks, without the fragment plan, the two questions a GEMM's copies ask
    often: grids of the same blocks (partials to reducers) alias when every block stays put; a
    multicast into a replicated grid from an unreplicated source always moves something.

    Cached by what the answer depends on (layouts, shapes, dtypes): a tower's layers ask the same
    questions of buffers with other names."""
    if getattr(src.layout, "index_space", "rows") != getattr(dst.layout, "index_space", "rows"):
        plan_for(src, dst, tiles)           # the error, naming the buffers
    return _moves_nothing(src.layout, dst.layout, tuple(src.shape), tuple(dst.shape), src.dtype, dst.dtype, tiles)


@functools.lru_cache(maxsize=4096)
def _moves_nothing(sl, dl, src_shape, dst_shape, src_dtype, dst_dtype, tiles: int) -> bool:
    from ..layout.gemm_grid import Grid
    from ..program import Buffer
    from .blocks import block_move
    src, dst = Buffer("src", sl, src_shape, src_dtype), Buffer("dst", dl, dst_shape, dst_dtype)
    if sl == dl and tuple(src.shape) == tuple(dst.shape) and src.dtype == dst.dtype:
        return True
    if isinstance(dl, Grid) and sl != dl and dl.index_space == getattr(sl, "index_space", "rows"):
        move = block_move(src, dst)
        if move is not None:
            return move.is_identity
        h = dl.holder_array()
        rb, cb = np.asarray(dl.row_bounds), np.asarray(dl.col_bounds)
        nonempty = (np.diff(rb)[:, None] * np.diff(cb)[None, :]) > 0
        multi = ((h[:, :, 1:] >= 0) & (h[:, :, 1:] != h[:, :, :1])).any(axis=2) & nonempty
        if multi.any() and sl.owner_map(tuple(src.shape), src.dtype, tiles).replicas == 1:
            return False
    plan = plan_for(src, dst, tiles)
    return plan.is_identity and not plan.needs_rearrangement


def plan_for(src, dst, tiles: int):
    a, b = (getattr(x.layout, "index_space", "rows") for x in (src, dst))
    if a != b:
        raise ValueError(f"copy {src.name} -> {dst.name} mixes index spaces {a} and {b}")
    return _plan_cached(src.layout, dst.layout, tuple(src.shape), tuple(dst.shape), src.dtype, tiles)


@functools.lru_cache(maxsize=16)       # plans may hold millions of fragments: keep few
def _plan_cached(src_layout, dst_layout, src_shape, dst_shape, dtype, tiles):
    if src_shape != dst_shape and int(np.prod(src_shape)) != int(np.prod(dst_shape)):
        raise ValueError(f"copy between shapes {src_shape} and {dst_shape}")
    return plan_copy(src_layout.owner_map(src_shape, dtype, tiles),
                     dst_layout.owner_map(dst_shape, dtype, tiles), dtype.itemsize)


def local_copy_cycles(runs: Transfers, target) -> np.ndarray:
    """Per tile cycles of on-tile copy runs: one ``copy`` kernel call per run."""
    from ..kernels import dispatch
    from ..kernels.calls import CopyCall
    out = np.zeros(target.tiles, dtype=np.int64)
    if len(runs) == 0:
        return out
    sizes, inv = np.unique(runs.nbytes, return_inverse=True)
    cyc = np.array([dispatch(CopyCall(int(n)), target).cycles(CopyCall(int(n)), target) for n in sizes])
    np.add.at(out, runs.src_tile, cyc[inv.reshape(-1)])
    return out


@dataclass(frozen=True, eq=False)
class CopyCost:
    """Per-tile cost of one copy: additive over the copies of an exchange step."""

    send: np.ndarray          # int64 [tiles] send cycles of its transfers
    recv: np.ndarray          # int64 [tiles] receive cycles
    nbytes: int               # bytes over the exchange (per destination)
    transfers: int            # transfer rows
    local_cycles: np.ndarray  # int64 [tiles] cycles of its on-tile copy runs
    local_bytes: int
    local_runs: int
    links: np.ndarray         # int64 [ipus * ipus] cross-IPU bytes per IPU pair (estimate.exchange.link_bytes)


def copy_cost(src, dst, target, into_view: bool = False) -> "CopyCost | None":
    """The cost of copying ``src`` into ``dst`` (None when the copy moves nothing), cached by layouts:
    the same preparation copy recurs across boundary combinations and candidates. ``into_view``:
    ``dst`` is a view of other memory than ``src``'s, so a copy that keeps every element at its
    offset still copies on the tile (``step_traffic``'s ``identity_runs``)."""
    return _copy_cost(src.layout, dst.layout, tuple(src.shape), tuple(dst.shape), src.dtype, target, into_view)


@functools.lru_cache(maxsize=4096)
def _copy_cost(src_layout, dst_layout, src_shape, dst_shape, dtype, target, into_view=False):
    from ..program import Buffer, Copy
    for fast_path in (_replicated_grid_cost, _block_move_cost):
        fast = fast_path(src_layout, dst_layout, src_shape, dtype, target)
        if fast is not False and not (into_view and fast is None):
            return fast
    prog = Program({"s": Buffer("s", src_layout, src_shape, dtype), "d": Buffer("d", dst_layout, dst_shape, dtype)})
    tr, local = step_traffic(prog, ExchangeStep("copy", (Copy("s", "d"),)), target.tiles, identity_runs=into_view)
    return _traffic_cost(tr, local, target)


def _traffic_cost(tr: Transfers, local: Transfers, target) -> "CopyCost | None":
    if len(tr) == 0 and len(local) == 0:
        return None
    send, recv = tile_exchange_cycles(tr, target)
    out = CopyCost(send, recv, int(tr.nbytes.sum()), len(tr), local_copy_cycles(local, target),
                   int(local.nbytes.sum()) if len(local) else 0, len(local), link_bytes(tr, target))
    for a in (out.send, out.recv, out.local_cycles):
        a.flags.writeable = False
    return out


def _block_move_cost(src_layout, dst_layout, shape, dtype, target):
    """The cost of a copy between two grids of the same blocks, block by block (``False``: not
    applicable): a GEMM's partials moving to their reducers (``estimate.blocks``). The row-by-row
    plan that ``step_traffic`` builds (one fragment per block row, millions for a big GEMM) merges
    back into exactly these runs, so pricing one fragment per block gives the same transfers."""
    from .blocks import block_move
    from ..program import Buffer
    if dtype is None:
        return False
    move = block_move(Buffer("s", src_layout, shape, dtype), Buffer("d", dst_layout, shape, dtype))
    if move is None:
        return False
    if move.is_identity:
        return None                       # the destination aliases the source
    return _traffic_cost(*move.traffic(merge=True), target)


def _replicated_grid_cost(src_layout, dst_layout, shape, dtype, target):
    """The cost of a copy into a replicated GEMM grid, from its replica-0 plan (``False``: not applicable).

    A preparation copy multicasts every fragment to the block's replicas, which hold
    it at the same offset. Planning the copy into replica 0 only and expanding each
    fragment to its block's holders gives the same transfers as planning the full
    replicated copy (as ``step_traffic`` does, which lowering uses), at 1/r of the
    planning work. Applies when the source is not replicated, every block is held by
    all or none of its replicas at one offset, and replica 0 alone lays out the same.
    """
    from ..layout.gemm_grid import Grid
    if not isinstance(dst_layout, Grid) or dst_layout.replicas < 2 or dtype is None:
        return False
    if target.ipus > 1:          # the links' charge needs the transfers themselves: the general path
        return False
    item = dtype.itemsize
    h = dst_layout.holder_array()
    held = h >= 0
    if not (held.all(axis=2) | ~held.any(axis=2)).all():
        return False
    off = dst_layout.block_offsets(item)
    base = Grid(dst_layout.row_bounds, dst_layout.col_bounds, np.ascontiguousarray(h[:, :, :1]).tobytes(), 1,
                dst_layout.grain, dst_layout.align_bytes, dst_layout.panel_space)
    b_off = base.block_offsets(item)[:, :, 0]
    full = held.all(axis=2)
    if not ((off == off[:, :, :1]).all(axis=2) | ~full).all() or not (b_off == off[:, :, 0])[full].all():
        return False
    src_om = src_layout.owner_map(shape, dtype, target.tiles)
    if src_om.replicas != 1 or getattr(src_layout, "index_space", "rows") != dst_layout.index_space:
        return False
    plan0 = plan_copy(src_om, base.owner_map(shape, dtype, target.tiles), item)
    if len(plan0.start) == 0:
        return None
    # The block of each fragment, from its first element.
    rows = int(np.prod(shape[:-1]))
    cols = shape[-1]
    idx = plan0.start
    if dst_layout.index_space != "rows":
        r, c = panel_coords(idx, rows, cols, dst_layout.grain)
    else:
        r, c = idx // cols, idx % cols
    bi = np.searchsorted(np.asarray(dst_layout.row_bounds), r, side="right") - 1
    bj = np.searchsorted(np.asarray(dst_layout.col_bounds), c, side="right") - 1
    block = bi * h.shape[1] + bj
    # Merge runs contiguous in both memories within one block (what step_traffic's merge does).
    m = fragments_to_transfers(plan0.src_tile, plan0.src_offset * item, block, plan0.dst_offset * item,
                               (plan0.stop - plan0.start) * item, multicast=False)
    blk = m.dst_tile.astype(np.int64)
    src = m.src_tile.astype(np.int64)
    n = m.nbytes
    tiles = target.tiles
    # Per block, its holders as one row of a [blocks, tiles] table, to ask "is tile t a holder of
    # block b" for many (b, t) at once without a fragments x replicas matrix (t outside the tiles,
    # as t ^ 1 of an unheld slot, holds nothing).
    hb = h.reshape(-1, h.shape[2])
    holder = np.zeros((len(hb), tiles), dtype=bool)
    rows_of, cols_of = np.nonzero(hb >= 0)
    holder[rows_of, hb[rows_of, cols_of]] = True

    def holds(b, t):
        inside = (t >= 0) & (t < tiles)
        return inside & holder[b, np.where(inside, t, 0)]

    r = hb.shape[1]
    has_local = holds(blk, src)                  # the source tile holds the block: an on-tile copy
    remotes = r - has_local                      # remote destinations of each fragment
    # Pairs (estimate.exchange.split_for_pairs): the block's holders whose partner t ^ 1 holds it too
    # take an aligned fragment paired, 8 B/cycle, in one send; the other remote holders in a second
    # send at 4 B/cycle. A source holding the block takes itself out and leaves its partner unpaired.
    flat = hb.reshape(-1)
    held_flat = flat >= 0
    hb_blocks = np.repeat(np.arange(len(hb)), r)
    paired_holder = held_flat & holds(hb_blocks, flat ^ 1)
    n_paired = np.bincount(hb_blocks[paired_holder], minlength=len(hb))
    n_held = np.bincount(hb_blocks[held_flat], minlength=len(hb))
    src_paired = has_local & holds(blk, src ^ 1)
    n_p = n_paired[blk] - 2 * src_paired                           # paired destinations
    n_u = (n_held - n_paired)[blk] + src_paired - (has_local & ~src_paired)
    aligned = pair_aligned(m.src_off, m.dst_off, n)
    paired = aligned & (n_p > 0)
    c8 = -(-n // target.paired_bytes_per_cycle)
    c4 = -(-n // target.exchange_bytes_per_cycle)
    sctrl, rctrl = target.send_control_cycles, target.receive_control_cycles
    s_cyc = np.where(paired, c8 + sctrl + np.where(n_u > 0, c4 + sctrl, 0), np.where(remotes > 0, c4 + sctrl, 0))
    partner_tile = src ^ 1
    borrow = paired & (partner_tile < tiles)
    send = tile_sum(src, s_cyc, tiles) + tile_sum(partner_tile[borrow], c8[borrow] + sctrl, tiles)
    # Receives: per block, what a paired holder and an unpaired holder take from all its fragments;
    # then the source takes nothing of its own fragment and its partner takes it unpaired.
    c_p = np.where(aligned, c8, c4)
    per_paired = tile_sum(blk, c_p + rctrl, len(hb))
    per_unpaired = tile_sum(blk, c4 + rctrl, len(hb))
    take = np.where(paired_holder, np.repeat(per_paired, r), np.repeat(per_unpaired, r))
    own = np.where(src_paired, c_p, c4) + rctrl
    recv = tile_sum(flat[held_flat], take[held_flat], tiles) - tile_sum(src[has_local], own[has_local], tiles) \
        + tile_sum(partner_tile[src_paired], (c4 - c_p)[src_paired], tiles)
    nbytes = int((n * remotes).sum())
    lf = np.flatnonzero(has_local)
    if lf.size:
        runs = fragments_to_transfers(src[lf], m.src_off[lf], src[lf], m.dst_off[lf], n[lf], multicast=False)
        local_cycles = local_copy_cycles(runs, target)
        local_bytes, local_runs = int(runs.nbytes.sum()), len(runs)
    else:
        local_cycles, local_bytes, local_runs = np.zeros(tiles, dtype=np.int64), 0, 0
    out = CopyCost(send, recv, nbytes, int(remotes.sum()), local_cycles, local_bytes, local_runs,
                   np.zeros(1, dtype=np.int64))
    for a in (out.send, out.recv, out.local_cycles):
        a.flags.writeable = False
    return out


def cost_program(program: Program, target) -> Detailed:
    tiles = target.tiles
    compute = exchange = sync = moved = 0
    steps: list[StepCost] = []
    for index, step in enumerate(program.steps):
        if isinstance(step, ComputeStep):
            c = step.cycles
            compute += c
            steps.append(StepCost(step.name, "compute", c, 0, 0, index))
        elif isinstance(step, ExchangeStep):
            costs = [copy_cost(program.buffers[cp.src], program.buffers[cp.dst], target,
                               into_view=cp.dst in program.aliases
                               and alias_root(cp.src, program.aliases) != alias_root(cp.dst, program.aliases))
                     for cp in step.copies]
            costs = [c for c in costs if c is not None]
            if any(c.transfers for c in costs):
                send = sum(c.send for c in costs)
                recv = sum(c.recv for c in costs)
                pairs = sum(c.links for c in costs)
                c = phase_cycles(send, recv, pairs, target)
                s = phase_sync(True, pairs, target)
                b = sum(c.nbytes for c in costs)
                exchange += c
                sync += s
                moved += b
                steps.append(StepCost(step.name, "exchange", c, s, b, index))
            if any(c.local_runs for c in costs):
                lc = int(sum(c.local_cycles for c in costs).max())
                compute += lc
                steps.append(StepCost(step.name + ".local", "local_copy", lc, 0, sum(c.local_bytes for c in costs),
                                      index))
        else:
            raise TypeError(f"unknown step {step!r}")
    mem = program_memory(program, target)
    est = Estimate(compute=compute, exchange=exchange, sync=sync,
                   standard=int(mem.standard.max(initial=0)), interleaved=int(mem.interleaved.max(initial=0)),
                   total_memory=int(mem.total.max(initial=0)), bytes_moved=moved)
    return Detailed(est, steps, mem.total, mem)


def scheduled(program: Program, tiles: int) -> Program:
    """The program as lowering will schedule it: the program-stage low passes that change its cycles,
    run by the same functions, in the pass list's order: ``eliminate_noop_copies``
    (``program.alias_noop_copies``: copies that move nothing are dropped, their destination aliases
    the source) then ``group_exchanges`` (``program.group_exchange_steps``: independent exchanges
    back to back share one superstep). The other program-stage passes change memory only
    (``donate_cast_buffer``, ``omit_padding``): the estimate's memory stays the conservative bound."""
    from ..program import alias_noop_copies, group_exchange_steps
    aliases: dict[str, str] = dict(program.aliases)      # the views fragments declared
    steps, _ = alias_noop_copies(program.steps, program.buffers, aliases,
                                 lambda src, dst: moves_nothing(src, dst, tiles))
    steps, _ = group_exchange_steps(steps, aliases)
    return Program(dict(program.buffers), steps, aliases)
