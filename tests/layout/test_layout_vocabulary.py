"""The layout vocabulary: owner maps, verification and the one-line names."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tileplan.errors import TileplanError
from tileplan.graph.dtypes import DType
from tileplan.layout import (Blocks, Explicit, Imported, Intervals, LayoutError, OwnerMap, Packed, WholeRows,
                             balanced_bounds)
from tileplan.layout.owner_map import alignment_problem, local_problem
from tileplan.target import load_target

IPU = load_target("ipu21")
FP8, FP16, FP32 = DType.FP8, DType.FP16, DType.FP32


def held_counts(om: OwnerMap) -> np.ndarray:
    """How many times each element is held (element-level; for small test tensors only)."""
    counts = np.zeros(om.size, dtype=np.int64)
    for s, e in zip(om.start, om.stop):
        counts[s:e] += 1
    return counts


# ---- names ---------------------------------------------------------------------


def test_layouts_print_as_one_short_line():
    tiles = np.arange(24).reshape(4, 2, 3)
    assert str(WholeRows(64)) == "Rows(64)"
    assert str(WholeRows(64, first_tile=128)) == "Rows(64@128)"
    assert str(Intervals(64)) == "Iv(64,a8)"
    assert str(Packed(32, 64)) == "Packed(32,64)"
    assert str(Packed(32, 64).effective((10, 33), FP8)) == "Packed(32,64->Iv)"
    assert str(Explicit(((0, 0, 3), (1, 3, 5)))) == "Explicit(2)"
    assert str(Imported.linear(64)) == "Imp(Iv(64,a8))"
    assert str(Blocks.even(10, 10, 4, 2, tiles)) == "Blocks(4x2 r3)"


def test_layouts_are_hashable_values():
    tiles = np.arange(4).reshape(2, 2)
    assert {WholeRows(4): 1}[WholeRows(4)] == 1
    assert Blocks.even(8, 8, 2, 2, tiles) == Blocks.even(8, 8, 2, 2, tiles.copy())
    assert hash(Explicit(((0, 0, 3),))) == hash(Explicit([[0, 0, 3]]))
    assert Imported(Intervals(3)) != Intervals(3)


def test_owner_maps_are_cached_and_read_only():
    om = Intervals(8).owner_map((40, 12), FP16, 64)
    assert om is Intervals(8).owner_map((40, 12), FP16, 64)
    with pytest.raises(ValueError):
        om.start[0] = 5


def test_layout_error_is_a_tileplan_error():
    assert issubclass(LayoutError, TileplanError)


# ---- WholeRows ------------------------------------------------------------------


def test_whole_rows_splits_rows_into_balanced_contiguous_ranges():
    om = WholeRows(4).verify((2, 5, 3), FP32, IPU)             # 10 rows of 3
    assert om.owners().tolist() == [0, 1, 2, 3]
    assert (om.stop - om.start).tolist() == [9, 9, 6, 6]       # rows 3, 3, 2, 2
    assert om.offset.tolist() == [0, 0, 0, 0]


def test_whole_rows_never_has_more_owners_than_rows():
    om = WholeRows(64).verify((3, 7), FP16, IPU)
    assert om.owners().tolist() == [0, 1, 2]
    assert om.elements_per_tile(64)[:4].tolist() == [7, 7, 7, 0]


def test_whole_rows_can_start_at_a_later_tile():
    om = WholeRows(4, first_tile=10).verify((8, 2), FP16, IPU)
    assert om.owners().tolist() == [10, 11, 12, 13]


def test_whole_rows_running_past_the_last_tile_is_an_error():
    with pytest.raises(LayoutError, match=r"Rows\(8@60\).*uses tile 67"):
        WholeRows(8, first_tile=60).verify((16, 4), FP16, load_target("ipu21-64"))


def test_whole_rows_of_a_large_tensor_builds_in_milliseconds():
    om = WholeRows(1472).verify((2916, 4304), FP16, IPU)
    assert len(om) == 1472 and om.elements_per_tile(1472).sum() == 2916 * 4304


# ---- Intervals ------------------------------------------------------------------


def test_intervals_layout_covers_every_element_once():
    om = Intervals(7).verify((13, 11), FP16, IPU)
    assert (held_counts(om) == 1).all()
    assert om.stop[-1] == 13 * 11


@pytest.mark.parametrize("dtype, unit", [(FP8, 8), (FP16, 4), (FP32, 2)])
def test_intervals_byte_boundaries_are_multiples_of_eight(dtype, unit):
    om = Intervals(5).verify((3, 37), dtype, IPU)              # 111 elements: a tail in every dtype
    inner = om.stop[:-1]
    assert (inner % unit == 0).all() and ((inner * dtype.itemsize) % 8 == 0).all()
    assert om.stop[-1] == 111                                  # the tail ends the last interval


def test_intervals_with_a_coarser_alignment_round_to_it():
    om = Intervals(3, align=32).verify((100,), FP16, IPU)      # 16-element units
    assert om.start.tolist() == [0, 48, 80] and om.stop.tolist() == [48, 80, 100]


def test_intervals_of_a_tiny_tensor_use_fewer_owners_and_none_empty():
    om = Intervals(64).verify((1, 5), FP16, IPU)               # 5 fp16 = 2 units of 4
    assert om.owners().tolist() == [0, 1]
    assert (om.stop - om.start).tolist() == [4, 1]


@settings(max_examples=40, deadline=None)
@given(size=st.integers(1, 5000), owners=st.integers(1, 100), dtype=st.sampled_from([FP8, FP16, FP32]))
def test_intervals_are_balanced_aligned_and_cover_any_size(size, owners, dtype):
    om = Intervals(owners).verify((size,), dtype, IPU)
    lengths = om.stop - om.start
    unit = 8 // dtype.itemsize
    assert (lengths > 0).all() and lengths.sum() == size
    assert len(om) == min(owners, math.ceil(size / unit))
    assert (om.start % unit == 0).all()
    assert lengths[:-1].max() - lengths[:-1].min() <= unit if len(om) > 1 else True


# ---- Packed ---------------------------------------------------------------------


def test_packed_stores_panels_of_grain_columns_in_stream_order():
    om = Packed(2, 3).verify((3, 4), FP16, IPU)                # 2 panels x 3 rows = 6 panel rows
    assert om.local_format == "panels"
    # stream: panel 0 rows 0..2, then panel 1 rows 0..2; two panel rows per tile.
    by_tile = {t: om.intervals_on(t) for t in range(3)}
    assert by_tile[0].start.tolist() == [0, 4] and by_tile[0].offset.tolist() == [0, 2]
    assert by_tile[1].start.tolist() == [8, 2] and by_tile[1].offset.tolist() == [0, 2]
    assert by_tile[2].start.tolist() == [6, 10]
    assert (held_counts(om) == 1).all()


def test_packed_boundaries_are_whole_panel_rows():
    om = Packed(16, 10).verify((40, 64), FP16, IPU)
    assert (om.start % 16 == 0).all() and (om.stop - om.start == 16).all()
    assert om.elements_per_tile(10).tolist() == [256] * 10


def test_packed_with_a_sub_word_tail_falls_back_to_row_major_intervals():
    layout = Packed(32, 6)
    eff = layout.effective((17, 70), FP8)
    assert eff.fallback and eff.local_format == "rows" and str(eff) == "Packed(32,6->Iv)"
    om = layout.verify((17, 70), FP8, IPU)
    assert om.local_format == "rows"
    assert np.array_equal(om.start, Intervals(6).owner_map((17, 70), FP8, 64).start)


def test_packed_of_a_single_panel_is_one_interval_per_owner():
    om = Packed(8, 4).verify((12, 8), FP32, IPU)               # panel rows are contiguous: merged
    assert len(om) == 4 and om.local_format == "panels"


# ---- Explicit -------------------------------------------------------------------


def test_explicit_stacks_each_tiles_intervals_in_order_of_start():
    om = Explicit(((3, 10, 20), (3, 0, 4), (1, 4, 10))).verify((4, 5), FP16, IPU)
    on3 = om.intervals_on(3)
    assert on3.start.tolist() == [0, 10] and on3.offset.tolist() == [0, 4]


def test_explicit_that_does_not_cover_its_tensor_names_the_missing_elements():
    layout = Explicit(((0, 0, 8), (1, 10, 20)))
    with pytest.raises(LayoutError, match=r"Explicit\(2\) on fp16\[4x5\]: elements \[8, 10\) are held 0 times"):
        layout.verify((4, 5), FP16, IPU)


def test_explicit_that_holds_an_element_twice_is_an_error():
    with pytest.raises(LayoutError, match=r"elements \[5, 8\) are held 2 times, expected once"):
        Explicit(((0, 0, 8), (1, 5, 20))).verify((20,), FP16, IPU)


def test_explicit_past_the_end_of_the_tensor_is_an_error():
    with pytest.raises(LayoutError, match="outside the tensor's 20 elements"):
        Explicit(((0, 0, 24),)).verify((20,), FP16, IPU)


def test_explicit_with_an_empty_interval_is_refused():
    with pytest.raises(LayoutError, match="empty"):
        Explicit(((0, 5, 5),))


# ---- Imported -------------------------------------------------------------------


def test_imported_delegates_to_its_base():
    shape = (9, 31)
    assert np.array_equal(Imported.linear(5).verify(shape, FP8, IPU).stop,
                          Intervals(5).owner_map(shape, FP8, 1472).stop)
    assert Imported(Packed(16, 4)).local_format == "panels"
    assert str(Imported(Packed(16, 4)).effective((4, 20), FP16)) == "Imp(Packed(16,4->Iv))"


def test_imported_refuses_a_private_grid():
    with pytest.raises(LayoutError, match="boundary"):
        Imported(Blocks.even(4, 4, 2, 2, np.arange(4).reshape(2, 2)))


# ---- Blocks ---------------------------------------------------------------------


def test_blocks_hold_each_element_once_per_replica_on_distinct_tiles():
    tile_of = np.arange(3 * 2 * 3).reshape(3, 2, 3)
    layout = Blocks.even(7, 5, 3, 2, tile_of)
    om = layout.verify((7, 5), FP16, IPU)
    assert om.replicas == 3 and not Blocks.boundary
    assert (held_counts(om) == 3).all()
    assert layout.row_bounds == (0, 3, 5, 7) and layout.col_bounds == (0, 3, 5)
    # block (1, 0): rows 3..4, cols 0..2 on tiles 6, 7, 8, row-major within the block
    on7 = om.intervals_on(7)
    assert on7.start.tolist() == [15, 20] and on7.offset.tolist() == [0, 3]


def test_blocks_spanning_whole_rows_are_one_interval():
    om = Blocks.even(6, 4, 2, 1, np.array([[5], [9]])).verify((6, 4), FP32, IPU)
    assert len(om) == 2 and om.owners().tolist() == [5, 9]


def test_a_tile_holding_several_blocks_stacks_them_in_block_order():
    tile_of = np.array([[[0], [1]], [[1], [0]]])              # tile 0 holds blocks (0,0) and (1,1)
    om = Blocks.even(4, 4, 2, 2, tile_of).verify((4, 4), FP16, IPU)
    on0 = om.intervals_on(0)
    assert on0.start.tolist() == [0, 4, 10, 14] and on0.offset.tolist() == [0, 2, 4, 6]


def test_blocks_naming_a_tile_twice_in_one_block_is_refused():
    with pytest.raises(LayoutError, match=r"block \(0, 1\) names tile 3 twice"):
        Blocks((0, 2), (0, 1, 2), (((1, 2, 5), (7, 3, 3)),))


def test_blocks_that_do_not_match_the_tensor_shape_are_an_error():
    with pytest.raises(LayoutError, match=r"covers 6x4 but the tensor is 6x5"):
        Blocks.even(6, 4, 2, 2, np.arange(4).reshape(2, 2)).verify((6, 5), FP16, IPU)


def test_blocks_even_refuses_empty_blocks():
    with pytest.raises(LayoutError, match="empty blocks"):
        Blocks.even(3, 8, 4, 2, np.arange(8).reshape(4, 2))


def test_a_large_block_grid_builds_quickly():
    tile_of = np.arange(8 * 46 * 4).reshape(8, 46, 4)
    om = Blocks.even(2916, 4304, 8, 46, tile_of).verify((2916, 4304), FP16, IPU)
    assert om.elements_per_tile(1472)[: 8 * 46 * 4].min() > 0
    assert om.bytes_per_tile(1472, 2).sum() == 4 * 2916 * 4304 * 2


# ---- capacity, helpers ---------------------------------------------------------


def test_capacity_overflow_names_the_tile_and_its_bytes():
    with pytest.raises(LayoutError, match=r"Rows\(2\) on fp32\[2x100000\]: tile 0 would hold 400,000 bytes, "
                                          r"over its 100,000 usable bytes"):
        WholeRows(2).verify((2, 100_000), FP32, _small_target(100_000))


def _small_target(usable: int):
    from dataclasses import replace
    return replace(IPU, sram_bytes=usable + IPU.reserve_bytes, interleaved_bytes=0,
                   standard_bytes=usable + IPU.reserve_bytes)


def test_bytes_per_tile_is_the_local_buffer_size():
    om = Intervals(3).owner_map((10, 10), FP16, 4)
    assert om.bytes_per_tile(4, 2).tolist() == (om.elements_per_tile(4) * 2).tolist()
    assert om.elements_per_tile(4).tolist() == [36, 32, 32, 0]


def test_balanced_bounds_give_the_first_parts_one_more():
    assert balanced_bounds(10, 4).tolist() == [0, 3, 6, 8, 10]


def test_a_misaligned_interval_boundary_is_reported_in_elements_and_bytes():
    om = OwnerMap.build([0, 1], [0, 6], [6, 16], [0, 0], 16)
    assert alignment_problem(om, 4, 2) == ("interval [0, 6) on tile 0 has a boundary at element 6 (byte 12), "
                                           "not a multiple of 4 elements (8 bytes)")
    assert alignment_problem(Intervals(2).owner_map((16,), FP16, 2), 4, 2) is None


def test_a_local_buffer_with_a_gap_is_reported():
    om = OwnerMap.build([0, 0], [0, 8], [4, 16], [0, 6], 16)
    assert local_problem(om) == "intervals on tile 0 leave a gap in its local buffer at element offset 4"


def test_an_imported_layout_past_the_target_names_itself():
    with pytest.raises(LayoutError, match=r"Rows\(80\) on fp16\[80x4\]: uses tile 79"):
        Imported(WholeRows(80)).verify((80, 4), FP16, load_target("ipu21-64"))
