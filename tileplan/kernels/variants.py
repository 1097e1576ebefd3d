"""The variant table: every registered kernel, one row each, registered by a loop.

Each row names the variant, its primitive, families, priority, predicates (a
reason string per test), cycle formula (``cycles.py``), numpy semantics
(``reference.py``) and codelet emitter (``codelets.py``); primitives in their own module
(``pointwise``, ``rearrange``, ``layernorm``, ``softmax``, ``rowreduce``) contribute their rows
through ``variants()``. Priorities: a specialised kernel 10, a general fallback 0 (ties on cycles
only).
"""

from __future__ import annotations

from ..graph.dtypes import DType
from . import codelets as cl
from . import cycles as cy
from . import gather, layernorm, pointwise, rearrange, rowreduce, softmax
from . import reference as ref
from .registry import BOTH, FALLBACK, SPECIAL, Predicate, Registry, Variant, in_, is_

FP8, FP16, FP32 = DType.FP8, DType.FP16, DType.FP32


# ---- predicate builders (each returns a Predicate with its human reason) -------

def target_has_amp(dtype: DType, partials: DType) -> Predicate:
    name = f"amp_{dtype}" + (f"_{partials}" if (dtype, partials) == (FP16, FP32) else "")
    return Predicate(f"target has {dtype}->{partials} AMP ({name} > 0)",
                     lambda c, t: t.amp_flops(dtype, partials) > 0)


TARGET_HAS_FP8 = Predicate("target has FP8 (amp_fp8 > 0)", lambda c, t: t.amp_fp8 > 0)


def k_fills_64bit_loads(dtype: DType) -> Predicate:
    lanes = 8 // dtype.itemsize
    return Predicate(f"k % {lanes} == 0 (A rows start 64-bit aligned for AMP loads)",
                     lambda c, t: c.k % lanes == 0)


PANELS_MATCH_GRAIN = Predicate("panels: grain == target grain for in_dtype",
                               lambda c, t: c.b_format != "panels" or c.grain == t.grain(c.in_dtype))
# A partial last panel (n % grain != 0) is fine for the AMP, which feeds C in groups of 16 columns and
# prices a narrow group as a whole one (cycles.amp_interleaved_cycles), as long as its rows start on
# 64-bit boundaries: (n % grain) * itemsize a multiple of 8 bytes (layout.panels.panels_fit).
PANEL_ROWS_ALIGNED = Predicate("panels: (n % grain) * itemsize % 8 == 0 (a partial last panel's rows start "
                               "64-bit aligned)",
                               lambda c, t: c.b_format != "panels" or (c.n % c.grain) * c.in_dtype.itemsize % 8 == 0)


def amp_matmul(name: str, dtype: DType, partials: DType) -> Variant:
    preds = [is_("in_dtype", dtype), is_("partials", partials), target_has_amp(dtype, partials),
             k_fills_64bit_loads(dtype), PANELS_MATCH_GRAIN, PANEL_ROWS_ALIGNED]
    return Variant(name, "matmul", BOTH, SPECIAL, tuple(preds), cy.matmul_cycles, ref.matmul,
                   cl.matmul_codelet, doc=f"AMP {dtype} x {dtype} -> {partials}")


def k_off_64bit_loads(dtype: DType) -> Predicate:
    lanes = 8 // dtype.itemsize
    return Predicate(f"k % {lanes} != 0 (A rows off 64-bit boundaries: repacked first)",
                     lambda c, t: c.k % lanes != 0)


def amp_repack_matmul(name: str, dtype: DType, partials: DType) -> Variant:
    """The AMP on an A block whose rows are not whole 64-bit words (an odd K: 729 keys in ``P V``):
    the vertex first copies A into rows padded to whole words (``cycles.amp_repack_cycles``)."""
    preds = [is_("in_dtype", dtype), is_("partials", partials), target_has_amp(dtype, partials),
             k_off_64bit_loads(dtype), PANELS_MATCH_GRAIN, PANEL_ROWS_ALIGNED]
    return Variant(name, "matmul", BOTH, SPECIAL, tuple(preds), cy.amp_repack_cycles, ref.matmul,
                   cl.matmul_codelet, doc=f"AMP {dtype} x {dtype} -> {partials}, A repacked to 64-bit rows")


VMAC_PAIRS = ((FP32, FP32), (FP16, FP16), (FP16, FP32), (FP8, FP16))
VMAC_TYPES = Predicate("(in_dtype, partials) is fp32->fp32, fp16->fp16, fp16->fp32 or fp8->fp16",
                       lambda c, t: (c.in_dtype, c.partials) in VMAC_PAIRS)
FP8_NEEDS_TARGET = Predicate("fp8 operands need a target with FP8 (amp_fp8 > 0)",
                             lambda c, t: c.in_dtype is not FP8 or t.amp_fp8 > 0)


def elementwise(name: str, primitive: str, dtype: DType, cycles, reference, codelet) -> Variant:
    return Variant(name, primitive, BOTH, SPECIAL, (is_("dtype", dtype),), cycles, reference, codelet)


FITTED_CASTS = ((FP16, FP8), (FP32, FP16))
CAST_SIDES_FP8 = Predicate("an fp8 side needs a target with FP8 (amp_fp8 > 0)",
                           lambda c, t: FP8 not in (c.in_dtype, c.out_dtype) or t.amp_fp8 > 0)
CAST_NOT_FITTED = Predicate("not fp16->fp8 or fp32->fp16 (those have fitted kernels)",
                            lambda c, t: (c.in_dtype, c.out_dtype) not in FITTED_CASTS)
CAST_CHANGES = Predicate("changes the type or the scale (else it is a copy)",
                         lambda c, t: c.in_dtype is not c.out_dtype or c.in_scale != c.out_scale)
PANEL_GRAIN = Predicate("grain == target grain for dtype (the AMP panel width)",
                        lambda c, t: c.grain == t.grain(c.dtype))
WHOLE_PANELS = Predicate("cols % grain == 0 (whole panels)", lambda c, t: c.cols % c.grain == 0)
REDUCE_OUT = in_("out_dtype", (FP16, FP32))
NO_BIAS = Predicate("no bias row (bias_cols == 0)", lambda c, t: c.bias_cols == 0)
WITH_BIAS = Predicate("a bias row (bias_cols > 0)", lambda c, t: c.bias_cols > 0)
NO_GELU = Predicate("no GeLU epilogue (gelu == '')", lambda c, t: not c.gelu)
WITH_GELU = Predicate("a GeLU epilogue (gelu is tanh or erf)", lambda c, t: bool(c.gelu))
NO_CAST = Predicate("no epilogue cast (cast_to is None)", lambda c, t: c.cast_to is None)
WITH_CAST = Predicate("an epilogue cast to fp8 (cast_to is fp8)", lambda c, t: c.cast_to is FP8)
CAST_NEEDS_FP8 = Predicate("an epilogue cast to fp8 needs a target with FP8 (amp_fp8 > 0)",
                           lambda c, t: c.cast_to is None or t.amp_fp8 > 0)
BIAS_GELU_ALIGNED = Predicate("operands 8-byte aligned (aligned) and rows of whole 64-bit words "
                              "(cols * itemsize % 8 == 0)",
                              lambda c, t: c.aligned and c.cols * c.dtype.itemsize % 8 == 0)


def reduce_variant(name: str, dtype: DType, bias: bool, cycles=None, gelu: bool = False, cast: bool = False,
                   doc: str = "") -> Variant:
    """A partial reduction row: partials type, bias row or not, and its epilogues (GeLU, FP8 cast)."""
    preds = (is_("in_dtype", dtype), REDUCE_OUT, WITH_BIAS if bias else NO_BIAS,
             WITH_GELU if gelu else NO_GELU, WITH_CAST if cast else NO_CAST, CAST_NEEDS_FP8)
    return Variant(name, "reduce", BOTH, SPECIAL, preds, cycles or cy.reduce_cycles, ref.reduce,
                   cl.reduce_codelet, doc=doc)


def _table() -> list[Variant]:
    return [
        # AMP matmul: one variant per operand/partials pair; FP8 only where the target has it.
        amp_matmul("amp_fp32", FP32, FP32),
        amp_matmul("amp_fp16_fp16", FP16, FP16),
        amp_matmul("amp_fp16_fp32", FP16, FP32),
        amp_matmul("amp_fp8_fp16", FP8, FP16),
        # The same with A rows of an odd K, repacked to whole 64-bit words first.
        amp_repack_matmul("amp_repack_fp32", FP32, FP32),
        amp_repack_matmul("amp_repack_fp16_fp16", FP16, FP16),
        amp_repack_matmul("amp_repack_fp16_fp32", FP16, FP32),
        amp_repack_matmul("amp_repack_fp8_fp16", FP8, FP16),
        # Vector-unit fallback: any k, any panel width, far slower; keeps odd local shapes plannable.
        Variant("vmac", "matmul", BOTH, FALLBACK, (VMAC_TYPES, FP8_NEEDS_TARGET),
                cy.vmac_cycles, ref.matmul, cl.matmul_codelet, doc="vector-unit multiply-accumulate"),
        # Partial reductions: the fitted FP16 loop, the FP32 one derived from it; with a bias row
        # (a GEMM's bias Add done in its reduction) the same loops with one more addend.
        reduce_variant("reduce_fp16", FP16, bias=False),
        reduce_variant("reduce_fp32", FP32, bias=False),
        reduce_variant("reduce_bias_fp16", FP16, bias=True, doc="reduction plus a bias row"),
        reduce_variant("reduce_bias_fp32", FP32, bias=True, doc="reduction plus a bias row"),
        # Fused epilogues of the reducers (a GEMM's following ops): the result cast to FP8 (with or
        # without a bias row), and bias-GeLU (published model), its result optionally cast to FP8.
        reduce_variant("reduce_cast_fp16", FP16, bias=False, cast=True, doc="reduction, FP8 result"),
        reduce_variant("reduce_cast_fp32", FP32, bias=False, cast=True, doc="reduction, FP8 result"),
        reduce_variant("reduce_bias_cast_fp16", FP16, bias=True, cast=True, doc="reduction + bias, FP8 result"),
        reduce_variant("reduce_bias_cast_fp32", FP32, bias=True, cast=True, doc="reduction + bias, FP8 result"),
        reduce_variant("reduce_bias_gelu_fp16", FP16, bias=True, cycles=cy.reduce_gelu_cycles, gelu=True,
                       doc="reduction + bias-GeLU"),
        reduce_variant("reduce_bias_gelu_fp32", FP32, bias=True, cycles=cy.reduce_gelu_cycles, gelu=True,
                       doc="reduction + bias-GeLU"),
        reduce_variant("reduce_bias_gelu_cast_fp16", FP16, bias=True, cycles=cy.reduce_gelu_cycles, gelu=True,
                       cast=True, doc="reduction + bias-GeLU, FP8 result"),
        reduce_variant("reduce_bias_gelu_cast_fp32", FP32, bias=True, cycles=cy.reduce_gelu_cycles, gelu=True,
                       cast=True, doc="reduction + bias-GeLU, FP8 result"),
        # GeLU and the fused bias-GeLU, per element type.
        elementwise("gelu_fp16", "gelu", FP16, cy.gelu_cycles, ref.gelu, cl.gelu_codelet),
        elementwise("gelu_fp32", "gelu", FP32, cy.gelu_cycles, ref.gelu, cl.gelu_codelet),
        Variant("bias_gelu_fp16", "bias_gelu", BOTH, SPECIAL, (is_("dtype", FP16), CAST_NEEDS_FP8),
                cy.bias_gelu_cycles, ref.bias_gelu, cl.bias_gelu_codelet),
        Variant("bias_gelu_fp32", "bias_gelu", BOTH, SPECIAL, (is_("dtype", FP32), CAST_NEEDS_FP8),
                cy.bias_gelu_cycles, ref.bias_gelu, cl.bias_gelu_codelet),
        # The published aligned FP16 path (FITTED), and bias-GeLU with FP8 output (FITTED); the
        # general rows above take what these refuse (dispatch picks the fewest cycles).
        Variant("bias_gelu_aligned_fp16", "bias_gelu", BOTH, SPECIAL,
                (is_("dtype", FP16), BIAS_GELU_ALIGNED, NO_CAST), cy.bias_gelu_aligned_cycles,
                ref.bias_gelu, cl.bias_gelu_codelet, doc="bias + GeLU, aligned FP16 path"),
        Variant("bias_gelu_fp16_fp8", "bias_gelu", BOTH, SPECIAL,
                (is_("dtype", FP16), WITH_CAST, CAST_NEEDS_FP8), cy.bias_gelu_fp8_cycles,
                ref.bias_gelu, cl.bias_gelu_codelet, doc="bias + GeLU with FP8 output"),
        # Casts: two fitted kernels, a streaming conversion for every other pair.
        Variant("cast_fp16_fp8", "cast", BOTH, SPECIAL,
                (is_("in_dtype", FP16), is_("out_dtype", FP8), CAST_SIDES_FP8),
                cy.cast_fp16_fp8_cycles, ref.cast, cl.cast_codelet),
        Variant("cast_fp32_fp16", "cast", BOTH, SPECIAL, (is_("in_dtype", FP32), is_("out_dtype", FP16)),
                cy.cast_fp32_fp16_cycles, ref.cast, cl.cast_codelet),
        Variant("cast_convert", "cast", BOTH, FALLBACK, (CAST_NOT_FITTED, CAST_CHANGES, CAST_SIDES_FP8),
                cy.cast_convert_cycles, ref.cast, cl.cast_codelet),
        # Rearrangement between row-major and AMP panels, and the local copy.
        Variant("pack_panels", "pack", BOTH, SPECIAL, (PANEL_GRAIN, WHOLE_PANELS),
                cy.pack_cycles, ref.pack, cl.pack_codelet),
        Variant("unpack_panels", "unpack", BOTH, SPECIAL, (PANEL_GRAIN, WHOLE_PANELS),
                cy.unpack_cycles, ref.unpack, cl.unpack_codelet),
        Variant("copy_local", "copy", BOTH, SPECIAL, (), cy.copy_cycles, ref.copy, cl.copy_codelet),
        # Pointwise binary (with broadcasting) and unary ops: one module, one row per op there.
        *pointwise.variants(),
        *rearrange.variants(),
        *gather.variants(),             # rows of a table by int32 indices (an embedding)
        # Row-wise kernels: each module lists its own rows (LayerNorm, softmax, row reductions).
        *layernorm.variants(),
        *softmax.variants(),
        *rowreduce.variants(),
    ]


def build_default_registry() -> Registry:
    registry = Registry()
    for variant in _table():
        registry.register(variant)
    return registry


DEFAULT_REGISTRY = build_default_registry()
