"""A split-K GEMM's bias Add done in its reduction: when it applies, the candidates it adds,
the whole-graph choice between it and the fused bias-GeLU, and the package end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tileplan.graph.core import Add, Cast, GeLU, Graph, MatMul, Role, Tensor
from tileplan.graph.dtypes import DType
from tileplan.graph.loaders import load_model
from tileplan.lowering.compile import compile_model, compile_plan
from tileplan.lowering.lower import lower
from tileplan.lowering.package import Package, load_package
from tileplan.planner import catalogue
from tileplan.planner.cpsat import solve_cpsat
from tileplan.planner.elementwise import fusable_bias
from tileplan.planner.plan import Context, build_problem, plan
from tileplan.planner.planjson import plan_to_json
from tileplan.planner.select import Fused, solve_dp, solve_exhaustive
from tileplan.report.terminal import render_package
from tileplan.sim.validate import validate_package
from tileplan.target import load_target

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
IPU64 = load_target("ipu21-64")
FP16, FP32 = DType.FP16, DType.FP32


def gemm_bias(*, outputs=None, bias_role=Role.PARAMETER, bias_shape=(24,), lead=(), extra_user=False,
              dtype=FP16) -> Graph:
    tensors = [Tensor("x", lead + (16, 32), dtype, Role.INPUT), Tensor("w", (32, 24), dtype, Role.PARAMETER),
               Tensor("b", bias_shape, dtype, bias_role)]
    ops = [MatMul("mm", ("x", "w"), "h"), Add("bias", ("h", "b"), "y")]
    if extra_user:
        ops.append(GeLU("side", ("h",), "z"))
    return Graph.build("gemm_bias", tensors, ops, outputs=outputs)


def test_a_bias_add_is_fusable_into_the_gemm_only_as_its_sole_consumer_adding_a_parameter_row():
    g = gemm_bias()
    add, bias = fusable_bias(g, g.op("mm"))
    assert add.name == "bias" and bias == "b"
    assert fusable_bias(g, g.op("bias")) is None                                       # not a MatMul
    assert fusable_bias(*(lambda g: (g, g.op("mm")))(gemm_bias(bias_shape=(1, 24)))) is not None
    for reason, graph in [("the product is an output", gemm_bias(outputs=["h", "y"])),
                          ("the product has a second consumer", gemm_bias(extra_user=True)),
                          ("the bias is an activation", gemm_bias(bias_role=Role.INPUT)),
                          ("the bias repeats over a batch, not a row", gemm_bias(bias_shape=(16, 24), lead=(2,)))]:
        assert fusable_bias(graph, graph.op("mm")) is None, reason


@pytest.fixture
def no_bias_gelu(monkeypatch):
    """Plans without the elementwise bias-GeLU pass: on mlp_fp16_small its aligned path (faster than
    the GeLU alone) beats fc1's bias in the reduction, and these tests are about the latter."""
    from tileplan.planner import elementwise
    monkeypatch.setattr(elementwise, "fusable_gelu", lambda graph, op: None)


@pytest.fixture(scope="module")
def small_mlp():
    graph = load_model(FIXTURES / "mlp_fp16_small.toml")
    return graph, load_target(graph.target)


def test_the_catalogue_keeps_both_kinds_and_adds_the_bias_only_where_there_is_a_reduction(small_mlp):
    graph, target = small_mlp
    cands = catalogue.gemm_candidates(Context(graph, target), graph.op("fc1"))
    fused = [c for c in cands if c.choice.bias and c.choice.epilogue is None]     # the epilogue kind: its own tests
    plain = [c for c in cands if not c.choice.bias]
    assert fused and plain
    for c in fused:
        assert c.choice.gk > 1 and c.choice.reduction != "none"
        assert c.fused == "bias1" and isinstance(c.out, Fused)
        assert "bias fused into the reduction" in str(c)
        reduce = [v for s in c.program.steps if s.name == "fc1.reduce" for v in s.vertices]
        assert reduce and all(v.variant == "reduce_bias_fp16" and v.call.bias_cols for v in reduce)
        assert all(v.ins[-1].buffer == "b1" for v in reduce)         # the resident replicated bias row
        assert c.program.steps[-1].copies[0].dst.startswith("hb@")   # it writes the Add's output
    assert all(c.fused is None and not isinstance(c.out, Fused) for c in plain)


def test_the_plan_does_the_bias_in_the_reduction_when_the_whole_graph_is_faster(small_mlp, monkeypatch, no_bias_gelu):
    # With compact weights (with its weights pre-arranged, fc1 is faster unsplit: no reduction).
    graph, target = small_mlp
    fused = plan(graph, target, weights="compact")
    picked = {op: fused.candidates[op][i] for op, i in fused.picks.items()}
    assert picked["fc1"].choice.bias and picked["fc2"].choice.bias
    assert picked["bias1"].absorbed and picked["bias2"].absorbed
    assert picked["bias1"].estimate.cycles == 0 and "the reduction of fc1" in picked["bias1"].desc
    assert not picked["act"].absorbed                     # a plain GeLU on the GEMM's output
    # Without the new kind the same graph plans slower (the GEMM, then the fused bias-GeLU).
    monkeypatch.setattr(catalogue, "bias_fusion", lambda ctx, op: None)
    before = plan(graph, target, weights="compact")
    assert before.picks["fc1"] is not None and not any(c.fused for c in before.candidates["fc1"])
    assert fused.estimate.cycles < before.estimate.cycles


def test_the_selection_keeps_the_gemm_and_fused_bias_gelu_where_that_is_faster():
    # The FP8 smoke MLP: fc1 is offered the bias in a reduction but its best plan is an unsplit K
    # grid and the fused bias-GeLU; fc2 (split K) takes the bias into its reduction.
    graph = load_model(FIXTURES / "mlp_smoke_fp8.toml")
    p = plan(graph, IPU64, dp_paths=None)
    picked = {op: p.candidates[op][i] for op, i in p.picks.items()}
    assert any(c.fused == "bias1" for c in p.candidates["fc1"])
    assert picked["bias1"].fused == "act" and picked["act"].absorbed
    assert picked["fc2"].choice.bias and picked["bias2"].absorbed


# The smoke MLP's exhaustive oracle costs 25 CPU-seconds (measured): slow, in the whole suite; the
# small FP16 MLP's runs in the fast lane too.
@pytest.mark.parametrize("fixture", [pytest.param("mlp_smoke_fp8", marks=pytest.mark.slow), "mlp_fp16_small"])
def test_dp_cpsat_and_the_exhaustive_oracle_agree_with_both_fusions_on_offer(fixture):
    graph = load_model(FIXTURES / f"{fixture}.toml")
    target = load_target(graph.target)
    full = plan(graph, target, weights="compact")      # the selection's own candidates, as it costed them
    # A few candidates per op keep the oracle small: the chosen one, and per GEMM the two fastest
    # of each kind; elementwise ops keep every candidate (plain, bias-GeLU and absorbed).
    cands = {}
    for op, cs in full.candidates.items():
        if cs[0].choice is None:
            cands[op] = cs
            continue
        keep = {id(cs[full.picks[op]])}
        for kind in (True, False):
            same = sorted((c for c in cs if bool(c.fused) == kind), key=lambda c: c.estimate.cycles)
            keep |= {id(c) for c in same[:2]}
        cands[op] = [c for c in cs if id(c) in keep]
    problem = build_problem(Context(graph, target), cands)
    oracle = solve_exhaustive(problem)
    dp, cp = solve_dp(problem, paths=None), solve_cpsat(problem)
    assert oracle.cycles == dp.cycles == cp.cycles == full.selection.cycles
    assert any(cands[op][i].fused and cands[op][i].choice is not None for op, i in oracle.picks.items())


def test_the_package_validates_with_the_estimate_equal_to_the_simulated_cycles(small_mlp, tmp_path, no_bias_gelu):
    graph, target = small_mlp
    p = plan(graph, target, weights="compact")        # compact weights: both GEMMs split K
    _, path = compile_plan(p, target, tmp_path / "pkg")
    pkg = load_package(path)
    v = validate_package(pkg)
    assert v.passed and v.outputs["y"]["max_abs"] <= 0.001 and v.outputs["y"]["cosine"] > 0.999
    estimate = json.loads((path / "report.json").read_text())["estimate"]
    assert estimate["cycles"] == v.profile.cycles == p.estimate.cycles
    groups = [g for s in pkg.program.steps if s.name.endswith(".reduce") for g in s.groups]
    assert groups and {g.variant for g in groups} == {"reduce_bias_fp16"}
    assert (path / "codelets" / "reduce_bias_fp16_own.cpp").exists()
    # The steps the absorbed Adds would have run are gone.
    assert not any(s.name.startswith(("bias1.", "bias2.")) for s in pkg.program.steps)


def test_plan_json_and_the_report_say_the_bias_is_fused_into_the_reduction(small_mlp, no_bias_gelu):
    graph, target = small_mlp
    data = plan_to_json(plan(graph, target, weights="compact"))
    ops = {o["name"]: o for o in data["ops"]}
    assert ops["fc1"]["grid"]["bias_in_reduction"] is True and ops["fc1"]["fused_with"] == "bias1"
    assert ops["bias1"]["absorbed"] and ops["bias1"]["absorbed_into"] == "fc1"
    assert ops["act"]["absorbed_into"] is None and not ops["act"]["absorbed"]
    losers = data["runner_ups"]["fc1"]
    assert any("leaves the bias to the Add" in r["lost"] for r in losers)
    from rich.console import Console
    console = Console(width=400, record=True)
    console.print(render_package(data, verbose=True))
    text = console.export_text()
    assert "bias fused into the reduction" in text and "fused into the reduction of fc1" in text
    console = Console(width=100, record=True)             # the compact tables abbreviate the same facts
    console.print(render_package(data))
    text = console.export_text()
    assert "+bias" in text and "fused: reduction of fc1" in text


def test_same_inputs_give_byte_identical_packages_with_the_bias_in_the_reduction(small_mlp, tmp_path):
    graph, target = small_mlp
    digests = []
    for name in ("a", "b"):
        _, _, path = compile_model(graph, target, tmp_path / name, jobs=1)
        digests.append({f.relative_to(path).as_posix(): f.read_bytes() for f in sorted(path.rglob("*")) if f.is_file()})
    assert digests[0] == digests[1]
    assert np.any(["reduce_bias" in k for k in digests[0]])


@st.composite
def deep_k_gemm_bias(draw):
    """(graph, target): a GEMM with a long K and a short output (split K pays), then its bias Add
    (either operand order, a [N] or [1, N] row) and maybe a GeLU; FP32, FP16 or FP8 operands."""
    kind = draw(st.sampled_from([FP32, FP16, DType.FP8]))
    act = FP16 if kind is DType.FP8 else kind
    lead = draw(st.sampled_from([(), (2,)]))
    m, k, n = draw(st.integers(1, 12)), draw(st.integers(64, 600)), draw(st.integers(1, 40))
    tensors = [Tensor("x", lead + (m, k), act, Role.INPUT), Tensor("w", (k, n), kind, Role.PARAMETER),
               Tensor("b", draw(st.sampled_from([(n,), (1, n)])), act, Role.PARAMETER)]
    ops, src = [], "x"
    if kind is DType.FP8:
        tensors.append(Tensor("x8", lead + (m, k), DType.FP8))
        ops.append(Cast("cast", ("x",), "x8"))
        src = "x8"
    ops += [MatMul("mm", (src, "w"), "h"), Add("bias", draw(st.sampled_from([("h", "b"), ("b", "h")])), "y")]
    if draw(st.booleans()):
        ops.append(GeLU("act", ("y",), "z"))
    return Graph.build("deep_k", tensors, ops), IPU64.with_tiles(draw(st.sampled_from([8, 16, 32, 64])))


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(deep_k_gemm_bias())
def test_random_split_k_gemms_with_their_bias_in_the_reduction_validate_as_estimated(case):
    graph, target = case
    p = plan(graph, target)
    v = validate_package(Package(None, graph, target, lower(p.mid.program, target).tile_program, {}, {}, {}))
    assert v.passed, ("; ".join(op.describe() for op in graph.ops) + f" on {target.tiles} tiles", v.outputs)
    assert v.profile.cycles == p.estimate.cycles


@pytest.mark.parametrize("dtype, variant", [(FP32, "reduce_bias_fp32"), (FP16, "reduce_bias_fp16")])
def test_a_short_wide_k_gemm_takes_its_bias_into_the_reduction_in_both_types(dtype, variant):
    tensors = [Tensor("x", (4, 512), dtype, Role.INPUT), Tensor("w", (512, 16), dtype, Role.PARAMETER),
               Tensor("b", (16,), dtype, Role.PARAMETER)]
    graph = Graph.build("deep_k", tensors, [MatMul("mm", ("x", "w"), "h"), Add("bias", ("h", "b"), "y")])
    p = plan(graph, IPU64)
    mm = p.candidates["mm"][p.picks["mm"]]
    assert mm.choice.bias and mm.choice.gk > 1
    assert {v.variant for s in mm.program.steps if s.name == "mm.reduce" for v in s.vertices} == {variant}
    v = validate_package(Package(None, graph, IPU64, lower(p.mid.program, IPU64).tile_program, {}, {}, {}))
    assert v.passed and v.profile.cycles == p.estimate.cycles
