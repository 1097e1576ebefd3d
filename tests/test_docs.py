"""The documentation runs: every Python example in docs/ is executed as a doctest, and every
``tileplan`` command line in the README and docs/ names a command and options that exist.

The site itself is built by ``.ci/run`` (``mkdocs build --strict``: warnings are errors).
"""

from __future__ import annotations

import doctest
import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]


def _blocks(path: Path, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", path.read_text(), re.S)


PYCON = [(p, i, b) for p in PAGES for i, b in enumerate(_blocks(p, "pycon"))]


@pytest.mark.parametrize("page,index,block", PYCON, ids=[f"{p.name}#{i}" for p, i, _ in PYCON])
def test_python_examples_run_as_doctests(page, index, block, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    text = block.replace("/tmp/smoke", str(tmp_path / "smoke"))
    test = doctest.DocTestParser().get_doctest(text, {}, f"{page.name}#{index}", str(page), 0)
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    runner.run(test)
    assert runner.summarize(verbose=False).failed == 0


def test_there_are_python_examples():
    assert any(p.name == "python-api.md" for p, _, _ in PYCON)


def _command_lines() -> list[tuple[str, str]]:
    out = []
    for page in PAGES:
        for block in re.findall(r"```[a-z]*\n(.*?)```", page.read_text(), re.S):
            for line in block.splitlines():
                for part in re.split(r"&&|\|", line.split("#")[0]):
                    part = part.strip()
                    if part.startswith("tileplan ") and "..." not in part:
                        out.append((page.name, part))
    return out


COMMANDS = _command_lines()


def _click_command():
    import typer.main
    from tileplan.cli import app
    return typer.main.get_command(app)


@pytest.mark.parametrize("page,line", COMMANDS, ids=[f"{p}:{line[:50]}" for p, line in COMMANDS])
def test_command_lines_name_commands_and_options_that_exist(page, line):
    words = shlex.split(line)[1:]
    cmd, path = _click_command(), ["tileplan"]
    while words and hasattr(cmd, "commands") and words[0] in cmd.commands:
        cmd = cmd.commands[words[0]]
        path.append(words.pop(0))
    assert len(path) > 1 or words[0] in ("--version", "-V", "--help", "-h"), f"{page}: no such command in {line!r}"
    known = {o for p in cmd.params for o in (*getattr(p, "opts", ()), *getattr(p, "secondary_opts", ()))}
    known |= {"--help", "-h"}
    for w in words:
        if w.startswith("-") and len(w) > 1:
            assert w.split("=")[0] in known, f"{page}: {' '.join(path)} has no option {w!r} ({line!r})"


def test_there_are_command_lines():
    assert {"compile", "validate", "report"} <= {line.split()[1] for _, line in COMMANDS}


def test_the_readme_is_an_entry_page():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (REPO / link).is_file(), link
