"""Copies between grids of the same blocks lower block by block to the same program as row by row."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import tileplan.lowering.block_moves as block_moves
from tileplan.estimate.detailed import plan_for, step_traffic
from tileplan.estimate.exchange import fragments_to_transfers
from tileplan.program import Buffer, ComputeStep, Copy, ExchangeStep, Program
from tileplan.graph.dtypes import DType
from tileplan.layout.gemm_grid import Grid
from tileplan.lowering.block_moves import block_move
from tileplan.lowering.lower import lower
from tileplan.target import load_target

TARGET = load_target("ipu21-64")


@st.composite
def same_block_grids(draw):
    """Two row-major grids of one tensor with the same bounds and random holders (often on a few tiles,
    so that blocks share tiles, stay on their tile or chain in memory)."""
    heights = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    widths = draw(st.lists(st.integers(1, 6), min_size=1, max_size=4))
    rb, cb = np.concatenate(([0], np.cumsum(heights))), np.concatenate(([0], np.cumsum(widths)))
    blocks = len(heights) * len(widths)
    tiles = draw(st.integers(1, 6))
    hs = [np.array(draw(st.lists(st.integers(0, tiles - 1), min_size=blocks, max_size=blocks))).reshape(
        len(heights), len(widths)) for _ in range(2)]
    if draw(st.booleans()):
        hs[1] = hs[0].copy()              # every block stays on its tile
    if draw(st.booleans()):               # the destination leaves some blocks out (a reducer's own partial)
        left_out = np.array(draw(st.lists(st.booleans(), min_size=blocks, max_size=blocks))).reshape(hs[1].shape)
        hs[1] = np.where(left_out, -1, hs[1])
    dtype = draw(st.sampled_from([DType.FP16, DType.FP8, DType.FP32]))
    shape = (int(rb[-1]), int(cb[-1]))
    return Buffer("P", Grid.of(rb, cb, hs[0]), shape, dtype), Buffer("Pr", Grid.of(rb, cb, hs[1]), shape, dtype)


@settings(max_examples=150, deadline=None)
@given(same_block_grids())
def test_a_block_move_is_the_row_by_row_plan_merged(bufs):
    src, dst = bufs
    move = block_move(src, dst)
    assert move is not None
    plan = plan_for(src, dst, TARGET.tiles)
    assert move.is_identity == plan.is_identity
    prog = Program({"P": src, "Pr": dst})
    rows, rows_local = step_traffic(prog, ExchangeStep("x", (Copy("P", "Pr"),)), TARGET.tiles, merge=False)
    blocks, blocks_local = move.traffic()
    assert move.row_fragments() == len(rows)

    def merged(t):
        m = fragments_to_transfers(t.src_tile, t.src_off, t.dst_tile, t.dst_off, t.nbytes)
        return [a.tolist() for a in (m.group, m.src_tile, m.src_off, m.dst_tile, m.dst_off, m.nbytes)]

    assert merged(blocks) == merged(rows)
    for f in ("group", "src_tile", "src_off", "dst_tile", "dst_off", "nbytes"):
        assert getattr(blocks_local, f).tolist() == getattr(rows_local, f).tolist(), f


def test_grids_of_other_bounds_panels_or_replicas_are_not_block_moves():
    h = np.arange(4).reshape(2, 2)
    a = Buffer("a", Grid.of([0, 2, 4], [0, 3, 6], h), (4, 6), DType.FP16)
    assert block_move(a, Buffer("b", Grid.of([0, 1, 4], [0, 3, 6], h), (4, 6), DType.FP16)) is None
    assert block_move(a, Buffer("b", Grid.of([0, 2, 4], [0, 3, 6], h, grain=16), (4, 6), DType.FP16)) is None
    assert block_move(a, Buffer("b", Grid.of([0, 2, 4], [0, 3, 6], np.stack([h, h + 4], axis=2)),
                                (4, 6), DType.FP16)) is None
    # A destination may leave blocks out; a source may not, when the destination wants them.
    partial = Buffer("b", Grid.of([0, 2, 4], [0, 3, 6], np.where(h == 3, -1, h)), (4, 6), DType.FP16)
    assert len(block_move(a, partial).nbytes) == 3
    assert block_move(partial, a) is None


def reduction_program() -> Program:
    """Partials written by a compute step, moved to reducers that share some tiles with the writers, and
    a second copy in the same exchange."""
    rng = np.random.default_rng(7)
    rb, cb = [0, 5, 9, 16, 20], [0, 8, 12, 20]
    src = Grid.of(rb, cb, rng.integers(0, 16, size=(4, 3)))
    dst = Grid.of(rb, cb, rng.integers(8, 24, size=(4, 3)))
    bufs = {"P": Buffer("P", src, (20, 20), DType.FP16), "Pr": Buffer("Pr", dst, (20, 20), DType.FP16),
            "Q": Buffer("Q", src, (20, 20), DType.FP16), "Qr": Buffer("Qr", Grid.of(rb, cb, rng.integers(
                0, 16, size=(4, 3))), (20, 20), DType.FP16)}
    return Program(bufs, [ComputeStep("write", ()), ExchangeStep("reduce", (Copy("P", "Pr"), Copy("Q", "Qr")))])


def test_lowering_a_reduction_exchange_block_by_block_gives_the_row_by_row_program(monkeypatch):
    fast = lower(reduction_program(), TARGET)
    monkeypatch.setattr(block_moves, "block_move", lambda src, dst: None)
    slow = lower(reduction_program(), TARGET)
    assert fast.log == slow.log and any("merge_transfers" in line for line in fast.log)
    assert fast.tile_program.to_files() == slow.tile_program.to_files()
