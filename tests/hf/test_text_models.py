"""Whole Hugging Face text encoders (random init, a small config, no download),
with an attention mask, compiled onto ipu21-64 and validated on the IPU model against torch:

- ``BertModel`` (eager attention and SDPA) through torch.export: ``input_ids`` and
  ``attention_mask`` are INT32 graph inputs;
  the word embedding a Gather by ``input_ids``; the position and (all-zero) token-type embeddings
  computed at import; HF's padding mask a Cast of ``attention_mask``, scaled and added to every
  layer's scores, broadcast over heads and query rows.
- ``BertModel`` through the ONNX export (TorchScript exporter, opset 17): the word embedding an
  ONNX Gather by the ``input_ids`` input; the mask a Cast to BOOL, a Flatten and Gather by constant
  indices, Reshapes, And with a constant, Expand and Where, imported as the same Cast, Mul and Add.
- ``BertModel``'s ``pooler_output`` (the CLS row, a Linear, tanh), and the model in FP16.
- ``DistilBertModel``; ``RobertaModel`` with ``position_ids`` and ``token_type_ids`` given (its own
  positions are integer arithmetic on the token ids: refused naming ``cumsum``).
- A mask that really masks: a padded sequence gives, for its real tokens, the outputs of the
  unpadded sequence (the check a user makes)."""

from __future__ import annotations

import copy
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tileplan.errors import TileplanError  # noqa: E402
from tileplan.graph.core import Role  # noqa: E402
from tileplan.graph.dtypes import DType  # noqa: E402
from tileplan.graph.onnx import import_onnx  # noqa: E402
from tileplan.graph.torch import import_module  # noqa: E402
from tileplan.lowering.compile import compile_model  # noqa: E402
from tileplan.lowering.package import load_package  # noqa: E402
from tileplan.sim.validate import validate_package  # noqa: E402
from tileplan.target import load_target  # noqa: E402

HIDDEN, LAYERS, VOCAB, T = 64, 2, 100, 8

# By default one compile per import path and model runs (each takes 30-45 s of CPU); SDPA's, FP16's and
# the pooler's compiles run with ``TILEPLAN_ALL_MODELS=1`` (as tests/hf/test_whole_models.py's matrix).
ALL_MODELS = os.environ.get("TILEPLAN_ALL_MODELS") == "1"
whole_matrix = pytest.mark.skipif(not ALL_MODELS, reason="one compile per model and path runs by default; "
                                                          "TILEPLAN_ALL_MODELS=1 runs the whole matrix")


class LastHidden(torch.nn.Module):
    """``model(input_ids, attention_mask).last_hidden_state``."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class Pooled(LastHidden):
    """``model(input_ids, attention_mask).pooler_output``: the CLS row, a Linear, tanh."""

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).pooler_output


def bert(impl: str = "eager", pooled: bool = False) -> torch.nn.Module:
    cfg = transformers.BertConfig(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=4,
                                  intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=32,
                                  attn_implementation=impl)
    torch.manual_seed(0)
    return (Pooled if pooled else LastHidden)(transformers.BertModel(cfg)).eval()


def tokens(batch: int, lengths) -> tuple:
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (batch, T), generator=gen)
    mask = torch.zeros(batch, T, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
        ids[b, n:] = 0                                      # [PAD]
    return ids, mask


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_bert_imports_integer_inputs_a_gather_and_the_mask(impl):
    """Eager attention and SDPA (``scaled_dot_product_attention`` with the bool mask) import to the
    same ops: the mask's bias is computed once and read by every layer."""
    ids, mask = tokens(2, (T, 5))
    model = import_module(bert(impl), (ids, mask))
    g = model.graph
    inputs = {t.name: t for t in g.by_role(Role.INPUT)}
    assert {n: (t.shape, t.dtype) for n, t in inputs.items()} == {
        "input_ids": ((2, T), DType.INT32), "attention_mask": ((2, T), DType.INT32)}
    kinds = [op.kind for op in g.ops]
    assert kinds.count("gather") == 1                       # the word embedding; position/type folded
    (gather,) = [op for op in g.ops if op.kind == "gather"]
    assert gather.inputs[1] == "input_ids" and g.tensors[gather.inputs[0]].shape == (VOCAB, HIDDEN)
    assert kinds.count("softmax") == LAYERS and kinds.count("layernorm") == 2 * LAYERS + 1
    (cast,) = [op for op in g.ops if op.kind == "cast"]   # the mask, once, read by every layer
    assert cast.inputs == ("attention_mask",)
    assert all(np.issubdtype(v.dtype, np.floating) for v in model.params.values())


def export_onnx(module, ids, mask, path) -> None:
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (ids, mask), str(path), dynamo=False, opset_version=17,
                          input_names=["input_ids", "attention_mask"], output_names=["last_hidden_state"])


def test_bert_imports_through_onnx_export(tmp_path):
    ids, mask = tokens(2, (T, 5))
    export_onnx(bert(), ids, mask, tmp_path / "bert.onnx")
    g = import_onnx(tmp_path / "bert.onnx").graph
    assert {t.name: (t.shape, t.dtype) for t in g.by_role(Role.INPUT)} == {
        "input_ids": ((2, T), DType.INT32), "attention_mask": ((2, T), DType.INT32)}
    kinds = [op.kind for op in g.ops]
    assert kinds.count("gather") == 1 and kinds.count("softmax") == LAYERS
    (cast,) = [op for op in g.ops if op.kind == "cast"]
    assert cast.inputs == ("attention_mask",)


def compile_and_validate(module, ids, mask, tmp_path, name="pkg", onnx=False, extra=()):
    """Compile the import of ``module`` on (ids, mask, *extra) (through torch.export, or ``onnx``:
    its ONNX export), validate against torch; returns the plan, the validation and torch's output."""
    args = (ids, mask) + tuple(extra)
    if onnx:
        export_onnx(module, ids, mask, tmp_path / f"{name}.onnx")
        model = import_onnx(tmp_path / f"{name}.onnx")
    else:
        model = import_module(module, args)
    p, _, path = compile_model(model.graph, load_target("ipu21-64"), tmp_path / name, params=model.params, jobs=1)
    (out,) = model.graph.by_role(Role.OUTPUT)
    with torch.no_grad():                   # fp16 modules: the same fp16 weights, torch computing in fp32
        want = copy.deepcopy(module).float()(*args).numpy()
    names = [t.name for t in model.graph.by_role(Role.INPUT)]
    given = dict(zip(["input_ids", "attention_mask", "position_ids", "token_type_ids"], args))
    np.savez(tmp_path / f"{name}-in.npz", **{n: given[n].numpy() for n in names})
    np.savez(tmp_path / f"{name}-want.npz", **{out.name: want.reshape(out.shape)})
    v = validate_package(load_package(path), inputs_path=tmp_path / f"{name}-in.npz",
                         expected_path=tmp_path / f"{name}-want.npz")
    assert v.passed, v.outputs
    assert v.outputs[out.name]["cosine"] > 0.999
    return p, v, want


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["eager", pytest.param("sdpa", marks=whole_matrix)])
def test_bert_with_a_padding_mask_compiles_and_validates_against_torch(impl, tmp_path):
    p, v, _ = compile_and_validate(bert(impl), *tokens(2, (T, 5)), tmp_path)
    assert v.profile.cycles == p.estimate.cycles


@pytest.mark.slow
@whole_matrix
def test_fp16_bert_with_a_padding_mask_compiles_and_validates_against_torch(tmp_path):
    """FP16 weights and activations; HF's mask minimum is FP16's (-65504), its bias exact in FP16."""
    p, v, _ = compile_and_validate(bert().half(), *tokens(2, (T, 5)), tmp_path)
    assert v.profile.cycles == p.estimate.cycles


@pytest.mark.slow
@whole_matrix
def test_bert_pooler_output_with_a_padding_mask_compiles_and_validates_against_torch(tmp_path):
    p, v, want = compile_and_validate(bert(pooled=True), *tokens(2, (T, 3)), tmp_path)
    assert want.shape == (2, HIDDEN) and v.profile.cycles == p.estimate.cycles


@pytest.mark.slow
def test_bert_through_onnx_export_compiles_and_validates_against_torch(tmp_path):
    p, v, _ = compile_and_validate(bert(), *tokens(2, (T, 5)), tmp_path, onnx=True)
    assert v.profile.cycles == p.estimate.cycles


@pytest.mark.slow
def test_bert_mask_really_masks_padded_tokens(tmp_path):
    """The padded sequence (5 real tokens then 3 pads, masked) against the 5 tokens alone: the
    real tokens' outputs agree (torch's own, and the check that the mask reaches the scores)."""
    module = bert()
    ids, mask = tokens(1, (5,))
    _, _, padded = compile_and_validate(module, ids, mask, tmp_path, "padded")
    with torch.no_grad():
        alone = module(ids[:, :5], mask[:, :5]).numpy()
        unmasked = module(ids, torch.ones_like(mask)).numpy()
    np.testing.assert_allclose(padded[:, :5], alone, atol=1e-4)
    assert np.abs(unmasked[:, :5] - alone).max() > 1e-2      # without the mask they would differ


# ---- other text encoders ---------------------------------------------------------------

class Distil(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class WithPositions(torch.nn.Module):
    """RoBERTa with ``position_ids`` and ``token_type_ids`` given: its own position ids are computed
    from the token ids (``cumsum`` of ``input_ids != pad``: integer arithmetic on an input, which
    tileplan does not import), so the caller computes them, as a tokenizer pipeline can."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, position_ids, token_type_ids):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          token_type_ids=token_type_ids).last_hidden_state


def distilbert() -> torch.nn.Module:
    cfg = transformers.DistilBertConfig(dim=HIDDEN, n_layers=LAYERS, n_heads=4, hidden_dim=128, vocab_size=VOCAB,
                                        max_position_embeddings=32, attn_implementation="eager")
    torch.manual_seed(0)
    return Distil(transformers.DistilBertModel(cfg)).eval()


def roberta() -> torch.nn.Module:
    cfg = transformers.RobertaConfig(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=4,
                                     intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=40,
                                     attn_implementation="eager")
    torch.manual_seed(0)
    return WithPositions(transformers.RobertaModel(cfg)).eval()


@pytest.mark.slow
def test_distilbert_with_a_padding_mask_compiles_and_validates_against_torch(tmp_path):
    p, v, _ = compile_and_validate(distilbert(), *tokens(2, (T, 5)), tmp_path)
    assert v.profile.cycles == p.estimate.cycles


@pytest.mark.slow
def test_roberta_with_given_positions_compiles_and_validates_against_torch(tmp_path):
    ids, mask = tokens(2, (T, 5))
    positions = (torch.cumsum(mask, 1) * mask + 1).long()         # RoBERTa's own rule, pad index 1
    p, v, _ = compile_and_validate(roberta(), ids, mask, tmp_path, extra=(positions, torch.zeros_like(ids)))
    assert v.profile.cycles == p.estimate.cycles
    assert [op.kind for op in import_module(roberta(), (ids, mask, positions, torch.zeros_like(ids))).graph.ops
            ].count("gather") == 3                                  # words, positions, token types


def test_roberta_computing_its_positions_from_the_tokens_is_refused_naming_the_nodes():
    class Own(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    with pytest.raises(TileplanError, match=r"unsupported nodes: .*aten\.cumsum\.default"):
        import_module(Own(roberta().model), tokens(2, (T, 5)))
