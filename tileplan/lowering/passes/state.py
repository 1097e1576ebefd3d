"""The state the low passes rewrite."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...program import Program


@dataclass
class LoweringState:
    program: Program
    target: object
    aliases: dict[str, str] = field(default_factory=dict)      # buffer -> buffer whose memory it shares
    sizes: dict[str, np.ndarray] = field(default_factory=dict)  # buffer -> per tile bytes (overrides)
    tile_program: object = None                                # set after expansion
    log: list[str] = field(default_factory=list)               # one line per change a pass made
    plans: object = None                                       # lowering.block_moves.CopyPlans of the lowering
    pool: object = None                                        # tile_program.ArrayPool: equal tables shared
    numbers: object = None                                     # tile_program.RowNumbers: Exchange.origin
    placement: object = None                                   # tile_program.Placement, once allocated

    def __post_init__(self):
        if self.plans is None:
            from ..block_moves import CopyPlans
            self.plans = CopyPlans(self.target.tiles)
        if self.pool is None:
            from ..tile_program import ArrayPool
            self.pool = ArrayPool()
        if self.numbers is None:
            from ..tile_program import RowNumbers
            self.numbers = RowNumbers()
