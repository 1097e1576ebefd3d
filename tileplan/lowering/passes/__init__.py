"""Low passes, one per file, run as one flat named list.

Each pass takes and returns a ``LoweringState`` (the buffer-level program plus
aliases and size overrides, and after expansion the tile program). The list
says why each pass is there; ``lowering.lower`` runs it in order and records
the names in the package.
"""

from __future__ import annotations

from . import (donate_cast_buffer, eliminate_noop_copies, group_exchanges, merge_transfers, omit_padding)

# (name, stage, function, why): "program" passes rewrite buffers and steps before
# allocation; "tiles" passes rewrite the per-tile transfers after expansion.
PASSES = [
    ("eliminate_noop_copies", "program", eliminate_noop_copies.run,
     "a conversion whose every fragment stays put needs no buffer and no step: alias it"),
    ("group_exchanges", "program", group_exchanges.run,
     "independent exchanges back to back share one superstep and one sync"),
    ("donate_cast_buffer", "program", donate_cast_buffer.run,
     "a cast whose input dies there writes over it: one buffer instead of two"),
    ("omit_padding", "program", omit_padding.run,
     "block padding after a tile's last block is never read: do not allocate it"),
    ("merge_transfers", "tiles", merge_transfers.run,
     "fragments contiguous in both memories are one transfer: fewer control cycles"),
]
