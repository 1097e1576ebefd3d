"""``tileplan validate DIR --trace FILE``: the simulated per-tile timeline as a Chrome trace (Perfetto,
chrome://tracing) that adds up to the run's cycles, tile by tile."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

import tileplan

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "fixtures" / "mlp_smoke_fp8.toml"


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """(package, the trace document, the trace's bytes, validate's exit status and output)."""
    from tileplan.cli import main
    pkg = tileplan.compile(SMOKE, tmp_path_factory.mktemp("trace") / "smoke")
    trace = pkg / "trace.json"
    with pytest.raises(SystemExit) as done:
        main(["validate", str(pkg), "--trace", str(trace)])
    data = trace.read_bytes()
    return pkg, json.loads(data), data, done.value.code


def test_every_event_has_the_trace_event_fields(traced):
    pkg, doc, _, code = traced
    assert code in (0, None)
    assert doc["otherData"]["clock_hz"] > 0 and "cycle" in doc["otherData"]["time_unit"]
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert slices
    for e in doc["traceEvents"]:
        assert isinstance(e["name"], str) and e["pid"] == 0 and isinstance(e["tid"], int) and "args" in e
        assert e["ph"] in ("X", "M")
        if e["ph"] == "X":
            assert isinstance(e["ts"], int) and isinstance(e["dur"], int) and e["ts"] >= 0 and e["dur"] > 0
    names = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert names == {t: f"tile {t}" for t in range(64)}                   # every tile, one thread each


def test_each_tile_adds_up_to_the_simulated_cycles(traced):
    pkg, doc, _, _ = traced
    record = json.loads((pkg / "validation.json").read_text())
    tile_cycles = np.load(pkg / "validation.npz")["tile_cycles"]
    total = record["cycles"]
    assert doc["otherData"]["cycles"] == total > 0
    by_tile = defaultdict(list)
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            by_tile[e["tid"]].append(e)
    assert sorted(by_tile) == list(range(64))
    for tile, events in by_tile.items():
        events.sort(key=lambda e: e["ts"])
        assert events[0]["ts"] == 0 and events[-1]["ts"] + events[-1]["dur"] == total
        assert all(a["ts"] + a["dur"] == b["ts"] for a, b in zip(events, events[1:]))   # no gap, no overlap
        assert sum(e["dur"] for e in events) == total
        busy = sum(e["dur"] for e in events if e["args"]["kind"] in ("compute", "exchange"))
        assert busy == int(tile_cycles[:, tile].sum())          # what validation.npz records for the tile


def test_the_busy_events_are_named_after_the_program_steps(traced):
    pkg, doc, _, _ = traced
    from tileplan.lowering.package import load_package
    steps = [s.name for s in load_package(pkg).program.steps]
    busy = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["args"]["kind"] in ("compute", "exchange")]
    assert {e["name"] for e in busy} <= set(steps)
    assert {e["args"]["first_step"] for e in busy} == set(range(len(steps))) - {
        i for i in range(len(steps)) if not np.load(pkg / "validation.npz")["tile_cycles"][i].any()}
    for e in busy:
        assert e["name"] == steps[e["args"]["first_step"]] == steps[e["args"]["last_step"]]
    syncs = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["args"]["kind"] == "sync"]
    assert syncs and all(e["name"] == "sync" for e in syncs)


def test_the_same_run_writes_the_same_bytes(traced, tmp_path):
    from tileplan.cli import main
    pkg, _, data, _ = traced
    with pytest.raises(SystemExit):
        main(["validate", str(pkg), "--quiet", "--trace", str(tmp_path / "again.json")])
    assert (tmp_path / "again.json").read_bytes() == data
