"""Plan-quality figures shared by the tests and ``tileplan bench``.

- ``spearman``: rank correlation (ties share their average rank).
- ``detailed_survivors``: per GEMM of a plan, every candidate that reached the
  detailed estimate (kept or a runner-up).
- ``coarse_ranking``: per GEMM, the Spearman correlation of the coarse compute
  cycles with the detailed cycles over those survivors.
- ``amp_floor``: per GEMM, the matmul step of its fastest grid option that fits
  tile memory, alone (no exchange, no reduction): what no plan under the cycle
  model can beat, beside the roofline bound that assumes a perfect AMP.
- ``search_gap``: the bounded DP's cycles against the optimum of the same
  ``select.Problem`` (the exhaustive oracle, or the unbounded DP when the
  product of choices is too large to enumerate).
"""

from __future__ import annotations

import math

import numpy as np

from .select import Problem, solve_dp, solve_exhaustive


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


def detailed_survivors(plan) -> dict[str, list]:
    """Per GEMM: every candidate that reached the detailed estimate (kept or not)."""
    out = {}
    for op, cands in plan.candidates.items():
        if cands and cands[0].choice is not None:
            out[op] = [c for c in cands + plan.runner_ups.get(op, []) if c.detailed]
    return out


def coarse_ranking(plan, min_distinct: int = 3) -> dict[str, dict]:
    """Per GEMM: ``spearman`` of coarse compute cycles against detailed cycles over its detailed
    survivors (None when fewer than ``min_distinct`` distinct implementations: nothing to rank),
    and how many survivors there were."""
    out = {}
    for op, cands in detailed_survivors(plan).items():
        distinct = len({c.desc for c in cands})
        rho = (spearman([c.coarse.compute for c in cands], [c.estimate.cycles for c in cands])
               if distinct >= min_distinct else None)
        out[op] = {"spearman": rho, "survivors": len(cands), "distinct": distinct}
    return out


def combinations(problem: Problem) -> int:
    return math.prod(len(problem.choices[op]) for op in problem.ops)


def search_gap(problem: Problem, paths: int = 16, max_combinations: int = 2_000_000) -> dict:
    """The bounded DP (``paths``) against the optimum: ``solve_exhaustive`` when the product of
    choices is at most ``max_combinations``, else the unbounded (exact) DP. ``gap`` is
    bounded / optimum - 1 (None when nothing fits)."""
    n = combinations(problem)
    bounded = solve_dp(problem, paths=paths)
    if n <= max_combinations:
        optimum, method = solve_exhaustive(problem), "exhaustive"
    else:
        optimum, method = solve_dp(problem, paths=None), "exact dp (unbounded paths)"
    gap = None
    if bounded is not None and optimum is not None:
        gap = bounded.cycles / optimum.cycles - 1 if optimum.cycles else 0.0
    return {"paths": paths, "combinations": n, "optimum_method": method,
            "bounded_cycles": bounded.cycles if bounded is not None else None,
            "optimum_cycles": optimum.cycles if optimum is not None else None,
            "gap": gap}


def amp_floor(plan) -> dict[str, dict]:
    """Per GEMM: the fewest matmul-step cycles of any grid option (every order, reduction and
    serial K split) whose blocks fit tile memory with no boundary pieces, and that option."""
    from ..estimate.coarse import amp_cycles
    from ..graph.core import MatMul
    from .gemm import GemmShape, coarse_rows
    out = {}
    for op in plan.graph.ops:
        if not isinstance(op, MatMul):
            continue
        shape = GemmShape.of(plan.graph, op, plan.target)
        rows = coarse_rows(shape, plan.target, 0, 0)
        fit = np.flatnonzero(rows.fits)
        if not fit.size:
            continue
        amp = amp_cycles(shape, plan.target, rows.grid[fit], rows.partials[fit], rows.sk[fit])
        best = int(np.argmin(amp))
        out[op.name] = {"cycles": int(amp[best]), "choice": str(rows.choice(shape, int(fit[best])))}
    return out
