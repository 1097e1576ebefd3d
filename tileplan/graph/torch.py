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
  ``aten.matmul``: MatMul. ``addmm``'s ``alpha``/``beta`` other than 1 are Muls by
  one-element parameters ``<node>.alpha``/``<node>.beta``.
- ``aten.t``, ``aten.permute``/``aten.transpose`` swapping the last two axes,
  read only as MatMul operands: folded into the MatMul's transpose flags (this
  is how decomposed ``linear`` arrives: ``permute(W, [1, 0])`` then ``addmm``).
- ``aten.gelu(x, approximate='none'|'tanh')``: GeLU (erf or tanh form).
- ``aten.add/sub/mul/div`` (``.Tensor`` and ``.Scalar``): the Binary ops with numpy
  broadcasting. A Python-number operand is a one-element parameter
  ``<node>.scalar`` / ``<node>.scalar1`` in the dtype of the tensor operand;
  ``alpha != 1`` scales the second operand (folded into a number, else a Mul
  ``<node>.alpha``); ``div`` with a rounding mode is refused.
- ``neg, sqrt, reciprocal, exp, tanh, erf, sigmoid``: the Unary ops; ``rsqrt``:
  Sqrt ``<node>.sqrt`` then Reciprocal; ``silu``: Sigmoid ``<node>.sigmoid`` and
  a Mul; ``pow.Tensor_Scalar`` with exponent 2 or 3: Muls (others refused).
- The GeLU subgraphs written out in Python (Hugging Face ``gelu_new``:
  ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))``) fold into one
  GeLU (``tileplan.graph.patterns``); quick_gelu and SiLU stay Mul/Sigmoid ops.
- ``aten.to.dtype``, ``aten._to_copy`` (``.half()``, ``.float()``, ``.to(dtype)``):
  Cast to float32/float16/float8_e4m3fnuz, dropped when the dtype does not change.
  An FP8 GEMM is written in its quantise-dequantise form, FP8 values cast back to float16 before
  the product (torch's CPU matmul has no FP8 form with an FP16 result): ``x.to(f8).half() @
  (w8.half() * 2**s).T`` folds into tileplan's FP8 MatMul, ``2**s`` becoming ``w8``'s FP8 scale
  (the ``fp8-matmul`` row of ``tileplan.graph.patterns``).
- ``aten.view``/``reshape``/``_unsafe_view``/``flatten``/``squeeze``/``unsqueeze``
  that keep the last dimension: dropped. tileplan ops work on rows (every
  leading dimension folded), so such a reshape changes nothing they compute;
  the value keeps the shape of the op that wrote it (an ``[B, T, K]`` input
  stays ``[B, T, K]`` through ``view([B*T, K])`` and ``addmm``). A reshaped value
  may not feed a MatMul of two activations or one with a batched parameter; read
  by a transpose, or by a reduction or softmax over another axis than the last
  (where the axes matter), it becomes a Reshape op ``<reader>.shape`` to torch's
  shape first, as does a dropped view that is a graph output (the output keeps
  torch's shape). ``select.int`` is a one-wide Slice and a Reshape. Reshapes that
  change the last dimension are Reshape ops.
- ``softmax``/``_softmax``: Softmax over its dim; ``layer_norm`` over the last axis (no
  weight/bias: ones/zeros parameters ``<node>.weight``/``.bias``); ``mean.dim``,
  ``sum.dim_IntList``, ``amax``: reductions over any axes (``importing.reduce_ops``).
- ``t``/``permute``/``transpose`` not folded into a MatMul: Transpose ops (any
  permutation, ``importing.transpose_ops``).
- ``clone``, ``contiguous``, ``alias``, ``detach``, ``dropout`` (eval; ``train=True``
  is refused) are dropped; ``_assert_tensor_metadata`` and other assertions are
  skipped.
- ``conv2d`` / ``convolution`` with stride == kernel, no padding, dilation 1, groups 1 (a
  vision transformer's patch embedding): a GEMM over the patches (``importing.patch_conv_ops``:
  Reshape, Transpose, Reshape of the pixel input, MatMul by ``<weight>.patches`` ``[D, C*kh*kw]``,
  bias Add); followed by ``flatten(2).transpose(1, 2)`` the tokens ``[B, h*w, D]`` are written
  straight from the GEMM. Other convolutions are refused naming what differs.
- Values known at import are computed at import (``_Importer._plan_folding``): a node whose
  tensor operands are all parameters, buffers, constants or such values and that has no tensor
  operand, reads an integer/bool buffer or a computed value, or is an op tileplan does not import
  (``embedding`` of the position table by ``position_ids``, ``arange``, comparisons, ``where``,
  the resize of ``interpolate_pos_encoding``) runs its own ATen op on the values; what an imported
  op reads of the result is a parameter named after the node. An integer buffer no op reads is
  no tensor at all; one an op reads is refused naming it and its dtype.
- Integer and bool user inputs (token ids, an attention mask) are INT32 graph inputs.
  ``embedding(W, ids)`` by such an input is a Gather of the parameter's rows. HF's padding mask
  (the input cast to bool, read at ``[arange, arange]``, ``&`` with all-true constants,
  ``expand``, ``where(mask, 0, min)``) is a Cast of the input, a Mul and an Add (``_mask_bias``),
  kept at ``[B, 1, 1, T]`` and computed once; ``scaled_dot_product_attention`` becomes eager
  attention's ops with that bias (``_sdpa``). The same nodes of values known at import are
  computed at import (``_ACTIVATION_ONLY``).
- Anything else: one ``TileplanError`` listing every unsupported node by target
  (``3 unsupported nodes: aten.relu.default (2: relu, relu_1), ...``).

Dtypes: float32, float16, float8_e4m3fnuz; bfloat16 is refused naming
``--cast-bf16 fp16`` (``import_module(..., cast_bf16="fp16")`` converts it to
float16 and records it in ``Graph.imported``); integer and bool tensors are an
error naming the tensor and its dtype where an op computes on them (indices and masks known at
import are folded, above).

``load_python_factory("path/to/model.py:factory")`` imports that file, calls
``factory()``, which returns ``(module, example_inputs)`` (a tensor or a tuple of
tensors), and imports the module; the CLI uses it for ``.py:factory`` model
arguments.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from .. import checked
from ..errors import TileplanError
from .core import (Add, Cast, Concat, Div, Max, Erf, Exp, Gather, GeLU, Graph, LayerNorm, MatMul, Mul, Neg, Op, Reciprocal,
                   ReduceMax, ReduceMean, ReduceSum, Relu, Reshape, Role, Sigmoid, Softmax, Slice, Sqrt, Sub, Tanh,
                   Tensor)
from .importing import (BF16_HELP, check_cast_bf16, live_ops, patch_conv_ops, patch_conv_refusal, reduce_ops,
                        transpose_ops, unsupported_error)
from .dtypes import DType, quantise
from .patterns import fuse

INSTALL_HINT = "install the torch extra: pip install torch==2.13.0"


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


def import_module(module: Any, example_inputs: Any, *, name: str | None = None,
                  cast_bf16: str | None = None) -> TorchModel:
    """Export ``module`` on ``example_inputs`` (eval mode) and import the program. torch's own
    loggers are silenced meanwhile: a failure is the one error line, not torch's traceback."""
    torch = _torch()
    if not isinstance(module, torch.nn.Module):
        raise TileplanError(f"expected a torch.nn.Module instance, got {_what_value(module)}")
    args = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    bad = next((a for a in args if not isinstance(a, torch.Tensor)), None)
    if bad is not None or not args:
        raise TileplanError("example inputs must be a tensor or a tuple of tensors, got "
                            f"{_what_value(bad) if args else 'none'}")
    was_training = module.training
    try:
        with _quiet_torch_logs():
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
    return import_exported(program, name=name or type(module).__name__, cast_bf16=cast_bf16)


def _what_value(value: Any) -> str:
    if isinstance(value, type):
        return f"the class {value.__name__} (call it: return an instance)"
    return f"a {type(value).__name__}"


class _quiet_torch_logs:
    """While torch.export runs: no log records (torch's loggers print tracebacks at WARNING) and
    nothing on sys.stderr (on failure it prints the partial FX graph there); both restored after."""

    def __enter__(self):
        import contextlib
        import io
        import logging
        self.level = logging.root.manager.disable
        logging.disable(logging.CRITICAL)
        self.redirect = contextlib.redirect_stderr(io.StringIO())
        self.redirect.__enter__()
        return self

    def __exit__(self, *exc):
        import logging
        self.redirect.__exit__(*exc)
        logging.disable(self.level)
        return False


def from_module(module: Any, example_inputs: Any, *, name: str | None = None,
                cast_bf16: str | None = None) -> Graph:
    """The ``Graph`` of a torch module (see ``import_module``)."""
    return import_module(module, example_inputs, name=name, cast_bf16=cast_bf16).graph


def import_exported(program: Any, *, name: str = "exported", cast_bf16: str | None = None) -> TorchModel:
    """Import a ``torch.export.ExportedProgram`` (``cast_bf16="fp16"``: bfloat16 becomes float16)."""
    _torch()
    check_cast_bf16(cast_bf16)
    return _Importer(program, name, cast_bf16=cast_bf16).run()


def factory_name(path: Path, attr: str) -> str:
    """The model (and package) name of ``path.py:attr``: the factory's name (``model.py:siglip_layer`` is
    ``siglip_layer``), or the file's stem when the factory has the generic name ``factory``."""
    return checked.printable(path.stem if attr == "factory" else attr)


def load_python_factory(spec: str | Path, *, name: str | None = None, cast_bf16: str | None = None) -> TorchModel:
    """Import ``path/to/model.py:factory``: ``factory()`` returns ``(module, example_inputs)``.

    The graph is named ``factory_name(path, factory)`` unless ``name`` is given. Errors name
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
    except SystemExit as exc:                 # sys.exit() in the model file: no graph was made
        raise TileplanError(f"running {attr}() failed: it called sys.exit({exc.code!r})", source=source) from None
    except Exception as exc:
        first = " ".join(str(exc).split())[:300]
        raise TileplanError(f"running {attr}() failed: {type(exc).__name__}: {first}", source=source) from None
    finally:
        sys.modules.pop(mod_name, None)
    if not (isinstance(made, tuple) and len(made) == 2):
        raise TileplanError(f"{attr}() must return (module, example_inputs), got {type(made).__name__}",
                            source=source)
    module, example_inputs = made
    try:
        return import_module(module, example_inputs, name=name or factory_name(path, attr), cast_bf16=cast_bf16)
    except TileplanError as exc:
        raise exc.with_source(source) from None


# ---- the importer ------------------------------------------------------------

@dataclass
class _Importer:
    program: Any
    name: str
    cast_bf16: str | None = None
    value: dict[str, str] = field(default_factory=dict)             # fx node name -> tensor name
    known: dict[str, Tensor] = field(default_factory=dict)          # every tensor so far, tileplan shapes
    declared: dict[str, Tensor] = field(default_factory=dict)       # inputs, parameters, Cast outputs
    transposed: dict[str, tuple[str, Any]] = field(default_factory=dict)  # fx node -> (tensor, the node)
    params: dict[str, np.ndarray] = field(default_factory=dict)
    ops: list[Op] = field(default_factory=list)
    converted: int = 0                       # bf16 tensors converted under cast_bf16
    pieces: dict[str, tuple] = field(default_factory=dict)   # a split's fx node -> (source, dim, bounds, squeeze)
    consts: dict[str, Any] = field(default_factory=dict)      # fx node -> its torch value known at import
    const_names: dict[str, str] = field(default_factory=dict)  # fx node -> tensor name, if it becomes one
    folded: set[str] = field(default_factory=set)    # fx nodes computed at import (not parameters as such)
    consumed: set[str] = field(default_factory=set)  # fx nodes another node's handler has imported
    # fx node -> (INT32 tensor, torch shape): a bool value that is an integer input read as a 0/1
    # mask, through identity indexing, ``&`` with all-true constants and ``expand`` (``_mask``)
    masks: dict[str, tuple[str, tuple]] = field(default_factory=dict)
    mask_biases: dict[tuple, str] = field(default_factory=dict)   # (mask, shape, x, y, dtype) -> its bias

    def run(self) -> TorchModel:
        sig = self.program.graph_signature
        specs = {spec.arg.name: spec for spec in sig.input_specs if hasattr(spec.arg, "name")}
        missing: dict[str, list[str]] = {}
        self._plan_folding(specs)
        for node in self.program.graph.nodes:
            target = _target_name(node.target) if node.op == "call_function" else None
            if node.name in self.folded:
                continue
            if node.op == "call_function" and target not in _HANDLERS and target not in _SKIPPED:
                missing.setdefault(target, []).append(node.name)
            elif node.op not in ("placeholder", "call_function", "output"):
                missing.setdefault(f"FX {node.op}", []).append(node.name)
        if missing:
            raise unsupported_error("node", missing, supported())
        for node in self.program.graph.nodes:
            if node.op == "placeholder":
                self._placeholder(node, specs.get(node.name))
            elif node.op == "call_function":
                self._call(node)
            elif node.op != "output":
                raise TileplanError(f"node {node.name!r} ({node.op}): unsupported FX node kind; {supported()}")
        outputs = []
        fx_nodes = {n.name: n for n in self.program.graph.nodes}
        for spec in sig.output_specs:
            if spec.kind.name != "USER_OUTPUT":
                raise TileplanError(f"output {spec.arg.name!r} is a {spec.kind.name.lower()}; tileplan "
                                    "imports modules that do not mutate their buffers or inputs")
            node = fx_nodes.get(spec.arg.name)
            if node is not None and node.op == "call_function" and self.reshaped(node):
                # a dropped view is the output: the graph output keeps torch's shape (a Reshape op)
                # (named after the node, or ``<node>.view`` when the node's own op wrote that name)
                x = self.value[node.name]
                out = node.name if x != node.name else f"{node.name}.view"
                self.emit(node, Reshape(out, (x,), out, shape=_static_shape(node.meta["val"], node.name)))
            outputs.append(self.read(spec.arg.name, "the graph output"))
        rescaled: dict[str, int] = {}
        ops = live_ops(fuse(self.ops, self.scalar, outputs, self.known.get, rescaled), outputs)
        for name, exponent in rescaled.items():        # fp8-matmul: a dequantised weight's 2**s
            self.declared[name] = dataclasses.replace(self.declared[name], scale=exponent)
        read, produced = {t for op in ops for t in op.inputs}, {op.output for op in ops}
        tensors = [t for t in self.declared.values()
                   if (t.role is Role.INTERMEDIATE and t.name in produced) or t.name in read]
        params = {k: v for k, v in self.params.items() if k in read}
        graph = Graph.build(self.name, tensors, ops, outputs=list(dict.fromkeys(outputs)))
        if self.cast_bf16:
            graph.imported = {"cast_bf16": self.cast_bf16, "converted_bf16_tensors": self.converted}
        return TorchModel(graph, params)

    def _plan_folding(self, specs: dict) -> None:
        """Which nodes are computed at import (``folded``): every ATen call whose tensor operands are
        all known at import (parameters, buffers, lifted constants, earlier folded values) and that
        has no tensor operand (``arange``, ``zeros``, ``full``), reads an integer/bool buffer or a
        folded value (``position_ids`` and the ``embedding`` of a parameter by them, comparisons,
        ``where`` over such masks), or is an op tileplan does not import as such (the bicubic
        resize of ``interpolate_pos_encoding`` at the fixed exported size); and, so that such a node
        has its operands' values, every node known at import that a folded node reads (the
        reshape and permute of the position table before the resize).
        Non-float buffers and constants are folded values themselves: they never become tensors.

        Design decision: a folded node is evaluated by calling its own ATen op on the torch values
        (``_fold``), not a numpy re-implementation: torch's semantics exactly, for any op, and the
        values are small index and shape tensors. A node of an imported op reading parameters only
        (``t(W)``, a Cast of an FP8 weight) stays an op: the MatMul transpose flags and the ``fp8-matmul`` pattern
        need to see it. What a real op then reads of a folded value becomes a parameter (float)
        or is refused naming its dtype (``read``).
        """
        known: set[str] = set()
        nodes = list(self.program.graph.nodes)
        calls = {n.name for n in nodes if n.op == "call_function"}
        for node in nodes:
            if node.op == "placeholder":
                spec = specs.get(node.name)
                if spec is not None and spec.kind.name in ("PARAMETER", "BUFFER", "CONSTANT_TENSOR"):
                    known.add(node.name)
                    val = node.meta.get("val")
                    if _is_tensor(val) and str(val.dtype).removeprefix("torch.") not in _FLOAT_DTYPES:
                        self.folded.add(node.name)
            elif node.op == "call_function":
                if _target_name(node.target) in _SKIPPED:
                    continue
                operands = _tensor_operands(node)
                if all(a in known for a in operands):
                    known.add(node.name)
                    if (not operands or _target_name(node.target) not in _HANDLERS
                            or _target_name(node.target) in _ACTIVATION_ONLY):
                        self.folded.add(node.name)
        while True:        # what a folded node reads is folded; what reads only folded values too
            before = len(self.folded)
            for node in reversed(nodes):
                if node.name in self.folded and node.op == "call_function":
                    self.folded |= {a for a in _tensor_operands(node) if a in known and a in calls}
            for node in nodes:
                if node.name in calls and node.name in known and any(a in self.folded for a in _tensor_operands(node)):
                    self.folded.add(node.name)
            if len(self.folded) == before:
                return

    def _fold(self, node) -> None:
        """Evaluate a folded node's ATen op on the values known at import."""
        torch = _torch()
        from torch.fx.node import map_arg
        args = map_arg(node.args, lambda n: self.consts[n.name])
        kwargs = map_arg(node.kwargs, lambda n: self.consts[n.name])
        try:
            with torch.no_grad():
                self.consts[node.name] = node.target(*args, **kwargs)
        except Exception as exc:
            first = " ".join(str(exc).split())[:200]
            raise _node_err(node, f"evaluating it at import (its operands are constants) failed: "
                                  f"{type(exc).__name__}: {first}") from None
        self.const_names[node.name] = node.name

    def _materialise(self, key: str, reader: str) -> str:
        """A folded value read by an op: a parameter (float), refused otherwise."""
        val = self.consts[key]
        tname = self.const_names.get(key, key)
        if not _is_tensor(val):
            raise TileplanError(f"{reader}: operand {tname!r} is a {type(val).__name__} computed at import; "
                                "tileplan imports tensor operands only")
        text = str(val.dtype).removeprefix("torch.")
        if text not in _FLOAT_DTYPES:
            raise TileplanError(f"{reader} reads {tname!r} ({text}, known at import); tileplan "
                                "computes on float32, float16 and float8_e4m3fnuz tensors (integer values "
                                "may only index or shape constants)")
        shape = tuple(int(d) for d in val.shape) or (1,)
        dt = self.dtype(val.dtype, tname)
        self.params[tname] = _numpy(val, tname, dt).reshape(shape)
        self.known[tname] = self.declared[tname] = Tensor(tname, shape, dt, Role.PARAMETER)
        self.value[key] = tname
        return tname

    def scalar(self, t: str) -> float | None:
        """The value of a parameter whose elements are all equal (for the pattern table)."""
        v = self.params.get(t)
        if v is None or v.size == 0:
            return None
        f = np.asarray(v, dtype=np.float64).ravel()
        return float(f[0]) if np.all(f == f[0]) else None

    def dtype(self, torch_dtype: Any, tname: str) -> DType:
        """tileplan's dtype for a torch dtype; bfloat16 is refused unless ``cast_bf16``."""
        if str(torch_dtype) == "torch.bfloat16":
            if self.cast_bf16 != "fp16":
                raise TileplanError(f"tensor {tname!r} is bfloat16; {BF16_HELP}")
            self.converted += 1
            return DType.FP16
        return _dtype(torch_dtype, tname)

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
            text = str(val.dtype).removeprefix("torch.")
            dt = DType.INT32 if text in _INT_INPUTS else self.dtype(val.dtype, tname)
        else:
            tname, role = spec.target, Role.PARAMETER
            self.consts[node.name] = self._parameter_value(tname, kind)
            self.const_names[node.name] = tname
            if node.name in self.folded:      # an integer/bool buffer: a value for folding only
                return
            shape = _static_shape(val, tname) or (1,)     # a 0-d constant broadcasts as [1]
            dt = self.dtype(val.dtype, tname)
            self.params[tname] = _numpy(self._parameter_value(tname, kind), tname, dt).reshape(shape)
        t = Tensor(tname, shape, dt, role)
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
        if isinstance(key, str) and key in self.folded and key not in self.value:
            return self._materialise(key, reader)
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

    def constant(self, name: str, value: float, like: str) -> str:
        """A one-element parameter ``name`` holding a Python number, in the dtype of tensor ``like``."""
        dt = self.known[like].dtype
        self.params[name] = quantise(np.array([float(value)]), dt)
        self.known[name] = self.declared[name] = Tensor(name, (1,), dt, Role.PARAMETER)
        return name

    def operands(self, node, args) -> tuple[str, ...]:
        """Tensors for a pointwise op's arguments; Python numbers become ``<node>.scalar`` parameters
        (``<node>.scalar1`` for the second) in the dtype of the tensor operand."""
        tensors = [a for a in args if not isinstance(a, (int, float, bool))]
        if not tensors:
            raise _node_err(node, "has no tensor operand")
        like = self.read(tensors[0], _describe(node))
        out = []
        for k, a in enumerate(args):
            if isinstance(a, bool) or not isinstance(a, (int, float)):
                out.append(self.read(a, _describe(node)))
            else:
                out.append(self.constant(f"{node.name}.scalar{k or ''}", a, like))
        return tuple(out)

    def alias(self, node, src: Any) -> None:
        self.value[node.name] = self.read(src, _describe(node))

    # -- calls --------------------------------------------------------------------

    def _call(self, node) -> None:
        target = _target_name(node.target)
        if target in _SKIPPED or node.name in self.consumed:
            return
        if node.name in self.folded:
            self._fold(node)
            return
        handler = _HANDLERS.get(target)
        if handler is None:
            raise _node_err(node, f"unsupported op; {supported()}")
        handler(self, node)

    def matmul(self, node, a, b, *, bias=None, transpose_b=False, alpha=1, beta=1) -> None:
        """``alpha * (a @ b) + beta * bias``: a MatMul, then Muls by one-element parameters
        ``<node>.alpha``/``<node>.beta`` where they are not 1, then the bias Add ``<node>.bias``."""
        (ta, fa), (tb, fb) = self.operand(a, node), self.operand(b, node)
        fb ^= transpose_b
        b_is_matrix_parameter = self.known[tb].role is Role.PARAMETER and len(self.known[tb].shape) == 2
        # A view tileplan dropped (the last dimension kept) is brought back as a Reshape where the
        # product needs torch's batch dimensions: a MatMul of two activations or with a batched
        # parameter (nn.MultiheadAttention's folded query against its keys); a row-wise product
        # with a matrix parameter reads any leading shape.
        if self.reshaped(a) and not b_is_matrix_parameter:
            ta = _source(self, node, self.transposed[a.name][1].args[0] if a.name in self.transposed else a, "view_a")
        if self.reshaped(b):
            tb = _source(self, node, self.transposed[b.name][1].args[0] if b.name in self.transposed else b, "view_b")
        out = node.name if bias is None and alpha == 1 else f"{node.name}.matmul"
        self.emit(node, MatMul(node.name, (ta, tb), out, transpose_a=fa, transpose_b=fb))
        if alpha != 1:
            scaled = node.name if bias is None else f"{node.name}.scaled"
            self.emit(node, Mul(f"{node.name}.alpha", (out, self.constant(f"{node.name}.alpha", alpha, out)), scaled))
            out = scaled
        if bias is not None:
            tbias = self.read(bias, _describe(node))
            if beta != 1:
                c = self.constant(f"{node.name}.beta", beta, tbias)
                self.emit(node, Mul(f"{node.name}.beta", (tbias, c), f"{node.name}.bias_scaled"))
                tbias = f"{node.name}.bias_scaled"
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
    imp.matmul(node, node.args[1], node.args[2], bias=node.args[0], alpha=alpha, beta=beta)


def _mm(imp: _Importer, node) -> None:
    imp.matmul(node, node.args[0], node.args[1])


def _transpose_view(imp: _Importer, node) -> None:
    """``t``/``permute``/``transpose``: a swap of the last two axes read only by MatMuls folds into
    their transpose flags; any other permutation is Transpose ops (``importing.transpose_ops``)."""
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
    swap = rank >= 2 and perm == list(range(rank - 2)) + [rank - 1, rank - 2]
    if swap and all(_target_name(u.target) in _MATMULS for u in node.users):
        imp.transposed[node.name] = (imp.read(src, _describe(node)), node)    # a MatMul transpose flag
        return
    x = _source(imp, node, src)        # a dropped reshape is made real first: the axes as written
    for op in transpose_ops(node.name, x, node.name, tuple(perm)):     # planned rearrangements
        imp.emit(node, op)


def _conv2d(imp: _Importer, node) -> None:
    """``conv2d`` (``.default`` and ``.padding``) and ``convolution`` as a patch embedding: a GEMM
    over the patches (``importing.patch_conv_ops``), the weight re-laid at import as the parameter
    ``<weight>.patches`` ``[D, C*kh*kw]``. When the output is read only by ``flatten(2)`` read only by
    ``transpose(1, 2)`` (``nn.Conv2d`` then vision transformers' tokens), the GEMM's rows are the
    tokens and the transpose's value is written directly as ``[B, h*w, D]`` (no transpose pair).
    Other convolutions are refused naming what differs (``importing.patch_conv_refusal``)."""
    target = _target_name(node.target)
    x_node, w_node = node.args[0], node.args[1]
    bias = _arg(node, 2, "bias")
    if target == "aten.convolution.default":
        stride, padding, dilation = node.args[3], node.args[4], node.args[5]
        if node.args[6]:
            raise _node_err(node, "a transposed convolution; tileplan imports patch-embedding convolutions")
        groups = node.args[8]
    else:
        stride, padding = _arg(node, 3, "stride", 1), _arg(node, 4, "padding", 0)
        dilation, groups = _arg(node, 5, "dilation", 1), _arg(node, 6, "groups", 1)
    x_shape, w_shape = (tuple(int(d) for d in n.meta["val"].shape) for n in (x_node, w_node))
    kernel = w_shape[2:]
    pair = lambda v: [int(v)] * 2 if isinstance(v, int) else [int(e) for e in v]     # noqa: E731
    if isinstance(padding, str):
        padding = [0, 0] if padding == "valid" or kernel == (1, 1) else [1, 1]     # 'same' pads a kernel > 1
    reason = patch_conv_refusal(x_shape, w_shape, stride=pair(stride), padding=pair(padding),
                                dilation=pair(dilation), groups=int(groups))
    if reason is not None:
        raise _node_err(node, reason)
    x = imp.read(x_node, _describe(node))
    w = imp.read(w_node, _describe(node))
    if imp.known[w].role is not Role.PARAMETER or w not in imp.params:
        raise _node_err(node, f"weight {w!r} is computed; tileplan imports convolutions by a parameter weight")
    weight = f"{w}.patches"
    imp.params[weight] = np.ascontiguousarray(imp.params[w].reshape(w_shape[0], -1))
    imp.known[weight] = imp.declared[weight] = Tensor(weight, imp.params[weight].shape, imp.known[w].dtype,
                                                      Role.PARAMETER)
    b = imp.read(bias, _describe(node)) if bias is not None else None
    out_node, tokens = node, False
    users = list(node.users)
    if len(users) == 1 and _target_name(users[0].target) == "aten.flatten.using_ints" \
            and [int(d) % 4 for d in (_arg(users[0], 1, "start_dim", 0), _arg(users[0], 2, "end_dim", -1))] == [2, 3]:
        after = list(users[0].users)
        if len(after) == 1 and _target_name(after[0].target) == "aten.transpose.int" \
                and sorted(int(d) % 3 for d in after[0].args[1:3]) == [1, 2]:
            out_node, tokens = after[0], True
            imp.consumed |= {users[0].name, after[0].name}
    ops, _ = patch_conv_ops(out_node.name, x, x_shape, weight, b, kernel, w_shape[0], out_node.name, tokens=tokens)
    for op in ops:
        imp.emit(out_node, op)


def _gelu(imp: _Importer, node) -> None:
    approximate = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
    if approximate not in ("none", "tanh"):
        raise _node_err(node, f"approximate={approximate!r}; expected 'none' or 'tanh'")
    x = imp.read(node.args[0], _describe(node))
    imp.emit(node, GeLU(node.name, (x,), node.name, approximate="erf" if approximate == "none" else "tanh"))


def _binary(cls: type[Op]):
    """``aten.<op>.Tensor`` / ``.Scalar``: a Binary op; a number operand is a [1] parameter.

    ``add``/``sub`` with ``alpha != 1`` scale the second operand first (folded into a number
    operand, else a Mul named ``<node>.alpha``). ``div`` with a rounding mode is refused.
    """
    def handle(imp: _Importer, node) -> None:
        a, b = node.args[0], node.args[1] if len(node.args) > 1 else node.kwargs["other"]
        alpha = node.kwargs.get("alpha", node.args[2] if len(node.args) > 2 and cls in (Add, Sub) else 1)
        if node.kwargs.get("rounding_mode") is not None:
            raise _node_err(node, f"rounding_mode={node.kwargs['rounding_mode']!r}; tileplan divides in "
                                  "floating point only")
        if alpha != 1 and isinstance(b, (int, float)):
            b, alpha = b * alpha, 1
        ta, tb = imp.operands(node, (a, b))
        kept = _adds_computed_zeros(imp, node, cls, (a, b), (ta, tb))
        if kept is not None:
            imp.value[node.name] = kept
            return
        if alpha != 1:
            scaled = f"{node.name}.scaled"
            imp.ops.append(Mul(f"{node.name}.alpha", (tb, imp.constant(f"{node.name}.alpha", alpha, tb)), scaled))
            imp.known[scaled] = Tensor(scaled, imp.known[tb].shape, imp.known[tb].dtype)
            tb = scaled
        imp.emit(node, cls(node.name, (ta, tb), node.name))
    return handle


def _adds_computed_zeros(imp: _Importer, node, cls, args, tensors) -> str | None:
    """The other operand, when an Add (or the subtrahend of a Sub) is a value computed at import
    that is all zeros and the result has the other operand's shape and dtype: the attention mask
    HF builds when none is given (``create_bidirectional_mask``: ``[B, 1, T, T]`` of zeros,
    broadcast over the heads). Only values computed at import: a parameter the user may override
    stays an Add."""
    if cls not in (Add, Sub):
        return None
    val = node.meta.get("val")
    for k in ((0, 1) if cls is Add else (1,)):
        zero, other = tensors[k], tensors[1 - k]
        if getattr(args[k], "name", None) not in imp.folded or not _is_tensor(val):
            continue
        t, v = imp.known[other], imp.params.get(zero)
        if v is not None and not np.any(np.asarray(v, dtype=np.float64)) and \
                tuple(val.shape) == t.shape and imp.dtype(val.dtype, node.name) is t.dtype:
            return other
    return None


def _unary(*classes: type[Op]):
    """A unary aten op as a chain of unary ops (``rsqrt`` is Sqrt then Reciprocal); the last is
    named after the node, the others ``<node>.<kind>``."""
    def handle(imp: _Importer, node) -> None:
        x = imp.read(node.args[0], _describe(node))
        for k, cls in enumerate(classes):
            last = k == len(classes) - 1
            out = node.name if last else f"{node.name}.{cls.kind}"
            imp.emit(node, cls(out, (x,), out))
            x = out
    return handle


def _silu(imp: _Importer, node) -> None:
    """``silu(x) = x * sigmoid(x)``: a Sigmoid ``<node>.sigmoid`` and a Mul (no fused kernel is cheaper)."""
    x = imp.read(node.args[0], _describe(node))
    imp.emit(node, Sigmoid(f"{node.name}.sigmoid", (x,), f"{node.name}.sigmoid"))
    imp.emit(node, Mul(node.name, (x, f"{node.name}.sigmoid"), node.name))


def _softmax(imp: _Importer, node) -> None:
    """``softmax(x, dim)`` / ``_softmax(x, dim, half_to_float=False)``: Softmax over ``dim``."""
    if _target_name(node.target) == "aten._softmax.default" and node.args[2]:
        raise _node_err(node, "half_to_float=True; tileplan computes softmax in the input's type")
    dtype = _arg(node, 2, "dtype") if _target_name(node.target) == "aten.softmax.int" else None
    dim = int(node.args[1])
    rank = len(node.args[0].meta["val"].shape)
    x = _source(imp, node, node.args[0]) if dim % rank != rank - 1 else imp.read(node.args[0], _describe(node))
    if dtype is not None and imp.dtype(dtype, node.name) is not imp.known[x].dtype:
        # softmax(x, dim, dtype=...) (HF eager attention asks FP32): the input cast first, as torch does.
        cast = Tensor(f"{node.name}.cast", imp.known[x].shape, imp.dtype(dtype, node.name))
        imp.emit(node, Cast(f"{node.name}.cast", (x,), cast.name), cast)
        x = cast.name
    imp.emit(node, Softmax(node.name, (x,), node.name, axis=dim if dim < 0 else dim - len(imp.known[x].shape)))


def _layer_norm(imp: _Importer, node) -> None:
    """``layer_norm(x, [C], weight, bias, eps)`` over the last axis; no weight/bias: ones/zeros
    parameters ``<node>.weight``/``<node>.bias``. A normalized_shape of more axes is refused."""
    x = imp.read(node.args[0], _describe(node))
    shape = list(_arg(node, 1, "normalized_shape"))
    if len(shape) != 1:
        raise _node_err(node, f"normalized_shape {shape}; tileplan normalises over the last axis (flatten first)")
    params = []
    for k, key, fill in ((2, "weight", 1.0), (3, "bias", 0.0)):
        t = _arg(node, k, key)
        if t is None:
            name = f"{node.name}.{key}"
            imp.constant(name, fill, x)
            imp.params[name] = np.full(shape, imp.params[name][0])
            imp.known[name] = imp.declared[name] = Tensor(name, tuple(shape), imp.known[x].dtype, Role.PARAMETER)
            params.append(name)
        else:
            params.append(imp.read(t, _describe(node)))
    imp.emit(node, LayerNorm(node.name, (x, *params), node.name, epsilon=float(_arg(node, 4, "eps", 1e-5))))


def _reduction(cls: type[Op]):
    """``mean.dim``/``sum.dim_IntList``/``amax``: a reduction over any axes (``importing.reduce_ops``)."""
    def handle(imp: _Importer, node) -> None:
        src = node.args[0]
        dims = _arg(node, 1, "dim")
        keepdim = bool(_arg(node, 2, "keepdim", False))
        if _arg(node, 3, "dtype") is not None:
            raise _node_err(node, "a dtype argument; cast the input first")
        rank = len(src.meta["val"].shape)
        dims = list(range(rank)) if dims is None or list(dims) == [] else [int(d) % rank for d in dims]
        # a dropped reshape is made real first where another axis than the last is reduced
        x = _source(imp, node, src) if dims != [rank - 1] else imp.read(src, _describe(node))
        shape = imp.known[x].shape
        dims = [d - rank + len(shape) for d in dims]
        out = tuple(1 if d in dims else s for d, s in enumerate(shape)) if keepdim else \
            tuple(s for d, s in enumerate(shape) if d not in dims)
        for op in reduce_ops(cls, node.name, x, node.name, shape, tuple(dims), out or (1,)):
            imp.emit(node, op)
    return handle


def _pow(imp: _Importer, node) -> None:
    """``pow(x, 2)`` and ``pow(x, 3)`` are Muls (``x**3`` of gelu_new); any other exponent is refused."""
    e = node.args[1] if len(node.args) > 1 else node.kwargs.get("exponent")
    if isinstance(e, bool) or not isinstance(e, (int, float)) or float(e) not in (2.0, 3.0):
        raise _node_err(node, f"exponent {e!r}; tileplan imports pow with a constant exponent 2 or 3 (as Muls)")
    x = imp.read(node.args[0], _describe(node))
    if float(e) == 2.0:
        imp.emit(node, Mul(node.name, (x, x), node.name))
        return
    imp.emit(node, Mul(f"{node.name}.square", (x, x), f"{node.name}.square"))
    imp.emit(node, Mul(node.name, (f"{node.name}.square", x), node.name))


def _cast(imp: _Importer, node) -> None:
    src = node.args[0]
    if _mask_of(imp, src) is not None and str(node.meta["val"].dtype) == "torch.bool":
        imp.masks[node.name] = imp.masks[src.name]      # a mask cast to bool again
        return
    dtype = node.kwargs.get("dtype")
    if dtype is None and _target_name(node.target) == "aten.to.dtype":
        dtype = node.args[1]
    if dtype is None and _target_name(node.target) == "aten.to.device" and len(node.args) > 2:
        dtype = node.args[2]
    x = imp.read(src, _describe(node))
    out_val = node.meta.get("val")
    if str(out_val.dtype) == "torch.bool" and imp.known[x].dtype is DType.INT32:
        imp.masks[node.name] = (x, _static_shape(out_val, node.name))     # read as 0/1 where it is used
        return
    if dtype is None or imp.dtype(out_val.dtype, node.name) is imp.known[x].dtype:
        imp.alias(node, src)          # no change of tileplan dtype (bf16 -> fp16 under cast_bf16 too)
        return
    out = Tensor(node.name, imp.known[x].shape, imp.dtype(out_val.dtype, node.name))
    imp.emit(node, Cast(node.name, (x,), node.name), out)


def _reshape(imp: _Importer, node) -> None:
    """view/reshape/flatten/squeeze/unsqueeze: dropped when the last dimension stays (tileplan ops
    work on rows), else a Reshape op to torch's output shape (free where the layout survives)."""
    src = node.args[0]
    before, after = tuple(src.meta["val"].shape), tuple(node.meta["val"].shape)
    if before and after and before[-1] == after[-1]:
        imp.alias(node, src)
        return
    x = imp.read(src, _describe(node))
    imp.emit(node, Reshape(node.name, (x,), node.name, shape=_static_shape(node.meta["val"], node.name) or (1,)))


def _split(imp: _Importer, node) -> None:
    """``split.Tensor``, ``split_with_sizes``, ``chunk`` and ``unbind.int`` (a fused QKV
    projection's ``qkv(x).chunk(3, -1)``, CLIP-style ``in_proj`` outputs): the pieces' bounds along
    the axis; each ``getitem`` of a piece is then one ``Slice`` (``_getitem``), so a piece no one
    reads costs nothing."""
    src = node.args[0]
    shape = tuple(src.meta["val"].shape)
    target = _target_name(node.target)
    dim_at = {"aten.unbind.int": 1}.get(target, 2)
    dim = int(_arg(node, dim_at, "dim", 0)) % len(shape)
    length = shape[dim]
    if target == "aten.unbind.int":
        sizes = [1] * length
    elif target == "aten.chunk.default":
        part = -(-length // int(_arg(node, 1, "chunks")))
        sizes = [min(part, length - i) for i in range(0, length, part)]
    elif target == "aten.split.Tensor" and isinstance(node.args[1], int):
        part = int(node.args[1])
        sizes = [min(part, length - i) for i in range(0, length, part)]
    else:
        sizes = [int(d) for d in _arg(node, 1, "split_sizes")]
    bounds = np.concatenate(([0], np.cumsum(sizes))).tolist()
    imp.pieces[node.name] = (src, dim, bounds, target == "aten.unbind.int")


def _source(imp: _Importer, node, src, tag: str = "shape") -> str:
    """The tensor of ``src`` in torch's shape: a Reshape ``<node>.<tag>`` where tileplan dropped
    one (a slice's axis is torch's)."""
    x = imp.read(src, _describe(node))
    if imp.reshaped(src):
        shape = _static_shape(src.meta["val"], node.name)
        out = f"{node.name}.{tag}"
        imp.emit(node, Reshape(out, (x,), out, shape=shape))
        return out
    return x


def _slice_of(imp: _Importer, node, src, dim: int, start: int, stop: int, squeeze: bool = False,
              step: int = 1) -> None:
    x = _source(imp, node, src)
    positions = Slice.positions(range(start, stop, step))
    if positions == {"start": 0, "stop": imp.known[x].shape[dim], "step": 1} and not squeeze:
        imp.value[node.name] = x
        return
    out = f"{node.name}.slice" if squeeze else node.name
    imp.emit(node, Slice(out, (x,), out, axis=dim, **positions))
    if squeeze:            # (a MatMul needs its operands' batch axes as written: the Reshape stays)
        imp.emit(node, Reshape(node.name, (out,), node.name, shape=_static_shape(node.meta["val"], node.name) or (1,)))


def _getitem(imp: _Importer, node) -> None:
    """One piece of a split (``_split``)."""
    src, index = node.args[0], node.args[1]
    if getattr(src, "name", None) not in imp.pieces or not isinstance(index, int):
        raise _node_err(node, "indexes a value that is not a split's list of pieces; tileplan imports getitem "
                              "of split, split_with_sizes, chunk and unbind")
    x, dim, bounds, squeeze = imp.pieces[src.name]
    _slice_of(imp, node, x, dim, bounds[index], bounds[index + 1], squeeze)


def _slice(imp: _Importer, node) -> None:
    """``aten.slice.Tensor(x, dim, start, end, step)`` (step positive, as torch allows): a
    ``Slice``, nothing where it keeps the whole axis."""
    src = node.args[0]
    shape = tuple(src.meta["val"].shape)
    dim = int(_arg(node, 1, "dim", 0)) % len(shape)
    start, end, step = _arg(node, 2, "start"), _arg(node, 3, "end"), _arg(node, 4, "step", 1)
    a, b, st = slice(start, end, step).indices(shape[dim])
    _slice_of(imp, node, src, dim, a, b, step=st)


def _select(imp: _Importer, node) -> None:
    """``select.int(x, dim, index)``: a one-wide ``Slice`` with the axis dropped (a Reshape)."""
    src = node.args[0]
    shape = tuple(src.meta["val"].shape)
    dim = int(_arg(node, 1, "dim")) % len(shape)
    index = int(_arg(node, 2, "index"))
    if not -shape[dim] <= index < shape[dim]:
        raise _node_err(node, f"index {index} is out of range for axis {dim} of length {shape[dim]}")
    index %= shape[dim]
    _slice_of(imp, node, src, dim, index, index + 1, squeeze=True)


def _cat(imp: _Importer, node) -> None:
    """``cat(tensors, dim)``: a ``Concat`` (a class token joined to the patch tokens). An operand
    known at import (the class token expanded over the batch, folded) is a parameter; one whose
    tileplan tensor dropped torch's shape is reshaped back first (``<node>.shape<i>``). One operand
    is that operand."""
    parts = list(_arg(node, 0, "tensors"))
    shape = tuple(node.meta["val"].shape)
    dim = int(_arg(node, 1, "dim", 0)) % len(shape)
    xs = []
    for i, src in enumerate(parts):
        x = imp.read(src, _describe(node))
        if imp.reshaped(src):
            out = f"{node.name}.shape{i}"
            imp.emit(node, Reshape(out, (x,), out, shape=_static_shape(src.meta["val"], node.name)))
            x = out
        xs.append(x)
    if len(xs) == 1:
        imp.value[node.name] = xs[0]
        return
    imp.emit(node, Concat(node.name, tuple(xs), node.name, axis=dim))


def _dropout(imp: _Importer, node) -> None:
    """Inference dropout is its input; ``train=True`` is refused."""
    if _arg(node, 2, "train", False):
        raise _node_err(node, "train=True; tileplan compiles inference dropout only (export in eval mode)")
    imp.alias(node, node.args[0])


def _identity(imp: _Importer, node) -> None:
    imp.alias(node, node.args[0])


def _embedding(imp: _Importer, node) -> None:
    """``embedding(weight, indices)`` by an integer input: a Gather of the parameter's rows (by
    indices known at import it was folded). ``padding_idx`` only affects training."""
    w = imp.read(node.args[0], _describe(node))
    idx = imp.read(node.args[1], _describe(node))
    if imp.known[w].role is not Role.PARAMETER:
        raise _node_err(node, f"the table {w!r} is computed; tileplan gathers rows of a parameter table")
    if imp.known[idx].dtype is not DType.INT32:
        raise _node_err(node, f"the indices {idx!r} are {imp.known[idx].dtype}; tileplan gathers by an integer input")
    imp.emit(node, Gather(node.name, (w, idx), node.name))


def _mask_of(imp: _Importer, arg) -> tuple[str, tuple] | None:
    return imp.masks.get(getattr(arg, "name", None))


def _all_true(imp: _Importer, arg) -> bool:
    val = imp.consts.get(getattr(arg, "name", None)) if getattr(arg, "name", None) in imp.folded else None
    return val is not None and _is_tensor(val) and bool(val.bool().all())


def _mask_index(imp: _Importer, node) -> None:
    """``mask[arange, arange]`` (HF's padding mask read at ``[batch, key]``): indices known at import
    that pick every element once, in order, are a reshape of the mask; anything else is refused."""
    torch = _torch()
    src, indices = node.args[0], node.args[1]
    m = _mask_of(imp, src)
    if m is None or not all(getattr(i, "name", None) in imp.folded for i in indices):
        raise _node_err(node, "tileplan imports indexing of an attention mask by constant indices only")
    numel = int(np.prod(m[1]))
    probe = torch.arange(numel).reshape(m[1])[tuple(imp.consts[i.name] for i in indices)]
    if probe.numel() != numel or not bool((probe.reshape(-1) == torch.arange(numel)).all()):
        raise _node_err(node, "the constant indices do not read each mask element once in order (only that "
                              "indexing of a mask is imported)")
    imp.masks[node.name] = (m[0], tuple(int(d) for d in probe.shape))


def _mask_and(imp: _Importer, node) -> None:
    """``mask & c`` with ``c`` all true known at import: the mask (its broadcast left to the reader)."""
    a, b = node.args[0], node.args[1]
    for m, c in ((a, b), (b, a)):
        if _mask_of(imp, m) is not None and _all_true(imp, c):
            imp.masks[node.name] = imp.masks[m.name]
            return
    raise _node_err(node, "tileplan imports '&' of an attention mask with an all-true constant only")


def _expand(imp: _Importer, node) -> None:
    """``expand`` of a mask: the mask, its broadcast left to the op that reads it (checked there);
    expand of any other activation is refused."""
    m = _mask_of(imp, node.args[0])
    if m is None:
        raise _node_err(node, "expand of an activation; tileplan imports expand of constants (computed at "
                              "import) and of an attention mask only")
    imp.masks[node.name] = m


def _scalar_value(imp: _Importer, arg, node) -> float:
    if isinstance(arg, (int, float)) and not isinstance(arg, bool):
        return float(arg)
    val = imp.consts.get(getattr(arg, "name", None))
    if _is_tensor(val) and val.numel() == 1:
        return float(val.reshape(-1)[0])
    raise _node_err(node, "where's values must be numbers or one-element constants")


def _where(imp: _Importer, node) -> None:
    """``where(mask, x, y)`` of an integer attention mask and two numbers (HF's additive mask: 0
    where attended, the dtype's min elsewhere): ``y + mask * (x - y)`` (``_mask_bias``). The mask
    keeps its own shape ``[B, 1, 1, T]``: the Add into the scores broadcasts it over heads and query
    rows (checked against torch's shapes of every reader, so a broadcast left out is never wrong)."""
    m = _mask_of(imp, node.args[0])
    if m is None:
        raise _node_err(node, "tileplan imports where() over an attention mask computed from an integer input")
    x, y = _scalar_value(imp, node.args[1], node), _scalar_value(imp, node.args[2], node)
    for user in node.users:
        others = [a for a in user.args if hasattr(a, "meta") and a is not node]
        want = tuple(user.meta["val"].shape) if _is_tensor(user.meta.get("val")) else None
        got = tuple(np.broadcast_shapes(m[1], *[tuple(o.meta["val"].shape) for o in others])) if want else None
        if _target_name(user.target) not in _MASK_READERS or want != got:
            raise _node_err(node, f"its mask is read by {_describe(user)}; tileplan imports an attention mask "
                                  "added to (or multiplied with) a tensor of the broadcast shape")
    imp.value[node.name] = _mask_bias(imp, node, m, x, y, imp.dtype(node.meta["val"].dtype, node.name), node.name)


def _mask_bias(imp: _Importer, node, mask: tuple[str, tuple], x: float, y: float, dt: DType, out: str) -> str:
    """``y + mask * (x - y)`` of a 0/1 integer mask (x where 1, y where 0) in ``dt``, written to
    ``out``: a Cast of the INT32 input ``<node>.mask``, a Reshape to the mask's torch shape where it
    differs, a Mul by ``x - y`` and an Add of ``y`` (one-element parameters). Design decision: an
    arithmetic form, not a select, so the Pointwise family plans it (and the mask's values are 0
    and 1: HF's contract; another value scales the bias)."""
    if not np.isfinite(x - y):
        raise _node_err(node, f"the mask's values {x!r} and {y!r} are too far apart to write as y + mask * (x - y)")
    src, shape = mask
    key = (src, shape, x, y, dt)
    if key in imp.mask_biases:               # every layer's attention reads the one bias
        return imp.mask_biases[key]
    imp.mask_biases[key] = out
    pre = node.name
    cast = Tensor(f"{pre}.mask", imp.known[src].shape, dt)
    imp.emit(node, Cast(cast.name, (src,), cast.name), cast)
    val = cast.name
    if imp.known[val].shape != shape:
        imp.emit(node, Reshape(f"{pre}.mask_shape", (val,), f"{pre}.mask_shape", shape=shape))
        val = f"{pre}.mask_shape"
    imp.emit(node, Mul(f"{pre}.mask_scaled", (val, imp.constant(f"{pre}.mask_scale", x - y, val)), f"{pre}.mask_scaled"))
    imp.emit(node, Add(out, (f"{pre}.mask_scaled", imp.constant(f"{pre}.mask_base", y, val)), out))
    return out


def _sdpa(imp: _Importer, node) -> None:
    """``scaled_dot_product_attention(q, k, v, attn_mask, dropout_p=0, is_causal, scale)``: the ops
    of eager attention, ``softmax(q @ k^T * scale + bias) @ v``: MatMul ``<node>.scores``, Mul
    ``<node>.scaled``, Add ``<node>.masked``, Softmax ``<node>.softmax``, MatMul ``<node>``. A
    bool mask from an integer input is the additive bias 0 / the dtype's min (``_mask_bias``; torch
    uses -inf, the same softmax unless a whole row is masked, which HF never builds); a float
    mask is added as it is; ``is_causal`` adds a constant ``[L, S]`` bias. Dropout, grouped-query
    attention and a bool mask not from an integer input are refused."""
    torch = _torch()
    q, k, v = (imp.read(a, _describe(node)) for a in node.args[:3])
    mask = _arg(node, 3, "attn_mask")
    if float(_arg(node, 4, "dropout_p", 0.0)) != 0.0:
        raise _node_err(node, "dropout_p is not 0; tileplan compiles inference attention")
    if node.kwargs.get("enable_gqa", False):
        raise _node_err(node, "enable_gqa=True (grouped-query attention) is not imported")
    causal = bool(_arg(node, 5, "is_causal", False))
    scale = _arg(node, 6, "scale")
    qs = imp.known[q].shape
    scale = 1.0 / float(np.sqrt(qs[-1])) if scale is None else float(scale)
    n = node.name
    dt = imp.known[q].dtype
    imp.emit(node, MatMul(f"{n}.scores", (q, k), f"{n}.scores", transpose_b=True))
    scores = f"{n}.scores"
    imp.emit(node, Mul(f"{n}.scaled", (scores, imp.constant(f"{n}.scale", scale, scores)), f"{n}.scaled"))
    x = f"{n}.scaled"
    if mask is not None:
        m = _mask_of(imp, mask)
        if m is not None:
            bias = _mask_bias(imp, node, m, 0.0, float(torch.finfo(getattr(torch, str(dt.numpy))).min), dt,
                              f"{n}.bias")
        elif str(mask.meta["val"].dtype) == "torch.bool":
            raise _node_err(node, "its bool attn_mask is not computed from an integer input")
        else:
            bias = imp.read(mask, _describe(node))
        if tuple(np.broadcast_shapes(imp.known[bias].shape, imp.known[x].shape)) != imp.known[x].shape:
            raise _node_err(node, f"attn_mask {list(imp.known[bias].shape)} does not broadcast to the scores "
                                  f"{list(imp.known[x].shape)}")
        imp.emit(node, Add(f"{n}.masked", (x, bias), f"{n}.masked"))
        x = f"{n}.masked"
    if causal:
        L, S = imp.known[x].shape[-2:]
        tri = np.where(np.tril(np.ones((L, S), dtype=bool)), 0.0, float(np.finfo(dt.numpy).min))
        imp.params[f"{n}.causal"] = tri.astype(dt.numpy)
        imp.known[f"{n}.causal"] = imp.declared[f"{n}.causal"] = Tensor(f"{n}.causal", (L, S), dt, Role.PARAMETER)
        imp.emit(node, Add(f"{n}.causal_masked", (x, f"{n}.causal"), f"{n}.causal_masked"))
        x = f"{n}.causal_masked"
    imp.emit(node, Softmax(f"{n}.softmax", (x,), f"{n}.softmax", axis=-1))
    imp.emit(node, MatMul(n, (f"{n}.softmax", v), n))


# Handlers that import an op of activations only (a mask's forms, an embedding by token ids): of
# values known at import the node is computed at import, as any op tileplan does not import.
_ACTIVATION_ONLY = {"aten.embedding.default", "aten.to.device", "aten.index.Tensor", "aten.__and__.Tensor",
                    "aten.expand.default", "aten.where.ScalarOther", "aten.where.ScalarSelf", "aten.where.Scalar",
                    "aten.where.self"}

_MASK_READERS = {"aten.add.Tensor", "aten.mul.Tensor", "aten.sub.Tensor"}


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
    "aten.conv2d.default": _conv2d,
    "aten.conv2d.padding": _conv2d,
    "aten.convolution.default": _conv2d,
    "aten.add.Tensor": _binary(Add),
    "aten.add.Scalar": _binary(Add),
    "aten.sub.Tensor": _binary(Sub),
    "aten.sub.Scalar": _binary(Sub),
    "aten.mul.Tensor": _binary(Mul),
    "aten.mul.Scalar": _binary(Mul),
    "aten.div.Tensor": _binary(Div),
    "aten.div.Scalar": _binary(Div),
    "aten.div.Tensor_mode": _binary(Div),
    "aten.neg.default": _unary(Neg),
    "aten.sqrt.default": _unary(Sqrt),
    "aten.rsqrt.default": _unary(Sqrt, Reciprocal),
    "aten.reciprocal.default": _unary(Reciprocal),
    "aten.exp.default": _unary(Exp),
    "aten.tanh.default": _unary(Tanh),
    "aten.erf.default": _unary(Erf),
    "aten.sigmoid.default": _unary(Sigmoid),
    "aten.relu.default": _unary(Relu),
    "aten.maximum.default": _binary(Max),
    "aten.silu.default": _silu,
    "aten.pow.Tensor_Scalar": _pow,
    "aten.softmax.int": _softmax,
    "aten._softmax.default": _softmax,
    "aten.layer_norm.default": _layer_norm,
    "aten.mean.dim": _reduction(ReduceMean),
    "aten.sum.dim_IntList": _reduction(ReduceSum),
    "aten.amax.default": _reduction(ReduceMax),
    "aten.to.dtype": _cast,
    "aten.to.dtype_layout": _cast,
    "aten._to_copy.default": _cast,
    "aten.view.default": _reshape,
    "aten.reshape.default": _reshape,
    "aten._unsafe_view.default": _reshape,
    "aten.flatten.using_ints": _reshape,
    "aten.unflatten.int": _reshape,
    "aten.squeeze.dim": _reshape,
    "aten.squeeze.dims": _reshape,
    "aten.squeeze.default": _reshape,
    "aten.unsqueeze.default": _reshape,
    "aten.clone.default": _identity,
    "aten.contiguous.default": _identity,
    "aten.alias.default": _identity,
    "aten.detach.default": _identity,
    "aten.dropout.default": _dropout,
    "aten.split.Tensor": _split,
    "aten.split_with_sizes.default": _split,
    "aten.chunk.default": _split,
    "aten.unbind.int": _split,
    "getitem": _getitem,
    "aten.slice.Tensor": _slice,
    "aten.select.int": _select,
    "aten.cat.default": _cat,
    "aten.embedding.default": _embedding,
    "aten.to.device": _cast,
    "aten.index.Tensor": _mask_index,
    "aten.__and__.Tensor": _mask_and,
    "aten.expand.default": _expand,
    "aten.where.ScalarOther": _where,
    "aten.where.ScalarSelf": _where,
    "aten.where.Scalar": _where,
    "aten.where.self": _where,
    "aten.scaled_dot_product_attention.default": _sdpa,
}
def supported() -> str:
    names = sorted(t.removeprefix("aten.") for t in _HANDLERS)
    return f"tileplan imports aten {', '.join(names)}"


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


_FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float8_e4m3fnuz")
# Integer and bool user inputs (token ids, attention masks) are INT32 graph inputs: the host gives
# them; a Gather reads them as indices, a Cast as a 0/1 mask (``_mask``). Values past int32 are refused
# by ``validate`` naming the input.
_INT_INPUTS = ("int64", "int32", "int16", "int8", "uint8", "bool")


def _tensor_operands(node) -> list[str]:
    """The fx nodes a call reads (in its args and kwargs, lists included)."""
    from torch.fx.node import map_arg
    found: list[str] = []
    map_arg((node.args, node.kwargs), lambda n: found.append(n.name))
    return found


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


def _numpy(value: Any, tname: str, dt: DType | None = None) -> np.ndarray:
    torch = _torch()
    t = value.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16 and dt is DType.FP16:      # --cast-bf16 fp16
        t = t.to(torch.float16)
    if t.dtype == torch.float8_e4m3fnuz:
        return t.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fnuz).copy()
    _dtype(t.dtype, tname)
    return t.numpy().copy()
