"""The whole SigLIP vision model as a fixture: ``fixtures/make_encoder.py``'s vision specs (patch
embedding, position embeddings, the layers, post-LayerNorm, MAP head) and the torch factory
``fixtures/siglip_hf.py:siglip_vision`` on HF ``SiglipVisionModel`` describe the same graph; the
small factory (an image that is not a whole number of patches) compiles and validates against
torch. And a ViT fed an image of another size than its config's, with
``interpolate_pos_encoding``, compiles at that size (the bicubic resize of the position table
is computed at import)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
sys.path.insert(0, str(FIXTURES))

import make_encoder  # noqa: E402
import siglip_hf  # noqa: E402

from tileplan.graph.core import MatMul, Role  # noqa: E402
from tileplan.graph.loaders import load_model  # noqa: E402
from tileplan.graph.torch import import_module  # noqa: E402
from tileplan.planner.rewrite import canonical  # noqa: E402
from torch_validate import Pooled, compile_and_validate  # noqa: E402

# layers, width, heads, mlp, image (35: four patches of 8 and 3 pixels over), patch, batch
SMALL = (2, 64, 4, 128, 35, 8, 1)


def signature(graph) -> list[tuple]:
    """Per op in order: kind, input shapes (a MatMul's parameter as multiplied, ``[K, N]``), output
    shape, dtype and FP8 scale, input roles: what planning reads, names aside."""
    out = []
    for op in graph.ops:
        shapes = []
        for i, name in enumerate(op.inputs):
            t = graph.tensors[name]
            flip = isinstance(op, MatMul) and i == 1 and op.transpose_b and t.role is Role.PARAMETER
            shapes.append(tuple(t.shape[::-1]) if flip else t.shape)
        t = graph.tensors[op.output]
        out.append((op.kind, tuple(shapes), t.shape, str(t.dtype), t.scale,
                    tuple(str(graph.tensors[i].role) for i in op.inputs)))
    return out


def test_the_vision_generator_writes_what_the_torch_factory_imports(tmp_path):
    layers, width, heads, mlp, image, patch, batch = SMALL
    spec = make_encoder.Spec("vision_small", "ipu21-64", batch, (image // patch) ** 2, width, heads, mlp, True,
                             layers=layers, image=image, patch=patch, head=True, description="small vision model")
    (tmp_path / "v.toml").write_text(make_encoder.Writer(spec).text())
    toml = canonical(load_model(tmp_path / "v.toml"))
    module, x = siglip_hf.siglip_vision(*SMALL, fp8=True)
    imported = canonical(import_module(module, x).graph)
    assert signature(toml) == signature(imported)
    kinds = [op.kind for op in toml.ops]
    assert kinds.count("slice") == 2 + 2 + 1       # the crop (rows, columns); the head's k and v; the pooled row
    assert kinds.count("matmul") == 1 + 8 * layers + 6
    (out,) = toml.by_role(Role.OUTPUT)
    assert out.shape == (batch, width)


def test_the_committed_vision_fixture_is_the_generators():
    (spec,) = [s for s in make_encoder.SPECS if s.name == "siglip_vision_fp8_b1"]
    assert (FIXTURES / "siglip_vision_fp8_b1.toml").read_text() == make_encoder.Writer(spec).text()
    assert (spec.image, spec.patch, spec.layers, spec.tokens) == (384, 14, 27, 729)


@pytest.mark.slow
def test_the_small_vision_factory_compiles_and_validates(tmp_path):
    """In FP16 (the crop, the MAP head, the dropped attention weights against torch's output; the
    FP8 form's graph is the TOML's above: FP8 roundings flip between torch's FP32 run and the
    FP16 plan, so its pooled row is no comparison)."""
    module, (x,) = siglip_hf.siglip_vision(*SMALL)
    model = import_module(module, (x,))
    compile_and_validate(model, module, x, tmp_path)


@pytest.mark.slow
def test_a_vit_at_another_image_size_compiles_with_its_position_table_interpolated(tmp_path):
    cfg = transformers.ViTConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_hidden_layers=2,
                                 image_size=32, patch_size=8, num_channels=3, attn_implementation="eager")
    torch.manual_seed(0)
    module = Pooled(transformers.ViTModel(cfg, add_pooling_layer=True), interpolate_pos_encoding=True).eval()
    x = torch.randn(1, 3, 48, 40)                                # 6 x 5 patches, the config's 4 x 4
    model = import_module(module, (x,))
    (cat,) = [op for op in model.graph.ops if op.kind == "concat"]
    assert model.graph.tensors[cat.output].shape == (1, 1 + 30, 64)
    compile_and_validate(model, module, x, tmp_path)
