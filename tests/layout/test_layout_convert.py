"""Copy plans between layouts: exact fragments, replica choice, per-tile totals, round trips."""

import math
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tileplan.graph.dtypes import DType
from tileplan.layout import (Blocks, CopyPlan, Explicit, Imported, Intervals, LayoutError, Packed, WholeRows,
                             convert, gather, plan_copy, scatter)
from tileplan.layout.layouts import rows_cols
from tileplan.target import load_target

FP8, FP16, FP32 = DType.FP8, DType.FP16, DType.FP32
IPU = load_target("ipu21")


def write_counts(plan: CopyPlan, dst_om) -> dict[int, np.ndarray]:
    """How many times each destination buffer slot is written by the plan."""
    counts = {t: np.zeros(int(n), dtype=np.int64)
              for t, n in enumerate(dst_om.bytes_per_tile(dst_om.max_tile() + 1, 1)) if n}
    for t, off, n in zip(plan.dst_tile, plan.dst_offset, plan.stop - plan.start):
        counts[int(t)][off: off + n] += 1
    return counts


def round_trip(src, dst, shape, dtype, tiles, seed=0):
    """Scatter random data through ``src``, execute the plan, gather through ``dst``."""
    size = math.prod(shape)
    values = np.random.default_rng(seed).permutation(size).astype(np.int64)
    src_om, dst_om = src.owner_map(shape, dtype, tiles), dst.owner_map(shape, dtype, tiles)
    plan = plan_copy(src_om, dst_om, dtype.itemsize)
    out = plan.execute(scatter(values, src_om), {})
    return values, plan, out, dst_om


# ---- fragments --------------------------------------------------------------------


def test_converting_rows_to_intervals_cuts_at_every_source_boundary():
    plan = convert(WholeRows(2), Intervals(3), (4, 6), FP16, 8)   # rows cut at 12; intervals at 8, 16
    rows = sorted(zip(plan.start.tolist(), plan.stop.tolist(), plan.src_tile.tolist(), plan.dst_tile.tolist()))
    assert rows == [(0, 8, 0, 0), (8, 12, 0, 1), (12, 16, 1, 1), (16, 24, 1, 2)]
    assert plan.local.tolist() == [True, False, True, False]


def test_copy_plan_rows_are_sorted_by_source_destination_and_start():
    plan = convert(Intervals(5), WholeRows(7), (13, 9), FP32, 8)
    key = list(zip(plan.src_tile.tolist(), plan.dst_tile.tolist(), plan.start.tolist()))
    assert key == sorted(key)
    assert plan.nbytes.tolist() == ((plan.stop - plan.start) * 4).tolist()


def test_converting_a_layout_to_itself_is_the_identity():
    grid = Blocks.even(6, 8, 2, 2, np.arange(8).reshape(2, 2, 2))
    for layout, replicas in ((WholeRows(5), 1), (Intervals(4), 1), (Packed(4, 3), 1), (grid, 2)):
        plan = convert(layout, layout, (6, 8), FP16, 16)
        assert plan.is_identity and plan.exchange_bytes == 0
        assert plan.send_bytes(16).sum() == 0 and plan.local_bytes(16).sum() == 6 * 8 * 2 * replicas


def test_same_owners_with_the_same_offsets_merge_into_one_fragment_per_tile():
    # Row ranges and (unaligned-free) fp32 intervals that happen to coincide.
    plan = convert(WholeRows(4), Intervals(4), (8, 2), FP32, 4)
    assert len(plan) == 4 and plan.is_identity


def test_per_tile_send_and_receive_totals_exclude_local_copies():
    plan = convert(WholeRows(2), Intervals(3), (4, 6), FP16, 4)
    assert plan.send_bytes(4).tolist() == [8, 16, 0, 0]
    assert plan.recv_bytes(4).tolist() == [0, 8, 16, 0]
    assert plan.send_fragments(4).tolist() == [1, 1, 0, 0]
    assert plan.recv_fragments(4).tolist() == [0, 1, 1, 0]
    assert plan.local_bytes(4).tolist() == [16, 8, 0, 0]
    pairs = plan.pairs()
    assert list(zip(pairs.src.tolist(), pairs.dst.tolist(), pairs.nbytes.tolist(), pairs.fragments.tolist())) \
        == [(0, 1, 8, 1), (1, 2, 16, 1)]
    assert plan.pairs(include_local=True).local.tolist() == [True, False, True, False]


def test_a_replicated_source_prefers_the_copy_on_the_destination_tile():
    src = Blocks.even(4, 4, 1, 1, np.array([[[2, 5, 7]]]))      # the whole matrix on tiles 2, 5 and 7
    plan = convert(src, WholeRows(4, first_tile=4), (4, 4), FP16, 8)   # rows on tiles 4, 5, 6, 7
    assert dict(zip(plan.dst_tile.tolist(), plan.src_tile.tolist())) == {4: 2, 5: 5, 6: 2, 7: 7}


def test_a_replicated_destination_receives_every_replica():
    dst = Blocks.even(2, 4, 1, 2, np.array([[[1, 2], [3, 4]]]))
    plan = convert(WholeRows(1), dst, (2, 4), FP32, 8)
    assert sorted(plan.dst_tile.tolist()) == [1, 1, 2, 2, 3, 3, 4, 4]
    assert plan.recv_bytes(8).tolist() == [0, 16, 16, 16, 16, 0, 0, 0]


def test_converting_rows_into_panels_is_flagged_for_a_pack_kernel():
    plan = convert(Intervals(4), Packed(16, 4), (32, 64), FP16, 8)
    assert plan.needs_rearrangement == ("rows", "panels")
    assert convert(Packed(16, 4), Intervals(4), (32, 64), FP16, 8).needs_rearrangement == ("panels", "rows")
    assert convert(Intervals(4), Packed(16, 4), (32, 70), FP16, 8).needs_rearrangement is None   # fallback


@pytest.mark.parametrize("src, dst", [
    (Intervals(1), Packed(2, 1)),                                  # one tile holds panels 0 and 1
    (Packed(2, 1), WholeRows(1)),
    (WholeRows(2), Blocks.even(3, 4, 1, 2, np.array([[[0], [0]]]))),   # one tile holds blocks (0,0) and (0,1)
])
def test_fragments_adjacent_in_the_tensor_but_not_in_a_buffer_stay_apart(src, dst):
    values, plan, out, dst_om = round_trip(src, dst, (3, 4), FP16, 2)
    assert np.array_equal(gather(out, dst_om, 12), values)


def test_a_source_that_does_not_cover_the_tensor_cannot_be_planned():
    src = Explicit(((0, 0, 10),)).owner_map((20,), FP16, 4)
    with pytest.raises(LayoutError, match=r"does not hold elements \[10, 12\)"):
        plan_copy(src, Intervals(2).owner_map((20,), FP16, 4), 2)


def test_owner_maps_of_different_sizes_cannot_be_converted():
    with pytest.raises(LayoutError, match="20 and 21 elements"):
        plan_copy(Intervals(2).owner_map((20,), FP16, 4), Intervals(2).owner_map((21,), FP16, 4), 2)


def test_scatter_then_gather_returns_the_tensor():
    values = np.arange(7 * 9, dtype=np.float32)
    for layout in (Packed(3, 4), Blocks.even(7, 9, 3, 2, np.arange(12).reshape(3, 2, 2)), Explicit(
            ((3, 0, 50), (1, 50, 63)))):
        om = layout.owner_map((7, 9), FP32, 16)
        assert np.array_equal(gather(scatter(values, om), om, 63), values)


def test_large_conversions_plan_in_well_under_a_second():
    shape, tiles = (2916, 4304), 1472
    grid = Blocks.even(*shape, 8, 46, np.arange(8 * 46 * 4).reshape(8, 46, 4))
    t0 = time.perf_counter()
    for src, dst in ((Intervals(tiles), grid), (grid, WholeRows(tiles)), (WholeRows(tiles), Intervals(tiles))):
        plan = plan_copy(src.owner_map(shape, FP16, tiles), dst.owner_map(shape, FP16, tiles), 2)
        assert plan.nbytes.sum() == shape[0] * shape[1] * 2 * (4 if dst is grid else 1)
    assert time.perf_counter() - t0 < 3.0


# ---- the property: any two layouts, every element moved exactly once ------------------


@st.composite
def shapes(draw):
    dims = draw(st.integers(1, 3))
    prime = st.sampled_from([1, 2, 3, 5, 7, 11, 13, 17, 31, 37])
    dim = st.one_of(prime, st.integers(1, {1: 400, 2: 60, 3: 16}[dims]))
    return tuple(draw(dim) for _ in range(dims))


@st.composite
def layouts(draw, shape, dtype, tiles, rng):
    rows, cols = rows_cols(shape)
    size = rows * cols
    kind = draw(st.sampled_from(["rows", "intervals", "packed", "blocks", "explicit", "imported"]))
    owners = draw(st.one_of(st.integers(1, min(3, tiles)), st.integers(1, tiles)))
    if kind == "rows":
        k = min(owners, rows)
        return WholeRows(owners, first_tile=draw(st.integers(0, tiles - k)))
    if kind == "intervals":
        return Intervals(owners)
    if kind == "imported":
        return Imported(draw(st.sampled_from([Intervals(owners), WholeRows(owners)])))
    if kind == "packed":
        return Packed(draw(st.sampled_from([1, 2, 3, 4, 8, 16, 32])), owners)
    if kind == "blocks":
        r = draw(st.integers(1, min(3, tiles)))
        gr, gc = draw(st.integers(1, min(rows, 4))), draw(st.integers(1, min(cols, 4)))
        pool = draw(st.integers(r, tiles))                          # small pools: tiles with several blocks
        tile_of = np.stack([rng.choice(pool, size=r, replace=False) for _ in range(gr * gc)]).reshape(gr, gc, r)
        return Blocks.even(rows, cols, gr, gc, tile_of)
    cuts = np.unique(rng.integers(1, size, size=draw(st.integers(0, 12)))) if size > 1 else np.zeros(0, int)
    bounds = np.concatenate(([0], cuts, [size]))
    return Explicit.from_arrays(rng.integers(0, tiles, size=len(bounds) - 1), bounds[:-1], bounds[1:])


@settings(max_examples=60, deadline=None)
@given(data=st.data(), shape=shapes(), dtype=st.sampled_from([FP8, FP16, FP32]), tiles=st.one_of(st.integers(1, 4), st.integers(1, 64)),
       seed=st.integers(0, 2 ** 32 - 1))
def test_any_conversion_moves_every_element_exactly_once_to_its_owner(data, shape, dtype, tiles, seed):
    rng = np.random.default_rng(seed)
    src = data.draw(layouts(shape, dtype, tiles, rng), label="src")
    dst = data.draw(layouts(shape, dtype, tiles, rng), label="dst")
    src.verify(shape, dtype, IPU.with_tiles(tiles))
    dst.verify(shape, dtype, IPU.with_tiles(tiles))
    values, plan, out, dst_om = round_trip(src, dst, shape, dtype, tiles, seed)

    assert plan.size == values.size
    # Every destination replica gets every element, at the offset its owner map says.
    assert all(t in out for t in dst_om.owners().tolist())
    for t, buf in out.items():
        ivs = dst_om.intervals_on(t)
        for s, e, o in zip(ivs.start, ivs.stop, ivs.offset):
            assert np.array_equal(buf[o: o + e - s], values[s:e])
    assert np.array_equal(gather(out, dst_om, values.size), values)
    # Each destination slot is written exactly once.
    counts = write_counts(plan, dst_om)
    assert all((c == 1).all() for c in counts.values())
    assert plan.nbytes.sum() == values.size * dst_om.replicas * dtype.itemsize
    # Sources really hold what they send.
    src_om = src.owner_map(shape, dtype, tiles)
    held = {t: src_om.intervals_on(t) for t in np.unique(plan.src_tile).tolist()}
    for t, s, o, n in zip(plan.src_tile, plan.start, plan.src_offset, plan.stop - plan.start):
        ivs = held[int(t)]
        k = np.searchsorted(ivs.offset, o, side="right") - 1
        assert ivs.start[k] + (o - ivs.offset[k]) == s and o + n <= ivs.offset[k] + ivs.stop[k] - ivs.start[k]
    # Totals agree with the fragments.
    assert plan.send_bytes(tiles).sum() + plan.local_bytes(tiles).sum() == plan.nbytes.sum()
    assert plan.pairs().nbytes.sum() == plan.send_bytes(tiles).sum() == plan.recv_bytes(tiles).sum()
    assert plan.pairs().fragments.sum() == plan.send_fragments(tiles).sum()
