"""A small schema checker for JSON documents read from disk: one place that turns a document of
the wrong shape into one ``TileplanError`` naming the file, the field and the problem.

A spec is built from a handful of node types and checked with ``check(doc, spec, where)``:

- ``Int(lo, hi)``: an integer (never ``true``/``false``) in ``[lo, hi]``;
- ``Num(lo, hi)``: a finite integer or float in ``[lo, hi]``;
- ``Str(max_len)``, ``Bool()``, ``Enum(*values)``, ``Any()``;
- ``Opt(spec)``: ``null`` or ``spec``;
- ``List(item, min_len, max_len)`` (``length=n``: exactly ``n`` items);
- ``Obj(required, optional, closed=False)``: an object with the ``required`` keys (each checked
  by its spec) and, when present, the ``optional`` ones; other keys are allowed and left alone,
  or refused with ``closed=True``;
- ``NumText()``: a number, or the text of one JSON cannot hold (``"nan"``, ``"-inf"``);
- ``Map(value, max_len)``: an object of any string keys, each value checked by ``value``.

A violation raises ``TileplanError("{where}: {path}: {problem}")``, the path written as code
reads it (``ops[3].estimate.cycles``, ``runner_ups['fc1'][0]``), e.g.
``pkg/report.json: memory.tile_estimate[5]: is -1, below 0``.

Design decision: the specs are plain values built at the call, so a bound that depends on the
package (a list holding one number per tile of the target, a tile index below the tile count)
is written where the spec is made, from what the caller already trusts (the target and the tile
program, checked when the package was loaded). Every count that drives work (a loop, a figure,
an allocation) gets such a bound: a document is checked before anything is computed from it.
Unknown keys are accepted, so older or newer writers with extra fields still read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .errors import TileplanError

INT64 = (-(1 << 63), (1 << 63) - 1)
EXACT = 1 << 53                 # the largest integer a float (and JavaScript) holds exactly


class SchemaError(Exception):
    """A violation at ``path`` (raised inside ``check``; ``check`` turns it into a TileplanError)."""

    def __init__(self, path: str, problem: str):
        super().__init__(problem)
        self.path, self.problem = path, problem


def kind(v) -> str:
    """How a JSON value's type is named in an error ("a string", "true/false", ...)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true/false"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, float):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, dict):
        return "an object"
    return type(v).__name__


def _show(v) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


class Spec:
    what = "a value"

    def check(self, v, path: str):  # pragma: no cover - every node overrides it
        raise NotImplementedError

    def wrong(self, v, path: str):
        raise SchemaError(path, f"expected {self.what}, got {kind(v)}")


def _range(v, lo, hi, path):
    if lo is not None and v < lo:
        raise SchemaError(path, f"is {_show(v)}, below {lo:,}" if hi != lo else f"is {_show(v)}, expected {lo:,}")
    if hi is not None and v > hi:
        raise SchemaError(path, f"is {_show(v)}, above {hi:,}" if hi != lo else f"is {_show(v)}, expected {hi:,}")


@dataclass(frozen=True)
class Int(Spec):
    lo: int | None = INT64[0]
    hi: int | None = INT64[1]
    what = "an integer"

    def check(self, v, path):
        if isinstance(v, bool) or not isinstance(v, int):
            self.wrong(v, path)
        _range(v, self.lo, self.hi, path)


@dataclass(frozen=True)
class Num(Spec):
    lo: float | None = None
    hi: float | None = None
    what = "a number"

    def check(self, v, path):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            self.wrong(v, path)
        if isinstance(v, float) and not math.isfinite(v):
            raise SchemaError(path, f"is {v}, not a finite number")
        if isinstance(v, int) and not INT64[0] <= v <= INT64[1]:
            raise SchemaError(path, "is an integer that does not fit in 64 bits")
        _range(v, self.lo, self.hi, path)


@dataclass(frozen=True)
class Str(Spec):
    max_len: int = 1 << 16
    what = "a string"

    def check(self, v, path):
        if not isinstance(v, str):
            self.wrong(v, path)
        if len(v) > self.max_len:
            raise SchemaError(path, f"a string of {len(v):,} characters, more than {self.max_len:,}")


@dataclass(frozen=True)
class Bool(Spec):
    what = "true or false"

    def check(self, v, path):
        if not isinstance(v, bool):
            self.wrong(v, path)


class NumText(Spec):
    what = "a number or the text of one"

    def check(self, v, path):
        if isinstance(v, str) and len(v) <= 40:
            try:
                float(v)
                return
            except ValueError:
                pass
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise SchemaError(path, f"{_show(v)} is not a number")


class Any(Spec):
    def check(self, v, path):
        pass


class Enum(Spec):
    def __init__(self, *values):
        self.values = values

    def check(self, v, path):
        if not any(type(v) is type(x) and v == x for x in self.values):
            raise SchemaError(path, f"is {_show(v)}, expected one of {', '.join(_show(x) for x in self.values)}")


@dataclass(frozen=True)
class Opt(Spec):
    spec: Spec

    def check(self, v, path):
        if v is not None:
            self.spec.check(v, path)


@dataclass(frozen=True)
class List(Spec):
    item: Spec = field(default_factory=Any)
    min_len: int = 0
    max_len: int = 1 << 24
    length: int | None = None
    what = "a list"

    def check(self, v, path):
        if not isinstance(v, list):
            self.wrong(v, path)
        if self.length is not None and len(v) != self.length:
            raise SchemaError(path, f"a list of {len(v):,} items, expected {self.length:,}")
        if len(v) < self.min_len:
            raise SchemaError(path, f"a list of {len(v):,} items, at least {self.min_len:,} expected")
        if len(v) > self.max_len:
            raise SchemaError(path, f"a list of {len(v):,} items, more than {self.max_len:,}")
        item = self.item
        if isinstance(item, Any):
            return
        for i, x in enumerate(v):
            item.check(x, f"{path}[{i}]")


def _key_path(path: str, key: str, dotted: bool) -> str:
    if dotted and key.isidentifier():
        return f"{path}.{key}" if path else key
    return f"{path}[{_show(key)}]"


class Obj(Spec):
    what = "an object"

    def __init__(self, required: dict[str, Spec] | None = None, optional: dict[str, Spec] | None = None,
                 closed: bool = False):
        self.required = required or {}
        self.optional = optional or {}
        self.closed = closed          # unknown keys refused (a document whose every field is read)

    def check(self, v, path):
        if not isinstance(v, dict):
            self.wrong(v, path)
        if self.closed:
            for key in v:
                if key not in self.required and key not in self.optional:
                    raise SchemaError(_key_path(path, str(key), True), "not a known field")
        for key, spec in self.required.items():
            if key not in v:
                raise SchemaError(_key_path(path, key, True), "missing")
            spec.check(v[key], _key_path(path, key, True))
        for key, spec in self.optional.items():
            if key in v:
                spec.check(v[key], _key_path(path, key, True))


@dataclass(frozen=True)
class Map(Spec):
    value: Spec = field(default_factory=Any)
    max_len: int = 1 << 20
    key: Spec = field(default_factory=Str)
    what = "an object"

    def check(self, v, path):
        if not isinstance(v, dict):
            self.wrong(v, path)
        if len(v) > self.max_len:
            raise SchemaError(path, f"an object of {len(v):,} entries, more than {self.max_len:,}")
        for k, x in v.items():
            self.key.check(k, _key_path(path, str(k), False))
            self.value.check(x, _key_path(path, str(k), False))


def check(doc, spec: Spec, where: str):
    """``doc`` if it matches ``spec``; else ``TileplanError("{where}: {path}: {problem}")``
    (``where``: the file, as the user should read it)."""
    try:
        spec.check(doc, "")
    except SchemaError as exc:
        raise TileplanError(f"{where}: {exc.path}: {exc.problem}" if exc.path else f"{where}: {exc.problem}") \
            from None
    except RecursionError:
        raise TileplanError(f"{where}: nested too deeply") from None
    return doc
