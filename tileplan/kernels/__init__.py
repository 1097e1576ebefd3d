"""Tile kernels: calls, the variant registry, cycle formulas, numpy semantics and
Poplar codelets.

Typical use (planner, estimates, lowering, the IPU model)::

    from tileplan.kernels import MatMulCall, dispatch
    variant = dispatch(call, target)            # the fastest accepted variant
    variant.cycles(call, target)                # int, one tile-level call
    variant.reference(call, a, b)               # numpy semantics on tile buffers
    variant.codelet(call)                       # CodeletSource: key, vertex, source, fields
"""

from __future__ import annotations

from typing import Any

from ..target import Target
from .calls import (BiasGeLUCall, Call, CastCall, CopyCall, GeLUCall, MatMulCall, PackCall, ReduceCall,
                    UnpackCall)
from .codelets import CodeletSource, Field
from .gather import GatherCall
from .pointwise import BinaryCall, UnaryCall
from .rearrange import TransposeCall
from .layernorm import LayerNormApplyCall, LayerNormCall, MomentsCombineCall, RowMomentsCall
from .rowreduce import RowReduceCall, RowReduceCombineCall, RowReducePartialCall
from .softmax import SoftmaxApplyCall, SoftmaxCall, SoftmaxCombineCall, SoftmaxPartialCall
from .registry import NoVariantError, Predicate, Registry, Variant
from .variants import DEFAULT_REGISTRY, build_default_registry

CALL_CLASSES = (MatMulCall, ReduceCall, BinaryCall, UnaryCall, GeLUCall, BiasGeLUCall, CastCall, PackCall,
                UnpackCall, CopyCall, LayerNormCall, RowMomentsCall, MomentsCombineCall, LayerNormApplyCall,
                SoftmaxCall, SoftmaxPartialCall, SoftmaxCombineCall, SoftmaxApplyCall, RowReduceCall,
                RowReducePartialCall, RowReduceCombineCall, TransposeCall, GatherCall)
"""Every call record, for reading tile programs back (``primitive`` -> class)."""


def default_registry() -> Registry:
    """The registry of every built-in variant (shared; use ``.copy()``/``.without()`` to vary it)."""
    return DEFAULT_REGISTRY


def dispatch(call: Any, target: Target, force: str | None = None, registry: Registry | None = None) -> Variant:
    """The fastest variant accepting ``call`` on ``target`` (or the forced one)."""
    return (DEFAULT_REGISTRY if registry is None else registry).dispatch(call, target, force)


__all__ = ["BinaryCall", "BiasGeLUCall", "CALL_CLASSES", "Call", "CastCall", "CodeletSource", "CopyCall", "Field", "GatherCall", "GeLUCall",
           "MatMulCall", "NoVariantError", "PackCall", "Predicate", "ReduceCall", "Registry", "TransposeCall", "UnaryCall", "UnpackCall",
           "Variant", "build_default_registry", "default_registry", "dispatch",
           "LayerNormApplyCall", "LayerNormCall", "MomentsCombineCall", "RowMomentsCall", "RowReduceCall",
           "RowReduceCombineCall", "RowReducePartialCall", "SoftmaxApplyCall", "SoftmaxCall", "SoftmaxCombineCall",
           "SoftmaxPartialCall"]
