"""The View and Transpose families: reshapes are free where the layout survives them, transposes
exchange rows (or column blocks) and rearrange on tile; every form validates on the IPU model and
its estimate is the simulated cycles."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tileplan.errors import TileplanError
from tileplan.graph.core import Graph, Reshape, Role, Tanh, Tensor, Transpose
from tileplan.graph.dtypes import DType
from tileplan.lowering.compile import compile_model
from tileplan.lowering.package import load_package
from tileplan.planner.plan import plan
from tileplan.sim.validate import validate_package
from tileplan.target import load_target

TARGET = load_target("ipu21-64")


def _run(graph, tmp_path):
    p, _, path = compile_model(graph, TARGET, tmp_path / "pkg", jobs=1)
    pkg = load_package(path)
    v = validate_package(pkg)
    estimate = json.loads((pkg.path / "report.json").read_text())["estimate"]["cycles"]
    return p, v, estimate


@pytest.mark.parametrize("shape, perm", [
    ((2, 20, 6, 16), (0, 2, 1, 3)),        # attention's head split [B, T, H, D] -> [B, H, T, D]
    ((2, 6, 20, 16), (0, 2, 1, 3)),        # and the merge back
    ((3, 7, 5), (1, 0, 2)),                # odd sizes, rows of 5
    ((2, 6, 20, 16), (0, 1, 3, 2)),        # K^T for Q K^T: the last two axes
    ((7, 5), (1, 0)),                      # a plain matrix transpose, odd sizes
    ((3, 130, 9), (0, 2, 1)),              # more rows than tiles
])
@pytest.mark.parametrize("dtype", [DType.FP16, DType.FP32])
def test_a_transpose_validates_and_its_estimate_is_the_simulated_cycles(tmp_path, shape, perm, dtype):
    x = Tensor("x", shape, dtype, Role.INPUT)
    graph = Graph.build("t", [x], [Transpose("tr", ("x",), "xt", perm=perm), Tanh("act", ("xt",), "y")])
    _, v, estimate = _run(graph, tmp_path)
    assert v.outputs["y"]["passed"] and v.outputs["y"]["max_abs"] == 0.0, v.outputs["y"]
    assert estimate == v.profile.cycles


def test_a_reshape_whose_layout_survives_moves_nothing(tmp_path):
    # [4, 24, 40] -> [96, 40]: the same rows; the view costs nothing.
    x = Tensor("x", (4, 24, 40), DType.FP16, Role.INPUT)
    graph = Graph.build("r", [x], [Tanh("a", ("x",), "h"), Reshape("flat", ("h",), "hf", shape=(96, 40)),
                                   Tanh("b", ("hf",), "y")])
    p, v, estimate = _run(graph, tmp_path)
    view = p.candidates["flat"][p.picks["flat"]]
    assert view.estimate.cycles == 0
    assert v.outputs["y"]["passed"] and estimate == v.profile.cycles


def test_a_reshape_that_regroups_rows_validates(tmp_path):
    x = Tensor("x", (6, 35), DType.FP32, Role.INPUT)
    graph = Graph.build("r", [x], [Tanh("a", ("x",), "h"), Reshape("regroup", ("h",), "hr", shape=(5, 7, 6)),
                                   Tanh("b", ("hr",), "y")])
    _, v, estimate = _run(graph, tmp_path)
    assert v.outputs["y"]["passed"] and estimate == v.profile.cycles


def test_a_transpose_moving_the_last_axis_with_others_is_refused_naming_the_op():
    x = Tensor("x", (2, 3, 4), DType.FP16, Role.INPUT)
    graph = Graph.build("t", [x], [Transpose("rot", ("x",), "y", perm=(2, 0, 1))])
    with pytest.raises(TileplanError, match=r"op 'rot' \(transpose\): perm \[2, 0, 1\] moves the last axis"):
        plan(graph, TARGET)


def test_graph_level_checks_name_the_op():
    x = Tensor("x", (2, 3, 4), DType.FP16, Role.INPUT)
    with pytest.raises(TileplanError, match=r"op 'r' \(reshape\): cannot reshape 'x' \[2, 3, 4\]"):
        Graph.build("t", [x], [Reshape("r", ("x",), "y", shape=(5, 5))])
    with pytest.raises(TileplanError, match=r"op 't' \(transpose\): perm \[0, 0, 1\] is not a permutation"):
        Graph.build("t", [x], [Transpose("t", ("x",), "y", perm=(0, 0, 1))])
    assert np.array_equal(Transpose("t", ("x",), "y", perm=(1, 0)).reference(np.eye(2)[:, :1]), [[1.0, 0.0]])
