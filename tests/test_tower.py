"""The small 4-layer tower (fixtures/encoder_tower_small.toml, 64 tiles) end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import tileplan
from tileplan.graph.loaders import load_model
from tileplan.planner.cache import PlanCache

TOWER = Path(__file__).resolve().parents[1] / "fixtures" / "encoder_tower_small.toml"


@pytest.mark.slow
def test_the_small_tower_compiles_from_a_warm_cache_and_validates_on_the_ipu_model(tmp_path):
    from tileplan.lowering.compile import compile_model
    from tileplan.target import load_target
    g = load_model(TOWER)
    target = load_target(g.target)
    cache = PlanCache(tmp_path / "cache")
    p, _, pkg = compile_model(g, target, tmp_path / "cold", cache=cache)
    assert cache.misses > 0       # (its hits: the fused QKV form reading what the separate one stored)
    warm_cache = PlanCache(tmp_path / "cache")
    _, _, warm = compile_model(g, target, tmp_path / "warm", cache=warm_cache)
    assert warm_cache.misses == 0 and warm_cache.hits == cache.misses + cache.hits
    assert (warm / "manifest.json").read_bytes() == (pkg / "manifest.json").read_bytes()
    # Every layer's weights stay resident: the package's parameters are all four layers'.
    plan = json.loads((pkg / "plan.json").read_text())
    assert plan["totals"]["cycles"] == p.estimate.cycles
    # Four FP16 layers accumulate FP16 roundings in another order than the float64 reference rounds
    # each op's result: the outputs (|y| up to about 16) agree within two FP16 ulps at that size.
    v = tileplan.validate(pkg, atol=2 * 2.0 ** -6, rtol=0.01)
    out = v.outputs["l3.y"]
    assert v.passed, out
    assert out["cosine"] > 0.99999
    assert v.profile.cycles == p.estimate.cycles
    # The layers are one program: the package holds a table the layers share once, and loads it as
    # one array (the IPU model then checks and counts it once).
    from tileplan.lowering.package import load_package
    steps = {s.name: s for s in load_package(pkg).program.steps}
    layer1 = [n for n in steps if n.startswith("l1.")]
    same = [n for n in layer1 if _tables(steps[n]) == _tables(steps[n.replace("l1.", "l2.")])]   # (grouped steps
    #                                                                  name each of their layer's parts)
    assert len(same) >= len(layer1) // 2, sorted(set(layer1) - set(same))
    index = json.loads((pkg / "program.json").read_text())
    assert sum("arrays" in s for s in index["steps"]) + sum("arrays" in g for s in index["steps"]
                                                             for g in s.get("groups", ())) >= len(same)


def _tables(step) -> tuple:
    """The identities of a step's arrays (equal tuples: the very same arrays)."""
    if hasattr(step, "groups"):
        return tuple((id(g.tile), id(g.ins), id(g.outs)) for g in step.groups)
    return tuple(id(getattr(step.transfers, f)) for f in ("group", "src_tile", "src_off", "dst_tile", "dst_off",
                                                            "nbytes"))


def test_a_tower_whose_weights_do_not_fit_names_the_tile_region_and_largest_buffers(cli, tmp_path):
    # Four FP16 [2048, 2048] weights: 8 MiB each, 512 KiB per tile of 64 (589,824 usable), under the
    # SRAM (a fifth would be refused before planning: loaders.check_parameter_bytes), beside
    # [2048, 2048] activations that do not fit with them.
    layers = 4
    lines = ['[model]', 'name = "too_deep"', 'target = "ipu21-64"', '', '[tensors]',
             'x = { shape = [2048, 2048], dtype = "fp16", role = "input" }']
    lines += [f'w{i} = {{ shape = [2048, 2048], dtype = "fp16", role = "parameter" }}' for i in range(layers)]
    x = "x"
    for i in range(layers):
        lines += ["", "[[ops]]", f'name = "fc{i}"', 'op = "matmul"', f'inputs = ["{x}", "w{i}"]', f'output = "h{i}"']
        x = f"h{i}"
    model = tmp_path / "too_deep.toml"
    model.write_text("\n".join(lines) + "\n")
    code, out, err = cli("plan", model, "--no-cache", "-o", tmp_path / "plan.json")
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert "nothing fits" in err and "tile 0" in err and "interleaved 524,288" in err, err
    assert "the largest w3 131,072 B (interleaved)" in err
    assert not (tmp_path / "plan.json").exists()


def test_the_tower_lowered_from_its_renamed_layers_is_the_program_of_their_vertices_built_out(planned):
    """Shared costing renames one layer's compute steps for the others (``ComputeStep.renamed``: their
    vertices are never built, lowering places the original's grouping by the renamed buffers, and
    copies with one plan are expanded and merged once). The tile program must be the one lowered
    from the same program with every renamed step's vertices built out as plain steps, array for
    array, and lowering must not have built the renamed steps' vertices."""
    from tileplan.lowering.lower import lower
    from tileplan.program import ComputeStep, Program
    _, target, p = planned(TOWER)
    prog = p.mid.program
    renamed = [s for s in prog.steps if isinstance(s, ComputeStep) and s.source is not None]
    assert {s.name.split(".")[0] for s in renamed} >= {"l1", "l2", "l3"}    # later layers: renamings
    got = lower(prog, target).tile_program.to_files()
    assert not any("vertices" in s.__dict__ for s in renamed if s.primitives != {"cast"})
    built = Program(dict(prog.buffers), [ComputeStep(s.name, s.vertices) if isinstance(s, ComputeStep) else s
                                         for s in prog.steps], dict(prog.aliases))
    assert all(s.source is None for s in built.steps if isinstance(s, ComputeStep))
    want = lower(built, target).tile_program.to_files()
    assert got[1] == want[1] and got[0] == want[0]


def test_the_tower_s_host_tables_hold_each_repeated_step_once_and_compute_what_the_ipu_model_computes(planned, monkeypatch):
    """host/tables.bin stores a step whose rows equal an earlier step's (slot for slot: the same
    vertices, operands and copies over that layer's own variables) once; the later layers' steps
    refer to those rows with their own bindings. Executed as host.cpp executes them, the shared rows
    still compute, byte for byte, the outputs the IPU model computes from the tile program."""
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent / "lowering"))
    from test_emit import HostDataflow, read_tables, run_ipu_model
    from tileplan.lowering.emit import emit_host
    from tileplan.lowering.lower import lower
    from tileplan.sim.reference import seeded_values
    from tileplan.lowering.emit.host import Replay
    g, target, p = planned(TOWER)
    tp = lower(p.mid.program, target).tile_program
    repeats = []
    replay_as_earlier = Replay._repeat
    monkeypatch.setattr(Replay, "_repeat", lambda self, *a: repeats.append(replay_as_earlier(self, *a)) or repeats[-1])
    files = emit_host(tp, target, g.name)
    # a repeated exchange is replayed from the earlier one's rows: the tables a full replay writes
    # (most of the exchanges of layers 2-4: their own steps, as many again as layer 1's)
    from tileplan.program import ExchangeStep
    per_layer = sum(isinstance(s, ExchangeStep) and s.name.startswith("l1.") for s in p.mid.program.steps)
    assert sum(repeats) >= 3 * per_layer * 3 // 4 and per_layer >= 15, (repeats, per_layer)
    monkeypatch.setattr(Replay, "_repeat", lambda self, *a: False)
    assert emit_host(tp, target, g.name) == files
    tables = read_tables(files["host/tables.bin"])
    steps = tables["steps"]
    names = [tables.string(n) for n in steps[:, 1].tolist()]
    body = {name: tuple(row[2:6]) for name, row in zip(names, steps.tolist())}
    scope = {name: tuple(row[6:8]) for name, row in zip(names, steps.tolist())}
    layer2 = [n for n in names if n.startswith("l2.")]
    in_layer1 = {n: n.replace("l2.", "l1.") for n in layer2}     # (grouped steps name each layer's parts)
    shared = [n for n in layer2 if body[n] == body[in_layer1[n]]]
    assert len(shared) >= len(layer2) * 3 // 4, sorted(set(layer2) - set(shared))
    # shared rows, each layer's own variables: the bindings differ where the layer's values do
    assert any(scope[n] != scope[in_layer1[n]] for n in shared)
    bound = tables["bindings"][:, 0]
    differs = [n for n in shared
               if not np.array_equal(bound[slice(scope[n][0], sum(scope[n]))],
                                     bound[slice(scope[in_layer1[n]][0], sum(scope[in_layer1[n]]))])]
    assert len(differs) == len(shared)
    # each distinct group row stored once: fewer groups than the steps' vertex groups
    assert len(tables["groups"]) * 2 < sum(len([gr for gr in getattr(st, "groups", ()) if gr.call.primitive != "copy"])
                                           for st in tp.steps)
    stored = seeded_values(p.graph, seed=5)          # (the planned graph: its QKV projections may be fused)
    got = HostDataflow(tables, tp, target).run(stored)
    want = run_ipu_model(tp, target, stored)
    assert set(got) == set(want) == {"l3.y"}
    assert got["l3.y"].tobytes() == np.ascontiguousarray(want["l3.y"]).tobytes()
