"""``plan.json``: the plan as data, for packages, ``tileplan report`` and diffs.

``plan_to_json(plan)`` returns plain JSON values only (ints, not numpy types;
floats rounded to 6 decimals), with no timestamps and no plan time, so the same
model and target give byte-identical files (``write_plan_json`` sorts keys).

Contents:

- ``model``, ``target``, ``solver``; ``weights``, the parameter storage the plan was made with
  (``"planner"``: selection may pre-arrange a GEMM's weights; ``"compact"``: never);
- ``prearranged`` (only when some are): the parameters stored as their GEMM's grid reads them,
  with their bytes beside their compact storage's;
- ``ops`` in execution order: the chosen candidate as one line, the layouts of
  its inputs (activation inputs as the candidate reads them, private parameters
  in their resident storage) and of its output, the GEMM grid, cycles by phase
  and memory by class of its fragment; ``fused_with`` names the op whose output
  it writes (the GeLU of a bias-GeLU, the bias Add a GEMM does in its reduction:
  its grid says ``bias_in_reduction``; the last op of a fused epilogue chain,
  its grid's ``epilogue`` saying what the reducers also do), ``fused_through``
  the ops in between, and ``absorbed`` marks the op that fusion did, with
  ``absorbed_into`` naming the op that did its work;
- ``conversions``: every conversion node of the MidGraph (the tensor, from, to,
  the op it feeds, bytes moved and cycles);
- ``totals``: the whole program's detailed estimate (``Estimate.as_dict()``)
  and the tile with the highest memory peak; ``roofline_cycles`` and ``ratio``;
  ``model_floor`` (``quality.model_floor``: no plan in the candidate space is
  faster) with its ratio to the roofline and the plan's ratio to it; each op's
  ``floor`` is its share of it (``floor_group``, on a GEMM with an epilogue chain: the ops
  its floor covers, the GEMM first; the chain ops' own floors are then 0);
- ``imported`` (only when an importer converted the model, e.g. ``--cast-bf16 fp16``):
  ``Graph.imported``, ``{"cast_bf16": "fp16", "converted_bf16_tensors": N}``;
- ``folded`` (only when the planner folded outputs at plan time, ``planner.rewrite``): per graph
  output no op writes, its tensor, shape, dtype and one value (a string: ``"-inf"`` is no JSON
  number); host data, no tile memory, zero cycles;
- ``qkv`` (only when the graph has GEMMs that fuse, ``planner.qkv``): ``mode`` (auto, fused,
  separate), ``chosen`` (``"fused"`` or ``"separate"``), ``separate_cycles`` and ``fused_cycles``
  (the whole program's estimate of each form; null where it was not planned), ``groups`` (the
  GEMMs of each group) and ``fused`` (when chosen: each fused GEMM, its weight and the weights
  concatenated into it, which the package's params.npz holds);
- ``pipeline`` (only with ``--micro-batch``, ``planner.pipeline``): the micro-batch size and count,
  the batch, the stages' own and link cycles, each slot's cycles, the sync between slots, the whole
  run's cycles, a micro-batch's latency (cycles and ms), images/s with fill and drain and steady;
  from the estimate (modelled figures). The graph of the plan is one micro-batch's;
- ``runner_ups`` per GEMM: the candidates that lost, best first, with coarse and
  (when they reached it) detailed cycles and memory, and why they lost: kept
  candidates the whole-graph selection did not pick, then the catalogue's
  runner-ups (``candidates.RunnerUp``: each with why it lost).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .candidates import activation_inputs

FORMAT = "tileplan.plan/1"
RUNNER_UPS = 12            # per GEMM in plan.json


def _f(x: float) -> float:
    return round(float(x), 6)


def _phases(est) -> dict:
    return {"compute": int(est.compute), "exchange": int(est.exchange), "sync": int(est.sync),
            "cycles": int(est.cycles), "bytes_moved": int(est.bytes_moved)}


def _memory(est) -> dict:
    return {"standard": int(est.standard), "interleaved": int(est.interleaved), "total": int(est.total_memory)}


def _grid(choice) -> dict | None:
    if choice is None:
        return None
    return {"gb": int(choice.gb), "gm": int(choice.gm), "gn": int(choice.gn), "gk": int(choice.gk),
            "order": choice.order, "reduction": choice.reduction, "partials": str(choice.partials),
            "bias_in_reduction": bool(choice.bias),
            "epilogue": str(choice.epilogue) if choice.epilogue is not None else None}


def _op_entry(plan, node, storage) -> dict:
    graph = plan.graph
    op = graph.op(node.op)
    cand = node.candidate
    acts = activation_inputs(storage, op)
    reads = dict(zip(acts, cand.ins))
    inputs = {}
    for name in op.inputs:
        if name in reads:
            inputs[name] = str(reads[name])
        elif name in storage:
            inputs[name] = str(storage[name].layout)
    return {
        "name": op.name,
        "kind": op.kind,
        "candidate": str(cand),
        "layouts": {"inputs": inputs, "output": str(cand.out)},
        "grid": _grid(cand.choice),
        "estimate": _phases(cand.estimate),
        "memory": _memory(cand.estimate),
        "fused_with": cand.fused,
        "fused_through": list(cand.through),
        "absorbed": bool(cand.absorbed),
        "absorbed_into": absorbed_into(plan, op.name) if cand.absorbed else None,
    }


def absorbed_into(plan, op: str) -> str | None:
    """The op whose chosen candidate did the work of the absorbed op ``op``."""
    for node in plan.mid.nodes:
        if node.kind == "op" and (node.candidate.fused == op or op in node.candidate.through):
            return node.op
    return None


def _conversion_entry(node) -> dict:
    return {"tensor": node.tensor, "from": str(node.src), "to": str(node.dst), "for_op": node.op,
            "bytes": int(node.estimate.bytes_moved), "cycles": int(node.estimate.cycles),
            "estimate": _phases(node.estimate)}


def _loser(cand, lost: str) -> dict:
    return {"candidate": str(cand), "implementation": cand.desc,
            "coarse": {"cycles": int(cand.coarse.cycles), "memory": int(cand.coarse.total_memory)},
            "detailed": ({**_phases(cand.estimate), "memory": _memory(cand.estimate)} if cand.detailed else None),
            "lost": lost}


def runner_ups(plan, op: str, limit: int = RUNNER_UPS) -> list[dict]:
    """The best losers of one GEMM, one per private implementation (grid, order, reduction, partials)
    other than the chosen one, each in its best boundary variant: kept candidates the selection did
    not pick first (by detailed cycles), then detailed runner-ups, then coarse-only ones."""
    chosen = plan.candidates[op][plan.picks[op]]
    kept = sorted((c for c in plan.candidates[op] if c is not chosen),
                  key=lambda c: (c.estimate.cycles, c.estimate.total_memory, str(c)))
    lost = plan.runner_ups.get(op, [])
    detailed = sorted((r for r in lost if r.candidate.detailed),
                      key=lambda r: (r.candidate.estimate.cycles, str(r.candidate)))
    coarse = sorted((r for r in lost if not r.candidate.detailed),
                    key=lambda r: (r.candidate.coarse.cycles, str(r.candidate)))
    out, seen = [], {chosen.desc}
    for c, why in [(c, None) for c in kept] + [(r.candidate, r.why) for r in detailed + coarse]:
        if c.desc in seen:
            continue
        seen.add(c.desc)
        out.append(_loser(c, _selection_loss(c, chosen) if why is None else why))
        if len(out) == limit:
            break
    return out


def _selection_loss(c, chosen) -> str:
    delta = c.estimate.cycles - chosen.estimate.cycles
    if bool(c.fused) != bool(chosen.fused):
        # One adds the following bias Add in its reduction, the other leaves it to the Add: their
        # own cycles do not compare; the whole graph does.
        how = "adds the bias in its reduction" if c.fused else "leaves the bias to the Add"
        return (f"selection: {delta:+,} cycles against the chosen candidate on its own, but it {how}, "
                f"and with it the whole graph is slower (or over memory)")
    if delta > 0:
        return f"selection: {delta:,} cycles slower than the chosen candidate on its own"
    if delta < 0:
        return (f"selection: {-delta:,} cycles faster on its own, but its boundary layouts cost more "
                f"in conversions (or memory) elsewhere in the graph")
    return "selection: as fast on its own; the chosen one fits the rest of the graph at least as well"


def prearranged(plan) -> list[dict]:
    """The parameters a plan stores pre-arranged (as their GEMM's grid reads them), each with its
    layout and its bytes (most on one tile, and over all tiles) beside its compact storage's."""
    from ..estimate.memory import buffer_tile_bytes
    from ..program import Buffer
    from .storage import parameter_storage
    compact = parameter_storage(plan.graph, plan.target)
    out = []
    for op in plan.graph.ops:
        cand = plan.candidates[op.name][plan.picks[op.name]]
        if cand.weights is None:
            continue
        name = op.inputs[1]
        t = plan.graph.tensors[name]
        sizes = []
        for st in (plan.storage[name], compact[name]):
            shape = t.shape[:-2] + (t.shape[-1], t.shape[-2]) if st.transpose else t.shape
            sizes.append(buffer_tile_bytes(Buffer(name, st.layout, shape, t.dtype, "parameter"), plan.target.tiles,
                                           plan.target.alignment))
        out.append({"tensor": name, "op": op.name, "layout": str(plan.storage[name].layout),
                    "replicas": int(plan.storage[name].layout.replicas),
                    "bytes_per_tile_max": int(sizes[0].max()), "bytes_total": int(sizes[0].sum()),
                    "compact_bytes_per_tile_max": int(sizes[1].max()), "compact_bytes_total": int(sizes[1].sum())})
    return out


def plan_to_json(plan) -> dict:
    storage = plan.storage
    ops, conversions = [], []
    for node in plan.mid.nodes:
        if node.kind == "op":
            ops.append(_op_entry(plan, node, storage))
        else:
            conversions.append(_conversion_entry(node))
    gemms = [op.name for op in plan.graph.ops if plan.candidates[op.name] and
             plan.candidates[op.name][0].choice is not None]
    tile_memory = plan.detailed.tile_memory
    peak_tile = int(np.argmax(tile_memory)) if tile_memory is not None and tile_memory.size else -1
    from .quality import model_floor
    floor = model_floor(plan.graph, plan.target, plan.weights)
    for entry in ops:
        share = floor["ops"].get(entry["name"], {})
        entry["floor"] = share.get("cycles")
        if share.get("group"):                # a GEMM's floor covers its epilogue chain's ops too
            entry["floor_group"] = list(share["group"])
    doc = {
        "format": FORMAT,
        "model": plan.graph.name,
        "target": plan.target.name,
        "tiles": int(plan.target.tiles),
        "solver": plan.solver,
        "weights": plan.weights,
        "ops": ops,
        "conversions": conversions,
        "totals": {**{k: int(v) for k, v in plan.estimate.as_dict().items()}, "peak_tile": peak_tile},
        "roofline_cycles": _f(plan.roofline),
        "ratio": _f(plan.ratio) if plan.roofline else None,
        "model_floor": {"cycles": int(floor["cycles"]),
                        "roofline_ratio": _f(floor["cycles"] / plan.roofline) if plan.roofline else None,
                        "plan_ratio": _f(plan.estimate.cycles / floor["cycles"]) if floor["cycles"] else None},
        "runner_ups": {op: runner_ups(plan, op) for op in gemms},
        **({"imported": dict(plan.graph.imported)} if plan.graph.imported else {}),   # e.g. cast_bf16
    }
    if plan.graph.folded:                     # outputs folded at plan time: host data, zero cycles
        doc["folded"] = [{"tensor": n, "shape": list(plan.graph.tensors[n].shape),
                          "dtype": str(plan.graph.tensors[n].dtype), "value": repr(v)}
                         for n, v in sorted(plan.graph.folded.items())]
    pre = prearranged(plan)
    if pre:
        doc["prearranged"] = pre
    if plan.pinned is not None:               # pins that changed the plan, beside the planner's own choice
        doc["pinned"] = {**plan.pinned, "cycles": int(plan.estimate.cycles)}
    if plan.qkv is not None:                  # fused QKV: the form chosen and both forms' cycles
        doc["qkv"] = plan.qkv
    if getattr(plan, "stages", None):         # a multi-IPU target: stages (each op's IPU) or spread
        doc["stages"] = {k: v for k, v in plan.stages.items() if k != "ipu_of"}
        ipu_of = plan.stages.get("ipu_of", {})
        for entry in ops:
            if entry["name"] in ipu_of:
                entry["ipu"] = ipu_of[entry["name"]]
    if getattr(plan, "pipeline", None):       # micro-batches: the schedule's figures (planner.pipeline)
        doc["pipeline"] = plan.pipeline
    return doc



def dumps(data: dict) -> str:
    return json.dumps(data, sort_keys=True, indent=2) + "\n"


def write_plan_json(plan, path: str | Path) -> Path:
    """Write plan.json atomically (``tileplan.atomic.write_file``: a regular file or nothing). ``plan``:
    a ``Plan``, or the document ``plan_to_json`` made of it."""
    from ..atomic import write_file
    return write_file(path, dumps(plan if isinstance(plan, dict) else plan_to_json(plan)))
