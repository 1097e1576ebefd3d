"""``compile_model``: plan, lower, emit and package one model.

The report data (``report.json``) records, per step, the planner's detailed
estimate next to the cycles of the lowered program (what the IPU model will
count), the per-tile memory of the allocation, and the low passes' log.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..estimate.detailed import cost_program
from ..estimate.exchange import link_bytes, phase_cycles, phase_sync, tile_exchange_cycles
from ..gcpause import pausing
from .lower import lower
from .package import package_files, write_package
from .tile_program import ComputeSet, exchange_shape


def program_cycles(tp, target) -> list[dict]:
    """Cycles of each step of a tile program under the shared cycle model (static; no execution).

    An exchange of the shape of an earlier one (``tile_program.exchange_shape``: the same rows, the
    same destinations) differs at most in its source addresses, which the cycle model reads only
    through the paired-exchange alignment (``estimate.exchange.pair_aligned``, 8 bytes): where
    every buffer sits 8-byte aligned, the two cost the same, and a tower's repeated exchanges are
    costed once."""
    out = []
    used = tp.addr >= 0
    aligned = bool((tp.addr[used] % 8 == 0).all())
    costed: dict = {}
    for st in tp.steps:
        if isinstance(st, ComputeSet):
            per = np.zeros(tp.tiles, dtype=np.int64)
            for g in st.groups:
                np.add.at(per, g.tile, g.cycles)
            out.append({"name": st.name, "kind": "compute", "cycles": int(per.max(initial=0)), "sync": 0})
        else:
            shape = exchange_shape(st) if aligned else None
            got = costed.get(shape) if shape is not None else None
            if got is None:
                s, r = tile_exchange_cycles(st.transfers, target, tp.tiles)
                pairs = link_bytes(st.transfers, target)
                got = {"cycles": phase_cycles(s, r, pairs, target),
                       "sync": phase_sync(len(st.transfers) > 0, pairs, target),
                       "bytes": int(st.transfers.nbytes.sum()), "transfers": st.transfers.transfer_count}
                if shape is not None:
                    costed[shape] = got
            out.append({"name": st.name, "kind": "exchange", **got})
    return out


def compiled_pipeline(plan, tp, target, prog_steps=None) -> dict | None:
    """A plan with micro-batches (``planner.pipeline``): the schedule's figures from the lowered
    program's static per-step cycles (``program_cycles``: what the IPU model counts); else None."""
    if not getattr(plan, "pipeline", None):
        return None
    from ..planner.pipeline import pipeline_stages, tile_program_pipeline
    steps = program_cycles(tp, target) if prog_steps is None else prog_steps
    fig = plan.pipeline
    return tile_program_pipeline(tp, target, pipeline_stages(plan.stages), fig["micro_batch"], fig["micro_batches"],
                                 [s["cycles"] + s["sync"] for s in steps])


def build_report(plan, state, target, est=None) -> dict:
    """report.json's document. ``est``: the plan program's detailed cost (``cost_program``), when the
    caller has it."""
    tp = state.tile_program
    est = cost_program(plan.mid.program, target) if est is None else est
    prog_steps = program_cycles(tp, target)
    # The memory figures are the planner's own (the scheduled program's, as plan.json's totals):
    # one "planner's estimate" per tile, never a second one of the unscheduled program.
    planned = plan.detailed if getattr(plan.detailed, "memory", None) is not None else est
    used = tp.addr >= 0
    top = np.where(used, tp.addr + tp.size, 0).max(axis=0) if used.any() else np.zeros(tp.tiles, np.int64)
    pipeline = compiled_pipeline(plan, tp, target, prog_steps)
    return {
        **({"pipeline": pipeline} if pipeline else {}),
        "model": plan.graph.name,
        "target": target.name,
        "roofline_cycles": plan.roofline,
        "estimate": plan.estimate.as_dict(),
        "estimate_steps": [{"name": s.name, "kind": s.kind, "cycles": s.cycles, "sync": s.sync, "bytes": s.bytes}
                           for s in est.steps],
        "program_steps": prog_steps,
        "program_cycles": sum(s["cycles"] + s["sync"] for s in prog_steps),
        "memory": {
            "tile_top": top.tolist(),                               # highest allocated byte + 1 per tile
            "tile_estimate": [int(x) for x in planned.tile_memory],    # planner's peak per tile
            "by_kind": {k: [int(x) for x in v] for k, v in sorted(planned.memory.by_kind.items())},
            "standard": [int(x) for x in planned.memory.standard],
            "interleaved": [int(x) for x in planned.memory.interleaved],
        },
        "passes": list(tp.passes),
        "pass_log": list(state.log),
    }


def compile_model(graph, target, out_dir, *, params=None, jobs: int = 1, solver: str = "dp", progress=None,
                  registry=None, pins=(), cache=None, weights=None, qkv: str = "auto", ipus: str = "auto",
                  micro_batch: int | None = None):
    from ..planner.plan import plan as make_plan

    def planned(budget=None):
        return make_plan(graph, target, jobs=jobs, solver=solver, progress=progress, pins=pins, cache=cache,
                         weights=weights, qkv=qkv, ipus=ipus, budget=budget, micro_batch=micro_batch)
    return compile_fitting(planned(), planned, target, out_dir, params=params, registry=registry)


# Re-plans ``compile_fitting`` makes, each within a tighter budget, before it gives up.
REPLANS = 2


def compile_fitting(p, replan, target, out_dir, *, params=None, registry=None, stage=None):
    """``compile_plan`` of plan ``p``; where the allocator cannot place what selection accepted
    (``allocate.Unplaced``), the model is planned again by ``replan(budget)`` within a tighter
    budget of bytes per tile, at most ``REPLANS`` times: ``(plan, state, package path)``.

    Design decision: selection counts bytes, the allocator places them, and first fit can fragment
    a tile that the count says fits (``allocate``'s module docstring measures how often, all above
    90% of the capacity). Rather than hold every plan to a fixed headroom, which would cost the
    plans that place (most of them, the tightest included) cycles they need not pay, the
    headroom is derived from the failure: the failing tile's peak (the most bytes live at one
    step) less the bytes the placement lacked (``Unplaced.short``: the failing buffer less the
    largest free gap, or the bytes over the usable ones). Selection is then held to that budget on
    every tile, so the failing tile's peak drops by at least what was missing; a plan with the
    same peak there is no longer accepted. Only selection runs again on a warm plan cache. When no
    plan fits the tighter budget, the error names both: the allocator's tile, buffers and regions,
    and selection's refusal."""
    from ..errors import TileplanError
    from .allocate import Unplaced
    budget = target.usable_bytes
    for attempt in range(REPLANS + 1):
        try:
            state, path = compile_plan(p, target, out_dir, params=params, registry=registry, stage=stage)
            return p, state, path
        except Unplaced as exc:
            if attempt == REPLANS:
                raise TileplanError(f"{exc} (after {REPLANS} re-plans, the last within {budget:,} bytes per "
                                    "tile)") from None
            budget = min(budget, exc.peak) - exc.short
            try:
                p = replan(budget)
            except TileplanError as refused:
                raise TileplanError(f"{exc}; planned again within {budget:,} bytes per tile (the peak less the "
                                    f"{exc.short:,} bytes the placement lacked): {refused}") from None
    raise AssertionError("unreachable")


@pausing
def compile_plan(p, target, out_dir, *, params=None, registry=None, stage=None):
    """The part of ``compile_model`` after planning: lower the plan, write its package. A large plan's
    documents (plan.json, the detailed estimate the report compares) are worked out beside its
    lowering, and its host program beside the other files (``beside``). ``stage("package")`` is
    called when the lowering is done (the command line's progress display)."""
    from ..planner.qkv import package_params
    params = package_params((p.qkv or {}).get("fused"), params)   # a fused GEMM's weights, concatenated
    big = len(p.mid.program.steps) >= FORK_STEPS
    documents = beside(big, _plan_documents, (p, target), "the plan's documents")
    host = None
    try:
        state = lower(p.mid.program, target, registry=registry)
        host = beside(big, _emit_host, _host_args(p, state, target), "the host program's emission")

        def files() -> dict[str, bytes]:
            plan_json, estimate = documents()
            return package_files(p, state, target, params, plan_json, build_report(p, state, target, estimate), host)
        # The files are made once the package's temporary folder exists (tileplan.atomic.write_folder).
        if stage is not None:
            stage("package")
        path = write_package(Path(out_dir), files)
    finally:
        for call in (documents, host):     # (a compile that failed before it read them)
            if call is not None:
                call.cancel()
    return state, path


# A plan whose program has at least this many steps has its documents and its host program worked
# out in forked processes, beside the lowering and the package's other files (a SigLIP tower's 1,783
# steps: about 1 s of documents beside 9 s of lowering, 7 s of host emission beside program.npz and
# the report). Below it (a layer: 62 steps, the small tower 185) each takes well under a second and
# a fork would cost more than it saves.
FORK_STEPS = 1000


def beside(big: bool, fn, args: tuple, what: str):
    """``fn(*args)`` as a call (``tileplan.forked.Forked``): worked out in a forked process now when
    ``big``, else here when it is first called. The same result either way."""
    from ..forked import Forked
    return Forked(fn, args, what) if big else _Deferred(fn, args)


def _plan_documents(p, target):
    """plan.json's document and the plan's detailed estimate (step by step, for the report)."""
    from ..planner.planjson import plan_to_json
    return plan_to_json(p), cost_program(p.mid.program, target)


def _host_args(p, state, target) -> tuple:
    from ..planner.pipeline import pipeline_stages
    folded = [(n, p.graph.folded_value(n)) for n in sorted(p.graph.folded)]   # the host writes these
    pipe = getattr(p, "pipeline", None)       # micro-batches: the host runs the pipelined slots
    schedule = (pipeline_stages(p.stages), pipe["micro_batches"]) if pipe else (1, 1)
    return state.tile_program, target, p.graph.name, folded, schedule


def _emit_host(tp, target, name, folded, schedule=(1, 1)):
    from .emit.host import emit_host
    return emit_host(tp, target, name, folded=folded, schedule=schedule)


class _Deferred:
    """``fn(*args)`` worked out when first called (``beside`` for a small plan: ``Forked``'s calls)."""

    def __init__(self, fn, args):
        self.fn, self.args, self.value = fn, args, None

    def __call__(self):
        if self.value is None:
            self.value = self.fn(*self.args)
        return self.value

    def cancel(self) -> None:
        pass
