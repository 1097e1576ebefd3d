"""The top-level Python API: tileplan.load_model / plan / compile / validate / report."""

from __future__ import annotations

import doctest
import json
import pydoc
import re
import subprocess
import sys
from pathlib import Path

import tileplan

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "fixtures" / "mlp_smoke_fp8.toml"
API = ("load_model", "plan", "compile", "validate", "report")


def test_help_lists_the_five_functions_with_their_docstrings():
    text = pydoc.render_doc(tileplan, renderer=pydoc.plaintext)
    for name in API:
        assert f"{name}(" in text
        assert getattr(tileplan, name).__doc__.strip()


def test_import_tileplan_imports_no_planner_numpy_or_rich():
    code = ("import sys, tileplan; tileplan.plan; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'rich', 'typer', 'ortools') "
            "or m.startswith('tileplan.') and m != 'tileplan._version'))")   # the version string alone
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_plan_takes_a_path_or_a_graph_and_gives_the_same_plan():
    from tileplan.planner.planjson import plan_to_json
    graph = tileplan.load_model(SMOKE)
    a = plan_to_json(tileplan.plan(SMOKE))
    b = plan_to_json(tileplan.plan(graph, "ipu21-64"))
    assert a == b and a["model"] == "mlp_smoke_fp8" and a["target"] == "ipu21-64"
    assert a["model_floor"]["cycles"] <= a["totals"]["cycles"]


def test_validate_records_the_run_and_report_compares_packages(tmp_path):
    a = tileplan.compile(SMOKE, tmp_path / "a")
    b = tileplan.compile(REPO / "fixtures" / "mlp_fp16_small.toml", tmp_path / "b")
    v = tileplan.validate(a)
    record = json.loads((a / "validation.json").read_text())
    assert record["cycles"] == v.profile.cycles and record["trace"] == "validation.npz"
    html = tileplan.report(a, tmp_path / "r.html", compare=[b]).read_text()
    assert 'id="compare-select"' in html and "mlp_fp16_small @" in html


def test_a_bad_model_raises_the_one_error_type(tmp_path):
    import pytest

    from tileplan.errors import TileplanError
    with pytest.raises(TileplanError, match="no such model file"):
        tileplan.load_model(tmp_path / "missing.toml")
