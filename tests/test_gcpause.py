"""The cycle collector is paused over planning and lowering, and restored after, even on an error."""

from __future__ import annotations

import gc

import pytest

from tileplan.gcpause import paused, pausing


def test_the_collector_is_paused_inside_nested_blocks_and_restored_by_the_outermost():
    assert gc.isenabled()
    with paused():
        assert not gc.isenabled()
        with paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_an_exception_inside_a_paused_function_still_restores_the_collector():
    @pausing
    def fails():
        assert not gc.isenabled()
        raise ValueError("bad")

    with pytest.raises(ValueError):
        fails()
    assert gc.isenabled()


def test_a_collector_the_caller_disabled_stays_disabled():
    gc.disable()
    try:
        with paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_planning_runs_with_the_collector_paused(monkeypatch):
    from tileplan.bench import FIXTURES
    from tileplan.graph import load_model
    from tileplan.planner import catalogue
    from tileplan.planner.plan import plan
    from tileplan.target import load_target

    seen = []
    real = catalogue.gemm_candidates

    def spy(ctx, op):
        seen.append(gc.isenabled())
        return real(ctx, op)

    monkeypatch.setattr(catalogue, "gemm_candidates", spy)
    plan(load_model(FIXTURES / "mlp_smoke_fp8.toml"), load_target("ipu21-64"))
    assert seen and not any(seen)
    assert gc.isenabled()
