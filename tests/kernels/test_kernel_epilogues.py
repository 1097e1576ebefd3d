"""Fused epilogues: the reducers' bias-GeLU and FP8 cast, bias-GeLU with FP8 output and the
aligned bias-GeLU path: their published cycle points (REFERENCES.md, "Transformer kernels on
IPU21"), their dispatch, and numpy semantics equal to the unfused ops they replace."""

from __future__ import annotations

import numpy as np
import pytest

from tileplan.errors import TileplanError
from tileplan.graph.dtypes import DType, quantise
from tileplan.kernels import BiasGeLUCall, CastCall, GeLUCall, ReduceCall, default_registry, dispatch
from tileplan.kernels import cycles as cy
from tileplan.target import load_target

FP8, FP16, FP32 = DType.FP8, DType.FP16, DType.FP32
REG = default_registry()
IPU21 = load_target("ipu21")


def test_reduction_with_bias_gelu_reproduces_the_published_model_point():
    call = ReduceCall(82 * 32, 6, FP16, FP16, bias_cols=32, gelu="tanh")
    assert dispatch(call, IPU21).name == "reduce_bias_gelu_fp16"
    assert dispatch(call, IPU21).cycles(call, IPU21) == 17892
    # 288 + (C/16) (222 + ceil(4R/6) 6 (20 + P)) for another shape: 10 x 64, 3 partials.
    other = ReduceCall(10 * 64, 3, FP16, FP16, bias_cols=64, gelu="erf")
    assert REG["reduce_bias_gelu_fp16"].cycles(other, IPU21) == 288 + 4 * (222 + 7 * 6 * 23)


@pytest.mark.parametrize("rows,cols,published", [(1, 16, 540), (1, 1408, 5760), (1, 2152, 8550), (1, 2208, 8730),
                                                 (3, 2152, 25206)])
def test_the_aligned_bias_gelu_fit_reproduces_every_published_point(rows, cols, published):
    call = BiasGeLUCall(rows, cols, FP16, aligned=True)
    assert dispatch(call, IPU21).name == "bias_gelu_aligned_fp16"
    assert dispatch(call, IPU21).cycles(call, IPU21) == published


def test_unaligned_operands_take_the_general_pass_near_the_published_four_byte_offset_figure():
    call = BiasGeLUCall(3, 2152, FP16, aligned=False)
    v = dispatch(call, IPU21)
    assert v.name == "bias_gelu_fp16"
    assert "aligned" in "; ".join(REG["bias_gelu_aligned_fp16"].rejections(call, IPU21))
    # The published 4-byte-offset figure of the same kernel: 37,950 (the general pass is DERIVED).
    assert abs(v.cycles(call, IPU21) - 37950) < 0.05 * 37950
    # Rows that are not whole 64-bit words cannot all start aligned.
    assert not REG["bias_gelu_aligned_fp16"].accepts(BiasGeLUCall(2, 2153, FP16, aligned=True), IPU21)


@pytest.mark.parametrize("cols,published", [(1152, 7152), (2152, 13776)])
def test_bias_gelu_with_fp8_output_reproduces_both_published_points(cols, published):
    call = BiasGeLUCall(1, cols, FP16, cast_to=FP8, aligned=True)
    assert dispatch(call, IPU21).name == "bias_gelu_fp16_fp8"
    assert dispatch(call, IPU21).cycles(call, IPU21) == published


def test_the_fused_reduction_epilogues_cost_less_than_the_kernels_they_replace():
    n, parts = 82 * 32, 6
    fused = ReduceCall(n, parts, FP16, FP16, bias_cols=32, gelu="tanh", cast_to=FP8)
    apart = (ReduceCall(n, parts, FP16, FP16, bias_cols=32), GeLUCall(n, FP16), CastCall(n, FP16, FP8))
    total = sum(dispatch(c, IPU21).cycles(c, IPU21) for c in apart)
    assert dispatch(fused, IPU21).cycles(fused, IPU21) < total
    cast = ReduceCall(n, parts, FP16, FP16, cast_to=FP8)
    plain, alone = ReduceCall(n, parts, FP16, FP16), CastCall(n, FP16, FP8)
    assert dispatch(cast, IPU21).name == "reduce_cast_fp16"
    assert (dispatch(plain, IPU21).cycles(plain, IPU21) < dispatch(cast, IPU21).cycles(cast, IPU21)
            < dispatch(plain, IPU21).cycles(plain, IPU21) + dispatch(alone, IPU21).cycles(alone, IPU21))


@pytest.mark.parametrize("rows,cols,parts", [(1, 16, 2), (82, 32, 6), (7, 40, 27), (3, 8, 2), (100, 3, 4)])
@pytest.mark.parametrize("dt", [FP16, FP32])
def test_the_fused_reducer_floor_bounds_every_block_shape_of_at_least_its_elements(rows, cols, parts, dt):
    for cast in (None, FP8):
        call = ReduceCall(rows * cols, parts, dt, FP16, bias_cols=cols, gelu="tanh", cast_to=cast)
        assert cy.reduce_gelu_floor(rows * cols, parts, dt, cast, IPU21) <= cy.reduce_gelu_cycles(call, IPU21)


def _rng_fp16(rng, n, std):
    return rng.normal(0, std, n).astype(np.float16)


def test_the_reduction_epilogues_compute_what_the_unfused_ops_would_store():
    rng = np.random.default_rng(3)
    rows, cols, parts = 5, 16, 3
    partials = _rng_fp16(rng, parts * rows * cols, 2.0)
    bias = _rng_fp16(rng, cols, 1.0)
    fused = ReduceCall(rows * cols, parts, FP16, FP16, bias_cols=cols, gelu="tanh", cast_to=FP8, cast_scale=-2)
    got = REG["reduce_bias_gelu_cast_fp16"].reference(fused, partials, bias)
    summed = REG["reduce_bias_fp16"].reference(ReduceCall(rows * cols, parts, FP16, FP16, bias_cols=cols),
                                               partials, bias)
    g = REG["gelu_fp16"].reference(GeLUCall(rows * cols, FP16), summed)
    want = REG["cast_fp16_fp8"].reference(CastCall(rows * cols, FP16, FP8, out_scale=-2), g)
    assert got.dtype == FP8.numpy
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))
    cast_only = ReduceCall(rows * cols, parts, FP16, FP16, cast_to=FP8)
    plain = REG["reduce_fp16"].reference(ReduceCall(rows * cols, parts, FP16, FP16), partials)
    assert np.array_equal(REG["reduce_cast_fp16"].reference(cast_only, partials).view(np.uint8),
                          quantise(plain.astype(np.float64), FP8).view(np.uint8))


def test_bias_gelu_with_fp8_output_is_the_bias_gelu_then_the_cast():
    rng = np.random.default_rng(4)
    a, bias = _rng_fp16(rng, 4 * 32, 400.0), _rng_fp16(rng, 32, 3.0)
    g = REG["bias_gelu_fp16"].reference(BiasGeLUCall(4, 32, FP16), a, bias)
    want = REG["cast_fp16_fp8"].reference(CastCall(128, FP16, FP8, out_scale=1), g)
    got = REG["bias_gelu_fp16_fp8"].reference(BiasGeLUCall(4, 32, FP16, cast_to=FP8, cast_scale=1), a, bias)
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))
    assert np.abs(got.astype(np.float32)).max() == 240          # saturated, not NaN


def test_epilogue_fields_are_checked():
    with pytest.raises(TileplanError, match="GeLU epilogue needs a bias row"):
        ReduceCall(16, 2, FP16, FP16, gelu="tanh")
    with pytest.raises(TileplanError, match="cast_to must be None or fp8"):
        ReduceCall(16, 2, FP16, FP16, cast_to=FP16)
    with pytest.raises(TileplanError, match="cast_scale 3 given without a cast_to"):
        BiasGeLUCall(1, 16, FP16, cast_scale=3)
    assert ReduceCall(32, 2, FP16, FP16, bias_cols=16, gelu="erf", cast_to=FP8).key() == \
        "reduce_fp16_fp16_bias_gelu_erf_to_fp8"


def test_an_fp8_epilogue_needs_an_fp8_target():
    ipu2 = load_target("ipu2")
    with pytest.raises(TileplanError, match="needs a target with FP8"):
        dispatch(ReduceCall(32, 2, FP16, FP16, cast_to=FP8), ipu2)
