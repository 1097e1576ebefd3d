"""The IPU model's access checks, on tiny hand-built tile programs and a mutated lowered one.

Each broken program raises ``SimError`` naming the step and the tile: two
vertices writing one byte in a compute set, a vertex reading what another
writes in the same compute set, two transfers writing one byte, an exchange
overwriting what it sends, a transfer or operand out of the tile's memory or
inside the reserve, an allocation in the reserve. The correct program runs,
moves its bytes and counts the cycles of the shared cycle model.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from tileplan.estimate.exchange import Transfers
from tileplan.graph.loaders import load_model
from tileplan.kernels import CopyCall, dispatch
from tileplan.lowering.lower import lower
from tileplan.lowering.tile_program import BufferInfo, ComputeSet, Exchange, TileProgram, VertexGroup
from tileplan.planner.plan import plan
from tileplan.sim.model import IPUModel, SimError
from tileplan.target import load_target

TARGET = load_target("ipu21-64").with_tiles(8)
BASE = TARGET.reserve_bytes            # the first usable byte of every tile
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def copies(name: str, tiles, src, dst, nbytes: int = 16) -> ComputeSet:
    """A compute set of on-tile ``copy`` vertices: vertex i copies nbytes from src[i] to dst[i] on tiles[i]."""
    call = CopyCall(nbytes)
    variant = dispatch(call, TARGET)
    return ComputeSet(name, [VertexGroup(call, variant.name, variant.cycles(call, TARGET), (nbytes,), (nbytes,),
                                         np.array(tiles, dtype=np.int32), np.array(src, dtype=np.int64)[:, None],
                                         np.array(dst, dtype=np.int64)[:, None])])


def transfers(name: str, rows) -> Exchange:
    """An exchange from rows of (group, src tile, src address, dst tile, dst address, bytes)."""
    g, st, so, dt, do, n = (np.array(c, dtype=np.int64) for c in zip(*rows))
    zero = np.zeros(len(rows), dtype=np.int32)
    return Exchange(name, Transfers(g, st.astype(np.int32), zero, so, dt.astype(np.int32), zero, do, n))


def program(*steps, addr: int = BASE) -> TileProgram:
    """One 256-byte scratch buffer at ``addr`` on every tile, and the given steps."""
    info = BufferInfo("scratch", "fp16", [128], "transient", "standard", "Iv(8,a16)", None, False, 0)
    return TileProgram(TARGET.tiles, [info], np.full((1, TARGET.tiles), addr, dtype=np.int64),
                       np.full((1, TARGET.tiles), 256, dtype=np.int64), list(steps))


def test_a_correct_program_runs_moves_its_bytes_and_counts_its_cycles():
    model = IPUModel(program(copies("shuffle", [2, 2, 5], [BASE, BASE + 16, BASE], [BASE + 64, BASE + 80, BASE + 64]),
                             transfers("send", [(0, 2, BASE + 64, 6, BASE + 128, 32),
                                                (1, 5, BASE + 64, 6, BASE + 160, 16)])), TARGET)
    data = np.arange(8 * 48, dtype=np.uint8).reshape(8, 48)
    model.mem[:, BASE:BASE + 48] = data
    profile = model.run()
    np.testing.assert_array_equal(model.mem[2, BASE + 64:BASE + 96], data[2, :32])
    np.testing.assert_array_equal(model.mem[6, BASE + 128:BASE + 160], data[2, :32])
    np.testing.assert_array_equal(model.mem[6, BASE + 160:BASE + 176], data[5, :16])
    copy_cycles = dispatch(CopyCall(16), TARGET).cycles(CopyCall(16), TARGET)
    assert [s.name for s in profile.steps] == ["shuffle", "send"]
    assert profile.steps[0].cycles == 2 * copy_cycles              # tile 2 runs two vertices
    recv = (32 // 4 + TARGET.receive_control_cycles) + (16 // 4 + TARGET.receive_control_cycles)
    assert profile.steps[1].cycles == recv                          # tile 6 receives both
    assert profile.sync == TARGET.sync_cycles


def test_two_vertices_writing_one_byte_in_a_compute_set_are_refused():
    bad = program(copies("cs.overlap", [3, 3], [BASE, BASE + 32], [BASE + 64, BASE + 72]))
    with pytest.raises(SimError, match=r"^cs\.overlap: two writers of one byte on tile 3 at bytes "
                                       rf"\[{BASE + 72}, {BASE + 80}\)"):
        IPUModel(bad, TARGET).run()


def test_a_vertex_reading_bytes_another_writes_in_the_same_compute_set_is_refused():
    bad = program(copies("cs.race", [5, 5], [BASE, BASE + 64], [BASE + 64, BASE + 128]))
    with pytest.raises(SimError, match=r"^cs\.race: a read of a byte written in the same step on tile 5"):
        IPUModel(bad, TARGET).run()


def test_vertices_on_different_tiles_may_use_the_same_addresses():
    IPUModel(program(copies("cs.ok", [1, 4], [BASE, BASE], [BASE + 64, BASE + 64])), TARGET).run()


def test_two_transfers_writing_one_byte_are_refused():
    bad = program(transfers("ex.clash", [(0, 1, BASE, 7, BASE + 64, 16), (1, 2, BASE, 7, BASE + 72, 16)]))
    with pytest.raises(SimError, match=r"^ex\.clash: two writers of one byte on tile 7"):
        IPUModel(bad, TARGET).run()


def test_an_exchange_that_overwrites_bytes_it_sends_is_refused():
    bad = program(transfers("ex.swap", [(0, 1, BASE, 2, BASE, 16), (1, 2, BASE + 8, 1, BASE + 64, 16)]))
    with pytest.raises(SimError, match=r"^ex\.swap: a read of a byte written in the same step on tile 2"):
        IPUModel(bad, TARGET).run()


@pytest.mark.parametrize("side, row, tile, where", [
    ("destination", (0, 1, BASE, 3, TARGET.sram_bytes - 8, 16), 3, "past the end"),
    ("destination", (0, 1, BASE, 4, 64, 16), 4, "in the reserve"),
    ("source", (0, 6, TARGET.reserve_bytes - 8, 2, BASE, 16), 6, "in the reserve"),
])
def test_a_transfer_outside_the_usable_memory_is_refused(side, row, tile, where):
    bad = program(transfers("ex.out", [row]))
    with pytest.raises(SimError, match=rf"^ex\.out: transfer {side}: tile {tile} accesses bytes "
                                       rf"\[{row[2] if side == 'source' else row[4]}, .*outside its usable memory"):
        IPUModel(bad, TARGET).run()


def test_a_vertex_operand_past_the_end_of_tile_memory_is_refused():
    bad = program(copies("cs.far", [6], [BASE], [TARGET.sram_bytes - 4]))
    with pytest.raises(SimError, match=r"^cs\.far: copy_local output 0: tile 6 accesses bytes"):
        IPUModel(bad, TARGET).run()


def test_an_allocation_in_the_reserve_is_refused_before_anything_runs():
    with pytest.raises(SimError, match="places a buffer in the reserve"):
        IPUModel(program(addr=BASE - 64), TARGET)


def test_a_lowered_program_with_two_vertices_writing_one_output_is_refused():
    graph = load_model(FIXTURES / "mlp_smoke_fp8.toml")
    target = load_target("ipu21-64")
    tp = lower(plan(graph, target).mid.program, target).tile_program
    IPUModel(tp, target).run()                                  # as lowered: no conflict
    broken = copy.deepcopy(tp)
    step = next(s for s in broken.steps if isinstance(s, ComputeSet) and s.name == "bias1.compute")
    group = next(g for g in step.groups if len(g.tile) > 1)
    tile = int(group.tile[0])
    group.tile, group.outs = group.tile.copy(), group.outs.copy()   # equal tables are shared between steps
    group.tile[1], group.outs[1] = tile, group.outs[0]         # vertex 1 moves onto vertex 0's tile and output
    with pytest.raises(SimError, match=rf"^bias1\.compute: two writers of one byte on tile {tile} "):
        IPUModel(broken, target).run()


def test_a_panel_space_parameter_is_written_panel_major_and_read_back_with_a_partial_last_panel():
    from tileplan.graph.dtypes import DType
    from tileplan.layout import PackedPanels
    # 3 x 40 FP16 in panels of 16: two whole panels, then one 8 columns wide; two owners.
    om = PackedPanels(16, 2).owner_map((3, 40), DType.FP16, TARGET.tiles)
    info = BufferInfo("w", "fp16", [3, 40], "parameter", "interleaved", "Packed(16,2)", "w", False, 0,
                      space="panels16")
    tp = TileProgram(TARGET.tiles, [info], np.full((1, TARGET.tiles), BASE, dtype=np.int64),
                     np.full((1, TARGET.tiles), 256, dtype=np.int64), [],
                     {"w": (om.tile, om.start, om.stop, om.offset)})
    sim = IPUModel(tp, TARGET)
    values = np.arange(120, dtype=np.float16).reshape(3, 40)
    sim.write("w", values)
    held = np.concatenate([sim.mem[t, BASE:BASE + int(n) * 2].view(np.float16)
                           for t, n in zip(om.tile, om.stop - om.start)])
    want = np.concatenate([values[:, :16].reshape(-1), values[:, 16:32].reshape(-1), values[:, 32:].reshape(-1)])
    assert np.array_equal(held, want)
    assert np.array_equal(sim.read("w"), values.reshape(-1))
