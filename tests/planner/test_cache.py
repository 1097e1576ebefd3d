"""The plan cache on disk (planner/cache.py): warm results equal cold ones, damage is never trusted."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tileplan.graph.loaders import load_model
from tileplan.planner.cache import FORMAT, PlanCache
from tileplan.planner.plan import plan
from tileplan.planner.planjson import plan_to_json
from tileplan.target import load_target

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
LAYER = FIXTURES / "encoder_layer_small.toml"


def package_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def cold_cache(tmp_path_factory) -> tuple[Path, dict, int, int]:
    """The layer planned once into an empty plan cache: (its folder, the plan JSON, hits, misses).
    Tests warm a copy of the folder (``warm_copy``), so every one starts from the same cold entries."""
    folder = tmp_path_factory.mktemp("cold-cache")
    g = load_model(LAYER)
    first = PlanCache(folder)
    return folder, plan_to_json(plan(g, load_target(g.target), cache=first)), first.hits, first.misses


@pytest.fixture(scope="module")
def cold_cli_plan(tmp_path_factory) -> Path:
    """``tileplan plan LAYER --cache cache -o cold.json`` run once: the folder holding both."""
    from tileplan.cli import main
    root = tmp_path_factory.mktemp("cold-cli")
    with pytest.raises(SystemExit) as info:
        main(["plan", str(LAYER), "--cache", str(root / "cache"), "-q", "-o", str(root / "cold.json")])
    assert (info.value.code or 0) == 0
    return root


def warm_copy(folder: Path, tmp_path: Path) -> Path:
    """A copy of a cold cache (or CLI run) folder in this test's tmp_path."""
    dst = tmp_path / "copy"
    shutil.copytree(folder, dst)
    return dst


def test_a_cold_and_a_warm_compile_write_byte_identical_packages(cli, cold_cli_plan, tmp_path):
    """A compile reading the entries of a cold run (``cold_cli_plan``: one cold planning, shared
    with the damage tests below, not a third) writes the package a compile with no cache writes."""
    cache = warm_copy(cold_cli_plan, tmp_path) / "cache"
    entries = sorted(cache.glob("*.entry"))
    assert entries, "the cold run stored its GEMM catalogues"
    stamps = [e.stat().st_mtime_ns for e in entries]
    code, _, err = cli("compile", LAYER, "-o", tmp_path / "warm", "--cache", cache, "-q")
    assert code == 0 and "warning" not in err
    assert [e.stat().st_mtime_ns for e in sorted(cache.glob("*.entry"))] == stamps   # read, not rewritten
    code, _, _ = cli("compile", LAYER, "-o", tmp_path / "none", "--no-cache", "-q")
    assert code == 0
    assert package_bytes(tmp_path / "warm") == package_bytes(tmp_path / "none")


def test_a_warm_plan_reads_every_catalogue_from_the_cache(planned, cold_cache, tmp_path):
    g, target, uncached = planned(LAYER)
    cold = plan_to_json(uncached)
    folder, first, first_hits, first_misses = cold_cache
    assert first == cold
    assert first_misses > 0       # (its hits: the fused QKV form reading what the separate one stored)
    second = PlanCache(warm_copy(folder, tmp_path))
    assert plan_to_json(plan(g, target, cache=second)) == cold
    assert second.misses == 0 and second.hits == first_misses + first_hits


def test_a_warm_plan_takes_its_selection_from_the_cache_without_searching_again(cold_cache, tmp_path, monkeypatch):
    import tileplan.planner.plan as planning
    g = load_model(LAYER)
    target = load_target(g.target)
    folder, cold = cold_cache[:2]
    tmp_path = warm_copy(folder, tmp_path)

    def no_search(*args, **kwargs):
        raise AssertionError("the warm plan searched again")
    monkeypatch.setattr(planning, "solve_dp", no_search)
    warm = PlanCache(tmp_path)
    assert plan_to_json(plan(g, target, cache=warm)) == cold
    assert warm.misses == 0
    with pytest.raises(AssertionError, match="searched again"):       # another solver option: another entry
        plan(g, target, cache=PlanCache(tmp_path), dp_paths=4)


def test_a_selection_entry_whose_picks_do_not_fit_is_ignored_with_a_warning(cold_cache, tmp_path):
    import json
    import zlib
    from tileplan.planner.cache import inflate
    g = load_model(LAYER)
    target = load_target(g.target)
    folder, cold = cold_cache[:2]
    tmp_path = warm_copy(folder, tmp_path)
    for f in tmp_path.glob("*.entry"):
        head, _, body = f.read_bytes().partition(b"\n")
        doc = json.loads(inflate(body))
        if "picks" in doc["value"]:
            doc["value"]["picks"] = [10**6] * len(doc["value"]["picks"])
            f.write_bytes(head + b"\n" + zlib.compress(json.dumps(doc).encode()))
            break
    else:
        raise AssertionError("no selection entry was stored")
    lines: list[str] = []
    assert plan_to_json(plan(g, target, cache=PlanCache(tmp_path, warn=lines.append))) == cold
    assert len(lines) == 1 and "does not fit this graph's selection" in lines[0]


@pytest.mark.parametrize("damage", ["garbage", "truncated", "foreign"])
def test_a_corrupt_or_foreign_entry_is_ignored_with_one_warning_and_replaced(cli, cold_cli_plan, tmp_path, damage):
    tmp_path = warm_copy(cold_cli_plan, tmp_path)              # cache/ and cold.json of one cold CLI plan
    cache = tmp_path / "cache"
    entries = sorted(cache.glob("*.entry"))
    victim = entries[0]
    if damage == "garbage":
        victim.write_bytes(b"not a cache entry\n\x00\x01")
    elif damage == "truncated":
        victim.write_bytes(victim.read_bytes()[:-40])
    else:          # another entry's content under this entry's name: written for another key
        victim.write_bytes(entries[1].read_bytes())
    code, _, err = cli("plan", LAYER, "--cache", cache, "-q", "-o", tmp_path / "warm.json")
    assert code == 0
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and victim.name in warnings[0] and "ignored" in warnings[0]
    assert (tmp_path / "warm.json").read_bytes() == (tmp_path / "cold.json").read_bytes()
    code, _, err = cli("plan", LAYER, "--cache", cache, "-q", "-o", tmp_path / "again.json")
    assert "warning" not in err, "the damaged entry was replaced by the fresh result"


def test_an_entry_that_would_build_other_objects_is_refused(tmp_path):
    import json
    import os
    import pickle
    import zlib
    from tileplan.planner.cachecodec import CATALOGUE
    cache = PlanCache(tmp_path)
    key = cache.full_key("0" * 64, "1" * 64, {"frontier_bound": 32})

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'ran'}",))

    head = f"{FORMAT} key={json.dumps(key, sort_keys=True)}\n".encode()
    tmp_path.mkdir(exist_ok=True)
    lines = []
    cache.warn = lines.append
    cache.file_of(key).write_bytes(head + zlib.compress(pickle.dumps({"key": key, "x": Evil()})))
    assert cache.load(key, CATALOGUE, 64) is None
    # a tag that is not in the allowlist, where a candidate is expected
    doc = {"key": key, "arrays": [], "blobs": [],
           "value": {"names": [], "lost": [], "kept": [{"O": "tileplan.bench.subprocess.Popen", "f": {}}]}}
    cache.file_of(key).write_bytes(head + zlib.compress(json.dumps(doc).encode()))
    assert cache.load(key, CATALOGUE, 64) is None
    assert len(lines) == 2 and all("corrupt or foreign" in line for line in lines)
    assert "is not allowed here" in lines[1]
    assert not (tmp_path / "ran").exists()


def test_the_codec_schema_names_every_constructor_field_of_the_allowed_classes():
    from tileplan.planner.cachecodec import check_complete
    check_complete()


def test_cache_info_and_clear_report_and_remove_the_entries(cli, cold_cli_plan, tmp_path):
    cache = warm_copy(cold_cli_plan, tmp_path) / "cache"
    count = len(list(cache.glob("*.entry")))
    code, out, _ = cli("cache", "info", "--cache", cache)
    assert code == 0 and f"{count} entries" in out and str(cache) in out
    code, out, _ = cli("cache", "clear", "--cache", cache)
    assert code == 0 and f"removed {count} entries" in out
    assert not list(cache.glob("*.entry"))
    assert "0 entries" in cli("cache", "info", "--cache", cache)[1]
