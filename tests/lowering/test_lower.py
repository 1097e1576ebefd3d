"""Lowering a program by hand: rearrangement kernels, allocation, and what the tile program holds."""

from __future__ import annotations

import numpy as np
import pytest

import tileplan.lowering.lower as lowering
from tileplan.errors import TileplanError
from tileplan.program import Buffer, Copy, ExchangeStep, Program
from tileplan.graph.dtypes import DType
from tileplan.kernels import default_registry
from tileplan.layout import Intervals, Packed
from tileplan.lowering.lower import lower
from tileplan.sim.model import IPUModel
from tileplan.target import load_target

TARGET = load_target("ipu21-64")


def unpack_program(k: int = 64, n: int = 96) -> Program:
    """A resident FP8 parameter in AMP panels copied into a row-major (Intervals) buffer."""
    w = Buffer("w", Packed(32, TARGET.tiles), (k, n), DType.FP8, "parameter", "interleaved", tensor="w")
    rows = Buffer("w@Iv", Intervals(TARGET.tiles), (k, n), DType.FP8, "output", tensor="w")
    return Program({"w": w, "w@Iv": rows}, [ExchangeStep("convert.w", (Copy("w", "w@Iv"),))])


def test_a_conversion_out_of_panels_without_an_unpack_kernel_fails_before_any_expansion(monkeypatch):
    def must_not_run(*args, **kwargs):
        raise AssertionError("lowering went on to allocate or expand the conversion")

    monkeypatch.setattr(lowering, "allocate", must_not_run)
    monkeypatch.setattr(lowering, "expand", must_not_run)
    with pytest.raises(TileplanError) as info:
        lower(unpack_program(), TARGET, registry=default_registry().without("pack", "unpack"))
    message = str(info.value)
    assert "conversion of 'w'" in message
    assert "from Packed(32,64) (panels) to Iv(64,a8) (rows)" in message
    assert "needs the 'unpack' rearrangement kernel" in message
    assert "'ipu21'" in message


def test_a_conversion_out_of_panels_with_the_unpack_kernel_reads_back_row_major():
    k, n = 64, 96
    state = lower(unpack_program(k, n), TARGET)
    model = IPUModel(state.tile_program, TARGET)
    values = (np.arange(k * n) % 200).astype(np.uint8).reshape(k, n)   # distinct bytes per column group
    model.write("w", values.view(DType.FP8.numpy))
    model.run()
    np.testing.assert_array_equal(model.read("w@Iv").view(np.uint8).reshape(k, n), values)


def test_a_buffer_that_does_not_fit_names_the_tile_the_region_and_the_bytes():
    big = Buffer("big", Intervals(1), (TARGET.usable_bytes // 2 + 8,), DType.FP16, "tensor", tensor="t")
    out = Buffer("out", Intervals(2), big.shape, DType.FP16, "output", tensor="t")
    program = Program({"big": big, "out": out}, [ExchangeStep("spread", (Copy("big", "out"),))])
    with pytest.raises(TileplanError) as info:
        lower(program, TARGET)
    message = str(info.value)
    assert message.startswith("tile 0: buffer 'big'")
    assert f"({TARGET.usable_bytes + 16:,} bytes, standard preferred) does not fit" in message
    assert f"the tile has {TARGET.usable_bytes:,} usable bytes" in message


def test_every_buffer_is_aligned_and_clear_of_the_reserve():
    state = lower(unpack_program(), TARGET)
    tp = state.tile_program
    held = tp.size > 0
    assert (tp.addr[held] % TARGET.alignment == 0).all()
    assert (tp.addr[held] >= TARGET.reserve_bytes).all()
    assert ((tp.addr + tp.size)[held] <= TARGET.sram_bytes).all()
    packed = tp.addr[tp.buffer_index("w")]
    assert (packed[packed >= 0] >= TARGET.standard_bytes).all(), "a resident AMP operand prefers interleaved memory"


def test_first_fit_takes_the_lowest_aligned_address_clear_of_every_live_buffer():
    """The allocator's first fit against a scan of every aligned address: random placed buffers
    (addresses and lifetimes), random requests; the address must be the lowest one at which the
    request overlaps no placed buffer live at the same time, or None when no such address fits."""
    from tileplan.lowering.allocate import _Placed, _first_fit
    rng = np.random.default_rng(11)
    for trial in range(200):
        placed = _Placed(12)
        for _ in range(int(rng.integers(0, 12))):
            at = int(rng.integers(0, 60)) * 4
            placed.add(at, at + int(rng.integers(1, 40)), *sorted(int(x) for x in rng.integers(0, 8, 2)))
        lo, hi, align = int(rng.integers(0, 40)), int(rng.integers(120, 320)), 8
        n = int(rng.integers(1, 64))
        a, b = sorted(int(x) for x in rng.integers(0, 8, 2))
        live = [(o, q) for o, q, s, e in placed if s <= b and a <= e]
        want = next((x for x in range(-(-lo // align) * align, hi - n + 1, align)
                     if all(x + n <= o or q <= x for o, q in live)), None)
        assert _first_fit(placed, lo, hi, n, a, b, align) == want, trial


@pytest.mark.parametrize("forked", [False, True], ids=["one process", "halves forked"])
def test_size_profiles_placed_from_each_other_get_the_addresses_first_fit_gives_each_alone(forked, monkeypatch):
    """The allocator places each distinct size profile from the one before (a root keeps its
    address unless its size differs or a move of an earlier root live with it can change its first
    fit). Against each profile
    placed alone, root by root: random profiles that share most sizes (as a tower's tiles do),
    random lifetimes and region preferences, capacities small enough that some profiles fail,
    which must fail at the same root with the same message. Forked: the second half of the
    profiles placed in a forked process from scratch (as a tower's are), the same addresses."""
    from dataclasses import replace

    from tileplan.lowering import allocate
    from tileplan.lowering.allocate import _Placed, _does_not_fit, _first_fit, _placements
    if forked:
        monkeypatch.setattr(allocate, "FORK_PROFILES", 2)
    rng = np.random.default_rng(5)
    for trial in range(40):
        roots = [f"b{i}" for i in range(int(rng.integers(4, 30)))]
        r = len(roots)
        base = rng.integers(0, 6, r) * 8 * int(rng.integers(1, 14))
        profiles = np.repeat(base[None], int(rng.integers(1, 12)), axis=0)
        change = rng.random(profiles.shape) < 0.15
        profiles[change] = rng.integers(0, 6, int(change.sum())) * 8 * 10
        profiles = np.unique(profiles, axis=0)
        spans = [tuple(sorted(int(x) for x in rng.integers(0, 10, 2))) for _ in range(r)]
        prefer_il = rng.random(r) < 0.4
        order = sorted(range(r), key=lambda i: (-int(profiles[:, i].max()), spans[i][0], roots[i]))
        std, il = int(rng.integers(2, 8)) * 256, int(rng.integers(2, 8)) * 256
        target = replace(TARGET, reserve_bytes=64, standard_bytes=std, interleaved_bytes=il, sram_bytes=std + il)
        regions = {"standard": (target.reserve_bytes, target.standard_bytes),
                   "interleaved": (target.standard_bytes, target.sram_bytes)}
        got = dict(_placements(profiles, order, roots, prefer_il, spans, regions, target))
        for p, sizes in enumerate(profiles):
            placed = {reg: _Placed(r) for reg in regions}
            want = np.full(r, -1, dtype=np.int64)
            for pos, i in enumerate(order):
                n, (a, b) = int(sizes[i]), spans[i]
                if not n:
                    continue
                for reg in ("interleaved", "standard") if prefer_il[i] else ("standard", "interleaved"):
                    at = _first_fit(placed[reg], *regions[reg], n, a, b, target.alignment)
                    if at is not None:
                        break
                else:
                    want = _does_not_fit(placed, roots[i], n, prefer_il[i], a, b, r, target)
                    break
                placed[reg].add(at, at + n, a, b, pos)
                want[i] = at
            if isinstance(want, allocate._Miss):
                assert got[p] == want, (trial, p)
            else:
                assert np.array_equal(got[p], want), (trial, p)


def test_array_pool_returns_the_first_array_with_equal_bytes_whether_or_not_samples_agree():
    """The pool keys a large array by a sample of its elements and hashes it whole only when a
    second array has that key: arrays that differ only between the sampled elements stay apart,
    equal ones (small or large, any order of arrival) become the first one seen."""
    from tileplan.lowering.tile_program import ArrayPool
    pool = ArrayPool()
    big = np.arange(10_000, dtype=np.int64)
    other = big.copy()
    other[1] += 1                       # not a sampled element: the same first key as ``big``
    assert pool(big) is big
    assert pool(big.copy()) is big
    assert pool(other) is other
    assert pool(other.copy()) is other and pool(big.copy()) is big
    assert pool(big.astype(np.int32)) is not big               # another dtype: another table
    small = np.arange(5)
    assert pool(small) is small and pool(small.copy()) is small
    assert pool(np.arange(6)) is not small
    assert pool.hits == 4
