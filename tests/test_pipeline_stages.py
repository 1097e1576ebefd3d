"""Planning over several IPUs (``planner.stages``): pipeline stages of whole layers, one IPU each,
joined over the IPU-Links, and one GEMM too big for one IPU spread over two (tensor-parallel)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tileplan.errors import TileplanError
from tileplan.graph.dtypes import DType
from tileplan.target import load_target

FIXTURES = Path(__file__).parent.parent / "fixtures"
TOWER = FIXTURES / "encoder_tower_small.toml"


# ---- the layout move ----------------------------------------------------------------------------

def test_a_shifted_layout_holds_its_elements_on_tiles_offset_higher():
    from tileplan.layout.gemm_grid import Grid
    from tileplan.layout.layouts import Intervals, Shifted, WholeRows, shifted
    base = Intervals(8, 8)
    moved = shifted(base, 64)
    assert isinstance(moved, Shifted) and str(moved) == "Iv(8,a8)+64"
    a, b = base.owner_map((4, 32), DType.FP16, 64), moved.owner_map((4, 32), DType.FP16, 128)
    assert (b.tile == a.tile + 64).all() and (b.start == a.start).all() and (b.offset == a.offset).all()
    per_tile = moved.bytes_per_tile((4, 32), DType.FP16, 128)
    assert per_tile[:64].sum() == 0 and (per_tile[64:] == base.owner_map((4, 32), DType.FP16, 64)
                                         .bytes_per_tile(64, 2)).all()
    assert shifted(WholeRows(4, 2), 64) == WholeRows(4, 66)
    grid = Grid.of((0, 8, 16), (0, 32), np.array([[3], [-1]]))
    g = shifted(grid, 64)                        # a grid stays a grid: its holders move, unheld blocks stay
    assert isinstance(g, Grid) and g.holder_array()[:, :, 0].tolist() == [[67], [-1]]
    assert shifted(shifted(base, 64), 64) == Shifted(base, 128) and shifted(base, 0) is base


# ---- the split ----------------------------------------------------------------------------------

def _tower():
    from tileplan.graph.loaders import load_model
    from tileplan.planner.rewrite import canonical
    return canonical(load_model(TOWER))


@pytest.mark.parametrize("target, layers", [("ipu21-64x2", [[0, 1], [2, 3]]),
                                            ("ipu21-64x4", [[0], [1], [2], [3]])])
def test_the_split_balances_whole_layers_over_the_ipus(target, layers):
    """Equal layers: each IPU gets an equal share of whole layers (cuts only between layers)."""
    from tileplan.planner.stages import split
    g = _tower()
    costs = [100 + 7 * (i % 5) for i in range(len(g.ops))]      # the same per layer, uneven within one
    sp = split(g, load_target(target), costs)
    got = [sorted({int(op.name.split(".")[0][1:]) for op in g.ops[a:b]}) for a, b in sp.ranges]
    assert got == layers
    assert sp.ranges[0][0] == 0 and sp.ranges[-1][1] == len(g.ops)


def test_the_fp16_siglip_tower_splits_into_two_stages_of_whole_layers():
    """822 MB of FP16 weights: more than one C600 holds, half of it on each of two."""
    import time
    from tileplan.graph.loaders import load_model
    from tileplan.planner.rewrite import canonical
    from tileplan.planner.stages import FILL, split
    g = canonical(load_model(FIXTURES / "siglip_tower_fp16_b1.toml"))
    two = load_target("ipu21x2")
    t0 = time.perf_counter()
    sp = split(g, two, [10_000] * len(g.ops))      # ~200,000 cycles a layer, more than a crossing
    assert time.perf_counter() - t0 < 5
    layers = [sorted({int(op.name.split(".")[0][1:]) for op in g.ops[a:b]}) for a, b in sp.ranges]
    assert layers == [list(range(14)), list(range(14, 27))]
    assert sum(sp.params) > FILL * two.tiles_per_ipu * two.usable_bytes      # not one IPU's worth
    assert all(p <= FILL * two.tiles_per_ipu * two.usable_bytes for p in sp.params)


def test_a_split_whose_stages_cannot_hold_their_parameters_is_refused(tmp_path):
    """Four layers' parameters (299,136 B for two) over two IPUs of one 256 KiB tile each: no split
    fits, and the error names the model and the largest op's parameter bytes."""
    from tileplan.planner.stages import split
    path = tmp_path / "tiny.toml"
    path.write_text('inherits = "ipu21-64x2"\nname = "tiny"\ntiles = 2\nsram_bytes = 262144\n'
                    'standard_bytes = 131072\ninterleaved_bytes = 131072\n')
    g = _tower()
    with pytest.raises(TileplanError, match="encoder_tower_small") as exc:
        split(g, load_target(str(path)), [1] * len(g.ops))
    assert "bytes of parameters" in str(exc.value) and "2 IPUs of 1 tiles" in str(exc.value)


def test_an_unknown_ipus_mode_is_one_clear_error():
    from tileplan.planner.plan import plan
    with pytest.raises(TileplanError, match="--ipus must be one of auto, spread, stages"):
        plan(_tower(), load_target("ipu21-64x2"), ipus="pipelined")


# ---- compiled and validated ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def shared_cache():
    """One cache for the module: the two targets' stages are one-IPU programs of 64 tiles, so their
    layer catalogues are costed once."""
    from tileplan.planner.cache import MemoryCache
    return MemoryCache()


def _compile(graph, target, out, **kw):
    from tileplan.lowering.compile import compile_model
    from tileplan.lowering.package import load_package
    from tileplan.sim.validate import validate_package
    p, _, path = compile_model(graph, target, out, jobs=1, **kw)
    v = validate_package(load_package(path))         # raises when an output is out of tolerance
    report = json.loads((path / "report.json").read_text())
    plan = json.loads((path / "plan.json").read_text())
    return p, v, report, plan


@pytest.mark.slow
@pytest.mark.parametrize("name, ipus", [("ipu21-64x2", 2), ("ipu21-64x4", 4)])
def test_a_small_tower_runs_as_pipeline_stages_of_whole_layers(tmp_path, shared_cache, name, ipus):
    from tileplan.graph.loaders import load_model
    target = load_target(name)
    graph = load_model(TOWER)
    p, v, report, plan = _compile(graph, target, tmp_path / "pkg", cache=shared_cache, ipus="stages",
                                  qkv="fused")     # (one QKV form: the test is about the stages)
    assert report["estimate"]["cycles"] == v.profile.cycles
    st = plan["stages"]
    assert st["mode"] == "stages" and [s["ipu"] for s in st["stages"]] == list(range(ipus))
    # each IPU holds whole layers, in order, the same number of them
    layer_ipu = {}
    for op in plan["ops"]:
        layer_ipu.setdefault(op["name"].split(".")[0], set()).add(op["ipu"])
    assert all(len(s) == 1 for s in layer_ipu.values())
    layer_ipu = {k: s.pop() for k, s in layer_ipu.items()}
    assert [layer_ipu[f"l{i}"] for i in range(4)] == [i * ipus // 4 for i in range(4)]
    # in the joined program every compute step runs on one IPU, the IPUs in order, and every buffer
    # of a layer lies on its layer's IPU (a copy received from the stage before on the receiving IPU)
    per = target.tiles_per_ipu
    from tileplan.program import ComputeStep
    order = []
    for step in p.mid.program.steps:
        if isinstance(step, ComputeStep) and step.vertices:
            on = {vtx.tile // per for vtx in step.vertices}
            assert len(on) == 1
            order.append(on.pop())
    assert order == sorted(order) and set(order) == set(range(ipus))
    for b in p.mid.program.buffers.values():
        on = set((b.owner_map(target.tiles).tile // per).tolist())
        layer = (b.tensor or b.name).split(".")[0]           # the graph input "x": read by l0
        want = int(b.name.rsplit("@ipu", 1)[1]) if "@ipu" in b.name else layer_ipu.get(layer, 0)
        assert layer in layer_ipu or layer == "x"
        assert on == {want}, b.name
    # the IPU-Links carry only the residual stream at each stage boundary, once
    crossing = [s for s in v.profile.steps if s.kind == "exchange" and s.sync == target.sync_cycles_multi]
    assert len(crossing) == ipus - 1 and all(".receive." in s.name for s in crossing)
    width = 2 * 20 * 96 * 2                      # the [2, 20, 96] FP16 residual stream
    assert [s["link_bytes_in"] for s in st["stages"]] == [0] + [width] * (ipus - 1)
    # the latency is the sum of the stages and the crossings; the interval the slowest stage
    assert st["interval_cycles"] == max(s["cycles"] for s in st["stages"])
    assert v.profile.cycles >= sum(s["cycles"] for s in st["stages"])


def _wide_gemm(tmp_path):
    """[16, 1024] x [1024, 3072] FP16 (6.3 MB of weights) for two 8-tile IPUs (4.7 MB usable each):
    the model file, beside its target file ``t.toml``."""
    (tmp_path / "t.toml").write_text('inherits = "ipu21-64x2"\nname = "two-small"\ntiles = 16\n')
    model = tmp_path / "g.toml"
    model.write_text('[model]\nname = "wide_gemm"\ntarget = "t.toml"\n[tensors]\n'
                     'a = { shape = [16, 1024], dtype = "fp16", role = "input" }\n'
                     'b = { shape = [1024, 3072], dtype = "fp16", role = "parameter" }\n'
                     '[[ops]]\nname = "gemm"\nop = "matmul"\ninputs = ["a", "b"]\noutput = "c"\n')
    return model


@pytest.mark.slow
def test_a_gemm_too_big_for_one_ipu_spreads_its_grid_over_two(tmp_path):
    """[16, 1024] x [1024, 3072] FP16: 6.3 MB of weights against 4.7 MB usable on one 8-tile IPU.
    No stage split fits; ``auto`` plans the GEMM over both IPUs' tiles, which validates."""
    from tileplan.graph.loaders import load_model
    model = _wide_gemm(tmp_path)
    target = load_target(str(tmp_path / "t.toml"))
    p, v, report, plan = _compile(load_model(model), target, tmp_path / "pkg")
    assert report["estimate"]["cycles"] == v.profile.cycles
    st = plan["stages"]
    assert st["mode"] == "spread" and st["chosen_by"] == "auto" and st["stages_cycles"] is None
    assert "gemm" in st["not_fitting"]["stages"]
    ipus = {vtx.tile // target.tiles_per_ipu for node in p.mid.nodes if node.op == "gemm" and node.program
            for step in node.program.steps for vtx in getattr(step, "vertices", ())}
    assert ipus == {0, 1}                            # the GEMM's grid spans both IPUs
    with pytest.raises(TileplanError, match="no pipeline-stage split"):
        _compile(load_model(model), target, tmp_path / "pkg2", ipus="stages")


# ---- the command line ---------------------------------------------------------------------------

def _refused(result, *words):
    code, _, err = result
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    for w in words:
        assert w in lines[0], (w, lines[0])


def test_the_command_line_refuses_an_unknown_ipus_form(cli, tmp_path):
    _refused(cli("plan", FIXTURES / "mlp_smoke_fp8.toml", "--target", "ipu21-64x2", "--ipus", "pipelined"),
             "--ipus", "pipelined")


def test_stages_that_cannot_hold_a_model_are_refused_before_any_costing(cli, tmp_path):
    """The parameter bytes against each IPU's memory: one line naming the model and the op, at once."""
    import time
    model = _wide_gemm(tmp_path)
    t0 = time.perf_counter()
    _refused(cli("compile", model, "--ipus", "stages", "-o", tmp_path / "pkg", "-j", "1"),
             "wide_gemm", "'gemm'", "6,291,456 bytes of parameters")
    assert time.perf_counter() - t0 < 10 and not (tmp_path / "pkg").exists()
