"""Eliminate copies that move nothing.

A copy whose plan keeps every fragment on its tile at its offset (for example
a host input already in the layout its consumer reads, or a layout whose
owner map equals another's) is dropped; its destination buffer becomes an
alias of its source. Exchange steps left empty disappear.
"""

from __future__ import annotations

from ...program import ExchangeStep, Program


def run(state):
    prog = state.program
    steps = []
    for step in prog.steps:
        if not isinstance(step, ExchangeStep):
            steps.append(step)
            continue
        keep = []
        for cp in step.copies:
            src, dst = prog.buffers[cp.src], prog.buffers[cp.dst]
            plan = state.plans(src, dst)
            if plan.is_identity and not plan.needs_rearrangement and dst.name not in state.aliases:
                state.aliases[dst.name] = src.name
                state.log.append(f"eliminate_noop_copies: {dst.name} aliases {src.name}")
            else:
                keep.append(cp)
        if keep:
            steps.append(ExchangeStep(step.name, tuple(keep)))
    state.program = Program(dict(prog.buffers), steps)
    return state
