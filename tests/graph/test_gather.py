"""Gather (an embedding) and INT32 inputs: the op's shape rule, float64 reference and refusals; a
small model with token ids compiled onto ipu21-64 and validated on the IPU model (estimate equal to
the simulated cycles); validate refusing an index past the table and a fractional integer input,
naming them."""

from __future__ import annotations

import numpy as np
import pytest

from tileplan.errors import TileplanError
from tileplan.graph.core import Add, Cast, Gather, Graph, Role, Tensor
from tileplan.graph.dtypes import DType, quantise
from tileplan.lowering.compile import compile_model
from tileplan.lowering.package import load_package
from tileplan.planner.gather import column_bounds
from tileplan.sim.validate import validate_package
from tileplan.target import load_target

I32, FP16, FP32 = DType.INT32, DType.FP16, DType.FP32
V, D, B, T = 50, 24, 2, 6


def table(dt=FP32, shape=(V, D)):
    return Tensor("table", shape, dt, Role.PARAMETER)


def ids(dt=I32, shape=(B, T)):
    return Tensor("ids", shape, dt, Role.INPUT)


def test_infer_appends_the_table_width_and_reference_picks_rows():
    op = Gather("g", ("table", "ids"), "y")
    assert op.infer([table(FP16), ids()]) == ((B, T, D), FP16)
    w = np.arange(V * D, dtype=np.float64).reshape(V, D)
    i = np.array([[0, 49, 3], [3, 3, 7]])
    np.testing.assert_array_equal(op.reference(w, i), w[i])
    np.testing.assert_array_equal(op.reference(w, np.array([-1, -50])), w[[49, 0]])     # from the end (ONNX)


@pytest.mark.parametrize("ins,words", [
    ([table(), ids(FP32)], ["indices 'ids' must be int32", "fp32"]),
    ([table(shape=(V, 4, 6)), ids()], ["table 'table' [50, 4, 6] must be 2-D"]),
    ([table(DType.FP8), ids()], ["must be fp16 or fp32", "fp8"]),
])
def test_infer_refuses_naming_the_tensor(ins, words):
    with pytest.raises(TileplanError) as e:
        Gather("emb", ("table", "ids"), "y").infer(ins)
    assert "op 'emb' (gather)" in str(e.value)
    for w in words:
        assert w in str(e.value)


@pytest.mark.parametrize("bad", [50, -51])
def test_reference_refuses_an_index_outside_the_table(bad):
    with pytest.raises(TileplanError,
                       match=rf"op 'g' \(gather\): index {bad} of 'ids' is outside the 50 rows of 'table'"):
        Gather("g", ("table", "ids"), "y").reference(np.zeros((V, D)), np.array([0, bad]))


def test_arithmetic_on_int32_is_refused_and_a_cast_to_int32_is_not_allowed():
    with pytest.raises(TileplanError, match=r"'ids' is int32 \(cast first\)"):
        Add("a", ("ids", "ids"), "y").infer([ids(), ids()])
    assert I32 not in Cast("c", ("x",), "y").allowed_output_dtypes([ids()])


def test_int32_values_must_be_whole_numbers_in_range():
    np.testing.assert_array_equal(quantise(np.array([0.0, -3.0, 2 ** 31 - 1]), I32), [0, -3, 2 ** 31 - 1])
    for bad in (0.5, 2.0 ** 31, np.nan):
        with pytest.raises(ValueError, match="int32 values must be whole numbers"):
            quantise(np.array([bad]), I32)


@pytest.mark.parametrize("width,itemsize,tiles,want", [
    (64, 4, 64, tuple(range(0, 65, 2))),           # FP32: whole 8-byte words, 32 tiles
    (768, 2, 1472, tuple(range(0, 769, 4))),       # BERT-base FP16: 4 columns over 192 tiles
    (24, 2, 64, (0, 4, 8, 12, 16, 20, 24)),
    (5, 4, 64, (0, 2, 4, 5)),                      # a remainder block
])
def test_column_blocks_are_whole_words_spread_over_the_tiles(width, itemsize, tiles, want):
    assert column_bounds(width, itemsize, tiles) == want


def embedding_model(dt):
    g = Graph.build("emb", [ids(), table(dt), Tensor("x", (B, T, D), dt, Role.INPUT)],
                    [Gather("g", ("table", "ids"), "e"), Add("add", ("e", "x"), "y")])
    rng = np.random.default_rng(0)
    return g, {"table": rng.normal(size=(V, D)).astype(dt.numpy)}


@pytest.mark.parametrize("dt", [FP32, FP16])
def test_an_embedding_by_token_ids_compiles_and_validates(dt, tmp_path):
    g, params = embedding_model(dt)
    p, _, path = compile_model(g, load_target("ipu21-64"), tmp_path / "pkg", params=params, jobs=1)
    rng = np.random.default_rng(1)
    tok = rng.integers(0, V, (B, T))
    tok[0, :2] = (0, V - 1)                                   # the first and last rows
    x = rng.normal(size=(B, T, D))
    np.savez(tmp_path / "in.npz", ids=tok, x=x)
    want = params["table"].astype(np.float64)[tok] + quantise(x, dt).astype(np.float64)
    np.savez(tmp_path / "want.npz", y=want)
    v = validate_package(load_package(path), inputs_path=tmp_path / "in.npz", expected_path=tmp_path / "want.npz")
    assert v.passed, v.outputs
    assert v.profile.cycles == p.estimate.cycles


@pytest.mark.parametrize("values,words", [
    (np.full((B, T), V), ["in.npz: op 'g' (gather): index 50 of 'ids' is outside the 50 rows of 'table'"]),
    (np.full((B, T), 0.5), ["in.npz: 'ids': int32 values must be whole numbers", "got 0.5"]),
])
def test_validate_refuses_bad_token_ids_naming_them(values, words, tmp_path):
    g, params = embedding_model(FP32)
    _, _, path = compile_model(g, load_target("ipu21-64"), tmp_path / "pkg", params=params, jobs=1)
    np.savez(tmp_path / "in.npz", ids=values, x=np.zeros((B, T, D)))
    with pytest.raises(TileplanError) as e:
        validate_package(load_package(path), inputs_path=tmp_path / "in.npz")
    for w in words:
        assert w in str(e.value)
