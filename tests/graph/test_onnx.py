"""ONNX import: op mapping, GeLU subgraph fusion, errors, and the fixture twins."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tileplan.errors import TileplanError
from tileplan.graph.core import Add, Cast, GeLU, Graph, MatMul, Role, Tensor, Transpose
from tileplan.graph.dtypes import DType
from tileplan.graph.onnx import from_onnx, import_onnx, load_onnx_params, to_onnx

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
F32, F16, FP8 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.FLOAT8E4M3FNUZ


def make_model(nodes, inputs, outputs, inits=(), *, opset=20, name="g", metadata=None):
    """A ModelProto from (name, elem type, shape) triples and numpy initializers."""
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        [numpy_helper.from_array(v, n) for n, v in dict(inits).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    if metadata:
        helper.set_model_props(model, metadata)
    return model


def const(name, value, dtype=np.float32):
    return helper.make_node("Constant", [], [name], name=name,
                            value=numpy_helper.from_array(np.array(value, dtype=dtype)))


def kinds(graph: Graph) -> list[str]:
    return [op.kind for op in graph.ops]


# ---- the mixed example fixture ----------------------------------------------------

def test_mixed_fixture_imports_gemm_batched_matmul_and_fused_erf_gelu():
    model = import_onnx(FIXTURES / "onnx_mixed.onnx")
    g = model.graph
    assert g.name == "onnx_mixed"
    assert kinds(g) == ["matmul", "add", "gelu", "matmul", "add"]
    gemm = g.op("/fc/Gemm")
    assert gemm.inputs == ("x", "fc.weight") and gemm.transpose_b and not gemm.transpose_a
    assert g.op("/fc/Gemm.bias").inputs == ("h.matmul", "fc.bias")
    gelu = g.op("/act/Mul_1")
    assert isinstance(gelu, GeLU) and gelu.approximate == "erf" and gelu.inputs == ("h",)
    batched = g.op("/attn/MatMul")
    assert batched.inputs == ("a", "c") and g.tensors["s"].shape == (4, 16, 64)
    roles = {n: t.role for n, t in g.tensors.items()}
    assert roles["x"] is roles["a"] is roles["c"] is Role.INPUT
    assert roles["fc.weight"] is roles["fc.bias"] is Role.PARAMETER
    assert roles["y"] is Role.OUTPUT
    assert {t.dtype for t in g.tensors.values()} == {DType.FP32}
    assert g.tensors["fc.weight"].shape == (64, 32)
    assert set(model.params) == {"fc.weight", "fc.bias"}
    raw = onnx.load(str(FIXTURES / "onnx_mixed.onnx"))
    weight = next(i for i in raw.graph.initializer if i.name == "fc.weight")
    np.testing.assert_array_equal(model.params["fc.weight"], numpy_helper.to_array(weight))


def test_from_onnx_and_load_onnx_params_split_the_import():
    g = from_onnx(FIXTURES / "onnx_mixed.onnx", name="renamed")
    assert g.name == "renamed"
    params = load_onnx_params(FIXTURES / "onnx_mixed.onnx")
    assert params["fc.bias"].dtype == np.float32 and params["fc.bias"].shape == (64,)


# ---- MatMul and Gemm ------------------------------------------------------------

def test_batched_matmul_of_two_activations_broadcasts_batch_dims():
    m = make_model([helper.make_node("MatMul", ["a", "b"], ["c"], name="mm")],
                   [("a", F16, [2, 1, 8, 16]), ("b", F16, [3, 16, 4])], [("c", F16, [2, 3, 8, 4])])
    g = from_onnx(m)
    assert g.tensors["c"].shape == (2, 3, 8, 4) and g.tensors["c"].dtype is DType.FP16
    assert g.tensors["a"].role is g.tensors["b"].role is Role.INPUT
    assert g.op("mm").mnk(g.inputs_of(g.op("mm"))) == (6, 8, 4, 16)


def test_gemm_with_trans_b_and_bias_becomes_matmul_and_add():
    w = np.arange(6 * 4, dtype=np.float32).reshape(6, 4)
    b = np.ones(6, dtype=np.float32)
    m = make_model([helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="fc", transB=1)],
                   [("x", F32, [3, 4])], [("y", F32, [3, 6])], {"w": w, "b": b})
    imported = import_onnx(m)
    g = imported.graph
    assert [type(op) for op in g.ops] == [MatMul, Add]
    assert g.ops[0] == MatMul("fc", ("x", "w"), "y.matmul", transpose_b=True)
    assert g.ops[1] == Add("fc.bias", ("y.matmul", "b"), "y")
    assert g.tensors["y"].shape == (3, 6) and g.tensors["y"].role is Role.OUTPUT
    np.testing.assert_array_equal(imported.params["w"], w)


def test_gemm_folds_alpha_and_beta_into_initializers():
    w = np.full((4, 6), 2.0, dtype=np.float32)
    b = np.full(6, 3.0, dtype=np.float32)
    m = make_model([helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="fc", alpha=0.5, beta=2.0, transA=1)],
                   [("x", F32, [4, 3])], [("y", F32, [3, 6])], {"w": w, "b": b})
    imported = import_onnx(m)
    assert imported.graph.op("fc").transpose_a
    np.testing.assert_array_equal(imported.params["w"], w * 0.5)
    np.testing.assert_array_equal(imported.params["b"], b * 2.0)


def test_gemm_alpha_and_beta_on_activations_become_muls_by_one_element_parameters():
    m = make_model([helper.make_node("Gemm", ["x", "w", "c"], ["y"], name="scaled", alpha=0.25, beta=3.0)],
                   [("x", F32, [3, 4]), ("w", F32, [4, 6]), ("c", F32, [6])], [("y", F32, [3, 6])])
    model = import_onnx(m)
    g = model.graph
    assert [op.describe() for op in g.ops] == [
        "matmul scaled(x, w) -> y.matmul", "mul scaled.alpha(y.matmul, scaled.alpha) -> y.scaled",
        "mul scaled.beta(c, scaled.beta) -> y.bias_scaled", "add scaled.bias(y.scaled, y.bias_scaled) -> y"]
    assert model.params == {"scaled.alpha": np.array([0.25], np.float32), "scaled.beta": np.array([3.0], np.float32)}
    assert g.tensors["scaled.alpha"].shape == (1,) and g.tensors["scaled.alpha"].role is Role.PARAMETER


def test_transposes_fold_into_matmul_flags_or_into_initializer_values():
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    bias = np.arange(3, dtype=np.float32).reshape(3, 1)
    m = make_model([helper.make_node("Transpose", ["b"], ["bT"], name="t", perm=[0, 2, 1]),
                    helper.make_node("MatMul", ["a", "bT"], ["c"], name="mm"),
                    helper.make_node("Transpose", ["w"], ["wT"], name="tw", perm=[1, 0]),
                    helper.make_node("MatMul", ["c", "wT"], ["d"], name="mm2"),
                    helper.make_node("Transpose", ["bias"], ["biasT"], name="tb", perm=[1, 0]),
                    helper.make_node("Add", ["d", "biasT"], ["e"], name="add")],
                   [("a", F32, [2, 5, 6]), ("b", F32, [2, 4, 6])], [("e", F32, [2, 5, 3])],
                   {"w": w, "bias": bias})
    imported = import_onnx(m)
    g = imported.graph
    assert g.op("mm") == MatMul("mm", ("a", "b"), "c", transpose_b=True)
    assert g.op("mm2") == MatMul("mm2", ("c", "w"), "d", transpose_b=True)
    np.testing.assert_array_equal(imported.params["w"], w)
    assert g.op("add").inputs == ("d", "biasT") and g.tensors["biasT"].role is Role.PARAMETER
    np.testing.assert_array_equal(imported.params["biasT"], bias.T)


def test_transpose_of_an_activation_read_by_add_is_a_transpose_op():
    m = make_model([helper.make_node("Transpose", ["x"], ["xT"], name="t", perm=[1, 0]),
                    helper.make_node("Add", ["xT", "y0"], ["y"], name="add")],
                   [("x", F32, [3, 3]), ("y0", F32, [3, 3])], [("y", F32, [3, 3])])
    g = from_onnx(m)
    assert g.ops[0] == Transpose("t", ("x",), "xT", perm=(1, 0)) and kinds(g) == ["transpose", "add"]


def test_transpose_of_any_permutation_is_split_into_rearrangements_tileplan_plans():
    m = make_model([helper.make_node("Transpose", ["x"], ["y"], name="t", perm=[2, 0, 1])],
                   [("x", F32, [2, 3, 4])], [("y", F32, [4, 2, 3])])
    g = from_onnx(m)
    assert [(op.name, op.perm) for op in g.ops] == [("t.swap", (0, 2, 1)), ("t", (1, 0, 2))]
    x = np.random.default_rng(0).standard_normal((2, 3, 4))
    v = x
    for op in g.ops:
        v = op.reference(v)
    np.testing.assert_array_equal(v, np.transpose(x, (2, 0, 1)))


# ---- elementwise, casts, identities -------------------------------------------------

def test_add_broadcasts_and_identity_is_dropped():
    m = make_model([helper.make_node("Identity", ["x"], ["xi"], name="id"),
                    helper.make_node("Add", ["xi", "b"], ["s"], name="add"),
                    helper.make_node("Identity", ["s"], ["y"], name="id_out")],
                   [("x", F16, [2, 7, 5])], [("y", F16, [2, 7, 5])], {"b": np.ones(5, np.float16)})
    g = from_onnx(m)
    assert g.ops == [Add("add", ("x", "b"), "y")]
    assert g.tensors["y"].role is Role.OUTPUT and g.tensors["y"].shape == (2, 7, 5)


@pytest.mark.parametrize("approximate, expected", [("none", "erf"), ("tanh", "tanh")])
def test_opset20_gelu_maps_approximate(approximate, expected):
    m = make_model([helper.make_node("Gelu", ["x"], ["y"], name="act", approximate=approximate)],
                   [("x", F32, [4, 8])], [("y", F32, [4, 8])])
    assert from_onnx(m).ops == [GeLU("act", ("x",), "y", approximate=expected)]


def test_cast_to_fp8_takes_its_scale_from_metadata_and_fp8_matmul_gives_fp16():
    w = np.ones((8, 4), dtype=ml_dtypes.float8_e4m3fnuz)
    m = make_model([helper.make_node("Cast", ["x"], ["x8"], name="cast", to=FP8),
                    helper.make_node("MatMul", ["x8", "w"], ["y"], name="mm")],
                   [("x", F16, [2, 8])], [("y", F16, [2, 4])], {"w": w},
                   metadata={"tileplan.scale.x8": "-2", "tileplan.scale.w": "1", "tileplan.target": "ipu21-64"})
    imported = import_onnx(m)
    g = imported.graph
    assert g.ops[0] == Cast("cast", ("x",), "x8")
    assert g.tensors["x8"] == Tensor("x8", (2, 8), DType.FP8, Role.INTERMEDIATE, scale=-2)
    assert g.tensors["w"].scale == 1 and g.tensors["w"].dtype is DType.FP8
    assert g.tensors["y"].dtype is DType.FP16
    assert g.target == "ipu21-64"
    assert imported.params["w"].dtype == ml_dtypes.float8_e4m3fnuz


def test_fp16_matmul_with_declared_float_output_keeps_fp32_partials():
    m = make_model([helper.make_node("MatMul", ["a", "b"], ["c"], name="mm")],
                   [("a", F16, [4, 8]), ("b", F16, [8, 2])], [("c", F32, [4, 2])])
    assert from_onnx(m).tensors["c"].dtype is DType.FP32


def test_scale_metadata_for_a_non_fp8_tensor_is_an_error():
    m = make_model([helper.make_node("Gelu", ["x"], ["y"], name="act")],
                   [("x", F32, [4, 8])], [("y", F32, [4, 8])], metadata={"tileplan.scale.y": "1"})
    with pytest.raises(TileplanError, match=r"tileplan.scale.y.*fp8 only"):
        from_onnx(m)


# ---- GeLU subgraphs -----------------------------------------------------------------

def erf_gelu_nodes(variant: str) -> list:
    """The erf GeLU as exporters write it, from x to y, in several associations."""
    mul = lambda a, b, out: helper.make_node("Mul", [a, b], [out], name=f"mul_{out}")  # noqa: E731
    head = {
        "div": [const("c_sqrt2", 1.4142135), helper.make_node("Div", ["x", "c_sqrt2"], ["u"], name="div")],
        "mul": [const("c_rsqrt2", 0.70710677), mul("c_rsqrt2", "x", "u")],
    }
    tail = {
        "x_first": [mul("x", "a", "xa"), const("c_half", 0.5), mul("xa", "c_half", "y")],
        "half_first": [const("c_half", 0.5), mul("x", "c_half", "hx"), mul("hx", "a", "y")],
        "half_on_a": [const("c_half", 0.5), mul("a", "c_half", "ha"), mul("x", "ha", "y")],
    }
    h_, t_ = variant.split("/")
    return head[h_] + [helper.make_node("Erf", ["u"], ["e"], name="erf"), const("c_one", 1.0),
                       helper.make_node("Add", ["c_one", "e"], ["a"], name="add_one")] + tail[t_]


@pytest.mark.parametrize("variant", ["div/x_first", "mul/half_first", "mul/half_on_a", "div/half_on_a"])
def test_erf_gelu_subgraph_fuses_into_one_gelu(variant):
    m = make_model(erf_gelu_nodes(variant), [("x", F32, [3, 8])], [("y", F32, [3, 8])], opset=17)
    g = from_onnx(m)
    assert len(g.ops) == 1
    (op,) = g.ops
    assert isinstance(op, GeLU) and op.approximate == "erf" and op.inputs == ("x",) and op.output == "y"
    assert set(g.tensors) == {"x", "y"}


def tanh_gelu_nodes(cube: str, dtype=np.float32) -> list:
    cube_nodes = {
        "pow": [const("c3", 3.0, dtype), helper.make_node("Pow", ["x", "c3"], ["x3"], name="pow")],
        "mul": [helper.make_node("Mul", ["x", "x"], ["x2"], name="sq"),
                helper.make_node("Mul", ["x2", "x"], ["x3"], name="cube")],
    }[cube]
    return cube_nodes + [
        const("c_k", 0.044715, dtype), helper.make_node("Mul", ["c_k", "x3"], ["kx3"], name="kx3"),
        helper.make_node("Add", ["x", "kx3"], ["v"], name="inner_add"),
        const("c_b", 0.7978845608, dtype), helper.make_node("Mul", ["v", "c_b"], ["s"], name="scale"),
        helper.make_node("Tanh", ["s"], ["t"], name="tanh"),
        const("c_one", 1.0, dtype), helper.make_node("Add", ["t", "c_one"], ["a"], name="one_plus"),
        const("c_half", 0.5, dtype), helper.make_node("Mul", ["c_half", "x"], ["hx"], name="half"),
        helper.make_node("Mul", ["hx", "a"], ["y"], name="gelu_out")]


@pytest.mark.parametrize("cube", ["pow", "mul"])
def test_tanh_gelu_subgraph_fuses_into_one_gelu(cube):
    m = make_model(tanh_gelu_nodes(cube), [("x", F32, [3, 8])], [("y", F32, [3, 8])], opset=17)
    g = from_onnx(m)
    assert g.ops == [GeLU("gelu_out", ("x",), "y", approximate="tanh")]


def test_tanh_gelu_subgraph_in_fp16_matches_with_rounded_constants():
    m = make_model(tanh_gelu_nodes("pow", np.float16), [("x", F16, [3, 8])], [("y", F16, [3, 8])], opset=17)
    assert from_onnx(m).ops == [GeLU("gelu_out", ("x",), "y", approximate="tanh")]


def test_gelu_subgraph_with_a_shared_intermediate_is_not_fused():
    nodes = erf_gelu_nodes("div/x_first") + [helper.make_node("Add", ["e", "x"], ["z"], name="leak")]
    m = make_model(nodes, [("x", F32, [3, 8])], [("y", F32, [3, 8]), ("z", F32, [3, 8])], opset=17)
    g = from_onnx(m)
    assert "gelu" not in kinds(g) and {"erf", "div", "mul", "add"} <= set(kinds(g))


def test_gelu_subgraph_with_a_wrong_constant_is_not_fused_but_kept_as_its_pointwise_ops():
    nodes = erf_gelu_nodes("div/x_first")
    nodes[0] = const("c_sqrt2", 1.5)
    m = make_model(nodes, [("x", F32, [3, 8])], [("y", F32, [3, 8])], opset=17)
    g = from_onnx(m)
    assert "gelu" not in kinds(g) and "erf" in kinds(g)


# ---- values known at import: folded -----------------------------------------------

def test_shape_arithmetic_of_an_activation_folds_to_one_reshape():
    """``Shape`` of an activation is a constant (tileplan plans static shapes), and so is the
    arithmetic after it: Gather, Mod, Concat; the Reshape's shape, symbolic to ONNX inference, is
    inferred again once folded."""
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Gather", ["s", "one"], ["d"], name="dim", axis=0),
             helper.make_node("Mod", ["d", "five"], ["m"], name="mod"),
             helper.make_node("Concat", ["minus_one", "m"], ["shape2"], name="cat", axis=0),
             helper.make_node("Reshape", ["x", "shape2"], ["y"], name="reshape")]
    inits = {"one": np.array([1], np.int64), "five": np.array([5], np.int64), "minus_one": np.array([-1], np.int64)}
    m = make_model(nodes, [("x", F32, [2, 12])], [("y", F32, ["rows", "cols"])], inits)
    model = import_onnx(m)
    g = model.graph
    assert kinds(g) == ["reshape"]                       # 12 % 5 = 2: x as [12, 2]
    assert g.op("reshape").shape == (12, 2) and g.tensors["y"].shape == (12, 2)
    assert model.params == {}                            # no integer constant left behind


def test_a_shape_made_static_by_folding_folds_in_turn():
    """``Shape`` of a Reshape's output whose shape ONNX inference could not give (it came from a
    shape subgraph): folded once that subgraph is, and inferred again (the multi-head attention
    pooling head's export: the packed k|v reshaped by the shape of a projection)."""
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Gather", ["s", "one"], ["d"], name="dim", axis=0),
             helper.make_node("Mod", ["d", "five"], ["m"], name="mod"),
             helper.make_node("Concat", ["minus_one", "m"], ["shape2"], name="cat", axis=0),
             helper.make_node("Reshape", ["x", "shape2"], ["h"], name="reshape"),
             helper.make_node("Shape", ["h"], ["s2"], name="shape_h"),
             helper.make_node("Gather", ["s2", "one"], ["cols"], name="cols", axis=0),
             helper.make_node("Concat", ["cols", "minus_one"], ["shape3"], name="cat2", axis=0),
             helper.make_node("Reshape", ["h", "shape3"], ["y"], name="back")]
    inits = {"one": np.array([1], np.int64), "five": np.array([5], np.int64), "minus_one": np.array([-1], np.int64)}
    m = make_model(nodes, [("x", F32, [2, 12])], [("y", F32, ["rows", "cols"])], inits)
    g = from_onnx(m)
    assert kinds(g) == ["reshape", "reshape"]
    assert g.tensors["h"].shape == (12, 2) and g.tensors["y"].shape == (2, 12)


def resize_model(mode: str, table: np.ndarray, scales) -> onnx.ModelProto:
    """``y = x + Resize(table)``: a parameter resized at a fixed size (a position table
    interpolated to the image), with the attributes the TorchScript exporter writes for bicubic
    and for nearest."""
    out = [int(d * s) for d, s in zip(table.shape, scales)]
    nodes = [helper.make_node("Resize", ["table", "", "scales"], ["resized"], name="resize", mode=mode,
                              coordinate_transformation_mode="half_pixel" if mode == "cubic" else "asymmetric", cubic_coeff_a=-0.75,
                              nearest_mode="floor"),
             helper.make_node("Add", ["x", "resized"], ["y"], name="add")]
    return make_model(nodes, [("x", F32, out)], [("y", F32, out)],
                      {"table": table, "scales": np.array(scales, np.float32)})


@pytest.mark.parametrize("mode", ["nearest", "cubic"])
def test_resize_of_an_initializer_folds_into_a_parameter(mode):
    table = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4) ** 1.5
    m = resize_model(mode, table, [1.0, 1.0, 2.0, 2.0])
    model = import_onnx(m)
    g = model.graph
    assert kinds(g) == ["add"]
    (param,) = [t for t in g.inputs_of(g.op("add")) if t.role is Role.PARAMETER]
    value = model.params[param.name]
    assert value.shape == (1, 1, 8, 8) and value.dtype == np.float32
    if mode == "nearest":                # asymmetric, floor: each value twice along both axes
        np.testing.assert_array_equal(value, table.repeat(2, axis=2).repeat(2, axis=3))
    else:                                # bicubic (a = -0.75): smooth, not a copy of the nearest rows
        from onnx.reference import ReferenceEvaluator
        x = np.zeros((1, 1, 8, 8), np.float32)
        np.testing.assert_allclose(value, ReferenceEvaluator(m).run(None, {"x": x})[0], rtol=1e-6)
        assert not np.allclose(value, table.repeat(2, axis=2).repeat(2, axis=3))


def test_pow_of_constants_with_any_exponent_folds():
    """``Pow(16, 0.5)`` cast to an integer (a grid side computed from a position table's length):
    only Pow of an *activation* needs the exponent 2 or 3 tileplan plans as Muls."""
    nodes = [const("n", 16.0), const("half", 0.5),
             helper.make_node("Pow", ["n", "half"], ["side_f"], name="pow"),
             helper.make_node("Cast", ["side_f"], ["side"], name="cast", to=TensorProto.INT64),
             helper.make_node("Unsqueeze", ["side", "zero"], ["side1"], name="unsq"),
             helper.make_node("Concat", ["side1", "side1"], ["shape"], name="cat", axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")]
    m = make_model(nodes, [("x", F32, [16])], [("y", F32, ["rows", "cols"])], {"zero": np.array([0], np.int64)})
    g = from_onnx(m)
    assert kinds(g) == ["reshape"] and g.tensors["y"].shape == (4, 4)


def test_a_node_of_constants_the_evaluator_cannot_run_is_refused_naming_it():
    m = resize_model("cubic", np.ones((1, 1, 4, 4), np.float32), [1.0, 1.0, 2.0, 2.0])
    m.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.array([2.0, 2.0], np.float32), "scales"))
    with pytest.raises(TileplanError, match=r"node 'resize' \(Resize\): its inputs are all constants, but "
                                            r"evaluating it at import failed: "):
        from_onnx(m)


# ---- errors ------------------------------------------------------------------------

def test_every_unsupported_node_is_reported_in_one_error_with_counts_and_names():
    nodes = [helper.make_node("Elu", ["x"], ["l1"], name="elu1"),
             helper.make_node("Gelu", ["l1"], ["g"], name="act"),
             helper.make_node("Elu", ["g"], ["l2"], name="elu2"),
             helper.make_node("Identity", ["l2"], ["s2"]),
             helper.make_node("HardSwish", ["s2"], ["y"])]
    m = make_model(nodes, [("x", F32, [2, 4])], [("y", F32, [2, 4])])
    with pytest.raises(TileplanError) as err:
        from_onnx(m)
    msg = str(err.value)
    assert msg.startswith("ONNX model 'g': 3 unsupported nodes: Elu (2: elu1, elu2), "
                          "HardSwish (1: HardSwish_4); tileplan imports Add, And, Cast, CastLike, Concat, Constant, Conv, "
                          "Div, Dropout,")


def test_unsupported_dtype_names_the_tensor():
    m = make_model([helper.make_node("Add", ["x", "x"], ["y"], name="add")],
                   [("x", TensorProto.DOUBLE, [2, 4])], [("y", TensorProto.DOUBLE, [2, 4])])
    with pytest.raises(TileplanError, match=r"tensor 'x' has ONNX element type DOUBLE"):
        from_onnx(m)


def test_symbolic_dimension_names_the_tensor():
    m = make_model([helper.make_node("Gelu", ["x"], ["y"], name="act")],
                   [("x", F32, ["batch", 8])], [("y", F32, ["batch", 8])])
    with pytest.raises(TileplanError, match=r"graph input 'x' has a dynamic dimension \(shape \['batch', 8\]\)"):
        from_onnx(m)


def test_a_file_that_is_not_onnx_is_an_error_naming_the_file(tmp_path):
    bad = tmp_path / "model.onnx"
    bad.write_text("[model]\nname = 'not onnx'\n")
    with pytest.raises(TileplanError, match=rf"^{bad}: "):
        from_onnx(bad)
    with pytest.raises(TileplanError, match="no such ONNX file"):
        from_onnx(tmp_path / "missing.onnx")


def test_errors_from_a_file_carry_its_path(tmp_path):
    m = make_model([helper.make_node("Elu", ["x"], ["y"], name="elu")], [("x", F32, [2])], [("y", F32, [2])])
    path = tmp_path / "elu.onnx"
    onnx.save(m, str(path))
    with pytest.raises(TileplanError, match=rf"^{path}: 1 unsupported node: Elu \(1: elu\); tileplan imports"):
        from_onnx(path)


# ---- twins of the TOML fixtures and export round trips --------------------------

def signature(graph: Graph):
    tensors = {n: (t.shape, t.dtype, t.role, t.scale) for n, t in graph.tensors.items()}
    return tensors, [op.describe() for op in graph.ops], graph.target


def test_onnx_twin_of_mlp_smoke_fp8_matches_the_toml_original():
    from tileplan.graph import loaders
    toml_path = FIXTURES / "mlp_smoke_fp8.toml"
    original = loaders.load_model(toml_path)
    twin = import_onnx(FIXTURES / "mlp_smoke_fp8.onnx")
    assert signature(twin.graph) == signature(original), "regenerate with: python fixtures/make_onnx.py"
    assert twin.graph.name == original.name
    for t in original.by_role(Role.PARAMETER):
        assert twin.params[t.name].shape == t.shape and twin.params[t.name].dtype == t.dtype.numpy


def test_to_onnx_round_trips_transposes_partials_and_scales():
    tensors = [Tensor("a", (2, 5, 6), DType.FP16, Role.INPUT), Tensor("w", (7, 6), DType.FP16, Role.PARAMETER),
               Tensor("b", (7,), DType.FP32, Role.PARAMETER), Tensor("p", (2, 5, 7), DType.FP32),
               Tensor("q", (2, 5, 7), DType.FP8, scale=-3)]
    ops = [MatMul("mm", ("a", "w"), "p", transpose_b=True), Add("bias", ("p", "b"), "pb"),
           GeLU("act", ("pb",), "g", approximate="erf"), Cast("to8", ("g",), "q")]
    graph = Graph.build("rt", tensors, ops, target="ipu21")
    params = {"w": np.ones((7, 6), np.float16), "b": np.zeros(7, np.float32)}
    model = to_onnx(graph, params)
    onnx.checker.check_model(model)
    back = import_onnx(model)
    assert signature(back.graph) == signature(graph)
    assert back.graph.name == "rt"


def test_to_onnx_round_trips_every_pointwise_op_reshape_and_transpose():
    from tileplan.graph.core import OP_KINDS, Reshape
    x = Tensor("x", (2, 3, 4), DType.FP32, Role.INPUT)
    ops, last = [], "x"
    for kind in ("add", "sub", "mul", "div", "neg", "sqrt", "reciprocal", "exp", "tanh", "erf", "sigmoid"):
        cls = OP_KINDS[kind]
        ops.append(cls(kind, (last, last)[:cls.arity], f"{kind}.out"))
        last = f"{kind}.out"
    ops += [Reshape("r", (last,), "r.out", shape=(6, 4)), Transpose("t", ("r.out",), "y", perm=(1, 0))]
    graph = Graph.build("pw", [x], ops)
    back = import_onnx(to_onnx(graph, {}))
    assert signature(back.graph) == signature(graph)


def test_fp8_element_type_constant_matches_onnx():
    from tileplan.graph import onnx as tp_onnx
    assert tp_onnx._FP8 == TensorProto.FLOAT8E4M3FNUZ


def test_load_model_dispatches_onnx_files():
    from tileplan.graph.loaders import load_model
    g = load_model(FIXTURES / "onnx_mixed.onnx")
    assert g.name == "onnx_mixed" and [op.kind for op in g.ops] == ["matmul", "add", "gelu", "matmul", "add"]


@pytest.mark.parametrize("fixture", ["mlp_smoke_fp8", "odd_fp8_tails"])
def test_an_fp8_twin_is_standard_onnx_and_compiles_to_what_onnx_s_reference_evaluator_computes(fixture, tmp_path):
    """ONNX has no MatMul on FLOAT8 types: the twins write an FP8 GEMM as its operands cast to
    FLOAT16 (a weight's scale a Mul by 2**s) and an FP16 MatMul, which passes onnx's full check and
    runs in its reference evaluator; the importer folds it back into the FP8 MatMul (same graph as
    the TOML), and the compiled package validates against the evaluator's outputs."""
    from onnx.reference import ReferenceEvaluator
    from tileplan.graph import loaders
    from tileplan.lowering.compile import compile_model
    from tileplan.lowering.package import load_package
    from tileplan.sim.validate import validate_package
    from tileplan.target import load_target
    model = onnx.load(str(FIXTURES / f"{fixture}.onnx"))
    onnx.checker.check_model(model, full_check=True)
    assert "float8" not in str([n.op_type for n in model.graph.node if n.op_type == "MatMul"])
    twin = import_onnx(FIXTURES / f"{fixture}.onnx")
    assert signature(twin.graph) == signature(loaders.load_model(FIXTURES / f"{fixture}.toml"))
    (inp,) = model.graph.input
    x = np.random.default_rng(2).standard_normal(twin.graph.tensors[inp.name].shape).astype(np.float16)
    want = ReferenceEvaluator(model).run(None, {inp.name: x})
    np.savez(tmp_path / "in.npz", **{inp.name: x})
    np.savez(tmp_path / "want.npz", **{o.name: w for o, w in zip(model.graph.output, want)})
    _, _, path = compile_model(twin.graph, load_target("ipu21-64"), tmp_path / "pkg", params=twin.params, jobs=1)
    v = validate_package(load_package(path), inputs_path=tmp_path / "in.npz", expected_path=tmp_path / "want.npz")
    assert v.passed and all(o["cosine"] > 0.999 for o in v.outputs.values()), v.outputs
