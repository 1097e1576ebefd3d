"""The CLI: `machines`, `show`, and the one-line error contract (exit 2, no traceback)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures"






def test_machines_lists_every_preset_with_its_figures(cli):
    code, out, err = cli("machines")
    assert code == 0 and err == ""
    for name in ("ipu2", "bow", "ipu21", "ipu21-64"):
        assert name in out
    for figure in ("1,472", "638,976", "212,992", "425,984", "49,152", "1.50", "282.6", "565.2", "600"):
        assert figure in out


def test_machines_accepts_a_user_target_file(cli, tmp_path):
    path = tmp_path / "quarter.toml"
    path.write_text('inherits = "ipu21"\nname = "quarter"\ndescription = "a quarter"\ntiles = 368\n')
    code, out, _ = cli("machines", str(path))
    assert code == 0 and "quarter" in out and "368" in out


def test_show_siglip_b4_on_ipu21_gives_the_roofline_bound(cli):
    code, out, err = cli("show", str(FIXTURES / "siglip_mlp_fp8_b4.toml"), "--target", "ipu21")
    assert code == 0 and err == ""
    assert "153,470 cycles" in out and "102.3 us" in out
    assert "ipu21 (--target)" in out
    from tileplan.graph.loaders import load_model
    from tileplan.planner.quality import model_floor
    from tileplan.target import load_target
    floor = model_floor(load_model(FIXTURES / "siglip_mlp_fp8_b4.toml"), load_target("ipu21"))["cycles"]
    assert f"model floor: {floor:,} cycles = {floor / 153470.3:.2f}x the roofline bound" in out
    for text in ("mlp_up", "mlp_down", "4x729x1152, 1152x4304 -> 4x729x4304", "fp8, fp8 -> fp16",
                 "28,916,269,056", "2^-1", "parameter", "output"):
        assert text in out


def test_show_uses_the_model_files_target_by_default(cli):
    code, out, _ = cli("show", str(FIXTURES / "mlp_smoke_fp8.toml"))
    assert code == 0 and "ipu21-64 (model file)" in out and "64 tiles" in out


def test_show_falls_back_to_ipu21_without_any_target(cli, tmp_path):
    text = (FIXTURES / "mlp_fp16_small.toml").read_text().replace('target = "ipu21-64"\n', "")
    (tmp_path / "m.toml").write_text(text)
    code, out, _ = cli("show", str(tmp_path / "m.toml"))
    assert code == 0 and "ipu21 (default)" in out and "1,472 tiles" in out


def test_show_accepts_a_target_file(cli, tmp_path):
    path = tmp_path / "half.toml"
    path.write_text('inherits = "ipu2"\nname = "half"\ntiles = 736\n')
    code, out, _ = cli("show", str(FIXTURES / "gemm_4096_fp16.toml"), "--target", str(path))
    bound = 2 * 4096 ** 3 / (736 * 128)
    assert code == 0 and f"{bound:,.0f} cycles" in out and "half (--target)" in out


@pytest.mark.parametrize("argv, words", [
    (["show", "fixtures/siglip_mlp_fp8_b4.toml", "--target", "ipu99"], "unknown target 'ipu99'"),
    (["show", "fixtures/siglip_mlp_fp8_b4.toml", "--target", "ipu2"], "no fp8 AMP"),
    (["show", "no/such/model.toml"], "no such model file"),
    (["machines", "ipu3"], "unknown target 'ipu3'"),
])
def test_user_errors_are_one_line_and_exit_2(cli, monkeypatch, argv, words):
    monkeypatch.chdir(REPO)
    code, out, err = cli(*argv)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and out == "" and len(lines) == 1
    assert lines[0].startswith("error: ") and words in lines[0]


@pytest.mark.parametrize("argv", [["show"], ["frobnicate"], ["show", "a.toml", "--tagret", "ipu21"]])
def test_usage_errors_exit_2(cli, argv):
    code, _, err = cli(*argv)
    assert code == 2 and "Traceback" not in err


def test_the_installed_command_runs():
    exe = Path(sys.executable).with_name("tileplan")
    if not exe.exists():
        pytest.skip("the tileplan entry point is not installed next to this python")
    proc = subprocess.run([str(exe), "show", "fixtures/siglip_mlp_fp8_b4.toml", "--target", "ipu21"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "153,470 cycles" in proc.stdout
