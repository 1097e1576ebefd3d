"""Concat: its shape rule and float64 reference, the TOML op row, the importers' rows (torch ``cat``,
ONNX ``Concat``; ``expand`` / ONNX ``Expand`` / ``Tile`` of a constant folded at import), and small
models joined along the last axis and along the row axis compiled onto ipu21-64 and validated on
the IPU model with the planner's estimate equal to the simulated cycles."""

from __future__ import annotations

import numpy as np
import pytest

from tileplan.errors import TileplanError
from tileplan.graph.core import Concat, Graph, Role, Tensor
from tileplan.graph.dtypes import DType
from tileplan.graph.loaders import load_model
from tileplan.lowering.compile import compile_model
from tileplan.lowering.package import load_package
from tileplan.sim.validate import validate_package
from tileplan.target import load_target


def t(name, shape, dtype=DType.FP32, scale=0):
    return Tensor(name, tuple(shape), dtype, Role.INPUT, scale)


# ---- the op ------------------------------------------------------------------------

@pytest.mark.parametrize("axis,shapes,want", [
    (1, [(2, 1, 8), (2, 16, 8)], (2, 17, 8)),            # a class token joined to patch tokens
    (-1, [(3, 4), (3, 5), (3, 1)], (3, 10)),
    (0, [(2, 4), (3, 4)], (5, 4)),
    (-3, [(1, 2, 3), (4, 2, 3)], (5, 2, 3)),
    (0, [(0, 4), (3, 4)], (3, 4)),                       # a zero-size part adds nothing
])
def test_infer_sums_the_joined_axis_and_reference_is_numpy_concatenate(axis, shapes, want):
    op = Concat("cat", tuple(f"x{i}" for i in range(len(shapes))), "y", axis=axis)
    shape, dtype = op.infer([t(f"x{i}", s) for i, s in enumerate(shapes)])
    assert shape == want and dtype is DType.FP32
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(s) for s in shapes]
    np.testing.assert_array_equal(op.reference(*xs), np.concatenate(xs, axis=axis))


def test_windows_are_the_inputs_column_ranges_of_the_outputs_2d_view():
    op = Concat("cat", ("a", "b", "c"), "y", axis=1)
    assert op.windows([(2, 1, 8), (2, 3, 8), (2, 4, 8)]) == (64, [(0, 8), (8, 24), (32, 32)])
    assert Concat("cat", ("a", "b"), "y", axis=-1).windows([(5, 3), (5, 2)]) == (5, [(0, 3), (3, 2)])


@pytest.mark.parametrize("ins,axis,words", [
    ([t("a", (2, 3)), t("b", (4, 3))], 1, ["'a' [2, 3]", "'b' [4, 3]", "axis other than the joined axis 1"]),
    ([t("a", (2, 3)), t("b", (2, 3, 1))], 0, ["'b' [2, 3, 1]"]),
    ([t("a", (2, 3)), t("b", (2, 3), DType.FP16)], 0, ["dtype", "fp16"]),
    ([t("a", (2, 3), DType.FP8, 2), t("b", (2, 3), DType.FP8, 3)], 0, ["scale", "does not rescale"]),
    ([t("a", (2, 3)), t("b", (2, 3))], 2, ["axis 2 is out of range", "'a' [2, 3]"]),
])
def test_infer_refuses_parts_that_do_not_join_naming_them(ins, axis, words):
    with pytest.raises(TileplanError) as e:
        Concat("join", tuple(x.name for x in ins), "y", axis=axis).infer(ins)
    assert "op 'join' (concat)" in str(e.value)
    for w in words:
        assert w in str(e.value)


def test_an_fp8_concat_keeps_its_inputs_scale():
    g = Graph.build("m", [t("a", (2, 8), DType.FP8, 3), t("b", (2, 8), DType.FP8, 3)],
                    [Concat("cat", ("a", "b"), "y", axis=0)])
    assert g.tensors["y"].shape == (4, 8) and g.tensors["y"].scale == 3


def test_a_concat_of_no_inputs_is_refused_and_the_axis_must_be_an_integer():
    with pytest.raises(TileplanError, match="op 'cat' \\(concat\\): takes one or more inputs, got none"):
        Graph.build("m", [t("a", (2, 8))], [Concat("cat", (), "y")])
    with pytest.raises(TileplanError, match="axis must be an integer"):
        Concat("cat", ("a",), "y", axis=1.5)


# ---- the TOML row --------------------------------------------------------------------

LAST_AXIS = """
[model]
name = "concat_last"
target = "ipu21-64"
[tensors]
a = { shape = [2, 9, 64], dtype = "fp32", role = "input" }
b = { shape = [2, 9, 32], dtype = "fp32", role = "input" }
w = { shape = [96, 48], dtype = "fp32", role = "parameter" }
[[ops]]
name = "join"
op = "concat"
axis = -1
inputs = ["a", "b"]
output = "ab"
[[ops]]
name = "proj"
op = "matmul"
inputs = ["ab", "w"]
output = "y"
"""

# A class token (a parameter already repeated over the batch) joined to patch tokens a GEMM writes,
# then a third part (an input) after them; the joined tokens are the graph's output.
ROW_AXIS = """
[model]
name = "concat_rows"
target = "ipu21-64"
[tensors]
x = { shape = [2, 8, 48], dtype = "fp32", role = "input" }
extra = { shape = [2, 3, 64], dtype = "fp32", role = "input" }
w = { shape = [48, 64], dtype = "fp32", role = "parameter" }
cls = { shape = [2, 1, 64], dtype = "fp32", role = "parameter" }
[[ops]]
name = "embed"
op = "matmul"
inputs = ["x", "w"]
output = "patches"
[[ops]]
name = "join"
op = "concat"
axis = 1
inputs = ["cls", "patches", "extra"]
output = "tokens"
"""


# One tensor joined to itself along the rows: in element intervals its first copy keeps every
# element on its tile at its offset, yet lands in other memory (the output's), so it is an on-tile
# copy the estimate must count as lowering makes it.
SELF = """
[model]
name = "concat_self"
target = "ipu21-64"
[tensors]
x = { shape = [4, 40], dtype = "fp32", role = "input" }
[[ops]]
name = "join"
op = "concat"
axis = 0
inputs = ["x", "x"]
output = "y"
"""


def write(tmp_path, text, name="model.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_toml_op_reads_its_axis_and_any_number_of_inputs(tmp_path):
    g = load_model(write(tmp_path, ROW_AXIS))
    op = g.op("join")
    assert isinstance(op, Concat) and op.axis == 1 and op.inputs == ("cls", "patches", "extra")
    assert g.tensors["tokens"].shape == (2, 12, 64)


@pytest.mark.parametrize("edit,words", [
    (('inputs = ["cls", "patches", "extra"]', "inputs = []"), ["op 'join' (concat)", "one or more inputs"]),
    (('axis = 1', 'axis = 1\nperm = [0, 1]'), ["key 'perm' applies to transpose ops, not concat"]),
    (('axis = 1', 'axis = 2'), ["op 'join' (concat)", "'cls' [2, 1, 64]", "'patches' [2, 8, 64]"]),
])
def test_the_toml_op_refuses_bad_entries_naming_the_op(tmp_path, edit, words):
    with pytest.raises(TileplanError) as e:
        load_model(write(tmp_path, ROW_AXIS.replace(*edit)))
    for w in words:
        assert w in str(e.value)


@pytest.mark.parametrize("text,name", [(LAST_AXIS, "last axis"), (ROW_AXIS, "row axis"), (SELF, "itself")])
def test_a_concat_compiles_and_validates_with_the_estimate_equal_to_the_simulated_cycles(tmp_path, text, name):
    graph = load_model(write(tmp_path, text))
    p, _, path = compile_model(graph, load_target("ipu21-64"), tmp_path / "pkg", jobs=1)
    pick = p.candidates["join"][p.picks["join"]]
    assert len(pick.ins) == len(graph.op("join").inputs)          # one input layout per part
    assert "its column window" in pick.desc
    v = validate_package(load_package(path))
    assert v.passed, v.outputs
    assert v.profile.cycles == p.estimate.cycles


# ---- the importers -----------------------------------------------------------------

def test_torch_cat_of_an_expanded_class_token_is_a_concat_reading_a_folded_parameter():
    torch = pytest.importorskip("torch")
    from tileplan.graph.torch import import_module

    class Tokens(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.cls = torch.nn.Parameter(torch.randn(1, 1, 16))
            self.proj = torch.nn.Linear(12, 16)

        def forward(self, x):
            return torch.cat([self.cls.expand(x.shape[0], -1, -1), self.proj(x)], dim=1)

    torch.manual_seed(0)
    m = Tokens().eval()
    model = import_module(m, (torch.randn(3, 5, 12),))
    (cat,) = [op for op in model.graph.ops if isinstance(op, Concat)]
    assert cat.axis == 1 and model.graph.tensors[cat.output].shape == (3, 6, 16)
    token = model.graph.tensors[cat.inputs[0]]
    assert token.role is Role.PARAMETER and token.shape == (3, 1, 16)     # the expand, computed at import
    np.testing.assert_array_equal(model.params[token.name], m.cls.detach().numpy().repeat(3, axis=0))


def test_torch_adding_zeros_computed_at_import_is_dropped_but_a_zero_parameter_stays():
    """A value computed at import that is all zeros (HF's attention mask when none is given) adds
    nothing; a zero parameter is a weight the user may override, so its Add stays."""
    torch = pytest.importorskip("torch")
    from tileplan.graph.torch import import_module

    class Masked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bias = torch.nn.Parameter(torch.zeros(4, 6))

        def forward(self, x):
            mask = torch.zeros(x.shape[0], 1, 4, 4).expand(-1, 3, -1, -1)
            y = torch.softmax(x + mask, dim=-1)
            return y.reshape(x.shape[0], 3, 4, 4)[:, 0] @ torch.ones(4, 6) + self.bias

    model = import_module(Masked().eval(), (torch.randn(2, 3, 4, 4),))
    adds = [op for op in model.graph.ops if op.kind == "add"]
    assert len(adds) == 1 and "bias" in adds[0].inputs


def _onnx_join(data_node, data_inputs, initializers):
    onnx = pytest.importorskip("onnx")
    h = onnx.helper
    nodes = [data_node, h.make_node("Concat", ["token", "x"], ["y"], name="join", axis=1)]
    graph = h.make_graph(nodes, "join", [h.make_tensor_value_info(n, onnx.TensorProto.FLOAT, s)
                                         for n, s in data_inputs],
                         [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 4, 8])], initializer=initializers)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


@pytest.mark.parametrize("kind", ["Expand", "Tile"])
def test_onnx_expand_or_tile_of_an_initializer_is_folded_and_concat_imports(kind, tmp_path):
    onnx = pytest.importorskip("onnx")
    from tileplan.graph.onnx import import_onnx
    cls = np.arange(8, dtype=np.float32).reshape(1, 1, 8)
    arg = np.array([2, 1, 8] if kind == "Expand" else [2, 1, 1], dtype=np.int64)
    inits = [onnx.numpy_helper.from_array(cls, "cls"), onnx.numpy_helper.from_array(arg, "how")]
    m = _onnx_join(onnx.helper.make_node(kind, ["cls", "how"], ["token"], name="repeat"), [("x", [2, 3, 8])], inits)
    onnx.save(m, tmp_path / "m.onnx")
    model = import_onnx(tmp_path / "m.onnx")
    assert [op.kind for op in model.graph.ops] == ["concat"]
    np.testing.assert_array_equal(model.params["token"], np.repeat(cls, 2, axis=0))
    p, _, path = compile_model(model.graph, load_target("ipu21-64"), tmp_path / "pkg", params=model.params, jobs=1)
    x = np.random.default_rng(1).standard_normal((2, 3, 8)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    np.savez(tmp_path / "want.npz", y=np.concatenate([np.repeat(cls, 2, axis=0), x], axis=1))
    v = validate_package(load_package(path), inputs_path=tmp_path / "in.npz", expected_path=tmp_path / "want.npz")
    assert v.passed, v.outputs
    assert v.outputs["y"]["max_abs"] == 0.0        # a copy of the values, bit for bit


def test_onnx_expand_of_an_activation_is_refused_naming_the_node(tmp_path):
    onnx = pytest.importorskip("onnx")
    from tileplan.graph.onnx import import_onnx
    inits = [onnx.numpy_helper.from_array(np.array([2, 1, 8], dtype=np.int64), "how")]
    m = _onnx_join(onnx.helper.make_node("Expand", ["c", "how"], ["token"], name="repeat"),
                   [("c", [1, 1, 8]), ("x", [2, 3, 8])], inits)
    onnx.save(m, tmp_path / "m.onnx")
    with pytest.raises(TileplanError, match="node 'repeat' \\(Expand\\): expands the activation 'c'; tileplan "
                                            "imports Expand of constants"):
        import_onnx(tmp_path / "m.onnx")


def test_a_concat_round_trips_through_its_onnx_twin(tmp_path):
    pytest.importorskip("onnx")
    from tileplan.graph.onnx import import_onnx, to_onnx
    g = load_model(write(tmp_path, ROW_AXIS))
    rng = np.random.default_rng(2)
    params = {p.name: rng.standard_normal(p.shape).astype(np.float32) for p in g.by_role(Role.PARAMETER)}
    back = import_onnx(to_onnx(g, params))
    (op,) = [o for o in back.graph.ops if isinstance(o, Concat)]
    assert op.axis == 1 and op.inputs == ("cls", "patches", "extra")
    assert back.graph.tensors["tokens"].shape == (2, 12, 64)


def _onnx_gather(indices: np.ndarray, tmp_path):
    onnx = pytest.importorskip("onnx")
    h = onnx.helper
    out_shape = [2] + list(indices.shape) + [8]
    g = h.make_graph([h.make_node("Gather", ["x", "idx"], ["y"], name="cls_row", axis=1)], "rows",
                     [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 5, 8])],
                     [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, out_shape)],
                     initializer=[onnx.numpy_helper.from_array(indices, "idx")])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), tmp_path / "g.onnx")
    return tmp_path / "g.onnx"


@pytest.mark.parametrize("indices", [np.array(0, np.int64), np.array([4, 2, 0], np.int64), np.array([-1], np.int64)])
def test_onnx_gather_of_an_activation_by_an_even_run_of_indices_is_a_slice_and_validates(indices, tmp_path):
    """The CLS row a pooler reads (``x[:, 0]``: a scalar index drops the axis), a reversed strided
    run, a negative index."""
    from tileplan.graph.onnx import import_onnx
    model = import_onnx(_onnx_gather(indices, tmp_path))
    assert "slice" in [op.kind for op in model.graph.ops]
    _, _, path = compile_model(model.graph, load_target("ipu21-64"), tmp_path / "pkg", jobs=1)
    x = np.random.default_rng(3).standard_normal((2, 5, 8)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    np.savez(tmp_path / "want.npz", y=np.take(x, indices, axis=1))
    v = validate_package(load_package(path), inputs_path=tmp_path / "in.npz", expected_path=tmp_path / "want.npz")
    assert v.passed and v.outputs["y"]["max_abs"] == 0.0


def test_onnx_gather_by_uneven_indices_is_refused_naming_the_node(tmp_path):
    from tileplan.graph.onnx import import_onnx
    with pytest.raises(TileplanError, match="'cls_row' .*indices \\[0, 1, 3\\] do not step evenly"):
        import_onnx(_onnx_gather(np.array([0, 1, 3], np.int64), tmp_path))


@pytest.mark.parametrize("shapes,left", [([(2, 0, 8), (2, 3, 8)], ["reshape"]),
                                         ([(2, 0, 8), (2, 3, 8), (2, 0, 8), (2, 2, 8)], ["concat"])])
def test_zero_size_parts_are_dropped_at_plan_time_and_the_rest_validates(shapes, left, tmp_path):
    """ONNX admits zero-size tensors; a Concat's zero-size parts hold nothing: the planner's rewrite
    drops them (one part left: a Reshape to its own shape)."""
    onnx = pytest.importorskip("onnx")
    from tileplan.graph.onnx import import_onnx
    h = onnx.helper
    names = [f"p{i}" for i in range(len(shapes))]
    g = h.make_graph([h.make_node("Concat", names, ["y"], name="join", axis=1)], "parts",
                     [h.make_tensor_value_info(n, onnx.TensorProto.FLOAT, s) for n, s in zip(names, shapes)],
                     [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, sum(s[1] for s in shapes), 8])])
    model = import_onnx(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]))
    p, _, path = compile_model(model.graph, load_target("ipu21-64"), tmp_path / "pkg", jobs=1)
    assert [op.kind for op in p.graph.ops] == left
    assert all(p.graph.tensors[i].size for op in p.graph.ops for i in op.inputs)
    rng = np.random.default_rng(4)
    xs = {n: rng.standard_normal(s).astype(np.float32) for n, s in zip(names, shapes)}
    np.savez(tmp_path / "in.npz", **xs)
    np.savez(tmp_path / "want.npz", y=np.concatenate(list(xs.values()), axis=1))
    v = validate_package(load_package(path), inputs_path=tmp_path / "in.npz", expected_path=tmp_path / "want.npz")
    assert v.passed and v.outputs["y"]["max_abs"] == 0.0


@pytest.mark.parametrize("edit,words", [
    (('axis = 1', 'axis = 7'), ["model.toml", "op 'join' (concat)", "axis 7 is out of range"]),
    (('inputs = ["cls", "patches", "extra"]', 'inputs = ["cls", "nowhere"]'), ["model.toml", "nowhere"]),
])
def test_the_cli_refuses_a_bad_concat_in_one_line(cli, tmp_path, edit, words):
    code, _, err = cli("show", write(tmp_path, ROW_AXIS.replace(*edit)))
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err
    for w in words:
        assert w in lines[0], (w, lines[0])
