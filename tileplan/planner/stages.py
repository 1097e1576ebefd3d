"""Planning over several IPUs: pipeline stages, or one graph spread over every tile.

A multi-IPU target (``Target.ipus > 1``) is planned one of two ways (``plan(..., ipus=)``, the
command line's ``--ipus``):

- ``spread``: the whole target as one machine. Every op may place its work on any IPU's tiles
  (a GEMM's grid spans the IPUs: tensor-parallel), and conversions cross the IPU-Links wherever
  the layouts say. The only way for one op too big for one IPU.
- ``stages``: pipeline stages. The ops, in execution order, are cut into contiguous blocks, one
  per IPU; IPU k runs its block on its tiles ``[k * tiles_per_ipu, (k + 1) * tiles_per_ipu)``,
  and the values a later block reads cross the IPU-Links once, at the stage boundary.
- ``auto`` (the default): both, keeping the plan with fewer modelled cycles (a tie keeps
  ``spread``); the one that fits where the other does not (no stage split fits a single op too
  big for one IPU; a spread plan may not fit where stages do).

Design decision: each stage is planned as a one-IPU program (``Target.with_tiles``: its key is
the one of a one-IPU target of that many tiles, so the plan cache and the GEMM catalogues are
shared between the stages and with one-IPU plans), then moved onto its IPU's tiles
(``layout.shifted``: every buffer's layout and every vertex's tile move by ``k *
tiles_per_ipu``) and the stage programs are joined by one exchange per value crossing a
boundary. The joined program is costed in detail on the whole target (the link model of
``estimate.exchange``), lowered, packaged and simulated as any other: the estimate and the IPU
model count the link transfers alike. Repeated layers are planned once per stage selection (a
stage's tower is still one block searched once), and the catalogue of a layer is costed once
for every stage.

Design decision, the split: a selection over per-op costs, not a search per stage. Each op's
cost is its cheapest candidate's detailed cycles in the one-IPU catalogue (the catalogue the
stage plans then reuse), its memory the bytes of the parameters it reads. Cuts are allowed only
between repeated layers where the graph has them (``canon.repeated_blocks``: each IPU then holds
whole layers and only the residual stream crosses), else between any two ops, and never where a
parameter is read on both sides. A dynamic programme over the cuts minimises the slowest stage
(the pipelined interval: with micro-batches in flight, one image leaves every interval), a
stage's cost being its ops' cycles plus the link transfer of what it receives, then the total
(the latency of one image); a stage whose parameters exceed ``FILL`` of its IPU's usable
memory is not allowed. The stage plans then check memory exactly; a stage that still does not
fit stops with the planner's error, naming the stage. (The entry points, ``plan_stages`` and
``plan_over_ipus``, live in ``planner.plan``; this module holds the mechanics.)
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import TileplanError
from ..graph.core import Graph, Role
from .storage import RESIDENT_FILL

MODES = ("auto", "spread", "stages")

# The share of an IPU's usable SRAM a stage's parameters may take in the split (the rest: the
# activations, transients and the per-tile imbalance of the stage's own plan): the share a tile's
# resident parameters may take (``storage.RESIDENT_FILL``), one constant for both.
FILL = RESIDENT_FILL


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise TileplanError(f"--ipus must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


@dataclasses.dataclass
class Split:
    """Op index ranges, one per stage (IPU), and the op costs the split was made from."""

    ranges: list[tuple[int, int]]
    cycles: list[int]          # per stage: the ops' cheapest cycles (the split's model)
    params: list[int]          # per stage: parameter bytes


def _param_bytes(graph: Graph, op) -> int:
    return sum(graph.tensors[i].nbytes for i in dict.fromkeys(op.inputs)
               if graph.tensors[i].role is Role.PARAMETER)


def op_costs(ctx, cache) -> list[int]:
    """Each op's cheapest candidate in the planning context ``ctx`` of a one-IPU target (cycles), from
    the catalogue the stage plans reuse (GEMMs through ``cache``, elementwise ops costed once per
    planning problem)."""
    from . import canon
    from .catalogue import Catalogues
    from .families import family_of
    g = ctx.graph
    gemms = Catalogues(ctx, [op for op in g.ops if family_of(op).catalogued], share=True, cache=cache).result()
    seen: dict = {}
    out = []
    for op in g.ops:
        if family_of(op).catalogued:
            cands = gemms[op.name]
        else:
            key = canon.op_key(g, ctx.storage, op)
            if key not in seen:
                seen[key] = family_of(op).candidates(ctx, op)
            cands = seen[key]
        out.append(min((int(c.estimate.cycles) for c in cands), default=0))
    return out


def split(graph: Graph, target, costs: list[int]) -> Split:
    """The stage split of ``graph``'s ops (canonical order) over ``target``'s IPUs (module doc); a
    ``TileplanError`` saying why when no split fits."""
    from ..estimate.exchange import link_cycles, phase_sync
    from .canon import repeated_blocks
    from .storage import parameter_storage
    ops = graph.ops
    n = len(ops)
    index = {op.name: i for i, op in enumerate(ops)}
    blocks = repeated_blocks(graph, parameter_storage(graph, target.with_tiles(target.tiles_per_ipu)))
    if blocks:
        cuts = sorted({index[b[0].name] for b in blocks} | {index[blocks[-1][-1].name] + 1})
    else:
        cuts = list(range(1, n))
    cuts = [c for c in cuts if 0 < c < n]
    # a parameter read on both sides of a cut forbids it
    readers: dict[str, list[int]] = {}
    for i, op in enumerate(ops):
        for t in op.inputs:
            if graph.tensors[t].role is Role.PARAMETER:
                readers.setdefault(t, []).append(i)
    spans = [(min(r), max(r)) for r in readers.values() if min(r) != max(r)]
    cuts = [c for c in cuts if not any(a < c <= b for a, b in spans)]
    params = np.array([_param_bytes(graph, op) for op in ops], dtype=np.int64)
    pre_c = np.concatenate(([0], np.cumsum(np.asarray(costs, dtype=np.int64))))
    pre_p = np.concatenate(([0], np.cumsum(params)))
    budget = FILL * target.tiles_per_ipu * target.usable_bytes
    produced_at = {op.output: i for i, op in enumerate(ops)}

    def crossing(c: int) -> int:
        """Cycles of the link transfer at a cut before op ``c`` (``estimate.exchange``'s link model):
        the bytes of the values made before it and read after it, from one IPU to the next, and a
        sync spanning IPUs."""
        names = {t for op in ops[c:] for t in op.inputs
                 if t in produced_at and produced_at[t] < c}
        pairs = np.zeros(target.ipus * target.ipus, dtype=np.int64)
        pairs[1] = sum(graph.tensors[t].nbytes for t in names)   # IPU 0 -> 1
        return link_cycles(pairs, target) + phase_sync(bool(pairs[1]), pairs, target)

    points = [0, *cuts, n]
    cross = {c: crossing(c) for c in cuts}
    m = len(points)
    INF = (float("inf"), float("inf"))
    # best[k][j]: (slowest stage, total) of k stages covering ops [0, points[j]); from: the previous j
    best = [[INF] * m for _ in range(target.ipus + 1)]
    came = [[-1] * m for _ in range(target.ipus + 1)]
    best[0][0] = (0, 0)
    for k in range(1, target.ipus + 1):
        for j in range(1, m):
            for i in range(j):
                if best[k - 1][i] == INF:
                    continue
                a, b = points[i], points[j]
                if pre_p[b] - pre_p[a] > budget:
                    continue
                c = int(pre_c[b] - pre_c[a]) + (cross[a] if a else 0)
                prev = best[k - 1][i]
                cand = (max(prev[0], c), prev[1] + c)
                if cand < best[k][j]:
                    best[k][j], came[k][j] = cand, i
    k_best = min(range(1, target.ipus + 1), key=lambda k: (best[k][m - 1], k))
    if best[k_best][m - 1] == INF:
        heaviest = max(range(n), key=lambda i: params[i])
        raise TileplanError(f"no pipeline-stage split of model {graph.name!r} fits {target.ipus} IPUs of "
                            f"{target.tiles_per_ipu} tiles: the stages' parameters exceed {FILL:.0%} of an IPU's "
                            f"{target.tiles_per_ipu * target.usable_bytes:,} usable bytes (the largest op, "
                            f"{ops[heaviest].name!r}, reads {int(params[heaviest]):,} bytes of parameters)")
    ranges, j, k = [], m - 1, k_best
    while k:
        i = came[k][j]
        ranges.append((points[i], points[j]))
        j, k = i, k - 1
    ranges.reverse()
    return Split(ranges, [int(pre_c[b] - pre_c[a]) for a, b in ranges],
                 [int(pre_p[b] - pre_p[a]) for a, b in ranges])


def stage_graph(graph: Graph, lo: int, hi: int) -> Graph:
    """Ops ``[lo, hi)`` of ``graph`` as a graph of their own: what earlier stages made (and the graph
    inputs) are its inputs, what later stages or the graph's outputs read are its outputs."""
    ops = graph.ops[lo:hi]
    produced = {op.output for op in ops}
    later = {t for op in graph.ops[hi:] for t in op.inputs}
    names = dict.fromkeys(t for op in ops for t in (*op.inputs, op.output))
    tensors, outputs = [], []
    for name in graph.tensors:
        if name not in names:
            continue
        t = graph.tensors[name]
        if name in produced:
            role = Role.OUTPUT if (t.role is Role.OUTPUT or name in later) else Role.INTERMEDIATE
            if role is Role.OUTPUT:
                outputs.append(name)
        else:
            role = Role.PARAMETER if t.role is Role.PARAMETER else Role.INPUT
        tensors.append(dataclasses.replace(t, role=role, layout=None if role is Role.INPUT and name in
                                           graph.producers else t.layout))
    opnames = {op.name for op in ops}
    g = Graph.build(graph.name, tensors, list(ops), outputs=outputs, target=graph.target,
                    pins=tuple(p for p in graph.pins if p.op in opnames), weights=graph.weights)
    return dataclasses.replace(g, imported=dict(graph.imported))


def compose(graph: Graph, target, plans: list, sp: Split, buffer_name) -> dict:
    """The fields of one ``Plan`` of the whole target from the stage plans (stage k on IPU k): their
    programs moved onto their IPUs' tiles and joined by an exchange per value crossing a boundary.
    ``buffer_name``: ``plan.buffer_name`` (a tensor's buffer in a layout)."""
    from ..estimate.detailed import cost_program, scheduled
    from ..layout.layouts import shifted
    from ..program import ComputeStep, Copy, ExchangeStep, Program
    from .mid import MidGraph, MidNode
    tpi = target.tiles_per_ipu
    program = Program()
    nodes: list = []
    layouts: dict = {}
    home: dict[str, str] = {}        # tensor -> the joined program's buffer holding it where it was born
    cands, picks, runner_ups, storage = {}, {}, {}, {}
    stages, ops, tensors, fused, groups = [], [], {}, [], []
    for k, p in enumerate(plans):
        off = k * tpi
        g = p.graph
        imports = [n for n, t in g.tensors.items() if t.role is Role.INPUT and n in home]

        def rn(name, _imports=frozenset(imports), _k=k, _bufs=p.mid.program.buffers):
            b = _bufs.get(name)
            return f"{name}@ipu{_k}" if b is not None and b.tensor in _imports else name
        for b in p.mid.program.buffers.values():
            kind = b.kind
            if kind == "input" and b.tensor in imports:
                kind = "tensor"
            if kind == "output" and graph.tensors.get(b.tensor) is not None \
                    and graph.tensors[b.tensor].role is not Role.OUTPUT:
                kind = "tensor"
            program.buffers[rn(b.name)] = dataclasses.replace(b, name=rn(b.name), layout=shifted(b.layout, off),
                                                              kind=kind)
        received = 0
        for t in imports:
            src = home[t]
            dst = [b for b in p.mid.program.buffers.values() if b.tensor == t and b.kind == "input"]
            if not dst:
                continue               # (read by an absorbed op only: nothing to receive)
            dst = rn(dst[0].name)
            conv = Program({src: program.buffers[src], dst: program.buffers[dst]},
                           [ExchangeStep(f"ipu{k}.receive.{t}", (Copy(src, dst),))])
            est = cost_program(conv, target).estimate
            nodes.append(MidNode("conversion", f"to IPU {k}: {t}", g.consumers[t][0].name if g.consumers.get(t)
                                 else None, None, t, program.buffers[src].layout, program.buffers[dst].layout,
                                 conv, est))
            program.steps.extend(conv.steps)
            received += int(np.prod(program.buffers[src].shape)) * program.buffers[src].dtype.itemsize
        roots: dict = {}
        for st in p.mid.program.steps:
            if isinstance(st, ComputeStep):
                root, names = st.source if st.source is not None else (st, None)
                moved = roots.get(id(root))
                if moved is None:
                    moved = roots[id(root)] = ComputeStep(root.name, tuple(
                        dataclasses.replace(v, tile=v.tile + off) for v in root.vertices))
                mapping = {b: rn(names[b] if names is not None else b) for b in root.buffers}
                program.steps.append(ComputeStep(st.name, source=(moved, mapping)))
            else:
                program.steps.append(ExchangeStep(st.name, tuple(Copy(rn(c.src), rn(c.dst)) for c in st.copies)))
        program.aliases.update({rn(a): rn(b) for a, b in p.mid.program.aliases.items()})
        for node in p.mid.nodes:
            nodes.append(node)
        for t, lays in p.mid.layouts.items():
            if t not in home and (t in g.producers or g.tensors[t].role is Role.INPUT):
                name = buffer_name(t, lays[0])
                if name in p.mid.program.buffers:
                    home[t] = rn(name)
            layouts.setdefault(t, []).extend(shifted(x, off) for x in lays)
        cands.update(p.candidates)
        picks.update(p.picks)
        runner_ups.update(p.runner_ups)
        storage.update({n: dataclasses.replace(s, layout=shifted(s.layout, off)) for n, s in p.storage.items()})
        for op in g.ops:
            ops.append(op)
        for n, t in g.tensors.items():
            tensors.setdefault(n, graph.tensors.get(n, dataclasses.replace(t, layout=None)))
        if p.qkv is not None:
            fused.extend(p.qkv.get("fused", []))
            groups.extend(p.qkv.get("groups", []))
        stages.append({"ipu": k, "first_op": g.ops[0].name, "last_op": g.ops[-1].name, "ops": len(g.ops),
                       "cycles": int(p.estimate.cycles), "parameter_bytes": int(sp.params[k]),
                       "link_bytes_in": int(received), "ops_names": [op.name for op in g.ops]})
    outputs = [n for n, t in graph.tensors.items() if t.role is Role.OUTPUT]
    joined = Graph.build(graph.name, [t if t.role is not Role.OUTPUT or t.name in outputs else
                                      dataclasses.replace(t, role=Role.INTERMEDIATE) for t in tensors.values()],
                         ops, outputs=outputs, target=graph.target, pins=graph.pins, weights=graph.weights,
                         folded=graph.folded)
    joined = dataclasses.replace(joined, imported=dict(graph.imported))
    mid = MidGraph(nodes, program, layouts)
    detailed = cost_program(scheduled(program, target.tiles), target)
    first = plans[0]
    record = {"mode": "stages", "interval_cycles": max(s["cycles"] for s in stages),
              "stages": [{k: v for k, v in s.items() if k != "ops_names"} for s in stages],
              "ipu_of": {n: s["ipu"] for s in stages for n in s["ops_names"]}}
    qkv = None
    if any(p.qkv is not None for p in plans):
        def total(form):          # both forms' cycles summed over the stages, where every stage planned it
            got = [p.qkv.get(f"{form}_cycles") if p.qkv else None for p in plans]
            return None if any(c is None for c in got) else int(sum(got))
        qkv = {"mode": first.qkv["mode"] if first.qkv else "auto", "chosen": "fused" if fused else "separate",
               "separate_cycles": total("separate"), "fused_cycles": total("fused"), "fused": fused,
               "groups": groups}
    return dict(graph=joined, target=target, mid=mid, candidates=cands, picks=picks, estimate=detailed.estimate,
                detailed=detailed, roofline=joined.roofline_cycles(target), solver=first.solver,
                runner_ups=runner_ups, storage=storage, weights=first.weights, qkv=qkv, stages=record)
