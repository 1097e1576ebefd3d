"""Pins: a user's grid for a GEMM, on the command line or in a model's [pin] table. A pin is honoured
or refused with the reason; --emit-pins writes pins that reproduce the plan byte for byte; a pinned
plan's report shows it beside the planner's own choice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tileplan.errors import TileplanError
from tileplan.graph.loaders import load_model
from tileplan.graph.pins import parse_pin
from tileplan.planner.pins import emit_pins
from tileplan.planner.plan import plan
from tileplan.target import load_target

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
SMALL = FIXTURES / "mlp_fp16_small.toml"


@pytest.fixture(scope="module")
def graph():
    return load_model(SMALL)


@pytest.fixture(scope="module")
def target(graph):
    return load_target(graph.target)


def chosen(p, op):
    return p.candidates[op][p.picks[op]]


def test_a_pin_is_honoured_and_recorded_beside_the_planners_own_choice(graph, target):
    own = plan(graph, target)
    pinned = plan(graph, target, pins=[parse_pin("fc1=grid:4x8x2,order:bijl,reduction:gather")])
    c = chosen(pinned, "fc1").choice
    assert (c.gb, c.gm, c.gn, c.gk, c.order, c.reduction) == (1, 4, 8, 2, "bijl", "gather")
    assert pinned.pinned["own_cycles"] == own.estimate.cycles
    assert pinned.pinned["pins"] == {"fc1": "grid:4x8x2,order:bijl,reduction:gather"}
    assert pinned.estimate.cycles > own.estimate.cycles        # the planner's choice was faster


def test_a_pin_of_the_planners_own_choice_changes_nothing(graph, target):
    own = plan(graph, target)
    again = plan(graph, target, pins=[parse_pin(line.split(" = ")[0].strip('"') + "=" + line.split(" = ")[1].strip('"'))
                                      for line in emit_pins(own).splitlines() if " = " in line])
    assert again.pinned is None
    assert {op.name: str(chosen(again, op.name)) for op in graph.ops} == \
           {op.name: str(chosen(own, op.name)) for op in graph.ops}


@pytest.mark.parametrize("spec, why", [
    ("fc1=grid:8x9x1", r"the grid needs 72 tiles; 'ipu21-64' has 64"),
    ("fc1=grid:1x40x1", r"gn=40 splits N.s panels \(32\) into empty blocks"),
    ("nope=grid:1x1x1", r"the graph has no op of that name"),
    ("act=grid:1x1x1", r"only MatMul ops take grid pins"),
])
def test_a_pin_that_fits_no_candidate_says_why(graph, target, spec, why):
    with pytest.raises(TileplanError, match=why):
        plan(graph, target, pins=[parse_pin(spec)])


def test_a_pin_whose_blocks_overflow_tile_memory_names_the_bytes():
    from tileplan.graph.core import Graph, MatMul, Role, Tensor
    from tileplan.graph.dtypes import DType
    g = Graph.build("big", [Tensor("a", (512, 2048), DType.FP16, Role.INPUT),
                            Tensor("w", (2048, 2048), DType.FP16, Role.PARAMETER)], [MatMul("mm", ("a", "w"), "c")])
    with pytest.raises(TileplanError, match=r"pin of 'mm' \(grid:1x1x1\): every form overflows tile memory; .* B over"):
        plan(g, load_target("ipu21-64"), pins=[parse_pin("mm=grid:1x1x1")])


@pytest.mark.parametrize("text, why", [
    ("fc1", "a pin is OP=grid"), ("fc1=order:bijl", "the grid is missing"), ("fc1=grid:2x2", "grid must be"),
    ("fc1=grid:2x2x2,order:xyzw", "order must be one of"), ("fc1=grid:2x2x1,reduction:rows", "needs gk > 1"),
    ("fc1=grid:2x2x2,colour:red", "unknown key 'colour'"),
])
def test_malformed_pins_are_one_line_errors(text, why):
    with pytest.raises(TileplanError, match=why):
        parse_pin(text)


def test_a_model_files_pin_table_pins_its_gemm(tmp_path, target):
    text = SMALL.read_text() + '\n[pin]\nfc1 = "grid:4x8x2"\n'
    path = tmp_path / "pinned.toml"
    path.write_text(text)
    p = plan(load_model(path), target)
    c = chosen(p, "fc1").choice
    assert (c.gm, c.gn, c.gk) == (4, 8, 2) and p.pinned is not None


def test_emitted_pins_fed_back_give_a_byte_identical_package(tmp_path, cli):
    pins = tmp_path / "pins.toml"
    code, _, err = cli("plan", str(SMALL), "--emit-pins", str(pins), "-q")
    assert code == 0, err
    for name, extra in (("a", []), ("b", ["--pins", str(pins)])):
        code, _, err = cli("compile", str(SMALL), "-o", str(tmp_path / name), "-q", *extra)
        assert code == 0, err
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert files
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    assert "pinned" not in json.loads((tmp_path / "b" / "plan.json").read_text())


@pytest.mark.slow
def test_the_siglip_fp16_mlp_compiles_and_validates_with_the_grids_users_pin(tmp_path, cli):
    """Grids a user pinned on the full-size SigLIP FP16 MLP without biases (1472 tiles): the package
    compiles with them and validates."""
    model = FIXTURES / "siglip_mlp_fp16_nobias_b1.toml"
    pkg = tmp_path / "pkg"
    code, _, err = cli("compile", model, "-o", pkg, "-q", "--pin", "up=grid:2x92x8", "--pin", "down=grid:3x18x27")
    assert code == 0, err
    ops = {o["name"]: o for o in json.loads((pkg / "plan.json").read_text())["ops"]}
    assert ops["up"]["candidate"].split(" grid ")[1].startswith("2x92x8")
    assert ops["down"]["candidate"].split(" grid ")[1].startswith("3x18x27")
    code, out, err = cli("validate", pkg)
    assert code == 0 and "validation passed" in out, out + err


SMOKE = FIXTURES / "mlp_smoke_fp8.toml"


def test_emitted_pins_name_the_epilogue_and_reproduce_a_plan_with_a_fused_one():
    graph = load_model(SMOKE)
    target = load_target(graph.target)
    fused = plan(graph, target, pins=[parse_pin("fc1=grid:3x9x2,epilogue:bias+gelu+fp8")])
    assert chosen(fused, "fc1").choice.epilogue is not None and chosen(fused, "cast_g").absorbed
    text = emit_pins(fused)
    lines = {line.split(" = ")[0].strip('"'): line.split(" = ")[1].strip('"') for line in text.splitlines()
             if " = " in line}
    assert lines["fc1"].endswith(",epilogue:bias+gelu+fp8") and ",epilogue:" in lines["fc2"]
    again = plan(graph, target, pins=[parse_pin(f"{op}={spec}") for op, spec in lines.items()])
    assert emit_pins(again) == text and again.estimate.cycles == fused.estimate.cycles
    assert {op.name: chosen(again, op.name).desc for op in graph.ops} == \
           {op.name: chosen(fused, op.name).desc for op in graph.ops}


@pytest.mark.parametrize("text, why", [
    ("fc1=grid:2x2x2,epilogue:gelu", "a GeLU in the reduction needs the bias too"),
    ("fc1=grid:2x2x2,epilogue:fp8+bias", "parts of bias\\+gelu\\+fp8 in that order"),
    ("fc1=grid:2x2x2,epilogue:relu", "epilogue must be none or parts of"),
    ("fc1=grid:2x2x1,epilogue:bias", "need gk > 1"),
])
def test_malformed_epilogue_pins_are_one_line_errors(text, why):
    with pytest.raises(TileplanError, match=why):
        parse_pin(text)


def test_a_pin_naming_an_epilogue_the_op_cannot_fuse_says_which_it_can():
    graph = load_model(SMOKE)
    with pytest.raises(TileplanError, match=r"pin of 'fc2' .*epilogue:bias\+gelu\+fp8 is not one its reducers may "
                                            r"do \(its output feeds bias2 \(add\); the ops after it allow none, bias\)"):
        plan(graph, load_target(graph.target), pins=[parse_pin("fc2=grid:4x5x3,epilogue:bias+gelu+fp8")])


def test_a_model_files_pin_table_takes_an_epilogue(tmp_path):
    path = tmp_path / "pinned.toml"
    path.write_text(SMOKE.read_text() + '\n[pin]\nfc1 = "grid:3x9x2,epilogue:bias+gelu+fp8"\n')
    graph = load_model(path)
    p = plan(graph, load_target(graph.target))
    assert str(chosen(p, "fc1").choice.epilogue) == "GeLU (tanh) and cast to fp8" and chosen(p, "fc1").choice.bias
