"""ONNX import (and export of tileplan graphs as ONNX twins).

``import_onnx(path_or_model) -> OnnxModel(graph, params)`` reads an ONNX file (or
an ``onnx.ModelProto``) with the ``onnx`` package alone (no onnxruntime), runs
ONNX shape inference, and builds a ``Graph`` of ``tileplan.graph.core`` ops.
``from_onnx`` returns just the graph, ``load_onnx_params`` just the parameter
values. ``params`` maps every parameter tensor's name to its stored values in
the tensor's own dtype (``np.float32``, ``np.float16`` or
``ml_dtypes.float8_e4m3fnuz``; an FP8 value ``q`` stands for ``q * 2**scale``).

What maps to what:

- graph inputs -> role ``input``; initializers and ``Constant`` nodes read by a
  kept op -> role ``parameter`` (a 0-d constant becomes shape ``[1]``, which
  broadcasts the same); graph outputs -> role ``output``.
- ``MatMul`` -> MatMul (numpy semantics, batched, broadcast batch dimensions;
  either operand an activation or a parameter).
- ``Gemm`` -> MatMul with ``transA``/``transB`` as its transpose flags, named after
  the node, writing ``<Y>.matmul``; plus, with a bias ``C``, an Add named
  ``<node>.bias`` writing ``Y``. ``alpha != 1`` is folded into the values of B
  (or A) when that operand is an initializer read by this node only; ``beta != 1``
  likewise into C. Otherwise the node is refused (tileplan has no scalar
  multiply): the error names the node.
- ``Add`` -> Add (numpy broadcasting).
- ``Gelu`` (opset 20) -> GeLU: ``approximate="none"`` is the erf form,
  ``"tanh"`` the tanh form.
- The GeLU subgraphs exporters emit below opset 20 fuse back into one GeLU:
  erf: ``0.5 * x * (1 + Erf(x / 1.4142135))`` (or ``x * 0.70710677``), in any
  association and operand order of the Muls; tanh:
  ``0.5 * x * (1 + Tanh(0.7978846 * (x + 0.044715 * x**3)))`` with ``Pow(x, 3)``
  or ``x * x * x``. Constants match within a relative 2e-3 (FP16 constants
  pass); every intermediate value must have no consumer outside the pattern
  and not be a graph output, otherwise the nodes stay and are refused as
  unsupported ops. The fused GeLU is named after the pattern's last node.
- ``Cast`` to FLOAT, FLOAT16 or FLOAT8E4M3FNUZ -> Cast (FP8 casts saturate).
- ``Identity`` is dropped (its consumers read its input; an Identity that
  writes a graph output renames its input's producer's output instead).
- ``Transpose`` that swaps the last two axes and is read only as MatMul or Gemm
  operands folds into their transpose flags (the parameter keeps its name and
  values); any other Transpose of an initializer is folded into new values
  (a parameter named after the Transpose's output); any other Transpose is
  refused.
- Anything else: one ``TileplanError`` naming the node (its name, or
  ``<OpType>_<index>`` for an unnamed node) and its op type.

Dtypes: FLOAT -> fp32, FLOAT16 -> fp16, FLOAT8E4M3FNUZ -> fp8; anything else is
an error naming the tensor. Every input must have a static shape (tileplan plans
static shapes): a symbolic or missing dimension is an error naming the tensor.

tileplan conventions ONNX has no words for, carried in ``metadata_props``:

- ``tileplan.scale.<tensor>`` = ``"<int>"``: the FP8 power-of-two scale exponent
  of an FP8 input, parameter or Cast output (default 0).
- ``tileplan.target`` = ``"<preset>"``: the model's default target.
- ONNX's MatMul does not admit FP8 operands, nor an output type other than its
  inputs'. tileplan reads a MatMul on FLOAT8E4M3FNUZ operands as the AMP's FP8
  GEMM with an FP16 result, and honours an output type declared in
  ``value_info`` (FP16 operands with an FLOAT output: FP32 partials). Such files
  pass ``onnx.checker.check_model`` but not its ``full_check``. ``to_onnx``
  writes them this way.

The graph is named ``name`` if given, else after the file stem, else after the
ONNX graph's name.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import TileplanError
from .core import Add, Cast, GeLU, Graph, MatMul, Op, Role, Tensor
from .dtypes import DType, dequantise, quantise

SUPPORTED = "tileplan imports MatMul, Gemm, Add, Gelu, Cast and the GeLU subgraphs"
SCALE_KEY = "tileplan.scale."
TARGET_KEY = "tileplan.target"
CONSTANT_RTOL = 2e-3        # relative tolerance when matching GeLU subgraph constants
OPSET = 20                  # Gelu appears in opset 20


@dataclass(frozen=True)
class OnnxModel:
    """An imported ONNX model: the graph and every parameter's stored values."""

    graph: Graph
    params: dict[str, np.ndarray]


def import_onnx(path_or_model: Any, *, name: str | None = None) -> OnnxModel:
    """Read an ONNX file or ``onnx.ModelProto`` into a graph and its parameter values."""
    model, source, default_name = _read(path_or_model)
    try:
        return _Importer(model, name or default_name).run()
    except TileplanError as exc:
        raise exc.with_source(source) from None


def from_onnx(path_or_model: Any, *, name: str | None = None) -> Graph:
    """The ``Graph`` of an ONNX file or ``onnx.ModelProto`` (see ``import_onnx``)."""
    return import_onnx(path_or_model, name=name).graph


def load_onnx_params(path_or_model: Any) -> dict[str, np.ndarray]:
    """Parameter values of an ONNX model, by tensor name, in each tensor's dtype."""
    return import_onnx(path_or_model).params


# ---- reading -----------------------------------------------------------------

def _onnx():
    import onnx
    return onnx


def _read(path_or_model: Any):
    """(ModelProto, error source, default graph name); malformed files name the file."""
    onnx = _onnx()
    if isinstance(path_or_model, onnx.ModelProto):
        model = path_or_model
        label = model.graph.name or "onnx_model"
        source = f"ONNX model {label!r}"
        default_name = label
    else:
        path = Path(path_or_model)
        source = str(path)
        if not path.is_file():
            raise TileplanError("no such ONNX file", source=source)
        try:
            model = onnx.load(str(path))
        except Exception as exc:   # protobuf DecodeError, external-data errors, ...
            raise TileplanError(f"not a readable ONNX model ({type(exc).__name__}: {exc})",
                                source=source) from None
        default_name = path.stem
    if not model.HasField("graph") or not model.graph.node:
        raise TileplanError("not an ONNX model: it has no graph nodes", source=source)
    try:
        onnx.checker.check_model(model)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TileplanError(f"malformed ONNX model: {first}", source=source) from None
    try:
        model = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False)
    except Exception as exc:
        raise TileplanError(f"ONNX shape inference failed: {exc}", source=source) from None
    return model, source, default_name


# ---- the importer ------------------------------------------------------------

@dataclass
class _Node:
    """One ONNX node, unpacked: a unique name, op type, tensor names, attributes."""

    name: str
    op_type: str
    domain: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any]

    def describe(self) -> str:
        op = self.op_type if self.domain in ("", "ai.onnx") else f"{self.domain}::{self.op_type}"
        return f"node {self.name!r} ({op})"

    def err(self, message: str) -> TileplanError:
        return TileplanError(f"{self.describe()}: {message}")


@dataclass
class _Importer:
    model: Any
    name: str
    nodes: list[_Node] = field(default_factory=list)
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    types: dict[str, tuple[int, list]] = field(default_factory=dict)   # name -> (elem type, dims)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    transposed: dict[str, tuple[str, _Node]] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)

    def run(self) -> OnnxModel:
        self._unpack()
        self._drop_identities()
        self._fold_transposes()
        self._fuse_gelus()
        ops, declared = self._lower()
        return self._build(ops, declared)

    # -- unpacking --------------------------------------------------------------

    def _unpack(self) -> None:
        onnx = _onnx()
        g = self.model.graph
        self.metadata = {p.key: p.value for p in self.model.metadata_props}
        for vi in list(g.input) + list(g.value_info) + list(g.output):
            tt = vi.type.tensor_type
            if vi.type.HasField("tensor_type"):
                dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                        for d in tt.shape.dim] if tt.HasField("shape") else None
                self.types[vi.name] = (tt.elem_type, dims)
        for init in g.initializer:
            self.constants[init.name] = _to_array(init, f"initializer {init.name!r}")
        # Before IR 4 initializers were also listed as graph inputs: they stay parameters.
        self.inputs = [vi.name for vi in g.input if vi.name not in self.constants]
        self.outputs = [vi.name for vi in g.output]
        used: Counter = Counter()
        for i, n in enumerate(g.node):
            name = n.name or f"{n.op_type}_{i}"
            used[name] += 1
            if used[name] > 1:
                name = f"{name}_{used[name] - 1}"
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
            node = _Node(name, n.op_type, n.domain, list(n.input), list(n.output), attrs)
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                self.constants[node.outputs[0]] = _constant_value(node)
            else:
                self.nodes.append(node)

    def _drop_identities(self) -> None:
        alias: dict[str, str] = {}

        def resolve(t: str) -> str:
            while t in alias:
                t = alias[t]
            return t

        produced = {o for n in self.nodes for o in n.outputs if n.op_type != "Identity"}
        kept = []
        for n in self.nodes:
            if n.op_type != "Identity":
                kept.append(n)
                continue
            src, dst = resolve(n.inputs[0]), n.outputs[0]
            if dst in self.outputs and src in produced and src not in self.outputs:
                alias[src] = dst        # the graph output keeps its name
            else:
                alias[dst] = src
        for n in kept:
            n.inputs = [resolve(t) if t else t for t in n.inputs]
            n.outputs = [resolve(t) for t in n.outputs]
        outs = [resolve(t) for t in self.outputs]
        self.outputs = list(dict.fromkeys(outs))
        for old in list(alias):
            if old in self.types and resolve(old) not in self.types:
                self.types[resolve(old)] = self.types[old]
        self.nodes = kept

    def _fold_transposes(self) -> None:
        """Transposes into MatMul/Gemm transpose flags, or into initializer values."""
        readers: dict[str, list[tuple[_Node, int]]] = {}
        for n in self.nodes:
            for k, t in enumerate(n.inputs):
                readers.setdefault(t, []).append((n, k))
        kept = []
        for n in self.nodes:
            if n.op_type != "Transpose":
                kept.append(n)
                continue
            src, out = n.inputs[0], n.outputs[0]
            rank = len(self._dims(src) or [])
            perm = [int(p) for p in n.attrs.get("perm", range(rank - 1, -1, -1))]
            swap = rank >= 2 and perm == list(range(rank - 2)) + [rank - 1, rank - 2]
            others = [r for r, k in readers.get(out, []) if r.op_type not in ("MatMul", "Gemm") or k > 1]
            if swap and not others and out not in self.outputs:
                self.transposed[out] = (src, n)
            elif src in self.constants:
                self.constants[out] = np.transpose(self.constants[src], perm)
            elif not swap:
                raise n.err(f"transposes {src!r} with perm {perm}; tileplan folds only a swap of the "
                            "last two axes into the MatMul or Gemm that reads it")
            else:
                who = others[0].describe() if others else "the graph output"
                raise n.err(f"{who} reads its output; tileplan folds a Transpose only into a MatMul "
                            "or Gemm operand")
        self.nodes = kept

    # -- GeLU subgraph fusion ---------------------------------------------------

    def _fuse_gelus(self) -> None:
        ctx = _Patterns(self)
        fused: dict[int, _Node] = {}          # id(root node) -> replacement
        removed: set[int] = set()
        for n in self.nodes:
            if id(n) in removed or n.domain not in ("", "ai.onnx"):
                continue
            match = ctx.match_erf(n) if n.op_type == "Erf" else ctx.match_tanh(n) if n.op_type == "Tanh" else None
            if match is None:
                continue
            x, root, members, approximate = match
            if any(id(m) in removed for m in members):
                continue
            removed |= {id(m) for m in members}
            fused[id(root)] = _Node(root.name, "Gelu", "", [x], [root.outputs[0]],
                                    {"approximate": approximate})
        self.nodes = [fused.get(id(n), n) for n in self.nodes
                      if id(n) in fused or id(n) not in removed]

    # -- lowering ---------------------------------------------------------------

    def _lower(self) -> tuple[list[Op], dict[str, Tensor]]:
        """tileplan ops for every node, plus the op outputs whose dtype must be declared."""
        for n in self.nodes:
            if n.domain not in ("", "ai.onnx") or n.op_type not in _LOWER:
                raise n.err(f"unsupported op; {SUPPORTED}")
        ops: list[Op] = []
        declared: dict[str, Tensor] = {}
        for n in self.nodes:
            new_ops = _LOWER[n.op_type](self, n)
            ops.extend(new_ops)
            for op in new_ops:
                t = self._declared_output(op, n)
                if t is not None:
                    declared[t.name] = t
        return ops, declared

    def _declared_output(self, op: Op, node: _Node) -> Tensor | None:
        """The op's output as ONNX types it, when Graph.build must be told the dtype.

        A Cast's output dtype is its ``to``. A MatMul's output is declared when ONNX
        types it other than its operands (FP16 -> FLOAT partials, FP8 -> FLOAT16);
        an FP8 MatMul output typed FP8 is ONNX inference echoing the operands, and
        is left to Graph.build's default (FP16).
        """
        if isinstance(op, Cast):
            dims = self._static(op.output, what="Cast output")
            return Tensor(op.output, dims, _dtype(node.attrs["to"], op.output), scale=self._scale(op.output))
        info = self.types.get(op.output)
        if isinstance(op, MatMul) and info is not None and info[0] in _DTYPES and _all_static(info[1]):
            dt = _DTYPES[info[0]]
            if dt is not DType.FP8 and dt is not self._tensor_dtype(op.inputs[0]):
                return Tensor(op.output, tuple(info[1]), dt)
        return None

    def operand(self, t: str) -> tuple[str, bool]:
        """(tensor, transposed?) for a MatMul/Gemm operand, folding a last-two-axes Transpose."""
        if t in self.transposed:
            return self.transposed[t][0], True
        return t, False

    def scalar(self, t: str) -> float | None:
        """The value of a constant whose elements are all equal (a scalar in effect)."""
        v = self.constants.get(t)
        if v is None or v.size == 0:
            return None
        try:
            f = np.asarray(v, dtype=np.float64).ravel()
        except (TypeError, ValueError):
            return None
        return float(f[0]) if np.all(f == f[0]) else None

    def fold_scalar(self, node: _Node, t: str, factor: float, attr: str) -> None:
        """Multiply an initializer's values by ``factor`` (Gemm alpha/beta), in its own dtype."""
        readers = [n for n in self.nodes if t in n.inputs]
        if t not in self.constants or len(readers) != 1:
            why = "is not an initializer" if t not in self.constants else "is shared with other nodes"
            raise node.err(f"{attr}={factor:g} needs an initializer operand read by this node alone to "
                           f"fold into, and {t!r} {why}; tileplan has no scalar multiply")
        v = self.constants[t]
        dt = _DTYPES.get(_np_elem_type(v))
        if dt is None:
            raise TileplanError(f"tensor {t!r} has element type {v.dtype}; {_DTYPE_HELP}")
        scale = self._scale(t)
        self.constants[t] = quantise(dequantise(v, dt, scale) * factor, dt, scale)

    # -- building ---------------------------------------------------------------

    def _build(self, ops: list[Op], declared: dict[str, Tensor]) -> OnnxModel:
        read = {t for op in ops for t in op.inputs}
        tensors: list[Tensor] = []
        params: dict[str, np.ndarray] = {}
        for t in self.inputs:
            if t not in read:
                continue       # an unused graph input: not part of what tileplan plans
            elem, _ = self.types.get(t, (0, None))
            tensors.append(Tensor(t, self._static(t, what="graph input"), _dtype(elem, t),
                                  Role.INPUT, scale=self._scale(t)))
        for t, v in self.constants.items():
            if t not in read:
                continue
            dt = _DTYPES.get(_np_elem_type(v))
            if dt is None:
                raise TileplanError(f"tensor {t!r} (initializer) has element type {v.dtype}; {_DTYPE_HELP}")
            v = np.ascontiguousarray(v.reshape(v.shape or (1,)))
            params[t] = v
            tensors.append(Tensor(t, tuple(int(d) for d in v.shape), dt, Role.PARAMETER, scale=self._scale(t)))
        tensors.extend(declared.values())
        known = {t.name for t in tensors} | {op.output for op in ops}
        for key in self.metadata:
            if key.startswith(SCALE_KEY):
                if key[len(SCALE_KEY):] not in known:
                    raise TileplanError(f"metadata {key!r} names no tensor of the graph")
                self._scale(key[len(SCALE_KEY):])          # refuses a scale on a non-fp8 tensor
        for t in self.outputs:
            if t not in known:
                raise TileplanError(f"graph output {t!r} is not written by any imported op")
        target = self.metadata.get(TARGET_KEY) or None
        graph = Graph.build(self.name, tensors, ops, outputs=self.outputs or None, target=target)
        return OnnxModel(graph, params)

    # -- tensor facts -----------------------------------------------------------

    def _dims(self, t: str) -> list | None:
        if t in self.constants:
            return list(self.constants[t].shape)
        info = self.types.get(t)
        return None if info is None else info[1]

    def _static(self, t: str, *, what: str) -> tuple[int, ...]:
        dims = self._dims(t)
        if dims is None:
            raise TileplanError(f"{what} {t!r} has no known shape; tileplan plans static shapes")
        if not _all_static(dims):
            shown = ", ".join(str(d) if isinstance(d, int) and d > 0 else repr(d or "?") for d in dims)
            raise TileplanError(f"{what} {t!r} has a dynamic dimension (shape [{shown}]); tileplan plans "
                                "static shapes: export with fixed sizes or pin the dimension "
                                "(onnx.tools.update_model_dims)")
        return tuple(int(d) for d in dims)

    def _tensor_dtype(self, t: str) -> DType | None:
        if t in self.constants:
            return _DTYPES.get(_np_elem_type(self.constants[t]))
        info = self.types.get(t)
        return None if info is None else _DTYPES.get(info[0])

    def _scale(self, t: str) -> int:
        text = self.metadata.get(SCALE_KEY + t)
        if text is None:
            return 0
        try:
            scale = int(text)
        except ValueError:
            raise TileplanError(f"metadata {SCALE_KEY + t!r} = {text!r} is not an integer exponent") from None
        dt = self._tensor_dtype(t)
        if dt is not DType.FP8 and scale != 0:
            raise TileplanError(f"metadata {SCALE_KEY + t!r} gives scale {scale} to a {dt or 'non-fp8'} tensor; "
                                "scales apply to fp8 only")
        return scale


# ---- per-op lowering -----------------------------------------------------------

def _lower_matmul(imp: _Importer, n: _Node) -> list[Op]:
    (a, ta), (b, tb) = imp.operand(n.inputs[0]), imp.operand(n.inputs[1])
    return [MatMul(n.name, (a, b), n.outputs[0], transpose_a=ta, transpose_b=tb)]


def _lower_gemm(imp: _Importer, n: _Node) -> list[Op]:
    alpha, beta = float(n.attrs.get("alpha", 1.0)), float(n.attrs.get("beta", 1.0))
    (a, ta), (b, tb) = imp.operand(n.inputs[0]), imp.operand(n.inputs[1])
    ta ^= bool(n.attrs.get("transA", 0))
    tb ^= bool(n.attrs.get("transB", 0))
    c = n.inputs[2] if len(n.inputs) > 2 and n.inputs[2] else None
    if alpha != 1.0:
        imp.fold_scalar(n, b if b in imp.constants else a, alpha, "alpha")
    if c is not None and beta != 1.0:
        imp.fold_scalar(n, c, beta, "beta")
    y = n.outputs[0]
    if c is None:
        return [MatMul(n.name, (a, b), y, transpose_a=ta, transpose_b=tb)]
    return [MatMul(n.name, (a, b), f"{y}.matmul", transpose_a=ta, transpose_b=tb),
            Add(f"{n.name}.bias", (f"{y}.matmul", c), y)]


def _lower_add(imp: _Importer, n: _Node) -> list[Op]:
    return [Add(n.name, tuple(n.inputs[:2]), n.outputs[0])]


def _lower_gelu(imp: _Importer, n: _Node) -> list[Op]:
    approximate = n.attrs.get("approximate", "none")
    approximate = approximate.decode() if isinstance(approximate, bytes) else approximate
    if approximate not in ("none", "tanh"):
        raise n.err(f"approximate={approximate!r}; ONNX Gelu has 'none' (erf) and 'tanh'")
    return [GeLU(n.name, (n.inputs[0],), n.outputs[0], approximate="erf" if approximate == "none" else "tanh")]


def _lower_cast(imp: _Importer, n: _Node) -> list[Op]:
    _dtype(n.attrs["to"], n.outputs[0])
    return [Cast(n.name, (n.inputs[0],), n.outputs[0])]


_LOWER = {"MatMul": _lower_matmul, "Gemm": _lower_gemm, "Add": _lower_add, "Gelu": _lower_gelu,
          "Cast": _lower_cast}


# ---- GeLU subgraph patterns ----------------------------------------------------

@dataclass
class _Patterns:
    """Matchers for the erf and tanh GeLU subgraphs, over the importer's nodes."""

    imp: _Importer
    producer: dict[str, _Node] = field(default_factory=dict)
    consumers: dict[str, list[_Node]] = field(default_factory=dict)

    def __post_init__(self):
        for n in self.imp.nodes:
            for t in n.outputs:
                self.producer[t] = n
            for t in n.inputs:
                self.consumers.setdefault(t, []).append(n)

    def private(self, t: str) -> bool:
        """Whether ``t`` has exactly one reader and is not a graph output."""
        return len(self.consumers.get(t, [])) == 1 and t not in self.imp.outputs

    def product(self, t: str, root: bool = True) -> tuple[float, Counter, list[_Node]]:
        """Flatten the Mul/Div/Pow tree computing ``t``: (constant factor, other factors, nodes).

        Only private intermediates are flattened, so a value read elsewhere (the
        GeLU input itself) stays a leaf.
        """
        c = self.imp.scalar(t)
        if c is not None:
            return c, Counter(), []
        n = self.producer.get(t)
        if n is None or n.domain not in ("", "ai.onnx") or not (root or self.private(t)):
            return 1.0, Counter({t: 1}), []
        if n.op_type == "Mul":
            c1, f1, n1 = self.product(n.inputs[0], False)
            c2, f2, n2 = self.product(n.inputs[1], False)
            return c1 * c2, f1 + f2, [n] + n1 + n2
        d = self.imp.scalar(n.inputs[1]) if len(n.inputs) > 1 else None
        if n.op_type == "Div" and d:
            c1, f1, n1 = self.product(n.inputs[0], False)
            return c1 / d, f1, [n] + n1
        if n.op_type == "Pow" and d is not None and d == int(d) and 2 <= d <= 4:
            return 1.0, Counter({n.inputs[0]: int(d)}), [n]
        return 1.0, Counter({t: 1}), []

    def one_plus(self, t: str) -> tuple[str, _Node] | None:
        """``t``'s only reader, when it is ``Add(t, 1)``: (its output, the node)."""
        if not self.private(t):
            return None
        (n,) = self.consumers[t]
        if n.op_type != "Add" or n.domain not in ("", "ai.onnx"):
            return None
        other = n.inputs[1] if n.inputs[0] == t else n.inputs[0]
        return (n.outputs[0], n) if _close(self.imp.scalar(other), 1.0) else None

    def outer(self, x: str, a: str) -> tuple[_Node, list[_Node]] | None:
        """The Muls computing ``0.5 * x * a`` downstream of ``a``: (last node, all nodes)."""
        t = a
        for _ in range(3):
            if not self.private(t):
                return None
            (n,) = self.consumers[t]
            if n.op_type not in ("Mul", "Div") or n.domain not in ("", "ai.onnx"):
                return None
            coef, factors, nodes = self.product(n.outputs[0])
            if factors == Counter({x: 1, a: 1}) and _close(coef, 0.5):
                return n, nodes
            t = n.outputs[0]
        return None

    def match_erf(self, erf: _Node):
        s = erf.inputs[0]
        if not self.private(s):
            return None
        coef, factors, inner = self.product(s)
        if len(factors) != 1 or sum(factors.values()) != 1 or not _close(coef, 1 / math.sqrt(2)):
            return None
        (x,) = factors
        return self._finish(x, erf, inner, [], "none")

    def match_tanh(self, tanh: _Node):
        s = tanh.inputs[0]
        if not self.private(s):
            return None
        coef, factors, inner = self.product(s)
        if len(factors) != 1 or sum(factors.values()) != 1 or not _close(coef, math.sqrt(2 / math.pi)):
            return None
        (v,) = factors
        add = self.producer.get(v)
        if add is None or add.op_type != "Add" or not self.private(v):
            return None
        for x, w in (add.inputs, add.inputs[::-1]):
            if not self.private(w):
                continue
            cw, fw, cube = self.product(w)
            if fw == Counter({x: 3}) and _close(cw, 0.044715):
                return self._finish(x, tanh, inner, [add] + cube, "tanh")
        return None

    def _finish(self, x: str, fn: _Node, inner: list[_Node], more: list[_Node], approximate: str):
        plus = self.one_plus(fn.outputs[0])
        if plus is None:
            return None
        a, add_one = plus
        outer = self.outer(x, a)
        if outer is None:
            return None
        root, outer_nodes = outer
        members = inner + more + [fn, add_one] + outer_nodes
        ids = {id(m) for m in members}
        for m in members:                      # every intermediate stays inside the pattern
            for t in m.outputs:
                if m is root:
                    continue
                if t in self.imp.outputs or any(id(c) not in ids for c in self.consumers.get(t, [])):
                    return None
        return x, root, members, approximate


def _close(value: float | None, target: float) -> bool:
    return value is not None and math.isclose(value, target, rel_tol=CONSTANT_RTOL)


# ---- dtypes and values ---------------------------------------------------------

_FP8 = 18   # TensorProto.FLOAT8E4M3FNUZ (checked against onnx below)
_DTYPES: dict[int, DType] = {1: DType.FP32, 10: DType.FP16, _FP8: DType.FP8}  # FLOAT, FLOAT16, FP8
_DTYPE_HELP = "tileplan takes FLOAT (fp32), FLOAT16 (fp16) and FLOAT8E4M3FNUZ (fp8)"


def _dtype(elem_type: int, tensor: str) -> DType:
    if elem_type in _DTYPES:
        return _DTYPES[elem_type]
    onnx = _onnx()
    label = onnx.TensorProto.DataType.Name(elem_type) if elem_type else "unknown"
    raise TileplanError(f"tensor {tensor!r} has ONNX element type {label}; {_DTYPE_HELP}")


def _np_elem_type(v: np.ndarray) -> int:
    try:
        return int(_onnx().helper.np_dtype_to_tensor_dtype(v.dtype))
    except (KeyError, ValueError, TypeError):
        return 0


def _all_static(dims) -> bool:
    return dims is not None and all(isinstance(d, int) and d > 0 for d in dims)


def _to_array(proto, what: str) -> np.ndarray:
    try:
        return _onnx().numpy_helper.to_array(proto)
    except Exception as exc:
        raise TileplanError(f"{what}: cannot read its values ({exc})") from None


def _constant_value(node: _Node) -> np.ndarray:
    a = node.attrs
    if "value" in a:
        return _to_array(a["value"], node.describe())
    if "value_float" in a:
        return np.array(a["value_float"], dtype=np.float32)
    if "value_floats" in a:
        return np.array(a["value_floats"], dtype=np.float32)
    if "value_int" in a:
        return np.array(a["value_int"], dtype=np.int64)
    if "value_ints" in a:
        return np.array(a["value_ints"], dtype=np.int64)
    raise node.err(f"constant kind {sorted(a)} is not supported (tileplan reads dense tensor constants)")


# ---- export: a tileplan Graph as ONNX ------------------------------------------

def to_onnx(graph: Graph, params: dict[str, np.ndarray], *, opset: int = OPSET):
    """An ``onnx.ModelProto`` computing ``graph``, with ``params`` as initializers.

    Same tensor and node names; MatMul transpose flags become ``Transpose`` nodes
    named ``<op>.transpose_a``/``.transpose_b`` (which ``import_onnx`` folds back);
    GeLU is opset-20 ``Gelu``; FP8 scales and the target go to ``metadata_props``;
    every intermediate gets a ``value_info`` (which carries the FP8 and FP32
    partials MatMul output types, see the module docstring). Pinned layouts are
    not carried (ONNX has no place for them).
    """
    onnx = _onnx()
    h, tp = onnx.helper, onnx.TensorProto
    elem = {DType.FP32: tp.FLOAT, DType.FP16: tp.FLOAT16, DType.FP8: tp.FLOAT8E4M3FNUZ}

    def info(t: Tensor):
        return h.make_tensor_value_info(t.name, elem[t.dtype], list(t.shape))

    nodes = []
    for op in graph.ops:
        if isinstance(op, MatMul):
            ins = list(op.inputs)
            for k, flag in enumerate((op.transpose_a, op.transpose_b)):
                if flag:
                    src = graph.tensors[ins[k]]
                    r = len(src.shape)
                    out = f"{op.name}.{'ab'[k]}T"
                    nodes.append(h.make_node("Transpose", [src.name], [out], name=f"{op.name}.transpose_{'ab'[k]}",
                                             perm=list(range(r - 2)) + [r - 1, r - 2]))
                    ins[k] = out
            nodes.append(h.make_node("MatMul", ins, [op.output], name=op.name))
        elif isinstance(op, Add):
            nodes.append(h.make_node("Add", list(op.inputs), [op.output], name=op.name))
        elif isinstance(op, GeLU):
            nodes.append(h.make_node("Gelu", list(op.inputs), [op.output], name=op.name,
                                     approximate="none" if op.approximate == "erf" else "tanh"))
        elif isinstance(op, Cast):
            out = graph.tensors[op.output]
            nodes.append(h.make_node("Cast", list(op.inputs), [op.output], name=op.name, to=elem[out.dtype]))
        else:
            raise TileplanError(f"op {op.name!r} ({op.kind}): no ONNX form")
    inits = []
    for t in graph.by_role(Role.PARAMETER):
        if t.name not in params:
            raise TileplanError(f"parameter {t.name!r} has no value to write")
        v = np.asarray(params[t.name])
        if v.shape != t.shape or v.dtype != t.dtype.numpy:
            raise TileplanError(f"parameter {t.name!r}: value is {v.dtype}{list(v.shape)}, "
                                f"the tensor is {t.dtype}{list(t.shape)}")
        inits.append(onnx.numpy_helper.from_array(v, t.name))
    g = h.make_graph(nodes, graph.name, [info(t) for t in graph.by_role(Role.INPUT)],
                     [info(t) for t in graph.by_role(Role.OUTPUT)], inits,
                     value_info=[info(t) for t in graph.by_role(Role.INTERMEDIATE)])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", opset)], producer_name="tileplan")
    model.ir_version = 10       # onnx 1.16 reads it; FLOAT8E4M3FNUZ needs IR >= 9
    props = {SCALE_KEY + t.name: str(t.scale) for t in graph.tensors.values() if t.scale}
    if graph.target:
        props[TARGET_KEY] = graph.target
    h.set_model_props(model, props)
    return model
