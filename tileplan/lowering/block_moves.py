"""Copies between two grids of the same blocks, lowered block by block.

A GEMM's partials move to their reducers this way (``P -> Pr``): both grids cut
the tensor at the same row and column bounds and hold every block once (the
destination may leave some out: a reducer reads its own partial in place),
row-major and dense, so each block is one contiguous run in both tiles'
memories. The general path plans such a copy row by row (two owner maps and a
copy plan of one fragment per block row: over a million for the SigLIP
batch-4 MLP) and the low pass ``merge_transfers`` joins the rows back into
these runs. Planning one fragment per block gives the same program after the
passes at a small fraction of the work:

- ``merge_transfers`` joins fragments contiguous in both memories maximally,
  so its result does not depend on how finely the runs were cut, provided no
  two rows of the step read the same source bytes for the same tile (then the
  row order could matter). Rows of a block move read their source buffer's
  bytes once, so ``expand`` takes this path only when no other copy of the
  step reads the same memory.
- Each block is one contiguous run in both memories, so one transfer per block
  is a correct program by itself: ``expand`` makes it whether or not
  ``merge_transfers`` follows (no expansion depends on a later pass).
- On-tile runs are merged as they are made (``merge=True``, as
  ``step_traffic`` does), with the same argument.
- The pass log counts the row-by-row fragments; ``row_fragments`` counts them
  from the blocks without building the plan.

``BlockMove`` and ``block_move`` live in ``estimate.blocks``: the detailed
estimate prices the same blocks.
"""

from __future__ import annotations

from ..estimate.blocks import BlockMove, block_move
from ..estimate.detailed import plan_for

__all__ = ["BlockMove", "CopyPlans", "block_move"]


class CopyPlans:
    """Each copy's plan (its ``BlockMove`` when it is one), made once per lowering: the passes and the
    expansion all ask for it (``plan_for``'s own cache keeps only a few plans, fewer than a serial GEMM
    has copies). A plan depends on the two buffers' layouts, shapes and element type only, so it is
    keyed by those: the copies of a tower's 27 layers share one plan each, not 27."""

    def __init__(self, tiles: int):
        self.tiles = tiles
        self._plans: dict = {}

    @staticmethod
    def _key(src, dst) -> tuple:
        return (src.layout, dst.layout, tuple(src.shape), tuple(dst.shape), src.dtype)

    def __call__(self, src, dst):
        """The copy's ``BlockMove`` when it is one, else its row-by-row plan."""
        key = (self._key(src, dst), True)
        if key not in self._plans:
            self._plans[key] = block_move(src, dst) or self.rows(src, dst)
        return self._plans[key]

    def traffic(self, src, dst, block: bool, make):
        """What ``make(plan)`` lowers the copy to (its exchange rows, on-tile runs and fragment count,
        with buffer ids 0), made once per plan: a plan does not depend on the buffers' names, nor
        their traffic, so a tower's 27 layers expand each of their copies once. ``block``: the
        ``BlockMove`` (``__call__``) or the row-by-row plan (``rows``)."""
        key = (self._key(src, dst), block, "traffic")
        if key not in self._plans:
            self._plans[key] = make(self(src, dst) if block else self.rows(src, dst))
        return self._plans[key]

    def rows(self, src, dst):
        """The copy's row-by-row plan (``plan_for``)."""
        key = (self._key(src, dst), False)
        if key not in self._plans:
            self._plans[key] = plan_for(src, dst, self.tiles)
        return self._plans[key]
