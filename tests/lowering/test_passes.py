"""The low passes: each one changes the program it runs on, and none changes what it computes.

For every pass, a graph where it fires is lowered twice, with the full pass
list and with the list less that pass; both tile programs run on the IPU
model with the same seeded inputs and must produce bit-identical outputs
(and pass validation against the float64 reference). The change each pass
makes is checked where a user would see it: the pass log, fewer steps,
transfers or syncs, shared addresses, smaller allocations.
"""

from __future__ import annotations

import functools

from pathlib import Path

import re

import numpy as np
import pytest

from tileplan.estimate.detailed import plan_for
from tileplan.program import Buffer, Copy, ExchangeStep, Program
from tileplan.graph.core import Add, Graph, MatMul, Role, Tensor
from tileplan.graph.dtypes import DType
from tileplan.graph.loaders import load_model
from tileplan.layout import Intervals, WholeRows
from tileplan.lowering.lower import lower
from tileplan.lowering.package import Package
from tileplan.lowering.passes import PASSES
from tileplan.lowering.tile_program import ComputeSet, Exchange
from tileplan.planner.plan import plan
from tileplan.sim.model import IPUModel
from tileplan.sim.validate import validate_package
from tileplan.target import load_target

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
ALL_PASSES = [p.name for p in PASSES]
TARGET = load_target("ipu21-64")


def without(name: str) -> list[str]:
    return [p for p in ALL_PASSES if p != name]


@functools.lru_cache(maxsize=None)
def fixture_plan(name: str):
    """(graph, plan) of a fixture on ipu21-64, planned once per test run (lowering does not change a plan)."""
    graph = load_model(FIXTURES / f"{name}.toml")
    return graph, plan(graph, TARGET)


def simulate(graph, target, tile_program):
    """Run a tile program on the IPU model with the seeded validation data."""
    return validate_package(Package(None, graph, target, tile_program, {}, {}, {}))


def assert_same_outputs(graph, target, with_pass, without_pass):
    a = simulate(graph, target, with_pass.tile_program)
    b = simulate(graph, target, without_pass.tile_program)
    assert a.passed and b.passed, (a.outputs, b.outputs)
    assert a.values.keys() == b.values.keys()
    for name in a.values:
        np.testing.assert_array_equal(a.values[name], b.values[name], err_msg=f"output {name!r}")
    return a, b


def addresses(state, buffer: str) -> np.ndarray:
    tp = state.tile_program
    return tp.addr[tp.buffer_index(buffer)]


def exchanges(state) -> list[Exchange]:
    return [s for s in state.tile_program.steps if isinstance(s, Exchange)]


def two_branches() -> Graph:
    """y = x @ w1 + z @ w2: the first GEMM's output exchange and the second's preparation are independent."""
    f16 = DType.FP16
    return Graph.build("two_branches", [
        Tensor("x", (64, 96), f16, Role.INPUT), Tensor("z", (64, 96), f16, Role.INPUT),
        Tensor("w1", (96, 128), f16, Role.PARAMETER), Tensor("w2", (96, 128), f16, Role.PARAMETER)],
        [MatMul("fa", ("x", "w1"), "a"), MatMul("fb", ("z", "w2"), "b"), Add("sum", ("a", "b"), "y")])


# ---- eliminate_noop_copies -------------------------------------------------------------------

def test_eliminate_noop_copies_lets_a_host_input_in_its_consumers_layout_stay_put():
    graph, p = fixture_plan("mlp_smoke_fp8")
    with_pass = lower(p.mid.program, TARGET)
    without_pass = lower(p.mid.program, TARGET, passes=without("eliminate_noop_copies"))
    assert "eliminate_noop_copies: x@Iv(64,a16) aliases x@Imp(Iv(64,a16))" in with_pass.log
    np.testing.assert_array_equal(addresses(with_pass, "x@Iv(64,a16)"), addresses(with_pass, "x@Imp(Iv(64,a16))"))
    assert not np.array_equal(addresses(without_pass, "x@Iv(64,a16)"), addresses(without_pass, "x@Imp(Iv(64,a16))"))
    assert_same_outputs(graph, TARGET, with_pass, without_pass)


def test_eliminate_noop_copies_removes_the_copy_of_a_gemm_result_into_a_boundary_layout_it_already_has():
    # Regression: without the pass, the copy mm0.C -> t0@Rows(5) (an identity plan) was not
    # expanded at all, so t0 was never written and the output was garbage.
    f16 = DType.FP16
    graph = Graph.build("gemm_3d", [Tensor("x", (4, 31, 10), f16, Role.INPUT),
                                    Tensor("w0", (10, 2), f16, Role.PARAMETER)],
                        [MatMul("mm0", ("x", "w0"), "t0")])
    target = TARGET.with_tiles(5)
    p = plan(graph, target)
    with_pass = lower(p.mid.program, target)
    without_pass = lower(p.mid.program, target, passes=without("eliminate_noop_copies"))
    assert "eliminate_noop_copies: t0@Rows(5) aliases mm0.C" in with_pass.log
    assert len(with_pass.tile_program.steps) < len(without_pass.tile_program.steps)
    a, b = assert_same_outputs(graph, target, with_pass, without_pass)
    assert a.profile.cycles < b.profile.cycles


# ---- group_exchanges -------------------------------------------------------------------------

def test_group_exchanges_runs_two_independent_exchanges_after_one_sync():
    graph = two_branches()
    p = plan(graph, TARGET)
    with_pass = lower(p.mid.program, TARGET)
    without_pass = lower(p.mid.program, TARGET, passes=without("group_exchanges"))
    assert "group_exchanges: fb.prep joins fa.out" in with_pass.log
    assert len(exchanges(with_pass)) == len(exchanges(without_pass)) - 1
    a, b = assert_same_outputs(graph, TARGET, with_pass, without_pass)
    assert a.profile.sync == b.profile.sync - TARGET.sync_cycles


def test_group_exchanges_keeps_apart_an_exchange_that_reads_what_the_previous_one_writes_through_an_alias():
    # Regression: s -> p, then p -> q (an identity: q aliases p), then q -> r. Once the middle copy
    # is gone, the last exchange reads p's memory under the name q; grouping it with the first
    # (which writes p) made one exchange read bytes it also wrote.
    f16, shape = DType.FP16, (64, 8)
    bufs = [Buffer("s", Intervals(4), shape, f16, "input", tensor="v"),
            Buffer("p", Intervals(64, 16), shape, f16, "tensor", tensor="v"),
            Buffer("q", WholeRows(64), shape, f16, "tensor", tensor="v"),
            Buffer("r", Intervals(2), shape, f16, "output", tensor="v")]
    program = Program({b.name: b for b in bufs}, [ExchangeStep("a", (Copy("s", "p"),)),
                                                  ExchangeStep("b", (Copy("p", "q"),)),
                                                  ExchangeStep("c", (Copy("q", "r"),))])
    assert plan_for(bufs[1], bufs[2], TARGET.tiles).is_identity
    state = lower(program, TARGET)
    assert "eliminate_noop_copies: q aliases p" in state.log
    assert not any(line.startswith("group_exchanges") for line in state.log)
    model = IPUModel(state.tile_program, TARGET)
    values = np.arange(512, dtype=np.float16).reshape(shape)
    model.write("s", values)
    model.run()
    np.testing.assert_array_equal(model.read("r").reshape(shape), values)


# ---- donate_cast_buffer ----------------------------------------------------------------------

def test_donate_cast_buffer_casts_the_smoke_mlps_gelu_output_in_place():
    graph, p = fixture_plan("mlp_smoke_fp8")
    with_pass = lower(p.mid.program, TARGET)
    without_pass = lower(p.mid.program, TARGET, passes=without("donate_cast_buffer"))
    assert "donate_cast_buffer: g8@Iv(64,a8) takes over g@Iv(64,a16) at cast_g.compute" in with_pass.log
    src, dst = addresses(with_pass, "g@Iv(64,a16)"), addresses(with_pass, "g8@Iv(64,a8)")
    held = dst >= 0
    assert held.any()
    np.testing.assert_array_equal(dst[held], src[held])
    assert not np.array_equal(addresses(without_pass, "g8@Iv(64,a8)")[held],
                              addresses(without_pass, "g@Iv(64,a16)")[held])
    assert_same_outputs(graph, TARGET, with_pass, without_pass)


# ---- omit_padding ----------------------------------------------------------------------------

def accesses_outside_buffers(tp) -> list[str]:
    """Every vertex operand and transfer endpoint, as (tile, lo, hi), that no allocated buffer contains."""
    held = tp.size > 0
    b_tile = np.broadcast_to(np.arange(tp.tiles), tp.addr.shape)[held]
    b_lo, b_hi = tp.addr[held], (tp.addr + tp.size)[held]
    order = np.lexsort((b_lo, b_tile))
    b_tile, b_lo, b_hi = b_tile[order], b_lo[order], b_hi[order]
    bad = []

    def check(step, tiles, lo, nbytes):
        for t, a, n in zip(np.asarray(tiles).tolist(), np.asarray(lo).tolist(), np.broadcast_to(nbytes, len(lo)).tolist()):
            on = b_tile == t
            if not np.any(on & (b_lo <= a) & (b_hi >= a + n)):
                bad.append(f"{step}: tile {t} [{a}, {a + n})")

    for st in tp.steps:
        if isinstance(st, ComputeSet):
            for g in st.groups:
                for j, n in enumerate(g.in_bytes):
                    check(st.name, g.tile, g.ins[:, j], n)
                for j, n in enumerate(g.out_bytes):
                    check(st.name, g.tile, g.outs[:, j], n)
        else:
            tr = st.transfers
            check(st.name, tr.src_tile, tr.src_off, tr.nbytes)
            check(st.name, tr.dst_tile, tr.dst_off, tr.nbytes)
    return bad


def test_omit_padding_allocates_prime_sized_pieces_exactly_and_every_access_stays_inside_them():
    graph, p = fixture_plan("odd_prime_dims")
    with_pass = lower(p.mid.program, TARGET)
    without_pass = lower(p.mid.program, TARGET, passes=without("omit_padding"))
    saved = [line for line in with_pass.log if line.startswith("omit_padding: ")]
    # A's rows of K = 131 halves end off 8-byte boundaries: its pieces carry padding the pass drops.
    assert any(re.fullmatch(r"omit_padding: fc\.A saves [1-9]\d* bytes on its worst tile", line) for line in saved), saved
    assert with_pass.tile_program.size.sum() < without_pass.tile_program.size.sum()
    assert (with_pass.tile_program.size <= without_pass.tile_program.size).all()
    assert accesses_outside_buffers(with_pass.tile_program) == []
    assert_same_outputs(graph, TARGET, with_pass, without_pass)


# ---- merge_transfers -------------------------------------------------------------------------

def test_merge_transfers_sends_contiguous_fragments_as_one_transfer():
    # Row by row (no block moves), so the fragments the pass joins are all there to see.
    graph, p = fixture_plan("mlp_smoke_fp8")
    with_pass = lower(p.mid.program, TARGET, block_moves=False)
    without_pass = lower(p.mid.program, TARGET, passes=without("merge_transfers"), block_moves=False)
    merged = [re.match(r"merge_transfers: [\w.+]+: (\d+) fragments -> (\d+) transfers", line) for line in with_pass.log]
    merged = [m for m in merged if m]
    assert merged and int(merged[0].group(2)) < int(merged[0].group(1))

    def count(state):
        return sum(x.transfers.transfer_count for x in exchanges(state))

    def moved(state):
        return sum(int(x.transfers.nbytes.sum()) for x in exchanges(state))

    assert count(with_pass) < count(without_pass)
    assert moved(with_pass) == moved(without_pass)
    a, b = assert_same_outputs(graph, TARGET, with_pass, without_pass)
    assert a.profile.exchange < b.profile.exchange


# ---- all of them -----------------------------------------------------------------------------

@pytest.mark.parametrize("fixture", ["mlp_smoke_fp8", "odd_fp8_tails", "odd_3d_activation", "residual_block"])
def test_a_program_lowered_without_any_pass_computes_the_same_bits(fixture):
    graph, p = fixture_plan(fixture)
    optimised = lower(p.mid.program, TARGET)
    plain = lower(p.mid.program, TARGET, passes=[])
    assert plain.log == [] and plain.tile_program.passes == []
    assert optimised.tile_program.passes == ALL_PASSES
    assert_same_outputs(graph, TARGET, optimised, plain)


def test_the_expansion_does_not_depend_on_the_passes_that_follow_it():
    # Block moves (one transfer per block) are the expansion's own: with or without merge_transfers
    # listed, every block is one contiguous transfer, and the program computes the same bits.
    graph, p = fixture_plan("mlp_smoke_fp8")
    with_pass = lower(p.mid.program, TARGET)
    without_pass = lower(p.mid.program, TARGET, passes=without("merge_transfers"))
    rows = lambda state: sum(len(x.transfers) for x in exchanges(state))   # noqa: E731
    row_by_row = lower(p.mid.program, TARGET, passes=without("merge_transfers"), block_moves=False)
    assert rows(without_pass) < rows(row_by_row)
    assert rows(with_pass) <= rows(without_pass)
    assert_same_outputs(graph, TARGET, with_pass, without_pass)
