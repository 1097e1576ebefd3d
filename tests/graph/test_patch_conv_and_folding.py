"""Patch-embedding convolutions imported as a GEMM over patches, other convolutions refused naming
what differs, and values known at import folded into parameters: through torch.export and ONNX.
Each imported graph is run with tileplan's float64 reference and compared with torch's (or
numpy's) own result."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tileplan.errors import TileplanError
from tileplan.graph.core import Role
from tileplan.graph.onnx import import_onnx
from tileplan.sim.reference import reference

torch = pytest.importorskip("torch")

from tileplan.graph.torch import import_module  # noqa: E402


def run(model, **inputs) -> np.ndarray:
    """The graph's one output from tileplan's reference on ``inputs`` and its parameters."""
    (out,) = model.graph.by_role(Role.OUTPUT)
    vals = reference(model.graph, {**model.params, **inputs}, keep=[out.name])
    return vals[out.name]


class Patches(torch.nn.Module):
    """A ViT-style patch embedding: conv, then optionally flatten(2).transpose(1, 2) to tokens."""

    def __init__(self, tokens: bool, bias: bool = True, **conv):
        super().__init__()
        self.tokens = tokens
        self.conv = torch.nn.Conv2d(3, 16, bias=bias, **conv)

    def forward(self, x):
        y = self.conv(x)
        return y.flatten(2).transpose(1, 2) if self.tokens else y


@pytest.mark.parametrize("tokens", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_torch_patch_conv_is_a_gemm_over_patches_and_matches_torch(tokens, bias):
    torch.manual_seed(0)
    module = Patches(tokens, bias, kernel_size=4, stride=4).eval()
    x = torch.randn(2, 3, 16, 24)                               # NCHW, non-square
    model = import_module(module, (x,))
    kinds = [op.kind for op in model.graph.ops]
    assert kinds.count("matmul") == 1 and kinds.count("add") == (1 if bias else 0)
    if tokens:   # written straight from the GEMM: the patch gather's is the only Transpose
        assert kinds.count("transpose") == 1
    (inp,) = model.graph.by_role(Role.INPUT)
    assert inp.shape == (2, 3, 16, 24)                          # the pixel input stays [B, C, H, W]
    (w,) = [n for n in model.params if n.endswith(".patches")]
    assert model.params[w].shape == (16, 3 * 4 * 4)
    with torch.no_grad():
        want = module(x).numpy()
    got = run(model, **{inp.name: x.numpy()})
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("conv,words", [
    (dict(kernel_size=4, stride=2), ["stride [2, 2]", "kernel [4, 4]"]),
    (dict(kernel_size=4, stride=4, padding=1), ["padding [1, 1]"]),
    (dict(kernel_size=4, stride=1, padding="same"), ["stride [1, 1]"]),
])
def test_torch_other_convolutions_are_refused_naming_the_node_and_what_differs(conv, words):
    module = Patches(False, **conv)
    with pytest.raises(TileplanError) as err:
        import_module(module, (torch.randn(1, 3, 16, 16),))
    text = str(err.value)
    assert "conv" in text and all(w in text for w in words), text


def test_torch_grouped_convolution_is_refused():
    module = torch.nn.Conv2d(4, 8, kernel_size=2, stride=2, groups=2)
    with pytest.raises(TileplanError, match=r"node 'conv2d'.*groups=2"):
        import_module(module, (torch.randn(1, 4, 8, 8),))


def test_torch_dilated_patch_conv_is_refused_naming_dilation():
    module = torch.nn.Conv2d(3, 8, kernel_size=2, stride=2, dilation=1)
    module.dilation = (2, 2)
    with pytest.raises(TileplanError, match=r"dilation \[2, 2\]; tileplan imports convolutions with dilation 1"):
        import_module(module, (torch.randn(1, 3, 8, 8),))


class Positions(torch.nn.Module):
    """Embeddings added by position: an int64 ``position_ids`` buffer (read), one not read, an
    arange compared and masked with ``where``, all computed at import."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(6, 8)
        self.register_buffer("position_ids", torch.arange(6).unsqueeze(0), persistent=False)
        self.register_buffer("unused_ids", torch.arange(4), persistent=False)

    def forward(self, x):
        pos = self.table(self.position_ids)                      # [1, 6, 8]
        keep = torch.arange(6).unsqueeze(-1) < 4                 # [6, 1] bool
        masked = torch.where(keep, pos, torch.zeros_like(pos))
        return x + masked


def test_torch_folds_embedding_by_position_ids_arange_and_where_into_a_parameter():
    torch.manual_seed(0)
    module = Positions().eval()
    x = torch.randn(2, 6, 8)
    model = import_module(module, (x,))
    assert [op.kind for op in model.graph.ops] == ["add"]
    assert all(np.issubdtype(v.dtype, np.floating) for v in model.params.values())
    assert not any("ids" in t for t in model.graph.tensors)     # the int64 buffers are no tensors
    with torch.no_grad():
        want = module(x).numpy()
    np.testing.assert_allclose(run(model, x=x.numpy()), want, rtol=1e-6, atol=1e-6)


def test_torch_an_integer_value_read_by_a_computed_op_is_refused_naming_it():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("ids", torch.arange(4), persistent=False)

        def forward(self, x):
            return x + self.ids
    with pytest.raises(TileplanError, match=r"node 'add' \(aten.add.Tensor\) reads 'ids' \(int64, known at import\)"):
        import_module(M(), (torch.randn(2, 4),))


def test_torch_a_value_folded_from_a_parameter_by_an_unimported_op_becomes_a_parameter():
    """The bicubic resize of a position table (``interpolate_pos_encoding``) at the exported size."""
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Parameter(torch.randn(1, 4, 2, 2))

        def forward(self, x):
            grid = torch.nn.functional.interpolate(self.table.reshape(1, 4, 2, 2), size=(2, 3), mode="bicubic",
                                                   align_corners=False)
            return x + grid.permute(0, 2, 3, 1).reshape(1, 6, 4)
    module = M().eval()
    x = torch.randn(2, 6, 4)
    model = import_module(module, (x,))
    assert [op.kind for op in model.graph.ops] == ["add"]
    with torch.no_grad():
        want = module(x).numpy()
    np.testing.assert_allclose(run(model, x=x.numpy()), want, rtol=1e-6, atol=1e-6)


# ---- ONNX ---------------------------------------------------------------------------------

def onnx_patches(tokens: bool, *, strides=(4, 4), pads=(0, 0, 0, 0), group=1, h=16, w=24):
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((16, 3, 4, 4)).astype(np.float32)
    bias = rng.standard_normal(16).astype(np.float32)
    table = rng.standard_normal((24, 16)).astype(np.float32)
    oh, ow = h // 4, w // 4
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], name="patch", kernel_shape=[4, 4], strides=list(strides),
                              pads=list(pads), group=group)]
    inits = [numpy_helper.from_array(v, n) for n, v in (("w", weight), ("b", bias), ("table", table))]
    inits.append(numpy_helper.from_array(np.arange(oh * ow, dtype=np.int64)[None], "ids"))
    if tokens:   # the exporters' shape subgraph: Shape -> Slice -> Concat -> Reshape, then Transpose
        inits += [numpy_helper.from_array(np.array(v, np.int64), n)
                  for n, v in (("s0", [0]), ("s2", [2]), ("m1", [-1]))]
        nodes += [helper.make_node("Shape", ["y"], ["shape"]),
                  helper.make_node("Slice", ["shape", "s0", "s2"], ["bd"]),
                  helper.make_node("Concat", ["bd", "m1"], ["flat_shape"], axis=0),
                  helper.make_node("Reshape", ["y", "flat_shape"], ["flat"]),
                  helper.make_node("Transpose", ["flat"], ["tok"], perm=[0, 2, 1]),
                  helper.make_node("Gather", ["table", "ids"], ["pos"], axis=0),
                  helper.make_node("Add", ["tok", "pos"], ["out"])]
        out = ("out", TensorProto.FLOAT, [2, oh * ow, 16])
    else:
        out = ("y", TensorProto.FLOAT, [2, 16, oh, ow])
    graph = helper.make_graph(nodes, "patches", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, h, w])],
                              [helper.make_tensor_value_info(*out)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model, weight, bias, table


def conv_numpy(x, weight, bias):
    b, c, h, w = x.shape
    p = x.reshape(b, c, h // 4, 4, w // 4, 4).transpose(0, 2, 4, 1, 3, 5).reshape(b, h // 4, w // 4, -1)
    return np.einsum("bhwk,dk->bdhw", p, weight.reshape(16, -1)) + bias[None, :, None, None]


@pytest.mark.parametrize("tokens", [True, False])
def test_onnx_conv_gather_and_shape_subgraph_import_and_match_numpy(tokens):
    proto, weight, bias, table = onnx_patches(tokens)
    model = import_onnx(proto)
    kinds = [op.kind for op in model.graph.ops]
    assert kinds.count("matmul") == 1 and "gather" not in kinds
    if tokens:
        assert kinds.count("transpose") == 1                  # the Reshape + Transpose pair cancelled
        assert "pos" in model.params and model.params["pos"].shape == (1, 24, 16)
    x = np.random.default_rng(1).standard_normal((2, 3, 16, 24)).astype(np.float32)
    want = conv_numpy(x, weight, bias)
    if tokens:
        want = want.reshape(2, 16, 24).transpose(0, 2, 1) + table[None]
    got = run(model, x=x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kw,words", [
    (dict(strides=(2, 2)), "stride [2, 2] differs from the kernel [4, 4]"),
    (dict(pads=(1, 1, 1, 1)), "padding [1, 1, 1, 1]"),
])
def test_onnx_other_convolutions_are_refused_naming_the_node(kw, words):
    proto, *_ = onnx_patches(False, **kw)
    with pytest.raises(TileplanError) as err:
        import_onnx(proto)
    assert "node 'patch' (Conv)" in str(err.value) and words in str(err.value), str(err.value)


def test_onnx_gather_with_out_of_range_constant_indices_is_refused():
    table = np.zeros((4, 2), np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["pos"], name="g"), helper.make_node("Add", ["x", "pos"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])],
        [numpy_helper.from_array(table, "table"), numpy_helper.from_array(np.array([0, 1, 4], np.int64), "ids")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    with pytest.raises(TileplanError, match=r"node 'g' \(Gather\): indices 0..4 are out of range"):
        import_onnx(model)


def test_torch_transpose_reduction_and_select_of_a_dropped_reshape_use_torchs_axes():
    """A reshape tileplan drops (it keeps the last axis) read where the axes matter is made real:
    ``view`` then ``transpose``, ``mean`` over a leading axis and ``select`` give torch's values."""
    class M(torch.nn.Module):
        def forward(self, x):
            flat = x.reshape(6, 4)                                   # [2, 3, 4] -> [6, 4]: dropped
            return flat.transpose(0, 1).sum(dim=1) + flat.mean(dim=0) + flat[5]
    x = torch.randn(2, 3, 4)
    model = import_module(M(), (x,))
    assert "reshape" in [op.kind for op in model.graph.ops]
    np.testing.assert_allclose(run(model, x=x.numpy()), M()(x).numpy(), rtol=1e-6, atol=1e-6)
