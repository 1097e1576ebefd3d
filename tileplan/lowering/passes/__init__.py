"""Low passes, one per file, run as one flat named list.

Each pass takes and returns a ``LoweringState`` (the buffer-level program plus
aliases and size overrides, and after expansion the tile program). The list
says why each pass is there; ``lowering.lower`` runs it in order and records
the names in the package.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from . import (donate_cast_buffer, eliminate_noop_copies, group_exchanges, merge_transfers, omit_padding)


@dataclass(frozen=True)
class LowPass:
    """One low pass: ``stage`` "program" rewrites buffers and steps before allocation, "tiles" the
    per-tile transfers after expansion; ``run`` takes and returns the ``LoweringState``."""

    name: str
    stage: str
    run: Callable
    why: str

    def __post_init__(self):
        if self.stage not in ("program", "tiles"):
            raise ValueError(f"low pass {self.name!r}: stage {self.stage!r} is not 'program' or 'tiles'")


PASSES = (
    LowPass("eliminate_noop_copies", "program", eliminate_noop_copies.run,
            "a conversion whose every fragment stays put needs no buffer and no step: alias it"),
    LowPass("group_exchanges", "program", group_exchanges.run,
            "independent exchanges back to back share one superstep and one sync"),
    LowPass("donate_cast_buffer", "program", donate_cast_buffer.run,
            "a cast whose input dies there writes over it: one buffer instead of two"),
    LowPass("omit_padding", "program", omit_padding.run,
            "block padding after a tile's last block is never read: do not allocate it"),
    LowPass("merge_transfers", "tiles", merge_transfers.run,
            "fragments contiguous in both memories are one transfer: fewer control cycles"),
)
