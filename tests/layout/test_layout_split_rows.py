"""``SplitRows``: rows cut into column pieces on neighbouring tiles, and the partials grids of its
two-stage kernels."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tileplan.graph.dtypes import DType
from tileplan.layout import LayoutError, SplitRows, WholeRows, plan_copy
from tileplan.target import load_target

IPU = load_target("ipu21")
FP16, FP32 = DType.FP16, DType.FP32


def held(om) -> np.ndarray:
    counts = np.zeros(om.size, dtype=np.int64)
    for s, e in zip(om.start, om.stop):
        counts[s:e] += 1
    return counts


def test_split_rows_prints_as_groups_by_parts():
    assert str(SplitRows(729, 2)) == "SplitRows(729x2)"
    assert str(SplitRows(4, 16, first_tile=32)) == "SplitRows(4x16@32)"


def test_split_rows_refuses_one_part_and_non_positive_counts():
    with pytest.raises(LayoutError, match="parts must be at least 2"):
        SplitRows(8, 1)
    with pytest.raises(LayoutError, match="owners must be a positive integer"):
        SplitRows(0, 2)


def test_729_tokens_on_1472_tiles_use_1458_tiles_one_row_half_each():
    lay = SplitRows(729, 2)
    om = lay.verify((729, 1152), FP16, IPU)
    per_tile = om.elements_per_tile(IPU.tiles)
    assert np.count_nonzero(per_tile) == 1458
    assert set(per_tile[:1458].tolist()) == {576}
    assert np.count_nonzero(WholeRows(1472).owner_map((729, 1152), FP16, IPU.tiles).elements_per_tile(IPU.tiles)) == 729


def test_a_rows_pieces_sit_on_neighbouring_tiles_in_column_order():
    lay = SplitRows(3, 4)
    tile, group, part, rows, cols, c0 = lay.pieces((6, 100))
    assert tile.tolist() == list(range(12))
    assert group.tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]
    assert rows.tolist() == [2] * 12
    # 100 columns are 13 units of 8: pieces of 32, 24, 24 and the 20-column tail
    assert cols.tolist()[:4] == [32, 24, 24, 20] and c0.tolist()[:4] == [0, 32, 56, 80]
    om = lay.owner_map((6, 100), FP16, 16)
    on1 = om.intervals_on(1)
    assert on1.start.tolist() == [32, 132] and on1.offset.tolist() == [0, 24]


def test_narrow_rows_get_fewer_parts_and_few_rows_fewer_groups():
    assert SplitRows(8, 4).split((3, 20)) == (3, 3)
    assert SplitRows(8, 4).verify((3, 20), FP32, IPU).replicas == 1


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 40), cols=st.integers(1, 300), owners=st.integers(1, 40), parts=st.integers(2, 9),
       dtype=st.sampled_from([FP16, FP32]))
def test_split_rows_covers_every_element_once_without_empty_pieces(rows, cols, owners, parts, dtype):
    lay = SplitRows(owners, parts)
    if lay.split((rows, cols))[1] < 2:
        with pytest.raises(LayoutError, match="do not make 2 pieces"):
            lay.verify((rows, cols), dtype, IPU)
        return
    om = lay.verify((rows, cols), dtype, IPU)
    assert (held(om) == 1).all()
    g, p = lay.split((rows, cols))
    assert np.count_nonzero(om.elements_per_tile(IPU.tiles)) == g * p
    assert (lay.col_bounds((rows, cols))[1:-1] % 8 == 0).all()


def test_each_tile_receives_the_other_parts_of_its_rows_in_part_order():
    lay = SplitRows(2, 3)
    shape, width = (5, 48), 3
    own, others = lay.partials(shape, width)
    pshape = (5, 3 * width)
    own_om, oth_om = (x.owner_map(pshape, FP32, 8) for x in (own, others))
    assert (held(own_om) == 1).all() and oth_om.replicas == 2 and (held(oth_om) == 2).all()
    # Group 0 has rows 0..2 on tiles 0, 1, 2; tile 1 holds parts 0 and 2 of them, part-major.
    on = oth_om.intervals_on(1)
    runs = sorted(zip(on.offset.tolist(), on.start.tolist(), on.stop.tolist()))
    # part p of row r starts at element r * 9 + p * 3
    assert [(s, e) for _, s, e in runs] == [(r * 9 + p * 3, r * 9 + p * 3 + 3) for p in (0, 2) for r in range(3)]
    # The exchange: each piece's partials go to the other tiles of its group only, nothing stays on a tile.
    plan = plan_copy(own_om, oth_om, 4)
    src, dst = plan.src_tile, plan.dst_tile
    assert ((src // 3) == (dst // 3)).all() and (src != dst).all()
    stats = lay.row_stats(shape, 2).owner_map((5, 2), FP32, 8)
    assert stats.replicas == 3 and (held(stats) == 3).all()


def test_rows_too_narrow_for_two_pieces_are_refused():
    with pytest.raises(LayoutError, match="do not make 2 pieces"):
        SplitRows(4, 2).verify((4, 8), FP16, IPU)
