"""Every variant's emitted Poplar codelet, compiled with g++ against the stand-in
headers in tests/poplar and run on sample data, agrees with its numpy semantics
(``harness.compare`` states the agreement: bit-exact where the operations are the
same, within stated ulp bounds for matmul and GeLU)."""

from __future__ import annotations

import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from tileplan.graph.dtypes import DType
from tileplan.kernels.pointwise import BINARY, UNARY
from tileplan.kernels import (GatherCall, TransposeCall, UnaryCall, BinaryCall, BiasGeLUCall, CastCall, CopyCall, GeLUCall, MatMulCall, PackCall, ReduceCall,
                              UnpackCall, default_registry)
from tileplan.kernels import (LayerNormApplyCall, LayerNormCall, MomentsCombineCall, RowMomentsCall, RowReduceCall,
                              RowReduceCombineCall, RowReducePartialCall, SoftmaxApplyCall, SoftmaxCall,
                              SoftmaxCombineCall, SoftmaxPartialCall)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "poplar"))
from harness import GXX, Case, compare, random, run_codelets  # noqa: E402

FP8, FP16, FP32 = DType.FP8, DType.FP16, DType.FP32
pytestmark = pytest.mark.skipif(GXX is None, reason="g++ is not installed")


def all_fp16_values() -> np.ndarray:
    return np.arange(65536, dtype=np.uint16).view(np.float16)


def fp8_specials() -> np.ndarray:
    return np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fnuz)


def build_cases(rng) -> list[tuple[str, object, dict[str, np.ndarray], str]]:
    """(variant, call, inputs, comparison) for every variant, several specialisations each."""
    cases = []

    def add(variant, call, comparison="exact", **inputs):
        cases.append((variant, call, inputs, comparison))

    # AMP / vector matmul: row-major and panel B, every dtype pair, odd shapes, scales.
    for variant, dt, part, grain in (("amp_fp32", FP32, FP32, 8), ("amp_fp16_fp16", FP16, FP16, 16),
                                     ("amp_fp16_fp32", FP16, FP32, 16), ("amp_fp8_fp16", FP8, FP16, 32)):
        m, k, n = 13, 64, 2 * grain
        for call in (MatMulCall(m, n, k, dt, part, out_scale=-1),
                     MatMulCall(m, n, k, dt, part, b_format="panels", grain=grain)):
            b = random(rng, dt, call.panels * k * grain if call.grain else k * n, 1 / np.sqrt(k))
            add(variant, call, "matmul", a=random(rng, dt, m * k, 2.0 if dt is FP8 else 0.5), b=b)
    # A partial last panel (n % grain != 0, rows of whole 64-bit words).
    for variant, dt, part, grain, n in (("amp_fp8_fp16", FP8, FP16, 32, 72), ("amp_fp16_fp16", FP16, FP16, 16, 20),
                                        ("amp_fp32", FP32, FP32, 8, 26)):
        call = MatMulCall(11, n, 24, dt, part, b_format="panels", grain=grain)
        add(variant, call, "matmul", a=random(rng, dt, 11 * 24, 2.0 if dt is FP8 else 0.5),
            b=random(rng, dt, 24 * n, 1 / np.sqrt(24)))
    call = MatMulCall(7, 5, 3, FP16, FP16)
    add("vmac", call, "matmul", a=random(rng, FP16, 21), b=random(rng, FP16, 15))
    call = MatMulCall(5, 32, 9, FP8, FP16, b_format="panels", grain=32, out_scale=2)
    add("vmac", call, "matmul", a=random(rng, FP8, 45, 4.0), b=random(rng, FP8, 9 * 32, 4.0))

    # Reductions, including FP16 overflow to inf on the way out.
    add("reduce_fp16", ReduceCall(50, 3, FP16, FP16), partials=random(rng, FP16, 150, 4.0))
    add("reduce_fp16", ReduceCall(8, 2, FP16, FP32, out_scale=3),
        partials=np.array([60000] * 8 + [40000] * 8, np.float16))
    add("reduce_fp16", ReduceCall(8, 2, FP16, FP16),
        partials=np.array([60000] * 8 + [40000] * 8, np.float16))
    add("reduce_fp32", ReduceCall(37, 4, FP32, FP16, out_scale=-2), partials=random(rng, FP32, 148, 100.0))
    # Reductions with a bias row (3 or 5 rows of it), including an overflow the bias tips over.
    add("reduce_bias_fp16", ReduceCall(48, 3, FP16, FP16, bias_cols=16),
        partials=random(rng, FP16, 144, 4.0), bias=random(rng, FP16, 16))
    add("reduce_bias_fp16", ReduceCall(8, 2, FP16, FP16, bias_cols=4),
        partials=np.array([30000] * 8 + [30000] * 8, np.float16),
        bias=np.array([6000, -6000, 0, np.nan], np.float16))
    add("reduce_bias_fp16", ReduceCall(20, 2, FP16, FP32, out_scale=2, bias_cols=4),
        partials=random(rng, FP16, 40, 4.0), bias=random(rng, FP32, 4))
    add("reduce_bias_fp32", ReduceCall(35, 4, FP32, FP16, bias_cols=7),
        partials=random(rng, FP32, 140, 100.0), bias=random(rng, FP16, 7, 10.0))
    # A reducer's own partial read in place, the others from its gathered pieces (with and without bias).
    add("reduce_fp16", ReduceCall(50, 3, FP16, FP16, own=True), own=random(rng, FP16, 50, 4.0),
        others=random(rng, FP16, 100, 4.0))
    add("reduce_fp32", ReduceCall(9, 2, FP32, FP32, out_scale=1, own=True), own=random(rng, FP32, 9, 100.0),
        others=random(rng, FP32, 9, 100.0))
    add("reduce_bias_fp16", ReduceCall(48, 4, FP16, FP16, bias_cols=16, own=True),
        own=random(rng, FP16, 48, 4.0), others=random(rng, FP16, 144, 4.0), bias=random(rng, FP16, 16))

    # Reduction epilogues: the result cast to FP8 (scaled, saturating: large partials), bias-GeLU
    # (both forms, FP16 and FP32 partials), bias-GeLU then FP8, with the own partial in place.
    add("reduce_cast_fp16", ReduceCall(50, 3, FP16, FP16, cast_to=FP8, cast_scale=-1),
        partials=random(rng, FP16, 150, 60.0))
    add("reduce_cast_fp32", ReduceCall(24, 2, FP32, FP16, cast_to=FP8, cast_scale=2, own=True),
        own=random(rng, FP32, 24, 100.0), others=random(rng, FP32, 24, 100.0))
    add("reduce_bias_cast_fp16", ReduceCall(48, 3, FP16, FP16, bias_cols=16, cast_to=FP8),
        partials=random(rng, FP16, 144, 4.0), bias=random(rng, FP16, 16))
    add("reduce_bias_cast_fp32", ReduceCall(35, 4, FP32, FP16, bias_cols=7, cast_to=FP8, cast_scale=1),
        partials=random(rng, FP32, 140, 10.0), bias=random(rng, FP16, 7, 10.0))
    for form in ("tanh", "erf"):
        add("reduce_bias_gelu_fp16", ReduceCall(96, 3, FP16, FP16, bias_cols=32, gelu=form), "gelu",
            partials=random(rng, FP16, 288, 2.0), bias=random(rng, FP16, 32))
        add("reduce_bias_gelu_fp32", ReduceCall(40, 2, FP32, FP32, bias_cols=8, gelu=form, own=True), "gelu",
            own=random(rng, FP32, 40, 2.0), others=random(rng, FP32, 40, 2.0), bias=random(rng, FP32, 8))
    add("reduce_bias_gelu_cast_fp16", ReduceCall(96, 4, FP16, FP16, bias_cols=16, gelu="tanh", cast_to=FP8,
                                                 own=True),
        own=random(rng, FP16, 96, 2.0), others=random(rng, FP16, 288, 2.0), bias=random(rng, FP16, 16))
    add("reduce_bias_gelu_cast_fp32", ReduceCall(64, 2, FP32, FP16, bias_cols=32, gelu="erf", cast_to=FP8,
                                                 cast_scale=-2),
        partials=random(rng, FP32, 128, 2.0), bias=random(rng, FP16, 32))

    # Adds, dense and row broadcast, aligned and not.
    for variant, dt in (("binary_vector", FP16), ("binary_vector", FP32), ("binary_pairs", FP16), ("binary_pairs", FP32)):
        add(variant, BinaryCall(3, 8, dt, "dense"), a=random(rng, dt, 24), b=random(rng, dt, 24))
        add(variant, BinaryCall(5, 12, dt, "row_broadcast"), a=random(rng, dt, 60), b=random(rng, dt, 12))
    add("binary_pairs", BinaryCall(3, 7, FP16, "row_broadcast"), a=random(rng, FP16, 21), b=random(rng, FP16, 7))
    add("binary_vector", BinaryCall(1, 4, FP16), a=np.array([65504, -65504, 1, np.nan], np.float16),
        b=np.array([65504, -65504, np.inf, 1], np.float16))

    # Every binary op in every broadcast mode, the broadcast operand second and first.
    for fn in BINARY:
        for mode, bsize in (("dense", 60), ("row_broadcast", 12), ("col_broadcast", 5), ("scalar", 1)):
            for swap in ((False, True) if mode != "dense" else (False,)):
                for dt in (FP16, FP32):
                    b = random(rng, dt, bsize, 2.0)
                    add("binary_vector" if mode != "scalar" or dt is FP32 else "binary_pairs",
                        BinaryCall(5, 12, dt, mode, fn, swap), a=random(rng, dt, 60, 2.0), b=b)
    # The AMP on A rows of an odd K (repacked to whole 64-bit words first), every type pair.
    for variant, dt, part in (("amp_repack_fp32", FP32, FP32), ("amp_repack_fp16_fp16", FP16, FP16),
                              ("amp_repack_fp16_fp32", FP16, FP32), ("amp_repack_fp8_fp16", FP8, FP16)):
        m, k, n = 5, 37, 24
        add(variant, MatMulCall(m, n, k, dt, part), "matmul", a=random(rng, dt, m * k, 2.0 if dt is FP8 else 0.5),
            b=random(rng, dt, k * n, 1 / np.sqrt(k)))

    # The on-tile 2-D transpose (raw elements): odd shapes, every type.
    for dt in (FP8, FP16, FP32):
        add("transpose_2d", TransposeCall(7, 5, dt), **{"in": random(rng, dt, 35)})

    # Every unary op, both types, over its domain plus specials.
    for fn in UNARY:
        for dt in (FP16, FP32):
            xs = np.concatenate([np.linspace(-8, 8, 397), [0.0, -0.0, 1e-4, 30.0, -30.0]])
            if fn in ("sqrt",):
                xs = np.abs(xs)
            add("unary", UnaryCall(xs.size, dt, fn), "unary", **{"in": xs.astype(dt.numpy)})

    # GeLU and bias-GeLU, both forms, both types; inputs over [-10, 10] plus specials.
    for dt in (FP16, FP32):
        xs = np.concatenate([np.linspace(-10, 10, 1001), [0.0, -0.0, 1e-5, -1e-5, 6e4, -6e4]]).astype(dt.numpy)
        for form in ("tanh", "erf"):
            add(f"gelu_{dt}", GeLUCall(xs.size, dt, form), "gelu", **{"in": xs})
            add(f"bias_gelu_{dt}", BiasGeLUCall(9, 16, dt, form), "gelu",
                a=random(rng, dt, 144, 3.0), bias=random(rng, dt, 16))
        # The general pass with its result cast to FP8 (odd width), for both types.
        add(f"bias_gelu_{dt}", BiasGeLUCall(5, 13, dt, "tanh", cast_to=FP8, cast_scale=-3),
            a=random(rng, dt, 65, 3.0), bias=random(rng, dt, 13))
    # The aligned FP16 path and the FP8-output pass (its scale, and saturation of large values).
    add("bias_gelu_aligned_fp16", BiasGeLUCall(3, 24, FP16, "tanh", aligned=True), "gelu",
        a=random(rng, FP16, 72, 3.0), bias=random(rng, FP16, 24))
    add("bias_gelu_fp16_fp8", BiasGeLUCall(4, 32, FP16, "erf", cast_to=FP8, cast_scale=1),
        a=random(rng, FP16, 128, 200.0), bias=random(rng, FP16, 32))

    # Casts: every FP16 value into FP8 (rounding ties, subnormals, saturation, NaN);
    # every FP8 byte out of FP8; FP32 -> FP16 overflow and ties.
    halves = all_fp16_values()
    add("cast_fp16_fp8", CastCall(halves.size, FP16, FP8), **{"in": halves})
    add("cast_fp16_fp8", CastCall(halves.size, FP16, FP8, out_scale=3), **{"in": halves})
    add("cast_convert", CastCall(halves.size, FP32, FP8, out_scale=-4), **{"in": halves.astype(np.float32)})
    # saturate=False: every FP16 value, so 240..248 (to 240), 248 and up and the infinities (NaN)
    add("cast_fp16_fp8", CastCall(halves.size, FP16, FP8, saturate=False), **{"in": halves})
    add("cast_convert", CastCall(halves.size, FP32, FP8, out_scale=2, saturate=False),
        **{"in": halves.astype(np.float32)})
    for out, scale in ((FP16, 0), (FP16, 5), (FP32, -3)):
        add("cast_convert", CastCall(256, FP8, out, in_scale=scale), **{"in": fp8_specials()})
    add("cast_convert", CastCall(256, FP8, FP8, in_scale=1, out_scale=-1), **{"in": fp8_specials()})
    add("cast_convert", CastCall(halves.size, FP16, FP32), **{"in": halves})
    with np.errstate(invalid="ignore"):
        nudged = halves.astype(np.float32) * np.float32(1.0009765625)
    f32 = np.concatenate([nudged, rng.normal(0, 1e4, 4000),
                          [7e4, -7e4, np.inf, np.nan, 2.0 ** -25, 2.0 ** -24 * 1.5]]).astype(np.float32)
    add("cast_fp32_fp16", CastCall(f32.size, FP32, FP16), **{"in": f32})

    # Pack/unpack (FP8 as raw bytes) and the local copy.
    for dt, grain in ((FP16, 16), (FP8, 32), (FP32, 8)):
        rows, cols = 5, 3 * grain
        add("pack_panels", PackCall(rows, cols, dt, grain), **{"in": random(rng, dt, rows * cols)})
        add("unpack_panels", UnpackCall(rows, cols, dt, grain), **{"in": random(rng, dt, rows * cols)})
    add("copy_local", CopyCall(37), **{"in": rng.integers(0, 256, 37, dtype=np.uint8)})
    # Integer inputs: an attention mask and token ids cast to float (exact), rows gathered by
    # token ids (repeats, the first and last rows), an odd width and a width of whole words.
    ints = np.concatenate([[0, 1, -1, 2 ** 24, -(2 ** 24), 2 ** 31 - 1], rng.integers(-5000, 5000, 58)]).astype(np.int32)
    for out in (FP16, FP32):
        add("cast_convert", CastCall(ints.size, DType.INT32, out), **{"in": ints})
    for dt, width in ((FP16, 5), (FP32, 8)):
        idx = np.concatenate([[0, 29, 3, 3, -1, -30], rng.integers(0, 30, 9)]).astype(np.int32)
        add("gather_rows", GatherCall(idx.size, width, 30, dt), table=random(rng, dt, 30 * width), idx=idx)
    rowwise_cases(rng, add)
    return cases


# Row shapes: one short row (cut over the workers), rows below six, exactly six, six plus a remainder.
ROW_SHAPES = ((1, 7), (3, 100), (6, 48), (8, 37))


def rowwise_cases(rng, add) -> None:
    """LayerNorm, softmax and row reductions: both schedules, both types, whole rows and split-row
    chains fed with partials their own references made (from row pieces of unequal widths)."""
    reg = default_registry()
    for d in (FP16, FP32):
        for sched in ("rows", "split"):
            for rows, cols in ROW_SHAPES:
                n = rows * cols
                x = rng.normal(3.0, 2.0, n).astype(d.numpy)          # a mean far from 0: two-pass statistics
                r = random(rng, d, n, 0.5)
                gamma, beta = random(rng, d, cols), random(rng, d, cols)
                add(f"layernorm_{sched}_{d}", LayerNormCall(rows, cols, d), x=x, gamma=gamma, beta=beta)
                add(f"add_layernorm_{sched}_{d}", LayerNormCall(rows, cols, d, eps=1e-3, residual=True),
                    x=x, r=r, gamma=gamma, beta=beta)
                add(f"row_moments_{sched}_{d}", RowMomentsCall(rows, cols, d), x=x)
                add(f"add_row_moments_{sched}_{d}", RowMomentsCall(rows, cols, d, residual=True), x=x, r=r)
                moments = reg[f"row_moments_{sched}_{d}"].reference(RowMomentsCall(rows, cols, d), x)
                stats = reg["moments_combine"].reference(MomentsCombineCall(rows, 1), moments)
                add(f"layernorm_apply_{sched}_{d}", LayerNormApplyCall(rows, cols, d), x=x, stats=stats,
                    gamma=gamma, beta=beta)
                logits = random(rng, d, n, 4.0)
                add(f"softmax_{sched}_{d}", SoftmaxCall(rows, cols, d), "exp", x=logits)
                add(f"softmax_partial_{sched}_{d}", SoftmaxPartialCall(rows, cols, d), "exp", x=logits)
                sm = reg[f"softmax_partial_{sched}_{d}"].reference(SoftmaxPartialCall(rows, cols, d), logits)
                add(f"softmax_apply_{sched}_{d}", SoftmaxApplyCall(rows, cols, d), "exp", x=logits, stats=sm)
                if (rows, cols) == ROW_SHAPES[-1]:     # attention's 1/sqrt(d) folded into the softmax
                    for make in (SoftmaxCall, SoftmaxPartialCall):
                        add(f"{make.primitive}_{sched}_{d}", make(rows, cols, d, 0.125), "exp", x=logits)
                    scaled = reg[f"softmax_partial_{sched}_{d}"].reference(SoftmaxPartialCall(rows, cols, d, 0.125),
                                                                           logits)
                    add(f"softmax_apply_{sched}_{d}", SoftmaxApplyCall(rows, cols, d, 0.125), "exp", x=logits,
                        stats=scaled)
                fn = ("sum", "mean", "max")[rows % 3]
                add(f"row_reduce_{sched}_{d}", RowReduceCall(rows, cols, d, fn), x=logits)
                add(f"row_reduce_partial_{sched}_{d}", RowReducePartialCall(rows, cols, d, fn), x=logits)
        for fn in ("sum", "mean", "max"):
            partials = random(rng, FP32, 3 * 5, 10.0)
            add(f"row_reduce_combine_{d}", RowReduceCombineCall(5, 3, 90, d, fn), partials=partials)
        # Specials: a NaN in one softmax row (that row only becomes NaN); FP16 overflow of the residual sum.
        logits = np.array([0.0, 1.0, np.nan, 2.0, -1.0, 3.0, 0.5, 0.25], d.numpy)
        add(f"softmax_split_{d}", SoftmaxCall(2, 4, d), "exp", x=logits)
        add(f"row_reduce_rows_{d}", RowReduceCall(2, 4, d, "max"), x=logits)
        big = np.full(8, 60000 if d is FP16 else 3e38, d.numpy)
        add(f"add_layernorm_rows_{d}", LayerNormCall(1, 8, d, residual=True), x=big, r=big,
            gamma=np.ones(8, d.numpy), beta=np.zeros(8, d.numpy))
    # Split-row combines: pieces of 5, 40 and 17 columns of 7 rows, partials from their references.
    widths, rows = (5, 40, 17), 7
    pieces = [rng.normal(50.0, 3.0, rows * w).astype(np.float16) for w in widths]
    moments = [reg["row_moments_rows_fp16"].reference(RowMomentsCall(rows, w, FP16), p) for w, p in zip(widths, pieces)]
    add("moments_combine", MomentsCombineCall(rows, 3, eps=1e-5), partials=np.concatenate(moments))
    parts = [reg["softmax_partial_rows_fp16"].reference(SoftmaxPartialCall(rows, w, FP16), 3 * p - 150)
             for w, p in zip(widths, pieces)]
    add("softmax_combine", SoftmaxCombineCall(rows, 3), "exp", partials=np.concatenate(parts))
    # The same with the tile's own part (1) apart: mine, then the others in part order.
    add("moments_combine", MomentsCombineCall(rows, 3, eps=1e-5, own=1), mine=moments[1],
        partials=np.concatenate([moments[0], moments[2]]))
    add("softmax_combine", SoftmaxCombineCall(rows, 3, own=1), "exp", mine=parts[1],
        partials=np.concatenate([parts[0], parts[2]]))
    add("softmax_combine", SoftmaxCombineCall(rows, 3, own=1, scale=0.125), "exp", mine=parts[1],
        partials=np.concatenate([parts[0], parts[2]]))


def test_every_codelet_matches_its_numpy_semantics(tmp_path):
    registry = default_registry()
    cases = build_cases(np.random.default_rng(7))
    covered = {name for name, *_ in cases}
    assert covered == {v.name for v in registry}, "each variant needs a codelet case"
    runs = [Case(registry[name].codelet(call), inputs) for name, call, inputs, _ in cases]
    results = run_codelets(runs, tmp_path)
    for (name, call, inputs, comparison), run, result in zip(cases, runs, results):
        for i, out_field in enumerate(run.codelet.outputs):
            compare(registry[name], call, inputs, comparison, result[out_field.name], out_field.dtype, i)


def test_one_codelet_source_serves_every_shape_of_a_specialisation():
    v = default_registry()["amp_fp8_fp16"]
    small = v.codelet(MatMulCall(4, 32, 8, FP8, FP16, b_format="panels", grain=32))
    large = v.codelet(MatMulCall(400, 64, 256, FP8, FP16, b_format="panels", grain=32, out_scale=-3))
    assert small.key == large.key == "amp_fp8_fp16_panels"
    assert small.vertex == "AmpFp8Fp16Panels" and small.filename == "amp_fp8_fp16_panels.cpp"
    assert small.source == large.source
    assert large.params == {"m": 400, "n": 64, "k": 256, "grain": 32, "outScale": -3}
    assert [(f.name, f.ctype, f.size) for f in large.fields if f.is_vector] == [
        ("a", "unsigned char", 400 * 256), ("b", "unsigned char", 2 * 256 * 32), ("c", "half", 400 * 64)]
    assert "class AmpFp8Fp16Panels : public poplar::MultiVertex" in large.source
    assert "bool compute(unsigned workerId)" in large.source


def test_codelet_keys_are_unique_across_specialisations():
    registry = default_registry()
    cases = build_cases(np.random.default_rng(0))
    by_key = {}
    for name, call, _, _ in cases:
        cs = registry[name].codelet(call)
        by_key.setdefault(cs.key, set()).add(cs.source)
    assert all(len(sources) == 1 for sources in by_key.values())
