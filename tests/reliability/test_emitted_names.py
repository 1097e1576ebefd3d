"""Names from a model in the emitted C++: never a path, never raw text in host.cpp.

A model (the 64-tile FP8 smoke MLP, renamed) whose tensors and ops are called ``../../../x``,
``a/b``, ``..``, names with ``"``, ``\\``, ``*/``, ``??/`` and non-ASCII letters compiles; its
host.cpp

- is printable ASCII (no raw control or bidi character a reader or ``g++ -Wbidi-chars`` could trip on),
- passes ``g++ -fsyntax-only -Wall -Werror=bidi-chars`` against the stand-in Poplar headers and builds
  with ``-DTILEPLAN_DUMP_TABLES``,
- names its data files ``t<row>_<letters>.bin`` (plain names, unique, one per host tensor), and the
  host program writes nothing outside its data folder, even for a folded output named ``../../z``,
- refuses a damaged table whose data file name is a path,
- keeps each name exact: the C++ literals, un-escaped, and the tables' strings equal the names.

The package validates on the IPU model. Names with a control character or a bidirectional or
other format control (U+202E, U+2066, ...) are refused by the model loader with one error line;
the escaping of such characters in C++ is checked on its own, by the compiler (``SAMPLES``).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from reliability_corpus import SMOKE, assert_refused

from tileplan.lowering.emit.cpp import cpp_comment, cpp_string, data_file, is_data_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "poplar"))
from harness import GXX, POPLAR_STANDIN  # noqa: E402

needs_gxx = pytest.mark.skipif(GXX is None, reason="g++ is not installed")

TENSORS = {"x": "../../../x", "w1": "a/b", "b1": "..", "w2": 'q"uote\\back*/', "b2": "bidi<evil>x",
           "y": "../../../\u00e9\u4e2d", "x8": "x8\u00e8", "h": "h\u0416", "hb": "??/hb", "g": "g\\",
           "g8": "\u4e2d", "o": "o*/"}
OPS = {"cast_x": "../../../op", "fc1": "a/b", "bias1": "..", "act": 'q"\\*/', "cast_g": "op\u00e9\u4e2d",
       "fc2": "\u00e9", "bias2": "z\u00df"}
MODEL = "m\u00e9\"*/\\"
DESCRIPTION = "d\u00e9*/"
FOLDED = [("../../z\u00e9", np.zeros(0, np.float16)), ("..", np.full((2, 3), -np.inf, np.float16))]
PLAIN = re.compile(r"^[A-Za-z0-9_.-]+\.bin$")


def q(s: str) -> str:
    return json.dumps(s)      # a JSON string (\\uXXXX escapes) is a TOML basic string


def hostile_toml(path: Path, tensors=TENSORS, ops=OPS, model=MODEL) -> Path:
    """The smoke fixture with every tensor and op renamed."""
    d = tomllib.loads(SMOKE.read_text())
    out = ["[model]", f"name = {q(model)}", 'target = "ipu21-64"', f"description = {q(DESCRIPTION)}",
           f"outputs = [{q(tensors['y'])}]", "", "[tensors]"]
    for k, v in d["tensors"].items():
        out.append(f"{q(tensors[k])} = {{ " + ", ".join(f"{a} = {json.dumps(b)}" for a, b in v.items()) + " }")
    for op in d["ops"]:
        out += ["", "[[ops]]"]
        for a, b in op.items():
            b = {"name": lambda: ops[b], "inputs": lambda: [tensors[i] for i in b],
                 "output": lambda: tensors[b]}.get(a, lambda: b)()
            out.append(f"{a} = {json.dumps(b)}")
    path.write_text("\n".join(out) + "\n")
    return path


def unescape_literal(body: str) -> str:
    """The text of a C++ narrow string literal's body as cpp_string writes it (octal bytes, \\x escapes
    of one character), decoded as UTF-8."""
    out = bytearray()
    for m in re.finditer(r"\\([0-7]{3}|.)|([^\\])", body):
        esc, ch = m.groups()
        if ch is not None:
            out += ch.encode()
        elif len(esc) == 3:
            out.append(int(esc, 8))
        else:
            out += esc.encode()
    return out.decode()


def unescape_comment(body: str) -> str:
    return re.sub(r"\\(u[0-9a-f]{4}|U[0-9a-f]{8}|.)",
                  lambda m: chr(int(m.group(1)[1:], 16)) if len(m.group(1)) > 1 else m.group(1), body)


def printable_ascii(text: str) -> bool:
    return all(ch in "\n\t" or 32 <= ord(ch) < 127 for ch in text)


@pytest.fixture(scope="module")
def package(guard, tmp_path_factory):
    """The hostile model compiled by the CLI, in a folder three levels down (``../../../x`` would land
    in the test's own scratch folder, which must stay as it was)."""
    root = tmp_path_factory.mktemp("names")
    work = root / "a" / "b" / "c"
    work.mkdir(parents=True)
    model = hostile_toml(work / "model.toml")
    code, out, err = guard.run(["compile", model, "--target", "ipu21-64", "-o", work / "pkg", "-j", "1"], work)
    assert code == 0, err
    return root, work / "pkg"


@pytest.fixture(scope="module")
def dump(package, tmp_path_factory):
    """host.cpp built with -DTILEPLAN_DUMP_TABLES (no Poplar)."""
    if GXX is None:
        pytest.skip("g++ is not installed")
    _, pkg = package
    exe = tmp_path_factory.mktemp("dump") / "dump"
    build = subprocess.run([GXX, "-std=c++17", "-O0", "-Wall", "-Werror=bidi-chars", "-DTILEPLAN_DUMP_TABLES",
                            "host.cpp", "-lz", "-o", str(exe)], cwd=pkg, capture_output=True, text=True)
    assert build.returncode == 0 and not build.stderr, build.stderr[-4000:]
    return exe


def test_host_cpp_is_printable_ascii_whatever_the_names_hold(package):
    _, pkg = package
    text = (pkg / "host.cpp").read_text(encoding="utf-8")
    assert printable_ascii(text)
    assert "../../../" not in text


@needs_gxx
def test_host_cpp_passes_a_strict_syntax_check_against_the_stand_in_headers(package):
    _, pkg = package
    build = subprocess.run([GXX, "-std=c++17", "-fsyntax-only", "-Wall", "-Werror=bidi-chars", "-I",
                            str(POPLAR_STANDIN), "host.cpp"], cwd=pkg, capture_output=True, text=True)
    assert build.returncode == 0 and not build.stderr, build.stderr[-4000:]


def test_the_model_and_target_names_round_trip_through_the_header_comment(package):
    _, pkg = package
    header = (pkg / "host.cpp").read_text().splitlines()[1]
    m = re.fullmatch(r'// Model "((?:[^"\\]|\\.)*)" on target "((?:[^"\\]|\\.)*)" \(64 tiles\): .*', header)
    assert m, header
    assert unescape_comment(m.group(1)) == MODEL and unescape_comment(m.group(2)) == "ipu21-64"
    assert "*/" not in header and "/*" not in header


def test_the_data_files_are_plain_unique_names_one_per_host_tensor(package, dump):
    _, pkg = package
    run = subprocess.run([str(dump)], cwd=pkg, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    files = [line[len("file "):] for line in run.stdout.splitlines() if line.startswith("file ")]
    assert len(files) == 6 == len(set(files))          # x, w1, b1, w2, b2 and the output y
    for f in files:
        assert PLAIN.match(f) and ".." not in f and is_data_file(f), f
    assert {"t0001_x.bin", "t0002_a_b.bin"} <= set(files)   # the name's letters show which is which


def test_the_tables_hold_every_tensor_name_exactly(package):
    """The stream handles and debug names are the names' UTF-8 bytes, in the tables (not in host.cpp)."""
    _, pkg = package
    data = (pkg / "host" / "tables.bin").read_bytes()
    for name in (TENSORS["x"], TENSORS["w1"], TENSORS["b1"], TENSORS["w2"], TENSORS["b2"], TENSORS["y"]):
        assert b"\0" + name.encode() + b"\0" in data, name


@needs_gxx
def test_a_damaged_table_naming_a_path_as_data_file_is_refused(package, dump, tmp_path):
    _, pkg = package
    data = (pkg / "host" / "tables.bin").read_bytes()
    assert data.count(b"\0t0001_x.bin\0") == 1
    (tmp_path / "host").mkdir()
    (tmp_path / "host" / "tables.bin").write_bytes(data.replace(b"\0t0001_x.bin\0", b"\0../../x.bin\0"))
    run = subprocess.run([str(dump), "host/tables.bin"], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 1 and "not a plain file name" in run.stderr, run.stderr


@needs_gxx
def test_folded_outputs_with_hostile_names_are_written_inside_the_data_folder(package, tmp_path):
    """The host writes folded outputs itself (kFolded): their files are plain names too."""
    from tileplan.graph.loaders import load_model
    from tileplan.lowering.emit import emit_host
    from tileplan.lowering.lower import lower
    from tileplan.planner.plan import plan
    from tileplan.target import load_target
    root, pkg = package
    graph = load_model(pkg.parent / "model.toml")
    target = load_target("ipu21-64")
    tp = lower(plan(graph, target).mid.program, target).tile_program
    files = emit_host(tp, target, graph.name, folded=FOLDED)
    text = files["host.cpp"].decode()
    assert printable_ascii(text)
    rows = re.findall(r'^    \{"((?:[^"\\]|\\.)*)", "((?:[^"\\]|\\.)*)", (\d+), (\d+), "', text, re.M)
    assert [unescape_literal(r[0]) for r in rows] == [n for n, _ in FOLDED]        # the names, exact
    assert [unescape_literal(r[1]) for r in rows] == ["t0006_z.bin", "t0007.bin"]   # after the 6 host tensors
    build_dir = tmp_path / "p" / "q" / "r"
    (build_dir / "host").mkdir(parents=True)
    for name, data in files.items():
        (build_dir / name).write_bytes(data)
    build = subprocess.run([GXX, "-std=c++17", "-O0", "-Wall", "-Werror=bidi-chars", "-DTILEPLAN_DUMP_TABLES",
                            "host.cpp", "-lz", "-o", "dump"], cwd=build_dir, capture_output=True, text=True)
    assert build.returncode == 0 and not build.stderr, build.stderr[-4000:]
    (build_dir / "data").mkdir()
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    run = subprocess.run(["./dump", "host/tables.bin", "data"], cwd=build_dir, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    after = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert sorted(set(after) - set(before)) == ["p/q/r/data/t0006_z.bin", "p/q/r/data/t0007.bin"]
    assert (build_dir / "data" / "t0006_z.bin").read_bytes() == b""
    assert np.all(np.frombuffer((build_dir / "data" / "t0007.bin").read_bytes(), np.float16) == -np.inf)


def test_the_package_of_the_hostile_model_validates(package, guard):
    root, pkg = package
    before = sorted(str(p.relative_to(root)) for p in root.rglob("*") if pkg not in p.parents and p != pkg)
    code, out, err = guard.run(["validate", pkg], pkg.parent, timeout=120)
    assert code == 0, err
    assert "validation passed" in out
    after = sorted(str(p.relative_to(root)) for p in root.rglob("*") if pkg not in p.parents and p != pkg)
    assert after == before


@pytest.mark.parametrize("bad", ["x\x01", "x\x1b[31m", "x\x7f", "x\x85", "x\u202e", "x\u2066"])
@pytest.mark.parametrize("where", ["tensor", "op"])
def test_a_name_with_a_control_character_is_refused_in_one_line(guard, tmp_path, bad, where):
    tensors, ops = dict(TENSORS), dict(OPS)
    if where == "tensor":
        tensors["w1"] = bad
    else:
        ops["fc1"] = bad
    model = hostile_toml(tmp_path / "model.toml", tensors, ops)
    line = assert_refused(guard.run(["compile", model, "--target", "ipu21-64", "-o", tmp_path / "pkg", "-j", "1"],
                                    tmp_path), "character", f"U+{ord(bad[1]):04X}")
    assert printable_ascii(line)
    assert not (tmp_path / "pkg").exists()


# ---- the escaping functions, checked by the compiler itself ------------------------------------------

SAMPLES = ["", "plain", '"', "\\", "\\\\", "a\\", "??/", "??=", "*/", "/*", "*//*", "\u00e9", "\u4e2d",
           "\U0001f600", "\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c", "\x00", "\x01\x1f\x7f\x85",
           "\u2028\u2029", "\\x41\u00e9", "\\1234", "1\x002"]


@needs_gxx
def test_cpp_string_literals_hold_exactly_the_utf8_bytes_as_g_plus_plus_reads_them(tmp_path):
    rows = "".join(f"  {{{cpp_string(s)}, sizeof({cpp_string(s)}) - 1}},\n" for s in SAMPLES)
    src = ("#include <cstdio>\n#include <cstddef>\nstruct S { const char *p; std::size_t n; };\n"
           f"const S kS[] = {{\n{rows}}};\n"
           "int main() {\n  for (const S &s : kS) {\n    for (std::size_t i = 0; i < s.n; ++i)"
           " std::printf(\"%02x\", static_cast<unsigned char>(s.p[i]));\n    std::printf(\"\\n\");\n  }\n}\n")
    assert printable_ascii(src)
    (tmp_path / "s.cpp").write_text(src)
    build = subprocess.run([GXX, "-std=c++17", "-Wall", "-Werror=bidi-chars", "-Wtrigraphs", "s.cpp", "-o", "s"],
                           cwd=tmp_path, capture_output=True, text=True)
    assert build.returncode == 0 and not build.stderr, build.stderr
    run = subprocess.run(["./s"], cwd=tmp_path, capture_output=True, text=True)
    assert run.stdout.split("\n")[:-1] == [s.encode().hex() for s in SAMPLES]
    assert [unescape_literal(cpp_string(s)[1:-1]) for s in SAMPLES] == SAMPLES


@needs_gxx
def test_cpp_comments_end_where_they_should(tmp_path):
    """A comment ending in a backslash would swallow the next line; ``*/`` would end a block comment."""
    lines = "".join(f"// {cpp_comment(s)}\nint k{i} = {i}; /* {cpp_comment(s)} */\n" for i, s in enumerate(SAMPLES))
    total = " + ".join(f"k{i}" for i in range(len(SAMPLES)))
    src = f"{lines}int main() {{ return ({total}) == {sum(range(len(SAMPLES)))} ? 0 : 1; }}\n"
    assert printable_ascii(src)
    (tmp_path / "c.cpp").write_text(src)
    build = subprocess.run([GXX, "-std=c++17", "-Wall", "-Werror=comment", "-Werror=bidi-chars", "c.cpp", "-o",
                            "c"], cwd=tmp_path, capture_output=True, text=True)
    assert build.returncode == 0 and not build.stderr, build.stderr
    assert subprocess.run(["./c"], cwd=tmp_path).returncode == 0
    assert [unescape_comment(cpp_comment(s)[1:-1]) for s in SAMPLES] == SAMPLES


@pytest.mark.parametrize("name", ["../../../x", "..", ".", "", "a/b", "\u202e", "\u00e9\u4e2d", "-rf", ".hidden",
                                  "x" * 500, "a..b", "CON"])
def test_data_file_names_are_plain_and_keep_the_name_s_letters(name):
    f = data_file(7, name)
    assert PLAIN.match(f) and ".." not in f and not f.startswith(".") and is_data_file(f), f
    assert f.startswith("t0007") and len(f) <= len("t0007_") + 40 + len(".bin")
    assert data_file(8, name) != f


@pytest.mark.parametrize("key, field, doc", [("../x", "a", "doc"), ("k", "a b", "doc"), ("k", "a", "d\u202e"),
                                             ("k", "a", "d */ x"), ("k", "a", "two\nlines")])
def test_a_codelet_key_field_or_doc_that_cannot_be_emitted_as_is_is_refused(key, field, doc):
    """Codelet keys become file and class names as they are: they are checked, not escaped."""
    from tileplan.errors import TileplanError
    from tileplan.kernels.codelets import _param, render
    with pytest.raises(TileplanError, match="codelet"):
        render(key, "", (_param(field, 1),), doc)
    assert render("k", "", (_param("a", 1),), "doc").vertex == "K"


def test_the_host_template_refuses_a_value_it_would_write_unescaped():
    """host.cpp.j2's environment lets only printable ASCII through: a name without its filter is an error."""
    from tileplan.errors import TileplanError
    from tileplan.lowering.emit.host import _template
    env = _template().environment
    assert env.from_string("{{ x | cpp_string }}").render(x="\u202e") == '"\\342\\200\\256"'
    with pytest.raises(TileplanError, match="unescaped"):
        env.from_string("// {{ x }}").render(x="a\u202eb")
