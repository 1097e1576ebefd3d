"""Shared test fixtures: running the CLI in-process."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Design decision: when the environment says not to write bytecode beside the sources
# (PYTHONDONTWRITEBYTECODE), the suite keeps its compiled bytecode in a cache folder outside the
# tree instead of compiling every module from source in every process: otherwise each xdist
# worker re-runs pytest's assertion rewriting of ~100 test files and compiles tileplan afresh
# (about 15 of a worker's 26 CPU-seconds of collection). The source tree stays free of
# __pycache__ either way. Set before tileplan and the test modules are imported, in this process
# only: a subprocess given the folder (PYTHONPYCACHEPREFIX) would look there for the standard
# library's bytecode too, and, not writing, compile it at every start (0.2 instead of 0.03 CPU-s
# for a bare interpreter).
if sys.dont_write_bytecode and not sys.pycache_prefix:
    _cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    sys.pycache_prefix = str(_cache / "tileplan-tests" / "pycache")
    sys.dont_write_bytecode = False

# The progress display's stage lines (stderr, when not a terminal: tileplan.progress) are off for the
# suite, whose CLI runs check stderr whole; tests/test_cli_progress.py turns them on where it checks them.
# Set at import, before any forked or spawned tileplan (the reliability guard's server inherits it).
os.environ["TILEPLAN_PROGRESS"] = "off"

from tileplan.cli import main


@pytest.fixture(autouse=True)
def wide_output(monkeypatch):
    """Piped output is 160 columns wide unless COLUMNS says otherwise: keep table cells on one line."""
    monkeypatch.delenv("COLUMNS", raising=False)


@pytest.fixture(autouse=True)
def private_plan_cache(monkeypatch, tmp_path_factory):
    """The default plan cache (~/.cache/tileplan) of CLI runs lives in a temporary folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "xdg-cache"))


@pytest.fixture
def cli(capsys):
    """``cli(*argv) -> (exit status, stdout, stderr)`` of one ``tileplan`` run in-process."""

    def run(*argv) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as info:
            main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return info.value.code or 0, out, err

    return run


@pytest.fixture(scope="session")
def planned():
    """``planned(model_path) -> (graph, target, plan)``: the model file planned once per session with the
    planner's defaults (shared costing, no plan cache), on the model's own target. Tests that only read
    the plan share it; a test that changes planning options plans for itself."""
    from tileplan.graph.loaders import load_model
    from tileplan.planner.plan import plan
    from tileplan.target import load_target
    memo = {}

    def get(path):
        if path not in memo:
            graph = load_model(path)
            target = load_target(graph.target)
            memo[path] = graph, target, plan(graph, target)
        return memo[path]

    return get
