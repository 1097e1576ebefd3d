"""Fused QKV projections as exporters write them: ONNX's one MatMul followed by a Split, torch's
``qkv(x).chunk(3, -1)`` (CLIP/ViT style) and timm's ``reshape(B, T, 3, H, D).permute(...).unbind(0)``.
Each imports as Slices, compiles onto ipu21-64 and validates against the exporter's own outputs."""

from __future__ import annotations

import numpy as np
import pytest

from tileplan.graph.core import Role
from tileplan.lowering.compile import compile_model
from tileplan.lowering.package import load_package
from tileplan.sim.validate import validate_package
from tileplan.target import load_target

TARGET = load_target("ipu21-64")


def _validate(graph, params, inputs: dict, want: np.ndarray, tmp_path):
    _, _, path = compile_model(graph, TARGET, tmp_path / "pkg", params=params, jobs=1)
    (out,) = graph.by_role(Role.OUTPUT)
    np.savez(tmp_path / "inputs.npz", **inputs)
    np.savez(tmp_path / "expected.npz", **{out.name: want.reshape(out.shape)})
    v = validate_package(load_package(path), inputs_path=tmp_path / "inputs.npz",
                         expected_path=tmp_path / "expected.npz")
    assert v.passed, v.outputs
    assert v.outputs[out.name]["cosine"] > 0.9999
    return v


def onnx_attention(B=2, T=10, C=32, H=4, seed=0):
    """LayerNorm, one QKV MatMul [C, 3C] + bias, Split into q, k and v, heads, softmax(q k^T / sqrt(d)) v."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(seed)
    D = C // H
    inits = {"g": rng.uniform(0.5, 1.5, C), "b": rng.normal(0, 0.1, C), "w": rng.normal(0, C ** -0.5, (C, 3 * C)),
             "wb": rng.normal(0, 0.1, 3 * C), "split": np.array([C, C, C], np.int64),
             "heads": np.array([B, T, H, D], np.int64), "merged": np.array([B, T, C], np.int64),
             "scale": np.array(D ** -0.5)}
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["n"], axis=-1, epsilon=1e-5),
             helper.make_node("MatMul", ["n", "w"], ["qkv0"]), helper.make_node("Add", ["qkv0", "wb"], ["qkv"]),
             helper.make_node("Split", ["qkv", "split"], ["q", "k", "v"], axis=-1)]
    for t in "qkv":
        nodes += [helper.make_node("Reshape", [t, "heads"], [f"{t}4"]),
                  helper.make_node("Transpose", [f"{t}4"], [f"{t}h"], perm=[0, 2, 1, 3])]
    nodes += [helper.make_node("Transpose", ["kh"], ["kt"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["qh", "kt"], ["s0"]), helper.make_node("Mul", ["s0", "scale"], ["s"]),
              helper.make_node("Softmax", ["s"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "vh"], ["o4"]),
              helper.make_node("Transpose", ["o4"], ["o"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["o", "merged"], ["y"])]
    graph = helper.make_graph(
        nodes, "fused_qkv_attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, T, C])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, T, C])],
        [numpy_helper.from_array(v if v.dtype == np.int64 else v.astype(np.float32), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    return onnx.shape_inference.infer_shapes(model)


def test_an_onnx_fused_qkv_matmul_and_split_imports_as_slices_and_validates_against_onnx(tmp_path):
    from onnx.reference import ReferenceEvaluator
    from tileplan.graph.onnx import import_onnx
    model = onnx_attention()
    x = np.random.default_rng(1).normal(0, 1, (2, 10, 32)).astype(np.float32)
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    imported = import_onnx(model)
    kinds = [op.kind for op in imported.graph.ops]
    assert kinds.count("matmul") == 3 and kinds.count("slice") == 3      # one projection GEMM, three slices
    _validate(imported.graph, imported.params, {"x": x}, want, tmp_path)


torch = pytest.importorskip("torch")


class FusedAttention(torch.nn.Module):
    """One ``qkv`` Linear of 3C columns, split by ``chunk`` or, timm's way, by ``unbind``."""

    def __init__(self, style: str, C: int = 32, H: int = 4):
        super().__init__()
        self.qkv, self.proj, self.H, self.style = torch.nn.Linear(C, 3 * C), torch.nn.Linear(C, C), H, style

    def forward(self, x):
        B, T, C = x.shape
        H, D = self.H, C // self.H
        if self.style == "chunk":
            q, k, v = (t.reshape(B, T, H, D).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        else:
            q, k, v = self.qkv(x).reshape(B, T, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)
        a = ((q @ k.transpose(-2, -1)) * D ** -0.5).softmax(dim=-1)
        return self.proj((a @ v).transpose(1, 2).reshape(B, T, C))


@pytest.mark.parametrize("style", ["chunk", "unbind"])
def test_a_torch_fused_qkv_split_imports_as_slices_and_validates_against_torch(style, tmp_path):
    from tileplan.graph.torch import import_module
    torch.manual_seed(0)
    module = FusedAttention(style).eval()
    x = torch.randn(2, 10, 32)
    imported = import_module(module, (x,))
    kinds = [op.kind for op in imported.graph.ops]
    assert kinds.count("slice") == 3, kinds
    with torch.no_grad():
        want = module(x).numpy()
    (inp,) = imported.graph.by_role(Role.INPUT)
    _validate(imported.graph, imported.params, {inp.name: x.numpy()}, want, tmp_path)


def test_hf_siglip_layer_with_its_projections_fused_validates_against_torch(tmp_path):
    pytest.importorskip("transformers")
    from transformers import SiglipVisionConfig
    from transformers.models.siglip.modeling_siglip import SiglipEncoderLayer
    from tileplan.graph.torch import import_module
    from tileplan.planner.qkv import fused_graph
    from tileplan.planner.rewrite import canonical

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            cfg = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4,
                                     attn_implementation="eager")
            self.layer = SiglipEncoderLayer(cfg)

        def forward(self, x):
            y = self.layer(x, None)
            return y[0] if isinstance(y, tuple) else y

    torch.manual_seed(0)
    module = Layer().eval()
    x = torch.randn(2, 10, 32)
    imported = import_module(module, (x,))
    _, (group,) = fused_graph(canonical(imported.graph))
    assert len(group.members) == 3 and group.axis == -2        # torch Linear weights are [out, in]: rows join
    p, _, path = compile_model(imported.graph, TARGET, tmp_path / "pkg", params=imported.params, jobs=1, qkv="fused")
    assert p.qkv["chosen"] == "fused"
    with torch.no_grad():
        want = module(x).numpy()
    (inp,) = p.graph.by_role(Role.INPUT)
    (out,) = p.graph.by_role(Role.OUTPUT)
    np.savez(tmp_path / "inputs.npz", **{inp.name: x.numpy()})
    np.savez(tmp_path / "expected.npz", **{out.name: want.reshape(out.shape)})
    v = validate_package(load_package(path), inputs_path=tmp_path / "inputs.npz", expected_path=tmp_path / "expected.npz")
    assert v.passed and v.outputs[out.name]["cosine"] > 0.9999, v.outputs


class StridedTokens(torch.nn.Module):
    """Every other token and every third channel of ``tanh(x)``: ``aten.slice`` with steps."""

    def forward(self, x):
        return torch.tanh(x)[:, 1::2, ::3] * 2.0


def test_a_torch_strided_slice_imports_with_its_steps_and_validates_against_torch(tmp_path):
    from tileplan.graph.torch import import_module
    x = torch.randn(2, 11, 16)
    imported = import_module(StridedTokens(), (x,))
    steps = sorted(op.step for op in imported.graph.ops if op.kind == "slice")
    assert steps == [2, 3]
    with torch.no_grad():
        want = StridedTokens()(x).numpy()
    (inp,) = imported.graph.by_role(Role.INPUT)
    _validate(imported.graph, imported.params, {inp.name: x.numpy()}, want, tmp_path)
