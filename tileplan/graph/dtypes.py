"""Element types: FP32, FP16 and IPU F143 FP8 with a power-of-two scale; INT32 for integer inputs.

FP8 is the IPU21's F143 format: 1 sign, 4 exponent and 3 mantissa bits, bias 8,
max 240, NaN 0x80, no negative zero, which is ``ml_dtypes.float8_e4m3fnuz``.
A tensor's FP8 value ``q`` stands for ``q * 2**scale`` (a tensor-wide power of
two); casts into FP8 divide by the scale and saturate to +-240.

INT32 carries a text model's integer inputs (token ids, an attention mask). Design decision:
integers are values a model reads, not arithmetic it does: an INT32 tensor is a graph input read
by a Gather (its indices) or a Cast to a float type; every arithmetic op refuses it (``Pointwise``
and ``Rowwise`` check their operands are float), so no integer kernel beyond those two exists.
"""

from __future__ import annotations

import enum
from functools import cache

import numpy as np


class DType(enum.Enum):
    FP32 = "fp32"
    FP16 = "fp16"
    FP8 = "fp8"
    INT32 = "int32"

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self._value_]

    @property
    def numpy(self) -> np.dtype:
        return _numpy_dtype(self._value_)

    @property
    def cpp(self) -> str:
        """The C++ element type of Poplar codelets (FP8 is carried as raw bytes)."""
        return {DType.FP32: "float", DType.FP16: "half", DType.FP8: "unsigned char", DType.INT32: "int"}[self]

    @property
    def is_float(self) -> bool:
        return self is not DType.INT32

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, text: str) -> "DType":
        aliases = {"fp32": cls.FP32, "float32": cls.FP32, "f32": cls.FP32,
                   "fp16": cls.FP16, "float16": cls.FP16, "f16": cls.FP16, "half": cls.FP16,
                   "fp8": cls.FP8, "f143": cls.FP8, "float8_e4m3fnuz": cls.FP8,
                   "int32": cls.INT32, "i32": cls.INT32}
        try:
            return aliases[str(text).lower()]
        except KeyError:
            raise ValueError(f"unknown dtype {text!r} (expected fp32, fp16, fp8 or int32)") from None


_ITEMSIZE = {"fp32": 4, "fp16": 2, "fp8": 1, "int32": 4}     # bytes per element, by DType value


@cache
def _numpy_dtype(value: str) -> np.dtype:
    """The numpy dtype of a ``DType`` value.

    Design decision: ml_dtypes is imported here, on the first FP8 array, not with this module:
    importing it registers its casts with numpy, about 2 s of CPU with ml_dtypes 0.7 and numpy 2.4,
    and planning, ``show`` and ``machines`` never make an FP8 array (lowering's parameter values,
    the IPU model and the importers do)."""
    if value == "fp8":
        import ml_dtypes
        return np.dtype(ml_dtypes.float8_e4m3fnuz)
    return np.dtype({"fp32": np.float32, "fp16": np.float16, "int32": np.int32}[value])

FP8_MAX = 240.0  # ml_dtypes.float8_e4m3fnuz max finite; IPU F143 saturation bound


def quantise(values: np.ndarray, dtype: DType, scale: int = 0, saturate: bool = True) -> np.ndarray:
    """Round float values into ``dtype`` storage; FP8 divides by 2**scale and saturates.

    NaN stays NaN (FP8 NaN is 0x80). Infinities saturate for FP8 (F143 has none).
    ``saturate=False`` (ONNX Cast's ``saturate=0``): an FP8 value that rounds past +-240
    (magnitude 248 and up, infinities) becomes NaN instead, as ml_dtypes' conversion does.
    """
    x = np.asarray(values, dtype=np.float64)
    if dtype is DType.INT32:
        return _integers(x)
    if dtype is DType.FP8:
        y = x * (2.0 ** -scale)
        if saturate:
            y = np.where(np.isnan(y), np.nan, np.clip(y, -FP8_MAX, FP8_MAX))
        with np.errstate(over="ignore", invalid="ignore"):
            return y.astype(np.float32).astype(dtype.numpy)
    if dtype is DType.FP16:
        with np.errstate(over="ignore"):
            return x.astype(np.float16)
    return x.astype(np.float32)


def _integers(x: np.ndarray) -> np.ndarray:
    """Whole numbers in the int32 range as int32; anything else is refused (an index or a mask
    rounded silently would compute something else than the user gave)."""
    bad = ~np.isfinite(x) | (x != np.round(x)) | (np.abs(x) > 2.0 ** 31 - 1)
    if bad.any():
        raise ValueError(f"int32 values must be whole numbers within +-(2**31 - 1), got {float(x[bad].flat[0]):g}")
    return x.astype(np.int32)


def dequantise(stored: np.ndarray, dtype: DType, scale: int = 0) -> np.ndarray:
    """The float64 values a stored tensor stands for (FP8 times 2**scale)."""
    x = np.asarray(stored).astype(np.float64)
    return x * (2.0 ** scale) if dtype is DType.FP8 else x
