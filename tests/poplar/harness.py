"""Compile emitted codelets against tests/poplar's stand-in headers and run them.

``run_codelets(cases, workdir)`` writes every case's input vectors as raw binary
files, generates ONE C++ file holding every codelet (each in its own namespace)
with a ``main`` that binds each vertex's fields to buffers loaded from those
files, sets its scalar parameters, runs ``compute(w)`` for every worker and
writes the outputs back; compiles it with a single g++ invocation and returns
the outputs as numpy arrays. Output buffers start filled with 0xA5 bytes so an
element no worker writes shows up as a mismatch.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tileplan.kernels import CodeletSource

POPLAR_STANDIN = Path(__file__).resolve().parents[1] / "poplar"
GXX = shutil.which("g++")
NUMPY_OF_CTYPE = {"float": np.float32, "half": np.float16, "unsigned char": np.uint8}


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
    build = subprocess.run([GXX, "-std=c++17", "-O1", "-Wall", "-Wno-unused-function", "-I", str(POPLAR_STANDIN),
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
