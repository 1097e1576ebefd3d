"""Bounded Pareto frontiers: extremes kept, only non-dominated points, the bound respected."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tileplan.planner.frontier import PRUNE_FROM, frontier, pareto


@st.composite
def points(draw, extra_columns: int = 2):
    n = draw(st.integers(1, 60))
    col = st.lists(st.integers(0, 50), min_size=n, max_size=n)
    cycles, memory = np.array(draw(col)), np.array(draw(col))
    extremes = tuple(np.array(draw(col)) for _ in range(draw(st.integers(0, extra_columns))))
    return cycles, memory, extremes


def brute_force_pareto(cycles, memory) -> set[int]:
    """Indices not dominated by any other point (first of identical points)."""
    keep = set()
    for i in range(cycles.size):
        dominated = any((cycles[j] <= cycles[i] and memory[j] <= memory[i])
                        and (cycles[j] < cycles[i] or memory[j] < memory[i] or j < i)
                        for j in range(cycles.size) if j != i)
        if not dominated:
            keep.add(i)
    return keep


def argmin_by(col, cycles) -> int:
    """The least entry of a column, ties broken by fewer cycles then lower index."""
    return int(np.lexsort((np.arange(col.size), cycles, col))[0])


@settings(max_examples=200, deadline=None)
@given(points(), st.integers(4, 40))
def test_frontier_keeps_the_fastest_and_every_least_memory_entry(data, bound):
    cycles, memory, extremes = data
    out = set(frontier(cycles, memory, bound, extremes=extremes).tolist())
    assert int(np.lexsort((np.arange(cycles.size), memory, cycles))[0]) in out      # fastest
    assert argmin_by(memory, cycles) in out
    for col in extremes:
        assert argmin_by(col, cycles) in out


@settings(max_examples=200, deadline=None)
@given(points(extra_columns=0))
def test_an_unthinned_frontier_is_exactly_the_non_dominated_points(data):
    cycles, memory, _ = data
    out = frontier(cycles, memory, bound=10_000)
    assert set(out.tolist()) == brute_force_pareto(cycles, memory) == set(pareto(cycles, memory).tolist())
    # In cycle order, memory falls strictly.
    assert np.all(np.diff(cycles[out]) > 0) and np.all(np.diff(memory[out]) < 0)


@settings(max_examples=200, deadline=None)
@given(points(), st.integers(4, 12))
def test_a_crowded_frontier_respects_its_bound_and_keeps_only_pareto_points_or_extremes(data, bound):
    cycles, memory, extremes = data
    out = frontier(cycles, memory, bound, extremes=extremes)
    assert len(out) <= bound and len(set(out.tolist())) == len(out)
    allowed = brute_force_pareto(cycles, memory) | {argmin_by(c, cycles) for c in extremes}
    assert set(out.tolist()) <= allowed


def test_a_thinned_frontier_spreads_over_the_cycle_range():
    cycles = np.arange(100)
    memory = 100 - np.arange(100)                  # every point is on the frontier
    out = frontier(cycles, memory, bound=8)
    assert len(out) == 8 and out[0] == 0 and out[-1] == 99
    assert np.max(np.diff(cycles[out])) <= 2 * 99 / 7


def sorted_pareto(cycles, memory) -> np.ndarray:
    """The Pareto set by sorting every row: (cycles, memory, index) order, memory falling strictly."""
    order = np.lexsort((np.arange(cycles.size), memory, cycles))
    m = memory[order]
    best = np.minimum.accumulate(np.concatenate(([np.iinfo(np.int64).max], m[:-1])))
    return order[m < best]


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([7, 1000, 10**6]))
def test_pareto_of_many_trade_off_rows_equals_sorting_them_all(seed, spread):
    """The anchor pruning that spares sorting hundreds of thousands of coarse rows drops no front entry,
    on rows shaped like a GEMM's options (memory falls as cycles rise, with noise and ties)."""
    rng = np.random.default_rng(seed)
    n = 20_000                       # above frontier.PRUNE_FROM: the pruning runs
    cycles = rng.integers(1_000, 1_000 + spread, n)
    memory = (10**9 // cycles + rng.integers(0, spread, n)).astype(np.int64)
    assert n > PRUNE_FROM
    assert np.array_equal(pareto(cycles, memory), sorted_pareto(cycles, memory))
