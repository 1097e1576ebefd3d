"""The two test lanes of docs/testing.md: ``pytest -q -n 2`` (the whole suite) and
``pytest -q -n 2 -m "not slow"`` (the fast lane). The ``slow`` marker must be registered and markers
strict, so that a mistyped marker is an error rather than a test silently left in the fast lane."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_slow_marker_is_registered_and_markers_are_strict(pytestconfig):
    assert any(m.split(":")[0].strip() == "slow" for m in pytestconfig.getini("markers"))
    assert "--strict-markers" in pytestconfig.getini("addopts")


def test_the_fast_lane_leaves_out_exactly_the_slow_tests(tmp_path):
    """A scratch test file with one slow and one ordinary test, collected with the lane's marker
    expression (the repository's pytest configuration), and a mistyped marker refused."""
    (tmp_path / "test_scratch.py").write_text(
        "import pytest\n\n@pytest.mark.slow\ndef test_long():\n    pass\n\ndef test_short():\n    pass\n")
    (tmp_path / "test_typo.py").write_text("import pytest\n\n@pytest.mark.slwo\ndef test_typo():\n    pass\n")
    base = [sys.executable, "-m", "pytest", "-c", str(REPO / "pyproject.toml"), "--rootdir", str(tmp_path),
            "-p", "no:cacheprovider", "--collect-only", "-q"]
    fast = subprocess.run(base + ["-m", "not slow", str(tmp_path / "test_scratch.py")], capture_output=True,
                          text=True, timeout=120)
    assert fast.returncode == 0, fast.stdout + fast.stderr
    assert "test_short" in fast.stdout and "test_long" not in fast.stdout and "1 deselected" in fast.stdout
    typo = subprocess.run(base + [str(tmp_path / "test_typo.py")], capture_output=True, text=True, timeout=120)
    assert typo.returncode != 0 and "slwo" in typo.stdout + typo.stderr
