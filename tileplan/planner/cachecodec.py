"""The plan cache's data-only codec: an entry's value as JSON plus raw little-endian arrays.

A plan cache entry may come from anywhere (a shared ``--cache`` folder, a restored CI cache, a
file dropped into ``~/.cache/tileplan``), so reading one must never run code or build an object
the planner did not ask for. ``encode`` writes a value as JSON; ``decode`` reads it back against
a *schema* (``Record``, ``Obj``, ``Tup``, ...) that says, field by field, what may be there.

Design decisions:

- Objects are written as ``{"O": tag, "f": {field: value}}``; ``tag`` is a fixed short name from
  the allowlist ``CLASSES`` below, never a module path or importable name. The decoder builds an
  object only where the schema expects one of the tags it lists, through the class's normal
  constructor (so its own ``__post_init__`` checks run), after checking every field against its
  spec: exact ``int`` (never ``bool``), ``str``, ``bool``, ``None``, tuples, lists, arrays, or
  another allowed object. A field the class has and the entry lacks, or one it does not have, is
  damage. Integers are int64 and floats finite (``safeio.parse_json``).
- Arrays (the per-tile byte counts of a candidate) and byte strings (``Grid.holders``) are kept
  base64 in the same JSON document, each distinct one once (``"A"``/``"B"`` index a table): one
  file, one parser, no second container format to bound. An array is 1-D int64 of exactly the
  target's tile count; the decoder is told that count.
- Tuples and lists stay apart (``{"T": [...]}`` for a tuple), so a value read back equals, and
  hashes like, the one written: a warm plan is byte-identical to a cold one.

Any mismatch raises ``EntryError`` with a short reason; the cache turns it into its one warning
line and plans without the entry.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import math

import numpy as np

from ..estimate.cost import Estimate
from ..graph.dtypes import DType
from ..layout import layouts as L
from ..layout.gemm_grid import Grid
from ..layout.split_rows import SplitRows
from .. import schema as S
from ..safeio import parse_json
from ..errors import TileplanError
from .candidates import Candidate, RunnerUp
from .gemm import Epilogue, GemmChoice
from .select import Fused

_INT64 = 1 << 63
_COUNT = 1 << 40                # a shape, bound, tile or count field: far above any real one


class EntryError(ValueError):
    """An entry's body does not match its schema (the reason, short, for the warning line); ``path``:
    where in the value, filled in as the error passes up through the fields (``_Reader.sub``)."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why, self.path = why, []

    def __str__(self) -> str:
        return f"{'/'.join(map(str, self.path))}: {self.why}" if self.path else self.why


# ---- field specs ----------------------------------------------------------------------------

class Spec:
    def decode(self, v, ctx: "_Reader"):
        raise NotImplementedError


class _Scalar(Spec):
    """A scalar field checked by the document schema's own node (``tileplan.schema``): one
    definition of "an integer in range", "a string", "true or false" for every document read."""

    node: S.Spec

    def decode(self, v, ctx):
        try:
            self.node.check(v, "")
        except S.SchemaError as exc:
            raise EntryError(exc.problem) from None
        return v


class Int(_Scalar):
    def __init__(self, lo: int = -_INT64, hi: int = _INT64 - 1):
        self.node = S.Int(lo, hi)


class Float(Spec):
    """Exactly a finite float, never an integer: a value read back must equal, and hash like, the
    one written (``schema.Num`` would accept either)."""

    def decode(self, v, ctx):
        if type(v) is not float or not math.isfinite(v):
            raise EntryError(f"expected a finite number, found {_kind(v)}")
        return v


class Str(_Scalar):
    node = S.Str()


class Bool(_Scalar):
    node = S.Bool()


class NoneOnly(Spec):
    def decode(self, v, ctx):
        if v is not None:
            raise EntryError(f"expected null, found {_kind(v)}")
        return None


class Opt(Spec):
    """None or ``inner``."""

    def __init__(self, inner: Spec):
        self.inner = inner

    def decode(self, v, ctx):
        return None if v is None else self.inner.decode(v, ctx)


class OneOf(Spec):
    """The first of ``options`` whose JSON kind matches (str, or an object of one of its tags)."""

    def __init__(self, *options: Spec):
        self.options = options

    def decode(self, v, ctx):
        for o in self.options:
            if isinstance(o, Str) and type(v) is str or isinstance(o, NoneOnly) and v is None:
                return o.decode(v, ctx)
            if isinstance(o, Obj) and isinstance(v, dict) and v.get("O") in o.tags:
                return o.decode(v, ctx)
        raise EntryError(f"unexpected {_kind(v)}")


class Tup(Spec):
    """A tuple of ``item``s (``length``: exactly that many)."""

    def __init__(self, item: Spec, length: int | None = None):
        self.item, self.length = item, length

    def decode(self, v, ctx):
        if not (isinstance(v, dict) and set(v) == {"T"} and type(v["T"]) is list):
            raise EntryError(f"expected a tuple, found {_kind(v)}")
        items = v["T"]
        if self.length is not None and len(items) != self.length:
            raise EntryError(f"expected {self.length} items, found {len(items)}")
        return tuple(ctx.sub(i, self.item, x) for i, x in enumerate(items))


class Lst(Spec):
    def __init__(self, item: Spec):
        self.item = item

    def decode(self, v, ctx):
        if type(v) is not list:
            raise EntryError(f"expected a list, found {_kind(v)}")
        return [ctx.sub(i, self.item, x) for i, x in enumerate(v)]


class TileArray(Spec):
    """A 1-D int64 array of one non-negative entry per tile (bytes per tile), or empty (a coarse
    runner-up's, never detailed)."""

    def decode(self, v, ctx):
        if not (isinstance(v, dict) and set(v) == {"A"} and type(v["A"]) is int and 0 <= v["A"] < len(ctx.arrays)):
            raise EntryError(f"expected an array, found {_kind(v)}")
        a = ctx.array(v["A"])
        if a.shape not in ((ctx.tiles,), (0,)):
            raise EntryError(f"an array of {a.size} entries, expected one per tile ({ctx.tiles}) or none")
        if a.size and int(a.min()) < 0:
            raise EntryError(f"a negative byte count")
        return a


class Bytes(Spec):
    def decode(self, v, ctx):
        if not (isinstance(v, dict) and set(v) == {"B"} and type(v["B"]) is int and 0 <= v["B"] < len(ctx.blobs)):
            raise EntryError(f"expected bytes, found {_kind(v)}")
        return ctx.blob(v["B"])


class Enum(Spec):
    def __init__(self, cls):
        self.cls = cls

    def decode(self, v, ctx):
        if not (isinstance(v, dict) and set(v) == {"E"} and type(v["E"]) is str):
            raise EntryError(f"expected a {self.cls.__name__}, found {_kind(v)}")
        try:
            return self.cls(v["E"])
        except ValueError:
            raise EntryError(f"{v['E'][:40]!r} is not a {self.cls.__name__}") from None


class Obj(Spec):
    """An object of one of ``tags`` (names in ``CLASSES``), built by its constructor from checked fields."""

    def __init__(self, *tags: str):
        self.tags = tags

    def decode(self, v, ctx):
        if not (isinstance(v, dict) and set(v) == {"O", "f"} and isinstance(v["f"], dict)):
            raise EntryError(f"expected an object, found {_kind(v)}")
        tag = v["O"]
        if tag not in self.tags:
            raise EntryError(f"{str(tag)[:40]!r} is not allowed here")
        cls, fields = CLASSES[tag]
        got = v["f"]
        if set(got) != set(fields):
            odd = sorted(set(got) ^ set(fields))
            raise EntryError(f"{tag} fields do not match ({', '.join(map(str, odd))[:80]})")
        kwargs = {name: ctx.sub(name, spec, got[name]) for name, spec in fields.items()}
        try:
            return cls(**kwargs)
        except (TileplanError, ValueError, TypeError) as e:
            raise EntryError(f"not a valid {tag} ({str(e)[:80]})") from None


class Record(Spec):
    """A JSON object with exactly these keys (the top level of an entry's value)."""

    def __init__(self, fields: dict[str, Spec]):
        self.fields = fields

    def decode(self, v, ctx):
        if not (isinstance(v, dict) and set(v) == set(self.fields)):
            raise EntryError(f"expected the keys {sorted(self.fields)}")
        return {name: ctx.sub(name, spec, v[name]) for name, spec in self.fields.items()}


def _kind(v) -> str:
    """The schema's wording of a value's type; an object also names its first keys (a damaged
    entry's tag or fields)."""
    return f"{S.kind(v)} with keys {sorted(map(str, v))[:4]}" if isinstance(v, dict) else S.kind(v)


# ---- the allowlist --------------------------------------------------------------------------

COUNT = Int(0, _COUNT)
BOUNDS = Tup(COUNT)
LAYOUT_TAGS = ("WholeRows", "Intervals", "Packed", "PackedPanels", "Explicit", "Imported", "Stored",
               "Permuted", "Window", "Blocks", "SplitRows", "Grid")
LAYOUT = Obj(*LAYOUT_TAGS)
VALUE_LAYOUT = Obj(*LAYOUT_TAGS, "Fused")       # a layout, or the marker of a fused value
ESTIMATE = Obj("Estimate")

CLASSES: dict[str, tuple[type, dict[str, Spec]]] = {
    "WholeRows": (L.WholeRows, {"owners": COUNT, "first_tile": COUNT}),
    "Intervals": (L.Intervals, {"owners": COUNT, "align": COUNT}),
    "Packed": (L.Packed, {"grain": COUNT, "owners": COUNT, "fallback": Bool()}),
    "PackedPanels": (L.PackedPanels, {"grain": COUNT, "owners": COUNT}),
    "Explicit": (L.Explicit, {"intervals": Tup(Tup(COUNT, 3))}),
    "Imported": (L.Imported, {"base": LAYOUT}),
    "Stored": (L.Stored, {"base": LAYOUT}),
    "Permuted": (L.Permuted, {"base": LAYOUT, "out_shape": BOUNDS, "perm": BOUNDS, "pick": BOUNDS}),
    "Window": (L.Window, {"base": LAYOUT, "source_shape": BOUNDS, "cols": COUNT, "c0": COUNT}),
    "Blocks": (L.Blocks, {"row_bounds": BOUNDS, "col_bounds": BOUNDS, "tiles": Tup(Tup(BOUNDS))}),
    "SplitRows": (SplitRows, {"owners": COUNT, "parts": COUNT, "first_tile": COUNT}),
    "Grid": (Grid, {"row_bounds": BOUNDS, "col_bounds": BOUNDS, "holders": Bytes(), "replicas": COUNT,
                    "grain": COUNT, "align_bytes": COUNT, "panel_space": Bool()}),
    "Fused": (Fused, {"layout": LAYOUT, "via": Str()}),
    "Estimate": (Estimate, {f: Int(0) for f in ("compute", "exchange", "sync", "standard", "interleaved",
                                                 "total_memory", "bytes_moved")}),
    "Epilogue": (Epilogue, {"gelu": Str(), "cast": Bool(), "cast_scale": Int()}),
    "GemmChoice": (GemmChoice, {"gb": COUNT, "gm": COUNT, "gn": COUNT, "gk": COUNT, "order": Str(),
                                "reduction": Str(), "partials": Enum(DType), "sk": COUNT, "bias": Bool(),
                                "epilogue": Opt(Obj("Epilogue"))}),
    # A catalogue's candidate as the cache keeps it (``catalogue._compact``): no program, no template.
    "Candidate": (Candidate, {"op": Str(), "ins": Tup(VALUE_LAYOUT), "out": VALUE_LAYOUT, "desc": Str(),
                              "coarse": ESTIMATE, "estimate": ESTIMATE, "program": NoneOnly(),
                              "transient": TileArray(), "fused": Opt(Str()), "absorbed": Bool(),
                              "choice": Opt(Obj("GemmChoice")), "boundary": Opt(Tup(Opt(VALUE_LAYOUT))),
                              "detailed": Bool(), "weights": OneOf(NoneOnly(), Str(), Obj("Grid")),
                              "template": NoneOnly(), "resident": Opt(TileArray()),
                              "interleaved": Opt(TileArray()), "through": Tup(Str())}),
    "RunnerUp": (RunnerUp, {"candidate": Obj("Candidate"), "why": Str()}),
}
TAG_OF = {cls: tag for tag, (cls, _) in CLASSES.items()}


# ---- encode ---------------------------------------------------------------------------------

class _Writer:
    def __init__(self):
        self.arrays: list[str] = []
        self.blobs: list[str] = []
        self.seen: dict = {}

    def table(self, kind: str, raw: bytes, into: list) -> int:
        at = self.seen.get((kind, raw))
        if at is None:
            at = self.seen[(kind, raw)] = len(into)
            into.append(base64.b64encode(raw).decode())
        return at

    def value(self, v):
        if v is None or type(v) in (bool, int, str):
            return v
        if type(v) is float:
            if not math.isfinite(v):
                raise ValueError(f"plan cache: {v} is not a finite number")
            return v
        if isinstance(v, (np.integer, np.bool_)):
            return v.item()
        if isinstance(v, tuple):
            return {"T": [self.value(x) for x in v]}
        if isinstance(v, list):
            return [self.value(x) for x in v]
        if isinstance(v, dict):
            return {str(k): self.value(x) for k, x in v.items()}
        if isinstance(v, np.ndarray):
            a = np.ascontiguousarray(v, dtype="<i8")
            if a.ndim != 1 or not np.array_equal(a, v):
                raise ValueError(f"plan cache: only 1-D int64 arrays are stored, not {v.dtype} {v.shape}")
            return {"A": self.table("A", a.tobytes(), self.arrays)}
        if isinstance(v, bytes):
            return {"B": self.table("B", v, self.blobs)}
        if isinstance(v, DType):
            return {"E": v.value}
        tag = TAG_OF.get(type(v))
        if tag is None:
            raise ValueError(f"plan cache: a {type(v).__name__} is not a value the cache stores")
        return {"O": tag, "f": {name: self.value(getattr(v, name)) for name in CLASSES[tag][1]}}


def encode(key: dict, value: dict) -> bytes:
    """``value`` (a dict of plain values and allowed objects) and its ``key`` as one JSON document."""
    w = _Writer()
    doc = {"key": key, "value": w.value(value)}
    doc.update(arrays=w.arrays, blobs=w.blobs)
    return json.dumps(doc, separators=(",", ":"), sort_keys=True, allow_nan=False).encode()


# ---- decode ---------------------------------------------------------------------------------

class _Reader:
    def __init__(self, arrays: list, blobs: list, tiles: int):
        self.raw_arrays, self.raw_blobs, self.tiles = arrays, blobs, tiles
        self.arrays, self.blobs = arrays, blobs            # (their lengths, for the index checks)
        self.done_arrays: dict[int, np.ndarray] = {}
        self.done_blobs: dict[int, bytes] = {}

    def sub(self, step, spec: Spec, v):
        try:
            return spec.decode(v, self)
        except EntryError as e:          # (the path is made only for the warning: no cost per field)
            e.path.insert(0, step)
            raise

    def _raw(self, table: list, i: int) -> bytes:
        text = table[i]
        if type(text) is not str:
            raise EntryError(f"its data is not a base64 string")
        try:
            return base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise EntryError(f"its data is not valid base64") from None

    def array(self, i: int) -> np.ndarray:
        a = self.done_arrays.get(i)
        if a is None:
            raw = self._raw(self.raw_arrays, i)
            if len(raw) % 8:
                raise EntryError(f"an array of {len(raw)} bytes is not int64")
            a = np.frombuffer(raw, dtype="<i8").astype(np.int64)
            a.flags.writeable = False
            self.done_arrays[i] = a
        return a.copy()           # each candidate its own array, as the planner made them

    def blob(self, i: int) -> bytes:
        b = self.done_blobs.get(i)
        if b is None:
            b = self.done_blobs[i] = self._raw(self.raw_blobs, i)
        return b


def decode(data: bytes, key: dict, schema: Spec, tiles: int, where: str = "plan cache entry"):
    """The value ``encode`` wrote for ``key``, checked against ``schema`` on a target of ``tiles``
    tiles; ``EntryError`` when the body is not that (damaged, foreign, or for another key)."""
    try:
        doc = parse_json(data, where, "plan cache entry")
    except TileplanError as e:
        raise EntryError(str(e).removeprefix(f"{where}: ")[:120]) from None
    if not (isinstance(doc, dict) and set(doc) == {"key", "value", "arrays", "blobs"}
            and type(doc["arrays"]) is list and type(doc["blobs"]) is list):
        raise EntryError("its body is not a plan cache document")
    if doc["key"] != key:
        raise EntryError("its body was written for another key")
    return _Reader(doc["arrays"], doc["blobs"], tiles).sub("value", schema, doc["value"])


# ---- the two kinds of entry -----------------------------------------------------------------

CATALOGUE = Record({"names": Lst(Str()), "kept": Lst(Obj("Candidate")), "lost": Lst(Obj("RunnerUp"))})
SELECTION = Record({"picks": Lst(Int(0)), "cycles": Int(0), "peak": Int(0), "peak_tile": Int(0),
                    "exact": Bool(), "peak_op": Int(-1)})


def check_complete() -> None:
    """Every allowed class's schema names exactly its constructor's fields (a test calls this)."""
    for tag, (cls, fields) in CLASSES.items():
        init = [f.name for f in dataclasses.fields(cls) if f.init]
        if sorted(init) != sorted(fields):
            raise AssertionError(f"{tag}: schema fields {sorted(fields)} != constructor fields {sorted(init)}")
