"""The plan cache on disk: GEMM catalogue results keyed by (op key, target key, tileplan version).

A GEMM's catalogue (its kept candidates and its runner-ups, without their fragment programs,
which ``catalogue.program_of`` rebuilds from each candidate's grid choice) is the expensive part
of planning. It depends on the op's planning problem (``canon.op_key``), the machine
(``canon.target_key``), the tileplan version and the catalogue's frontier bound, nothing else;
an entry holds the names of the op it was costed for, and ``canon.Renaming`` maps them onto the
op that reads it.

Location: ``~/.cache/tileplan`` (``$XDG_CACHE_HOME/tileplan`` when set), or the folder given
(``--cache DIR``); ``--no-cache`` plans without it. One file per entry,
``<sha256 of the key>.entry``: a header line (format, then the full key as JSON) and a
zlib-compressed body, one JSON document (``cachecodec``): the key again, the value, and its int64
arrays and byte strings in base64. Writes go to a temporary file in the same folder, then
``os.replace`` (atomic).

Design decision: entries are data only, never pickles. A cache folder may be shared, restored
from CI or written by anyone with access to ``~/.cache``, and any unpickler, however restricted,
can be walked into building something that runs code. The codec builds objects only from an
allowlist of fixed tags, through their constructors, with every field's type checked
(``cachecodec.CLASSES``), and the planner checks what types cannot: that the entry's names are
the reading op's (``catalogue.cached_catalogue``), that picks fit the selection problem
(``plan.selection``).

Reading an entry: ``safeio.read_file`` (a regular file only, at most ``LIMIT`` bytes: a FIFO, a
link to a device or a folder in its place is refused without blocking), the header's format and
key compared, the body inflated to at most ``LIMIT`` bytes (``inflate``: a zlib bomb stops
there), then decoded against the schema the caller names. An entry that fails any of these is
ignored with one warning line on stderr (``warning: plan cache entry <file> is corrupt or foreign
(<why>); ignored``), never trusted, and replaced by the fresh result. Results do not depend on
the cache: a warm plan is byte-identical
to a cold one (tests/planner/test_cache.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import zlib
from pathlib import Path

from ..checked import printable
from ..errors import TileplanError
from ..safeio import LIMITS, read_file
from . import cachecodec
from .cachecodec import EntryError

FORMAT = "tileplan-plan-cache 3"        # 3: data only (JSON and base64 arrays, ``cachecodec``), no pickle
SUFFIX = ".entry"
LIMIT = LIMITS["cache_entry"]           # bytes of an entry on disk, and of its body decompressed


def default_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tileplan"


def inflate(body: bytes, limit: int = LIMIT) -> bytes:
    """``body`` decompressed, at most ``limit`` bytes of it: a zlib bomb is refused after ``limit``
    bytes, never inflated whole; a truncated stream is refused too."""
    d = zlib.decompressobj()
    try:
        out = d.decompress(body, limit + 1)
    except zlib.error as e:
        raise EntryError(f"its body does not decompress ({e})") from None
    if len(out) > limit or d.unconsumed_tail:
        raise EntryError(f"its body decompresses to more than {limit:,} bytes")
    if not d.eof:
        raise EntryError("its body is truncated")
    if d.unused_data:
        raise EntryError("its body has trailing bytes")
    return out


def _print_warning(line: str) -> None:
    """A cache warning on stderr, escaped (``checked.printable``): it quotes the cache folder's path
    and what a foreign entry holds, neither of which may act on the terminal."""
    print(printable(line), file=sys.stderr)


class PlanCache:
    """One cache folder. ``load(key)`` -> the stored value or None; ``store(key, value)``."""

    def __init__(self, path: str | os.PathLike | None = None, warn=None):
        self.path = Path(path) if path is not None else default_dir()
        self.warn = warn or _print_warning
        self.hits = self.misses = 0

    @staticmethod
    def full_key(op_key: str, target_key: str, extra: dict) -> dict:
        from .._version import __version__
        return {"op": op_key, "target": target_key, "tileplan": __version__, **extra}

    def file_of(self, key: dict) -> Path:
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
        return self.path / f"{digest}{SUFFIX}"

    def has(self, key: dict) -> bool:
        """Whether an entry is there for ``key`` (not whether it is sound: ``load`` checks that)."""
        return self.file_of(key).is_file()

    def load(self, key: dict, schema, tiles: int):
        """The value stored for ``key``, checked against ``schema`` (``cachecodec.CATALOGUE`` or
        ``SELECTION``) on a target of ``tiles`` tiles; None when there is none or it is not sound
        (then one warning line: the caller computes the value afresh and stores it over the entry)."""
        f = self.file_of(key)
        try:
            data = read_file(f, LIMIT, "plan cache entry")
        except TileplanError as e:
            if not os.path.lexists(f):
                self.misses += 1
                return None
            why = str(e).removeprefix(f"{f}: ")
            return self.reject(key, why)
        try:
            head, newline, body = data.partition(b"\n")
            if not newline:
                raise EntryError("it has no header line")
            fmt, _, stored_key = head.decode("utf-8", "replace").partition(" key=")
            if fmt != FORMAT:
                raise EntryError(f"format {fmt[:40]!r}, expected {FORMAT!r}")
            if stored_key != json.dumps(key, sort_keys=True):
                raise EntryError("it was written for another key")
            value = cachecodec.decode(inflate(body), key, schema, tiles, str(f))
        except EntryError as e:
            return self.reject(key, str(e))
        self.hits += 1
        return value

    def reject(self, key: dict, why: str, loaded: bool = False) -> None:
        """Count the entry for ``key`` as a miss, with the one warning line saying why it is not used;
        ``loaded``: by a caller that ``load`` gave it to and finds it does not fit what it reads (a
        name its op does not have), so it is no longer a hit."""
        self.warn(f"warning: plan cache entry {self.file_of(key)} is corrupt or foreign ({why}); ignored")
        self.hits -= bool(loaded)
        self.misses += 1
        return None

    def store(self, key: dict, value: dict) -> None:
        body = zlib.compress(cachecodec.encode(key, value), 6)
        head = f"{FORMAT} key={json.dumps(key, sort_keys=True)}\n".encode()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path, prefix=".tmp-", suffix=SUFFIX)
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(head + body)
                self._replace(tmp, self.file_of(key))
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as e:
            self.warn(f"warning: plan cache {self.path} is not writable ({e.strerror}); entry not stored")

    @staticmethod
    def _replace(tmp: str, dst: Path) -> None:
        """``os.replace``, after removing what stands in the entry's place and cannot be replaced
        by a file (a folder left there; a link or FIFO is replaced by ``os.replace`` itself)."""
        if dst.is_dir() and not dst.is_symlink():
            os.rmdir(dst)           # (an empty one only: what is in a folder is not the cache's to remove)
        os.replace(tmp, dst)

    def entries(self) -> list[Path]:
        if not self.path.is_dir():
            return []
        return sorted(p for p in self.path.iterdir() if p.suffix == SUFFIX and not p.name.startswith("."))

    def info(self) -> dict:
        files = self.entries()
        return {"path": str(self.path), "entries": len(files), "bytes": sum(f.stat().st_size for f in files)}

    def clear(self) -> int:
        """Remove every entry (and leftover temporary files); returns the number of entries removed."""
        files = self.entries()
        for f in files:
            f.unlink(missing_ok=True)
        if self.path.is_dir():
            for f in self.path.glob(f".tmp-*{SUFFIX}"):
                f.unlink(missing_ok=True)
        return len(files)


class MemoryCache:
    """The plan cache's interface in memory, for one ``plan`` call without a cache on disk: its two
    QKV forms (``planner.qkv``) share the catalogues of the GEMMs they have in common (an encoder
    layer's output projection, MLP and attention products), as they would through a cache folder.

    Design decision: entries go through the same codec as on disk (``cachecodec``, without the
    compression), so each reader gets its own objects, as from disk, and every plan exercises the
    codec the disk cache relies on: a value the codec cannot write back equal fails here first.
    MEASURED: ``plan`` of fixtures/mlp_smoke_fp8.toml in one process, 0.254-0.255 s of CPU through
    the codec against 0.241-0.257 s with pickle copies: no cost worth a second mechanism."""

    full_key = staticmethod(PlanCache.full_key)

    def __init__(self):
        self._entries: dict[str, bytes] = {}
        self.hits = self.misses = 0

    def warn(self, line: str) -> None:       # (an entry made in this process is never foreign)
        _print_warning(line)

    def file_of(self, key: dict) -> str:
        return "(in memory)"

    def has(self, key: dict) -> bool:
        return json.dumps(key, sort_keys=True) in self._entries

    def load(self, key: dict, schema, tiles: int):
        got = self._entries.get(json.dumps(key, sort_keys=True))
        if got is None:
            self.misses += 1
            return None
        try:
            value = cachecodec.decode(got, key, schema, tiles, "(in memory)")
        except EntryError as e:
            return self.reject(key, str(e))
        self.hits += 1
        return value

    reject = PlanCache.reject

    def store(self, key: dict, value: dict) -> None:
        self._entries[json.dumps(key, sort_keys=True)] = cachecodec.encode(key, value)
