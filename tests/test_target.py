"""Targets: the presets, a user's target file that inherits a preset, bad target files."""

from __future__ import annotations

import pytest

from tileplan.errors import TileplanError
from tileplan.graph import DType
from tileplan.target import PRESET_DIR, Target, load_target, preset_names


def test_all_presets_load():
    assert preset_names() == ["bow", "ipu2", "ipu21", "ipu21-64", "ipu21-64x2", "ipu21-64x4", "ipu21x2", "ipu21x4", "ipu2x4"]
    for name in preset_names():
        t = load_target(name)
        assert isinstance(t, Target) and t.name == name
        assert t.standard_bytes + t.interleaved_bytes == t.sram_bytes


def test_preset_figures_match_the_design():
    ipu21 = load_target("ipu21")
    assert (ipu21.tiles, ipu21.sram_bytes, ipu21.clock_hz) == (1472, 638_976, 1.5e9)
    assert (ipu21.standard_bytes, ipu21.interleaved_bytes) == (212_992, 425_984)
    assert (ipu21.amp_fp16, ipu21.amp_fp8, ipu21.workers) == (128, 256, 6)
    assert (ipu21.exchange_bytes_per_cycle, ipu21.sync_cycles) == (4, 600)
    assert ipu21.peak_tflops(DType.FP16) == pytest.approx(282.6, abs=0.1)
    ipu2, bow = load_target("ipu2"), load_target("bow")
    assert not ipu2.supports(DType.FP8) and not bow.supports(DType.FP8)
    assert (ipu2.clock_hz, bow.clock_hz) == (1.33e9, 1.85e9)
    small = load_target("ipu21-64")
    assert small.tiles == 64 and small.amp_fp8 == ipu21.amp_fp8 and small.family == "ipu21"


def test_a_target_passes_through_and_a_preset_file_path_works():
    t = load_target("ipu21")
    assert load_target(t) is t
    assert load_target(str(PRESET_DIR / "ipu21.toml")) == t


def test_a_user_target_inherits_a_preset_and_overrides_tiles(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('inherits = "ipu21"\nname = "mine"\ndescription = "quarter C600"\ntiles = 368\n'
                    "[exchange]\nsync_cycles = 150\n")
    t = load_target(str(path))
    base = load_target("ipu21")
    assert (t.name, t.tiles, t.sync_cycles) == ("mine", 368, 150)
    assert (t.clock_hz, t.amp_fp8, t.sram_bytes) == (base.clock_hz, base.amp_fp8, base.sram_bytes)


def test_a_relative_inherits_path_is_relative_to_the_inheriting_file(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "base.toml").write_text('inherits = "ipu2"\nname = "base"\ntiles = 32\n')
    (tmp_path / "sub" / "child.toml").write_text('inherits = "base.toml"\nname = "child"\nclock_hz = 1e9\n')
    t = load_target(str(tmp_path / "sub" / "child.toml"))
    assert (t.name, t.tiles, t.clock_hz, t.family) == ("child", 32, 1e9, "ipu2")


@pytest.mark.parametrize("text, words", [
    ('inherits = "ipu21"\ntiles = 0\n', "tiles must be positive"),
    ('inherits = "ipu21"\ntiles = "many"\n', "tiles must be an integer"),
    ('inherits = "ipu21"\ntyles = 8\n', "unknown target key 'tyles'"),
    ('inherits = "ipu21"\n[amp]\nfp9 = 1\n', "unknown key 'fp9' in [amp]"),
    ('inherits = "ipu21"\nstandard_bytes = 1000\n', "standard_bytes + interleaved_bytes"),
    ('inherits = "ipu21"\nalignment = 6\n', "alignment must be a power of two"),
    ('inherits = "ipu99"\n', "unknown target 'ipu99'"),
    ('inherits = 3\n', "inherits must be"),
    ('inherits = "self.toml"\n', "inherits from itself"),
    ('name = "lone"\ntiles = 4\n', "is missing"),
    ('inherits = "ipu21"\ntiles = [\n', "malformed TOML"),
])
def test_bad_target_files_are_one_clear_error(tmp_path, text, words):
    path = tmp_path / "self.toml"
    path.write_text(text)
    with pytest.raises(TileplanError) as info:
        load_target(str(path))
    assert words in str(info.value)
    assert "self.toml" in str(info.value)


def test_an_unknown_target_name_lists_the_presets():
    with pytest.raises(TileplanError, match=r"unknown target 'ipu3'.*ipu21-64"):
        load_target("ipu3")
