"""Dispatch: every predicate runs, the fastest accepted variant wins, priority
breaks ties, forcing works and explains refusals, and no-fit errors list every
variant with its reasons."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tileplan.errors import TileplanError
from tileplan.graph.dtypes import DType
from tileplan.kernels import (BinaryCall, CastCall, CopyCall, MatMulCall, NoVariantError, PackCall, Predicate, Registry,
                              Variant, default_registry, dispatch)
from tileplan.target import load_target

FP8, FP16, FP32 = DType.FP8, DType.FP16, DType.FP32
IPU21, IPU2, BOW = load_target("ipu21"), load_target("ipu2"), load_target("bow")


def test_dispatch_picks_the_fastest_accepted_variant():
    # Aligned wide rows: the vector loop; many short broadcast rows: the pair loop is cheaper.
    wide = BinaryCall(2, 1152, FP16, "row_broadcast")
    short = BinaryCall(200, 4, FP16, "row_broadcast")
    reg = default_registry()
    assert reg["binary_vector"].accepts(short, IPU21) and reg["binary_pairs"].accepts(short, IPU21)
    assert dispatch(wide, IPU21).name == "binary_vector"
    assert dispatch(short, IPU21).name == "binary_pairs"
    assert reg["binary_pairs"].cycles(short, IPU21) < reg["binary_vector"].cycles(short, IPU21)


def test_dispatch_uses_the_amp_when_it_fits_and_the_vector_unit_otherwise():
    assert dispatch(MatMulCall(64, 64, 64, FP8, FP16, b_format="panels", grain=32), IPU21).name == "amp_fp8_fp16"
    assert dispatch(MatMulCall(64, 64, 64, FP16, FP32), BOW).name == "amp_fp16_fp32"
    # k not 64-bit aligned: the AMP after a repack of A, except where the vector loop is cheaper (tiny).
    assert dispatch(MatMulCall(64, 64, 63, FP16, FP16), IPU21).name == "amp_repack_fp16_fp16"
    assert dispatch(MatMulCall(1, 1, 3, FP16, FP16), IPU21).name == "vmac"


def _constant(name: str, cycles: int, priority: int, accept: bool = True) -> Variant:
    pred = Predicate("always" if accept else "never", lambda c, t: accept)
    return Variant(name, "copy", ("ipu2", "ipu21"), priority, (pred,), lambda c, t: cycles,
                   lambda c, x: x, lambda c, v: None)


def test_priority_breaks_ties_then_the_name():
    reg = Registry([_constant("b_low", 100, 0), _constant("a_high", 100, 5), _constant("slow", 101, 99)])
    assert reg.dispatch(CopyCall(8), IPU21).name == "a_high"
    tied = Registry([_constant("zeta", 100, 1), _constant("alpha", 100, 1)])
    assert tied.dispatch(CopyCall(8), IPU21).name == "alpha"


def test_forced_variant_is_returned_even_when_slower():
    call = BinaryCall(2, 1152, FP16, "row_broadcast")
    assert dispatch(call, IPU21, force="binary_pairs").name == "binary_pairs"


def test_forcing_a_rejected_variant_says_why():
    call = MatMulCall(8, 8, 7, FP16, FP16)
    with pytest.raises(TileplanError, match=r"forced kernel 'amp_fp16_fp16'.*k % 4 == 0"):
        dispatch(call, IPU21, force="amp_fp16_fp16")
    with pytest.raises(TileplanError, match="not a matmul variant"):
        dispatch(call, IPU21, force="copy_local")


def test_the_amp_reads_a_partial_last_panel_whose_rows_are_whole_64_bit_words():
    half = MatMulCall(64, 4304 - 4288, 64, FP8, FP16, b_format="panels", grain=32)      # mlp_up's last panel
    assert dispatch(half, IPU21).name == "amp_fp8_fp16"
    assert dispatch(MatMulCall(64, 136, 64, FP8, FP16, b_format="panels", grain=32), IPU21).name == "amp_fp8_fp16"
    tail = MatMulCall(64, 75, 64, FP8, FP16, b_format="panels", grain=32)               # 11-byte panel rows
    reasons = dict(default_registry().candidates(tail, IPU21))
    assert [r for r in reasons[default_registry()["amp_fp8_fp16"]] if "partial last panel" in r]
    assert dispatch(tail, IPU21).name == "vmac"                                         # the vector unit reads any width


def test_duplicate_registration_is_refused():
    reg = default_registry().copy()
    with pytest.raises(KeyError, match="amp_fp8_fp16"):
        reg.register(default_registry()["amp_fp8_fp16"])
    names = [v.name for v in default_registry()]
    assert len(names) == len(set(names))


def test_dispatch_with_no_accepting_variant_lists_every_variant_with_reasons():
    call = MatMulCall(64, 64, 64, FP8, FP16, b_format="panels", grain=32)
    with pytest.raises(NoVariantError) as info:
        dispatch(call, IPU2)
    lines = str(info.value).splitlines()
    assert "no matmul kernel" in lines[0] and "ipu2" in lines[0]
    listed = {line.split(":")[0].strip(): line for line in lines[1:]}
    assert set(listed) == {"amp_fp32", "amp_fp16_fp16", "amp_fp16_fp32", "amp_fp8_fp16", "vmac", "amp_repack_fp32",
                           "amp_repack_fp16_fp16", "amp_repack_fp16_fp32", "amp_repack_fp8_fp16"}
    assert "k % 8 != 0 (A rows off 64-bit boundaries: repacked first)" in listed["amp_repack_fp8_fp16"]
    assert "target has fp8->fp16 AMP (amp_fp8 > 0)" in listed["amp_fp8_fp16"]
    # Every predicate is evaluated: the FP32 kernel lists both of its type mismatches.
    assert "in_dtype is fp32; partials is fp32" in listed["amp_fp32"]
    assert "fp8 operands need a target with FP8" in listed["vmac"]
    assert isinstance(info.value, TileplanError)


def test_a_registry_without_the_packer_has_no_pack_kernel():
    reg = default_registry().without("pack")
    assert "pack_panels" not in reg and "unpack_panels" in reg
    with pytest.raises(NoVariantError, match="no variants registered"):
        reg.dispatch(PackCall(4, 32, FP16, 16), IPU21)
    assert "pack_panels" in default_registry()          # the default is untouched
    assert "vmac" not in default_registry().without("vmac")
    with pytest.raises(KeyError):
        default_registry().without("no_such_kernel")


def test_a_copied_registry_is_independent():
    reg = default_registry().copy()
    reg.register(_constant("my_copy", 1, 0))
    assert "my_copy" in reg and "my_copy" not in default_registry()
    assert dispatch(CopyCall(64), IPU21, registry=reg).name == "my_copy"


def test_fp8_casts_need_an_fp8_target():
    call = CastCall(64, FP16, FP8)
    assert dispatch(call, IPU21).name == "cast_fp16_fp8"
    with pytest.raises(NoVariantError, match="needs a target with FP8"):
        dispatch(call, IPU2)
    assert dispatch(CastCall(64, FP16, FP32), IPU2).name == "cast_convert"


def test_calls_validate_their_fields_and_print_in_one_line():
    with pytest.raises(TileplanError, match="positive integer"):
        MatMulCall(0, 4, 4, FP16, FP16)
    with pytest.raises(TileplanError, match="needs a positive grain"):
        MatMulCall(4, 4, 4, FP16, FP16, b_format="panels")
    with pytest.raises(TileplanError, match="scales are FP8 only"):
        CastCall(4, FP16, FP32, in_scale=1)
    with pytest.raises(TileplanError, match="mode must be one of"):
        BinaryCall(2, 2, FP16, "diagonal")
    call = MatMulCall(184, 64, 288, FP8, FP16, b_format="panels", grain=32)
    assert str(call) == "matmul(m=184, n=64, k=288, in_dtype=fp8, partials=fp16, b_format=panels, grain=32)"
    assert call.key() == "matmul_fp8_fp16_panels"
    assert dataclasses.replace(call, k=64).key() == call.key()
    assert np.isfinite(dispatch(call, IPU21).cycles(call, IPU21))
