"""A large plan's documents and host files are worked out in forked processes (``lowering.compile.beside``):
the package is byte-identical to one made in process, and an error in the child is the caller's."""

from __future__ import annotations

from pathlib import Path

import pytest

from tileplan.errors import TileplanError
from tileplan.forked import Forked
from tileplan.graph.loaders import load_params
from tileplan.lowering import compile as lc

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def _files(root: Path) -> dict[str, bytes]:
    return {str(f.relative_to(root)): f.read_bytes() for f in sorted(root.rglob("*")) if f.is_file()}


def test_a_package_made_in_forked_processes_is_the_package_made_in_process(planned, tmp_path, monkeypatch):
    # Forking is forced (FORK_STEPS = 1), so any plan shows it: the small encoder layer's, which the
    # session has planned for other tests (the small tower's plan alone cost 20 CPU-seconds here).
    path = FIXTURES / "encoder_layer_small.toml"
    _, target, p = planned(path)
    made = []
    real = lc.beside
    monkeypatch.setattr(lc, "beside", lambda big, *a: made.append(big) or real(big, *a))
    got = {}
    for name, steps in (("in-process", 10**9), ("forked", 1)):
        monkeypatch.setattr(lc, "FORK_STEPS", steps)
        _, pkg = lc.compile_plan(p, target, tmp_path / name, params=load_params(path))
        got[name] = _files(Path(pkg))
    assert made == [False, False, True, True]          # (documents, host) in process, then forked
    assert got["forked"] == got["in-process"]
    assert "host/tables.bin" in got["forked"] and "host.cpp" in got["forked"]


def _fails():
    raise TileplanError("the child's own error")


def test_an_error_in_a_forked_call_is_raised_by_its_caller():
    with pytest.raises(TileplanError, match="the child's own error"):
        Forked(_fails, (), "a test call")()
