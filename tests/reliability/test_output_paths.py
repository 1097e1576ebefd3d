"""Output paths: tileplan writes a regular file or a package it made, or refuses and deletes nothing."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

from reliability_corpus import SMOKE, assert_refused

from tileplan import atomic
from tileplan.lowering.package import FORMAT, write_package


def compile_to(cli, out, *extra):
    return cli("compile", SMOKE, "-o", out, "-j", "1", *extra)


def tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# ---- compile -o -------------------------------------------------------------------------------------

def test_compile_keeps_a_users_folder_even_if_it_holds_a_manifest_json(cli, tmp_path):
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "manifest.json").write_text('{"format": "tileplan-package/1", "files": {}}')
    (folder / "notes.txt").write_text("mine")
    assert_refused(compile_to(cli, folder), folder, "not a tileplan package")
    assert tree(tmp_path) == ["work", "work/manifest.json", "work/notes.txt"]


@pytest.mark.parametrize("where", ["an existing file", "a path under a file", "a symbolic link to a package",
                                   "a symbolic link to nowhere", "/proc/x", "/sys/x", "a FIFO"])
def test_compile_refuses_an_output_that_is_not_a_package_folder_and_deletes_nothing(cli, small_package, tmp_path,
                                                                                   where):
    (tmp_path / "file").write_text("keep")
    out = {"an existing file": tmp_path / "file", "a path under a file": tmp_path / "file" / "pkg",
           "a symbolic link to a package": tmp_path / "link", "a symbolic link to nowhere": tmp_path / "dangling",
           "/proc/x": "/proc/x", "/sys/x": "/sys/x", "a FIFO": tmp_path / "fifo"}[where]
    if where == "a symbolic link to a package":
        os.symlink(small_package, out)
    elif where == "a symbolic link to nowhere":
        os.symlink(tmp_path / "nowhere", out)
    elif where == "a FIFO":
        os.mkfifo(out)
    before = tree(tmp_path)
    package_before = tree(small_package)
    assert_refused(compile_to(cli, out), out)
    assert tree(tmp_path) == before and (tmp_path / "file").read_text() == "keep"
    assert tree(small_package) == package_before


def test_compile_into_the_current_folder_inside_a_package_is_refused(cli, small_package, tmp_path, monkeypatch):
    import shutil
    pkg = tmp_path / "pkg"
    shutil.copytree(small_package, pkg)
    before = tree(tmp_path)
    monkeypatch.chdir(pkg)
    assert_refused(compile_to(cli, "."), "current folder")
    assert_refused(compile_to(cli, "sub"), "inside the tileplan package")
    assert tree(tmp_path) == before                  # no ..old.* or temporary folders anywhere


def test_compile_into_an_empty_folder_writes_the_package_there(cli, tmp_path):
    (tmp_path / "empty").mkdir()
    code, _, err = compile_to(cli, tmp_path / "empty")
    assert code == 0, err
    assert atomic.is_package(tmp_path / "empty") and (tmp_path / "empty" / "manifest.json").is_file()


def test_a_package_carries_its_own_marker_with_the_format_tag(small_package):
    assert (small_package / ".tileplan-package").read_text() == FORMAT + "\n"


# ---- plan -o and report --html ------------------------------------------------------------------------

FILE_DESTINATIONS = ["a folder", "a FIFO", "a symbolic link", "a device", "a path under a file", "/proc/x"]


def _file_destination(tmp_path, where):
    (tmp_path / "file").write_text("keep")
    if where == "a folder":
        (tmp_path / "dir").mkdir()
        return tmp_path / "dir"
    if where == "a FIFO":
        os.mkfifo(tmp_path / "fifo")
        return tmp_path / "fifo"
    if where == "a symbolic link":
        os.symlink(tmp_path / "file", tmp_path / "link")
        return tmp_path / "link"
    if where == "a path under a file":
        return tmp_path / "file" / "out"
    return {"a device": "/dev/null", "/proc/x": "/proc/x"}[where]


@pytest.mark.parametrize("where", FILE_DESTINATIONS)
def test_plan_output_refuses_anything_but_a_regular_file(cli, tmp_path, where):
    dest = _file_destination(tmp_path, where)
    before = tree(tmp_path)
    assert_refused(cli("plan", SMOKE, "-o", dest, "-j", "1"), dest)
    assert tree(tmp_path) == before and (tmp_path / "file").read_text() == "keep"


@pytest.mark.parametrize("where", FILE_DESTINATIONS)
def test_report_html_refuses_anything_but_a_regular_file(cli, small_package, tmp_path, where):
    dest = _file_destination(tmp_path, where)
    before = tree(tmp_path)
    assert_refused(cli("report", small_package, "--html", dest), dest)
    assert tree(tmp_path) == before and (tmp_path / "file").read_text() == "keep"


def test_plan_output_replaces_a_regular_file(cli, tmp_path):
    dest = tmp_path / "plan.json"
    dest.write_text("old")
    code, _, err = cli("plan", SMOKE, "-o", dest, "-j", "1")
    assert code == 0, err
    assert dest.read_text().startswith("{") and tree(tmp_path) == ["plan.json"]


# ---- temporaries, faults and concurrent writers -------------------------------------------------------

def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_stale_temporary_package_of_a_killed_run_is_removed_by_the_next_compile(cli, tmp_path):
    pid = dead_pid()
    stale = tmp_path / f".pkg.tileplan-tmp-{pid}-0123abcd"
    stale.mkdir()
    (stale / ".tileplan-package").write_text(FORMAT + "\n")
    (stale / "plan.json").write_text("{}")
    empty = tmp_path / f".pkg.tileplan-tmp-{pid}-89abcdef"          # killed before its marker was written
    empty.mkdir()
    users = tmp_path / f".pkg.tileplan-tmp-{pid}-deadbeef"           # same name pattern, not ours
    users.mkdir()
    (users / "notes.txt").write_text("mine")
    live = tmp_path / ".pkg.tileplan-tmp-1-00000000"                  # pid 1 runs: another writer's
    live.mkdir()
    (live / ".tileplan-package").write_text(FORMAT + "\n")
    code, _, err = compile_to(cli, tmp_path / "pkg")
    assert code == 0, err
    assert not stale.exists() and not empty.exists()
    assert (users / "notes.txt").read_text() == "mine" and live.exists()


def test_a_disk_full_during_compile_is_one_error_line_and_leaves_nothing(cli, tmp_path, monkeypatch):
    real = atomic._create
    count = {"n": 0}

    def full(path, data):
        count["n"] += 1
        if count["n"] > 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real(path, data)

    monkeypatch.setattr(atomic, "_create", full)
    assert_refused(compile_to(cli, tmp_path / "pkg"), tmp_path / "pkg", "disk is full")
    assert tree(tmp_path) == []


def test_a_disk_full_during_validate_keeps_the_previous_validation_record(cli, small_package, tmp_path,
                                                                          monkeypatch):
    import shutil
    pkg = tmp_path / "pkg"
    shutil.copytree(small_package, pkg)
    code, _, err = cli("validate", pkg)
    assert code == 0, err
    previous = (pkg / "validation.json").read_text()

    def full(path, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(atomic, "_create", full)
    assert_refused(cli("validate", pkg), pkg / "validation.json", "disk is full")
    assert (pkg / "validation.json").read_text() == previous
    assert not [p for p in pkg.iterdir() if "tileplan-tmp" in p.name]
    monkeypatch.undo()
    code, out, err = cli("report", pkg)
    assert code == 0, err


WRITERS = """
import sys
from tileplan.lowering.package import write_package
for i in range(int(sys.argv[2])):
    write_package(sys.argv[1], {"a.txt": sys.argv[3].encode() * 1000, "sub/b.txt": str(i).encode()})
"""


def test_two_processes_writing_one_package_never_fail_and_leave_no_old_folders(tmp_path):
    out = tmp_path / "pkg"
    write_package(out, {"a.txt": b"seed"})
    procs = [subprocess.Popen([sys.executable, "-c", WRITERS, str(out), "150", tag], stderr=subprocess.PIPE)
             for tag in ("A", "B")]
    errs = [p.communicate()[1].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pkg"]
    assert sorted(p.name for p in out.iterdir()) == [".tileplan-package", "a.txt", "sub"]
    assert (out / "a.txt").read_text() in ("A" * 1000, "B" * 1000)
