"""The coarse model ranks a GEMM's survivors the way the detailed estimate does (Spearman >= 0.8)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tileplan.planner.quality import coarse_ranking, spearman
from tileplan.target import load_target

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def test_spearman_of_a_monotone_pair_is_one_and_of_a_reversed_pair_minus_one():
    assert spearman([1, 2, 3, 4], [10, 20, 25, 90]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [9, 5, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 2], [5, 5, 7]) == pytest.approx(1.0)


def fixture_plan(planned, fixture: str):
    """The fixture's plan on its own target (ipu21-64), planned once per session (``planned``)."""
    graph, target, p = planned(FIXTURES / f"{fixture}.toml")
    assert target.name == "ipu21-64"
    return p


FIXTURE_NAMES = ["mlp_smoke_fp8", "mlp_fp16_small", "odd_prime_dims", "odd_fp8_tails", "odd_fp8_panels",
                 "odd_3d_activation", "residual_block"]
# odd_prime_dims (K = 131): since an odd K block runs on the AMP after a repack (not on the vector
# unit, which used to dominate and order every grid), its top 32 survivors lie within 5% of each
# other and the coarse model's errors of ~100 cycles reorder them: Spearman 0.68. A known gap of the
# coarse model (its per-grid error is not modelled); the test below checks that the pruning keeps the best.
# With the fused epilogue kinds among its survivors (their reducers cost clearly more, and the coarse
# model prices that) the ranking is back above 0.8, so it is checked like the others.
KNOWN_LOW: dict[str, str] = {}


@pytest.mark.parametrize("fixture", [pytest.param(f, marks=pytest.mark.xfail(reason=KNOWN_LOW[f], strict=True))
                                     if f in KNOWN_LOW else f for f in FIXTURE_NAMES])
def test_coarse_ranking_agrees_with_the_detailed_estimates(fixture, planned):
    # Per GEMM: coarse-versus-detailed Spearman over the candidates that reached the detailed estimate.
    for op, fig in coarse_ranking(fixture_plan(planned, fixture)).items():
        if fig["spearman"] is None:      # fewer than 3 distinct implementations: nothing to rank
            continue
        assert fig["spearman"] >= 0.8, f"{fixture} {op}: Spearman {fig['spearman']:.3f} over {fig['survivors']} survivors"


@pytest.mark.parametrize("fixture", FIXTURE_NAMES)
def test_the_coarse_models_favourite_is_within_two_percent_of_the_detailed_best(fixture, planned):
    p = fixture_plan(planned, fixture)
    from tileplan.planner.quality import detailed_survivors
    for op, cands in detailed_survivors(p, default_storage=True).items():
        favourite = min(cands, key=lambda c: (c.coarse.compute, c.desc))
        best = min(c.estimate.cycles for c in cands)
        assert favourite.estimate.cycles <= 1.02 * best, (fixture, op, favourite.desc, favourite.estimate.cycles, best)


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


@pytest.mark.parametrize("epilogue", [("tanh", True, 1), ("", True, -2), ("erf", False, 0)])
def test_the_coarse_model_prices_a_fused_epilogue_with_the_reduce_kernels_dispatch_picks(epilogue):
    # reduction_epilogue_cycles finds the accepted reduce variants once per partials type and
    # keeps prices across calls; per row it must give what dispatching both calls gives.
    import numpy as np

    from tileplan.estimate.coarse import reduction_epilogue_cycles, widest_block_n
    from tileplan.graph.core import Graph, MatMul, Role, Tensor
    from tileplan.graph.dtypes import DType
    from tileplan.kernels import dispatch
    from tileplan.kernels.calls import ReduceCall
    from tileplan.planner.gemm import Epilogue, GemmShape

    target = load_target("ipu21")
    g = Graph.build("g", [Tensor("x", (729, 1152), DType.FP8, Role.INPUT),
                          Tensor("w", (1152, 4304), DType.FP8, Role.PARAMETER)], [MatMul("mm", ("x", "w"), "y")])
    shape = GemmShape.of(g, g.ops[0], target)
    fields = Epilogue(*epilogue).fields()
    rng = np.random.default_rng(5)
    grid = np.stack([np.ones(60, int), rng.integers(1, 40, 60), rng.integers(1, 92, 60), rng.integers(1, 12, 60)], 1)
    red = rng.integers(0, 3, 60)
    ptype = rng.integers(0, len(shape.partial_types()), 60)
    for repeat in range(2):                           # the second call reads the kept prices
        got = reduction_epilogue_cycles(shape, target, grid, red, ptype, True, fields)
        for i, (gb, gm, gn, gk) in enumerate(grid.tolist()):
            m = -(-shape.M // gm)
            rows = -(-m // gk) if red[i] == 2 else m
            n = int(widest_block_n(shape, np.array([gn]))[0])
            if red[i] == 0 or gk < 2:
                assert got[i] == 0
                continue
            calls = [ReduceCall(rows * n, gk, shape.partial_types()[ptype[i]], shape.out_dtype, -shape.c_scale, n,
                                True, **f) for f in ({}, fields)]
            base, fused = (dispatch(c, target).cycles(c, target) for c in calls)
            assert got[i] == fused - base


@pytest.mark.parametrize("fixture", ["mlp_smoke_fp8", "mlp_fp16_small", "odd_fp8_panels", "residual_block"])
def test_no_plan_computes_a_gemm_faster_than_its_amp_floor(fixture, planned):
    """The AMP floor (the fastest fitting grid's matmul step alone) is at most every detailed
    candidate's own matmul step."""
    from tileplan.program import ComputeStep
    from tileplan.planner.quality import amp_floor
    p = fixture_plan(planned, fixture)
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


def test_the_coarse_reduction_prices_each_partials_type_with_the_kernel_formula():
    """The coarse rows call kernels.cycles' reduction loop: FP32 partials take twice the waves of FP16."""
    import numpy as np
    from tileplan.estimate.coarse import reduction_bias_cycles
    from tileplan.graph.core import Graph, MatMul, Role, Tensor
    from tileplan.graph.dtypes import DType
    from tileplan.kernels import ReduceCall
    from tileplan.kernels.cycles import reduce_cycles
    from tileplan.planner.gemm import GemmShape
    from tileplan.target import load_target
    target = load_target("ipu21-64")
    a = Tensor("a", (64, 256), DType.FP16, Role.INPUT)
    w = Tensor("w", (256, 96), DType.FP16, Role.PARAMETER)
    graph = Graph.build("m", [a, w], [MatMul("mm", ("a", "w"), "c")])
    g = GemmShape.of(graph, graph.ops[0], target)
    grid = np.array([[1, 4, 2, 4]])
    types = g.partial_types()
    assert set(types) == {DType.FP16, DType.FP32}
    for idx, ptype in enumerate(types):
        got = reduction_bias_cycles(g, target, grid, np.array([1]), np.array([idx]))[0]
        n = 16 * 48
        want = (reduce_cycles(ReduceCall(n, 5, ptype, g.out_dtype), target)
                - reduce_cycles(ReduceCall(n, 4, ptype, g.out_dtype), target))
        assert got == want, (ptype, got, want)
