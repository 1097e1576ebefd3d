"""Hugging Face encoder layers and encoders (random init, small configs, eager attention, no
download) through torch.export: LayerNorm, attention with softmax, residuals and the MLP import,
compile onto ipu21-64 and validate on the IPU model against torch's own outputs."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tileplan.graph.torch import import_module  # noqa: E402
from torch_validate import compile_and_validate  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures"))
from siglip_hf import Hidden  # noqa: E402


def siglip_layer():
    from transformers import SiglipVisionConfig
    from transformers.models.siglip.modeling_siglip import SiglipEncoderLayer
    cfg = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, attn_implementation="eager")
    return Hidden(SiglipEncoderLayer(cfg), encoder=False)


def vit_layer():
    from transformers import ViTConfig
    from transformers.models.vit.modeling_vit import ViTLayer
    cfg = ViTConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, attn_implementation="eager")
    return Hidden(ViTLayer(cfg), encoder=False)


def siglip_encoder(layers: int):
    from transformers import SiglipVisionConfig
    from transformers.models.siglip.modeling_siglip import SiglipEncoder
    cfg = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_hidden_layers=layers,
                             attn_implementation="eager")
    return Hidden(SiglipEncoder(cfg), encoder=True)


# The 2-layer encoder (a first and a last layer) in FP16; the 4-layer one (with inner
# layers, whose repeated steps the package shares) in FP32.
MODELS = {"SiglipEncoderLayer": siglip_layer, "ViTLayer": vit_layer, "SiglipEncoder-2": lambda: siglip_encoder(2),
          "SiglipEncoder-4": lambda: siglip_encoder(4)}


def _case(name: str, dtype: str):
    """The encoder stacks cost 25-55 CPU-seconds each (the 4-layer one 53 s measured): slow, in the
    whole suite; the single layers (10-15 s) are in the fast lane too."""
    return pytest.param(name, dtype, marks=pytest.mark.slow) if name.startswith("SiglipEncoder-") else (name, dtype)


@pytest.mark.parametrize("name,dtype", [_case(n, "float32") for n in MODELS if n != "SiglipEncoder-2"]
                         + [_case("SiglipEncoderLayer", "float16"), _case("SiglipEncoder-2", "float16")])
def test_hf_encoder_imports_compiles_and_validates_against_torch(name, dtype, tmp_path):
    torch.manual_seed(0)
    module = MODELS[name]().eval().to(getattr(torch, dtype))
    x = torch.randn(2, 10, 32, dtype=getattr(torch, dtype))
    model = import_module(module, (x,))
    kinds = [op.kind for op in model.graph.ops]
    layers = int(name.split("-")[1]) if "-" in name else 1
    assert kinds.count("layernorm") == 2 * layers and kinds.count("softmax") == layers
    # HF's `matmul(q, k^T) * scaling` is folded into the softmax: no pointwise pass over the scores.
    assert "mul" not in kinds
    scaling = np.asarray(32 // 4, np.float64) ** -0.5
    for op in model.graph.ops:
        if op.kind == "softmax":
            assert op.softmax_scale == float(scaling.astype(getattr(np, dtype)))
    _, v = compile_and_validate(model, module, x, tmp_path)
