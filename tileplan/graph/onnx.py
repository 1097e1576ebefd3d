"""ONNX import (and export of tileplan graphs as ONNX twins).

``import_onnx(path_or_model) -> OnnxModel(graph, params)`` reads an ONNX file (or
an ``onnx.ModelProto``) with the ``onnx`` package alone (no onnxruntime), runs
ONNX shape inference, and builds a ``Graph`` of ``tileplan.graph.core`` ops.
``from_onnx`` returns just the graph, ``load_onnx_params`` just the parameter
values. ``params`` maps every parameter tensor's name to its stored values in
the tensor's own dtype (``np.float32``, ``np.float16`` or
``ml_dtypes.float8_e4m3fnuz``; an FP8 value ``q`` stands for ``q * 2**scale``).

The import runs in passes: unpack (dtypes, initializers, ``Constant`` nodes),
``_REWRITE`` (nodes that are other nodes), Identity dropping, constant folding,
Transpose folding, ``_LOWER`` (one row per node type -> tileplan ops; every node
without a row is reported in one error: ``3 unsupported nodes: LayerNormalization
(2: ln1, ln2), Softmax (1: sm)``), then the shared pattern table
(``tileplan.graph.patterns``) folds exporter decompositions (the GeLU subgraphs).

What maps to what:

- graph inputs -> role ``input``; initializers and ``Constant`` nodes (``value``,
  ``value_float(s)``, ``value_int(s)``) read by a kept op -> role ``parameter``;
  graph outputs -> role ``output``. A 0-d tensor becomes shape ``[1]`` (it
  broadcasts the same); a 0-d graph input, parameter or output keeps its declared shape at the
  package boundary (``Graph.boundary_shape``: ``validate --inputs`` takes, ``--outputs`` writes a 0-d array).
- ``MatMul`` -> MatMul (numpy semantics, batched, broadcast batch dimensions;
  either operand an activation or a parameter).
- ``Gemm`` -> MatMul with ``transA``/``transB`` as its transpose flags, named after
  the node, writing ``<Y>.matmul``; plus, with a bias ``C``, an Add named
  ``<node>.bias`` writing ``Y``. ``alpha``/``beta`` fold into the values of an
  initializer operand read by this node only (B or A; C), else they are Muls by
  one-element parameters ``<node>.alpha`` / ``<node>.beta``.
- ``Add``, ``Sub``, ``Mul``, ``Div`` -> the Binary ops (numpy broadcasting);
  ``Sum`` -> a chain of Adds; ``Pow`` with a constant exponent 2 or 3 -> Muls
  (other exponents are refused).
- ``Neg``, ``Sqrt``, ``Reciprocal``, ``Exp``, ``Tanh``, ``Erf``, ``Sigmoid`` -> the
  Unary ops; ``Gelu`` (opset 20) -> GeLU (``approximate="none"`` is the erf form,
  ``"tanh"`` the tanh form).
- ``Cast`` to FLOAT, FLOAT16 or FLOAT8E4M3FNUZ -> Cast (FP8 casts saturate to +-240;
  ``saturate=0`` makes out-of-range values NaN); ``CastLike(x, like)`` -> Cast to ``like``'s type.
- Nodes whose inputs are all constants are evaluated at import (tileplan plans static
  shapes, so ``Shape`` of any tensor is a constant too): those tileplan lowers, of float
  constants, with the ops' own ``reference()`` (``CastLike(Constant 0.5, x)``,
  ``Sqrt(Constant 2)``); any other standard node with ``onnx.reference.ReferenceEvaluator``
  (shape arithmetic: Mod, Equal, Where, integer Cast; a position table's bicubic ``Resize``);
  folding and shape inference repeat until nothing more folds.
- ``Identity`` and inference ``Dropout`` (ratio ignored; ``training_mode`` true or
  not a constant is refused, as is a read mask output) are dropped (readers read
  the input); one that copies a graph input, a constant or another output into a
  graph output is a Reshape to the same shape.
- ``Concat`` -> Concat along its axis (of integer constants: shape arithmetic, folded; of float
  constants: folded into a parameter). ``Expand`` and ``Tile`` of a constant (a class token
  repeated over the batch) are folded into a parameter (and the Equal / Where of constants that
  compute their shapes); of an activation they are refused. ``Gather`` of an activation by
  constant indices that step evenly (the CLS row ``x[:, 0]``) -> Slice (a Reshape dropping the
  axis for a scalar index).
- ``Reshape``, ``Flatten``, ``Squeeze``, ``Unsqueeze`` -> Reshape to the output
  shape ONNX shape inference gives.
- Integer and bool graph inputs (token ids, an attention mask) -> INT32 inputs. ``Gather`` of an
  initializer by one -> a Gather (an embedding; any axis, through a re-laid table, a Reshape and a
  Transpose). The exporters' padding mask (the input Cast to BOOL, order-keeping Flatten /
  Reshape / Gather by constant indices, ``And`` with all-true constants, ``Expand``,
  ``Where(mask, 0, min)``) -> a Cast of the input, a Mul and an Add, kept at ``[B, 1, 1, T]``
  and computed once (``_lower_where``); ``And``, ``Expand`` and ``Where`` of anything else are
  refused naming the node (of constants they are folded).
- ``Transpose`` that swaps the last two axes and is read only as MatMul or Gemm
  operands folds into their transpose flags (the parameter keeps its name and
  values); a Transpose of an initializer is folded into new values (a parameter
  named after the Transpose's output); any other Transpose -> Transpose ops
  (``importing.transpose_ops``: any permutation as at most three rearrangements
  the planner plans).
- The erf and tanh GeLU subgraphs below opset 20, in every form exporters write
  (Div or Mul by the constant, ``Pow(x, 3)`` or ``x * x * x``, Sum or Add,
  CastLike'd Constants), fold into one GeLU (``tileplan.graph.patterns``).

Dtypes: FLOAT -> fp32, FLOAT16 -> fp16, FLOAT8E4M3FNUZ -> fp8; BFLOAT16 is refused
naming ``--cast-bf16 fp16`` (``import_onnx(..., cast_bf16="fp16")`` reads every
bf16 tensor, initializer and Cast target as FLOAT16 and records it in
``Graph.imported``); anything else (DOUBLE, other FP8 formats; integer and bool but for graph
inputs) is an error naming the tensor and its type. Every input must have a static
shape (tileplan plans static shapes): a symbolic or missing dimension is an
error naming the tensor, and so is a negative one. A zero dimension is a
zero-size tensor (``Reshape`` with ``allowzero=1`` makes them too): imported as
it is, and folded at plan time with what it feeds (``planner.rewrite``).

tileplan conventions ONNX has no words for, carried in ``metadata_props``:

- ``tileplan.scale.<tensor>`` = ``"<int>"``: the FP8 power-of-two scale exponent
  of an FP8 input, parameter or Cast output (default 0).
- ``tileplan.target`` = ``"<preset>"``: the model's default target.
- ONNX's MatMul does not admit FP8 operands, nor an output type other than its
  inputs'. The standard way to state an FP8 GEMM is its quantise-dequantise
  form: both FP8 operands ``Cast`` to FLOAT16 (an FP8 initializer's scale a
  ``Mul`` by ``2**s``) and an FP16 MatMul; the importer folds it into the AMP's
  FP8 GEMM with its FP16 result (``patterns``, ``fp8-matmul``; the dequantising
  Cast of an FP8 initializer is not constant-folded, so the weight stays FP8).
  ``to_onnx`` writes FP8 GEMMs this way (files pass ``onnx.checker``'s
  ``full_check`` and run in ``onnx.reference``), but for an FP8 activation with
  a nonzero scale. tileplan also reads a MatMul on FLOAT8E4M3FNUZ operands
  directly (what ``to_onnx`` wrote before; not valid under ``full_check``), and
  honours an output type declared in ``value_info`` (FP16 operands with a FLOAT
  output: FP32 partials).

The graph is named ``name`` if given, else after the file stem, else after the
ONNX graph's name.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import ml_dtypes
import numpy as np

from .. import checked
from ..errors import TileplanError
from .core import (Add, Cast, Concat, Div, Max, Erf, Exp, Gather, GeLU, Graph, LayerNorm, MatMul, Mul, Neg, Op, Reciprocal,
                   ReduceMax, ReduceMean, ReduceSum, Relu, Reshape, Role, Sigmoid, Softmax, Sqrt, Sub, Tanh, Tensor,
                   Transpose, Slice)
from .dtypes import DType, dequantise, quantise
from .importing import (BF16_HELP, check_cast_bf16, patch_conv_ops, patch_conv_refusal, reduce_ops, transpose_ops,
                        unsupported_error)
from .patterns import Declared, fuse

SCALE_KEY = "tileplan.scale."
TARGET_KEY = "tileplan.target"
OPSET = 20                  # Gelu appears in opset 20


@dataclass(frozen=True)
class OnnxModel:
    """An imported ONNX model: the graph and every parameter's stored values."""

    graph: Graph
    params: dict[str, np.ndarray]


def import_onnx(path_or_model: Any, *, name: str | None = None, cast_bf16: str | None = None) -> OnnxModel:
    """Read an ONNX file or ``onnx.ModelProto`` into a graph and its parameter values.

    ``cast_bf16="fp16"`` converts a BFLOAT16 model to FLOAT16 (else bf16 is refused).
    """
    model, source, default_name = _read(path_or_model)
    try:
        check_cast_bf16(cast_bf16)
        return _Importer(model, name or default_name, cast_bf16=cast_bf16).run()
    except TileplanError as exc:
        raise exc.with_source(source) from None


def from_onnx(path_or_model: Any, *, name: str | None = None, cast_bf16: str | None = None) -> Graph:
    """The ``Graph`` of an ONNX file or ``onnx.ModelProto`` (see ``import_onnx``)."""
    return import_onnx(path_or_model, name=name, cast_bf16=cast_bf16).graph


def load_onnx_params(path_or_model: Any, *, cast_bf16: str | None = None) -> dict[str, np.ndarray]:
    """Parameter values of an ONNX model, by tensor name, in each tensor's dtype."""
    return import_onnx(path_or_model, cast_bf16=cast_bf16).params


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
        from ..safeio import LIMITS, read_file
        data = read_file(path, LIMITS["onnx"], "ONNX file")
        try:
            model = onnx.load_model_from_string(data)    # (external data read below: _load_external_data)
        except Exception as exc:   # protobuf DecodeError, ...
            raise TileplanError(f"not a readable ONNX model ({type(exc).__name__}: {exc})",
                                source=source) from None
        # Design decision: a model named after its file takes the stem with control characters
        # escaped (``checked.printable``): the name must be printable (``checked.name``), and a
        # file name is the user's own choice, not something to refuse the model for.
        default_name = checked.printable(path.stem)
    if not model.HasField("graph") or not model.graph.node:
        raise TileplanError("not an ONNX model: it has no graph nodes", source=source)
    try:
        _check_opset(model)
        _load_external_data(model, None if isinstance(path_or_model, onnx.ModelProto) else Path(path_or_model).parent)
    except TileplanError as exc:
        raise exc.with_source(source) from None
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


def _check_opset(model) -> None:
    """Refuse a default-domain opset newer than the installed ``onnx`` knows.

    Design decision: refuse rather than read the model as the newest known opset with a warning.
    An op's inputs, attributes and defaults are defined per opset (Softmax's axis, Split's sizes and
    the reductions' axes all moved between opsets); a model written for an opset the importer and
    ONNX's shape inference do not know might mean something else than what its nodes say under
    the newest known one, and a warning on stderr would not stop the package being built from a
    silently different model. An exporter can always write an older opset."""
    newest = _onnx().defs.onnx_opset_version()
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx") and o.version > newest:
            raise TileplanError(f"the model imports opset {o.version} of the default ONNX domain, newer than this "
                                f"importer knows (at most {newest}, onnx {_onnx().__version__}); export it at "
                                f"opset {newest} or lower")


def _tensors_of(graph):
    """Every TensorProto of a graph (initializers, sparse initializers, node attributes), subgraphs too."""
    for t in graph.initializer:
        yield t
    for sp in graph.sparse_initializer:
        yield sp.values
        yield sp.indices
    for n in graph.node:
        for a in n.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            if a.HasField("sparse_tensor"):
                yield a.sparse_tensor.values
                yield a.sparse_tensor.indices
            if a.HasField("g"):
                yield from _tensors_of(a.g)
            for sub in a.graphs:
                yield from _tensors_of(sub)


_PACKED_4BIT = {"INT4", "UINT4", "FLOAT4E2M1"}


def _external_nbytes(onnx, tensor, what: str) -> int:
    """The bytes a tensor's shape and element type need (what its external data must hold)."""
    count = math.prod(int(d) for d in tensor.dims)
    label = onnx.TensorProto.DataType.Name(tensor.data_type) if tensor.data_type in \
        onnx.TensorProto.DataType.values() else str(tensor.data_type)
    if any(d < 0 for d in tensor.dims):
        raise TileplanError(f"{what} has a negative dimension ({list(tensor.dims)})")
    if label in _PACKED_4BIT:
        return (count + 1) // 2
    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))
    except Exception:
        dtype = None
    if dtype is None or dtype.kind not in "biufcV":
        raise TileplanError(f"{what} has element type {label}; {_DTYPE_HELP}")
    return count * dtype.itemsize


def _load_external_data(model, folder: Path | None) -> None:
    """Read each tensor's external data: exactly the bytes its shape and element type need
    (``offset`` + that many; a ``length`` that differs is an error, and so is a backing file too
    short), from a regular file inside the model's folder (a relative path, no ``..`` out of it,
    no symbolic link). Design decision: tileplan reads it rather than ``onnx.load``, which reads
    the whole backing file when a tensor gives no ``length`` (a 1 GiB file for a 64-byte tensor)."""
    from ..safeio import LIMITS, read_range
    onnx = _onnx()
    total = 0
    for tensor in _tensors_of(model.graph):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        what = f"tensor {tensor.name!r} (external data)"
        if folder is None:
            raise TileplanError(f"{what}: a model given in memory has no folder to read its external data from; "
                                "load it from its file")
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        rel = Path(location)
        if not location or rel.is_absolute() or ".." in rel.parts or "\0" in location:
            raise TileplanError(f"{what}: location {location!r} must be a relative path inside the model's folder")
        try:
            offset = int(info.get("offset", "0"))
            length = int(info["length"]) if "length" in info else None
        except ValueError:
            raise TileplanError(f"{what}: offset {info.get('offset')!r} or length {info.get('length')!r} "
                                "is not an integer") from None
        nbytes = _external_nbytes(onnx, tensor, what)
        if length is not None and length != nbytes:
            raise TileplanError(f"{what}: length {length:,} bytes, but its shape {list(tensor.dims)} and type need "
                                f"{nbytes:,}")
        total += nbytes
        if total > LIMITS["npz"]:
            raise TileplanError(f"{what}: the external data add up to more than {LIMITS['npz']:,} bytes")
        backing = folder / rel
        inside = os.path.realpath(folder)
        if os.path.commonpath([inside, os.path.realpath(backing)]) != inside:
            raise TileplanError(f"{what}: {location!r} leads outside the model's folder")
        tensor.raw_data = read_range(backing, offset, nbytes, f"external data of tensor {tensor.name!r}",
                                     follow=False)
        tensor.data_location = onnx.TensorProto.DEFAULT
        del tensor.external_data[:]


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
    cast_bf16: str | None = None
    nodes: list[_Node] = field(default_factory=list)
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    types: dict[str, tuple[int, list]] = field(default_factory=dict)   # name -> (elem type, dims)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    transposed: dict[str, tuple[str, _Node]] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    converted: int = 0                  # bf16 tensors converted under cast_bf16
    opset: int = OPSET                  # the model's default-domain opset
    consumed: set[str] = field(default_factory=set)   # nodes another node's lowering imported
    # tensor -> (INT32 graph input, shape): a bool value that is an integer input read as a 0/1 mask
    # (Cast to BOOL, order-keeping views and Gathers, And with all-true constants, Expand: ``_mask``)
    masks: dict[str, tuple[str, tuple]] = field(default_factory=dict)
    mask_biases: dict[tuple, str] = field(default_factory=dict)   # (mask, shape, x, y, dtype) -> its bias

    def run(self) -> OnnxModel:
        self._unpack()
        self._rewrite()
        self._drop_identities()
        # Folding makes shapes static (a Reshape by a folded shape), and a static shape makes the
        # Shape nodes that read it constants: fold and infer again until nothing more folds.
        # (Shape inference runs once more only when a pass folded something.)
        self._fold_constants()
        while True:
            self._reinfer_shapes()
            count = len(self.nodes)
            self._fold_constants()
            if len(self.nodes) == count:
                break
        self._fold_transposes()
        ops, declared = self._lower()
        rescaled: dict[str, int] = {}
        ops = fuse(ops, self.scalar, self.outputs, lambda t: declared.get(t) or self._declaration(t), rescaled)
        for name, exponent in rescaled.items():     # fp8-matmul: a dequantised weight's 2**s is its scale
            self.metadata[SCALE_KEY + name] = str(exponent)
        produced = {op.output for op in ops}
        return self._build(ops, {k: t for k, t in declared.items() if k in produced})

    # -- unpacking --------------------------------------------------------------

    def _unpack(self) -> None:
        onnx = _onnx()
        g = self.model.graph
        self.metadata = {p.key: p.value for p in self.model.metadata_props}
        self.opset = next((int(o.version) for o in self.model.opset_import if o.domain in ("", "ai.onnx")), OPSET)
        for vi in list(g.input) + list(g.value_info) + list(g.output):
            tt = vi.type.tensor_type
            if vi.type.HasField("tensor_type"):
                dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                        for d in tt.shape.dim] if tt.HasField("shape") else None
                self.types[vi.name] = (self._elem(tt.elem_type, vi.name), dims)
        for init in g.initializer:
            self.constants[init.name] = self._value(_to_array(init, f"initializer {init.name!r}"), init.name)
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
                self.constants[node.outputs[0]] = self._value(_constant_value(node), node.outputs[0])
                continue
            if node.op_type == "Cast" and "to" in attrs:
                attrs["to"] = self._elem(attrs["to"], node.outputs[0])
            self.nodes.append(node)

    def _elem(self, elem_type: int, tensor: str) -> int:
        """An ONNX element type, BFLOAT16 read as FLOAT16 under ``cast_bf16``."""
        if elem_type == _BF16 and self.cast_bf16 == "fp16":
            self.converted += 1
            return _FP16
        if elem_type == _BF16:
            raise TileplanError(f"tensor {tensor!r} is BFLOAT16; {BF16_HELP}")
        return elem_type

    def _value(self, v: np.ndarray, tensor: str) -> np.ndarray:
        """A constant's values, bf16 converted to fp16 under ``cast_bf16``."""
        if v.dtype == ml_dtypes.bfloat16:
            self._elem(_BF16, tensor)
            return v.astype(np.float16)
        return v

    def _rewrite(self) -> None:
        """``_REWRITE`` rows: nodes that are other nodes in disguise (CastLike, Sum, Dropout)."""
        out: list[_Node] = []
        for n in self.nodes:
            rule = _REWRITE.get(n.op_type) if n.domain in ("", "ai.onnx") else None
            out.extend(rule(self, n) if rule else [n])
        self.nodes = out

    def _fold_constants(self) -> None:
        """Nodes whose inputs are all constants become constants: tileplan plans static shapes,
        so a ``Shape`` of any tensor is a constant, and so is everything computed from constants.

        ``_SHAPE_FOLD`` rows first (the Shape / Size of a static tensor, Gather, Expand, Tile); then
        a node tileplan lowers, of float constants, through its ops' own ``reference()`` in the
        dtypes it stores (the exporters' ``CastLike(Constant, x)`` and ``Sqrt(Constant 2)``, so the
        patterns see plain scalars); any other node by ONNX's reference evaluator
        (``_evaluate``): integer shape arithmetic, Equal / Where, Mod, Pow, Resize, ...
        """
        kept = []
        readers: dict[str, list[_Node]] = {}
        for n in self.nodes:
            for t in n.inputs:
                readers.setdefault(t, []).append(n)
        for n in self.nodes:
            if self._dequantises_weight(n, readers):
                kept.append(n)
                continue
            if n.domain in ("", "ai.onnx") and n.op_type in _SHAPE_FOLD:
                values = _SHAPE_FOLD[n.op_type](self, n)
                if values is not None:
                    self.constants[n.outputs[0]] = values
                    continue
            row = _LOWER.get(n.op_type) if n.domain in ("", "ai.onnx") else None
            ins = [t for t in n.inputs if t]
            if not ins or any(t not in self.constants for t in ins):
                kept.append(n)
                continue
            if row is not None and row.fold and all(self._tensor_dtype(t) is not None for t in ins):
                try:
                    self._fold_by_reference(n, row, ins)
                    continue
                except TileplanError:
                    pass            # a node tileplan would not plan (Pow 0.5): the evaluator may fold it
            if not self._evaluate(n, readers):
                kept.append(n)
        self.nodes = kept

    def _fold_by_reference(self, n: _Node, row: "_Row", ins: list[str]) -> None:
        """A node of float constants evaluated with the ops' own ``reference()``, through the
        dtype each op stores (FP8 values quantised with their scales)."""
        env = {t: dequantise(self.constants[t], self._tensor_dtype(t), self._scale(t)) for t in ins}
        dts = {t: self._tensor_dtype(t) for t in ins}
        done: dict[str, np.ndarray] = {}
        for op in row.lower(self, n):
            info = self.types.get(op.output)
            dt = (_DTYPES.get(info[0]) if info else None) or dts[op.inputs[0]]
            stored = quantise(op.reference(*(env[i] for i in op.inputs)), dt, self._scale(op.output))
            env[op.output], dts[op.output] = dequantise(stored, dt, self._scale(op.output)), dt
            done[op.output] = stored
        self.constants.update(done)

    def _evaluate(self, n: _Node, readers: dict) -> bool:
        """Any other standard node whose inputs are all constants, evaluated at import by
        ``onnx.reference.ReferenceEvaluator``: the shape arithmetic after a ``Shape`` (``Mod``,
        ``Unsqueeze``, integer ``Cast``), and values computed from parameters at a fixed input size
        (a position table's bicubic ``Resize``, ``Pow(16, 0.5)``). Returns whether it folded.

        Design decision: one evaluator for every such node, with ONNX's own semantics for every
        attribute, rather than numpy written per op; tileplan plans static shapes, so all of these
        are constants of the model. Not evaluated: nodes of another domain or with subgraphs, FP8
        operands (their scales are tileplan's, not ONNX's), and a Transpose read only as MatMul /
        Gemm operands (``_fold_transposes`` folds it into their flags, keeping the parameter). A
        node the evaluator cannot run is refused naming it and the evaluator's reason."""
        onnx = _onnx()
        if n.domain not in ("", "ai.onnx") or any(isinstance(v, onnx.GraphProto) or
                                                  (isinstance(v, list) and v and isinstance(v[0], onnx.GraphProto))
                                                  for v in n.attrs.values()):
            return False
        values = [self.constants[t] for t in n.inputs if t]
        if any(_DTYPES.get(_np_elem_type(v)) is DType.FP8 or not _np_elem_type(v) for v in values):
            return False
        if n.op_type == "Transpose" and all(r.op_type in ("MatMul", "Gemm") for r in readers.get(n.outputs[0], [])):
            return False
        from onnx.reference import ReferenceEvaluator
        helper = onnx.helper
        names = list(dict.fromkeys(t for t in n.inputs if t))
        graph = helper.make_graph(
            [helper.make_node(n.op_type, n.inputs, n.outputs, name=n.name, **n.attrs)], "fold",
            [helper.make_tensor_value_info(t, _np_elem_type(self.constants[t]), list(self.constants[t].shape))
             for t in names],
            [helper.make_tensor_value_info(t, 0, None) for t in n.outputs if t])
        model = helper.make_model(graph, opset_imports=[o for o in self.model.opset_import
                                                        if o.domain in ("", "ai.onnx")] or None)
        try:
            results = ReferenceEvaluator(model).run(None, {t: self.constants[t] for t in names})
        except Exception as exc:        # the evaluator's own error, whatever its class: its first line
            first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")[:300]
            raise n.err(f"its inputs are all constants, but evaluating it at import failed: "
                        f"{type(exc).__name__}: {first}") from None
        if any(_DTYPES.get(_np_elem_type(np.asarray(v))) is DType.FP8 for v in results):
            return False                # an FP8 result carries a tileplan scale the evaluator knows nothing of
        for t, v in zip([t for t in n.outputs if t], results):
            self.constants[t] = np.array(v, order="C")       # (ascontiguousarray makes a 0-d array 1-d)
        return True

    def _reinfer_shapes(self) -> None:
        """Shapes ONNX inference left symbolic because they came from a shape subgraph (``Shape`` ->
        ``Slice`` -> ``Concat`` -> ``Reshape``: ``unk__0`` down the rest of the graph), inferred again
        now that the subgraph is folded: the remaining nodes, every constant declared by type and
        shape, and integer constants (the shapes and indices inference reads) by value. Only
        dimensions that were not static change."""
        if all(_all_static(dims) for _, dims in self.types.values()):
            return
        onnx = _onnx()
        helper = onnx.helper
        consts, inits = [], []
        for t, v in self.constants.items():
            elem = _np_elem_type(v)
            if np.issubdtype(v.dtype, np.integer) and v.size <= 1 << 16:
                inits.append(onnx.numpy_helper.from_array(v, t))
            elif elem:
                consts.append(helper.make_tensor_value_info(t, elem, list(v.shape)))
        inputs = [helper.make_tensor_value_info(t, self.types[t][0], self.types[t][1]) for t in self.inputs
                  if t in self.types]
        nodes = [helper.make_node(n.op_type, n.inputs, n.outputs, name=n.name, domain=n.domain or "", **n.attrs)
                 for n in self.nodes]
        graph = helper.make_graph(nodes, "reinfer", inputs + consts, [], initializer=inits)
        model = helper.make_model(graph, opset_imports=list(self.model.opset_import))
        try:
            inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False)
        except Exception:
            return                  # keep what the first inference gave; the lowering names the tensor
        for vi in inferred.graph.value_info:
            old = self.types.get(vi.name)
            if old is None or _all_static(old[1]) or not vi.type.HasField("tensor_type"):
                continue
            tt = vi.type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim] \
                if tt.HasField("shape") else None
            if _all_static(dims) and (old[1] is None or len(dims) == len(old[1])):
                self.types[vi.name] = (old[0], dims)

    def _dequantises_weight(self, n: _Node, readers: dict) -> bool:
        """Whether ``n`` is a Cast of an FP8 initializer (not a scalar) whose value reaches a MatMul
        operand, through a Mul by a constant and Transposes: the quantise-dequantise form of an FP8
        GEMM's weight. It stays a node (folded, the weight would be stored in FP16) for the
        ``fp8-matmul`` pattern row, which reads the FP8 initializer itself."""
        if n.op_type != "Cast" or not n.inputs or n.inputs[0] not in self.constants:
            return False
        v = self.constants[n.inputs[0]]
        if v.size <= 1 or _DTYPES.get(_np_elem_type(v)) is not DType.FP8:
            return False
        t = n.outputs[0]
        for _ in range(4):
            nxt = readers.get(t, [])
            if len(nxt) != 1:
                return False
            r = nxt[0]
            if r.op_type in ("MatMul", "Gemm"):
                return True
            if r.op_type not in ("Mul", "Transpose") or (r.op_type == "Mul" and not any(
                    self.scalar(x) is not None for x in r.inputs if x != t)):
                return False
            t = r.outputs[0]
        return False

    def _declaration(self, t: str):
        """``t``'s dtype, role and FP8 scale as far as the model says (for the pattern table)."""
        dt = self._tensor_dtype(t)
        if dt is None:
            return None
        role = Role.PARAMETER if t in self.constants else Role.INPUT if t in self.inputs else Role.INTERMEDIATE
        return Declared(dt, role, self._scale(t))

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
            elif dst in self.outputs:
                n.inputs = [src]        # a graph output copying an input, a constant or another output:
                kept.append(n)          # a real op (a Reshape to the same shape)
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
            else:
                n.attrs["perm"] = perm
                kept.append(n)          # a Transpose op, planned as a rearrangement
        self.nodes = kept

    # -- lowering ---------------------------------------------------------------

    def _lower(self) -> tuple[list[Op], dict[str, Tensor]]:
        """tileplan ops for every node, plus the op outputs whose dtype must be declared.

        Every node without a ``_LOWER`` row is reported in one error.
        """
        missing: dict[str, list[str]] = {}
        for n in self.nodes:
            if n.domain not in ("", "ai.onnx") or n.op_type not in _LOWER:
                op = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}"
                missing.setdefault(op, []).append(n.name)
        if missing:
            raise unsupported_error("node", missing, supported())
        ops: list[Op] = []
        declared: dict[str, Tensor] = {}
        for n in self.nodes:
            if n.name in self.consumed:
                continue
            new_ops = _LOWER[n.op_type].lower(self, n)
            ops.extend(new_ops)
            for op in new_ops:
                t = self._declared_output(op, n)
                if t is not None:
                    declared[t.name] = t
        return ops, declared

    def constant(self, name: str, value: float, like: str, shape: tuple[int, ...] = (1,)) -> str:
        """A new parameter of ``shape`` (one element by default) filled with ``value``, in the
        dtype of tensor ``like``."""
        dt = self._tensor_dtype(like)
        if dt is None or dt is DType.FP8:
            dt = DType.FP16 if dt is DType.FP8 else DType.FP32
        self.constants[name] = quantise(np.full(shape, value), dt)
        return name

    def _declared_output(self, op: Op, node: _Node) -> Tensor | None:
        """The op's output as ONNX types it, when Graph.build must be told the dtype.

        A Cast's output dtype is its ``to``. A MatMul's output is declared when ONNX
        types it other than its operands (FP16 -> FLOAT partials, FP8 -> FLOAT16);
        an FP8 MatMul output typed FP8 is ONNX inference echoing the operands, and
        is left to Graph.build's default (FP16).
        """
        if isinstance(op, Cast) and op.output == node.outputs[0]:
            dims = self._static(op.output, what="Cast output")
            return Tensor(op.output, dims, _dtype(node.attrs["to"], op.output), scale=self._scale(op.output))
        if isinstance(op, Cast) and op.output in self.types:     # a Cast a lowering adds (a mask's)
            return Tensor(op.output, self._static(op.output, what="Cast output"),
                          _dtype(self.types[op.output][0], op.output))
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

    def fold_scalar(self, t: str, factor: float) -> bool:
        """Multiply an initializer read by one node only by ``factor`` (Gemm alpha/beta), in its
        own dtype; False when ``t`` is not such an initializer (the caller then multiplies)."""
        readers = [n for n in self.nodes if t in n.inputs]
        if t not in self.constants or len(readers) != 1:
            return False
        v = self.constants[t]
        dt = _DTYPES.get(_np_elem_type(v))
        if dt is None:
            raise TileplanError(f"tensor {t!r} has element type {v.dtype}; {_DTYPE_HELP}")
        scale = self._scale(t)
        self.constants[t] = quantise(dequantise(v, dt, scale) * factor, dt, scale)
        return True

    # -- building ---------------------------------------------------------------

    def _build(self, ops: list[Op], declared: dict[str, Tensor]) -> OnnxModel:
        read = {t for op in ops for t in op.inputs}
        tensors: list[Tensor] = []
        params: dict[str, np.ndarray] = {}
        for t in self.inputs:
            if t not in read:
                continue       # an unused graph input: not part of what tileplan plans
            elem, _ = self.types.get(t, (0, None))
            dt = DType.INT32 if elem in _INT_INPUTS else _dtype(elem, t)
            tensors.append(Tensor(t, self._static(t, what="graph input"), dt,
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
        if self.cast_bf16:
            graph.imported = {"cast_bf16": self.cast_bf16, "converted_bf16_tensors": self.converted}
        scalars = sorted(t.name for t in graph.tensors.values()     # 0-d at the boundary, [1] inside
                         if t.role is not Role.INTERMEDIATE and self._dims(t.name) == [])
        if scalars:
            graph.imported["declared_shapes"] = {t: [] for t in scalars}
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
        if any(isinstance(d, int) and not isinstance(d, bool) and d < 0 for d in dims):
            raise TileplanError(f"{what} {t!r} has a negative dimension (shape {list(dims)}); tileplan "
                                "tensors have non-negative dimensions")
        if not _all_static(dims):
            shown = ", ".join(str(d) if isinstance(d, int) and d >= 0 else repr(d or "?") for d in dims)
            raise TileplanError(f"{what} {t!r} has a dynamic dimension (shape [{shown}]); tileplan plans "
                                "static shapes: export with fixed sizes or pin the dimension "
                                "(onnx.tools.update_model_dims)")
        return tuple(int(d) for d in dims) or (1,)       # a 0-d tensor is [1]: it broadcasts the same

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


# ---- per-op lowering: the node table --------------------------------------------

def _lower_matmul(imp: _Importer, n: _Node) -> list[Op]:
    """numpy semantics, 1-D operands included: a 1-D A is a row ``[1, K]``, a 1-D B a column
    ``[K, 1]`` (Reshapes ``<node>.a2d`` / ``<node>.b2d``), and the added axis is dropped from the
    result (``<node>.squeeze``)."""
    (a, ta), (b, tb) = imp.operand(n.inputs[0]), imp.operand(n.inputs[1])
    y = n.outputs[0]
    ops: list[Op] = []
    a_1d = not ta and len(imp._dims(n.inputs[0]) or ()) == 1
    b_1d = not tb and len(imp._dims(n.inputs[1]) or ()) == 1
    if not (a_1d or b_1d):
        return [MatMul(n.name, (a, b), y, transpose_a=ta, transpose_b=tb)]
    if a_1d:
        (k,) = imp._static(n.inputs[0], what="MatMul operand")
        ops.append(Reshape(f"{n.name}.a2d", (a,), f"{y}.a2d", shape=(1, k)))
        a = f"{y}.a2d"
    if b_1d:
        (k,) = imp._static(n.inputs[1], what="MatMul operand")
        ops.append(Reshape(f"{n.name}.b2d", (b,), f"{y}.b2d", shape=(k, 1)))
        b = f"{y}.b2d"
    ops.append(MatMul(n.name, (a, b), f"{y}.2d", transpose_a=ta, transpose_b=tb))
    ops.append(Reshape(f"{n.name}.squeeze", (f"{y}.2d",), y, shape=imp._static(y, what="MatMul output")))
    return ops


def _lower_gemm(imp: _Importer, n: _Node) -> list[Op]:
    """``Y = alpha * A' @ B' + beta * C``: alpha and beta fold into an initializer operand read
    by this node alone, else they are Muls by a one-element parameter ``<node>.alpha``/``.beta``."""
    alpha, beta = float(n.attrs.get("alpha", 1.0)), float(n.attrs.get("beta", 1.0))
    (a, ta), (b, tb) = imp.operand(n.inputs[0]), imp.operand(n.inputs[1])
    ta ^= bool(n.attrs.get("transA", 0))
    tb ^= bool(n.attrs.get("transB", 0))
    c = n.inputs[2] if len(n.inputs) > 2 and n.inputs[2] else None
    y = n.outputs[0]
    scale_out = alpha != 1.0 and not imp.fold_scalar(b if b in imp.constants else a, alpha)
    scale_c = c is not None and beta != 1.0 and not imp.fold_scalar(c, beta)
    out = y if c is None and not scale_out else f"{y}.matmul"
    ops: list[Op] = [MatMul(n.name, (a, b), out, transpose_a=ta, transpose_b=tb)]
    if scale_out:
        scaled = y if c is None else f"{y}.scaled"
        ops.append(Mul(f"{n.name}.alpha", (out, imp.constant(f"{n.name}.alpha", alpha, y)), scaled))
        out = scaled
    if c is not None:
        if scale_c:
            ops.append(Mul(f"{n.name}.beta", (c, imp.constant(f"{n.name}.beta", beta, c)), f"{y}.bias_scaled"))
            c = f"{y}.bias_scaled"
        ops.append(Add(f"{n.name}.bias", (out, c), y))
    return ops


def _pointwise(cls: type[Op]) -> Callable[[_Importer, _Node], list[Op]]:
    """The row of a pointwise ONNX node that is one tileplan op of the same arity."""
    def lower(imp: _Importer, n: _Node) -> list[Op]:
        return [cls(n.name, tuple(n.inputs[:cls.arity]), n.outputs[0])]
    return lower


def _lower_pow(imp: _Importer, n: _Node) -> list[Op]:
    """``Pow(x, 2)`` and ``Pow(x, 3)`` (a constant exponent) are Muls; any other Pow is refused."""
    x, y = n.inputs[0], n.outputs[0]
    e = imp.scalar(n.inputs[1])
    if e not in (2.0, 3.0):
        what = f"exponent {e:g}" if e is not None else f"exponent {n.inputs[1]!r}, which is not a constant"
        raise n.err(f"{what}; tileplan imports Pow with a constant exponent 2 or 3 (as Muls)")
    if e == 2.0:
        return [Mul(n.name, (x, x), y)]
    return [Mul(f"{n.name}.square", (x, x), f"{y}.square"), Mul(n.name, (f"{y}.square", x), y)]


def _lower_gelu(imp: _Importer, n: _Node) -> list[Op]:
    approximate = n.attrs.get("approximate", "none")
    approximate = approximate.decode() if isinstance(approximate, bytes) else approximate
    if approximate not in ("none", "tanh"):
        raise n.err(f"approximate={approximate!r}; ONNX Gelu has 'none' (erf) and 'tanh'")
    return [GeLU(n.name, (n.inputs[0],), n.outputs[0], approximate="erf" if approximate == "none" else "tanh")]


def _lower_cast(imp: _Importer, n: _Node) -> list[Op]:
    x = n.inputs[0]
    if n.attrs["to"] == _BOOL and (x in imp.masks or _is_int_input(imp, x)):
        imp.masks[n.outputs[0]] = imp.masks.get(x) or (x, imp._static(x, what="Cast input"))
        return []                       # a 0/1 mask, read where it is used (``_lower_where``)
    if x in imp.masks:
        raise n.err(f"casts the mask {x!r} to a number type; tileplan imports a mask read by Where")
    _dtype(n.attrs["to"], n.outputs[0])
    # saturate=0 only means something for FP8 (ONNX ignores it for other types).
    saturate = n.attrs.get("saturate", 1) != 0 or n.attrs["to"] != _FP8
    return [Cast(n.name, (n.inputs[0],), n.outputs[0], saturate=saturate)]


def _lower_view(imp: _Importer, n: _Node) -> list[Op]:
    """Reshape, Flatten, Squeeze, Unsqueeze (and an Identity that must copy): a Reshape to the
    output shape ONNX shape inference gives (no -1 or 0 entries left); a Reshape whose shape
    inference could not see its (folded) shape input resolves the constant itself."""
    y = n.outputs[0]
    if n.inputs[0] in imp.masks:         # a mask relabelled: the same values in the same order
        imp.masks[y] = (imp.masks[n.inputs[0]][0], imp._static(y, what=f"{n.op_type} output"))
        return []
    if n.op_type == "Reshape" and not _all_static(imp._dims(y) or []) and n.inputs[1] in imp.constants:
        src = imp._static(n.inputs[0], what="Reshape input")
        want = [int(d) for d in np.asarray(imp.constants[n.inputs[1]]).ravel()]
        if not n.attrs.get("allowzero", 0):
            want = [src[k] if d == 0 else d for k, d in enumerate(want)]
        try:
            imp.types[y] = (imp.types.get(y, (0, None))[0], list(np.empty(src, np.int8).reshape(want).shape))
        except ValueError:
            raise n.err(f"cannot reshape {n.inputs[0]!r} {list(src)} to {want}") from None
    shape = imp._static(y, what=f"{n.op_type} output")
    return [Reshape(n.name, (n.inputs[0],), y, shape=shape)]


def _lower_transpose(imp: _Importer, n: _Node) -> list[Op]:
    """A Transpose not folded into a MatMul/Gemm operand or into initializer values."""
    return transpose_ops(n.name, n.inputs[0], n.outputs[0], tuple(n.attrs["perm"]))


def _lower_split(imp: _Importer, n: _Node) -> list[Op]:
    """Split along ``axis`` (default 0) into the sizes of ``split`` (an input from opset 13, an
    attribute before), or into ``num_outputs`` (opset 18: parts of ceil(L / n), the last smaller),
    or into as many equal parts as outputs: one ``Slice`` per output, named after the node and the
    output's position."""
    x = n.inputs[0]
    shape = imp._static(x, what="Split input")
    axis = int(n.attrs.get("axis", 0))
    if not -len(shape) <= axis < len(shape):
        raise n.err(f"axis {axis} is out of range for {x!r} {list(shape)}")
    length, k = shape[axis], len(n.outputs)
    if len(n.inputs) > 1 and n.inputs[1]:
        if n.inputs[1] not in imp.constants:
            raise n.err(f"split sizes {n.inputs[1]!r} must be a constant (tileplan plans static shapes)")
        sizes = [int(d) for d in np.asarray(imp.constants[n.inputs[1]]).ravel()]
    elif "split" in n.attrs:
        sizes = [int(d) for d in n.attrs["split"]]
    else:
        part = -(-length // k)
        sizes = [min(part, length - i * part) for i in range(k)]
    if len(sizes) != k or sum(sizes) != length or min(sizes) < 0:
        raise n.err(f"split sizes {sizes} must be {k} sizes of at least 0 adding up to axis {axis}'s length "
                    f"{length}")
    bounds = np.concatenate(([0], np.cumsum(sizes))).tolist()
    return [Slice(n.name if i == 0 else f"{n.name}.{i}", (x,), y, axis=axis, start=a, stop=b)
            for i, (y, a, b) in enumerate(zip(n.outputs, bounds, bounds[1:]))]


def _lower_slice(imp: _Importer, n: _Node) -> list[Op]:
    """Slice with constant starts, ends, axes and steps: one ``Slice`` per sliced axis, positions
    as ONNX (and Python) take them: ends past the axis clamp to it, negative positions count from
    the end, a negative step walks back, an empty range gives a zero-size output."""
    x, y = n.inputs[0], n.outputs[0]
    shape = imp._static(x, what="Slice input")
    args = []
    for k, what in ((1, "starts"), (2, "ends"), (3, "axes"), (4, "steps")):
        t = n.inputs[k] if len(n.inputs) > k else ""
        if t and t not in imp.constants:
            raise n.err(f"{what} {t!r} must be a constant (tileplan plans static shapes)")
        args.append([int(d) for d in np.asarray(imp.constants[t]).ravel()] if t else n.attrs.get(what))
    starts, ends, axes, steps = args
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    windows = []
    for a, b, e, st in zip(axes, starts, ends, steps):
        if st == 0:
            raise n.err(f"step 0 on axis {a}")
        length = shape[a % len(shape)]
        positions = Slice.positions(range(*slice(b, e, st).indices(length)))
        if positions != {"start": 0, "stop": length, "step": 1}:
            windows.append((a % len(shape), positions))
    if not windows:
        return [Reshape(n.name, (x,), y, shape=tuple(shape))]
    ops, cur = [], x
    for i, (a, positions) in enumerate(windows):
        out = y if i == len(windows) - 1 else f"{y}.slice{i}"
        ops.append(Slice(n.name if i == len(windows) - 1 else f"{n.name}.{i}", (cur,), out, axis=a, **positions))
        cur = out
    return ops


def _lower_gather(imp: _Importer, n: _Node) -> list[Op]:
    """``Gather`` of an activation by constant indices that step evenly along the axis (the CLS row
    a pooler reads, ``x[:, 0]``: a scalar index): a ``Slice``, then a Reshape to the output's shape
    where the indices' shape is not one axis (a scalar index drops the axis). Other indices are
    refused naming them (a Gather of constants is folded at import, ``_fold_gather``)."""
    x, idx_name, y = n.inputs[0], n.inputs[1], n.outputs[0]
    if x in imp.constants and _is_int_input(imp, idx_name):
        return _lower_embedding(imp, n)
    if x in imp.masks and idx_name in imp.constants:
        return _mask_gather(imp, n)
    if idx_name not in imp.constants:
        raise n.err(f"indices {idx_name!r} are not a constant; tileplan gathers by indices fixed at export "
                    "or, from a parameter table, by an integer graph input")
    shape = imp._static(x, what="Gather input")
    axis = int(n.attrs.get("axis", 0))
    if not -len(shape) <= axis < len(shape):
        raise n.err(f"axis {axis} is out of range for {x!r} {list(shape)}")
    axis %= len(shape)
    idx = np.asarray(imp.constants[idx_name])
    length = shape[axis]
    flat = [int(i) for i in idx.ravel()]
    if any(not -length <= i < length for i in flat):
        raise n.err(f"indices {flat} are out of range for axis {axis} of length {length}")
    flat = [i % length for i in flat]
    steps = {b - a for a, b in zip(flat, flat[1:])}
    if not flat or len(steps) > 1 or 0 in steps:
        raise n.err(f"indices {flat} do not step evenly along axis {axis}; tileplan gathers a run of "
                    "positions (a Slice)")
    step = steps.pop() if steps else 1
    positions = Slice.positions(range(flat[0], flat[-1] + (1 if step > 0 else -1), step))
    out_shape = tuple(imp._static(y, what="Gather output"))
    if idx.ndim == 1:
        return [Slice(n.name, (x,), y, axis=axis, **positions)]
    return [Slice(f"{n.name}.slice", (x,), f"{y}.slice", axis=axis, **positions),
            Reshape(n.name, (f"{y}.slice",), y, shape=out_shape or (1,))]


def _is_int_input(imp: _Importer, t: str) -> bool:
    return t in imp.inputs and imp.types.get(t, (0, None))[0] in _INT_INPUTS


def _lower_embedding(imp: _Importer, n: _Node) -> list[Op]:
    """``Gather(data, indices, axis)`` of a constant by an integer graph input (an embedding by
    token ids): a Gather of the rows of ``data`` with the gathered axis first and the others
    flattened (a new constant ``<node>.table`` unless ``data`` is already ``[V, W]`` gathered on
    axis 0), a Reshape to the indices' shape plus the other axes, and a Transpose putting the
    leading axes back in front (``axis > 0``)."""
    x, idx, y = n.inputs[0], n.inputs[1], n.outputs[0]
    data = np.asarray(imp.constants[x])
    shape, q = data.shape, imp._static(idx, what="Gather indices")
    axis = int(n.attrs.get("axis", 0))
    if not -len(shape) <= axis < len(shape):
        raise n.err(f"axis {axis} is out of range for {x!r} {list(shape)}")
    axis %= len(shape)
    rest = shape[:axis] + shape[axis + 1:]
    table = x
    if axis or len(shape) != 2:
        table = f"{n.name}.table"
        imp.constants[table] = np.ascontiguousarray(np.moveaxis(data, axis, 0).reshape(shape[axis], -1))
    final = tuple(imp._static(y, what="Gather output"))
    gathered = tuple(q) + (int(np.prod(rest)),)
    if gathered == final:
        return [Gather(n.name, (table, idx), y)]
    ops: list[Op] = [Gather(n.name, (table, idx), f"{n.name}.rows")]
    grouped = tuple(q) + tuple(rest)
    if not axis:
        return ops + [Reshape(f"{n.name}.shape", (f"{n.name}.rows",), y, shape=final)]
    ops.append(Reshape(f"{n.name}.shape", (f"{n.name}.rows",), f"{n.name}.grouped", shape=grouped or (1,)))
    k = len(q)
    perm = tuple(range(k, k + axis)) + tuple(range(k)) + tuple(range(k + axis, len(grouped)))
    return ops + transpose_ops(f"{n.name}.axes", f"{n.name}.grouped", y, perm)


def _mask_gather(imp: _Importer, n: _Node) -> list[Op]:
    """A mask read at constant indices that pick every element once, in order (the exporter's
    ``mask[arange, arange]``): the mask under the output's shape; other indices are refused."""
    src, shape = imp.masks[n.inputs[0]]
    numel = int(np.prod(shape))
    probe = np.take(np.arange(numel).reshape(shape), np.asarray(imp.constants[n.inputs[1]]),
                    axis=int(n.attrs.get("axis", 0)))
    if probe.size != numel or not np.array_equal(probe.ravel(), np.arange(numel)):
        raise n.err("reads a mask at constant indices that do not pick each element once in order (only that "
                    "indexing of a mask is imported)")
    imp.masks[n.outputs[0]] = (src, tuple(int(d) for d in probe.shape))
    return []


def _lower_and(imp: _Importer, n: _Node) -> list[Op]:
    """``And`` of a mask and an all-true constant: the mask (its broadcast left to its reader)."""
    a, b = n.inputs
    for m, c in ((a, b), (b, a)):
        if m in imp.masks and c in imp.constants and bool(np.all(imp.constants[c])):
            imp.masks[n.outputs[0]] = imp.masks[m]
            return []
    raise n.err("tileplan imports And of an attention mask with an all-true constant only")


def _lower_expand(imp: _Importer, n: _Node) -> list[Op]:
    """``Expand`` of a mask: the mask, its broadcast left to the op that reads it (checked there).
    Expand of another activation is refused (of a constant it was folded at import)."""
    if n.inputs[0] not in imp.masks:
        raise n.err(f"expands the activation {n.inputs[0]!r}; tileplan imports Expand of constants (folded at "
                    "import) and of an attention mask")
    imp.masks[n.outputs[0]] = imp.masks[n.inputs[0]]
    return []


def _lower_where(imp: _Importer, n: _Node) -> list[Op]:
    """``Where(mask, x, y)`` of an integer attention mask and two one-element constants (HF's
    additive mask): ``y + mask * (x - y)``: a Cast of the input to the result's type, a Reshape to
    the mask's shape where it differs, a Mul and an Add by one-element parameters, computed once
    per mask and values. The mask keeps its shape ``[B, 1, 1, T]``; every reader must be an Add,
    Sub or Mul whose output is the broadcast of the mask with its other operand (so a broadcast
    the mask left out is never wrong)."""
    cond, xt, yt = n.inputs
    if cond not in imp.masks:
        raise n.err(f"its condition {cond!r} is not an attention mask computed from an integer graph input")
    x, y = imp.scalar(xt), imp.scalar(yt)
    if x is None or y is None:
        raise n.err("tileplan imports Where over a mask with one-element constant values only")
    src, shape = imp.masks[cond]
    out = n.outputs[0]
    for r in imp.nodes:
        if out not in r.inputs:
            continue
        others = [imp._static(t, what="operand") for t in r.inputs if t != out]
        want = imp._dims(r.outputs[0])
        if r.op_type not in ("Add", "Sub", "Mul") or list(np.broadcast_shapes(shape, *others)) != list(want or []):
            raise n.err(f"its mask is read by {r.describe()}; tileplan imports a mask added to (or multiplied "
                        "with) a tensor of the broadcast shape")
    if not np.isfinite(x - y):
        raise n.err(f"the values {x!r} and {y!r} are too far apart to write as y + mask * (x - y)")
    dt = _dtype(imp.types[out][0], out) if out in imp.types else DType.FP32
    key = (src, shape, x, y, dt)
    if key in imp.mask_biases:
        return [Reshape(n.name, (imp.mask_biases[key],), out, shape=shape)]
    imp.mask_biases[key] = out
    pre = n.name
    cast = f"{pre}.mask"
    imp.types[cast] = (_ELEM_OF[dt], list(imp._static(src, what="mask input")))
    ops: list[Op] = [Cast(cast, (src,), cast)]
    val = cast
    if tuple(imp._static(src, what="mask input")) != shape:
        ops.append(Reshape(f"{pre}.mask_shape", (cast,), f"{pre}.mask_shape", shape=shape))
        val = f"{pre}.mask_shape"
    imp.constants[f"{pre}.mask_scale"] = quantise(np.array([x - y]), dt)
    imp.constants[f"{pre}.mask_base"] = quantise(np.array([y]), dt)
    ops.append(Mul(f"{pre}.mask_scaled", (val, f"{pre}.mask_scale"), f"{pre}.mask_scaled"))
    ops.append(Add(pre, (f"{pre}.mask_scaled", f"{pre}.mask_base"), out))
    return ops


def _lower_softmax(imp: _Importer, n: _Node) -> list[Op]:
    """Softmax over ``axis`` (opset 13+; the planner moves another axis last). Below opset 13 the
    input is flattened to 2-D at ``axis`` first (Reshapes ``<y>.rows`` and back)."""
    x, y = n.inputs[0], n.outputs[0]
    shape = imp._static(x, what="Softmax input")
    rank = len(shape)
    axis = int(n.attrs.get("axis", -1 if imp.opset >= 13 else 1)) % rank
    if imp.opset >= 13 or axis == rank - 1:
        return [Softmax(n.name, (x,), y, axis=axis - rank)]
    rows = (math.prod(shape[:axis]), math.prod(shape[axis:]))
    return [Reshape(f"{n.name}.rows", (x,), f"{y}.rows", shape=rows),
            Softmax(f"{n.name}.softmax", (f"{y}.rows",), f"{y}.softmax", axis=-1),
            Reshape(n.name, (f"{y}.softmax",), y, shape=shape)]


def _lower_layernorm(imp: _Importer, n: _Node) -> list[Op]:
    """LayerNormalization over the axes from ``axis`` on: over the last axis directly, else the
    trailing axes flattened into one (Reshapes ``<y>.rows`` and back; Scale and B reshaped to
    ``[C]``). A missing B is a zero parameter ``<node>.bias``; Mean and InvStdDev must be unread."""
    x, y = n.inputs[0], n.outputs[0]
    shape = imp._static(x, what="LayerNormalization input")
    rank = len(shape)
    axis = int(n.attrs.get("axis", -1)) % rank
    c = math.prod(shape[axis:])
    ops: list[Op] = []
    params = []
    for k, what in ((1, "scale"), (2, "bias")):
        t = n.inputs[k] if len(n.inputs) > k and n.inputs[k] else None
        if t is None:
            params.append(imp.constant(f"{n.name}.bias", 0.0, x, shape=(c,)))
            continue
        if tuple(imp._static(t, what=f"LayerNormalization {what}")) != (c,):
            if t in imp.constants:
                name = f"{n.name}.{what}"
                imp.constants[name] = np.ascontiguousarray(np.broadcast_to(imp.constants[t], shape[axis:]).reshape(c))
                t = name
            else:
                ops.append(Reshape(f"{n.name}.{what}", (t,), f"{y}.{what}", shape=(c,)))
                t = f"{y}.{what}"
        params.append(t)
    eps = float(n.attrs.get("epsilon", 1e-5))
    ops += _layernorm_statistics(imp, n, shape, axis, eps)
    if axis == rank - 1:
        return ops + [LayerNorm(n.name, (x, *params), y, epsilon=eps)]
    rows = shape[:axis] + (c,)
    return ops + [Reshape(f"{n.name}.rows", (x,), f"{y}.rows", shape=rows),
                  LayerNorm(f"{n.name}.norm", (f"{y}.rows", *params), f"{y}.norm", epsilon=eps),
                  Reshape(n.name, (f"{y}.norm",), y, shape=shape)]


def _layernorm_statistics(imp: _Importer, n: _Node, shape, axis: int, eps: float) -> list[Op]:
    """LayerNormalization's optional Mean and InvStdDev outputs, when a node or the graph reads
    them, computed on the rows view ``[..., C]`` (the normalised axes flattened, a Reshape
    ``<node>.stats.rows``): ``mean = ReduceMean(x)``, ``InvStdDev = 1 / sqrt(ReduceMean((x -
    mean)**2) + epsilon)`` (column broadcasts), then Reshapes to ONNX's kept-dims shape."""
    def used(t):
        return bool(t) and (t in imp.outputs or any(t in m.inputs for m in imp.nodes))

    mean_out = n.outputs[1] if len(n.outputs) > 1 else ""
    inv_out = n.outputs[2] if len(n.outputs) > 2 else ""
    if not used(mean_out) and not used(inv_out):
        return []
    x, stem = n.inputs[0], f"{n.name}.stats"
    rows = tuple(shape[:axis]) + (math.prod(shape[axis:]),)
    kept = tuple(shape[:axis]) + (1,) * (len(shape) - axis)
    ops: list[Op] = []
    if rows != tuple(shape):
        ops.append(Reshape(f"{stem}.rows", (x,), f"{stem}.rows", shape=rows))
        x = f"{stem}.rows"

    def out(name: str, value: str, target: str) -> None:
        """``value`` (a column) as the output ``target`` in ONNX's shape, when it is read."""
        if used(target):
            ops.append(Reshape(f"{n.name}.{name}", (value,), target, shape=kept))

    ops.append(ReduceMean(f"{stem}.mean", (x,), f"{stem}.mean", keepdims=True))
    out("mean", f"{stem}.mean", mean_out)
    if used(inv_out):
        ops += [Sub(f"{stem}.centred", (x, f"{stem}.mean"), f"{stem}.centred"),
                Mul(f"{stem}.square", (f"{stem}.centred", f"{stem}.centred"), f"{stem}.square"),
                ReduceMean(f"{stem}.var", (f"{stem}.square",), f"{stem}.var", keepdims=True),
                Add(f"{stem}.var_eps", (f"{stem}.var", imp.constant(f"{stem}.epsilon", eps, n.inputs[0])),
                    f"{stem}.var_eps"),
                Sqrt(f"{stem}.std", (f"{stem}.var_eps",), f"{stem}.std"),
                Reciprocal(f"{stem}.inv_std_dev", (f"{stem}.std",), f"{stem}.inv_std_dev")]
        out("inv_std_dev", f"{stem}.inv_std_dev", inv_out)
    return ops


def _reduce(cls: type[Op], axes_input_since: int) -> Callable[[_Importer, _Node], list[Op]]:
    """ReduceSum/Mean/Max over any constant axes (attribute, or input 1 from ``axes_input_since``),
    ``keepdims`` and ``noop_with_empty_axes`` as ONNX (``importing.reduce_ops``)."""
    def lower(imp: _Importer, n: _Node) -> list[Op]:
        x, y = n.inputs[0], n.outputs[0]
        shape = imp._static(x, what=f"{n.op_type} input")
        if imp.opset >= axes_input_since:
            t = n.inputs[1] if len(n.inputs) > 1 and n.inputs[1] else None
            if t is not None and t not in imp.constants:
                raise n.err(f"axes {t!r} is not a constant; tileplan plans reductions over static axes")
            axes = [] if t is None else [int(a) for a in np.asarray(imp.constants[t]).ravel()]
        else:
            axes = [int(a) for a in n.attrs.get("axes", [])]
        if not axes and n.attrs.get("noop_with_empty_axes", 0):
            return [Reshape(n.name, (x,), y, shape=shape)]
        axes = axes or list(range(len(shape)))
        return reduce_ops(cls, n.name, x, y, shape, tuple(axes), imp._static(y, what=f"{n.op_type} output"))
    return lower


def _fold_shape(imp: _Importer, n: _Node):
    dims = imp._dims(n.inputs[0])
    if not _all_static(dims or []) and not (dims == [] and n.inputs[0] in imp.constants):
        return None
    start, end = n.attrs.get("start", 0), n.attrs.get("end", None)
    return np.array(dims, np.int64)[start:end]


def _fold_size(imp: _Importer, n: _Node):
    dims = imp._dims(n.inputs[0])
    return np.array(math.prod(dims), np.int64) if _all_static(dims or []) or n.inputs[0] in imp.constants else None


def _fold_gather(imp: _Importer, n: _Node):
    """``Gather`` of a constant by integer constant indices: shape arithmetic, or a lookup table
    read at indices fixed at export (a position embedding by ``position_ids = arange``), whose
    rows become a parameter named after the output. Out-of-range indices are refused."""
    data, idx = (imp.constants.get(t) for t in n.inputs[:2])
    if data is None or idx is None or not np.issubdtype(np.asarray(idx).dtype, np.integer):
        return None
    axis = int(n.attrs.get("axis", 0))
    rank = np.ndim(data)
    if not -rank <= axis < rank:
        raise n.err(f"axis {axis} is out of range for data of rank {rank}")
    length = np.shape(data)[axis]
    idx = np.asarray(idx)
    if idx.size and (idx.min() < -length or idx.max() >= length):
        raise n.err(f"indices {int(idx.min())}..{int(idx.max())} are out of range for axis {axis} of length {length}")
    return np.take(data, idx, axis=axis)


def _lower_concat(imp: _Importer, n: _Node) -> list[Op]:
    """``Concat`` -> Concat along its ``axis`` (a class token joined to the patch tokens)."""
    if "axis" not in n.attrs:
        raise n.err("has no axis attribute (ONNX requires one)")
    return [Concat(n.name, tuple(n.inputs), n.outputs[0], axis=int(n.attrs["axis"]))]


def _lower_conv(imp: _Importer, n: _Node) -> list[Op]:
    """``Conv`` as a patch embedding: a GEMM over the patches (``importing.patch_conv_ops``), the
    initializer weight re-laid as ``<weight>.patches`` ``[D, C*kh*kw]``. When the output's only
    reader is a Reshape to ``[B, D, h*w]`` whose only reader is a Transpose ``[0, 2, 1]`` (the
    exporters' ``flatten(2).transpose(1, 2)``), the GEMM's rows are those tokens: the Transpose's
    output is written directly as ``[B, h*w, D]`` and the two nodes add nothing. Other convolutions
    are refused naming what differs (``importing.patch_conv_refusal``)."""
    x, w = n.inputs[0], n.inputs[1]
    bias = n.inputs[2] if len(n.inputs) > 2 and n.inputs[2] else None
    if w not in imp.constants:
        raise n.err(f"weight {w!r} is not an initializer; tileplan imports convolutions by a constant weight")
    x_shape = imp._static(x, what="Conv input")
    w_shape = tuple(int(d) for d in imp.constants[w].shape)
    auto_pad = n.attrs.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
    if auto_pad not in ("NOTSET", "VALID"):
        raise n.err(f"auto_pad={auto_pad}; tileplan imports unpadded convolutions (patch embeddings)")
    spatial = max(len(w_shape) - 2, 0)
    reason = patch_conv_refusal(x_shape, w_shape, stride=n.attrs.get("strides", [1] * spatial),
                                padding=n.attrs.get("pads", [0] * 2 * spatial),
                                dilation=n.attrs.get("dilations", [1] * spatial), groups=n.attrs.get("group", 1))
    if "kernel_shape" in n.attrs and [int(k) for k in n.attrs["kernel_shape"]] != list(w_shape[2:]):
        reason = reason or f"kernel_shape {list(n.attrs['kernel_shape'])} differs from the weight's {list(w_shape[2:])}"
    if reason is not None:
        raise n.err(reason)
    weight = f"{w}.patches"
    imp.constants[weight] = np.ascontiguousarray(imp.constants[w].reshape(w_shape[0], -1))
    y, name, tokens = n.outputs[0], n.name, False
    readers = [r for r in imp.nodes if y in r.inputs]
    b, d, h, wd = x_shape[0], w_shape[0], x_shape[2] // w_shape[2], x_shape[3] // w_shape[3]
    if len(readers) == 1 and readers[0].op_type in ("Reshape", "Flatten") and y not in imp.outputs:
        flat = readers[0]
        after = [r for r in imp.nodes if flat.outputs[0] in r.inputs]
        if tuple(imp._dims(flat.outputs[0]) or ()) == (b, d, h * wd) and flat.outputs[0] not in imp.outputs \
                and len(after) == 1 and after[0].op_type == "Transpose" and list(after[0].attrs.get("perm", ())) == [0, 2, 1]:
            y, name, tokens = after[0].outputs[0], after[0].name, True
            imp.consumed |= {flat.name, after[0].name}
    ops, _ = patch_conv_ops(name, x, x_shape, weight, bias, tuple(w_shape[2:]), d, y, tokens=tokens)
    return ops


def _fold_repeat(how: str):
    """``Expand`` / ``Tile`` of a constant by a constant shape or repeat count (a class token
    repeated over the batch): evaluated at import, the result a parameter named after the output.
    tileplan has no op that repeats an activation: such a node is left to the unsupported-node
    error. Design decision: an FP8 constant is repeated only when the output carries its scale
    (the stored bytes are repeated, not rescaled)."""
    def fold(imp: _Importer, n: _Node):
        if len(n.inputs) < 2 or any(t not in imp.constants for t in n.inputs[:2]):
            return None
        data, arg = np.asarray(imp.constants[n.inputs[0]]), np.asarray(imp.constants[n.inputs[1]])
        if not np.issubdtype(arg.dtype, np.integer):
            return None
        if imp._tensor_dtype(n.inputs[0]) is DType.FP8 and imp._scale(n.inputs[0]) != imp._scale(n.outputs[0]):
            return None
        arg = [int(d) for d in arg.ravel()]
        if any(d < 0 for d in arg):
            raise n.err(f"{'shape' if how == 'expand' else 'repeats'} {arg} has a negative entry")
        try:
            if how == "expand":
                out = np.broadcast_to(data, np.broadcast_shapes(data.shape, tuple(arg)))
            else:
                if len(arg) != data.ndim:
                    raise n.err(f"repeats {arg} has {len(arg)} entries for input of rank {data.ndim}")
                out = np.tile(data, arg)
        except ValueError as exc:
            raise n.err(f"cannot {how} {list(data.shape)} by {arg}: {exc}") from None
        return np.ascontiguousarray(out)
    return fold


# What needs more than a node's constant inputs: the static shape of any tensor (``Shape``,
# ``Size``), and folds with tileplan's own checks (out-of-range indices, an FP8 scale carried
# through a repeat). Every other node of constants is evaluated by ``_Importer._evaluate``.
_SHAPE_FOLD: dict[str, Callable[[_Importer, _Node], np.ndarray | None]] = {
    "Shape": _fold_shape,
    "Size": _fold_size,
    "Gather": _fold_gather,
    "Expand": _fold_repeat("expand"),
    "Tile": _fold_repeat("tile"),
}


@dataclass(frozen=True)
class _Row:
    lower: Callable[[_Importer, _Node], list[Op]]
    fold: bool = True          # constant inputs fold into a constant (False: the lowering has effects)


# One row per ONNX node type tileplan imports. A new pointwise op is one more row here.
_LOWER: dict[str, _Row] = {
    "MatMul": _Row(_lower_matmul),
    "Gemm": _Row(_lower_gemm, fold=False),
    "Conv": _Row(_lower_conv, fold=False),
    "Add": _Row(_pointwise(Add)),
    "Sub": _Row(_pointwise(Sub)),
    "Mul": _Row(_pointwise(Mul)),
    "Div": _Row(_pointwise(Div)),
    "Pow": _Row(_lower_pow),
    "Neg": _Row(_pointwise(Neg)),
    "Sqrt": _Row(_pointwise(Sqrt)),
    "Reciprocal": _Row(_pointwise(Reciprocal)),
    "Exp": _Row(_pointwise(Exp)),
    "Tanh": _Row(_pointwise(Tanh)),
    "Erf": _Row(_pointwise(Erf)),
    "Sigmoid": _Row(_pointwise(Sigmoid)),
    "Relu": _Row(_pointwise(Relu)),
    "Max": _Row(_pointwise(Max)),
    "Gelu": _Row(_lower_gelu),
    "Cast": _Row(_lower_cast),
    "Reshape": _Row(_lower_view),
    "Flatten": _Row(_lower_view),
    "Squeeze": _Row(_lower_view),
    "Unsqueeze": _Row(_lower_view),
    "Identity": _Row(_lower_view),
    "Transpose": _Row(_lower_transpose, fold=False),   # _fold_transposes folds constants, keeping names
    "Softmax": _Row(_lower_softmax),
    "Split": _Row(_lower_split),
    "Concat": _Row(_lower_concat),
    "Gather": _Row(_lower_gather, fold=False),
    "And": _Row(_lower_and, fold=False),         # of a mask (of constants: folded by the evaluator)
    "Expand": _Row(_lower_expand, fold=False),   # of a mask (of constants: folded in _SHAPE_FOLD)
    "Where": _Row(_lower_where, fold=False),     # of a mask (of constants: folded by the evaluator)   # (after _SHAPE_FOLD: a Gather of constants is folded there)
    "Slice": _Row(_lower_slice),
    "LayerNormalization": _Row(_lower_layernorm, fold=False),
    "ReduceSum": _Row(_reduce(ReduceSum, 13)),
    "ReduceMean": _Row(_reduce(ReduceMean, 18)),
    "ReduceMax": _Row(_reduce(ReduceMax, 18)),
}


def supported() -> str:
    rest = ", ".join(sorted(set(_LOWER) | set(_REWRITE) | {"Constant"}))
    return f"tileplan imports {rest} and the GeLU subgraphs"


# ---- rewrites: nodes that are other nodes ------------------------------------------

def _elem_of(imp: _Importer, t: str) -> int:
    return _np_elem_type(imp.constants[t]) if t in imp.constants else imp.types.get(t, (0, None))[0]


def _rewrite_cast(imp: _Importer, n: _Node) -> list[_Node]:
    """A Cast to the type its input already has is an Identity."""
    if n.attrs.get("to") == _elem_of(imp, n.inputs[0]) and n.attrs.get("to"):
        return [_Node(n.name, "Identity", "", [n.inputs[0]], n.outputs[:1], {})]
    return [n]


def _rewrite_castlike(imp: _Importer, n: _Node) -> list[_Node]:
    """``CastLike(x, like)`` is ``Cast(x, to=<like's type>)``."""
    attrs = {"to": _elem_of(imp, n.inputs[1]), **({"saturate": n.attrs["saturate"]} if "saturate" in n.attrs else {})}
    return _rewrite_cast(imp, _Node(n.name, "Cast", "", [n.inputs[0]], n.outputs, attrs))


def _variadic(binary: str):
    """``Sum(a, b, c, ...)`` / ``Max(...)``: a chain of two-input ``binary`` nodes (numpy broadcasting,
    as the variadic op's); one input is its Identity."""
    def rewrite(imp: _Importer, n: _Node) -> list[_Node]:
        ins, y = [t for t in n.inputs if t], n.outputs[0]
        if len(ins) == 1:
            return [_Node(n.name, "Identity", "", ins, [y], {})]
        out, acc = [], ins[0]
        for k, t in enumerate(ins[1:], 1):
            last = k == len(ins) - 1
            name, dst = (n.name, y) if last else (f"{n.name}.{k}", f"{y}.{k}")
            out.append(_Node(name, binary, "", [acc, t], [dst], {}))
            acc = dst
        return out
    return rewrite


def _rewrite_dropout(imp: _Importer, n: _Node) -> list[_Node]:
    """Inference Dropout is the identity of its data input; training mode is refused."""
    training = n.inputs[2] if len(n.inputs) > 2 and n.inputs[2] else None
    if training is not None:
        if training not in imp.constants:
            raise n.err(f"training_mode is the graph input {training!r}; tileplan compiles inference "
                        "(export in eval mode, or make training_mode a constant false)")
        if bool(np.asarray(imp.constants[training]).ravel()[0]):
            raise n.err("training_mode=1; tileplan compiles inference Dropout only (export in eval mode)")
    if n.attrs.get("is_test", 1) == 0 and "is_test" in n.attrs:
        raise n.err("is_test=0 (training); tileplan compiles inference Dropout only")
    mask = n.outputs[1] if len(n.outputs) > 1 and n.outputs[1] else None
    if mask is not None and (mask in imp.outputs or any(mask in m.inputs for m in imp.nodes)):
        raise n.err(f"its mask output {mask!r} is read; in inference the mask is all true and "
                    "tileplan has no bool tensors")
    return [_Node(n.name, "Identity", "", [n.inputs[0]], [n.outputs[0]], {})]


_REWRITE: dict[str, Callable[[_Importer, _Node], list[_Node]]] = {
    "Cast": _rewrite_cast,
    "CastLike": _rewrite_castlike,
    "Sum": _variadic("Add"),
    "Max": _variadic("Max"),       # the chained two-input Max nodes lower through _LOWER's row
    "Dropout": _rewrite_dropout,
}


# ---- dtypes and values ---------------------------------------------------------

_FP16, _BF16, _FP8 = 10, 16, 18   # TensorProto.FLOAT16, BFLOAT16, FLOAT8E4M3FNUZ (tested against onnx)
_DTYPES: dict[int, DType] = {1: DType.FP32, _FP16: DType.FP16, _FP8: DType.FP8}  # FLOAT, FLOAT16, FP8
_ELEM_OF = {dt: elem for elem, dt in _DTYPES.items()}
_BOOL = 9                          # TensorProto.BOOL
# Integer and bool graph inputs (INT64, INT32, INT16, INT8, UINT8, BOOL: token ids, attention masks)
# are INT32 inputs the host gives; a Gather reads them as indices, a Cast to BOOL as a mask.
_INT_INPUTS = (7, 6, 5, 3, 2, _BOOL)
_DTYPE_HELP = ("tileplan takes FLOAT (fp32), FLOAT16 (fp16) and FLOAT8E4M3FNUZ (fp8); integer and bool "
               "tensors are out of scope")
def _dtype(elem_type: int, tensor: str) -> DType:
    if elem_type in _DTYPES:
        return _DTYPES[elem_type]
    if elem_type == _BF16:
        raise TileplanError(f"tensor {tensor!r} is BFLOAT16; {BF16_HELP}")
    onnx = _onnx()
    label = onnx.TensorProto.DataType.Name(elem_type) if elem_type else "unknown"
    raise TileplanError(f"tensor {tensor!r} has ONNX element type {label}; {_DTYPE_HELP}")


def _np_elem_type(v: np.ndarray) -> int:
    try:
        return int(_onnx().helper.np_dtype_to_tensor_dtype(v.dtype))
    except (KeyError, ValueError, TypeError):
        return 0


def _all_static(dims) -> bool:
    return dims is not None and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims)


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

# The pointwise ops that are one ONNX node of the same name (the _pointwise rows of _LOWER).
_ONNX_TYPE = {cls.kind: name for name, cls in (("Add", Add), ("Sub", Sub), ("Mul", Mul), ("Div", Div),
                                               ("Neg", Neg), ("Sqrt", Sqrt), ("Reciprocal", Reciprocal),
                                               ("Exp", Exp), ("Tanh", Tanh), ("Erf", Erf),
                                               ("Sigmoid", Sigmoid), ("Relu", Relu), ("Max", Max))}


def _constant(h, name: str, value: np.ndarray):
    """A Constant node holding ``value``, named (and output) ``name``."""
    t = _onnx().numpy_helper.from_array(value, name)
    return h.make_node("Constant", [], [name], name=name, value=t)


def qdq_weights(op, graph) -> list[str] | None:
    """An FP8 MatMul's operands in the exporter's quantise-dequantise form (None: written as an FP8
    MatMul, the form only tileplan reads): both operands FP8, every activation one of scale 0, a
    scaled weight read by this MatMul only (its scale is written as a Mul by ``2**scale``); the
    weights among them."""
    ins = [graph.tensors[t] for t in op.inputs]
    if any(t.dtype is not DType.FP8 for t in ins) or any(t.scale for t in ins if t.role is not Role.PARAMETER):
        return None
    if any(t.scale and len(graph.consumers[t.name]) != 1 for t in ins):     # its scale is this Mul's alone
        return None
    return [t.name for t in ins if t.role is Role.PARAMETER]


def _export_matmul(op, graph, h, elem):
    """MatMul, its transpose flags as Transposes. An FP8 GEMM is written in standard ONNX, which has
    no MatMul on FLOAT8 types: each operand Cast to FLOAT16 (a weight's FP8 scale a Mul by ``2**s``)
    and an FP16 MatMul, which ``import_onnx`` folds back (``patterns``, ``fp8-matmul``)."""
    nodes, ins = [], list(op.inputs)
    qdq = qdq_weights(op, graph)
    for k, t in enumerate(ins if qdq is not None else []):
        side = "ab"[k]
        nodes.append(h.make_node("Cast", [t], [f"{op.name}.{side}16"], name=f"{op.name}.dequantise_{side}",
                                 to=elem[DType.FP16]))
        ins[k] = f"{op.name}.{side}16"
        scale = graph.tensors[t].scale
        if scale:
            nodes += [_constant(h, f"{op.name}.{side}scale", np.array(2.0 ** scale, np.float16)),
                      h.make_node("Mul", [ins[k], f"{op.name}.{side}scale"], [f"{op.name}.{side}16s"],
                                  name=f"{op.name}.scale_{side}")]
            ins[k] = f"{op.name}.{side}16s"
    for k, flag in enumerate((op.transpose_a, op.transpose_b)):
        if flag:
            r = len(graph.tensors[op.inputs[k]].shape)
            out = f"{op.name}.{'ab'[k]}T"
            nodes.append(h.make_node("Transpose", [ins[k]], [out], name=f"{op.name}.transpose_{'ab'[k]}",
                                     perm=list(range(r - 2)) + [r - 1, r - 2]))
            ins[k] = out
    return nodes + [h.make_node("MatMul", ins, [op.output], name=op.name)]


def _export_pointwise(op, graph, h, elem):
    return [h.make_node(_ONNX_TYPE[op.kind], list(op.inputs), [op.output], name=op.name)]


def _export_reshape(op, graph, h, elem):
    return [_constant(h, f"{op.name}.shape", np.array(op.shape, np.int64)),
            h.make_node("Reshape", [op.inputs[0], f"{op.name}.shape"], [op.output], name=op.name)]


def _export_transpose(op, graph, h, elem):
    return [h.make_node("Transpose", list(op.inputs), [op.output], name=op.name, perm=list(op.perm))]


def _export_gelu(op, graph, h, elem):
    return [h.make_node("Gelu", list(op.inputs), [op.output], name=op.name,
                        approximate="none" if op.approximate == "erf" else "tanh")]


def _export_cast(op, graph, h, elem):
    return [h.make_node("Cast", list(op.inputs), [op.output], name=op.name, to=elem[graph.tensors[op.output].dtype])]


def _export_layernorm(op, graph, h, elem):
    return [h.make_node("LayerNormalization", list(op.inputs), [op.output], name=op.name, axis=-1,
                        epsilon=op.epsilon)]


def _export_softmax(op, graph, h, elem):
    """Softmax over its axis; a scale other than 1 is a Mul by a scalar Constant before it (what
    the importer's ``scaled-softmax`` pattern folds back)."""
    if op.softmax_scale == 1.0:
        return [h.make_node("Softmax", list(op.inputs), [op.output], name=op.name, axis=op.axis)]
    dtype = graph.tensors[op.inputs[0]].dtype.numpy
    return [_constant(h, f"{op.name}.scale", np.array(op.softmax_scale, dtype)),
            h.make_node("Mul", [op.inputs[0], f"{op.name}.scale"], [f"{op.name}.scaled"], name=f"{op.name}.mul"),
            h.make_node("Softmax", [f"{op.name}.scaled"], [op.output], name=op.name, axis=op.axis)]


def _export_reduce(onnx_type: str):
    def write(op, graph, h, elem):
        return [_constant(h, f"{op.name}.axes", np.array([-1], np.int64)),
                h.make_node(onnx_type, [op.inputs[0], f"{op.name}.axes"], [op.output], name=op.name,
                            keepdims=int(op.keepdims))]
    return write


def _export_slice(op, graph, h, elem):
    """ONNX Slice of one axis (a negative step's ``stop`` of -1, "through index 0", is INT64_MIN)."""
    bounds = (("starts", op.start), ("ends", op.stop if op.stop >= 0 else -2**63), ("axes", op.axis),
              ("steps", op.step))
    return [_constant(h, f"{op.name}.{what}", np.array([v], np.int64)) for what, v in bounds] + \
        [h.make_node("Slice", [op.inputs[0], *(f"{op.name}.{what}" for what, _ in bounds)], [op.output], name=op.name)]


def _export_concat(op, graph, h, elem):
    return [h.make_node("Concat", list(op.inputs), [op.output], name=op.name, axis=op.axis)]


# Each op kind's ONNX nodes (the pointwise ops of ``_ONNX_TYPE`` are one node of that type).
_EXPORT = {MatMul: _export_matmul, Reshape: _export_reshape, Transpose: _export_transpose, GeLU: _export_gelu,
           Cast: _export_cast, LayerNorm: _export_layernorm, Softmax: _export_softmax,
           ReduceSum: _export_reduce("ReduceSum"), ReduceMean: _export_reduce("ReduceMean"),
           ReduceMax: _export_reduce("ReduceMax"), Slice: _export_slice, Concat: _export_concat}


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
        write = _EXPORT.get(type(op)) or (_export_pointwise if op.kind in _ONNX_TYPE else None)
        if write is None:
            raise TileplanError(f"op {op.name!r} ({op.kind}): no ONNX form")
        nodes += write(op, graph, h, elem)
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
    explicit = {w for op in graph.ops if isinstance(op, MatMul) for w in (qdq_weights(op, graph) or [])}
    props = {SCALE_KEY + t.name: str(t.scale) for t in graph.tensors.values() if t.scale and t.name not in explicit}
    if graph.target:
        props[TARGET_KEY] = graph.target
    h.set_model_props(model, props)
    return model
