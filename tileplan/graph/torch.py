"""PyTorch import through ``torch.export``: a module and example inputs -> Graph.

``import_module(module, example_inputs) -> TorchModel(graph, params)`` exports the
module (in eval mode; its training flag is restored after) with
``torch.export.export`` and maps the ATen graph onto ``tileplan.graph.core`` ops.
``from_module`` returns just the graph; ``import_exported`` takes an
``ExportedProgram`` you already have (before or after ``run_decompositions``).
``params`` maps each parameter tensor's name to its values as numpy arrays in
the tensor's dtype (``np.float32``, ``np.float16``, ``ml_dtypes.float8_e4m3fnuz``).

torch is an optional extra (``pip install torch==2.13.0``); it is imported only
when an import function runs.

Names: parameters, buffers and lifted constants keep their module path
(``fc1.weight``); user inputs and op outputs take the FX node names (``x``,
``linear``, ``gelu``); the graph is named after the module's class.

What maps to what:

- ``aten.linear(x, W, b)`` (``nn.Linear``, which computes ``x @ W.T + b``): a
  MatMul named after the node reading the parameter ``W[out, in]`` as is with
  ``transpose_b=True`` (so ``params['fc1.weight']`` equals the module's weight),
  writing ``<node>.matmul``; then an Add named ``<node>.bias`` writing ``<node>``.
  Without a bias the MatMul writes ``<node>``.
- ``aten.addmm(b, x, W)`` likewise (MatMul then bias Add); ``aten.mm``, ``aten.bmm``,
  ``aten.matmul``: MatMul. ``alpha``/``beta`` other than 1 are refused.
- ``aten.t``, ``aten.permute``/``aten.transpose`` swapping the last two axes,
  read only as MatMul operands: folded into the MatMul's transpose flags (this
  is how decomposed ``linear`` arrives: ``permute(W, [1, 0])`` then ``addmm``).
- ``aten.gelu(x, approximate='none'|'tanh')``: GeLU (erf or tanh form).
- ``aten.add.Tensor(a, b)`` (bias additions and residuals, broadcasting): Add.
  A Python-number operand or ``alpha != 1`` is refused.
- ``aten.to.dtype``, ``aten._to_copy`` (``.half()``, ``.float()``, ``.to(dtype)``):
  Cast to float32/float16/float8_e4m3fnuz, dropped when the dtype does not change.
- ``aten.view``/``reshape``/``_unsafe_view``/``flatten`` that keep the last dimension:
  dropped. tileplan ops work on rows (every leading dimension folded), so such a
  reshape changes nothing they compute; the value keeps the shape of the op that
  wrote it (an ``[B, T, K]`` input stays ``[B, T, K]`` through ``view([B*T, K])``
  and ``addmm``). A reshaped value may not feed a MatMul of two activations or
  one with a batched parameter (the batch dimensions would change meaning).
- ``clone``, ``contiguous``, ``alias``, ``detach``, ``dropout`` (eval) are dropped;
  ``_assert_tensor_metadata`` and other assertions are skipped.
- Anything else: one ``TileplanError`` naming the node and its target.

``load_python_factory("path/to/model.py:factory")`` imports that file, calls
``factory()``, which returns ``(module, example_inputs)`` (a tensor or a tuple of
tensors), and imports the module; the CLI uses it for ``.py:factory`` model
arguments.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from ..errors import TileplanError
from .core import Add, Cast, GeLU, Graph, MatMul, Op, Role, Tensor
from .dtypes import DType

INSTALL_HINT = "install the torch extra: pip install torch==2.13.0"
SUPPORTED = ("tileplan imports aten linear, addmm, mm, bmm, matmul, gelu, add.Tensor, dtype casts "
             "and reshapes that keep the last dimension")


@dataclass(frozen=True)
class TorchModel:
    """An imported torch module: the graph and every parameter's values."""

    graph: Graph
    params: dict[str, np.ndarray]


def _torch():
    try:
        import torch
    except ImportError:
        raise TileplanError(f"PyTorch import needs torch; {INSTALL_HINT}") from None
    return torch


def import_module(module: Any, example_inputs: Any, *, name: str | None = None) -> TorchModel:
    """Export ``module`` on ``example_inputs`` (eval mode) and import the program."""
    torch = _torch()
    args = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    was_training = getattr(module, "training", False)
    try:
        module.eval()
        program = torch.export.export(module, args)
    except TileplanError:
        raise
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise TileplanError(f"torch.export failed for {type(module).__name__}: "
                            f"{type(exc).__name__}: {first}") from None
    finally:
        module.train(was_training)
    return import_exported(program, name=name or type(module).__name__)


def from_module(module: Any, example_inputs: Any, *, name: str | None = None) -> Graph:
    """The ``Graph`` of a torch module (see ``import_module``)."""
    return import_module(module, example_inputs, name=name).graph


def import_exported(program: Any, *, name: str = "exported") -> TorchModel:
    """Import a ``torch.export.ExportedProgram``."""
    _torch()
    return _Importer(program, name).run()


def load_python_factory(spec: str | Path, *, name: str | None = None) -> TorchModel:
    """Import ``path/to/model.py:factory``: ``factory()`` returns ``(module, example_inputs)``.

    The graph is named after the file stem unless ``name`` is given. Errors name
    the file.
    """
    text = str(spec)
    path_text, sep, attr = text.rpartition(":")
    if not sep or not path_text.endswith(".py") or not attr.isidentifier():
        raise TileplanError("expected a Python model as path/to/model.py:factory", source=text)
    path = Path(path_text)
    source = str(path)
    if not path.is_file():
        raise TileplanError("no such Python file", source=source)
    _torch()
    mod_name = f"_tileplan_factory_{abs(hash(str(path.resolve())))}"
    try:
        loader_spec = importlib.util.spec_from_file_location(mod_name, path)
        pymod = importlib.util.module_from_spec(loader_spec)
        sys.modules[mod_name] = pymod
        loader_spec.loader.exec_module(pymod)
        factory = getattr(pymod, attr, None)
        if not callable(factory):
            raise TileplanError(f"has no function {attr!r}", source=source)
        made = factory()
    except TileplanError:
        raise
    except Exception as exc:
        raise TileplanError(f"running {attr}() failed: {type(exc).__name__}: {exc}", source=source) from None
    finally:
        sys.modules.pop(mod_name, None)
    if not (isinstance(made, tuple) and len(made) == 2):
        raise TileplanError(f"{attr}() must return (module, example_inputs), got {type(made).__name__}",
                            source=source)
    module, example_inputs = made
    try:
        return import_module(module, example_inputs, name=name or path.stem)
    except TileplanError as exc:
        raise exc.with_source(source) from None


# ---- the importer ------------------------------------------------------------

@dataclass
class _Importer:
    program: Any
    name: str
    value: dict[str, str] = field(default_factory=dict)             # fx node name -> tensor name
    known: dict[str, Tensor] = field(default_factory=dict)          # every tensor so far, tileplan shapes
    declared: dict[str, Tensor] = field(default_factory=dict)       # inputs, parameters, Cast outputs
    transposed: dict[str, tuple[str, Any]] = field(default_factory=dict)  # fx node -> (tensor, the node)
    params: dict[str, np.ndarray] = field(default_factory=dict)
    ops: list[Op] = field(default_factory=list)

    def run(self) -> TorchModel:
        sig = self.program.graph_signature
        specs = {spec.arg.name: spec for spec in sig.input_specs if hasattr(spec.arg, "name")}
        for node in self.program.graph.nodes:
            if node.op == "placeholder":
                self._placeholder(node, specs.get(node.name))
            elif node.op == "call_function":
                self._call(node)
            elif node.op != "output":
                raise TileplanError(f"node {node.name!r} ({node.op}): unsupported FX node kind; {SUPPORTED}")
        outputs = []
        for spec in sig.output_specs:
            if spec.kind.name != "USER_OUTPUT":
                raise TileplanError(f"output {spec.arg.name!r} is a {spec.kind.name.lower()}; tileplan "
                                    "imports modules that do not mutate their buffers or inputs")
            outputs.append(self.read(spec.arg.name, "the graph output"))
        read = {t for op in self.ops for t in op.inputs}
        tensors = [t for t in self.declared.values() if t.role is Role.INTERMEDIATE or t.name in read]
        params = {k: v for k, v in self.params.items() if k in read}
        graph = Graph.build(self.name, tensors, self.ops, outputs=list(dict.fromkeys(outputs)))
        return TorchModel(graph, params)

    # -- values -------------------------------------------------------------------

    def _placeholder(self, node, spec) -> None:
        val = node.meta.get("val")
        kind = spec.kind.name if spec is not None else "USER_INPUT"
        if kind not in ("USER_INPUT", "PARAMETER", "BUFFER", "CONSTANT_TENSOR"):
            raise TileplanError(f"input {node.name!r} is a {kind.lower()}; tileplan imports tensor inputs, "
                                "parameters, buffers and constants")
        if not _is_tensor(val):
            raise TileplanError(f"input {node.name!r} is not a tensor ({type(val).__name__}); "
                                "tileplan imports tensor inputs only")
        if kind == "USER_INPUT":
            tname, role = node.name, Role.INPUT
            shape = _static_shape(val, tname)
            if not shape:
                raise TileplanError(f"input {tname!r} is a 0-d tensor; tileplan tensors have at least one "
                                    "dimension")
        else:
            tname, role = spec.target, Role.PARAMETER
            shape = _static_shape(val, tname) or (1,)     # a 0-d constant broadcasts as [1]
            self.params[tname] = _numpy(self._parameter_value(tname, kind), tname).reshape(shape)
        t = Tensor(tname, shape, _dtype(val.dtype, tname), role)
        self.known[tname] = self.declared[tname] = t
        self.value[node.name] = tname

    def _parameter_value(self, target: str, kind: str):
        p = self.program
        if target in p.state_dict:
            return p.state_dict[target]
        constants = getattr(p, "constants", None) or {}
        if target in constants:
            return constants[target]
        raise TileplanError(f"{kind.lower()} {target!r} has no value in the exported program")

    def read(self, arg: Any, reader: str) -> str:
        """The tensor an fx argument stands for; ``reader`` describes who reads it."""
        key = getattr(arg, "name", arg)
        if isinstance(key, str) and key in self.transposed:
            raise _node_err(self.transposed[key][1], f"{reader} reads its output; tileplan folds a "
                                                     "transpose only into a MatMul operand")
        if not isinstance(key, str) or key not in self.value:
            raise TileplanError(f"{reader}: operand {arg!r} is not a tensor; tileplan imports tensor "
                                "operands only (no Python numbers)")
        return self.value[key]

    def operand(self, arg: Any, node) -> tuple[str, bool]:
        """(tensor, transposed?) for a MatMul operand, folding a last-two-axes transpose."""
        key = getattr(arg, "name", arg)
        if isinstance(key, str) and key in self.transposed:
            return self.transposed[key][0], True
        return self.read(arg, _describe(node)), False

    def reshaped(self, arg: Any) -> bool:
        """Whether tileplan's tensor for ``arg`` has another shape than torch's (a dropped reshape)."""
        if getattr(arg, "name", None) in self.transposed:
            arg = self.transposed[arg.name][1].args[0]       # the value before the transpose
        val = getattr(arg, "meta", {}).get("val")
        tname = self.value.get(getattr(arg, "name", None))
        return _is_tensor(val) and tname in self.known and tuple(val.shape) != self.known[tname].shape

    def emit(self, node, op: Op, out: Tensor | None = None) -> None:
        """Append ``op``; its output (inferred, or ``out`` when declared) becomes the node's value."""
        ins = [self.known[i] for i in op.inputs]
        if out is None:
            shape, dtype = op.infer(ins)
            out = Tensor(op.output, tuple(shape), dtype)
        else:
            self.declared[out.name] = out
        self.known[out.name] = out
        self.ops.append(op)
        self.value[node.name] = op.output

    def alias(self, node, src: Any) -> None:
        self.value[node.name] = self.read(src, _describe(node))

    # -- calls --------------------------------------------------------------------

    def _call(self, node) -> None:
        target = _target_name(node.target)
        if target in _SKIPPED:
            return
        handler = _HANDLERS.get(target)
        if handler is None:
            raise _node_err(node, f"unsupported op; {SUPPORTED}")
        handler(self, node)

    def matmul(self, node, a, b, *, bias=None, transpose_b=False) -> None:
        (ta, fa), (tb, fb) = self.operand(a, node), self.operand(b, node)
        fb ^= transpose_b
        b_is_matrix_parameter = self.known[tb].role is Role.PARAMETER and len(self.known[tb].shape) == 2
        for arg, ok in ((a, b_is_matrix_parameter), (b, False)):
            if self.reshaped(arg) and not ok:
                raise _node_err(node, f"operand {arg.name!r} is a reshape tileplan dropped (it keeps the "
                                      f"shape {list(self.known[self.value[arg.name]].shape)}); a MatMul of two "
                                      "activations or with a batched parameter needs its batch dimensions "
                                      "as written")
        out = node.name if bias is None else f"{node.name}.matmul"
        self.emit(node, MatMul(node.name, (ta, tb), out, transpose_a=fa, transpose_b=fb))
        if bias is not None:
            tbias = self.read(bias, _describe(node))
            self.emit(node, Add(f"{node.name}.bias", (out, tbias), node.name))


# ---- per-target handlers ---------------------------------------------------------

def _arg(node, index: int, key: str, default=None):
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(key, default)


def _linear(imp: _Importer, node) -> None:
    x, w, b = _arg(node, 0, "input"), _arg(node, 1, "weight"), _arg(node, 2, "bias")
    imp.matmul(node, x, w, bias=b, transpose_b=True)


def _addmm(imp: _Importer, node) -> None:
    beta, alpha = _arg(node, 3, "beta", 1), _arg(node, 4, "alpha", 1)
    if beta != 1 or alpha != 1:
        raise _node_err(node, f"beta={beta}, alpha={alpha}; tileplan has no scalar multiply (use 1)")
    imp.matmul(node, node.args[1], node.args[2], bias=node.args[0])


def _mm(imp: _Importer, node) -> None:
    imp.matmul(node, node.args[0], node.args[1])


def _transpose_view(imp: _Importer, node) -> None:
    """``t``/``permute``/``transpose``: a swap of the last two axes, for a MatMul to fold."""
    src = node.args[0]
    rank = len(src.meta["val"].shape)
    target = _target_name(node.target)
    if target == "aten.t.default":
        perm = [1, 0] if rank == 2 else list(range(rank))
    elif target == "aten.permute.default":
        perm = [int(p) % rank for p in node.args[1]]
    else:
        d0, d1 = (int(d) % rank for d in node.args[1:3])
        perm = list(range(rank))
        perm[d0], perm[d1] = perm[d1], perm[d0]
    if perm == list(range(rank)):
        imp.alias(node, src)
        return
    if rank < 2 or perm != list(range(rank - 2)) + [rank - 1, rank - 2]:
        raise _node_err(node, f"permutes axes {perm}; tileplan folds only a swap of the last two axes "
                              "into the MatMul that reads it")
    readers = [_target_name(u.target) for u in node.users]
    if any(r not in _MATMULS for r in readers):
        bad = next(u for u in node.users if _target_name(u.target) not in _MATMULS)
        raise _node_err(node, f"{_describe(bad)} reads its output; tileplan folds a transpose only into "
                              "a MatMul operand")
    imp.transposed[node.name] = (imp.read(src, _describe(node)), node)


def _gelu(imp: _Importer, node) -> None:
    approximate = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
    if approximate not in ("none", "tanh"):
        raise _node_err(node, f"approximate={approximate!r}; expected 'none' or 'tanh'")
    x = imp.read(node.args[0], _describe(node))
    imp.emit(node, GeLU(node.name, (x,), node.name, approximate="erf" if approximate == "none" else "tanh"))


def _add(imp: _Importer, node) -> None:
    alpha = node.kwargs.get("alpha", 1)
    if alpha != 1:
        raise _node_err(node, f"alpha={alpha}; tileplan has no scalar multiply (use 1)")
    a, b = (imp.read(arg, _describe(node)) for arg in node.args[:2])
    imp.emit(node, Add(node.name, (a, b), node.name))


def _cast(imp: _Importer, node) -> None:
    src = node.args[0]
    dtype = node.kwargs.get("dtype")
    if dtype is None and _target_name(node.target) == "aten.to.dtype":
        dtype = node.args[1]
    src_val, out_val = src.meta.get("val"), node.meta.get("val")
    if dtype is None or out_val.dtype == src_val.dtype:
        imp.alias(node, src)
        return
    x = imp.read(src, _describe(node))
    out = Tensor(node.name, imp.known[x].shape, _dtype(out_val.dtype, node.name))
    imp.emit(node, Cast(node.name, (x,), node.name), out)


def _reshape(imp: _Importer, node) -> None:
    src = node.args[0]
    before, after = tuple(src.meta["val"].shape), tuple(node.meta["val"].shape)
    if not before or not after or before[-1] != after[-1]:
        raise _node_err(node, f"reshapes {list(before)} to {list(after)}; tileplan drops reshapes that keep "
                              "the last dimension and has no op for others")
    imp.alias(node, src)


def _identity(imp: _Importer, node) -> None:
    imp.alias(node, node.args[0])


_MATMULS = {"aten.linear.default", "aten.addmm.default", "aten.mm.default", "aten.bmm.default",
            "aten.matmul.default"}
_HANDLERS = {
    "aten.linear.default": _linear,
    "aten.addmm.default": _addmm,
    "aten.mm.default": _mm,
    "aten.bmm.default": _mm,
    "aten.matmul.default": _mm,
    "aten.t.default": _transpose_view,
    "aten.permute.default": _transpose_view,
    "aten.transpose.int": _transpose_view,
    "aten.gelu.default": _gelu,
    "aten.add.Tensor": _add,
    "aten.to.dtype": _cast,
    "aten.to.dtype_layout": _cast,
    "aten._to_copy.default": _cast,
    "aten.view.default": _reshape,
    "aten.reshape.default": _reshape,
    "aten._unsafe_view.default": _reshape,
    "aten.flatten.using_ints": _reshape,
    "aten.clone.default": _identity,
    "aten.contiguous.default": _identity,
    "aten.alias.default": _identity,
    "aten.detach.default": _identity,
    "aten.dropout.default": _identity,        # export in eval mode: dropout is the identity
}
_SKIPPED = {"aten._assert_tensor_metadata.default", "aten._assert_scalar.default",
            "aten.sym_constrain_range_for_size.default", "aten._assert_async.msg"}


# ---- helpers ---------------------------------------------------------------------

def _target_name(target: Any) -> str:
    """``aten.linear.default`` for an OpOverload; the qualified name otherwise."""
    return str(target) if hasattr(target, "_schema") else getattr(target, "__qualname__", str(target))


def _describe(node) -> str:
    return f"node {node.name!r} ({_target_name(node.target) if node.op == 'call_function' else node.op})"


def _node_err(node, message: str) -> TileplanError:
    return TileplanError(f"{_describe(node)}: {message}")


def _is_tensor(val: Any) -> bool:
    return hasattr(val, "shape") and hasattr(val, "dtype")


def _static_shape(val, tname: str) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in val.shape)
    except (TypeError, ValueError):
        raise TileplanError(f"tensor {tname!r} has a dynamic shape {list(val.shape)}; tileplan plans static "
                            "shapes (export without dynamic_shapes)") from None


def _dtype(torch_dtype: Any, tname: str) -> DType:
    text = str(torch_dtype).removeprefix("torch.")
    table = {"float32": DType.FP32, "float16": DType.FP16, "float8_e4m3fnuz": DType.FP8}
    if text not in table:
        raise TileplanError(f"tensor {tname!r} has dtype {text}; tileplan takes float32, float16 and "
                            "float8_e4m3fnuz")
    return table[text]


def _numpy(value: Any, tname: str) -> np.ndarray:
    torch = _torch()
    t = value.detach().cpu().contiguous()
    if t.dtype == torch.float8_e4m3fnuz:
        return t.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fnuz).copy()
    _dtype(t.dtype, tname)
    return t.numpy().copy()
