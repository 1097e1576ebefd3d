"""FP8 towers: the default tolerance follows the FP8 GEMMs on an output's path, and still catches
a wrong FP8 computation; the reference's low-memory mode gives the same outputs."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from tileplan.graph.loaders import load_model
from tileplan.kernels import default_registry
from tileplan.kernels.registry import Registry
from tileplan.sim.reference import reference, seeded_values
from tileplan.sim.validate import FP8_FITTED_DEPTH, TOLERANCES, depth_factor, fp8_gemm_depth
from tileplan.graph.dtypes import DType

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def _make_encoder():
    spec = importlib.util.spec_from_file_location("make_encoder", FIXTURES / "make_encoder.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("make_encoder", mod)       # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def small_fp8_tower(tmp_path: Path, layers: int) -> Path:
    """The small tower's shape (2 x 20 tokens, width 96, 64 tiles) with FP8 projection GEMMs, as
    ``siglip_tower_fp8_b1`` has them."""
    m = _make_encoder()
    spec = m.Spec(f"small_fp8_tower{layers}", "ipu21-64", 2, 20, 96, 6, 192, True, layers=layers,
                  description="small FP8 tower")
    path = tmp_path / f"{spec.name}.toml"
    path.write_text(m.Writer(spec).text())
    return path


def test_an_encoder_layer_puts_four_fp8_gemms_on_its_output_path_and_an_fp16_tower_none(tmp_path):
    g = load_model(small_fp8_tower(tmp_path, 3))
    depth = fp8_gemm_depth(g)
    # q (k, v run beside it), the output projection, fc1 and fc2; the attention products are FP16.
    assert [depth[f"l{i}.y"] for i in range(3)] == [4, 8, 12]
    assert depth["l0.h"] == 2 and depth["l0.scores"] == 1 and depth["x"] == 0
    fp16 = fp8_gemm_depth(load_model(FIXTURES / "encoder_tower_small.toml"))
    assert max(fp16.values()) == 0


def test_the_fp8_atol_is_the_fitted_one_up_to_two_gemms_deep_then_grows_with_the_square_root():
    assert depth_factor(0) == depth_factor(1) == depth_factor(FP8_FITTED_DEPTH) == 1.0
    assert depth_factor(8) == 2.0
    assert depth_factor(108) == pytest.approx(math.sqrt(54))      # the 27-layer SigLIP tower


def test_the_reference_keeping_only_the_outputs_gives_the_same_outputs(tmp_path):
    g = load_model(small_fp8_tower(tmp_path, 2))
    stored = seeded_values(g)
    full = reference(g, stored)
    kept = reference(g, stored, keep=["l1.y", "l0.y"])
    assert sorted(kept) == ["l0.y", "l1.y"]
    for name, value in kept.items():
        assert np.array_equal(value, full[name])


def _truncating_fp8_casts() -> Registry:
    """The default kernels, but every cast into FP8 rounds toward zero (a saturating cast written
    with a truncation instead of round-to-nearest-even): each cast is off by up to one FP8 step."""
    reg = default_registry()
    return Registry(dataclasses.replace(v, reference_fn=lambda call, x, _n=v.name: _trunc(reg, _n, call, x))
                    if v.primitive == "cast" else v for v in reg)


def _trunc(reg, name, call, x):
    from tileplan.graph.dtypes import dequantise
    y = reg[name].reference(call, x)
    if call.out_dtype is not DType.FP8:
        return y
    xin = np.asarray(x)
    if call.in_dtype is DType.FP8 and xin.dtype == np.uint8:
        xin = xin.view(call.in_dtype.numpy)
    want = dequantise(xin, call.in_dtype, call.in_scale).reshape(y.shape) * 2.0 ** -call.out_scale
    away = np.abs(y.astype(np.float64)) > np.abs(want)     # rounded away from zero: take the neighbour below
    bits = np.ascontiguousarray(y).view(np.uint8)
    mag = (bits & 0x7F).astype(np.int16) - away            # F143: the magnitude bits count up in value
    toward = np.where(mag <= 0, 0, (bits & 0x80) | np.maximum(mag, 0)).astype(np.uint8)
    return np.where(away, toward, bits).astype(np.uint8).view(y.dtype)


def _reductions_dropping_their_last_partial() -> Registry:
    """The default kernels, but a split-K reduction sums all its partials but the last."""
    reg = default_registry()

    def drop_last(call, *ins, _n):
        if call.parts < 2:
            return reg[_n].reference(call, *ins)
        if call.own:             # (own partial, the others, [bias]): the others lose their last
            if call.parts == 2:
                return reg[_n].reference(dataclasses.replace(call, parts=1, own=False), ins[0], *ins[2:])
            others = np.asarray(ins[1])[..., :(call.parts - 2) * call.n]
            return reg[_n].reference(dataclasses.replace(call, parts=call.parts - 1), ins[0], others, *ins[2:])
        first = np.asarray(ins[0])[..., :(call.parts - 1) * call.n]
        return reg[_n].reference(dataclasses.replace(call, parts=call.parts - 1), first, *ins[1:])

    return Registry(dataclasses.replace(v, reference_fn=lambda call, *ins, _n=v.name: drop_last(call, *ins, _n=_n))
                    if v.primitive == "reduce" else v for v in reg)


@pytest.mark.slow
def test_a_small_fp8_tower_passes_the_depth_tolerance_a_dropped_partial_fails_and_truncating_casts_show_in_the_cosine(tmp_path):
    import tileplan
    from tileplan.lowering.compile import compile_model
    from tileplan.lowering.package import load_package
    from tileplan.sim.validate import validate_package
    from tileplan.target import load_target
    g = load_model(small_fp8_tower(tmp_path, 4))
    _, _, pkg_path = compile_model(g, load_target(g.target), tmp_path / "pkg")
    v = tileplan.validate(pkg_path, write=False)
    out = v.outputs["l3.y"]
    assert out["fp8_depth"] == 16
    base = TOLERANCES[DType.FP8][0]
    assert out["atol"] == pytest.approx(base * max(1.0, float(np.abs(v.values["l3.y"]).max())) * math.sqrt(8),
                                        rel=0.05)
    assert v.passed, out
    assert out["cosine"] > 0.999
    # Measured: max abs 0.217 within atol 0.322, cosine 0.99980. A split-K reduction that drops a
    # partial fails (3.1). FP8 casts that truncate are NOT caught by the element tolerance (0.664,
    # within rtol 0.125 of a large element): only the cosine shows them (0.99853), 7x further from 1.
    dropped = validate_package(load_package(pkg_path), registry=_reductions_dropping_their_last_partial())
    assert not dropped.passed, dropped.outputs["l3.y"]
    trunc = validate_package(load_package(pkg_path), registry=_truncating_fp8_casts()).outputs["l3.y"]
    assert trunc["max_abs"] > 2 * out["max_abs"]
    assert 1 - trunc["cosine"] > 4 * (1 - out["cosine"])
