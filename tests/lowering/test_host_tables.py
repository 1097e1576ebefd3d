"""host/tables.bin's deflated sections (TPHOST3): what host.cpp reads back, and what it refuses.

The sections are read here by their documented layout (``test_emit.read_tables``), and by host.cpp
itself built with ``-DTILEPLAN_DUMP_TABLES`` (no Poplar): a damaged zlib stream and a header that
claims more rows than its stored bytes can hold are refused with one message, before any
allocation of the claimed size.
"""

from __future__ import annotations

import resource
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tileplan.graph.loaders import load_model
from tileplan.lowering.emit import emit_host
from tileplan.lowering.lower import lower
from tileplan.planner.plan import plan
from tileplan.target import load_target

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "poplar"))
from harness import GXX  # noqa: E402
from test_emit import TABLE_NAMES, read_tables  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
needs_gxx = pytest.mark.skipif(GXX is None, reason="g++ is not installed")
HEADER = struct.Struct("<16sIIQQ")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The smoke model's host files, and host.cpp built as the table dump."""
    graph = load_model(FIXTURES / "mlp_smoke_fp8.toml")
    target = load_target("ipu21-64")
    tp = lower(plan(graph, target).mid.program, target).tile_program
    files = emit_host(tp, target, graph.name)
    root = tmp_path_factory.mktemp("tables")
    (root / "host").mkdir()
    for name, data in files.items():
        (root / name).write_bytes(data)
    if GXX is not None:
        build = subprocess.run([GXX, "-std=c++17", "-O0", "-DTILEPLAN_DUMP_TABLES", "host.cpp", "-lz", "-o", "dump"],
                               cwd=root, capture_output=True, text=True)
        assert build.returncode == 0, build.stderr[-4000:]
    return root, files


def sections(data: bytes) -> dict[str, tuple[int, int]]:
    """Each section's (header offset, stored bytes), walked by the documented layout."""
    (count,) = struct.unpack_from("<I", data, 8)
    at, out = 12, {}
    for _ in range(count):
        name, _, _, _, stored = HEADER.unpack_from(data, at)
        out[name.rstrip(b"\0").decode()] = (at, stored)
        at += HEADER.size + stored
    return out


def run_dump(root: Path, data: bytes, tmp_path: Path) -> subprocess.CompletedProcess:
    (tmp_path / "host").mkdir(exist_ok=True)
    (tmp_path / "host" / "tables.bin").write_bytes(data)

    def limit():           # 256 MiB of address space: an allocation of a claimed size would fail loudly
        resource.setrlimit(resource.RLIMIT_AS, (256 << 20, 256 << 20))
    return subprocess.run([str(root / "dump"), "host/tables.bin"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, preexec_fn=limit)


def test_the_integer_sections_are_deflated_and_smaller_than_their_rows(built):
    _, files = built
    data = files["host/tables.bin"]
    assert data[:8] == b"TPHOST3\0"
    tables = read_tables(data)
    where = sections(data)
    assert set(where) == {"strings", *TABLE_NAMES}
    raw = sum(tables[n].size * 4 for n in TABLE_NAMES)
    stored = sum(where[n][1] for n in TABLE_NAMES)
    assert stored * 3 < raw, (stored, raw)
    # the names stay plain bytes: every variable's name is found in the file as it is
    names = [tables.string(o) for o in tables["variables"][:, 0].tolist()]
    assert names and all(b"\0" + n.encode() + b"\0" in data for n in names[:50])


@needs_gxx
def test_host_cpp_refuses_a_damaged_deflated_section(built, tmp_path):
    root, files = built
    data = bytearray(files["host/tables.bin"])
    at, stored = sections(bytes(data))["runs"]
    middle = at + HEADER.size + stored // 2
    data[middle:middle + 8] = bytes(b ^ 0x5A for b in data[middle:middle + 8])
    run = run_dump(root, bytes(data), tmp_path)
    assert run.returncode == 1, (run.returncode, run.stderr)
    assert "host/tables.bin: damaged section runs" in run.stderr


@needs_gxx
def test_host_cpp_refuses_a_header_claiming_more_rows_than_its_bytes_hold(built, tmp_path):
    root, files = built
    data = bytearray(files["host/tables.bin"])
    at, stored = sections(bytes(data))["runs"]
    name, esize, columns, _, _ = HEADER.unpack_from(data, at)
    HEADER.pack_into(data, at, name, esize, columns, 1 << 36, stored)     # 1.4 TB of runs from a few KB
    run = run_dump(root, bytes(data), tmp_path)
    assert run.returncode == 1, (run.returncode, run.stderr)
    assert "section runs claims" in run.stderr
