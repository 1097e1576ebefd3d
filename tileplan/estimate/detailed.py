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


def exchange_transfers(program: Program, step: ExchangeStep, tiles: int, buf_ids: dict[str, int] | None = None):
    """All transfers of one exchange step, and per-tile local-copy bytes (same-tile fragments)."""
    parts, local = [], np.zeros(tiles, dtype=np.int64)
    local_frags = []
    for cp in step.copies:
        src, dst = program.buffers[cp.src], program.buffers[cp.dst]
        item = src.dtype.itemsize
        plan = plan_for(src, dst, tiles)
        if len(plan.start) == 0:
            continue
        nbytes = (plan.stop - plan.start) * item
        so, do = plan.src_offset * item, plan.dst_offset * item
        loc = plan.src_tile == plan.dst_tile
        moved = loc & (so != do)
        if moved.any():
            np.add.at(local, plan.src_tile[moved], nbytes[moved])
            local_frags.append((cp, np.flatnonzero(moved)))
        ex = ~loc
        if ex.any():
            sid = buf_ids[cp.src] if buf_ids else 0
            did = buf_ids[cp.dst] if buf_ids else 0
            parts.append(fragments_to_transfers(plan.src_tile[ex], so[ex], plan.dst_tile[ex], do[ex],
                                                nbytes[ex], sid, did))
    return Transfers.concat(parts), local, local_frags


def plan_for(src, dst, tiles: int):
    return _plan_cached(src.layout, dst.layout, tuple(src.shape), tuple(dst.shape), src.dtype, tiles)


@functools.lru_cache(maxsize=512)
def _plan_cached(src_layout, dst_layout, src_shape, dst_shape, dtype, tiles):
    if src_shape != dst_shape and int(np.prod(src_shape)) != int(np.prod(dst_shape)):
        raise ValueError(f"copy between shapes {src_shape} and {dst_shape}")
    return plan_copy(src_layout.owner_map(src_shape, dtype, tiles),
                     dst_layout.owner_map(dst_shape, dtype, tiles), dtype.itemsize)


def local_copy_cycles(local_bytes: np.ndarray, target) -> np.ndarray:
    """Per tile cycles of the on-tile copies of one exchange step (the ``copy`` kernel)."""
    from ..kernels import dispatch
    from ..kernels.calls import CopyCall
    out = np.zeros(local_bytes.shape, dtype=np.int64)
    for t in np.flatnonzero(local_bytes):
        call = CopyCall(int(local_bytes[t]))
        out[t] = dispatch(call, target).cycles(call, target)
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
            tr, local, _ = exchange_transfers(program, step, tiles)
            if len(tr):
                send, recv = tile_exchange_cycles(tr, target)
                c = int(np.maximum(send, recv).max())
                b = int(tr.nbytes.sum())
                exchange += c
                sync += target.sync_cycles
                moved += b
                steps.append(StepCost(step.name, "exchange", c, target.sync_cycles, b))
            if local.any():
                lc = int(local_copy_cycles(local, target).max())
                compute += lc
                steps.append(StepCost(step.name + ".local", "local_copy", lc, 0, int(local.sum())))
        else:
            raise TypeError(f"unknown step {step!r}")
    mem = program_memory(program, target)
    est = Estimate(compute=compute, exchange=exchange, sync=sync,
                   standard=int(mem.standard.max(initial=0)), interleaved=int(mem.interleaved.max(initial=0)),
                   total_memory=int(mem.total.max(initial=0)), bytes_moved=moved)
    return Detailed(est, steps, mem.total, mem)
