"""The coarse model ranks a GEMM's survivors the way the detailed estimate does (Spearman >= 0.8)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pytest

from tileplan.graph.loaders import load_model
from tileplan.planner.plan import plan
from tileplan.planner.quality import coarse_ranking, spearman
from tileplan.target import load_target

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def test_spearman_of_a_monotone_pair_is_one_and_of_a_reversed_pair_minus_one():
    assert spearman([1, 2, 3, 4], [10, 20, 25, 90]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [9, 5, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 2], [5, 5, 7]) == pytest.approx(1.0)


@lru_cache(maxsize=None)
def ranking(fixture: str) -> dict[str, dict]:
    """Per GEMM: coarse-versus-detailed Spearman over the candidates that reached the detailed estimate."""
    return coarse_ranking(plan(load_model(FIXTURES / f"{fixture}.toml"), load_target("ipu21-64"), jobs=1))


@pytest.mark.parametrize("fixture", ["mlp_smoke_fp8", "mlp_fp16_small", "odd_prime_dims", "odd_fp8_tails",
                                     "odd_fp8_panels", "odd_3d_activation", "residual_block"])
def test_coarse_ranking_agrees_with_the_detailed_estimates(fixture):
    for op, fig in ranking(fixture).items():
        if fig["spearman"] is None:      # fewer than 3 distinct implementations: nothing to rank
            continue
        assert fig["spearman"] >= 0.8, f"{fixture} {op}: Spearman {fig['spearman']:.3f} over {fig['survivors']} survivors"


def test_the_coarse_model_prices_a_block_with_the_kernel_dispatch_picks():
    # matmul_block_cycles evaluates each variant as a line in the block's rows; it must give
    # exactly what dispatching the block's own call gives, AMP or vector-unit fallback alike.
    import numpy as np

    from tileplan.graph.core import MatMul, Role, Tensor, Graph
    from tileplan.graph.dtypes import DType
    from tileplan.kernels import dispatch
    from tileplan.kernels.calls import MatMulCall
    from tileplan.estimate.coarse import matmul_block_cycles
    from tileplan.planner.gemm import GemmShape

    target = load_target("ipu21")
    rng = np.random.default_rng(3)
    for dt, out, n_cols in ((DType.FP8, DType.FP16, 4304), (DType.FP16, DType.FP16, 4096), (DType.FP32, DType.FP32, 96)):
        g = Graph.build("g", [Tensor("x", (64, 200), dt, Role.INPUT), Tensor("w", (200, n_cols), dt, Role.PARAMETER)],
                        [MatMul("mm", ("x", "w"), "y")])
        shape = GemmShape.of(g, g.ops[0], target)
        m, n, k = (rng.integers(1, hi, 40) for hi in (700, 300, 300))
        if shape.panels:      # whole panels, or a partial last panel of whole 64-bit words
            unit = 8 // dt.itemsize
            n = np.maximum(n // unit, 1) * unit
        got = matmul_block_cycles(shape, target, m, n, k, 0)
        fmt, grain = ("panels", shape.grain) if shape.panels else ("rows", 0)
        for i in range(len(m)):
            call = MatMulCall(int(m[i]), int(n[i]), int(k[i]), dt, out, "interleaved", fmt, 0, grain)
            assert got[i] == dispatch(call, target).cycles(call, target)


@pytest.mark.parametrize("fixture", ["mlp_smoke_fp8", "mlp_fp16_small", "odd_fp8_panels", "residual_block"])
def test_no_plan_computes_a_gemm_faster_than_its_amp_floor(fixture):
    """The AMP floor (the fastest fitting grid's matmul step alone) is at most every detailed
    candidate's own matmul step."""
    from tileplan.estimate.program import ComputeStep
    from tileplan.planner.quality import amp_floor
    p = plan(load_model(FIXTURES / f"{fixture}.toml"), load_target("ipu21-64"), jobs=1)
    floor = amp_floor(p)
    assert set(floor) == {op for op, cs in p.candidates.items() if cs and cs[0].choice is not None}
    for op, f in floor.items():
        steps = []
        for c in p.candidates[op]:
            amp = [s for s in c.program.steps if isinstance(s, ComputeStep) and ".amp" in s.name]
            per_tile = {}
            for s in amp:
                t = {}
                for v in s.vertices:
                    t[v.tile] = t.get(v.tile, 0) + v.cycles
                per_tile[s.name] = max(t.values())
            steps.append(sum(per_tile.values()))
        assert f["cycles"] <= min(steps), (op, f, min(steps))
