"""Hostile package documents and data: each case is refused with one line naming the file, in a
guarded process (2 GiB address space, a timeout), before any large allocation or a hang; and the
package answers that a validation must not accept.

Each case builds its package from the ``damaged`` fixture (a fresh copy of the small compiled
package; ``rehash`` after an edit, so the content checks and not the digests must find it) or from
the ONNX package (the one that carries ``params.npz``). ``test_damaged_packages`` holds the
value-level damage (addresses, tiles, sizes); these are the malformed documents and the hostile
files: wrong types, lists for objects, non-finite numbers, huge integers, FIFOs, members that are
not arrays, headers claiming terabytes, zip bombs.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil
import zipfile

import numpy as np
import pytest

from tileplan.lowering.tile_program import deterministic_npz
from tileplan.target import load_target

from reliability_corpus import assert_refused, rehash

GiB = 1 << 30
TIMEOUT = 60


def run(guard, *args, cwd):
    result = guard.run([str(a) for a in args], cwd, timeout=TIMEOUT)
    assert result[0] is not None, "the case hung (killed at the timeout)"
    return result


def edit_json(pkg, name, change):
    doc = json.loads((pkg / name).read_text())
    change(doc)
    (pkg / name).write_text(json.dumps(doc))      # (json.dumps writes NaN as the bare word NaN)


def npy_header(shape, dtype) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, {"descr": np.dtype(dtype).str, "fortran_order": False,
                                               "shape": tuple(shape)})
    return out.getvalue()


def zip_members(members: dict[str, bytes], deflate: bool = True) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return out.getvalue()


def bomb(shape, dtype, data_bytes: int = 16 << 20) -> bytes:
    """An npz of one member whose header declares ``shape`` (gigabytes) and whose deflated data is
    ``data_bytes`` of zeros (a few KB on disk): what a reader that trusts the header allocates."""
    return zip_members({"bomb.npy": npy_header(shape, dtype) + bytes(data_bytes)})


def arrays_of(path):
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


# ---- malformed JSON documents (re-hashed) ------------------------------------------------------

def _first_group(doc):
    return next(st for st in doc["steps"] if st["kind"] == "compute")["groups"][0]


DOCUMENTS = [
    ("program.json's buffers are an object", "program.json",
     lambda d: d.__setitem__("buffers", {"a": 1}), ["buffers"]),
    ("program.json's tiles is a huge integer", "program.json",
     lambda d: d.__setitem__("tiles", 10 ** 18), ["tiles"]),
    ("program.json's tiles disagree with the target", "program.json",
     lambda d: d.__setitem__("tiles", 32), ["tiles", "target.json"]),
    ("program.json's io names no buffer", "program.json",
     lambda d: d["io"].append("ghost"), ["io[", "'ghost'"]),
    ("a buffer's shape holds a string", "program.json",
     lambda d: d["buffers"][0].__setitem__("shape", ["8"]), ["buffers[0].shape"]),
    ("a buffer's space is not a layout", "program.json",
     lambda d: d["buffers"][0].__setitem__("space", "panels-x"), ["buffers[0].space"]),
    ("a vertex group's cycles is a string", "program.json",
     lambda d: _first_group(d).__setitem__("cycles", "many"), ["cycles"]),
    ("a vertex group's call is a list", "program.json",
     lambda d: _first_group(d).__setitem__("call", [1, 2]), ["call"]),
    ("a vertex call's field has the wrong type", "program.json",
     lambda d: _first_group(d)["call"].__setitem__("n", "lots"), ["call", "'lots'"]),
    ("a step is a number", "program.json", lambda d: d["steps"].__setitem__(0, 5), ["steps[0]"]),
    ("model.json's tensors hold NaN", "model.json",
     lambda d: d["tensors"][0].__setitem__("scale", float("nan")), ["model.json", "NaN"]),
    ("model.json's tensors are an object", "model.json", lambda d: d.__setitem__("tensors", {"x": 1}),
     ["model.json", "tensors"]),
    ("a model tensor's shape is huge", "model.json",
     lambda d: d["tensors"][0].__setitem__("shape", [2 ** 62, 2 ** 62]), ["model.json", "shape"]),
    ("target.json's tiles is a list", "target.json", lambda d: d.__setitem__("tiles", [64]),
     ["target.json", "tiles"]),
    ("target.json's SRAM is past 64 bits", "target.json",
     lambda d: d.__setitem__("sram_bytes", 10 ** 30), ["target.json", "64 bits"]),
    ("plan.json's prearranged is an object", "plan.json",
     lambda d: d.__setitem__("prearranged", {"tensor": "w1"}), ["plan.json", "prearranged"]),
    ("report.json's estimate is a list", "report.json", lambda d: d.__setitem__("estimate", [1]),
     ["report.json", "estimate"]),
]


@pytest.mark.parametrize("case, name, change, words", DOCUMENTS, ids=[c[0] for c in DOCUMENTS])
def test_a_malformed_document_is_refused_naming_the_file_and_field(guard, damaged, tmp_path, case, name,
                                                                   change, words):
    edit_json(damaged, name, change)
    rehash(damaged)
    assert_refused(run(guard, "validate", damaged, cwd=tmp_path), name, *words)
    assert not (damaged / "validation.json").exists()


# ---- hostile data files ------------------------------------------------------------------------

def fifo(pkg, name):
    (pkg / name).unlink()
    os.mkfifo(pkg / name)


def program_with(extra: dict[str, bytes]):
    def recipe(pkg):
        members = {f"{k}.npy": _npy(v) for k, v in arrays_of(pkg / "program.npz").items()}
        members.update(extra)
        (pkg / "program.npz").write_bytes(zip_members(members))
        rehash(pkg)
    return recipe


def _npy(a) -> bytes:
    out = io.BytesIO()
    np.save(out, a)
    return out.getvalue()


DATA = [
    ("program.npz is a FIFO", lambda p: fifo(p, "program.npz"), ["program.npz", "FIFO"]),
    ("plan.json is a FIFO", lambda p: fifo(p, "plan.json"), ["plan.json", "FIFO"]),
    ("a program.npz member is not an .npy", program_with({"notes.txt": b"hello"}),
     ["program.npz", "not an .npy"]),
    ("a program.npz header claims 2 TiB", program_with({"huge.npy": npy_header((1 << 38,), np.float64)}),
     ["program.npz", "more than"]),
    ("program.npz is a zip bomb", lambda p: ((p / "program.npz").write_bytes(bomb((1 << 30,), np.int64)),
                                             rehash(p)), ["program.npz", "more than"]),
]


@pytest.mark.parametrize("case, recipe, words", DATA, ids=[c[0] for c in DATA])
def test_a_hostile_package_file_is_refused_without_a_hang_or_a_large_allocation(guard, damaged, tmp_path,
                                                                                 case, recipe, words):
    recipe(damaged)
    assert_refused(run(guard, "validate", damaged, cwd=tmp_path), damaged, *words)


@pytest.fixture
def onnx_copy(onnx_package, tmp_path):
    dst = tmp_path / "onnx"
    shutil.copytree(onnx_package, dst)
    return dst


def test_a_params_npz_zip_bomb_is_refused_before_it_is_decompressed(guard, onnx_copy, tmp_path):
    (onnx_copy / "params.npz").write_bytes(bomb((5 << 27,), np.float16, 64 << 20))    # declares 1.25 GiB
    rehash(onnx_copy)
    assert_refused(run(guard, "validate", onnx_copy, cwd=tmp_path), onnx_copy / "params.npz", "more than")


def test_inputs_that_are_an_npy_not_an_npz_are_refused(guard, small_package, tmp_path):
    pkg = tmp_path / "pkg"
    shutil.copytree(small_package, pkg)
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((96, 144), np.float32))
    assert_refused(run(guard, "validate", pkg, "--inputs", x, cwd=tmp_path), x, "not a readable npz")


def test_an_inputs_zip_bomb_is_refused_before_it_is_decompressed(guard, small_package, tmp_path):
    pkg = tmp_path / "pkg"
    shutil.copytree(small_package, pkg)
    x = tmp_path / "in.npz"
    x.write_bytes(bomb((1 << 30,), np.float64))
    assert_refused(run(guard, "validate", pkg, "--inputs", x, cwd=tmp_path), x, "more than")


# ---- answers a validation must not accept ------------------------------------------------------

def test_nan_parameters_fail_validation_and_say_why(guard, onnx_copy, tmp_path):
    arrays = arrays_of(onnx_copy / "params.npz")
    name = next(k for k in sorted(arrays) if arrays[k].dtype == np.float16)
    arrays[name] = np.full_like(arrays[name], np.nan)
    (onnx_copy / "params.npz").write_bytes(deterministic_npz(arrays))
    rehash(onnx_copy)
    code, out, err = run(guard, "validate", onnx_copy, cwd=tmp_path)
    assert code == 1, (code, err)
    assert "validation FAILED" in out and "validation passed" not in out
    assert f"'{name}' hold NaN or infinity" in " ".join(out.split()), out
    assert json.loads((onnx_copy / "validation.json").read_text())["outputs"]["y"]["passed"] is False


def test_a_package_whose_target_lost_fp8_is_refused_naming_the_target_and_the_vertex(guard, damaged, tmp_path):
    target = dataclasses.asdict(load_target("ipu2").with_tiles(64))
    assert target["amp_fp8"] == 0
    (damaged / "target.json").write_text(json.dumps(target))
    rehash(damaged)
    line = assert_refused(run(guard, "validate", damaged, cwd=tmp_path), damaged, repr(target["name"]),
                          "amp_fp8")
    assert "fp8" in line.split("kernel variant")[1].split()[0], line        # the FP8 vertex is named


@pytest.mark.parametrize("obstacle", ["folder", "fifo", "symlink"])
def test_validate_refuses_an_unwritable_record_before_it_prints_a_table(guard, damaged, tmp_path, obstacle):
    where = damaged / "validation.json"
    if obstacle == "folder":
        where.mkdir()
    elif obstacle == "fifo":
        os.mkfifo(where)
    else:
        where.symlink_to(tmp_path / "elsewhere.json")
    code, out, err = run(guard, "validate", damaged, cwd=tmp_path)
    assert_refused((code, out, err), "validation.json")
    assert out == "", out                   # no table, nothing that reads as a pass
    assert not (tmp_path / "elsewhere.json").exists()
