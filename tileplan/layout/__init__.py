"""The layout vocabulary and conversions between layouts.

A ``Layout`` says, for one tensor, which tile holds which elements and in which
local format; ``owner_map`` gives that as numpy intervals (``OwnerMap``), and
``plan_copy``/``convert`` give the ``CopyPlan`` between two layouts.
"""

from .convert import CopyPlan, PairTraffic, convert, gather, plan_copy, scatter
from .layouts import (Blocks, Explicit, Imported, Intervals, Layout, Packed, PackedPanels, Permuted, Stored, WholeRows,
                      Window,
                      balanced_bounds,
                      rows_cols)
from .split_rows import SplitRows
from .owner_map import LOCAL_FORMATS, LayoutError, OwnerMap, TileIntervals

__all__ = ["Blocks", "CopyPlan", "Explicit", "Imported", "Intervals", "LOCAL_FORMATS", "Layout", "LayoutError",
           "OwnerMap", "Packed", "PackedPanels", "PairTraffic", "Permuted", "SplitRows", "Stored", "TileIntervals", "WholeRows", "Window", "balanced_bounds", "convert",
           "gather", "plan_copy", "rows_cols", "scatter"]
