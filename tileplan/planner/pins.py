"""Pins: a user's choice of a GEMM's grid, as poplin's ``planConstraints`` and ipu-stack's
``--gemm-plan-constraint`` allow, to reproduce a plan or try one of their own.

A pin is one line, ``OP=grid:GMxGNxGK`` (or ``GBxGMxGNxGK`` for a batched GEMM), optionally with
``,order:bjli`` (which physical tile runs which grid cell), ``,reduction:gather|rows``,
``,partials:fp16|fp32``, ``,serial:N`` (serial K steps), ``,storage:panels|grid`` (the weights
in resident panels, or pre-arranged as the grid reads them) and
``,epilogue:none|bias|bias+gelu+fp8|...`` (what the reducers do after the sum: the following bias
Add, GeLU and Cast to FP8 they fuse, ``planner.epilogue``; a pin naming one the op's graph does not
allow is an error that says which it allows). On the command line ``--pin`` is repeatable and
``--pins FILE`` reads a TOML file with a ``[pin]`` table (``OP = "grid:..."``), the format
``tileplan plan --emit-pins FILE`` writes and a model file's own ``[pin]`` table uses.

The planner keeps, of a pinned GEMM, only the candidates that match the pin. When its catalogue
kept none, the pinned grid is built and costed in every boundary combination and every form the
pin leaves open (orders, reductions, partials, the storage, the bias and the epilogue in the
reduction). A pin that fits no candidate is an error that says why: the tiles it needs, a split
into empty blocks, tile memory, the missing kernel, or an epilogue the op cannot fuse.

A pin that selects what the planner would have chosen changes nothing (the same package, byte for
byte). One that changes the plan is recorded in plan.json beside the planner's own choice and its
cycles, and the reports show both.
"""

from __future__ import annotations

import itertools

from ..errors import TileplanError
from ..graph.pins import ORDERS, REDUCTIONS, Pin, epilogue_name, parse_pin, read_pins_file  # noqa: F401  (re-exported)

def pin_of(cand, storage_in_grid: bool) -> Pin:
    """The pin that reproduces a GEMM candidate's choice exactly."""
    c = cand.choice
    return Pin(cand.op, (c.gb, c.gm, c.gn, c.gk), c.order, c.reduction if c.gk > 1 else None, c.partials,
               c.sk, "grid" if storage_in_grid else "panels", epilogue_name(c.bias, c.epilogue))


def fused_kinds(ctx, op) -> dict[str, tuple]:
    """The epilogues (``epilogue_name``) a MatMul's candidates may have, each with the (bias, chain)
    its fragment fuses: ``none``; ``bias`` with its bias Add (``catalogue.bias_fusion``); the chain
    its reducers may do (``catalogue.epilogue_fusion``)."""
    from .catalogue import bias_fusion, epilogue_fusion
    kinds = {"none": (False, None)}
    if bias_fusion(ctx, op) is not None:
        kinds["bias"] = (True, None)
    chain = epilogue_fusion(ctx, op)
    if chain is not None:
        kinds[epilogue_name(chain.bias is not None, chain.epilogue)] = (chain.bias is not None, chain)
    return kinds


def check_epilogue(ctx, op, pin: Pin) -> None:
    """A pin's epilogue must be one the op's graph allows (``fused_kinds``); the error says which."""
    if pin.epilogue is None:
        return
    kinds = fused_kinds(ctx, op)
    if pin.epilogue in kinds:
        return
    after = ctx.graph.consumers.get(op.output, [])
    nxt = (f"its output feeds {', '.join(f'{c.name} ({c.kind})' for c in after)}" if after
           else "nothing reads its output")
    raise TileplanError(f"pin of {op.name!r} ({pin}): epilogue:{pin.epilogue} is not one its reducers may do "
                        f"({nxt}; the ops after it allow {', '.join(kinds)}): the fused ops must each be the only "
                        "reader of the one before, not an output or pinned, the bias resident and replicated, "
                        "the Cast a saturating one to fp8")


def emit_pins(plan) -> str:
    """A TOML ``[pin]`` table with one pin per GEMM of a plan (``tileplan plan --emit-pins``)."""
    lines = [f"# Pins that reproduce the plan of {plan.graph.name} on {plan.target.name} (tileplan plan --emit-pins)",
             "[pin]"]
    for op in plan.graph.ops:
        cand = plan.candidates[op.name][plan.picks[op.name]]
        if cand.choice is None:
            continue
        lines.append(f'"{op.name}" = "{pin_of(cand, cand.weights is not None)}"')
    return "\n".join(lines) + "\n"


def check_pins(graph, pins: list[Pin], where: str = "--pin") -> dict[str, Pin]:
    """Pins by op name; each names a GEMM of the graph, once."""
    out: dict[str, Pin] = {}
    for pin in pins:
        try:
            op = graph.op(pin.op)
        except KeyError:
            gemms = [o.name for o in graph.ops if o.kind == "matmul"]
            raise TileplanError(f"{where}: pin of {pin.op!r}: the graph has no op of that name (its MatMuls: "
                                f"{', '.join(gemms[:12]) or 'none'})") from None
        if op.kind != "matmul":
            raise TileplanError(f"{where}: pin of {pin.op!r}: only MatMul ops take grid pins ({pin.op!r} is {op.kind})")
        if pin.op in out and out[pin.op] != pin:
            raise TileplanError(f"{where}: {pin.op!r} is pinned twice, differently: {out[pin.op]} and {pin}")
        out[pin.op] = pin
    return out


def pinned_candidates(ctx, op, pin: Pin, cands: list, runner_ups: list) -> list:
    """The candidates of a pinned GEMM: those its catalogue costed that match, else the pinned grid
    built and costed in every boundary combination and open form; an error says why none fits."""
    check_epilogue(ctx, op, pin)
    found = [c for c in cands + [r.candidate for r in runner_ups]
             if c.detailed and c.choice is not None and pin.matches(c.choice)
             and (pin.storage is None or (pin.storage == "grid") == (c.weights is not None))]
    if found:
        return found
    from ..estimate.cost import Estimate
    from ..estimate.detailed import cost_program
    from ..kernels import NoVariantError
    from .candidates import Candidate, Fused
    from .catalogue import (boundary_combinations, describe, fragment, fusion_for, interleaved_of, prearrangeable,
                            prearranged_context, transient_of)
    from .gemm import GemmChoice, GemmShape
    shape = GemmShape.of(ctx.graph, op, ctx.target)
    target = ctx.target
    gb, gm, gn, gk = pin.grid
    what = f"pin of {op.name!r} ({pin})"
    if gb * gm * gn * gk > target.tiles:
        raise TileplanError(f"{what}: the grid needs {gb * gm * gn * gk:,} tiles; {target.name!r} has "
                            f"{target.tiles:,}")
    units = -(-shape.K // max(1, 8 // shape.in_dtype.itemsize))
    n_units = -(-shape.N // shape.grain) if shape.panels else shape.N
    for name, parts, size, of in (("gb", gb, shape.batch, "the batch"), ("gm", gm, shape.M, "M"),
                                  ("gn", gn, n_units, "N's panels" if shape.panels else "N"),
                                  ("gk", gk, units, "K's 64-bit units")):
        if parts > size:
            raise TileplanError(f"{what}: {name}={parts} splits {of} ({size}) into empty blocks")
    kinds = [(bias, chain, c) for name, (bias, chain) in fused_kinds(ctx, op).items()
             if (name == "none" or gk > 1) and pin.epilogue in (None, name)
             for c in boundary_combinations(ctx, op, bias, chain)]
    orders = [pin.order] if pin.order else list(ORDERS)
    reductions = [pin.reduction] if pin.reduction else (list(REDUCTIONS) if gk > 1 else ["none"])
    partials = [pin.partials] if pin.partials else list(shape.partial_types())
    serials = [pin.serial] if pin.serial else [1]
    pre_ok = prearrangeable(ctx, op)
    if pin.storage == "grid" and not pre_ok:
        raise TileplanError(f"{what}: its weights cannot be pre-arranged (they are not a parameter in compact "
                            "storage read by this op only): drop storage:grid")
    pres = [True] if pin.storage == "grid" else [False] if pin.storage == "panels" or not pre_ok else [False, True]
    out, missing, closest = [], None, None
    for (bias, chain, combo), order, red, ptype, sk, pre in itertools.product(kinds, orders, reductions, partials,
                                                                              serials, pres):
        choice = GemmChoice(gb, gm, gn, gk, order, red, ptype if gk > 1 else shape.out_dtype, sk, bias,
                            chain.epilogue if chain is not None else None)
        fusion = fusion_for(ctx, op, choice)
        used, weights, resident = ctx, None, None
        if pre:
            used, st = prearranged_context(ctx, op, shape, choice)
            weights, resident = st.layout, used.tile_bytes(op.inputs[1], st.layout)
        try:
            prog = fragment(used, op, shape, choice, combo, fusion)
            d = cost_program(prog, target)
        except NoVariantError as e:
            missing = str(e).splitlines()[0]
            continue
        est = d.estimate
        over = max(est.total_memory - target.usable_bytes, est.interleaved - target.interleaved_bytes)
        if over > 0:
            if closest is None or over < closest[0]:
                closest = (over, est, choice)
            continue
        ins = tuple(lay for lay in combo[:2] if lay is not None)
        out_layout = Fused(combo[2], chain.tag) if chain is not None else Fused(combo[2]) if bias else combo[2]
        out.append(Candidate(op.name, ins, out_layout, describe(choice, pre), Estimate(), est,
                             prog, transient_of(used, d, choice, combo, fusion), choice=choice, boundary=combo,
                             fused=chain.last.name if chain is not None else fusion[0].name if bias else None,
                             through=chain.through if chain is not None else (), weights=weights,
                             resident=resident, interleaved=interleaved_of(used, d, prog)))
    if out:
        return out
    if closest is not None:
        over, est, choice = closest
        raise TileplanError(f"{what}: every form overflows tile memory; the least overflowing ({choice}) needs "
                            f"{est.total_memory:,} B total ({est.interleaved:,} B interleaved) on its fullest tile, "
                            f"{over:,} B over the {target.usable_bytes:,} B usable "
                            f"({target.interleaved_bytes:,} B interleaved)")
    raise TileplanError(f"{what}: no kernel runs its blocks: {missing}" if missing else f"{what}: no candidate")
