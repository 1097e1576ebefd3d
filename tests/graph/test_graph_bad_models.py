"""Bad model files: each gives one `error:` line naming the file and the problem, exit 2.

Every file in bad_models/ starts with ``# expect: <words>``: the words the error
message must contain.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tileplan.cli import main

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BAD_MODELS = Path(__file__).resolve().parent / "bad_models"

BAD = sorted(BAD_MODELS.glob("*.toml"))


def expected_words(path) -> str:
    first = path.read_text().splitlines()[0] if path.read_text() else ""
    assert first.startswith("# expect: "), f"{path.name} must start with '# expect: ...'"
    return first.removeprefix("# expect: ")


def check_one_error_line(path, code, err):
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    assert str(path) in lines[0]
    assert expected_words(path) in lines[0]
    assert "Traceback" not in err


def test_there_are_enough_bad_models():
    assert len(BAD) >= 15


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.stem)
def test_bad_model_gives_one_error_line_and_exit_2(path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["show", str(path)])
    out, err = capsys.readouterr()
    check_one_error_line(path, info.value.code, err)
    assert out == ""                        # nothing printed before the error


@pytest.mark.parametrize("name", ["malformed_toml", "cycle", "unknown_target", "explicit_layout_gap"])
def test_bad_model_through_the_installed_command(name):
    path = BAD_MODELS / f"{name}.toml"
    proc = subprocess.run([sys.executable, "-c", "from tileplan.cli import main; main()", "show", str(path)],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    check_one_error_line(path, proc.returncode, proc.stderr)
    assert proc.stdout == ""
