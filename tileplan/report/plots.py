"""The HTML report's plots: matplotlib figures rendered to inline SVG strings.

Every function takes plain JSON data (what a package's plan.json, report.json and
validation.json hold) and returns one ``<svg>`` element as text, ready to paste
into an HTML page:

- ``totals_plot``: the whole program's cycles by phase (estimate, and the IPU
  model's run when there is one) against the roofline bound;
- ``frontier_plot``: one GEMM's candidates as cycles against memory per tile,
  the chosen point marked, detailed and coarse estimates apart, and the Pareto
  frontier of the detailed points;
- ``memory_map``: all tiles as a grid of cells coloured by peak bytes, one
  panel per memory figure (hand-written SVG, text searchable);
- ``buffer_map``: the buffers placed on one tile, by address and the steps
  they are live (hand-written SVG, each buffer named);
- ``timeline_plot``: the superstep timeline of a run (compute, sync, exchange
  per step) beside estimate vs simulated cycles per step.

Output is deterministic: the Agg-free ``Figure`` API (no pyplot state), a fixed
``svg.hashsalt``, no date in the metadata, and every element id prefixed with
the plot's own name so several SVGs can share one HTML document without id
clashes. The same data gives the same bytes.
"""

from __future__ import annotations

import io
import math
import re

import matplotlib
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

HASHSALT = "tileplan-report"

# one colour per phase, used by every plot and by the HTML legend swatches
COLOURS = {
    "compute": "#4c72b0",
    "local copy": "#9db8dc",
    "sync": "#a8a8a8",
    "exchange": "#dd8452",
    "roofline": "#2a9d5c",
    "chosen": "#c8102e",
}

# liveness classes (report.views.CLASSES), also in templates/report.js
CLASS_COLOURS = {"parameters": "#8172b2", "activations": "#4c72b0", "partials": "#dd8452", "transient": "#55a868"}

RC = {
    "svg.hashsalt": HASHSALT,
    "svg.fonttype": "path",           # glyphs as paths: no font needed in the browser
    "text.parse_math": False,         # names from the model are text: a "$" is a dollar sign
    "font.family": "DejaVu Sans",     # ships with matplotlib
    "font.size": 10,
    "axes.titlesize": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#e4e4e4",
    "grid.linewidth": 0.6,
    "axes.axisbelow": True,
    "legend.frameon": False,
    "legend.fontsize": 9,
}


def _n(x) -> str:
    return f"{int(round(x)):,}"


def _bytes_axis(ax, axis: str, largest: float) -> None:
    """Bytes with thousands separators, or KiB once the values pass 64 KiB (labels stay short)."""
    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_major_locator(matplotlib.ticker.MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10]))
    if largest >= 65536:
        target.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _p: f"{v / 1024:,.0f} KiB"))
    else:
        target.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _p: f"{v:,.0f}"))


def _cycles_axis(ax, axis: str = "x") -> None:
    fmt = matplotlib.ticker.FuncFormatter(lambda v, _pos: f"{v:,.0f}")
    (ax.xaxis if axis == "x" else ax.yaxis).set_major_formatter(fmt)


_ID = re.compile(r'\bid="([^"]+)"')
_REF = re.compile(r'(href="#|url\(#)([^")]+)')


def to_svg(fig: Figure, name: str) -> str:
    """The figure as one ``<svg>`` element (no XML prolog), ids prefixed with ``name``."""
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": HASHSALT}):
        fig.savefig(buf, format="svg", metadata={"Date": None}, bbox_inches="tight", pad_inches=0.08)
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    text = _ID.sub(lambda m: f'id="{name}-{m.group(1)}"', text)
    text = _REF.sub(lambda m: f"{m.group(1)}{name}-{m.group(2)}", text)
    return text.replace("<svg ", f'<svg class="plot" role="img" aria-label="{name}" ', 1).strip() + "\n"


def _figure(width: float, height: float) -> Figure:
    with matplotlib.rc_context(RC):
        return Figure(figsize=(width, height), layout="constrained")


# ---- totals ---------------------------------------------------------------------

def totals_plot(totals: dict, roofline: float, simulated: dict | None = None) -> str:
    """Horizontal stacked bars of cycles by phase (estimate, simulated) with the roofline bound as a line."""
    with matplotlib.rc_context(RC):
        rows = [("planner estimate", totals)]
        if simulated is not None:
            rows.append(("IPU model run", simulated))
        fig = _figure(7.2, 0.75 + 0.45 * len(rows))
        ax = fig.add_subplot()
        for y, (_label, t) in enumerate(rows):
            left = 0
            for phase in ("compute", "sync", "exchange"):
                ax.barh(y, t[phase], left=left, height=0.55, color=COLOURS[phase],
                        label=phase if y == 0 else None)
                left += t[phase]
            ax.text(left, y, f"  {_n(left)}  ({left / roofline:.1f}x roofline)" if roofline else f"  {_n(left)}",
                    va="center", ha="left", fontsize=8)
        ax.axvline(roofline, color=COLOURS["roofline"], linewidth=1.6,
                   label=f"roofline bound {_n(roofline)}")
        ax.set_yticks(range(len(rows)), [r[0] for r in rows])
        ax.invert_yaxis()
        longest = max(sum(t[p] for p in ("compute", "sync", "exchange")) for _, t in rows)
        ax.set_xlim(0, max(longest, roofline, 1) * 1.32)
        ax.set_xlabel("cycles")
        _cycles_axis(ax)
        ax.grid(axis="y", visible=False)
        ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=4)
        return to_svg(fig, "totals")


# ---- Pareto frontier ------------------------------------------------------------------

def pareto(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The non-dominated (memory, cycles) points, by increasing memory (both minimised)."""
    out: list[tuple[float, float]] = []
    for m, c in sorted(set(points)):
        if not out or c < out[-1][1]:
            out.append((m, c))
    return out


def frontier_plot(op: dict, losers: list[dict], slug: str) -> str:
    """One GEMM's candidates: cycles against worst-tile memory; chosen point, runner-ups, frontier."""
    with matplotlib.rc_context(RC):
        fig = _figure(8.6, 4.2)
        ax = fig.add_subplot()
        chosen = (op["memory"]["total"], op["estimate"]["cycles"])
        detailed = [(r["detailed"]["memory"]["total"], r["detailed"]["cycles"]) for r in losers if r["detailed"]]
        coarse_of_detailed = [(r["coarse"]["memory"], r["coarse"]["cycles"]) for r in losers if r["detailed"]]
        coarse_only = [(r["coarse"]["memory"], r["coarse"]["cycles"]) for r in losers if not r["detailed"]]

        for (dm, dc), (cm, cc) in zip(detailed, coarse_of_detailed):
            ax.plot([cm, dm], [cc, dc], color="#c9c9c9", linewidth=0.8, zorder=1)
        if coarse_only:
            ax.scatter(*zip(*coarse_only), marker="s", s=30, facecolors="none", edgecolors="#8a8a8a",
                       linewidths=1.0, zorder=2)
        if coarse_of_detailed:
            ax.scatter(*zip(*coarse_of_detailed), marker="o", s=30, facecolors="none",
                       edgecolors=COLOURS["compute"], linewidths=1.0, zorder=2)
        if detailed:
            ax.scatter(*zip(*detailed), marker="o", s=34, color=COLOURS["compute"], zorder=3)
        front = pareto(detailed + [chosen])
        if len(front) > 1:
            ax.step(*zip(*front), where="post", color=COLOURS["compute"], linewidth=1.0,
                    linestyle="--", zorder=2)
        ax.scatter([chosen[0]], [chosen[1]], marker="*", s=220, color=COLOURS["chosen"],
                   edgecolors="white", linewidths=0.8, zorder=4)
        ax.annotate(_short(op), chosen, xytext=(10, -10), textcoords="offset points", fontsize=8, va="top",
                    color=COLOURS["chosen"], zorder=5,
                    bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "edgecolor": "none", "alpha": 0.85})

        ax.set_xlabel("the op's own memory estimate (bytes, worst tile of its fragment)")
        ax.set_ylabel("cycles")
        _bytes_axis(ax, "x", max(m for m, _ in detailed + coarse_only + coarse_of_detailed + [chosen]))
        _cycles_axis(ax, "y")
        ax.margins(x=0.12, y=0.12)
        handles = [
            Line2D([], [], marker="*", linestyle="", markersize=12, color=COLOURS["chosen"],
                   label="chosen (detailed estimate)"),
            Line2D([], [], marker="o", linestyle="", color=COLOURS["compute"], label="runner-up, detailed estimate"),
            Line2D([], [], marker="o", linestyle="", markerfacecolor="none", color=COLOURS["compute"],
                   label="same runner-up, coarse estimate"),
            Line2D([], [], marker="s", linestyle="", markerfacecolor="none", color="#8a8a8a",
                   label="pruned on the coarse frontier"),
            Line2D([], [], linestyle="--", color=COLOURS["compute"], label="Pareto frontier (detailed)"),
        ]
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        ax.set_title(f"{op['name']}: cycles against memory of its candidates", loc="left")
        return to_svg(fig, slug)


def _short(op: dict) -> str:
    g = op.get("grid")
    if not g:
        return "chosen"
    grid = f"{g['gm']}x{g['gn']}x{g['gk']}" + (f" b{g['gb']}" if g["gb"] > 1 else "")
    return f"chosen: grid {grid}"


# ---- memory map -----------------------------------------------------------------------

def tile_grid(tiles: int) -> tuple[int, int]:
    """(rows, columns) for drawing ``tiles`` cells: the divisor pair nearest a 3:2 landscape
    (1472 -> 32 x 46, 64 -> 8 x 8); a prime count gets a near-square grid with empty cells."""
    best = None
    for cols in range(1, tiles + 1):
        if tiles % cols == 0:
            rows = tiles // cols
            if cols >= rows:
                score = abs(math.log(cols / rows / 1.4))
                if best is None or score < best[0]:
                    best = (score, rows, cols)
    _, rows, cols = best
    if rows == 1 and tiles > 8:                    # prime: no useful divisor
        cols = math.ceil(math.sqrt(tiles * 1.4))
        rows = math.ceil(tiles / cols)
    return rows, cols


VIRIDIS = ("#440154", "#482475", "#414487", "#355f8d", "#2a788e", "#21918c", "#22a884", "#44bf70",
           "#7ad151", "#bddf26", "#fde725")     # matplotlib's viridis at 11 even steps: one per level
CLASS_FILL = {"parameters": "#c9c1e3", "activations": "#b8cbe6", "partials": "#f1c9a8", "transient": "#bfe0c6"}


def _esc(text) -> str:
    from html import escape
    return escape(str(text), quote=True)


def memory_map(panels: list[tuple[str, list[int], int]], slug: str) -> str:
    """One panel per (title, bytes per tile, capacity in bytes): tiles as cells, tile 0 top left,
    row-major, coloured in ``len(VIRIDIS)`` levels from the panel's lowest to its highest tile.

    Design decision: SVG written here from the data, not a matplotlib image: each level is one
    ``<path>`` of unit squares (a 1472-tile panel is a few kilobytes, not hundreds), the titles,
    peaks and scale are ``<text>`` (the browser's find reaches them), and nothing but presentation
    attributes styles it (no ``style`` attribute for the page's CSP to list)."""
    tiles = len(panels[0][1])
    rows, cols = tile_grid(tiles)
    cell = max(4, min(22, 360 // cols))
    out = []
    for k, (title, values, capacity) in enumerate(panels):
        lo, hi = (int(min(values)), int(max(values))) if values else (0, 0)
        base = 0 if hi == lo else lo
        levels = len(VIRIDIS)
        paths: list[list[str]] = [[] for _ in range(levels)]
        for t, v in enumerate(values):
            lv = 0 if hi == base else min(levels - 1, (int(v) - base) * levels // (hi - base + 1))
            paths[lv].append(f"M{t % cols} {t // cols}h1v1h-1z")
        peak = max(range(len(values)), key=lambda i: (values[i], -i)) if values else -1
        share = f" = {100 * hi / capacity:.1f}% of {_n(capacity)} B" if capacity else ""
        spread = f"all {tiles:,} tiles equal" if hi == lo else f"lowest {_n(lo)} B"
        w, h = cols * cell, rows * cell
        W, H = max(w + 8, 300), h + 86
        svg = [f'<svg class="memory-panel" role="img" aria-label="{_esc(slug)}-{k}" viewBox="0 0 {W} {H}" '
               f'width="{W}" height="{H}" xmlns="http://www.w3.org/2000/svg">',
               f'<text x="0" y="13" font-size="12" font-weight="600">{_esc(title)}</text>',
               f'<text x="0" y="28" font-size="11">peak {_n(hi)} B (tile {peak}){_esc(share)}</text>',
               f'<text x="0" y="42" font-size="11" fill="#5f6b76">{_esc(spread)}</text>',
               f'<g transform="translate(0 50) scale({cell})">']
        for lv, d in enumerate(paths):
            if d:
                svg.append(f'<path fill="{VIRIDIS[lv]}" stroke="#fff" stroke-width="{0.6 / cell:.3f}" d="{"".join(d)}"/>')
        svg.append("</g>")
        y = 50 + h + 10
        step = (hi - base + 1) / levels
        for lv in range(levels):
            x = lv * (W // levels)
            svg.append(f'<rect x="{x}" y="{y}" width="{W // levels - 2}" height="8" fill="{VIRIDIS[lv]}">'
                       f'<title>{_n(base + lv * step)} to {_n(base + (lv + 1) * step - 1)} B</title></rect>')
        svg.append(f'<text x="0" y="{y + 22}" font-size="10" fill="#5f6b76">{_n(base)} B</text>')
        svg.append(f'<text x="{W}" y="{y + 22}" font-size="10" fill="#5f6b76" text-anchor="end">{_n(hi)} B</text>')
        svg.append("</svg>")
        out.append("".join(svg))
    return f'<div class="memory-map" id="{_esc(slug)}">' + "\n".join(out) + "</div>\n"


def buffer_map(buffers: list[dict], steps: list[str], tile: int, regions: dict, slug: str) -> str:
    """The placement on one tile: per region, program steps to the right and addresses down, each
    buffer a rectangle over the steps it is live, its name written in it where it fits and in its
    ``<title>``; ``regions``: region -> bytes drawn (the allocation's peak of the region)."""
    n = max(len(steps), 1)
    W, L, top = 900, 64, 30
    out = [f'<svg class="buffer-map" role="img" aria-label="{_esc(slug)}" xmlns="http://www.w3.org/2000/svg" ']
    parts, y0 = [], top
    for region in ("standard", "interleaved"):
        span = max(int(regions.get(region, 0)), 1)
        rows = [b for b in buffers if b["region"] == region]
        height = 60 if not rows else max(90, min(320, 22 * len(rows)))
        parts.append(f'<text x="0" y="{y0 - 8}" font-size="11" font-weight="600">{region} region: '
                     f'{_n(regions.get(region, 0))} B up to its highest address used</text>')
        parts.append(f'<rect x="{L}" y="{y0}" width="{W - L}" height="{height}" fill="#fafbfc" stroke="#dfe3e8"/>')
        for f in (0, 1):
            parts.append(f'<text x="{L - 4}" y="{y0 + f * height + 4}" font-size="9" fill="#5f6b76" '
                         f'text-anchor="end">{_n(f * span)}</text>')
        sx, sy = (W - L) / n, height / span
        for b in rows:
            x, y = L + b["first"] * sx, y0 + b["offset"] * sy
            w, h = max((b["last"] - b["first"] + 1) * sx, 1.0), max(b["bytes"] * sy, 0.8)
            tip = (f'{b["name"]}: {_n(b["bytes"])} B at +{_n(b["offset"])}, steps {b["first"]}-{b["last"]}, '
                   f'{b["class"]}' + (f'; shared with {", ".join(b["shared"])}' if b["shared"] else ""))
            parts.append(f'<g class="buffer"><rect x="{x:.1f}" y="{y:.2f}" width="{w:.1f}" height="{h:.2f}" '
                         f'fill="{CLASS_FILL.get(b["class"], "#ddd")}" stroke="#56606b" stroke-width="0.4"/>'
                         f'<title>{_esc(tip)}</title>')
            if h >= 10 and w >= 7 * min(len(b["name"]), 40):
                parts.append(f'<text x="{x + 3:.1f}" y="{y + min(h, 14) - 3:.2f}" font-size="9">{_esc(b["name"])}</text>')
            parts.append("</g>")
        y0 += height + 36
    ticks = sorted({0, n - 1} | set(range(0, n, max(1, math.ceil(n / 12)))))
    for s in ticks:
        parts.append(f'<text x="{L + (s + 0.5) * (W - L) / n:.1f}" y="{y0 - 20}" font-size="9" fill="#5f6b76" '
                     f'text-anchor="middle">{s}</text>')
    parts.append(f'<text x="{L + (W - L) / 2:.0f}" y="{y0 - 6}" font-size="10" fill="#5f6b76" '
                 f'text-anchor="middle">program step (tile {tile})</text>')
    out.append(f'viewBox="0 0 {W} {y0}" width="{W}" height="{y0}">')
    return "".join(out) + "".join(parts) + "</svg>\n"


# ---- superstep timeline ---------------------------------------------------------------

def timeline_plot(steps: list[dict], estimates: dict[str, dict]) -> str:
    """Left: each step as a row, its compute (or local copy), sync and exchange segments at their
    start cycle. Right: estimate vs simulated cycles (phase + sync) of the same step.

    ``steps`` are the IPU model's profile steps (validation.json); ``estimates`` maps a step name
    to the planner's estimate of that step (report.json ``estimate_steps``)."""
    with matplotlib.rc_context(RC):
        n = len(steps)
        fig = _figure(11.0, 1.4 + 0.24 * n)
        left, right = fig.subplots(1, 2, sharey=True, gridspec_kw={"width_ratios": [2.2, 1]})
        t = 0
        for i, s in enumerate(steps):
            est = estimates.get(s["name"])
            if s["kind"] == "compute":
                phase = "local copy" if est and est["kind"] == "local_copy" else "compute"
                left.barh(i, s["cycles"], left=t, height=0.7, color=COLOURS[phase])
                t += s["cycles"] + s["sync"]
            else:
                left.barh(i, s["sync"], left=t, height=0.7, color=COLOURS["sync"])
                left.barh(i, s["cycles"], left=t + s["sync"], height=0.7, color=COLOURS["exchange"])
                t += s["sync"] + s["cycles"]
        left.set_yticks(range(n), [s["name"] for s in steps], fontsize=7.5 if n <= 60 else 6)
        left.set_ylim(max(n, 1) - 0.5, -0.5)       # (a program of no steps: an empty, valid axis)
        left.set_xlim(0, max(t, 1) * 1.01)
        left.set_xlabel("cycles from the start of the program")
        left.grid(axis="y", visible=False)
        _cycles_axis(left)
        left.set_title(f"superstep timeline (IPU model run): {_n(t)} cycles", loc="left")
        left.legend(handles=[Patch(color=COLOURS[p], label=p) for p in ("compute", "local copy", "sync", "exchange")],
                    loc="lower center", bbox_to_anchor=(0.5, 1.04), ncol=4)

        sim = [s["cycles"] + s["sync"] for s in steps]
        est = [(estimates[s["name"]]["cycles"] + estimates[s["name"]]["sync"]) if s["name"] in estimates else 0
               for s in steps]
        ys = list(range(n))
        right.barh([y - 0.19 for y in ys], est, height=0.36, color="#b9c7dd", label="planner estimate")
        right.barh([y + 0.19 for y in ys], sim, height=0.36, color="#34495e", label="IPU model")
        right.set_xlabel("cycles of the step (incl. sync)")
        right.grid(axis="y", visible=False)
        _cycles_axis(right)
        right.set_title("estimate vs simulated, per step", loc="left")
        right.legend(loc="lower center", bbox_to_anchor=(0.5, 1.04), ncol=2)
        return to_svg(fig, "timeline")
