"""Names from a model, a target file or a path reach the terminal as text.

Rich markup in an op or tensor name (``m[/bold]x``, ``x[bias]``) is printed literally by every
command, never parsed (a ``MarkupError`` traceback, or a name silently dropped as a style). A
control or bidi character in a target's name or description, or in a model's names, is refused
at load with one error line naming the file and the field. A path or file stem the user gave is
printed with its control characters escaped (``\\x1b``), in output and in error lines alike.
Each case runs through the ``guard`` (its own process, memory limit, timeout).
"""

from __future__ import annotations

import shutil
import unicodedata
from pathlib import Path

import pytest

from reliability_corpus import FIXTURES, SMOKE, assert_refused

# Ops of the smoke MLP renamed to markup-like names; tensors too.
OP_NAMES = {"fc1": "m[/bold]x", "bias1": "x[bias]", "act": "[red]r[/red]", "fc2": "[link=http://x]y"}
TENSOR_NAMES = {"b1": "x[bias]", "y": "[red]r[/red]", "w2": "[link=http://x]y"}
MODEL_NAME = "m[/bold]x"

# What each command shows of the names (a compact table may cut a long cell, never a name column).
SHOWN = {
    "show": [MODEL_NAME, *OP_NAMES.values(), *TENSOR_NAMES.values()],
    "plan": [MODEL_NAME, *OP_NAMES.values()],
    "compile": [MODEL_NAME],
    "validate": [MODEL_NAME, TENSOR_NAMES["y"]],
    "report": [MODEL_NAME, *OP_NAMES.values()],
    "report --compare": [f"A = {MODEL_NAME} @", *OP_NAMES.values()],
}

ESC_STEM = "evil\x1b]0;pwned\x07"          # sets a terminal's window title
ESC_STEM_SHOWN = "evil\\x1b]0;pwned\\x07"  # as printed: the escapes, as text
ESC_DIR = "pkg\x1b[2J"                    # clears the screen
ESC_DIR_SHOWN = "pkg\\x1b[2J"


def raw_controls(text: str) -> list[str]:
    """Characters a terminal would act on (newlines end lines; every other control, format
    (bidi) or separator character counts)."""
    return [c for c in text if c != "\n" and unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")]


def assert_text_only(result) -> tuple[str, str]:
    code, out, err = result
    assert code == 0, (code, out, err)
    assert "Traceback" not in err and "MarkupError" not in err, err
    assert raw_controls(out) == [], [hex(ord(c)) for c in raw_controls(out)]
    assert raw_controls(err) == [], [hex(ord(c)) for c in raw_controls(err)]
    return out, err


def hostile_toml(text: str = SMOKE.read_text()) -> str:
    for old, new in OP_NAMES.items():
        text = text.replace(f'name = "{old}"', f'name = "{new}"')
    for old, new in TENSOR_NAMES.items():      # declarations, op inputs/outputs, [model] outputs
        text = (text.replace(f"\n{old} ", f'\n"{new}" ').replace(f'"{old}"', f'"{new}"'))
    return text.replace('name = "mlp_smoke_fp8"', f'name = "{MODEL_NAME}"')


@pytest.fixture(scope="module")
def cases(tmp_path_factory, guard):
    """The hostile models, compiled once: the renamed TOML model into ``pkg``, the ONNX copy named
    with an ESC into a folder named with one."""
    d = tmp_path_factory.mktemp("names")
    (d / "names.toml").write_text(hostile_toml())
    shutil.copy(FIXTURES / "mlp_smoke_fp8.onnx", d / f"{ESC_STEM}.onnx")
    toml = guard.run(["compile", "names.toml", "-o", "pkg", "-j", "1"], d, timeout=300)
    onnx = guard.run(["compile", f"{ESC_STEM}.onnx", "-o", ESC_DIR, "-j", "1", "-t", "ipu21-64"], d, timeout=300)
    return d, toml, onnx


def test_the_renamed_model_holds_every_name():
    text = hostile_toml()
    for name in (*OP_NAMES, *TENSOR_NAMES):
        assert f'"{name}"' not in text and f"\n{name} " not in text, name
    for name in (*OP_NAMES.values(), *TENSOR_NAMES.values()):
        assert f'"{name}"' in text, name


@pytest.mark.parametrize("command", list(SHOWN))
def test_markup_in_names_prints_literally(cases, guard, command):
    d, compiled, _ = cases
    args = {"show": ["show", "names.toml"], "plan": ["plan", "names.toml", "-j", "1"],
            "validate": ["validate", "pkg"], "report": ["report", "pkg"],
            "report --compare": ["report", "pkg", "--compare", "pkg", "--html", "compare.html"]}
    result = compiled if command == "compile" else guard.run(args[command], d, timeout=300)
    out, _ = assert_text_only(result)
    for name in SHOWN[command]:
        assert name in out, (name, out)


@pytest.mark.parametrize("command", ["show", "plan", "compile", "validate", "report"])
def test_escape_in_file_and_folder_names_is_shown_as_text(cases, guard, command):
    d, _, compiled = cases
    args = {"show": ["show", f"{ESC_STEM}.onnx", "-t", "ipu21-64"],
            "plan": ["plan", f"{ESC_STEM}.onnx", "-t", "ipu21-64", "-j", "1"],
            "validate": ["validate", ESC_DIR], "report": ["report", ESC_DIR]}
    result = compiled if command == "compile" else guard.run(args[command], d, timeout=300)
    out, _ = assert_text_only(result)
    assert ESC_STEM_SHOWN in out, out         # the model is named after the file: its stem, escaped
    if command in ("compile", "report"):      # "into <folder>", "wrote <folder>/report.html"
        assert ESC_DIR_SHOWN in out, out


TARGET_FIELDS = [("description", "window title \x1b]0;pwned\x07"),
                 ("description", "clears \x1b[2J the screen"),
                 ("name", "ipu\u202e46-12upi")]


@pytest.mark.parametrize("command", ["show", "plan", "compile", "machines"])
@pytest.mark.parametrize("field,value", TARGET_FIELDS, ids=["osc-title", "clear-screen", "bidi-override"])
def test_control_characters_in_a_target_are_refused(tmp_path, guard, command, field, value):
    preset = (Path(__file__).resolve().parents[2] / "tileplan" / "targets" / "ipu21-64.toml").read_text()
    lines = [f"{field} = {_toml_string(value)}" if line.startswith(f"{field} =") else line
             for line in preset.splitlines()]
    assert any(line.startswith(f"{field} = ") and "\\u" in line for line in lines)
    target = tmp_path / "esc_target.toml"
    target.write_text("\n".join(lines) + "\n")
    shutil.copy(SMOKE, tmp_path / "model.toml")
    args = {"show": ["show", "model.toml", "-t", target], "plan": ["plan", "model.toml", "-t", target],
            "compile": ["compile", "model.toml", "-o", "out", "-t", target], "machines": ["machines", target]}
    result = guard.run(args[command], tmp_path)
    assert_refused(result, str(target), f"target {field}")
    assert raw_controls(result[1] + result[2]) == []
    assert not (tmp_path / "out").exists()


def _toml_string(value: str) -> str:
    """A TOML basic string with every non-ASCII or control character as a \\uXXXX escape (the file
    itself stays plain ASCII; TOML decodes the escapes)."""
    return '"' + "".join(c if " " <= c < "\x7f" and c not in '"\\' else f"\\u{ord(c):04x}" for c in value) + '"'


@pytest.mark.parametrize("where,named", [
    ('name = "act"', "op name"),
    ('name = "mlp_smoke_fp8"', "model name"),
])
def test_control_characters_in_model_names_are_refused(tmp_path, guard, where, named):
    key, _, value = where.partition(" = ")
    text = SMOKE.read_text().replace(where, f'{key} = "a\\u202eb\\u001b[2Jc"')
    (tmp_path / "model.toml").write_text(text)
    result = guard.run(["show", "model.toml", "-t", "ipu21-64"], tmp_path)
    assert_refused(result, "model.toml", named, "U+202E")
    assert raw_controls(result[1] + result[2]) == []


def test_an_error_line_shows_a_path_escaped(tmp_path, guard):
    result = guard.run(["show", "missing\x1b[2J\u202e.toml"], tmp_path)
    line = assert_refused(result, "missing\\x1b[2J\\u202e.toml")
    assert raw_controls(line) == []


def test_a_plan_cache_warning_shows_its_path_escaped(tmp_path, guard):
    shutil.copy(SMOKE, tmp_path / "model.toml")
    cache = tmp_path / ESC_DIR
    first = guard.run(["plan", "model.toml", "-j", "1", "--cache", cache], tmp_path, timeout=300)
    assert_text_only(first)
    entries = sorted(cache.rglob("*.entry"))
    assert entries
    for entry in entries:                     # every entry damaged: the next plan warns about each
        entry.write_bytes(b"\x1b[2J not an entry")
    out, err = assert_text_only(guard.run(["plan", "model.toml", "-j", "1", "--cache", cache], tmp_path, timeout=300))
    warnings = [line for line in err.splitlines() if line.startswith("warning: plan cache entry")]
    assert warnings, err
    assert all(ESC_DIR_SHOWN in line for line in warnings), warnings
