"""The progress display (tileplan.progress): named stages in order, one line per finished stage on a
non-terminal stderr, none with --quiet, totals known before a bar starts, and the command's time."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tileplan import progress

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "fixtures" / "mlp_smoke_fp8.toml"
LINE = re.compile(r"^stage (\w+): (\d+\.\d\d) s$")


def run(*argv, quiet=False):
    env = {k: v for k, v in os.environ.items() if k != "TILEPLAN_PROGRESS"}
    return subprocess.run([sys.executable, "-m", "tileplan.cli", *map(str, argv), *(["--quiet"] if quiet else [])],
                          capture_output=True, text=True, env=env, timeout=600)


def test_a_piped_compile_and_validate_print_one_line_per_stage_in_order(tmp_path):
    done = run("compile", SMOKE, "-o", tmp_path / "pkg", "-j", "1", "--no-cache")
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert all(LINE.match(line) for line in lines), lines
    stages = [LINE.match(line)[1] for line in lines]
    assert stages == ["import", "catalogues", "selection", "lowering", "package", "report"]
    # "compiled ... in X s" is the whole command: no less than its stages before the report
    total = float(re.search(r" in (\d+\.\d\d) s \(plan", done.stdout)[1])
    assert total >= sum(float(LINE.match(line)[2]) for line in lines[:-1]) - 0.05
    done = run("validate", tmp_path / "pkg")
    assert done.returncode == 0
    assert [LINE.match(line)[1] for line in done.stderr.splitlines()] == ["import", "simulation", "report"]


def test_quiet_prints_no_stage(tmp_path):
    done = run("plan", SMOKE, "-j", "1", "-o", tmp_path / "plan.json", quiet=True)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_the_catalogue_bar_has_its_total_before_it_starts_and_it_never_grows():
    progress.begin(in_process=True)
    tick = progress.catalogue_ticks(2)
    d = progress.current()
    assert (d.name, d.total) == ("catalogues", 2)
    seen = []
    for op in ("fc1", "fc2"):
        for done, total in ((0, 5), (3, 5), (5, 9), (9, 9)):     # a catalogue's own total may grow: the bar's may not
            tick(op, done, total)
            seen.append((d.name, d.total, sum(d.fractions.values())))
    assert all(total == 2 for name, total, _ in seen if name == "catalogues")
    done = [s for name, _, s in seen if name == "catalogues"]
    assert done == sorted(done) and done[0] == 0                # and the bar never moves back
    assert d.name == "selection" and progress.activity() == "planning (selection)"
    d.finish(ok=False)


def test_the_process_start_is_before_now_and_recent():
    import time
    start = progress.process_start()
    assert start is not None and 0 < time.monotonic() - start < 24 * 3600
