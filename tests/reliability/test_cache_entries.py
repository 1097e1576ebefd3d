"""Hostile plan cache entries: a file in a shared ``--cache`` folder, a restored CI cache or
``~/.cache/tileplan`` is data, never code, and never trusted.

Each case writes one entry at the exact file name the smoke model's compile reads (an entry of
its first cold compile, ``victim``) and compiles the model again on that cache folder through the
``guard`` (own process, 2 GiB address space, timeout). The compile must succeed with ONE warning
line naming the entry, write the package a cold compile writes (manifest.json byte for byte), run
no code from the entry (each pickle payload would create a sentinel file), and change nothing
outside its output and cache folders.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from guarded import tree
from reliability_corpus import SMOKE

from tileplan.planner.cache import inflate


# ---- pickle payloads: each runs ``touch SENTINEL`` when unpickled ----------------------------

def _s(text: str) -> bytes:
    raw = text.encode()
    return b"\x8c" + bytes([len(raw)]) + raw              # SHORT_BINUNICODE


def _global(module: str, name: str) -> bytes:
    return _s(module) + _s(name) + b"\x93"                   # STACK_GLOBAL (dotted names: protocol 4)


def _argv(sentinel: Path) -> bytes:
    return b"](" + _s("touch") + _s(str(sentinel)) + b"e"   # ['touch', sentinel]


def payload(kind: str, sentinel: Path) -> bytes:
    if kind == "dotted_name_under_tileplan":            # tileplan -> planner.cache.os.system
        body = _global("tileplan", "planner.cache.os.system") + _s(f"touch {sentinel}") + b"\x85R"
    elif kind == "class_reachable_through_tileplan":    # tileplan.bench -> subprocess.Popen
        body = _global("tileplan.bench", "subprocess.Popen") + _argv(sentinel) + b"\x85R"
    elif kind == "copyreg_reconstructor":              # _reconstructor(Popen, Popen, argv) runs Popen.__init__
        popen = _global("tileplan.bench", "subprocess.Popen")
        body = _global("copyreg", "_reconstructor") + popen + popen + _argv(sentinel) + b"\x87R"
    else:                                               # a plain pickle of os.system
        class Run:
            def __reduce__(self):
                return (os.system, (f"touch {sentinel}",))
        return pickle.dumps(Run(), protocol=4)
    return b"\x80\x04" + body + b"."


PICKLES = ["dotted_name_under_tileplan", "class_reachable_through_tileplan", "copyreg_reconstructor",
           "plain_pickle_of_os_system"]


# ---- the cold compile and its entries ---------------------------------------------------------

def _key_of(entry: Path) -> dict:
    head = entry.read_bytes().partition(b"\n")[0].decode()
    return json.loads(head.partition(" key=")[2])


@pytest.fixture(scope="module")
def cold(guard, tmp_path_factory):
    """The smoke model compiled once on an empty cache: (cache folder, manifest bytes, the GEMM
    catalogue entries, the selection entry)."""
    root = tmp_path_factory.mktemp("cache-entries")
    code, _, err = guard.run(["compile", SMOKE, "--cache", root / "cache", "-o", root / "out", "-j", "1", "-q"], root)
    assert code == 0, err
    entries = sorted((root / "cache").glob("*.entry"))
    gemms = [e for e in entries if _key_of(e).get("kind") != "selection"]
    selection = [e for e in entries if _key_of(e).get("kind") == "selection"]
    assert len(gemms) == 2 and len(selection) == 1, entries      # the smoke MLP: two GEMMs, one selection
    return root / "cache", (root / "out" / "manifest.json").read_bytes(), gemms, selection[0]


def _rewrite(entry: Path, edit) -> None:
    """``entry`` with its JSON body document changed by ``edit`` (header and compression kept)."""
    head, _, body = entry.read_bytes().partition(b"\n")
    doc = json.loads(inflate(body))
    text = edit(doc)
    entry.write_bytes(head + b"\n" + zlib.compress(text.encode() if isinstance(text, str) else json.dumps(doc).encode()))


def _header(entry: Path) -> bytes:
    return entry.read_bytes().partition(b"\n")[0] + b"\n"


def _first_candidate(doc: dict) -> dict:
    return doc["value"]["kept"][0]["f"]


def damage(case: str, cache: Path, victim: Path, other: Path, selection: Path, sentinel: Path) -> Path:
    """Write case ``case`` into ``cache``; returns the entry file it damaged."""
    if case in PICKLES:
        victim.write_bytes(_header(victim) + zlib.compress(payload(case, sentinel)))
    elif case == "fifo":
        victim.unlink()
        os.mkfifo(victim)
    elif case == "link_to_dev_zero":
        victim.unlink()
        victim.symlink_to("/dev/zero")
    elif case == "folder":
        victim.unlink()
        victim.mkdir()
    elif case == "zlib_bomb":                   # 1 GiB of zeros, about 1 MiB compressed
        victim.write_bytes(_header(victim) + _zlib_of_zeros(1024))
    elif case == "truncated":
        data = victim.read_bytes()
        victim.write_bytes(data[: len(data) // 2])
    elif case == "wrong_type_in_a_field":
        _rewrite(victim, lambda d: _first_candidate(d)["coarse"]["f"].update(compute="12"))
    elif case == "nan":
        _rewrite(victim, lambda d: json.dumps(d).replace('"compute":', '"compute":NaN,"x":', 1))
    elif case == "huge_int":
        _rewrite(victim, lambda d: json.dumps(d).replace('"compute":', '"compute":' + "9" * 40 + ',"x":', 1))
    elif case == "array_of_the_wrong_length":
        _rewrite(victim, lambda d: d["arrays"].__setitem__(0, d["arrays"][0][:-12]))
    elif case == "unknown_tag":
        _rewrite(victim, lambda d: _first_candidate(d).update(choice={"O": "tileplan.bench.subprocess.Popen", "f": {}}))
    elif case == "names_of_another_op":
        _rewrite(victim, lambda d: d["value"].update(names=[n + "_elsewhere" for n in d["value"]["names"]]))
    elif case == "names_too_few":
        _rewrite(victim, lambda d: d["value"].update(names=d["value"]["names"][:-1]))
    elif case == "body_swapped_with_another_entry":
        victim.write_bytes(_header(victim) + other.read_bytes().partition(b"\n")[2])
    elif case == "entry_for_another_key":
        victim.write_bytes(other.read_bytes())
    elif case == "selection_picks_out_of_range":
        _rewrite(selection, lambda d: d["value"].update(picks=[10**6] * len(d["value"]["picks"])))
        return selection
    elif case == "selection_wrong_types":
        _rewrite(selection, lambda d: d["value"].update(exact="yes"))
        return selection
    else:
        raise AssertionError(case)
    return victim


def _zlib_of_zeros(mib: int) -> bytes:
    """A zlib stream of ``mib`` MiB of zeros, built in half a second rather than compressed (8 CPU-s):
    after a full flush a deflate block refers to nothing before it, so the block of one MiB of zeros
    repeats as is; then the empty final block and the Adler-32 of all the zeros."""
    z, chunk = zlib.compressobj(9), bytes(1 << 20)
    first = z.compress(chunk) + z.flush(zlib.Z_FULL_FLUSH)          # (with the stream's header)
    again = z.compress(chunk) + z.flush(zlib.Z_FULL_FLUSH)
    adler = 1
    for _ in range(mib):
        adler = zlib.adler32(chunk, adler)
    return first + again * (mib - 1) + zlib.compressobj(9).flush()[2:-4] + struct.pack(">I", adler)


def test_the_zlib_bomb_is_a_valid_stream_of_zeros():
    data = _zlib_of_zeros(3)
    assert zlib.decompress(data) == bytes(3 << 20)


CASES = PICKLES + ["fifo", "link_to_dev_zero", "folder", "zlib_bomb", "truncated", "wrong_type_in_a_field",
                   "nan", "huge_int", "array_of_the_wrong_length", "unknown_tag", "names_of_another_op",
                   "names_too_few", "body_swapped_with_another_entry", "entry_for_another_key",
                   "selection_picks_out_of_range", "selection_wrong_types"]


# Cases compiled a second time to see the fresh result stored in the entry's place (the special
# files: a file replaces them; the others are plain files the store replaces as any entry).
AGAIN = {"fifo", "link_to_dev_zero", "folder", "zlib_bomb", "copyreg_reconstructor"}


@pytest.mark.parametrize("case", CASES)
def test_a_hostile_cache_entry_is_ignored_with_one_warning_and_runs_nothing(guard, cold, tmp_path, case):
    cold_cache, cold_manifest, gemms, selection = cold
    cache = tmp_path / "cache"
    shutil.copytree(cold_cache, cache)
    mine = lambda p: cache / p.name          # noqa: E731
    sentinel = tmp_path / "ran"
    hit = damage(case, cache, mine(gemms[0]), mine(gemms[1]), mine(selection), sentinel)
    before = tree(tmp_path)
    code, _, err = guard.run(["compile", SMOKE, "--cache", cache, "-o", tmp_path / "out", "-j", "1", "-q"],
                             tmp_path, timeout=60)
    assert code == 0, (code, err)
    assert "Traceback" not in err
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1, err
    assert warnings[0].startswith("warning: plan cache entry") and hit.name in warnings[0], warnings[0]
    assert "ignored" in warnings[0]
    assert not sentinel.exists(), "code from the cache entry ran"
    assert (tmp_path / "out" / "manifest.json").read_bytes() == cold_manifest
    after = tree(tmp_path)
    outside = lambda t: {k: v for k, v in t.items() if not k.startswith(("out", "cache"))}   # noqa: E731
    assert outside(after) == outside(before)
    if case not in AGAIN:
        return
    # the fresh result was stored over the entry: a second compile reads it without a warning
    code, _, err = guard.run(["compile", SMOKE, "--cache", cache, "-o", tmp_path / "again", "-j", "1", "-q"],
                             tmp_path, timeout=60)
    assert code == 0 and "warning" not in err, err


def test_the_pickle_payloads_do_run_code_when_unpickled(tmp_path):
    """The payloads above are real: unpickled by plain ``pickle`` (what an unchecked reader would
    do) each creates its sentinel. Run in a child process with this worktree's tileplan importable."""
    files = []
    for kind in PICKLES:
        f = tmp_path / f"{kind}.pickle"
        f.write_bytes(payload(kind, tmp_path / f"{kind}.ran"))
        files.append(str(f))
    script = ("import pickle, sys\n"
              "import tileplan.planner.cache, tileplan.bench   # (loaded in a planning process)\n"
              "for f in sys.argv[1:]:\n"
              "    p = pickle.loads(open(f, 'rb').read())\n"
              "    getattr(p, 'wait', lambda: None)()\n")
    subprocess.run([sys.executable, "-c", script, *files], check=True, cwd=tmp_path, capture_output=True, timeout=60)
    assert all((tmp_path / f"{kind}.ran").exists() for kind in PICKLES)
