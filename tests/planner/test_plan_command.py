"""Planning fixtures end to end: plan.json, the `tileplan plan` command, solver agreement, no-fit errors."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tileplan.graph.loaders import load_model
from tileplan.planner.plan import plan
from tileplan.planner.planjson import dumps, plan_to_json, write_plan_json
from tileplan.target import load_target

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures"
SMOKE = FIXTURES / "mlp_smoke_fp8.toml"
IPU64 = load_target("ipu21-64")






def tiny_target(tmp_path: Path, sram: int) -> Path:
    path = tmp_path / "tiny.toml"
    half = sram // 2
    path.write_text('inherits = "ipu21-64"\nname = "tiny"\ndescription = "ipu21-64 with a tiny SRAM"\n'
                    f"sram_bytes = {sram}\nstandard_bytes = {half}\ninterleaved_bytes = {sram - half}\n"
                    "reserve_bytes = 1024\n")
    return path


@pytest.mark.parametrize("pool", ["POOL_MIN_WORK", "POOL_MIN_TILES"], ids=["choices-pooled", "catalogues-pooled"])
def test_planning_the_same_file_twice_gives_byte_identical_plan_json(tmp_path, monkeypatch, pool):
    from tileplan.planner import catalogue
    # The second run goes through the process pool: a GEMM's detailed choices split over the workers,
    # or whole GEMM catalogues one per worker.
    monkeypatch.setattr(catalogue, pool, 0)
    first = write_plan_json(plan(load_model(SMOKE), IPU64, jobs=1), tmp_path / "a.json").read_bytes()
    second = write_plan_json(plan(load_model(SMOKE), IPU64, jobs=2), tmp_path / "b.json").read_bytes()
    assert first == second
    data = json.loads(first)
    assert data["model"] == "mlp_smoke_fp8" and data["target"] == "ipu21-64"
    assert "plan_seconds" not in first.decode() and "time" not in data


def test_plan_json_holds_every_op_its_grid_the_conversions_totals_and_runner_ups():
    p = plan(load_model(SMOKE), IPU64, jobs=1)
    data = json.loads(dumps(plan_to_json(p)))
    assert [op["name"] for op in data["ops"]] == [op.name for op in p.graph.ops]
    fc1 = next(op for op in data["ops"] if op["name"] == "fc1")
    assert set(fc1["grid"]) == {"gb", "gm", "gn", "gk", "order", "reduction", "partials", "bias_in_reduction",
                                "epilogue"}
    assert set(fc1["layouts"]["inputs"]) == {"x8", "w1"}
    assert fc1["estimate"]["cycles"] == sum(fc1["estimate"][k] for k in ("compute", "exchange", "sync"))
    assert set(fc1["memory"]) == {"standard", "interleaved", "total"}
    for conv in data["conversions"]:
        assert {"tensor", "from", "to", "bytes", "cycles"} <= set(conv)
    assert data["totals"]["cycles"] == p.estimate.cycles
    assert data["ratio"] == pytest.approx(p.estimate.cycles / data["roofline_cycles"], rel=1e-6)
    floor = data["model_floor"]
    assert floor["cycles"] == sum(op["floor"] for op in data["ops"]) <= data["totals"]["cycles"]
    assert floor["plan_ratio"] == pytest.approx(data["totals"]["cycles"] / floor["cycles"], rel=1e-6)
    # A GEMM whose reducers may do its epilogue chain takes the chain ops' floor shares (they count
    # 0): its floor bounds the GEMM and that chain together.
    from tileplan.planner.epilogue import gemm_chain
    by_name = {op["name"]: op for op in data["ops"]}
    for op in (op for op in data["ops"] if op["grid"]):
        chain = gemm_chain(p.graph, p.graph.op(op["name"]))
        group = [op["name"]] + ([o.name for o in chain.ops] if chain is not None else [])
        assert op["floor"] <= sum(by_name[n]["estimate"]["cycles"] for n in group), op["name"]
    for op in ("fc1", "fc2"):
        losers = data["runner_ups"][op]
        assert losers and all(r["lost"] for r in losers)
        assert all(r["coarse"]["cycles"] > 0 for r in losers)


def test_tileplan_plan_prints_the_report_and_writes_plan_json(cli, tmp_path):
    out_path = tmp_path / "out" / "plan.json"
    code, out, err = cli("plan", str(SMOKE), "-o", str(out_path), "--jobs", "1")
    assert code == 0 and err == ""
    for text in ("fc1", "fc2", "runner-up", "roofline bound", "ratio", "plan time", "model floor"):
        assert text in out
    assert json.loads(out_path.read_text())["model"] == "mlp_smoke_fp8"
    assert [p.name for p in out_path.parent.iterdir()] == ["plan.json"]       # no temporary left behind


def test_tileplan_plan_runs_as_a_command(tmp_path):
    out_path = tmp_path / "plan.json"
    res = subprocess.run([sys.executable, "-m", "tileplan.cli", "plan", str(SMOKE), "-o", str(out_path),
                          "--solver", "cpsat"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads(out_path.read_text())["solver"] == "cpsat"


@pytest.mark.parametrize("fixture", ["mlp_smoke_fp8", "odd_prime_dims", "odd_fp8_tails", "odd_fp8_panels",
                                     "odd_3d_activation", "residual_block"])
def test_the_dp_and_cpsat_pick_plans_with_equal_cycles(fixture):
    graph = load_model(FIXTURES / f"{fixture}.toml")
    dp = plan(graph, IPU64, solver="dp", dp_paths=None)
    cp = plan(graph, IPU64, solver="cpsat")
    assert dp.selection.cycles == cp.selection.cycles
    assert cp.selection.exact


def test_when_the_selection_finds_nothing_that_fits_the_error_names_the_op_the_tile_and_the_bytes(cli, tmp_path):
    # 4,096 usable bytes: every GEMM has a grid (with serial K) that fits alone, no whole plan fits.
    target = tiny_target(tmp_path, 5_120)
    out_path = tmp_path / "plan.json"
    code, out, err = cli("plan", str(SMOKE), "--target", str(target), "-o", str(out_path), "--jobs", "1")
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "'fc1'" in lines[0] and re.search(r"tile \d+", lines[0]) and "bytes" in lines[0]
    assert "Traceback" not in err and not out_path.exists()


def test_when_no_grid_of_a_gemm_fits_the_error_names_the_op_the_tile_and_the_bytes(cli, tmp_path):
    target = tiny_target(tmp_path, 3_584)
    code, _, err = cli("plan", str(SMOKE), "--target", str(target), "--jobs", "1")
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "'fc1'" in lines[0] and "bytes" in lines[0]
    assert re.search(r"tile \d+", lines[0])
