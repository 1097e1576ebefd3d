"""Micro-batches pipelined through the stages of a multi-IPU plan (``--micro-batch``).

A model's batch (the leading axis of its inputs, ``B``) is cut into ``M = B / m`` micro-batches of
``m`` images. The model is planned once, for one micro-batch (``micro_graph``: the same graph with
the batch axis ``m``), and the program runs ``M`` times. On a plan of pipeline stages
(``planner.stages``: IPU ``k`` runs stage ``k``) the runs overlap: in time slot ``t`` stage ``s``
works on micro-batch ``t - s`` (fill: the first ``S - 1`` slots, drain: the last ``S - 1``), and
``T = M + S - 1`` slots run in all. A slot is

1. its link phase: the transfers into every stage that works in the slot (a micro-batch crossing
   from IPU ``s - 1`` to IPU ``s``), one after the other, each with its sync spanning IPUs;
2. its compute phase: every working stage runs its steps on its IPU at once; the phase lasts as
   long as the slowest of them (a stage's own steps: compute sets, on-IPU exchanges, one-IPU syncs);
3. one sync across IPUs before the next slot (none after the last).

So ``total = sum over slots of (links + slowest stage) + (T - 1) x sync``, the latency of a
micro-batch is the slots from its entry into stage 0 to its exit from the last stage, and the
steady-state rate (every stage busy, ``M >= S``) is ``m`` images per (all links + slowest stage +
sync). A plan on one IPU, or spread over every IPU, is one stage: its micro-batches run one after
the other, one sync between them.

Design decision: one function (``schedule``) turns per-step cycles and each step's place (a stage's
own step, or the link phase into a stage) into the figures, and the planner's estimate, the compiled
program's static count and the IPU model's run all call it with their own per-step cycles: the
estimate equals the simulated cycles wherever the per-step cycles do. Each step's place is read
from the tiles it touches (``place``): a step on one IPU is that stage's own; a step touching IPUs
``s - 1`` and ``s`` is the link phase into stage ``s`` (the lowering may group a stage's last
on-IPU exchange or the next stage's first with the link transfer: that step then runs in the link
phase, which keeps every micro-batch's order of steps). A step touching other IPUs (a value skipping
a stage) is refused: in flight, the skipped stage's next micro-batch would overwrite it.

Design decision, the batch axis: axis 0 of every input and activation (what the fixtures, the ONNX
and the torch importers write for a vision tower). ``micro_graph`` checks it rather than guessing:
every input, intermediate and output must have ``B`` leading, no op may reduce, slice, concatenate
or transpose over axis 0 (its ``axis`` / ``perm`` fields), and a Reshape's ``shape`` keeps ``B``
leading; then each image's result depends on that image only, and a micro-batch's outputs are the
rows of the batch's outputs.
"""

from __future__ import annotations

import dataclasses

from ..errors import TileplanError
from ..graph.core import Graph, Role

# The most micro-batches one package runs (plan.json's ``pipeline``, checked on loading): validation
# runs the program that many times, so a damaged count must not make it run for days.
MAX_MICRO_BATCHES = 1 << 12


def check_micro_batch(value) -> int | None:
    """``--micro-batch``: None (no micro-batches) or a positive integer."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TileplanError(f"--micro-batch must be a positive whole number of images, got {value!r}")
    return int(value)


def batch_of(graph: Graph) -> int:
    """The model's batch: the leading dimension shared by all its inputs (a ``TileplanError`` when
    they do not share one)."""
    ins = [t for t in graph.tensors.values() if t.role is Role.INPUT]
    if not ins:
        raise TileplanError(f"model {graph.name!r} has no inputs: --micro-batch cuts the inputs' batch axis")
    leads = {t.shape[0] if t.shape else None for t in ins}
    if len(leads) != 1 or None in leads:
        raise TileplanError(f"model {graph.name!r}: --micro-batch needs every input to have the batch as its "
                            f"leading axis; the inputs have shapes "
                            f"{', '.join(f'{t.name!r} {list(t.shape)}' for t in ins[:4])}")
    return int(leads.pop())


def micro_graph(graph: Graph, m: int) -> Graph:
    """``graph`` with its batch axis ``m`` (module doc); ``graph`` itself when ``m`` is its batch."""
    b = batch_of(graph)
    if m > b or b % m:
        raise TileplanError(f"--micro-batch {m} does not divide model {graph.name!r}'s batch of {b} images "
                            f"(the leading axis of its inputs)")
    if b // m > MAX_MICRO_BATCHES:
        raise TileplanError(f"--micro-batch {m} makes {b // m:,} micro-batches of model {graph.name!r}'s batch of "
                            f"{b}; at most {MAX_MICRO_BATCHES:,} run in one package")
    for t in graph.tensors.values():
        if t.role is not Role.PARAMETER and (not t.shape or t.shape[0] != b):
            raise TileplanError(f"model {graph.name!r}: tensor {t.name!r} {list(t.shape)} does not have the batch "
                                f"({b}) as its leading axis; --micro-batch needs every activation to")
    for op in graph.ops:
        n = len(graph.tensors[op.inputs[0]].shape)
        axis = getattr(op, "axis", None)
        perm = getattr(op, "perm", None)
        if (isinstance(axis, int) and n and axis % n == 0) or (perm and perm[0] != 0):
            raise TileplanError(f"op {op.name!r} ({op.kind}) works across the batch axis of model {graph.name!r}; "
                                "--micro-batch needs each image computed on its own")
    if m == b:
        return graph

    def cut(shape):
        return (m, *shape[1:])
    tensors = [t if t.role is Role.PARAMETER else dataclasses.replace(t, shape=cut(t.shape))
               for t in graph.tensors.values()]
    ops = []
    for op in graph.ops:
        shape = getattr(op, "shape", None)
        if isinstance(shape, tuple) and shape:        # (its output, an activation, has the batch leading)
            op = dataclasses.replace(op, shape=cut(shape))
        ops.append(op)
    outputs = [n for n, t in graph.tensors.items() if t.role is Role.OUTPUT]
    unread = frozenset(n for n, t in graph.tensors.items()
                       if t.role in (Role.INPUT, Role.PARAMETER) and not graph.consumers.get(n))
    g = Graph.build(graph.name, tensors, ops, outputs=outputs, target=graph.target, pins=graph.pins,
                    weights=graph.weights, folded=dict(graph.folded), unread=unread)
    return dataclasses.replace(g, imported=dict(graph.imported))


# ---- the schedule ---------------------------------------------------------------------------------

def place(ipus: set[int], stages: int, previous: int, where: str) -> tuple[str, int]:
    """A step's place in the schedule from the IPUs it touches: ``("own", s)`` or ``("link", s)`` (the
    link phase into stage ``s``). ``stages == 1``: every step is stage 0's. A step touching no tile
    stays with the step before it (``previous``: that step's stage)."""
    if stages == 1:
        return ("own", 0)
    if not ipus:
        return ("own", previous)
    if len(ipus) == 1:
        return ("own", next(iter(ipus)))
    lo, hi = min(ipus), max(ipus)
    if len(ipus) == 2 and hi == lo + 1:
        return ("link", hi)
    raise TileplanError(f"{where} moves data between IPUs {sorted(ipus)}: with micro-batches in flight each stage "
                        "may only receive from the stage before it")


def stage_figures(steps: list[tuple[int, tuple[str, int]]], stages: int) -> tuple[list[int], list[int]]:
    """(own cycles per stage, link cycles into each stage) from ``(cycles with sync, place)`` per step."""
    own, link = [0] * stages, [0] * stages
    for cycles, (kind, s) in steps:
        (own if kind == "own" else link)[s] += int(cycles)
    return own, link


def schedule(own: list[int], link: list[int], micro_batches: int, micro_batch: int, target) -> dict:
    """The pipelined run's figures (module doc) from each stage's own cycles and the cycles of the link
    phase into it, ``micro_batches`` runs of ``micro_batch`` images, at ``target``'s clock and sync."""
    s_n, m_n = len(own), int(micro_batches)
    sync = target.sync_cycles_multi if target.ipus > 1 else target.sync_cycles
    slots = []
    for t in range(m_n + s_n - 1):
        active = [s for s in range(s_n) if 0 <= t - s < m_n]
        slots.append(sum(link[s] for s in active) + max(own[s] for s in active))
    total = sum(slots) + (len(slots) - 1) * sync
    latency = max(sum(slots[j:j + s_n]) + (s_n - 1) * sync for j in range(m_n))
    steady = sum(link) + max(own) + sync
    batch = m_n * micro_batch
    clock = target.clock_hz
    return {"micro_batch": int(micro_batch), "micro_batches": m_n, "batch": batch, "stages": s_n,
            "stage_cycles": [int(c) for c in own], "link_cycles": [int(c) for c in link],
            "slot_cycles": [int(c) for c in slots], "sync_cycles": int(sync), "cycles": int(total),
            "run_ms": total / clock * 1e3, "latency_cycles": int(latency), "latency_ms": latency / clock * 1e3,
            "images_per_second": batch * clock / total, "steady_cycles": int(steady),
            "steady_images_per_second": micro_batch * clock / steady}


def pipeline_stages(stages_record: dict | None) -> int:
    """How many stages a plan's micro-batches flow through: its pipeline stages, else 1."""
    if stages_record and stages_record.get("mode") == "stages":
        return len(stages_record["stages"])
    return 1


def estimate_places(program, target, stages: int) -> list[tuple[str, int]]:
    """The place of each step of a plan's (scheduled) program, from the tiles its vertices and buffers
    are on (``place``)."""
    import numpy as np

    from ..estimate.memory import buffer_tile_bytes
    from ..program import ComputeStep
    tpi = target.tiles_per_ipu
    seen: dict[str, frozenset] = {}

    def buffer_ipus(name):
        got = seen.get(name)
        if got is None:
            per = buffer_tile_bytes(program.buffers[name], target.tiles, target.alignment)
            got = seen[name] = frozenset((np.flatnonzero(per) // tpi).tolist())
        return got
    out, prev = [], 0
    for st in program.steps:
        if stages == 1:
            out.append(("own", 0))
            continue
        if isinstance(st, ComputeStep):
            root = st.source[0] if st.source is not None else st
            ipus = {v.tile // tpi for v in root.vertices}
        else:
            ipus = set().union(*(buffer_ipus(c.src) | buffer_ipus(c.dst) for c in st.copies)) if st.copies else set()
        p = place(ipus, stages, prev, f"step {st.name!r}")
        prev = p[1]
        out.append(p)
    return out


def program_places(tp, target, stages: int) -> list[tuple[str, int]]:
    """The place of each step of a lowered tile program (``lowering.tile_program``), from its vertex
    groups' tiles or its transfers' tiles."""
    import numpy as np
    tpi = target.tiles_per_ipu
    out, prev = [], 0
    for st in tp.steps:
        if stages == 1:
            out.append(("own", 0))
            continue
        if hasattr(st, "groups"):            # a compute set (``lowering.tile_program``); else an exchange
            tiles = [np.asarray(g.tile) for g in st.groups]
        else:
            tiles = [np.asarray(st.transfers.src_tile), np.asarray(st.transfers.dst_tile)]
        cat = np.concatenate(tiles) if tiles else np.zeros(0, dtype=np.int64)
        p = place(set(np.unique(cat // tpi).tolist()), stages, prev, f"step {st.name!r}")
        prev = p[1]
        out.append(p)
    return out


def plan_pipeline(p, micro_batch: int, micro_batches: int) -> dict:
    """A plan's pipelined figures from its detailed estimate (the scheduled program, step by step)."""
    from ..estimate.detailed import cost_program, scheduled
    target = p.target
    stages = pipeline_stages(p.stages)
    prog = scheduled(p.mid.program, target.tiles)
    places = estimate_places(prog, target, stages)
    costed = cost_program(prog, target)
    steps = [(c.cycles + c.sync, places[c.step]) for c in costed.steps]
    return schedule(*stage_figures(steps, stages), micro_batches, micro_batch, target)


def tile_program_pipeline(tp, target, stages: int, micro_batch: int, micro_batches: int, step_cycles) -> dict:
    """A tile program's pipelined figures from its per-step cycles (with sync): the compiled
    program's static count (``lowering.compile.program_cycles``) or the IPU model's run."""
    places = program_places(tp, target, stages)
    return schedule(*stage_figures(list(zip(step_cycles, places)), stages), micro_batches, micro_batch, target)


def summary(fig: dict, what: str = "estimate") -> str:
    """One line a user reads: the pipelined run's figures (modelled, not measured)."""
    return (f"micro-batches ({what}): {fig['micro_batches']} x {fig['micro_batch']} image(s) over {fig['stages']} "
            f"stage(s): {fig['cycles']:,} cycles in all ({fig['run_ms']:.3f} ms), "
            f"{fig['images_per_second']:.1f} images/s with fill and drain, "
            f"{fig['steady_images_per_second']:.1f} images/s steady; latency per image "
            f"{fig['latency_cycles']:,} cycles ({fig['latency_ms']:.3f} ms) (modelled by the cycle model, "
            f"not measured on hardware)")
