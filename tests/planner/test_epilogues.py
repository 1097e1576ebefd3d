"""Fused epilogues in plans: which chains fuse, the candidates they add beside the unfused ones,
and packages whose fused passes (reducers doing bias-GeLU and the FP8 cast, bias-GeLU with FP8
output) validate on the IPU model with the estimate equal to the simulated cycles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tileplan.graph.core import Add, Cast, GeLU, Graph, MatMul, Role, Tensor
from tileplan.graph.dtypes import DType
from tileplan.graph.loaders import load_model
from tileplan.lowering.compile import compile_plan
from tileplan.lowering.package import load_package
from tileplan.planner import catalogue
from tileplan.planner import elementwise as ew
from tileplan.planner.epilogue import gemm_chain
from tileplan.planner.plan import Context, plan
from tileplan.planner.select import Fused
from tileplan.sim.validate import validate_package
from tileplan.target import load_target

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
IPU64 = load_target("ipu21-64")
FP8, FP16 = DType.FP8, DType.FP16


def chain_graph(*, bias=True, gelu=True, cast=True, outputs=None, cast_saturate=True) -> Graph:
    tensors = [Tensor("x", (16, 32), FP16, Role.INPUT), Tensor("w", (32, 24), FP16, Role.PARAMETER)]
    tensors += [Tensor("b", (24,), FP16, Role.PARAMETER)] if bias else []
    tensors += [Tensor("y8", (16, 24), FP8, Role.OUTPUT, scale=1)] if cast else []
    ops, cur = [MatMul("mm", ("x", "w"), "h")], "h"
    if bias:
        ops.append(Add("bias", (cur, "b"), "hb"))
        cur = "hb"
    if gelu:
        ops.append(GeLU("act", (cur,), "g"))
        cur = "g"
    if cast:
        ops.append(Cast("to8", (cur,), "y8", saturate=cast_saturate))
    return Graph.build("chain", tensors, ops, outputs=outputs)


def test_the_chain_a_gemm_reducer_may_do_is_the_bias_the_gelu_and_the_fp8_cast():
    chain = gemm_chain((g := chain_graph()), g.op("mm"))
    assert [op.name for op in chain.ops] == ["bias", "act", "to8"] and chain.bias == "b"
    assert chain.epilogue.gelu == "tanh" and chain.epilogue.cast and chain.epilogue.cast_scale == 1
    assert chain.through == ("bias", "act") and chain.tag == "reduce:add+gelu+cast"
    only_cast = gemm_chain((g := chain_graph(bias=False, gelu=False)), g.op("mm"))
    assert [op.name for op in only_cast.ops] == ["to8"] and only_cast.bias is None
    no_cast = gemm_chain((g := chain_graph(cast=False)), g.op("mm"))
    assert [op.name for op in no_cast.ops] == ["bias", "act"] and not no_cast.epilogue.cast
    # The bias alone is the bias-in-reduction kind; a GeLU needs the bias; an output or a
    # non-saturating cast ends the chain before it.
    for reason, graph, want in [
            ("bias alone", chain_graph(gelu=False, cast=False), None),
            ("a GeLU with no bias", chain_graph(bias=False, cast=False), None),
            ("the GeLU's value is an output", chain_graph(outputs=["g", "y8"]), ["bias", "act"]),
            ("a cast that makes NaN past 240", chain_graph(cast_saturate=False), ["bias", "act"])]:
        got = gemm_chain(graph, graph.op("mm"))
        assert (got and [op.name for op in got.ops]) == want, reason


@pytest.fixture(scope="module")
def smoke():
    graph = load_model(FIXTURES / "mlp_smoke_fp8.toml")
    return graph, load_target(graph.target)


def test_the_catalogue_adds_the_epilogue_kind_beside_the_plain_and_bias_kinds(smoke):
    graph, target = smoke
    cands = catalogue.gemm_candidates(Context(graph, target), graph.op("fc1"))
    fused = [c for c in cands if c.choice.epilogue is not None]
    assert fused and any(c.choice.epilogue is None for c in cands)
    for c in fused:
        assert c.choice.gk > 1 and c.choice.bias
        assert c.fused == "cast_g" and c.through == ("bias1", "act")
        assert isinstance(c.out, Fused) and c.out.via == "reduce:add+gelu+cast"
        reduce = [v for s in c.program.steps if s.name == "fc1.reduce" for v in s.vertices]
        assert reduce and {v.variant for v in reduce} == {"reduce_bias_gelu_cast_fp16"}
        assert all(v.call.gelu == "tanh" and v.call.cast_to is FP8 for v in reduce)
        assert c.program.buffers["fc1.Cr"].dtype is FP8              # the reducers store FP8
        assert c.program.steps[-1].copies[0].dst.startswith("g8@")   # it writes the Cast's output
        assert "GeLU (tanh) and cast to fp8 in the reduction" in c.desc


def test_the_selection_compares_the_fused_kinds_by_cost_and_every_pick_is_consistent(smoke):
    graph, target = smoke
    p = plan(graph, target)
    picked = {op: p.candidates[op][i] for op, i in p.picks.items()}
    fc1 = [c for c in p.candidates["fc1"] if c.choice.epilogue is not None]
    assert fc1 and not picked["fc1"].choice.epilogue          # on offer, and slower here
    assert min(c.estimate.cycles for c in fc1) > picked["fc1"].estimate.cycles
    # The absorbed ops take exactly the candidates their fusion's marker allows.
    assert picked["bias1"].fused == "act" and picked["act"].absorbed and not picked["cast_g"].absorbed


def _forced(monkeypatch, graph, target, keep):
    """The plan when only the candidates ``keep(op, cand)`` accepts are on offer for some ops."""
    gemms, pointwise = catalogue.gemm_candidates, ew.candidates
    monkeypatch.setattr(catalogue, "gemm_candidates", lambda ctx, op: [c for c in gemms(ctx, op) if keep(op, c)])
    monkeypatch.setattr(ew, "candidates", lambda ctx, op: [c for c in pointwise(ctx, op) if keep(op, c)])
    return plan(graph, target)


def _validated(p, target, path):
    _, pkg_path = compile_plan(p, target, path)
    pkg = load_package(pkg_path)
    v = validate_package(pkg)
    estimate = json.loads((pkg_path / "report.json").read_text())["estimate"]
    return pkg, v, estimate


def test_a_plan_whose_reducers_do_bias_gelu_and_the_fp8_cast_validates(smoke, monkeypatch, tmp_path):
    graph, target = smoke
    p = _forced(monkeypatch, graph, target, lambda op, c: op.name != "fc1" or c.choice.epilogue is not None)
    picked = {op: p.candidates[op][i] for op, i in p.picks.items()}
    assert picked["fc1"].choice.epilogue is not None
    assert all(picked[n].absorbed and picked[n].estimate.cycles == 0 for n in ("bias1", "act", "cast_g"))
    pkg, v, estimate = _validated(p, target, tmp_path / "pkg")
    assert v.passed and v.outputs["y"]["cosine"] > 0.999
    assert estimate["cycles"] == v.profile.cycles == p.estimate.cycles
    variants = {g.variant for s in pkg.program.steps if s.name == "fc1.reduce" for g in s.groups}
    assert variants == {"reduce_bias_gelu_cast_fp16"}
    assert (pkg.path / "codelets" / "reduce_bias_gelu_cast_fp16_own.cpp").exists() or any(
        f.name.startswith("reduce_bias_gelu_cast_fp16") for f in (pkg.path / "codelets").iterdir())


def test_a_plan_whose_reducers_do_the_epilogue_with_the_weights_pre_arranged_validates(smoke, monkeypatch, tmp_path):
    # The kinds are orthogonal: the catalogue offers fused candidates reading B pre-arranged too.
    graph, target = smoke
    p = _forced(monkeypatch, graph, target,
                lambda op, c: op.name != "fc1" or (c.choice.epilogue is not None and c.weights is not None))
    picked = {op: p.candidates[op][i] for op, i in p.picks.items()}
    assert picked["fc1"].choice.epilogue is not None and picked["fc1"].weights is not None
    assert "B pre-arranged" in picked["fc1"].desc and picked["cast_g"].absorbed
    pkg, v, estimate = _validated(p, target, tmp_path / "pkg")
    assert v.passed and v.outputs["y"]["cosine"] > 0.999
    assert estimate["cycles"] == v.profile.cycles == p.estimate.cycles


def test_a_plan_with_the_fp8_output_bias_gelu_pass_validates(smoke, monkeypatch, tmp_path):
    graph, target = smoke
    p = _forced(monkeypatch, graph, target,
                lambda op, c: op.name != "bias1" or c.desc.startswith("bias-gelu-fp8"))
    picked = {op: p.candidates[op][i] for op, i in p.picks.items()}
    assert picked["bias1"].fused == "cast_g" and picked["bias1"].through == ("act",)
    assert picked["act"].absorbed and picked["cast_g"].absorbed
    pkg, v, estimate = _validated(p, target, tmp_path / "pkg")
    assert v.passed and v.outputs["y"]["cosine"] > 0.999
    assert estimate["cycles"] == v.profile.cycles == p.estimate.cycles
    variants = {g.variant for s in pkg.program.steps if s.name == "bias1.compute" for g in s.groups}
    assert variants and variants <= {"bias_gelu_fp16_fp8", "bias_gelu_fp16"}


def test_a_plan_whose_reducers_do_bias_gelu_in_fp16_validates(monkeypatch, tmp_path):
    graph = load_model(FIXTURES / "mlp_fp16_small.toml")
    target = load_target(graph.target)
    p = _forced(monkeypatch, graph, target, lambda op, c: op.name != "fc1" or c.choice.epilogue is not None)
    picked = {op: p.candidates[op][i] for op, i in p.picks.items()}
    assert picked["fc1"].choice.epilogue.gelu == "tanh" and picked["act"].absorbed
    pkg, v, estimate = _validated(p, target, tmp_path / "pkg")
    assert v.passed and v.outputs["y"]["max_abs"] <= 0.002
    assert estimate["cycles"] == v.profile.cycles == p.estimate.cycles


def _bias_gelu_graph(cols: int) -> Graph:
    tensors = [Tensor("x", (8, cols), FP16, Role.INPUT), Tensor("b", (cols,), FP16, Role.PARAMETER)]
    return Graph.build("bg", tensors, [Add("bias", ("x", "b"), "s"), GeLU("act", ("s",), "y")])


def test_the_bias_gelu_pass_takes_the_aligned_path_exactly_where_its_operands_start_8_byte_aligned():
    target = IPU64.with_tiles(4)
    ctx = Context(_bias_gelu_graph(24), target)
    for c in ew.candidates(ctx, ctx.graph.op("bias")):
        if not c.desc.startswith("bias-gelu"):
            continue
        for v in (v for s in c.program.steps for v in s.vertices):
            a, bias = v.ins
            aligned = a.offset * 2 % 8 == 0 and bias.offset * 2 % 8 == 0 and v.outs[0].offset * 2 % 8 == 0
            assert v.call.aligned == aligned
            assert v.variant == ("bias_gelu_aligned_fp16" if aligned else "bias_gelu_fp16"), (c.desc, v.call)
    # Whole rows of 13 halves are not whole 64-bit words: the general pass (a piece of a row may be).
    ctx = Context(_bias_gelu_graph(13), target)
    calls = {(v.call.cols, v.variant) for c in ew.candidates(ctx, ctx.graph.op("bias")) if c.desc.startswith("bias-gelu")
             for s in c.program.steps for v in s.vertices}
    assert (13, "bias_gelu_fp16") in calls and (13, "bias_gelu_aligned_fp16") not in calls
    assert all(cols * 2 % 8 == 0 for cols, variant in calls if variant == "bias_gelu_aligned_fp16")


def test_a_catalogue_costed_kind_by_kind_in_a_pool_is_the_catalogue_costed_at_once(smoke):
    """The smoke MLP's two GEMMs on 1472 tiles with two jobs: fewer catalogues than twice the
    workers, so each runs in the pool one kind per task (``catalogue.submit``); every op's
    candidates and runner-ups, in order, are the ones one in-process catalogue gives."""
    from tileplan.planner.families import family_of
    from tileplan.planner.plan import _context
    graph, _ = smoke
    big = load_target("ipu21")
    pooled = _context(graph, big, 2, 32, None, None, "planner")
    gemms = [op for op in pooled.graph.ops if family_of(op).catalogued]
    assert len(gemms) == 2 and catalogue.split_kinds(len(gemms), 2)
    assert len(catalogue.kinds(pooled, pooled.graph.op("fc1"))) > 2        # plain, bias, epilogue, ...
    got = catalogue.Catalogues(pooled, gemms).result()
    alone = _context(graph, big, 1, 32, None, None, "planner")
    for op in gemms:
        want = catalogue.gemm_candidates(alone, op)
        assert [(c.desc, c.estimate, c.boundary) for c in got[op.name]] == \
            [(c.desc, c.estimate, c.boundary) for c in want], op.name
        assert [(r.candidate.desc, r.why) for r in pooled.runner_ups[op.name]] == \
            [(r.candidate.desc, r.why) for r in alone.runner_ups[op.name]], op.name
