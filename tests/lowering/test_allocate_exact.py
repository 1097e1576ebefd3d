"""The allocator against an exact packer on small cases.

Dynamic storage allocation (buffers with sizes and lifetimes, one address each, no two buffers live
at the same step overlapping) is NP-hard; the allocator's first fit in a fixed order is a heuristic.
Here each random case is also solved exactly with OR-tools CP-SAT (``NoOverlap2D`` over the address
interval and the lifetime interval of every buffer), and the two are compared. The bound every case
is measured against is the interval-graph lower bound: the most bytes live at one step ("max live"),
which is what the planner's memory check counts.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tileplan.lowering.allocate import _placements, placement_order
from tileplan.target import load_target

cp_model = pytest.importorskip("ortools.sat.python.cp_model")

TARGET = load_target("ipu21-64")
ALIGN = TARGET.alignment

# The heuristic places every case whose max live bytes are at most this fraction of the capacity.
# Measured: over these cases first fit missed only above 97% (the test prints the misses); over 688
# other random cases (the allocator's module docstring) the lowest miss was at 91.8%.
FITS_BELOW = 0.9
CASES = 240


def exact_fits(sizes, spans, capacity: int) -> bool | None:
    """Can the buffers be placed at aligned addresses in ``[0, capacity)``? None: undecided in time."""
    units = capacity // ALIGN
    if any(-(-int(n) // ALIGN) > units for n in sizes):
        return False
    m = cp_model.CpModel()
    xs, ys = [], []
    for i, (n, (a, b)) in enumerate(zip(sizes, spans)):
        u = -(-int(n) // ALIGN)
        s = m.NewIntVar(0, units - u, f"s{i}")
        xs.append(m.NewIntervalVar(s, u, s + u, f"x{i}"))
        ys.append(m.NewFixedSizeIntervalVar(a, b + 1 - a, f"y{i}"))
    m.AddNoOverlap2D(xs, ys)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    solver.parameters.max_time_in_seconds = 10.0
    status = solver.Solve(m)
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return True
    return False if status == cp_model.INFEASIBLE else None


def heuristic(sizes, spans, steps: int, capacity: int):
    """The allocator's placement of one size profile in one region of ``capacity`` bytes: addresses
    by buffer, or the allocator's message when it does not fit."""
    target = replace(TARGET, reserve_bytes=0, standard_bytes=capacity, interleaved_bytes=0, sram_bytes=capacity)
    regions = {"standard": (0, capacity), "interleaved": (capacity, capacity)}
    roots = [f"b{i}" for i in range(len(sizes))]
    order = placement_order(sizes, spans, roots, steps)
    (_, got), = _placements(np.asarray(sizes)[None], order, roots, np.zeros(len(sizes), bool), spans, regions,
                            target)
    return getattr(got, "message", got)          # (a profile that does not fit: its message)


def random_case(rng):
    """Lifetimes over a few steps, about a quarter of them the whole program (resident parameters),
    sizes multiples of the alignment, and a capacity between 95% and 143% of the max live bytes."""
    steps = int(rng.integers(4, 12))
    spans = []
    for _ in range(int(rng.integers(5, 14))):
        if rng.random() < 0.25:
            spans.append((0, steps - 1))
        else:
            spans.append(tuple(sorted(int(x) for x in rng.integers(0, steps, 2))))
    sizes = rng.integers(1, 30, len(spans)) * ALIGN * int(rng.integers(1, 5))
    live = max(sum(int(n) for n, (a, b) in zip(sizes, spans) if a <= t <= b) for t in range(steps))
    capacity = -(-int(live / rng.uniform(0.7, 1.05)) // ALIGN) * ALIGN
    return steps, sizes, spans, live, capacity


def test_the_allocator_places_validly_and_fits_what_the_exact_packer_fits_with_headroom():
    rng = np.random.default_rng(2024)
    tally = {"cases": 0, "over max live": 0, "exact fits": 0, "exact does not": 0, "undecided": 0,
             "heuristic fits": 0}
    missed = []                  # (max live / capacity) of cases the exact packer fits and first fit does not
    for case in range(CASES):
        steps, sizes, spans, live, capacity = random_case(rng)
        tally["cases"] += 1
        got = heuristic(sizes, spans, steps, capacity)
        fits = not isinstance(got, str)
        if live > capacity:
            tally["over max live"] += 1
            assert not fits, case                   # no placement beats the lower bound
            continue
        if fits:
            tally["heuristic fits"] += 1
            # Valid: aligned, inside the capacity, no two buffers live at one step sharing a byte.
            assert (got % ALIGN == 0).all() and (got >= 0).all() and (got + sizes <= capacity).all(), case
            for i in range(len(sizes)):
                for j in range(i):
                    if spans[i][0] <= spans[j][1] and spans[j][0] <= spans[i][1]:
                        assert got[i] + sizes[i] <= got[j] or got[j] + sizes[j] <= got[i], (case, i, j)
        exact = exact_fits(sizes, spans, capacity)
        tally[{True: "exact fits", False: "exact does not", None: "undecided"}[exact]] += 1
        if fits:
            assert exact is not False, case         # the exact packer is exact: it fits whatever first fit does
        elif exact:
            missed.append(live / capacity)
        if not fits:
            assert "does not fit" in got, got
    print(tally, "missed at max live / capacity:", sorted(round(m, 3) for m in missed))
    assert tally["undecided"] == 0
    # Every miss is within the documented margin: max live above FITS_BELOW of the capacity.
    assert all(m > FITS_BELOW for m in missed), sorted(missed)
    # The cases span both sides of the bound: some cannot fit at all, most fit.
    assert tally["over max live"] > 0 and tally["heuristic fits"] > CASES // 2


def test_a_fragmented_tile_is_reported_as_fragmented_with_its_peak_and_largest_buffers():
    """Three steps, one 72-byte region, four buffers whose peak is exactly 72 bytes: the exact packer
    places them (24-byte buffers at 0, 24, 48; the 32-byte one at 0 after the first two end), first
    fit in the allocator's order does not (the 32-byte buffer first, at 0, leaves no 24-byte gap
    below the one live beside it). The error names the tile, the buffer, each region's largest gap,
    the tile's peak and that the placement, not the bytes, failed."""
    from tileplan.errors import TileplanError
    from tileplan.layout import Intervals
    from tileplan.lowering.allocate import allocate
    from tileplan.program import Buffer, Copy, ExchangeStep, Program
    from tileplan.graph.dtypes import DType

    sizes = {"b0": 24, "b1": 24, "c": 32, "b3": 24, "z": 0}
    spans = [(0, 1), (0, 0), (1, 2), (0, 0)]
    assert exact_fits([24, 24, 32, 24], spans, 72) is True
    target = replace(TARGET, reserve_bytes=0, standard_bytes=72, interleaved_bytes=0, sram_bytes=72)
    buffers = {n: Buffer(n, Intervals(target.tiles), (4,), DType.FP16, "transient") for n in sizes}
    steps = [ExchangeStep("s0", (Copy("b1", "b0"), Copy("b3", "b0"))), ExchangeStep("s1", (Copy("b0", "c"),)),
             ExchangeStep("s2", (Copy("c", "z"),))]
    per_tile = {n: np.full(target.tiles, v, dtype=np.int64) for n, v in sizes.items()}
    with pytest.raises(TileplanError) as info:
        allocate(Program(buffers, steps), target, sizes=per_tile)
    message = str(info.value)
    assert message.startswith("tile 0: buffer 'b")
    assert "the largest free gaps while it is live: 16 in the standard region" in message
    assert "its peak is 72 bytes at step 0 (100.0% of the usable bytes): the placement fragmented" in message
    assert "largest live then: 'b0' 24, 'b1' 24, 'b3' 24 bytes" in message
