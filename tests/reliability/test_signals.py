"""SIGINT and SIGTERM during ``tileplan compile``: no temporary folder, no surviving worker, no hang,
and the output path untouched.

The compile (SigLIP MLP b1 with two pool workers, a few seconds; the residual block
where the signal waits for the package folder) runs in a session of its own, so every process it starts can be found afterwards by its session id. A
signal is sent after a delay (while the catalogue pool is costing), shortly after
the pool's workers start, or the moment the temporary package folder appears
(while the package is made and written).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reliability_corpus import FIXTURES

MODEL = FIXTURES / "siglip_mlp_fp8_b1.toml"
QUICK = FIXTURES / "residual_block.toml"


def session_members(sid: int) -> list[int]:
    """Processes still running (not zombies) in session ``sid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        state, session = fields[0], int(fields[3])
        if session == sid and state != "Z":
            found.append(int(entry.name))
    return found


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def interrupted_compile(tmp_path, small_package, sig, when, model=MODEL, target="ipu21"):
    out = tmp_path / "out"
    shutil.copytree(small_package, out)            # an older package at the output path
    before = snapshot(out)
    env = {**os.environ, "COLUMNS": "120"}
    if when == "temp":               # planned in a few seconds; making and writing its package takes 0.2 s
        model, target = QUICK, None
    argv = ["compile", str(model), "-o", str(out), "-j", "2"] + (["--target", target] if target else [])
    proc = subprocess.Popen([sys.executable, "-m", "tileplan.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, env=env, cwd=tmp_path)
    try:
        if when == "delay":
            time.sleep(4.0)
        elif when == "pool":                         # shortly after the pool's workers start
            deadline = time.monotonic() + 120
            while len(session_members(proc.pid)) < 2:
                assert proc.poll() is None, "compile ended before starting its pool"
                assert time.monotonic() < deadline
                time.sleep(0.01)
            time.sleep(0.5)
        else:                                        # the moment the temporary folder appears
            deadline = time.monotonic() + 120
            while not any(p.name.startswith(".out.tileplan-tmp-") for p in tmp_path.iterdir()):
                assert proc.poll() is None, "compile ended before writing its package"
                assert time.monotonic() < deadline
                time.sleep(0.001)
        assert proc.poll() is None, "compile ended before the signal"
        running = session_members(proc.pid)
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)                 # Ctrl-C: the whole foreground group
        else:
            proc.send_signal(sig)                    # kill PID
        _, err = proc.communicate(timeout=60)        # no hang
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    deadline = time.monotonic() + 10
    while session_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc.returncode, err.decode(), out, before, running, session_members(proc.pid)


CASES = [(signal.SIGINT, "delay"), (signal.SIGTERM, "delay"), (signal.SIGINT, "pool"), (signal.SIGTERM, "pool"),
         (signal.SIGINT, "temp"), (signal.SIGTERM, "temp")]


@pytest.mark.slow
@pytest.mark.parametrize("sig, when", CASES, ids=[f"{s.name} {w}" for s, w in CASES])
def test_a_signal_during_compile_leaves_no_temporary_folder_no_worker_and_the_output_untouched(
        tmp_path, small_package, sig, when):
    code, err, out, before, running, left = interrupted_compile(tmp_path, small_package, sig, when)
    if when == "pool":
        assert len(running) >= 2, "the signal should reach the compile while its pool workers run"
    assert code == 128 + sig, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: interrupted by {sig.name}"), err
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert snapshot(out) == before
    assert left == [], "no process of the compile may survive it"


@pytest.mark.slow
def test_sigterm_while_one_gemms_detailed_costing_runs_on_the_pool_leaves_nothing(tmp_path, small_package):
    """A single GEMM splits its detailed costing over the pool (``gemm_candidates``), another pool."""
    code, err, out, before, running, left = interrupted_compile(
        tmp_path, small_package, signal.SIGTERM, "pool", model=FIXTURES / "gemm_4096_fp16.toml", target="ipu2")
    assert code == 128 + signal.SIGTERM, err
    assert len(running) >= 2 and left == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] and snapshot(out) == before


@pytest.mark.slow
def test_pool_workers_die_with_a_compile_killed_outright(tmp_path, small_package):
    code, err, out, before, running, left = interrupted_compile(tmp_path, small_package, signal.SIGKILL, "pool")
    assert code == -signal.SIGKILL and len(running) >= 2
    assert left == [], "workers must not outlive their parent"
    assert snapshot(out) == before


@pytest.mark.slow
def test_the_next_compile_removes_the_temporary_folder_of_a_killed_one(tmp_path, small_package):
    from reliability_corpus import SMOKE
    code, _, out, before, _, _ = interrupted_compile(tmp_path, small_package, signal.SIGKILL, "temp")
    assert code == -signal.SIGKILL
    assert len([p for p in tmp_path.iterdir() if p.name.startswith(".out.tileplan-tmp-")]) == 1
    assert snapshot(out) == before
    done = subprocess.run([sys.executable, "-m", "tileplan.cli", "compile", str(SMOKE), "-o", str(out), "-j", "1"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_the_command_line_is_still_starting_gives_the_one_line_not_a_traceback(tmp_path, sig):
    """0.3 s in, the CLI is still importing numpy and the rest (or, on a fast machine, planning):
    either way one ``error: interrupted`` line and 128 + the signal."""
    proc = subprocess.Popen([sys.executable, "-m", "tileplan.cli", "compile", str(MODEL), "-o", str(tmp_path / "out")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, cwd=tmp_path)
    try:
        time.sleep(0.3)
        os.killpg(proc.pid, sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    lines = err.decode().strip().splitlines()
    assert proc.returncode == 128 + sig and len(lines) == 1, err.decode()
    assert lines[0].startswith(f"error: interrupted by {sig.name}")
    assert not (tmp_path / "out").exists()
