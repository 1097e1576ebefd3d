"""The planner's entry point: ``plan(graph, target) -> Plan``.

1. Storage of parameters (fixed, not searched): a GEMM's B operand is resident
   AMP panels over all tiles (``PackedPanels``, the last panel partial when the
   grain does not divide N; ``Packed`` falling back to row-major ``Intervals``
   when its rows end in a sub-word tail or it is narrower than one panel), a
   GEMM's parameter A operand is resident ``Intervals``, a
   bias row is replicated on every tile; any other parameter is a value born
   in ``Intervals`` and converted where its consumer wants it.
2. Candidates per op: GEMMs through the catalogue (``catalogue.gemm_candidates``:
   coarse rows, bounded frontiers, detailed survivors; a split-K GEMM followed by
   a bias Add also offers candidates that add the bias in their reduction);
   elementwise ops one per activation layout, plus fused bias-GeLU; an op whose
   work another op's candidate does (a GeLU in a bias-GeLU, a bias Add in a GEMM's
   reduction) gets an absorbed candidate per layout that candidate writes.
3. Selection (``select.solve_dp``, or CP-SAT with ``solver="cpsat"``).
4. The ``MidGraph``: chosen fragments and explicit conversions as one program,
   costed in detail; the ``Plan`` wraps it with the report data.
5. Stationary weights (``stationary_weights``): a GEMM's B parameter is stored
   in a grid that reads each of its blocks on one tile, at once, instead of
   ``PackedPanels``, when the whole program is then faster and fits: that grid's
   preparation copy moves nothing. Decided after selection, among the grids of
   the GEMM's detailed candidates with the picked one's boundary layouts (the
   catalogue ranks them with the default storage): a decode-shaped GEMM (few
   rows, one row block) stops moving its weights every call.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import TileplanError
from ..estimate.caches import Caches, shared as shared_caches
from ..estimate.cost import Estimate
from ..estimate.detailed import cost_program, scheduled
from ..estimate.memory import buffer_tile_bytes
from ..gcpause import pausing
from ..program import Buffer, Copy, ExchangeStep, Program
from ..graph.core import Graph, Role
from ..layout import Imported, Intervals, Packed, PackedPanels
from ..layout.gemm_grid import Grid
from ..layout.panels import panels_fit
from . import elementwise as ew
from . import epilogue
from .candidates import Candidate, Fused, RunnerUp, Storage, activation_inputs
from .families import family_of
from .catalogue import Catalogues
from .mid import MidGraph
from .rewrite import canonical
from .select import Choice, Problem, no_fit_error, solve_dp


def parameter_storage(graph: Graph, target) -> dict[str, Storage]:
    """How every parameter is kept: the storage its first consumer's family asks for
    (``families.Family.storage``), else a value born in ``Intervals``.

    Replicated parameters (bias rows, LayerNorm's gamma and beta: a whole copy on every tile) are
    resident while everything resident fits every tile. A deep tower's replicas do not (27 SigLIP
    layers hold about 29 KB of them per layer on every tile, 790 KB in all, beside 279 KB of
    weight panels): then every replicated parameter becomes a value born in ``Intervals``, which
    selection broadcasts to its consumer when it runs (a conversion whose copy is transient), so
    all the layers' weights stay resident. The rule applies to all of them alike, so repeated
    layers keep one planning problem (``canon.op_key``)."""
    out: dict[str, Storage] = {}
    for op in graph.ops:
        fam = family_of(op)
        for idx, t in enumerate(graph.inputs_of(op)):
            if t.role is not Role.PARAMETER or t.name in out:
                continue
            out[t.name] = fam.storage(graph, op, idx, t, target) or Storage(ew.intervals(target.tiles, t.dtype), False)
    replicas = [n for n, st in out.items()
                if st.private and st.layout == ew.replicated(graph.tensors[n].shape, target.tiles)]
    if replicas:
        resident = np.zeros(target.tiles, dtype=np.int64)
        for n, st in out.items():
            if st.private:
                t = graph.tensors[n]
                buf = Buffer(n, st.layout, _stored_shape(t, st), t.dtype, "parameter")
                resident += buffer_tile_bytes(buf, target.tiles, target.alignment)
        if int(resident.max()) > target.usable_bytes:
            for n in replicas:
                out[n] = Storage(ew.intervals(target.tiles, graph.tensors[n].dtype), False)
    return out


def buffer_name(tensor: str, layout) -> str:
    return f"{tensor}@{layout}"


class Context:
    """Shared state of one planning run: graph, target, storage, buffer factory, and ``caches`` (the
    run's ``estimate.caches.Caches``: kernel dispatch and GEMM cores; default, this process's shared
    one of the target)."""

    def __init__(self, graph: Graph, target, jobs: int = 1, frontier_bound: int = 32, progress=None,
                 caches: Caches | None = None):
        self.graph, self.target, self.jobs = graph, target, jobs
        self.caches = caches if caches is not None else shared_caches(target)
        self.frontier_bound = frontier_bound
        self.progress = progress
        self.storage = parameter_storage(graph, target)
        self._conv: dict = {}
        self._bytes: dict = {}
        self.runner_ups: dict[str, list[RunnerUp]] = {}     # filled by the catalogue, per GEMM

    def __getstate__(self) -> dict:
        """What a catalogue worker receives: everything but the progress callback (a closure of the
        caller's display, not picklable and not the worker's to call) and the parent's bookkeeping."""
        state = dict(self.__dict__)
        state["progress"] = None
        state["runner_ups"] = {}
        state.pop("_fragments", None)      # programs built for the parent's MidGraph
        return state

    def with_storage(self, tensor: str, storage: "Storage") -> "Context":
        """A copy of this context with one parameter stored differently (caches shared)."""
        other = copy.copy(self)
        other.storage = {**self.storage, tensor: storage}
        other._bytes = {}          # bytes per tile follow the storage
        return other

    def kind_of(self, tensor: str) -> str:
        role = self.graph.tensors[tensor].role
        return {Role.INPUT: "input", Role.OUTPUT: "output", Role.PARAMETER: "parameter"}.get(role, "tensor")

    def tensor_buffer(self, tensor: str, layout) -> Buffer:
        t = self.graph.tensors[tensor]
        st = self.storage.get(tensor)
        if st is not None and st.private:
            weights = isinstance(st.layout, (Packed, PackedPanels, Grid))     # an AMP's B operand
            return Buffer(tensor, st.layout, _stored_shape(t, st), t.dtype, "parameter",
                          "interleaved" if weights else "standard", t.scale, tensor, st.transpose)
        kind = self.kind_of(tensor)
        if st is not None and layout != st.layout:
            kind = "tensor"          # a converted copy of a parameter value
        return Buffer(buffer_name(tensor, layout), layout, t.shape, t.dtype, kind, "standard", t.scale, tensor)

    def tile_bytes(self, tensor: str, layout) -> np.ndarray:
        """int64 [tiles], read-only: the tensor's bytes per tile in ``layout`` (memoised: selection
        asks for the same pairs many times)."""
        key = (tensor, layout)
        got = self._bytes.get(key)
        if got is None:
            if isinstance(layout, Fused):
                got = np.zeros(self.target.tiles, dtype=np.int64)
            else:
                got = buffer_tile_bytes(self.tensor_buffer(tensor, layout), self.target.tiles, self.target.alignment)
            got.flags.writeable = False
            self._bytes[key] = got
        return got

    def conversion_program(self, tensor: str, src, dst) -> Program:
        p = Program()
        a, b = self.tensor_buffer(tensor, src), self.tensor_buffer(tensor, dst)
        p.add_buffer(a)
        p.add_buffer(b)
        p.steps.append(ExchangeStep(f"convert.{tensor}", (Copy(a.name, b.name),)))
        return p

    def conversion(self, tensor: str, src, dst) -> tuple[int, np.ndarray]:
        """(cycles, transient bytes) of converting a tensor between two layouts; memoised by what the
        cost depends on (the two buffers up to their names), so the same conversion in every layer of
        a tower is costed once."""
        named = (tensor, src, dst)
        got = self._conv.get(named)
        if got is None:
            key = tuple(dataclasses.replace(self.tensor_buffer(tensor, lay), name="", tensor=None)
                        for lay in (src, dst))
            got = self._conv.get(key)
            if got is None:
                d = cost_program(self.conversion_program(tensor, src, dst), self.target)
                got = self._conv[key] = (d.estimate.cycles, np.zeros(self.target.tiles, dtype=np.int64))
            self._conv[named] = got
        return got


def _stored_shape(t, st: Storage) -> tuple[int, ...]:
    if st.transpose:
        return t.shape[:-2] + (t.shape[-1], t.shape[-2])
    return t.shape


@dataclass
class Plan:
    graph: Graph
    target: Any
    mid: MidGraph
    candidates: dict[str, list[Candidate]]
    picks: dict[str, int]
    estimate: Estimate
    detailed: Any
    roofline: float
    plan_seconds: float = 0.0
    solver: str = "dp"
    runner_ups: dict[str, list[RunnerUp]] = field(default_factory=dict)    # per GEMM: the losers and why
    selection: Any = None         # the solver's select.Solution (its objective: candidate + conversion cycles)
    storage: dict = field(default_factory=dict)   # parameter storage as planned (``parameter_storage``
                                                  # plus stationary weights)
    pinned: dict | None = None    # pins that changed the plan: the pins, the planner's own choice and cycles

    @property
    def ratio(self) -> float:
        return self.estimate.cycles / self.roofline if self.roofline else float("nan")


def _pinned_layouts(graph: Graph) -> Graph:
    """The graph with each pinned layout a ``tileplan.layout`` object: a model file's pins arrive as
    the loader's specs (``graph.toml.LayoutSpec``), which say what to build (``to_layout``)."""
    specs = {n: t for n, t in graph.tensors.items() if hasattr(t.layout, "to_layout")}
    if not specs:
        return graph
    tensors = dict(graph.tensors)
    for n, t in specs.items():
        tensors[n] = dataclasses.replace(t, layout=t.layout.to_layout())
    return dataclasses.replace(graph, tensors=tensors)


@pausing
def plan(graph: Graph, target, *, jobs: int = 1, solver: str = "dp", frontier_bound: int = 32,
         dp_paths: int | None = 16, progress=None, stationary: bool = True, pins=(), share: bool = True,
         cache=None, caches: Caches | None = None) -> Plan:
    """Plan ``graph`` on ``target``: the catalogue of every op, whole-graph selection, the MidGraph
    and its detailed estimate. ``pins`` (``planner.pins.Pin``) restrict GEMMs to a grid; a pinned
    plan that differs from the planner's own choice records it (``Plan.pinned``). ``share``: ops
    with one planning problem (``canon.op_key``) are costed once and the others get re-targeted
    copies of their candidates (the same result as costing each; ``share=False`` is the
    reference). ``cache``: a ``planner.cache.PlanCache`` of GEMM catalogues (None: no cache); the
    plan does not depend on what it holds. ``caches``: the in-memory memo tables of the run
    (``estimate.caches.Caches``; None: this process's shared ones of the target); nor on those."""
    from . import canon
    from .pins import check_pins, pinned_candidates
    t0 = time.perf_counter()
    graph = _pinned_layouts(canonical(graph))
    ctx = Context(graph, target, jobs, frontier_bound, progress, caches)
    pinned = check_pins(graph, [*graph.pins, *pins])
    for name, t in graph.tensors.items():
        if t.layout is not None:
            t.layout.verify(t.shape, t.dtype, target)
    # The GEMM catalogues (in pool workers when they run in parallel) while the elementwise ops,
    # which never depend on a GEMM's candidates, are planned here.
    pending = Catalogues(ctx, [op for op in graph.ops if family_of(op).catalogued], share=share, cache=cache)
    ew_cands: dict[str, list[Candidate]] = {}
    shared: dict[str, tuple] = {}            # op key -> (the op costed, its family candidates)
    try:
        for op in graph.ops:
            if family_of(op).catalogued:
                continue
            key = canon.op_key(graph, ctx.storage, op) if share else None
            if key in shared:
                src, src_cands = shared[key]
                rn = canon.Renaming(canon.op_names(graph, src), canon.op_names(graph, op))
                own = [canon.retarget(c, rn, op.name, lazy=True) for c in src_cands]
            else:
                own = family_of(op).candidates(ctx, op)
                if key is not None:
                    shared[key] = (op, own)
            producers = [c for cs in ew_cands.values() for c in cs if c.fused]
            ew_cands[op.name] = own + epilogue.absorbed(ctx, op, producers, into="the bias Add")
    except BaseException:
        pending.cancel()
        raise
    gemms = pending.result()
    own = _solve(ctx, gemms, ew_cands, solver, dp_paths, stationary, {})
    result, record = own, None
    if pinned:
        with_pins = {name: pinned_candidates(ctx, graph.op(name), pinned[name], cs, ctx.runner_ups.get(name, []))
                     if name in pinned else cs for name, cs in gemms.items()}
        run = _solve(ctx, with_pins, ew_cands, solver, dp_paths, stationary, pinned)
        chosen = lambda r: {op.name: str(r[1][op.name][r[2][op.name]]) for op in graph.ops}  # noqa: E731
        if chosen(run) != chosen(own) or run[4].estimate.cycles != own[4].estimate.cycles:
            record = {"pins": {n: str(p) for n, p in sorted(pinned.items())},
                      "own_cycles": int(own[4].estimate.cycles),
                      "own_choice": {n: chosen(own)[n] for n in sorted(pinned)}}
            result = run
    ctx, cands, picks, mid, detailed, sol = result
    return Plan(graph, target, mid, cands, picks, detailed.estimate, detailed, graph.roofline_cycles(target),
                time.perf_counter() - t0, solver, ctx.runner_ups, sol, ctx.storage, pinned=record)


def _solve(ctx: Context, gemms: dict, ew_cands: dict, solver: str, dp_paths, stationary: bool, pinned: dict):
    """Selection over the ops' candidates, the MidGraph, its detailed cost and the stationary
    weights step: ``(context, candidates, picks, MidGraph, detailed cost, solution)``."""
    graph, target = ctx.graph, ctx.target
    ew_cands = dict(ew_cands)
    # A bias Add some GEMM candidates do in their reduction: absorbed candidates, one per layout
    # they write the Add's output in.
    for name, cs in gemms.items():
        fused = [c for c in cs if c.fused]
        for absorbed in dict.fromkeys(n for c in fused for n in (*c.through, c.fused)):
            ew_cands[absorbed] = ew_cands[absorbed] + epilogue.absorbed(ctx, graph.op(absorbed), fused,
                                                                       into=f"the reduction of {name}")
    cands: dict[str, list[Candidate]] = {}
    for op in graph.ops:
        cands[op.name] = gemms[op.name] if family_of(op).catalogued else ew_cands[op.name]
        if not cands[op.name]:
            raise TileplanError(f"op {op.name!r} ({op.kind}): no candidate fits the target {target.name!r}")
    problem = build_problem(ctx, cands)
    if solver == "cpsat":
        from .cpsat import solve_cpsat
        sol = solve_cpsat(problem)
    else:
        sol = solve_dp(problem, paths=dp_paths)
    if sol is None:
        raise no_fit_error(problem)
    mid = MidGraph.build(ctx, cands, sol.picks)
    detailed = cost_program(scheduled(mid.program, target.tiles), target)
    picks = sol.picks
    if stationary:
        skip = {n for n, p in pinned.items() if p.storage == "panels"}
        ctx, cands, picks, mid, detailed = stationary_weights(ctx, cands, picks, mid, detailed, skip)
    for name, pin in pinned.items():
        if pin.storage == "grid" and cands[name][picks[name]].weights is None:
            raise TileplanError(f"pin of {name!r} ({pin}): its weights cannot stay in this grid (it reads each "
                                "weight block on more than one tile, or the whole program is then slower or "
                                "does not fit): drop storage:grid")
    return ctx, cands, picks, mid, detailed, sol


STATIONARY_TRIES = 6      # per GEMM: detailed candidates re-costed with their weights stored in their grid


def stationary_weights(ctx: Context, cands: dict[str, list[Candidate]], picks: dict[str, int], mid: MidGraph,
                       detailed, skip: set = frozenset()) -> tuple:
    """Step 5 of ``plan``: per GEMM in op order whose B is a resident-panels parameter read by this
    op only (no pinned layout), store B in a grid that multiplies each of its blocks on one tile
    (``gemm.stationary_b``) when the whole program is then faster and fits the target (total and
    interleaved peaks). The grids tried are those of the detailed candidates (kept or runner-up)
    with the picked one's boundary layouts and fusion, fastest first (``STATIONARY_TRIES``): the
    conversions around the GEMM stay as selected, so a grid whose fragment is not faster than the
    pick's cannot make the program faster and is not tried on the whole program. The one faster
    with its weights in place is rebuilt on the new storage, says so in its description, and
    becomes the pick (taken out of the runner-ups if it was one).

    GEMMs with one planning problem (``canon.op_key``: the projections of every layer of a tower)
    are decided together: each one's fragment trial is costed once per (key, grid) and renamed
    for the others, and the group's moves are tried on the whole program at once; when the group
    together is not faster or does not fit, its members are tried one by one. So a tower costs a
    whole-program trial per group, not per GEMM. Returns the (context, candidates, picks,
    MidGraph, detailed cost) in effect."""
    from . import canon
    from .catalogue import fragment, fusion_for, transient_of
    from .gemm import GemmShape, stationary_b
    g, target = ctx.graph, ctx.target
    picks = dict(picks)
    trials: dict = {}             # (op key, grid choice, boundary, fusion) -> (op, cost, program)

    def best_move(ctx, cands, picks, op):
        """(op, moved candidate, its source candidate, trial context) or None."""
        cand = cands[op.name][picks[op.name]]
        if cand.choice is None or op.name in skip:       # not a GEMM candidate, or pinned to panels
            return None
        b = op.inputs[1]
        st = ctx.storage.get(b)
        if st is None or not isinstance(st.layout, (Packed, PackedPanels)) \
                or g.tensors[b].layout is not None or len(g.consumers.get(b, [])) != 1:
            return None
        shape = GemmShape.of(g, op, target)
        same = [c for c in cands[op.name] + [r.candidate for r in ctx.runner_ups.get(op.name, [])]
                if c.detailed and c.choice is not None and c.boundary == cand.boundary and c.fused == cand.fused]
        same.sort(key=lambda c: (c is not cand, c.estimate.cycles))
        grids = [(c, grid) for c in same if (grid := stationary_b(shape, c.choice)) is not None]
        key = canon.op_key(g, ctx.storage, op)
        best = None
        for c, grid in grids[:STATIONARY_TRIES]:
            trial = ctx.with_storage(b, Storage(grid, True, st.transpose))
            memo = (key, c.choice, c.boundary, c.fused is not None)
            if memo not in trials:
                prog = fragment(trial, op, shape, c.choice, c.boundary)
                trials[memo] = (op, cost_program(prog, target), prog)
            d = trials[memo][1]
            if best is None or d.estimate.cycles < best[0].estimate.cycles:
                best = (d, c, trial, memo)
        if best is None or best[0].estimate.cycles >= cand.estimate.cycles:
            return None
        d, c, trial, memo = best
        src, _, prog = trials[memo]           # renamed only for a move worth trying
        prog = canon.rename_program(prog, canon.Renaming(canon.op_names(g, src), canon.op_names(g, op)))
        moved = dataclasses.replace(c, desc=f"{c.desc}, {b} stored in the grid", estimate=d.estimate, program=prog,
                                    weights=trial.storage[b].layout, template=None,
                                    transient=transient_of(ctx, d, c.choice, c.boundary, fusion_for(ctx, op, c.choice)))
        return op, moved, c, trial.storage[b]

    def attempt(state, moves):
        ctx, cands, picks, mid, detailed = state
        trial_ctx = ctx
        trial_cands, trial_picks = dict(cands), dict(picks)
        for op, moved, c, storage in moves:
            trial_ctx = trial_ctx.with_storage(op.inputs[1], storage)
            kept = list(trial_cands[op.name])
            at = next((i for i, k in enumerate(kept) if k is c), None)
            if at is None:
                kept.append(moved)
                at = len(kept) - 1
            else:
                kept[at] = moved
            trial_cands[op.name] = kept
            trial_picks[op.name] = at
        trial_mid = MidGraph.build(trial_ctx, trial_cands, trial_picks)
        trial_cost = cost_program(scheduled(trial_mid.program, target.tiles), target)
        est = trial_cost.estimate
        if est.cycles < detailed.estimate.cycles and est.total_memory <= target.usable_bytes \
                and est.interleaved <= target.interleaved_bytes:
            for op, moved, c, storage in moves:
                if any(r.candidate is c for r in trial_ctx.runner_ups.get(op.name, [])):
                    trial_ctx.runner_ups = {**trial_ctx.runner_ups,
                                            op.name: [r for r in trial_ctx.runner_ups[op.name] if r.candidate is not c]}
            return trial_ctx, trial_cands, trial_picks, trial_mid, trial_cost
        return None

    groups: dict[str, list] = {}
    for op in g.ops:
        if cands[op.name][picks[op.name]].choice is not None:
            groups.setdefault(canon.op_key(g, ctx.storage, op), []).append(op)
    state = (ctx, cands, picks, mid, detailed)
    for members in groups.values():
        moves = [m for op in members if (m := best_move(state[0], state[1], state[2], op)) is not None]
        if not moves:
            continue
        got = attempt(state, moves) if len(moves) > 1 else None
        if got is not None:
            state = got
            continue
        for op in members:
            m = best_move(state[0], state[1], state[2], op)
            if m is not None:
                state = attempt(state, [m]) or state
    return state


def build_problem(ctx: Context, cands: dict[str, list[Candidate]]) -> Problem:
    g, target = ctx.graph, ctx.target
    fixed = {}
    for name, t in g.tensors.items():
        if t.role is Role.INPUT:
            fixed[name] = ew.input_layout(t, target.tiles)
        elif name in ctx.storage and not ctx.storage[name].private:
            fixed[name] = ctx.storage[name].layout
    resident = np.zeros(target.tiles, dtype=np.int64)
    parts = {}
    for name, st in ctx.storage.items():
        if st.private:
            b = ctx.tile_bytes(name, st.layout)
            resident += b
            parts[name] = (b, ctx.tensor_buffer(name, st.layout).region)
    choices = {op: [Choice(c.ins, c.out, c.estimate.cycles, c.transient, str(c)) for c in cs]
               for op, cs in cands.items()}
    return Problem(
        ops=[op.name for op in g.ops],
        inputs={op.name: activation_inputs(ctx.storage, op) for op in g.ops},
        output={op.name: op.output for op in g.ops},
        choices=choices,
        fixed=fixed,
        outputs={t.name for t in g.by_role(Role.OUTPUT)},
        tile_bytes=ctx.tile_bytes,
        conversion=ctx.conversion,
        resident=resident,
        capacity=target.usable_bytes,
        resident_parts=parts,
    )
