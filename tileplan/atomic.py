"""The one safe writer: every file and folder tileplan writes goes through here.

``write_file(path, data)`` (plan -o, report --html, validate --outputs,
validation.json, bench artifacts) and ``write_folder(path, files, tag)``
(packages) write into a temporary sibling and rename it into place, so an
interrupted or failed write leaves the destination as it was. They refuse:

- a destination that is a symbolic link, a device, a FIFO or a socket (never
  followed, never replaced), a folder where a file is wanted, a file where a
  folder is wanted;
- a folder that is not one tileplan made: a package folder carries a marker
  file ``.tileplan-package`` holding its format tag (``manifest.json`` alone
  proves nothing), and an existing folder without it is only replaced when
  empty;
- the current folder or one of its parents (``-o .``), a folder inside a
  package, and anything under ``/proc`` or ``/sys``.

Every refusal and every OS error (disk full, permission, a path under a file) is
a ``TileplanError`` naming the path (that path only). Temporary names are
``.<name>.tileplan-tmp-<pid>-<random>`` (a name longer than 200 bytes is cut and given a hash
there, ``_tmp_stem``, so the temporary's name fits in 255 bytes); the temporary is removed on any
exception (``KeyboardInterrupt`` and the CLI's SIGTERM exception included).
One left behind by a killed process (its pid no longer running) is removed by
the next write to the same destination.

A package replaces an older one by an atomic exchange of the two folders
(Linux ``renameat2(RENAME_EXCHANGE)``), then the old one is deleted from the
temporary name: two processes writing one package never meet a half-moved
folder and never leave ``.old`` folders; the last writer wins. Where the
exchange is not available the old folder is first moved to a temporary name,
retried if another writer got in between.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import re
import secrets
import shutil
import signal
import stat
import threading
from pathlib import Path
from typing import Callable

from .errors import TileplanError

MARKER = ".tileplan-package"
TMP_TAG = ".tileplan-tmp-"
_SYSTEM = (Path("/proc"), Path("/sys"))


def write_file(path: str | Path, data: bytes | str) -> Path:
    """Write ``data`` to the regular file ``path`` atomically (see the module docstring)."""
    where = str(path)
    _check_file_destination(Path(path))
    path = Path(os.path.abspath(path))       # (normalised: ``a/../b`` is ``b``)
    if isinstance(data, str):
        data = data.encode("utf-8")
    _make_parent(path)
    _remove_stale(path)
    tmp = None
    try:
        tmp = path.parent / _tmp_name(path)
        _create(tmp, data)
        _check_file_destination(path)      # again, just before the rename
        with _signals_held() as held:
            if not held.pending():
                os.replace(tmp, path)
                tmp = None
    except OSError as exc:
        raise _os_error(where, "cannot write the file", exc) from None
    finally:
        if tmp is not None:
            _unlink_quietly(tmp)
    return Path(where)


def write_folder(path: str | Path, files: "dict[str, bytes] | Callable[[], dict[str, bytes]]", tag: str) -> Path:
    """Write the folder ``path`` holding ``files`` (relative names -> bytes) and the marker
    ``.tileplan-package`` (holding ``tag``), atomically; an existing folder is replaced only if it
    carries the marker (or is empty). ``files`` may be a function making them: it runs once the
    temporary folder exists, so an interruption while the files are made is cleaned up the same way."""
    where = str(path)
    _check_folder_destination(Path(path))
    path = Path(os.path.abspath(path))
    _make_parent(path)
    _remove_stale(path)
    tmp = None
    try:
        tmp = path.parent / _tmp_name(path)
        os.mkdir(tmp, 0o777)                                   # umask applies
        _create(tmp / MARKER, (tag + "\n").encode())           # first: a stale temp is recognisable
        if callable(files):
            files = files()
        for name, data in sorted(files.items()):
            rel = Path(name)
            if rel.is_absolute() or ".." in rel.parts or name == MARKER:
                raise _err(where, f"refusing to write the member {name!r}")
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            _create(tmp / rel, data)
        with _signals_held() as held:        # the swap and its clean-up run whole, or not at all
            if not held.pending():
                _swap_in(tmp, path)
                tmp_left, tmp = tmp, None    # it now holds the old package (or nothing)
                _rmtree_quietly(tmp_left)
    except OSError as exc:
        raise _os_error(where, "cannot write the package", exc) from None
    finally:
        if tmp is not None:
            _rmtree_quietly(tmp)
    return Path(where)


def check_file(path: str | Path) -> Path:
    """Refuse now what ``write_file(path)`` would refuse later (before a long run)."""
    path = Path(path)
    _check_file_destination(path)
    return path


def check_folder(path: str | Path) -> Path:
    """Refuse now what ``write_folder(path)`` would refuse later (before a long compile)."""
    path = Path(path)
    _check_folder_destination(path)
    return path


def is_package(path: str | Path) -> bool:
    """A folder tileplan wrote: a real folder (not a link) holding a regular ``.tileplan-package`` marker."""
    path = Path(path)
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return False
        fd = os.open(path / MARKER, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        return os.read(fd, 200).startswith(b"tileplan-package/")
    finally:
        os.close(fd)


# ---- destination checks ---------------------------------------------------------------------

def _lstat(path: Path):
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise _err(path, "a parent of this path is a file, not a folder") from None
    except OSError as exc:
        raise _os_error(str(path), "cannot inspect the path", exc) from None


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISREG(mode):
        return "a file"
    return "a special file"


def _check_common(path: Path, folder: bool) -> None:
    absolute = Path(os.path.abspath(path))
    real_parent = Path(os.path.realpath(absolute.parent))
    for system in _SYSTEM:
        if real_parent == system or system in real_parent.parents:
            raise _err(path, f"is under {system}, a system filesystem; not writing there")
    for parent in absolute.parents:
        st = _lstat(parent)
        if st is not None and not stat.S_ISDIR(st.st_mode) and not stat.S_ISLNK(st.st_mode):
            raise _err(path, f"{parent} is a file, not a folder")
        if folder and is_package(parent):
            raise _err(path, f"is inside the tileplan package {parent}; write it elsewhere")


def _check_file_destination(path: Path) -> None:
    if path.name in ("", ".", ".."):
        raise _err(path, "names a folder; give a file path")
    _check_common(path, folder=False)
    st = _lstat(path)
    if st is not None and not stat.S_ISREG(st.st_mode):
        hint = "; give a file path" if stat.S_ISDIR(st.st_mode) else "; not replacing it"
        raise _err(path, f"is {_kind(st.st_mode)}{hint}")


def _check_folder_destination(path: Path) -> None:
    absolute = Path(os.path.abspath(path))
    cwd = Path(os.path.abspath(os.getcwd()))
    if absolute == cwd or absolute in cwd.parents:
        raise _err(path, "is the current folder or one of its parents; "
                            "give the package a folder of its own")
    _check_common(path, folder=True)
    st = _lstat(path)
    if st is None:
        return
    if not stat.S_ISDIR(st.st_mode):
        raise _err(path, f"exists and is {_kind(st.st_mode)}, not a tileplan package; not replacing it")
    if not is_package(path) and _has_entries(path):
        raise _err(path, "exists and is not a tileplan package; not overwriting it "
                            f"(it has no {MARKER} marker)")


def _has_entries(path: Path) -> bool:
    try:
        with os.scandir(path) as it:
            return any(True for _ in it)
    except OSError as exc:
        raise _os_error(str(path), "cannot read the folder", exc) from None


def _make_parent(path: Path) -> None:
    parent = Path(os.path.abspath(path)).parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise _err(path, "a parent of this path is a file, not a folder") from None
    except OSError as exc:
        raise _os_error(str(path), "cannot create its folder", exc) from None


# ---- temporaries ---------------------------------------------------------------------------

# The longest name part a temporary keeps whole: with ``.``, ``TMP_TAG``, a pid (at most 10
# digits) and ``-<8 hex>`` a temporary name stays within NAME_MAX (255 bytes on Linux file systems).
_STEM_MAX = 200


def _tmp_stem(name: str) -> str:
    """The destination name as its temporaries spell it: the name itself, or, when its encoding is
    longer than ``_STEM_MAX`` bytes, its first bytes, ``~`` and 16 hex digits of its SHA-256.

    Design decision: cut and hash rather than refuse: a destination name of up to 255 bytes is valid
    and must be writable, and the temporary's name has to leave room for the tag, the pid and the
    random part. The stem depends on the name alone, so ``_remove_stale`` finds a killed run's
    leftovers by the same stem, and distinct long names sharing their first bytes still differ."""
    raw = os.fsencode(name)
    if len(raw) <= _STEM_MAX:
        return name
    digest = hashlib.sha256(raw).hexdigest()[:16]
    return os.fsdecode(raw[:_STEM_MAX - 17]) + "~" + digest


def _tmp_name(path: Path) -> str:
    stem = _tmp_stem(Path(os.path.abspath(path)).name)
    return f".{stem}{TMP_TAG}{os.getpid()}-{secrets.token_hex(4)}"


def _remove_stale(path: Path) -> None:
    """Remove temporaries of ``path`` whose writer is no longer running (a killed run)."""
    absolute = Path(os.path.abspath(path))
    pattern = re.compile(re.escape(f".{_tmp_stem(absolute.name)}{TMP_TAG}") + r"(\d+)-[0-9a-f]{8}")
    try:
        entries = list(os.scandir(absolute.parent))
    except OSError:
        return
    for e in entries:
        m = pattern.fullmatch(e.name)
        if m is None or _alive(int(m.group(1))):
            continue
        if e.is_dir(follow_symlinks=False):
            # ours by name and marker (perhaps still empty: killed while writing it), or empty
            # (killed before the marker was written)
            marker = Path(e.path) / MARKER
            if marker.is_file() and not marker.is_symlink() or not _has_entries_quietly(e.path):
                _rmtree_quietly(Path(e.path))
        elif e.is_file(follow_symlinks=False):
            _unlink_quietly(Path(e.path))


def _has_entries_quietly(path) -> bool:
    try:
        with os.scandir(path) as it:
            return any(True for _ in it)
    except OSError:
        return True


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OverflowError:
        return False
    return True


def _create(path: Path, data: bytes) -> None:
    """A new regular file (never through a link; the umask applies) holding ``data``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _rmtree_quietly(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


# ---- putting a folder in place -------------------------------------------------------------

def _swap_in(tmp: Path, path: Path) -> None:
    """Put ``tmp`` at ``path``; afterwards ``tmp`` holds the replaced package, or does not exist."""
    for _ in range(100):
        try:
            os.rename(tmp, path)             # path absent, or an empty folder
            return
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        # path is a non-empty folder (perhaps another writer just put its package there)
        if not is_package(path):
            raise _err(path, "exists and is not a tileplan package; not overwriting it "
                                f"(it has no {MARKER} marker)")
        if _exchange(tmp, path):
            return
        aside = path.parent / _tmp_name(path)
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            continue                          # another writer moved it first: try again
        try:
            os.rename(tmp, path)
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            _rmtree_quietly(aside)
            continue
        os.rename(aside, tmp)                 # the old package, for the caller to delete
        return
    raise _err(path, "other processes keep replacing this package; try again")


class _signals_held:
    """Hold SIGINT and SIGTERM while the destination is replaced and the old copy removed: a signal
    arriving before is seen (``pending``) and the destination is left as it was; one arriving during
    is delivered (as the CLI's exception) once the replacement is complete."""

    SIGNALS = {signal.SIGINT, signal.SIGTERM}

    def __enter__(self):
        self.saved = None
        if hasattr(signal, "pthread_sigmask") and threading.current_thread() is threading.main_thread():
            self.saved = signal.pthread_sigmask(signal.SIG_BLOCK, self.SIGNALS)
        return self

    def pending(self) -> bool:
        return self.saved is not None and bool(signal.sigpending() & self.SIGNALS)

    def __exit__(self, *exc):
        if self.saved is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, self.saved)
        return False


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2); False where the system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    r = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if r == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _err(path, message: str) -> TileplanError:
    """An error about the destination ``path``: it names that path only (its ``source``), so a caller
    that names its own input on errors without a source (the CLI's model file) leaves it alone."""
    return TileplanError(message, source=str(path))


def _os_error(where: str, what: str, exc: OSError) -> TileplanError:
    reason = exc.strerror or str(exc)
    if exc.errno == errno.ENOSPC:
        reason = "the disk is full"
    return _err(where, f"{what} ({reason})")
