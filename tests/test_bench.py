"""`tileplan bench`: every figure lands in bench.json, the table in BENCH.md; timeouts and
failures are data. No wall-clock assertions (benchmarks measure, tests do not)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tileplan.bench import FIGURES, PLANNED_TWICE, Benchmark, pinned_rows, run_one, throughput

REPO = Path(__file__).resolve().parents[1]


def test_bench_of_the_smoke_mlp_writes_every_figure_and_the_table(tmp_path):
    out = tmp_path / "artifacts"
    proc = subprocess.run([sys.executable, "-m", "tileplan.cli", "bench", "--only", "mlp_smoke_fp8", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "100"})
    assert proc.returncode == 0, proc.stderr
    text = (out / "bench.json").read_text()
    doc = json.loads(text)
    assert text == json.dumps(doc, sort_keys=True, indent=2) + "\n", "sorted keys"
    assert {"cpu_count", "python", "numpy"} <= set(doc["machine"])
    assert list(doc["benchmarks"]) == ["mlp_smoke_fp8"]
    rec = doc["benchmarks"]["mlp_smoke_fp8"]
    assert rec["status"] == "ok", rec["status"]
    assert set(FIGURES) <= set(rec)
    uncached = ("plan_seconds_cold", "plan_seconds_warm", "plan_cache_entries",   # cached benchmarks only
                "pipeline")                                                       # multi-IPU targets only
    unbatched = ("batch", "stage_cycles", "throughput")          # towers with a batch (and pipeline stages) only
    unbatched += ("plan_budget",)                # a plan the allocator fragmented, planned again within a budget
    unbatched += ("pins", "pinned_own_cycles")   # pinned benchmarks only
    missing = [k for k in FIGURES if rec[k] is None and k != "stage_at_stop" and k not in uncached + unbatched]
    assert not missing, f"figures not measured: {missing}"
    assert rec["stages_done"] == ["plan", "quality", "compile", "validate", "report"]
    assert rec["report_html_bytes"] > 0 and rec["report_seconds"] > 0
    assert rec["report_load_seconds"] > 0 and "Chromium" in rec["report_load_note"]   # .ci/run installs it
    assert len(rec["plan_seconds_all"]) == rec["plan_repeats"] == 5
    assert set(rec["estimate"]) >= {"compute", "exchange", "sync", "cycles"}
    sim = rec["simulated"]
    assert sim["cycles"] == sim["compute"] + sim["exchange"] + sim["sync"] > 0
    assert rec["simulated_roofline_ratio"] == sim["cycles"] / rec["roofline_cycles"]
    assert rec["estimate_to_simulated"] == rec["estimate"]["cycles"] / sim["cycles"]
    assert rec["planner_peak_rss_bytes"] >= rec["planner_rss_self_bytes"] > 0
    assert 0 < rec["memory_peak_bytes"] <= rec["sram_bytes"] and rec["outputs_passed"] is True
    assert 0.99 < rec["cosine_min"] <= 1.0 and 0 < rec["validate_cpu_seconds"] and rec["validate_atol"] > 0
    assert set(rec["spearman_per_gemm"]) == {"fc1", "fc2"}
    assert rec["spearman_min"] == min(f["spearman"] for f in rec["spearman_per_gemm"].values()
                                      if f["spearman"] is not None)
    assert rec["amp_floor_cycles"] == sum(f["cycles"] for f in rec["amp_floor"].values())
    assert rec["amp_floor_roofline_ratio"] == rec["amp_floor_cycles"] / rec["roofline_cycles"] >= 1
    assert rec["model_floor_cycles"] == sum(f["cycles"] for f in rec["model_floor"].values())
    assert rec["amp_floor_cycles"] <= rec["model_floor_cycles"] <= rec["estimate"]["cycles"]
    assert rec["estimate_to_model_floor"] == rec["estimate"]["cycles"] / rec["model_floor_cycles"] >= 1
    search = rec["search"]
    assert search["optimum_method"] in ("exhaustive", "exact dp (unbounded paths)") and search["paths"] == 16
    assert search["bounded_cycles"] >= search["optimum_cycles"] and search["gap"] >= 0
    assert [t["target"] for t in doc["targets"]] and all("met" in t for t in doc["targets"])
    # its run's Chrome trace beside bench.json: every tile's events span the simulated cycles
    trace_file = out / rec["trace_file"]
    assert rec["trace_file"] == "mlp_smoke_fp8.trace.json.gz" and trace_file.stat().st_size == rec["trace_bytes"]
    trace = json.loads(gzip.decompress(trace_file.read_bytes()))
    assert trace["otherData"]["cycles"] == sim["cycles"]
    spans = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            spans[e["tid"]] = spans.get(e["tid"], 0) + e["dur"]
    assert len(spans) == rec["tiles"] == 64 and set(spans.values()) == {sim["cycles"]}
    # the same benchmark with compact weights, beside it: planned, compiled and validated too
    compact = rec["compact"]
    assert compact["status"] == "ok" and compact["stages_done"] == compact["stages"] == ["plan", "compile", "validate"]
    assert set(compact) == set(FIGURES) - {"compact"}
    assert compact["simulated"]["cycles"] == compact["estimate"]["cycles"] and compact["outputs_passed"] is True
    assert compact["model_floor_cycles"] <= compact["estimate"]["cycles"]
    assert compact["model_floor_cycles"] >= rec["model_floor_cycles"]      # the compact space is the narrower
    assert rec["storage_in_grid"] and set(rec["storage_in_grid"]) <= {"w1", "w2"}

    md = (out / "BENCH.md").read_text()
    assert "| figure | mlp_smoke_fp8 | mlp_smoke_fp8 (compact) |" in md
    assert "| target | tileplan | compact weights | met | model floor | reference |" in md
    assert "compiled and validated with compact weights too: mlp_smoke_fp8" in md
    for label in ("plan time", "compile time", "planner peak RSS", "simulated: cycles", "estimate / simulated",
                  "memory peak", "max abs error", "Spearman", "bounded search", "AMP floor", "model floor",
                  "HTML report: size"):
        assert label in md, label
    assert "not measured on hardware" in md and "63.5 s" in md and "614,700" in md
    assert "mlp_smoke_fp8" in proc.stdout and "wrote" in proc.stdout
    # the terminal's tables at 100 columns: nothing wider, nothing cut, the figures whole
    lines = proc.stdout.splitlines()
    assert max(map(len, lines)) <= 100 and "…" not in proc.stdout
    assert f"{sim['cycles']:,}" in proc.stdout and f"{rec['roofline_cycles']:,.0f}" in proc.stdout


def test_a_benchmark_out_of_time_is_recorded_as_a_timeout():
    rec = run_one(Benchmark("mlp_smoke_fp8", "ipu21-64", True, (0.01, 0.01)), quick=True, jobs=1, budget=0.01)
    assert rec["status"] == "timeout" and rec["stage_at_stop"] is not None
    assert rec["stages_done"] == [] and rec["plan_seconds"] is None


def test_a_failing_benchmark_is_recorded_as_an_error():
    rec = run_one(Benchmark("no_such_fixture", "ipu21-64", True, (60, 60)), quick=True, jobs=1, budget=60)
    assert rec["status"].startswith("error: ") and "no such model file" in rec["status"]
    assert rec["stage_at_stop"] == "start"


def test_an_unknown_benchmark_name_is_a_usage_error():
    proc = subprocess.run([sys.executable, "-m", "tileplan.cli", "bench", "--only", "nope"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "unknown benchmark" in proc.stderr


def test_a_cached_benchmark_measures_its_cold_and_warm_plans():
    rec = run_one(Benchmark("mlp_smoke_fp8", "ipu21-64", True, (120, 120), quick_stages=("plan",), cached=True),
                  quick=True, jobs=1, budget=120)
    assert rec["status"] == "ok", rec["status"]
    assert rec["plan_seconds_cold"] == rec["plan_seconds_all"][0]
    assert rec["plan_seconds_warm"] is not None and rec["plan_cache_entries"] == 3   # fc1, fc2, the selection
    assert sum(rec["cycles_by_family"].values()) >= rec["estimate"]["cycles"]     # grouping only saves
    assert set(rec["cycles_by_family"]) >= {"projection GEMMs", "pointwise"}


def test_throughput_is_batch_times_clock_over_cycles_and_over_the_slowest_stage_when_pipelined():
    one = throughput(2, 1.5e9, 15_000_000)
    assert one["images_per_second"] == 200.0 and one["latency_seconds"] == 0.01
    assert one["seconds_per_image"] == 0.005 and not one["pipelined"]
    # Two stages of one batch: the latency adds them, a batch completes every slowest stage.
    two = throughput(2, 1.5e9, 15_000_000, [6_000_000, 9_000_000])
    assert two["images_per_second"] == 2 * 1.5e9 / 9_000_000 and two["latency_seconds"] == 0.01
    assert two["interval_cycles"] == 9_000_000 and two["pipelined"]


def test_a_benchmark_with_a_batch_reports_its_modelled_throughput():
    rec = run_one(Benchmark("mlp_smoke_fp8", "ipu21-64", True, (300, 300), quick_stages=("plan", "compile", "validate"),
                            compact=PLANNED_TWICE, batch=4), quick=True, jobs=1, budget=300)
    assert rec["status"] == "ok", rec["status"]
    t = rec["throughput"]
    assert rec["clock_hz"] == 1.5e9 and t["source"] == "simulated" and t["batch"] == 4
    assert t["images_per_second"] == 4 * 1.5e9 / rec["simulated"]["cycles"]
    # the compact run was planned only: its throughput comes from its estimate, and says so
    assert rec["compact"]["throughput"]["source"] == "estimate"


def test_scale_projection_fills_each_ipu_with_whole_layers_and_replicates_the_pipeline_over_a_pod():
    from tileplan.bench import scale_projection
    from tileplan.target import load_target
    ipu, link = load_target("ipu2"), load_target("ipu2x4")       # 1472 x 589,824 usable B; 24 B/cycle, ring
    per_tile = 32_000                                            # a layer's parameters per tile
    got = scale_projection(layer_cycles=1_000_000, layer_param_bytes=per_tile * ipu.tiles,
                           layer_peak_bytes=per_tile + 100_000, boundary_bytes=240_000, layers=40, batch=2,
                           ipu=ipu, link=link)
    # (589,824 - 100,000) // 32,000 = 15 layers an IPU: 3 stages of 14 layers
    assert got["layers_per_ipu"] == 15 and got["stages"] == 3 and got["layers_per_stage"] == 14
    assert got["ipus_by_parameters"] == 3                        # 40 x 47.1 MB over 868 MB an IPU
    boundary = 240_000 // 24 + link.link_latency_cycles + link.sync_cycles_multi
    assert got["boundary_cycles"] == boundary
    assert got["stage_cycles"] == 14 * 1_000_000 + boundary
    assert got["latency_cycles"] == 40 * 1_000_000 + 2 * boundary
    pod16 = got["pods"][16]
    assert pod16["pipelines"] == 5 and pod16["ipus_idle"] == 1
    assert pod16["images_per_second"] == 5 * 2 * ipu.clock_hz / got["stage_cycles"]
    # Everything on one IPU: no boundary, one stage.
    small = scale_projection(layer_cycles=1_000, layer_param_bytes=ipu.tiles * 100, layer_peak_bytes=1_000,
                             boundary_bytes=1_000, layers=4, batch=1, ipu=ipu, link=link)
    assert small["stages"] == 1 and small["boundary_cycles"] == 0 and small["pods"][64]["pipelines"] == 64


STAGES = ("plan", "compile", "validate")


@pytest.fixture(scope="module")
def pinned_pair(tmp_path_factory):
    """mlp_fp16_small as the planner plans it and with two grids pinned (a pins file), each planned,
    compiled and simulated: (the planner's record, the pinned one)."""
    pins = tmp_path_factory.mktemp("pins") / "pins.toml"
    pins.write_text('[pin]\nfc1 = "grid:4x16x1"\nfc2 = "grid:4x4x4"\n')
    own = run_one(Benchmark("mlp_fp16_small", "ipu21-64", True, (300, 300), quick_stages=STAGES,
                            compact=PLANNED_TWICE), quick=True, jobs=1, budget=300)
    pinned = run_one(Benchmark("small_pinned", "ipu21-64", True, (300, 300), quick_stages=STAGES,
                               compact=PLANNED_TWICE, fixture="mlp_fp16_small", pins=str(pins)),
                     quick=True, jobs=1, budget=300)
    return own, pinned


def test_a_pinned_benchmark_runs_its_grids_beside_the_planners_own_choice(pinned_pair):
    """A benchmark with a pins file plans, compiles and simulates the model with those grids; the
    side-by-side rows set its simulated cycles beside the unpinned benchmark's."""
    own, pinned = pinned_pair
    for rec in (own, pinned):
        assert rec["status"] == "ok" and rec["stages_done"] == list(STAGES), rec["status"]
        assert rec["simulated"]["cycles"] == rec["estimate"]["cycles"] and rec["outputs_passed"] is True
    assert pinned["pins"] == ["fc1=grid:4x16x1", "fc2=grid:4x4x4"] and own["pins"] is None
    # the planner's own choice differs, and its estimate is the unpinned benchmark's
    assert pinned["pinned_own_cycles"] == own["estimate"]["cycles"] < pinned["estimate"]["cycles"]
    rows = pinned_rows({"small_pinned": pinned, "mlp_fp16_small": own},
                       (("small_pinned", "mlp_fp16_small", "a user"),))
    a, b = pinned["simulated"]["cycles"], own["simulated"]["cycles"]
    assert rows == [("mlp_fp16_small", "a user: fc1=grid:4x16x1, fc2=grid:4x4x4", f"{a:,}", f"{b:,}",
                     f"{a / b:.2f}x")]


def test_the_terminal_tables_fit_100_columns_and_cut_no_figure(pinned_pair, monkeypatch):
    """One block per benchmark, the pinned pair and the targets, at 100 columns: no line wider, no
    cell cut (an ellipsis), every figure whole; a figure neither column measured is left out."""
    import tileplan.bench as bench
    from rich.console import Console
    own, pinned = pinned_pair
    monkeypatch.setattr(bench, "SIDE_BY_SIDE", (("small_pinned", "mlp_fp16_small", "a user"),))
    results = {"mlp_fp16_small": own, "small_pinned": pinned}
    doc = {"mode": "quick", "benchmarks": results, "targets": bench.target_figures(results)}
    console = Console(width=100, record=True, file=open(os.devnull, "w"))
    for table in bench.rich_tables(doc):
        console.print(table)
    text = console.export_text()
    assert max(map(len, text.splitlines())) <= 100 and "…" not in text
    for rec in (own, pinned):
        for figure in (rec["simulated"]["cycles"], rec["estimate"]["compute"], rec["memory_peak_bytes"],
                       rec["compact"]["estimate"]["cycles"]):
            assert f"{figure:,}" in text, figure
    assert "fc1=grid:4x16x1," in text and f"{pinned['simulated']['cycles'] / own['simulated']['cycles']:.2f}x" in text
    assert text.count("tileplan bench --quick: ") == 3     # two blocks and the pinned pair
    assert "throughput" not in text                         # no batch: neither column has the figure


def test_the_elk_pins_name_the_ops_of_the_benchmarked_model():
    """The ELK side-by-side benchmark pins both GEMMs of its model, with the published grids."""
    from tileplan.bench import BY_NAME, FIXTURES, SIDE_BY_SIDE
    from tileplan.graph.loaders import load_model
    from tileplan.graph.pins import read_pins_file
    (pinned, own, _), = SIDE_BY_SIDE
    b = BY_NAME[pinned]
    assert b.model == BY_NAME[own].model and b.pins and not BY_NAME[own].pins
    graph = load_model(FIXTURES / f"{b.model}.toml")
    pins = {p.op: str(p) for p in read_pins_file(FIXTURES / b.pins)}
    assert pins == {"up": "grid:46x8x4", "down": "grid:46x2x16"}
    assert {op.name for op in graph.ops if op.kind == "matmul"} == set(pins)
