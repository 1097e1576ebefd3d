"""Draw docs/images/trace.png: the first tiles of a ``tileplan validate --trace`` file as a timeline.

Not a MkDocs hook: run by hand when the picture should change,

    python docs/hooks/trace_image.py artifacts/siglip_mlp_fp8_b4.trace.json.gz docs/images/trace.png

It writes a small self-contained HTML page (one SVG: a row per tile, a slice per event coloured by
its kind, the steps named above the rows, a cycle axis below) and photographs it in headless
Chromium (playwright, the browser at ``TILEPLAN_CHROMIUM`` or /usr/bin/chromium). Perfetto
(ui.perfetto.dev) shows the same file with every tile, zoomable; this picture is for the docs.

Design decision: the page is drawn from the trace's events alone (what any trace viewer reads), so
the picture shows the file a user gets, not the IPU model's internals.
"""

from __future__ import annotations

import gzip
import html
import json
import os
import sys
from pathlib import Path

COLOURS = {"compute": "#3b78c2", "exchange": "#e8923a", "idle": "#e6e6e6", "sync": "#555555"}
WIDTH, LEFT, RIGHT, ROW, TOP = 1200, 70, 34, 9, 64


def load(path: Path) -> dict:
    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)


def _ticks(total: int) -> list[int]:
    """Axis ticks at a round step (1, 2 or 5 times a power of ten), at most 8 of them."""
    power = 1
    while True:
        for k in (1, 2, 5):
            if total / (k * power) <= 8:
                return list(range(0, total + 1, k * power))
        power *= 10


def page(trace: dict, tiles: int, title: str) -> str:
    """The HTML page of the first ``tiles`` tiles of ``trace``."""
    other = trace["otherData"]
    total, steps = other["cycles"], other["steps"]
    events = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["tid"] < tiles]
    span = WIDTH - LEFT - RIGHT
    x = lambda c: LEFT + span * c / total                       # noqa: E731
    starts = {}
    for e in events:
        if e["args"]["kind"] in ("compute", "exchange"):
            i = e["args"]["first_step"]
            starts[i] = min(starts.get(i, e["ts"]), e["ts"])
    height = TOP + tiles * ROW + 48
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif">',
           f'<text x="{LEFT}" y="18" font-size="14" font-weight="bold">{html.escape(title)}</text>']
    order = sorted(starts)
    label_right = 0.0
    for n, i in enumerate(order):                               # the steps, named where the name fits
        x0 = x(starts[i])
        x1 = x(starts[order[n + 1]]) if n + 1 < len(order) else x(total)
        svg.append(f'<line x1="{x0:.1f}" y1="{TOP - 14}" x2="{x0:.1f}" y2="{TOP + tiles * ROW}" '
                   f'stroke="#999" stroke-width="0.5"/>')
        name = steps[i]
        if x0 >= label_right and (x1 - x0) > 6.5 * len(name):
            svg.append(f'<text x="{x0 + 2:.1f}" y="{TOP - 4}" font-size="11">{html.escape(name)}</text>')
            label_right = x0 + 6.5 * len(name) + 4
    for e in events:
        y = TOP + e["tid"] * ROW
        svg.append(f'<rect x="{x(e["ts"]):.2f}" y="{y}" width="{max(x(e["ts"] + e["dur"]) - x(e["ts"]), 0.3):.2f}" '
                   f'height="{ROW - 1}" fill="{COLOURS[e["args"]["kind"]]}"/>')
    for t in range(0, tiles, 8):
        svg.append(f'<text x="{LEFT - 6}" y="{TOP + t * ROW + ROW - 1}" font-size="10" text-anchor="end">'
                   f'tile {t}</text>')
    axis = TOP + tiles * ROW + 4
    svg.append(f'<line x1="{LEFT}" y1="{axis}" x2="{WIDTH - RIGHT}" y2="{axis}" stroke="#333"/>')
    for c in _ticks(total):
        svg.append(f'<line x1="{x(c):.1f}" y1="{axis}" x2="{x(c):.1f}" y2="{axis + 4}" stroke="#333"/>')
        svg.append(f'<text x="{x(c):.1f}" y="{axis + 16}" font-size="10" text-anchor="middle">{c:,}</text>')
    svg.append(f'<text x="{WIDTH - RIGHT}" y="{axis + 30}" font-size="11" text-anchor="end">'
               f'cycles (of {total:,}; {other["clock_hz"] / 1e9:.2f} GHz)</text>')
    lx = LEFT
    for kind, colour in COLOURS.items():
        svg.append(f'<rect x="{lx}" y="{axis + 22}" width="10" height="10" fill="{colour}"/>'
                   f'<text x="{lx + 14}" y="{axis + 31}" font-size="11">{kind}</text>')
        lx += 90
    svg.append("</svg>")
    return ("<!doctype html><html><head><meta charset='utf-8'><style>body{margin:0;background:#fff}</style>"
            "</head><body>" + "".join(svg) + "</body></html>")


def main(trace_path: str, png_path: str, tiles: int = 48) -> None:
    from playwright.sync_api import sync_playwright
    trace = load(Path(trace_path))
    other = trace["otherData"]
    title = (f"{other['model']} on {other['target']}: the first {tiles} tiles of the simulated trace "
             f"({len(other['steps'])} steps)")
    out = Path(png_path)
    html_path = out.with_suffix(".html")
    html_path.write_text(page(trace, tiles, title))
    chromium = os.environ.get("TILEPLAN_CHROMIUM", "/usr/bin/chromium")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        pg = browser.new_page(viewport={"width": WIDTH, "height": TOP + tiles * ROW + 48})
        pg.goto(html_path.resolve().as_uri())
        pg.screenshot(path=str(out), full_page=True)
        browser.close()
    html_path.unlink()


if __name__ == "__main__":
    main(*sys.argv[1:3], *(int(a) for a in sys.argv[3:4]))
