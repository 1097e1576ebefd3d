"""A tower's repeated layers in the package: each layer's exchanges are stored once, relative to
their source buffers, plus a per-layer address table (``TileProgram.to_files``), on the small
4-layer tower (fixtures/encoder_tower_small.toml, 64 tiles)."""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

import numpy as np
import pytest

import tileplan
from tileplan.graph.loaders import load_model

TOWER = Path(__file__).resolve().parents[2] / "fixtures" / "encoder_tower_small.toml"
LAYERS = 4


@pytest.fixture(scope="module")
def tower(tmp_path_factory):
    """The small tower compiled twice (a plan cache between them) and the first compile's tile program."""
    from tileplan.lowering.compile import compile_model
    from tileplan.planner.cache import PlanCache
    from tileplan.target import load_target
    tmp = tmp_path_factory.mktemp("reuse")
    g = load_model(TOWER)
    target = load_target(g.target)
    p, state, pkg = compile_model(g, target, tmp / "a", cache=PlanCache(tmp / "cache"))
    _, _, again = compile_model(g, target, tmp / "b", cache=PlanCache(tmp / "cache"))
    return p, state.tile_program, Path(pkg), Path(again)


def _exchanges(pkg: Path) -> list[dict]:
    index = json.loads((pkg / "program.json").read_text())
    return [dict(s, index=i) for i, s in enumerate(index["steps"]) if s["kind"] == "exchange"]


def _member(step: dict, field: str) -> str:
    return step.get("arrays", {}).get(field, f"s{step['index']}x_{field}")


def _layer(name: str) -> tuple[int, str] | None:
    """(layer, the step's name with its layer made 0) of a per-layer step."""
    m = re.search(r"\bl(\d+)\.", name)
    return None if m is None else (int(m.group(1)), re.sub(r"\bl\d+\.", "l0.", name))


@pytest.mark.slow
def test_each_layers_exchanges_name_the_first_layers_rows_and_only_their_own_buffers(tower):
    _, _, pkg, _ = tower
    steps = _exchanges(pkg)
    first = {s["name"]: s for s in steps if _layer(s["name"]) and _layer(s["name"])[0] == 0}
    later = [s for s in steps if _layer(s["name"]) and _layer(s["name"])[0] > 0]
    assert len(first) > 10 and len(later) == (LAYERS - 1) * len(first)
    for s in later:
        twin = first[_layer(s["name"])[1]]
        assert "sources" in s and "sources" in twin, s["name"]
        # the same rows, stored once: the same members for every column
        for f in ("group", "src_tile", "src_off", "dst_tile", "nbytes"):
            assert _member(s, f) == _member(twin, f), (s["name"], f)
        # the per-layer address table: the same row counts, other source buffers
        assert [n for n, _ in s["sources"]] == [n for n, _ in twin["sources"]]
        assert [b for _, b in s["sources"]] != [b for _, b in twin["sources"]], s["name"]
    with zipfile.ZipFile(pkg / "program.npz") as z:
        stored = {n[:-4] for n in z.namelist() if n.endswith("_src_off.npy")}
    assert stored == {_member(s, "src_off") for s in steps}
    assert len(stored) <= len(steps) - len(later)          # no later layer stores its own source addresses


@pytest.mark.slow
def test_the_relocated_tables_are_the_lowered_ones_and_the_ipu_model_counts_the_estimate(tower):
    p, tp, pkg, _ = tower
    from tileplan.lowering.package import load_package
    from tileplan.lowering.tile_program import EXCHANGE_FIELDS, Exchange
    loaded = load_package(pkg).program
    assert len(loaded.steps) == len(tp.steps)
    for mine, back in zip(tp.steps, loaded.steps):
        if isinstance(mine, Exchange):
            for f in EXCHANGE_FIELDS:
                assert np.array_equal(getattr(mine.transfers, f), getattr(back.transfers, f)), (mine.name, f)
    # a column the layers share is one array once loaded, as it was lowered
    by_name = {s.name: s for s in loaded.steps if isinstance(s, Exchange)}
    assert by_name["l1.fc1.prep"].transfers.group is by_name["l2.fc1.prep"].transfers.group
    v = tileplan.validate(pkg, atol=2 * 2.0 ** -6, rtol=0.01, write=False)
    assert v.passed, v.outputs
    assert v.profile.cycles == p.estimate.cycles


@pytest.mark.slow
def test_repeat_compiles_are_byte_identical(tower):
    _, _, a, b = tower
    files = sorted(str(f.relative_to(a)) for f in a.rglob("*") if f.is_file())
    assert files == sorted(str(f.relative_to(b)) for f in b.rglob("*") if f.is_file())
    for name in files:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.mark.slow
def test_the_stored_group_and_source_columns_are_smaller_than_the_tables(tower):
    """What the layers repeat is stored once: the source and group members hold less than one
    layer's worth of rows per exchange shape, however many layers run them."""
    _, tp, pkg, _ = tower
    from tileplan.lowering.tile_program import Exchange
    rows = sum(len(s.transfers) for s in tp.steps if isinstance(s, Exchange))
    with zipfile.ZipFile(pkg / "program.npz") as z:
        stored = sum(np.load(z.open(n)).size for n in z.namelist() if n.endswith("_src_off.npy"))
    assert stored * (LAYERS - 1) < rows
