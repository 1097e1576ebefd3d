"""Hostile pipeline-stage records under `tileplan report`: a two-IPU package compiled as pipeline
stages, its plan.json's `stages` (or an op's `ipu`) damaged and re-hashed, run under the guard.
The contract: one `error:` line naming plan.json and the field, exit 2, no traceback, no hang,
nothing written outside the output folder; the intact package reports its stages."""

from __future__ import annotations

import json
import shutil

import pytest

from guarded import tree
from reliability_corpus import SMOKE, assert_refused, rehash

TIMEOUT = 60


@pytest.fixture(scope="module")
def staged_package(tmp_path_factory):
    """The smoke MLP compiled for two 64-tile IPUs as pipeline stages."""
    import tileplan  # noqa: F401
    from tileplan.graph.loaders import load_model
    from tileplan.lowering.compile import compile_model
    from tileplan.target import load_target
    out = tmp_path_factory.mktemp("staged") / "pkg"
    _, _, path = compile_model(load_model(SMOKE), load_target("ipu21-64x2"), out, jobs=1, ipus="stages")
    return path


def _run(guard, staged_package, tmp_path, edit):
    pkg = tmp_path / "pkg"
    shutil.copytree(staged_package, pkg)
    if edit is not None:
        doc = json.loads((pkg / "plan.json").read_text())
        edit(doc)
        (pkg / "plan.json").write_text(json.dumps(doc))
        rehash(pkg)
    out = tmp_path / "out"
    out.mkdir()
    before = tree(tmp_path)
    result = guard.run(["report", pkg, "--html", out / "report.html", "-q"], cwd=tmp_path, timeout=TIMEOUT)
    assert result[0] is not None, "the report hung (killed at the timeout)"
    after = tree(tmp_path)
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    assert changed <= {"out", "out/report.html"}, changed
    return result, out / "report.html"


def test_an_intact_staged_package_reports_its_stages(guard, staged_package, tmp_path):
    result, page = _run(guard, staged_package, tmp_path, None)
    assert result[0] == 0, result[2]
    html = page.read_text()
    assert 'id="stages"' in html and "Pipelined interval" in html


def _set(path, value):
    def edit(doc):
        node = doc
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return edit


@pytest.mark.parametrize("case, edit, words", [
    ("mode unknown", _set(("stages", "mode"), "<script>"), ["plan.json", "mode"]),
    ("stage on a tile past the target", _set(("stages", "stages", 0, "ipu"), 10 ** 9), ["plan.json", "ipu"]),
    ("cycles not a count", _set(("stages", "stages", 1, "cycles"), -5), ["plan.json", "cycles"]),
    ("stages not a list", _set(("stages", "stages"), {"a": 1}), ["plan.json", "stages"]),
    ("an op's ipu a string", _set(("ops", 0, "ipu"), "zero"), ["plan.json", "ipu"]),
    ("a huge stage list", _set(("stages", "stages"), [{"ipu": 0}] * 100_000), ["plan.json", "stages"]),
])
def test_a_damaged_stage_record_is_one_clear_error(guard, staged_package, tmp_path, case, edit, words):
    result, page = _run(guard, staged_package, tmp_path, edit)
    assert_refused(result, *words)
    assert not page.exists()
