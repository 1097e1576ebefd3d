"""Group independent exchanges into one superstep.

Two exchange steps with no compute between them are merged when no copy of
the second reads a buffer that a copy of the first writes (or writes one the
first touches): their transfers then run in one exchange phase after one
sync. Buffers are compared by the memory they occupy: a buffer that aliases
another (``eliminate_noop_copies`` runs first) counts as its root buffer.
"""

from __future__ import annotations

from ...estimate.program import ExchangeStep, Program


def run(state):
    steps = []
    for step in state.program.steps:
        prev = steps[-1] if steps else None
        if isinstance(step, ExchangeStep) and isinstance(prev, ExchangeStep) and _independent(prev, step, state.aliases):
            steps[-1] = ExchangeStep(f"{prev.name}+{step.name}", prev.copies + step.copies)
            state.log.append(f"group_exchanges: {step.name} joins {prev.name}")
        else:
            steps.append(step)
    state.program = Program(dict(state.program.buffers), steps)
    return state


def _independent(a: ExchangeStep, b: ExchangeStep, aliases: dict[str, str]) -> bool:
    def root(name: str) -> str:
        while name in aliases:
            name = aliases[name]
        return name

    written = {root(c.dst) for c in a.copies}
    touched = written | {root(c.src) for c in a.copies}
    return not any(root(c.src) in written or root(c.dst) in touched for c in b.copies)
