"""Each variant's numpy semantics against plain numpy / float64 formulations."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from tileplan.errors import TileplanError
from tileplan.graph.dtypes import DType
from tileplan.kernels import (BinaryCall, BiasGeLUCall, CastCall, CopyCall, GeLUCall, MatMulCall, PackCall, ReduceCall,
                              UnpackCall, default_registry)
from tileplan.kernels.reference import erf

FP8, FP16, FP32 = DType.FP8, DType.FP16, DType.FP32
E4M3 = ml_dtypes.float8_e4m3fnuz
REG = default_registry()


def rand(rng, dtype: DType, shape, std=1.0):
    x = rng.normal(0, std, shape)
    if dtype is FP8:
        return np.clip(x, -240, 240).astype(np.float32).astype(E4M3)
    return x.astype(dtype.numpy)


def ulp(x: np.ndarray, dtype: DType) -> np.ndarray:
    return np.abs(np.spacing(np.abs(x.astype(dtype.numpy)))).astype(np.float64)


def pack_rows(b: np.ndarray, grain: int) -> np.ndarray:
    """Plain-loop reference of the panel format: panel p = b[:, p*g:(p+1)*g] (the last one may be narrower)."""
    k, n = b.shape
    return np.concatenate([b[:, p * grain:(p + 1) * grain].reshape(-1) for p in range(-(-n // grain))])


# ---- matmul -----------------------------------------------------------------------

@pytest.mark.parametrize("variant, dt, part", [("amp_fp32", FP32, FP32), ("amp_fp16_fp16", FP16, FP16),
                                               ("amp_fp16_fp32", FP16, FP32), ("amp_fp8_fp16", FP8, FP16),
                                               ("vmac", FP16, FP16)])
def test_matmul_reference_is_the_float64_product_rounded_to_partials(variant, dt, part):
    rng = np.random.default_rng(1)
    m, k, n, scale = 9, 96, 64, -2
    a, b = rand(rng, dt, (m, k), 2.0), rand(rng, dt, (k, n), 2.0)
    call = MatMulCall(m, n, k, dt, part, out_scale=scale)
    got = REG[variant].reference(call, a.reshape(-1), b.reshape(-1)).astype(np.float64).reshape(m, n)
    exact = (a.astype(np.float64) @ b.astype(np.float64)) * 2.0 ** scale
    # FP32 accumulation of exact products: the error is at most k * 2^-24 * sum|a*b| before rounding.
    bound = k * 2.0 ** -24 * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))) * 2.0 ** scale
    assert np.all(np.abs(got - exact) <= ulp(exact, part) + bound)
    assert REG[variant].reference(call, a.reshape(-1), b.reshape(-1)).dtype == part.numpy


@pytest.mark.parametrize("dt, grain", [(FP16, 16), (FP8, 32), (FP32, 8)])
def test_matmul_panels_and_rows_give_identical_bits(dt, grain):
    rng = np.random.default_rng(2)
    m, k, n = 5, 40, 3 * grain
    a, b = rand(rng, dt, (m, k)), rand(rng, dt, (k, n))
    part = FP32 if dt is FP32 else FP16
    rows = REG["vmac"].reference(MatMulCall(m, n, k, dt, part), a.reshape(-1), b.reshape(-1))
    panels = REG["vmac"].reference(MatMulCall(m, n, k, dt, part, b_format="panels", grain=grain),
                                   a.reshape(-1), pack_rows(b, grain))
    assert rows.tobytes() == panels.tobytes()


@pytest.mark.parametrize("variant, dt, grain, n", [("amp_fp8_fp16", FP8, 32, 48), ("amp_fp8_fp16", FP8, 32, 4304),
                                                   ("amp_fp16_fp16", FP16, 16, 36), ("amp_fp32", FP32, 8, 10)])
def test_matmul_with_a_partial_last_panel_reads_the_narrow_panel_and_matches_row_major_b(variant, dt, grain, n):
    rng = np.random.default_rng(3)
    m, k = 6, 40
    a, b = rand(rng, dt, (m, k)), rand(rng, dt, (k, n))
    part = FP32 if dt is FP32 else FP16
    packed = pack_rows(b, grain)
    assert packed.size == k * n                               # no padding in the narrow panel
    call = MatMulCall(m, n, k, dt, part, b_format="panels", grain=grain)
    rows = REG[variant].reference(MatMulCall(m, n, k, dt, part), a.reshape(-1), b.reshape(-1))
    assert REG[variant].reference(call, a.reshape(-1), packed).tobytes() == rows.tobytes()
    both = REG[variant].reference(call, np.stack([a.reshape(-1)] * 2), np.stack([packed] * 2))   # batched over tiles
    assert both[1].tobytes() == rows.tobytes()


def test_fp8_matmul_reads_raw_bytes_propagates_nan_and_overflows_fp16_to_inf():
    m, k, n = 2, 8, 32
    a = np.full((m, k), 240.0, np.float32).astype(E4M3)
    a[1, 3] = np.nan
    b = np.full((k, n), 240.0, np.float32).astype(E4M3)
    call = MatMulCall(m, n, k, FP8, FP16)
    c = REG["amp_fp8_fp16"].reference(call, a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8))
    assert np.all(np.isposinf(c[:n])) and np.all(np.isnan(c[n:]))       # 8 * 240^2 > 65504


def test_reference_carries_a_leading_batch_axis():
    rng = np.random.default_rng(3)
    call = MatMulCall(3, 16, 8, FP16, FP16)
    a, b = rand(rng, FP16, (4, 24)), rand(rng, FP16, (4, 128))
    batched = REG["amp_fp16_fp16"].reference(call, a, b)
    assert batched.shape == (4, 48)
    for t in range(4):
        assert batched[t].tobytes() == REG["amp_fp16_fp16"].reference(call, a[t], b[t]).tobytes()


def test_reference_refuses_operands_of_the_wrong_type_or_size():
    call = MatMulCall(2, 2, 2, FP16, FP16)
    with pytest.raises(TileplanError, match="expected fp16"):
        REG["amp_fp16_fp16"].reference(call, np.zeros(4, np.float32), np.zeros(4, np.float16))
    with pytest.raises(TileplanError, match="expected 4 elements"):
        REG["amp_fp16_fp16"].reference(call, np.zeros(5, np.float16), np.zeros(4, np.float16))


# ---- reduce, add ------------------------------------------------------------------

@pytest.mark.parametrize("variant, dt, out", [("reduce_fp16", FP16, FP16), ("reduce_fp16", FP16, FP32),
                                              ("reduce_fp32", FP32, FP16)])
def test_reduce_sums_parts_in_fp32_order(variant, dt, out):
    rng = np.random.default_rng(4)
    x = rand(rng, dt, (5, 33), 3.0)
    got = REG[variant].reference(ReduceCall(33, 5, dt, out, out_scale=1), x.reshape(-1))
    acc = np.zeros(33, np.float32)
    for p in range(5):
        acc = (acc + x[p].astype(np.float32)).astype(np.float32)
    assert got.tobytes() == (acc * np.float32(2)).astype(out.numpy).tobytes()


@pytest.mark.parametrize("variant, dt, out", [("reduce_bias_fp16", FP16, FP16), ("reduce_bias_fp16", FP16, FP32),
                                              ("reduce_bias_fp32", FP32, FP16)])
def test_reduce_adds_the_bias_row_as_one_more_addend_before_the_one_rounding(variant, dt, out):
    rng = np.random.default_rng(6)
    x, bias = rand(rng, dt, (3, 4, 11), 3.0), rand(rng, out, (11,), 3.0)
    call = ReduceCall(44, 3, dt, out, out_scale=-1, bias_cols=11)
    got = REG[variant].reference(call, x.reshape(-1), bias)
    acc = np.zeros((4, 11), np.float32)
    for p in range(3):
        acc = (acc + x[p].astype(np.float32)).astype(np.float32)
    acc = (acc + bias.astype(np.float32)).astype(np.float32)
    assert got.tobytes() == (acc * np.float32(0.5)).astype(out.numpy).reshape(-1).tobytes()
    # The unfused path rounds the sum to the output type, then the Add rounds again.
    if out is FP16:
        plain = REG[variant.replace("_bias", "")].reference(ReduceCall(44, 3, dt, out, out_scale=-1), x.reshape(-1))
        two_roundings = REG["binary_vector"].reference(BinaryCall(4, 11, FP16, "row_broadcast"), plain,
                                                    (bias * np.float16(0.5)).astype(np.float16))
        assert np.allclose(got.astype(np.float64), two_roundings.astype(np.float64), rtol=2e-3, atol=2e-3)
    with pytest.raises(ValueError, match="bias operand"):
        REG[variant].reference(call, x.reshape(-1))


@pytest.mark.parametrize("variant", ["binary_vector", "binary_pairs"])
@pytest.mark.parametrize("dt", [FP16, FP32])
def test_add_dense_and_row_broadcast_round_the_fp32_sum_once(variant, dt):
    rng = np.random.default_rng(5)
    a, b, bias = rand(rng, dt, (6, 8), 1e3), rand(rng, dt, (6, 8), 1e3), rand(rng, dt, (8,), 1e3)
    dense = REG[variant].reference(BinaryCall(6, 8, dt, "dense"), a.reshape(-1), b.reshape(-1))
    assert dense.tobytes() == (a.astype(np.float32) + b.astype(np.float32)).astype(dt.numpy).tobytes()
    bcast = REG[variant].reference(BinaryCall(6, 8, dt, "row_broadcast"), a.reshape(-1), bias)
    assert bcast.tobytes() == (a.astype(np.float32) + bias.astype(np.float32)).astype(dt.numpy).tobytes()


# ---- GeLU -------------------------------------------------------------------------

def gelu64(x: float, form: str) -> float:
    if form == "erf":
        return 0.5 * x * (1.0 + math.erf(x / math.sqrt(2.0)))
    return 0.5 * x * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


@pytest.mark.parametrize("dt", [FP16, FP32])
@pytest.mark.parametrize("form", ["tanh", "erf"])
def test_gelu_matches_the_float64_formula_within_an_ulp(dt, form):
    x = np.linspace(-8, 8, 2001).astype(dt.numpy)
    got = REG[f"gelu_{dt}"].reference(GeLUCall(x.size, dt, form), x).astype(np.float64)
    want = np.array([gelu64(float(v), form) for v in x])
    # FP32 evaluation: 1 + t loses up to |x|/2 ulp(1) absolutely; then one rounding to dtype.
    assert np.all(np.abs(got - want) <= ulp(want, dt) + np.abs(x.astype(np.float64)) * 2.0 ** -22)


def test_erf_is_within_double_rounding_of_math_erf():
    x = np.concatenate([np.linspace(-7, 7, 20001), [0.0, 0.5, -0.5, 4.0, -4.0, 30.0, -30.0]])
    want = np.array([math.erf(v) for v in x])
    assert np.max(np.abs(erf(x) - want)) < 1e-15
    assert np.isnan(erf(np.array([np.nan]))[0])


@pytest.mark.parametrize("dt", [FP16, FP32])
def test_bias_gelu_equals_the_unfused_add_then_gelu(dt):
    rng = np.random.default_rng(6)
    a, bias = rand(rng, dt, (4, 24), 2.0), rand(rng, dt, (24,))
    got = REG[f"bias_gelu_{dt}"].reference(BiasGeLUCall(4, 24, dt, "erf"), a.reshape(-1), bias)
    s = (a.astype(np.float32) + bias.astype(np.float32)).astype(dt.numpy).reshape(-1)   # the Add's stored sum
    want = REG[f"gelu_{dt}"].reference(GeLUCall(s.size, dt, "erf"), s)
    assert got.tobytes() == want.tobytes()


# ---- casts ------------------------------------------------------------------------

def test_cast_into_fp8_saturates_keeps_nan_and_has_no_negative_zero():
    x = np.array([300.0, -1000.0, np.inf, -np.inf, np.nan, 240.0, 247.9, -0.0, -1e-9, 0.0009765625, 1.5], np.float32)
    got = REG["cast_convert"].reference(CastCall(x.size, FP32, FP8), x).view(np.uint8)
    assert list(got) == [0x7F, 0xFF, 0x7F, 0xFF, 0x80, 0x7F, 0x7F, 0x00, 0x00, 0x01, 0x44]


def test_cast_scales_divide_into_fp8_and_multiply_out_of_it():
    x = np.array([1.0, 3.0, 1000.0, -2.0], np.float16)
    q = REG["cast_fp16_fp8"].reference(CastCall(4, FP16, FP8, out_scale=2), x)
    assert list(q.astype(np.float32)) == [0.25, 0.75, 240.0, -0.5]          # 1000/4 = 250 saturates
    back = REG["cast_convert"].reference(CastCall(4, FP8, FP16, in_scale=2), q)
    assert list(back.astype(np.float32)) == [1.0, 3.0, 960.0, -2.0]


def test_cast_fp32_to_fp16_rounds_to_nearest_even_and_overflows_to_inf():
    x = np.array([1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 65520.0, 1e9, -1e9], np.float32)
    got = REG["cast_fp32_fp16"].reference(CastCall(5, FP32, FP16), x)
    assert list(got.astype(np.float64)) == [1.0, 1 + 2.0 ** -9, np.inf, np.inf, -np.inf]


@settings(max_examples=60, deadline=None)
@given(arrays(np.float32, st.integers(1, 64), elements=st.floats(width=32, allow_nan=True)),
       st.integers(-8, 8))
def test_cast_into_fp8_equals_ml_dtypes_of_the_clipped_scaled_value(x, scale):
    got = REG["cast_convert"].reference(CastCall(x.size, FP32, FP8, out_scale=scale), x)
    y = x.astype(np.float64) * 2.0 ** -scale
    with np.errstate(invalid="ignore"):
        want = np.where(np.isnan(y), np.nan, np.clip(y, -240, 240)).astype(np.float32).astype(E4M3)
    assert got.view(np.uint8).tobytes() == want.view(np.uint8).tobytes()


def test_every_fp8_value_survives_a_round_trip_through_fp16():
    q = np.arange(256, dtype=np.uint8).view(E4M3)
    h = REG["cast_convert"].reference(CastCall(256, FP8, FP16), q)
    back = REG["cast_fp16_fp8"].reference(CastCall(256, FP16, FP8), h)
    assert back.view(np.uint8).tobytes() == q.view(np.uint8).tobytes()


# ---- rearrangement ----------------------------------------------------------------

@pytest.mark.parametrize("dt, grain", [(FP16, 16), (FP8, 32), (FP32, 8)])
def test_pack_matches_the_panel_loop_and_unpack_inverts_it(dt, grain):
    x = rand(np.random.default_rng(8), dt, (7, 2 * grain))
    packed = REG["pack_panels"].reference(PackCall(7, 2 * grain, dt, grain), x.reshape(-1))
    assert packed.view(np.uint8).tobytes() == pack_rows(x, grain).view(np.uint8).tobytes()
    back = REG["unpack_panels"].reference(UnpackCall(7, 2 * grain, dt, grain), packed)
    assert back.view(np.uint8).tobytes() == x.view(np.uint8).tobytes()


def test_copy_returns_the_same_bytes():
    x = np.arange(40, dtype=np.uint8)
    assert REG["copy_local"].reference(CopyCall(40), x).tobytes() == x.tobytes()


def test_a_cast_without_saturation_gives_nan_past_240_as_ml_dtypes_does():
    import ml_dtypes
    from tileplan.kernels.calls import CastCall
    from tileplan.kernels.reference import cast
    x = np.array([239.0, 247.9, 248.0, -250.0, np.inf, 1e6, -1.0], np.float32)
    got = cast(CastCall(x.size, DType.FP32, DType.FP8, saturate=False), x)
    want = x.astype(ml_dtypes.float8_e4m3fnuz)
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))
    saturated = cast(CastCall(x.size, DType.FP32, DType.FP8), x).astype(np.float32)
    assert list(saturated[2:6]) == [240.0, -240.0, 240.0, 240.0]
