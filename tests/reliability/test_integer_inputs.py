"""``tileplan validate`` of a package with INT32 inputs (token ids into an embedding table): values
the model has no meaning for are refused in one line naming the file, the input and the op; a
bool mask array is read as 0/1."""

from __future__ import annotations

import numpy as np
import pytest

from reliability_corpus import assert_refused

MODEL = """\
[model]
name = "emb"
target = "ipu21-64"
outputs = ["y"]

[tensors]
ids = { shape = [2, 8], dtype = "int32", role = "input" }
keep = { shape = [2, 8], dtype = "int32", role = "input" }
table = { shape = [100, 64], dtype = "fp16", role = "parameter" }
keepf = { shape = [2, 8], dtype = "fp16", role = "intermediate" }

[[ops]]
name = "lookup"
op = "gather"
inputs = ["table", "ids"]
output = "e"

[[ops]]
name = "mask"
op = "cast"
inputs = ["keep"]
output = "keepf"

[[ops]]
name = "act"
op = "tanh"
inputs = ["e"]
output = "y"

[[ops]]
name = "kept"
op = "tanh"
inputs = ["keepf"]
output = "z"
"""


@pytest.fixture(scope="module")
def int_package(tmp_path_factory):
    from tileplan.cli import main
    root = tmp_path_factory.mktemp("ints")
    (root / "emb.toml").write_text(MODEL)
    with pytest.raises(SystemExit) as info:
        main(["compile", str(root / "emb.toml"), "-o", str(root / "pkg"), "-j", "1"])
    assert (info.value.code or 0) == 0
    return root / "pkg"


ONES = np.ones((2, 8), np.int64)
CASES = [
    ("a token id past the table", {"ids": np.full((2, 8), 100), "keep": ONES},
     ["op 'lookup' (gather)", "index 100 of 'ids'", "100 rows of 'table'"]),
    ("a token id below minus the table", {"ids": np.full((2, 8), -101), "keep": ONES}, ["index -101 of 'ids'"]),
    ("a fractional mask", {"ids": ONES, "keep": np.full((2, 8), 0.5)}, ["'keep'", "whole numbers", "got 0.5"]),
    ("a value past int32", {"ids": np.full((2, 8), 2 ** 40), "keep": ONES}, ["'ids'", "within +-(2**31 - 1)"]),
    ("a NaN token id", {"ids": np.full((2, 8), np.nan), "keep": ONES}, ["'ids'", "got nan"]),
]


@pytest.mark.parametrize("case, arrays, words", CASES, ids=[c[0] for c in CASES])
def test_validate_refuses_integer_inputs_the_model_has_no_meaning_for(guard, int_package, tmp_path, case, arrays,
                                                                        words):
    path = tmp_path / "in.npz"
    np.savez(path, **arrays)
    assert_refused(guard.run(["validate", str(int_package), "--inputs", str(path)], tmp_path), path, *words)


def test_a_bool_mask_array_is_read_as_zeros_and_ones(cli, int_package, tmp_path):
    path = tmp_path / "in.npz"
    keep = np.zeros((2, 8), bool)
    keep[:, :5] = True
    np.savez(path, ids=ONES, keep=keep)
    code, out, err = cli("validate", int_package, "--inputs", path)
    assert code == 0, err
    assert "validation passed" in out + err
