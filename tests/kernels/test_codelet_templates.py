"""The codelets' C++ lives in template files (tileplan/kernels/templates/*.cpp.j2); the kernel modules
pass them data. Checked on the source (no C++ statement left in a kernel module, no template unused)
and on every rendered codelet of the kernel codelet cases (plain C++: no template syntax left, no
trailing blanks, no run of blank lines). tests/kernels/test_kernel_codelets.py compiles and runs them."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

import tileplan.kernels
from tileplan.kernels import default_registry

from test_kernel_codelets import build_cases  # (tests/kernels is on sys.path)

KERNELS = Path(tileplan.kernels.__file__).parent
TEMPLATES = KERNELS / "templates"
CPP_STATEMENT = re.compile(r"for \(unsigned|store_as<\w|class \w+ : public poplar|poplar::(Input|Output)<")


def test_no_kernel_module_holds_a_cpp_statement():
    for module in sorted(KERNELS.glob("*.py")):
        hits = [line.strip() for line in module.read_text().splitlines() if CPP_STATEMENT.search(line)]
        assert hits == [], (module.name, hits)


def test_every_template_is_rendered_or_imported():
    names = {p.name for p in TEMPLATES.glob("*.cpp.j2")}
    python = "\n".join(p.read_text() for p in KERNELS.glob("*.py"))
    used = {f"{n}.cpp.j2" for n in re.findall(r'\bbody\(\s*"(\w+)"', python)}
    used |= set(re.findall(r'get_template\("([\w.]+)"\)', python))
    used |= {n for p in TEMPLATES.glob("*.cpp.j2") for n in re.findall(r'{%\s*import\s+"([\w.]+)"', p.read_text())}
    assert "codelet.cpp.j2" in used and names == used


def test_every_rendered_codelet_is_plain_cpp():
    registry = default_registry()
    sources = {registry[name].codelet(call).source for name, call, _, _ in build_cases(np.random.default_rng(7))}
    assert len(sources) > 150
    for source in sources:
        assert not re.search(r"{{|{%|{#|#}|%}|}}\s*$", source, re.M), source[:200]
        assert "\n\n\n" not in source and source.endswith("  }\n};\n")
        assert all(line == line.rstrip() for line in source.splitlines()), source[:200]
        assert all(32 <= ord(ch) < 127 or ch == "\n" for ch in source)
