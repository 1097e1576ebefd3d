"""``tileplan validate`` arguments: bad arrays and tolerances are refused; non-finite values fail honestly."""

from __future__ import annotations

import numpy as np
import pytest

from reliability_corpus import assert_refused

X = (96, 144)   # the smoke MLP's input


def npz(path, **arrays):
    np.savez(path, **arrays)
    return path


ARRAY_CASES = [
    ("a string array", lambda: {"x": np.full(X, "a")}, ["'x'", "only numbers are read"]),
    ("a complex array", lambda: {"x": np.ones(X) * (1 + 2j)}, ["'x'", "complex"]),
    ("a boolean array", lambda: {"x": np.ones(X, bool)}, ["'x'", "bool"]),
    ("an object array", lambda: {"x": np.array([{"a": 1}], dtype=object)}, ["'x'", "object"]),
    ("a wrongly shaped array", lambda: {"x": np.ones((4, 4))}, ["'x' has shape [4, 4]"]),
    ("an array naming no tensor", lambda: {"x": np.ones(X), "ghost": np.ones(3)}, ["'ghost'"]),
    ("an array naming an intermediate", lambda: {"x": np.ones(X), "h": np.ones((96, 288))}, ["'h'"]),
    ("a missing input", lambda: {"w1": np.ones((144, 288))}, ["no values for the input", "'x'"]),
]


@pytest.mark.parametrize("case, arrays, words", ARRAY_CASES, ids=[c[0] for c in ARRAY_CASES])
def test_validate_refuses_bad_inputs_naming_the_file_and_array(cli, small_package, tmp_path, case, arrays, words):
    path = npz(tmp_path / "in.npz", **arrays())
    assert_refused(cli("validate", small_package, "--inputs", path), path, *words)


EXPECTED_CASES = [
    ("a string array", lambda: {"y": np.full(X, "1.0")}, ["'y'", "only numbers are read"]),
    ("a complex array", lambda: {"y": np.ones(X, np.complex64)}, ["'y'", "complex"]),
    ("a wrongly shaped array", lambda: {"y": np.ones((3,))}, ["'y' has shape [3]"]),
    ("an array naming an input", lambda: {"y": np.ones(X), "x": np.ones(X)}, ["'x' is not an output"]),
    ("no arrays", lambda: {}, ["holds no arrays"]),
]


@pytest.mark.parametrize("case, arrays, words", EXPECTED_CASES, ids=[c[0] for c in EXPECTED_CASES])
def test_validate_refuses_bad_expected_values_naming_the_file_and_array(cli, small_package, tmp_path, case, arrays,
                                                                        words):
    path = npz(tmp_path / "want.npz", **arrays())
    assert_refused(cli("validate", small_package, "--expected", path), path, *words)


@pytest.mark.parametrize("what", ["not an npz", "a folder", "missing"])
def test_validate_refuses_an_inputs_file_it_cannot_read(cli, small_package, tmp_path, what):
    path = tmp_path / "in.npz"
    if what == "not an npz":
        path.write_bytes(b"hello")
    elif what == "a folder":
        path.mkdir()
    assert_refused(cli("validate", small_package, "--inputs", path), path)


TOLERANCES = [("--atol", "-1"), ("--rtol", "-5"), ("--atol", "nan"), ("--rtol", "inf"), ("--atol", "-inf")]


@pytest.mark.parametrize("option, value", TOLERANCES, ids=[" ".join(t) for t in TOLERANCES])
def test_validate_refuses_a_negative_or_non_finite_tolerance(cli, small_package, option, value):
    assert_refused(cli("validate", small_package, option, value), option, "non-negative")


def test_non_finite_inputs_fail_and_the_report_says_how_many_values_are_non_finite(cli, small_package, tmp_path):
    x = np.random.default_rng(0).standard_normal(X)
    x[0, 0] = np.nan
    path = npz(tmp_path / "in.npz", x=x)
    want = npz(tmp_path / "want.npz", y=np.zeros(X))           # finite expected values: NaN is not one
    code, out, err = cli("validate", small_package, "--inputs", path, "--expected", want)
    assert code == 1 and err == ""
    row = next(line for line in out.splitlines() if "values non-finite" in line)
    assert "(output " in row and "1.000000" not in row and "inf" not in row.replace("non-finite", "")
    assert "validation FAILED" in out


def test_non_finite_expected_values_fail(cli, small_package, tmp_path):
    want = np.zeros(X)
    want[3, 4] = np.inf
    path = npz(tmp_path / "want.npz", y=want)
    code, out, _ = cli("validate", small_package, "--expected", path)
    assert code == 1 and "1 of 13,824 values non-finite" in out and "reference 1" in out


def test_outputs_are_written_to_exactly_the_path_given(cli, small_package, tmp_path):
    target = tmp_path / "result.bin"
    code, out, err = cli("validate", small_package, "--outputs", target)
    assert code == 0, err
    assert f"wrote {target}" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.bin"]
    with np.load(target) as z:
        assert z.files == ["y"] and z["y"].shape == X


@pytest.mark.parametrize("kind", ["a folder", "a device", "a symbolic link"])
def test_outputs_refuses_a_destination_that_is_not_a_regular_file_and_writes_nothing(cli, small_package, tmp_path,
                                                                                   kind):
    import os
    before = sorted(p.name for p in small_package.iterdir())
    if kind == "a folder":
        dest = tmp_path / "dir"
        dest.mkdir()
    elif kind == "a device":
        dest = "/dev/null"
    else:
        dest = tmp_path / "link"
        os.symlink(tmp_path / "elsewhere", dest)
    line = assert_refused(cli("validate", small_package, "--outputs", dest), dest)
    assert kind in line
    assert not (tmp_path / "elsewhere").exists() and not list(tmp_path.glob("*.npz"))
    assert sorted(p.name for p in small_package.iterdir()) == before
