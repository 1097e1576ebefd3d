"""Group independent exchanges into one superstep.

Two exchange steps with no compute between them are merged when no copy of
the second reads a buffer that a copy of the first writes (or writes one the
first touches): their transfers then run in one exchange phase after one
sync. Buffers are compared by the memory they occupy: a buffer that aliases
another (``eliminate_noop_copies`` runs first) counts as its root buffer.
"""

from __future__ import annotations

from ...program import Program, group_exchange_steps


def run(state):
    steps, log = group_exchange_steps(state.program.steps, state.aliases)
    state.log.extend(log)
    state.program = Program(dict(state.program.buffers), steps)
    return state
