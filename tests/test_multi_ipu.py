"""Targets of several IPUs: their figures, the exchange model's link and sync charges, and a smoke
model planned, compiled and validated on a two-IPU target of 64 tiles per IPU."""

from __future__ import annotations

import dataclasses
import json
import sys

import numpy as np

import pytest

from tileplan.errors import TileplanError
from tileplan.target import load_target

TWO = load_target("ipu21-64x2")


def test_multi_ipu_presets_state_their_ipus_and_links():
    for name, ipus, topology in (("ipu21x2", 2, "all-to-all"), ("ipu21x4", 4, "ring"), ("ipu2x4", 4, "ring"),
                                 ("ipu21-64x2", 2, "all-to-all"), ("ipu21-64x4", 4, "ring")):
        t = load_target(name)
        assert (t.ipus, t.topology) == (ipus, topology)
        assert t.tiles == ipus * t.tiles_per_ipu
        assert t.link_bytes_per_cycle > 0 and t.sync_cycles_multi >= t.sync_cycles
    big = load_target("ipu21x2")
    assert (big.tiles, big.tiles_per_ipu, big.link_bytes_per_cycle) == (2944, 1472, 21)
    # Two IPUs hold twice one IPU's memory: the 822 MB tower's parameters fit 2 x 940 MB.
    one = load_target("ipu21")
    assert big.tiles * big.sram_bytes == 2 * one.tiles * one.sram_bytes
    assert one.ipus == 1 and one.topology == "all-to-all"


def test_a_one_ipu_target_document_has_no_link_figures():
    """A one-IPU target's package document and cache key are what they were before IPUs counted."""
    assert "ipus" not in load_target("ipu21-64").document()
    assert load_target("ipu21-64x2").document()["ipus"] == 2


@pytest.mark.parametrize("text, words", [
    ('inherits = "ipu21-64"\nipus = 2\n', ["link_bytes_per_cycle"]),
    ('inherits = "ipu21-64"\nipus = 3\n[link]\nbytes_per_cycle = 8\nsync_cycles = 900\n', ["not a multiple", "3"]),
    ('inherits = "ipu21-64x2"\n[link]\ntopology = "torus"\n', ["topology", "torus"]),
    ('inherits = "ipu21-64x2"\n[link]\nsync_cycles = 100\n', ["sync_cycles_multi", "below"]),
    ('inherits = "ipu21-64x2"\n[link]\nbytes_per_cycle = "fast"\n', ["link_bytes_per_cycle", "integer"]),
    ('inherits = "ipu21-64x2"\n[link]\nwidth = 3\n', ["unknown key", "width"]),
])
def test_bad_multi_ipu_target_files_are_one_clear_error(tmp_path, text, words):
    path = tmp_path / "t.toml"
    path.write_text(text)
    with pytest.raises(TileplanError) as exc:
        load_target(str(path))
    for w in words:
        assert w in str(exc.value)


def test_with_tiles_keeps_whole_ipus():
    assert TWO.with_tiles(32).ipus == 1
    assert TWO.with_tiles(128).ipus == 2
    with pytest.raises(TileplanError, match="whole number"):
        TWO.with_tiles(96)
    assert dataclasses.replace(TWO, ipus=1).tiles_per_ipu == 128


# ---- the exchange model ------------------------------------------------------------------------

def _copy_program(src_tile: int, dst_tile: int, cols: int):
    from tileplan.graph.dtypes import DType
    from tileplan.layout.layouts import WholeRows
    from tileplan.program import Buffer, Copy, ExchangeStep, Program
    buffers = {"s": Buffer("s", WholeRows(1, src_tile), (1, cols), DType.FP16),
               "d": Buffer("d", WholeRows(1, dst_tile), (1, cols), DType.FP16)}
    return Program(buffers, [ExchangeStep("copy", (Copy("s", "d"),))])


def test_a_cross_ipu_copy_costs_the_link_and_the_multi_ipu_sync():
    """4,096 bytes from tile 0 (IPU 0) to tile 64 (IPU 1): the tiles take 1,024 + 2 cycles at
    4 B/cycle, the link ceil(4096 / 21) = 196 cycles plus 1,000 of latency; the sync spans IPUs."""
    from tileplan.estimate.detailed import cost_program
    cross = cost_program(_copy_program(0, 64, 2048), TWO)
    assert TWO.link_bytes_per_cycle == 21 and TWO.link_latency_cycles == 1000
    assert (cross.estimate.exchange, cross.estimate.sync) == (-(-4096 // 21) + 1000, 1200)
    within = cost_program(_copy_program(0, 1, 2048), TWO)          # the same copy inside IPU 0
    assert (within.estimate.exchange, within.estimate.sync) == (4096 // 4 + 2, 600)
    # On one IPU the copy costs what it always did.
    one = load_target("ipu21-64")
    assert cost_program(_copy_program(0, 1, 2048), one).estimate == within.estimate


def test_link_bytes_are_per_ipu_pair_and_ring_routes_take_the_shorter_way(tmp_path):
    from tileplan.estimate.exchange import fragments_to_transfers, link_bytes, link_cycles, phase_sync
    path = tmp_path / "four.toml"
    path.write_text('inherits = "ipu21-64x2"\nname = "four"\ntiles = 256\nipus = 4\n[link]\ntopology = "ring"\n')
    four = load_target(str(path))
    # IPU 0 -> IPU 1 (one hop) and IPU 0 -> IPU 2 (two hops, clockwise on the tie): 4,200 B each,
    # both on connection 0 -> 1; IPU 3 -> IPU 0 is one hop the other way round; a copy within IPU 1.
    tr = fragments_to_transfers(np.array([0, 0, 192, 64]), 0, np.array([64, 128, 0, 65]), 0,
                                np.array([4200, 4200, 840, 4200]))
    pairs = link_bytes(tr, four)
    assert pairs.reshape(4, 4)[0, 1] == 4200 and pairs.reshape(4, 4)[0, 2] == 4200
    assert pairs.reshape(4, 4)[3, 0] == 840 and pairs.reshape(4, 4)[1, 1] == 0
    assert link_cycles(pairs, four) == 8400 // 21 + 2 * 1000
    assert phase_sync(True, pairs, four) == 1200
    # All-to-all: each pair its own connection, one hop.
    a2a = dataclasses.replace(four, topology="all-to-all")
    assert link_cycles(pairs, a2a) == 4200 // 21 + 1000
    # Nothing crosses: no link time, the one-IPU sync.
    inside = link_bytes(fragments_to_transfers(np.array([64]), 0, np.array([65]), 0, np.array([64])), four)
    assert link_cycles(inside, four) == 0 and phase_sync(True, inside, four) == 600


# ---- a smoke model on two IPUs -----------------------------------------------------------------

def test_a_smoke_model_on_two_ipus_compiles_validates_and_pays_for_its_links(tmp_path):
    from pathlib import Path

    from tileplan.graph.loaders import load_model
    from tileplan.lowering.compile import compile_model
    from tileplan.lowering.package import load_package
    from tileplan.sim.validate import validate_package
    model = Path(__file__).parent.parent / "fixtures" / "mlp_smoke_fp8.toml"
    graph = load_model(model)
    _, _, path = compile_model(graph, TWO, tmp_path / "pkg", jobs=1)
    pkg = load_package(path)
    assert (pkg.target.ipus, pkg.target.tiles) == (2, 128)
    v = validate_package(pkg)                    # raises when an output is out of tolerance
    report = json.loads((path / "report.json").read_text())
    assert report["estimate"]["cycles"] == v.profile.cycles
    syncs = [s.sync for s in v.profile.steps if s.kind == "exchange" and s.sync]
    assert TWO.sync_cycles_multi in syncs        # some exchange crossed the IPU-Link
    # host.cpp builds a device of two IPUs of 64 tiles each, on the IPU model and on hardware.
    host = (path / "host.cpp").read_text()
    assert "constexpr unsigned kIpus = 2;" in host and "model.numIPUs = kIpus;" in host
    assert "getDevices(poplar::TargetType::IPU, kIpus)" in host
    sys.path.insert(0, str(Path(__file__).resolve().parent / "poplar"))
    from harness import GXX, syntax_check
    if GXX is not None:                          # both device paths against the stand-in headers
        (tmp_path / "hw.cpp").write_text("#define TILEPLAN_HARDWARE 1\n" + host)
        syntax_check(tmp_path / "hw.cpp")
    # The same tiles as one IPU (no link, no multi-IPU sync) cost less: the links were charged.
    flat = dataclasses.replace(TWO, ipus=1)
    _, _, flat_path = compile_model(graph, flat, tmp_path / "flat", jobs=1)
    flat_cycles = json.loads((flat_path / "report.json").read_text())["estimate"]["cycles"]
    assert flat_cycles < v.profile.cycles
