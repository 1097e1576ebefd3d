"""Models users already have: ONNX files and PyTorch modules, compiled and validated end to end."""

import math
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tileplan.cli import main
from tileplan.graph.core import Role
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


def test_the_torch_factory_of_the_small_encoder_layer_compiles_and_validates_against_torch(tmp_path):
    """``fixtures/siglip_hf.py:encoder_layer_small``: HF SiglipEncoderLayer at the TOML fixture's
    shapes, through the CLI, validated against the module's own output."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    sys.path.insert(0, str(FIXTURES))
    import siglip_hf
    module, (x,) = siglip_hf.encoder_layer_small()
    graph = load_model(f"{FIXTURES / 'siglip_hf.py'}:encoder_layer_small")
    kinds = [op.kind for op in graph.ops]
    assert kinds.count("layernorm") == 2 and kinds.count("softmax") == 1
    (inp,) = graph.by_role(Role.INPUT)
    (out,) = graph.by_role(Role.OUTPUT)
    with torch.no_grad():
        want = module.float()(x.float()).numpy()
    np.savez(tmp_path / "inputs.npz", **{inp.name: x.float().numpy()})
    np.savez(tmp_path / "expected.npz", **{out.name: want.reshape(out.shape)})
    pkg = tmp_path / "pkg"
    assert run("compile", f"{FIXTURES / 'siglip_hf.py'}:encoder_layer_small", "--target", "ipu21-64", "-o", pkg) == 0
    assert run("validate", pkg, "--inputs", tmp_path / "inputs.npz", "--expected", tmp_path / "expected.npz") == 0

