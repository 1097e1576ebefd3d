"""The parameter storage option: ``--weights planner|compact`` (plan, compile), ``[plan] weights`` in a
TOML model, ``weights=`` in the Python API; recorded in plan.json, part of the plan-cache key, and a
bad value is one error line with exit status 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tileplan
from tileplan.errors import TileplanError
from tileplan.planner.cache import PlanCache
from tileplan.planner.planjson import plan_to_json

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
SMALL = FIXTURES / "mlp_fp16_small.toml"       # both of its weights are pre-arranged by the planner


def with_plan_table(tmp_path: Path, table: str) -> Path:
    path = tmp_path / "model.toml"
    path.write_text(SMALL.read_text() + f"\n[plan]\n{table}\n")
    return path


def test_the_planner_pre_arranges_weights_and_compact_keeps_every_weight_compact():
    own = plan_to_json(tileplan.plan(SMALL))
    compact = plan_to_json(tileplan.plan(SMALL, weights="compact"))
    assert own["weights"] == "planner" and {e["tensor"] for e in own["prearranged"]} == {"w1", "w2"}
    assert compact["weights"] == "compact" and "prearranged" not in compact
    assert all("pre-arranged" not in op["candidate"] for op in compact["ops"])
    for op in compact["ops"]:
        if op["kind"] == "matmul":
            assert op["layouts"]["inputs"][op["name"].replace("fc", "w")].startswith("Packed")
    # the floor of the compact space credits no held weight: it is not below the planner's floor
    assert compact["model_floor"]["cycles"] >= own["model_floor"]["cycles"]
    assert compact["model_floor"]["cycles"] <= compact["totals"]["cycles"]


def test_weights_on_the_command_line_is_recorded_in_plan_json_and_the_report(cli, tmp_path):
    code, out, err = cli("plan", SMALL, "--weights", "compact", "--jobs", "1", "-o", tmp_path / "plan.json")
    assert code == 0 and "weights: compact" in out
    doc = json.loads((tmp_path / "plan.json").read_text())
    assert doc["weights"] == "compact" and "prearranged" not in doc
    code, out, _ = cli("plan", SMALL, "--weights", "planner", "--jobs", "1", "--json", "--quiet")
    assert code == 0 and json.loads(out)["weights"] == "planner" and json.loads(out)["prearranged"]


def test_compile_with_compact_weights_writes_a_package_that_validates(cli, tmp_path):
    code, _, err = cli("compile", SMALL, "-o", tmp_path / "pkg", "--weights", "compact", "--jobs", "1", "--quiet")
    assert code == 0, err
    planned = json.loads((tmp_path / "pkg" / "plan.json").read_text())
    assert planned["weights"] == "compact" and "prearranged" not in planned
    v = tileplan.validate(tmp_path / "pkg")
    assert v.passed and v.profile.cycles == planned["totals"]["cycles"]
    code, out, err = cli("validate", tmp_path / "pkg", "--json")        # validate says how it was planned
    assert code == 0 and json.loads(out)["weights"] == "compact" and "weights: compact; none pre-arranged" in err


def test_a_plan_table_in_the_model_file_sets_the_storage_and_the_command_line_wins(cli, tmp_path):
    model = with_plan_table(tmp_path, 'weights = "compact"')
    assert tileplan.load_model(model).weights == "compact"
    assert plan_to_json(tileplan.plan(model))["weights"] == "compact"
    code, out, _ = cli("plan", model, "--json", "--quiet", "--jobs", "1")
    assert code == 0 and json.loads(out)["weights"] == "compact"
    code, out, _ = cli("plan", model, "--weights", "planner", "--json", "--quiet", "--jobs", "1")
    assert code == 0 and json.loads(out)["weights"] == "planner"
    # the same plan as the option gives for the unchanged model (only the model file's name differs)
    a = plan_to_json(tileplan.plan(model))
    b = plan_to_json(tileplan.plan(SMALL, weights="compact"))
    assert a["ops"] == b["ops"] and a["totals"] == b["totals"]


def test_a_bad_weights_value_is_one_error_line_with_status_2(cli, tmp_path):
    code, out, err = cli("plan", SMALL, "--weights", "grid", "-o", tmp_path / "plan.json")
    assert code == 2 and out == ""
    assert err.strip() == "error: --weights must be 'planner' or 'compact', got 'grid'"
    assert not (tmp_path / "plan.json").exists()
    code, _, err = cli("compile", SMALL, "-o", tmp_path / "pkg", "--weights", "Compact")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--weights" in err and not (tmp_path / "pkg").exists()
    bad = with_plan_table(tmp_path, 'weights = "panels"')
    code, _, err = cli("plan", bad)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert str(bad) in err and "[plan] weights must be 'planner' or 'compact', got 'panels'" in err
    unknown = with_plan_table(tmp_path, 'weight = "compact"')
    code, _, err = cli("plan", unknown)
    assert code == 2 and "[plan]: unknown key 'weight'" in err
    with pytest.raises(TileplanError, match="weights must be 'planner' or 'compact', got 'none'"):
        tileplan.plan(SMALL, weights="none")


def test_a_storage_grid_pin_with_compact_weights_is_an_error_naming_both(cli):
    code, _, err = cli("plan", SMALL, "--weights", "compact", "--pin", "fc1=grid:2x32x1,storage:grid")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "pin of 'fc1'" in err and "storage:grid" in err and 'weights = "compact"' in err


def test_plans_with_either_storage_keep_their_own_plan_cache_entries(tmp_path):
    from tileplan.planner.plan import plan
    from tileplan.target import load_target
    graph, target = tileplan.load_model(SMALL), load_target("ipu21-64")
    cache = PlanCache(tmp_path / "cache")
    own = plan_to_json(plan(graph, target, cache=cache))
    after_own = cache.info()["entries"]
    compact = plan_to_json(plan(graph, target, cache=cache, weights="compact"))
    assert cache.info()["entries"] == 2 * after_own > 0          # new entries, not the planner's
    assert plan_to_json(plan(graph, target, cache=cache)) == own            # warm: each reads its own
    assert plan_to_json(plan(graph, target, cache=cache, weights="compact")) == compact
    assert cache.info()["entries"] == 2 * after_own
    assert own["prearranged"] and "prearranged" not in compact
    assert plan_to_json(plan(graph, target, weights="compact")) == compact   # the same as with no cache
