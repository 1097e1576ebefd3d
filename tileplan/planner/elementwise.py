"""Elementwise candidates (Add, GeLU, Cast, fused bias-Add + GeLU) and their programs.

An elementwise op runs where its output lies: for each activation layout of
the output tensor, every tile computes its own pieces, and the activation
inputs must arrive in the same layout (same element intervals on the same
tiles). A bias row (an Add operand of shape ``[N]`` broadcast over rows) is
read from a copy replicated on every tile (``replicated``).

Activation layouts use 8-element units (``Intervals(T, align=8 * itemsize)``)
so that one layout gives the same element intervals for FP32, FP16 and FP8:
a Cast keeps its pieces on the same tiles and moves nothing.

A bias Add whose only consumer is a GeLU may fuse with it into one
``bias_gelu`` pass: a candidate of the Add that writes the GeLU's output (the
sum is never stored); the GeLU then takes its ``absorbed`` candidate.

A bias Add that is a split-K GEMM's only consumer (``fusable_bias``) may instead
be done by the GEMM's reduction (``planner.gemm``, ``GemmChoice.bias``): the GEMM
writes the Add's output and the Add takes an ``absorbed`` candidate.
"""

from __future__ import annotations

import numpy as np

from ..graph.core import Add, Binary, Cast, GeLU, Graph, MatMul, Op, Role, Tensor, Unary
from ..graph.dtypes import DType
from ..kernels.calls import BiasGeLUCall, CastCall, GeLUCall
from ..kernels.pointwise import BinaryCall, UnaryCall
from ..layout import Imported, Intervals, WholeRows
from ..layout.gemm_grid import Grid
from ..program import Buffer, ComputeStep, Operand, Program, Vertex
from ..estimate.cost import Estimate
from ..estimate.detailed import cost_program
from .candidates import Candidate, Fused, activation_inputs
from ..estimate.caches import Caches, shared as shared_caches


def activation_layouts(t: Tensor, tiles: int) -> list:
    """The boundary layouts offered for an activation tensor (or its pinned explicit layout)."""
    if t.layout is not None:
        return [t.layout]
    return [WholeRows(tiles), intervals(tiles, t.dtype)]


def input_layout(t: Tensor, tiles: int):
    """Host inputs arrive linear (row-major Intervals) unless the model file pins a layout."""
    return t.layout if t.layout is not None else Imported(intervals(tiles, t.dtype))


def intervals(tiles: int, dtype: DType) -> Intervals:
    return Intervals(tiles, align=8 * dtype.itemsize)


def same_elements(layout, dtype: DType):
    """The layout that gives a tensor of ``dtype`` the same element intervals as ``layout`` does."""
    if isinstance(layout, Intervals) and layout.align % 8 == 0 and layout.align // 8 in (1, 2, 4):
        unit = layout.align // 8            # bytes per element of the dtype it was made for
        return Intervals(layout.owners, align=layout.align // unit * dtype.itemsize)
    return layout


def replicated(shape, tiles: int) -> Grid:
    """A whole tensor held on every tile, row-major from offset 0 (a broadcast operand)."""
    rows, cols = int(np.prod(shape[:-1])), int(shape[-1])
    return Grid.of((0, rows), (0, cols), np.arange(tiles).reshape(1, 1, tiles))


def broadcast_form(graph: Graph, op: Op) -> tuple[int | None, str]:
    """How a pointwise op reads its operands: ``(index of the broadcast operand, mode)`` with the
    modes of ``kernels.pointwise.BinaryCall``: ``dense`` (no broadcast operand: index None),
    ``scalar`` (one element), ``row_broadcast`` (the operand repeats over the leading dimensions of
    the other: a bias row ``[N]``, or any ``[..., P, N]`` repeated over a batch), ``col_broadcast``
    (``[..., M, 1]`` against ``[..., M, N]``: one value per row), ``batch_row_broadcast`` (rows that
    differ per leading index and repeat over the middle axes: ``[B, 1, 1, T]`` against
    ``[B, H, T, T]``, an attention mask; each leading index's block is a ``row_broadcast`` call reading
    its own rows of the operand). Other broadcasts (both operands broadcast, or a column repeated
    over a batch) are refused, naming the op and shapes."""
    if not isinstance(op, Binary):
        return None, "dense"
    ins = graph.inputs_of(op)
    out = graph.output_of(op)
    if all(t.shape == out.shape for t in ins):
        return None, "dense"
    for idx in (1, 0):
        t, other = ins[idx], ins[1 - idx]
        if other.shape != out.shape or t.shape == out.shape:
            continue
        if t.size == 1:
            return idx, "scalar"
        core = tuple(t.shape)
        while len(core) > 1 and core[0] == 1:
            core = core[1:]
        if tuple(out.shape[len(out.shape) - len(core):]) == core:
            return idx, "row_broadcast"
        padded = (1,) * (len(out.shape) - len(t.shape)) + tuple(t.shape)
        if padded[-1] == 1 and padded[:-1] == tuple(out.shape[:-1]):
            return idx, "col_broadcast"
        if batch_row_split(padded, tuple(out.shape)) is not None:
            return idx, "batch_row_broadcast"
    a, b = ins
    raise op.err(f"broadcasting {a.name!r} {list(a.shape)} with {b.name!r} {list(b.shape)} is supported where one "
                 "operand is the output's shape and the other a scalar, a row repeated over the leading "
                 "dimensions (a bias row, a batch broadcast) or a column [..., M, 1]")


def batch_row_split(padded: tuple, out: tuple) -> tuple[int, int] | None:
    """For an operand shape ``padded`` (as long as ``out``) that is the output's leading axes, then
    unit axes the output repeats it over, then the output's trailing axes (an attention mask
    ``[B, 1, 1, T]`` against the scores ``[B, H, T, T]``): ``(block, period)``, the output elements
    per leading index and the operand elements per leading index; else None."""
    n = len(out)
    k = 0
    while k < n - 1 and padded[k] == out[k] and out[k] > 1:
        k += 1
    j = k
    while j < n - 1 and padded[j] == 1:
        j += 1
    if k == 0 or j == k or padded[j:] != out[j:] or not any(out[a] > 1 for a in range(k, j)):
        return None
    return int(np.prod(out[k:])), int(np.prod(out[j:]))


def broadcast_operand(graph: Graph, op: Op) -> int | None:
    """The index of the operand a pointwise op reads replicated on every tile (its broadcast operand)."""
    return broadcast_form(graph, op)[0]


def is_row_broadcast(graph: Graph, op: Op) -> int | None:
    """For an Add: the index of its bias-row operand (``row_broadcast``), else None (what the bias
    fusions look for)."""
    if not isinstance(op, Add):
        return None
    idx, mode = broadcast_form(graph, op)
    return idx if mode == "row_broadcast" else None


def check_supported(graph: Graph, op: Op) -> None:
    broadcast_form(graph, op)


def pointwise_call(graph: Graph, op: Op, n: int):
    """The kernel call of a unary pointwise op (or a Cast) on ``n`` elements: the row of
    ``UNARY_CALLS`` for the op's class or its nearest base."""
    for cls in type(op).__mro__:
        if cls in UNARY_CALLS:
            return UNARY_CALLS[cls](op, graph.inputs_of(op)[0], graph.output_of(op), n)
    raise TypeError(f"no pointwise kernel for op kind {op.kind!r}")


def _cast_call(op, src: Tensor, out: Tensor, n: int) -> CastCall:
    return CastCall(n, src.dtype, out.dtype, src.scale if src.dtype is DType.FP8 else 0,
                    out.scale if out.dtype is DType.FP8 else 0, op.saturate)


# One row per unary kernel family: op class -> its call on n elements (op, input, output, n).
UNARY_CALLS = {
    GeLU: lambda op, src, out, n: GeLUCall(n, out.dtype, op.approximate),     # the fitted GeLU kernel
    Cast: _cast_call,
    Unary: lambda op, src, out, n: UnaryCall(n, out.dtype, op.kind),          # kernels.pointwise.UNARY[kind]
}


def _pieces(om) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    return om.tile, om.start, om.stop, om.offset


def _row_split(start: int, stop: int, cols: int):
    """[start, stop) of a flat row-major range -> (rows, cols, first column, element offset) runs:
    a partial head row, whole rows, a partial tail row."""
    out = []
    pos = start
    if pos % cols and pos < stop:
        end = min(stop, (pos // cols + 1) * cols)
        out.append((1, end - pos, pos % cols, pos - start))
        pos = end
    whole = (stop - pos) // cols
    if whole:
        out.append((whole, cols, 0, pos - start))
        pos += whole * cols
    if pos < stop:
        out.append((1, stop - pos, 0, pos - start))
    return out


def build_program(graph: Graph, op: Op, layout, in_bufs: list[Buffer], out_buf: Buffer, target,
                  fused_gelu: GeLU | None = None, caches: Caches | None = None,
                  fused_cast: Cast | None = None) -> Program:
    """One compute step: each tile's pieces of the output, from the same pieces of the inputs
    (kernels dispatched through ``caches``, default ``estimate.caches.shared(target)``). A fused
    bias-GeLU (``fused_gelu``, and ``fused_cast``: its result cast to FP8) tells each call whether
    its operands start 8-byte aligned (``BiasGeLUCall.aligned``; buffers are placed 8-byte aligned)."""
    caches = caches or shared_caches(target)
    prog = Program()
    for b in in_bufs + [out_buf]:
        prog.add_buffer(b)
    out_t = graph.tensors[out_buf.tensor]
    om = layout.owner_map(out_t.shape, out_t.dtype, target.tiles)
    tile, start, stop, offset = _pieces(om)
    bidx, mode = broadcast_form(graph, op)
    dense = [b for i, b in enumerate(in_bufs) if i != bidx]
    for b in dense:
        bom = b.layout.owner_map(b.shape, b.dtype, target.tiles)
        if not (np.array_equal(bom.tile, tile) and np.array_equal(bom.start, start)
                and np.array_equal(bom.stop, stop)):
            raise ValueError(f"{op.name}: input {b.name} is not laid out like the output {out_buf.name}")
    vertices = []
    period = out_t.cols
    block = None                                   # batch_row_broadcast: output elements per leading index
    if mode == "row_broadcast":
        period = graph.inputs_of(op)[bidx].size
    elif mode == "batch_row_broadcast":
        b_t = graph.inputs_of(op)[bidx]
        block, period = batch_row_split((1,) * (len(out_t.shape) - len(b_t.shape)) + tuple(b_t.shape),
                                        tuple(out_t.shape))
    made: dict = {}            # piece shape -> (call, variant, cycles): tiles with equal pieces share one call

    def vertex(t, key, make, ins, outs):
        hit = made.get(key)
        if hit is None:
            call = make()
            hit = made[key] = (call,) + caches.kernel(call)
        return Vertex(t, hit[0], ins, outs, hit[1], hit[2])

    for t, s, e, o in zip(tile.tolist(), start.tolist(), stop.tolist(), offset.tolist()):
        if not isinstance(op, Binary):
            ins = tuple(Operand(b.name, o, e - s) for b in dense)
            vertices.append(vertex(t, e - s, lambda: pointwise_call(graph, op, e - s), ins,
                                   (Operand(out_buf.name, o, e - s),)))
            continue
        x = dense[0]
        if mode in ("dense", "scalar"):            # one run of every element
            runs = [(1, e - s, 0, 0)]
        elif block is not None:                    # each leading index's block: its own rows of b
            runs = []
            for lo in range(s - s % block, e, block):
                a0, a1 = max(s, lo), min(e, lo + block)
                runs += [(r, w, lo // block * period + c, a0 - s + rel)
                         for r, w, c, rel in _row_split(a0 - lo, a1 - lo, period)]
        else:                                      # whole rows of the broadcast period, head and tail pieces
            runs = _row_split(s, e, period)
        for rows, width, c0, rel in runs:
            key = (rows, width)
            if fused_gelu is not None:
                dt = x.dtype
                aligned = ((o + rel) * dt.itemsize % 8 == 0 and (o + rel) * out_t.dtype.itemsize % 8 == 0
                           and c0 * dt.itemsize % 8 == 0)
                key = (rows, width, aligned)
                cast_to = out_t.dtype if fused_cast is not None else None
                cast_scale = out_t.scale if fused_cast is not None else 0
                make = lambda: BiasGeLUCall(rows, width, dt, fused_gelu.approximate, cast_to,  # noqa: E731
                                            cast_scale, aligned)
            else:
                kmode = "row_broadcast" if block is not None else mode      # a block reads its rows of b
                make = lambda: BinaryCall(rows, width, out_t.dtype, kmode, op.kind, swap=bidx == 0)  # noqa: E731
            ins = [Operand(x.name, o + rel, rows * width)]
            if bidx is None:
                ins.append(Operand(dense[1].name, o + rel, rows * width))
            elif mode == "scalar":
                ins.append(Operand(in_bufs[bidx].name, 0, 1))
            elif mode in ("row_broadcast", "batch_row_broadcast"):     # (c0: the block's rows offset in b)
                ins.append(Operand(in_bufs[bidx].name, c0, width))
            else:                                  # col_broadcast: one value per output row
                ins.append(Operand(in_bufs[bidx].name, (s + rel) // period, rows))
            vertices.append(vertex(t, key, make, tuple(ins), (Operand(out_buf.name, o + rel, rows * width),)))
    prog.steps.append(ComputeStep(f"{op.name}.compute", tuple(vertices)))
    return prog


def fusable_gelu(graph: Graph, op: Op) -> GeLU | None:
    """The GeLU a bias Add may fuse with: the Add's only consumer, same dtype, and the sum not an output."""
    if not isinstance(op, Add) or is_row_broadcast(graph, op) is None:
        return None
    out = graph.output_of(op)
    users = graph.consumers.get(out.name, [])
    if out.role is Role.OUTPUT or len(users) != 1 or not isinstance(users[0], GeLU):
        return None
    return users[0]


def fusable_cast(graph: Graph, op: Op) -> Cast | None:
    """The Cast to FP8 a fused pass ending in ``op`` may also do (``planner.epilogue``): the only
    consumer of ``op``'s output, a saturating Cast of an unscaled FP16 or FP32 value to FP8. Whether
    the value may stay in registers (not an output, not pinned) is the caller's to check."""
    out = graph.output_of(op)
    users = graph.consumers.get(out.name, [])
    if len(users) != 1 or not isinstance(users[0], Cast):
        return None
    cast = users[0]
    if graph.output_of(cast).dtype is not DType.FP8 or not cast.saturate:
        return None
    if out.dtype not in (DType.FP16, DType.FP32) or out.scale:
        return None
    return cast


def fusable_bias(graph: Graph, op: Op) -> tuple[Add, str] | None:
    """The bias Add a MatMul's reduction may do, and its bias tensor: the Add is the MatMul's only
    consumer, the product is not an output and has no pinned layout (it is never stored), the other
    operand is a parameter row of N elements (leading dimensions 1) broadcast over the rows, and the
    Add keeps the product's type (FP16 or FP32, unscaled: the reduction adds the bias before its one
    rounding). Whether the bias is read from its replicated storage is the planner's to check."""
    if not isinstance(op, MatMul):
        return None
    out = graph.output_of(op)
    users = graph.consumers.get(out.name, [])
    if out.role is Role.OUTPUT or out.layout is not None or len(users) != 1 or not isinstance(users[0], Add):
        return None
    add = users[0]
    idx = is_row_broadcast(graph, add)
    if idx is None:
        return None
    bias, other = graph.inputs_of(add)[idx], graph.inputs_of(add)[1 - idx]
    res = graph.output_of(add)
    if other.name != out.name or bias.role is not Role.PARAMETER:
        return None
    if any(d != 1 for d in bias.shape[:-1]) or bias.shape[-1] != out.shape[-1]:
        return None
    if not (bias.dtype is out.dtype is res.dtype) or out.dtype not in (DType.FP16, DType.FP32):
        return None
    if bias.scale or out.scale or res.scale:
        return None
    return add, bias.name


# ---- candidates ----------------------------------------------------------------------

def candidates(ctx, op) -> list[Candidate]:
    """The Pointwise family's candidates: one per activation layout of the output, plus the fused
    bias-GeLU ones of a bias Add whose only consumer is a GeLU."""
    g, target = ctx.graph, ctx.target
    check_supported(g, op)
    out_t = g.output_of(op)
    acts = activation_inputs(ctx.storage, op)
    cands = []
    for lay in activation_layouts(out_t, target.tiles):
        cands.append(_elementwise(ctx, op, lay, acts, fused=None))
    gelu = fusable_gelu(g, op)
    if gelu is not None and out_t.layout is None:
        for lay in activation_layouts(g.output_of(gelu), target.tiles):
            cands.append(_elementwise(ctx, op, lay, acts, fused=gelu))
        # Bias-GeLU with FP8 output: the pass also does the GeLU's Cast to FP8 (``planner.epilogue``).
        cast = fusable_cast(g, gelu)
        hidden = g.output_of(gelu).role is not Role.OUTPUT and g.output_of(gelu).layout is None
        if cast is not None and hidden:
            for lay in activation_layouts(g.output_of(cast), target.tiles):
                cands.append(_elementwise(ctx, op, lay, acts, fused=gelu, cast=cast))
    return cands


def _elementwise(ctx, op, lay, acts, fused, cast: Cast | None = None) -> Candidate:
    g = ctx.graph
    bidx = broadcast_operand(g, op)
    in_lays = [replicated(g.tensors[n].shape, ctx.target.tiles) if i == bidx
               else same_elements(lay, g.tensors[n].dtype) for i, n in enumerate(op.inputs)]
    in_bufs = [ctx.tensor_buffer(n, l) for n, l in zip(op.inputs, in_lays)]
    last = cast if cast is not None else fused
    out_name = last.output if last is not None else op.output
    out_buf = ctx.tensor_buffer(out_name, lay)
    prog = build_program(g, op, lay, in_bufs, out_buf, ctx.target, fused_gelu=fused, caches=ctx.caches,
                         fused_cast=cast)
    d = cost_program(prog, ctx.target)
    transient = np.zeros(ctx.target.tiles, dtype=np.int64)
    if fused is not None:
        transient = ctx.tile_bytes(out_name, lay)
    kind = "bias-gelu-fp8 " if cast is not None else "bias-gelu " if fused is not None else ""
    desc = f"{kind}{op.kind} on {lay}"
    if cast is not None:
        out_layout = Fused(lay, chain_tag("bias_gelu", (fused, cast)))
    else:
        out_layout = Fused(lay) if fused is not None else lay
    by_name = dict(zip(op.inputs, in_lays))
    return Candidate(op.name, tuple(by_name[n] for n in acts), out_layout, desc, d.estimate, d.estimate, prog, transient,
                     fused=last.name if last is not None else None,
                     through=(fused.name,) if cast is not None else ())


def chain_tag(start: str, ops) -> str:
    """The ``Fused.via`` of a fusion chain (``planner.epilogue``): what starts it and the kinds of
    the ops it absorbs (each kind occurs once in a chain, so with the tensor it marks this names one
    chain)."""
    return f"{start}:{'+'.join(op.kind for op in ops)}"


def absorbed_candidates(ctx, op, fused_layouts, into: str = "the bias Add", via: str = "",
                        stored: bool = True) -> list[Candidate]:
    """The absorbed side of a fusion (a GeLU in a bias-GeLU, a bias Add in a GEMM's reduction):
    reads nothing, costs nothing; its output was written by the op it fused ``into`` (``stored``:
    in the layout given; else it is an op in the middle of a chain, ``planner.epilogue``, whose
    output is never stored: the ``Fused`` marker of chain ``via`` passes on)."""
    out = []
    for lay in fused_layouts:
        mark = Fused(lay, via)
        out.append(Candidate(op.name, (mark,), lay if stored else mark,
                             f"fused into {into} on {lay}" + ("" if stored else " (never stored)"), Estimate(),
                             Estimate(), Program(), np.zeros(ctx.target.tiles, dtype=np.int64), absorbed=True))
    return out
