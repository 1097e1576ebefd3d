"""The coarse model ranks a GEMM's survivors the way the detailed estimate does (Spearman >= 0.8)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

from tileplan.graph.loaders import load_model
from tileplan.planner.plan import plan
from tileplan.target import load_target

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def ranks(x) -> np.ndarray:
    """Ranks from 0, ties sharing their average rank."""
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="stable")
    r = np.empty(x.size)
    r[order] = np.arange(x.size)
    _, group = np.unique(x, return_inverse=True)
    return (np.bincount(group, r) / np.bincount(group))[group]


def spearman(a, b) -> float:
    ra, rb = ranks(a), ranks(b)
    if np.ptp(ra) == 0 or np.ptp(rb) == 0:
        return 1.0 if np.ptp(ra) == np.ptp(rb) else 0.0
    return float(np.corrcoef(ra, rb)[0, 1])


def test_spearman_of_a_monotone_pair_is_one_and_of_a_reversed_pair_minus_one():
    assert spearman([1, 2, 3, 4], [10, 20, 25, 90]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [9, 5, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 2], [5, 5, 7]) == pytest.approx(1.0)


@lru_cache(maxsize=None)
def survivors(fixture: str) -> dict[str, list]:
    """Per GEMM: every candidate that reached the detailed estimate (kept or not)."""
    p = plan(load_model(FIXTURES / f"{fixture}.toml"), load_target("ipu21-64"), jobs=1)
    out = {}
    for op, cands in p.candidates.items():
        if cands and cands[0].choice is not None:
            out[op] = [c for c in cands + p.runner_ups.get(op, []) if c.detailed]
    return out


# Measured on this tree (coarse vs detailed, per GEMM): the coarse model prices A's multicast at
# the paired rate for a ``bilj`` order, but when the sending tiles are themselves destinations
# their own piece is a local copy and the remaining destinations are no longer complete pairs,
# so the detailed exchange runs at the unpaired rate (mlp_fp16_small and residual_block fc1:
# 2x32x1 is coarse-fastest, detailed-slowest); the coarse model has no local-copy term.
KNOWN_BELOW = {
    "mlp_fp16_small": "fc1: Spearman -0.5 over 3 grids (A multicast priced paired, runs unpaired)",
    "residual_block": "fc1: Spearman -0.5 over 3 grids (A multicast priced paired, runs unpaired)",
    "odd_fp8_tails": "fc: Spearman 0.45 (gk > 1 near-ties within 0.5%; local copies unpriced)",
}


@pytest.mark.parametrize("fixture", [
    pytest.param(f, marks=pytest.mark.xfail(strict=True, reason=KNOWN_BELOW[f])) if f in KNOWN_BELOW else f
    for f in ("mlp_smoke_fp8", "mlp_fp16_small", "odd_prime_dims", "odd_fp8_tails", "odd_3d_activation",
              "residual_block")])
def test_coarse_ranking_agrees_with_the_detailed_estimates(fixture):
    for op, cands in survivors(fixture).items():
        if len({c.desc for c in cands}) < 3:
            continue
        rho = spearman([c.coarse.compute for c in cands], [c.estimate.cycles for c in cands])
        assert rho >= 0.8, f"{fixture} {op}: Spearman {rho:.3f} over {len(cands)} survivors"
