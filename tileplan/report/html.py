"""The HTML cost report of a package: one self-contained file.

``load_report_data(DIR)`` reads a package through ``lowering.package.load_package``
(so a folder that is not a package, or one whose files do not match its manifest,
is a ``TileplanError``) plus its ``validation.json`` when ``tileplan validate`` has
run. ``render_html(data)`` fills ``templates/report.html.j2``; ``write_html`` writes
the page atomically.

The page has no external resources: CSS in a ``<style>`` element, one inline
script (``templates/report.js``, plain JS drawing SVG), its data in one inline
``application/json`` element (``page_data``), system fonts only, and the static
plots as inline ``<svg>`` made by ``report.plots``. It never names the folder it
was made from and carries no time, so the same package gives the same bytes
wherever it lives. Per-tile data (liveness by class, the run's cycles, exchange
bytes: ``report.views``) is kept exact; for a 1472-tile SigLIP layer the page
stays near 1-2 MB.

Sections: totals against the roofline bound; the plan per op (chosen candidate,
layouts, grid, cycles by phase, memory by class) and the conversions; per GEMM
the Pareto frontier of its candidates and the runner-up table with why each
lost; the per-tile memory map (total, standard, interleaved: the planner's peaks
from report.json); and, for a validated package, the outputs' error figures, the
superstep timeline of the IPU model run and estimate vs simulated per step.
Interactive views (the script): a tile map (hover a tile for its numbers, click
it to chart its liveness; a metric and a step to colour by), liveness per step
of the worst and the chosen tile by class, the BSP execution trace (tiles x
steps, zoomable), and the compare selector. Server-side tables: compute sets and
vertices per step, exchanges with the largest flows, tile balance per step, the
legend of the notation, and the per op / per step comparison with other packages.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import jinja2

from ..errors import TileplanError
from . import plots
from .terminal import candidate_name, floor_groups


@dataclass(frozen=True)
class ReportData:
    """What a report is made from: the package's JSON files, already checked."""

    plan: dict                  # plan.json
    report: dict                # report.json (estimate and program steps, memory per tile)
    target: dict                # target.json
    validation: dict | None     # validation.json, when the package has been validated
    manifest_sha: str           # SHA-256 of manifest.json: names the package contents
    program: object = None      # the TileProgram (lowering.tile_program)
    tile_cycles: object = None  # int32 [steps, tiles] of the run (validation.npz), when recorded


def load_report_data(path: str | Path) -> ReportData:
    """Read a package for its report: every document checked (``report.documents``) before use."""
    import dataclasses
    from ..lowering.package import load_package
    from ..planner.planjson import RUNNER_UPS
    from . import documents as docs

    pkg = load_package(path)
    if not pkg.report:
        raise TileplanError(f"{pkg.path}: the package has no report.json (compiled by an older tileplan?)")
    tp = pkg.program
    target = docs.check(dataclasses.asdict(pkg.target), docs.target_spec(), str(pkg.path / "target.json"))
    if target["sram_bytes"] <= target["reserve_bytes"] or tp.tiles != target["tiles"]:
        raise TileplanError(f"{pkg.path / 'target.json'}: {target['tiles']:,} tiles of {target['sram_bytes']:,} B "
                            f"with a {target['reserve_bytes']:,} B reserve do not describe the program's "
                            f"{tp.tiles:,} tiles")
    tiles, steps, ops = tp.tiles, len(tp.steps), len(pkg.graph.ops)
    docs.check(pkg.plan, docs.plan_spec(tiles, ops, RUNNER_UPS), str(pkg.path / "plan.json"))
    docs.check(pkg.report, docs.report_spec(tiles, steps), str(pkg.path / "report.json"))
    validation, cycles = _load_validation(pkg.path, tiles, steps, len(pkg.graph.tensors))
    sha = hashlib.sha256(_manifest_bytes(pkg.path)).hexdigest()
    return ReportData(pkg.plan, pkg.report, target, validation, sha, tp, cycles)


def _manifest_bytes(root: Path) -> bytes:
    from ..safeio import LIMITS, read_file
    return read_file(root / "manifest.json", LIMITS["json"], "package manifest")


def _load_validation(root: Path, tiles: int, steps: int, outputs: int):
    """(validation.json, the trace's int array [steps, tiles] or None), or (None, None) when the
    package has not been validated.

    Design decision: validation.json and validation.npz sit outside the manifest, so they are
    read as untrusted: through ``tileplan.safeio`` (a regular file of bounded size: a FIFO or a
    device in their place is refused, never waited on), the record schema-checked against the
    program it claims to have run, and the trace read only from its fixed name in the package
    folder (the record's ``trace`` field may say that name or nothing; it is never a path)."""
    import os
    from ..safeio import load_json_object, load_npz
    from . import documents as docs

    vpath = root / "validation.json"
    if not os.path.lexists(vpath):
        return None, None
    # The record holds a few numbers per step and per tile, and the outputs' figures.
    limit = 1 << 20 | 256 * (steps + tiles + outputs) + 8 * 4096 * steps
    validation = load_json_object(vpath, limit, "validation record")
    docs.check(validation, docs.validation_spec(tiles, steps, outputs), str(vpath))
    if not validation.get("trace"):
        return validation, None
    tpath = root / docs.TRACE_FILE
    arrays = load_npz(tpath, 8 * steps * tiles + 4096, "validation trace")
    cycles = arrays.get("tile_cycles")
    if cycles is None or cycles.dtype.kind not in "iu" or cycles.shape != (steps, tiles):
        what = "no tile_cycles array" if cycles is None else f"tile_cycles of {cycles.dtype} {list(cycles.shape)}"
        raise TileplanError(f"{tpath}: damaged validation trace ({what}; the run has {steps} steps on {tiles} "
                            f"tiles); run tileplan validate again")
    if cycles.size and (int(cycles.min()) < 0 or int(cycles.max()) > 1 << 53):
        raise TileplanError(f"{tpath}: damaged validation trace (cycles outside [0, 2^53]); "
                            f"run tileplan validate again")
    return validation, cycles


# ---- the page's content ------------------------------------------------------------------

def _slug(name: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in name)


def step_rows(data: ReportData) -> list[dict]:
    """Per simulated step: its kind, the planner's estimate and the simulated cycles (each incl. sync)."""
    est = {s["name"]: s for s in data.report.get("estimate_steps", [])}
    rows = []
    for s in data.validation["steps"]:
        e = est.get(s["name"])
        sim = s["cycles"] + s["sync"]
        e_total = e["cycles"] + e["sync"] if e else None
        kind = "local copy" if e and e["kind"] == "local_copy" else s["kind"]
        rows.append({"name": s["name"], "kind": kind, "bytes": s.get("bytes", 0), "sync": s["sync"],
                     "estimate": e_total, "simulated": sim,
                     "delta": None if e_total is None else sim - e_total,
                     "ratio": None if not e_total else sim / e_total})
    return rows


def memory_panels(data: ReportData) -> list[tuple[str, list[int], int]]:
    """Per tile, each memory figure under its one label (``legend.MEMORY``): the planner's estimate
    (report.json, by region too), the allocation's peak (the tile program's addresses), and the
    IPU model's simulated peak when validated."""
    from . import views
    from .legend import MEMORY
    mem, t = data.report["memory"], data.target
    usable = t["sram_bytes"] - t["reserve_bytes"]
    std_cap, il_cap = t["standard_bytes"] - t["reserve_bytes"], t["interleaved_bytes"]
    panels = [
        (f"{MEMORY['estimate']}: both regions", mem["tile_estimate"], usable),
        (f"{MEMORY['estimate']}: standard region", mem["standard"], std_cap),
        (f"{MEMORY['estimate']}: interleaved region", mem["interleaved"], il_cap),
    ]
    if data.program is not None:
        alloc = views.allocation(data.program, t)
        panels.append((f"{MEMORY['allocation']}: both regions", [int(x) for x in alloc["total"]], usable))
    if data.validation is not None and len(data.validation["memory_peak"]) == len(mem["tile_estimate"]):
        panels.append((MEMORY["simulated"], data.validation["memory_peak"], usable))
    return panels


def allocation_peaks(data: ReportData) -> list[int] | None:
    """The allocation's peak per tile (``views.allocation``), or None without a tile program."""
    from . import views
    return None if data.program is None else [int(x) for x in views.allocation(data.program, data.target)["total"]]


def memory_figures(data: ReportData) -> list[dict]:
    """One row per memory figure: its label, its worst tile and bytes there, and where it comes from."""
    from . import views
    from .legend import MEMORY
    rows = []

    def row(key, values, source):
        if len(values):
            worst = max(range(len(values)), key=lambda i: (int(values[i]), -i))
            rows.append({"key": key, "label": MEMORY[key], "bytes": int(values[worst]), "tile": worst,
                         "source": source})
    row("estimate", data.report["memory"]["tile_estimate"], "report.json: the planned program's liveness")
    if data.program is not None:
        row("allocation", views.allocation(data.program, data.target)["total"],
            "the tile program's addresses (highest address used per region)")
    if data.validation is not None:
        row("simulated", data.validation["memory_peak"], "validation.json: the IPU model run")
    return rows


def page_data(data: ReportData, live: dict, ex: list[dict]) -> dict:
    """The JSON the page's script draws from: per tile and step, exact integers."""
    from .legend import MEMORY
    tp = data.program
    v = data.validation
    rows, cols = plots.tile_grid(tp.tiles)
    steps = [{"name": st.name, "kind": "compute" if hasattr(st, "groups") else "exchange"} for st in tp.steps]
    doc = {"tiles": tp.tiles, "grid": [rows, cols], "steps": steps, "classes": live["classes"],
           "live": live["live"].tolist(), "worst": live["worst_tile"],
           "always": [int(x) for x in live["always_bytes"]],
           "memory": [int(x) for x in (v["memory_peak"] if v else live["live"].sum(axis=0).max(axis=0))],
           "memory_label": MEMORY["simulated"] if v else "most bytes live at once",
           "sent": {str(e["step"]): e["sent"].tolist() for e in ex},
           "received": {str(e["step"]): e["received"].tolist() for e in ex},
           "trace": None, "sync": None}
    if data.tile_cycles is not None and len(v["steps"]) == len(steps):
        doc["trace"] = data.tile_cycles.tolist()
        doc["sync"] = [s["sync"] for s in v["steps"]]
    return doc


def compare_context(data: ReportData, others: list[ReportData]) -> list[dict]:
    from . import compare
    from .terminal import package_label
    out = []
    for i, o in enumerate(others):
        source, steps = compare.step_rows(data, o)
        out.append({"index": i, "label": package_label(o), "ops": compare.op_rows(data, o),
                    "totals": compare.totals(data, o), "step_source": source, "steps": steps})
    return out


def context(data: ReportData, compare: list[ReportData] = ()) -> dict:
    """Everything the template shows, as plain values and SVG strings."""
    from .._version import __version__
    from . import views
    from .legend import LEGEND, MEMORY
    from .terminal import package_label

    plan, report, v = data.plan, data.report, data.validation
    ops = plan["ops"]
    convs: dict[str, list[dict]] = {}
    for c in plan["conversions"]:
        convs.setdefault(c["for_op"], []).append(c)
    simulated = ({k: v[k] for k in ("compute", "exchange", "sync", "cycles")} if v else None)
    gemms = []
    for op in ops:
        losers = plan["runner_ups"].get(op["name"])
        if losers is None:
            continue
        gemms.append({"op": op, "losers": losers,
                      "frontier": plots.frontier_plot(op, losers, f"frontier-{_slug(op['name'])}")})
    ctx = {
        "version": __version__,
        "plan": plan,
        "target": data.target,
        "totals": plan["totals"],
        "roofline": plan["roofline_cycles"],
        "ops": ops,
        "convs": convs,
        "floors": floor_groups(ops),
        "conversions": plan["conversions"],
        "gemms": gemms,
        "manifest_sha": data.manifest_sha,
        "passes": report.get("passes", []),
        "pass_log": report.get("pass_log", []),
        "program_cycles": report.get("program_cycles"),
        "colours": plots.COLOURS,
        "totals_svg": plots.totals_plot(plan["totals"], plan["roofline_cycles"], simulated),
        "memory_svg": plots.memory_map(memory_panels(data), "memory-map"),
        "memory_figures": memory_figures(data),
        "memory_labels": MEMORY,
        "memory_tiles": plots.tile_grid(plan["tiles"]),
        "validation": v,
        "legend": LEGEND,
        "label": package_label(data),
        "compare": compare_context(data, list(compare)),
    }
    if data.program is not None:
        live = views.liveness(data.program)
        ex = views.exchanges(data.program)
        alloc = views.allocation(data.program, data.target)
        worst = int(alloc["total"].argmax()) if alloc["total"].size else 0
        buffers = views.tile_buffers(data.program, worst, data.target)
        ctx.update({"buffer_tile": worst, "tile_buffers": buffers,
                    "buffer_svg": plots.buffer_map(buffers, [st.name for st in data.program.steps], worst,
                                                   {k: int(alloc[k][worst]) for k in ("standard", "interleaved")},
                                                   "buffer-map")})
        ctx.update({"live": live, "compute_sets": views.compute_sets(data.program), "exchanges": ex,
                    "classes": views.CLASSES, "class_colours": plots.CLASS_COLOURS,
                    "steps_all": [st.name for st in data.program.steps],
                    "page_json": script_json(page_data(data, live, ex)),
                    "script": SCRIPT})
        if data.tile_cycles is not None:
            ctx["trace"] = views.trace(data.tile_cycles, v["steps"])
    if v is not None:
        rows = step_rows(data)
        est = {s["name"]: s for s in report.get("estimate_steps", [])}
        ctx.update({
            "steps": rows,
            "steps_matched": sum(r["estimate"] is not None for r in rows),
            "steps_equal": sum(r["delta"] == 0 for r in rows),
            "timeline_svg": plots.timeline_plot(v["steps"], est),
            "sim_peak": max(v["memory_peak"]) if v["memory_peak"] else 0,
            "sim_peak_tile": v["memory_peak"].index(max(v["memory_peak"])) if v["memory_peak"] else -1,
            "passed": all(o["passed"] for o in v["outputs"].values()),
        })
    return ctx


def _num(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and not x.is_integer():
        return f"{x:,.2f}"
    return f"{int(x):,}"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("tileplan.report", "templates"),
                             autoescape=jinja2.select_autoescape(["html", "j2"]),
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True)
    env.filters["num"] = _num
    env.filters["slug"] = _slug
    env.filters["candidate"] = candidate_name
    env.filters["signed"] = lambda x: "-" if x is None else f"{int(x):+,}"
    env.filters["round"] = lambda x: round(x)
    return env


def render_html(data: ReportData, compare: list[ReportData] = ()) -> str:
    """The page, its Content-Security-Policy naming the hashes of its own script and styles."""
    ctx = context(data, compare)
    page = _environment().get_template("report.html.j2").render(**ctx, csp=_CSP_SLOT)
    return page.replace(_CSP_SLOT, csp(page, ctx.get("script")), 1)


# ---- safety of the page ------------------------------------------------------------------

SCRIPT = (Path(__file__).parent / "templates" / "report.js").read_text(encoding="utf-8")
if "</script" in SCRIPT.lower():                    # (it goes into the page verbatim)
    raise RuntimeError("templates/report.js must not contain </script")
_CSP_SLOT = "tileplan-csp-slot"     # filled after rendering: the first occurrence is the meta tag's
_JSON_ESCAPES = {ord("<"): "\\u003c", ord(">"): "\\u003e", ord("&"): "\\u0026",
                 0x2028: "\\u2028", 0x2029: "\\u2029"}
_STYLE_ELEMENT = re.compile(r"<style[^>]*>(.*?)</style>", re.S)
_STYLE_ATTRIBUTE = re.compile(r'\sstyle="([^"]*)"')


def script_json(doc) -> str:
    """``doc`` as JSON safe inside a ``<script>`` element: ``<``, ``>``, ``&`` and the line
    separators U+2028/9 written as ``\\uXXXX`` escapes (they only occur inside strings), so a name
    holding ``</script>`` or ``<!--`` cannot end or change the element; the parsed value is the same."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).translate(_JSON_ESCAPES)


def _sha(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii") + "'"


def csp(page: str, script: str | None) -> str:
    """The page's Content-Security-Policy: nothing may load (``default-src 'none'``; images only as
    ``data:``), the one script that may run is the page's own (by its SHA-256), and the styles
    that apply are the page's ``<style>`` elements and ``style`` attributes (by their hashes:
    ours and matplotlib's SVGs).

    Design decision: the page is one self-contained file, so ``'self'`` means nothing and a
    nonce would have to be random (the page must be byte-deterministic); hashes of the content
    are both strict and deterministic. The style hashes are collected from the rendered page:
    names from the model are escaped text there, so they cannot form a ``<style>`` element or a
    ``style`` attribute; the script's hash is of our script alone."""
    from html import unescape
    styles = sorted({_sha(m) for m in _STYLE_ELEMENT.findall(page)})
    attributes = sorted({_sha(unescape(m)) for m in _STYLE_ATTRIBUTE.findall(page)})
    script_src = _sha(script) if script is not None else "'none'"
    style_src = " ".join(styles + (["'unsafe-hashes'"] + attributes if attributes else [])) or "'none'"
    return (f"default-src 'none'; script-src {script_src}; style-src {style_src}; img-src data:; "
            f"base-uri 'none'; form-action 'none'")


def write_html(data: ReportData, path: str | Path, compare: list[ReportData] = ()) -> Path:
    """Write the page atomically (``tileplan.atomic.write_file``: a regular file or nothing);
    ``compare``: other packages shown side by side."""
    from ..atomic import write_file
    return write_file(path, render_html(data, compare))
