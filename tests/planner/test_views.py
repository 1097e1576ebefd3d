"""The View and Transpose families: reshapes are free where the layout survives them, transposes
exchange rows (or column blocks) and rearrange on tile; every form validates on the IPU model and
its estimate is the simulated cycles."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tileplan.errors import TileplanError
from tileplan.graph.core import Cast, Graph, MatMul, Reshape, Role, Softmax, Tanh, Tensor, Transpose
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


def test_a_view_of_an_fp8_tensor_keeps_its_scale_and_a_key_read_transposed_validates(tmp_path):
    # Found by the fuzz test (seed 1): q q^T on an FP8 activation with scale -6 came out 2^6 too large,
    # because the Transpose the planner puts before the MatMul wrote a tensor of scale 0.
    x = Tensor("x", (3, 8, 27), DType.FP16, Role.INPUT)
    q = Tensor("q", (3, 8, 27), DType.FP8, scale=-6)
    graph = Graph.build("qqt", [x, q], [Softmax("p", ("x",), "s"), Cast("c", ("s",), "q"),
                                        MatMul("qk", ("q", "q"), "y", transpose_b=True)])
    _, v, estimate = _run(graph, tmp_path)
    assert v.outputs["y"]["passed"], v.outputs["y"]
    assert estimate == v.profile.cycles
    r = Graph.build("r", [Tensor("a", (4, 6), DType.FP8, Role.INPUT, scale=3)],
                    [Reshape("flat", ("a",), "b", shape=(24,)), Transpose("t", ("a",), "c", perm=(1, 0))])
    assert r.tensors["b"].scale == r.tensors["c"].scale == 3
    with pytest.raises(TileplanError, match=r"op 'flat' \(reshape\): output 'b' is declared with scale 1; it keeps"):
        Graph.build("r", [Tensor("a", (4, 6), DType.FP8, Role.INPUT, scale=3), Tensor("b", (24,), DType.FP8, scale=1)],
                    [Reshape("flat", ("a",), "b", shape=(24,))])


@pytest.mark.parametrize("dtype", [DType.FP16, DType.FP32, DType.FP8])
def test_a_cast_to_the_type_it_has_is_a_free_view(tmp_path, dtype):
    # Found by the fuzz test: a Cast changing neither type nor scale had no kernel (a NoVariantError traceback).
    x = Tensor("x", (5, 33), DType.FP16, Role.INPUT)
    ops = [Cast("to", ("x",), "a"), Cast("same", ("a",), "b"), Cast("back", ("b",), "y")]
    graph = Graph.build("c", [x, Tensor("a", (5, 33), dtype, scale=2 if dtype is DType.FP8 else 0),
                              Tensor("b", (5, 33), dtype, scale=2 if dtype is DType.FP8 else 0)], ops)
    p, v, estimate = _run(graph, tmp_path)
    assert p.candidates["same"][p.picks["same"]].estimate.cycles == 0
    assert v.outputs["y"]["passed"] and estimate == v.profile.cycles
