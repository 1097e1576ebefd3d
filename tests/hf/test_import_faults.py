"""Imports that whole models met on the way, each a small module compiled onto ipu21-64 and
validated on the IPU model against torch's own output (through torch.export, and through the
ONNX export where the ONNX importer reads the construct on its own):

- a view tileplan drops (the last dimension kept) before a graph output comes back as a Reshape
  with a name of its own, not the name of the op before it;
- a MatMul of an activation with a transposed view tileplan dropped, and ``nn.MultiheadAttention``
  with a learned probe as its query (the query projection reads parameters only and is computed
  at import: a batched parameter against the keys' view), plan;
- a pointwise op whose operand repeats over a middle axis (``[1, 4, 16, 16]`` with
  ``[1, 4, 1, 16]``, either operand order, a parameter or an activation) plans as a row broadcast
  between Transposes.
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402

from tileplan.graph.core import Role  # noqa: E402
from tileplan.graph.onnx import import_onnx  # noqa: E402
from tileplan.graph.torch import import_module  # noqa: E402
from tileplan.lowering.compile import compile_model  # noqa: E402
from tileplan.lowering.package import load_package  # noqa: E402
from tileplan.sim.validate import validate_package  # noqa: E402
from tileplan.target import load_target  # noqa: E402
from torch_validate import compile_and_validate  # noqa: E402


class TanhOfView(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x):
        return torch.tanh(self.lin(x).reshape(-1, 16))


def test_a_dropped_view_before_the_output_is_a_reshape_named_apart(tmp_path):
    module = TanhOfView().eval()
    x = torch.randn(2, 4, 16)
    model = import_module(module, (x,))
    names = [op.name for op in model.graph.ops]
    assert len(names) == len(set(names))
    (out,) = model.graph.by_role(Role.OUTPUT)
    assert out.shape == (8, 16) and model.graph.ops[-1].kind == "reshape"
    compile_and_validate(model, module, x, tmp_path)


class ProductWithDroppedView(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x, y):
        keys = self.lin(x).reshape(-1, 16)          # [8, 16]: tileplan keeps [2, 4, 16] until needed
        return self.lin(y) @ keys.t()


def test_a_matmul_with_a_transposed_dropped_view_plans(tmp_path):
    module = ProductWithDroppedView().eval()
    x, y = torch.randn(2, 4, 16), torch.randn(3, 16)
    model = import_module(module, (x, y))
    (mm,) = [op for op in model.graph.ops if op.name == "matmul"]
    assert model.graph.tensors[mm.inputs[1]].shape == (8, 16) and mm.transpose_b
    _, _, path = compile_model(model.graph, load_target("ipu21-64"), tmp_path / "pkg", params=model.params, jobs=1)
    xs = {t.name: v for t, v in zip(model.graph.by_role(Role.INPUT), (x, y))}
    np.savez(tmp_path / "in.npz", **{k: v.numpy() for k, v in xs.items()})
    (out,) = model.graph.by_role(Role.OUTPUT)
    with torch.no_grad():
        np.savez(tmp_path / "want.npz", **{out.name: module(x, y).numpy()})
    v = validate_package(load_package(path), inputs_path=tmp_path / "in.npz", expected_path=tmp_path / "want.npz")
    assert v.passed, v.outputs


class ProbeAttention(torch.nn.Module):
    """SigLIP's MAP head's attention: a learned probe repeated over the batch queries the tokens."""

    def __init__(self, batch_first: bool):
        super().__init__()
        self.batch_first = batch_first
        self.probe = torch.nn.Parameter(torch.randn(1, 1, 16))
        self.attn = torch.nn.MultiheadAttention(16, 4, batch_first=batch_first)

    def forward(self, x):
        probe = self.probe.repeat(x.shape[0], 1, 1) if self.batch_first else self.probe.repeat(1, x.shape[1], 1)
        return self.attn(probe, x, x)[0]


@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_with_a_probe_query_plans(batch_first, tmp_path):
    module = ProbeAttention(batch_first).eval()
    x = torch.randn(2, 8, 16) if batch_first else torch.randn(8, 2, 16)
    model = import_module(module, (x,))
    assert [op.kind for op in model.graph.ops].count("softmax") == 1
    compile_and_validate(model, module, x, tmp_path)


class MiddleBroadcast(torch.nn.Module):
    """``x op p`` with ``p`` repeating over axis 2 of ``x``: a parameter, or an activation."""

    def __init__(self, kind: str, first: bool):
        super().__init__()
        self.kind, self.first = kind, first
        self.p = torch.nn.Parameter(torch.randn(1, 4, 1, 16))
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x):
        p = self.p if self.kind == "parameter" else self.lin(x.mean(dim=2, keepdim=True))
        return (p - x) if self.first else (x - p)


@pytest.mark.parametrize("kind,first", [("parameter", False), ("activation", True)])
def test_a_middle_axis_broadcast_plans_through_torch_export(kind, first, tmp_path):
    module = MiddleBroadcast(kind, first).eval()
    x = torch.randn(1, 4, 16, 16)
    model = import_module(module, (x,))
    compile_and_validate(model, module, x, tmp_path)


def test_a_middle_axis_broadcast_plans_through_onnx(tmp_path):
    pytest.importorskip("onnx")
    module = MiddleBroadcast("parameter", True).eval()
    x = torch.randn(1, 4, 16, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (x,), str(tmp_path / "m.onnx"), dynamo=False, opset_version=17,
                          input_names=["x"], output_names=["y"])
    model = import_onnx(tmp_path / "m.onnx")
    assert [op.kind for op in model.graph.ops] == ["sub"]            # the rewrite is the planner's
    compile_and_validate(model, module, x, tmp_path)
