"""The HTML report in a real browser: playwright driving a Chromium it does not download.

The browser is found through ``TILEPLAN_CHROMIUM`` (a path; when set it must exist, so a CI that
names its browser cannot silently skip), then playwright's own Chromium where ``playwright
install`` put one, then Debian's ``/usr/bin/chromium`` (what .ci/run installs and names). With
none of them the tests are skipped, saying so.

Console errors are collected from the page's ``console`` events of type error and its uncaught
exceptions (``pageerror``); `test_the_error_check_catches_a_page_with_a_js_error` is the negative
control. Screenshots go to pytest's tmp_path (kept as test artifacts, not committed).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import tileplan

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures"
DEBIAN_CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="session")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the test extra")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=_chromium(p), args=ARGS)
        yield b
        b.close()


def _chromium(playwright) -> str:
    """The Chromium to drive (see the module docstring), or a skip naming what was looked for."""
    import os
    named = os.environ.get("TILEPLAN_CHROMIUM")
    if named:
        if not Path(named).is_file():
            pytest.fail(f"TILEPLAN_CHROMIUM={named} names no file")
        return named
    try:
        own = playwright.chromium.executable_path
    except Exception:                       # noqa: BLE001  (playwright without a browser of its own)
        own = None
    for path in (own, DEBIAN_CHROMIUM):
        if path and Path(path).is_file():
            return path
    pytest.skip("no Chromium: set TILEPLAN_CHROMIUM, run `playwright install chromium`, or install Debian's "
                "chromium (/usr/bin/chromium)")


class Page:
    """A page with its console errors and uncaught exceptions recorded."""

    def __init__(self, browser, path: Path):
        self.errors: list[str] = []
        self.page = browser.new_page(viewport={"width": 1400, "height": 1000})
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))
        t0 = time.perf_counter()
        self.page.goto(path.as_uri(), wait_until="load")
        self.seconds = time.perf_counter() - t0

    def ready(self) -> "Page":
        self.page.wait_for_selector("body[data-ready='1']", timeout=10_000)
        return self


@pytest.fixture(scope="session")
def small(tmp_path_factory) -> dict:
    """The smoke package (validated) and the small FP16 MLP and an unvalidated copy to compare with."""
    root = tmp_path_factory.mktemp("browser")
    smoke = tileplan.compile(FIXTURES / "mlp_smoke_fp8.toml", root / "smoke")
    v = tileplan.validate(smoke)
    fp16 = tileplan.compile(FIXTURES / "mlp_fp16_small.toml", root / "fp16")
    tileplan.validate(fp16)
    odd = tileplan.compile(FIXTURES / "odd_prime_dims.toml", root / "odd")
    html = tileplan.report(smoke, compare=[fp16, odd])
    return {"html": html, "validation": v, "root": root}


@pytest.fixture(scope="session")
def siglip(tmp_path_factory) -> dict:
    """SigLIP b1 on all 1472 tiles, compiled, validated and reported."""
    root = tmp_path_factory.mktemp("siglip")
    pkg = tileplan.compile(FIXTURES / "siglip_mlp_fp8_b1.toml", root / "b1", jobs=2)
    tileplan.validate(pkg)
    return {"html": tileplan.report(pkg), "package": pkg}


def test_the_small_report_opens_without_console_errors_and_draws_its_views(browser, small, tmp_path):
    page = Page(browser, small["html"]).ready()
    assert page.errors == []
    p = page.page
    assert p.locator("#tile-map rect.tile").count() == 64
    assert p.locator("#live-worst rect").count() > 10 and p.locator("#trace rect.cell").count() > 10
    p.screenshot(path=str(tmp_path / "small.png"), full_page=True)
    assert (tmp_path / "small.png").stat().st_size > 50_000


def test_the_error_check_catches_a_page_with_a_js_error(browser, tmp_path):
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><body><p>page</p><script>console.error('deliberate console error');"
                   "window.noSuchFunction();</script></body></html>")
    page = Page(browser, bad)
    page.page.wait_for_timeout(100)
    assert any("deliberate console error" in e for e in page.errors)
    assert any(e.startswith("uncaught:") and "noSuchFunction" in e for e in page.errors)


def test_hovering_a_tile_shows_its_numbers(browser, small):
    page = Page(browser, small["html"]).ready()
    p = page.page
    peak = int(small["validation"].profile.memory_peak[5])
    p.hover("#tile-map rect[data-tile='5']")
    text = p.inner_text("#tooltip")
    assert "tile 5" in text and f"{peak:,} B" in text
    # a step's view: bytes sent by the tile in the first GEMM's preparation exchange
    step = [s.name for s in small["validation"].profile.steps].index("fc1.prep")
    p.select_option("#tile-metric", "sent")
    p.select_option("#tile-step", str(step))
    p.hover("#tile-map rect[data-tile='0']")
    assert "B sent (fc1.prep)" in p.inner_text("#tooltip")
    assert page.errors == []


def test_clicking_a_tile_charts_its_liveness_and_hovering_a_step_shows_bytes_by_class(browser, small):
    page = Page(browser, small["html"]).ready()
    p = page.page
    p.click("#tile-map rect[data-tile='9']")
    assert "chosen tile 9" in p.text_content("#live-chosen")
    p.hover("#live-chosen rect.hit[data-step='3']")
    text = p.inner_text("#tooltip")
    assert "fc1.amp" in text and "partials:" in text and "parameters:" in text


def test_the_trace_zooms_in_and_resets(browser, small):
    page = Page(browser, small["html"]).ready()
    p = page.page
    total = small["validation"].profile.cycles
    assert p.inner_text("#trace-range").startswith(f"cycles 0 to {total:,} of {total:,}")
    p.click("#zoom-in")
    assert not p.inner_text("#trace-range").startswith(f"cycles 0 to {total:,}")
    p.click("#zoom-reset")
    assert p.inner_text("#trace-range").startswith(f"cycles 0 to {total:,}")
    p.hover("#trace rect.cell >> nth=0")
    assert "cast_x.compute" in p.inner_text("#tooltip")


def test_switching_the_compared_package_shows_its_table(browser, small, tmp_path):
    page = Page(browser, small["html"]).ready()
    p = page.page
    blocks = p.locator(".compare-block")
    assert blocks.count() == 2
    assert blocks.nth(0).is_visible() and not blocks.nth(1).is_visible()
    assert "mlp_fp16_small" in blocks.nth(0).inner_text()
    p.select_option("#compare-select", "1")
    assert blocks.nth(1).is_visible() and not blocks.nth(0).is_visible()
    assert "odd_prime_dims" in p.locator(".compare-block >> visible=true").inner_text()
    p.locator("#compare").screenshot(path=str(tmp_path / "compare.png"))


@pytest.mark.slow
def test_the_1472_tile_siglip_report_is_under_10_mb_and_loads_in_under_3_s(browser, siglip, tmp_path):
    html = siglip["html"]
    size = html.stat().st_size
    assert size < 10 * 1024 * 1024
    page = Page(browser, html).ready()
    assert page.seconds < 3.0, f"load took {page.seconds:.2f} s"
    assert page.errors == []
    p = page.page
    assert p.locator("#tile-map rect.tile").count() == 1472
    validation = json.loads((siglip["package"] / "validation.json").read_text())
    p.hover("#tile-map rect[data-tile='1000']")
    assert f"{validation['memory_peak'][1000]:,} B" in p.inner_text("#tooltip")
    p.screenshot(path=str(tmp_path / "siglip.png"), full_page=True)
    print(f"SigLIP b1 report: {size / 1e6:.2f} MB, loaded in {page.seconds:.2f} s; screenshot {tmp_path}")


# ---- names from a hostile model ------------------------------------------------------------

HOSTILE = {          # the smoke model's names -> names holding HTML and script
    "mlp_smoke_fp8": "<script>window.__pwned=4</script>",
    "fc1": '<img src=x onerror="window.__pwned=1">',
    "act": "</script><script>window.__pwned=2</script>",
    "bias1": "it's \"quoted\" & <b>bold</b> $x$",
    "h": "<svg onload=window.__pwned=3>",
}


@pytest.fixture(scope="session")
def hostile(tmp_path_factory) -> dict:
    """The smoke model with its names replaced by HTML and script (a TOML the test writes: op and
    tensor names are free strings), compiled, validated and reported."""
    root = tmp_path_factory.mktemp("hostile")
    text = (FIXTURES / "mlp_smoke_fp8.toml").read_text()
    for old, new in HOSTILE.items():          # a JSON string is a TOML basic string
        text = text.replace(f'"{old}"', json.dumps(new))
    text = text.replace("\nh  = {", f"\n{json.dumps(HOSTILE['h'])} = {{")
    model = root / "hostile.toml"
    model.write_text(text)
    pkg = tileplan.compile(model, root / "pkg")
    tileplan.validate(pkg)
    return {"html": tileplan.report(pkg), "package": pkg}


def test_names_holding_html_and_script_are_shown_as_text_and_never_run(browser, hostile):
    page = Page(browser, hostile["html"]).ready()
    p = page.page
    title = f"tileplan report: {HOSTILE['mlp_smoke_fp8']} on ipu21-64"
    assert p.title() == title
    # every tooltip target: each handler fills the tooltip; collect what it shows
    shown = p.evaluate("""() => {
        const tip = document.getElementById("tooltip"), out = [];
        for (const e of document.querySelectorAll("#tile-map rect.tile, #live-worst rect.hit, #live-chosen rect.hit, #trace rect.cell")) {
            e.dispatchEvent(new MouseEvent("mouseenter", {bubbles: false}));
            out.push([tip.innerText, tip.querySelectorAll("*:not(b):not(br)").length]);
        }
        return out;
    }""")
    assert len(shown) > 64 + 2 * 15
    assert all(elements == 0 for _, elements in shown), "a tooltip holds elements made from a name"
    texts = "\n".join(t for t, _ in shown)
    for op in ("fc1", "bias1"):                     # steps named after the hostile ops, as text
        assert HOSTILE[op] + "." in texts, op
    # real pointer hovers too, over the trace's cells and the liveness steps of the hostile ops
    step = next(i for i, o in enumerate(p.locator("#tile-step option").all_inner_texts())
                if HOSTILE["fc1"] in o) - 1
    p.hover(f"#live-worst rect.hit[data-step='{step}']")
    assert p.locator("#tooltip").is_visible()
    assert p.inner_text("#tooltip").startswith(HOSTILE["fc1"] + ".")
    for cell in p.locator("#trace rect.cell").all()[:40]:
        cell.hover()
    p.wait_for_timeout(300)                          # an <img onerror> would have fired by now
    assert p.evaluate("() => window.__pwned") is None
    assert p.title() == title
    assert page.errors == []                         # (a blocked inline script would log a CSP error)
    # the names are the text of the page's tables, not markup
    assert HOSTILE["bias1"] in p.inner_text("#op-table")
    assert HOSTILE["h"] in p.inner_text("#op-table")
    assert p.locator("#op-table img, #op-table svg, main script, #op-table b:text-is('bold')").count() == 0


def test_the_page_carries_a_content_security_policy_of_its_own_script(browser, hostile):
    html = hostile["html"].read_text()
    head = html[:html.index("<title>")]
    assert '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; script-src \'sha256-' in head
    # a script the policy does not name is refused: the same page with one more inline script
    extra = hostile["html"].with_name("extra.html")
    extra.write_text(html.replace("</body>", "<script>window.__pwned = 5;</script></body>"))
    page = Page(browser, extra).ready()             # the page's own script still runs
    p = page.page
    assert p.evaluate("() => window.__pwned") is None
    assert any("Content Security Policy" in e for e in page.errors)
    p.hover("#tile-map rect[data-tile='3']")
    assert p.locator("#tooltip").is_visible() and "tile 3" in p.inner_text("#tooltip")
    # byte-deterministic: the same package gives the same page
    again = tileplan.report(hostile["package"], html=hostile["html"].with_name("again.html"))
    assert again.read_bytes() == hostile["html"].read_bytes()


# ---- layout of the drawn charts: no label over another, none over the bars ----------------------

_BOXES = """(sel) => [...document.querySelectorAll(sel)].map(e => {
    const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom, e.textContent || ""]; })"""


def _overlaps(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _pairwise_clear(boxes) -> list:
    return [(a[4], b[4]) for i, a in enumerate(boxes) for b in boxes[i + 1:] if _overlaps(a, b)]


def _check_chart_layout(p, zoom: int = 0) -> None:
    """``zoom``: clicks on the trace's zoom-in first (a step's name is written where it fits)."""
    for chart in ("#live-worst", "#live-chosen"):
        ticks = p.evaluate(_BOXES, f"{chart} text.tick")
        assert len(ticks) >= 2 and _pairwise_clear(ticks) == [], chart
        bars = p.evaluate(_BOXES, f"{chart} rect.bar")
        label = p.evaluate(_BOXES, f"{chart} text.always-label")
        assert bars and len(label) == 1 and "always live" in label[0][4]
        assert not any(_overlaps(label[0], b) for b in bars), f"{chart}: the always-live label is over a bar"
        keys = p.evaluate(_BOXES, f"{chart} text.legend-key")
        assert not any(_overlaps(k, b) for k in keys for b in bars)
    for _ in range(zoom):
        p.click("#zoom-in")
    ticks = p.evaluate(_BOXES, "#trace text.cycle-tick")
    names = p.evaluate(_BOXES, "#trace text.step-name")
    cells = p.evaluate(_BOXES, "#trace rect.cell")
    assert len(ticks) >= 3 and _pairwise_clear(ticks) == []
    assert names and _pairwise_clear(names) == []
    assert not any(_overlaps(n, c) for n in names for c in cells), "a step name is over the trace"
    assert max(n[3] for n in names) <= min(c[1] for c in cells) <= max(c[3] for c in cells) <= min(t[1] for t in ticks)


def test_the_step_chart_and_the_trace_keep_their_labels_apart(browser, small, tmp_path):
    """Tick labels of the liveness charts and of the trace's cycle axis never meet, the always-live
    label and the class key stay off the bars, the trace names its steps above its rows; then the
    same page with 8 times the steps (its JSON data edited: the script draws what it is given),
    where every step labelled would collide."""
    page = Page(browser, small["html"]).ready()
    p = page.page
    _check_chart_layout(p)
    assert "fc1.amp" in [n[4] for n in p.evaluate(_BOXES, "#trace text.step-name")]
    for view in ("#liveness", "#trace-section"):
        p.locator(view).screenshot(path=str(tmp_path / f"{view[1:]}.png"))
    html = small["html"].read_text()
    start = html.index('<script type="application/json" id="page-data">') + len('<script type="application/json" id="page-data">')
    end = html.index("</script>", start)
    d = json.loads(html[start:end])
    k = 8
    d["steps"] = [dict(s, name=f"{s['name']}#{i}") for i in range(k) for s in d["steps"]]
    d["live"] = [[row for _ in range(k) for row in cls] for cls in d["live"]]
    d["trace"] = [row for _ in range(k) for row in d["trace"]]
    d["sync"] = d["sync"] * k
    many = tmp_path / "many-steps.html"
    many.write_text(html[:start] + json.dumps(d).replace("</", "<\\/") + html[end:])
    page = Page(browser, many).ready()
    assert page.errors == []
    _check_chart_layout(page.page, zoom=3)
    assert page.page.locator("#live-worst text.tick").count() < len(d["steps"]) / 2
    page.page.locator("#liveness").screenshot(path=str(tmp_path / "many-steps.png"))


def test_the_memory_map_names_its_buffers_where_find_reaches_them(browser, small):
    """The browser's find (``window.find``) meets a buffer's name in the memory map's SVG, and each
    memory figure appears once in the figures table under its label."""
    from tileplan.report.legend import MEMORY
    page = Page(browser, small["html"]).ready()
    p = page.page
    names = p.evaluate("() => [...document.querySelectorAll('#memory svg.buffer-map text')].map(t => t.textContent)")
    assert "w1" in names
    assert p.evaluate("() => { window.getSelection().removeAllRanges(); return window.find('fc1.C'); }")
    assert p.evaluate("() => document.querySelector('#memory svg.buffer-map').contains("
                      "window.getSelection().anchorNode)")
    labels = p.locator("#memory-figures td:first-child").all_inner_texts()
    assert labels == list(MEMORY.values())
    p.hover("#memory svg.buffer-map g.buffer >> nth=0")
    assert page.errors == []
