"""Packages on disk: deterministic, atomic, and refused when damaged.

- compiling the same model twice gives byte-identical folders;
- ``tileplan validate`` refuses a damaged package (a flipped byte, a missing
  file, a folder that is no package) with exit status 2 and one ``error:``
  line naming the file;
- a compile that fails leaves nothing at the output path, and a write that
  fails half-way leaves neither the package nor its temporary folder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tileplan.cli import main
from tileplan.errors import TileplanError
from tileplan.lowering.package import load_package, write_package

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
SMOKE = FIXTURES / "mlp_smoke_fp8.toml"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    out, err = capsys.readouterr()
    return info.value.code or 0, out, err


def compile_into(path: Path) -> Path:
    try:
        main(["compile", str(SMOKE), "-o", str(path), "-j", "1"])
    except SystemExit as exc:
        assert not exc.code, f"compile exited with {exc.code}"
    return path


def files_of(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def smoke_package(tmp_path_factory) -> Path:
    return compile_into(tmp_path_factory.mktemp("compiled") / "smoke")


@pytest.fixture
def package_copy(smoke_package, tmp_path) -> Path:
    return Path(shutil.copytree(smoke_package, tmp_path / "pkg"))


def test_the_same_model_compiles_to_byte_identical_packages(smoke_package, tmp_path):
    # A second compile in a fresh process with another hash seed: no set or dict order leaks into the files.
    again = tmp_path / "again"
    env = dict(os.environ, PYTHONHASHSEED="12345")
    subprocess.run([sys.executable, "-m", "tileplan.cli", "compile", str(SMOKE), "-o", str(again), "-j", "1"],
                   check=True, env=env, capture_output=True)
    first, second = files_of(smoke_package), files_of(again)
    assert sorted(first) == sorted(second)
    for name in ("plan.json", "program.json", "program.npz", "report.json", "host.cpp", "manifest.json"):
        assert name in first
    assert any(name.startswith("codelets/") and name.endswith(".cpp") for name in first)
    differing = [name for name in first if first[name] != second[name]]
    assert differing == []


def test_the_package_loads_with_its_program_target_and_graph(smoke_package):
    pkg = load_package(smoke_package)
    assert pkg.graph.name == "mlp_smoke_fp8"
    assert pkg.target.name == "ipu21-64" and pkg.program.tiles == 64
    assert pkg.program.passes == ["eliminate_noop_copies", "group_exchanges", "donate_cast_buffer",
                                  "omit_padding", "merge_transfers"]


def test_validate_refuses_a_package_with_a_flipped_byte_in_its_program(capsys, package_copy):
    npz = package_copy / "program.npz"
    data = bytearray(npz.read_bytes())
    data[len(data) // 2] ^= 0x01
    npz.write_bytes(bytes(data))
    code, out, err = run(capsys, "validate", str(package_copy))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert f"{npz}: content does not match the manifest" in err
    assert "Traceback" not in err


def test_validate_refuses_a_package_with_a_missing_file(capsys, package_copy):
    (package_copy / "host.cpp").unlink()
    code, out, err = run(capsys, "validate", str(package_copy))
    assert code == 2 and out == ""
    assert err.count("\n") == 1
    assert err == f"error: {package_copy}: host.cpp is missing from the package\n"


def test_validate_refuses_a_folder_that_is_not_a_package(capsys, tmp_path):
    (tmp_path / "notes.txt").write_text("not a package")
    code, out, err = run(capsys, "validate", str(tmp_path))
    assert code == 2 and out == ""
    assert err == f"error: {tmp_path}: no manifest.json; not a tileplan package\n"


def test_validate_refuses_a_package_whose_manifest_is_damaged(capsys, package_copy):
    manifest = package_copy / "manifest.json"
    manifest.write_text(manifest.read_text()[:40])
    code, _, err = run(capsys, "validate", str(package_copy))
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: {manifest}: damaged manifest")


def test_a_compile_that_cannot_plan_leaves_nothing_at_the_output_path(capsys, tmp_path):
    tiny = tmp_path / "tiny.toml"
    tiny.write_text('inherits = "ipu21-64"\nname = "tiny"\n'
                    "sram_bytes = 6144\nstandard_bytes = 3072\ninterleaved_bytes = 3072\nreserve_bytes = 2048\n")
    out_dir = tmp_path / "out"          # (4,096 usable bytes: selection finds nothing that fits)
    out_dir.mkdir()
    code, _, err = run(capsys, "compile", str(SMOKE), "--target", str(tiny), "-o", str(out_dir / "pkg"), "-j", "1")
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1
    assert list(out_dir.iterdir()) == []


def test_a_package_write_that_fails_half_way_leaves_no_package_and_no_temporary_folder(tmp_path):
    parent = tmp_path / "out"
    files = {"a.json": b"{}\n", "a.json/b.cpp": b"// cannot live under a file\n"}
    with pytest.raises(TileplanError, match="cannot write the package"):
        write_package(parent / "pkg", files)
    assert list(parent.iterdir()) == []


def test_recompiling_replaces_a_package_and_leaves_no_temporary_folders(smoke_package, tmp_path):
    target = compile_into(tmp_path / "pkg")
    (target / "validation.json").write_text("{}")       # a previous run's record goes with the old package
    compile_into(target)
    assert [p.name for p in tmp_path.iterdir()] == ["pkg"]
    assert files_of(target) == files_of(smoke_package)


def test_compile_will_not_overwrite_a_folder_that_is_not_a_package(capsys, tmp_path):
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    code, _, err = run(capsys, "compile", str(SMOKE), "-o", str(precious), "-j", "1")
    assert code == 2 and "is not a tileplan package; not overwriting it" in err
    assert (precious / "thesis.tex").read_text() == "years of work"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precious"]


def test_loading_a_package_refuses_one_whose_program_disagrees_with_its_target(package_copy):
    import hashlib
    import json
    target = json.loads((package_copy / "target.json").read_text())
    target["tiles"] = 32
    (package_copy / "target.json").write_text(json.dumps(target))
    manifest = json.loads((package_copy / "manifest.json").read_text())
    manifest["files"]["target.json"] = hashlib.sha256((package_copy / "target.json").read_bytes()).hexdigest()
    (package_copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(TileplanError, match="the tile program has 64 tiles, its target 32"):
        load_package(package_copy)
