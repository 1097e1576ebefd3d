"""Candidates are immutable values; the catalogue's losers are their own records with the reason."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tileplan.graph.loaders import load_model
from tileplan.planner.candidates import Candidate, RunnerUp
from tileplan.planner.plan import plan
from tileplan.planner.planjson import plan_to_json
from tileplan.target import load_target

SMOKE = Path(__file__).resolve().parents[2] / "fixtures" / "mlp_smoke_fp8.toml"


@pytest.fixture(scope="module")
def smoke_plan():
    g = load_model(SMOKE)
    return plan(g, load_target(g.target))


def test_a_candidate_cannot_be_changed_after_it_is_made(smoke_plan):
    cand = smoke_plan.candidates["fc1"][smoke_plan.picks["fc1"]]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cand.program = None
    with pytest.raises(dataclasses.FrozenInstanceError):
        cand.estimate = cand.coarse
    assert "lost" not in {f.name for f in dataclasses.fields(Candidate)}


def test_every_runner_up_is_a_record_of_a_candidate_and_why_it_lost(smoke_plan):
    for op in ("fc1", "fc2"):
        losers = smoke_plan.runner_ups[op]
        assert losers and all(isinstance(r, RunnerUp) and isinstance(r.candidate, Candidate) and r.why
                              for r in losers)
        assert any(not r.candidate.detailed and "coarse frontier" in r.why for r in losers)


def test_the_plan_json_gives_each_runner_up_the_reason_of_its_record(smoke_plan):
    from tileplan.planner.planjson import runner_ups
    data = plan_to_json(smoke_plan)
    every = runner_ups(smoke_plan, "fc1", limit=10**6)      # plan.json lists the best of these
    assert data["runner_ups"]["fc1"] == every[:len(data["runner_ups"]["fc1"])]
    why = {str(r.candidate): r.why for r in smoke_plan.runner_ups["fc1"]}
    listed = [r for r in every if r["candidate"] in why]
    assert listed and all(r["lost"] == why[r["candidate"]] for r in listed)
