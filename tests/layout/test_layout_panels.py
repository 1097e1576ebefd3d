"""Panel-major index space with a partial last panel: the index arithmetic, ``PackedPanels``,
panel-space ``Grid``s, and copies between them (every element moved exactly once)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tileplan.graph.dtypes import DType
from tileplan.layout import LayoutError, PackedPanels, gather, plan_copy, scatter
from tileplan.layout.gemm_grid import Grid, aligned_bounds, balanced_bounds
from tileplan.layout.panels import (from_panel_major, panel_coords, panel_index, panel_widths, panels_fit,
                                    row_segments, to_panel_major)
from tileplan.target import load_target

IPU = load_target("ipu21")
FP8, FP16, FP32 = DType.FP8, DType.FP16, DType.FP32
GRAIN = {FP8: 32, FP16: 16, FP32: 8}


def panel_major_by_hand(m: np.ndarray, grain: int) -> np.ndarray:
    """Panel after panel, each its columns' rows x width block row-major: the definition, by loops."""
    return np.concatenate([m[:, a:a + grain].reshape(-1) for a in range(0, m.shape[1], grain)])


# ---- the index arithmetic ----------------------------------------------------------


def test_a_partial_last_panel_is_narrower_and_follows_the_whole_ones():
    assert panel_widths(40, 16).tolist() == [16, 16, 8]
    assert panel_widths(48, 16).tolist() == [16, 16, 16]
    # 3 rows x 40 columns: panel 2 starts after two whole 3 x 16 panels, its rows are 8 wide.
    assert panel_index(0, 32, 3, 40, 16) == 96 and panel_index(1, 32, 3, 40, 16) == 104
    assert panel_index(2, 39, 3, 40, 16) == 119
    assert panel_index(1, 17, 3, 40, 16) == 48 + 16 + 1


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 12), n=st.integers(1, 90), grain=st.sampled_from([1, 2, 3, 8, 16, 32]))
def test_panel_major_order_round_trips_and_matches_its_definition(rows, n, grain):
    m = np.arange(rows * n).reshape(rows, n)
    flat = to_panel_major(m, grain)
    assert np.array_equal(flat, panel_major_by_hand(m, grain))
    assert np.array_equal(from_panel_major(flat, rows, n, grain), m)
    r, c = np.divmod(np.arange(rows * n), n)
    idx = panel_index(r, c, rows, n, grain)
    assert np.array_equal(flat[idx], m[r, c])                     # panel_index names the slot of (r, c)
    rr, cc = panel_coords(idx, rows, n, grain)
    assert np.array_equal(rr, r) and np.array_equal(cc, c)
    start, width = row_segments(rows, n, grain)                   # pieces that read the matrix row-major
    assert np.array_equal(np.concatenate([flat[s:s + w] for s, w in zip(start, width)]), m.reshape(-1))


def test_panels_fit_needs_a_whole_panel_and_rows_of_whole_words():
    assert panels_fit(4304, 32, 1)                # SigLIP mlp_up: 134 panels and one of 16 columns
    assert panels_fit(144, 32, 1) and panels_fit(40, 16, 2) and panels_fit(4096, 16, 2)
    assert not panels_fit(75, 32, 1)              # 75-byte rows: a sub-word tail
    assert not panels_fit(61, 16, 2)              # 122-byte rows
    assert not panels_fit(24, 32, 1)              # less than one panel


# ---- PackedPanels ---------------------------------------------------------------------


def test_packed_panels_cut_the_stream_of_panel_rows_with_a_narrow_last_panel():
    # 3 x 40 FP16, grain 16: panels 16, 16, 8 wide -> 9 panel rows, 4 owners take 3, 2, 2, 2.
    om = PackedPanels(16, 4).verify((3, 40), FP16, IPU)
    assert om.local_format == "panels"
    assert om.start.tolist() == [0, 48, 80, 104] and om.stop.tolist() == [48, 80, 104, 120]
    assert om.tile.tolist() == [0, 1, 2, 3] and om.offset.tolist() == [0, 0, 0, 0]


@settings(max_examples=60, deadline=None)
@given(k=st.integers(1, 40), words=st.integers(1, 30), dtype=st.sampled_from([FP8, FP16, FP32]),
       owners=st.integers(1, 80))
def test_packed_panels_verify_for_any_width_of_whole_words(k, words, dtype, owners):
    grain = GRAIN[dtype]
    n = grain + words * (8 // dtype.itemsize)                     # at least one panel; rows of whole words
    om = PackedPanels(grain, owners).verify((k, n), dtype, IPU.with_tiles(80))
    total = k * math.ceil(n / grain)
    assert len(om) == min(owners, total)                          # one interval per owner, none empty
    assert om.stop[-1] == k * n and (om.start * dtype.itemsize % 8 == 0).all()
    # Every chunk is whole panel rows: each boundary is the start of a panel row.
    full = k * (n // grain) * grain
    inner = om.start[1:]
    assert np.where(inner < full, inner % grain, (inner - full) % (n % grain or grain)).max(initial=0) == 0


def test_packed_panels_refuse_rows_with_a_sub_word_tail_and_less_than_a_panel():
    with pytest.raises(LayoutError, match="sub-word tail"):
        PackedPanels(32, 4).verify((147, 75), FP8, IPU)
    with pytest.raises(LayoutError, match="do not fill one panel"):
        PackedPanels(32, 4).verify((10, 24), FP8, IPU)


# ---- panel-space grids ------------------------------------------------------------------


def grid_block_by_hand(m: np.ndarray, r0, r1, c0, c1, grain) -> np.ndarray:
    """A block's local buffer: its panels in order, each rows r0..r1 x the panel's columns row-major."""
    return np.concatenate([m[r0:r1, a:min(a + grain, c1)].reshape(-1) for a in range(c0, c1, grain)])


def test_a_grid_in_panel_space_refuses_column_bounds_inside_a_panel():
    with pytest.raises(ValueError, match="inside a panel"):
        Grid.of([0, 4], [0, 20, 40], np.zeros((1, 2), np.int64), grain=16, panel_space=True)
    Grid.of([0, 4], [0, 32, 40], np.zeros((1, 2), np.int64), grain=16, panel_space=True)   # the end may be partial


@settings(max_examples=60, deadline=None)
@given(k=st.integers(1, 30), words=st.integers(0, 24), dtype=st.sampled_from([FP8, FP16, FP32]),
       gr=st.integers(1, 4), gc=st.integers(1, 6), replicas=st.integers(1, 2), owners=st.integers(1, 40),
       seed=st.integers(0, 2 ** 32 - 1))
def test_packed_panels_to_a_panel_grid_and_back_moves_every_element_once(k, words, dtype, gr, gc, replicas,
                                                                         owners, seed):
    grain = GRAIN[dtype]
    n = grain + words * (8 // dtype.itemsize)
    gr = min(gr, k)
    tiles = 40
    rng = np.random.default_rng(seed)
    rb = balanced_bounds(k, gr)
    cb = aligned_bounds(n, gc, grain)
    holders = np.stack([rng.choice(tiles, size=replicas, replace=False)
                        for _ in range(gr * (len(cb) - 1))]).reshape(gr, len(cb) - 1, replicas)
    grid = Grid.of(rb, cb, holders, grain=grain, panel_space=True)
    src = PackedPanels(grain, owners)
    src_om = src.verify((k, n), dtype, IPU.with_tiles(tiles))
    dst_om = grid.owner_map((k, n), dtype, tiles)
    assert src.index_space == grid.index_space == f"panels{grain}"

    m = rng.permutation(k * n).reshape(k, n)
    values = to_panel_major(m, grain)                  # the host writes a panel-space buffer panel-major
    plan = plan_copy(src_om, dst_om, dtype.itemsize)
    out = plan.execute(scatter(values, src_om), {})
    assert plan.nbytes.sum() == k * n * replicas * dtype.itemsize
    # Each tile holds its blocks stacked in block order, each in AMP panel format (last panel narrower).
    off = grid.block_offsets(dtype.itemsize)
    for i in range(gr):
        for j in range(len(cb) - 1):
            want = grid_block_by_hand(m, rb[i], rb[i + 1], cb[j], cb[j + 1], grain)
            for r in range(replicas):
                t, o = int(holders[i, j, r]), int(off[i, j, r])
                assert np.array_equal(out[t][o:o + want.size], want), (i, j, r)
    # And back: the grid's replicas gather to the same matrix, and copy back into the stream.
    assert np.array_equal(from_panel_major(gather(out, dst_om, k * n), k, n, grain), m)
    back = plan_copy(dst_om, src_om, dtype.itemsize).execute(out, {})
    assert np.array_equal(gather(back, src_om, k * n), values)
