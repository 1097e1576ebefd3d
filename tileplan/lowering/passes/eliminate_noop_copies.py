"""Eliminate copies that move nothing.

A copy whose plan keeps every fragment on its tile at its offset (for example
a host input already in the layout its consumer reads, or a layout whose
owner map equals another's) is dropped; its destination buffer becomes an
alias of its source. Exchange steps left empty disappear. The rewrite is
``program.alias_noop_copies`` with the one "moves nothing" test
(``estimate.detailed.moves_nothing``), which the planner's whole-graph estimate
runs too (``estimate.detailed.scheduled``).
"""

from __future__ import annotations

from ...estimate.detailed import moves_nothing
from ...program import Program, alias_noop_copies


def run(state):
    prog, tiles = state.program, state.target.tiles
    steps, log = alias_noop_copies(prog.steps, prog.buffers, state.aliases,
                                   lambda src, dst: moves_nothing(src, dst, tiles))
    state.log.extend(log)
    state.program = Program(dict(prog.buffers), steps)
    return state
