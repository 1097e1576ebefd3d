"""tileplan: a graph-level distributed tile planner and compiler for IPU-style accelerators."""

__version__ = "0.1.0"
