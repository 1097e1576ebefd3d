"""Whole Hugging Face vision models (random init, a small config, eager attention, no download),
compiled onto ipu21-64 and validated on the IPU model against torch's own outputs:

- ``SiglipVisionModel`` without its pooling head: the patch-embedding convolution, the position
  embedding looked up by the ``position_ids`` buffer, two encoder layers and the post-LayerNorm,
  imported through torch.export and through ONNX export; and with its MAP head, through both.
- The class-token models, through torch.export and ONNX export, each to its ``pooler_output``: ``ViTModel`` (its
  pooler: the CLS row, a Linear, tanh), ``CLIPVisionModel`` (pre-LayerNorm; position embedding by
  ``position_ids``; the CLS row post-LayerNormed), ``DeiTModel`` (class and distillation tokens;
  ViT's pooler), ``Dinov2Model`` (``interpolate_pos_encoding`` at the fixed size, layer scale;
  the CLS row of the final LayerNorm). The class token expanded over the batch is computed at
  import; joining it to the patch tokens is a Concat; the CLS row is a Slice."""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tileplan.graph.core import Role  # noqa: E402
from tileplan.graph.onnx import import_onnx  # noqa: E402
from tileplan.graph.torch import import_module  # noqa: E402
from torch_validate import Pooled, compile_and_validate  # noqa: E402

HIDDEN, LAYERS, PATCH = 64, 2, 8

# The suite runs one compile-and-validate per model and path, covering batch 2, FP16 and a
# non-square image among them; ``TILEPLAN_ALL_MODELS=1`` runs the whole matrix (each case takes
# 15-40 s of CPU: all of them would double the suite's time on two cores).
ALL_MODELS = os.environ.get("TILEPLAN_ALL_MODELS") == "1"


def matrix(*cases, lean: tuple):
    """``cases`` as pytest params; those not in ``lean`` run only with TILEPLAN_ALL_MODELS=1."""
    skip = pytest.mark.skipif(not ALL_MODELS, reason="one case per model and path runs by default; "
                                                     "TILEPLAN_ALL_MODELS=1 runs the whole matrix")
    return [pytest.param(*c, marks=() if c in lean else skip) for c in cases]


class LastHidden(torch.nn.Module):
    """``SiglipVisionModel(pixel_values).last_hidden_state`` (the output a user compares), or with
    the MAP head its ``pooler_output``."""

    def __init__(self, model, interpolate: bool, pooled: bool = False):
        super().__init__()
        self.model, self.interpolate, self.pooled = model, interpolate, pooled

    def forward(self, pixel_values):
        out = self.model(pixel_values=pixel_values, interpolate_pos_encoding=self.interpolate)
        return out.pooler_output if self.pooled else out.last_hidden_state


def siglip_vision(dtype: str, interpolate: bool = False, head: bool = False) -> torch.nn.Module:
    from transformers import SiglipVisionConfig, SiglipVisionModel
    cfg = SiglipVisionConfig(hidden_size=HIDDEN, intermediate_size=128, num_attention_heads=4,
                             num_hidden_layers=LAYERS, image_size=32, patch_size=PATCH, num_channels=3,
                             vision_use_head=head, attn_implementation="eager")
    torch.manual_seed(0)
    return LastHidden(SiglipVisionModel(cfg), interpolate, head).eval().to(getattr(torch, dtype))


def check_imported(model, batch: int, h: int, w: int) -> None:
    kinds = [op.kind for op in model.graph.ops]
    assert kinds.count("layernorm") == 2 * LAYERS + 1 and kinds.count("softmax") == LAYERS
    assert kinds.count("matmul") == 1 + LAYERS * 8     # the patch GEMM; q, k, v, out, fc1, fc2, q@k, p@v
    (inp,) = model.graph.by_role(Role.INPUT)
    assert inp.shape == (batch, 3, h, w)                          # pixels in, as the user feeds them
    tokens = (h // PATCH) * (w // PATCH)
    (out,) = model.graph.by_role(Role.OUTPUT)
    assert out.shape == (batch, tokens, HIDDEN)
    assert all(np.issubdtype(v.dtype, np.floating) for v in model.params.values())   # no int64 buffer
    tables = [v for v in model.params.values() if v.shape == (1, tokens, HIDDEN)]
    assert len(tables) == 1                                       # the position rows, folded at import




def export_onnx(module, x, path) -> None:
    """torch.onnx's TorchScript exporter (the dynamo one needs onnxscript), opset 17: Conv, the
    Shape/Slice/Concat subgraph of ``flatten(2)``, Gather of the position table, LayerNormalization."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (x,), str(path), dynamo=False, opset_version=17, input_names=["pixel_values"],
                          output_names=["last_hidden_state"])


@pytest.mark.parametrize("batch,h,w", [(1, 32, 32), (2, 32, 48)])
def test_siglip_vision_model_imports_through_torch_export(batch, h, w):
    module = siglip_vision("float32", interpolate=(h, w) != (32, 32))
    model = import_module(module, (torch.randn(batch, 3, h, w),))
    check_imported(model, batch, h, w)


def test_siglip_vision_model_imports_through_onnx_export(tmp_path):
    module = siglip_vision("float32")
    x = torch.randn(1, 3, 32, 32)
    export_onnx(module, x, tmp_path / "siglip.onnx")
    model = import_onnx(tmp_path / "siglip.onnx")
    check_imported(model, 1, 32, 32)


def test_siglip_vision_model_with_map_head_imports_the_probe_query_computed_at_import():
    """The MAP head: a learned probe repeated over the batch, ``nn.MultiheadAttention`` with one
    query row (its packed ``in_proj`` split), a LayerNorm and an MLP; the probe's query projection
    reads parameters only, so it is computed at import: one MatMul fewer."""
    module = siglip_vision("float32", head=True)
    model = import_module(module, (torch.randn(2, 3, 32, 32),))
    kinds = [op.kind for op in model.graph.ops]
    assert kinds.count("softmax") == LAYERS + 1 and kinds.count("layernorm") == 2 * LAYERS + 2
    # patch GEMM, 8 per layer; the head's packed k|v, q@k, p@v, out_proj, fc1, fc2 (not the probe's q)
    assert kinds.count("matmul") == 1 + 8 * LAYERS + 6
    (out,) = model.graph.by_role(Role.OUTPUT)
    assert out.shape == (2, HIDDEN)


@pytest.mark.slow
def test_siglip_vision_model_with_map_head_compiles_and_validates(tmp_path):
    module = siglip_vision("float32", head=True)
    x = torch.randn(2, 3, 32, 32)
    compile_and_validate(import_module(module, (x,)), module, x, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("batch,h,w,dtype", matrix((1, 32, 32, "float32"), (2, 32, 48, "float32"),
                                                   (2, 32, 32, "float16"),
                                                   lean=((2, 32, 48, "float32"), (2, 32, 32, "float16"))))
def test_siglip_vision_model_through_torch_export_compiles_and_validates(batch, h, w, dtype, tmp_path):
    module = siglip_vision(dtype, interpolate=(h, w) != (32, 32))
    x = torch.randn(batch, 3, h, w, dtype=getattr(torch, dtype))
    model = import_module(module, (x,))
    compile_and_validate(model, module, x, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("batch,head", matrix((1, False), (2, True), lean=((2, True),)))
def test_siglip_vision_model_through_onnx_export_compiles_and_validates(batch, head, tmp_path):
    """With the MAP head, the exporter writes ``nn.MultiheadAttention``'s packed k|v split with a
    ``Shape`` of an activation and a ``Mod``: shape arithmetic, folded at import. The head case
    runs by default (it holds the whole body; the body alone is imported by the test above)."""
    module = siglip_vision("float32", head=head)
    x = torch.randn(batch, 3, 32, 32)
    export_onnx(module, x, tmp_path / "siglip.onnx")
    model = import_onnx(tmp_path / "siglip.onnx")
    (out,) = model.graph.by_role(Role.OUTPUT)
    assert out.shape == ((batch, HIDDEN) if head else (batch, (32 // PATCH) ** 2, HIDDEN))
    compile_and_validate(model, module, x, tmp_path)


# ---- class-token models ----------------------------------------------------------------

# name -> (config class, model class, model kwargs, class tokens joined to the patches, Linears
# past the encoder, LayerNorms besides the layers' two each)
CLASS_TOKEN_MODELS = {
    "vit": ("ViTConfig", "ViTModel", {"add_pooling_layer": True}, 1, 1, 1),
    "clip": ("CLIPVisionConfig", "CLIPVisionModel", {}, 1, 0, 2),
    "deit": ("DeiTConfig", "DeiTModel", {"add_pooling_layer": True}, 2, 1, 1),
    "dinov2": ("Dinov2Config", "Dinov2Model", {}, 1, 0, 1),
}


def class_token_model(name: str, dtype: str = "float32") -> torch.nn.Module:
    config_cls, model_cls, kwargs, *_ = CLASS_TOKEN_MODELS[name]
    cfg = getattr(transformers, config_cls)(hidden_size=HIDDEN, intermediate_size=128, num_attention_heads=4,
                                            num_hidden_layers=LAYERS, image_size=32, patch_size=PATCH,
                                            num_channels=3, attn_implementation="eager")
    torch.manual_seed(0)
    return Pooled(getattr(transformers, model_cls)(cfg, **kwargs)).eval().to(getattr(torch, dtype))


@pytest.mark.parametrize("name", sorted(CLASS_TOKEN_MODELS))
def test_class_token_model_imports_its_tokens_as_a_concat_of_a_folded_parameter(name):
    _, _, _, extra, linears, norms = CLASS_TOKEN_MODELS[name]
    batch, patches = 2, (32 // PATCH) ** 2
    model = import_module(class_token_model(name), (torch.randn(batch, 3, 32, 32),))
    g = model.graph
    kinds = [op.kind for op in g.ops]
    assert kinds.count("matmul") == 1 + 8 * LAYERS + linears
    assert kinds.count("layernorm") == 2 * LAYERS + norms and kinds.count("softmax") == LAYERS
    (cat,) = [op for op in g.ops if op.kind == "concat"]
    assert cat.axis == 1 and g.tensors[cat.output].shape == (batch, extra + patches, HIDDEN)
    tokens = [g.tensors[i] for i in cat.inputs[:-1]]              # the class (and distillation) tokens,
    assert all(t.role is Role.PARAMETER and t.shape == (batch, 1, HIDDEN) for t in tokens)   # over the batch
    assert g.tensors[cat.inputs[-1]].shape == (batch, patches, HIDDEN)         # then the patch tokens
    assert "slice" in kinds                                       # the CLS row
    (out,) = g.by_role(Role.OUTPUT)
    assert out.shape == (batch, HIDDEN)
    assert all(np.issubdtype(v.dtype, np.floating) for v in model.params.values())
    # The zero attention mask HF builds when none is given ([B, 1, T, T], computed at import) is not added.
    assert not any(v.ndim == 4 for v in model.params.values())


def compile_class_token_model(name: str, batch: int, dtype: str, tmp_path) -> None:
    module = class_token_model(name, dtype)
    x = torch.randn(batch, 3, 32, 32, dtype=getattr(torch, dtype))
    p, v = compile_and_validate(import_module(module, (x,)), module, x, tmp_path)
    assert v.profile.cycles == p.estimate.cycles        # the Concat's copies priced as lowering makes them


@pytest.mark.slow
@pytest.mark.parametrize("batch,dtype", matrix((1, "float32"), (2, "float32"), (2, "float16"),
                                               lean=((2, "float32"),)))
def test_vit_model_with_its_pooler_compiles_and_validates(batch, dtype, tmp_path):
    compile_class_token_model("vit", batch, dtype, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name,batch,dtype", matrix(*[(n, b, d) for n in ("clip", "deit", "dinov2")
                                                     for b, d in ((1, "float32"), (2, "float16"))],
                                                   lean=(("clip", 2, "float16"), ("deit", 2, "float16"),
                                                         ("dinov2", 2, "float16"))))
def test_class_token_model_compiles_and_validates(name, batch, dtype, tmp_path):
    compile_class_token_model(name, batch, dtype, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name,w", matrix(("vit", 32), ("clip", 32), ("deit", 32), ("dinov2", 48),
                                          lean=(("vit", 32), ("clip", 32), ("deit", 32), ("dinov2", 48))))
def test_class_token_model_through_onnx_export_compiles_and_validates(name, w, tmp_path):
    """Through the TorchScript ONNX exporter: the class token ``Expand``ed by a shape the exporter
    computes with Equal / Where of constants (folded at import), Concat, and the CLS row a
    ``Gather`` by the constant index 0 (a Slice). DINOv2 always exports its
    ``interpolate_pos_encoding``: the grid side a ``Pow(n, 0.5)`` cast to an integer and the
    position table's bicubic ``Resize``, all of parameters and shapes, so computed at import; on
    a 32 x 48 image the 4 x 4 table is really resized (to 4 x 6)."""
    module = class_token_model(name)
    x = torch.randn(2, 3, 32, w)
    export_onnx(module, x, tmp_path / f"{name}.onnx")
    model = import_onnx(tmp_path / f"{name}.onnx")
    assert [op.kind for op in model.graph.ops].count("concat") == 1
    compile_and_validate(model, module, x, tmp_path)
