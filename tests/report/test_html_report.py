"""`tileplan report`: the terminal summary and the self-contained HTML report of the smoke package,
checked statically (no external reference, same bytes wherever the package lives, the sections).
The page in a real browser (console errors, hover, compare, screenshots) is tests/report/test_browser.py.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tileplan.cli import main
from tileplan.report.plots import pareto, tile_grid

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "fixtures" / "mlp_smoke_fp8.toml"
GEMMS = ("fc1", "fc2")
PLOTS = ("totals", "frontier-fc1", "frontier-fc2", "timeline")


def cli(*argv: str) -> tuple[int, str, str]:
    """Run the CLI in this process; (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(argv))
            code = 0
        except SystemExit as exc:
            code = exc.code or 0
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(autouse=True)
def wide_output(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)


@pytest.fixture(scope="module")
def packages(tmp_path_factory) -> dict[str, Path]:
    """The smoke package compiled and validated through the CLI, and an unvalidated copy."""
    root = tmp_path_factory.mktemp("report")
    pkg = root / "smoke"
    code, out, err = cli("compile", str(SMOKE), "-o", str(pkg), "--jobs", "1")
    assert code == 0, out + err
    plain = root / "smoke-unvalidated"
    shutil.copytree(pkg, plain)
    code, out, err = cli("validate", str(pkg))
    assert code == 0, out + err
    assert (pkg / "validation.json").is_file()
    return {"validated": pkg, "unvalidated": plain}


@pytest.fixture(scope="module")
def report(packages) -> tuple[Path, str]:
    """`tileplan report` of the validated package: the HTML path and the terminal output."""
    code, out, err = cli("report", str(packages["validated"]))
    assert code == 0, out + err
    html = packages["validated"] / "report.html"
    assert html.is_file()
    return html, out


class Dom(HTMLParser):
    """What the checks need from a page: svg labels, table ids/classes, all link/src targets, text."""

    def __init__(self, text: str):
        super().__init__()
        self.svgs: list[str] = []
        self.maps: list[str] = []
        self.tables: list[str] = []
        self.refs: list[tuple[str, str, str]] = []
        self.tags: list[str] = []
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        if tag == "svg" and "plot" in (a.get("class") or ""):
            self.svgs.append(a.get("aria-label", ""))
        if tag == "svg" and (a.get("class") or "") in ("memory-panel", "buffer-map"):
            self.maps.append(a.get("aria-label", ""))
        if tag == "table":
            self.tables.append(a.get("id") or a.get("class") or "")
        for key in ("src", "href", "xlink:href", "data", "action", "srcset"):
            if a.get(key):
                self.refs.append((tag, key, a[key]))

    def handle_data(self, data):
        self.text.append(data)


def external_references(html: str) -> list[str]:
    """Anything the page would fetch: scripts, stylesheets, links or URLs that leave the file."""
    dom = Dom(html)
    bad = [f"<{t} {k}={v!r}>" for t, k, v in dom.refs if not v.startswith(("#", "data:"))]
    bad += [f"<{t}>" for t in dom.tags if t in ("link", "iframe", "object", "embed", "img")]   # inline <script> only
    bad += re.findall(r"@import|@font-face|url\((?!#)[^)]*\)", html)
    return bad


def test_the_html_report_is_self_contained(report):
    html, _ = report
    text = html.read_text()
    assert external_references(text) == []
    assert external_references('<link rel="stylesheet" href="https://cdn.example/x.css">') != []   # the check bites
    assert external_references('<script src="https://cdn.example/x.js"></script>') != []
    assert Dom(text).svgs == list(PLOTS)
    page = Dom(text)
    for table in ("op-table", "runner-ups", "step-table", "balance-table", "compute-set-table", "exchange-table",
                  "legend-table", "always-live"):
        assert table in page.tables, table
    words = " ".join(page.text)
    for needle in ("Liveness", "Execution trace per tile", "Compute sets and vertices", "amp_fp8_fp16",
                   "largest flows", "Iv(k,a16)", "Packed(g,k)", "bjli", "Imp(L)", "fc2.reduce.exchange"):
        assert needle in words, needle
    assert str(html.parent) not in text            # no paths: the page does not depend on where the package is


def test_the_same_package_gives_the_same_html_bytes(packages, report, tmp_path):
    html, _ = report
    moved = tmp_path / "elsewhere"
    shutil.copytree(packages["validated"], moved)
    code, out, err = cli("report", str(moved), "--html", str(tmp_path / "again.html"))
    assert code == 0, out + err
    assert (tmp_path / "again.html").read_bytes() == html.read_bytes()


def test_the_terminal_report_shows_plan_layouts_runner_ups_totals_and_the_run(packages, report):
    _, out = report
    plan = json.loads((packages["validated"] / "plan.json").read_text())
    validation = json.loads((packages["validated"] / "validation.json").read_text())
    for needle in ("Plan: mlp_smoke_fp8 on ipu21-64", "Layouts and grids of the chosen candidates",
                   "why it lost", "roofline bound: 972 cycles", "Validation run on the IPU model",
                   f"model floor: {plan['model_floor']['cycles']:,} cycles",
                   f"simulated: {validation['cycles']:,} cycles", "steps simulate exactly as estimated",
                   "wrote "):
        assert needle in out, needle
    for op in plan["ops"]:
        assert op["name"] in out and op["layouts"]["output"] in out
        if op["grid"]:
            g = op["grid"]
            assert f"{g['gm']}x{g['gn']}x{g['gk']} {g['order']}" in out
    for gemm in GEMMS:
        assert f"{gemm}: chosen" in out
    assert f"total: {plan['totals']['cycles']:,} cycles" in out


def test_an_unvalidated_package_reports_without_the_timeline(packages, tmp_path):
    out_html = tmp_path / "plain.html"
    code, out, err = cli("report", str(packages["unvalidated"]), "--html", str(out_html))
    assert code == 0, out + err
    assert "not validated" in out
    dom = Dom(out_html.read_text())
    assert dom.svgs == ["totals", "frontier-fc1", "frontier-fc2"]
    assert "step-table" not in dom.tables and "has not been validated" in " ".join(dom.text)
    assert not (packages["unvalidated"] / "report.html").exists()


def test_bad_packages_are_one_error_line_and_exit_2(packages, tmp_path):
    code, out, err = cli("report", str(tmp_path))
    assert code == 2 and err.startswith("error: ") and "not a tileplan package" in err and out == ""

    damaged = tmp_path / "damaged"
    shutil.copytree(packages["unvalidated"], damaged)
    (damaged / "manifest.json").write_text("{ not json")
    code, out, err = cli("report", str(damaged))
    assert code == 2 and "damaged manifest" in err and "Traceback" not in err

    edited = tmp_path / "edited"
    shutil.copytree(packages["validated"], edited)
    (edited / "validation.json").write_text('{"cycles": ')
    (edited / "report.html").unlink(missing_ok=True)
    code, out, err = cli("report", str(edited))
    assert code == 2 and "validation.json" in err
    assert not (edited / "report.html").exists()


def test_tile_grids_fit_the_machines():
    assert tile_grid(1472) == (32, 46)
    assert tile_grid(64) == (8, 8)
    rows, cols = tile_grid(67)                     # prime: a near-square grid with a few empty cells
    assert rows * cols >= 67 and cols - rows <= 3


def test_pareto_keeps_only_undominated_points_by_memory():
    assert pareto([(10, 5), (8, 9), (12, 5), (9, 9), (7, 12), (11, 4)]) == [(7, 12), (8, 9), (10, 5), (11, 4)]


def _section(html: str, ident: str) -> str:
    start = html.index(f'<section id="{ident}">')
    return html[start:html.index("</section>", start)]


def test_each_memory_figure_is_shown_once_under_its_one_label(packages, report):
    """Three memory figures, three labels (``legend.MEMORY``): the figures table holds each once, the
    memory map draws a panel of each, the legend says what each is, and the terminal prints each
    under the same label with the same bytes."""
    from tileplan.report.legend import LEGEND, MEMORY
    html, out = report
    text = html.read_text()
    plan = json.loads((packages["validated"] / "plan.json").read_text())
    rep = json.loads((packages["validated"] / "report.json").read_text())
    validation = json.loads((packages["validated"] / "validation.json").read_text())
    rows = re.findall(r'<tr data-figure="(\w+)"><td>([^<]*)</td><td class="n">(\d+)</td><td class="n">([\d,]+)</td>', text)
    assert [(k, lab) for k, lab, _t, _b in rows] == [(k, MEMORY[k].replace("'", "&#39;")) for k in MEMORY]
    figures = {k: int(b.replace(",", "")) for k, _l, _t, b in rows}
    # the planner's estimate is one figure: plan.json's totals and report.json's tiles agree
    assert figures["estimate"] == plan["totals"]["total_memory"] == max(rep["memory"]["tile_estimate"])
    assert figures["simulated"] == max(validation["memory_peak"])
    assert figures["allocation"] >= max(validation["memory_peak"]) > 0
    memory = _section(text, "memory")
    assert "planner estimate" not in memory and "(planner)" not in memory   # the old, ambiguous labels
    for label in MEMORY.values():
        assert memory.count(f">{label.replace(chr(39), '&#39;')}") >= 1, label
    assert {m for _g, m, _d in LEGEND} >= set(MEMORY.values())
    for key, label in MEMORY.items():      # the terminal: one line per figure, its label, its bytes
        lines = [ln for ln in out.splitlines() if ln.startswith(f"memory peak ({label}): ")]
        assert len(lines) == 1 and f": {figures[key]:,} B on tile" in lines[0], (label, lines)


def test_the_memory_map_is_searchable_svg_naming_each_buffer(packages, report):
    """No image: panels and a buffer map written as SVG from the data, buffer names as text."""
    html, _ = report
    text = html.read_text()
    dom = Dom(text)
    assert dom.maps[:5] == [f"memory-map-{i}" for i in range(5)] and dom.maps[5:] == ["buffer-map"]
    memory = _section(text, "memory")
    assert "<image" not in memory and "data:image" not in memory and "style=" not in memory
    names = re.findall(r'<g class="buffer">.*?<title>([^:<]+):', memory)
    program = json.loads((packages["validated"] / "program.json").read_text())
    assert names and set(names) <= {b["name"] for b in program["buffers"]}
    assert "w1" in names and re.search(r'<text [^>]*font-size="9">w1</text>', memory)   # drawn as text too
    assert len(text) < 600_000


def test_the_chosen_row_names_its_candidate_as_its_runner_ups_are_named(packages, report):
    """The starred row and the runner-ups come from one function (``terminal.candidate_name``): a
    runner-up of the chosen candidate's own implementation reads exactly as the starred row."""
    from tileplan.report.terminal import candidate_name, short_candidate
    html, out = report
    text = html.read_text()
    plan = json.loads((packages["validated"] / "plan.json").read_text())
    for op in plan["ops"]:
        losers = plan["runner_ups"].get(op["name"])
        if losers is None:
            continue
        name = candidate_name(op["candidate"])
        assert "B pre-arranged" in name and "A:" not in name and "->" not in name
        assert f'<tr class="chosen"><td>&#9733;</td><td class="mono">{name}</td>' in text.replace("&#39;", "'")
        for r in losers:
            assert candidate_name(r["candidate"]) == r["implementation"]
        assert f"{op['name']}: chosen {short_candidate(op['candidate'])}" in out
    assert candidate_name("A:Grid(7x9 r1) grid 7x1x9 bijl rows fp16, B pre-arranged -> Iv(64,a16)") == \
        "grid 7x1x9 bijl rows fp16, B pre-arranged"
    assert candidate_name("A:Rows(64) B:Rows(64) add on Rows(64) -> Rows(64)") == "add on Rows(64)"
