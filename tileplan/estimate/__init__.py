"""Cost estimates: the Estimate value type, coarse (vectorised) and detailed (per-tile) costing."""

from .cost import Estimate

__all__ = ["Estimate"]
