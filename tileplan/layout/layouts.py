"""The layout vocabulary: small frozen values saying which tile holds which elements.

Every layout is a hashable frozen dataclass with a one-line ``str`` (for plan
printouts), a ``local_format`` (``"rows"``: row-major pieces, ``"panels"``: AMP
panels) and ``owner_map(shape, dtype, tiles)``, a cached pure function giving the
vectorised ``OwnerMap``. ``verify(shape, dtype, target)`` raises ``LayoutError``
naming the layout and the problem.

Conventions the planner relies on:
- Tiles are numbered from 0. ``WholeRows``, ``Intervals`` and ``Packed`` use tiles
  ``0..k-1`` (``WholeRows`` may start at ``first_tile``), where ``k`` is the owner
  count after capping it so that no owner is empty; ``Explicit`` and ``Blocks``
  name their tiles.
- Splits are balanced: the first ``n % k`` owners get one unit more.
- ``owner_map`` raises ``LayoutError`` if the layout names a tile at or beyond
  ``tiles``.

| layout | str | distribution |
|---|---|---|
| ``WholeRows(k)`` | ``Rows(k)`` | contiguous row ranges, one interval per owner |
| ``Intervals(k, a)`` | ``Iv(k,a8)`` | contiguous flat ranges, byte boundaries multiples of ``a`` |
| ``Packed(g, k)`` | ``Packed(g,k)`` | stream of AMP panel rows (``g`` columns), cut in ``k`` chunks |
| ``Explicit(ivs)`` | ``Explicit(n)`` | (tile, start, stop) intervals pinned by the model file |
| ``Imported(base)`` | ``Imp(base)`` | a host input; as ``base`` (``Imported.linear(k)``: ``Iv(k,a8)``) |
| ``Stored(base)`` | ``Stored(base)`` | as ``base``, written by a producer fused with its consumer |
| ``Blocks(rb, cb, t)`` | ``Blocks(4x2 r3)`` | a GEMM's private 2-D block grid (DESIGN's ``Grid``), replicated |
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from ..graph.dtypes import DType
from ..target import Target
from .owner_map import (LayoutError, OwnerMap, alignment_problem, capacity_problem, coverage_problem,
                        exclusive_cumsum, local_problem, stacked_offsets)
from .panels import WORD_BYTES, panel_count, panels_fit

Shape = tuple[int, ...]


def rows_cols(shape: Shape) -> tuple[int, int]:
    """The 2-D view of a shape: all leading dimensions folded into rows."""
    return math.prod(shape[:-1]), shape[-1]


def describe(shape: Shape, dtype: DType) -> str:
    return f"{dtype}[{'x'.join(map(str, shape))}]"


def balanced_bounds(n: int, k: int) -> np.ndarray:
    """int64 [k + 1]: ``n`` units cut into ``k`` parts, the first ``n % k`` one larger."""
    sizes = np.full(k, n // k, dtype=np.int64)
    sizes[: n % k] += 1
    return np.concatenate(([0], np.cumsum(sizes)))


def _positive(layout: str, name: str, value) -> None:
    if not (isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value > 0):
        raise LayoutError(f"{layout}: {name} must be a positive integer, got {value!r}")


def _shape(shape) -> Shape:
    shape = tuple(int(d) for d in shape)
    if not shape or min(shape) <= 0:
        raise LayoutError(f"a layout needs a shape of positive dimensions, got {list(shape)}")
    return shape


@functools.lru_cache(maxsize=128)      # a block grid's map can hold ~0.5M intervals: keep a bounded few
def _cached_owner_map(layout: "Layout", shape: Shape, dtype: DType, tiles: int) -> OwnerMap:
    om = layout._build(shape, dtype, tiles)
    if len(om) and (om.max_tile() >= tiles or int(om.tile.min()) < 0):
        bad = om.max_tile() if om.max_tile() >= tiles else int(om.tile.min())
        raise LayoutError(f"{layout} on {describe(shape, dtype)}: uses tile {bad} "
                          f"but the target has tiles 0..{tiles - 1}")
    return om


class Layout:
    """Base of the vocabulary. Subclasses are frozen dataclasses implementing ``_build``."""

    boundary: ClassVar[bool] = True      # may be offered at an op boundary (Blocks: no)

    @property
    def local_format(self) -> str:
        return "rows"

    @property
    def index_space(self) -> str:
        """How element indices number the tensor: ``"rows"`` (flat row-major) or ``"panels<g>"``
        (panel-major: panel p of g columns, then rows, then columns within the panel). A copy
        plan needs both owner maps in one index space."""
        return "rows"

    def owner_map(self, shape: Shape, dtype: DType, tiles: int) -> OwnerMap:
        """The owner map of a tensor of ``shape`` and ``dtype`` on ``tiles`` tiles (cached)."""
        return _cached_owner_map(self, _shape(shape), dtype, int(tiles))

    def effective(self, shape: Shape, dtype: DType) -> "Layout":
        """The layout actually used for this tensor (``Packed`` may fall back to row-major)."""
        return self

    def verify(self, shape: Shape, dtype: DType, target: Target) -> OwnerMap:
        """Check the layout against its tensor and target; the owner map, or ``LayoutError``.

        Checks: the layout's own shape constraints, tile indices within the target,
        coverage (every element exactly once, or exactly r times on distinct tiles),
        no empty interval, dense local buffers, promised alignment, per-tile capacity.
        """
        shape = _shape(shape)
        where = f"{self} on {describe(shape, dtype)}"
        problem = self._shape_problem(shape) or self._dtype_problem(shape, dtype)
        if problem:
            raise LayoutError(f"{where}: {problem}")
        om = self.owner_map(shape, dtype, target.tiles)
        for problem in (coverage_problem(om), local_problem(om),
                        alignment_problem(om, self._unit(shape, dtype), dtype.itemsize),
                        capacity_problem(om, target.tiles, dtype.itemsize, target.usable_bytes)):
            if problem:
                raise LayoutError(f"{where}: {problem}")
        return om

    # ---- overridden by subclasses --------------------------------------------

    def _build(self, shape: Shape, dtype: DType, tiles: int) -> OwnerMap:
        raise NotImplementedError

    def _unit(self, shape: Shape, dtype: DType) -> int:
        """Interval boundaries the layout promises, in elements (1: no promise)."""
        return 1

    def _shape_problem(self, shape: Shape) -> str | None:
        return None

    def _dtype_problem(self, shape: Shape, dtype: DType) -> str | None:
        """A problem that depends on the element type too (byte alignment)."""
        return None


@dataclass(frozen=True)
class WholeRows(Layout):
    """Contiguous balanced row ranges on tiles ``first_tile ..`` (at most one owner per row)."""

    owners: int
    first_tile: int = 0

    def __post_init__(self):
        _positive("WholeRows", "owners", self.owners)
        if not (isinstance(self.first_tile, (int, np.integer)) and self.first_tile >= 0):
            raise LayoutError(f"WholeRows: first_tile must be a non-negative integer, got {self.first_tile!r}")

    def __str__(self) -> str:
        return f"Rows({self.owners})" if not self.first_tile else f"Rows({self.owners}@{self.first_tile})"

    def _build(self, shape, dtype, tiles):
        rows, cols = rows_cols(shape)
        k = min(self.owners, rows)
        bounds = balanced_bounds(rows, k) * cols
        return OwnerMap.build(self.first_tile + np.arange(k), bounds[:-1], bounds[1:], np.zeros(k),
                              rows * cols)


@dataclass(frozen=True)
class Intervals(Layout):
    """The flat element range in ``owners`` balanced contiguous intervals.

    Byte boundaries are multiples of ``align``: element boundaries are multiples of
    ``lcm(align, itemsize) / itemsize`` except the tensor's end (the tail). A tensor
    too small for ``owners`` such units gets fewer owners; none is empty.
    """

    owners: int
    align: int = 8

    def __post_init__(self):
        _positive("Intervals", "owners", self.owners)
        _positive("Intervals", "align", self.align)

    def __str__(self) -> str:
        return f"Iv({self.owners},a{self.align})"

    def _unit(self, shape, dtype):
        return math.lcm(self.align, dtype.itemsize) // dtype.itemsize

    def _build(self, shape, dtype, tiles):
        size = math.prod(shape)
        unit = self._unit(shape, dtype)
        units = -(-size // unit)
        k = min(self.owners, units)
        bounds = np.minimum(balanced_bounds(units, k) * unit, size)
        return OwnerMap.build(np.arange(k), bounds[:-1], bounds[1:], np.zeros(k), size)


@dataclass(frozen=True)
class Packed(Layout):
    """The compact resident format of a GEMM parameter ``B[K, N]`` (rows = K).

    Panel ``p`` holds columns ``[p*g, (p+1)*g)`` stored ``K x g`` row-major; the
    panels in panel-major order form a stream of ``K * N/g`` panel rows of ``g``
    elements, cut into ``owners`` balanced chunks of whole panel rows (tiles 0..k-1,
    tile i holds chunk i in stream order). No replication.

    If ``N % g != 0`` the matrix is stored row-major as ``Intervals(owners)``
    instead: ``effective(shape, dtype)`` then returns ``Packed(g, k, fallback=True)``,
    printed ``Packed(g,k->Iv)``. (The planner keeps weights with a partial last
    panel as ``PackedPanels``; it uses ``Packed`` only for rows ending in a sub-word
    tail, or narrower than one panel, which fall back.)
    """

    grain: int
    owners: int
    fallback: bool = False     # row-major Intervals(owners); set by effective(), not by callers

    def __post_init__(self):
        _positive("Packed", "grain", self.grain)
        _positive("Packed", "owners", self.owners)

    def __str__(self) -> str:
        return f"Packed({self.grain},{self.owners}{'->Iv' if self.fallback else ''})"

    @property
    def local_format(self) -> str:
        return "rows" if self.fallback else "panels"

    def effective(self, shape, dtype):
        if not self.fallback and shape[-1] % self.grain:
            return replace(self, fallback=True)
        return self

    def _row_major(self) -> Intervals:
        return Intervals(self.owners)

    def _unit(self, shape, dtype):
        eff = self.effective(shape, dtype)
        return eff._row_major()._unit(shape, dtype) if eff.fallback else self.grain

    def _build(self, shape, dtype, tiles):
        eff = self.effective(shape, dtype)
        if eff.fallback:
            return eff._row_major()._build(shape, dtype, tiles)
        k_rows, n = rows_cols(shape)
        g = self.grain
        total = k_rows * (n // g)                     # panel rows in the stream
        k = min(self.owners, total)
        bounds = balanced_bounds(total, k)
        stream = np.arange(total, dtype=np.int64)
        panel, row = np.divmod(stream, k_rows)
        owner = np.repeat(np.arange(k), np.diff(bounds))
        start = row * n + panel * g
        offset = (stream - bounds[owner]) * g
        return OwnerMap.build(owner, start, start + g, offset, k_rows * n, local_format="panels")


@dataclass(frozen=True)
class PackedPanels(Layout):
    """``Packed``'s distribution, addressed in panel-major index space.

    The matrix ``K x N`` is held as ``P = ceil(N / g)`` panels, panel ``p`` the
    columns ``[p*g, p*g + w_p)`` stored ``K x w_p`` row-major (``w_p = g``, the last
    panel ``N - (P-1)*g`` when ``g`` does not divide ``N``: a partial panel). The
    panels in panel-major order form a stream of ``K * P`` panel rows, cut into
    ``owners`` balanced chunks of whole panel rows (tiles 0..k-1, tile i holds chunk
    i in stream order); element ``(r, c)`` is numbered ``p*K*g + r*w_p + c % g``
    (``layout.panels``). A chunk of the stream is then one interval, and a copy of a
    column block of panels into a GEMM grid is one fragment per panel instead of
    one per panel row; the host writes such a buffer panel-major.

    Needs ``N >= g`` and rows without a sub-word tail (``N * itemsize % 8 == 0``, see
    ``panels.panels_fit``): every panel row, the partial ones included, then starts
    on an 8-byte boundary, which is the alignment ``verify`` checks (whole panel rows
    when ``g`` divides ``N``).
    """

    grain: int
    owners: int

    def __post_init__(self):
        _positive("PackedPanels", "grain", self.grain)
        _positive("PackedPanels", "owners", self.owners)

    def __str__(self) -> str:
        return f"Packed({self.grain},{self.owners})"

    @property
    def local_format(self) -> str:
        return "panels"

    @property
    def index_space(self) -> str:
        return f"panels{self.grain}"

    def _unit(self, shape, dtype):
        if shape[-1] % self.grain == 0:
            return self.grain
        return math.lcm(WORD_BYTES, dtype.itemsize) // dtype.itemsize

    def _shape_problem(self, shape):
        if shape[-1] < self.grain:
            return f"{shape[-1]} columns do not fill one panel of {self.grain}"
        return None

    def _dtype_problem(self, shape, dtype):
        if not panels_fit(shape[-1], self.grain, dtype.itemsize):
            return (f"rows of {shape[-1]} x {dtype.itemsize} bytes end in a sub-word tail: the last panel's "
                    f"{shape[-1] % self.grain}-column rows would not start on {WORD_BYTES}-byte boundaries")
        return None

    def _build(self, shape, dtype, tiles):
        k_rows, n = rows_cols(shape)
        g = self.grain
        full = k_rows * (n // g)                      # panel rows of whole panels, then the partial ones
        total = k_rows * panel_count(n, g)
        k = min(self.owners, total)
        rows_at = balanced_bounds(total, k)           # panel-row bounds of the chunks
        bounds = np.minimum(rows_at, full) * g + np.maximum(rows_at - full, 0) * (n % g)
        return OwnerMap.build(np.arange(k), bounds[:-1], bounds[1:], np.zeros(k, dtype=np.int64), k_rows * n,
                              local_format="panels")


@dataclass(frozen=True)
class Explicit(Layout):
    """(tile, start, stop) element intervals pinned by a model file; a hard constraint.

    Local offsets stack each tile's intervals in order of start. ``verify`` checks
    that they cover the tensor exactly once.
    """

    intervals: tuple[tuple[int, int, int], ...]

    def __post_init__(self):
        try:
            ivs = tuple((int(t), int(a), int(b)) for t, a, b in self.intervals)
        except (TypeError, ValueError):
            raise LayoutError(f"Explicit: intervals must be (tile, start, stop) integer triples, "
                              f"got {self.intervals!r}"[:300]) from None
        object.__setattr__(self, "intervals", ivs)
        for i, (t, a, b) in enumerate(ivs):
            if t < 0 or a < 0 or b <= a:
                raise LayoutError(f"{self}: interval #{i} (tile {t}, [{a}, {b})) is "
                                  f"{'empty' if b <= a else 'negative'}")

    @classmethod
    def from_arrays(cls, tile, start, stop) -> "Explicit":
        return cls(tuple(zip(np.asarray(tile).tolist(), np.asarray(start).tolist(),
                             np.asarray(stop).tolist())))

    def __str__(self) -> str:
        return f"Explicit({len(self.intervals)})"

    def _build(self, shape, dtype, tiles):
        a = np.array(self.intervals, dtype=np.int64).reshape(-1, 3)
        by_start = np.argsort(a[:, 1], kind="stable")
        tile, start, stop = a[by_start, 0], a[by_start, 1], a[by_start, 2]
        offset = stacked_offsets(tile, stop - start)
        return OwnerMap.build(tile, start, stop, offset, math.prod(shape))


class _OnBase:
    """A layout that is ``self.base`` under another name: its format, units, checks and owner map
    are the base's (``Imported``, ``Stored``)."""

    @property
    def local_format(self) -> str:
        return self.base.local_format

    def _unit(self, shape, dtype):
        return self.base._unit(shape, dtype)

    def _shape_problem(self, shape):
        return self.base._shape_problem(shape)

    def _dtype_problem(self, shape, dtype):
        return self.base._dtype_problem(shape, dtype)

    def _build(self, shape, dtype, tiles):
        return self.base.owner_map(shape, dtype, tiles)


@dataclass(frozen=True)
class Imported(_OnBase, Layout):
    """The layout a host input arrives in; everything delegates to ``base``."""

    base: Layout

    def __post_init__(self):
        if not isinstance(self.base, Layout) or not self.base.boundary:
            raise LayoutError(f"Imported: the base must be a boundary layout, got {self.base}")

    @classmethod
    def linear(cls, owners: int, align: int = 8) -> "Imported":
        """The default: a row-major host input in ``Intervals(owners, align)``."""
        return cls(Intervals(owners, align))

    def __str__(self) -> str:
        return f"Imp({self.base})"

    def effective(self, shape, dtype):
        eff = self.base.effective(shape, dtype)
        return self if eff == self.base else Imported(eff)


@dataclass(frozen=True)
class Stored(_OnBase, Layout):
    """A value stored in ``base`` by an op whose pass also wrote its consumer's output there: a
    residual Add fused into the LayerNorm after it writes the sum (which the residual stream still
    reads) and the norm. Everything delegates to ``base``, so a conversion out of it is one out of
    ``base``; selection lets nothing convert into it (``planner.select``), so the consumer's
    candidate that reads it (and does no work) is only chosen with the fused producer."""

    base: Layout

    def __post_init__(self):
        if not isinstance(self.base, Layout) or not self.base.boundary or isinstance(self.base, Stored):
            raise LayoutError(f"Stored: the base must be a boundary layout, got {self.base}")

    def __str__(self) -> str:
        return f"Stored({self.base})"

    @property
    def index_space(self) -> str:
        return self.base.index_space


@dataclass(frozen=True)
class Permuted(Layout):
    """Where a Transpose's output has its elements, said of its input: for ``y = x.transpose(perm)``
    in layout ``base`` (of ``out_shape``), each tile holds, at the same local offsets, the elements of
    ``x`` its pieces of ``y`` are made of. The permutation must keep the last axis: runs of the
    trailing axes it keeps stay contiguous in both tensors, so the owner map has one interval per
    run (never per element). A conversion into it is the Transpose's exchange; a local copy on
    every tile then gives ``y`` in ``base``. Never offered at a boundary.

    ``pick`` = ``(axis, start, step, length)`` says the same of a strided or reversed Slice
    (``y = x.take(range(start, ..., step), axis)``, ``x``'s axis ``axis`` of ``length``, before its
    last axis): output position ``i`` along that axis is input position ``start + step * i``; the
    runs are the trailing axes after it."""

    base: Layout
    out_shape: tuple[int, ...]
    perm: tuple[int, ...]
    pick: tuple[int, ...] = ()
    boundary: ClassVar[bool] = False

    def __post_init__(self):
        object.__setattr__(self, "out_shape", tuple(int(d) for d in self.out_shape))
        object.__setattr__(self, "perm", tuple(int(p) for p in self.perm))
        object.__setattr__(self, "pick", tuple(int(p) for p in self.pick))
        if sorted(self.perm) != list(range(len(self.out_shape))) or self.perm[-1] != len(self.perm) - 1:
            raise LayoutError(f"Permuted: perm {list(self.perm)} must be a permutation of "
                              f"{len(self.out_shape)} axes keeping the last one")
        if self.pick and (len(self.pick) != 4 or not 0 <= self.pick[0] < len(self.out_shape) - 1):
            raise LayoutError(f"Permuted: pick {list(self.pick)} must be (axis, start, step, length) of an axis "
                              "before the last")

    def __str__(self) -> str:
        pick = f",{self.pick[0]}:{self.pick[1]}:{self.pick[2]}" if self.pick else ""
        return f"Perm({self.base},{''.join(map(str, self.perm))}{pick})"

    def kept_axes(self) -> int:
        """The first of the trailing axes the permutation keeps in place (and no pick reads)."""
        k = len(self.perm)
        while k > 0 and self.perm[k - 1] == k - 1 and not (self.pick and self.pick[0] == k - 1):
            k -= 1
        return k

    def _in_shape(self) -> tuple[int, ...]:
        shape = [self.out_shape[self.perm.index(a)] for a in range(len(self.perm))]
        if self.pick:
            shape[self.pick[0]] = self.pick[3]
        return tuple(shape)

    def _shape_problem(self, shape):
        want = self._in_shape()
        if tuple(shape) != want:
            return f"the input of this rearrangement has shape {list(want)}, not {list(shape)}"
        return None

    def _build(self, shape, dtype, tiles):
        om = self.base.owner_map(self.out_shape, dtype, tiles)
        k = self.kept_axes()
        run = math.prod(self.out_shape[k:])
        first, last = om.start // run, (om.stop - 1) // run
        count = last - first + 1
        j = np.repeat(np.arange(len(om)), count)
        r = first[j] + (np.arange(int(count.sum()), dtype=np.int64) - np.repeat(exclusive_cumsum(count), count))
        s = np.maximum(om.start[j], r * run)
        e = np.minimum(om.stop[j], (r + 1) * run)
        out_coord = np.unravel_index(r, self.out_shape[:k]) if k else ()
        in_coord = [None] * k
        for i in range(k):
            in_coord[self.perm[i]] = out_coord[i]
        if self.pick:
            axis, start, step, _ = self.pick
            in_coord[axis] = start + step * in_coord[axis]
        in_run = np.ravel_multi_index(in_coord, tuple(shape[:k])) if k else np.zeros_like(r)
        start = in_run * run + (s - r * run)
        return OwnerMap.build(om.tile[j], start, start + (e - s), om.offset[j] + (s - om.start[j]), math.prod(shape))


@dataclass(frozen=True)
class Window(Layout):
    """Where a Slice's output already is, said of the output: ``x`` (``source_shape``, in layout
    ``base``) seen as ``[rows, cols]`` row-major, and ``y`` as ``[rows, w]``, the columns
    ``[c0, c0 + w)`` of every row (a Slice of axis ``a`` has ``cols`` = the elements from axis
    ``a`` on). Each tile holds the elements of ``y`` that its pieces of ``x`` hold, at the local
    offsets they have in ``x``'s buffer. A buffer in it is a view of ``x``'s buffer (the Slice's
    program declares the alias: ``planner.views.slice_candidates``), so a copy out of it is the
    Slice's only work, planned and costed as any conversion: nothing at all where the output's
    layout has the same pieces at the same offsets (a column range aligned to column blocks), else
    one fragment per row piece (never per element). Never offered at a boundary."""

    base: Layout
    source_shape: tuple[int, ...]
    cols: int
    c0: int
    boundary: ClassVar[bool] = False

    def __post_init__(self):
        object.__setattr__(self, "source_shape", tuple(int(d) for d in self.source_shape))
        object.__setattr__(self, "cols", int(self.cols))
        object.__setattr__(self, "c0", int(self.c0))
        size = math.prod(self.source_shape)
        if not isinstance(self.base, Layout) or self.cols <= 0 or size % self.cols or not 0 <= self.c0 < self.cols:
            raise LayoutError(f"Window: a layout, a column count dividing {size} and a first column within it, "
                              f"got {self.base}, {self.cols}, {self.c0}")

    def __str__(self) -> str:
        return f"Win({self.base},{self.c0}/{self.cols})"

    def _width(self, shape) -> int | None:
        rows = math.prod(self.source_shape) // self.cols
        size = math.prod(shape)
        w = size // rows
        return w if w * rows == size and self.c0 + w <= self.cols else None

    def _shape_problem(self, shape):
        if self._width(shape) is None:
            return (f"not a window of columns from {self.c0} of {list(self.source_shape)} seen as "
                    f"{math.prod(self.source_shape) // self.cols} rows of {self.cols}")
        return None

    def _build(self, shape, dtype, tiles):
        w = self._width(shape)
        if w is None:
            raise LayoutError(f"{self} on {describe(shape, dtype)}: {self._shape_problem(shape)}")
        om = self.base.owner_map(self.source_shape, dtype, tiles)
        C = self.cols
        first, last = om.start // C, (om.stop - 1) // C          # the source rows each piece touches
        count = last - first + 1
        j = np.repeat(np.arange(len(om)), count)
        r = first[j] + (np.arange(int(count.sum()), dtype=np.int64) - np.repeat(exclusive_cumsum(count), count))
        s = np.maximum(om.start[j], r * C + self.c0)
        e = np.minimum(om.stop[j], r * C + self.c0 + w)
        keep = e > s
        j, r, s, e = j[keep], r[keep], s[keep], e[keep]
        start = r * w + (s - r * C - self.c0)
        return OwnerMap.build(om.tile[j], start, start + (e - s), om.offset[j] + (s - om.start[j]),
                              math.prod(shape), replicas=om.replicas)


@dataclass(frozen=True)
class Blocks(Layout):
    """A GEMM's private 2-D block grid (DESIGN's ``Grid``); never a boundary layout.

    Block ``(i, j)`` covers rows ``[rb[i], rb[i+1])`` x cols ``[cb[j], cb[j+1])`` and
    is held row-major (one interval per block row) on each tile of ``tiles[i][j]``
    (``r`` distinct tiles, the same ``r`` for every block). A tile holding several
    blocks stacks them in block order (row-major over ``(i, j)``).
    """

    row_bounds: tuple[int, ...]
    col_bounds: tuple[int, ...]
    tiles: tuple[tuple[tuple[int, ...], ...], ...]
    boundary: ClassVar[bool] = False

    def __post_init__(self):
        rb = tuple(int(x) for x in self.row_bounds)
        cb = tuple(int(x) for x in self.col_bounds)
        object.__setattr__(self, "row_bounds", rb)
        object.__setattr__(self, "col_bounds", cb)
        for name, b in (("row", rb), ("col", cb)):
            if len(b) < 2 or b[0] != 0 or any(y <= x for x, y in zip(b, b[1:])):
                raise LayoutError(f"Blocks: {name} bounds must rise strictly from 0, got {list(b)}")
        try:
            t = np.array(self.tiles, dtype=np.int64)
        except (TypeError, ValueError):
            raise LayoutError("Blocks: tiles must be a [rows][cols][replicas] nest of tile numbers") from None
        gr, gc = len(rb) - 1, len(cb) - 1
        if t.ndim != 3 or t.shape[:2] != (gr, gc) or t.shape[2] < 1:
            raise LayoutError(f"Blocks: tiles must have shape [{gr}][{gc}][replicas], got {list(t.shape)}")
        if t.min() < 0:
            raise LayoutError(f"Blocks: tile numbers must be non-negative, got {int(t.min())}")
        same = np.sort(t, axis=2)
        twice = same[:, :, 1:] == same[:, :, :-1]
        if twice.any():
            i, j, k = np.argwhere(twice)[0]
            raise LayoutError(f"Blocks: block ({i}, {j}) names tile {same[i, j, k]} twice among its replicas "
                              f"{t[i, j].tolist()}")
        object.__setattr__(self, "tiles", tuple(tuple(tuple(c) for c in row) for row in t.tolist()))

    @classmethod
    def even(cls, rows: int, cols: int, gr: int, gc: int, tile_of: np.ndarray) -> "Blocks":
        """A ``gr x gc`` balanced grid (first blocks one larger); ``tile_of[i, j, r]`` (or ``[i, j]``)."""
        if not (0 < gr <= rows and 0 < gc <= cols):
            raise LayoutError(f"Blocks: a {gr}x{gc} grid does not fit a {rows}x{cols} matrix "
                              "without empty blocks")
        t = np.asarray(tile_of)
        if t.ndim == 2:
            t = t[:, :, None]
        return cls(tuple(balanced_bounds(rows, gr).tolist()), tuple(balanced_bounds(cols, gc).tolist()),
                   tuple(tuple(tuple(c) for c in row) for row in t.tolist()))

    @property
    def grid(self) -> tuple[int, int]:
        return len(self.row_bounds) - 1, len(self.col_bounds) - 1

    @property
    def replicas(self) -> int:
        return len(self.tiles[0][0])

    def tile_array(self) -> np.ndarray:
        """int32 [gr, gc, r]: the tiles of each block."""
        return np.array(self.tiles, dtype=np.int32)

    def __str__(self) -> str:
        gr, gc = self.grid
        return f"Blocks({gr}x{gc} r{self.replicas})"

    def _shape_problem(self, shape):
        rows, cols = rows_cols(shape)
        if (self.row_bounds[-1], self.col_bounds[-1]) != (rows, cols):
            return (f"the grid covers {self.row_bounds[-1]}x{self.col_bounds[-1]} but the tensor is "
                    f"{rows}x{cols} (rows x cols)")
        return None

    def _build(self, shape, dtype, tiles):
        rows, cols = rows_cols(shape)
        problem = self._shape_problem(shape)
        if problem:
            raise LayoutError(f"{self} on {describe(shape, dtype)}: {problem}")
        gr, gc = self.grid
        r = self.replicas
        rb, cb = np.array(self.row_bounds, dtype=np.int64), np.array(self.col_bounds, dtype=np.int64)
        height, width = np.diff(rb), np.diff(cb)
        # One entry per (block i, block j, replica), in block order.
        bi, bj, _ = (a.reshape(-1) for a in np.indices((gr, gc, r)))
        btile = self.tile_array().reshape(-1)
        bh, bw = height[bi], width[bj]
        base = stacked_offsets(btile, bh * bw)
        # One interval per block row.
        entry = np.repeat(np.arange(len(bi)), bh)
        row_in = np.arange(len(entry), dtype=np.int64) - np.repeat(exclusive_cumsum(bh), bh)
        start = (rb[bi][entry] + row_in) * cols + cb[bj][entry]
        w = bw[entry]
        return OwnerMap.build(btile[entry], start, start + w, base[entry] + row_in * w,
                              rows * cols, replicas=r)


@dataclass(frozen=True)
class Shifted:
    """``base`` moved ``offset`` tiles up: tile ``t`` of ``base`` is tile ``t + offset`` here. A
    pipeline stage planned on one IPU of a multi-IPU target (``planner.stages``) runs on IPU k's
    tiles ``[k * tiles_per_ipu, ...)`` in this layout.

    Design decision: a wrapper, not a ``Layout`` subclass, so it can carry any layout-like value
    (a GEMM grid too, though ``shifted`` moves a grid by its holders, which keeps its own fast
    paths); format, index space and replicas are the base's, ``str`` names the offset. Build it
    with ``shifted``."""

    base: Any
    offset: int

    boundary: ClassVar[bool] = True

    def __str__(self) -> str:
        return f"{self.base}+{self.offset}"

    @property
    def local_format(self) -> str:
        return getattr(self.base, "local_format", "rows")

    @property
    def index_space(self) -> str:
        return getattr(self.base, "index_space", "rows")

    @property
    def replicas(self) -> int:
        return int(getattr(self.base, "replicas", 1))

    def effective(self, shape, dtype):
        eff = self.base.effective(shape, dtype) if hasattr(self.base, "effective") else self.base
        return self if eff == self.base else shifted(eff, self.offset)

    def owner_map(self, shape, dtype, tiles: int) -> OwnerMap:
        return _shifted_owner_map(self, _shape(shape), dtype, int(tiles))

    def bytes_per_tile(self, shape, dtype, tiles: int) -> np.ndarray:
        out = np.zeros(int(tiles), dtype=np.int64)
        if hasattr(self.base, "bytes_per_tile"):
            out[self.offset:] = self.base.bytes_per_tile(shape, dtype, int(tiles) - self.offset)
        else:
            out[self.offset:] = self.base.owner_map(shape, dtype, int(tiles) - self.offset).bytes_per_tile(
                int(tiles) - self.offset, dtype.itemsize)
        return out

    def verify(self, shape, dtype, target) -> OwnerMap:
        return self.owner_map(shape, dtype, target.tiles)


@functools.lru_cache(maxsize=256)
def _shifted_owner_map(layout: Shifted, shape: Shape, dtype: DType, tiles: int) -> OwnerMap:
    if tiles <= layout.offset:
        raise LayoutError(f"{layout}: the target has tiles 0..{tiles - 1}")
    om = layout.base.owner_map(shape, dtype, tiles - layout.offset)
    return OwnerMap(om.tile.astype(np.int64) + layout.offset, om.start, om.stop, om.offset, om.size, om.replicas,
                    om.local_format)


def shifted(layout, offset: int):
    """``layout`` on tiles ``offset`` higher: a GEMM grid with its holders moved (still a grid), a
    ``WholeRows`` with its first tile moved, anything else wrapped in ``Shifted`` (offset 0: itself)."""
    if not offset or layout is None:
        return layout
    from .gemm_grid import Grid
    if isinstance(layout, Shifted):
        return shifted(layout.base, layout.offset + offset)
    if isinstance(layout, Grid):
        h = layout.holder_array()
        moved = np.where(h >= 0, h + offset, h)
        return replace(layout, holders=np.ascontiguousarray(moved, dtype="<i8").tobytes())
    if isinstance(layout, WholeRows):
        return replace(layout, first_tile=layout.first_tile + offset)
    return Shifted(layout, int(offset))
