"""MidGraph -> TileProgram: passes, allocation, expansion into vertices and transfers.

1. The program-level low passes (``passes.PASSES``, stage "program").
2. Every conversion that changes a local format (row-major <-> AMP panels)
   must have its rearrangement kernel registered (``pack``/``unpack``); the
   check runs before any copy is expanded, so a missing kernel is one clear
   error, not a program of per-element copies.
3. ``allocate`` places every buffer on every tile.
4. Expansion: compute steps become vertex groups (one kernel call, one
   variant, many tiles) with absolute operand addresses; exchange steps become
   transfer tables (one row per fragment and destination) plus, for same-tile
   fragments, a compute set of ``copy`` vertices right after the exchange.
5. The tile-level passes (stage "tiles"), e.g. merging adjacent transfers.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..errors import TileplanError
from ..estimate.exchange import Transfers, fragments_to_transfers
from ..program import ComputeStep, ExchangeStep, Program, alias_root
from ..kernels import NoVariantError, default_registry, dispatch
from ..kernels.calls import CopyCall, PackCall, UnpackCall
from .allocate import allocate
from .block_moves import BlockMove, CopyPlans
from .passes import PASSES
from .passes.state import LoweringState
from .tile_program import (ArrayPool, BufferInfo, ComputeSet, Exchange, Placement, RowNumbers, TileProgram,
                           VertexGroup, absolute, on_buffers)


def return_freed_memory() -> None:
    """Give freed heap memory back to the system (glibc only; elsewhere nothing).

    Lowering makes and drops large transient tables; glibc's heap keeps what they freed. Trimming
    it once lowering is done returns that memory before the package is written. (The allocator's
    mmap threshold is left as glibc sets it: when it was fixed at 1 MiB, every table above it was
    mapped and unmapped, and on the 27-layer tower, whose layers now share most of their tables,
    that cost 4.8 s of system time for 6% less peak memory: 2.05 GB against 2.18 GB.)"""
    import ctypes
    import ctypes.util
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


def lower(program: Program, target, *, registry=None, passes=None, block_moves: bool = True) -> LoweringState:
    """Lower a whole-graph program; returns the state holding ``tile_program`` and the pass log.
    ``passes``: the names of the low passes to run (default all, in ``PASSES`` order);
    ``block_moves``: the expansion's own option (``expand``), whichever passes run."""
    registry = registry or default_registry()
    chosen = PASSES if passes is None else [p for p in PASSES if p.name in passes]
    state = LoweringState(program, target, aliases=dict(program.aliases))   # the views fragments declared
    for p in chosen:
        if p.stage == "program":
            state = p.run(state)
    check_rearrangements(state.program, target, registry, state.plans)
    alloc = allocate(state.program, target, state.aliases, state.sizes)
    state.tile_program = expand(state.program, alloc, target, registry, state.aliases, block_moves=block_moves,
                                plans=state.plans, pool=state.pool)
    state.plans = CopyPlans(target.tiles)       # expanded: do not keep the copy plans alive
    state.placement = Placement(state.pool, state.numbers, state.tile_program.addr, state.tile_program.size)
    unused: set = set()
    spans = _tile_spans(state.program, state.tile_program, unused)
    for info in state.tile_program.buffers:
        root = alias_root(info.name, state.aliases)
        info.alias_of = root if root != info.name else None
        # An alias no step touches takes its root's span: its bytes count on the root, its by-use
        # lifetime (0, 0) must not stretch the root's (``estimate.memory.alias_roots``).
        info.span = spans[root] if info.name in unused and root != info.name else spans[info.name]
    for p in chosen:
        if p.stage == "tiles":
            state = p.run(state)
    for st in state.tile_program.steps:
        if isinstance(st, Exchange):
            if st.transfers is None:            # no pass merged it: its rows as expanded
                st.transfers, st.origin, st.sources = state.placement(st.parts)
            st.parts = None                     # lowering's own: not kept with the program
    state.tile_program.passes = [p.name for p in chosen]
    state.pool = ArrayPool()                    # a fresh one: the old index keeps replaced tables alive
    state.numbers = RowNumbers()                # (the origins' numbers stay valid: they are plain ints)
    state.placement = None
    return_freed_memory()
    return state


def _tile_spans(program: Program, tp, unused: set | None = None) -> dict[str, list[int]]:
    """Buffer lifetimes in tile-program steps: each program step became zero, one or two
    consecutive tile steps (an exchange and its on-tile copies). ``unused`` collects the buffers
    no step touches (``estimate.memory.buffer_lifetimes``)."""
    from ..estimate.memory import buffer_lifetimes
    first, last, j = [], [], 0
    for step in program.steps:
        k = j
        while k < len(tp.steps) and tp.steps[k].name in (step.name, step.name + ".local"):
            k += 1
        first.append(j)
        last.append(max(k - 1, j))
        j = k
    n = max(len(tp.steps), 1)
    out = {}
    for name, (a, b) in buffer_lifetimes(program, unused).items():
        out[name] = [min(first[a], n - 1) if first else 0, min(last[b], n - 1) if last else 0]
    return out


def check_rearrangements(program: Program, target, registry, plans=None) -> None:
    """Every copy between row-major and panel formats needs its pack/unpack kernel."""
    plans = plans or CopyPlans(target.tiles)
    for step in program.steps:
        if not isinstance(step, ExchangeStep):
            continue
        for cp in step.copies:
            src, dst = program.buffers[cp.src], program.buffers[cp.dst]
            plan = plans(src, dst)
            if not plan.needs_rearrangement or plan.is_identity:
                continue
            sfmt, dfmt = plan.needs_rearrangement
            rows, cols = int(np.prod(src.shape[:-1])), src.shape[-1]
            grain = target.grain(src.dtype)
            call = (PackCall if dfmt == "panels" else UnpackCall)(rows, cols, src.dtype, grain)
            try:
                dispatch(call, target, registry=registry)
            except NoVariantError as exc:
                raise TileplanError(
                    f"conversion of {src.tensor or src.name!r} from {src.layout} ({sfmt}) to {dst.layout} ({dfmt}) "
                    f"needs the {call.primitive!r} rearrangement kernel, which the registry for target family "
                    f"{target.family!r} lacks: {str(exc).splitlines()[0]}") from None


def expand(program: Program, alloc, target, registry, aliases: dict[str, str] | None = None,
           block_moves: bool = True, plans=None, pool: ArrayPool | None = None) -> TileProgram:
    """The tile program of ``program`` placed by ``alloc``. ``block_moves``: copies between grids of the
    same blocks become one exchange row per block (``lowering.block_moves``: each block is one
    contiguous run in both memories); what the expansion makes does not depend on which passes
    follow. ``block_moves=False``: every copy row by row (the reference the tests compare with).
    ``pool``: equal tables become one array (``tile_program.ArrayPool``; a tower's layers share theirs)."""
    tiles = target.tiles
    plans = plans or CopyPlans(tiles)
    pool = pool or ArrayPool()
    index = {n: i for i, n in enumerate(alloc.names)}
    infos = []
    for n in alloc.names:
        b = program.buffers[n]
        infos.append(BufferInfo(n, b.dtype.value, list(b.shape), b.kind, b.region, str(b.layout), b.tensor,
                                bool(b.transpose), int(b.scale),
                                space=getattr(b.layout, "index_space", "rows")))
    steps = []
    layouts: dict = {}
    for step in program.steps:
        if isinstance(step, ComputeStep):
            steps.append(ComputeSet(step.name, _groups(program, step, alloc, index, pool, layouts)))
        else:
            local, fragments, parts = _step_traffic(program, step, tiles, index, aliases or {}, block_moves, plans)
            local = Transfers.concat([local, _unaliased_identity_runs(program, step, aliases or {}, tiles, index, plans)])
            rows = sum(len(p[0]) for p in parts)
            if rows:            # its table: made from the parts when asked (``lower``; merge_transfers merges them)
                steps.append(Exchange(step.name, None, fragments if fragments != rows else None, parts))
            if len(local):
                steps.append(ComputeSet(step.name + ".local", _copy_groups(_absolute(local, alloc), target, registry,
                                                                           pool)))
    io_maps = {}
    for n in alloc.names:
        b = program.buffers[n]
        if b.kind in ("input", "parameter", "output"):
            om = b.owner_map(tiles)
            io_maps[n] = (om.tile, om.start, om.stop, om.offset)
    return TileProgram(tiles, infos, alloc.addr, alloc.size, steps, io_maps)


def _step_traffic(program, step, tiles, index, aliases, block_moves: bool, plans) -> tuple:
    """``step_traffic(merge=False)`` of one exchange step, copy by copy, with block moves (when allowed)
    one row per block: its on-tile runs, the exchange fragments its rows stand for (row by row), and per
    copy its exchange rows with buffer ids 0 (shared by the copies with one plan: ``Exchange.parts``)."""
    sources = [alias_root(cp.src, aliases) for cp in step.copies]
    loc_parts, fragments, parts = [], 0, []
    for cp, root_src in zip(step.copies, sources):
        src, dst = program.buffers[cp.src], program.buffers[cp.dst]
        block = block_moves and sources.count(root_src) == 1   # no other copy reads this memory (see block_moves)
        if block and not isinstance(plans(src, dst), BlockMove):
            block = False
        if block:
            ex, loc, n = plans.traffic(src, dst, True, _block_traffic)
        else:
            ex, loc, n = plans.traffic(src, dst, False, lambda plan: _copy_traffic(plan, src.dtype.itemsize))
        fragments += n
        if len(ex):
            parts.append((ex, index[cp.src], index[cp.dst]))
        loc_parts.append(on_buffers(loc, index[cp.src], index[cp.dst]))
    return Transfers.concat(loc_parts), fragments, tuple(parts)


def _block_traffic(move: BlockMove) -> tuple[Transfers, Transfers, int]:
    """A block move's (exchange rows, on-tile runs, fragments the exchange rows stand for), buffer ids 0."""
    ex, loc = move.traffic(0, 0)
    return ex, loc, move.row_fragments() if len(ex) else 0


def _copy_traffic(plan, item: int) -> tuple[Transfers, Transfers, int]:
    """``step_traffic(merge=False)`` of one copy from its plan: (exchange rows, on-tile runs, exchange
    fragments), buffer ids 0."""
    if len(plan.start) == 0 or (plan.is_identity and not plan.needs_rearrangement):
        return Transfers.empty(), Transfers.empty(), 0    # the destination aliases the source
    nbytes = (plan.stop - plan.start) * item
    so, do = plan.src_offset * item, plan.dst_offset * item
    loc = plan.src_tile == plan.dst_tile
    ex = ~loc
    cols = (plan.src_tile, so, plan.dst_tile, do, nbytes)
    local = fragments_to_transfers(*(c[loc] for c in cols), multicast=False) if loc.any() \
        else Transfers.empty()
    moved = fragments_to_transfers(*(c[ex] for c in cols), merge=False) if ex.any() \
        else Transfers.empty()
    return moved, local, len(moved)


def _unaliased_identity_runs(program, step, aliases, tiles, index, plans) -> Transfers:
    """On-tile copy runs for the identity copies of a step whose destination has its own memory.

    ``step_traffic`` leaves out copies that move nothing, because
    ``eliminate_noop_copies`` makes their destination an alias of the source.
    When that pass did not run (or did not alias the pair), the destination is
    a separate buffer and its bytes still have to be copied on the tile.
    """
    parts = []
    for cp in step.copies:
        if alias_root(cp.src, aliases) == alias_root(cp.dst, aliases):
            continue
        src, dst = program.buffers[cp.src], program.buffers[cp.dst]
        plan = plans(src, dst)
        if isinstance(plan, BlockMove):
            if plan.is_identity:
                parts.append(plan.traffic(index[cp.src], index[cp.dst], identity=True)[1])
            continue
        if len(plan.start) == 0 or not plan.is_identity or plan.needs_rearrangement:
            continue
        item = src.dtype.itemsize
        parts.append(fragments_to_transfers(plan.src_tile, plan.src_offset * item, plan.dst_tile,
                                            plan.dst_offset * item, (plan.stop - plan.start) * item,
                                            index[cp.src], index[cp.dst], multicast=False))
    return Transfers.concat(parts)


def _absolute(tr, alloc):
    """Buffer-relative transfer offsets -> absolute byte addresses on the tiles."""
    return absolute(tr, alloc.addr)


def _groups(program, step, alloc, index, pool, layouts: dict) -> list[VertexGroup]:
    """The vertex groups of a compute step, placed by ``alloc``. The grouping (which vertices share a
    call, their tiles and operand offsets) is worked out once per original step (``layouts``, by
    ``id``) and shared by its renamings (``ComputeStep.source``: a tower's repeated layers), which
    differ only in the buffers their operands name: each is placed by looking its buffers up."""
    root, names = step.source if step.source is not None else (step, None)
    here = root.buffers if names is None else [names[b] for b in root.buffers]
    got = layouts.get(id(root))
    if got is None:
        item = {b: program.buffers[h].dtype.itemsize for b, h in zip(root.buffers, here)}
        got = layouts[id(root)] = (root, _group_layout(root, item))
    buf = np.array([index[h] for h in here], dtype=np.int64)
    groups = []
    for call, variant, cycles, in_bytes, out_bytes, tiles, ins, outs in got[1]:
        ins_at = _operand_addresses(tiles, buf, *ins, alloc, here)
        outs_at = _operand_addresses(tiles, buf, *outs, alloc, here)
        groups.append(VertexGroup(call, variant, cycles, in_bytes, out_bytes, pool(tiles), pool(ins_at),
                                  pool(outs_at)))
    return groups


def _group_layout(step, item: dict) -> list[tuple]:
    """A compute step's vertices grouped (one call, one variant, equal operand sizes), in group order:
    per group its call, variant, cycles per vertex, operand byte sizes, tiles (int32 [n]), and per
    operand side (positions of the buffers in ``step.buffers`` int64 [n, k], byte offsets int64 [n, k])."""
    pos = {b: i for i, b in enumerate(step.buffers)}
    buckets: dict = defaultdict(list)
    for v in step.vertices:
        key = (v.call, v.variant, tuple(o.count for o in v.ins), tuple(o.count for o in v.outs),
               tuple(item[o.buffer] for o in v.ins + v.outs))
        buckets[key].append(v)
    out = []
    for key in sorted(buckets, key=lambda k: (k[0].primitive, str(k[0]), k[1], k[2], k[3])):
        vs = buckets[key]
        tiles = np.array([v.tile for v in vs], dtype=np.int32)
        sides = []
        for operands in ([v.ins for v in vs], [v.outs for v in vs]):
            n, k = len(operands), len(operands[0])
            flat = [o for ops in operands for o in ops]
            where = np.array([pos[o.buffer] for o in flat], dtype=np.int64).reshape(n, k)
            off = np.array([o.offset * item[o.buffer] for o in flat], dtype=np.int64).reshape(n, k)
            sides.append((where, off))
        size = lambda o: o.count * item[o.buffer]  # noqa: E731
        out.append((key[0], key[1], vs[0].cycles, tuple(size(o) for o in vs[0].ins),
                    tuple(size(o) for o in vs[0].outs), tiles, *sides))
    return out


def _operand_addresses(tiles, buf, where, off, alloc, names) -> np.ndarray:
    """int64 [vertices, k]: the absolute byte address of each vertex's k operands on its tile
    (``where``: positions in ``buf``, the allocation index of the step's buffers, named ``names``)."""
    base = alloc.addr[buf[where], tiles.astype(np.int64)[:, None]]
    if (base < 0).any():
        i = int(np.argmax((base < 0).reshape(-1)))
        k = where.shape[1]
        raise TileplanError(f"vertex on tile {int(tiles[i // k])} reads {names[int(where.reshape(-1)[i])]!r}, "
                            "which has no bytes there")
    return base + off


def _copy_groups(runs, target, registry, pool) -> list[VertexGroup]:
    groups = []
    for n in np.unique(runs.nbytes).tolist():
        sel = np.flatnonzero(runs.nbytes == n)
        call = CopyCall(int(n))
        v = dispatch(call, target, registry=registry)
        groups.append(VertexGroup(call, v.name, v.cycles(call, target), (int(n),), (int(n),),
                                  pool(runs.src_tile[sel], np.int32), pool(runs.src_off[sel][:, None], np.int64),
                                  pool(runs.dst_off[sel][:, None], np.int64)))
    return groups
