"""TOML model files: a small, readable format for model graphs.

A model file has three parts::

    [model]
    name = "mlp_smoke_fp8"
    target = "ipu21-64"        # optional: the default target (preset name or target TOML path,
                               #   relative to this file)
    outputs = ["y"]            # optional: default = tensors no op consumes, plus any tensor
                               #   declared with role "output"
    description = "..."        # optional, free text

    [tensors]                  # graph inputs and parameters; optionally op outputs (to pin them)
    x  = { shape = [96, 144], dtype = "fp16", role = "input" }
    w1 = { shape = [144, 288], dtype = "fp8", role = "parameter", scale = 1 }

    [[ops]]                    # one table per op, in any order (they are sorted topologically)
    name = "fc1"
    op = "matmul"              # matmul | add | gelu | cast
    inputs = ["x8", "w1"]
    output = "h"

Tensor keys: ``shape`` (list of positive integers) and ``dtype`` (``fp32``, ``fp16``,
``fp8``) are required; ``role`` (``input``, ``parameter``, ``intermediate``,
``output``) is required for tensors no op produces and defaults to ``intermediate``
for op outputs; ``scale`` (an integer power-of-two exponent, FP8 only, default 0);
``layout`` (an explicit boundary layout, below).

Op keys: ``name``, ``op``, ``inputs``, ``output`` are required. An op output need not
be declared in ``[tensors]``: its shape and dtype are inferred. An op may instead
give ``dtype`` and ``scale`` for its output inline (for example a matmul's FP32
partials, or a cast's target type). A ``cast`` must say what it casts to: either
``dtype`` inline or its output declared in ``[tensors]``. Per-kind options:
``transpose_a``/``transpose_b`` (matmul, booleans), ``approximate = "tanh" | "erf"``
(gelu, default ``tanh``), ``saturate = false`` (cast to FP8: out-of-range values become NaN
instead of +-240), ``axis`` and ``softmax_scale`` (softmax: ``softmax(softmax_scale * x)``, attention's
``1/sqrt(d)`` folded in; positive, default 1).

Layouts (``layout = {...}`` on a tensor) pin the tensor's boundary layout:

- ``{ kind = "rows", owners = 64 }``: whole rows over ``owners`` tiles;
- ``{ kind = "intervals", owners = 64, align = 8 }``: flat element intervals with
  ``align``-byte boundaries (``align`` defaults to 8);
- ``{ kind = "explicit", intervals = [[tile, start, stop], ...] }``: flat row-major
  element ranges ``[start, stop)`` on the given tiles, covering the tensor exactly once.

Two optional tables set planning inputs: ``[pin]`` (GEMM grids, ``graph.pins``) and
``[plan]``, whose ``weights = "planner" | "compact"`` says how parameters are stored
(``"planner"``, the default: selection may pre-arrange a GEMM's weights as its grid reads
them; ``"compact"``: every weight stays in its compact resident storage). The command
line's ``--pin`` and ``--weights`` win over them.

Every key is checked: an unknown key, a value of the wrong type or a missing
required key is an error naming the table it is in. Errors are ``TileplanError``;
the loader (``tileplan.graph.loaders``) prefixes them with the file path.
"""

from __future__ import annotations

import difflib
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import checked
from ..errors import TileplanError
from .core import OP_KINDS, Graph, Op, Role, Tensor, check_weights
from .dtypes import DType

# ---- explicit boundary layouts ---------------------------------------------------

LAYOUT_KINDS = {
    # kind -> (required keys, optional keys with defaults)
    "rows": ({"owners"}, {}),
    "intervals": ({"owners"}, {"align": 8}),
    "explicit": ({"intervals"}, {}),
}


@dataclass(frozen=True)
class LayoutSpec:
    """A boundary layout as the model file states it, before the layout module builds it.

    ``owners``/``align`` are set for ``rows`` and ``intervals``; ``intervals`` holds
    ``(tile, start, stop)`` triples of flat element ranges for ``explicit``.
    """

    kind: str
    owners: int | None = None
    align: int | None = None
    intervals: tuple[tuple[int, int, int], ...] = ()

    def __str__(self) -> str:
        if self.kind == "rows":
            return f"Rows({self.owners})"
        if self.kind == "intervals":
            return f"Intervals({self.owners}, align={self.align})"
        tiles = len({t for t, _, _ in self.intervals})
        return f"Explicit({len(self.intervals)} intervals on {tiles} tiles)"

    def to_layout(self):
        """The ``tileplan.layout`` object for this spec (imported lazily)."""
        from .. import layout

        if self.kind == "rows":
            return layout.WholeRows(self.owners)
        if self.kind == "intervals":
            return layout.Intervals(self.owners, align=self.align)
        return layout.Explicit(intervals=self.intervals)

    def check(self, tensor: Tensor, tiles: int | None = None) -> None:
        """Check the spec against its tensor (and the target's tile count, when known).

        ``rows``/``intervals`` need ``owners <= tiles`` (a tensor too small for its
        owners gets fewer, as ``tileplan.layout`` builds them). Explicit intervals must cover ``[0, tensor.size)`` exactly once, each
        non-empty, on tiles ``0 <= tile < tiles``. Vectorised: sort by start, then
        compare each start with the previous stop.
        """
        where = f"tensor {tensor.name!r}: {self.kind} layout"
        if self.kind in ("rows", "intervals") and tiles is not None and self.owners > tiles:
            raise TileplanError(f"{where} has {self.owners} owners but the target has {tiles} tiles")
        if self.kind != "explicit":
            return
        iv = np.asarray(self.intervals, dtype=np.int64).reshape(-1, 3)
        tile, start, stop = iv[:, 0], iv[:, 1], iv[:, 2]
        bad = np.flatnonzero(tile < 0 if tiles is None else (tile < 0) | (tile >= tiles))
        if bad.size:
            i = int(bad[0])
            limit = "" if tiles is None else f" (the target has tiles 0..{tiles - 1})"
            raise TileplanError(f"{where}: interval {i} {iv[i].tolist()} is on tile {int(tile[i])}{limit}")
        bad = np.flatnonzero((start < 0) | (stop <= start) | (stop > tensor.size))
        if bad.size:
            i = int(bad[0])
            raise TileplanError(f"{where}: interval {i} {iv[i].tolist()} is not a non-empty range "
                                f"within the tensor's {tensor.size} elements")
        order = np.argsort(start, kind="stable")
        s, e = start[order], stop[order]
        # Boundaries between consecutive sorted intervals: previous stop vs next start.
        prev_stop = np.concatenate(([0], e[:-1]))
        gap = np.flatnonzero(s > prev_stop)
        overlap = np.flatnonzero(s < prev_stop)
        problems = []
        if gap.size:
            i = int(gap[0])
            problems.append((int(prev_stop[i]), f"elements [{int(prev_stop[i])}, {int(s[i])}) are not covered"))
        if overlap.size:
            i = int(overlap[0])
            problems.append((int(s[i]), f"elements [{int(s[i])}, {int(min(prev_stop[i], e[i]))}) "
                                        "are covered more than once"))
        if int(e.max()) < tensor.size and not problems:
            problems.append((int(e.max()), f"elements [{int(e.max())}, {tensor.size}) are not covered"))
        if problems:
            _, first = min(problems)
            raise TileplanError(f"{where} does not cover the tensor's {tensor.size} elements exactly once: {first}")


# ---- reading values ---------------------------------------------------------------

def _did_you_mean(key: str, known) -> str:
    close = difflib.get_close_matches(key, list(known), n=1)
    return f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(sorted(known))})"


def _check_keys(table: dict, where: str, required: set[str], optional: set[str]) -> None:
    known = required | optional
    for key in table:
        if key not in known:
            raise TileplanError(f"{where}: unknown key {key!r}{_did_you_mean(key, known)}")
    missing = sorted(required - set(table))
    if missing:
        raise TileplanError(f"{where}: missing required key{'s' if len(missing) > 1 else ''} "
                            f"{', '.join(repr(m) for m in missing)}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _str(v: Any, where: str, key: str) -> str:
    if not isinstance(v, str) or not v:
        raise TileplanError(f"{where}: {key} must be a non-empty string, got {v!r}")
    return v


def _int(v: Any, where: str, key: str) -> int:
    if not _is_int(v):
        raise TileplanError(f"{where}: {key} must be an integer, got {v!r}")
    return v


def _bool(v: Any, where: str, key: str) -> bool:
    if not isinstance(v, bool):
        raise TileplanError(f"{where}: {key} must be true or false, got {v!r}")
    return v


def _number(v: Any, where: str, key: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TileplanError(f"{where}: {key} must be a number, got {v!r}")
    return float(v)


def _int_list(v: Any, where: str, key: str) -> tuple[int, ...]:
    if not isinstance(v, list) or not all(_is_int(d) for d in v):
        raise TileplanError(f"{where}: {key} must be a list of integers, got {v!r}")
    return tuple(v)


def _names(v: Any, where: str, key: str) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(s, str) and s for s in v):
        raise TileplanError(f"{where}: {key} must be a list of tensor names, got {v!r}")
    return tuple(v)


def _table(v: Any, where: str) -> dict:
    if not isinstance(v, dict):
        raise TileplanError(f"{where} must be a table, got {v!r}")
    return v


def _dtype(v: Any, where: str) -> DType:
    try:
        return DType.parse(_str(v, where, "dtype"))
    except ValueError as exc:
        raise TileplanError(f"{where}: {exc}") from None


def _shape(v: Any, where: str) -> tuple[int, ...]:
    if not isinstance(v, list) or not v or not all(_is_int(d) for d in v):
        raise TileplanError(f"{where}: shape must be a non-empty list of integers, got {v!r}")
    for d in v:
        if d == 0:
            raise TileplanError(f"{where}: shape {v} has a zero dimension (dimensions must be positive)")
        if d < 0:
            raise TileplanError(f"{where}: shape {v} has a negative dimension (dimensions must be positive)")
    return tuple(v)


def _scale(v: Any, where: str, dtype: DType) -> int:
    scale = _int(v, where, "scale")
    if dtype is not DType.FP8 and scale != 0:
        raise TileplanError(f"{where}: scale {scale} given for a {dtype} tensor; scales apply to fp8 only")
    return scale


def _layout(v: Any, where: str) -> LayoutSpec:
    where = f"{where}: layout"
    v = _table(v, where)
    kind = _str(v.get("kind"), where, "kind") if "kind" in v else None
    if kind not in LAYOUT_KINDS:
        raise TileplanError(f"{where}: kind must be one of {', '.join(LAYOUT_KINDS)}, got {kind!r}")
    required, optional = LAYOUT_KINDS[kind]
    _check_keys(v, f"{where} {kind!r}", required | {"kind"}, set(optional))
    if kind == "explicit":
        iv = v["intervals"]
        if (not isinstance(iv, list) or not iv
                or not all(isinstance(r, list) and len(r) == 3 and all(_is_int(x) for x in r) for r in iv)):
            raise TileplanError(f"{where}: intervals must be a non-empty list of [tile, start, stop] "
                                f"integer triples")
        return LayoutSpec(kind, intervals=tuple(tuple(r) for r in iv))
    owners = _int(v["owners"], where, "owners")
    if owners <= 0:
        raise TileplanError(f"{where}: owners must be positive, got {owners}")
    align = None
    if kind == "intervals":
        align = _int(v.get("align", optional["align"]), where, "align")
        if align <= 0 or align & (align - 1):
            raise TileplanError(f"{where}: align must be a positive power of two (bytes), got {align}")
    return LayoutSpec(kind, owners=owners, align=align)


# ---- the model file ------------------------------------------------------------

TOP_KEYS = ("model", "tensors", "ops", "pin", "plan")
MODEL_KEYS = (set(), {"name", "target", "outputs", "description"})
PLAN_KEYS = (set(), {"weights"})          # [plan]: planning options the model file sets (the command line's win)
TENSOR_KEYS = ({"shape", "dtype"}, {"role", "scale", "layout"})
OP_KEYS = ({"name", "op", "inputs", "output"}, {"dtype", "scale"})
OP_OPTIONS = {"matmul": {"transpose_a": _bool, "transpose_b": _bool},
              "gelu": {"approximate": _str},
              "reshape": {"shape": lambda v, where, key: _shape(v, f"{where}: {key}")},
              "transpose": {"perm": lambda v, where, key: _int_list(v, where, key)},
              "layernorm": {"epsilon": lambda v, where, key: _number(v, where, key)},
              "softmax": {"axis": _int, "softmax_scale": lambda v, where, key: _number(v, where, key)},
              "cast": {"saturate": _bool},
              "slice": {"axis": _int, "start": _int, "stop": _int, "step": _int},
              "concat": {"axis": _int},
              **{k: {"keepdims": _bool} for k in ("reducesum", "reducemean", "reducemax")}}


@dataclass(frozen=True)
class _OpEntry:
    """One ``[[ops]]`` table, parsed: the op plus its inline output dtype/scale."""

    op: Op
    dtype: DType | None
    scale: int | None


def parse_model(doc: dict, *, name: str = "model", base_dir: Path | None = None) -> Graph:
    """Build a ``Graph`` from a parsed TOML document (errors carry no file prefix).

    ``name`` is the model name when ``[model]`` gives none (the loader passes the
    file stem); ``base_dir`` resolves a relative target file path.
    """
    for key in doc:
        if key not in TOP_KEYS:
            raise TileplanError(f"unknown top-level key {key!r}{_did_you_mean(key, TOP_KEYS)}")
    for key, how in (("model", "[model]"), ("tensors", "[tensors]"), ("ops", "[[ops]]")):
        if key not in doc:
            raise TileplanError(f"missing the {how} table")
    model = _table(doc["model"], "[model]")
    _check_keys(model, "[model]", *MODEL_KEYS)
    name = _str(model.get("name", name), "[model]", "name")
    if "description" in model:
        _str(model["description"], "[model]", "description")
    target = _target(model, base_dir)

    tensors_doc = _table(doc["tensors"], "[tensors]")
    ops_doc = doc["ops"]
    if not isinstance(ops_doc, list) or not all(isinstance(o, dict) for o in ops_doc):
        raise TileplanError("ops must be an array of tables ([[ops]])")
    entries = [_op(o, i) for i, o in enumerate(ops_doc)]

    seen_ops: dict[str, int] = {}
    producers: dict[str, Op] = {}
    for i, e in enumerate(entries):
        if e.op.name in seen_ops:
            raise TileplanError(f"op name {e.op.name!r} is used twice ([[ops]] entries "
                                f"{seen_ops[e.op.name]} and {i})")
        seen_ops[e.op.name] = i
        if e.op.output in producers:
            raise e.op.err(f"output {e.op.output!r} is already produced by op {producers[e.op.output].name!r}")
        producers[e.op.output] = e.op

    declared = [_tensor(n, t, producers) for n, t in tensors_doc.items()]
    table = {t.name: t for t in declared}
    for e in entries:
        if e.dtype is None and e.scale is None:
            if e.op.kind == "cast" and e.op.output not in table:
                raise e.op.err(f"give the output dtype (dtype = \"fp8\" ...) or declare {e.op.output!r} "
                               "in [tensors]: a cast must say what it casts to")
            continue
        if e.op.output in table:
            raise TileplanError(f"tensor {e.op.output!r} is declared twice: in [tensors] and inline "
                                f"(dtype/scale) in op {e.op.name!r}")

    inline = _inline_outputs(entries, table)
    outputs = _outputs(model, entries, table)
    from .pins import pins_from_table         # the [pin] table: GEMM grids (planner.pins applies them)
    pins = pins_from_table(doc.get("pin", {}), "[pin]")
    options = _table(doc.get("plan", {}), "[plan]")
    _check_keys(options, "[plan]", *PLAN_KEYS)
    weights = check_weights(options["weights"], "[plan] weights") if "weights" in options else None
    graph = Graph.build(name, declared + inline, [e.op for e in entries], outputs=outputs, target=target, pins=pins,
                        weights=weights)
    for t in graph.tensors.values():
        if t.layout is not None:
            t.layout.check(t)
    return graph


def _target(model: dict, base_dir: Path | None) -> str | None:
    if "target" not in model:
        return None
    from ..target import load_target

    spec = _str(model["target"], "[model]", "target")
    # Kept as written (a preset name, or a path relative to the model file), so the graph does not
    # depend on the working directory; ``load_target(spec, base_dir=...)`` resolves it.
    load_target(spec, base_dir=base_dir)     # an unknown or broken target is an error of this file
    return spec


def _tensor(name: str, v: Any, producers: dict[str, Op]) -> Tensor:
    where = f"tensor {name!r}"
    v = _table(v, where)
    required, optional = TENSOR_KEYS
    if name not in producers:
        required = required | {"role"}
    _check_keys(v, where, required, optional - required)
    shape = _shape(v["shape"], where)
    dtype = _dtype(v["dtype"], where)
    role_text = _str(v.get("role", "intermediate"), where, "role")
    try:
        role = Role(role_text)
    except ValueError:
        raise TileplanError(f"{where}: role must be one of {', '.join(r.value for r in Role)}, "
                            f"got {role_text!r}") from None
    scale = _scale(v.get("scale", 0), where, dtype)
    layout = _layout(v["layout"], where) if "layout" in v else None
    return Tensor(name, shape, dtype, role, scale, layout)


def _op(v: dict, index: int) -> _OpEntry:
    where = f"[[ops]] entry {index}"
    if isinstance(v.get("name"), str) and v["name"]:
        where = f"op {v['name']!r}"
    if "op" not in v:
        raise TileplanError(f"{where}: missing required key 'op' (one of {', '.join(OP_KINDS)})")
    kind = v["op"]
    if not isinstance(kind, str) or kind not in OP_KINDS:
        raise TileplanError(f"{where}: unknown op {kind!r} (known: {', '.join(OP_KINDS)})")
    options = OP_OPTIONS.get(kind, {})
    for key in v:
        owners = [other for other, other_options in OP_OPTIONS.items() if key in other_options]
        if owners and key not in options:
            raise TileplanError(f"{where}: key {key!r} applies to {', '.join(owners)} ops, not {kind}")
    required, optional = OP_KEYS
    _check_keys(v, where, required, optional | set(options))
    name = _str(v["name"], where, "name")
    where = f"op {name!r} ({kind})"
    inputs = _names(v["inputs"], where, "inputs")
    output = _str(v["output"], where, "output")
    cls = OP_KINDS[kind]
    problem = cls.arity_problem(inputs)
    if problem:
        raise TileplanError(f"{where}: {problem}")
    extra = {k: parse(v[k], where, k) for k, parse in options.items() if k in v}
    op = cls(name=name, inputs=inputs, output=output, **extra)
    dtype = _dtype(v["dtype"], where) if "dtype" in v else None
    scale = _int(v["scale"], where, "scale") if "scale" in v else None
    return _OpEntry(op, dtype, scale)


def _inline_outputs(entries: list[_OpEntry], table: dict[str, Tensor]) -> list[Tensor]:
    """Tensors for op outputs given inline (dtype/scale): infer their shapes upstream.

    Unknown inputs and cycles are left for ``Graph.build`` to report: this only
    returns what it can resolve.
    """
    by_output = {e.op.output: e for e in entries}
    known: dict[str, Tensor] = dict(table)
    visiting: set[str] = set()

    def resolve(name: str) -> Tensor | None:
        if name in known:
            return known[name]
        e = by_output.get(name)
        if e is None or name in visiting:
            return None
        visiting.add(name)
        ins = [resolve(i) for i in e.op.inputs]
        visiting.discard(name)
        if any(t is None for t in ins):
            return None
        shape, dtype = e.op.infer(ins)
        dtype = e.dtype or dtype
        scale = 0
        if e.scale is not None:
            scale = _scale(e.scale, f"op {e.op.name!r} ({e.op.kind}), output {name!r}", dtype)
        known[name] = Tensor(name, tuple(shape), dtype, Role.INTERMEDIATE, scale)
        return known[name]

    out = []
    for e in entries:
        if e.dtype is not None or e.scale is not None:
            t = resolve(e.op.output)
            if t is not None:
                out.append(t)
    return out


def _outputs(model: dict, entries: list[_OpEntry], table: dict[str, Tensor]) -> list[str] | None:
    """Graph outputs: [model] outputs, else unconsumed op outputs plus role-"output" tensors."""
    flagged = [n for n, t in table.items() if t.role is Role.OUTPUT]
    if "outputs" in model:
        outputs = list(_names(model["outputs"], "[model]", "outputs"))
        if not outputs:
            raise TileplanError("[model]: outputs must name at least one tensor")
        for n in flagged:
            if n not in outputs:
                raise TileplanError(f"tensor {n!r} has role 'output' but is not in [model] outputs {outputs}")
        return outputs
    consumed = {i for e in entries for i in e.op.inputs}
    unconsumed = [e.op.output for e in entries if e.op.output not in consumed]
    return unconsumed + [n for n in flagged if n not in unconsumed] or None


def load_toml(path: str | Path) -> Graph:
    """Read and check a TOML model file (errors without the file prefix; see loaders)."""
    from ..safeio import LIMITS, read_file
    path = Path(path)
    text = read_file(path, LIMITS["model_toml"], "model file")
    try:
        doc = tomllib.loads(text.decode())
    except tomllib.TOMLDecodeError as exc:
        raise TileplanError(f"malformed TOML: {exc}") from None
    except UnicodeDecodeError:
        raise TileplanError("malformed TOML: the file is not UTF-8 text") from None
    except RecursionError:
        raise TileplanError("malformed TOML: arrays or tables nested too deeply") from None
    return parse_model(doc, name=checked.printable(path.stem), base_dir=path.parent)   # (see onnx._read)
