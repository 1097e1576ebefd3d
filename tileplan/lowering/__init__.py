"""Lowering: MidGraph -> TileProgram (allocation, passes, vertices and transfers) -> package on disk."""
