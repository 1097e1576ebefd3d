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

Every function takes ``verbose``: by default the tables fit 100 columns without
wrapping a cell (candidates abbreviated to their grid or kernel, the reasons to
their first clause, long cells cut with an ellipsis, memory as the total only);
``verbose=True`` (``--verbose``) prints the full candidate names and reasons, the
memory by region and the bytes each conversion moves, wrapping as needed.
``legend_table()`` is the key to the notation (``tileplan report --legend``).

Names (of ops, tensors, models, targets, packages) and paths are printed as text, never as rich
markup nor as terminal control sequences: every table here is a ``PlainTable`` and every line
that holds a name is built with ``plain`` (see there).

``render_package(plan, report, validation)`` is the report of a compiled package
(``tileplan report DIR``): the same plan table, then each op's layouts and GEMM
grid, the runner-ups, the totals, the estimate against the lowered program, and,
when the package has been validated, the IPU model run (output errors, simulated
cycles by phase, how many steps simulate as estimated).
"""

from __future__ import annotations

import re

from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from ..checked import printable
from .legend import MEMORY


RUNNER_UPS = 5          # per GEMM in the terminal


NO_ROOFLINE = "none (no MatMul)"


def plain(*parts) -> Text:
    """Text shown exactly as written: each part a string or a ``(string, style)`` pair, with control
    and bidi characters escaped (``checked.printable``) and square brackets left as they are.

    Design decision: the one way a name or a path reaches the terminal. A string given to rich is
    parsed as markup (``m[/bold]x`` raises ``MarkupError``, ``x[bias]`` vanishes as an unknown
    style), and rich passes ESC through; a ``Text`` is never parsed, and ``printable`` makes every
    character visible. Names checked at load (``checked.name``) cannot hold a control character,
    but paths, file stems and the contents of a package read from disk can."""
    return Text.assemble(*((printable(p[0]), p[1]) if isinstance(p, tuple) else printable(p) for p in parts))


class PlainTable(Table):
    """A rich table whose string title and cells are ``plain`` text, never markup (a renderable
    cell, a ``Text`` with its own style, passes as it is)."""

    def __init__(self, *headers, title=None, **kw):
        super().__init__(*headers, title=plain(title) if isinstance(title, str) else title, **kw)

    def add_row(self, *cells, **kw) -> None:
        super().add_row(*(plain(c) if isinstance(c, str) else c for c in cells), **kw)


def roofline_ratio_text(cycles: float, roofline: float | None) -> str:
    """``2.20x the roofline bound 153,470``, or the roofline's absence (a graph without a MatMul has no
    AMP work, so no bound: elementwise ops are not in it)."""
    if not roofline:
        return f"roofline bound {NO_ROOFLINE}"
    return f"{cycles / roofline:.2f}x the roofline bound {roofline:,.0f}"


def _table(title: str, columns, verbose: bool, flexible: dict | None = None, **kw) -> Table:
    """A table; compact (default): light borders, no cell wraps; only the ``flexible`` columns
    (long text; name -> widest) are cut, with an ellipsis (``_pin`` keeps the others whole)."""
    flexible = flexible or {}
    if verbose:
        t = PlainTable(title=title, box=box.HEAVY_HEAD, **kw)
    else:
        t = PlainTable(title=title, box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False, **kw)
    for col, right in columns:
        if verbose:
            t.add_column(col, justify="right" if right else "left", overflow="fold")
        else:
            t.add_column(col, justify="right" if right else "left", no_wrap=True, overflow="ellipsis",
                         max_width=flexible.get(col))
    t.flexible = set(flexible)
    return t


def _width() -> int:
    """The width tables are printed at: ``$COLUMNS`` or the terminal's, else 160 (the CLI's console
    when its output is not a terminal)."""
    import shutil
    return shutil.get_terminal_size((160, 24)).columns


def _pin(t: Table) -> Table:
    """Fix every column but the flexible ones at its widest cell, and narrow the flexible ones so
    the whole table fits the output's width (``_width``): only long text is cut, never a number."""
    if t.box is box.SIMPLE_HEAD:
        fixed = 0
        for col in t.columns:
            if col.header not in t.flexible:
                col.min_width = max([len(str(col.header))] + [
                    (c if isinstance(c, Text) else Text.from_markup(str(c))).cell_len for c in col._cells])
                fixed += col.min_width
        flex = [col for col in t.columns if col.header in t.flexible]
        if flex:
            room = (_width() - fixed - 2 * len(t.columns)) // len(flex)  # (a column's padding: one a side)
            for col in flex:
                col.max_width = max(8, min(col.max_width or room, room))
    return t


def candidate_name(desc: str) -> str:
    """A candidate as its implementation, without the boundary layouts it reads and writes (those are
    in the layouts table): ``A:Grid(7x9 r1) grid 7x1x9 bijl rows fp16, B pre-arranged -> Iv(64,a16)``
    -> ``grid 7x1x9 bijl rows fp16, B pre-arranged``.

    Design decision: the one function naming a candidate in both reports, for the chosen one and
    its runner-ups alike, so a starred row names exactly the candidate the runner-ups are compared
    with (rows, bias fused, B pre-arranged and all). The operand prefixes (``A:L``, ``B:L``) are
    cut at the space after their balanced brackets, since a layout may hold a space
    (``Grid(7x9 r1)``); the output is what follows the last `` -> ``."""
    s = desc.rsplit(" -> ", 1)[0] if " -> " in desc else desc
    while re.match(r"^[A-Z][A-Za-z0-9]*:", s):
        depth = 0
        for i, ch in enumerate(s):
            depth += ch in "([{"
            depth -= ch in ")]}"
            if ch == " " and depth <= 0:
                s = s[i + 1:]
                break
        else:
            break
    return s


def short_candidate(desc: str) -> str:
    """``candidate_name`` abbreviated for the compact tables: ``grid 4x5x3 bjli rows fp16 +bias``."""
    s = candidate_name(desc)
    return s.replace(", bias fused into the reduction", " +bias").replace("fused into the ", "fused: ")


_REASONS = [
    (re.compile(r"^selection: ([\d,]+) cycles slower than the chosen candidate on its own$"), r"selection: +\1 cycles"),
    (re.compile(r"^selection: ([+-][\d,]+) cycles against the chosen candidate on its own, but it adds the bias "
                r"in its reduction.*$"), r"selection: \1; whole graph slower"),
    (re.compile(r"^selection: ([+-][\d,]+) cycles against the chosen candidate on its own, but it leaves the "
                r"bias to the Add.*$"), r"selection: \1; whole graph slower"),
    (re.compile(r"^detailed ([\d,]+) cycles, ([\d,]+) B: dominated by (.*?) \(.*$"), r"dominated by \3"),
]


def short_reason(reason: str) -> str:
    """Why a runner-up lost, in a few words (``--verbose`` prints it whole)."""
    for pattern, repl in _REASONS:
        if pattern.match(reason):
            return pattern.sub(repl, reason)
    return reason.split("; ")[0]


def _n(x) -> str:
    return "-" if x is None else f"{x:,}"


def floor_groups(ops: list[dict]) -> dict[str, dict]:
    """Per op of plan.json with a floor, what its floor is compared with: ``{"ops": [names],
    "floor": cycles, "cycles": the chosen candidates' cycles of those ops}``; an op whose work a
    GEMM's floor covers (its epilogue chain: ``floor_group``) gets ``{"in": that GEMM}`` instead.

    Design decision: a floor is shown beside the cycles of the same work. A GEMM's floor covers
    its epilogue chain (the bias Add, GeLU, Cast its reducers may do), whether the plan fused the
    chain or ran it as a pass of its own, so its floor stands against the GEMM's and the chain's
    cycles together; compared with the GEMM's cycles alone it may exceed them and read as no
    bound. Both reports print these figures; a test checks floor <= cycles on the fixtures."""
    cycles = {op["name"]: op["estimate"]["cycles"] for op in ops}
    out: dict[str, dict] = {}
    for op in ops:
        if op.get("floor") is None:
            continue
        group = [n for n in (op.get("floor_group") or [op["name"]]) if n in cycles]
        if op["name"] not in group:
            group.insert(0, op["name"])
        out.setdefault(op["name"], {"ops": group, "floor": op["floor"], "cycles": sum(cycles[n] for n in group)})
        for n in group:
            if n != op["name"]:
                out[n] = {"in": op["name"]}
    return out


def floor_cell(groups: dict, name: str) -> str:
    """The floor column's cell: the floor, marked ``*`` when it covers other ops too (a note says
    which), or ``in GEMM`` for an op whose work another op's floor covers."""
    g = groups.get(name)
    if g is None:
        return "-"
    if "in" in g:
        return f"in {g['in']}"
    return f"{g['floor']:,}" + (" *" if len(g["ops"]) > 1 else "")


def floor_notes(data: dict) -> list[str]:
    """One line per floor that covers several ops: which, and the floor against their cycles."""
    return [f"* floor of {', '.join(g['ops'])} together (a GEMM and its epilogue chain, fused or done apart): "
            f"{g['floor']:,} against their {g['cycles']:,} cycles"
            for g in floor_groups(data["ops"]).values() if len(g.get("ops", ())) > 1]


def plan_table(data: dict, verbose: bool = False) -> Table:
    title = f"Plan: {data['model']} on {data['target']} ({data['tiles']:,} tiles, solver {data['solver']})"
    if verbose:
        cols = (("op", False), ("kind", False), ("chosen candidate", False), ("compute", True),
                ("exchange", True), ("sync", True), ("cycles", True), ("floor", True), ("standard B", True),
                ("interleaved B", True), ("total B", True))
    else:
        cols = (("op", False), ("kind", False), ("chosen", False), ("compute", True), ("exch", True),
                ("sync", True), ("cycles", True), ("floor", True), ("memory B", True))
    t = _table(title, cols, verbose, flexible={"chosen": 34})
    convs: dict[str, list[dict]] = {}
    for c in data["conversions"]:
        convs.setdefault(c["for_op"], []).append(c)
    floors = floor_groups(data["ops"])
    for op in data["ops"]:
        for c in convs.get(op["name"], []):
            e = c["estimate"]
            what = (f"{c['tensor']}: {c['from']} -> {c['to']} ({_n(c['bytes'])} B moved)" if verbose
                    else f"{c['tensor']}: {c['from']} -> {c['to']}")
            t.add_row("", "convert", what, _n(e["compute"]), _n(e["exchange"]), _n(e["sync"]), _n(e["cycles"]),
                      *([""] * (4 if verbose else 2)), style="dim")
        e, m = op["estimate"], op["memory"]
        mem = (_n(m["standard"]), _n(m["interleaved"]), _n(m["total"])) if verbose else (_n(m["total"]),)
        t.add_row(op["name"], op["kind"], op["candidate"] if verbose else short_candidate(op["candidate"]),
                  _n(e["compute"]), _n(e["exchange"]), _n(e["sync"]), _n(e["cycles"]), floor_cell(floors, op["name"]), *mem)
    return _pin(t)


def runner_up_table(op: str, chosen: str, losers: list[dict], limit: int = RUNNER_UPS,
                    verbose: bool = False) -> Table:
    title = f"{op}: chosen {chosen if verbose else short_candidate(chosen)}"
    cols = (("runner-up", False), ("coarse cycles" if verbose else "coarse", True),
            ("detailed cycles" if verbose else "detailed", True), ("memory B", True), ("why it lost", False))
    t = _table(title, cols, verbose, flexible={"runner-up": 32, "why it lost": 40}, title_justify="left")
    for r in losers[:limit]:
        d = r["detailed"]
        t.add_row(r["candidate"] if verbose else short_candidate(r["candidate"]), _n(r["coarse"]["cycles"]),
                  _n(d["cycles"]) if d else "-", _n(d["memory"]["total"] if d else r["coarse"]["memory"]),
                  r["lost"] if verbose else short_reason(r["lost"]))
    return _pin(t)


def totals_text(data: dict, plan_seconds: float | None) -> Text:
    tot = data["totals"]
    lines = [
        f"total: {tot['cycles']:,} cycles (compute {tot['compute']:,}, exchange {tot['exchange']:,}, "
        f"sync {tot['sync']:,}); {tot['bytes_moved']:,} B moved",
        f"memory peak ({MEMORY['estimate']}): {tot['total_memory']:,} B on tile {tot['peak_tile']} "
        f"(standard {tot['standard']:,} B, interleaved {tot['interleaved']:,} B, worst tiles)",
        (f"roofline bound: {data['roofline_cycles']:,.0f} cycles; ratio {data['ratio']:.2f}x"
         if data['roofline_cycles'] else f"roofline bound: {NO_ROOFLINE}"),
    ]
    floor = data.get("model_floor")          # plans written before the floor existed have none
    if floor:                                # (a plan of no device ops has a floor of 0 and no ratio)
        lines.append(f"model floor: {floor['cycles']:,} cycles (no plan in the candidate space is faster)"
                     + (f"; the plan is {floor['plan_ratio']:.2f}x the floor" if floor["plan_ratio"] else ""))
    for e in data.get("folded", []):         # outputs the planner folded: the host writes them
        lines.append(f"folded at plan time: {e['tensor']}: {e['dtype']}[{'x'.join(map(str, e['shape']))}] = "
                     f"{e['value']} (host data, no tile memory, 0 cycles)")
    if data.get("weights") == "compact":    # (plans written before the option have none: the planner's)
        lines.append("weights: compact (--weights compact: every weight in its compact resident storage, none "
                     "pre-arranged)")
    for e in data.get("prearranged", []):   # weights stored as their grid reads them
        lines.append(f"pre-arranged: {e['tensor']} (read by {e['op']}) as {e['layout']}: {e['bytes_per_tile_max']:,} B "
                     f"on its fullest tile, {e['bytes_total']:,} B in all, against {e['compact_bytes_per_tile_max']:,}"
                     f" B and {e['compact_bytes_total']:,} B compact")
    pinned = data.get("pinned")
    if pinned:
        delta = pinned["cycles"] - pinned["own_cycles"]
        lines.append(f"pinned: {', '.join(f'{op}={spec}' for op, spec in pinned['pins'].items())}: "
                     f"{pinned['cycles']:,} cycles against the planner's own choice's {pinned['own_cycles']:,} "
                     f"({delta:+,}; own: {'; '.join(f'{op}: {c}' for op, c in pinned['own_choice'].items())})")
    qkv = data.get("qkv")                   # fused QKV (planner.qkv): the form chosen, both forms' cycles
    if qkv:
        lines.append(qkv_line(qkv))
    lines.extend(stage_lines(data.get("stages")))
    if data.get("pipeline"):                # micro-batches (planner.pipeline): the schedule's figures
        from ..planner.pipeline import summary
        lines.append(summary(data["pipeline"]))
    if plan_seconds is not None:
        lines.append(f"plan time: {plan_seconds:.2f} s")
    return Text("\n").join(plain(line) for line in lines)


def stage_lines(stages: dict | None) -> list[str]:
    """A multi-IPU plan's form (``planner.stages``): pipeline stages, one line per stage (its IPU, its
    ops, cycles, parameter bytes and the bytes it receives over the IPU-Links), or spread."""
    if not stages:
        return []
    how = ""
    if stages.get("chosen_by") == "auto":
        costs = ", ".join(f"{form} {stages[f'{form}_cycles']:,}" if stages.get(f"{form}_cycles") is not None
                          else f"{form} does not fit" for form in ("stages", "spread"))
        how = f" (the cheaper; cycles: {costs})"
    if stages["mode"] != "stages":
        return [f"IPUs: one graph spread over every IPU's tiles{how}"]
    out = [f"IPUs: {len(stages['stages'])} pipeline stages{how}; pipelined interval "
           f"{stages['interval_cycles']:,} cycles (the slowest stage)"]
    for s in stages["stages"]:
        recv = f"; receives {s['link_bytes_in']:,} B over the IPU-Links" if s["link_bytes_in"] else ""
        out.append(f"  stage {s['ipu']} on IPU {s['ipu']}: ops {s['first_op']} .. {s['last_op']} ({s['ops']} ops), "
                   f"{s['cycles']:,} cycles, {s['parameter_bytes']:,} B of parameters{recv}")
    return out


def qkv_line(qkv: dict) -> str:
    """One line: which form of the fusable GEMM groups the plan has, and what each form costs. A
    tower's groups (one per layer) are named by the first and the last, with their count, so the
    line stays a line; plan.json holds them all."""
    names = ["+".join(g) for g in qkv["groups"]]
    groups = "; ".join(names) if len(names) <= 3 else f"{len(names)} groups: {names[0]}; ...; {names[-1]}"
    costs = ", ".join(f"{form} {qkv[f'{form}_cycles']:,}" if qkv[f"{form}_cycles"] is not None else f"{form} not planned"
                      for form in ("separate", "fused"))
    how = "forced" if qkv["mode"] != "auto" else "the cheaper"
    return f"fused QKV ({groups}): {qkv['chosen']} ({how}); cycles: {costs}"


def render(data: dict, plan_seconds: float | None = None, verbose: bool = False) -> Group:
    parts = [plan_table(data, verbose)]
    notes = floor_notes(data)
    if notes:
        parts.append(Text("\n").join(plain((line, "dim")) for line in notes))
    chosen = {op["name"]: op["candidate"] for op in data["ops"]}
    for op in chosen:                          # execution order (plan.json sorts its keys)
        losers = data["runner_ups"].get(op)
        if losers:
            parts.append(runner_up_table(op, chosen[op], losers, verbose=verbose))
    parts.append(totals_text(data, plan_seconds))
    return Group(*parts)


def _grid(g: dict | None) -> str:
    if not g:
        return "-"
    batch = f" b{g['gb']}" if g["gb"] > 1 else ""
    bias = ", bias fused into the reduction" if g.get("bias_in_reduction") else ""
    epi = f", {g['epilogue']} in the reduction" if g.get("epilogue") else ""
    return (f"{g['gm']}x{g['gn']}x{g['gk']}{batch} order {g['order']}, reduction {g['reduction']}, "
            f"partials {g['partials']}{bias}{epi}")


def _short_grid(g: dict | None) -> str:
    if not g:
        return "-"
    batch = f"{g['gb']}x" if g["gb"] > 1 else ""
    red = "" if g["reduction"] == "none" else f" {g['reduction']}"
    return f"{batch}{g['gm']}x{g['gn']}x{g['gk']} {g['order']}{red} {g['partials']}" + (
        " +bias" if g.get("bias_in_reduction") else "") + (" +epilogue" if g.get("epilogue") else "")


def layouts_table(data: dict, verbose: bool = False) -> Table:
    """Per op: the layouts the chosen candidate reads (parameters in their resident storage),
    the layout it writes, and the GEMM grid."""
    t = _table("Layouts and grids of the chosen candidates",
               (("op", False), ("input layouts", False), ("output layout", False), ("grid", False)), verbose,
               flexible={"input layouts": 40, "output layout": 20, "grid": 28})
    for op in data["ops"]:
        ins = ", ".join(f"{name} {lay}" for name, lay in op["layouts"]["inputs"].items())
        t.add_row(op["name"], ins, op["layouts"]["output"], _grid(op["grid"]) if verbose else _short_grid(op["grid"]))
    return _pin(t)


def legend_table() -> Table:
    """The key to the notation of the reports (``report.legend``)."""
    from .legend import LEGEND
    t = PlainTable(title="Notation", box=box.SIMPLE_HEAD)
    t.add_column("", style="dim")
    t.add_column("notation", style="bold", no_wrap=True)
    t.add_column("meaning", overflow="fold")
    for group, notation, meaning in LEGEND:
        t.add_row(group, notation, meaning)
    return t


def error_table(title: str, outputs: dict, atol: float, rtol: float) -> Table:
    """Each output's errors against the reference (scientific notation: FP32 errors are tiny) and
    whether it is within ``|got - want| <= atol + rtol |want|``."""
    t = PlainTable(title=title, box=box.SIMPLE_HEAD)
    for col in ("output", "max abs err", "max rel err", "cosine", "atol", "rtol", "within tol"):
        t.add_column(col, justify="left" if col == "output" else "right", no_wrap=True)
    for name, fig in sorted(outputs.items()):
        ok = Text("yes", style="green") if fig["passed"] else Text("NO", style="red")
        if fig.get("nonfinite"):        # never a figure that looks like a pass beside NaN or inf values
            t.add_row(name, f"{fig['nonfinite']:,} of {fig.get('elements', fig['nonfinite']):,} values non-finite "
                            f"(output {fig.get('nonfinite_got', 0):,}, reference {fig.get('nonfinite_want', 0):,})",
                      "-", "-", f"{fig.get('atol', atol):g}", f"{rtol:g}", ok)
            continue
        t.add_row(name, f"{fig['max_abs']:.3e}", f"{fig['max_rel']:.3e}", f"{fig['cosine']:.6f}",
                  f"{fig.get('atol', atol):g}", f"{rtol:g}", ok)
    return t


def validation_parts(validation: dict, report: dict, roofline: float) -> list:
    """The IPU model run of a validated package: output errors, cycles by phase, estimate per step."""
    t = error_table("Validation run on the IPU model", validation["outputs"], validation["atol"],
                    validation["rtol"])
    v = validation
    est = {s["name"]: s["cycles"] + s["sync"] for s in report.get("estimate_steps", [])}
    steps = v["steps"]
    same = sum(est.get(s["name"]) == s["cycles"] + s["sync"] for s in steps)
    worst = max(steps, key=lambda s: abs(s["cycles"] + s["sync"] - est.get(s["name"], 0)), default=None)
    lines = [f"simulated: {v['cycles']:,} cycles (compute {v['compute']:,}, exchange {v['exchange']:,}, "
             f"sync {v['sync']:,}), {roofline_ratio_text(v['cycles'], roofline)}"]
    if report.get("estimate") and steps:      # (no steps: nothing runs on the device, no ratio)
        e = report["estimate"]["cycles"]
        lines.append(f"estimate / simulated = {e / max(v['cycles'], 1):.3f}; {same} of {len(steps)} steps "
                     f"simulate exactly as estimated")
        if worst is not None and same < len(steps):
            w = worst["cycles"] + worst["sync"]
            lines.append(f"largest step difference: {worst['name']} simulated {w:,}, "
                         f"estimated {est.get(worst['name'], 0):,}")
    peak = v["memory_peak"]
    if peak:
        lines.append(f"memory peak ({MEMORY['simulated']}): {max(peak):,} B on tile {peak.index(max(peak))}")
    return [t, Text("\n").join(plain(line) for line in lines)]


def render_package(data: dict, report: dict | None = None, validation: dict | None = None,
                   verbose: bool = False, allocation: list[int] | None = None) -> Group:
    """The terminal report of a package: plan, layouts, runner-ups, totals, program, validation run
    (``allocation``: the allocation's peak per tile, ``html.allocation_peaks``)."""
    parts = list(render(data, verbose=verbose).renderables)
    parts.insert(2 if floor_notes(data) else 1, layouts_table(data, verbose))    # after the plan and its notes
    report = report or {}
    if report.get("program_cycles") is not None:
        steps = report.get("program_steps", [])
        parts.append(plain(f"lowered program: {len(steps)} steps, {report['program_cycles']:,} cycles "
                          f"(static count under the shared cycle model)"))
    if allocation:
        worst = max(range(len(allocation)), key=lambda i: (allocation[i], -i))
        parts.append(plain(f"memory peak ({MEMORY['allocation']}): {allocation[worst]:,} B on tile {worst} (highest "
                           f"address used in each region, summed; `tileplan report --legend`: why the figures differ)"))
    if validation is not None:
        parts.extend(validation_parts(validation, report, data["roofline_cycles"]))
    else:
        parts.append(Text("not validated: run `tileplan validate DIR` to add the IPU model run", style="dim"))
    return Group(*parts)


def print_report(plan_or_data, console: Console | None = None, plan_seconds: float | None = None,
                 verbose: bool = False) -> None:
    data = plan_or_data
    if not isinstance(data, dict):
        from ..planner.planjson import plan_to_json
        plan_seconds = plan_or_data.plan_seconds if plan_seconds is None else plan_seconds
        data = plan_to_json(plan_or_data)
    (console or Console()).print(render(data, plan_seconds, verbose))


def _signed(x) -> str:
    return "-" if x is None else f"{x:+,}"


def compare_table(a, b, verbose: bool = False) -> Group:
    """Two packages (``html.ReportData``) side by side: per op and per step, cycles and memory, b - a."""
    from . import compare
    la, lb = package_label(a), package_label(b)
    t = _table(f"Compare per op: A = {la}, B = {lb}",
               (("op", False), ("A cycles", True), ("B cycles", True), ("B - A", True), ("B / A", True),
                ("A memory B", True), ("B memory B", True), ("B - A ", True)), verbose)
    for r in compare.op_rows(a, b):
        t.add_row(r["name"], _n(r["cycles_a"]), _n(r["cycles_b"]), _signed(r["cycles_delta"]),
                  "-" if r["cycles_ratio"] is None else f"{r['cycles_ratio']:.2f}",
                  _n(r["memory_a"]), _n(r["memory_b"]), _signed(r["memory_delta"]))
    tot = compare.totals(a, b)
    t.add_row("total", _n(tot["cycles_a"]), _n(tot["cycles_b"]), _signed(tot["cycles_delta"]),
              "-" if tot["cycles_ratio"] is None else f"{tot['cycles_ratio']:.2f}",
              _n(tot["memory_a"]), _n(tot["memory_b"]), _signed(tot["memory_delta"]), style="bold")
    source, steps = compare.step_rows(a, b)
    s = _table(f"Compare per step ({source}, cycles incl. sync)",
               (("step", False), ("A", True), ("B", True), ("B - A", True)), verbose, flexible={"step": 40})
    for r in steps:
        if verbose or r["cycles_delta"] != 0:
            s.add_row(r["name"], _n(r["cycles_a"]), _n(r["cycles_b"]), _signed(r["cycles_delta"]))
    same = sum(r["cycles_delta"] == 0 for r in steps)
    note = plain((f"{same} of {len(steps)} steps take the same cycles in both" + ("" if verbose else
                 " (not listed; --verbose lists every step)"), "dim"))
    return Group(_pin(t), _pin(s), note)


def package_label(d) -> str:
    """How a report names a package: its model and the first digits of its manifest's SHA-256
    (never its folder, so the same package reads the same wherever it lives)."""
    return f"{d.plan['model']} @{d.manifest_sha[:8]}"
