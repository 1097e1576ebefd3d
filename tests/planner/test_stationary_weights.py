"""Stationary weights: a GEMM whose grid reads each weight block on one tile stores the weights
there, and stops moving them; the package still validates, with the estimate equal to the IPU
model's cycles."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tileplan.estimate.detailed import scheduled
from tileplan.program import ExchangeStep
from tileplan.graph.loaders import load_model
from tileplan.layout.gemm_grid import Grid
from tileplan.lowering.compile import compile_model
from tileplan.lowering.package import load_package
from tileplan.planner.gemm import GemmChoice, GemmShape, stationary_b, tile_of
from tileplan.planner.plan import plan
from tileplan.planner.planjson import plan_to_json
from tileplan.planner.quality import model_floor
from tileplan.sim.validate import validate_package
from tileplan.target import load_target

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def decode():
    graph = load_model(FIXTURES / "decode_proj_fp16.toml")
    return graph, load_target(graph.target)


def test_the_weights_of_a_decode_projection_stay_where_the_grid_multiplies_them():
    graph, target = decode()
    moved, kept = plan(graph, target, stationary=False), plan(graph, target)
    st = kept.storage["w"]
    assert isinstance(st.layout, Grid) and st.private
    chosen = kept.candidates["proj"][kept.picks["proj"]]
    assert chosen.desc.endswith("w stored in the grid") and chosen.choice.gm == 1
    assert st.layout == stationary_b(GemmShape.of(graph, graph.ops[0], target), chosen.choice)
    # The preparation now moves only the activations (4 x 2048 FP16, to every column block).
    prep = [s for s in kept.detailed.steps if s.name == "proj.prep"]
    x_bytes = 4 * 2048 * 2
    assert prep and prep[0].bytes <= x_bytes * chosen.choice.gn
    assert kept.estimate.cycles < 0.6 * moved.estimate.cycles
    assert model_floor(graph, target)["cycles"] <= kept.estimate.cycles
    # The plan says where the weights live.
    entry = next(op for op in plan_to_json(kept)["ops"] if op["name"] == "proj")
    assert entry["layouts"]["inputs"]["w"] == str(st.layout)


def test_a_grid_with_weight_replicas_or_serial_k_keeps_the_resident_panels():
    graph = load_model(FIXTURES / "siglip_mlp_fp8_b4.toml")
    target = load_target("ipu21")
    shape = GemmShape.of(graph, graph.op("mlp_up"), target)
    assert stationary_b(shape, GemmChoice(1, 8, 46, 4, "bilj", "rows")) is None          # 8 row blocks
    assert stationary_b(shape, GemmChoice(1, 1, 92, 16, "bilj", "rows", sk=2)) is None   # serial K
    grid = stationary_b(shape, GemmChoice(1, 1, 92, 16, "bilj", "rows"))
    # One replica per block, held by the tile of its (j, l) cell.
    T = tile_of(GemmChoice(1, 1, 92, 16, "bilj", "rows"))
    assert grid.replicas == 1
    assert np.array_equal(grid.holder_array()[:, :, 0], T[0, 0].T)


def test_the_decode_package_validates_with_the_estimate_equal_to_the_simulation(tmp_path):
    graph, target = decode()
    p, _, path = compile_model(graph, target, tmp_path / "pkg", jobs=1)
    assert isinstance(p.storage["w"].layout, Grid)
    v = validate_package(load_package(path))
    assert v.passed
    assert v.profile.cycles == p.estimate.cycles
    # The weights and the grid's B buffer are one allocation: the estimate's memory peak is the run's.
    assert p.estimate.total_memory == int(v.profile.memory_peak.max())
    # The copy of the weights into the grid moves nothing: lowering drops it (the grid's B buffer
    # is the weights' own), and no exchange reads them.
    copies = [c for s in p.mid.program.steps if isinstance(s, ExchangeStep) for c in s.copies if c.src == "w"]
    assert copies
    assert not any(c.src == "w" for s in scheduled(p.mid.program, target.tiles).steps
                   if isinstance(s, ExchangeStep) for c in s.copies)
