"""Refusals raised while planning (not loading) still name the model file; the IPU model's name the package."""

from __future__ import annotations

import json

import numpy as np

from reliability_corpus import assert_refused, rehash
from tileplan.lowering.tile_program import deterministic_npz

FOUR = 'inherits = "ipu21-64"\nname = "four"\ntiles = 4\n'

TOO_BIG = """\
[model]
name = "big"
target = "four.toml"
[tensors]
x = { shape = [512, 1024], dtype = "fp16", role = "input" }
w = { shape = [1024, 512], dtype = "fp16", role = "parameter" }
[[ops]]
name = "fc"
op = "matmul"
inputs = ["x", "w"]
output = "y"
"""

BROADCAST = """\
[model]
name = "bc"
target = "ipu21-64"
[tensors]
a = { shape = [4, 16, 32], dtype = "fp16", role = "input" }
b = { shape = [1, 16, 1], dtype = "fp16", role = "input" }
[[ops]]
name = "add"
op = "add"
inputs = ["a", "b"]
output = "y"
"""


def test_a_plan_that_does_not_fit_names_the_model_file(cli, tmp_path):
    (tmp_path / "four.toml").write_text(FOUR)
    path = tmp_path / "big.toml"
    path.write_text(TOO_BIG)
    assert_refused(cli("plan", path, "-j", "1"), path, "op 'fc'")
    assert_refused(cli("compile", path, "-o", tmp_path / "pkg", "-j", "1"), path, "op 'fc'")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.toml", "four.toml"]


def test_a_broadcast_the_planner_refuses_names_the_model_file(cli, tmp_path):
    path = tmp_path / "bc.toml"
    path.write_text(BROADCAST)
    assert_refused(cli("plan", path, "-j", "1"), path, "broadcasting", "[4, 16, 32]", "[1, 16, 1]")


def test_a_target_file_named_by_the_model_is_found_beside_it_from_any_folder(cli, tmp_path, monkeypatch):
    (tmp_path / "four.toml").write_text(FOUR)
    path = tmp_path / "big.toml"
    path.write_text(TOO_BIG)
    monkeypatch.chdir("/")
    assert_refused(cli("plan", path, "-j", "1"), path, "op 'fc'", "589,824 usable bytes")


def test_an_ipu_model_conflict_names_the_package(cli, damaged):
    """Two transfers of one exchange writing the same bytes: only running the program finds it."""
    with np.load(damaged / "program.npz") as z:
        arrays = {k: z[k] for k in z.files}
    key = next(k for k in sorted(arrays) if k.endswith("x_dst_off") and arrays[k].size > 1)
    prefix = key[: -len("dst_off")]
    for col in ("dst_off", "dst_tile"):
        a = arrays[prefix + col].copy()
        a[1] = a[0]
        arrays[prefix + col] = a
    (damaged / "program.npz").write_bytes(deterministic_npz(arrays))
    rehash(damaged)
    assert_refused(cli("validate", damaged), damaged, "two writers of one byte")


def test_report_refuses_a_validation_record_that_is_not_an_object(cli, damaged):
    (damaged / "validation.json").write_text(json.dumps([1, 2, 3]))
    assert_refused(cli("report", damaged), damaged / "validation.json", "not an object")
