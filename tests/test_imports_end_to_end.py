"""Models users already have: ONNX files and PyTorch modules, compiled and validated end to end."""

import copy
import math
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tileplan.cli import main
from tileplan.graph.core import Role
from tileplan.graph.dtypes import DType
from tileplan.graph.loaders import load_model
from tileplan.planner.plan import plan
from tileplan.planner.planjson import plan_to_json
from tileplan.target import load_target

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def run(*argv) -> int:
    try:
        main([str(a) for a in argv])
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def chosen(graph, target):
    data = plan_to_json(plan(graph, target))
    return [(op["name"], op["candidate"]) for op in data["ops"]], data["totals"]["cycles"]


@pytest.mark.parametrize("fixture", ["mlp_smoke_fp8", "odd_prime_dims", "odd_fp8_tails", "odd_3d_activation",
                                     "encoder_layer_small"])
def test_the_onnx_twin_of_a_fixture_plans_to_the_same_plan_as_the_toml_original(fixture):
    toml = load_model(FIXTURES / f"{fixture}.toml")
    twin = load_model(FIXTURES / f"{fixture}.onnx")
    target = load_target(toml.target)
    assert chosen(twin, target) == chosen(toml, target)


def test_the_onnx_smoke_model_compiles_validates_and_reports(tmp_path):
    pkg = tmp_path / "o"
    assert run("compile", FIXTURES / "mlp_smoke_fp8.onnx", "-o", pkg) == 0
    assert run("validate", pkg) == 0
    assert run("report", pkg) == 0
    assert (pkg / "report.html").is_file() and (pkg / "params.npz").is_file()


def gelu_erf(x):
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def test_an_onnx_model_with_batched_matmul_gemm_and_erf_gelu_validates_against_numpy(tmp_path):
    # onnx_mixed: y = a @ c  +  gelu_erf(x @ fc.weight^T + fc.bias)   (the GeLU is an exporter's subgraph)
    model = onnx.load(FIXTURES / "onnx_mixed.onnx")
    w = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in model.graph.initializer}
    rng = np.random.default_rng(7)
    inputs = {"x": rng.normal(0, 0.5, (16, 32)), "a": rng.normal(0, 0.5, (4, 16, 8)),
              "c": rng.normal(0, 0.5, (4, 8, 64))}
    inputs = {k: v.astype(np.float32) for k, v in inputs.items()}
    x, a, c = (inputs[k].astype(np.float64) for k in ("x", "a", "c"))
    y = a @ c + gelu_erf(x @ w["fc.weight"].T + w["fc.bias"])
    np.savez(tmp_path / "in.npz", **inputs)
    np.savez(tmp_path / "want.npz", y=y)
    np.savez(tmp_path / "wrong.npz", y=y + 0.01)
    pkg = tmp_path / "mixed"
    assert run("compile", FIXTURES / "onnx_mixed.onnx", "--target", "ipu21-64", "-o", pkg) == 0
    assert run("validate", pkg, "--inputs", tmp_path / "in.npz", "--expected", tmp_path / "want.npz") == 0
    assert run("validate", pkg, "--inputs", tmp_path / "in.npz", "--expected", tmp_path / "wrong.npz") == 1


MODULE = '''
import torch

class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.act = torch.nn.GELU(approximate="tanh")
        self.fc2 = torch.nn.Linear(64, 32)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))

def factory():
    torch.manual_seed(0)
    return MLP(), (torch.randn(16, 32),)
'''


def test_a_torch_linear_gelu_linear_module_compiles_and_validates_against_torch(tmp_path):
    torch = pytest.importorskip("torch")
    path = tmp_path / "mlp.py"
    path.write_text(MODULE)
    spec = f"{path}:factory"
    pkg = tmp_path / "torch_pkg"
    assert run("compile", spec, "--target", "ipu21-64", "-o", pkg) == 0
    assert run("validate", pkg) == 0
    sys.path.insert(0, str(tmp_path))
    try:
        import mlp
        module, (x,) = mlp.factory()
    finally:
        sys.path.remove(str(tmp_path))
    with torch.no_grad():
        want = module(x).double().numpy()
    graph = load_model(spec)
    (inp,) = [t.name for t in graph.by_role(Role.INPUT)]
    (out,) = [t.name for t in graph.by_role(Role.OUTPUT)]
    np.savez(tmp_path / "in.npz", **{inp: x.numpy()})
    np.savez(tmp_path / "want.npz", **{out: want})
    assert run("validate", pkg, "--inputs", tmp_path / "in.npz", "--expected", tmp_path / "want.npz") == 0


@pytest.mark.parametrize("factory", ["encoder_layer_small", "encoder_layer_small_fp8"])
def test_the_torch_factory_of_the_small_encoder_layer_compiles_and_validates_against_torch(factory, tmp_path):
    """``fixtures/siglip_hf.py:encoder_layer_small``: HF SiglipEncoderLayer at the TOML fixture's
    shapes, through the CLI, validated against the module's own output; ``_fp8``: its Linears
    FP8 GEMMs in the quantise-dequantise form (every projection an FP8 MatMul, the MLP weights
    with their scales), validated against the same module run by torch in FP32."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    sys.path.insert(0, str(FIXTURES))
    import siglip_hf
    module, (x,) = getattr(siglip_hf, factory)()
    graph = load_model(f"{FIXTURES / 'siglip_hf.py'}:{factory}")
    kinds = [op.kind for op in graph.ops]
    assert kinds.count("layernorm") == 2 and kinds.count("softmax") == 1
    fp8 = sorted(graph.tensors[op.inputs[1]].scale for op in graph.ops if op.kind == "matmul"
                 and all(graph.tensors[t].dtype is DType.FP8 for t in op.inputs))
    assert fp8 == ([-1, 0, 0, 0, 0, 1] if factory.endswith("fp8") else [])
    (inp,) = graph.by_role(Role.INPUT)
    (out,) = graph.by_role(Role.OUTPUT)
    with torch.no_grad():
        want = copy.deepcopy(module).float()(x.float()).numpy()
    np.savez(tmp_path / "inputs.npz", **{inp.name: x.float().numpy()})
    np.savez(tmp_path / "expected.npz", **{out.name: want.reshape(out.shape)})
    pkg = tmp_path / "pkg"
    assert run("compile", f"{FIXTURES / 'siglip_hf.py'}:{factory}", "--target", "ipu21-64", "-o", pkg) == 0
    assert run("validate", pkg, "--inputs", tmp_path / "inputs.npz", "--expected", tmp_path / "expected.npz") == 0


def test_the_fp8_layer_s_torch_factory_has_the_toml_fixture_s_ops():
    """``siglip_hf.py:siglip_layer_fp8_b1`` and ``siglip_layer_fp8_b1.toml`` (make_encoder.py) are
    the same layer: every op with its operand types, FP8 scales and GEMM shapes (HF eager attention's
    FP32 softmax island folds into the FP16 softmax, the Linears' quantise-dequantise form into FP8
    MatMuls)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")

    def summary(graph):
        ops = Counter()
        for op in graph.ops:
            ins = [graph.tensors[t] for t in op.inputs]
            key = (op.kind, tuple((t.dtype.value, t.scale, t.role is Role.PARAMETER) for t in ins))
            ops[key + ((op.mnk(ins),) if op.kind == "matmul" else ())] += 1
        return ops

    torch_ops = summary(load_model(f"{FIXTURES / 'siglip_hf.py'}:siglip_layer_fp8_b1"))
    toml_ops = summary(load_model(FIXTURES / "siglip_layer_fp8_b1.toml"))
    assert torch_ops == toml_ops
    assert sum(n for k, n in toml_ops.items() if k[0] == "matmul" and k[1][0][0] == "fp8") == 6

