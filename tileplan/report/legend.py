"""The key to the notation the reports print: layouts, GEMM grids, tile orders, storage, step names.

One list, ``LEGEND``, of ``(group, notation, meaning)``; ``tileplan report --legend``
prints it as a table and the HTML report shows it as its "Legend" section. The
notations are the ``str`` of the layout values (``layout/layouts.py``,
``layout/gemm_grid.py``, ``planner/select.py``) and of ``GemmChoice``
(``planner/gemm.py``): a new notation there belongs here too
(``tests/report/test_legend.py`` checks every layout the fixtures' plans print).
"""

from __future__ import annotations

# The three memory figures a report prints, each under one label everywhere (HTML, terminal, the
# CLI's compile and validate lines): what the planner estimated, what the allocation placed, what
# the IPU model measured. They differ; the legend says why.
MEMORY = {
    "estimate": "planner's estimate",
    "allocation": "allocation's peak",
    "simulated": "IPU model's simulated peak",
}

LEGEND: list[tuple[str, str, str]] = [
    ("layout", "Rows(k)", "whole rows over tiles 0..k-1, contiguous row ranges, the first n % k tiles one row more"),
    ("layout", "Rows(k@t)", "as Rows(k), starting at tile t"),
    ("layout", "Iv(k,a16)", "the flat row-major tensor cut in k contiguous intervals (tiles 0..k-1), each boundary "
                            "a multiple of 16 bytes"),
    ("layout", "Packed(g,k)", "AMP panels: the matrix as a stream of panel rows g columns wide (panel-major), cut in "
                              "k chunks over tiles 0..k-1; how a GEMM's weights stay resident"),
    ("layout", "Explicit(n)", "n (tile, start, stop) intervals pinned by the model file"),
    ("layout", "Imp(L)", "a host input, written by the host in layout L"),
    ("layout", "Fused(L)", "not materialised: the value stays in registers of the fused op, which writes layout L"),
    ("layout", "Grid(RxC rN pG)", "a GEMM's private block grid: R row blocks x C column blocks, each block on N tiles "
                                  "(replicas); pG: the blocks are in AMP panels of G columns; at a boundary (a "
                                  "grid-aligned A), the blocks the reading GEMM's grid multiplies"),
    ("layout", "Blocks(RxC rN)", "the same block grid as a boundary layout"),
    ("layout", "SplitRows(gxp)", "rows in g groups, each row cut in p column pieces on p neighbouring tiles "
                                 "(piece j of group i on tile i*p + j); a row-wise op exchanges FP32 partials "
                                 "within each row's tiles"),
    ("layout", "Stored(L)", "stored in L by an op that also did its consumer's work (a residual Add fused into "
                            "the LayerNorm after it: the sum and the norm); the consumer reads it and costs "
                            "nothing"),
    ("grid", "grid BxMxNxK", "a GEMM split over B batch groups x M row blocks x N column blocks x K blocks "
                             "(B omitted when 1); tiles used = the product"),
    ("grid", "bijl", "tile order: the last letter varies fastest over physical tiles; bijl puts the K partners "
                     "of one output block on adjacent tiles"),
    ("grid", "bilj", "tile order: tiles that share an A block adjacent (A multicasts land on tile pairs: paired "
                     "exchange)"),
    ("grid", "bjli", "tile order: tiles that share a B block adjacent (B multicasts paired)"),
    ("grid", "gather / rows", "split-K reduction: gather (the K block 0 tile reduces the whole output block) or "
                              "rows (its rows scattered over the K partners, each reducing one piece)"),
    ("grid", "fp16 / fp32", "the partials type of the GEMM (the AMP's accumulator output)"),
    ("grid", "serial-K s", "each tile walks its K range in s chunks, accumulating in place (less memory)"),
    ("grid", "+bias", "bias fused into the reduction: the reducers add the following Add's bias row"),
    ("candidate", "A:L", "the layout the candidate reads its activation input A in"),
    ("candidate", "-> L", "the layout the candidate writes its output in"),
    ("memory", "standard / interleaved", "the two SRAM regions of a tile; AMP weight operands live in the "
                                         "interleaved one"),
    ("memory", "parameters / activations / partials / transient",
     "liveness classes: model parameters; inputs, outputs and intermediate tensors; a GEMM's partial sums "
     "(buffers .C, .P, .Pr); other buffers private to one op (its operand blocks, staging)"),
    ("memory", MEMORY["estimate"],
     "the planner's memory peak of a tile: the most bytes its buffers hold at once, from their liveness over "
     "the planned program (estimate/memory.py), each buffer rounded up to the target's alignment"),
    ("memory", MEMORY["allocation"],
     "what the allocator placed (lowering/allocate.py): in each region the highest address used above the "
     "region's start, summed over the two regions; at least the estimate: buffers keep their address while "
     "live, so the gaps a freed buffer leaves between live ones (fragmentation) and the region each buffer must "
     "sit in count, and a buffer that shares another's memory (a donated buffer, a no-op copy) counts once"),
    ("memory", MEMORY["simulated"],
     "the most bytes live at once on a tile in the IPU model's run of the tile program (tileplan validate): "
     "the lowered program's buffers, after the lowering passes; below the estimate where a pass shortened a "
     "buffer's life or donated one buffer's memory to another, above it where lowering added staging buffers"),
    ("memory", "always live", "a buffer live over the whole program (parameters, resident weights)"),
    ("step", "op.prep / op.amp / op.reduce.exchange / op.reduce / op.out",
     "a GEMM's steps: operand preparation exchange, AMP compute set, split-K partials exchange and reduction "
     "compute set, output conversion exchange"),
    ("step", "op.compute", "an elementwise op's compute set (Add, GeLU, Cast, fused bias-GeLU)"),
    ("step", ".local", "the on-tile copies of an exchange step (a compute set of copy vertices)"),
    ("step", "compute set", "one BSP compute phase: vertices (kernel calls) on many tiles; a step lasts as long "
                            "as its slowest tile"),
    ("step", "exchange", "one BSP exchange phase after a sync: each tile max(send, receive) cycles"),
]


def legend_rows() -> list[tuple[str, str, str]]:
    return list(LEGEND)
