"""The one user-facing error type.

Anything a user can cause (a bad model file, an unknown target, a graph that does
not fit, a damaged package) raises ``TileplanError`` with a message that names the
file, op or tensor and the problem. The CLI prints it as one line and exits 2.
"""

from __future__ import annotations


class TileplanError(Exception):
    """A problem with the user's input; printed as one line, exit status 2."""

    def __init__(self, message: str, *, source: str | None = None):
        self.source = source
        super().__init__(f"{source}: {message}" if source else message)

    def with_source(self, source: str) -> "TileplanError":
        """The same error, prefixed with the file it came from (once)."""
        if self.source is not None:
            return self
        return TileplanError(str(self), source=source)


def check(cond: bool, message: str) -> None:
    """Raise ``TileplanError(message)`` unless ``cond`` holds."""
    if not cond:
        raise TileplanError(message)
