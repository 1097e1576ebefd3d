"""The shapes of the documents a report reads, checked before anything is drawn from them.

``tileplan report`` reads a package's plan.json and report.json (listed in its manifest: their
hashes say only that nobody edited them since the manifest was written, not that a writer made
them well), target.json (already built into a ``Target``), and, when ``tileplan validate`` has
run, validation.json and the per-tile trace validation.npz (outside the manifest: anything may
stand there). Each is checked here with ``tileplan.schema`` (types, ranges, list lengths), so a
damaged document is one ``TileplanError`` naming the file and the field, never a traceback
halfway through a table or a plot.

Design decision: every count the report loops over or draws is bound by what the package's
target and tile program say (checked when the package was loaded): ``tiles`` equals the
target's tile count (a plan claiming 10^9 tiles would make the tile grid run for minutes),
per-tile lists hold one value per tile, the run's steps are the program's steps, ops and
runner-ups are no more than the graph's ops and the planner writes, tile indices are tiles.
Cycle and byte figures are integers in ``[0, 2^53]`` (what a float, matplotlib and the page's
script hold exactly).

The trace is read only from the fixed name ``validation.npz`` in the package folder:
validation.json's ``trace`` field must be that name (or absent), never a path to read.
"""

from __future__ import annotations

from ..schema import EXACT, Bool, Enum, Int, List, Map, Num, Obj, Opt, Str, check

TRACE_FILE = "validation.npz"       # sim.validate.TRACE_FILE: the only trace a report reads
NAME = Str(4096)                    # an op, tensor, step or buffer name
TEXT = Str(1 << 16)                 # a candidate description, a reason, a log line
COUNT = Int(0, EXACT)               # cycles, bytes
RATIO = Num(0, 1e15)


def _phases() -> Obj:
    return Obj({"compute": COUNT, "exchange": COUNT, "sync": COUNT, "cycles": COUNT})


def plan_spec(tiles: int, ops: int, runner_ups: int) -> Obj:
    """plan.json (``planner.planjson.plan_to_json``): ``tiles`` of the target, at most ``ops``
    ops (the graph's) and ``runner_ups`` runner-ups per GEMM."""
    tile = Int(-1, tiles - 1)
    grid_n = Int(1, tiles)
    grid = Obj({"gm": grid_n, "gn": grid_n, "gk": grid_n, "gb": grid_n, "order": NAME, "reduction": NAME,
                "partials": NAME}, {"bias_in_reduction": Opt(Bool()), "epilogue": Opt(NAME)})
    memory = Obj({"standard": COUNT, "interleaved": COUNT, "total": COUNT})
    op = Obj({"name": NAME, "kind": NAME, "candidate": TEXT, "estimate": _phases(), "memory": memory,
              "layouts": Obj({"inputs": Map(TEXT, max_len=1024), "output": TEXT}), "grid": Opt(grid)},
             {"floor": Opt(COUNT), "floor_group": Opt(List(NAME, max_len=ops)), "fused_with": Opt(NAME), "absorbed": Opt(Bool()), "absorbed_into": Opt(NAME),
              "ipu": Opt(Int(0, tiles - 1))})
    conversion = Obj({"for_op": NAME, "tensor": NAME, "from": TEXT, "to": TEXT, "bytes": COUNT,
                      "estimate": _phases()})
    loser = Obj({"implementation": TEXT, "candidate": TEXT, "lost": TEXT,
                 "coarse": Obj({"cycles": COUNT, "memory": COUNT}),
                 "detailed": Opt(Obj({"cycles": COUNT, "memory": Obj({"total": COUNT})}))})
    totals = Obj({k: COUNT for k in ("cycles", "compute", "sync", "exchange", "bytes_moved", "total_memory",
                                     "standard", "interleaved")} | {"peak_tile": tile})
    prearranged = Obj({"tensor": NAME, "op": NAME, "layout": TEXT, "replicas": Int(0, tiles),
                       **{k: COUNT for k in ("bytes_per_tile_max", "bytes_total", "compact_bytes_per_tile_max",
                                             "compact_bytes_total")}})
    folded = Obj({"tensor": NAME, "shape": List(COUNT, max_len=64), "dtype": NAME, "value": TEXT})
    pinned = Obj({"cycles": COUNT, "own_cycles": COUNT, "pins": Map(TEXT, max_len=ops),
                  "own_choice": Map(TEXT, max_len=ops)})
    qkv = Obj({"groups": List(List(NAME, max_len=ops), max_len=ops), "mode": NAME, "chosen": NAME,
               "separate_cycles": Opt(COUNT), "fused_cycles": Opt(COUNT)})
    stage = Obj({"ipu": Int(0, tiles - 1), "first_op": NAME, "last_op": NAME, "ops": Int(0, ops), "cycles": COUNT,
                 "parameter_bytes": COUNT, "link_bytes_in": COUNT})
    stages = Obj({"mode": Enum("stages", "spread")},
                 {"interval_cycles": COUNT, "stages": List(stage, max_len=tiles), "chosen_by": NAME,
                  "stages_cycles": Opt(COUNT), "spread_cycles": Opt(COUNT), "not_fitting": Map(TEXT, max_len=2)})
    counts = List(COUNT, max_len=tiles)
    pipeline = Obj({"micro_batch": Int(1, EXACT), "micro_batches": Int(1, EXACT), "batch": Int(1, EXACT),
                    "stages": Int(1, tiles), "stage_cycles": counts, "link_cycles": counts,
                    "slot_cycles": List(COUNT, max_len=1 << 20), "sync_cycles": COUNT, "cycles": COUNT,
                    "run_ms": Num(0, EXACT), "latency_cycles": COUNT, "latency_ms": Num(0, EXACT), "images_per_second": Num(0, EXACT),
                    "steady_cycles": COUNT, "steady_images_per_second": Num(0, EXACT)})
    return Obj({"model": NAME, "target": NAME, "solver": NAME, "tiles": Int(tiles, tiles),
                "ops": List(op, max_len=ops), "conversions": List(conversion, max_len=16 * ops + 16),
                "totals": totals, "roofline_cycles": Num(0, EXACT), "ratio": Opt(RATIO),
                "runner_ups": Map(List(loser, max_len=runner_ups), max_len=ops)},
               {"weights": Opt(NAME), "model_floor": Opt(Obj({"cycles": COUNT}, {"roofline_ratio": Opt(RATIO),
                                                                                 "plan_ratio": Opt(RATIO)})),
                "prearranged": List(prearranged, max_len=16 * ops + 16),
                "folded": List(folded, max_len=16 * ops + 16), "pinned": Opt(pinned), "qkv": Opt(qkv),
                "stages": Opt(stages), "pipeline": Opt(pipeline)})


def report_spec(tiles: int, steps: int) -> Obj:
    """report.json (``lowering.compile``): per-tile memory of ``tiles`` tiles, at most ``steps``
    program steps (the tile program's) and a bounded multiple of them estimated (the estimate
    costs the plan's program before lowering groups independent exchanges into one step)."""
    step = Obj({"name": NAME, "kind": NAME, "cycles": COUNT, "sync": COUNT})
    per_tile = List(COUNT, length=tiles)
    return Obj({"memory": Obj({"tile_estimate": per_tile, "standard": per_tile, "interleaved": per_tile})},
               {"estimate_steps": List(step, max_len=16 * steps + 16), "program_steps": List(step, max_len=steps),
                "passes": List(TEXT, max_len=4096), "pass_log": List(TEXT, max_len=1 << 20),
                "program_cycles": Opt(COUNT), "estimate": Obj({"cycles": COUNT})})


def validation_spec(tiles: int, steps: int, outputs: int) -> Obj:
    """validation.json (``sim.validate.validation_record``) of a run of ``steps`` program steps on
    ``tiles`` tiles, with at most ``outputs`` outputs."""
    step = Obj({"name": NAME, "kind": Enum("compute", "exchange"), "cycles": COUNT, "sync": COUNT},
               {"bytes": COUNT})
    figure = Obj({"max_abs": Num(), "max_rel": Num(), "cosine": Num(), "passed": Bool()},
                 {"nonfinite": COUNT, "elements": COUNT, "nonfinite_got": COUNT, "nonfinite_want": COUNT,
                  "atol": Num(0)})
    return Obj({"outputs": Map(figure, max_len=outputs), "atol": Num(0), "rtol": Num(0), "cycles": COUNT,
                "compute": COUNT, "exchange": COUNT, "sync": COUNT, "steps": List(step, length=steps),
                "memory_peak": List(COUNT, length=tiles)},
               {"step_tile_cycles_max": List(COUNT, length=steps), "trace": Opt(Enum(TRACE_FILE))})


def target_spec() -> Obj:
    """The target's figures the report prints and divides by (``Target`` checked its own types)."""
    return Obj({"name": NAME, "description": TEXT, "tiles": Int(1, 1 << 16), "clock_hz": Num(1, 1e13),
                "sram_bytes": Int(1, EXACT), "reserve_bytes": Int(0, EXACT), "standard_bytes": Int(1, EXACT),
                "interleaved_bytes": Int(0, EXACT)})


__all__ = ["TRACE_FILE", "check", "plan_spec", "report_spec", "target_spec", "validation_spec"]
