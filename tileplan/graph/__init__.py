"""Model graphs: tensors, ops, dtypes and loaders (TOML, ONNX, torch.export)."""

from .core import Add, Cast, GeLU, Graph, MatMul, Op, OP_KINDS, Role, Tensor
from .dtypes import DType, dequantise, quantise

__all__ = ["Add", "Cast", "DType", "GeLU", "Graph", "MatMul", "Op", "OP_KINDS", "Role", "Tensor",
           "dequantise", "quantise", "load_model"]


def load_model(path):
    """Load a model file by extension (.toml; .onnx when the importer exists)."""
    from .loaders import load_model as _load
    return _load(path)
