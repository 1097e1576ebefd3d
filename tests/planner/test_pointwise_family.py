"""The Pointwise family end to end: every unary and binary op, every broadcast form, FP16 and FP32,
planned, lowered, run on the IPU model and compared with the float64 reference; the detailed
estimate equals the simulated cycles. A graph without a MatMul compiles, validates and reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tileplan.graph.core import OP_KINDS, Binary, Graph, Role, Tensor, Unary
from tileplan.graph.dtypes import DType
from tileplan.kernels.pointwise import BINARY, UNARY
from tileplan.lowering.compile import compile_model
from tileplan.lowering.package import load_package
from tileplan.sim.validate import validate_package
from tileplan.target import load_target

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
TARGET = load_target("ipu21-64")
UNARY_KINDS = sorted(k for k, c in OP_KINDS.items() if issubclass(c, Unary) and k != "gelu")
BINARY_KINDS = sorted(k for k, c in OP_KINDS.items() if issubclass(c, Binary))


def _run(graph: Graph, tmp_path):
    _, _, path = compile_model(graph, TARGET, tmp_path / "pkg", jobs=1)
    pkg = load_package(path)
    v = validate_package(pkg)
    estimate = json.loads((pkg.path / "report.json").read_text())["estimate"]["cycles"]
    return v, estimate


def test_every_graph_op_kind_has_a_kernel_row():
    assert set(UNARY_KINDS) == set(UNARY)
    assert set(BINARY_KINDS) == set(BINARY)


@pytest.mark.parametrize("dtype", [DType.FP16, DType.FP32])
@pytest.mark.parametrize("kind", UNARY_KINDS)
def test_each_unary_op_validates_and_its_estimate_is_the_simulated_cycles(tmp_path, kind, dtype):
    x = Tensor("x", (3, 40, 56), dtype, Role.INPUT)
    ops = [OP_KINDS[kind](kind, ("x",), "y")]
    if kind in ("sqrt", "reciprocal"):          # on exp(x) > 0 (validation inputs are N(0, 0.5))
        ops = [OP_KINDS["exp"]("pos", ("x",), "ex"), OP_KINDS[kind](kind, ("ex",), "y")]
    graph = Graph.build(f"unary_{kind}", [x], ops)
    v, estimate = _run(graph, tmp_path)
    figures = v.outputs["y"]
    assert figures["passed"] and figures["nonfinite"] == 0, figures
    assert estimate == v.profile.cycles


# (shape of a, shape of b): dense, scalar, one-element, bias row, batch broadcast, column, each way round.
FORMS = [((4, 24, 40), (4, 24, 40)), ((4, 24, 40), (1,)), ((1,), (4, 24, 40)), ((4, 24, 40), (40,)),
         ((40,), (4, 24, 40)), ((4, 24, 40), (24, 40)), ((4, 24, 40), (4, 24, 1)), ((4, 24, 1), (4, 24, 40))]


@pytest.mark.parametrize("kind", BINARY_KINDS)
@pytest.mark.parametrize("a_shape, b_shape", FORMS)
def test_each_binary_op_broadcasts_as_numpy_does(tmp_path, kind, a_shape, b_shape):
    # The smaller operand is a parameter (resident, replicated) or, when both are full-size, a second input.
    big = a_shape if len(a_shape) >= len(b_shape) and a_shape[-1] != 1 else b_shape
    a_role = Role.INPUT if a_shape == big else Role.PARAMETER
    b_role = Role.INPUT if b_shape == big else Role.PARAMETER
    a = Tensor("a", a_shape, DType.FP16, a_role)
    b = Tensor("b", b_shape, DType.FP16, b_role)
    graph = Graph.build(f"binary_{kind}", [a, b], [OP_KINDS[kind](kind, ("a", "b"), "y")])
    v, estimate = _run(graph, tmp_path)
    figures = v.outputs["y"]
    assert figures["passed"], figures
    assert estimate == v.profile.cycles


@pytest.mark.parametrize("kind", ["add", "sub"])
@pytest.mark.parametrize("a_shape, b_shape", [((2, 3, 8, 16), (2, 1, 1, 16)), ((2, 1, 1, 16), (2, 3, 8, 16)),
                                              ((4, 24, 40), (4, 1, 40)), ((2, 1, 8, 16), (2, 3, 8, 16))])
def test_rows_per_leading_index_broadcast_in_place_without_a_rearrangement(tmp_path, kind, a_shape, b_shape):
    """An attention mask ``[B, 1, 1, T]`` added to scores ``[B, H, T, T]`` (an activation, read
    replicated): each leading index's block reads its own rows of the mask; no Transpose."""
    from tileplan.planner.plan import plan
    a = Tensor("a", a_shape, DType.FP16, Role.INPUT)
    b = Tensor("b", b_shape, DType.FP16, Role.INPUT)
    graph = Graph.build(f"batch_rows_{kind}", [a, b], [OP_KINDS[kind](kind, ("a", "b"), "y")])
    assert [op.kind for op in plan(graph, TARGET).graph.ops] == [kind]
    v, estimate = _run(graph, tmp_path)
    assert v.outputs["y"]["passed"], v.outputs["y"]
    assert estimate == v.profile.cycles


def test_a_broadcast_activation_is_gathered_onto_every_tile(tmp_path):
    # b is an activation (made by an op), broadcast as a row: selection converts it into the replicated layout.
    x = Tensor("x", (8, 64), DType.FP32, Role.INPUT)
    r = Tensor("r", (64,), DType.FP32, Role.INPUT)
    ops = [OP_KINDS["exp"]("e", ("r",), "er"), OP_KINDS["mul"]("m", ("x", "er"), "y")]
    v, estimate = _run(Graph.build("bcast_act", [x, r], ops), tmp_path)
    assert v.outputs["y"]["passed"] and estimate == v.profile.cycles


def test_broadcasts_of_both_operands_are_refused_naming_the_op_and_shapes():
    from tileplan.errors import TileplanError
    from tileplan.planner.plan import plan
    a = Tensor("a", (8, 1), DType.FP16, Role.INPUT)
    b = Tensor("b", (1, 16), DType.FP16, Role.INPUT)
    graph = Graph.build("outer", [a, b], [OP_KINDS["add"]("outer_add", ("a", "b"), "y")])
    with pytest.raises(TileplanError, match=r"op 'outer_add' \(add\): broadcasting 'a' \[8, 1\] with 'b' \[1, 16\]"):
        plan(graph, TARGET)


def test_a_graph_without_a_matmul_compiles_validates_and_reports(tmp_path, cli):
    # In-process (the ``cli`` fixture): four interpreters importing tileplan cost 6 CPU-s more, and
    # the installed command's start is checked in tests/test_cli_startup.py.
    pkg = tmp_path / "pkg"
    for args in (["compile", str(FIXTURES / "pointwise_mix.toml"), "-o", str(pkg)], ["validate", str(pkg)],
                 ["report", str(pkg)], ["show", str(FIXTURES / "pointwise_mix.toml")]):
        code, out, err = cli(*args)
        assert code == 0, err
        if args[0] != "validate":
            assert "none (no MatMul)" in out, out
    assert (pkg / "report.html").exists()
    assert json.loads((pkg / "plan.json").read_text())["ratio"] is None
