"""The small 4-layer tower (fixtures/encoder_tower_small.toml, 64 tiles) end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tileplan
from tileplan.graph.loaders import load_model
from tileplan.planner.cache import PlanCache

TOWER = Path(__file__).resolve().parents[1] / "fixtures" / "encoder_tower_small.toml"


@pytest.mark.slow
def test_the_small_tower_compiles_from_a_warm_cache_and_validates_on_the_ipu_model(tmp_path):
    from tileplan.lowering.compile import compile_model
    from tileplan.target import load_target
    g = load_model(TOWER)
    target = load_target(g.target)
    cache = PlanCache(tmp_path / "cache")
    p, _, pkg = compile_model(g, target, tmp_path / "cold", cache=cache)
    assert cache.misses > 0 and cache.hits == 0
    warm_cache = PlanCache(tmp_path / "cache")
    _, _, warm = compile_model(g, target, tmp_path / "warm", cache=warm_cache)
    assert warm_cache.misses == 0 and warm_cache.hits == cache.misses
    assert (warm / "manifest.json").read_bytes() == (pkg / "manifest.json").read_bytes()
    # Every layer's weights stay resident: the package's parameters are all four layers'.
    plan = json.loads((pkg / "plan.json").read_text())
    assert plan["totals"]["cycles"] == p.estimate.cycles
    # Four FP16 layers accumulate FP16 roundings in another order than the float64 reference rounds
    # each op's result: the outputs (|y| up to about 16) agree within two FP16 ulps at that size.
    v = tileplan.validate(pkg, atol=2 * 2.0 ** -6, rtol=0.01)
    out = v.outputs["l3.y"]
    assert v.passed, out
    assert out["cosine"] > 0.99999
    assert v.profile.cycles == p.estimate.cycles
