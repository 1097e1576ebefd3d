"""ONNX's own backend node cases, run through tileplan: import, compile onto ``ipu21-64``, validate.

The cases come from the installed ``onnx`` package (``onnx.backend.test.case.node``:
importing one op's module there registers its cases, with the model, the inputs
and the expected outputs ONNX's reference computed). Each case is imported with
``import_onnx``, compiled with ``compile_model`` onto the 64-tile target and run
on the IPU model by ``validate_package`` against the case's own expected
outputs, at the tolerance of the output's dtype (``sim.validate.TOLERANCES``).

Rules, applied by the harness and listed, never silent:

- ``STATIC_ARGUMENTS``: inputs that ONNX passes as tensors but that are static
  arguments of the op (a Reshape's shape, Squeeze/Unsqueeze and reduction axes,
  Dropout's ratio) become initializers holding the case's values. tileplan plans static
  graphs, as an exporter writes them. A Gather's data is a table (an initializer, as an embedding's
  is); its indices, ``INDEX_INPUTS``, stay integer graph inputs (token ids: INT32 inputs).
- Excluded by type: a case whose data inputs or outputs are integer or bool
  tensors (out of scope), sequences or optionals (not tensors), or another float format than FLOAT, FLOAT16 and
  FLOAT8E4M3FNUZ (DOUBLE, BFLOAT16, the other FP8 and FP4 formats: tileplan's
  IPU has none of them). ``excluded()`` lists them with the rule.
- Inputs are fed and outputs compared in the shapes the case declares, 0-d ones
  too: the package keeps a graph's declared shapes at its boundary
  (``Graph.boundary_shape``), though a 0-d tensor is ``[1]`` inside.

``python tests/conformance/onnx_backend.py`` prints the per-op table the README
carries (cases, excluded, passed, failed and why).
"""

from __future__ import annotations

import copy
import importlib
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# ONNX op type -> the module of onnx.backend.test.case.node that holds its cases.
COVERED = {
    "MatMul": "matmul", "Gemm": "gemm", "Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div",
    "Neg": "neg", "Sqrt": "sqrt", "Reciprocal": "reciprocal", "Exp": "exp", "Tanh": "tanh", "Erf": "erf",
    "Sigmoid": "sigmoid", "Relu": "relu", "Max": "max", "Gelu": "gelu", "Cast": "cast", "CastLike": "castlike", "Identity": "identity",
    "Dropout": "dropout", "Reshape": "reshape", "Flatten": "flatten", "Squeeze": "squeeze",
    "Unsqueeze": "unsqueeze", "Transpose": "transpose", "LayerNormalization": "layernormalization",
    "Softmax": "softmax", "ReduceSum": "reducesum", "ReduceMean": "reducemean", "ReduceMax": "reducemax",
    "Split": "split", "Slice": "slice", "Concat": "concat", "Gather": "gather",
}
# ONNX op type -> input positions that are static arguments (become initializers).
STATIC_ARGUMENTS = {"Reshape": (1,), "Squeeze": (1,), "Unsqueeze": (1,), "Dropout": (1,), "ReduceSum": (1,),
                    "ReduceMean": (1,), "ReduceMax": (1,), "Split": (1,), "Slice": (1, 2, 3, 4),
                    "Gather": (0,)}
# ONNX op type -> input positions that are integer indices tileplan takes as INT32 graph inputs (token
# ids): those integer inputs run (not excluded by type).
INDEX_INPUTS = {"Gather": (1,)}
TARGET = "ipu21-64"
FLOAT_TYPES = {"FLOAT", "FLOAT16", "FLOAT8E4M3FNUZ"}


@dataclass(frozen=True)
class Case:
    op: str
    name: str
    model: object                    # onnx.ModelProto
    inputs: tuple                    # numpy arrays, in graph-input order
    outputs: tuple

    def excluded_because(self) -> str | None:
        """The dtype rule excluding this case, or None when it runs."""
        import onnx
        g = self.model.graph
        static = _static_inputs(self.model)
        indices = _static_inputs(self.model, INDEX_INPUTS)
        for vi in list(g.input) + list(g.output):
            if vi.name in static:
                continue
            if not vi.type.HasField("tensor_type"):
                return f"not a tensor: {vi.name!r} is a sequence or optional"
            label = onnx.TensorProto.DataType.Name(vi.type.tensor_type.elem_type)
            if label in FLOAT_TYPES:
                continue
            if vi.name in indices and label in ("INT64", "INT32"):
                continue
            if label.startswith(("INT", "UINT")) or label == "BOOL":
                return f"integer/bool: {vi.name!r} is {label}"
            return f"float format tileplan has not: {vi.name!r} is {label}"
        return None


def collect() -> list[Case]:
    """Every backend node case of the covered op types, in ONNX's order."""
    import onnx.backend.test.case.node as node_cases
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for module in dict.fromkeys(COVERED.values()):
            importlib.import_module(f"onnx.backend.test.case.node.{module}")
    by_module = {m: op for op, m in COVERED.items()}
    out = []
    for c in node_cases._NodeTestCases:
        op = _main_op(c.model)
        if op not in COVERED or by_module.get(COVERED[op]) != op:
            continue
        (ins, outs), = c.data_sets
        out.append(Case(op, c.name, c.model, tuple(ins), tuple(outs)))
    return out


def _main_op(model) -> str | None:
    """The op a case tests: the op its name spells (``test_castlike_..._expanded`` is CastLike's
    function body), else its only node."""
    import re
    name = model.graph.name
    spelled = [(op, p) for op in COVERED
               for p in (op.lower(), re.sub(r"(?<!^)(?=[A-Z])", "_", op).lower())
               if name.startswith(f"test_{p}_") or name == f"test_{p}"]
    if spelled:
        return max(spelled, key=lambda t: len(t[1]))[0]
    nodes = model.graph.node
    return nodes[0].op_type if len(nodes) == 1 else None


def _static_inputs(model, positions=None) -> set[str]:
    """Graph inputs that some node reads as a static argument (or at ``positions``' inputs)."""
    graph_inputs = {vi.name for vi in model.graph.input}
    names = set()
    for n in model.graph.node:
        for k in (STATIC_ARGUMENTS if positions is None else positions).get(n.op_type, ()):
            if k < len(n.input) and n.input[k] in graph_inputs:
                names.add(n.input[k])
    return names


def prepared_model(case: Case):
    """The case's model with its static-argument inputs turned into initializers."""
    from onnx import TensorProto, numpy_helper
    model = copy.deepcopy(case.model)
    g = model.graph
    static = _static_inputs(model)
    values = dict(zip([vi.name for vi in case.model.graph.input], case.inputs))
    values = {k: numpy_helper.to_array(v) if isinstance(v, TensorProto) else np.asarray(v) for k, v in values.items()}
    keep = [vi for vi in g.input if vi.name not in static]
    for name in static:
        g.initializer.append(numpy_helper.from_array(np.asarray(values[name]), name))
    del g.input[:]
    g.input.extend(keep)
    return model


@dataclass
class Outcome:
    passed: bool
    detail: str


def run(case: Case, workdir: Path) -> Outcome:
    """Import, compile and validate one case; a TileplanError is a failure with its message."""
    from tileplan.errors import TileplanError
    from tileplan.graph.core import Role
    from tileplan.graph.onnx import import_onnx
    from tileplan.lowering.compile import compile_model
    from tileplan.lowering.package import load_package
    from tileplan.sim.validate import TOLERANCES, validate_package
    from tileplan.target import load_target

    try:
        model = import_onnx(prepared_model(case), name=case.name)
        graph = model.graph
        target = load_target(TARGET)
        _, _, path = compile_model(graph, target, workdir / "pkg", params=model.params, jobs=1)
        pkg = load_package(path)
        by_name = dict(zip([vi.name for vi in case.model.graph.input], case.inputs))
        inputs = {t.name: _as(by_name[t.name], graph.boundary_shape(t.name)) for t in graph.by_role(Role.INPUT)}
        want = dict(zip([vi.name for vi in case.model.graph.output], case.outputs))
        outs = graph.by_role(Role.OUTPUT)
        expected = {t.name: _as(want[t.name], graph.boundary_shape(t.name)) for t in outs}
        np.savez(workdir / "inputs.npz", **inputs)
        np.savez(workdir / "expected.npz", **expected)
        worst = {}
        for t in outs:
            atol, rtol = TOLERANCES[t.dtype]
            v = validate_package(pkg, inputs_path=workdir / "inputs.npz", expected_path=workdir / "expected.npz",
                                 atol=atol, rtol=rtol)
            fig = v.outputs[t.name]
            worst[t.name] = fig
            if not fig["passed"]:
                return Outcome(False, f"output {t.name!r} ({t.dtype}) outside tolerance atol {atol:g} rtol "
                                      f"{rtol:g}: max abs err {fig['max_abs']:.3g}, nonfinite "
                                      f"{fig['nonfinite']}")
    except TileplanError as exc:
        return Outcome(False, f"error: {exc}")
    return Outcome(True, ", ".join(f"{k}: max abs err {f['max_abs']:.3g}" for k, f in worst.items()))


def _as(array, shape) -> np.ndarray:
    """A case's array as float64, which must have the shape the package declares for it."""
    from onnx import TensorProto, numpy_helper
    if isinstance(array, TensorProto):
        array = numpy_helper.to_array(array)
    a = np.asarray(array).astype(np.float64)
    if a.shape != tuple(shape):
        raise ValueError(f"array of shape {a.shape} is not the package's declared shape {tuple(shape)}")
    return a


def table(cases: list[Case]) -> str:
    """The README table: per op, the cases, how many are excluded by dtype, pass and fail."""
    rows, failures = [], []
    for op in COVERED:
        mine = [c for c in cases if c.op == op]
        excluded = [c for c in mine if c.excluded_because()]
        passed = 0
        for c in mine:
            if c.excluded_because():
                continue
            with tempfile.TemporaryDirectory() as tmp:
                try:
                    o = run(c, Path(tmp))
                except Exception as exc:       # a crash is a failure too (the tests show its traceback)
                    o = Outcome(False, f"crash: {type(exc).__name__}: {exc}")
            passed += o.passed
            if not o.passed:
                failures.append(f"- `{c.name}`: {o.detail}")
        ran = len(mine) - len(excluded)
        rows.append(f"| {op} | {len(mine)} | {len(excluded)} | {passed} / {ran} |")
    head = "| op | cases | excluded (dtype) | pass |\n|---|---:|---:|---:|"
    return "\n".join([head, *rows, "", *failures])


if __name__ == "__main__":
    print(table(collect()))
    sys.exit(0)
