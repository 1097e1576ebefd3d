"""Text from a model, a target or a user in emitted C++: string literals, comments, data file names.

Every name a model carries (tensors, ops, the model itself) and every name a target file carries
reaches emitted C++ only through these functions; an f-string that puts such a name into C++ any
other way is a bug.

Design decision: the emitted text is printable ASCII only (plus newlines). A name with a control
character, a bidirectional control (U+202E, U+2066..U+2069, U+200E/F, U+061C) or any other
non-ASCII character cannot then change what a reader (or ``g++ -Wbidi-chars``) sees in the file,
and cannot end a comment or a literal early. Non-ASCII text stays exact: a string literal holds the
name's UTF-8 bytes as octal escapes (three digits at most, so an escape cannot swallow the
character after it, as a greedy ``\\x`` escape would; no universal character name, which C++
refuses for some code points), and a comment shows it as ``\\uXXXX`` escapes.

Design decision: a data file the host program reads or writes is named after the tensor's row, not
after the tensor (``data_file``): a tensor named ``../../../x`` must not make the host program
write outside its data folder. The name's letters, digits, ``_`` and ``-`` follow the row number so
that a person can tell the files apart; the row number alone makes each name unique.
"""

from __future__ import annotations

import re

_PRINTABLE = frozenset(chr(c) for c in range(32, 127))
_DATA_FILE = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]*\.bin$")
SLUG_CHARS = 40          # at most this many characters of the name in a data file's name


def cpp_string(s: str) -> str:
    """``s`` as a C++ narrow string literal (quotes included) holding exactly ``s``'s UTF-8 bytes.

    Backslash and double quote are escaped, ``?`` too (no trigraph can form); every byte outside
    printable ASCII is a three-digit octal escape."""
    out = ['"']
    for ch in s:
        if ch in ('"', "\\", "?"):
            out.append("\\" + ch)
        elif ch in _PRINTABLE:
            out.append(ch)
        else:
            out.append("".join(f"\\{b:03o}" for b in ch.encode("utf-8", "surrogatepass")))
    out.append('"')
    return "".join(out)


def cpp_comment(s: str) -> str:
    """``s`` for a ``//`` or ``/* */`` comment: in double quotes, printable ASCII only (every other
    character as ``\\uXXXX`` or ``\\UXXXXXXXX``, backslash and quote escaped), with no ``*/`` (nor ``/*``) and no
    line break. The closing quote keeps a trailing backslash from continuing the comment onto the
    next line."""
    out = ['"']
    for ch in s:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif (ch == "/" and out[-1] == "*") or (ch == "*" and out[-1] == "/"):
            out.append("\\" + ch)           # no */ (nor /*) forms
        elif ch in _PRINTABLE:
            out.append(ch)
        elif ord(ch) <= 0xFFFF:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    out.append('"')
    return "".join(out)


def data_file(index: int, name: str) -> str:
    """The data file of the host program's ``index``-th host tensor (or folded output) named ``name``:
    ``t<index>`` then up to ``SLUG_CHARS`` of the name's ASCII letters, digits, ``_`` and ``-`` (other
    runs of characters become one ``_``), then ``.bin``. Always matches ``is_data_file``."""
    slug = re.sub(r"[^A-Za-z0-9_-]+", "_", name).strip("_")[:SLUG_CHARS]
    return f"t{index:04d}" + (f"_{slug}" if slug else "") + ".bin"


def is_data_file(file: str) -> bool:
    """A plain file name in the data folder: ASCII letters, digits, ``_``, ``-``, ``.``, ending in
    ``.bin``, not starting with ``.`` and without ``..`` (what host.cpp accepts too)."""
    return bool(_DATA_FILE.match(file)) and ".." not in file
