"""Targets of several IPUs: their figures, the exchange model's link and sync charges, and a smoke
model planned, compiled and validated on a two-IPU target of 64 tiles per IPU."""

from __future__ import annotations

import dataclasses

import pytest

from tileplan.errors import TileplanError
from tileplan.target import load_target

TWO = load_target("ipu21-64x2")


def test_multi_ipu_presets_state_their_ipus_and_links():
    for name, ipus, topology in (("ipu21x2", 2, "all-to-all"), ("ipu21x4", 4, "ring"), ("ipu2x4", 4, "ring"),
                                 ("ipu21-64x2", 2, "all-to-all")):
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
