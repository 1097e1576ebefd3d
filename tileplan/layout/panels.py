"""Panel-major index space: the element numbering of ``PackedPanels`` and panel-space ``Grid``s.

A ``rows x n`` matrix is cut into ``P = ceil(n / g)`` AMP panels of ``g`` columns;
panel ``p`` holds columns ``[p*g, p*g + w_p)`` with ``w_p = g`` except the last,
which is ``n - (P-1)*g`` wide when ``g`` does not divide ``n`` (a partial panel).
Each panel is ``rows x w_p`` row-major, and the panels follow each other, so element
``(r, c)`` with ``p = c // g`` has index ``p*rows*g + r*w_p + c % g`` (every panel
before ``p`` is a whole one). With ``n % g == 0`` this is the familiar
``(c // g)*rows*g + r*g + c % g``.

The helpers here are the one place that arithmetic lives: owner maps, the IPU
model's host I/O, the host program emitter and the exchange estimate all call them.
"""

from __future__ import annotations

import numpy as np

WORD_BYTES = 8     # 64-bit loads: a panel row of the last panel must start on an 8-byte boundary


def panel_count(n: int, grain: int) -> int:
    return -(-n // grain)


def panel_widths(n: int, grain: int) -> np.ndarray:
    """int64 [P]: the width of each panel (``grain``, the last one ``n - (P-1)*grain``)."""
    p = panel_count(n, grain)
    w = np.full(p, grain, dtype=np.int64)
    w[-1] = n - (p - 1) * grain
    return w


def panels_fit(n: int, grain: int, itemsize: int) -> bool:
    """Can a matrix of ``n`` columns be held as AMP panels of ``grain``?

    At least one whole panel (``n >= grain``), and every panel row 8-byte aligned:
    whole panels always are (``grain * itemsize`` is 32 bytes on every target); the
    partial last panel's rows are ``(n % grain) * itemsize`` bytes, which is a
    multiple of 8 exactly when ``n * itemsize`` is. Rows ending in a sub-word tail
    (``n * itemsize % 8 != 0``) would put the last panel's rows, and the stream cuts
    between them, off the 64-bit boundaries the AMP loads and the exchange need; such
    matrices stay row-major (``Packed`` falls back to ``Intervals``).
    """
    return n >= grain and (grain * itemsize) % WORD_BYTES == 0 and (n * itemsize) % WORD_BYTES == 0


def panel_index(r, c, rows: int, n: int, grain: int):
    """The panel-major index of element ``(r, c)`` (numpy arrays or ints)."""
    p = np.asarray(c) // grain
    last = panel_count(n, grain) - 1
    w = np.where(p == last, n - last * grain, grain)
    return p * rows * grain + np.asarray(r) * w + np.asarray(c) % grain


def panel_coords(idx, rows: int, n: int, grain: int) -> tuple[np.ndarray, np.ndarray]:
    """``(r, c)`` of panel-major indices ``idx`` (the inverse of ``panel_index``)."""
    idx = np.asarray(idx, dtype=np.int64)
    p = np.minimum(idx // (rows * grain), panel_count(n, grain) - 1)
    w = np.where(p == panel_count(n, grain) - 1, n - p * grain, grain)
    within = idx - p * rows * grain
    return within // w, p * grain + within % w


def row_segments(rows: int, n: int, grain: int) -> tuple[np.ndarray, np.ndarray]:
    """``(start, width)`` int64 [rows * P]: the panel-major range of each (row, panel) piece,
    in row-major order (row 0 panel 0, row 0 panel 1, ...). Concatenated, they read the
    matrix row-major."""
    w = panel_widths(n, grain)
    p = np.arange(len(w), dtype=np.int64)
    r = np.arange(rows, dtype=np.int64)[:, None]
    start = p * rows * grain + r * w
    return start.reshape(-1), np.broadcast_to(w, start.shape).reshape(-1).copy()


def to_panel_major(values: np.ndarray, grain: int) -> np.ndarray:
    """Flat panel-major values of a matrix (all leading dimensions folded into rows)."""
    n = values.shape[-1]
    m = np.ascontiguousarray(values).reshape(-1, n)
    whole = n // grain * grain
    head = m[:, :whole].reshape(len(m), n // grain, grain).transpose(1, 0, 2).reshape(-1)
    return np.concatenate((head, m[:, whole:].reshape(-1)))


def from_panel_major(flat: np.ndarray, rows: int, n: int, grain: int) -> np.ndarray:
    """``[rows, n]`` row-major values from flat panel-major ones."""
    flat = np.asarray(flat).reshape(-1)
    whole = n // grain * grain
    out = np.empty((rows, n), dtype=flat.dtype)
    out[:, :whole] = flat[:rows * whole].reshape(n // grain, rows, grain).transpose(1, 0, 2).reshape(rows, whole)
    out[:, whole:] = flat[rows * whole:].reshape(rows, n - whole)
    return out
