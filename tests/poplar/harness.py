"""Compile emitted Poplar C++ against tests/poplar's stand-in headers; run codelets.

Shared by the kernel tests (every variant's codelet) and the emission tests
(every codelet of a compiled package, and the syntax of its ``host.cpp``).
Test modules put this folder on ``sys.path`` and ``import harness``.

``run_codelets(cases, workdir)`` writes every case's input vectors as raw binary
files, generates ONE C++ file holding every codelet (each in its own namespace)
with a ``main`` that binds each vertex's fields to buffers loaded from those
files, sets its scalar parameters, runs ``compute(w)`` for every worker and
writes the outputs back; compiles it with a single g++ invocation and returns
the outputs as numpy arrays. Output buffers start filled with 0xA5 bytes so an
element no worker writes shows up as a mismatch.
"""

from __future__ import annotations

import dataclasses

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import ml_dtypes

from tileplan.graph.dtypes import DType
from tileplan.kernels import CodeletSource, MatMulCall, default_registry

POPLAR_STANDIN = Path(__file__).resolve().parent
GXX = shutil.which("g++")
NUMPY_OF_CTYPE = {"float": np.float32, "half": np.float16, "unsigned char": np.uint8, "int": np.int32}


@dataclass
class Case:
    codelet: CodeletSource
    inputs: dict[str, np.ndarray]      # field name -> array (FP8 as uint8 or float8 arrays)


def _runner(cases: list[Case]) -> str:
    parts = ["""#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>
#include <poplar/HalfFloat.hpp>
#include <poplar/Vertex.hpp>

template <typename T> std::vector<T> load(const std::string &path, std::size_t n) {
  std::vector<T> v(n);
  std::ifstream f(path, std::ios::binary);
  if (!f.read(reinterpret_cast<char *>(v.data()), n * sizeof(T))) { std::fprintf(stderr, "cannot read %s\\n", path.c_str()); std::exit(3); }
  return v;
}
template <typename T> void save(const std::string &path, const std::vector<T> &v) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char *>(v.data()), v.size() * sizeof(T));
}
template <typename T> std::vector<T> poisoned(std::size_t n) {
  std::vector<T> v(n);
  std::memset(static_cast<void *>(v.data()), 0xA5, n * sizeof(T));
  return v;
}
"""]
    for i, case in enumerate(cases):
        cs = case.codelet
        lines = [f"namespace case{i} {{", cs.source, "void run(const std::string &dir) {", f"  static {cs.vertex} v;"]
        for f in cs.fields:
            if f.direction == "input":
                lines.append(f'  auto {f.name}_buf = load<{f.ctype}>(dir + "/c{i}_{f.name}.bin", {f.size});')
                lines.append(f"  v.{f.name}.bind({f.name}_buf.data(), {f.name}_buf.size());")
            elif f.direction == "output":
                lines.append(f"  auto {f.name}_buf = poisoned<{f.ctype}>({f.size});")
                lines.append(f"  v.{f.name}.bind({f.name}_buf.data(), {f.name}_buf.size());")
            else:
                lines.append(f"  v.{f.name} = {f.value};")
        lines.append("  for (unsigned w = 0; w < poplar::MultiVertex::numWorkers(); ++w)")
        lines.append(f'    if (!v.compute(w)) {{ std::fprintf(stderr, "case {i} failed\\n"); std::exit(4); }}')
        for f in cs.outputs:
            lines.append(f'  save(dir + "/c{i}_{f.name}.bin", {f.name}_buf);')
        lines += ["}", f"}}  // namespace case{i}"]
        parts.append("\n".join(lines))
    calls = "\n".join(f"  case{i}::run(dir);" for i in range(len(cases)))
    parts.append(f"int main(int argc, char **argv) {{\n  const std::string dir = argv[1];\n{calls}\n  return 0;\n}}\n")
    return "\n\n".join(parts)


def run_codelets(cases: list[Case], workdir: Path) -> list[dict[str, np.ndarray]]:
    workdir.mkdir(parents=True, exist_ok=True)
    for i, case in enumerate(cases):
        for f in case.codelet.inputs:
            data = np.ascontiguousarray(case.inputs[f.name])
            want = np.dtype(NUMPY_OF_CTYPE[f.ctype])
            if data.dtype != want:
                data = data.view(want) if data.dtype.itemsize == want.itemsize else data.astype(want)
            assert data.size == f.size, (case.codelet.key, f.name, data.size, f.size)
            data.tofile(workdir / f"c{i}_{f.name}.bin")
    source = workdir / "codelets_main.cpp"
    source.write_text(_runner(cases))
    exe = workdir / "codelets_main"
    # -O0: half the compile CPU of -O1 (10 vs 20 s for the kernel tests' 36,000 lines); the runs take
    # well under a second either way and write the same bytes (x86-64 SSE arithmetic, no contraction).
    build = subprocess.run([GXX, "-std=c++17", "-O0", "-Wall", "-Wno-unused-function", "-I", str(POPLAR_STANDIN),
                            str(source), "-o", str(exe)], capture_output=True, text=True)
    if build.returncode:
        raise AssertionError(f"g++ failed:\n{build.stderr[-6000:]}")
    run = subprocess.run([str(exe), str(workdir)], capture_output=True, text=True, timeout=120)
    if run.returncode:
        raise AssertionError(f"codelet runner failed ({run.returncode}):\n{run.stderr}")
    results = []
    for i, case in enumerate(cases):
        results.append({f.name: np.fromfile(workdir / f"c{i}_{f.name}.bin", dtype=NUMPY_OF_CTYPE[f.ctype])
                        for f in case.codelet.outputs})
    return results


def syntax_check(source: Path) -> None:
    """``g++ -std=c++17 -fsyntax-only -I tests/poplar source``; fails with the compiler's message."""
    build = subprocess.run([GXX, "-std=c++17", "-fsyntax-only", "-Wall", "-I", str(POPLAR_STANDIN), str(source)],
                           capture_output=True, text=True)
    if build.returncode or build.stderr:
        raise AssertionError(f"g++ -fsyntax-only {source.name}:\n{build.stderr[-6000:]}")


# ---- sample data and agreement with the numpy semantics ------------------------------------

def random(rng, dtype: DType, size: int, std: float = 1.0) -> np.ndarray:
    x = rng.normal(0.0, std, size)
    if dtype is DType.FP8:
        return np.clip(x, -240, 240).astype(np.float32).astype(ml_dtypes.float8_e4m3fnuz)
    return x.astype(dtype.numpy)


def comparison_for(call) -> str:
    """How a primitive's codelet output is compared with its numpy semantics (see ``compare``)."""
    return {"matmul": "matmul", "gelu": "gelu", "bias_gelu": "gelu", "unary": "unary", "softmax": "exp",
            "softmax_partial": "exp", "softmax_combine": "exp", "softmax_apply": "exp"}.get(call.primitive, "exact")


def _ulp(values: np.ndarray, dtype: DType) -> np.ndarray:
    v = np.abs(values.astype(dtype.numpy))
    with np.errstate(invalid="ignore"):
        return np.abs(np.spacing(v)).astype(np.float64)


def compare(variant, call, inputs, comparison, got: np.ndarray, out_dtype: DType, output: int = 0) -> None:
    """Agreement: bit-exact for casts, copies, pack/unpack, adds and reductions (the
    same FP32 operations in the same order, one rounding); for matmul within one
    ulp of the output type plus the FP32 accumulation-order bound
    ``k * 2**-23 * sum|a*b|`` (numpy's BLAS sums in a different order than the
    vertex's sequential K loop); for GeLU within one ulp of the output type plus
    ``|x| * 2**-22`` (the C library's tanhf/erff are within an ulp or two of the
    float64 value the reference rounds, and ``1 + t`` magnifies that absolutely by
    at most |x|/2 ulp of 1); for the softmax family (``"exp"``) within one ulp of the output
    type plus ``2**-20 |want|``: each FP32 exp, the C library's double exp rounded to FP32 against
    numpy's, may differ by one FP32 ulp (2**-23 relative), which the sum of positive terms and
    the scaling by its reciprocal carry to at most about 3 * 2**-23 relative. ``output`` picks one
    output of a kernel with several (the reference returns them as a tuple, in field order)."""
    FP16, FP32 = DType.FP16, DType.FP32
    want = variant.reference(call, *inputs.values())
    if isinstance(want, tuple):
        want = want[output]
    if comparison == "exact" or out_dtype is DType.FP8:
        # Bit-exact, except that any NaN matches any NaN for FP16/FP32 (payloads differ).
        want_bits, got_bits = np.ascontiguousarray(want), np.ascontiguousarray(got).view(want.dtype)
        both_nan = np.zeros(want.shape, bool)
        if out_dtype in (FP16, FP32):
            both_nan = np.isnan(want_bits) & np.isnan(got_bits)
        uint = np.dtype(f"u{want.dtype.itemsize}")
        bad = np.flatnonzero((want_bits.view(uint) != got_bits.view(uint)) & ~both_nan)
        assert bad.size == 0, (f"{variant.name} {call}: {bad.size} elements differ, e.g. at {bad[:5]}: "
                               f"want {want_bits[bad[:5]]} got {got_bits[bad[:5]]}")
        return
    w = want.astype(np.float64)
    g = got.view(out_dtype.numpy).astype(np.float64)
    if comparison == "matmul":
        bound_call = MatMulCall(call.m, call.n, call.k, FP32, FP32, b_format=call.b_format, grain=call.grain)
        mags = {name: np.abs(x.astype(np.float32)) for name, x in inputs.items()}
        sum_abs = default_registry()["amp_fp32"].reference(bound_call, mags["a"], mags["b"]).astype(np.float64)
        tol = _ulp(w, out_dtype) + call.k * 2.0 ** -23 * sum_abs * 2.0 ** call.out_scale
    elif comparison == "unary":
        # The C library's expf/tanhf/erff/sqrtf against float64 rounded to FP32: FP32 outputs within
        # 4 ulp (sigmoid as 1 / (1 + expf(-x)) compounds two roundings), FP16 within one ulp.
        tol = _ulp(w, out_dtype) * (4 if out_dtype is FP32 else 1)
    elif comparison == "exp":
        tol = _ulp(w, out_dtype) + 2.0 ** -20 * np.abs(w)
    else:
        if call.primitive == "reduce":
            # A reduction's GeLU epilogue: its input is the rounded sum, the reduction without it.
            plain = dataclasses.replace(call, gelu="", cast_to=None, cast_scale=0)
            x = np.abs(variant.reference(plain, *inputs.values()).astype(np.float64))
        elif "bias" in inputs:
            bias = np.tile(inputs["bias"].astype(np.float64), w.size // inputs["bias"].size)
            x = np.abs(inputs["a"].astype(np.float64) + bias)
        else:
            x = np.abs(inputs["in"].astype(np.float64))
        tol = _ulp(w, out_dtype) + x * 2.0 ** -22
    same = (w == g) | (np.isnan(w) & np.isnan(g))
    with np.errstate(invalid="ignore"):
        close = np.abs(w - g) <= tol
    bad = np.flatnonzero(~(same | close))
    assert bad.size == 0, (f"{variant.name} {call}: {bad.size} elements out of tolerance, e.g. "
                           f"want {w[bad[:3]]} got {g[bad[:3]]}")
