"""Model loading: one entry point, ``load_model(path, target=None) -> Graph``.

Dispatches on the file extension: ``.toml`` (``tileplan.graph.toml``) and ``.onnx``
(``tileplan.graph.onnx``); ``path/to/model.py:factory`` imports a torch module through
torch.export (``tileplan.graph.torch.load_python_factory``; needs the torch extra).
Every error is a ``TileplanError`` prefixed with the file path. With a ``target``
at hand (the CLI always has one) the graph is also checked against it: every
MatMul's operand type must have an AMP on the target, and pinned layouts must fit
its tiles and pass ``tileplan.layout``'s ``verify`` (``check_against_target``).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import TileplanError
from .core import Graph, MatMul


def load_model(path: str | Path, target=None) -> Graph:
    """Load and check a model file; ``target`` (a ``Target``) adds the target checks."""
    path = Path(path)
    source = str(path)
    try:
        if not path.is_file() and not path.suffix.startswith(".py:"):
            raise TileplanError("no such model file")
        if path.suffix == ".toml":
            from .toml import load_toml
            graph = load_toml(path)
        elif path.suffix == ".onnx":
            graph = _load_onnx(path)
        elif path.suffix.startswith(".py:"):
            from .torch import load_python_factory
            graph = load_python_factory(source).graph
        else:
            raise TileplanError(f"unknown model file type {path.suffix!r} "
                                "(expected .toml, .onnx or model.py:factory)")
        if target is not None:
            check_against_target(graph, target)
    except TileplanError as exc:
        raise exc.with_source(source) from None
    return graph


def _load_onnx(path: Path) -> Graph:
    try:
        from .onnx import from_onnx
    except ImportError:
        raise TileplanError("ONNX models are not supported in this installation (use a TOML model file)") from None
    return from_onnx(path)


def check_against_target(graph: Graph, target) -> None:
    """Errors for a graph the target cannot run at all, naming the op or tensor."""
    for op in graph.ops:
        if isinstance(op, MatMul):
            dt = graph.tensors[op.inputs[0]].dtype
            if not target.supports(dt):
                raise op.err(f"target {target.name!r} has no {dt} AMP ({dt} operands "
                             f"{op.inputs[0]!r}, {op.inputs[1]!r}); cast them or choose another target")
    for t in graph.tensors.values():
        if t.layout is None:
            continue
        t.layout.check(t, tiles=target.tiles)
        _verify_with_layout_module(t, target)


def _verify_with_layout_module(tensor, target) -> None:
    """Also run ``tileplan.layout``'s own ``verify`` once that module provides it."""
    try:
        layout = tensor.layout.to_layout()
    except (ImportError, AttributeError):
        return                               # the layout module is not there yet
    verify = getattr(layout, "verify", None)
    if verify is None:
        return
    try:
        verify(tensor.shape, tensor.dtype, target)
    except TileplanError as exc:
        raise TileplanError(f"tensor {tensor.name!r}: {exc}") from None


def load_params(path: str | Path) -> dict | None:
    """Parameter values a model file carries (ONNX initializers, a torch module's weights); None for TOML."""
    path = Path(path)
    source = str(path)
    try:
        if path.suffix == ".onnx":
            from .onnx import load_onnx_params
            return load_onnx_params(path)
        if path.suffix.startswith(".py:"):
            from .torch import load_python_factory
            return load_python_factory(source).params
    except TileplanError as exc:
        raise exc.with_source(source) from None
    return None
