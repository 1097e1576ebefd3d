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
5. Pre-arranged weights: a GEMM's catalogue also offers candidates that read a
   B parameter stored as their grid reads it (``gemm.prearranged_b``, replicated
   over row blocks where the grid needs that), which never exchange it. Each
   carries that storage's bytes per tile (``Candidate.resident``), which
   selection holds over the whole program beside every other layer's weights,
   in the total and in the interleaved region; the storage of the picked
   candidates replaces the compact one (``Plan.storage``), and the host uploads
   the weights in it. ``weights="compact"`` (``graph.core.WEIGHTS``; the model
   file's ``[plan] weights``, the command line's ``--weights``) plans with compact
   weights only: the catalogue offers no pre-arranged candidate.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import TileplanError
from ..estimate.caches import Caches, shared as shared_caches
from ..estimate.cost import Estimate
from ..estimate.detailed import cost_program, scheduled
from ..estimate.memory import buffer_tile_bytes
from ..forked import Forked
from ..gcpause import pausing
from ..program import Buffer, Copy, ExchangeStep, Program
from ..graph.core import Graph, Role
from ..layout import Packed, PackedPanels
from ..layout.gemm_grid import Grid
from . import elementwise as ew
from . import epilogue
from . import select
from .candidates import Candidate, Fused, RunnerUp, Storage, activation_inputs
from .families import family_of
from .catalogue import Catalogues
from .mid import MidGraph
from .rewrite import canonical
from .select import Choice, Problem, Solution, StateLimit, no_fit_error, solve_dp
from .storage import parameter_storage, resolve_weights, stored_shape


def buffer_name(tensor: str, layout) -> str:
    """A tensor's buffer in a layout: a grid (a grid-aligned boundary) by its ``Grid.tag``, which tells
    apart grids ``str`` does not."""
    return f"{tensor}@{layout.tag if isinstance(layout, Grid) else layout}"


class Context:
    """Shared state of one planning run: graph, target, storage, buffer factory, and ``caches`` (the
    run's ``estimate.caches.Caches``: kernel dispatch and GEMM cores; default, this process's shared
    one of the target)."""

    def __init__(self, graph: Graph, target, jobs: int = 1, frontier_bound: int = 32, progress=None,
                 caches: Caches | None = None, weights: str = "planner", budget: int | None = None):
        self.graph, self.target, self.jobs = graph, target, jobs
        self.budget = budget            # bytes per tile selection may use (None: the target's usable bytes)
        self.weights = weights          # parameter storage (``graph.core.WEIGHTS``): "compact" pre-arranges none
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
        other = copy.copy(self)          # (``__getstate__``: what a worker gets; the copy keeps the rest)
        other.progress, other.runner_ups = self.progress, self.runner_ups
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
            return Buffer(tensor, st.layout, stored_shape(t, st), t.dtype, "parameter",
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
                                                  # with the picked pre-arranged weights)
    pinned: dict | None = None    # pins that changed the plan: the pins, the planner's own choice and cycles
    weights: str = "planner"      # the parameter storage it was planned with (``graph.core.WEIGHTS``)
    qkv: dict | None = None       # fused QKV (``planner.qkv``): the mode, the form chosen, both forms' cycles
                                  # and the fused groups; None when the graph has no group
    stages: dict | None = None    # a multi-IPU target's form (``planner.stages``): "stages" with the split, per
                                  # stage cycles and link bytes, or "spread"; None on one IPU
    budget: int | None = None     # bytes per tile selection was held to, when below the target's usable
                                  # bytes (``lowering.compile.compile_fitting``'s re-plan); None: all of them
    pipeline: dict | None = None  # micro-batches (``planner.pipeline``): the schedule's figures from the
                                  # estimate; None without ``micro_batch``

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
         dp_paths: int | None = 16, progress=None, weights: str | None = None, pins=(), share: bool = True,
         cache=None, caches: Caches | None = None, qkv: str = "auto", ipus: str = "auto",
         budget: int | None = None, micro_batch: int | None = None) -> Plan:
    """Plan ``graph`` on ``target`` (``plan_graph`` says how; ``budget``: the bytes per tile selection
    may use, below the target's usable bytes; None: all of them). ``qkv``: GEMMs reading one
    activation with alike weights (an encoder layer's Q, K and V projections) are planned as
    they are and fused into one GEMM plus Slices (``planner.qkv``), and the plan with fewer
    modelled cycles is kept (``"auto"``); ``"fused"`` or ``"separate"`` plans only that form.
    ``Plan.qkv`` records which, with both estimates. ``ipus``: how a multi-IPU target is used
    (``planner.stages``: ``"stages"``, ``"spread"`` or ``"auto"``, the cheaper); one IPU ignores it.
    ``micro_batch``: the batch cut into micro-batches of that many images, planned once for one
    micro-batch and pipelined through the stages (``planner.pipeline``; ``Plan.pipeline`` holds the
    schedule's figures); the plan's graph is then the micro-batch's."""
    from . import qkv as fuse
    from .stages import check_mode
    check_mode(ipus)
    if micro_batch is not None:
        from .pipeline import batch_of, check_micro_batch, micro_graph, plan_pipeline
        m = check_micro_batch(micro_batch)
        micro = micro_graph(graph, m)
        p = plan(micro, target, jobs=jobs, solver=solver, frontier_bound=frontier_bound, dp_paths=dp_paths,
                 progress=progress, weights=weights, pins=pins, share=share, cache=cache, caches=caches, qkv=qkv,
                 ipus=ipus, budget=budget)
        p.pipeline = plan_pipeline(p, m, batch_of(graph) // m)
        return p
    if target.ipus > 1 and ipus != "spread":
        return plan_over_ipus(graph, target, mode=ipus, jobs=jobs, solver=solver, frontier_bound=frontier_bound,
                              dp_paths=dp_paths, progress=progress, weights=weights, pins=pins, share=share,
                              cache=cache, caches=caches, qkv=qkv, budget=budget)
    t0 = time.perf_counter()
    fuse.check_qkv(qkv)
    canon_graph = canonical(graph)
    names = {op.name for op in canon_graph.ops}
    every_pin = [*canon_graph.pins, *pins]
    alt = fuse.fused_graph(canon_graph, {p.op for p in every_pin if p.op in names})   # pinned GEMMs stay apart
    fused_ops = {op.name for op in alt[0].ops} - names if alt is not None else set()
    if qkv == "auto" and any(p.op in fused_ops for p in every_pin):
        qkv = "fused"              # a pin of a fused GEMM (what --emit-pins writes for a fused plan)
    kw = dict(jobs=jobs, solver=solver, frontier_bound=frontier_bound, dp_paths=dp_paths, progress=progress,
              weights=weights, pins=pins, share=share, cache=cache, caches=caches, budget=budget)
    if alt is None:
        return plan_graph(canon_graph, target, **kw)
    if cache is None and qkv == "auto":
        from .cache import MemoryCache
        kw["cache"] = MemoryCache()          # the two forms' common GEMMs costed once
    fused_graph, found = alt
    # Both forms: with more than one job, their GEMM catalogues are costed first in one pool (the fused
    # QKV GEMM's beside the others, ``catalogue.warm``), and the separate form's selection runs in a
    # forked process while this one plans the fused form (``plan_graph``'s ``background``); the same
    # catalogues and search either way.
    both = qkv == "auto"
    if both and share and jobs > 1:
        from .catalogue import warm
        ctxs = [_context(g, target, jobs, frontier_bound, None, caches, weights) for g in (canon_graph, fused_graph)]
        warm([(c, [op for op in c.graph.ops if family_of(op).catalogued]) for c in ctxs], kw["cache"])
    separate = plan_graph(canon_graph, target, background=both and jobs > 1, **kw) if qkv != "fused" else None
    fused = None
    try:
        if qkv != "separate":
            try:
                fused = plan_graph(fused_graph, target, **kw)
            except TileplanError:
                if separate is None:
                    raise              # (the fused form does not fit: with "auto" the separate one stands)
    except BaseException:
        if callable(separate):
            separate.cancel()
        raise
    separate_cycles = None
    if isinstance(separate, Pending) and fused is not None:
        # While the separate form's selection runs in its process, this one works out the fused plan's
        # model floor, which its plan.json reports (``quality.model_floor``, remembered per op problem).
        from .quality import model_floor
        model_floor(fused.graph, target, fused.weights)
    if separate is not None:
        # (a background plan's estimate comes from its process: its Plan is made here only if it is kept)
        separate_cycles = separate.cycles() if isinstance(separate, Pending) else separate.estimate.cycles
    best = fused if separate is None or (fused is not None and fused.estimate.cycles < separate_cycles) \
        else separate              # a tie keeps the graph as written
    if isinstance(best, Pending):
        best = best()
    best.qkv = {"mode": qkv, "chosen": "fused" if best is fused else "separate",
                "separate_cycles": int(separate_cycles) if separate is not None else None,
                "fused_cycles": int(fused.estimate.cycles) if fused is not None else None,
                "fused": [g.to_json() for g in found] if best is fused else [],
                "groups": [list(g.members) for g in found]}
    best.plan_seconds = time.perf_counter() - t0
    return best


def _context(graph: Graph, target, jobs, frontier_bound, progress, caches, weights, budget=None) -> "Context":
    """The planning context of ``plan_graph``: the canonical graph with its pinned layouts and its
    parameter storage option resolved."""
    weights = resolve_weights(graph, weights)
    graph = dataclasses.replace(_pinned_layouts(canonical(graph)), weights=weights)
    return Context(graph, target, jobs, frontier_bound, progress, caches, weights, budget)


def plan_graph(graph: Graph, target, *, jobs: int = 1, solver: str = "dp", frontier_bound: int = 32,
               dp_paths: int | None = 16, progress=None, weights: str | None = None, pins=(), share: bool = True,
               cache=None, caches: Caches | None = None, background: bool = False, budget: int | None = None):
    """Plan ``graph`` on ``target``: the catalogue of every op, whole-graph selection, the MidGraph
    and its detailed estimate. ``pins`` (``planner.pins.Pin``) restrict GEMMs to a grid; a pinned
    plan that differs from the planner's own choice records it (``Plan.pinned``). ``share``: ops
    with one planning problem (``canon.op_key``) are costed once and the others get re-targeted
    copies of their candidates (the same result as costing each; ``share=False`` is the
    reference). ``cache``: a ``planner.cache.PlanCache`` of GEMM catalogues (None: no cache); the
    plan does not depend on what it holds. ``caches``: the in-memory memo tables of the run
    (``estimate.caches.Caches``; None: this process's shared ones of the target); nor on those.
    ``weights``: the parameter storage, ``"planner"`` (selection may pre-arrange a GEMM's weights)
    or ``"compact"`` (never); None: the model file's (``graph.weights``), else ``"planner"``.
    ``background`` (no pins): the selection runs in a forked process (``tileplan.forked.Forked``) and what returns
    is a ``Pending`` plan: calling it waits for the selection and gives the ``Plan``; ``cycles()`` gives
    its estimate, which the forked process works out after its selection (the plan's program costed
    in detail), so a plan that is not kept is never made here."""
    from . import canon
    from .pins import check_pins, pinned_candidates
    t0 = time.perf_counter()
    ctx = _context(graph, target, jobs, frontier_bound, progress, caches, weights, budget)
    graph, weights = ctx.graph, ctx.weights
    pinned = check_pins(graph, [*graph.pins, *pins])
    for name, pin in sorted(pinned.items()):
        if pin.storage == "grid" and weights == "compact":
            raise TileplanError(f"pin of {name!r} ({pin}): storage:grid pre-arranges its weights, but the plan "
                                "keeps every weight compact (weights = \"compact\"): drop one of them")
    for name, t in graph.tensors.items():
        if t.layout is not None:
            t.layout.verify(t.shape, t.dtype, target)
    # The GEMM catalogues (in pool workers when they run in parallel) while the elementwise ops,
    # which never depend on a GEMM's candidates, are planned here.
    pending = Catalogues(ctx, [op for op in graph.ops if family_of(op).catalogued], share=share, cache=cache)
    ew_cands: dict[str, list[Candidate]] = {}
    shared: dict[str, tuple] = {}            # op key -> (the op costed, its family candidates)
    fused_by: dict[str, list] = {}           # op -> earlier fused candidates that write or pass through it
    try:
        for op in graph.ops:
            if family_of(op).catalogued:
                continue
            key = canon.op_key(graph, ctx.storage, op) if share else None
            if key in shared:
                src, src_cands = shared[key]
                rn = canon.renaming(canon.op_names(graph, src), graph, op)
                own = [canon.retarget(c, rn, op.name, lazy=True) for c in src_cands]
            else:
                own = family_of(op).candidates(ctx, op)
                if key is not None:
                    shared[key] = (op, own)
            # the fused candidates that write this op's output or pass through it, by op name
            producers = fused_by.get(op.name, [])
            ew_cands[op.name] = own + (epilogue.absorbed(ctx, op, producers, into="the bias Add")
                                       if producers else [])
            for c in ew_cands[op.name]:
                if c.fused:
                    for name in (c.fused, *c.through):
                        fused_by.setdefault(name, []).append(c)
    except BaseException:
        pending.cancel()
        raise
    gemms = pending.result()
    if background and not pinned:
        cands, problem = _problem(ctx, gemms, ew_cands)
        def estimate(sol):               # (in the forked process, after its selection)
            return None if sol is None else _finish(ctx, cands, problem, sol, {})[4].estimate.cycles
        search = selection(ctx, problem, solver, dp_paths, {}, cache, background=True, after=estimate)

        def finish() -> Plan:
            res = _finish(ctx, cands, problem, search(), {})
            return _plan_of(graph, target, res, t0, solver, None, weights)
        return Pending(finish, search)
    own = _solve(ctx, gemms, ew_cands, solver, dp_paths, {}, cache)
    result, record = own, None
    if pinned:
        with_pins = {name: pinned_candidates(ctx, graph.op(name), pinned[name], cs, ctx.runner_ups.get(name, []))
                     if name in pinned else cs for name, cs in gemms.items()}
        run = _solve(ctx, with_pins, ew_cands, solver, dp_paths, pinned, cache)
        chosen = lambda r: {op.name: str(r[1][op.name][r[2][op.name]]) for op in graph.ops}  # noqa: E731
        if chosen(run) != chosen(own) or run[4].estimate.cycles != own[4].estimate.cycles:
            record = {"pins": {n: str(p) for n, p in sorted(pinned.items())},
                      "own_cycles": int(own[4].estimate.cycles),
                      "own_choice": {n: chosen(own)[n] for n in sorted(pinned)}}
            result = run
    return _plan_of(graph, target, result, t0, solver, record, weights)


def _plan_of(graph: Graph, target, result: tuple, t0: float, solver: str, record, weights: str) -> Plan:
    ctx, cands, picks, mid, detailed, sol = result
    return Plan(graph, target, mid, cands, picks, detailed.estimate, detailed, graph.roofline_cycles(target),
                time.perf_counter() - t0, solver, ctx.runner_ups, sol, ctx.storage, pinned=record, weights=weights,
                budget=ctx.budget)


class Pending:
    """A plan whose selection runs in the background (``plan_graph``'s ``background``): call it for the
    ``Plan``, ``cycles()`` for its estimate; ``cancel`` ends the search."""

    def __init__(self, finish, search):
        self._finish, self._search, self._plan = finish, search, None

    def __call__(self) -> Plan:
        if self._plan is None:
            self._plan = self._finish()
        return self._plan

    def cycles(self):
        """The plan's estimated cycles: the background process's (after its selection), else the Plan's
        (the selection came from the plan cache). A selection that found nothing raises, as the Plan would."""
        self._search()
        got = self._search.extra
        return got if got is not None else self().estimate.cycles

    def cancel(self) -> None:
        self._search.cancel()


def _solve(ctx: Context, gemms: dict, ew_cands: dict, solver: str, dp_paths, pinned: dict, cache=None):
    """Selection over the ops' candidates (pre-arranged weights included unless ``ctx.weights`` is compact), the
    MidGraph on the storage selection picked and its detailed cost: ``(context, candidates, picks,
    MidGraph, detailed cost, solution)``. With a plan ``cache``, the selection comes from it when this
    very problem was solved before (``selection``)."""
    cands, problem = _problem(ctx, gemms, ew_cands)
    return _finish(ctx, cands, problem, selection(ctx, problem, solver, dp_paths, pinned, cache), pinned)


def _problem(ctx: Context, gemms: dict, ew_cands: dict) -> tuple[dict, Problem]:
    """Every op's candidates (a bias Add some GEMM reduction does gets its absorbed ones) and the
    selection problem over them."""
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
    return cands, build_problem(ctx, cands)


def _finish(ctx: Context, cands: dict, problem: Problem, sol, pinned: dict):
    """``_solve``'s result from the selection's solution: the MidGraph on the storage it picked and
    its detailed cost."""
    graph, target = ctx.graph, ctx.target
    if sol is None:
        raise no_fit_error(problem)
    picks = sol.picks
    for op in graph.ops:                         # the picked pre-arranged weights replace their compact storage
        cand = cands[op.name][picks[op.name]]
        if cand.weights is not None:
            ctx = ctx.with_storage(op.inputs[1], Storage(cand.weights, True, ctx.storage[op.inputs[1]].transpose))
    mid = MidGraph.build(ctx, cands, picks)
    detailed = cost_program(scheduled(mid.program, target.tiles), target)
    for name, pin in pinned.items():
        if pin.storage == "grid" and cands[name][picks[name]].weights is None:
            raise TileplanError(f"pin of {name!r} ({pin}): its weights cannot be pre-arranged for this grid (they "
                                "are not a parameter read by this op only, or the whole program does not fit with "
                                "them): drop storage:grid")
    return ctx, cands, picks, mid, detailed, sol


def selection(ctx: Context, problem: Problem, solver: str, dp_paths, pinned: dict, cache=None,
              background: bool = False, after=None):
    """Whole-graph selection (``select.solve_dp``, or CP-SAT): a ``select.Solution``, or None when
    nothing fits. With ``background``: a ``Forked`` search, called for that result (the cache
    read here, written when it is called), and ``after`` of it worked out in its process too
    (``Forked.extra``).

    With a plan ``cache`` the solution is also kept on disk, keyed by the whole graph's canonical
    hash (``canon.subgraph_key``: a tower's 27 layers, names and parameter values left out), the
    target, the tileplan version, the solver and its options, the pins, and a digest of the problem
    itself (every op's choices: layouts read and written, cycles; the fixed layouts; the resident
    bytes per tile). A warm plan of the same model, or of a renamed copy of it, reads the picks
    instead of searching again: the search is deterministic, so the plan is the one a cold run
    makes. An entry whose picks do not fit the problem is ignored with a warning."""
    from . import canon
    from .cachecodec import SELECTION
    g = ctx.graph
    key = None
    if cache is not None:
        seen: dict = {}          # id -> (digest, array): a layer's retargeted choices share their arrays

        def arr(a):
            if a is None:
                return None
            got = seen.get(id(a))
            if got is None:
                got = seen[id(a)] = (_array_digest(a), a)
            return got[0]
        digest = canon.digest([[[[str(x) for x in ch.ins], str(ch.out), int(ch.cycles), ch.label,
                                 arr(ch.transient), arr(ch.resident), arr(ch.interleaved)]
                                for ch in problem.choices[op]] for op in problem.ops]
                              + [sorted(str(v) for v in problem.fixed.values()), problem.resident.tolist(),
                                 problem.capacity, problem.interleaved_capacity,
                                 _array_digest(problem.resident_interleaved)])
        key = cache.full_key(canon.subgraph_key(g, ctx.storage, g.ops), canon.target_key(ctx.target),
                             {"kind": "selection", "solver": solver, "dp_paths": dp_paths, "weights": ctx.weights,
                              "frontier": ctx.frontier_bound, "problem": digest,
                              "pins": {n: str(p) for n, p in sorted(pinned.items())}})
        got = cache.load(key, SELECTION, ctx.target.tiles)        # (types checked: ``cachecodec``)
        if got is not None:
            picks, at = got["picks"], got["peak_op"]
            if len(picks) == len(problem.ops) and at < len(problem.ops) and got["peak_tile"] < ctx.target.tiles \
                    and all(k < len(problem.choices[op]) for k, op in zip(picks, problem.ops)):
                sol = Solution(dict(zip(problem.ops, picks)), got["cycles"], got["peak"],
                               problem.ops[at] if at >= 0 else "", got["peak_tile"], got["exact"])
                return Forked.done(sol) if background else sol
            cache.reject(key, "it does not fit this graph's selection", True)

    def keep(sol):
        if key is not None and sol is not None:
            cache.store(key, {"picks": [int(sol.picks[op]) for op in problem.ops], "cycles": int(sol.cycles),
                              "peak": int(sol.peak), "peak_tile": int(sol.peak_tile), "exact": bool(sol.exact),
                              "peak_op": problem.ops.index(sol.peak_op) if sol.peak_op in problem.ops else -1})
        return sol
    if background:
        return Forked(_search, (problem, solver, dp_paths, g.name), "the background selection", keep, after)
    return keep(_search(problem, solver, dp_paths, g.name))


FALLBACK_SECONDS = 30.0


def _search(problem: Problem, solver: str, dp_paths, model: str = ""):
    """The selection by ``solver``.

    Design decision: the DP's states are the layouts of the values later ops read, so a graph
    holding many such values at once would multiply them; past ``select.MAX_STATES`` the DP stops
    (``select.StateLimit``, before it allocates more) and CP-SAT, whose model grows with the
    graph, not with its combinations, solves it within ``FALLBACK_SECONDS``. When that finds
    nothing either, the plan stops with an error naming the model and the stage."""
    if solver == "cpsat":
        from .cpsat import solve_cpsat
        return solve_cpsat(problem)
    try:
        return solve_dp(problem, paths=dp_paths, max_states=select.MAX_STATES)
    except StateLimit as exc:
        from .cpsat import solve_cpsat       # (ortools loads only when it is used)
        try:
            return solve_cpsat(problem, time_limit=FALLBACK_SECONDS)
        except TileplanError:
            raise TileplanError(f"model {model!r}: the whole-graph selection stopped: {exc}, and CP-SAT found no "
                                f"assignment within {FALLBACK_SECONDS:g} s") from None


def _array_digest(a) -> str | None:
    """A short content hash of a per-tile array of the selection problem (None stays None)."""
    if a is None:
        return None
    return hashlib.sha256(np.ascontiguousarray(a, dtype=np.int64).tobytes()).hexdigest()[:16]


def build_problem(ctx: Context, cands: dict[str, list[Candidate]]) -> Problem:
    g, target = ctx.graph, ctx.target
    fixed = {}
    for name, t in g.tensors.items():
        if t.role is Role.INPUT:
            fixed[name] = ew.input_layout(t, target.tiles)
        elif name in ctx.storage and not ctx.storage[name].private:
            fixed[name] = ctx.storage[name].layout
    # A GEMM with pre-arranged candidates holds its B's storage as its choice says: every choice of it
    # carries the bytes of the storage it reads (compact or pre-arranged), not the resident total.
    op_of = {op.name: op for op in g.ops}
    chosen_b = {op_of[op].inputs[1]: op for op, cs in cands.items() if any(c.weights is not None for c in cs)}
    resident = np.zeros(target.tiles, dtype=np.int64)
    interleaved = np.zeros(target.tiles, dtype=np.int64)
    parts = {}
    for name, st in ctx.storage.items():
        if st.private:
            b = ctx.tile_bytes(name, st.layout)
            region = ctx.tensor_buffer(name, st.layout).region
            parts[name] = (b, region)
            if name in chosen_b:
                continue
            resident += b
            if region == "interleaved":
                interleaved += b

    def choice(op, c):
        res = None
        if op_of[op].inputs[1:2] and op_of[op].inputs[1] in chosen_b:
            b = op_of[op].inputs[1]
            res = c.resident if c.weights is not None else ctx.tile_bytes(b, ctx.storage[b].layout)
        return Choice(c.ins, c.out, c.estimate.cycles, c.transient, str(c), res, c.interleaved)

    choices = {op: [choice(op, c) for c in cs] for op, cs in cands.items()}
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
        capacity=target.usable_bytes if ctx.budget is None else min(target.usable_bytes, ctx.budget),
        resident_parts=parts,
        interleaved_capacity=target.interleaved_bytes,
        resident_interleaved=interleaved,
        blocks=_block_ranges(g, ctx.storage),
    )


def _block_ranges(graph: Graph, storage: dict) -> list[tuple[int, int]] | None:
    """The repeated layers of the graph (``canon.repeated_blocks``) as index ranges of its op order: the
    selection searches one and composes the others (``select._Search``), where they repeat it."""
    from .canon import repeated_blocks
    index = {op.name: i for i, op in enumerate(graph.ops)}
    blocks = [(index[b[0].name], index[b[-1].name] + 1) for b in repeated_blocks(graph, storage)]
    return blocks or None


# ---- several IPUs (``planner.stages``) ----------------------------------------------------------

def plan_stages(graph: Graph, target, *, jobs: int = 1, solver: str = "dp", frontier_bound: int = 32,
                dp_paths=16, progress=None, weights=None, pins=(), share: bool = True, cache=None,
                caches=None, qkv: str = "auto", budget: int | None = None):
    """``graph`` planned as pipeline stages over ``target``'s IPUs (``planner.stages``): a ``Plan`` of the
    whole target whose ``stages`` records the split."""
    from .cache import MemoryCache
    from .stages import compose, op_costs, split, stage_graph
    t0 = time.perf_counter()
    canon_graph = canonical(graph)
    sub = target.with_tiles(target.tiles_per_ipu)
    if cache is None:
        cache = MemoryCache()          # the stages' common catalogues costed once
    w = resolve_weights(canon_graph, weights)
    split(canon_graph, target, [0] * len(canon_graph.ops))     # no split fits: refused before any costing
    costs = op_costs(_context(canon_graph, sub, jobs, frontier_bound, None, caches, w), cache)
    sp = split(canon_graph, target, costs)
    plans = []
    for k, (lo, hi) in enumerate(sp.ranges):
        g = stage_graph(canon_graph, lo, hi)
        names = {op.name for op in g.ops}
        try:
            plans.append(plan(g, sub, jobs=jobs, solver=solver, frontier_bound=frontier_bound, dp_paths=dp_paths,
                              progress=progress, weights=w, pins=[p for p in pins if p.op in names], share=share,
                              cache=cache, caches=caches, qkv=qkv, ipus="spread", budget=budget))
        except TileplanError as exc:
            raise TileplanError(f"pipeline stage {k} (IPU {k}: ops {canon_graph.ops[lo].name!r} to "
                                f"{canon_graph.ops[hi - 1].name!r}): {exc}") from None
    out = Plan(**compose(canon_graph, target, plans, sp, buffer_name))
    out.plan_seconds = time.perf_counter() - t0
    return out


def plan_over_ipus(graph: Graph, target, *, mode: str = "auto", **kw):
    """``plan``'s multi-IPU entry (``planner.stages``): ``stages``, or ``auto``'s choice between the two
    forms. The plan's ``stages`` record says which form it is and, with ``auto``, both forms'
    cycles (None: that form does not fit, with why)."""
    from .stages import check_mode
    check_mode(mode)
    if mode == "stages":
        return plan_stages(graph, target, **kw)
    t0 = time.perf_counter()
    staged = spread = None
    why = {}
    try:
        staged = plan_stages(graph, target, **kw)
    except TileplanError as exc:
        why["stages"] = str(exc)
    try:
        spread = plan(graph, target, ipus="spread", **kw)
    except TileplanError as exc:
        if staged is None:
            raise
        why["spread"] = str(exc)
    best = staged if spread is None or (staged is not None and staged.estimate.cycles < spread.estimate.cycles) \
        else spread
    record = dict(best.stages) if best.stages else {"mode": "spread"}
    record.update({"chosen_by": "auto",
                   "stages_cycles": int(staged.estimate.cycles) if staged is not None else None,
                   "spread_cycles": int(spread.estimate.cycles) if spread is not None else None,
                   "not_fitting": why})
    best.stages = record
    best.plan_seconds = time.perf_counter() - t0
    return best
