"""Micro-batches pipelined through the stages of a multi-IPU plan (``planner.pipeline``, ``--micro-batch``).

The fast cases use the 64-tile smoke MLP (96 rows: its batch axis) on two IPUs of 64 tiles, cut into
micro-batches of 24 rows; the slow ones the 4-layer small encoder tower (batch 2) on ipu21-64x2 and
ipu21-64x4."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tileplan.errors import TileplanError
from tileplan.graph.core import Graph, Reshape, Role, Softmax, Tensor, Transpose
from tileplan.graph.dtypes import DType
from tileplan.graph.loaders import load_model
from tileplan.lowering.compile import compile_model
from tileplan.lowering.package import load_package
from tileplan.planner.cache import MemoryCache
from tileplan.planner.pipeline import micro_graph, schedule
from tileplan.sim.reference import seeded_values
from tileplan.sim.validate import validate_package
from tileplan.target import load_target

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def slots_by_hand(own: list[int], link: list[int], micro_batches: int, sync: int) -> int:
    """The fill / steady / drain total written out: slot t runs micro-batch t - s on stage s."""
    total = 0
    slots = micro_batches + len(own) - 1
    for t in range(slots):
        working = [s for s in range(len(own)) if s <= t < s + micro_batches]
        total += sum(link[s] for s in working) + max(own[s] for s in working)
    return total + (slots - 1) * sync


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    """The smoke MLP on ipu21-64x2 in pipeline stages: its package with 4 micro-batches of 24 rows, and
    the package of one micro-batch's model compiled without micro-batches (the same plan)."""
    g = load_model(FIXTURES / "mlp_smoke_fp8.toml")
    tgt = load_target("ipu21-64x2")
    out = tmp_path_factory.mktemp("pipeline")
    cache = MemoryCache()
    p, _, piped = compile_model(g, tgt, out / "piped", jobs=1, ipus="stages", micro_batch=24, cache=cache)
    _, _, single = compile_model(micro_graph(g, 24), tgt, out / "single", jobs=1, ipus="stages", cache=cache)
    return {"graph": g, "target": tgt, "plan": p, "piped": piped, "single": single, "dir": out}


def test_pipelined_outputs_equal_each_micro_batch_run_alone(mlp):
    """Every micro-batch, run through the pipeline on the IPU model, gives the bytes the same
    program gives for those rows run alone; the whole batch passes against float64."""
    piped = validate_package(load_package(mlp["piped"]))
    assert piped.passed
    assert piped.values["y"].shape == (96, 144)
    x = seeded_values(mlp["plan"].graph, 0, batch=96)["x"]
    single = load_package(mlp["single"])
    for j in range(4):
        npz = mlp["dir"] / f"x{j}.npz"
        np.savez(npz, x=np.asarray(x[24 * j:24 * (j + 1)], dtype=np.float64))
        alone = validate_package(single, inputs_path=npz)
        assert alone.passed
        assert np.array_equal(alone.values["y"], piped.values["y"][24 * j:24 * (j + 1)]), j


def test_estimate_equals_compiled_and_simulated_cycles(mlp):
    pkg = load_package(mlp["piped"])
    planned = pkg.plan["pipeline"]
    compiled = pkg.report["pipeline"]
    simulated = validate_package(pkg).pipeline
    assert planned["micro_batches"] == 4 and planned["micro_batch"] == 24 and planned["stages"] == 2
    for key in ("cycles", "slot_cycles", "stage_cycles", "link_cycles", "latency_cycles"):
        assert planned[key] == compiled[key] == simulated[key], key


def test_total_is_fill_steady_drain_of_the_stage_cycles(mlp):
    """The total from the per-stage cycles the plan's stage split reports, the link transfer into
    stage 1 and the target's sync across IPUs, written out slot by slot."""
    p, tgt = mlp["plan"], mlp["target"]
    own = [s["cycles"] for s in p.stages["stages"]]
    assert own == p.pipeline["stage_cycles"]
    link = p.pipeline["link_cycles"]
    assert link[0] == 0 and link[1] > 0          # stage 1 receives the GeLU's output over the IPU-Links
    total = slots_by_hand(own, link, 4, tgt.sync_cycles_multi)
    assert p.pipeline["cycles"] == total
    assert p.pipeline["images_per_second"] == pytest.approx(96 * tgt.clock_hz / total)
    # a micro-batch's latency: its S slots and the syncs between them; the first one waits for nothing
    assert p.pipeline["latency_cycles"] >= own[0] + link[1] + own[1] + tgt.sync_cycles_multi


def test_throughput_rises_with_micro_batches_in_flight_on_two_ipus(mlp):
    """One plan of one micro-batch: more micro-batches per run amortise the fill and drain, and
    overlapping the stages beats running the micro-batches one at a time through both IPUs."""
    p, tgt = mlp["plan"], mlp["target"]
    own, link = p.pipeline["stage_cycles"], p.pipeline["link_cycles"]
    rates = [schedule(own, link, n, 24, tgt)["images_per_second"] for n in (1, 2, 4, 8, 16)]
    assert all(a < b for a, b in zip(rates, rates[1:])), rates
    one_at_a_time = 24 * 4 * tgt.clock_hz / (4 * (own[0] + link[1] + own[1]) + 7 * tgt.sync_cycles_multi)
    assert p.pipeline["images_per_second"] > one_at_a_time
    assert rates[-1] < p.pipeline["steady_images_per_second"]


def test_plan_json_and_report_say_the_figures_are_modelled(mlp):
    from rich.console import Console

    from tileplan.report.terminal import render
    doc = json.loads((mlp["piped"] / "plan.json").read_text())
    console = Console(record=True, width=400)
    console.print(render(doc, None))
    text = console.export_text()
    assert "4 x 24 image(s) over 2 stage(s)" in text and "not measured on hardware" in text


def _graph(op, shape=(2, 4, 8)):
    x = Tensor("x", shape, DType.FP16, Role.INPUT)
    return Graph.build("m", [x], [op], outputs=[op.output])


@pytest.mark.parametrize("op, shape, named", [
    (Softmax("sm", ("x",), "y", axis=0), (2, 4, 8), "'sm'"),
    (Transpose("tr", ("x",), "y", perm=(1, 0, 2)), (2, 2, 8), "'tr'"),
    (Reshape("flat", ("x",), "y", shape=(8, 8)), (2, 4, 8), "'y'"),
])
def test_models_mixing_the_batch_are_refused(op, shape, named):
    with pytest.raises(TileplanError) as info:
        micro_graph(_graph(op, shape), 1)
    assert named in str(info.value) and "--micro-batch" in str(info.value)


def test_micro_graph_keeps_the_batch_axis_only():
    g = load_model(FIXTURES / "encoder_tower_small.toml")
    m = micro_graph(g, 1)
    for name, t in g.tensors.items():
        want = t.shape if t.role is Role.PARAMETER else (1, *t.shape[1:])
        assert m.tensors[name].shape == want, name
    assert micro_graph(g, 2) is g


@pytest.mark.slow
def test_small_tower_pipelined_on_two_ipus(tmp_path):
    """The 4-layer small tower (batch 2) in micro-batches of one image on ipu21-64x2: validated against
    float64, estimate = simulated, the formula of the per-stage cycles."""
    g = load_model(FIXTURES / "encoder_tower_small.toml")
    tgt = load_target("ipu21-64x2")
    p, _, path = compile_model(g, tgt, tmp_path / "pkg", jobs=1, ipus="stages", micro_batch=1)
    v = validate_package(load_package(path))
    assert v.passed
    assert v.pipeline["cycles"] == p.pipeline["cycles"]
    own = [s["cycles"] for s in p.stages["stages"]]
    assert p.pipeline["cycles"] == slots_by_hand(own, p.pipeline["link_cycles"], 2, tgt.sync_cycles_multi)


@pytest.mark.slow
def test_small_tower_four_stages():
    """ipu21-64x4: four stages, one layer each; the schedule's total from the plan's stage cycles."""
    g = load_model(FIXTURES / "encoder_tower_small.toml")
    tgt = load_target("ipu21-64x4")
    from tileplan.planner.plan import plan
    p = plan(g, tgt, jobs=1, ipus="stages", micro_batch=1)
    assert p.pipeline["stages"] == 4
    own = [s["cycles"] for s in p.stages["stages"]]
    assert p.pipeline["stage_cycles"] == own
    assert p.pipeline["cycles"] == slots_by_hand(own, p.pipeline["link_cycles"], 2, tgt.sync_cycles_multi)


def test_bench_table_row_from_one_plan(mlp):
    """The bench's throughput table: one plan per row gives every batch (the schedule of its stage
    cycles, as a plan of that batch would give), and a row that cannot be planned says why."""
    from tileplan import bench
    g, tgt = mlp["graph"], mlp["target"]
    cache = MemoryCache()
    row = bench.pipeline_entry(micro_graph(g, 24), tgt, micro_batch=24, batches=(24, 48, 96), cache=cache)
    assert row["stage_cycles"] == mlp["plan"].pipeline["stage_cycles"]
    assert row["batches"]["96"]["cycles"] == mlp["plan"].pipeline["cycles"]       # the batch-96 plan's own figure
    rates = [row["batches"][b]["images_per_second"] for b in ("24", "48", "96")]
    assert rates == sorted(rates) and len(set(rates)) == 3
    bad = bench.pipeline_entry(g, tgt, micro_batch=5, batches=(96,), cache=cache)
    assert "--micro-batch 5" in bad["error"]
    table = {"batches": [24, 48, 96], "micro_batch": 24, "anchor": {"images_per_second": 163.8, "batch": 48,
                                                                    "ipus": 1, "source": "hardware"},
             "rows": [{"model": g.name, "precision": "fp8", **row}, {"model": g.name, "precision": "fp8", **bad}]}
    text = "\n".join(bench.pipeline_lines(table))
    assert f"{rates[2]:.1f}" in text and "not planned: --micro-batch 5" in text and "163.8" in text
