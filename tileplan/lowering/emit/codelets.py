"""Codelet files and the codelet manifest of a ``TileProgram``.

Every vertex group of every compute set names its kernel variant
(``group.variant``, looked up in the registry; dispatched again only when the
registry lacks it) and its call. ``variant.codelet(call)`` gives the
specialisation: one C++ file per codelet key serves every shape (shapes are
vertex fields), so the package holds one ``codelets/<key>.cpp`` per key used
anywhere in the program.

``codelet_manifest`` says, per compute-set group, which vertex class runs with
which field values (vector lengths, shape and scale parameters). ``host.cpp``
is written from it and the tests run each entry's codelet on sample data.
"""

from __future__ import annotations

from typing import Any, Iterator

from ...errors import TileplanError
from ...kernels import CodeletSource, Registry, default_registry, dispatch
from ...kernels.codelets import Field
from ..tile_program import ComputeSet, TileProgram, VertexGroup

CODELET_DIR = "codelets"


def codelet_path(source: CodeletSource) -> str:
    """The package-relative file of a codelet: ``codelets/<key>.cpp``."""
    return f"{CODELET_DIR}/{source.filename}"


def group_codelet(group: VertexGroup, target, registry: Registry | None = None,
                  memo: dict | None = None) -> CodeletSource:
    """The codelet a vertex group runs, checked against the group's operand byte sizes. ``memo``: a
    dict the caller keeps for one target and registry; the codelet depends only on the group's call,
    variant and operand sizes, so a tower's 27 layers render each once."""
    if memo is None:
        return _group_codelet(group, target, registry)
    key = (group.call, group.variant, tuple(group.in_bytes), tuple(group.out_bytes))
    got = memo.get(key)
    if got is None:
        got = memo[key] = _group_codelet(group, target, registry)
    return got


def _group_codelet(group: VertexGroup, target, registry: Registry | None) -> CodeletSource:
    registry = default_registry() if registry is None else registry
    variant = registry[group.variant] if group.variant in registry else dispatch(group.call, target,
                                                                                 registry=registry)
    source = variant.codelet(group.call)
    for what, fields, sizes in (("input", source.inputs, group.in_bytes), ("output", source.outputs, group.out_bytes)):
        have = tuple(field_bytes(f) for f in fields)
        if have != tuple(sizes):
            raise TileplanError(f"{group.call} ({variant.name}): the codelet's {what} fields "
                                f"{', '.join(f.name for f in fields)} hold {have} bytes but the tile program's "
                                f"operands are {tuple(sizes)} bytes")
    return source


def field_bytes(field: Field) -> int:
    """Bytes of a vector field for its call (FP8 and raw bytes are one byte an element)."""
    return int(field.size) * (field.dtype.itemsize if field.dtype is not None else 1)


def compute_groups(tile_program: TileProgram) -> Iterator[tuple[int, ComputeSet, int, VertexGroup]]:
    """(step index, compute set, group index, group) for every group, in program order."""
    for si, step in enumerate(tile_program.steps):
        if isinstance(step, ComputeSet):
            for gi, group in enumerate(step.groups):
                yield si, step, gi, group


def emit_codelets(tile_program: TileProgram, target, registry: Registry | None = None) -> dict[str, str]:
    """``{"codelets/<key>.cpp": C++ source}``: one file per specialisation used, sorted by name."""
    files: dict[str, str] = {}
    memo: dict = {}
    for _, step, _, group in compute_groups(tile_program):
        source = group_codelet(group, target, registry, memo)
        path = codelet_path(source)
        if files.setdefault(path, source.source) != source.source:
            raise TileplanError(f"codelet key {source.key!r} names two different sources "
                                f"(seen again in compute set {step.name!r} for {group.call})")
    return {path: files[path] for path in sorted(files)}


def codelet_manifest(tile_program: TileProgram, target, registry: Registry | None = None) -> list[dict[str, Any]]:
    """One entry per compute-set group, in program order: where it runs and with which vertex.

    Each entry: ``step`` (index into ``tile_program.steps``), ``compute_set``,
    ``group``, ``call`` (one line), ``primitive``, ``variant``, ``key``,
    ``file``, ``vertex`` (the C++ class), ``vertices`` and ``tiles`` (how many
    vertices, on how many distinct tiles) and ``fields``: every vertex field in
    declaration order with ``name``, ``direction``, ``ctype`` and either
    ``size`` (elements of a vector field) or ``value`` (a parameter).
    """
    import numpy as np
    entries = []
    for si, step, gi, group in compute_groups(tile_program):
        source = group_codelet(group, target, registry)
        fields = []
        for f in source.fields:
            entry = {"name": f.name, "direction": f.direction, "ctype": f.ctype}
            entry.update({"size": int(f.size)} if f.is_vector else {"value": int(f.value)})
            fields.append(entry)
        entries.append({"step": si, "compute_set": step.name, "group": gi, "call": str(group.call),
                        "primitive": group.call.primitive, "variant": group.variant, "key": source.key,
                        "file": codelet_path(source), "vertex": source.vertex, "vertices": int(len(group.tile)),
                        "tiles": int(np.unique(group.tile).size), "fields": fields})
    return entries
