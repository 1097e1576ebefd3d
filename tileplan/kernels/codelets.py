"""Poplar C++ codelets: one ``poplar::MultiVertex`` per specialisation.

A specialisation is a variant plus ``call.key()`` (types, formats, modes); the
shapes are vertex fields (``unsigned``/``int`` members), so one codelet file
serves every shape. ``variant.codelet(call)`` returns a ``CodeletSource``:

- ``key``: e.g. ``amp_fp8_fp16_panels``; the file is ``codelets/<key>.cpp``;
- ``vertex``: the C++ class name, e.g. ``AmpFp8Fp16Panels``;
- ``source``: the C++ text (identical for every call with the same key);
- ``fields``: the vertex fields in declaration order: vectors (``Input``/
  ``Output``, with their element type and length for this call) and scalar
  parameters (with their value for this call). Lowering connects the vectors
  to tile buffers and sets the parameters on each vertex.

Every vertex splits its work over ``numWorkers()`` (six) worker contexts by
``workerId``; it widens inputs to float, computes in float and rounds once to the
output type. FP8 (F143: 1 sign, 4 exponent, 3 mantissa bits, bias 8, max 240,
0x80 = NaN, no negative zero) travels as ``unsigned char`` and is decoded and
encoded by bit manipulation, rounding to nearest even and saturating.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass
from typing import Any

from ..errors import TileplanError
from ..graph.dtypes import DType


@dataclass(frozen=True)
class Field:
    """One vertex field: a vector (``direction`` "input"/"output") or a scalar
    parameter (``direction`` "param", with its ``value`` for this call)."""

    name: str
    direction: str              # "input", "output" or "param"
    ctype: str                  # C++ element or scalar type
    dtype: DType | None = None  # element type of a vector field (None: raw bytes or a param)
    size: int | None = None     # elements of a vector field for this call
    value: int | None = None    # value of a param for this call

    @property
    def is_vector(self) -> bool:
        return self.direction != "param"


@dataclass(frozen=True)
class CodeletSource:
    key: str
    vertex: str
    source: str
    fields: tuple[Field, ...]

    @property
    def filename(self) -> str:
        return f"{self.key}.cpp"

    @property
    def inputs(self) -> tuple[Field, ...]:
        return tuple(f for f in self.fields if f.direction == "input")

    @property
    def outputs(self) -> tuple[Field, ...]:
        return tuple(f for f in self.fields if f.direction == "output")

    @property
    def params(self) -> dict[str, int]:
        return {f.name: f.value for f in self.fields if f.direction == "param"}


def codelet_key(variant_name: str, call: Any) -> str:
    """The variant's name plus the call's specialisation tokens it does not
    already spell: ``amp_fp8_fp16`` + ``matmul_fp8_fp16_panels`` -> ``amp_fp8_fp16_panels``."""
    own = set(variant_name.split("_"))
    spec = call.key().split("_")[len(call.primitive.split("_")):]
    return "_".join([variant_name] + [t for t in spec if t not in own])


def camel(key: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in key.split("_"))


def _f32_literal(x: float) -> str:
    """A C++ float literal that rounds to the same FP32 value as ``x``."""
    import numpy as np
    return f"{float(np.float32(x))!r}f"


# ---- the templates ----------------------------------------------------------------

@functools.cache
def _templates():
    """The codelet templates beside this module (``templates/*.cpp.j2``).

    Design decision: the C++ of every codelet lives in template files, one per kernel family (its
    compute body) plus ``codelet.cpp.j2`` (the shared prelude, the vertex class and its fields);
    the Python side chooses the template and passes only data: element types, flags, modes and
    field names. No autoescaping (the output is C++); what reaches a template comes from variant
    names and a call's types, formats and modes, never from a model (``render`` checks the names).
    ``trim_blocks`` and ``lstrip_blocks`` make a line holding only a ``{% ... %}`` tag vanish, so
    the templates read as the C++ they emit."""
    import jinja2
    env = jinja2.Environment(loader=jinja2.PackageLoader("tileplan.kernels", "templates"),
                             autoescape=False, undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True)
    env.filters["f32"] = _f32_literal
    env.filters["rstrip"] = str.rstrip        # a macro's text without its last newline, where a line goes on
    return env


def body(template: str, **data: Any) -> str:
    """A codelet's compute body: ``templates/<template>.cpp.j2`` rendered with ``data``."""
    return _templates().get_template(f"{template}.cpp.j2").render(**data)


def _vec(direction: str, name: str, dtype: DType | None, size: int) -> Field:
    return Field(name, direction, dtype.cpp if dtype else "unsigned char", dtype, size)


def _param(name: str, value: int, ctype: str = "unsigned") -> Field:
    return Field(name, "param", ctype, value=value)


_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def render(key: str, body: str, fields: tuple[Field, ...], doc: str) -> CodeletSource:
    """The codelet of ``key``: its file ``codelets/<key>.cpp``, its vertex class ``camel(key)``.

    Design decision: the key, the field names and the doc line are made from variant names and a
    call's types, formats and modes, never from a model's names; they become a file name, C++
    identifiers and a comment as they are. So they are checked, not escaped (an escaped key would
    name another file and class): a key or field name that is not a C++ identifier, or a doc that
    is not one line of printable ASCII, is refused."""
    for what, text in [("key", key)] + [("field", f.name) for f in fields]:
        if not _IDENTIFIER.match(text):
            raise TileplanError(f"codelet {key!r}: {what} {text!r} is not a C++ identifier")
    if not all(32 <= ord(ch) < 127 for ch in doc) or "*/" in doc:
        raise TileplanError(f"codelet {key!r}: its description {doc!r} is not one line of printable ASCII")
    vertex = camel(key)
    source = _templates().get_template("codelet.cpp.j2").render(key=key, doc=doc, vertex=vertex, fields=fields,
                                                                body=body.rstrip())
    return CodeletSource(key, vertex, source, fields)


# ---- one emitter per primitive: the fields, the template's data, the doc line ------------

def matmul_codelet(call, variant) -> CodeletSource:
    key = codelet_key(variant.name, call)
    # Panels: the panel of ``col`` starts at column p0 and is ``width`` wide (``grain``, or less for
    # a partial last panel); panels before it are whole, ``k * grain`` elements each.
    cin = (_vec("input", "cin", call.partials, call.m * call.n),) if call.accumulate else ()
    fields = (_vec("input", "a", call.in_dtype, call.m * call.k),
              _vec("input", "b", call.in_dtype, call.k * call.n)) + cin + (
              _vec("output", "c", call.partials, call.m * call.n),
              _param("m", call.m), _param("n", call.n), _param("k", call.k),
              _param("grain", call.grain), _param("outScale", call.out_scale, "int"))
    code = body("matmul", panels=call.b_format == "panels", accumulate=call.accumulate, out=call.partials.cpp)
    return render(key, code, fields, f"C[m,n] = A[m,k] @ B[k,n] ({call.b_format} B), "
                                     f"{call.in_dtype} in, FP32 accumulate, {call.partials} out")


def reduce_codelet(call, variant) -> CodeletSource:
    key = codelet_key(variant.name, call)
    bias = call.bias_cols > 0
    inputs = ((_vec("input", "own", call.in_dtype, call.n),
               _vec("input", "others", call.in_dtype, (call.parts - 1) * call.n)) if call.own
              else (_vec("input", "partials", call.in_dtype, call.parts * call.n),))
    fields = (inputs
              + ((_vec("input", "bias", call.out_dtype, call.bias_cols),) if bias else ())
              + (_vec("output", "out", call.out_dtype, call.n),
                 _param("n", call.n), _param("parts", call.parts))
              + ((_param("cols", call.bias_cols),) if bias else ())
              + (_param("outScale", call.out_scale, "int"),)
              + ((_param("castScale", call.cast_scale, "int"),) if call.cast_to else ()))
    fields = tuple(dataclasses.replace(f, ctype=call.stored.cpp, dtype=call.stored) if f.name == "out" else f
                   for f in fields)
    code = body("reduce", own=bool(call.own), bias=bias, out=call.out_dtype.cpp, gelu=call.gelu,
                cast_to=call.cast_to)
    what = " plus a bias row [cols] repeated over the rows" if bias else ""
    how = "its own partial [n] in place, then the other parts - 1 [parts - 1, n]" if call.own \
        else "parts partials [parts, n]"
    return render(key, code, fields, f"sum of {how}{what} in FP32, {call.out_dtype} out"
                  + _epilogue_doc(call.gelu, call.cast_to))


def _epilogue_doc(gelu: str, cast_to) -> str:
    return ((f", then GeLU ({gelu})" if gelu else "")
            + (f", then cast to {cast_to} (saturating, power-of-two scale)" if cast_to is not None else ""))


def gelu_codelet(call, variant) -> CodeletSource:
    key = codelet_key(variant.name, call)
    fields = (_vec("input", "in", call.dtype, call.n), _vec("output", "out", call.dtype, call.n),
              _param("n", call.n))
    code = body("gelu", out=call.dtype.cpp, approximate=call.approximate)
    return render(key, code, fields, f"GeLU ({call.approximate}) in FP32, {call.dtype} out")


def bias_gelu_codelet(call, variant) -> CodeletSource:
    key = codelet_key(variant.name, call)
    fields = (_vec("input", "a", call.dtype, call.size), _vec("input", "bias", call.dtype, call.cols),
              _vec("output", "out", call.stored, call.size),
              _param("rows", call.rows), _param("cols", call.cols)) + (
              (_param("castScale", call.cast_scale, "int"),) if call.cast_to else ())
    code = body("bias_gelu", dtype=call.dtype.cpp, approximate=call.approximate, cast_to=call.cast_to)
    return render(key, code, fields, f"fused GeLU ({call.approximate}) of a + bias row, sum rounded to "
                                     f"{call.dtype} as the unfused Add would, {call.dtype} GeLU"
                                     + _epilogue_doc("", call.cast_to))


def cast_codelet(call, variant) -> CodeletSource:
    key = codelet_key(variant.name, call)
    fields = (_vec("input", "in", call.in_dtype, call.n), _vec("output", "out", call.out_dtype, call.n),
              _param("n", call.n), _param("inScale", call.in_scale, "int"),
              _param("outScale", call.out_scale, "int"))
    code = body("cast", out=call.out_dtype.cpp, saturate=call.saturate)
    what = "" if call.saturate else ", out-of-range values to NaN (no saturation)"
    return render(key, code, fields, f"cast {call.in_dtype} -> {call.out_dtype} with power-of-two scales{what}")


def _rearrange_codelet(call, variant, to_panels: bool) -> CodeletSource:
    key = codelet_key(variant.name, call)
    fields = (_vec("input", "in", call.dtype, call.size), _vec("output", "out", call.dtype, call.size),
              _param("rows", call.rows), _param("cols", call.cols), _param("grain", call.grain))
    what = "row-major -> AMP panels" if to_panels else "AMP panels -> row-major"
    return render(key, body("panels", to_panels=to_panels), fields, f"{what} ({call.dtype}, raw element copy)")


def pack_codelet(call, variant) -> CodeletSource:
    return _rearrange_codelet(call, variant, to_panels=True)


def unpack_codelet(call, variant) -> CodeletSource:
    return _rearrange_codelet(call, variant, to_panels=False)


def copy_codelet(call, variant) -> CodeletSource:
    key = codelet_key(variant.name, call)
    fields = (_vec("input", "in", None, call.nbytes), _vec("output", "out", None, call.nbytes),
              _param("nbytes", call.nbytes))
    return render(key, body("copy"), fields, "local byte copy")
