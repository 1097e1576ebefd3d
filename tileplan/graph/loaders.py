"""Model loading: ``load_model(path, target=None, cast_bf16=None) -> Graph`` and
``load_model_and_params`` (the graph and the parameter values from one import).

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


def load_model(path: str | Path, target=None, *, cast_bf16: str | None = None) -> Graph:
    """Load and check a model file; ``target`` (a ``Target``) adds the target checks.

    ``cast_bf16="fp16"`` converts a bf16 ONNX or torch model to FP16 (recorded in
    ``Graph.imported``, which plan.json carries); without it bf16 is refused.
    """
    return load_model_and_params(path, target, cast_bf16=cast_bf16)[0]


def load_model_and_params(path: str | Path, target=None, *,
                          cast_bf16: str | None = None) -> tuple[Graph, dict | None]:
    """The graph and the parameter values of a model file, from one import.

    One import matters for ``model.py:factory``: the factory runs once per call (a command
    calls this once), not once for the graph and again for the weights.
    """
    path = Path(path)
    source = str(path)
    params = None
    try:
        if not path.suffix.startswith(".py:"):
            from ..safeio import regular_file
            regular_file(path, "model file")        # (a FIFO or a device is named as such, never opened)
        if path.suffix == ".toml":
            from .toml import load_toml
            graph, params = load_toml(path), None
        elif path.suffix == ".onnx":
            graph, params = _load_onnx(path, cast_bf16)
        elif path.suffix.startswith(".py:"):
            from .torch import load_python_factory
            model = load_python_factory(source, cast_bf16=cast_bf16)
            graph, params = model.graph, model.params
        else:
            raise TileplanError(f"unknown model file type {path.suffix!r} "
                                "(expected .toml, .onnx or model.py:factory)")
        if target is not None:
            check_against_target(graph, target)
    except TileplanError as exc:
        raise exc.with_source(source) from None
    except OSError as exc:
        raise TileplanError(f"cannot read it ({exc.strerror or exc})", source=source) from None
    except RecursionError:
        raise TileplanError("nested too deeply to read", source=source) from None
    return graph, params


def _load_onnx(path: Path, cast_bf16: str | None):
    try:
        from .onnx import import_onnx
    except ImportError:
        raise TileplanError("ONNX models are not supported in this installation (use a TOML model file)") from None
    model = import_onnx(path, cast_bf16=cast_bf16)
    return model.graph, model.params


def check_against_target(graph: Graph, target) -> None:
    """Errors for a graph the target cannot run at all, naming the op or tensor."""
    for op in graph.ops:
        if isinstance(op, MatMul):
            dt = graph.tensors[op.inputs[0]].dtype
            if not target.supports(dt):
                raise op.err(f"target {target.name!r} has no {dt} AMP ({dt} operands "
                             f"{op.inputs[0]!r}, {op.inputs[1]!r}); cast them or choose another target")
    capacity = target.tiles * target.usable_bytes
    for t in graph.tensors.values():
        if t.nbytes > capacity:
            raise TileplanError(f"tensor {t.name!r} {list(t.shape)} {t.dtype} needs {t.nbytes:,} B, more than "
                                f"the whole usable SRAM of target {target.name!r} ({target.tiles:,} tiles x "
                                f"{target.usable_bytes:,} B)")
    check_parameter_bytes(graph, target)
    for t in graph.tensors.values():
        if t.layout is None:
            continue
        t.layout.check(t, tiles=target.tiles)
        _verify_with_layout_module(t, target)


def check_parameter_bytes(graph: Graph, target) -> None:
    """Refuse, before planning, a model whose parameter bytes alone exceed the target's usable SRAM
    (every tile's usable bytes, over all its IPUs), naming both figures, the IPUs of the target's
    kind that would hold them and the smallest preset with that many.

    Design decision: parameters stay resident for the whole program, so no plan can hold a model
    whose parameters outweigh the SRAM; counting them costs milliseconds where planning the model
    only to be refused takes minutes. The figure is a lower bound, not a fit test: a model under it
    may still be refused by selection (activations, per-tile balance) with the op and tile named.
    IPUs needed: the parameter bytes over one IPU's usable bytes, rounded up. The preset offered
    has IPUs like the target's (same family, tiles per IPU and usable bytes per tile) and at least
    that many of them; it is a suggestion of where the bytes could fit, not a promise."""
    from .core import Role
    params = sum(t.nbytes for t in graph.tensors.values() if t.role is Role.PARAMETER)
    sram = target.tiles * target.usable_bytes
    if params <= sram:
        return
    per_ipu = target.tiles_per_ipu * target.usable_bytes
    need = -(-params // per_ipu)
    preset = _preset_with_ipus(target, need)
    hint = (f"try --target {preset}" if preset else
            f"no preset has that many: write a target file with ipus = {need} (docs/targets.md)")
    raise TileplanError(f"model {graph.name!r}: its parameters take {params:,} bytes, more than the "
                        f"{sram:,} bytes of usable SRAM of target {target.name!r} ({target.tiles:,} tiles x "
                        f"{target.usable_bytes:,} B); it needs at least {need} IPUs: {hint}")


def _preset_with_ipus(target, ipus: int) -> str | None:
    """The preset with the fewest IPUs, at least ``ipus``, each like the target's (family, tiles per
    IPU, usable bytes per tile); None when there is none."""
    from ..target import load_target, preset_names
    found = []
    for name in preset_names():
        t = load_target(name)
        if (t.family, t.tiles_per_ipu, t.usable_bytes) == (target.family, target.tiles_per_ipu,
                                                            target.usable_bytes) and t.ipus >= ipus:
            found.append((t.ipus, name))
    return min(found)[1] if found else None


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


def load_params(path: str | Path, *, cast_bf16: str | None = None) -> dict | None:
    """Parameter values a model file carries (ONNX initializers, a torch module's weights); None for TOML.

    This imports the model again: a caller that needs the graph too calls ``load_model_and_params``.
    """
    return load_model_and_params(path, cast_bf16=cast_bf16)[1]
