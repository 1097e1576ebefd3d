"""``Caches``: the memo tables of planning on one target, held by the planning context.

Building candidate programs asks the kernel dispatch for the same calls many times (every vertex of
a grid with equal blocks), and a GEMM's core program (grid buffers, vertices, internal exchanges)
serves every boundary combination of its catalogue. A ``Caches`` keeps both, keyed by value (calls,
GEMM shapes and choices are frozen dataclasses), for one target:

- ``kernel(call)``: (variant name, cycles) of the variant ``kernels.dispatch`` picks;
- ``core(key, build)``: a GEMM core program (``planner.gemm``), a bounded few (``CORES``).

``planner.plan.Context.caches`` holds the planning run's one; ``plan(..., caches=)`` takes one
(a fresh ``Caches(target)`` plans the same as a warm one: results never depend on what it holds).
By default a run uses ``shared(target)``, this process's ``Caches`` of that target, so repeated
plans in one process (the bench's repeats, a catalogue worker's chunks) reuse what earlier ones
dispatched and built. A pickled ``Caches`` (a context sent to a catalogue worker) arrives as the
receiving process's shared one of the same target.
"""

from __future__ import annotations

from ..kernels import dispatch


class Caches:
    CORES = 64               # GEMM cores kept (each holds a grid's vertices)

    def __init__(self, target):
        self.target = target
        self._kernels: dict = {}     # call -> (variant name, cycles)
        self._cores: dict = {}       # planner.gemm core key -> (core program, reducer columns)

    def kernel(self, call) -> tuple[str, int]:
        """(variant name, cycles) of the kernel variant dispatch picks for ``call`` on the target."""
        hit = self._kernels.get(call)
        if hit is None:
            v = dispatch(call, self.target)
            hit = self._kernels[call] = (v.name, v.cycles(call, self.target))
        return hit

    def core(self, key, build):
        """The GEMM core under ``key``, made by ``build()`` when it is not kept."""
        hit = self._cores.get(key)
        if hit is None:
            if len(self._cores) >= self.CORES:
                self._cores.clear()
            hit = self._cores[key] = build()
        return hit

    def __reduce__(self):
        return shared, (self.target,)


_SHARED: dict = {}           # target -> its Caches in this process (a few targets at most)


def shared(target) -> Caches:
    """This process's ``Caches`` of ``target`` (by value: an equal target loaded twice shares it)."""
    got = _SHARED.get(target)
    if got is None:
        if len(_SHARED) >= 8:
            _SHARED.clear()
        got = _SHARED[target] = Caches(target)
    return got
