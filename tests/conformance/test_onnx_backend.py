"""ONNX's backend node cases for every op tileplan covers: import, compile onto ipu21-64, validate
against the case's expected outputs (the harness and its rules: ``onnx_backend.py``)."""

from __future__ import annotations

import pytest

from .onnx_backend import COVERED, collect, run

CASES = collect()
RUNNABLE = [c for c in CASES if c.excluded_because() is None]
EXCLUDED = [c for c in CASES if c.excluded_because() is not None]


def test_every_covered_op_has_backend_cases_that_run():
    ops = {c.op for c in RUNNABLE}
    assert ops == set(COVERED)


def test_excluded_cases_are_exactly_the_integer_bool_sequence_and_foreign_float_variants():
    reasons = {c.name: c.excluded_because() for c in EXCLUDED}
    assert all(r.startswith(("integer/bool:", "float format tileplan has not:", "not a tensor:")) for r in reasons.values())
    assert "test_add_int8" in reasons and "test_cast_FLOAT_to_DOUBLE" in reasons
    assert "test_dropout_default_mask" in reasons          # the mask output is BOOL
    assert "test_identity_sequence" in reasons
    assert not any(name in reasons for name in ("test_add", "test_cast_FLOAT_to_FLOAT16", "test_gelu_tanh_1"))


# Every runnable case must pass, the zero-size ones too (a zero-size tensor, a reduction over an empty
# axis, Reshape with allowzero, Split into empty parts, a Slice starting past the end: folded at plan
# time, planner.rewrite) and the reversed and strided Slices.
PASSING = RUNNABLE


@pytest.mark.parametrize("case", PASSING, ids=[c.name for c in PASSING])
def test_backend_case_compiles_and_validates_against_onnx_expected_outputs(case, tmp_path):
    outcome = run(case, tmp_path)
    assert outcome.passed, outcome.detail


def test_the_zero_size_cases_are_among_those_that_run():
    names = {c.name for c in RUNNABLE}
    assert {"test_reshape_allowzero_reordered", "test_reduce_max_empty_set", "test_reduce_sum_empty_set",
            "test_reduce_sum_empty_set_non_reduced_axis_zero", "test_split_zero_size_splits_opset18",
            "test_slice_start_out_of_bounds", "test_slice_neg_steps"} <= names
