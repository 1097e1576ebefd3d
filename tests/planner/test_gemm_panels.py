"""GEMM weights as AMP panels when N is not a multiple of the grain: storage, grids, coarse model."""

from __future__ import annotations

import numpy as np
import pytest

from tileplan.graph.core import Graph, MatMul, Role, Tensor
from tileplan.graph.dtypes import DType
from tileplan.layout import Packed, PackedPanels
from tileplan.layout.gemm_grid import aligned_bounds
from tileplan.planner.gemm import GemmChoice, GemmShape, build_program, grid_options
from tileplan.planner.plan import parameter_storage
from tileplan.estimate.coarse import coarse_parts
from tileplan.program import Buffer
from tileplan.target import load_target

IPU21, IPU64 = load_target("ipu21"), load_target("ipu21-64")
FP8, FP16 = DType.FP8, DType.FP16


def gemm(m: int, k: int, n: int, dtype: DType = FP8, transpose_b: bool = False) -> Graph:
    w = (n, k) if transpose_b else (k, n)
    return Graph.build("g", [Tensor("x", (m, k), dtype, Role.INPUT), Tensor("w", w, dtype, Role.PARAMETER)],
                       [MatMul("mm", ("x", "w"), "y", transpose_b=transpose_b)])


@pytest.mark.parametrize("k, n, dtype, panels", [
    (1152, 4304, FP8, True),       # SigLIP mlp_up: 134 whole panels and one of 16 columns
    (64, 144, FP8, True),          # 4 whole panels and one of 16
    (64, 200, FP8, True),          # a partial panel 8 columns wide
    (64, 40, FP16, True),          # FP16: panels of 16, the last 8 wide (16 bytes)
    (64, 256, FP8, True),          # whole panels, as before
    (147, 75, FP8, False),         # 75-byte rows: a sub-word tail stays row-major
    (131, 61, FP16, False),        # 122-byte rows
    (64, 24, FP8, False),          # narrower than one panel
])
def test_weights_are_stored_as_panels_whenever_their_rows_fill_whole_words(k, n, dtype, panels):
    for transpose in (False, True):
        g = gemm(32, k, n, dtype, transpose)
        st = parameter_storage(g, IPU21)["w"]
        assert isinstance(st.layout, PackedPanels if panels else Packed), (transpose, st.layout)
        assert GemmShape.of(g, g.ops[0], IPU21).panels is panels


def test_column_blocks_are_whole_panels_with_the_partial_one_last():
    g = GemmShape.of(gemm(96, 64, 144), gemm(96, 64, 144).ops[0], IPU64)
    assert g.panels and g.grain == 32
    assert grid_options(g, IPU64.tiles)[:, 2].max() == 5               # 4 whole panels + the partial one
    assert aligned_bounds(144, 3, 32).tolist() == [0, 64, 128, 144]
    assert aligned_bounds(144, 5, 32).tolist() == [0, 32, 64, 96, 128, 144]


def test_a_partial_panel_block_dispatches_the_amp_reading_panels():
    graph = gemm(96, 64, 144)
    g = GemmShape.of(graph, graph.ops[0], IPU64)
    st = parameter_storage(graph, IPU64)
    a = Buffer("x", PackedPanels(32, 64), (96, 64), FP8)        # any boundary layouts: the core is the point
    b = Buffer("w", st["w"].layout, (64, 144), FP8, "parameter", "interleaved")
    c = Buffer("y", PackedPanels(32, 64), (96, 144), FP16)
    prog = build_program(g, GemmChoice(1, 2, 5, 1), a, b, c, IPU64)
    amp = [v for s in prog.steps if s.name == "mm.amp" for v in s.vertices]
    widths = {v.call.n for v in amp}
    assert widths == {32, 16}
    assert {v.call.b_format for v in amp} == {"panels"} and {v.variant for v in amp} == {"amp_fp8_fp16"}
    assert all(v.ins[1].count == v.call.k * v.call.n for v in amp)   # no padding in the narrow panel


def test_the_coarse_model_prices_the_widest_block_in_whole_panels():
    graph = gemm(96, 64, 144)
    g = GemmShape.of(graph, graph.ops[0], IPU64)
    grids = np.array([[1, 2, 5, 1], [1, 2, 2, 1], [1, 4, 3, 1]], dtype=np.int64)
    zeros = np.zeros(len(grids), dtype=np.int64)
    interleaved = coarse_parts(g, IPU64, grids, zeros, zeros, zeros, np.ones(len(grids), np.int64)).interleaved
    # 5 panels (the last 16 wide) over gn = 5, 2, 3 column blocks: the widest holds 1, 3 and 2 whole
    # panels (aligned_bounds: [0, 32, ..], [0, 96, 144], [0, 64, 128, 144]); B bytes per tile = K x width.
    assert interleaved.tolist() == [64 * 32, 64 * 96, 64 * 64]
