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
zlib-compressed body read by a restricted unpickler that builds tileplan's own value types,
numpy arrays and builtins only. Writes go to a temporary file in the same folder, then
``os.replace`` (atomic). An entry that cannot be read, has another format or version, or was
written for another key is ignored with one warning line on stderr (never trusted) and
replaced by the fresh result. Results do not depend on the cache: a warm plan is byte-identical
to a cold one (tests/planner/test_cache.py).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import sys
import tempfile
import zlib
from pathlib import Path

from ..checked import printable

FORMAT = "tileplan-plan-cache 2"        # 2: runner-ups are RunnerUp records
SUFFIX = ".entry"


def default_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tileplan"


class _Unpickler(pickle.Unpickler):
    """Builds tileplan's value types, numpy arrays and builtins; refuses anything else."""

    SAFE = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
            ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
            ("numpy._core.multiarray", "scalar"), ("builtins", "tuple"), ("builtins", "frozenset"),
            ("builtins", "set"), ("builtins", "slice"), ("copyreg", "_reconstructor"),
            ("builtins", "object")}

    def find_class(self, module: str, name: str):
        if (module, name) in self.SAFE or module == "tileplan" or module.startswith("tileplan."):
            obj = super().find_class(module, name)
            if module.startswith("tileplan.") and not isinstance(obj, type):
                raise pickle.UnpicklingError(f"{module}.{name} is not a value type")
            return obj
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a plan cache entry")


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

    def load(self, key: dict):
        f = self.file_of(key)
        try:
            data = f.read_bytes()
        except FileNotFoundError:
            self.misses += 1
            return None
        except OSError as e:
            self.warn(f"warning: plan cache entry {f} cannot be read ({e.strerror}); ignored")
            self.misses += 1
            return None
        try:
            head, _, body = data.partition(b"\n")
            fmt, _, stored_key = head.decode().partition(" key=")
            if fmt != FORMAT:
                raise ValueError(f"format {fmt[:40]!r}, expected {FORMAT!r}")
            if json.loads(stored_key) != key:
                raise ValueError("it was written for another key")
            value = _Unpickler(io.BytesIO(zlib.decompress(body))).load()
            if not (isinstance(value, dict) and value.get("key") == key):
                raise ValueError("its body does not hold this key")
        except Exception as e:          # noqa: BLE001  (any damage: ignored, never trusted)
            self.warn(f"warning: plan cache entry {f} is corrupt or foreign ({e}); ignored")
            self.misses += 1
            return None
        self.hits += 1
        return value

    def store(self, key: dict, value: dict) -> None:
        body = zlib.compress(pickle.dumps({**value, "key": key}, protocol=4), 6)
        head = f"{FORMAT} key={json.dumps(key, sort_keys=True)}\n".encode()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path, prefix=".tmp-", suffix=SUFFIX)
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(head + body)
                os.replace(tmp, self.file_of(key))
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as e:
            self.warn(f"warning: plan cache {self.path} is not writable ({e.strerror}); entry not stored")

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
    Entries are pickled on ``store`` and unpickled on ``load``, so each reader gets its own objects,
    as from disk."""

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

    def load(self, key: dict):
        got = self._entries.get(json.dumps(key, sort_keys=True))
        if got is None:
            self.misses += 1
            return None
        self.hits += 1
        return pickle.loads(got)

    def store(self, key: dict, value: dict) -> None:
        self._entries[json.dumps(key, sort_keys=True)] = pickle.dumps(value, protocol=4)

