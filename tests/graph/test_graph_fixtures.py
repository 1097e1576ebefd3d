"""Every fixture loads, with the shapes, FLOPs and roofline bounds the design names."""

from __future__ import annotations

import pytest

from tileplan.graph import DType, MatMul, Role
from tileplan.graph.loaders import load_model
from tileplan.target import load_target

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures"

ALL = sorted(p.stem for p in FIXTURES.glob("*.toml"))
EXPECTED = {"mlp_smoke_fp8", "mlp_fp16_small", "siglip_mlp_fp8_b1", "siglip_mlp_fp8_b4", "gemm_4096_fp16",
            "odd_prime_dims", "odd_fp8_tails", "odd_fp8_panels", "odd_3d_activation", "residual_block"}


def load(name: str):
    return load_model(FIXTURES / f"{name}.toml")


def test_the_fixture_set_is_complete():
    assert EXPECTED <= set(ALL)


@pytest.mark.parametrize("name", ALL)
def test_every_fixture_loads_and_checks_against_its_own_target(name):
    g = load(name)
    assert g.name == name
    target = load_target(g.target)
    load_model(FIXTURES / f"{name}.toml", target=target)
    has_matmul = any(op.kind == "matmul" for op in g.ops)
    assert (g.roofline_cycles(target) > 0) == has_matmul       # no MatMul: no roofline bound
    assert g.by_role(Role.INPUT) and g.by_role(Role.OUTPUT)


@pytest.mark.parametrize("name", ALL)
def test_ops_come_in_dependency_order(name):
    g = load(name)
    seen = {t.name for t in g.tensors.values() if t.role in (Role.INPUT, Role.PARAMETER)}
    for op in g.ops:
        assert all(i in seen for i in op.inputs), op.name
        seen.add(op.output)


@pytest.mark.parametrize("batch, x_shape", [(1, (729, 1152)), (4, (4, 729, 1152))])
def test_siglip_mlp_shapes_types_and_scales(batch, x_shape):
    g = load(f"siglip_mlp_fp8_b{batch}")
    assert g.target == "ipu21"
    assert g.tensors["x"].shape == x_shape and g.tensors["x"].dtype is DType.FP16
    assert g.tensors["y"].shape == x_shape and g.tensors["y"].dtype is DType.FP16
    assert g.tensors["g"].shape == x_shape[:-1] + (4304,)
    assert (g.tensors["w1"].dtype, g.tensors["w1"].scale) == (DType.FP8, 1)      # MLP up +1
    assert (g.tensors["w2"].dtype, g.tensors["w2"].scale) == (DType.FP8, -1)     # MLP down -1
    assert [op.kind for op in g.ops] == ["cast", "matmul", "add", "gelu", "cast", "matmul", "add"]
    assert g.op("gelu").approximate == "tanh"
    for mm in ("mlp_up", "mlp_down"):
        ins = g.inputs_of(g.op(mm))
        assert [t.dtype for t in ins] == [DType.FP8, DType.FP8] and g.output_of(g.op(mm)).dtype is DType.FP16


def test_siglip_b4_gemm_flops_and_roofline():
    g = load("siglip_mlp_fp8_b4")
    gemm_flops = 2 * 2916 * 1152 * 4304
    assert [g.flops(op) for op in g.ops if isinstance(op, MatMul)] == [gemm_flops, gemm_flops]
    ipu21 = load_target("ipu21")
    bound = g.roofline_cycles(ipu21)
    assert bound == pytest.approx(2 * gemm_flops / (1472 * 256))
    assert 152_000 < bound < 154_000                       # "about 153,000 cycles"


def test_siglip_b1_is_a_quarter_of_b4():
    ipu21 = load_target("ipu21")
    assert load("siglip_mlp_fp8_b1").roofline_cycles(ipu21) * 4 == pytest.approx(
        load("siglip_mlp_fp8_b4").roofline_cycles(ipu21))


def test_smoke_mlp_is_width_144_mlp_288_on_64_tiles():
    g = load("mlp_smoke_fp8")
    assert load_target(g.target).tiles == 64
    assert g.tensors["w1"].shape == (144, 288) and g.tensors["w2"].shape == (288, 144)
    assert g.tensors["x"].dtype is DType.FP16 and g.tensors["w1"].dtype is DType.FP8
    assert g.tensors["y"].shape == (96, 144) and g.tensors["y"].dtype is DType.FP16


def test_gemm_4096_roofline_on_ipu2():
    g = load("gemm_4096_fp16")
    assert g.target == "ipu2"
    assert g.total_flops() == 2 * 4096 ** 3
    assert g.roofline_cycles(load_target("ipu2")) == pytest.approx(2 * 4096 ** 3 / (1472 * 128))


def test_odd_shapes_are_odd():
    primes = load("odd_prime_dims")
    assert primes.tensors["x"].shape == (97, 131) and primes.tensors["y"].shape == (97, 61)
    assert primes.op("act").approximate == "erf"

    tails = load("odd_fp8_tails")
    x8, w = tails.tensors["x8"], tails.tensors["w"]
    assert x8.dtype is DType.FP8 and w.dtype is DType.FP8
    assert x8.cols * x8.dtype.itemsize % 4 and w.cols * w.dtype.itemsize % 4   # sub-word row tails

    three = load("odd_3d_activation")
    assert three.tensors["x"].shape == (3, 50, 64) and three.tensors["x"].rows == 150
    assert three.tensors["y"].shape == (3, 50, 64)


def test_residual_block_keeps_x_live_for_two_consumers():
    g = load("residual_block")
    assert [op.name for op in g.consumers["x"]] == ["fc1", "residual"]
    assert g.ops[-1].name == "residual" and g.tensors["y"].role is Role.OUTPUT
