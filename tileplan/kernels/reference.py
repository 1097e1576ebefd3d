"""Numpy semantics of the tile kernels: exactly what one vertex call computes.

Operands are the flat tile buffers of a call (``x.shape[-1]`` is the operand's
element count); a leading batch axis (one row per tile, say) is allowed and
carried through, so the IPU model can run one call over many tiles at once.
FP8 operands are ``ml_dtypes.float8_e4m3fnuz`` arrays or their raw ``uint8``
bytes. Results are flat arrays of the output type (FP8 as float8_e4m3fnuz).

Arithmetic follows the tile: inputs widen to FP32, arithmetic is FP32,
transcendentals are evaluated in float64 and rounded to FP32 (a correctly
rounded stand-in for the tile's FP32 library functions), and the result is
rounded once to the output type. FP8 outputs saturate to +-240 and keep NaN.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ..errors import TileplanError
from ..graph.dtypes import DType, dequantise, quantise
from .calls import BiasGeLUCall, CastCall, CopyCall, GeLUCall, MatMulCall, PackCall, ReduceCall, UnpackCall


def operand(x: np.ndarray, dtype: DType, size: int, what: str) -> np.ndarray:
    """``x`` as a ``[batch, size]`` array of ``dtype`` (uint8 bytes view as FP8)."""
    x = np.asarray(x)
    if dtype is DType.FP8 and x.dtype == np.uint8:
        x = x.view(dtype.numpy)
    if x.dtype != dtype.numpy:
        raise TileplanError(f"kernel operand {what}: expected {dtype} ({dtype.numpy}), got {x.dtype}")
    if x.ndim == 0 or x.shape[-1] != size:
        raise TileplanError(f"kernel operand {what}: expected {size} elements on the last axis, got shape {x.shape}")
    return x.reshape(-1, size)


def _result(y: np.ndarray, batch_shape: tuple[int, ...]) -> np.ndarray:
    return y.reshape(batch_shape + y.shape[-1:])


def round_to(values32: np.ndarray, dtype: DType, scale_exp: int = 0) -> np.ndarray:
    """Round FP32 values, times ``2**scale_exp``, into ``dtype`` (FP8 saturating)."""
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = values32.astype(np.float32, copy=False)
        if scale_exp:
            scaled = np.ldexp(scaled, np.int32(scale_exp)).astype(np.float32)
        if dtype is DType.FP16:
            # The same bits as quantise's float64 route (an FP32 value is exact in float64; both
            # conversions round to nearest even once), without widening every element to float64.
            return scaled.astype(np.float16)
        return quantise(scaled, dtype)


@functools.cache
def _fp8_f32() -> np.ndarray:
    """Every FP8 value in FP32, by its byte (made on the first FP8 operand: ``graph.dtypes`` imports
    ml_dtypes only when an FP8 array is made)."""
    return np.arange(256, dtype=np.uint8).view(DType.FP8.numpy).astype(np.float32)


def _f32(x: np.ndarray) -> np.ndarray:
    """``x.astype(np.float32)``; FP8 through a table of its 256 values (the same bits, a few times faster
    than ml_dtypes' cast), into an array of the layout ``astype`` makes."""
    if x.dtype.itemsize == 1 and x.dtype == DType.FP8.numpy:
        out = np.empty_like(x, dtype=np.float32)
        np.take(_fp8_f32(), x.view(np.uint8), out=out)
        return out
    return x.astype(np.float32)


# ---- matmul / reduce --------------------------------------------------------------

def panels_to_rows(b: np.ndarray, k: int, n: int, grain: int) -> np.ndarray:
    """``[batch, k*n]`` panel buffers -> ``[batch, k, n]`` row-major: the whole panels, each
    ``k x grain``, then the partial last panel ``k x (n % grain)`` if ``grain`` does not divide ``n``."""
    b = b.reshape(-1, k * n)
    batch, whole = len(b), n // grain
    head = b[:, :k * whole * grain].reshape(batch, whole, k, grain).transpose(0, 2, 1, 3)
    tail = b[:, k * whole * grain:].reshape(batch, k, n - whole * grain)
    return np.concatenate((head.reshape(batch, k, whole * grain), tail), axis=2)


def matmul(call: MatMulCall, a: np.ndarray, b: np.ndarray, cin: np.ndarray | None = None) -> np.ndarray:
    """FP32 products and accumulation (numpy/BLAS order), ``* 2**out_scale``,
    rounded to ``call.partials``; with ``call.accumulate`` the partials ``cin`` are
    added (in FP32) before the rounding. Products of FP16 or FP8 values are exact
    in FP32; only the summation order can differ from the tile's."""
    a2 = operand(a, call.in_dtype, call.m * call.k, "A")
    b2 = operand(b, call.in_dtype, call.k * call.n, "B")
    batch = np.asarray(a).shape[:-1]
    bm = panels_to_rows(b2, call.k, call.n, call.grain) if call.b_format == "panels" else b2.reshape(-1, call.k, call.n)
    c = np.matmul(_f32(a2).reshape(-1, call.m, call.k), _f32(bm))
    if call.accumulate:
        if cin is None:
            raise ValueError("an accumulating matmul needs its input partials cin")
        c0 = _f32(operand(cin, call.partials, call.m * call.n, "cin")).reshape(-1, call.m, call.n)
        total = (c0 + np.ldexp(c, np.int32(call.out_scale)).astype(np.float32)).astype(np.float32)
        return _result(round_to(total, call.partials).reshape(-1, call.m * call.n), batch)
    return _result(round_to(c, call.partials, call.out_scale).reshape(-1, call.m * call.n), batch)


def reduce(call: ReduceCall, partials: np.ndarray, *more: np.ndarray) -> np.ndarray:
    """Sum in part order in FP32, then the bias row when ``call.bias_cols`` (one more addend,
    repeated over the ``n / bias_cols`` rows), ``* 2**out_scale``, round to ``out_dtype``.
    With ``call.own`` the partials come as two inputs, the reducer's own partial first (summed
    first) and the other ``parts - 1``; the bias, if any, follows them."""
    if call.own:
        if not more:
            raise ValueError("a reduction with its own partial in place needs the other partials too")
        others, *more = more
        own = operand(partials, call.in_dtype, call.n, "own").reshape(-1, 1, call.n)
        rest = operand(others, call.in_dtype, (call.parts - 1) * call.n, "others").reshape(-1, call.parts - 1,
                                                                                            call.n)
        x = np.concatenate([own, rest], axis=1)
    else:
        x = operand(partials, call.in_dtype, call.parts * call.n, "partials").reshape(-1, call.parts, call.n)
    bias = more[0] if more else None
    acc = np.zeros((x.shape[0], call.n), np.float32)
    for p in range(call.parts):
        acc += _f32(x[:, p])
    if call.bias_cols:
        if bias is None:
            raise ValueError("a reduction with a bias row needs its bias operand")
        acc += np.tile(_f32(operand(bias, call.out_dtype, call.bias_cols, "bias")), (1, call.n // call.bias_cols))
    y = round_to(acc, call.out_dtype, call.out_scale)
    return _result(epilogue(y, call.out_dtype, call.gelu, call.cast_to, call.cast_scale),
                   np.asarray(partials).shape[:-1])


def epilogue(y: np.ndarray, dtype: DType, gelu: str, cast_to: DType | None, cast_scale: int) -> np.ndarray:
    """A fused epilogue on a result ``y`` already rounded to ``dtype``: GeLU in FP32 rounded to
    ``dtype`` (as the unfused GeLU stores it) when ``gelu``, then a saturating cast to ``cast_to``
    with its scale (as the unfused Cast) when given."""
    if gelu:
        y = round_to(gelu32(_f32(y), gelu), dtype)
    if cast_to is not None:
        with np.errstate(over="ignore", invalid="ignore"):
            y = quantise(dequantise(y, dtype, 0), cast_to, cast_scale)
    return y


# ---- elementwise ------------------------------------------------------------------

from ..graph.numerics import erf  # noqa: E402  (one erf for the graph reference and the kernels)


_SQRT_2_PI = np.float32(math.sqrt(2.0 / math.pi))
_GELU_CUBIC = np.float32(0.044715)
_INV_SQRT2 = np.float32(1.0 / math.sqrt(2.0))


def gelu32(x: np.ndarray, approximate: str) -> np.ndarray:
    """GeLU of FP32 values in FP32 arithmetic (transcendental in float64 -> FP32).

    tanh: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``;
    erf:  ``0.5 x (1 + erf(x / sqrt 2))``.
    """
    x = x.astype(np.float32)
    half, one = np.float32(0.5), np.float32(1.0)
    with np.errstate(over="ignore", invalid="ignore"):
        if approximate == "tanh":
            inner = _SQRT_2_PI * (x + _GELU_CUBIC * x * x * x)
            t = np.tanh(inner.astype(np.float64)).astype(np.float32)
        else:
            t = erf((x * _INV_SQRT2).astype(np.float64)).astype(np.float32)
        return half * x * (one + t)


def gelu(call: GeLUCall, x: np.ndarray) -> np.ndarray:
    x2 = operand(x, call.dtype, call.n, "in")
    return _result(round_to(gelu32(_f32(x2), call.approximate), call.dtype), np.asarray(x).shape[:-1])


def bias_gelu(call: BiasGeLUCall, a: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """``gelu(a + bias)`` in one pass; the sum is rounded to ``dtype`` in registers before the
    GeLU, so the fused kernel computes exactly what the unfused Add then GeLU would."""
    a2 = operand(a, call.dtype, call.size, "a")
    b2 = np.tile(operand(bias, call.dtype, call.cols, "bias"), (1, call.rows))
    s = round_to(_f32(a2) + _f32(b2), call.dtype)
    return _result(epilogue(s, call.dtype, call.approximate, call.cast_to, call.cast_scale), np.asarray(a).shape[:-1])


def cast(call: CastCall, x: np.ndarray) -> np.ndarray:
    """``quantise(dequantise(x, in, in_scale), out, out_scale)``: exact for every
    pair here, since the float64 intermediate holds any FP32/FP16/FP8 value
    times a power of two exactly."""
    x2 = operand(x, call.in_dtype, call.n, "in")
    with np.errstate(over="ignore", invalid="ignore"):
        y = quantise(dequantise(x2, call.in_dtype, call.in_scale), call.out_dtype, call.out_scale, call.saturate)
    return _result(y, np.asarray(x).shape[:-1])


# ---- rearrangement ----------------------------------------------------------------

def _check_whole_panels(rows: int, cols: int, grain: int) -> int:
    if cols % grain:
        raise TileplanError(f"panels of grain {grain} need cols % grain == 0, got cols {cols}")
    return cols // grain


def pack(call: PackCall, x: np.ndarray) -> np.ndarray:
    """Row-major ``[rows, cols]`` -> panels ``[cols/grain, rows, grain]``."""
    x2 = operand(x, call.dtype, call.size, "in")
    p = _check_whole_panels(call.rows, call.cols, call.grain)
    y = x2.reshape(-1, call.rows, p, call.grain).transpose(0, 2, 1, 3).reshape(-1, call.size)
    return _result(y, np.asarray(x).shape[:-1])


def unpack(call: UnpackCall, x: np.ndarray) -> np.ndarray:
    """Panels ``[cols/grain, rows, grain]`` -> row-major ``[rows, cols]``."""
    x2 = operand(x, call.dtype, call.size, "in")
    p = _check_whole_panels(call.rows, call.cols, call.grain)
    y = x2.reshape(-1, p, call.rows, call.grain).transpose(0, 2, 1, 3).reshape(-1, call.size)
    return _result(y, np.asarray(x).shape[:-1])


def copy(call: CopyCall, x: np.ndarray) -> np.ndarray:
    """Bytes in, the same bytes out (``uint8``)."""
    x = np.asarray(x)
    if x.dtype != np.uint8 or x.shape[-1] != call.nbytes:
        raise TileplanError(f"kernel operand in: expected {call.nbytes} uint8 bytes on the last axis, "
                            f"got {x.dtype} shape {x.shape}")
    return x.copy()
