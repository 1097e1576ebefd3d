"""The planning context's memo tables (``estimate.caches.Caches``): held by the context, keyed by value,
and never changing a plan."""

from __future__ import annotations

import pickle
from pathlib import Path

from tileplan.estimate.caches import Caches, shared
from tileplan.kernels import dispatch
from tileplan.kernels.calls import CopyCall
from tileplan.planner.plan import plan
from tileplan.planner.planjson import plan_to_json
from tileplan.target import load_target

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def test_a_plan_with_fresh_caches_is_the_plan_with_the_shared_warm_ones(planned):
    g, target, first = planned(FIXTURES / "encoder_layer_small.toml")      # the session's plan (shared caches)
    warm = plan_to_json(first)
    warm_again = plan(g, target)                                            # the shared caches, warm now
    assert plan_to_json(warm_again) == warm
    fresh = Caches(target)
    assert plan_to_json(plan(g, target, caches=fresh)) == warm
    assert fresh._kernels and fresh._cores, "the run filled the caches it was given"


def test_equal_targets_share_one_caches_object_and_a_pickled_one_arrives_as_the_shared_one():
    a, b = load_target("ipu21-64"), load_target("ipu21-64")
    assert a is not b and shared(a) is shared(b)
    assert pickle.loads(pickle.dumps(Caches(a))) is shared(a)
    assert shared(load_target("ipu21")) is not shared(a)


def test_the_kernel_memo_answers_what_dispatch_picks():
    target = load_target("ipu21-64")
    call = CopyCall(96)
    v = dispatch(call, target)
    assert Caches(target).kernel(call) == (v.name, v.cycles(call, target))
