"""The detailed estimate: copy costs and the whole-graph estimate against the lowered program."""

from pathlib import Path

import numpy as np
import pytest

from tileplan.estimate import detailed as D
from tileplan.program import ExchangeStep, Program
from tileplan.lowering.compile import program_cycles
from tileplan.lowering.lower import lower
from tileplan.planner.plan import plan
from tileplan.target import load_target

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
TARGET = load_target("ipu21-64")


def fixture_plan(planned, fixture: str):
    """The fixture's plan on its own target (ipu21-64, ``TARGET``), planned once per session."""
    _, target, p = planned(FIXTURES / f"{fixture}.toml")
    assert target.name == TARGET.name
    return p


def full_expansion_cost(a, b, target):
    """The cost of a copy computed from its full fragment expansion (what lowering executes)."""
    prog = Program({a.name: a, b.name: b})
    from tileplan.program import Copy
    tr, local = D.step_traffic(prog, ExchangeStep("copy", (Copy(a.name, b.name),)), target.tiles)
    send, recv = D.tile_exchange_cycles(tr, target)
    return send, recv, D.local_copy_cycles(local, target), int(tr.nbytes.sum()) if len(tr) else 0


@pytest.mark.parametrize("fast_path,least", [(D._replicated_grid_cost, 10), (D._block_move_cost, 2)],
                         ids=["replicated-grid", "block-move"])
@pytest.mark.parametrize("fixture", ["mlp_smoke_fp8", "odd_fp8_panels", "odd_3d_activation", "residual_block"])
def test_fast_copy_costs_equal_their_full_expansion(fixture, fast_path, least, planned):
    """The planner's shortcuts (replica 0 of a multicast; whole blocks between grids of the same
    blocks) price a copy exactly as the fragment expansion lowering executes."""
    p = fixture_plan(planned, fixture)
    checked = 0
    for cands in p.candidates.values():
        for c in cands:
            for step in (c.program.steps if c.program else []):
                if not isinstance(step, ExchangeStep):
                    continue
                for cp in step.copies:
                    a, b = c.program.buffers[cp.src], c.program.buffers[cp.dst]
                    fast = fast_path(a.layout, b.layout, tuple(a.shape), a.dtype, TARGET)
                    if fast is False:
                        continue
                    if fast is None:      # the destination aliases the source (a grid-aligned A)
                        assert D.moves_nothing(a, b, TARGET.tiles)
                        continue
                    checked += 1
                    send, recv, local, nbytes = full_expansion_cost(a, b, TARGET)
                    np.testing.assert_array_equal(fast.send, send)
                    np.testing.assert_array_equal(fast.recv, recv)
                    np.testing.assert_array_equal(fast.local_cycles, local)
                    assert fast.nbytes == nbytes
    assert checked >= least


def test_the_whole_graph_estimate_counts_the_supersteps_lowering_schedules():
    # Two independent branches: the first GEMM's output exchange and the second's
    # preparation share one superstep once lowering groups them; the estimate knows.
    from tileplan.graph.core import Add, Graph, MatMul, Role, Tensor
    from tileplan.graph.dtypes import DType
    f16 = DType.FP16
    g = Graph.build("two_branches", [
        Tensor("x", (64, 96), f16, Role.INPUT), Tensor("z", (64, 96), f16, Role.INPUT),
        Tensor("w1", (96, 128), f16, Role.PARAMETER), Tensor("w2", (96, 128), f16, Role.PARAMETER)],
        [MatMul("fa", ("x", "w1"), "a"), MatMul("fb", ("z", "w2"), "b"), Add("sum", ("a", "b"), "y")])
    p = plan(g, TARGET)
    st = lower(p.mid.program, TARGET)
    assert any(line.startswith("group_exchanges") for line in st.log)
    lowered = sum(s["cycles"] + s["sync"] for s in program_cycles(st.tile_program, TARGET))
    assert p.estimate.cycles == lowered


@pytest.mark.parametrize("fixture", ["mlp_smoke_fp8", "odd_3d_activation", "residual_block", "mlp_fp16_small"])
def test_moves_nothing_agrees_with_the_fragment_plan(fixture, planned):
    """The block-level alias test gives the fragment plan's answer on every copy of every candidate."""
    p = fixture_plan(planned, fixture)
    answers = []
    for cands in p.candidates.values():
        for c in cands:
            for step in (c.program.steps if c.program else []):
                for cp in (step.copies if isinstance(step, ExchangeStep) else ()):
                    a, b = c.program.buffers[cp.src], c.program.buffers[cp.dst]
                    full = D.plan_for(a, b, TARGET.tiles)
                    expected = full.is_identity and not full.needs_rearrangement
                    assert D.moves_nothing(a, b, TARGET.tiles) == expected, (cp, c.desc)
                    answers.append(expected)
    assert len(answers) >= 20 and not all(answers)


@pytest.mark.parametrize("fixture", ["mlp_smoke_fp8", "residual_block", "encoder_layer_small"])
def test_the_scheduled_program_is_what_the_cycle_changing_low_passes_make(fixture, planned):
    """``scheduled`` runs eliminate_noop_copies and group_exchanges as lowering does: same steps, same aliases."""
    p = fixture_plan(planned, fixture)
    state = lower(p.mid.program, TARGET, passes=["eliminate_noop_copies", "group_exchanges"])
    s = D.scheduled(p.mid.program, TARGET.tiles)
    assert s.steps == state.program.steps and s.aliases == state.aliases
    assert any(line.startswith("eliminate_noop_copies") for line in state.log)
