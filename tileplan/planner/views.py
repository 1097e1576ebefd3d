"""The View and Transpose families: relabellings and rearrangements of a tensor's elements.

- ``View`` (Reshape; the importers map Flatten, Squeeze, Unsqueeze, Identity and inference Dropout
  onto it): the same elements in the same row-major order. A candidate per pair of activation
  layouts (input, output): one copy of the input buffer into the output buffer, priced by the
  copy machinery like any conversion. Where the two owner maps agree (``Intervals`` always, since
  they cut the flat order alone; ``WholeRows`` when the rows are the same) the copy moves
  nothing: lowering aliases the output to the input and the candidate costs nothing.
- ``Transpose`` keeping the last axis (attention's head split and merge, ``[B, T, H, D]`` to
  ``[B, H, T, D]``): per output layout, the input is exchanged into ``Permuted`` (each tile receives
  the input rows its output pieces are made of, one fragment per run of the kept trailing axes),
  then one local copy per tile writes the output buffer (``kernels`` ``copy``, ipu-stack's
  published local-copy cost). Never expanded into per-element copies.
- ``Transpose`` of the last two axes (``[..., T, D]`` to ``[..., D, T]``, a key transposed for
  ``Q K^T``): the output in ``WholeRows``; each tile receives the ``[T, w]`` column blocks of the
  input its output rows are made of (``Grid`` staging, one fragment per block row), and a
  ``transpose`` kernel writes them as ``[w, T]`` rows (``kernels.rearrange``).
Other permutations are refused with an error naming the op.
- ``Slice`` with a step other than 1 (reversed or strided, on an axis before the last; the
  planner's rewrite moves the last axis first): the rows of the trailing axes it picks, gathered
  as a Transpose's rows are (``Permuted`` with a ``pick``), then one local copy per tile.
- ``Slice`` (ONNX Split and Slice, ATen split / chunk / slice / unbind: a fused QKV projection's
  three heads), step 1: the output is a column window ``[c0, c0 + w)`` of the input's 2-D view
  (``graph.core.Slice.window``). A candidate per pair of activation layouts (input, output): a
  buffer in ``Window`` is declared a view of the input's buffer (``Program.aliases``: it is the
  input's memory, read where it lies), and one copy of it into the output buffer is the whole
  program, planned by the copy machinery like any conversion: nothing moves where the window's
  pieces are the output's pieces at the same offsets (a column range aligned to the input's
  column blocks: the output aliases the input), else on-tile copies and exchanges, one fragment
  per row piece, never per element.
- ``Concat`` (torch cat, ONNX Concat: a class token joined to the patch tokens), the inverse of a
  step-1 Slice: input ``i`` is the column window ``[c_i, c_i + w_i)`` of the output's 2-D view
  (``graph.core.Concat.windows``). A candidate per output layout and choice of input layouts: one
  buffer per input in ``Window`` of the output's layout, each declared a view of the output's
  buffer (``Program.aliases``: the output's memory, written where it lies), and one copy of each
  input into its window, all in one exchange step, planned by the copy machinery like any
  conversion: on-tile copies where an input's pieces lie on the tiles that hold their window,
  exchanges otherwise, one fragment per row piece, never per element.

  Design decision: the copies are always made. The case "free where the parts already lie where
  the result wants them" would need each input's producer to write into the output's memory (the
  input aliasing its window, the inverse of a Slice's alias), which the lifetimes of the
  allocator do not express; a Concat joins small tensors in the models tileplan imports (a class
  token and the patch tokens, once per image), so the copies are cheap.
"""

from __future__ import annotations

import itertools

import numpy as np

from ..estimate.detailed import cost_program, scheduled
from ..program import Buffer, ComputeStep, Copy, ExchangeStep, Operand, Program, Vertex
from ..graph.core import Op
from ..kernels.calls import CopyCall
from ..layout import Permuted, WholeRows, Window
from ..layout.gemm_grid import Grid
from ..kernels.rearrange import TransposeCall
from .candidates import Candidate
from .elementwise import activation_layouts
from .gemm import _vertex


def _candidate(ctx, op: Op, in_layout, out_layout, prog: Program, desc: str) -> Candidate:
    d = cost_program(scheduled(prog, ctx.target.tiles), ctx.target)
    return Candidate(op.name, (in_layout,), out_layout, desc, d.estimate, d.estimate, prog,
                     np.zeros(ctx.target.tiles, dtype=np.int64))


def view_candidates(ctx, op) -> list[Candidate]:
    g, tiles = ctx.graph, ctx.target.tiles
    x, y = g.inputs_of(op)[0], g.output_of(op)
    out = []
    for lay_out in activation_layouts(y, tiles):
        for lay_in in activation_layouts(x, tiles):
            prog = Program()
            a, b = prog.add_buffer(ctx.tensor_buffer(x.name, lay_in)), prog.add_buffer(ctx.tensor_buffer(y.name, lay_out))
            prog.steps.append(ExchangeStep(f"{op.name}.view", (Copy(a.name, b.name),)))
            out.append(_candidate(ctx, op, lay_in, lay_out, prog, f"view {list(x.shape)} -> {list(y.shape)}"))
    return out


def slice_candidates(ctx, op) -> list[Candidate]:
    g, tiles = ctx.graph, ctx.target.tiles
    x, y = g.inputs_of(op)[0], g.output_of(op)
    axis = op.axis % len(x.shape)
    if op.step != 1:
        if axis == len(x.shape) - 1:
            raise op.err("a strided or reversed Slice of the last axis is planned after the rewrite that moves "
                         "the axis (planner.rewrite); this graph was not rewritten")
        pick = (axis, op.start, op.step, x.shape[axis])
        identity = tuple(range(len(y.shape)))
        return [_gather_rows(ctx, op, Permuted(lay_out, y.shape, identity, pick),
                             f"slice {op.start}:{op.stop}:{op.step} of axis {axis}: rows exchanged, one local copy "
                             "per tile", source=lay_in)
                for lay_out in activation_layouts(y, tiles) for lay_in in activation_layouts(x, tiles)]
    C, c0, w = op.window(x.shape)
    out = []
    for lay_out in activation_layouts(y, tiles):
        for lay_in in activation_layouts(x, tiles):
            prog = Program()
            a = prog.add_buffer(ctx.tensor_buffer(x.name, lay_in))
            b = prog.add_buffer(ctx.tensor_buffer(y.name, lay_out))
            view = prog.add_buffer(Buffer(f"{op.name}.window@{lay_in}", Window(lay_in, x.shape, C, c0), y.shape,
                                          y.dtype, "transient", "standard", y.scale))
            prog.aliases[view.name] = a.name           # the window is the input's memory
            prog.steps.append(ExchangeStep(f"{op.name}.slice", (Copy(view.name, b.name),)))
            out.append(_candidate(ctx, op, lay_in, lay_out, prog,
                                  f"slice columns [{c0}, {c0 + w}) of {C}: the window copied where it lies"))
    return out


def concat_candidates(ctx, op) -> list[Candidate]:
    g, tiles = ctx.graph, ctx.target.tiles
    xs, y = g.inputs_of(op), g.output_of(op)
    C, windows = op.windows([x.shape for x in xs])
    per_input = [activation_layouts(x, tiles) for x in xs]
    # Every combination of input layouts for a few inputs; beyond that, each input in the same
    # kind of layout (the combinations grow as 2^n and the selection converts into any of them).
    choices = (list(itertools.product(*per_input)) if len(xs) <= 3 else
               [tuple(lays[min(k, len(lays) - 1)] for lays in per_input) for k in range(max(map(len, per_input)))])
    out = []
    for lay_out in activation_layouts(y, tiles):
        for lays_in in choices:
            prog = Program()
            b = prog.add_buffer(ctx.tensor_buffer(y.name, lay_out))
            copies = []
            # Each part in its window of the output's buffer (no part is zero-size: planner.rewrite
            # drops those).
            for i, (x, lay_in, (c0, _)) in enumerate(zip(xs, lays_in, windows)):
                a = prog.add_buffer(ctx.tensor_buffer(x.name, lay_in))
                view = prog.add_buffer(Buffer(f"{op.name}.window{i}@{lay_out}", Window(lay_out, y.shape, C, c0),
                                              x.shape, y.dtype, "transient", "standard", y.scale))
                prog.aliases[view.name] = b.name          # the window is the output's memory
                copies.append(Copy(a.name, view.name))
            prog.steps.append(ExchangeStep(f"{op.name}.concat", tuple(copies)))
            d = cost_program(scheduled(prog, tiles), ctx.target)
            out.append(Candidate(op.name, tuple(lays_in), lay_out,
                                 f"concat of {len(xs)} along axis {op.axis % len(y.shape)}: each input copied into "
                                 f"its column window of {C}", d.estimate, d.estimate, prog,
                                 np.zeros(tiles, dtype=np.int64)))
    return out


def transpose_candidates(ctx, op) -> list[Candidate]:
    g, target = ctx.graph, ctx.target
    x, y = g.inputs_of(op)[0], g.output_of(op)
    perm, n = tuple(op.perm), len(op.perm)
    if perm == tuple(range(n)):
        return view_candidates(ctx, op)
    if perm[-1] == n - 1:
        return [_gather_rows(ctx, op, Permuted(lay, y.shape, perm), f"transpose {''.join(map(str, perm))}: rows "
                             "exchanged, one local copy per tile") for lay in activation_layouts(y, target.tiles)]
    if perm == tuple(range(n - 2)) + (n - 1, n - 2):
        if y.layout is not None and not isinstance(y.layout, WholeRows):
            raise op.err(f"a transpose of the last two axes writes whole rows; the pinned layout {y.layout} of "
                         f"{y.name!r} is not")
        return [_matrix_transpose(ctx, op, y.layout or WholeRows(target.tiles))]
    raise op.err(f"perm {list(perm)} moves the last axis and others at once; tileplan transposes the last two "
                 "axes, or permutes leading axes keeping the last (split it into two Transposes)")


def _gather_rows(ctx, op, staged: Permuted, desc: str, source=None) -> Candidate:
    """The output in ``staged.base``: the input exchanged into ``staged`` (each tile receives the
    input rows its output pieces are made of), then one local copy per tile. A Transpose's staged
    input holds every element, so it is the candidate's input layout (selection converts into it);
    a Slice's holds the rows it picks only, so the candidate reads ``source`` (a boundary layout)
    and its program exchanges that into a transient buffer in ``staged``."""
    g, target = ctx.graph, ctx.target
    x, y = g.inputs_of(op)[0], g.output_of(op)
    lay = staged.base
    prog = Program()
    if source is None:
        src = prog.add_buffer(ctx.tensor_buffer(x.name, staged))
    else:
        whole = prog.add_buffer(ctx.tensor_buffer(x.name, source))
        src = prog.add_buffer(Buffer(f"{op.name}.rows@{staged}", staged, x.shape, x.dtype, "transient", "standard",
                                     x.scale))
        prog.steps.append(ExchangeStep(f"{op.name}.gather", (Copy(whole.name, src.name),)))
    dst = prog.add_buffer(ctx.tensor_buffer(y.name, lay))
    held = lay.owner_map(y.shape, y.dtype, target.tiles).elements_per_tile(target.tiles)
    vertices = tuple(_vertex(t, CopyCall(int(e) * y.dtype.itemsize), (Operand(src.name, 0, int(e)),),
                             (Operand(dst.name, 0, int(e)),), ctx.caches) for t, e in enumerate(held.tolist()) if e)
    prog.steps.append(ComputeStep(f"{op.name}.copy", vertices))
    return _candidate(ctx, op, staged if source is None else source, lay, prog, desc)


def column_blocks(x_shape, lay: WholeRows, y_shape, dtype, tiles: int) -> tuple[Grid, list]:
    """The staging grid of a last-two-axes transpose ``[B, T, D] -> [B, D, T]`` with the output in
    ``lay``: the input's 2-D view ``[B*T, D]`` cut into row blocks of ``T`` (one per batch) and the
    column bounds of every output tile's rows; each block is held by the tile whose output rows it
    makes. Returns the grid and, per held block in the grid's order on its tile, ``(tile, b, d0, d1)``."""
    T, D = int(x_shape[-2]), int(x_shape[-1])
    B = int(np.prod(x_shape[:-2], dtype=np.int64))
    om = lay.owner_map(y_shape, dtype, tiles)
    # Output rows r = b * D + d of [B*D, T]; each tile's range cut at batch boundaries.
    r0, r1 = om.start // T, om.stop // T
    cuts = set()
    for a, b in zip(r0.tolist(), r1.tolist()):
        cuts.update((a % D, b % D if b % D else D))
    col_bounds = sorted(cuts | {0, D})
    holders = np.full((B, len(col_bounds) - 1), -1, dtype=np.int64)
    segments = []
    for t, a, b in zip(om.tile.tolist(), r0.tolist(), r1.tolist()):
        r = a
        while r < b:
            bi, d0 = divmod(r, D)
            d1 = min(D, d0 + (b - r))
            lo, hi = col_bounds.index(d0), col_bounds.index(d1)
            holders[bi, lo:hi] = t
            segments.extend((t, bi, col_bounds[j], col_bounds[j + 1]) for j in range(lo, hi))
            r += d1 - d0
    grid = Grid.of([i * T for i in range(B + 1)], col_bounds, holders)
    return grid, segments


def _matrix_transpose(ctx, op, lay: WholeRows) -> Candidate:
    g, target = ctx.graph, ctx.target
    x, y = g.inputs_of(op)[0], g.output_of(op)
    T, D = x.shape[-2], x.shape[-1]
    grid, segments = column_blocks(x.shape, lay, y.shape, x.dtype, target.tiles)
    prog = Program()
    src = prog.add_buffer(ctx.tensor_buffer(x.name, grid))
    dst = prog.add_buffer(ctx.tensor_buffer(y.name, lay))
    om = lay.owner_map(y.shape, y.dtype, target.tiles)
    first_row = dict(zip(om.tile.tolist(), (om.start // T).tolist()))
    # Blocks stack on their tile in block order (row block major), each at an 8-byte aligned offset.
    offsets = grid.block_offsets(x.dtype.itemsize)
    vertices = []
    for t, b, d0, d1 in segments:
        j = grid.col_bounds.index(d0)
        at = int(offsets[b, j, 0])
        rows_out = b * D + d0 - first_row[t]
        vertices.append(_vertex(t, TransposeCall(T, d1 - d0, x.dtype), (Operand(src.name, at, T * (d1 - d0)),),
                                (Operand(dst.name, rows_out * T, T * (d1 - d0)),), ctx.caches))
    prog.steps.append(ComputeStep(f"{op.name}.transpose", tuple(vertices)))
    return _candidate(ctx, op, grid, lay, prog, f"transpose of the last two axes: [{T}, w] column blocks "
                                               f"exchanged, transposed on tile")
