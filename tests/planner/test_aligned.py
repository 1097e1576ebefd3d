"""Grid-aligned boundaries: a GEMM's output left in the blocks the next GEMM's grid reads, where the
next GEMM reads it as its A, alone. Both catalogues offer those layouts, the reader's preparation
then moves nothing for A, selection compares them with the neutral layouts, and the package
validates with the estimate equal to the IPU model's cycles."""

from __future__ import annotations

from pathlib import Path

import pytest

import tileplan.planner.catalogue as catalogue
from tileplan.graph.loaders import load_model
from tileplan.layout.gemm_grid import Grid
from tileplan.lowering.compile import compile_model
from tileplan.lowering.package import load_package
from tileplan.planner import canon
from tileplan.planner.gemm import GemmShape, a_grid
from tileplan.planner.plan import Context, plan
from tileplan.planner.quality import model_floor
from tileplan.sim.validate import validate_package
from tileplan.target import load_target

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def chain():
    graph = load_model(FIXTURES / "gemm_chain_fp16.toml")
    return graph, load_target(graph.target)


def reader():
    """The chain planned, its planning context, the reading GEMM and its shape."""
    graph, target = chain()
    p = plan(graph, target)
    down = p.graph.op("down")
    return p, Context(p.graph, target, weights=p.weights), down, GemmShape.of(p.graph, down, target)


def test_the_reader_and_the_writer_offer_the_same_grid_aligned_layouts():
    p, ctx, down, shape = reader()
    choices = catalogue.aligned_choices(ctx, down)
    assert 1 <= len(choices) <= catalogue.ALIGNED_GRIDS
    layouts = {a_grid(shape, c) for c in choices}
    assert len(layouts) == len(choices)
    # The writer's candidates include every aligned layout as their output, the reader's as their A,
    # and every reader candidate with an aligned A uses the very grid and order that read A so.
    ups = {c.out for c in p.candidates["up"] if isinstance(c.out, Grid)}
    downs = [c for c in p.candidates["down"] if isinstance(c.ins[0], Grid)]
    assert ups == layouts and {c.ins[0] for c in downs} == layouts
    for c in downs:
        assert a_grid(shape, c.choice) == c.ins[0] and c.choice.sk == 1


def test_an_aligned_a_moves_nothing_in_the_readers_preparation():
    from tileplan.estimate.detailed import cost_program, moves_nothing
    p, ctx, down, shape = reader()
    target = ctx.target
    choice = catalogue.aligned_choices(ctx, down)[0]
    rows = catalogue.ew.activation_layouts(ctx.graph.tensors["h"], target.tiles)[0]
    out = catalogue.ew.activation_layouts(ctx.graph.tensors["y"], target.tiles)[0]
    prep = {}
    for name, la in (("aligned", a_grid(shape, choice)), ("neutral", rows)):
        prog = catalogue.fragment(ctx, down, shape, choice, (la, None, out))
        a_in, a_grid_buf = ctx.tensor_buffer("h", la), prog.buffers["down.A"]
        assert moves_nothing(a_in, a_grid_buf, target.tiles) == (name == "aligned")
        prep[name] = next(s for s in cost_program(prog, target).steps if s.name == "down.prep").bytes
    assert prep["aligned"] < prep["neutral"]


def test_the_chain_plans_its_product_grid_aligned_and_validates(tmp_path):
    """On this chain the aligned path wins: the up GEMM writes its product as the down GEMM's grid reads
    it, which the neutral layouts cannot beat (planned with no aligned grid offered, it is slower)."""
    graph, target = chain()
    p, _, path = compile_model(graph, target, tmp_path / "pkg")
    up, down = (p.candidates[n][p.picks[n]] for n in ("up", "down"))
    assert isinstance(up.out, Grid) and down.ins[0] == up.out
    v = validate_package(load_package(path))
    assert v.passed and v.profile.cycles == p.estimate.cycles
    assert model_floor(p.graph, target)["cycles"] <= p.estimate.cycles


def test_without_aligned_grids_the_same_chain_plans_slower(monkeypatch):
    graph, target = chain()
    aligned = plan(graph, target).estimate.cycles
    monkeypatch.setattr(catalogue, "ALIGNED_GRIDS", 0)
    neutral = plan(graph, target)
    assert not any(isinstance(c.out, Grid) or isinstance(c.ins[0], Grid)
                   for n in ("up", "down") for c in neutral.candidates[n])
    assert aligned < neutral.estimate.cycles


def test_only_a_gemm_reading_an_intermediate_alone_as_its_a_is_aligned():
    graph, _ = chain()
    up, down = graph.op("up"), graph.op("down")
    assert canon.a_reader(graph, "h") is down and canon.a_reader(graph, "x") is None   # x: a host input
    assert canon.may_read_aligned(graph, down) and not canon.may_read_aligned(graph, up)
    # The writer's planning problem includes its reader (its catalogue offers the reader's layouts).
    assert down in canon.neighbourhood(graph, up)
    # Through a bias Add and a GeLU, the GeLU's output read by fc2 alone.
    mlp = load_model(FIXTURES / "mlp_fp16_small.toml")
    assert canon.a_reader(mlp, "g") is mlp.op("fc2") and canon.may_read_aligned(mlp, mlp.op("fc2"))


@pytest.mark.parametrize("fixture", ["mlp_smoke_fp8", "mlp_fp16_small",
                                     pytest.param("siglip_mlp_fp8_b1", marks=pytest.mark.slow)])
def test_gemms_through_an_epilogue_offer_aligned_layouts_only_to_the_fused_kinds(fixture, planned):
    """fc1 -> bias Add -> GeLU (-> Cast) -> fc2: only candidates whose reducers do the chain write fc2's
    A, so only they may write it grid-aligned; the plain and bias kinds write other tensors. The
    FP8 chain (with the Cast) on the 64-tile smoke MLP in the fast lane, at full size on 1472 tiles
    in the whole suite."""
    _, _, p = planned(FIXTURES / f"{fixture}.toml")
    up = next(op for op in p.graph.ops if op.kind == "matmul")
    aligned = [c for c in p.candidates[up.name] if isinstance(getattr(c.out, "layout", c.out), Grid)]
    assert aligned
    for c in aligned:
        assert c.choice.epilogue is not None and c.choice.epilogue.gelu
