"""Checked numbers and names: the one place that bounds what users may write.

Every dimension of every tensor (TOML, ONNX, torch import alike: ``Tensor``
calls ``dims``), every figure of a target (``Target`` calls ``figure``) and
every tensor and op name (``name``) passes through here, so no loader, planner
or kernel formula ever sees a value that overflows int64 or divides by zero.

Bounds, and why:

- a dimension is a positive integer (a graph tensor may have a zero one: a zero-size tensor); a tensor has at most ``MAX_ELEMENTS = 2**36``
  elements (64 Gi: 70x the whole SRAM of an ipu21, 1472 x 638,976 B). With
  every tensor of a MatMul within it, ``2 * batch * M * N * K`` stays below
  2**55, so the planner's int64 products (FLOPs, bytes x tiles, cycle sums)
  cannot overflow. A tensor that fits this bound but not the target is refused
  against the target (``graph.loaders.check_against_target``);
- a target figure is a finite number of the right kind, positive or (where 0
  means "none", as ``amp_fp8 = 0`` or ``sync_cycles = 0``) non-negative, and at
  most ``MAX_FIGURE`` (2**40) so sums and products of figures stay in int64;
- a name is a non-empty string without control characters (a NUL in a tensor
  name would make an npz member or a C++ identifier mean something else; an ESC
  in a name printed to a terminal would be a command to the terminal).

Names and text a user cannot be refused for (a path they typed, the stem of a
model file) are shown with ``printable`` instead: the same characters, escaped.
"""

from __future__ import annotations

import math
import unicodedata
from typing import Any

import numpy as np

from .errors import TileplanError

MAX_ELEMENTS = 1 << 36
MAX_FIGURE = 1 << 40


def is_int(v: Any) -> bool:
    """An integer that is not a bool (numpy integers count)."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def dims(shape: Any, where: str, *, zero_ok: bool = False) -> tuple[int, ...]:
    """``shape`` as a tuple of positive ints (non-negative with ``zero_ok``: a zero-size tensor)
    whose product is at most ``MAX_ELEMENTS``."""
    try:
        items = list(shape)
    except TypeError:
        raise TileplanError(f"{where}: shape must be a list of positive integers, got {shape!r}") from None
    if not items:
        raise TileplanError(f"{where}: a tensor needs at least one dimension")
    for d in items:
        if not is_int(d):
            raise TileplanError(f"{where}: dimensions must be positive integers, got shape {_show(items)}")
        if d < 0 or (d == 0 and not zero_ok):
            what = "a zero" if d == 0 else "a negative"
            raise TileplanError(f"{where}: shape {_show(items)} has {what} dimension (dimensions must be positive)")
    size = math.prod(int(d) for d in items)          # Python ints: exact, whatever the size
    if size > MAX_ELEMENTS:
        raise TileplanError(f"{where}: shape {_show(items)} has {size:,} elements, more than tileplan's "
                            f"limit of 2^36 ({MAX_ELEMENTS:,}), far beyond any target's memory")
    return tuple(int(d) for d in items)


def figure(value: Any, where: str, *, integer: bool = True, zero_ok: bool = False,
           maximum: float = MAX_FIGURE) -> int | float:
    """A target figure: a finite number (an integer unless ``integer=False``), positive, or
    non-negative with ``zero_ok``, at most ``maximum``."""
    if integer and not is_int(value):
        raise TileplanError(f"{where} must be an integer, got {value!r}")
    if not integer and not (is_int(value) or isinstance(value, float)):
        raise TileplanError(f"{where} must be a number, got {value!r}")
    if not is_int(value) and not math.isfinite(value):
        raise TileplanError(f"{where} must be a finite number, got {value!r}")
    if value < 0 or (value == 0 and not zero_ok):
        raise TileplanError(f"{where} must be {'non-negative' if zero_ok else 'positive'}, got {value!r}")
    if value > maximum:
        raise TileplanError(f"{where} is {value:,}, more than the limit {maximum:,.0f}")
    return int(value) if integer else float(value)


# Characters a terminal may act on rather than show: C0 and C1 controls (ESC starts a terminal
# command, CR and BS overwrite what was printed), format characters (the bidi overrides and
# isolates U+202A-202E and U+2066-2069, the marks U+200E/U+200F and U+061C, which reorder the
# rest of the line as displayed, and zero-width characters), line and paragraph separators, and
# lone surrogates (a file name that is not UTF-8 decodes to them; they cannot even be encoded).
UNPRINTABLE = ("Cc", "Cf", "Cs", "Zl", "Zp")


def _unprintable(c: str) -> bool:
    return unicodedata.category(c) in UNPRINTABLE


def name(value: Any, what: str, field: str = "name") -> str:
    """A tensor, op, model or target name (or another label, ``field``: a target's description):
    a non-empty string with no character of ``UNPRINTABLE``.

    Design decision: a name with a control or bidi character is refused, not escaped. It comes from
    a file the user passes (a model, a target), it would be printed, rendered and emitted in many
    places, and no legitimate name needs one; refusing it once here keeps every later use plain."""
    if not isinstance(value, str) or not value:
        raise TileplanError(f"{what} {field} must be a non-empty string, got {printable(repr(value))}")
    bad = next((c for c in value if _unprintable(c)), None)
    if bad is not None:
        kind = "control" if unicodedata.category(bad) == "Cc" else "non-printing"
        raise TileplanError(f"{what} {field} {printable(repr(value))} contains the {kind} character "
                            f"U+{ord(bad):04X}; {field}s must be printable")
    return value


def printable(value: Any) -> str:
    """``str(value)`` with every ``UNPRINTABLE`` character shown as a Python escape (``\\x1b``,
    ``\\u202e``, ``\\udcff``), so it prints as text and never acts on the terminal.

    Design decision: the one function for what cannot be refused — paths and file stems a user
    typed, and every error line the CLI prints. Backslashes are left as they are (an error message
    that holds a ``repr`` is already escaped and must not be escaped twice); text without an
    unprintable character is returned unchanged."""
    text = str(value)
    if not any(_unprintable(c) for c in text):
        return text
    return "".join(_escape(c) if _unprintable(c) else c for c in text)


def _escape(c: str) -> str:
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _show(items: list) -> str:
    text = repr(items)
    return text if len(text) <= 80 else text[:77] + "..."
