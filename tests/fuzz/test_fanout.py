"""Wide graphs the selection must plan in time and memory polynomial in their width.

``dags.fanout(width)``: one tensor read by ``width`` pointwise ops (Add of a parameter, GeLU, Cast),
each result a graph output, on a 64-tile target. Every output stays live to the end of the
program; the selection DP keeps its layout in the state only while a later op reads it
(``select.solve_dp``), so these plan with one state per op.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys

import pytest

import tileplan
from tileplan.planner import select

from dags import fanout

GiB = 1 << 30


@pytest.mark.parametrize("width", [100, 500])
def test_a_tensor_read_by_hundreds_of_ops_each_an_output_plans(tmp_path, width):
    case = fanout(width)
    model, target = case.write(tmp_path)
    graph = tileplan.load_model(model, target)
    plan = tileplan.plan(graph, target)
    assert len(plan.selection.picks) == width
    outputs = json.loads(case.model.splitlines()[3].removeprefix("outputs = "))
    assert len(outputs) == width and set(outputs) == {f"y{k}" for k in range(width)}


def test_a_hundred_wide_fan_out_compiles_and_validates(tmp_path):
    case = fanout(100)
    model, target = case.write(tmp_path)
    graph = tileplan.load_model(model, target)
    pkg = tileplan.compile(graph, tmp_path / "pkg", target=target)
    v = tileplan.validate(pkg, write=False)
    assert set(v.outputs) == {f"y{k}" for k in range(100)}
    for name, figures in v.outputs.items():
        assert figures["passed"] and figures["nonfinite"] == 0, (name, figures)


def _limited():
    resource.setrlimit(resource.RLIMIT_AS, (2 * GiB, 2 * GiB))


def test_the_200_wide_fan_out_plans_under_a_2_gib_address_space_limit(tmp_path):
    model, target = fanout(200).write(tmp_path)
    out = tmp_path / "plan.json"
    run = subprocess.run([sys.executable, "-c", "from tileplan.cli import main; main()", "plan", str(model),
                          "--target", str(target), "--no-cache", "-j", "1", "-q", "-o", str(out)],
                         preexec_fn=_limited, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    doc = json.loads(out.read_text())
    assert doc and out.stat().st_size > 0


def test_a_graph_holding_more_values_later_read_than_the_dp_s_state_bound_falls_back_to_cp_sat(tmp_path,
                                                                                             monkeypatch):
    # The gathered fan-out holds up to 512 states at once; with a bound of 64 the DP stops and CP-SAT plans it.
    from tileplan.planner import cpsat
    model, target = fanout(16, gather=True).write(tmp_path)
    graph = tileplan.load_model(model, target)
    own = tileplan.plan(graph, target)
    calls = []
    real = cpsat.solve_cpsat

    def spy(problem, time_limit=30.0):
        calls.append(time_limit)
        return real(problem, time_limit)
    monkeypatch.setattr(cpsat, "solve_cpsat", spy)
    monkeypatch.setattr(select, "MAX_STATES", 64)
    fell_back = tileplan.plan(graph, target)
    assert len(calls) == 1
    assert fell_back.selection.cycles <= own.selection.cycles
