"""Cycle formulas: integers, monotone in size, and the published worked values."""

from __future__ import annotations

import dataclasses

import pytest

from tileplan.errors import TileplanError
from tileplan.graph.dtypes import DType
from tileplan.kernels import (dispatch, GatherCall, TransposeCall, UnaryCall, BinaryCall, BiasGeLUCall, CastCall, CopyCall, GeLUCall, MatMulCall, PackCall, ReduceCall,
                              UnpackCall, default_registry)
from tileplan.kernels import (LayerNormApplyCall, LayerNormCall, MomentsCombineCall, RowMomentsCall, RowReduceCall,
                              RowReduceCombineCall, RowReducePartialCall, SoftmaxApplyCall, SoftmaxCall,
                              SoftmaxCombineCall, SoftmaxPartialCall)
from tileplan.kernels import cycles as cy
from tileplan.target import load_target

FP8, FP16, FP32 = DType.FP8, DType.FP16, DType.FP32
REG = default_registry()
IPU21 = load_target("ipu21")

# One accepted base call per variant, and the size fields to grow.
BASE = {
    "amp_fp32": (MatMulCall(32, 64, 64, FP32, FP32, b_format="panels", grain=8), ("m", "n", "k")),
    "amp_fp16_fp16": (MatMulCall(32, 64, 64, FP16, FP16, b_format="panels", grain=16), ("m", "n", "k")),
    "amp_fp16_fp32": (MatMulCall(32, 64, 64, FP16, FP32), ("m", "n", "k")),
    "amp_fp8_fp16": (MatMulCall(32, 64, 64, FP8, FP16, weights_region="standard"), ("m", "n", "k")),
    "vmac": (MatMulCall(3, 5, 7, FP16, FP16), ("m", "n", "k")),
    "amp_repack_fp32": (MatMulCall(32, 64, 63, FP32, FP32), ("m", "n")),
    "amp_repack_fp16_fp16": (MatMulCall(32, 64, 63, FP16, FP16), ("m", "n")),
    "amp_repack_fp16_fp32": (MatMulCall(32, 64, 63, FP16, FP32), ("m", "n")),
    "amp_repack_fp8_fp16": (MatMulCall(32, 64, 63, FP8, FP16), ("m", "n")),
    "reduce_fp16": (ReduceCall(100, 3, FP16, FP16), ("n", "parts")),
    "reduce_fp32": (ReduceCall(100, 3, FP32, FP32), ("n", "parts")),
    "reduce_bias_fp16": (ReduceCall(100, 3, FP16, FP16, bias_cols=20), ("n", "parts")),
    "reduce_bias_fp32": (ReduceCall(100, 3, FP32, FP16, bias_cols=50), ("n", "parts")),
    "reduce_cast_fp16": (ReduceCall(100, 3, FP16, FP16, cast_to=FP8), ("n", "parts")),
    "reduce_cast_fp32": (ReduceCall(100, 3, FP32, FP16, cast_to=FP8, cast_scale=-2), ("n", "parts")),
    "reduce_bias_cast_fp16": (ReduceCall(100, 3, FP16, FP16, bias_cols=20, cast_to=FP8), ("n", "parts")),
    "reduce_bias_cast_fp32": (ReduceCall(100, 3, FP32, FP16, bias_cols=20, cast_to=FP8), ("n", "parts")),
    "reduce_bias_gelu_fp16": (ReduceCall(100, 3, FP16, FP16, bias_cols=20, gelu="tanh"), ("n", "parts")),
    "reduce_bias_gelu_fp32": (ReduceCall(100, 3, FP32, FP16, bias_cols=20, gelu="erf"), ("n", "parts")),
    "reduce_bias_gelu_cast_fp16": (ReduceCall(100, 3, FP16, FP16, bias_cols=20, gelu="tanh", cast_to=FP8),
                                   ("n", "parts")),
    "reduce_bias_gelu_cast_fp32": (ReduceCall(100, 3, FP32, FP16, bias_cols=20, gelu="tanh", cast_to=FP8),
                                   ("n", "parts")),
    "bias_gelu_aligned_fp16": (BiasGeLUCall(3, 40, FP16, aligned=True), ("rows", "cols")),
    "bias_gelu_fp16_fp8": (BiasGeLUCall(3, 40, FP16, cast_to=FP8), ("rows", "cols")),
    "binary_vector": (BinaryCall(4, 64, FP16, "row_broadcast"), ("rows", "cols")),
    "binary_pairs": (BinaryCall(4, 63, FP32, "dense"), ("rows", "cols")),
    "unary": (UnaryCall(100, FP16, "exp"), ("n",)),
    "transpose_2d": (TransposeCall(8, 9, FP16), ("rows", "cols")),
    "gelu_fp16": (GeLUCall(100, FP16), ("n",)),
    "gelu_fp32": (GeLUCall(96, FP32, "erf"), ("n",)),
    "bias_gelu_fp16": (BiasGeLUCall(3, 40, FP16), ("rows", "cols")),
    "bias_gelu_fp32": (BiasGeLUCall(3, 40, FP32), ("rows", "cols")),
    "cast_fp16_fp8": (CastCall(100, FP16, FP8), ("n",)),
    "cast_fp32_fp16": (CastCall(100, FP32, FP16), ("n",)),
    "cast_convert": (CastCall(100, FP8, FP32), ("n",)),
    "pack_panels": (PackCall(8, 32, FP16, 16), ("rows",)),
    "unpack_panels": (UnpackCall(8, 32, FP16, 16), ("rows",)),
    "copy_local": (CopyCall(100), ("nbytes",)),
    "gather_rows": (GatherCall(30, 8, 100, FP16), ("rows", "width")),
}


def _rowwise_base() -> dict:
    """A base call per row-wise variant: six rows (whole rounds, so both schedules grow monotonically
    from it), for the variant's type and fusion; the combines grow in rows and parts."""
    shaped = {"layernorm": lambda d, res: LayerNormCall(6, 96, d, residual=res),
              "row_moments": lambda d, res: RowMomentsCall(6, 96, d, residual=res),
              "layernorm_apply": lambda d, res: LayerNormApplyCall(6, 96, d),
              "softmax": lambda d, res: SoftmaxCall(6, 96, d),
              "softmax_partial": lambda d, res: SoftmaxPartialCall(6, 96, d),
              "softmax_apply": lambda d, res: SoftmaxApplyCall(6, 96, d),
              "row_reduce": lambda d, res: RowReduceCall(6, 96, d, "mean"),
              "row_reduce_partial": lambda d, res: RowReducePartialCall(6, 96, d, "max")}
    base = {}
    for v in REG:
        if v.primitive in shaped:
            (call,) = [c for c in (shaped[v.primitive](d, res) for d in (FP16, FP32) for res in (False, True))
                       if v.accepts(c, IPU21)][:1]
            base[v.name] = (call, ("rows", "cols"))
    base["moments_combine"] = (MomentsCombineCall(6, 2), ("rows", "parts"))
    base["softmax_combine"] = (SoftmaxCombineCall(6, 2), ("rows", "parts"))
    for d in (FP16, FP32):
        base[f"row_reduce_combine_{d}"] = (RowReduceCombineCall(6, 2, 100, d, "mean"), ("rows", "parts"))
    return base


BASE.update(_rowwise_base())


def test_every_variant_has_a_base_call_it_accepts():
    assert set(BASE) == {v.name for v in REG}
    for name, (call, _) in BASE.items():
        assert REG[name].accepts(call, IPU21), (name, REG[name].rejections(call, IPU21))


@pytest.mark.parametrize("name", sorted(BASE))
def test_cycles_are_positive_integers_and_monotone_in_every_size(name):
    call, dims = BASE[name]
    v = REG[name]
    base = v.cycles(call, IPU21)
    assert isinstance(base, int) and base > 0
    assert v.cycles(call, IPU21) == base                       # deterministic
    for dim in dims:
        prev = base
        for factor in (2, 3, 8):
            grown = dataclasses.replace(call, **{dim: getattr(call, dim) * factor})
            c = v.cycles(grown, IPU21)
            assert isinstance(c, int) and c >= prev, (name, dim, factor, c, prev)
            prev = c
        assert prev > base, (name, dim)


# Published IPU21 hardware samples (ipu-stack crates/ipu-codegen/src/kernel/cost.rs tests):
# interleaved FP16 AMP GEMM (rows, inner, columns, measured cycles), modelled within 2%.
AMP_SAMPLES = [(184, 288, 48, 48654), (182, 288, 48, 48180), (184, 288, 32, 32538),
               (146, 576, 32, 53718), (120, 80, 272, 55344)]


def test_amp_formula_reproduces_the_worked_value_and_hardware_samples():
    call = MatMulCall(184, 48, 288, FP16, FP16, b_format="panels", grain=16)
    # 294 + ceil(288/16) * ceil(48/16) * (4*184 + 160) = 294 + 18 * 3 * 896
    assert REG["amp_fp16_fp16"].cycles(call, IPU21) == 48678
    for m, k, n, measured in AMP_SAMPLES:
        c = REG["amp_fp16_fp16"].cycles(MatMulCall(m, n, k, FP16, FP16, b_format="panels", grain=16), IPU21)
        assert abs(c - measured) < 0.02 * measured, (m, k, n, c, measured)


def test_fp8_amp_takes_k_over_two_and_fp32_partials_cost_twice_per_group():
    fp16 = REG["amp_fp16_fp16"].cycles(MatMulCall(100, 64, 128, FP16, FP16, b_format="panels", grain=16), IPU21)
    fp8 = REG["amp_fp8_fp16"].cycles(MatMulCall(100, 64, 256, FP8, FP16, b_format="panels", grain=32), IPU21)
    wide = REG["amp_fp16_fp32"].cycles(MatMulCall(100, 64, 128, FP16, FP32, b_format="panels", grain=16), IPU21)
    assert fp8 == fp16
    assert wide - cy.AMP_SETUP == 2 * (fp16 - cy.AMP_SETUP)


def test_a_partial_last_panel_costs_a_whole_column_group_and_no_pack():
    # 4304 = 134 x 32 + 16 columns: ceil(4304/16) = 269 groups, the 16-column half panel one of them.
    call = MatMulCall(46, 4304, 72, FP8, FP16, b_format="panels", grain=32)
    assert REG["amp_fp8_fp16"].cycles(call, IPU21) == cy.AMP_SETUP + 3 * 269 * (4 * 46 + 160)
    narrow = dataclasses.replace(call, n=8)          # an 8-column panel still takes a whole group
    assert REG["amp_fp8_fp16"].cycles(narrow, IPU21) == cy.AMP_SETUP + 3 * 1 * (4 * 46 + 160)
    rows = dataclasses.replace(call, b_format="rows", grain=0)
    assert REG["amp_fp8_fp16"].cycles(rows, IPU21) - REG["amp_fp8_fp16"].cycles(call, IPU21) == \
        IPU21.kernel_launch_cycles + 72 * 4304


def test_standard_memory_weights_and_row_major_b_cost_more():
    panels = MatMulCall(96, 64, 128, FP16, FP16, b_format="panels", grain=16)
    standard = dataclasses.replace(panels, weights_region="standard")
    rows = dataclasses.replace(panels, b_format="rows", grain=0)
    c = REG["amp_fp16_fp16"].cycles
    assert c(standard, IPU21) > c(panels, IPU21)
    assert c(rows, IPU21) == c(panels, IPU21) + IPU21.kernel_launch_cycles + 128 * 64


def test_fp32_amp_uses_the_standard_form_with_4r_and_2126():
    call = MatMulCall(10, 32, 32, FP32, FP32, b_format="panels", grain=8)
    # 294 + ceil(32/16) * (ceil(32 * 4*10 / 4) + ceil(ceil(32/16) * 2126 / 4))
    assert REG["amp_fp32"].cycles(call, IPU21) == 294 + 2 * (320 + 1063)


def test_reduction_matches_the_seven_hardware_samples():
    samples = [(8, 2, 360), (56, 2, 438), (1472, 2, 2700), (2208, 4, 4974), (1472, 4, 3444),
               (576, 15, 3090), (2208, 28, 18222)]
    for n, parts, measured in samples:
        assert REG["reduce_fp16"].cycles(ReduceCall(n, parts, FP16, FP16), IPU21) == measured


def test_reading_the_own_partial_in_place_costs_the_same_loads():
    # The formula counts a load and add per partial; two input pointers instead of one change neither.
    for n, parts in ((8, 2), (1472, 4), (2208, 28)):
        plain = REG["reduce_fp16"].cycles(ReduceCall(n, parts, FP16, FP16), IPU21)
        assert REG["reduce_fp16"].cycles(ReduceCall(n, parts, FP16, FP16, own=True), IPU21) == plain
    from tileplan.kernels import dispatch
    assert dispatch(ReduceCall(96, 2, FP16, FP16, own=True), IPU21).name == "reduce_fp16"
    with pytest.raises(TileplanError, match="at least two parts"):
        ReduceCall(96, 1, FP16, FP16, own=True)


def test_a_bias_row_in_the_reduction_is_priced_as_one_more_partial():
    # DERIVED (cycles.reduce_cycles): 282 + 6 * ceil(n/48) * (11 + 2P) for P FP16 partials plus the bias.
    for n, parts, cols in ((8, 2, 8), (1472, 4, 64), (2304, 9, 64), (576, 15, 96)):
        with_bias = REG["reduce_bias_fp16"].cycles(ReduceCall(n, parts, FP16, FP16, bias_cols=cols), IPU21)
        assert with_bias == 282 + 6 * -(-n // 48) * (11 + 2 * parts)
        assert with_bias == REG["reduce_fp16"].cycles(ReduceCall(n, parts + 1, FP16, FP16), IPU21)
    # Cheaper than the row-broadcast Add it replaces, which pays its own launch and row resets.
    fused = REG["reduce_bias_fp16"].cycles(ReduceCall(36 * 64, 9, FP16, FP16, bias_cols=64), IPU21)
    plain = REG["reduce_fp16"].cycles(ReduceCall(36 * 64, 9, FP16, FP16), IPU21)
    add = REG["binary_vector"].cycles(BinaryCall(36, 64, FP16, "row_broadcast"), IPU21)
    assert plain < fused < plain + add


def test_dispatch_sends_a_reduction_with_a_bias_row_to_the_bias_variant():
    from tileplan.kernels import dispatch
    assert dispatch(ReduceCall(96, 2, FP16, FP16, bias_cols=48), IPU21).name == "reduce_bias_fp16"
    assert dispatch(ReduceCall(96, 2, FP16, FP16), IPU21).name == "reduce_fp16"
    assert dispatch(ReduceCall(96, 2, FP32, FP32, bias_cols=96), IPU21).name == "reduce_bias_fp32"
    with pytest.raises(TileplanError, match="does not divide"):
        ReduceCall(96, 2, FP16, FP16, bias_cols=50)


def test_add_and_gelu_and_casts_reproduce_their_published_values():
    assert REG["binary_vector"].cycles(BinaryCall(1, 1728, FP16), IPU21) == 2220
    assert REG["binary_vector"].cycles(BinaryCall(3, 1152, FP16, "row_broadcast"), IPU21) == 4416
    assert REG["binary_pairs"].cycles(BinaryCall(1, 120, FP16), IPU21) == 450 + 54 * 10
    assert REG["gelu_fp16"].cycles(GeLUCall(960, FP16), IPU21) == 330 + 462 * 10
    assert REG["gelu_fp32"].cycles(GeLUCall(960, FP32), IPU21) == 330 + 2 * 462 * 10
    assert REG["cast_fp16_fp8"].cycles(CastCall(480, FP16, FP8), IPU21) == 330 + 24 * 10
    assert REG["cast_fp32_fp16"].cycles(CastCall(120, FP32, FP16), IPU21) == 330 + 48 * 10
    assert REG["unpack_panels"].cycles(UnpackCall(4, 32, FP16, 16), IPU21) == 11 + 10 * 128


def test_fused_bias_gelu_is_cheaper_than_add_then_gelu():
    fused = REG["bias_gelu_fp16"].cycles(BiasGeLUCall(8, 96, FP16), IPU21)
    apart = (REG["binary_vector"].cycles(BinaryCall(8, 96, FP16, "row_broadcast"), IPU21)
             + REG["gelu_fp16"].cycles(GeLUCall(8 * 96, FP16), IPU21))
    assert fused < apart


def test_amp_row_cycles_refuse_a_target_without_that_amp():
    with pytest.raises(TileplanError, match="no fp8->fp16 AMP"):
        cy.amp_row_cycles(load_target("ipu2"), FP8, FP16)
    assert cy.amp_row_cycles(IPU21, FP32, FP32) == 16


def test_machine_figures_come_from_the_target():
    call = CopyCall(4096)
    assert REG["copy_local"].cycles(call, IPU21) == 288 + 4096 // 8
    faster = dataclasses.replace(IPU21, local_copy_bytes_per_cycle=16, local_copy_call_cycles=100)
    assert REG["copy_local"].cycles(call, faster) == 100 + 4096 // 16
    launch = dataclasses.replace(IPU21, kernel_launch_cycles=50)
    pack = PackCall(8, 32, FP16, 16)
    assert REG["pack_panels"].cycles(pack, launch) - REG["pack_panels"].cycles(pack, IPU21) == 39


def test_sub_and_mul_cost_what_add_costs_and_divide_costs_more():
    """poplibs prices ADD, SUBTRACT and MULTIPLY alike (1 cycle per vector) and DIVIDE at 21 per 4 halves."""
    for mode in ("dense", "row_broadcast", "col_broadcast", "scalar"):
        add = dispatch(BinaryCall(8, 96, FP16, mode), IPU21)
        cycles = {fn: add.cycles(BinaryCall(8, 96, FP16, mode, fn), IPU21) for fn in ("add", "sub", "mul", "div")}
        assert cycles["add"] == cycles["sub"] == cycles["mul"] < cycles["div"]


def test_unary_cycles_follow_the_poplibs_inner_loops():
    """330 setup + workers * ceil(n / (workers * unroll)) * loop: exp FP16 is 4 cycles per 4 halves."""
    v = REG["unary"]
    assert v.cycles(UnaryCall(24 * 10, FP16, "exp"), IPU21) == 330 + 6 * 10 * 4
    assert v.cycles(UnaryCall(24 * 10, FP16, "sqrt"), IPU21) == 330 + 6 * 10 * 23
    assert v.cycles(UnaryCall(6 * 10, FP32, "erf"), IPU21) == 330 + 6 * 10 * 18


def test_an_odd_k_runs_on_the_amp_after_a_repack_not_on_the_vector_unit():
    """P V with 729 keys: A rows of 365 halves are off 64-bit words; repacking them (one cycle per
    element) and running the AMP beats the vector-unit loop by far."""
    call = MatMulCall(16, 72, 365, FP16, FP16)
    assert dispatch(call, IPU21).name == "amp_repack_fp16_fp16"
    padded = MatMulCall(16, 72, 368, FP16, FP16)
    assert REG["amp_repack_fp16_fp16"].cycles(call, IPU21) == (REG["amp_fp16_fp16"].cycles(padded, IPU21)
                                                              + IPU21.kernel_launch_cycles + 16 * 365)
    assert REG["amp_repack_fp16_fp16"].cycles(call, IPU21) < REG["vmac"].cycles(call, IPU21) / 3
