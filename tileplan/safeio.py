"""The one safe reader: every file tileplan reads from disk comes through here.

What a user, a shared cache folder or a package hands tileplan may be hostile: a FIFO where a
file should be (a read that never returns), a link to ``/dev/zero`` (one that never ends), a
multi-gigabyte file, a zip bomb, an ``.npy`` header that claims terabytes, JSON with ``NaN`` or
a 100,000-digit integer. Each reader here refuses those with one ``TileplanError`` naming the
file and the problem, before any large allocation:

- ``read_file(path, limit, what)``: the bytes of a regular file of at most ``limit`` bytes. The
  file is opened non-blocking (a FIFO never blocks the open), checked with ``fstat`` to be a
  regular file (not a FIFO, device, socket or folder), and read up to ``limit + 1`` bytes, so a
  file that grows while read is still caught.
- ``read_range(path, offset, length, what)``: exactly ``length`` bytes from ``offset`` of a regular
  file at least that long (ONNX external data), nothing more read.
- ``load_json(path_or_bytes, limit, what)``: one JSON document whose numbers are finite (no
  ``NaN``/``Infinity``) and whose integers fit in int64.
- ``load_npz(path_or_bytes, limit, what)``: the arrays of an ``.npz`` without pickles. Every
  member must be an ``.npy`` whose header declares a plain numeric or boolean dtype; the sum of
  the declared sizes is bounded by ``limit`` before anything is decompressed, and each member
  is read back to exactly its declared size (a member whose zip entry holds more or fewer bytes
  is damaged).

Design decision: the limits are arguments, set by each caller from what it reads (a package's
program is bounded by the target's SRAM, a plan-cache entry by a fixed cap), rather than one
global figure: ``LIMITS`` below names the caps the callers share.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import stat
import zipfile
import zlib
from pathlib import Path

import numpy as np

from .errors import TileplanError

MiB = 1 << 20
GiB = 1 << 30

# The caps callers share (bytes). A JSON document of a package (plan.json, report.json,
# program.json of the 27-layer tower: under 40 MiB) and a model or inputs file.
LIMITS = {
    "json": 256 * MiB,
    "npz": 16 * GiB,          # decompressed; callers bound it tighter where they know the shapes
    "cache_entry": 256 * MiB,
    "onnx": 2 * GiB,          # protobuf's own limit for one message; larger models keep weights as external data
    "model_toml": 64 * MiB,   # a TOML model (the 27-layer tower's is under 100 KB: parameters are seeded, not listed)
    "small_toml": 4 * MiB,    # a target or pins file
}

_INT64 = 1 << 63
_NPY_KINDS = "biuf"           # bool, signed, unsigned, float: nothing that can hold an object


@contextlib.contextmanager
def _regular_fd(where: str, what: str, follow: bool = True, attributed: bool = True):
    """An open, blocking file descriptor of the regular file ``where`` and its ``fstat``: opened
    non-blocking (a FIFO never blocks the open), then refused unless ``fstat`` says a regular
    file; ``follow=False`` refuses a symbolic link. Closed on exit; OS errors become one line.
    ``attributed=False``: the path is part of the message rather than the error's ``source``, so
    a caller reading on behalf of another file (a model's external data) can still name that one."""
    def error(message: str) -> TileplanError:
        return TileplanError(message, source=where) if attributed else TileplanError(f"{where}: {message}")

    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(where, flags)
    except FileNotFoundError:
        raise error(f"no such {what}") from None
    except IsADirectoryError:
        raise error(f"is a folder, not a {what}") from None
    except OSError as exc:
        if not follow and os.path.islink(where):
            raise error(f"is a symbolic link; refusing to read the {what} through it") from None
        raise error(f"cannot read the {what} ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise error(f"is a folder, not a {what}")
        if not stat.S_ISREG(st.st_mode):
            raise error(f"is a {_kind(st.st_mode)}, not a regular file; refusing to read the {what}")
        os.set_blocking(fd, True)
        yield fd, st
    except OSError as exc:
        raise error(f"cannot read the {what} ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def read_range(path: str | os.PathLike, offset: int, length: int, what: str = "file",
               follow: bool = True) -> bytes:
    """Exactly ``length`` bytes of the regular file ``path`` from ``offset`` (a file shorter than
    ``offset + length`` is refused, naming both): what a format that points into a larger file
    (ONNX external data) needs, without reading the rest. ``follow=False``: a symbolic link at
    ``path`` is refused."""
    where = str(path)
    if offset < 0 or length < 0:
        raise TileplanError(f"{where}: a negative offset or length ({offset}, {length}) into the {what}")
    with _regular_fd(where, what, follow, attributed=False) as (fd, st):
        if st.st_size < offset + length:
            raise TileplanError(f"{where}: the {what} is {st.st_size:,} bytes, too short for {length:,} bytes "
                                f"at offset {offset:,}")
        chunks, got = [], 0
        while got < length:
            chunk = os.pread(fd, min(length - got, 16 * MiB), offset + got)
            if not chunk:
                raise TileplanError(f"{where}: the {what} shrank while read ({offset + got:,} bytes)")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)


def read_file(path: str | os.PathLike, limit: int, what: str = "file") -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them (see the module docstring)."""
    where = str(path)
    with _regular_fd(where, what) as (fd, st):
        if st.st_size > limit:
            raise TileplanError(f"the {what} is {st.st_size:,} bytes, more than the limit of {limit:,}", source=where)
        chunks, got = [], 0
        while got <= limit:
            chunk = os.read(fd, min(limit + 1 - got, 16 * MiB))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > limit:
            raise TileplanError(f"the {what} grew past the limit of {limit:,} bytes while read", source=where)
        return b"".join(chunks)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a finite number")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > 19:
        raise ValueError(f"the integer {text[:24]}... does not fit in 64 bits")
    v = int(text)
    if not -_INT64 <= v < _INT64:
        raise ValueError(f"the integer {text} does not fit in 64 bits")
    return v


def _finite_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"{text[:24]} is not a finite number")
    return v


def parse_json(data: bytes | str, where: str, what: str = "JSON document"):
    """One JSON document from ``data``: finite numbers, int64 integers, valid UTF-8."""
    try:
        return json.loads(data, parse_constant=_refuse_constant, parse_int=_bounded_int,
                          parse_float=_finite_float)
    except UnicodeDecodeError:
        raise TileplanError(f"{where}: damaged {what} (not UTF-8 text)") from None
    except json.JSONDecodeError as exc:
        raise TileplanError(f"{where}: damaged {what} (not JSON: {exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise TileplanError(f"{where}: damaged {what} (JSON nested too deeply)") from None
    except ValueError as exc:
        raise TileplanError(f"{where}: damaged {what} ({exc})") from None


def load_json(path: str | os.PathLike, limit: int = LIMITS["json"], what: str = "JSON document"):
    """``parse_json`` of the regular file ``path`` of at most ``limit`` bytes."""
    return parse_json(read_file(path, limit, what), str(path), what)


def load_json_object(path: str | os.PathLike, limit: int = LIMITS["json"], what: str = "JSON document") -> dict:
    doc = load_json(path, limit, what)
    if not isinstance(doc, dict):
        raise TileplanError(f"{path}: damaged {what} (a JSON {type(doc).__name__}, not an object)")
    return doc


def load_npz(source: str | os.PathLike | bytes, limit: int = LIMITS["npz"], what: str = "npz file",
             where: str | None = None, file_limit: int | None = None) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` (a path, read with ``read_file``, or its bytes), by member name
    without ``.npy``; at most ``limit`` bytes of array data in all (declared sizes, checked before
    any member is decompressed). ``file_limit``: the cap on the file itself (default ``limit``:
    a stored npz is never larger than its data plus headers, a compressed one smaller)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        data, where = bytes(source), where or what
    else:
        where = where or str(source)
        data = read_file(source, (file_limit or limit) + 64 * MiB, what)
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, ValueError, OSError, EOFError):
        raise TileplanError(f"{where}: damaged {what} (not a readable npz)") from None
    out: dict[str, np.ndarray] = {}
    total = 0
    try:
        with zf:
            infos = zf.infolist()
            if len(infos) > 1_000_000:
                raise TileplanError(f"{where}: damaged {what} ({len(infos):,} members)")
            for info in infos:
                name = info.filename
                if not name.endswith(".npy") or info.is_dir():
                    raise TileplanError(f"{where}: damaged {what} (member {name[:80]!r} is not an .npy array)")
                key = name[:-4]
                if key in out:
                    raise TileplanError(f"{where}: damaged {what} (member {key[:80]!r} appears twice)")
                with zf.open(info) as fh:
                    shape, fortran, dtype = _npy_header(fh, where, what, key)
                    count = math.prod(shape)
                    nbytes = count * dtype.itemsize
                    total += nbytes
                    if total > limit:
                        raise TileplanError(f"{where}: {what} declares more than {limit:,} bytes of arrays "
                                            f"(at member {key[:80]!r}: shape {list(shape)} {dtype})")
                    header_len = fh.tell()
                    if info.file_size != header_len + nbytes:
                        raise TileplanError(f"{where}: damaged {what} (member {key[:80]!r} holds "
                                            f"{info.file_size - header_len:,} bytes of data, its header declares "
                                            f"{nbytes:,})")
                    raw = _read_exact(fh, nbytes)
                    if len(raw) != nbytes:
                        raise TileplanError(f"{where}: damaged {what} (member {key[:80]!r} is truncated)")
                a = np.frombuffer(raw, dtype=dtype, count=count)
                a = a.reshape(shape, order="F" if fortran else "C")
                out[key] = np.ascontiguousarray(a) if fortran else a
    except TileplanError:
        raise
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError, ValueError, NotImplementedError,
            RuntimeError) as exc:
        raise TileplanError(f"{where}: damaged {what} ({type(exc).__name__}: {str(exc)[:120]})") from None
    return out


def _read_exact(fh, n: int) -> bytearray:
    """Exactly ``n`` bytes of ``fh`` into a fresh (writable) buffer; fewer or more is returned as a
    buffer of another length for the caller to report."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = fh.readinto(view[got:])
        if not k:
            return buf[:got]
        got += k
    if fh.read(1):
        return buf + b"!"                  # (longer than declared)
    return buf


def _npy_header(fh, where: str, what: str, key: str):
    """(shape, fortran_order, dtype) of an ``.npy`` stream, its dtype plain (no objects, no fields)."""
    try:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh, max_header_size=10_000)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh, max_header_size=10_000)
        else:
            raise ValueError(f"npy version {version}")
    except (ValueError, SyntaxError, TypeError, EOFError, OSError) as exc:
        raise TileplanError(f"{where}: damaged {what} (member {key[:80]!r}: not an .npy array: "
                            f"{str(exc)[:80]})") from None
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None or \
            dtype.kind not in _NPY_KINDS:
        raise TileplanError(f"{where}: {what} member {key[:80]!r} holds {dtype} values; only numbers are read")
    if not all(isinstance(d, int) and 0 <= d < _INT64 for d in shape) or math.prod(shape) >= _INT64 // 16:
        raise TileplanError(f"{where}: damaged {what} (member {key[:80]!r} declares shape {list(shape)[:8]})")
    return tuple(shape), bool(fortran), dtype


def regular_file(path: str | os.PathLike, what: str = "file") -> Path:
    """``path`` if it names a regular file (checked without following into FIFOs or devices)."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise TileplanError(f"no such {what}", source=str(p)) from None
    except OSError as exc:
        raise TileplanError(f"cannot read the {what} ({exc.strerror or exc})", source=str(p)) from None
    if stat.S_ISDIR(st.st_mode):
        raise TileplanError(f"is a folder, not a {what}", source=str(p))
    if not stat.S_ISREG(st.st_mode):
        raise TileplanError(f"is a {_kind(st.st_mode)}, not a regular file; refusing to read the {what}", source=str(p))
    return p
