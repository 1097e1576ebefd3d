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
from .cost import Estimate
from .exchange import Transfers, fragments_to_transfers, tile_exchange_cycles
from .memory import program_memory
from .program import ComputeStep, ExchangeStep, Program


@dataclass(frozen=True)
class StepCost:
    name: str
    kind: str                 # "compute" | "exchange" | "local_copy"
    cycles: int               # slowest tile (exchange: without the sync)
    sync: int                 # sync cycles charged to this step
    bytes: int                # bytes moved (exchange) or copied (local)


@dataclass
class Detailed:
    estimate: Estimate
    steps: list[StepCost] = field(default_factory=list)
    tile_memory: np.ndarray | None = None     # int64 [tiles]: peak bytes per tile
    memory: object = None                     # estimate.memory.Memory: per tile, per class and kind


def step_traffic(program: Program, step: ExchangeStep, tiles: int, buf_ids: dict[str, int] | None = None,
                 *, merge: bool = True) -> tuple[Transfers, Transfers]:
    """(exchange transfers, on-tile copy runs) of one exchange step; offsets are buffer-relative bytes.

    A copy whose every fragment stays at its offset on its tile is an identity:
    the destination buffer aliases the source and nothing runs. Otherwise
    same-tile fragments are on-tile copy runs (the ``copy`` kernel, one vertex
    per run) and the rest are exchange transfers.
    """
    ex_parts, loc_parts = [], []
    for cp in step.copies:
        src, dst = program.buffers[cp.src], program.buffers[cp.dst]
        item = src.dtype.itemsize
        plan = plan_for(src, dst, tiles)
        if len(plan.start) == 0 or (plan.is_identity and not plan.needs_rearrangement):
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


def copy_cost(src, dst, target) -> "CopyCost | None":
    """The cost of copying ``src`` into ``dst`` (None when the copy moves nothing), cached by layouts:
    the same preparation copy recurs across boundary combinations and candidates."""
    return _copy_cost(src.layout, dst.layout, tuple(src.shape), tuple(dst.shape), src.dtype, target)


@functools.lru_cache(maxsize=4096)
def _copy_cost(src_layout, dst_layout, src_shape, dst_shape, dtype, target):
    from .program import Buffer, Copy
    prog = Program({"s": Buffer("s", src_layout, src_shape, dtype), "d": Buffer("d", dst_layout, dst_shape, dtype)})
    tr, local = step_traffic(prog, ExchangeStep("copy", (Copy("s", "d"),)), target.tiles)
    if len(tr) == 0 and len(local) == 0:
        return None
    send, recv = tile_exchange_cycles(tr, target)
    out = CopyCost(send, recv, int(tr.nbytes.sum()), len(tr), local_copy_cycles(local, target),
                   int(local.nbytes.sum()) if len(local) else 0, len(local))
    for a in (out.send, out.recv, out.local_cycles):
        a.flags.writeable = False
    return out


def cost_program(program: Program, target) -> Detailed:
    tiles = target.tiles
    compute = exchange = sync = moved = 0
    steps: list[StepCost] = []
    for step in program.steps:
        if isinstance(step, ComputeStep):
            per_tile = np.zeros(tiles, dtype=np.int64)
            for v in step.vertices:
                per_tile[v.tile] += v.cycles
            c = int(per_tile.max()) if step.vertices else 0
            compute += c
            steps.append(StepCost(step.name, "compute", c, 0, 0))
        elif isinstance(step, ExchangeStep):
            costs = [copy_cost(program.buffers[cp.src], program.buffers[cp.dst], target) for cp in step.copies]
            costs = [c for c in costs if c is not None]
            if any(c.transfers for c in costs):
                send = sum(c.send for c in costs)
                recv = sum(c.recv for c in costs)
                c = int(np.maximum(send, recv).max())
                b = sum(c.nbytes for c in costs)
                exchange += c
                sync += target.sync_cycles
                moved += b
                steps.append(StepCost(step.name, "exchange", c, target.sync_cycles, b))
            if any(c.local_runs for c in costs):
                lc = int(sum(c.local_cycles for c in costs).max())
                compute += lc
                steps.append(StepCost(step.name + ".local", "local_copy", lc, 0, sum(c.local_bytes for c in costs)))
        else:
            raise TypeError(f"unknown step {step!r}")
    mem = program_memory(program, target)
    est = Estimate(compute=compute, exchange=exchange, sync=sync,
                   standard=int(mem.standard.max(initial=0)), interleaved=int(mem.interleaved.max(initial=0)),
                   total_memory=int(mem.total.max(initial=0)), bytes_moved=moved)
    return Detailed(est, steps, mem.total, mem)


def scheduled(program: Program, tiles: int) -> Program:
    """The program as lowering will schedule it: copies that move nothing are dropped (their
    destination aliases the source, as views do), and independent exchanges back to back share
    one superstep (``lowering.passes``: eliminate_noop_copies, group_exchanges)."""
    from .program import group_exchange_steps
    aliases = {b.name: b.view_of for b in program.buffers.values() if b.view_of is not None}
    steps = []
    for step in program.steps:
        if isinstance(step, ExchangeStep):
            keep = []
            for cp in step.copies:
                plan = plan_for(program.buffers[cp.src], program.buffers[cp.dst], tiles)
                if plan.is_identity and not plan.needs_rearrangement and cp.dst not in aliases:
                    aliases[cp.dst] = cp.src
                else:
                    keep.append(cp)
            if keep:
                steps.append(ExchangeStep(step.name, tuple(keep)))
        else:
            steps.append(step)
    steps, _ = group_exchange_steps(steps, aliases)
    return Program(dict(program.buffers), steps)
