"""A large program's host files are emitted in a forked process (``lowering.compile.host_files``): the
package is byte-identical to one emitted in process, and an error in the child is the caller's."""

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


def test_host_files_emitted_in_a_forked_process_give_the_package_emitted_in_process(planned, tmp_path, monkeypatch):
    path = FIXTURES / "encoder_tower_small.toml"
    _, target, p = planned(path)
    got = {}
    for name, steps in (("in-process", 10**9), ("forked", 1)):
        monkeypatch.setattr(lc, "FORK_HOST_STEPS", steps)
        host = lc.host_files(p, lc.lower(p.mid.program, target), target)
        assert isinstance(host, Forked) == (name == "forked")
        host.cancel()
        _, pkg = lc.compile_plan(p, target, tmp_path / name, params=load_params(path))
        got[name] = _files(Path(pkg))
    assert got["forked"] == got["in-process"]
    assert "host/tables.bin" in got["forked"] and "host.cpp" in got["forked"]


def _fails():
    raise TileplanError("the child's own error")


def test_an_error_in_a_forked_call_is_raised_by_its_caller():
    with pytest.raises(TileplanError, match="the child's own error"):
        Forked(_fails, (), "a test call")()
