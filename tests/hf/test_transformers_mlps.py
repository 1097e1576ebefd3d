"""Hugging Face transformers MLPs (random init, small configs, no download) through torch.export:
import, compile onto ipu21-64, validate on the IPU model against torch's own outputs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tileplan.graph.torch import import_module  # noqa: E402
from torch_validate import compile_and_validate  # noqa: E402


def siglip(act):
    from transformers import SiglipVisionConfig
    from transformers.models.siglip.modeling_siglip import SiglipMLP
    return SiglipMLP(SiglipVisionConfig(hidden_size=32, intermediate_size=64, hidden_act=act))


def clip():
    from transformers import CLIPVisionConfig
    from transformers.models.clip.modeling_clip import CLIPMLP
    return CLIPMLP(CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4))          # quick_gelu by default


def llama():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP
    return LlamaMLP(LlamaConfig(hidden_size=32, intermediate_size=64))             # SwiGLU: silu(gate) * up


def gpt2():
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2MLP
    return GPT2MLP(64, GPT2Config(n_embd=32))                                      # Conv1D (addmm), gelu_new


MLPS = {
    "siglip-gelu": (lambda: siglip("gelu"), ["matmul", "add", "gelu", "matmul", "add"]),
    "siglip-gelu_pytorch_tanh": (lambda: siglip("gelu_pytorch_tanh"), ["matmul", "add", "gelu", "matmul", "add"]),
    "siglip-gelu_new": (lambda: siglip("gelu_new"), ["matmul", "add", "gelu", "matmul", "add"]),
    "siglip-quick_gelu": (lambda: siglip("quick_gelu"), ["matmul", "add", "mul", "sigmoid", "mul", "matmul", "add"]),
    "clip-quick_gelu": (clip, ["matmul", "add", "mul", "sigmoid", "mul", "matmul", "add"]),
    "llama-swiglu": (llama, ["matmul", "sigmoid", "mul", "matmul", "mul", "matmul"]),
    "gpt2-gelu_new": (gpt2, ["matmul", "add", "gelu", "matmul", "add"]),
}


@pytest.mark.parametrize("name,dtype", [(n, "float32") for n in MLPS] +
                         [("siglip-gelu_new", "float16"), ("siglip-quick_gelu", "float16")])
def test_transformers_mlp_imports_compiles_and_validates_against_torch(name, dtype, tmp_path):
    make, kinds = MLPS[name]
    torch.manual_seed(0)
    module = make().eval().to(getattr(torch, dtype))
    x = torch.randn(2, 8, 32, dtype=getattr(torch, dtype))
    model = import_module(module, (x,))
    assert [op.kind for op in model.graph.ops] == kinds
    approximate = {"siglip-gelu": "erf", "siglip-gelu_pytorch_tanh": "tanh", "siglip-gelu_new": "tanh",
                   "gpt2-gelu_new": "tanh"}.get(name)
    if approximate:
        (gelu,) = [op for op in model.graph.ops if op.kind == "gelu"]
        assert gelu.approximate == approximate
    compile_and_validate(model, module, x, tmp_path, min_cosine=None)
