"""Hostile documents under `tileplan report`: each case damages one document a report reads
(plan.json, report.json, validation.json, validation.npz) of a small compiled package and runs
`tileplan report PKG --html OUT` under the guard (its own process, 2 GiB, a timeout).

The contract: one `error:` line naming the file (and the field, for a document of the wrong
shape), exit 2, no traceback, no hang, nothing written; or, where the document is optional and
leaving it out is right (no trace recorded), a clean report. Documents in the manifest are
re-hashed after the edit (`rehash`), so the report's own checks must catch the damage.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import zipfile

import numpy as np
import pytest

from guarded import tree
from reliability_corpus import assert_refused, rehash

TIMEOUT = 60


@pytest.fixture(scope="module")
def validated_package(small_package, tmp_path_factory):
    """The small package, validated once (validation.json and validation.npz)."""
    import tileplan
    dst = tmp_path_factory.mktemp("report-docs") / "validated"
    shutil.copytree(small_package, dst)
    tileplan.validate(dst)
    assert (dst / "validation.json").is_file() and (dst / "validation.npz").is_file()
    return dst


@pytest.fixture
def validated(validated_package, tmp_path):
    """A fresh copy of the validated package to damage."""
    from reliability_corpus import fresh_copy
    return fresh_copy(validated_package, tmp_path)


def report(guard, pkg):
    """Run the report into a folder of its own; returns (result, the page, what the case may write)."""
    out = pkg.parent / "out"
    out.mkdir(exist_ok=True)
    before = tree(pkg.parent)
    result = guard.run(["report", pkg, "--html", out / "report.html", "-q"], cwd=pkg.parent, timeout=TIMEOUT)
    assert result[0] is not None, "the report hung (killed at the timeout)"
    after = tree(pkg.parent)
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    assert changed <= {"out", "out/report.html"}, changed     # nothing written outside the output
    return result, out / "report.html"


def edit_json(path, edit, raw=None):
    doc = json.loads(path.read_text())
    edit(doc)
    text = json.dumps(doc, indent=1)
    for old, new in (raw or {}).items():            # literal text JSON cannot write (NaN, huge numbers)
        text = text.replace(old, new)
    path.write_text(text)


def _set(path: str, value):
    """An edit setting ``a.b[2].c`` to ``value``."""
    def edit(doc):
        keys = [int(k) if k.isdigit() else k for k in path.replace("[", ".").replace("]", "").split(".")]
        node = doc
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value
    return edit


# ---- plan.json and report.json: in the manifest, re-hashed after the edit ----------------------------

PACKAGE_CASES = {
    # case: (file, edit, raw text replacements, words the error must name)
    "tiles 10^9": ("plan.json", _set("tiles", 10 ** 9), None, ["plan.json", "tiles", "1000000000", "expected 64"]),
    "a string for cycles": ("plan.json", _set("ops[1].estimate.cycles", "5337"), None,
                            ["plan.json", "ops[1].estimate.cycles", "expected an integer"]),
    "a list for the totals": ("plan.json", _set("totals", [1, 2]), None, ["plan.json", "totals", "expected an object"]),
    "NaN roofline": ("plan.json", _set("roofline_cycles", "@NAN@"), {'"@NAN@"': "NaN"},
                     ["plan.json", "NaN is not a finite number"]),
    "a huge integer": ("plan.json", _set("totals.cycles", "@BIG@"), {'"@BIG@"': "9" * 400},
                       ["plan.json", "does not fit in 64 bits"]),
    "negative memory": ("plan.json", _set("ops[0].memory.total", -5), None, ["plan.json", "ops[0].memory.total"]),
    "a peak tile past the tiles": ("plan.json", _set("totals.peak_tile", 64), None, ["plan.json", "totals.peak_tile"]),
    "an object for the runner-ups": ("plan.json", _set("runner_ups.fc1", {"a": 1}), None,
                                     ["plan.json", "runner_ups['fc1']", "expected a list"]),
    "an op without its estimate": ("plan.json", lambda d: d["ops"][2].pop("estimate"), None,
                                   ["plan.json", "ops[2].estimate", "missing"]),
    "a grid of 10^9 blocks": ("plan.json", _set("ops[1].grid.gm", 10 ** 9), None, ["plan.json", "ops[1].grid.gm"]),
    "a per-tile list one short": ("report.json", lambda d: d["memory"]["tile_estimate"].pop(), None,
                                  ["report.json", "memory.tile_estimate", "expected 64"]),
    "null for a step": ("report.json", _set("estimate_steps[0]", None), None, ["report.json", "estimate_steps[0]"]),
    "a list for the memory": ("report.json", _set("memory", []), None, ["report.json", "memory", "expected an object"]),
    "a number for a pass": ("report.json", _set("passes[0]", 3.5), None, ["report.json", "passes[0]"]),
}


@pytest.mark.parametrize("case", PACKAGE_CASES)
def test_a_package_document_of_the_wrong_shape_is_refused_naming_the_field(guard, damaged, case):
    name, edit, raw, words = PACKAGE_CASES[case]
    edit_json(damaged / name, edit, raw)
    rehash(damaged)
    (result, page) = report(guard, damaged)
    assert_refused(result, *words)
    assert not page.exists()


# ---- validation.json and validation.npz: outside the manifest -------------------------------------

def _npz(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


def _npy(a) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def _huge_header() -> bytes:
    """An .npy header declaring 10^6 x 10^6 int32 values, and no data."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<i4", "fortran_order": False, "shape": (10 ** 6, 10 ** 6)})
    return buf.getvalue()


def _fifo(name):
    def make(pkg):
        (pkg / name).unlink()
        os.mkfifo(pkg / name)
    return make


def _json(edit, raw=None):
    return lambda pkg: edit_json(pkg / "validation.json", edit, raw)


def _write(name, data: bytes):
    return lambda pkg: (pkg / name).write_bytes(data)


RUN_CASES = {
    # case: (damage, words the error must name)
    "trace naming /etc/passwd": (_json(_set("trace", "/etc/passwd")), ["validation.json", "trace", "/etc/passwd"]),
    "trace naming ../": (_json(_set("trace", "../pkg/validation.npz")), ["validation.json", "trace"]),
    "trace naming another file of the package": (_json(_set("trace", "program.npz")), ["validation.json", "trace"]),
    "a number for the trace": (_json(_set("trace", 7)), ["validation.json", "trace"]),
    "a list for the record": (_write("validation.json", b"[1, 2]"), ["validation.json", "not an object"]),
    "a list for an output's figures": (_json(_set("outputs.y", [1])), ["validation.json", "outputs['y']"]),
    "a string for the cycles": (_json(_set("cycles", "many")), ["validation.json", "cycles", "expected an integer"]),
    "NaN cycles": (_json(_set("steps[2].cycles", "@NAN@"), {'"@NAN@"': "NaN"}), ["validation.json", "NaN"]),
    "a huge integer": (_json(_set("sync", "@BIG@"), {'"@BIG@"': "9" * 5000}), ["validation.json", "64 bits"]),
    "10^18 cycles": (_json(_set("compute", 10 ** 18)), ["validation.json", "compute", "above"]),
    "a memory peak per tile one short": (_json(lambda d: d["memory_peak"].pop()),
                                         ["validation.json", "memory_peak", "expected 64"]),
    "steps the program does not have": (_json(lambda d: d["steps"].append(d["steps"][0])),
                                        ["validation.json", "steps", "16 items, expected 15"]),
    "a step kind the run never has": (_json(_set("steps[0].kind", "<b>x</b>")), ["validation.json", "steps[0].kind"]),
    "a FIFO for validation.json": (_fifo("validation.json"), ["validation.json", "FIFO"]),
    "a FIFO for the trace": (_fifo("validation.npz"), ["validation.npz", "FIFO"]),
    "a folder for the trace": (lambda pkg: ((pkg / "validation.npz").unlink(), (pkg / "validation.npz").mkdir()),
                               ["validation.npz", "folder"]),
    "the trace missing": (lambda pkg: (pkg / "validation.npz").unlink(), ["validation.npz"]),
    "a trace member that is not .npy": (_write("validation.npz", _npz({"tile_cycles.txt": b"1 2 3"})),
                                        ["validation.npz", "not an .npy"]),
    "a trace member that is not an array": (_write("validation.npz", _npz({"tile_cycles.npy": b"\x93NUMPY junk"})),
                                            ["validation.npz", "tile_cycles"]),
    "a trace of the wrong shape": (_write("validation.npz", _npz({"tile_cycles.npy": _npy(np.zeros((3, 3), np.int32))})),
                                   ["validation.npz", "tile_cycles"]),
    "a trace of floats": (_write("validation.npz", _npz({"tile_cycles.npy": _npy(np.zeros((15, 64)))})),
                          ["validation.npz", "float64"]),
    "a trace claiming 10^12 elements": (_write("validation.npz", _npz({"tile_cycles.npy": _huge_header()})),
                                        ["validation.npz", "tile_cycles"]),
    "a trace of negative cycles": (_write("validation.npz", _npz({"tile_cycles.npy": _npy(np.full((15, 64), -1, np.int32))})),
                                   ["validation.npz", "cycles"]),
    "a 300 MB validation.json": (lambda pkg: (pkg / "validation.json").write_bytes(b" " * (300 << 20)),
                                 ["validation.json", "limit"]),
}


@pytest.mark.parametrize("case", RUN_CASES)
def test_a_damaged_validation_record_or_trace_is_refused(guard, validated, case):
    damage, words = RUN_CASES[case]
    damage(validated)
    (result, page) = report(guard, validated)
    line = assert_refused(result, *words)
    assert "root:" not in line and "/bin/bash" not in line      # nothing of /etc/passwd is shown
    assert not page.exists()


def test_a_validated_package_reports_its_trace(guard, validated):
    (result, page) = report(guard, validated)
    assert result[0] == 0, result[2]
    assert 'id="trace"' in page.read_text()


def test_a_record_without_a_trace_reports_without_one(guard, validated):
    """The trace is optional: a record naming none gives a report without the trace view, whatever
    lies at validation.npz."""
    edit_json(validated / "validation.json", _set("trace", None))
    os.mkfifo(validated / "x.fifo")
    (validated / "validation.npz").unlink()
    os.mkfifo(validated / "validation.npz")
    (result, page) = report(guard, validated)
    assert result[0] == 0, result[2]
    text = page.read_text()
    assert 'id="trace"' not in text and "No per-tile trace" in text


def test_an_unvalidated_package_reports_without_a_run(guard, damaged):
    (result, page) = report(guard, damaged)
    assert result[0] == 0, result[2]
    assert "This package has not been validated" in page.read_text()
