"""Damaged packages whose manifest was re-hashed after the edit: the content checks must refuse them.

Each recipe edits one file of a small compiled package, recomputes the manifest's
digests, and runs ``tileplan validate``: exit 2, one line naming the package (and
the file), no traceback, and the IPU model never runs on the bad arrays.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tileplan.lowering.package import FORMAT
from tileplan.lowering.tile_program import deterministic_npz

from reliability_corpus import assert_refused, rehash


def edit_json(name, change):
    def recipe(pkg):
        doc = json.loads((pkg / name).read_text())
        (pkg / name).write_text(json.dumps(change(doc)))
    return recipe


def write_text(name, text):
    def recipe(pkg):
        (pkg / name).write_text(text)
    return recipe


def edit_program(change):
    """Edit program.npz's arrays: ``change(arrays)`` mutates the dict of arrays in place."""
    def recipe(pkg):
        with np.load(pkg / "program.npz") as z:
            arrays = {k: z[k] for k in z.files}
        change(arrays)
        (pkg / "program.npz").write_bytes(deterministic_npz(arrays))
    return recipe


def first(arrays, suffix):
    return next(k for k in sorted(arrays) if k.endswith(suffix))


def set_item(suffix, index, value):
    def change(arrays):
        key = first(arrays, suffix)
        arrays[key] = arrays[key].copy()
        arrays[key].reshape(-1)[index] = value
    return change


def retype(suffix, dtype):
    def change(arrays):
        key = first(arrays, suffix)
        arrays[key] = arrays[key].astype(dtype)
    return change


def like(doc, which, step=None):
    """Compute step number ``which`` made "like" step ``step`` (default: the first compute step), the form
    ``TileProgram.to_files`` gives a repeated layer's step, with no arrays of its own."""
    compute = [i for i, s in enumerate(doc["steps"]) if s["kind"] == "compute"]
    i = compute[which]
    doc["steps"][i] = {"kind": "compute", "name": doc["steps"][i]["name"],
                       "like": compute[0] if step is None else step, "group_arrays": []}
    return doc


def set_buffer_dtype(doc):
    b = next(b for b in doc["buffers"] if b["kind"] == "input")
    b["dtype"] = "fp32" if b["dtype"] != "fp32" else "fp16"
    return doc


def set_model_dtype(doc):
    t = next(t for t in doc["tensors"] if t["name"] == "x") if isinstance(doc["tensors"], list) else doc["tensors"]["x"]
    t["dtype"] = "fp32"
    return doc


# (case, recipe, words the error must contain besides the package path)
CASES = [
    ("plan.json is not JSON", write_text("plan.json", "{not json"), ["plan.json", "not JSON"]),
    ("report.json is not JSON", write_text("report.json", "]["), ["report.json", "not JSON"]),
    ("plan.json is a list", write_text("plan.json", "[1, 2]"), ["plan.json", "not an object"]),
    ("program.json is a number", write_text("program.json", "7"), ["program.json", "not an object"]),
    ("model.json is nested too deep", write_text("model.json", "[" * 100000 + "]" * 100000), ["model.json"]),
    ("model.json lacks its tensors", edit_json("model.json", lambda d: {k: v for k, v in d.items() if k != "tensors"}),
     ["model.json"]),
    ("target.json has clock_hz 0", edit_json("target.json", lambda d: {**d, "clock_hz": 0}),
     ["target.json", "clock_hz"]),
    ("target.json has an unknown field", edit_json("target.json", lambda d: {**d, "warp": 9}), ["target.json"]),
    ("a transfer's source tile is past the last tile", edit_program(set_item("x_src_tile", 0, 64)),
     ["src_tile", "tile outside [0, 64)"]),
    ("a transfer's destination tile is negative", edit_program(set_item("x_dst_tile", 0, -1)),
     ["dst_tile", "tile outside"]),
    ("a transfer moves negative bytes", edit_program(set_item("x_nbytes", 0, -8)), ["nbytes", "negative"]),
    ("a transfer moves no bytes", edit_program(set_item("x_nbytes", 0, 0)), ["nbytes"]),
    ("a transfer reads past the end of tile memory", edit_program(set_item("x_src_off", 0, 10 ** 9)),
     ["src_off", "outside usable memory"]),
    ("an exchange's sources count more rows than its table",
     edit_json("program.json", lambda d: (next(s for s in d["steps"] if "sources" in s)["sources"][0].__setitem__(
         0, 10 ** 6), d)[1]), ["program.json", "sources count"]),
    ("an exchange's source buffer is past the last buffer",
     edit_json("program.json", lambda d: (next(s for s in d["steps"] if "sources" in s)["sources"][0].__setitem__(
         1, 10 ** 6), d)[1]), ["program.json", "source buffer outside"]),
    ("a compute step is like a step after it", edit_json("program.json", lambda d: like(d, 0, len(d["steps"]) - 1)),
     ["program.json", "like", "not an earlier compute step"]),
    ("a compute step lists arrays for fewer groups than the step it is like",
     edit_json("program.json", lambda d: like(d, 1)), ["program.json", "group_arrays", "one entry per group"]),
    ("a transfer column holds floats", edit_program(retype("x_nbytes", np.float64)), ["nbytes", "not integers"]),
    ("a compute vertex runs on a negative tile", edit_program(set_item("g0_tile", 0, -1)), ["tile outside"]),
    ("a compute vertex runs past the last tile", edit_program(set_item("g0_tile", 0, 10 ** 6)), ["tile outside"]),
    ("a compute operand lies in the reserve", edit_program(set_item("g0_ins", 0, 0)), ["outside usable memory"]),
    ("a compute operand table lost a column", edit_program(lambda a: a.__setitem__(first(a, "g0_ins"),
                                                                                  a[first(a, "g0_ins")][:, :0])),
     ["ins has shape"]),
    ("a host map names a tile out of range", edit_program(set_item(":tile", 0, 999)), ["host map", "tile outside"]),
    ("a host map's interval runs past the buffer", edit_program(set_item(":stop", 0, 10 ** 9)), ["host map"]),
    ("a host map has a negative offset", edit_program(set_item(":offset", 0, -4)), ["host map", "negative offset"]),
    ("a host map array is missing", edit_program(lambda a: a.pop(first(a, ":offset"))), ["tile program"]),
    ("the address table has the wrong shape", edit_program(lambda a: a.__setitem__("addr", a["addr"][:, :3])),
     ["addr has shape"]),
    ("a buffer address is negative", edit_program(set_item("addr", 0, -7)), ["addr", "negative address"]),
    ("a buffer size is negative", edit_program(set_item("size", 0, -7)), ["size", "negative buffer size"]),
    ("program.json's input buffer disagrees with model.json's dtype", edit_json("program.json", set_buffer_dtype),
     ["program.json", "disagrees with model.json"]),
    ("model.json's input dtype disagrees with the program", edit_json("model.json", set_model_dtype),
     ["disagrees with model.json"]),
    ("program.json names an unknown kernel primitive",
     edit_json("program.json", lambda d: (d["steps"][0]["groups"][0]["call"].__setitem__("primitive", "warp"), d)[1]),
     ["tile program"]),
]


def test_the_damaged_package_corpus_covers_every_class_of_damage():
    assert len(CASES) >= 25


@pytest.mark.parametrize("case, recipe, words", CASES, ids=[c[0] for c in CASES])
def test_validate_refuses_a_rehashed_package_whose_content_is_damaged(cli, damaged, case, recipe, words):
    recipe(damaged)
    rehash(damaged)
    assert_refused(cli("validate", damaged), damaged, *words)


def test_a_manifest_that_is_a_list_is_refused(cli, damaged):
    (damaged / "manifest.json").write_text("[]")
    assert_refused(cli("validate", damaged), damaged / "manifest.json", "not an object")


def test_a_manifest_whose_files_are_not_a_table_is_refused(cli, damaged):
    (damaged / "manifest.json").write_text(json.dumps({"format": FORMAT, "files": ["plan.json"]}))
    assert_refused(cli("validate", damaged), damaged / "manifest.json", "damaged manifest")


def test_a_manifest_listing_a_file_outside_the_package_is_refused(cli, damaged):
    manifest = json.loads((damaged / "manifest.json").read_text())
    manifest["files"]["../outside.txt"] = "0" * 64
    (damaged / "manifest.json").write_text(json.dumps(manifest))
    assert_refused(cli("validate", damaged), "outside the package")


def test_report_refuses_a_package_whose_report_json_is_damaged(cli, damaged):
    (damaged / "report.json").write_text("{")
    rehash(damaged)
    assert_refused(cli("report", damaged), damaged, "report.json")


# ---- params.npz (a package compiled from ONNX carries it) --------------------------------------

@pytest.fixture
def damaged_onnx(onnx_package, tmp_path):
    from reliability_corpus import fresh_copy
    return fresh_copy(onnx_package, tmp_path)


def test_a_garbage_params_npz_is_refused(cli, damaged_onnx):
    (damaged_onnx / "params.npz").write_bytes(b"PK\x03\x04 not really a zip")
    rehash(damaged_onnx)
    assert_refused(cli("validate", damaged_onnx), damaged_onnx / "params.npz", "not a readable npz")


def test_a_params_npz_with_the_wrong_shape_is_refused(cli, damaged_onnx):
    with np.load(damaged_onnx / "params.npz") as z:
        arrays = {k: z[k] for k in z.files}
    name = sorted(arrays)[0]
    arrays[name] = arrays[name].reshape(-1)[:-1]
    (damaged_onnx / "params.npz").write_bytes(deterministic_npz(arrays))
    rehash(damaged_onnx)
    assert_refused(cli("validate", damaged_onnx), damaged_onnx / "params.npz", repr(name))


def test_a_params_npz_naming_no_tensor_is_refused(cli, damaged_onnx):
    with np.load(damaged_onnx / "params.npz") as z:
        arrays = {k: z[k] for k in z.files}
    arrays["ghost"] = np.zeros(3, np.float32)
    (damaged_onnx / "params.npz").write_bytes(deterministic_npz(arrays))
    rehash(damaged_onnx)
    assert_refused(cli("validate", damaged_onnx), damaged_onnx / "params.npz", "'ghost'")


def test_an_undamaged_package_still_validates(cli, damaged):
    code, out, err = cli("validate", damaged)      # (a copy: the session's package stays unvalidated)
    assert code == 0 and "validation passed" in out, err

