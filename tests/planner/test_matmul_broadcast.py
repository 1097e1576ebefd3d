"""MatMul with numpy batch broadcasting of both operands (ONNX MatMul, torch.matmul): the
canonical rewrite folds the axes one operand lacks into the other's rows or columns, so the Gemm
family plans one batched product; the result validates against numpy and the estimate is the
simulated cycles."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tileplan.errors import TileplanError
from tileplan.graph.core import Graph, MatMul, Role, Tensor
from tileplan.graph.dtypes import DType
from tileplan.lowering.compile import compile_model
from tileplan.lowering.package import load_package
from tileplan.planner.plan import plan
from tileplan.planner.rewrite import canonical
from tileplan.sim.validate import validate_package
from tileplan.target import load_target

TARGET = load_target("ipu21-64")
SHAPES = [
    ((3, 1, 3, 4), (1, 2, 4, 2)),          # ONNX's test_matmul_bcast: only-A and only-B axes
    ((2, 3, 5, 4), (3, 4, 6)),             # a shared axis after an only-A axis
    ((2, 1, 5, 4), (2, 3, 4, 6)),          # shared then only-B
    ((1, 3, 1, 5, 4), (2, 1, 4, 4, 6)),    # interleaved, with unit axes on both sides
]


def _graph(sa, sb, dtype=DType.FP32):
    tensors = [Tensor("a", sa, dtype, Role.INPUT), Tensor("b", sb, dtype, Role.INPUT)]
    return Graph.build("bcast", tensors, [MatMul("mm", ("a", "b"), "c")])


@pytest.mark.parametrize("sa, sb", SHAPES)
def test_the_rewritten_chain_computes_numpy_matmul(sa, sb):
    graph = canonical(_graph(sa, sb))
    rng = np.random.default_rng(1)
    values = {"a": rng.standard_normal(sa), "b": rng.standard_normal(sb)}
    for op in graph.ops:
        values[op.output] = op.reference(*(values[i] for i in op.inputs))
    np.testing.assert_allclose(values["c"], np.matmul(values["a"], values["b"]), rtol=1e-12)
    assert graph.tensors["c"].shape == np.broadcast_shapes(sa[:-2], sb[:-2]) + (sa[-2], sb[-1])
    assert [op.name for op in graph.ops if isinstance(op, MatMul)] == ["mm"]   # pins still name it


@pytest.mark.parametrize("sa, sb", SHAPES[:2])
def test_a_broadcast_matmul_validates_and_its_estimate_is_the_simulated_cycles(tmp_path, sa, sb):
    _, _, path = compile_model(_graph(sa, sb, DType.FP16), TARGET, tmp_path / "pkg", jobs=1)
    pkg = load_package(path)
    v = validate_package(pkg)
    assert v.outputs["c"]["passed"], v.outputs["c"]
    assert json.loads((pkg.path / "report.json").read_text())["estimate"]["cycles"] == v.profile.cycles


def test_a_parameter_that_would_need_rearranging_is_refused_naming_the_op_and_tensor():
    tensors = [Tensor("a", (3, 2, 5, 4), DType.FP16, Role.INPUT), Tensor("w", (1, 2, 4, 6), DType.FP16,
                                                                           Role.PARAMETER)]
    graph = Graph.build("bcast", tensors, [MatMul("mm", ("a", "w"), "c")])
    with pytest.raises(TileplanError, match=r"op 'mm' \(matmul\).*parameter 'w'"):
        plan(graph, TARGET)


def test_ops_computing_the_same_thing_are_planned_once_and_the_graph_still_validates(tmp_path):
    """Two casts of one tensor to FP8 (as the fixtures cast a LayerNorm output for Q and K): one
    cast is planned, both GEMMs read it; a graph output is never merged away."""
    from tileplan.graph.core import Cast
    tensors = [Tensor("x", (24, 32), DType.FP16, Role.INPUT),
               Tensor("x8a", (24, 32), DType.FP8), Tensor("x8b", (24, 32), DType.FP8),
               Tensor("wa", (32, 16), DType.FP8, Role.PARAMETER), Tensor("wb", (32, 16), DType.FP8, Role.PARAMETER)]
    ops = [Cast("ca", ("x",), "x8a"), Cast("cb", ("x",), "x8b"),
           MatMul("ma", ("x8a", "wa"), "ya"), MatMul("mb", ("x8b", "wb"), "yb")]
    graph = canonical(Graph.build("cse", tensors, ops))
    assert [op.name for op in graph.ops] == ["ca", "ma", "mb"] and graph.op("mb").inputs == ("x8a", "wb")
    assert "x8b" not in graph.tensors
    kept = canonical(Graph.build("cse", tensors, ops, outputs=["x8a", "x8b", "ya", "yb"]))
    assert [op.name for op in kept.ops] == ["ca", "cb", "ma", "mb"]
    _, _, path = compile_model(Graph.build("cse", tensors, ops), TARGET, tmp_path / "pkg", jobs=1)
    v = validate_package(load_package(path))
    assert v.passed and set(v.outputs) == {"ya", "yb"}
