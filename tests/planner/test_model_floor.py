"""The model floor is a lower bound: no candidate the planner details, and no plan, beats it."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

from tileplan.graph.core import Graph, MatMul, Role, Tensor
from tileplan.graph.dtypes import DType
from tileplan.graph.loaders import load_model
from tileplan.kernels import MatMulCall, ReduceCall, dispatch
from tileplan.layout.gemm_grid import Grid
from tileplan.planner.gemm import GemmShape
from tileplan.planner.plan import plan
from tileplan.planner.quality import detailed_survivors, gemm_floor, model_floor
from tileplan.target import load_target

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
SMALL = ["mlp_smoke_fp8", "mlp_fp16_small", "odd_prime_dims", "odd_fp8_tails", "odd_fp8_panels",
         "odd_3d_activation", "residual_block"]


@lru_cache(maxsize=None)
def planned(fixture: str):
    target = load_target("ipu21-64")
    graph = load_model(FIXTURES / f"{fixture}.toml")
    return graph, target, plan(graph, target, jobs=1)


@pytest.mark.parametrize("fixture", SMALL)
def test_no_detailed_candidate_and_no_plan_beats_the_model_floor(fixture):
    graph, target, p = planned(fixture)
    floor = model_floor(graph, target)
    assert floor["cycles"] == sum(f["cycles"] for f in floor["ops"].values())
    assert set(floor["ops"]) == {op.name for op in graph.ops}
    assert 0 < floor["cycles"] <= p.estimate.cycles
    ops = {op.name: op for op in graph.ops}
    checked = prearranged = 0
    for name, cands in detailed_survivors(p).items():
        shape = GemmShape.of(graph, ops[name], target)
        grid = [[c.choice.gb, c.choice.gm, c.choice.gn, c.choice.gk] for c in cands]
        ptype = [shape.partial_types().index(c.choice.partials) for c in cands]
        # A candidate reading its weights pre-arranged receives no B, one reading a grid-aligned A
        # (``planner.catalogue.aligned_layouts``) no A: its grid's floor credits that.
        pre_read = np.array([c.weights is not None for c in cands])
        aligned = np.array([isinstance(c.ins[0], Grid) for c in cands])
        held = [(target.tiles if a else 1, target.tiles if b else 1) for a, b in zip(aligned, pre_read)]

        def floors(epilogue=None):
            return np.array([gemm_floor(shape, target, [g], [t], h, epilogue)[0] for g, t, h in zip(grid, ptype, held)])
        bound = floors()
        # A GEMM whose reducers may do an epilogue chain: its fused candidates check against the
        # fused bound, and its share is at most an unfused candidate's bound plus the shares of the
        # chain's ops ("absorbed": they count 0 themselves), or a fused one's.
        share = floor["ops"][name]
        fused = np.array([c.choice.epilogue is not None for c in cands])
        share_bound = bound + share.get("absorbed", 0)
        if fused.any():
            epi = next(c.choice.epilogue for c in cands if c.choice.epilogue is not None)
            fused_bound = floors(epi)
            bound = np.where(fused, fused_bound, bound)
            share_bound = np.where(fused, fused_bound, share_bound)
        for c, b in zip(cands, bound):
            assert b <= c.estimate.cycles, (name, c.desc, int(b), c.estimate.cycles)
            checked += 1
            prearranged += c.weights is not None
        assert share["cycles"] <= min(share_bound)
    assert checked and prearranged
    # Every elementwise candidate that does its op's work costs at least the op's floor; one fused
    # into another op's pass costs nothing here, and a bias-GeLU pass at least the GeLU's floor.
    from tileplan.planner.elementwise import fusable_gelu
    for name, cands in p.candidates.items():
        if isinstance(ops[name], MatMul):
            continue
        for c in cands:
            if c.desc.startswith("fused into"):
                assert c.estimate.cycles == 0
                continue
            least = floor["ops"][fusable_gelu(graph, ops[name]).name]["cycles"] if c.desc.startswith("bias-gelu") \
                else floor["ops"][name]["cycles"]
            assert c.estimate.cycles >= least, (name, c.desc, c.estimate.cycles, least)


def test_the_gemm_floor_of_one_grid_worked_by_hand():
    # C[256, 256] = A @ B, FP16, on 64 tiles in a 4 x 4 x 4 grid: every tile a 64 x 64 x 64 block.
    target = load_target("ipu21-64")
    g = Graph.build("g", [Tensor("a", (256, 256), DType.FP16, Role.INPUT),
                          Tensor("b", (256, 256), DType.FP16, Role.PARAMETER)], [MatMul("mm", ("a", "b"), "c")])
    shape = GemmShape.of(g, g.ops[0], target)
    got = int(gemm_floor(shape, target, [[1, 4, 4, 4]], [0])[0])
    call = MatMulCall(64, 64, 64, DType.FP16, DType.FP16, "interleaved", "panels", 0, shape.grain)
    amp = dispatch(call, target).cycles(call, target)
    # A and B each needed on 4 tiles, held once: 3 * 128 KiB of each received. At most one of a
    # tile's two operands pairs: each tile's smaller block (64 x 60 K elements, K less one AMP load)
    # counts twice, less what the tiles hold (the whole of A and B).
    received = 3 * 131072 * 2 + (64 * (64 * 60 * 2) - 2 * 131072)
    prep = received // (8 * 64)
    # Reduction: 3 of 4 partials of each of 65,536 outputs leave their tile over 64 lanes of 4 B/cycle,
    # and some tile reduces 1,024 outputs of 4 addends.
    red_exchange = 3 * 65536 * 2 // (4 * 64)
    red = dispatch(ReduceCall(n=1024, parts=4, in_dtype=DType.FP16, out_dtype=DType.FP16), target).cycles(
        ReduceCall(n=1024, parts=4, in_dtype=DType.FP16, out_dtype=DType.FP16), target)
    assert got == amp + prep + red_exchange + red + 2 * target.sync_cycles


def test_the_floor_of_a_grid_falls_with_what_a_replicated_operand_already_holds():
    target = load_target("ipu21-64")
    g = Graph.build("g", [Tensor("a", (256, 256), DType.FP16, Role.INPUT),
                          Tensor("b", (256, 256), DType.FP16, Role.PARAMETER)], [MatMul("mm", ("a", "b"), "c")])
    shape = GemmShape.of(g, g.ops[0], target)
    grid = np.array([[1, 8, 8, 1], [1, 4, 4, 4]])
    once = gemm_floor(shape, target, grid, [0, 0])
    everywhere = gemm_floor(shape, target, grid, [0, 0], held=(target.tiles, target.tiles))
    assert (everywhere < once).all()


def test_the_floor_of_an_encoder_layer_bounds_its_plan():
    """The floor reads the graph as the planner does (a key transposed for q k^T through its Transpose)."""
    from tileplan.graph.loaders import load_model
    from tileplan.planner.quality import model_floor
    from tileplan.target import load_target
    graph = load_model(FIXTURES / "encoder_layer_small.toml")
    target = load_target(graph.target)
    floor = model_floor(graph, target)
    assert 0 < floor["cycles"] <= plan(graph, target).estimate.cycles
    assert any(name.endswith(".transpose_b") for name in floor["ops"])


def test_a_towers_model_floor_costs_each_distinct_op_once_and_equals_the_floor_op_by_op(monkeypatch):
    """The 4-layer tower's layers are one problem: its GEMM floors are computed for one layer only,
    and each op's share equals what computing it afresh gives."""
    from tileplan.planner import quality
    graph = load_model(FIXTURES / "encoder_tower_small.toml")
    target = load_target("ipu21-64")
    monkeypatch.setattr(quality, "_FLOOR_MEMO", {})
    calls = []
    real = quality.FLOORS["Gemm"]
    monkeypatch.setitem(quality.FLOORS, "Gemm", lambda g, op, *a: calls.append(op.name) or real(g, op, *a))
    floor = model_floor(graph, target)
    gemms = [n for n in floor["ops"] if "grid" in floor["ops"][n]]
    assert len(gemms) == 4 * 8 and 0 < len(calls) <= 8          # q, k, v, q k^T, p v, o, fc1, fc2 per layer
    assert all(n.startswith("l0.") for n in calls)
    n = len(calls)
    assert model_floor(graph, target) == floor and len(calls) == n   # a second call computes nothing
    monkeypatch.setattr(quality, "_FLOOR_MEMO", {})
    monkeypatch.setattr(quality, "_FLOOR_MEMO_SIZE", 0)          # nothing remembered: every op afresh
    assert model_floor(graph, target) == floor


@pytest.mark.parametrize("fixture", SMALL)
def test_every_reported_floor_is_at_most_the_cycles_it_is_shown_beside(fixture):
    """What both reports print (``report.terminal.floor_groups`` over plan.json): each op's floor,
    or a GEMM's floor over its epilogue chain, is at most the chosen candidates' cycles of the same
    ops; an op a GEMM's floor covers names that GEMM, and the floors add up to the model floor."""
    from tileplan.planner.planjson import plan_to_json
    from tileplan.report.terminal import floor_cell, floor_groups, floor_notes
    _graph, _target, p = planned(fixture)
    doc = plan_to_json(p)
    groups = floor_groups(doc["ops"])
    assert set(groups) == {op["name"] for op in doc["ops"]}
    heads = {n: g for n, g in groups.items() if "in" not in g}
    for name, g in heads.items():
        assert g["floor"] <= g["cycles"], (fixture, g)
        assert g["ops"][0] == name
    for name, g in groups.items():
        if "in" in g:
            assert name in heads[g["in"]]["ops"] and floor_cell(groups, name) == f"in {g['in']}"
    assert sum(g["floor"] for g in heads.values()) == doc["model_floor"]["cycles"]
    chains = [g for g in heads.values() if len(g["ops"]) > 1]
    assert len(floor_notes(doc)) == len(chains)
    if fixture in ("mlp_smoke_fp8", "mlp_fp16_small"):
        # fc1's floor covers its bias-GeLU chain, which this plan does as a pass apart
        fc1 = heads["fc1"]
        assert len(fc1["ops"]) > 1 and fc1["floor"] > next(op for op in doc["ops"] if op["name"] == "fc1")["estimate"]["cycles"]
