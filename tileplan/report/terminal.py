"""The terminal cost report of a plan (rich tables), rendered from plan.json data.

``render(data, plan_seconds=None)`` takes the dict ``planner.planjson.plan_to_json``
makes (so a saved plan.json renders the same way) and returns rich renderables:

1. the plan, node by node in execution order: each op's chosen candidate with
   its cycles by phase and memory by class, and each conversion with the bytes
   it moves;
2. per GEMM, the best runner-up candidates with their coarse and detailed
   cycles and memory and why they lost;
3. the totals beside the roofline bound, the ratio, and the plan time.

``print_report(plan_or_data, console, plan_seconds)`` prints them.

``render_package(plan, report, validation)`` is the report of a compiled package
(``tileplan report DIR``): the same plan table, then each op's layouts and GEMM
grid, the runner-ups, the totals, the estimate against the lowered program, and,
when the package has been validated, the IPU model run (output errors, simulated
cycles by phase, how many steps simulate as estimated).
"""

from __future__ import annotations

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

RUNNER_UPS = 5          # per GEMM in the terminal


NO_ROOFLINE = "none (no MatMul)"


def roofline_ratio_text(cycles: float, roofline: float | None) -> str:
    """``2.20x the roofline bound 153,470``, or the roofline's absence (a graph without a MatMul has no
    AMP work, so no bound: elementwise ops are not in it)."""
    if not roofline:
        return f"roofline bound {NO_ROOFLINE}"
    return f"{cycles / roofline:.2f}x the roofline bound {roofline:,.0f}"


def _n(x) -> str:
    return "-" if x is None else f"{x:,}"


def plan_table(data: dict) -> Table:
    t = Table(title=f"Plan: {data['model']} on {data['target']} ({data['tiles']:,} tiles, solver {data['solver']})")
    for col, right in (("op", False), ("kind", False), ("chosen candidate", False), ("compute", True),
                       ("exchange", True), ("sync", True), ("cycles", True), ("floor", True), ("standard B", True),
                       ("interleaved B", True), ("total B", True)):
        t.add_column(col, justify="right" if right else "left", overflow="fold")
    convs: dict[str, list[dict]] = {}
    for c in data["conversions"]:
        convs.setdefault(c["for_op"], []).append(c)
    for op in data["ops"]:
        for c in convs.get(op["name"], []):
            e = c["estimate"]
            t.add_row("", "convert", f"{c['tensor']}: {c['from']} -> {c['to']} ({_n(c['bytes'])} B moved)",
                      _n(e["compute"]), _n(e["exchange"]), _n(e["sync"]), _n(e["cycles"]), "", "", "", "",
                      style="dim")
        e, m = op["estimate"], op["memory"]
        t.add_row(op["name"], op["kind"], op["candidate"], _n(e["compute"]), _n(e["exchange"]), _n(e["sync"]),
                  _n(e["cycles"]), _n(op.get("floor")), _n(m["standard"]), _n(m["interleaved"]), _n(m["total"]))
    return t


def runner_up_table(op: str, chosen: str, losers: list[dict], limit: int = RUNNER_UPS) -> Table:
    t = Table(title=f"{op}: chosen {chosen}", title_justify="left")
    for col, right in (("runner-up", False), ("coarse cycles", True), ("detailed cycles", True),
                       ("memory B", True), ("why it lost", False)):
        t.add_column(col, justify="right" if right else "left", overflow="fold")
    for r in losers[:limit]:
        d = r["detailed"]
        t.add_row(r["candidate"], _n(r["coarse"]["cycles"]), _n(d["cycles"]) if d else "-",
                  _n(d["memory"]["total"] if d else r["coarse"]["memory"]), r["lost"])
    return t


def totals_text(data: dict, plan_seconds: float | None) -> Text:
    tot = data["totals"]
    lines = [
        f"total: {tot['cycles']:,} cycles (compute {tot['compute']:,}, exchange {tot['exchange']:,}, "
        f"sync {tot['sync']:,}); {tot['bytes_moved']:,} B moved",
        f"memory peak: {tot['total_memory']:,} B on tile {tot['peak_tile']} "
        f"(standard {tot['standard']:,} B, interleaved {tot['interleaved']:,} B, worst tiles)",
        (f"roofline bound: {data['roofline_cycles']:,.0f} cycles; ratio {data['ratio']:.2f}x"
         if data['roofline_cycles'] else f"roofline bound: {NO_ROOFLINE}"),
    ]
    floor = data.get("model_floor")          # plans written before the floor existed have none
    if floor:
        lines.append(f"model floor: {floor['cycles']:,} cycles (no plan in the candidate space is faster); "
                     f"the plan is {floor['plan_ratio']:.2f}x the floor")
    if plan_seconds is not None:
        lines.append(f"plan time: {plan_seconds:.2f} s")
    return Text("\n".join(lines))


def render(data: dict, plan_seconds: float | None = None) -> Group:
    parts = [plan_table(data)]
    chosen = {op["name"]: op["candidate"] for op in data["ops"]}
    for op in chosen:                          # execution order (plan.json sorts its keys)
        losers = data["runner_ups"].get(op)
        if losers:
            parts.append(runner_up_table(op, chosen[op], losers))
    parts.append(totals_text(data, plan_seconds))
    return Group(*parts)


def _grid(g: dict | None) -> str:
    if not g:
        return "-"
    batch = f" b{g['gb']}" if g["gb"] > 1 else ""
    bias = ", bias fused into the reduction" if g.get("bias_in_reduction") else ""
    return (f"{g['gm']}x{g['gn']}x{g['gk']}{batch} order {g['order']}, reduction {g['reduction']}, "
            f"partials {g['partials']}{bias}")


def layouts_table(data: dict) -> Table:
    """Per op: the layouts the chosen candidate reads (parameters in their resident storage),
    the layout it writes, and the GEMM grid."""
    t = Table(title="Layouts and grids of the chosen candidates")
    for col in ("op", "input layouts", "output layout", "grid"):
        t.add_column(col, overflow="fold")
    for op in data["ops"]:
        ins = ", ".join(f"{name} {lay}" for name, lay in op["layouts"]["inputs"].items())
        t.add_row(op["name"], ins, op["layouts"]["output"], _grid(op["grid"]))
    return t


def validation_parts(validation: dict, report: dict, roofline: float) -> list:
    """The IPU model run of a validated package: output errors, cycles by phase, estimate per step."""
    t = Table(title="Validation run on the IPU model")
    for col in ("output", "max abs err", "max rel err", "cosine", "within tol"):
        t.add_column(col, justify="left" if col == "output" else "right")
    for name, fig in sorted(validation["outputs"].items()):
        t.add_row(name, f"{fig['max_abs']:.6f}", f"{fig['max_rel']:.4f}", f"{fig['cosine']:.6f}",
                  "[green]yes[/green]" if fig["passed"] else "[red]NO[/red]")
    v = validation
    est = {s["name"]: s["cycles"] + s["sync"] for s in report.get("estimate_steps", [])}
    steps = v["steps"]
    same = sum(est.get(s["name"]) == s["cycles"] + s["sync"] for s in steps)
    worst = max(steps, key=lambda s: abs(s["cycles"] + s["sync"] - est.get(s["name"], 0)), default=None)
    lines = [f"simulated: {v['cycles']:,} cycles (compute {v['compute']:,}, exchange {v['exchange']:,}, "
             f"sync {v['sync']:,}), {roofline_ratio_text(v['cycles'], roofline)}"]
    if report.get("estimate"):
        e = report["estimate"]["cycles"]
        lines.append(f"estimate / simulated = {e / max(v['cycles'], 1):.3f}; {same} of {len(steps)} steps "
                     f"simulate exactly as estimated")
        if worst is not None and same < len(steps):
            w = worst["cycles"] + worst["sync"]
            lines.append(f"largest step difference: {worst['name']} simulated {w:,}, "
                         f"estimated {est.get(worst['name'], 0):,}")
    peak = v["memory_peak"]
    if peak:
        lines.append(f"memory peak of the run: {max(peak):,} B on tile {peak.index(max(peak))}")
    return [t, Text("\n".join(lines))]


def render_package(data: dict, report: dict | None = None, validation: dict | None = None) -> Group:
    """The terminal report of a package: plan, layouts, runner-ups, totals, program, validation run."""
    parts = list(render(data).renderables)
    parts.insert(1, layouts_table(data))
    report = report or {}
    if report.get("program_cycles") is not None:
        steps = report.get("program_steps", [])
        parts.append(Text(f"lowered program: {len(steps)} steps, {report['program_cycles']:,} cycles "
                          f"(static count under the shared cycle model)"))
    if validation is not None:
        parts.extend(validation_parts(validation, report, data["roofline_cycles"]))
    else:
        parts.append(Text("not validated: run `tileplan validate DIR` to add the IPU model run", style="dim"))
    return Group(*parts)


def print_report(plan_or_data, console: Console | None = None, plan_seconds: float | None = None) -> None:
    data = plan_or_data
    if not isinstance(data, dict):
        from ..planner.planjson import plan_to_json
        plan_seconds = plan_or_data.plan_seconds if plan_seconds is None else plan_seconds
        data = plan_to_json(plan_or_data)
    (console or Console()).print(render(data, plan_seconds))
