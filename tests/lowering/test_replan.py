"""Selection counts bytes, the allocator places them: where first fit fragments a tile that
selection accepted, compile plans again within a budget derived from the failure and places that."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tileplan.graph.loaders import load_model
from tileplan.target import load_target

SMOKE = Path(__file__).resolve().parents[2] / "fixtures" / "mlp_smoke_fp8.toml"
# The smoke MLP on 64 tiles of 9,856 bytes (found by shrinking the tile): selection accepts a plan
# whose worst tile peaks at 9,184 bytes, and first fit leaves tile 20 a buffer of 288 bytes with
# gaps of 208 and 272 bytes (its peak there 9,152 bytes, 92.9% of the tile).
TIGHT = replace(load_target("ipu21-64"), name="ipu21-64-tight", reserve_bytes=0, standard_bytes=3280,
                interleaved_bytes=6576, sram_bytes=9856)


def test_a_plan_the_allocator_fragments_is_planned_again_within_the_derived_budget(tmp_path):
    from tileplan.lowering.allocate import Unplaced
    from tileplan.lowering.compile import compile_model, compile_plan
    from tileplan.planner.plan import plan
    from tileplan.sim.validate import validate_package
    from tileplan.lowering.package import load_package
    graph = load_model(SMOKE)
    first = plan(graph, TIGHT, jobs=1)
    assert first.estimate.total_memory <= TIGHT.usable_bytes and first.budget is None     # selection: it fits
    with pytest.raises(Unplaced) as info:
        compile_plan(first, TIGHT, tmp_path / "first")
    exc = info.value
    assert "the placement fragmented the free space" in str(exc) and exc.peak <= TIGHT.usable_bytes
    assert exc.short == 288 - 272 and exc.tile == 20
    assert not (tmp_path / "first").exists()
    p, _, path = compile_model(graph, TIGHT, tmp_path / "pkg", jobs=1)
    assert p.budget == exc.peak - exc.short            # the tile's peak less what the placement lacked
    assert p.estimate.total_memory <= p.budget < first.estimate.total_memory
    v = validate_package(load_package(path))
    assert v.passed and v.profile.cycles == p.estimate.cycles
    assert int(v.profile.memory_peak.max()) <= TIGHT.sram_bytes


def test_when_nothing_fits_the_tighter_budget_the_error_names_the_tile_and_selections_refusal(tmp_path):
    from tileplan.errors import TileplanError
    from tileplan.lowering.compile import compile_fitting
    from tileplan.planner.plan import plan
    graph = load_model(SMOKE)
    refused = []

    def replan(budget):
        refused.append(budget)
        return plan(graph, TIGHT, jobs=1, budget=1024)      # far below any plan's peak: nothing fits
    with pytest.raises(TileplanError) as info:
        compile_fitting(plan(graph, TIGHT, jobs=1), replan, TIGHT, tmp_path / "pkg")
    msg = str(info.value)
    assert refused == [9152 - 16]
    assert msg.startswith("tile 20: buffer 'b2' (288 bytes") and "fragmented" in msg
    assert "planned again within 9,136 bytes per tile" in msg and "nothing fits" in msg
    assert "\n" not in msg and not (tmp_path / "pkg").exists()
