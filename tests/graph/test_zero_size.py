"""Zero-size tensors and results known at plan time (``planner.rewrite``, folding).

A zero-size tensor occupies no tile memory and moves no bytes; an op whose result is zero-size, or a
reduction over an empty axis (ReduceSum's empty set is 0, ReduceMax's -inf), is folded at plan time
into a graph output the package carries as host data, with zero cycles. What a user checks: the
package compiles, its plan lists the folded outputs, validate reads them with the right values (and
fails against wrong ones), report and the host program work on it, and bad shapes stay errors.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tileplan.errors import TileplanError
from tileplan.graph.core import Graph, ReduceMax, ReduceSum, Reshape, Role, Sigmoid, Tensor, Transpose
from tileplan.graph.dtypes import DType
from tileplan.lowering.compile import compile_model
from tileplan.lowering.package import load_package
from tileplan.sim.validate import validate_package
from tileplan.target import load_target

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "poplar"))
from harness import GXX, syntax_check  # noqa: E402

F32 = DType.FP32


def mixed_graph() -> Graph:
    """``y = sigmoid(x)`` on the device, beside a branch of zero-size tensors: ``z`` [2, 0, 4] viewed
    as ``zr`` [8, 0] (an intermediate no output reads), reduced to ``c`` (sum: zeros) and ``m`` (max:
    -inf), and transposed to the zero-size output ``zt``."""
    tensors = [Tensor("x", (4, 8), F32, Role.INPUT), Tensor("z", (2, 0, 4), F32, Role.INPUT)]
    ops = [Sigmoid("sig", ("x",), "y"),
           Reshape("flat", ("z",), "zr", shape=(8, 0)),
           ReduceSum("rsum", ("zr",), "c"),
           ReduceMax("rmax", ("zr",), "m"),
           Transpose("tz", ("z",), "zt", perm=(2, 1, 0))]
    return Graph.build("zero_size_branch", tensors, ops)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    target = load_target("ipu21-64")
    p, state, path = compile_model(mixed_graph(), target, tmp_path_factory.mktemp("zs") / "pkg", jobs=1)
    return p, state, load_package(path)


def test_a_zero_size_branch_is_folded_at_plan_time_and_only_the_rest_runs_on_tiles(compiled):
    p, state, pkg = compiled
    assert p.graph.folded == {"c": 0.0, "m": -math.inf, "zt": 0.0}
    assert [op.name for op in p.graph.ops] == ["sig"]
    assert "zr" not in p.graph.tensors                  # the zero-size intermediate is gone
    held = {b.tensor for b in state.tile_program.buffers}
    assert not held & {"z", "zr", "c", "m", "zt"}      # nothing of the branch occupies tile memory
    plan = json.loads((pkg.path / "plan.json").read_text())
    assert plan["folded"] == [
        {"tensor": "c", "shape": [8, 1], "dtype": "fp32", "value": "0.0"},
        {"tensor": "m", "shape": [8, 1], "dtype": "fp32", "value": "-inf"},
        {"tensor": "zt", "shape": [4, 0, 2], "dtype": "fp32", "value": "0.0"}]
    assert [o["name"] for o in plan["ops"]] == ["sig"]


def test_validate_reads_the_folded_outputs_with_the_values_onnx_gives_an_empty_set(compiled):
    _, _, pkg = compiled
    v = validate_package(pkg)
    assert v.passed
    assert np.array_equal(v.values["c"], np.zeros((8, 1)))
    assert np.array_equal(v.values["m"], np.full((8, 1), -np.inf))
    assert v.values["zt"].shape == (4, 0, 2)
    assert np.allclose(v.values["y"], 1 / (1 + np.exp(-_x(pkg))), atol=1e-6)


def _x(pkg):
    from tileplan.sim.reference import seeded_values
    return seeded_values(pkg.graph)["x"].astype(np.float64)


def test_validate_fails_when_the_expected_empty_set_maximum_is_not_minus_infinity(compiled, tmp_path):
    _, _, pkg = compiled
    x = _x(pkg)
    np.savez(tmp_path / "in.npz", x=x, z=np.zeros((2, 0, 4)))
    good = {"y": 1 / (1 + np.exp(-x)), "c": np.zeros((8, 1)), "m": np.full((8, 1), -np.inf), "zt": np.zeros((4, 0, 2))}
    np.savez(tmp_path / "good.npz", **good)
    np.savez(tmp_path / "bad.npz", **{**good, "m": np.zeros((8, 1))})
    assert validate_package(pkg, inputs_path=tmp_path / "in.npz", expected_path=tmp_path / "good.npz").passed
    bad = validate_package(pkg, inputs_path=tmp_path / "in.npz", expected_path=tmp_path / "bad.npz")
    assert not bad.outputs["m"]["passed"] and bad.outputs["c"]["passed"]


def test_the_same_graph_compiles_to_byte_identical_packages(compiled, tmp_path):
    _, _, pkg = compiled
    _, _, again = compile_model(mixed_graph(), load_target("ipu21-64"), tmp_path / "again", jobs=1)
    files = sorted(f.relative_to(pkg.path) for f in pkg.path.rglob("*") if f.is_file() and f.name != "validation.json"
                   and not f.name.startswith("validation"))
    assert files == sorted(f.relative_to(again) for f in again.rglob("*") if f.is_file())
    for f in files:
        assert (pkg.path / f).read_bytes() == (again / f).read_bytes(), f


# ---- a graph that folds entirely: the ONNX file, through the CLI --------------------------------

def folded_onnx(path):
    from onnx import TensorProto, helper, numpy_helper
    nodes = [helper.make_node("ReduceMax", ["data", "axes"], ["reduced"], name="rmax", keepdims=1),
             helper.make_node("Reshape", ["data", "shape"], ["reshaped"], name="view", allowzero=1)]
    graph = helper.make_graph(
        nodes, "empty_set", [helper.make_tensor_value_info("data", TensorProto.FLOAT16, [2, 0, 4])],
        [helper.make_tensor_value_info("reduced", TensorProto.FLOAT16, [2, 1, 4]),
         helper.make_tensor_value_info("reshaped", TensorProto.FLOAT16, [4, 0])],
        initializer=[numpy_helper.from_array(np.array([1], np.int64), "axes"),
                     numpy_helper.from_array(np.array([4, 0], np.int64), "shape")])
    import onnx
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), str(path))
    return path


def test_a_graph_that_folds_entirely_compiles_validates_and_reports_with_an_empty_program(cli, tmp_path):
    model = folded_onnx(tmp_path / "empty_set.onnx")
    code, out, err = cli("compile", model, "--target", "ipu21-64", "-o", tmp_path / "pkg", "-j", "1")
    assert code == 0, err
    assert "0 steps" in out and "roofline bound none (no MatMul)" in out
    assert "folded at plan time (host data, 0 cycles): reduced = -inf, reshaped = 0.0" in out
    code, out, err = cli("validate", tmp_path / "pkg")
    assert code == 0, err
    assert "validation passed" in out and "simulated: 0 cycles" in out
    code, out, err = cli("report", tmp_path / "pkg")
    assert code == 0, err
    assert "folded at plan time: reduced: fp16[2x1x4] = -inf (host data, no tile memory, 0 cycles)" in out
    html = (tmp_path / "pkg" / "report.html").read_text()
    assert "<tr><td>reduced</td><td>2x1x4</td><td>fp16</td><td>-inf</td></tr>" in html


def test_the_host_program_of_a_folded_package_compiles_and_writes_the_folded_outputs(cli, tmp_path):
    model = folded_onnx(tmp_path / "empty_set.onnx")
    assert cli("compile", model, "--target", "ipu21-64", "-o", tmp_path / "pkg", "-j", "1")[0] == 0
    pkg = tmp_path / "pkg"
    syntax_check(pkg / "host.cpp")                      # against the stand-in Poplar headers
    build = subprocess.run([GXX, "-std=c++17", "-O1", "-Wall", "-DTILEPLAN_DUMP_TABLES", "host.cpp", "-lz", "-o",
                            str(tmp_path / "dump")], cwd=pkg, capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    (tmp_path / "data").mkdir()
    run = subprocess.run([str(tmp_path / "dump"), "host/tables.bin", str(tmp_path / "data")], cwd=pkg,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "folded 2" in run.stdout
    files = sorted(p.name for p in (tmp_path / "data").iterdir())   # data files: t<row>_<name>.bin
    assert len(files) == 2 and files[0].endswith("_reduced.bin") and files[1].endswith("_reshaped.bin")
    reduced = np.frombuffer((tmp_path / "data" / files[0]).read_bytes(), np.float16)
    assert reduced.shape == (8,) and np.all(reduced == -np.inf)
    assert (tmp_path / "data" / files[1]).read_bytes() == b""


# ---- what stays an error ------------------------------------------------------------------------

def test_a_negative_dimension_is_an_error_naming_the_tensor():
    with pytest.raises(TileplanError, match=r"tensor 'x': shape \[2, -1\] has a negative dimension"):
        Tensor("x", (2, -1), F32, Role.INPUT)


def test_a_negative_dimension_in_an_onnx_input_is_a_one_line_error(tmp_path):
    from onnx import TensorProto, helper
    import onnx
    from tileplan.graph.onnx import import_onnx
    g = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["y"], name="sig")], "neg",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    m.graph.input[0].type.tensor_type.shape.dim[1].dim_value = -3
    onnx.save(m, str(tmp_path / "neg.onnx"))
    with pytest.raises(TileplanError) as info:
        import_onnx(tmp_path / "neg.onnx")
    assert "'x'" in str(info.value) and "negative dimension" in str(info.value) and "\n" not in str(info.value)


def test_a_reshape_to_a_negative_size_is_an_error_naming_the_op():
    with pytest.raises(TileplanError, match=r"op 'r' \(reshape\): shape must be a non-empty list of non-negative"):
        Reshape("r", ("x",), "y", shape=(4, -2))


def test_a_device_op_reading_a_folded_constant_is_refused_naming_it():
    from tileplan.graph.core import Add
    from tileplan.planner.rewrite import canonical
    g = Graph.build("reads_folded", [Tensor("x", (8, 1), F32, Role.INPUT), Tensor("z", (8, 0), F32, Role.INPUT)],
                    [ReduceSum("rsum", ("z",), "c"), Add("add", ("x", "c"), "y")])
    with pytest.raises(TileplanError, match=r"op 'add' \(add\): reads 'c', which is folded at plan time"):
        canonical(g)


def test_an_input_only_folded_ops_read_stays_declared_and_validates_unread(tmp_path):
    """``y = z + b`` with ``z`` zero-size folds away; ``b`` stays an input of the package (a user's
    inputs do not change with what folding removed), nothing on the device holds or reads it, and
    validate takes it like any input."""
    from tileplan.graph.core import Add
    g = Graph.build("unread", [Tensor("b", (1, 4), F32, Role.INPUT), Tensor("z", (0, 4), F32, Role.INPUT)],
                    [Add("add", ("z", "b"), "y")])
    p, state, path = compile_model(g, load_target("ipu21-64"), tmp_path / "pkg", jobs=1)
    assert p.graph.folded == {"y": 0.0} and not p.graph.ops
    assert p.graph.tensors["b"].role is Role.INPUT and not p.graph.consumers["b"]
    assert "b" not in {b.tensor for b in state.tile_program.buffers}
    assert json.loads((path / "model.json").read_text())["unread"] == ["b"]
    pkg = load_package(path)
    assert pkg.graph.tensors["b"].role is Role.INPUT
    assert validate_package(pkg).passed


def test_the_reductions_of_an_empty_set_are_onnx_s():
    empty = np.zeros((3, 0))
    assert np.array_equal(ReduceSum("s", ("x",), "y").reference(empty), np.zeros((3, 1)))
    assert np.array_equal(ReduceMax("m", ("x",), "y").reference(empty), np.full((3, 1), -np.inf))
