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


# Measured on this tree (coarse vs detailed, per GEMM): odd_fp8_tails' one GEMM has gk > 1
# candidates within 0.5% of each other in detail, which the coarse model (largest block, no
# per-run on-tile copy count for partials) cannot order: Spearman 0.44.
KNOWN_BELOW = {
    "odd_fp8_tails": "fc: Spearman 0.44 (gk > 1 near-ties within 0.5%; on-tile copies of partials unpriced)",
}


@pytest.mark.parametrize("fixture", [
    pytest.param(f, marks=pytest.mark.xfail(strict=True, reason=KNOWN_BELOW[f])) if f in KNOWN_BELOW else f
    for f in ("mlp_smoke_fp8", "mlp_fp16_small", "odd_prime_dims", "odd_fp8_tails", "odd_3d_activation",
              "residual_block")])
def test_coarse_ranking_agrees_with_the_detailed_estimates(fixture):
    for op, fig in ranking(fixture).items():
        if fig["spearman"] is None:      # fewer than 3 distinct implementations: nothing to rank
            continue
        assert fig["spearman"] >= 0.8, f"{fixture} {op}: Spearman {fig['spearman']:.3f} over {fig['survivors']} survivors"
