"""PyTorch import through torch.export (torch is an optional extra: skipped without it)."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from tileplan.errors import TileplanError  # noqa: E402
from tileplan.graph.core import Add, Cast, GeLU, Graph, MatMul, Role  # noqa: E402
from tileplan.graph.dtypes import DType  # noqa: E402
from tileplan.graph.torch import (from_module, import_exported, import_module,  # noqa: E402
                                  load_python_factory)


class Mlp(nn.Module):
    def __init__(self, d=16, hidden=32, approximate="tanh"):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, hidden), nn.Linear(hidden, d)
        self.approximate = approximate

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate=self.approximate))


class ResidualHalf(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8, bias=False)

    def forward(self, x):
        return x + self.fc(x).half().float()


def evaluate(graph: Graph, params: dict, inputs: dict) -> dict:
    """A float64 numpy reading of the graph's semantics (enough to check an import)."""
    env = {k: np.asarray(v, np.float64) for k, v in {**params, **inputs}.items()}
    erf = np.vectorize(math.erf)
    for op in graph.ops:
        ins = [env[i] for i in op.inputs]
        if isinstance(op, MatMul):
            a, b = ins
            a = np.swapaxes(a, -1, -2) if op.transpose_a else a
            b = np.swapaxes(b, -1, -2) if op.transpose_b else b
            env[op.output] = a @ b
        elif isinstance(op, Add):
            env[op.output] = ins[0] + ins[1]
        elif isinstance(op, GeLU):
            x = ins[0]
            env[op.output] = (0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))))\
                if op.approximate == "tanh" else 0.5 * x * (1 + erf(x / math.sqrt(2)))
        elif isinstance(op, Cast):
            env[op.output] = ins[0].astype(graph.tensors[op.output].dtype.numpy).astype(np.float64)
    return env


def test_linear_gelu_tanh_linear_imports_as_matmuls_with_transposed_weights():
    torch.manual_seed(0)
    module = Mlp()
    x = torch.randn(2, 5, 16)
    model = import_module(module, (x,))
    g = model.graph
    assert g.name == "Mlp"
    assert [op.kind for op in g.ops] == ["matmul", "add", "gelu", "matmul", "add"]
    assert g.ops[0] == MatMul("linear", ("x", "fc1.weight"), "linear.matmul", transpose_b=True)
    assert g.ops[1] == Add("linear.bias", ("linear.matmul", "fc1.bias"), "linear")
    assert g.ops[2] == GeLU("gelu", ("linear",), "gelu", approximate="tanh")
    assert g.tensors["x"].role is Role.INPUT and g.tensors["x"].shape == (2, 5, 16)
    assert g.tensors["fc1.weight"].role is Role.PARAMETER and g.tensors["fc1.weight"].shape == (32, 16)
    (out,) = g.by_role(Role.OUTPUT)
    assert out.shape == (2, 5, 16) and out.dtype is DType.FP32
    for key, value in module.state_dict().items():
        np.testing.assert_array_equal(model.params[key], value.numpy())
    got = evaluate(g, model.params, {"x": x.numpy()})[out.name]
    np.testing.assert_allclose(got, module(x).detach().numpy(), rtol=1e-5, atol=1e-5)


def test_decomposed_program_folds_permute_and_views_into_the_same_ops():
    torch.manual_seed(1)
    module = Mlp(approximate="none").eval()
    x = torch.randn(3, 4, 16)
    program = torch.export.export(module, (x,)).run_decompositions()
    model = import_exported(program, name="decomposed")
    g = model.graph
    assert [op.kind for op in g.ops] == ["matmul", "add", "gelu", "matmul", "add"]
    mm = g.ops[0]
    assert mm.inputs == ("x", "fc1.weight") and mm.transpose_b and not mm.transpose_a
    assert g.ops[2].approximate == "erf"
    (out,) = g.by_role(Role.OUTPUT)
    assert out.shape == (3, 4, 16)       # the dropped views keep the leading dimensions
    got = evaluate(g, model.params, {"x": x.numpy()})[out.name]
    np.testing.assert_allclose(got, module(x).detach().numpy(), rtol=1e-5, atol=1e-5)


def test_residual_add_and_half_casts():
    g = from_module(ResidualHalf(), (torch.randn(4, 8),))
    assert [op.kind for op in g.ops] == ["matmul", "cast", "cast", "add"]
    casts = [op for op in g.ops if isinstance(op, Cast)]
    assert [g.tensors[c.output].dtype for c in casts] == [DType.FP16, DType.FP32]
    residual = g.ops[-1]
    assert residual.inputs[0] == "x" and g.tensors[residual.output].role is Role.OUTPUT


def test_fp16_module_keeps_fp16_tensors():
    g = from_module(Mlp().half(), (torch.randn(4, 16, dtype=torch.float16),))
    assert {t.dtype for t in g.tensors.values()} == {DType.FP16}


def test_batched_matmul_of_two_activations():
    class Bmm(nn.Module):
        def forward(self, a, b):
            return torch.matmul(a, b.transpose(-1, -2))

    g = from_module(Bmm(), (torch.randn(2, 6, 4), torch.randn(2, 5, 4)))
    assert g.ops == [MatMul("matmul", ("a", "b"), "matmul", transpose_b=True)]
    assert g.tensors["matmul"].shape == (2, 6, 5)


def test_every_unsupported_aten_node_is_reported_in_one_error():
    class Soft(nn.Module):
        def forward(self, x):
            return torch.abs(torch.floor(x)) + torch.floor(x * 2)

    with pytest.raises(TileplanError) as err:
        from_module(Soft(), (torch.randn(2, 3),))
    msg = str(err.value)
    assert msg.startswith("3 unsupported nodes: aten.floor.default (2: floor, floor_1), aten.abs.default (1: abs_1)")
    assert "tileplan imports aten " in msg


def test_adding_a_python_number_makes_a_one_element_parameter_in_the_graph_dtype():
    class AddOne(nn.Module):
        def forward(self, x):
            return x + 1.0

    model = import_module(AddOne(), (torch.randn(2, 3, dtype=torch.float16),))
    g = model.graph
    assert [op.describe() for op in g.ops] == ["add add(x, add.scalar1) -> add"]
    assert g.tensors["add.scalar1"].shape == (1,) and g.tensors["add.scalar1"].dtype is DType.FP16
    assert model.params["add.scalar1"].dtype == np.float16 and model.params["add.scalar1"][0] == 1.0


class Pointwise(nn.Module):
    """Every pointwise ATen row: sub/mul/div with tensors and numbers, alpha, unary ops, pow, silu."""

    def forward(self, x, y):
        a = torch.sub(x, y, alpha=2.0) * 0.5 + torch.div(y, 4.0)
        b = torch.sqrt(torch.exp(-a)) + torch.rsqrt(torch.sigmoid(a)) + torch.reciprocal(y * y + 1.0)
        c = torch.tanh(b) - torch.erf(b) / 3 + torch.pow(a, 2) + a ** 3
        return F.silu(c) - torch.neg(x)


def test_every_pointwise_aten_row_imports_and_computes_what_torch_computes():
    torch.manual_seed(2)
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    model = import_module(Pointwise(), (x, y))
    g = model.graph
    kinds = {op.kind for op in g.ops}
    assert kinds == {"sub", "mul", "add", "div", "neg", "exp", "sqrt", "sigmoid", "reciprocal", "tanh", "erf"}
    assert "gelu" not in kinds
    from tileplan.sim.reference import reference
    (out,) = g.by_role(Role.OUTPUT)
    got = reference(g, {**model.params, "x": x.numpy(), "y": y.numpy()})[out.name]
    np.testing.assert_allclose(got, Pointwise()(x, y).numpy(), rtol=1e-5, atol=1e-5)


def test_silu_is_a_sigmoid_and_a_mul_of_its_input():
    g = from_module(nn.SiLU(), (torch.randn(2, 8),))
    assert [op.describe() for op in g.ops] == ["sigmoid silu.sigmoid(input) -> silu.sigmoid",
                                               "mul silu(input, silu.sigmoid) -> silu"]


def test_pow_with_another_exponent_is_refused_naming_the_node():
    class Pow4(nn.Module):
        def forward(self, x):
            return x ** 4

    with pytest.raises(TileplanError, match=r"node 'pow_1' \(aten\.pow\.Tensor_Scalar\): exponent 4"):
        from_module(Pow4(), (torch.randn(2, 3),))


class NewGelu(nn.Module):
    """Hugging Face's gelu_new, written out as it is in transformers.activations."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def test_gelu_new_written_out_folds_into_one_tanh_gelu():
    model = import_module(NewGelu(), (torch.randn(4, 8),))
    assert [op.describe() for op in model.graph.ops] == ["gelu mul_3(x) -> mul_3"]
    assert model.graph.ops[0].approximate == "tanh" and model.params == {}


def test_quick_gelu_stays_a_mul_a_sigmoid_and_a_mul():
    class QuickGelu(nn.Module):
        def forward(self, x):
            return x * torch.sigmoid(1.702 * x)

    g = from_module(QuickGelu(), (torch.randn(4, 8),))
    assert [op.kind for op in g.ops] == ["mul", "sigmoid", "mul"]


def test_arithmetic_on_an_integer_input_is_refused_naming_the_op_and_the_tensor():
    """An integer input is an INT32 graph input (token ids, a mask); only a Gather or a Cast reads it."""
    class Inc(nn.Module):
        def forward(self, x):
            return x + x

    with pytest.raises(TileplanError, match=r"op 'add' \(add\): add takes fp16 or fp32 operands, 'x' is int32 "
                                            r"\(cast first\)"):
        from_module(Inc(), (torch.arange(6).reshape(2, 3),))


def test_bf16_module_is_refused_naming_the_cast_bf16_option():
    with pytest.raises(TileplanError, match=r"tensor 'fc1.weight' is bfloat16; .*--cast-bf16 fp16"):
        from_module(Mlp().to(torch.bfloat16), (torch.randn(4, 16, dtype=torch.bfloat16),))


def test_cast_bf16_fp16_converts_a_bf16_module_and_records_it():
    module = Mlp().to(torch.bfloat16)
    model = import_module(module, (torch.randn(4, 16, dtype=torch.bfloat16),), cast_bf16="fp16")
    g = model.graph
    assert {t.dtype for t in g.tensors.values()} == {DType.FP16}
    assert g.imported == {"cast_bf16": "fp16", "converted_bf16_tensors": 5}
    np.testing.assert_array_equal(model.params["fc1.weight"], module.fc1.weight.detach().to(torch.float16).numpy())


def test_load_python_factory_imports_the_module_the_file_makes(tmp_path):
    path = tmp_path / "tiny_mlp.py"
    path.write_text(
        "import torch\n"
        "def factory():\n"
        "    m = torch.nn.Sequential(torch.nn.Linear(8, 12), torch.nn.GELU(), torch.nn.Linear(12, 8))\n"
        "    return m, (torch.randn(3, 8),)\n")
    model = load_python_factory(f"{path}:factory")
    assert model.graph.name == "tiny_mlp"
    assert [op.kind for op in model.graph.ops] == ["matmul", "add", "gelu", "matmul", "add"]
    assert set(model.params) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    from tileplan.graph.loaders import load_model
    assert load_model(f"{path}:factory").ops == model.graph.ops
    with pytest.raises(TileplanError, match=rf"^{path}: has no function 'missing'"):
        load_python_factory(f"{path}:missing")
    with pytest.raises(TileplanError, match="path/to/model.py:factory"):
        load_python_factory(str(path))


def test_a_torch_factory_runs_once_per_command(tmp_path, cli):
    calls = tmp_path / "calls.txt"
    path = tmp_path / "counted.py"
    path.write_text(
        "import torch\n"
        "def factory():\n"
        f"    open({str(calls)!r}, 'a').write('called\\n')\n"
        "    torch.manual_seed(0)\n"
        "    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.SiLU(), torch.nn.Linear(16, 8))\n"
        "    return m, (torch.randn(4, 8),)\n")
    code, out, err = cli("compile", f"{path}:factory", "-t", "ipu21-64", "-o", tmp_path / "pkg", "-j", "1")
    assert code == 0, err
    assert calls.read_text().count("called") == 1
    code, out, err = cli("validate", tmp_path / "pkg")
    assert code == 0, out + err
    cli("show", f"{path}:factory", "-t", "ipu21-64")
    assert calls.read_text().count("called") == 2


class HeadSplit(nn.Module):
    """Attention's head split and merge: view, permute keeping the last axis, a full reverse, unsqueeze."""

    def forward(self, x):
        b, t, c = x.shape
        h = x.view(b, t, 4, c // 4).permute(0, 2, 1, 3)          # [B, H, T, D]
        r = h.permute(3, 2, 1, 0)                                  # any permutation
        return torch.sigmoid(r).unsqueeze(0)


def test_views_and_permutes_import_as_reshape_and_transpose_ops_and_validate(tmp_path):
    from tileplan.lowering.compile import compile_model
    from tileplan.lowering.package import load_package
    from tileplan.sim.validate import validate_package
    from tileplan.target import load_target

    torch.manual_seed(3)
    x = torch.randn(2, 6, 16)
    model = import_module(HeadSplit(), (x,))
    g = model.graph
    assert [op.kind for op in g.ops] == ["reshape", "transpose", "transpose", "transpose", "transpose",
                                         "sigmoid", "reshape"]
    (out,) = g.by_role(Role.OUTPUT)
    assert out.shape == (1, 4, 6, 4, 2)
    _, _, path = compile_model(g, load_target("ipu21-64"), tmp_path / "pkg", params=model.params, jobs=1)
    np.savez(tmp_path / "in.npz", x=x.numpy())
    np.savez(tmp_path / "want.npz", **{out.name: HeadSplit()(x).numpy()})
    v = validate_package(load_package(path), inputs_path=tmp_path / "in.npz", expected_path=tmp_path / "want.npz")
    assert v.passed, v.outputs


def test_dropout_in_training_mode_is_refused_naming_the_node():
    class Drop(nn.Module):
        def forward(self, x):
            return F.dropout(x, 0.5, training=True)

    with pytest.raises(TileplanError, match=r"node 'dropout' \(aten\.dropout\.default\): train=True"):
        from_module(Drop(), (torch.randn(2, 3),))


def test_addmm_alpha_and_beta_are_muls_by_one_element_parameters():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.w, self.b = nn.Parameter(torch.randn(8, 6)), nn.Parameter(torch.randn(6))

        def forward(self, x):
            return torch.addmm(self.b, x, self.w, beta=0.5, alpha=2.0)

    torch.manual_seed(4)
    x = torch.randn(4, 8)
    module = Scaled()
    model = import_module(module, (x,))
    assert [op.kind for op in model.graph.ops] == ["matmul", "mul", "mul", "add"]
    assert model.params["addmm.alpha"].tolist() == [2.0] and model.params["addmm.beta"].tolist() == [0.5]
    from tileplan.sim.reference import reference
    got = reference(model.graph, {**model.params, "x": x.numpy()})["addmm"]
    np.testing.assert_allclose(got, module(x).detach().numpy(), rtol=1e-5, atol=1e-5)


class RowwiseBlock(nn.Module):
    """LayerNorm, softmax over a middle axis, and reductions with and without keepdim."""

    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(16)

    def forward(self, x):
        h = torch.softmax(self.ln(x), dim=1)
        centred = h - h.mean(dim=-1, keepdim=True) + h.sum(dim=(0, 1))        # a column, then a row
        return centred - torch.amax(centred, dim=-1, keepdim=True)


def test_layer_norm_softmax_and_reductions_import_and_validate_against_torch(tmp_path):
    from tileplan.lowering.compile import compile_model
    from tileplan.lowering.package import load_package
    from tileplan.sim.validate import validate_package
    from tileplan.target import load_target

    torch.manual_seed(5)
    x = torch.randn(2, 6, 16)
    module = RowwiseBlock().eval()
    with torch.no_grad():
        module.ln.weight.normal_()
        want = module(x).numpy()
    model = import_module(module, (x,))
    kinds = {op.kind for op in model.graph.ops}
    assert {"layernorm", "softmax", "reducemean", "reducesum", "reducemax"} <= kinds
    (out,) = model.graph.by_role(Role.OUTPUT)
    _, _, path = compile_model(model.graph, load_target("ipu21-64"), tmp_path / "pkg", params=model.params, jobs=1)
    np.savez(tmp_path / "in.npz", x=x.numpy())
    np.savez(tmp_path / "want.npz", **{out.name: want.reshape(out.shape)})
    v = validate_package(load_package(path), inputs_path=tmp_path / "in.npz", expected_path=tmp_path / "want.npz")
    assert v.passed, v.outputs


class Scores(nn.Module):
    """Attention probabilities with the 1/sqrt(d) where the two common writers put it: on the
    scores (HF eager attention, ``matmul(q, k^T) * scaling``) or on q first (timm's Attention)."""

    def __init__(self, on_q: bool):
        super().__init__()
        self.on_q, self.scaling = on_q, 8 ** -0.5

    def forward(self, q, k):
        if self.on_q:
            return (q * self.scaling @ k.transpose(-2, -1)).softmax(dim=-1)
        return torch.softmax(torch.matmul(q, k.transpose(2, 3)) * self.scaling, dim=-1, dtype=torch.float32)


@pytest.mark.parametrize("on_q", [False, True], ids=["on the scores", "on q"])
def test_attention_s_scale_folds_into_the_softmax_and_the_graph_computes_what_torch_does(on_q):
    torch.manual_seed(6)
    q, k = torch.randn(2, 3, 5, 8) * 3, torch.randn(2, 3, 5, 8) * 3
    module = Scores(on_q).eval()
    model = import_module(module, (q, k))
    assert [op.kind for op in model.graph.ops] == ["matmul", "softmax"]
    (sm,) = [op for op in model.graph.ops if op.kind == "softmax"]
    assert sm.softmax_scale == float(np.float32(8 ** -0.5))
    assert not any(t.role is Role.PARAMETER for t in model.graph.tensors.values()) and model.params == {}
    from tileplan.sim.reference import reference
    (out,) = model.graph.by_role(Role.OUTPUT)
    got = reference(model.graph, {"q": q.numpy(), "k": k.numpy()})[out.name]
    with torch.no_grad():
        np.testing.assert_allclose(got, module(q, k).numpy(), rtol=1e-5, atol=1e-6)


class Qdq(nn.Module):
    """``x.to(f8).half() @ (w8.half() * 2**s)^T``: an FP8 GEMM in the quantise-dequantise form,
    and the ways it can fall short of one."""

    def __init__(self, scale=0, also=False, dequant=torch.float16, x8=True):
        super().__init__()
        torch.manual_seed(3)
        self.register_buffer("w8", (torch.randn(8, 16) * 0.3).to(torch.float8_e4m3fnuz))
        self.scale, self.also, self.dequant, self.x8 = scale, also, dequant, x8

    def forward(self, x):
        w = self.w8.to(self.dequant)
        w = w * 2.0 ** self.scale if self.scale else w
        a = x.to(torch.float8_e4m3fnuz).to(self.dequant) if self.x8 else x.to(self.dequant)
        y = F.linear(a, w)
        return (y + w.sum(dim=1)) if self.also else y.half()


def _fp8_matmuls(graph):
    return [op for op in graph.ops if isinstance(op, MatMul)
            and all(graph.tensors[t].dtype is DType.FP8 for t in op.inputs)]


@pytest.mark.parametrize("scale", [0, -2])
def test_a_quantise_dequantise_gemm_imports_as_an_fp8_matmul_with_the_weight_s_scale(scale):
    x = torch.randn(2, 4, 16).half()
    module = Qdq(scale).eval()
    model = import_module(module, (x,))
    (mm,) = _fp8_matmuls(model.graph)
    w = model.graph.tensors[mm.inputs[1]]
    assert (w.role, w.scale) == (Role.PARAMETER, scale)
    assert [op.kind for op in model.graph.ops] == ["cast", "matmul"]      # the dequantising casts are gone
    assert model.graph.tensors[mm.output].dtype is DType.FP16
    # the graph computes what torch does: q * 2**scale is the weight the product reads
    got = evaluate(model.graph, model.params, {"x": x.numpy()})[mm.output]
    with torch.no_grad():
        want = module(x).double().numpy()
    np.testing.assert_allclose(got * 2.0 ** scale, want, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("case", ["dequantised weight read elsewhere", "fp32 product", "fp16 input"])
def test_a_dequantised_gemm_that_is_not_an_fp8_gemm_stays_as_written(case):
    module = {"dequantised weight read elsewhere": Qdq(also=True), "fp32 product": Qdq(dequant=torch.float32),
              "fp16 input": Qdq(x8=False)}[case].eval()
    model = import_module(module, (torch.randn(2, 4, 16).half(),))
    assert not _fp8_matmuls(model.graph)
    (mm,) = [op for op in model.graph.ops if isinstance(op, MatMul)]
    producer = {op.output: op for op in model.graph.ops}
    weight = producer[mm.inputs[1]]          # the FP8 weight still dequantised by its Cast
    assert isinstance(weight, Cast) and model.graph.tensors[weight.inputs[0]].dtype is DType.FP8
    assert model.graph.tensors[mm.inputs[1]].dtype is not DType.FP8


class Fp32Softmax(nn.Module):
    """HF eager attention's softmax: the FP16 scores up to FP32, softmax, back to FP16."""

    def __init__(self, back=True):
        super().__init__()
        self.back = back

    def forward(self, s):
        p = torch.softmax(s, dim=-1, dtype=torch.float32)
        return p.to(s.dtype) if self.back else p


def test_an_fp32_softmax_island_between_fp16_casts_imports_as_one_fp16_softmax():
    s = (torch.randn(2, 3, 5, 7) * 3).half()
    model = import_module(Fp32Softmax().eval(), (s,))
    (op,) = model.graph.ops
    assert op.kind == "softmax" and model.graph.tensors[op.inputs[0]].dtype is DType.FP16
    out = model.graph.tensors[op.output]
    assert out.dtype is DType.FP16 and out.role is Role.OUTPUT
    got = op.reference(s.double().numpy()).astype(np.float16)
    with torch.no_grad():
        want = Fp32Softmax()(s).numpy()
    assert np.abs(got.astype(np.float32) - want.astype(np.float32)).max() <= 2 ** -11   # one ulp at most
    # an FP32 result is what the module computes: the island stays
    kinds = [op.kind for op in import_module(Fp32Softmax(back=False).eval(), (s,)).graph.ops]
    assert kinds == ["cast", "softmax"]
