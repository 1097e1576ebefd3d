"""``check_program``: a tile program read from a package, checked against its own bounds.

A package whose manifest matches may still hold arrays someone edited and
re-hashed. Before the IPU model runs anything, every array is checked
(vectorised, one numpy pass per array: the tile program of a big package has
about a million entries):

- buffers: known element type, positive shape, ``addr``/``size`` shaped
  ``[buffers, tiles]``, integer, ``size >= 0``, ``addr >= -1``, every allocation
  inside the tile's usable memory (past the reserve, before the end);
  ``alias_of`` names a buffer, ``span`` lies within the program's steps;
- host I/O maps: one per host buffer, integer arrays of one length, tiles in
  ``[0, tiles)``, ``0 <= start <= stop <=`` the buffer's elements, ``offset >= 0``,
  and every interval inside the buffer's allocation on its tile;
- compute sets: each vertex group's ``tile`` in range, ``ins``/``outs`` shaped
  ``[vertices, operands]``, operand sizes non-negative, every operand inside
  usable memory, cycles non-negative;
- each vertex group's kernel variant against the package's target (``check_variant``): a variant
  the registry knows, of the call's primitive and the target's family, whose predicates (the ones
  ``Registry.dispatch`` chose it by) accept the call on this target: an FP8 vertex on a target
  without FP8 (``amp_fp8 = 0``) is refused, naming the vertex group and the target;
- exchanges: the six transfer columns integer and of one length, tiles in
  range, ``nbytes > 0``, source and destination inside usable memory;
- the graph (model.json) against the program: every host buffer's tensor exists
  with the same element type, scale and shape (transposed where the buffer says
  so), and every graph output has an output buffer.

Errors are ``TileplanError`` without a path; ``load_package`` prefixes the package.
"""

from __future__ import annotations

import numpy as np

from ..errors import TileplanError
from ..graph.core import Role
from ..graph.dtypes import DType
from .tile_program import ComputeSet, Exchange

HOST_KINDS = ("input", "parameter", "output")


def check_program(tp, target, graph, registry=None) -> None:
    from ..kernels import default_registry
    registry = registry or default_registry()
    tiles = tp.tiles
    if not isinstance(tiles, int) or tiles != target.tiles:
        raise TileplanError(f"program.json: the tile program has {tiles!r} tiles, its target {target.tiles}")
    lo, hi = target.reserve_bytes, target.sram_bytes
    nbuf = len(tp.buffers)
    addr, size = _int_array(tp.addr, "program.npz: addr"), _int_array(tp.size, "program.npz: size")
    for name, a in (("addr", addr), ("size", size)):
        if a.shape != (nbuf, tiles):
            raise TileplanError(f"program.npz: {name} has shape {list(a.shape)}, expected [{nbuf}, {tiles}] "
                                "(buffers x tiles)")
    _first_bad(size < 0, "program.npz: size", "a negative buffer size", size)
    _first_bad(addr < -1, "program.npz: addr", "a negative address", addr)
    used = addr >= 0
    _first_bad(used & ((addr < lo) | (addr + size > hi)), "program.npz: addr",
               f"an allocation outside usable memory [{lo}, {hi})", addr)

    names = {}
    items = []
    for i, b in enumerate(tp.buffers):
        where = f"program.json: buffer {i} ({b.name!r})"
        if not isinstance(b.name, str) or b.name in names:
            raise TileplanError(f"{where}: a missing or repeated name")
        names[b.name] = i
        try:
            dt = DType(b.dtype)
        except ValueError:
            raise TileplanError(f"{where}: unknown element type {b.dtype!r}") from None
        if (not isinstance(b.shape, list) or not b.shape
                or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in b.shape)):
            raise TileplanError(f"{where}: shape {b.shape!r} is not a list of positive integers")
        items.append(dt.itemsize)
        if b.span is not None and not (isinstance(b.span, list) and len(b.span) == 2
                                       and all(isinstance(x, int) for x in b.span)
                                       and 0 <= b.span[0] <= b.span[1] < max(len(tp.steps), 1)):
            raise TileplanError(f"{where}: span {b.span!r} is not within the program's {len(tp.steps)} steps")
    for i, b in enumerate(tp.buffers):
        if b.alias_of is not None and b.alias_of not in names:
            raise TileplanError(f"program.json: buffer {b.name!r} aliases {b.alias_of!r}, which is not a buffer")
    _check_against_graph(tp, graph)

    # host I/O maps
    for name, io in tp.io_maps.items():
        where = f"program.npz: the host map of {name!r}"
        if name not in names:
            raise TileplanError(f"{where}: no such buffer")
        bi = names[name]
        b = tp.buffers[bi]
        if b.kind not in HOST_KINDS:
            raise TileplanError(f"{where}: the buffer is a {b.kind!r} buffer, not a host input or output")
        tile, start, stop, offset = (_int_array(a, f"{where} ({k})")
                                     for a, k in zip(io, ("tile", "start", "stop", "offset")))
        n = tile.shape
        if any(a.ndim != 1 or a.shape != n for a in (tile, start, stop, offset)):
            raise TileplanError(f"{where}: tile, start, stop and offset are not 1-D arrays of one length")
        elements = int(np.prod(b.shape))
        _first_bad((tile < 0) | (tile >= tiles), where, f"a tile outside [0, {tiles})", tile)
        _first_bad((start < 0) | (stop < start) | (stop > elements), where,
                   f"an interval outside the buffer's {elements} elements", start)
        _first_bad(offset < 0, where, "a negative offset", offset)
        item = items[bi]
        t = np.clip(tile, 0, tiles - 1)
        inside = (addr[bi, t] >= 0) & ((offset + stop - start) * item <= size[bi, t])
        _first_bad(~inside, where, "an interval outside the buffer's allocation on its tile", tile)
    for b in tp.buffers:
        if b.kind in HOST_KINDS and b.name not in tp.io_maps:
            raise TileplanError(f"program.json: host buffer {b.name!r} has no host map in program.npz")

    # steps
    for si, st in enumerate(tp.steps):
        if isinstance(st, ComputeSet):
            for gi, g in enumerate(st.groups):
                where = f"program.npz: step {si} ({st.name!r}) vertex group {gi} ({g.variant})"
                tile = _int_array(g.tile, f"{where} tile")
                if tile.ndim != 1:
                    raise TileplanError(f"{where}: tile is not a 1-D array")
                _first_bad((tile < 0) | (tile >= tiles), where, f"a tile outside [0, {tiles})", tile)
                check_variant(g, target, registry, where)
                if not isinstance(g.cycles, int) or g.cycles < 0:
                    raise TileplanError(f"{where}: cycles {g.cycles!r} is not a non-negative integer")
                for what, arr, nbytes in (("ins", g.ins, g.in_bytes), ("outs", g.outs, g.out_bytes)):
                    a = _int_array(arr, f"{where} {what}")
                    if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in nbytes):
                        raise TileplanError(f"{where}: operand sizes {list(nbytes)} are not non-negative integers")
                    if a.shape != (tile.size, len(nbytes)):
                        raise TileplanError(f"{where}: {what} has shape {list(a.shape)}, expected "
                                            f"[{tile.size}, {len(nbytes)}] (vertices x operands)")
                    nb = np.asarray(nbytes, dtype=np.int64)
                    _first_bad((a < lo) | (a + nb > hi), where,
                               f"an operand ({what}) outside usable memory [{lo}, {hi})", a)
        elif isinstance(st, Exchange):
            where = f"program.npz: step {si} ({st.name!r}) transfers"
            tr = st.transfers
            cols = {f: _int_array(getattr(tr, f), f"{where} ({f})")
                    for f in ("group", "src_tile", "src_off", "dst_tile", "dst_off", "nbytes")}
            n = cols["group"].shape
            if any(a.ndim != 1 or a.shape != n for a in cols.values()):
                raise TileplanError(f"{where}: the transfer columns are not 1-D arrays of one length")
            for f in ("src_tile", "dst_tile"):
                _first_bad((cols[f] < 0) | (cols[f] >= tiles), f"{where} ({f})", f"a tile outside [0, {tiles})",
                           cols[f])
            _first_bad(cols["nbytes"] <= 0, f"{where} (nbytes)", "a transfer of no or negative bytes", cols["nbytes"])
            for f in ("src_off", "dst_off"):
                _first_bad((cols[f] < lo) | (cols[f] + cols["nbytes"] > hi), f"{where} ({f})",
                           f"bytes outside usable memory [{lo}, {hi})", cols[f])
        else:
            raise TileplanError(f"program.json: step {si} is neither a compute set nor an exchange")



def check_variant(g, target, registry, where: str) -> None:
    """The vertex group ``g``'s variant runs its call on ``target``: the very test
    ``Registry.dispatch`` applies (the variant's primitive and families, then every predicate), so a
    package whose target was swapped for one lacking what its kernels need (FP8, an AMP type) is
    refused however the target file was edited. Design decision: one mechanism, the registry's
    predicates, re-applied at load time (``check_program``) and by the IPU model before a compute
    set runs, rather than a second list of what each target supports."""
    name = g.variant
    if not isinstance(name, str) or name not in registry:
        raise TileplanError(f"{where}: kernel variant {name!r} is not in this tileplan's kernel registry")
    v = registry[name]
    primitive = getattr(g.call, "primitive", None)
    if v.primitive != primitive:
        raise TileplanError(f"{where}: kernel variant {name!r} implements {v.primitive!r}, the call is {primitive!r}")
    if target.family not in v.families:
        raise TileplanError(f"{where}: kernel variant {name!r} does not run on target {target.name!r} "
                            f"(family {target.family}; it runs on {', '.join(v.families)})")
    try:
        reasons = v.rejections(g.call, target)
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, ZeroDivisionError, OverflowError) as exc:
        raise TileplanError(f"{where}: the call of kernel variant {name!r} is malformed "
                            f"({type(exc).__name__}: {str(exc)[:120]})") from None
    if reasons:
        raise TileplanError(f"{where}: kernel variant {name!r} cannot run on target {target.name!r}: "
                            f"{'; '.join(reasons)}")


def _check_against_graph(tp, graph) -> None:
    for b in tp.buffers:
        if b.kind not in HOST_KINDS:
            continue
        where = f"program.json: host buffer {b.name!r}"
        t = graph.tensors.get(b.tensor) if isinstance(b.tensor, str) else None
        if t is None:
            raise TileplanError(f"{where}: its tensor {b.tensor!r} is not in model.json")
        if b.dtype != t.dtype.value:
            raise TileplanError(f"{where}: element type {b.dtype} disagrees with model.json's {t.dtype} "
                                f"for tensor {t.name!r}")
        if b.scale != t.scale:
            raise TileplanError(f"{where}: scale {b.scale!r} disagrees with model.json's {t.scale} "
                                f"for tensor {t.name!r}")
        shape = list(t.shape)
        if b.transpose and len(shape) >= 2:
            shape[-2], shape[-1] = shape[-1], shape[-2]
        if list(b.shape) != shape:
            raise TileplanError(f"{where}: shape {b.shape} disagrees with model.json's {list(t.shape)} "
                                f"for tensor {t.name!r}" + (" (transposed)" if b.transpose else ""))
    have = {b.tensor for b in tp.buffers if b.kind == "output"}
    for t in graph.tensors.values():
        if t.role is Role.OUTPUT and t.name not in have and t.name not in graph.folded:   # folded: host data
            raise TileplanError(f"program.json: output {t.name!r} of model.json has no output buffer")


def _int_array(a, where: str) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype.kind not in "iu":
        raise TileplanError(f"{where}: holds {a.dtype} values, not integers")
    return a.astype(np.int64, copy=False)


def _first_bad(bad: np.ndarray, where: str, what: str, values: np.ndarray) -> None:
    if bad.any():
        idx = np.unravel_index(int(np.argmax(bad)), bad.shape)
        at = ", ".join(map(str, idx))
        raise TileplanError(f"{where}: {what} at [{at}] (value {int(values[idx])})")


# ---- the package's JSON documents, before use ------------------------------------------------

_MAX_DIMS = 16                   # dimensions of a tensor or buffer
_MAX_DIM = 1 << 40               # one dimension


def _document_specs(target_fields: dict, steps: int):
    """The schema (``tileplan.schema``) of each JSON document a package holds, as loading and
    validation read them; ``steps``: the tile program's step count, bounding buffer spans."""
    from ..schema import Bool, Int, List, Map, Num, NumText, Obj, Opt, Str
    dims = lambda lo: List(Int(lo, _MAX_DIM), max_len=_MAX_DIMS)     # noqa: E731
    scale = Int(-1000, 1000)
    names = List(Str())
    kinds = {"str": Str(), "float": Num(), "int": Int()}
    from ..planner.pipeline import MAX_MICRO_BATCHES
    from ..target import OPTIONAL_FIELDS           # the multi-IPU figures: absent from one-IPU packages
    target = Obj({k: kinds.get(str(t), Int()) for k, t in target_fields.items() if k not in OPTIONAL_FIELDS},
                 {k: kinds.get(str(t), Int()) for k, t in target_fields.items() if k in OPTIONAL_FIELDS}, closed=True)
    model = Obj({"name": Str(), "ops": List(Obj({"name": Str(), "kind": Str(), "output": Str(), "inputs": names})),
                 "tensors": List(Obj({"name": Str(), "dtype": Str(), "role": Str(), "shape": dims(0)},
                                     {"scale": scale})),
                 "outputs": names},
                {"unread": names, "target": Opt(Str()), "folded": Map(NumText())})
    arrays = {"arrays": Map(Str())}
    group = Obj({"call": Obj(), "variant": Str(), "cycles": Int(0, 1 << 48),
                 "in_bytes": List(Int(0, 1 << 40), max_len=64), "out_bytes": List(Int(0, 1 << 40), max_len=64)},
                arrays)
    step = Obj({"kind": Str(), "name": Str()},
               {"groups": List(group), "sources": List(List(Int(0, 1 << 40), length=2)),
                "like": Int(0, max(steps - 1, 0)), "group_arrays": List(Map(Str())), **arrays})
    span = Opt(List(Int(0, max(steps - 1, 0)), length=2))
    buffer = Obj({"name": Str(), "dtype": Str(), "shape": dims(1), "kind": Str(), "region": Str(),
                  "layout": Str(), "tensor": Opt(Str()), "transpose": Bool(), "scale": scale},
                 {"alias_of": Opt(Str()), "span": span, "space": Str()}, closed=True)
    program = Obj({"tiles": Int(1, 1 << 24), "buffers": List(buffer), "steps": List(step), "io": names},
                  {"passes": names, "io_arrays": Map(Map(Str()))})
    plan = Obj(optional={"weights": Opt(Str()), "prearranged": List(Obj({"tensor": Str()})),
                         "pipeline": Obj({"micro_batch": Int(1, _MAX_DIM), "micro_batches": Int(1, MAX_MICRO_BATCHES),
                                          "batch": Int(1, _MAX_DIM), "stages": Int(1, 1 << 16)})})
    report = Obj(optional={"roofline_cycles": Opt(Num()), "estimate": Obj(optional={"cycles": Opt(Num())})})
    return {"target.json": target, "model.json": model, "program.json": program, "plan.json": plan,
            "report.json": report}


def check_documents(docs: dict, root) -> None:
    """The fields of the package's JSON documents that loading and validation use, checked before
    use against one schema each (``_document_specs``, written with ``tileplan.schema``: types,
    ranges, list lengths), then the references between them: ``program.json``'s tiles against
    ``target.json``'s, its io list against its buffers, its steps' kinds, a buffer's span within the
    steps, a buffer's space.

    Design decision: a malformed document (a list for an object, a string for a count, a 60-digit
    tile count) is one error naming the file and the field, rather than whichever ``KeyError`` or
    ``TypeError`` the first use of the field would raise; the meaning of the values (addresses,
    sizes, the graph's consistency) is checked after, by ``Target``, ``graph_from_dict`` and
    ``check_program``."""
    from dataclasses import fields

    from ..schema import check
    from ..target import Target
    steps = docs["program.json"].get("steps")
    specs = _document_specs({f.name: f.type for f in fields(Target)}, len(steps) if isinstance(steps, list) else 0)
    for name, spec in specs.items():
        if name in docs:
            check(docs[name], spec, f"{root / name}: damaged {name}")

    def fail(path: str, problem: str):
        raise TileplanError(f"{root / 'program.json'}: damaged program.json: {path}: {problem}")

    prog = docs["program.json"]
    if prog["tiles"] != docs["target.json"]["tiles"]:
        fail("tiles", f"the tile program has {prog['tiles']} tiles, its target {docs['target.json']['tiles']} "
                      "(target.json)")
    buffers = {b["name"] for b in prog["buffers"]}
    for i, b in enumerate(prog["buffers"]):
        space = b.get("space", "rows")
        if space != "rows" and not (space.startswith("panels") and space[6:].isdigit()
                                    and 0 < int(space[6:]) <= _MAX_DIM):
            fail(f"buffers[{i}].space", f"{space[:40]!r} is neither 'rows' nor 'panels<width>'")
        span = b.get("span")
        if span is not None and span[0] > span[1]:
            fail(f"buffers[{i}].span", f"{span} is not [first, last]")
    for i, st in enumerate(prog["steps"]):
        if st["kind"] not in ("compute", "exchange"):
            fail(f"steps[{i}].kind", f"{st['kind'][:40]!r} is neither 'compute' nor 'exchange'")
        if st["kind"] == "compute" and "like" in st:
            like = prog["steps"][st["like"]]
            if st["like"] >= i or like["kind"] != "compute" or "groups" not in like:
                fail(f"steps[{i}].like", f"{st['like']} is not an earlier compute step that lists its groups")
            if len(st.get("group_arrays", ())) != len(like["groups"]):
                fail(f"steps[{i}].group_arrays", f"not one entry per group of step {st['like']} "
                                                  f"({len(like['groups'])})")
        elif st["kind"] == "compute" and "groups" not in st:
            fail(f"steps[{i}].groups", "missing")
    for i, name in enumerate(prog["io"]):
        if name not in buffers:
            fail(f"io[{i}]", f"{name[:80]!r} is not a buffer of the program")
