"""ONNX importer tables: the node rows, rewrites, constants, the GeLU pattern forms, bf16 and refusals."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tileplan.errors import TileplanError
from tileplan.graph.core import GeLU, Role
from tileplan.graph.dtypes import DType
from tileplan.graph.onnx import from_onnx, import_onnx
from tileplan.sim.reference import reference

from test_onnx import F16, F32, const, kinds, make_model  # noqa: E402 (tests/graph is on sys.path)

BF16 = TensorProto.BFLOAT16


def run(graph, params, **inputs):
    (out,) = graph.by_role(Role.OUTPUT)
    return reference(graph, {**params, **inputs})[out.name]


@pytest.mark.parametrize("op_type,fn", [
    ("Sub", np.subtract), ("Mul", np.multiply), ("Div", np.divide)])
def test_binary_rows_broadcast_a_row_and_compute_numpy_semantics(op_type, fn):
    row = np.linspace(1, 2, 8, dtype=np.float32)
    m = make_model([helper.make_node(op_type, ["x", "r"], ["y"], name="op")],
                   [("x", F32, [3, 8])], [("y", F32, [3, 8])], {"r": row})
    model = import_onnx(m)
    assert kinds(model.graph) == [op_type.lower()]
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    np.testing.assert_allclose(run(model.graph, model.params, x=x), fn(x, row), rtol=1e-6)


@pytest.mark.parametrize("op_type", ["Neg", "Sqrt", "Reciprocal", "Exp", "Tanh", "Erf", "Sigmoid"])
def test_unary_rows_import_as_their_op(op_type):
    m = make_model([helper.make_node(op_type, ["x"], ["y"], name="op")], [("x", F16, [2, 8])], [("y", F16, [2, 8])])
    g = from_onnx(m)
    assert kinds(g) == [op_type.lower()] and g.tensors["y"].dtype is DType.FP16


@pytest.mark.parametrize("attr,value,stored", [
    ("value_float", 2.5, np.array([2.5], np.float32)),
    ("value_floats", [1.0, 2.0, 3.0, 4.0], np.array([1, 2, 3, 4], np.float32)),
    ("value", numpy_helper.from_array(np.array(0.5, np.float16)), np.array([0.5], np.float16)),
])
def test_constant_nodes_of_every_float_kind_become_parameters(attr, value, stored):
    nodes = [helper.make_node("Constant", [], ["c"], name="c", **{attr: value}),
             helper.make_node("Mul", ["x", "c"], ["y"], name="scale")]
    dt = F16 if stored.dtype == np.float16 else F32
    model = import_onnx(make_model(nodes, [("x", dt, [2, 4])], [("y", dt, [2, 4])]))
    np.testing.assert_array_equal(model.params["c"], stored)
    assert model.graph.tensors["c"].role is Role.PARAMETER and model.graph.tensors["c"].shape == stored.shape


def test_integer_constant_read_as_a_tensor_is_refused_naming_it_and_its_type():
    nodes = [helper.make_node("Constant", [], ["c"], name="c", value_int=3),
             helper.make_node("Add", ["x", "c"], ["y"], name="add")]
    m = make_model(nodes, [("x", F32, [2, 4])], [("y", F32, [2, 4])])
    with pytest.raises(TileplanError, match=r"tensor 'c' \(initializer\) has element type int64; .*integer and bool"):
        from_onnx(m)


def test_arithmetic_on_an_integer_graph_input_is_refused_naming_the_op_and_the_tensor():
    """An integer graph input is an INT32 input (token ids, a mask): a Gather or a Cast reads it."""
    m = make_model([helper.make_node("Add", ["x", "x"], ["y"], name="add")],
                   [("x", TensorProto.INT32, [2, 4])], [("y", TensorProto.INT32, [2, 4])])
    with pytest.raises(TileplanError, match=r"op 'add' \(add\): add takes fp16 or fp32 operands, 'x' is int32 "
                                            r"\(cast first\)"):
        from_onnx(m)


def test_a_gather_by_a_double_input_is_refused_naming_the_indices():
    m = make_model([helper.make_node("Gather", ["t", "x"], ["y"], name="g")],
                   [("x", TensorProto.DOUBLE, [2, 4])], [("y", TensorProto.FLOAT, [2, 4, 3])])
    m.graph.initializer.append(numpy_helper.from_array(np.ones((5, 3), np.float32), "t"))
    with pytest.raises(TileplanError, match=r"node 'g' \(Gather\): indices 'x' are not a constant; .*by an integer "
                                            r"graph input"):
        from_onnx(m)


def test_castlike_casts_to_the_type_of_its_second_input():
    m = make_model([helper.make_node("CastLike", ["x", "like"], ["y"], name="cl")],
                   [("x", F32, [2, 8]), ("like", F16, [1])], [("y", F16, [2, 8])])
    g = from_onnx(m)
    assert kinds(g) == ["cast"] and g.tensors["y"].dtype is DType.FP16 and "like" not in g.tensors


def test_castlike_and_sqrt_of_constants_fold_into_a_constant():
    nodes = [const("two", 2.0), helper.make_node("CastLike", ["two", "x"], ["two_c"], name="cl"),
             helper.make_node("Sqrt", ["two_c"], ["s"], name="sqrt"),
             helper.make_node("Div", ["x", "s"], ["y"], name="div")]
    model = import_onnx(make_model(nodes, [("x", F16, [2, 8])], [("y", F16, [2, 8])]))
    assert kinds(model.graph) == ["div"]
    assert model.params["s"].dtype == np.float16 and model.params["s"][0] == np.float16(np.sqrt(2.0))


def test_sum_of_three_inputs_is_a_chain_of_adds():
    m = make_model([helper.make_node("Sum", ["a", "b", "c"], ["y"], name="sum")],
                   [("a", F32, [2, 4]), ("b", F32, [2, 4]), ("c", F32, [4])], [("y", F32, [2, 4])])
    g = from_onnx(m)
    assert [op.describe() for op in g.ops] == ["add sum.1(a, b) -> y.1", "add sum(y.1, c) -> y"]


def test_pow_two_and_three_become_muls_and_other_exponents_are_refused():
    for e, expect in ((2.0, ["mul"]), (3.0, ["mul", "mul"])):
        m = make_model([helper.make_node("Pow", ["x", "e"], ["y"], name="pow")], [("x", F32, [2, 4])],
                       [("y", F32, [2, 4])], {"e": np.array(e, np.float32)})
        assert kinds(from_onnx(m)) == expect
    m = make_model([helper.make_node("Pow", ["x", "e"], ["y"], name="pow")], [("x", F32, [2, 4])],
                   [("y", F32, [2, 4])], {"e": np.array(0.5, np.float32)})
    with pytest.raises(TileplanError, match=r"node 'pow' \(Pow\): exponent 0.5; tileplan imports Pow with a constant "
                                            r"exponent 2 or 3"):
        from_onnx(m)


def test_inference_dropout_is_its_input_and_training_mode_is_refused():
    nodes = [helper.make_node("Dropout", ["x", "r"], ["d"], name="drop"), helper.make_node("Neg", ["d"], ["y"])]
    m = make_model(nodes, [("x", F32, [2, 4])], [("y", F32, [2, 4])], {"r": np.array(0.1, np.float32)})
    g = from_onnx(m)
    assert [op.describe() for op in g.ops] == ["neg Neg_1(x) -> y"]
    nodes = [helper.make_node("Dropout", ["x", "r", "t"], ["d"], name="drop"), helper.make_node("Neg", ["d"], ["y"])]
    m = make_model(nodes, [("x", F32, [2, 4])], [("y", F32, [2, 4])],
                   {"r": np.array(0.1, np.float32), "t": np.array(True)})
    with pytest.raises(TileplanError, match=r"node 'drop' \(Dropout\): training_mode=1; tileplan compiles inference"):
        from_onnx(m)


def test_identity_from_a_graph_input_to_the_output_is_a_copy():
    g = from_onnx(make_model([helper.make_node("Identity", ["x"], ["y"], name="id")],
                             [("x", F32, [2, 4])], [("y", F32, [2, 4])]))
    assert [op.describe() for op in g.ops] == ["reshape id(x) -> y"]


def test_reshape_flatten_squeeze_unsqueeze_take_the_inferred_output_shape():
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["a"], name="r"),
             helper.make_node("Unsqueeze", ["a", "axes"], ["b"], name="u"),
             helper.make_node("Squeeze", ["b", "axes"], ["c"], name="s"),
             helper.make_node("Flatten", ["c"], ["y"], name="f", axis=1)]
    m = make_model(nodes, [("x", F32, [2, 3, 4])], [("y", F32, [6, 4])],
                   {"shape": np.array([6, -1], np.int64), "axes": np.array([0], np.int64)})
    g = from_onnx(m)
    assert [(op.kind, op.shape) for op in g.ops] == [("reshape", (6, 4)), ("reshape", (1, 6, 4)),
                                                      ("reshape", (6, 4)), ("reshape", (6, 4))]


def tanh_gelu_expanded(cube: str):
    """The opset-20 Gelu(tanh) function body as ONNX expands it, with x**3 as Pow or as x*x*x."""
    nodes = []
    for name, v in (("half", 0.5), ("one", 1.0), ("two_pi", 2 / np.pi), ("c0", 0.044715), ("three", 3.0)):
        nodes += [const(name, v), helper.make_node("CastLike", [name, "x"], [f"{name}_c"])]
    nodes.append(helper.make_node("Sqrt", ["two_pi_c"], ["k"]))
    if cube == "pow":
        nodes.append(helper.make_node("Pow", ["x", "three_c"], ["x3"]))
    else:
        nodes += [helper.make_node("Mul", ["x", "x"], ["x2"]), helper.make_node("Mul", ["x2", "x"], ["x3"])]
    nodes += [helper.make_node("Mul", ["c0_c", "x3"], ["cx3"]), helper.make_node("Sum", ["x", "cx3"], ["inner"]),
              helper.make_node("Mul", ["k", "inner"], ["t_in"]), helper.make_node("Tanh", ["t_in"], ["t"]),
              helper.make_node("Sum", ["one_c", "t"], ["phi"]), helper.make_node("Mul", ["half_c", "x"], ["hx"]),
              helper.make_node("Mul", ["hx", "phi"], ["y"], name="last")]
    return nodes


@pytest.mark.parametrize("cube", ["pow", "muls"])
def test_expanded_tanh_gelu_with_castlike_and_constant_nodes_folds_into_one_gelu(cube):
    m = make_model(tanh_gelu_expanded(cube), [("x", F16, [4, 8])], [("y", F16, [4, 8])], opset=18)
    model = import_onnx(m)
    assert model.graph.ops == [GeLU("last", ("x",), "y", approximate="tanh")] and model.params == {}


def test_bf16_model_is_refused_naming_the_cast_bf16_option():
    m = make_model([helper.make_node("Gelu", ["x"], ["y"], name="act")], [("x", BF16, [2, 8])], [("y", BF16, [2, 8])])
    with pytest.raises(TileplanError, match=r"tensor 'x' is BFLOAT16; .*--cast-bf16 fp16"):
        from_onnx(m)


def bf16_mlp(path):
    import ml_dtypes
    w = np.random.default_rng(0).standard_normal((16, 8)).astype(ml_dtypes.bfloat16)
    m = make_model([helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
                    helper.make_node("Gelu", ["h"], ["y"], name="act")],
                   [("x", BF16, [4, 16])], [("y", BF16, [4, 8])], {"w": w})
    onnx.save(m, str(path))
    return w


def test_cast_bf16_fp16_converts_the_model_and_its_initializers(tmp_path):
    w = bf16_mlp(tmp_path / "m.onnx")
    model = import_onnx(tmp_path / "m.onnx", cast_bf16="fp16")
    assert {t.dtype for t in model.graph.tensors.values()} == {DType.FP16}
    np.testing.assert_array_equal(model.params["w"], w.astype(np.float16))
    assert model.graph.imported == {"cast_bf16": "fp16", "converted_bf16_tensors": 4}


def test_cli_cast_bf16_compiles_and_plan_json_records_the_conversion(tmp_path, cli):
    bf16_mlp(tmp_path / "m.onnx")
    code, _, err = cli("compile", tmp_path / "m.onnx", "-t", "ipu21-64", "-o", tmp_path / "pkg")
    assert code == 2 and "--cast-bf16 fp16" in err and not (tmp_path / "pkg").exists()
    code, out, err = cli("compile", tmp_path / "m.onnx", "-t", "ipu21-64", "-o", tmp_path / "pkg",
                         "--cast-bf16", "fp16", "-j", "1")
    assert code == 0, err
    plan = json.loads((tmp_path / "pkg" / "plan.json").read_text())
    assert plan["imported"] == {"cast_bf16": "fp16", "converted_bf16_tensors": 4}
    code, out, err = cli("validate", tmp_path / "pkg")
    assert code == 0, out + err


def test_cli_cast_bf16_to_another_type_is_refused(tmp_path, cli):
    bf16_mlp(tmp_path / "m.onnx")
    code, _, err = cli("show", tmp_path / "m.onnx", "--cast-bf16", "fp8")
    assert code == 2 and "--cast-bf16 'fp8': bf16 models convert to fp16" in err


def test_dropout_whose_mask_is_read_is_refused_naming_the_mask():
    nodes = [helper.make_node("Dropout", ["x"], ["d", "mask"], name="drop"),
             helper.make_node("Neg", ["d"], ["y"], name="neg"),
             helper.make_node("Identity", ["mask"], ["m"], name="keep")]
    m = make_model(nodes, [("x", F32, [2, 4])], [("y", F32, [2, 4]), ("m", TensorProto.BOOL, [2, 4])])
    with pytest.raises(TileplanError, match=r"node 'drop' \(Dropout\): its mask output 'mask' is read"):
        from_onnx(m)


def test_a_string_constant_is_refused_naming_the_node():
    nodes = [helper.make_node("Constant", [], ["c"], name="c", value_string="hello"),
             helper.make_node("Neg", ["x"], ["y"], name="neg")]
    m = make_model(nodes, [("x", F32, [2, 4])], [("y", F32, [2, 4])])
    with pytest.raises(TileplanError, match=r"node 'c' \(Constant\): constant kind \['value_string'\] is not supported"):
        from_onnx(m)


def softmax_nodes():
    return [helper.make_node("ReduceMax", ["x", "axes"], ["m"], name="max"),
            helper.make_node("Sub", ["x", "m"], ["d"], name="sub"),
            helper.make_node("Exp", ["d"], ["e"], name="exp"),
            helper.make_node("ReduceSum", ["e", "axes"], ["s"], name="sum"),
            helper.make_node("Div", ["e", "s"], ["y"], name="div")]


def test_expanded_softmax_over_the_last_axis_folds_into_one_softmax():
    m = make_model(softmax_nodes(), [("x", F32, [4, 8])], [("y", F32, [4, 8])],
                   {"axes": np.array([-1], np.int64)}, opset=18)
    model = import_onnx(m)
    assert [op.describe() for op in model.graph.ops] == ["softmax div(x) -> y"] and model.params == {}


@pytest.mark.parametrize("axis", [0, 1])
def test_expanded_softmax_over_a_leading_axis_folds_into_one_softmax_over_that_axis(axis):
    m = make_model(softmax_nodes(), [("x", F32, [3, 4, 5])], [("y", F32, [3, 4, 5])],
                   {"axes": np.array([axis], np.int64)}, opset=18)
    (op,) = import_onnx(m).graph.ops
    assert op.kind == "softmax" and op.axis == axis and op.inputs == ("x",) and op.output == "y"


def test_expanded_softmax_whose_reductions_take_different_axes_stays_its_ops():
    nodes = softmax_nodes()
    nodes[3] = helper.make_node("ReduceSum", ["e", "axes2"], ["s"], name="sum")
    m = make_model(nodes, [("x", F32, [3, 4, 5])], [("y", F32, [3, 4, 5])],
                   {"axes": np.array([1], np.int64), "axes2": np.array([0], np.int64)}, opset=18)
    assert "softmax" not in kinds(from_onnx(m))


def test_expanded_softmax_whose_exp_is_read_elsewhere_stays_its_ops():
    nodes = softmax_nodes() + [helper.make_node("Neg", ["e"], ["z"], name="leak")]
    m = make_model(nodes, [("x", F32, [4, 8])], [("y", F32, [4, 8]), ("z", F32, [4, 8])],
                   {"axes": np.array([-1], np.int64)}, opset=18)
    assert kinds(from_onnx(m)) == ["reducemax", "sub", "exp", "reducesum", "div", "neg"]


# ---- attention's 1/sqrt(d) folded into the softmax (patterns.py, scaled-softmax) -----------------

def scores_model(scale_nodes, inits, *, dtype=F32, opset=20, outputs=()):
    """q [2, 4, 6, 8] @ k^T (a Transpose folded into the MatMul) -> ``scale_nodes`` -> Softmax."""
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], name="kt", perm=[0, 1, 3, 2])]
    nodes += scale_nodes
    return make_model(nodes, [("q", dtype, [2, 4, 6, 8]), ("k", dtype, [2, 4, 6, 8])],
                      [("y", dtype, [2, 4, 6, 6])] + list(outputs), inits, opset=opset)


def attention64(q, k, scale):
    s = scale * (q.astype(np.float64) @ np.swapaxes(k.astype(np.float64), -1, -2))
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


QK = {n: np.random.default_rng(i).normal(0, 2.0, (2, 4, 6, 8)).astype(np.float32) for i, n in enumerate("qk")}


@pytest.mark.parametrize("form", ["mul", "div"])
def test_a_constant_scaling_the_scores_folds_into_the_softmax_and_computes_the_scaled_softmax(form):
    scale = {"mul": (np.array(8 ** -0.5, np.float32), "Mul"), "div": (np.array(8 ** 0.5, np.float32), "Div")}[form]
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s"], name="qk"),
             helper.make_node(scale[1], ["s", "c"], ["ss"], name="scale"),
             helper.make_node("Softmax", ["ss"], ["y"], name="softmax", axis=-1)]
    model = import_onnx(scores_model(nodes, {"c": scale[0]}))
    assert kinds(model.graph) == ["matmul", "softmax"] and model.params == {}
    (sm,) = [op for op in model.graph.ops if op.kind == "softmax"]
    assert sm.inputs == ("s",) and sm.softmax_scale == pytest.approx(8 ** -0.5, rel=1e-7)
    np.testing.assert_allclose(run(model.graph, model.params, **QK), attention64(QK["q"], QK["k"], 8 ** -0.5),
                               rtol=1e-5, atol=1e-7)


def test_a_scale_split_over_q_and_k_folds_through_the_matmul_into_the_softmax():
    root = np.array(8 ** -0.25, np.float32)            # how exporters of SDPA put sqrt(scale) on q and k
    nodes = [helper.make_node("Mul", ["q", "r"], ["qs"], name="q_scale"),
             helper.make_node("Mul", ["kt", "r"], ["ks"], name="k_scale"),
             helper.make_node("MatMul", ["qs", "ks"], ["s"], name="qk"),
             helper.make_node("Softmax", ["s"], ["y"], name="softmax", axis=-1)]
    model = import_onnx(scores_model(nodes, {"r": root}))
    # (the Transpose read by the Mul stays an op: the planner costs it as any activation's transpose)
    assert kinds(model.graph) == ["transpose", "matmul", "softmax"]
    assert model.graph.op("qk").inputs == ("q", "kt")
    assert model.graph.op("softmax").softmax_scale == pytest.approx(8 ** -0.5, rel=1e-6)
    np.testing.assert_allclose(run(model.graph, model.params, **QK), attention64(QK["q"], QK["k"], 8 ** -0.5),
                               rtol=1e-5, atol=1e-7)


def test_an_expanded_softmax_of_scaled_fp16_scores_cast_to_fp32_folds_into_one_scaled_softmax():
    """HF eager attention in FP16: the scores scaled in FP16, cast to FP32, softmax, cast back: one
    FP16 softmax of the unscaled scores (the FP32 island folded too, ``softmax-fp32``)."""
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s"], name="qk"),
             helper.make_node("Mul", ["s", "c"], ["ss"], name="scale"),
             helper.make_node("Cast", ["ss"], ["x"], name="to32", to=F32)] + softmax_nodes() + []
    nodes[-1] = helper.make_node("Div", ["e", "s32"], ["y32"], name="div")
    nodes[-2] = helper.make_node("ReduceSum", ["e", "axes"], ["s32"], name="sum")
    nodes.append(helper.make_node("Cast", ["y32"], ["y"], name="to16", to=F16))
    m = scores_model(nodes, {"c": np.array(0.125, np.float16), "axes": np.array([-1], np.int64)}, dtype=F16,
                     opset=18)
    model = import_onnx(m)
    assert kinds(model.graph) == ["matmul", "softmax"]
    sm = model.graph.op("div")
    assert sm.inputs == ("s",) and sm.output == "y" and sm.softmax_scale == 0.125
    assert model.graph.tensors["y"].dtype is DType.FP16


def test_a_scale_whose_scaled_scores_are_read_elsewhere_or_a_negative_one_stays_a_mul():
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s"], name="qk"),
             helper.make_node("Mul", ["s", "c"], ["ss"], name="scale"),
             helper.make_node("Softmax", ["ss"], ["y"], name="softmax", axis=-1)]
    shared = scores_model(nodes, {"c": np.array(0.5, np.float32)}, outputs=[("ss", F32, [2, 4, 6, 6])])
    assert kinds(from_onnx(shared)) == ["matmul", "mul", "softmax"]
    negative = scores_model(nodes, {"c": np.array(-0.5, np.float32)})
    assert kinds(from_onnx(negative)) == ["matmul", "mul", "softmax"]
    varying = scores_model(nodes, {"c": np.array([0.5, 0.25, 1, 1, 1, 1], np.float32)})
    assert kinds(from_onnx(varying)) == ["matmul", "mul", "softmax"]
