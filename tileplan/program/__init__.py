"""The fragment-program representation the planner costs and lowering expands: buffers (distributed
arrays with a layout), exchange steps of copies, compute steps of vertices (``fragments``)."""

from .fragments import (Buffer, ComputeStep, Copy, ExchangeStep, Operand, Operands, Program, Vertex,
                        alias_noop_copies, alias_root, group_exchange_steps)

__all__ = ["Buffer", "ComputeStep", "Copy", "ExchangeStep", "Operand", "Operands", "Program", "Vertex",
           "alias_noop_copies", "alias_root", "group_exchange_steps"]
