"""``tileplan bench``: the figures users judge tileplan by, per benchmark fixture.

Each benchmark runs in its own fresh (spawned) worker process, in its own
process group, under a time budget. The worker runs stages in order and sends
each stage's figures back as soon as it has them, so a benchmark that runs out
of time or fails keeps what it measured; its ``status`` says what happened
(``ok``, ``timeout`` with the stage it was in, ``error: ...``, ``skipped: ...``).
Nothing a worker does can crash the bench.

Stages:

- ``plan``: ``plan(graph, target, jobs=)`` repeated; the figure is the median of
  ``Plan.plan_seconds`` (in-process, with the catalogue's process pool). The
  first repeat is cold (fresh process); later repeats find the planner's module
  caches warm: all repeat times are kept. After the first repeat the worker
  reads its peak resident memory (``ru_maxrss``) and that of its largest
  finished child (the pool's workers): the planner's peak memory is their sum.
- ``quality``: per GEMM, the Spearman correlation of the coarse cycles with the
  detailed cycles over its detailed candidates (``planner.quality``); on small
  graphs, the bounded search (``solve_dp(paths=16)``) against the optimum of the
  same ``select.Problem`` (exhaustive, or the exact DP past 2e6 combinations, or CP-SAT's proved
  optimum past 1e9).
- ``compile``: the last plan lowered and its package written into a temporary
  folder; compile time = that plan's time + lowering + package writing.
- ``validate``: the package run on the bundled IPU model (``validate_package``):
  simulated cycles by phase, memory peak of the worst tile, max abs error.
- ``report``: the validated package's HTML report written (``tileplan.report``): its size,
  the time to write it, and the time headless Chromium takes to load the page until it marks
  itself ready (``body[data-ready]``). The load time needs playwright (the test extra) and
  Chromium (``$TILEPLAN_CHROMIUM``, default Debian's ``/usr/bin/chromium``); without them the
  figure is left unmeasured and the record says why. The tower has no report stage.

Every benchmark is reported twice, side by side: with the planner's own parameter
storage (``weights="planner"``: selection may pre-arrange a GEMM's weights as its grid
reads them) and with compact weights (``weights="compact"``). The compact run's stages are
the benchmark's ``compact`` (quick, full): its plan (one repeat, after the planner's, in
the same process) with its estimate and model floor, and where the budget allows, its
compile and IPU-model validation; its figures are the record's ``compact`` sub-record, with
the same keys.

Cycles are the IPU model's (a cycle model of the hardware), not hardware
measurements.
"""

from __future__ import annotations

import datetime
import json
import math
import multiprocessing
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures"

QUICK_DEADLINE = 280.0            # seconds for the whole --quick run (5 minutes with a margin)
SEARCH_PATHS = 16
# Choice combinations; past it the exact DP (checked against exhaustive search in the tests) is the
# oracle: with pre-arranged weights the smoke MLP has 1M, 170 s exhaustively, 0.6 s by the exact DP.
MAX_EXHAUSTIVE = 200_000


@dataclass(frozen=True)
class Benchmark:
    name: str                     # fixture name (fixtures/<name>.toml)
    target: str
    small: bool                   # small graph: more repeats, the exhaustive search gap
    budget: tuple[float, float]   # seconds (quick, full)
    quick_stages: tuple[str, ...] = ("plan", "quality", "compile", "validate")
    in_quick: bool = True         # False: too heavy for --quick's 5 minutes (recorded as skipped)
    cached: bool = False          # plan repeats share a fresh plan cache: the first is cold, the rest warm
    reported: bool = True         # the full run writes and loads its HTML report
    compact: tuple[tuple[str, ...], tuple[str, ...]] = (("plan",), ("plan", "compile", "validate"))
                                  # (quick, full): the stages of the compact-weights run; "plan" alone is
                                  # its plan and estimate (simulating it too would not fit the budget)
    ipus: str = "auto"            # a multi-IPU target's form (``planner.stages``: auto, stages or spread)
    batch: int = 0                # images per run of a vision tower (``throughput``); 0: not reported
    trace: bool = False           # its validate stage writes the run's Chrome trace beside bench.json
    fixture: str = ""             # the model file (fixtures/<fixture>.toml) when not the benchmark's name
    pins: str = ""                # a pins file under fixtures/ (``--pins``): every plan of the benchmark is pinned
    quality: bool = True          # False: no quality stage (a pinned plan's search gap says nothing)

    @property
    def model(self) -> str:
        return self.fixture or self.name

    @property
    def stages(self) -> tuple[str, ...]:
        return ("plan",) + (("quality",) if self.quality else ()) + ("compile", "validate") \
            + (("report",) if self.reported else ())

    def compact_stages(self, quick: bool) -> tuple[str, ...]:
        """The compact-weights run's stages: its plan, and compile / validate where the planner's run has them."""
        own = self.quick_stages if quick else self.stages
        return tuple(s for s in self.compact[0 if quick else 1] if s == "plan" or s in own)

    def repeats(self, quick: bool) -> int:
        if self.small:
            return 3 if quick else 5
        return 1 if quick else 3


# Run order = priority under the --quick deadline: the small graphs, then the two figures with
# cycle targets (SigLIP b4, the 4096 GEMM), then SigLIP b1 and the decode projection (no targets). A benchmark's
# budget is the smaller of its own and what is left of the --quick deadline.
SIMULATED_TWICE = (("plan", "compile", "validate"), ("plan", "compile", "validate"))   # small graphs: cheap
PLANNED_TWICE = (("plan",), ("plan",))

BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("mlp_smoke_fp8", "ipu21-64", True, (60, 600), compact=SIMULATED_TWICE, trace=True),
    Benchmark("mlp_fp16_small", "ipu21-64", True, (60, 600), compact=SIMULATED_TWICE),
    Benchmark("siglip_mlp_fp8_b4", "ipu21", False, (200, 3600),      # its report: the page size and load time
              quick_stages=("plan", "quality", "compile", "validate", "report"), trace=True),
    Benchmark("gemm_4096_fp16", "ipu2", False, (150, 3600)),
    Benchmark("siglip_mlp_fp8_b1", "ipu21", False, (120, 3600), quick_stages=("plan", "quality")),
    Benchmark("decode_proj_fp16", "ipu21-64", True, (30, 600), compact=SIMULATED_TWICE),  # decode-shaped GEMM
    # Whole encoder layers: LayerNorm, attention with softmax, residuals, the MLP.
    Benchmark("encoder_layer_small", "ipu21-64", True, (60, 600), compact=SIMULATED_TWICE),
    Benchmark("siglip_layer_fp8_b1", "ipu21", False, (150, 3600), quick_stages=("plan", "quality")),
    Benchmark("siglip_layer_fp16_b1", "ipu21", False, (150, 3600), quick_stages=("plan",)),
    Benchmark("siglip_layer_fp8_b4", "ipu21", False, (300, 3600), quick_stages=("plan",)),
    # One tensor read by 200 pointwise ops, each a graph output (tests/fuzz/dags.py fanout 200): the
    # selection's width, planned only (its time and peak RSS; targets: under 10 s and 1 GB).
    Benchmark("fanout_200", "ipu21-64", True, (60, 300), quick_stages=("plan",), reported=False,
              compact=PLANNED_TWICE),
    # The 27-layer SigLIP tower: repeated layers costed once, a plan cache (cold, then warm repeats).
    Benchmark("siglip_tower_fp8_b1", "ipu21", False, (0, 5400), quick_stages=("plan", "compile", "validate"),
              in_quick=False, cached=True, reported=False, compact=PLANNED_TWICE, batch=1),
    # The whole So400m/14 vision model at 384 px (patch embedding, position embeddings, the 27 layers,
    # post-LayerNorm, MAP head): the tower's cost plus what a user's model adds.
    Benchmark("siglip_vision_fp8_b1", "ipu21", False, (0, 5400), quick_stages=("plan", "compile", "validate"),
              in_quick=False, cached=True, reported=False, compact=PLANNED_TWICE, batch=1),
    # The same tower with FP16 weights (822 MB): two C600s, one pipeline stage of whole layers each;
    # its record's "pipeline" holds each stage's cycles and the bytes it receives over the IPU-Links.
    Benchmark("siglip_tower_fp16_b1", "ipu21x2", False, (0, 5400), quick_stages=("plan", "compile", "validate"),
              in_quick=False, cached=True, reported=False, compact=PLANNED_TWICE, ipus="stages", batch=1),
    # The same tower at batch 2 and 4: throughput beside the anchor's batch-2 run on one C600.
    Benchmark("siglip_tower_fp8_b2", "ipu21", False, (0, 5400), quick_stages=("plan", "compile", "validate"),
              in_quick=False, cached=True, reported=False, compact=PLANNED_TWICE, batch=2),
    Benchmark("siglip_tower_fp8_b4", "ipu21", False, (0, 7200), quick_stages=("plan", "compile", "validate"),
              in_quick=False, cached=True, reported=False, compact=PLANNED_TWICE, batch=4),
    # ELK side by side: the SigLIP So400m/14 MLP in FP16 (batch 1, no biases) as tileplan plans it,
    # and with ELK's published grids pinned (fixtures/pins/); both compiled and run on the IPU model.
    Benchmark("siglip_mlp_fp16_nobias_b1", "ipu21", False, (0, 3600), quick_stages=("plan", "compile", "validate"),
              in_quick=False, reported=False, compact=PLANNED_TWICE, quality=False),
    Benchmark("siglip_mlp_fp16_nobias_b1_elk", "ipu21", False, (0, 3600), quick_stages=("plan", "compile", "validate"),
              in_quick=False, reported=False, compact=PLANNED_TWICE, quality=False,
              fixture="siglip_mlp_fp16_nobias_b1", pins="pins/elk_siglip_mlp_fp16_b1.toml"),
)
# Pairs of benchmarks set side by side in the tables (``pinned_rows``): (a pinned benchmark, the same
# model as the planner chooses, who chose the pinned grids).
SIDE_BY_SIDE = (("siglip_mlp_fp16_nobias_b1_elk", "siglip_mlp_fp16_nobias_b1", "ELK (research planner; published grids)"),)
BY_NAME = {b.name: b for b in BENCHMARKS}

# Every figure of a benchmark record (None when not measured).
FIGURES = (
    "fixture", "target", "tiles", "status", "stage_at_stop", "stages", "stages_done", "budget_seconds",
    "elapsed_seconds", "jobs",
    "plan_repeats", "plan_seconds", "plan_seconds_first", "plan_seconds_all",
    "baseline_rss_bytes", "planner_rss_self_bytes", "planner_rss_children_max_bytes", "planner_peak_rss_bytes",
    "roofline_cycles", "estimate", "estimate_roofline_ratio", "cycles_by_family", "model_floor_by_family",
    "storage_in_grid", "compact",
    "spearman_per_gemm", "spearman_min", "search", "amp_floor", "amp_floor_cycles", "amp_floor_roofline_ratio",
    "model_floor", "model_floor_cycles", "model_floor_roofline_ratio", "estimate_to_model_floor",
    "lower_package_seconds", "compile_seconds",
    "validate_seconds", "simulated", "simulated_roofline_ratio", "memory_peak_bytes", "memory_peak_tile",
    "sram_bytes", "max_abs_error", "outputs_passed", "estimate_to_simulated",
    "validate_cpu_seconds", "cosine_min", "validate_atol",
    "plan_seconds_cold", "plan_seconds_warm", "plan_cache_entries", "package_bytes",
    "report_seconds", "report_html_bytes", "report_load_seconds", "report_load_note", "pipeline",
    "batch", "clock_hz", "stage_cycles", "throughput", "plan_budget",
    "trace_file", "trace_bytes", "pins", "pinned_own_cycles",
)

# The reference figures the benchmark targets are set beside (docs/benchmarks.md): the Rust planner's
# times, and cycles measured on IPU hardware.
REFERENCE = {
    "rust_planner_siglip_b4_seconds": 63.5,
    "rust_planner_siglip_b4_threads": 56,
    "rust_planner_smoke_seconds": 0.185,
    "hardware_siglip_b4_cycles": 614_700,
    "hardware_siglip_b4_roofline_ratio_approx": 4.0,
    "hardware_gemm_4096_fp16_cycles": 2_262_696,   # fixtures/gemm_4096_fp16.toml (ipu-stack README)
    # The SigLIP So400m/14 tower (27 layers, batch 1, one C600), as measured by ipu-stack and the Poplar SDK:
    "ipu_stack_siglip_tower_b1_cycles": 10_088_124,          # measured on hardware
    "ipu_stack_siglip_tower_b1_plan_seconds": 70.6,          # package planning, many threads
    "poplar_sdk_siglip_tower_b1_cycles": [15_987_659, 17_804_824],   # measured on hardware
    # The whole SigLIP So400m/14 vision model (patch embedding, position embeddings, 27 layers,
    # post-LayerNorm, MAP head; batch 1, one C600), the anchor compiler's program: measured on hardware.
    "ipu_stack_siglip_vision_b1_cycles": 10_088_124,
    # The same tower at batch 2 on one C600 (ipu-stack): hardware cycles, images/s timed by the host.
    "ipu_stack_siglip_tower_b2_cycles": [16_202_412, 17_462_346],
    "ipu_stack_siglip_tower_b2_images_per_second": 163.8,
}


# ---- throughput ----------------------------------------------------------------------------------

def throughput(batch: int, clock_hz: float, cycles: int, stage_cycles: list[int] | None = None) -> dict:
    """Latency and images per second of one run of ``batch`` images taking ``cycles`` at ``clock_hz``
    (the target's ``clock_hz``, whose source its TOML file names).

    One program (no pipeline): the batch's latency is ``cycles / clock``, the time per image that
    over ``batch``, and images/s ``batch x clock / cycles``. Pipeline stages over several IPUs
    (``stage_cycles``, one figure per stage for one batch): the batch's latency is the sum of the
    stages, and with successive batches overlapping across the stages a new batch completes every
    slowest stage, so images/s is ``batch x clock / max(stage_cycles)``.

    Design decision: the figures are derived from cycles and the clock alone (modelled cycles,
    never host timings), so they say what the cycle model predicts, not what a host measures."""
    if batch <= 0 or clock_hz <= 0 or cycles <= 0:
        raise ValueError(f"throughput needs a positive batch, clock and cycles (got {batch}, {clock_hz}, {cycles})")
    interval = max(stage_cycles) if stage_cycles else cycles
    latency = sum(stage_cycles) if stage_cycles else cycles
    return {"batch": batch, "clock_hz": clock_hz, "cycles": cycles, "interval_cycles": interval,
            "latency_seconds": latency / clock_hz, "seconds_per_image": interval / clock_hz / batch,
            "images_per_second": batch * clock_hz / interval, "pipelined": bool(stage_cycles)}


# ---- the pipelined throughput table ----------------------------------------------------------------

# Rows: (precision, IPU counts); columns: batches. Each row's fixture is the tower at batch 1, planned
# once per IPU count for one micro-batch of one image (``planner.pipeline``).
PIPELINE_ROWS = (("fp8", (1, 2, 4)), ("fp16", (2, 4)))
PIPELINE_BATCHES = (1, 2, 4, 8)
PIPELINE_MICRO_BATCH = 1
PIPELINE_TARGETS = {1: "ipu21", 2: "ipu21x2", 4: "ipu21x4"}


def pipeline_entry(graph, target, *, micro_batch: int, batches, jobs: int = 1, cache=None) -> dict:
    """One row of the throughput table: ``graph`` (a model of ``micro_batch`` images) planned once on
    ``target`` (pipeline stages on several IPUs) and its pipelined figures for every batch of
    ``batches`` (``planner.pipeline.schedule`` from the one plan's per-stage cycles: the plan does
    not depend on the batch, only the number of micro-batches does). A plan that does not fit is
    the row's ``error``, with the planner's reason."""
    from .errors import TileplanError
    from .planner.pipeline import schedule
    from .planner.plan import plan
    t0 = time.perf_counter()
    row = {"target": target.name, "ipus": target.ipus, "micro_batch": micro_batch}
    try:
        p = plan(graph, target, jobs=jobs, cache=cache, ipus="stages" if target.ipus > 1 else "auto",
                 micro_batch=micro_batch)
    except TileplanError as exc:
        return {**row, "error": str(exc), "plan_seconds": time.perf_counter() - t0}
    fig = p.pipeline
    row.update(plan_seconds=time.perf_counter() - t0, stage_cycles=fig["stage_cycles"], link_cycles=fig["link_cycles"],
               batches={})
    for b in batches:
        if b % micro_batch:
            continue
        got = schedule(fig["stage_cycles"], fig["link_cycles"], b // micro_batch, micro_batch, target)
        row["batches"][str(b)] = {k: got[k] for k in ("cycles", "images_per_second", "latency_cycles", "latency_ms",
                                                      "steady_images_per_second")}
    return row


def pipeline_table(*, jobs: int = 1, cache=None, rows=PIPELINE_ROWS, batches=PIPELINE_BATCHES,
                   micro_batch: int = PIPELINE_MICRO_BATCH, on_row=None) -> dict:
    """The full bench's throughput table: the SigLIP tower (``fixtures/siglip_tower_<precision>_b1``)
    on 1, 2 and 4 IPUs, images/s and latency per image at every batch of ``batches``, beside the
    anchor's batch-2 figure on one C600.

    Design decision, the micro-batch size: one image. The stage programs are planned once for it, so
    one plan per (precision, IPU count) gives every batch, and the most micro-batches are in flight
    (the shortest fill and drain per image). A larger micro-batch (a batch-2 program runs the tower's
    GEMMs with twice the rows, which this cycle model costs a little under twice the cycles) would
    need a plan per size; the table does not search it."""
    from .graph.loaders import load_model
    from .target import load_target
    out = {"micro_batch": micro_batch, "batches": list(batches), "rows": [],
           "anchor": {"images_per_second": REFERENCE["ipu_stack_siglip_tower_b2_images_per_second"], "batch": 2,
                      "ipus": 1, "source": "ipu-stack on one C600: hardware, host-timed"}}
    for precision, counts in rows:
        path = FIXTURES / f"siglip_tower_{precision}_b{micro_batch}.toml"
        graph = load_model(path)
        for n in counts:
            row = {"model": graph.name, "precision": precision,
                   **pipeline_entry(graph, load_target(PIPELINE_TARGETS[n]), micro_batch=micro_batch,
                                    batches=batches, jobs=jobs, cache=cache)}
            out["rows"].append(row)
            if on_row is not None:
                on_row(row)
    return out


def _plan_cache():
    from .planner.cache import PlanCache
    return PlanCache()          # the user's plan cache: the tower's catalogues, costed once


def pipeline_lines(table: dict | None) -> list[str]:
    """BENCH.md's throughput table (modelled figures) from ``pipeline_table``'s document."""
    if not table:
        return []
    bs = table["batches"]
    head = ["tower", "IPUs", "micro-batch", *[f"batch {b}: images/s; latency per image" for b in bs]]
    rows = []
    for r in table["rows"]:
        if "error" in r:
            why = r["error"] if len(r["error"]) <= 240 else r["error"][:240].rsplit(" ", 1)[0] + " ..."
            cells = [f"not planned: {why}"] + [""] * (len(bs) - 1)
        else:
            cells = [f"{r['batches'][str(b)]['images_per_second']:.1f}; {r['batches'][str(b)]['latency_ms']:.2f} ms"
                     if str(b) in r["batches"] else "-" for b in bs]
        rows.append([f"{r['precision'].upper()} ({r['model']})", str(r["ipus"]), str(r["micro_batch"]), *cells])
    a = table["anchor"]
    rows.append([f"anchor ({a['source']})", str(a["ipus"]), "-",
                 *[f"{a['images_per_second']:.1f}; -" if b == a["batch"] else "" for b in bs]])
    return ["## Pipelined throughput (modelled)", "",
            "Images/s = batch x clock / the whole run's cycles (fill, steady state and drain), latency per "
            "image = the cycles from a micro-batch's entry into stage 0 to its exit from the last stage, "
            "at the target's clock; every micro-batch is one image, each row one plan "
            "(`planner.pipeline`). Modelled by tileplan's cycle model, not measured; the anchor row is "
            "hardware, timed by its host.", "", _md_table(head, rows), ""]


def record_throughput(rec: dict) -> dict | None:
    """``throughput`` of a benchmark record with a batch: from its simulated cycles, else its
    estimate (``source`` says which), with its per-stage cycles when it has them (``stage_cycles``);
    None without a batch, a clock or cycles."""
    batch, clock = rec.get("batch"), rec.get("clock_hz")
    got = [(k, rec.get(k)) for k in ("simulated", "estimate") if rec.get(k)]
    if not batch or not clock or not got:
        return None
    source, figures = got[0]
    return {**throughput(batch, clock, figures["cycles"], rec.get("stage_cycles")), "source": source}


# ---- scale on paper -------------------------------------------------------------------------------

def scale_projection(*, layer_cycles: int, layer_param_bytes: int, layer_peak_bytes: int, boundary_bytes: int,
                     layers: int, batch: int, ipu, link, pods=(16, 64)) -> dict:
    """The cost model's projection of a tower of ``layers`` identical layers over pipeline stages, one
    IPU each, from one planned layer: its cycles, its parameter bytes, its planner's memory peak
    (worst tile, bytes) and the bytes crossing a stage boundary (the activation between layers).
    ``ipu``: the target of one IPU (tiles, usable bytes, clock); ``link``: a multi-IPU target whose
    link figures cost a boundary (``estimate.exchange.link_cycles``, one hop, plus its cross-IPU
    sync). ``pods``: IPU counts to project on, the stages' pipeline replicated over them.

    Design decision: a stage holds its layers' parameters, each spread evenly over its tiles, beside
    one layer's other bytes (the layer's peak less its share of parameters: activations,
    transients), so layers per IPU = (usable - those) / (parameters per tile of a layer), rounded
    down; the stages are contiguous blocks balanced by layer count (the layers are identical). A
    stage's interval is its layers' cycles plus one boundary transfer; a batch's latency is every
    layer plus every boundary; a pipeline completes a batch every slowest stage, and a Pod of N IPUs
    runs N // stages such pipelines. Every figure is modelled (the cycle model's), none measured."""
    import numpy as np

    from .estimate.exchange import link_cycles
    usable = ipu.tiles * ipu.usable_bytes
    params = layers * layer_param_bytes
    per_tile = layer_param_bytes / ipu.tiles
    other = max(layer_peak_bytes - per_tile, 0)
    per_ipu = int((ipu.usable_bytes - other) // per_tile) if per_tile else layers
    if per_ipu < 1:
        raise ValueError("one layer does not fit one IPU")
    stages = -(-layers // per_ipu)
    per_stage = -(-layers // stages)
    pairs = np.zeros(link.ipus * link.ipus, dtype=np.int64)
    pairs[1] = boundary_bytes                      # IPU 0 -> IPU 1: one hop
    boundary = link_cycles(pairs, link) + link.sync_cycles_multi if stages > 1 else 0
    interval = per_stage * layer_cycles + boundary
    latency = layers * layer_cycles + (stages - 1) * boundary
    out = {"layers": layers, "batch": batch, "parameter_bytes": params, "sram_bytes_per_ipu": usable,
           "ipus_by_parameters": -(-params // usable), "layers_per_ipu": per_ipu, "stages": stages,
           "layers_per_stage": per_stage, "boundary_bytes": boundary_bytes, "boundary_cycles": boundary,
           "stage_cycles": interval, "latency_cycles": latency, "clock_hz": ipu.clock_hz,
           "latency_seconds": latency / ipu.clock_hz,
           "images_per_second_one_pipeline": batch * ipu.clock_hz / interval, "pods": {}}
    for n in pods:
        replicas = n // stages
        out["pods"][n] = {"ipus": n, "pipelines": replicas, "ipus_idle": n - replicas * stages,
                          "images_per_second": replicas * batch * ipu.clock_hz / interval}
    return out


# ---- the worker --------------------------------------------------------------------------------

def _rss() -> tuple[int, int]:
    """(this process's peak RSS, the largest waited-for child's peak RSS) in bytes (Linux: KiB)."""
    scale = 1 if sys.platform == "darwin" else 1024
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale,
            resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * scale)


def _plan_figures(p) -> dict:
    """A plan's estimate figures (the planner's run and the compact one alike)."""
    from .planner.quality import cycles_by_family
    est = p.estimate
    return {"roofline_cycles": p.roofline,
            "estimate": {"compute": est.compute, "exchange": est.exchange, "sync": est.sync,
                         "cycles": est.cycles, "total_memory": est.total_memory},
            "estimate_roofline_ratio": p.ratio if p.roofline else None,
            "cycles_by_family": cycles_by_family(p),
            **({"pipeline": {k: v for k, v in p.stages.items() if k != "ipu_of"}} if p.stages else {}),
            # pipeline stages: each stage's cycles for one batch, the pipelined throughput's interval
            **({"stage_cycles": [s["cycles"] for s in p.stages["stages"]]} if (p.stages or {}).get("stages") else {})}


def _floor_figures(p) -> dict:
    """The model floor of the plan's candidate space (``quality.model_floor`` with its storage)."""
    from .planner.quality import family_label, model_floor
    mf = model_floor(p.graph, p.target, p.weights)
    by_family: dict[str, int] = {}
    for op in p.graph.ops:
        if op.name in mf["ops"]:
            label = family_label(p.graph, op)
            by_family[label] = by_family.get(label, 0) + mf["ops"][op.name]["cycles"]
    return {"model_floor": mf["ops"], "model_floor_cycles": mf["cycles"], "model_floor_by_family": by_family,
            "model_floor_roofline_ratio": mf["cycles"] / p.roofline if p.roofline else None,
            "estimate_to_model_floor": p.estimate.cycles / mf["cycles"] if mf["cycles"] else None}


def _compile(p, target, pkg_dir: Path, params, plan_seconds: float, replan) -> tuple[dict, Path, object]:
    """Lower and package ``p`` as ``tileplan compile`` does (``compile_fitting``: planned again by
    ``replan(budget)`` where the allocator fragments it); ``compile_seconds`` is ``plan_seconds``
    (the benchmark's first plan: a fresh process, an empty plan cache, what one ``tileplan
    compile`` pays) plus that. Returns the figures, the package and the plan compiled; a plan made
    again within a budget brings its estimate figures and ``plan_budget``."""
    from .lowering.compile import compile_fitting
    t0 = time.perf_counter()
    done, _, pkg_path = compile_fitting(p, replan, target, pkg_dir, params=params)
    lower_s = time.perf_counter() - t0
    size = sum(f.stat().st_size for f in Path(pkg_path).rglob("*") if f.is_file())
    got = {"lower_package_seconds": lower_s, "compile_seconds": plan_seconds + lower_s, "package_bytes": size,
           "plan_budget": done.budget}
    if done is not p:
        got.update(_plan_figures(done))
    return got, Path(pkg_path), done


def _validate(p, pkg_path: Path, trace: str | None = None) -> dict:
    """The package run on the IPU model; the run is recorded in it (the report's trace reads it).
    ``trace``: a file to write the run's Chrome trace to (gzip-compressed, as Perfetto and
    ``chrome://tracing`` open it), after the timed part.

    Design decision: the trace of a 1472-tile run is tens of megabytes of JSON; compressed (gzip
    with no timestamp: the same run, the same bytes) it is small enough to keep beside bench.json."""
    from .lowering.package import load_package
    from .sim.validate import validate_package, write_validation
    t0, c0 = time.perf_counter(), time.process_time()
    pkg = load_package(pkg_path)
    v = validate_package(pkg)
    prof = v.profile
    peak = prof.memory_peak
    write_validation(pkg, v)
    traced = {}
    if trace is not None:
        import gzip

        from .atomic import write_file
        from .sim.validate import chrome_trace
        data = gzip.compress(chrome_trace(pkg, v), compresslevel=9, mtime=0)
        write_file(trace, data)
        traced = {"trace_file": Path(trace).name, "trace_bytes": len(data)}
    return {**traced,
        "validate_seconds": time.perf_counter() - t0,
        "validate_cpu_seconds": time.process_time() - c0,
        "cosine_min": min((o["cosine"] for o in v.outputs.values()), default=None),
        "validate_atol": max((o["atol"] for o in v.outputs.values()), default=None),
        "simulated": {"cycles": prof.cycles, "compute": prof.compute, "exchange": prof.exchange, "sync": prof.sync},
        "simulated_roofline_ratio": prof.cycles / p.roofline if p.roofline else None,
        "memory_peak_bytes": int(peak.max()) if peak is not None and peak.size else None,
        "memory_peak_tile": int(peak.argmax()) if peak is not None and peak.size else None,
        "max_abs_error": max((o["max_abs"] for o in v.outputs.values()), default=None),
        "outputs_passed": v.passed,
        "estimate_to_simulated": p.estimate.cycles / prof.cycles if prof.cycles else None}


def _stages(bench: dict, work_dir: str, send) -> None:
    from .graph.loaders import check_against_target, load_model, load_params
    from .planner.plan import Context, build_problem, plan
    from .planner.quality import amp_floor, coarse_ranking, search_gap
    from .planner.planjson import prearranged
    from .target import load_target

    path = FIXTURES / f"{bench['model']}.toml"
    graph = load_model(path)
    pins = []
    if bench.get("pins"):
        from .graph.pins import read_pins_file
        pins = read_pins_file(FIXTURES / bench["pins"])
        send("figures", {"pins": [f"{p.op}={p}" for p in pins]})
    target = load_target(bench["target"])
    check_against_target(graph, target)
    jobs = bench["jobs"]
    send("figures", {"tiles": target.tiles, "sram_bytes": target.sram_bytes, "clock_hz": target.clock_hz})
    send("compact", {"tiles": target.tiles, "sram_bytes": target.sram_bytes, "clock_hz": target.clock_hz})
    stages, compact_stages = bench["stages"], bench["compact_stages"]

    send("stage", "plan")
    base, _ = _rss()
    times, p = [], None
    cache = None
    if bench["cached"]:
        from .planner.cache import PlanCache
        cache = PlanCache(Path(work_dir) / "plan-cache")
    compiled = None

    def replan(weights):            # (the allocator fragmented a plan: plan it again within a budget)
        return lambda budget: plan(graph, target, jobs=jobs, cache=cache, weights=weights, ipus=bench["ipus"],
                                   budget=budget, pins=pins)
    for i in range(bench["repeats"]):
        p = plan(graph, target, jobs=jobs, cache=cache, weights="planner", ipus=bench["ipus"], pins=pins)
        times.append(p.plan_seconds)
        if cache is not None:
            send("figures", {"plan_seconds_cold": times[0], "plan_cache_entries": cache.info()["entries"],
                             "plan_seconds_warm": statistics.median(times[1:]) if len(times) > 1 else None})
        if i == 0:
            own, child = _rss()
            send("figures", {
                "baseline_rss_bytes": base, "planner_rss_self_bytes": own, "planner_rss_children_max_bytes": child,
                "planner_peak_rss_bytes": own + child, "plan_seconds_first": times[0], **_plan_figures(p),
                **({"pinned_own_cycles": p.pinned["own_cycles"]} if p.pinned else {})})
        send("figures", {"plan_seconds_all": list(times), "plan_seconds": statistics.median(times)})
        if i == 0 and "compile" in stages:
            # Lowered and packaged at once, in the fresh process that planned it, as one `tileplan
            # compile` does: after the warm repeats, the compact plan and the quality figures, this
            # process's heap is larger and a tower's lowering and packaging (which fork) slower: 20.3 s
            # against 16-17 s in one measurement. Its figures are sent at the compile stage.
            send("stage", "compile")
            compiled = _compile(p, target, Path(work_dir) / "pkg", load_params(path), times[0], replan("planner"))
            send("stage", "plan")
    send("done", "plan")

    # The same graph with every weight in its compact resident storage, beside the planner's own choice.
    send("stage", "compact plan")
    compact = plan(graph, target, jobs=jobs, cache=cache, weights="compact", ipus=bench["ipus"], pins=pins)
    send("compact", {"plan_seconds_all": [compact.plan_seconds], "plan_seconds": compact.plan_seconds,
                     "plan_seconds_first": compact.plan_seconds, **_plan_figures(compact), **_floor_figures(compact)})
    send("figures", {"storage_in_grid": sorted(r["tensor"] for r in prearranged(p))})   # (the two plans may
    #                                                      differ in their QKV form, so in their weights' names)
    send("compact-done", "plan")

    if "quality" in stages:
        send("stage", "quality")
        ranking = coarse_ranking(p)
        rhos = [f["spearman"] for f in ranking.values() if f["spearman"] is not None]
        send("figures", {"spearman_per_gemm": ranking, "spearman_min": min(rhos) if rhos else None})
        floor = amp_floor(p)
        total = sum(f["cycles"] for f in floor.values())
        send("figures", {"amp_floor": floor, "amp_floor_cycles": total,
                         "amp_floor_roofline_ratio": total / p.roofline if p.roofline else None,
                         **_floor_figures(p)})
        if bench["small"]:
            problem = build_problem(Context(p.graph, target, jobs, weights=p.weights), p.candidates)
            send("figures", {"search": search_gap(problem, SEARCH_PATHS, MAX_EXHAUSTIVE)})
        send("done", "quality")

    if "compile" in stages:
        pkg_path = _compile_validate(p, target, Path(work_dir) / "pkg", load_params(path), stages, send, "", times[0],
                                     replan("planner"), compiled, bench.get("trace"))
        if "validate" in stages and "report" in stages:
            from .report import render
            send("stage", "report")
            t0 = time.perf_counter()
            html = render(pkg_path, Path(work_dir) / "report.html")
            report_s = time.perf_counter() - t0
            send("figures", {"report_seconds": report_s, "report_html_bytes": html.stat().st_size})
            load_s, note = page_load_seconds(html)
            send("figures", {"report_load_seconds": load_s, "report_load_note": note})
            send("done", "report")

    if "compile" in compact_stages:
        _compile_validate(compact, target, Path(work_dir) / "pkg-compact", load_params(path), compact_stages, send,
                          "compact", compact.plan_seconds, replan("compact"))


def _compile_validate(p, target, pkg_dir: Path, params, stages, send, storage: str, plan_seconds: float,
                      replan, compiled=None, trace: str | None = None) -> Path:
    """The compile stage, then the validate stage when listed, of one plan; ``storage``: "" for the
    planner's own storage (figures go to the record), "compact" for the compact-weights column (to
    its sub-record); ``compiled``: ``_compile``'s result when the plan was compiled already. Returns
    the package's path. ``trace``: where the planner's run writes its Chrome trace (``_validate``)."""
    prefix, figures, done = (f"{storage} ", storage, f"{storage}-done") if storage else ("", "figures", "done")
    send("stage", f"{prefix}compile")
    got, pkg_path, p = compiled or _compile(p, target, pkg_dir, params, plan_seconds, replan)
    send(figures, got)
    send(done, "compile")
    if "validate" in stages:
        send("stage", f"{prefix}validate")
        send(figures, _validate(p, pkg_path, trace if not storage else None))
        send(done, "validate")
    return pkg_path


def page_load_seconds(html: Path) -> tuple[float | None, str]:
    """Seconds headless Chromium takes to open ``html`` until the page marks itself ready (its
    scripts have drawn every view), and a note; ``None`` with the reason when playwright or
    Chromium is missing (playwright is in the test extra, not a dependency of tileplan)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None, "not measured: playwright is not installed (pip install -e '.[test]')"
    chromium = os.environ.get("TILEPLAN_CHROMIUM", "/usr/bin/chromium")
    if not Path(chromium).exists():
        return None, f"not measured: no Chromium at {chromium} (set TILEPLAN_CHROMIUM)"
    args = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=args)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            t0 = time.perf_counter()
            page.goto(html.resolve().as_uri(), wait_until="load")
            page.wait_for_selector("body[data-ready='1']", timeout=60_000)
            seconds = time.perf_counter() - t0
        finally:
            browser.close()
    return seconds, f"headless Chromium ({Path(chromium).name}), load until body[data-ready]"


def _worker(conn, bench: dict, work_dir: str) -> None:
    """Entry point of a benchmark's process: its own process group (so the parent can stop it and
    its pool in one signal), then the stages, each message sent as soon as it is known. The pool
    starts its workers the way the parent's would (a spawned process defaults to spawn)."""
    os.setpgrp()
    multiprocessing.set_start_method(bench["start_method"], force=True)

    def send(kind, payload=None):
        conn.send((kind, payload))

    try:
        _stages(bench, work_dir, send)
        send("end")
    except BaseException as exc:      # reported as data; the parent records it
        last = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
        where = f" ({Path(last.filename).name}:{last.lineno})" if last else ""
        message = " ".join(str(exc).split())
        send("error", f"{type(exc).__name__}: {message}"[:400] + where)
    finally:
        conn.close()


# ---- the parent --------------------------------------------------------------------------------

def empty_record(b: Benchmark, quick: bool, jobs: int) -> dict:
    rec = dict.fromkeys(FIGURES)
    stages = b.quick_stages if quick else b.stages
    rec.update(fixture=b.name, target=b.target, stages=list(stages), stages_done=[], jobs=jobs,
               plan_repeats=b.repeats(quick), batch=b.batch or None)
    compact = dict.fromkeys(f for f in FIGURES if f != "compact")      # the compact-weights run: the same keys
    compact.update(fixture=b.name, target=b.target, stages=list(b.compact_stages(quick)), stages_done=[], jobs=jobs,
                   plan_repeats=1, batch=b.batch or None)
    rec["compact"] = compact
    return rec


def _stop(proc) -> None:
    """Stop a benchmark worker and everything it started (its process group)."""
    if proc.is_alive():
        try:
            if os.getpgid(proc.pid) == proc.pid:
                os.killpg(proc.pid, signal.SIGKILL)
            else:                               # not yet in its own group: it has no children yet
                proc.kill()
        except ProcessLookupError:
            pass
    proc.join()


def run_one(b: Benchmark, *, quick: bool, jobs: int, budget: float, trace_dir: Path | None = None) -> dict:
    """One benchmark in its own process, within ``budget`` seconds; a benchmark with ``trace`` writes
    ``<trace_dir>/<name>.trace.json.gz`` when ``trace_dir`` is given."""
    rec = empty_record(b, quick, jobs)
    rec["budget_seconds"] = round(budget, 1)
    ctx = multiprocessing.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    work_dir = tempfile.mkdtemp(prefix=f"tileplan-bench-{b.name}-")
    spec = {"name": b.name, "model": b.model, "pins": b.pins, "target": b.target, "small": b.small, "jobs": jobs,
            "repeats": b.repeats(quick), "stages": rec["stages"], "cached": b.cached, "ipus": b.ipus,
            "compact_stages": rec["compact"]["stages"],
            "trace": (str(Path(trace_dir).resolve() / f"{b.name}.trace.json.gz")
                      if b.trace and trace_dir is not None else None),
            "start_method": multiprocessing.get_start_method()}
    t0 = time.monotonic()
    proc = ctx.Process(target=_worker, args=(send, spec, work_dir), name=f"bench-{b.name}")
    stage = "start"
    try:
        proc.start()
        send.close()
        while True:
            left = t0 + budget - time.monotonic()
            if left <= 0 or not recv.poll(left):
                rec["status"] = "timeout"
                rec["stage_at_stop"] = stage
                break
            try:
                kind, payload = recv.recv()
            except EOFError:
                proc.join(5)
                rec["status"] = f"error: worker exited with status {proc.exitcode} during {stage}"
                rec["stage_at_stop"] = stage
                break
            if kind == "stage":
                stage = payload
            elif kind == "done":
                rec["stages_done"].append(payload)
            elif kind == "figures":
                rec.update(payload)
            elif kind == "compact":
                rec["compact"].update(payload)
            elif kind == "compact-done":
                rec["compact"]["stages_done"].append(payload)
            elif kind == "error":
                rec["status"] = f"error: {payload}"
                rec["stage_at_stop"] = stage
                break
            elif kind == "end":
                rec["status"] = "ok"
                break
    finally:
        _stop(proc)
        recv.close()
        shutil.rmtree(work_dir, ignore_errors=True)
    rec["elapsed_seconds"] = time.monotonic() - t0
    rec["throughput"] = record_throughput(rec)
    rec["compact"]["throughput"] = record_throughput(rec["compact"])
    _compact_status(rec)
    return rec


def _compact_status(rec: dict) -> None:
    """The compact run's status: ok when its stages are done, else where the benchmark stopped."""
    c = rec["compact"]
    if c["stages"] and c["stages_done"] == c["stages"]:
        c["status"] = "ok"
    elif rec["status"] and rec["status"] != "ok":
        c["status"] = rec["status"]
        c["stage_at_stop"] = rec["stage_at_stop"]
        c["budget_seconds"] = rec["budget_seconds"]
    else:
        c["status"] = "not run"


def machine_info() -> dict:
    import numpy

    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10,
                                  check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    return {
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "platform": platform.platform(),
        "load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
    }


def run_bench(*, quick: bool, jobs: int, only: list[str] | None = None, on_result=None,
              trace_dir: Path | None = None) -> dict:
    """Run the benchmarks (all, or ``only``) and return the bench.json document; ``trace_dir``: where
    the benchmarks marked ``trace`` write their run's Chrome trace (the folder of bench.json)."""
    chosen = [BY_NAME[n] for n in only] if only else list(BENCHMARKS)
    machine = machine_info()           # before the run: its load average and commit are the start's
    started = time.monotonic()
    deadline = started + QUICK_DEADLINE if quick else math.inf
    results = {}
    for b in chosen:
        cap = b.budget[0 if quick else 1]
        left = deadline - time.monotonic()
        if quick and not b.in_quick:
            rec = empty_record(b, quick, jobs)
            rec["status"] = "skipped: not in --quick (its cold plan, compile and validate take minutes)"
            rec["budget_seconds"] = 0
            rec["elapsed_seconds"] = 0.0
            _compact_status(rec)
        elif left < 10:
            rec = empty_record(b, quick, jobs)
            rec["status"] = f"skipped: the --quick time budget ({QUICK_DEADLINE:.0f} s) was spent"
            rec["budget_seconds"] = 0
            rec["elapsed_seconds"] = 0.0
            _compact_status(rec)
        else:
            rec = run_one(b, quick=quick, jobs=jobs, budget=min(cap, left), trace_dir=trace_dir)
        results[b.name] = rec
        if on_result is not None:
            on_result(rec)
    return {
        "mode": "quick" if quick else "full",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine,
        "jobs": jobs,
        "total_seconds": time.monotonic() - started,
        "load_average_end": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "quick_deadline_seconds": QUICK_DEADLINE if quick else None,
        "benchmarks": results,
        "targets": target_figures(results),
        "reference": REFERENCE,
        "calibration": calibration_report(),
        # the pipelined throughput table: full-size plans, the full bench only (not with --only)
        **({"pipeline_table": pipeline_table(jobs=jobs, cache=_plan_cache())} if not quick and not only else {}),
    }


def calibration_report() -> dict:
    """The kernel entries of ``tileplan calibrate`` (the layout entries each plan a 1472-tile fixture:
    too slow for the bench)."""
    from .calibrate import report
    return report(kernels_only=True)


def calibration_lines(doc: dict) -> list[str]:
    """BENCH.md's calibration section: every kernel entry's model / hardware, then the summary."""
    cal = doc.get("calibration")
    if not cal:
        return []
    from .calibrate import ENTRY_COLUMNS, SUMMARY_COLUMNS, entry_cells, fit_line, summary_cells
    return [
        "## Calibration against hardware (kernels)",
        "",
        f"`tileplan calibrate --kernels-only` on {cal['target']}: tileplan's kernel cycles (the registry's, "
        f"as the planner prices them) against public IPU21 measurements ({cal['data']}; sources per row). "
        "Many kernel formulas were fitted to these very points, so a ratio of 1.000 there shows the "
        "formula is the published one, not an independent check; the later kernel revisions and the "
        "held-out split are the test.",
        "",
        _md_table(list(SUMMARY_COLUMNS), [summary_cells(s) for s in cal["summary"]]),
        "",
        fit_line(cal) + ".",
        "",
        _md_table(list(ENTRY_COLUMNS), [entry_cells(r) for r in cal["entries"]]),
        "",
    ]


# ---- targets and tables ------------------------------------------------------------------------

def _get(results: dict, name: str, key: str):
    rec = results.get(name)
    return None if rec is None else rec.get(key)


def _cycles_ratio(results: dict, name: str):
    """Simulated / roofline; the planner's estimate / roofline when the package was not simulated."""
    sim = _get(results, name, "simulated_roofline_ratio")
    if sim is not None:
        return sim, "simulated"
    est = _get(results, name, "estimate_roofline_ratio")
    return (est, "estimate (not simulated)") if est is not None else (None, None)


def target_figures(results: dict) -> list[dict]:
    """Each target with the figure reached (None when not measured) and whether it is met."""
    out = []

    def add(target, figure, limit, unit, source, reference, floor=None, compact=(None, None)):
        met = None if figure is None else figure <= limit
        out.append({"target": target, "figure": figure, "limit": limit, "unit": unit, "met": met,
                    "source": source, "reference": reference, "floor": floor,
                    "compact": compact[0], "compact_source": compact[1]})   # the same with compact weights

    compacts = {n: r["compact"] for n, r in results.items() if r.get("compact")}

    add("SigLIP b4 FP8 MLP (1472 tiles): plan + compile", _get(results, "siglip_mlp_fp8_b4", "compile_seconds"),
        10.0, "s", "siglip_mlp_fp8_b4 compile_seconds",
        "Rust IPU planner: 63.5 s of mid construction on 56 threads")
    add("64-tile FP8 smoke MLP: plan", _get(results, "mlp_smoke_fp8", "plan_seconds"), 0.100, "s",
        "mlp_smoke_fp8 plan_seconds (median)", "Rust IPU planner: 185 ms")
    ratio, how = _cycles_ratio(results, "siglip_mlp_fp8_b4")
    add("SigLIP b4 FP8 MLP: cycles / roofline bound", ratio, 1.6, "x", f"siglip_mlp_fp8_b4 {how or 'cycles'}",
        "hardware (Rust planner's program): 614,700 cycles, about 4x the FP8 roofline bound",
        _get(results, "siglip_mlp_fp8_b4", "model_floor_roofline_ratio"), _cycles_ratio(compacts, "siglip_mlp_fp8_b4"))
    ratio, how = _cycles_ratio(results, "gemm_4096_fp16")
    roof = _get(results, "gemm_4096_fp16", "roofline_cycles")
    hw = REFERENCE["hardware_gemm_4096_fp16_cycles"]
    add("4096-square FP16 GEMM: cycles / roofline bound", ratio, 1.3, "x", f"gemm_4096_fp16 {how or 'cycles'}",
        f"hardware: {hw:,} cycles" + (f" ({hw / roof:.2f}x this roofline)" if roof else "")
        + " (fixtures/gemm_4096_fp16.toml)", _get(results, "gemm_4096_fp16", "model_floor_roofline_ratio"),
        _cycles_ratio(compacts, "gemm_4096_fp16"))
    errs = {n: abs(r["estimate_to_simulated"] - 1) for n, r in results.items() if r.get("estimate_to_simulated")}
    worst = max(errs, key=errs.get) if errs else None
    add("detailed estimate within 5% of simulated cycles (every fixture)", errs[worst] if worst else None, 0.05,
        "rel", f"worst |estimate / simulated - 1| ({worst}; {len(errs)} of {len(results)} simulated)"
        if worst else "estimate_to_simulated", "")
    gaps = {n: r["search"]["gap"] for n, r in results.items() if r.get("search") and r["search"]["gap"] is not None}
    worst = max(gaps, key=gaps.get) if gaps else None
    add("bounded search within 1% of the optimum (small graphs)", gaps[worst] if worst else None, 0.01, "rel",
        f"worst gap ({worst})" if worst else "search gap", "")
    tower = "siglip_tower_fp8_b1"
    add("SigLIP tower (27 layers): plan + compile, cold cache", _get(results, tower, "compile_seconds"), 30.0, "s",
        f"{tower} compile_seconds (first plan: empty cache)",
        f"ipu-stack: {REFERENCE['ipu_stack_siglip_tower_b1_plan_seconds']} s of package planning on many threads")
    add("SigLIP tower (27 layers): plan, warm cache", _get(results, tower, "plan_seconds_warm"), 5.0, "s",
        f"{tower} plan_seconds_warm (median of the repeats after the first)", "")
    add("SigLIP tower (27 layers): planner peak memory", _get(results, tower, "planner_peak_rss_bytes"),
        8 * 2**30, "B", f"{tower} planner_peak_rss_bytes", "")
    sim = _get(results, tower, "simulated")
    cest = _get(compacts, tower, "simulated") or _get(compacts, tower, "estimate")
    ccycles = (cest["cycles"] / REFERENCE["ipu_stack_siglip_tower_b1_cycles"],
               "simulated" if _get(compacts, tower, "simulated") else "estimate (not simulated)") if cest else (None, None)
    lo, hi = REFERENCE["poplar_sdk_siglip_tower_b1_cycles"]
    add("SigLIP tower (27 layers): modelled cycles / ipu-stack's hardware cycles",
        sim["cycles"] / REFERENCE["ipu_stack_siglip_tower_b1_cycles"] if sim else None, 1.0, "x",
        f"{tower} simulated cycles (the IPU model: modelled, not measured on hardware)",
        f"ipu-stack {REFERENCE['ipu_stack_siglip_tower_b1_cycles']:,} cycles, Poplar SDK {lo:,}-{hi:,} cycles, "
        "both measured on a C600", _get(results, tower, "model_floor_roofline_ratio"),
        ccycles)
    vision = "siglip_vision_fp8_b1"
    cold = (_get(results, vision, "compile_seconds"), _get(results, tower, "compile_seconds"))
    add("SigLIP vision model (384 px, 27 layers, MAP head): plan + compile, cold cache / the tower's",
        cold[0] / cold[1] if None not in cold else None, 1.3, "x",
        f"{vision} compile_seconds / {tower} compile_seconds (both from an empty cache)", "")
    sim = _get(results, vision, "simulated")
    add("SigLIP vision model (384 px, 27 layers, MAP head): modelled cycles / ipu-stack's hardware cycles",
        sim["cycles"] / REFERENCE["ipu_stack_siglip_vision_b1_cycles"] if sim else None, 1.0, "x",
        f"{vision} simulated cycles (the IPU model: modelled, not measured on hardware)",
        f"ipu-stack {REFERENCE['ipu_stack_siglip_vision_b1_cycles']:,} cycles for the whole model, measured on a C600",
        _get(results, vision, "model_floor_roofline_ratio"))
    b2 = "siglip_tower_fp8_b2"
    sim = _get(results, b2, "simulated")
    lo, hi = REFERENCE["ipu_stack_siglip_tower_b2_cycles"]
    tp = _get(results, b2, "throughput")
    add("SigLIP tower (27 layers) at batch 2: modelled cycles / ipu-stack's hardware cycles",
        sim["cycles"] / lo if sim else None, 1.0, "x",
        f"{b2} simulated cycles (the IPU model: modelled, not measured on hardware) over the anchor's {lo:,}"
        + (f"; {tp['images_per_second']:.1f} images/s modelled (batch x clock / cycles)" if tp else ""),
        f"ipu-stack on a C600: {lo:,}-{hi:,} cycles (hardware), "
        f"{REFERENCE['ipu_stack_siglip_tower_b2_images_per_second']} images/s timed by the host",
        _get(results, b2, "model_floor_roofline_ratio"))
    add("SigLIP b4 FP8 MLP report page (1472 tiles): size", _get(results, "siglip_mlp_fp8_b4", "report_html_bytes"),
        10 * 2**20, "B", "siglip_mlp_fp8_b4 report_html_bytes", "")
    add("SigLIP b4 FP8 MLP report page: load in headless Chromium",
        _get(results, "siglip_mlp_fp8_b4", "report_load_seconds"), 3.0, "s",
        "siglip_mlp_fp8_b4 report_load_seconds", "")
    add("SigLIP b4 FP8 MLP: planner peak memory", _get(results, "siglip_mlp_fp8_b4", "planner_peak_rss_bytes"),
        4 * 2**30, "B", "siglip_mlp_fp8_b4 planner_peak_rss_bytes", "")
    ratio, how = _cycles_ratio(results, "siglip_layer_fp8_b1")
    add("SigLIP So400m encoder layer, FP8 b1: cycles / roofline bound", ratio, 3.0, "x",
        f"siglip_layer_fp8_b1 {how or 'cycles'}", "hardware (ipu-stack): 715,350 cycles for one such layer",
        _get(results, "siglip_layer_fp8_b1", "model_floor_roofline_ratio"), _cycles_ratio(compacts, "siglip_layer_fp8_b1"))
    add("SigLIP So400m encoder layer, FP8 b1: plan + compile", _get(results, "siglip_layer_fp8_b1", "compile_seconds"),
        15.0, "s", "siglip_layer_fp8_b1 compile_seconds", "")
    return out


def _fmt_seconds(s) -> str:
    if s is None:
        return "—"
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.2f} s" if s < 100 else f"{s:.0f} s"


def _fmt_bytes(b) -> str:
    if b is None:
        return "—"
    if b >= 2**30:
        return f"{b / 2**30:.2f} GiB"
    if b >= 2**20:
        return f"{b / 2**20:.0f} MiB"
    return f"{b:,} B"


def _fmt(v, unit: str) -> str:
    if v is None:
        return "—"
    if unit == "s":
        return _fmt_seconds(v)
    if unit == "x":
        return f"{v:.2f}x"
    if unit == "rel":
        return f"{100 * v:.2f}%"
    if unit == "B":
        return _fmt_bytes(v)
    return str(v)


def _status(rec: dict) -> str:
    s = rec["status"] or "—"
    if s == "timeout":
        return f"timeout ({rec['budget_seconds']:.0f} s, in {rec['stage_at_stop']})"
    return s


def _phases(d: dict | None) -> str:
    if not d:
        return "—"
    return f"{d['cycles']:,} ({d['compute']:,} / {d['exchange']:,} / {d['sync']:,})"


def _spearman(rec: dict) -> str:
    per = rec.get("spearman_per_gemm")
    if not per:
        return "—"
    parts = [f"{op} {f['spearman']:.2f}" if f["spearman"] is not None else f"{op} n/a"
             for op, f in sorted(per.items())]
    return ", ".join(parts)


def _search(rec: dict) -> str:
    s = rec.get("search")
    if not s:
        return "—"
    if s["gap"] is None:
        return "nothing fits" if s["bounded_cycles"] is None else f"no optimum known ({s['optimum_method']})"
    how = {"exhaustive": "exhaustive", "cp-sat (proved optimal)": "vs CP-SAT, proved optimal"}.get(
        s["optimum_method"], "vs exact DP")
    return f"{100 * s['gap']:.2f}% ({how}, {s['combinations']:,} combinations)"


def _throughput(rec: dict) -> str:
    t = rec.get("throughput")
    if not t:
        return "—"
    return (f"{t['images_per_second']:.1f} images/s at batch {t['batch']}{' (pipelined)' if t['pipelined'] else ''}; "
            f"{1e3 * t['seconds_per_image']:.2f} ms; {1e3 * t['latency_seconds']:.2f} ms "
            f"({t['source']} cycles at {t['clock_hz'] / 1e9:g} GHz)")


def figure_rows(results: dict) -> list[tuple[str, list[str]]]:
    """(figure, one cell per benchmark) for the per-benchmark table."""
    recs = list(results.values())

    def row(label, fn):
        return label, [fn(r) for r in recs]

    def ratio(key):
        return lambda r: f"{r[key]:.3f}" if r.get(key) is not None else "—"

    return [
        row("target machine", lambda r: f"{r['target']} ({r['tiles']:,} tiles)" if r["tiles"] else r["target"]),
        row("status", _status),
        row("pinned grids (and the planner's own choice's estimate)", lambda r: ", ".join(r["pins"])
            + (f" (own choice: {r['pinned_own_cycles']:,} cycles)" if r.get("pinned_own_cycles") else "")
            if r.get("pins") else "—"),
        row("stages run", lambda r: " / ".join(r["stages_done"]) or "none"),
        row("plan time (median of repeats)",
            lambda r: f"{_fmt_seconds(r['plan_seconds'])} (x{len(r['plan_seconds_all'])})" if r["plan_seconds_all"]
            else "—"),
        row("  first (cold) plan", lambda r: _fmt_seconds(r["plan_seconds_first"])),
        row("  plan with a cold / warm plan cache",
            lambda r: f"{_fmt_seconds(r['plan_seconds_cold'])} / {_fmt_seconds(r['plan_seconds_warm'])}"
            if r.get("plan_seconds_cold") is not None else "—"),
        row("compile time (plan + lower + package)", lambda r: _fmt_seconds(r["compile_seconds"])),
        row("  lower + write package; package size",
            lambda r: f"{_fmt_seconds(r['lower_package_seconds'])}; {_fmt_bytes(r['package_bytes'])}"
            if r.get("package_bytes") is not None else "—"),
        row("planner peak RSS (process + largest pool worker)", lambda r: _fmt_bytes(r["planner_peak_rss_bytes"])),
        row("roofline bound (cycles)", lambda r: f"{r['roofline_cycles']:,.0f}" if r["roofline_cycles"] else "—"),
        row("estimate: cycles (compute / exchange / sync)", lambda r: _phases(r["estimate"])),
        row("simulated: cycles (compute / exchange / sync)", lambda r: _phases(r["simulated"])),
        row("simulated / roofline", ratio("simulated_roofline_ratio")),
        row("estimate / roofline", ratio("estimate_roofline_ratio")),
        row("estimate / simulated", ratio("estimate_to_simulated")),
        row("weights the planner pre-arranges (stored as their grid reads them)", lambda r: ", ".join(r["storage_in_grid"]) or "none"
            if r.get("storage_in_grid") is not None else "—"),
        row("memory peak, worst tile (simulated)",
            lambda r: f"{r['memory_peak_bytes']:,} B of {r['sram_bytes']:,} (tile {r['memory_peak_tile']})"
            if r["memory_peak_bytes"] is not None else "—"),
        row("max abs error vs float64", lambda r: f"{r['max_abs_error']:.5f}" + ("" if r["outputs_passed"] else " FAIL")
            if r["max_abs_error"] is not None else "—"),
        row("AMP floor: fastest fitting grids' matmul steps alone (x roofline)",
            lambda r: f"{r['amp_floor_cycles']:,} ({r['amp_floor_roofline_ratio']:.2f}x)"
            if r.get("amp_floor_cycles") is not None and r.get("amp_floor_roofline_ratio") is not None else "—"),
        row("model floor: no plan in the candidate space is faster (x roofline)",
            lambda r: f"{r['model_floor_cycles']:,} ({r['model_floor_roofline_ratio']:.2f}x)"
            if r.get("model_floor_cycles") is not None and r.get("model_floor_roofline_ratio") is not None else "—"),
        row("estimate / model floor", ratio("estimate_to_model_floor")),
        row("estimate by family (cycles; conversions apart)", lambda r: ", ".join(
            f"{k} {v:,}" for k, v in r["cycles_by_family"].items()) if r.get("cycles_by_family") else "—"),
        row("model floor by family", lambda r: ", ".join(
            f"{k} {v:,}" for k, v in r["model_floor_by_family"].items()) if r.get("model_floor_by_family") else "—"),
        row("coarse vs detailed Spearman (per GEMM)", _spearman),
        row("bounded search (16 paths) gap to optimum", _search),
        row("pipeline stages (IPU: cycles, B received over the IPU-Links)", lambda r: "; ".join(
            f"{s['ipu']}: {s['cycles']:,}, {s['link_bytes_in']:,} B" for s in r["pipeline"]["stages"])
            + f" (interval {r['pipeline']['interval_cycles']:,})"
            if (r.get("pipeline") or {}).get("stages") else "—"),
        row("throughput (modelled): images/s; time per image; latency of a batch", _throughput),
        row("validate time (IPU model)", lambda r: _fmt_seconds(r["validate_seconds"])),
        row("HTML report: size; write; load in headless Chromium",
            lambda r: f"{_fmt_bytes(r['report_html_bytes'])}; {_fmt_seconds(r['report_seconds'])}; "
            + (_fmt_seconds(r["report_load_seconds"]) if r.get("report_load_seconds") is not None
               else r.get("report_load_note") or "—") if r.get("report_html_bytes") is not None else "—"),
        row("benchmark wall time / budget",
            lambda r: f"{_fmt_seconds(r['elapsed_seconds'])} / {r['budget_seconds']:.0f} s"
            if r["budget_seconds"] else "—"),
    ]


TARGET_COLUMNS = ("target", "tileplan", "compact weights", "met", "model floor", "reference")


def target_rows(doc: dict) -> list[tuple[str, str, str, str, str, str]]:
    """One row per target: the figure with the planner's own storage (what ``met`` judges), the same
    figure with compact weights (the estimate's, said so, where the compact plan was not simulated)."""
    out = []
    for t in doc["targets"]:
        limit = _fmt(t["limit"], t["unit"])
        met = "not measured" if t["met"] is None else "yes" if t["met"] else "**no**"
        floor = t.get("floor")
        floor = "—" if floor is None else _fmt(floor, t["unit"]) + (" (above the target)" if floor > t["limit"] else "")
        compact = t.get("compact")
        compact = "—" if compact is None else _fmt(compact, t["unit"]) + (
            " (estimate)" if (t.get("compact_source") or "").startswith("estimate") else "")
        out.append((f"{t['target']} (≤ {limit})", _fmt(t["figure"], t["unit"]), compact, met, floor,
                    t["reference"] or "—"))
    return out


def pinned_rows(results: dict, pairs=None) -> list[tuple[str, str, str, str, str]]:
    """Each pair of ``pairs`` (default ``SIDE_BY_SIDE``) that ran: (model, whose grids, their
    simulated cycles, tileplan's own choice's simulated cycles, pinned / own), the estimate's cycles
    (said so) where a package was not simulated. Both columns are tileplan's IPU model's figures."""
    out = []
    for pinned, own, who in SIDE_BY_SIDE if pairs is None else pairs:
        a, b = results.get(pinned), results.get(own)
        if a is None and b is None:
            continue

        def cycles(r):
            if r is None:
                return None, "not run"
            got = r.get("simulated") or r.get("estimate")
            if not got:
                return None, _status(r)
            return got["cycles"], f"{got['cycles']:,}" + ("" if r.get("simulated") else " (estimate)")
        (ca, ta), (cb, tb) = cycles(a), cycles(b)
        grids = ", ".join((a or {}).get("pins") or []) or "—"
        out.append((BY_NAME[own].model, f"{who}: {grids}", ta, tb, f"{ca / cb:.2f}x" if ca and cb else "—"))
    return out


PINNED_COLUMNS = ("model", "pinned grids", "pinned: cycles", "tileplan's choice: cycles", "pinned / tileplan")


def side_by_side(results: dict) -> dict:
    """The per-benchmark table's columns: each benchmark with the planner's storage, then with compact weights."""
    out = {}
    for name, rec in results.items():
        out[name] = rec
        if rec.get("compact"):
            out[f"{name} (compact)"] = rec["compact"]
    return out


def compact_notes() -> list[str]:
    """Which benchmarks' compact columns were simulated, per mode (``Benchmark.compact``)."""
    def names(quick, simulated):
        return [b.name for b in BENCHMARKS if ("validate" in b.compact_stages(quick)) == simulated]
    return [f"--quick: compiled and validated with compact weights too: {', '.join(names(True, True)) or 'none'}; "
            f"planned and estimated only (no compile, no simulation): {', '.join(names(True, False)) or 'none'}",
            f"full run: compiled and validated with compact weights too: {', '.join(names(False, True)) or 'none'}; "
            f"planned and estimated only: {', '.join(names(False, False)) or 'none'}"]


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    esc = lambda s: str(s).replace("|", "\\|")
    lines = ["| " + " | ".join(map(esc, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(esc, r)) + " |" for r in rows]
    return "\n".join(lines)


def skipped_by_quick() -> list[str]:
    out = []
    for b in BENCHMARKS:
        if b.repeats(True) != b.repeats(False):
            out.append(f"{b.name}: {b.repeats(True)} plan repeat(s) instead of {b.repeats(False)}")
        missing = [s for s in b.stages if s not in b.quick_stages]
        if missing:
            out.append(f"{b.name}: no {' / '.join(missing)} (no simulated cycles, memory peak, error, "
                       f"estimate/simulated or compile time)")
    return out


def markdown(doc: dict) -> str:
    results = doc["benchmarks"]
    m = doc["machine"]
    columns = side_by_side(results)
    names = list(columns)
    lines = [
        "# tileplan benchmarks",
        "",
        f"`tileplan bench{' --quick' if doc['mode'] == 'quick' else ''}` on {doc['date']}: "
        f"{m['cpu_count']} CPUs, Python {m['python']}, numpy {m['numpy']}, {doc['jobs']} planner job(s), "
        f"load average {', '.join(map(str, m['load_average'] or []))} at the start and "
        f"{', '.join(map(str, doc.get('load_average_end') or []))} at the end (1, 5, 15 min); "
        f"commit {(m['git_commit'] or '?')[:12]}{' (with local changes)' if m['git_dirty'] else ''}. "
        f"Whole run: {doc['total_seconds']:.0f} s. Raw figures: `bench.json`.",
        "",
        "**Cycles are modelled, not measured on hardware**: every simulated figure is counted by "
        "tileplan's bundled IPU model (`tileplan validate`), a cycle model of the IPU; the hardware "
        "figures in the reference column were measured on IPUs by other software.",
        "",
        "## Targets",
        "",
        _md_table(list(TARGET_COLUMNS), [list(r) for r in target_rows(doc)]),
        "",
        "## Figures per benchmark",
        "",
        _md_table(["figure"] + names, [[label] + cells for label, cells in figure_rows(columns)]),
        "",
        "Every benchmark has two columns: its name, the plan with the planner's own parameter storage "
        "(`--weights planner`: selection may store a GEMM's weights as its grid reads them, the row "
        "\"weights the planner pre-arranges\" names them), and `(compact)`, the same graph planned with "
        "`--weights compact` (every weight in its compact resident storage), one plan after the planner's "
        "in the same process (its module caches warm). The targets judge the planner's storage; their "
        "\"compact weights\" column is the same figure with compact weights. Where a compact column "
        "has no simulated cycles, its compile and IPU-model run were left out to keep the budget "
        "(its estimate equals the simulated cycles wherever both were measured):",
        "",
        *[f"- {line}" for line in compact_notes()],
        "",
        "Phases: compute / exchange / sync cycles. Plan times are in-process `Plan.plan_seconds` "
        "with the catalogue's process pool; the first repeat runs in a fresh process, later ones find "
        "the planner's module caches warm. Planner peak RSS: the planning process's `ru_maxrss` plus "
        "the largest pool worker's (workers run concurrently, so the true peak can be higher). "
        "Compile time: the first plan's time plus lowering and package writing, in the process that "
        "made it, before the repeats (as one `tileplan compile`). AMP floor: per GEMM, the "
        "matmul step of the grid option (any order, reduction, serial K) with the fewest AMP cycles that "
        "fits tile memory, with no exchange, reduction or elementwise work: no plan under this cycle "
        "model computes its GEMMs faster. Model floor (`planner.quality.model_floor`): a lower bound on "
        "every plan of the graph in the candidate space (any grid, tile order, reduction ownership or "
        "serial split): per GEMM grid its matmul step, the operand bytes its tiles must receive at the "
        "paired rate with at most one operand paired per tile, the partials its reduction must send "
        "and reduce, and a sync per phase; per elementwise op its kernel on a balanced share. A target "
        "below the floor cannot be met by a better search, only by a wider candidate space or faster "
        "kernels. The exhaustive optimum is "
        f"replaced by the exact (unbounded) DP when the product of choices exceeds {MAX_EXHAUSTIVE:,}. "
        "Throughput (towers with a batch, `bench.throughput`): images/s = batch x clock / cycles, from the "
        "simulated cycles (else the estimate) and the target's `clock_hz` (ipu21: 1.5 GHz, the clock "
        "ipu-stack's README uses for its C600 peak figure; see the target file): modelled, not timed.",
        "",
    ]
    pinned = pinned_rows(results)
    if pinned:
        lines += ["## Published grids beside tileplan's choice", "",
                  "The same model planned with another planner's published grids pinned (`--pins`: the grids "
                  "only; tile order, reduction, partials and storage are tileplan's) and as tileplan plans it, "
                  "both compiled and run on tileplan's IPU model: **both cycle figures are the IPU model's**, "
                  "neither was measured on hardware.", "",
                  _md_table(list(PINNED_COLUMNS), [list(r) for r in pinned]), ""]
    lines += calibration_lines(doc)
    lines += pipeline_lines(doc.get("pipeline_table"))
    problems = [(n, r) for n, r in results.items() if r["status"] != "ok"]
    if problems:
        lines += ["## Timeouts, failures and skips", ""]
        for n, r in problems:
            done = ", ".join(r["stages_done"]) or "nothing"
            lines.append(f"- `{n}`: {_status(r)}; stages finished: {done}.")
        lines.append("")
    lines += [
        "## Modes",
        "",
        f"`tileplan bench --quick` stays under 5 minutes on two cores: the whole run has a "
        f"{QUICK_DEADLINE:.0f} s deadline and each benchmark a budget (quick / full: "
        + ", ".join(f"{b.name} {b.budget[0]:.0f} / {b.budget[1]:.0f} s" for b in BENCHMARKS)
        + "); a benchmark's budget is the smaller of its own and what is left of the deadline, and one "
        "that runs out of time is recorded as a timeout with the figures it had (one that cannot start "
        "is recorded as skipped). Benchmarks run in this order, the ones with targets first. "
        "Compared with the full run, --quick skips by design:",
        "",
        *[f"- {s}" for s in skipped_by_quick()],
        "",
        "`tileplan bench` (full) runs every stage of every benchmark with 5 plan repeats for the small "
        "graphs and 3 for the big ones; `--only NAME` runs one benchmark, `--jobs N` sets the pool size, "
        "`--out DIR` the folder of bench.json and BENCH.md.",
        "",
    ]
    return "\n".join(lines)


def write_artifacts(doc: dict, out_dir: Path) -> tuple[Path, Path]:
    from .atomic import write_file
    jpath, mpath = Path(out_dir) / "bench.json", Path(out_dir) / "BENCH.md"
    write_file(jpath, json.dumps(_finite(doc), sort_keys=True, indent=2, default=_json_default, allow_nan=False)
               + "\n")
    write_file(mpath, markdown(doc))
    return jpath, mpath


def _finite(o):
    """NaN and infinities become None (JSON has no such numbers)."""
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    return o


def _json_default(o):
    import numpy as np
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    raise TypeError(f"not JSON: {type(o).__name__}")


def rich_tables(doc: dict) -> list:
    """The terminal's tables: one block per benchmark (its figures as rows: the planner's storage
    and, beside it, compact weights), then the published grids beside tileplan's choice, then the
    targets.

    Design decision: BENCH.md keeps one column per benchmark (a Markdown page scrolls sideways),
    but a terminal of 100 columns cannot hold 30-odd columns: rich shrank them until every number
    was cut. A block of three columns (figure, planner's storage, compact weights) fits 100
    columns: rich wraps a cell at spaces, never inside a word (a number is one word), and a
    figure neither run measured is left out of its block (an unrun compact column, a skipped
    benchmark: the block says only its status)."""
    from .report.terminal import PlainTable as Table      # fixture names as text, never markup
    from rich.text import Text

    from .report.terminal import plain
    title = f"tileplan bench{' --quick' if doc['mode'] == 'quick' else ''}"
    out = []
    results = doc["benchmarks"]
    for name, rec in results.items():
        compact = rec.get("compact")
        cols = {"planner": rec, **({"compact": compact} if compact else {})}
        block = Table(title=f"{title}: {name}", title_justify="left")
        block.add_column("figure", style="bold", ratio=3)
        block.add_column("planner's storage", ratio=2)
        if compact:
            block.add_column("compact weights", ratio=2)
        for label, cells in figure_rows(cols):
            if label != "status" and all(c in ("—", "none") for c in cells):
                continue
            block.add_row(label, *cells)
        out.append(block)
    pinned = pinned_rows(results)
    if pinned:
        t = Table(title=f"{title}: published grids beside tileplan's choice (both the IPU model's cycles)",
                  title_justify="left")
        for col in PINNED_COLUMNS:
            t.add_column(col, justify="right" if "cycles" in col or "/" in col else "left")
        for r in pinned:
            t.add_row(*r)
        out.append(t)
    targets = Table(title="tileplan bench: targets (cycles are the IPU model's, not hardware's)", title_justify="left")
    for col in TARGET_COLUMNS[:-1]:                  # (the reference goes under its target: six columns
        targets.add_column(col, justify="right" if col == "tileplan" else "left")     # of text do not fit 100)
    for r in target_rows(doc):
        cells = [c.replace("**", "") for c in r]
        first = plain(cells[0]) if cells[-1] == "—" else \
            Text.assemble(plain(cells[0]), "\n", plain(f"reference: {cells[-1]}"))
        targets.add_row(first, *cells[1:-1])
    out.append(targets)
    return [_whole_words(t) for t in out]


class _WholeWords:
    """A table rendered with every column at least as wide as its longest word and the rest of the
    width shared by how much each column's text wants beyond that; a cell then wraps at spaces
    only, so no number is cut.

    Design decision: rich's own shrinking narrows the widest column to the next one's width,
    below its longest word, and its cell is then cut with an ellipsis (a 100-column terminal
    showed "15,987,659-17,…" in the targets); the widths are worked out here instead, at the
    width the console renders at."""

    def __init__(self, table):
        self.table = table

    def __rich_console__(self, console, options):
        t = self.table
        pad = 2                                      # (a cell's padding: one a side)
        lines = [[ln for c in [col.header, *col._cells] for ln in str(c).split("\n")] for col in t.columns]
        low = [max((len(w) for ln in col for w in ln.split()), default=1) for col in lines]
        high = [max(max((len(ln) for ln in col), default=1), lo) for col, lo in zip(lines, low)]
        room = options.max_width - (len(t.columns) + 1) - pad * len(t.columns)
        widths = list(low)
        spare, want = room - sum(low), [hi - lo for lo, hi in zip(low, high)]
        if spare > 0 and sum(want):
            for k, w in enumerate(want):
                widths[k] += min(w, spare * w // sum(want))
        for col, w in zip(t.columns, widths):
            col.width = w
        yield t


def _whole_words(table):
    return _WholeWords(table)
