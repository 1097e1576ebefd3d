"""``host.cpp``: the tile program rebuilt with the Poplar host API.

For users who have the Poplar SDK: ``g++ -std=c++17 host.cpp -lpoplar -o host
&& ./host DATA_DIR`` builds the same graph (every vertex on the same tile with
the same shapes, every value on the same tiles, every exchange moving the same
elements between the same tiles, in the same step order), runs it on an
IPUModel (or, with ``-DTILEPLAN_HARDWARE``, on an attached IPU) and writes the
outputs next to the inputs.

How byte addresses become Poplar tensors
-----------------------------------------
Our program places buffers at explicit byte addresses and reuses memory: on the
64-tile smoke package a typical byte holds three to five different buffers
over the program, of different element types (an FP16 activation, later its FP8
cast). Poplar cannot express that: a variable has one element type, vertex
fields (``Input<Vector<half>>``) only connect to tensors of their type
(``Tensor::reinterpret`` only changes between types of one size), and the graph
compiler chooses addresses and reuses memory itself from liveness. So the host
program does not declare one variable per buffer (a vertex operand address
cannot be traced back to one buffer without liveness, which the tile program
does not store) nor one byte array per tile (typed fields could not connect to
it). Instead, emission replays the program over a per-tile map of which *value*
each byte range holds, and declares one Poplar variable per value written:

- one per host tensor (inputs and parameters), with one piece per owner-map
  interval (replicas included), each piece mapped to its tile;
- one per vertex-group output field of a compute set, one piece per vertex,
  mapped to the vertex's tile;
- one per exchange and element type, one piece per transfer destination.

Every operand is then a concatenation of slices of these variables, found by
looking up the bytes it reads; an exchange is one ``Copy`` per element type of
all its transfers' slices (multicast sources appear once per destination), and
on-tile copies (``copy`` vertex groups) are ``Copy`` programs too, since a
Poplar ``Copy`` between slices on one tile is exactly that and our byte-copy
vertex could not connect to typed data. Bytes read but never written (padding)
come from an uninitialised variable of the reader's type. Placement in the
interleaved region is left to Poplar; FP8 travels as ``UNSIGNED_CHAR`` (F143
bytes, decoded by the codelets), not Poplar's ``QUARTER``.

Size: the tables (variables, pieces, slices, operands) are static const arrays
and the vertices are added in loops, one loop per vertex group; the text grows
with the number of transfers and vertices, never with one statement each. It
is still O(transfer rows), and so is the replay (pure Python): the 64-tile
smoke package gives ~350 kB in well under a second, but the full-size SigLIP
MLP on 1472 tiles (1.35M transfer rows at batch 1, 2.4M at batch 4, mostly the
multicast of weight panels) gives 27-48 MB in 100-200 s. The fix is a
vectorised replay and binary side tables read by host.cpp; not done yet.

Host I/O: ``DATA_DIR/<tensor>.bin`` holds each input and parameter as raw
row-major elements of its type (FP16 as IEEE half, FP8 as F143 bytes already
divided by the tensor's power-of-two scale); program 0 streams the parameters
in, program 1 streams the inputs in, runs every step and streams the outputs
to ``DATA_DIR/<tensor>.bin``.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from ...errors import TileplanError
from ...graph.dtypes import DType
from ..tile_program import ComputeSet, Exchange, TileProgram
from .codelets import emit_codelets, group_codelet

ELEMENT_BYTES = {"unsigned char": 1, "half": 2, "float": 4}
POPLAR_TYPE = {"unsigned char": "poplar::UNSIGNED_CHAR", "half": "poplar::HALF", "float": "poplar::FLOAT"}
TYPE_CODE = {"unsigned char": 0, "half": 1, "float": 2}
TYPE_SUFFIX = {"unsigned char": "u8", "half": "f16", "float": "f32"}


# ---- values: Poplar variables, their tile pieces, slices and operands -------------------------

@dataclass
class Variable:
    name: str
    ctype: str
    pieces: list = field(default_factory=list)   # [tile, elements], adjacent same-tile pieces merged
    elements: int = 0

    def add_piece(self, tile: int, elements: int) -> int:
        """Append ``elements`` on ``tile``; returns the first element index of the piece."""
        begin = self.elements
        if self.pieces and self.pieces[-1][0] == tile:
            self.pieces[-1][1] += elements
        else:
            self.pieces.append([tile, elements])
        self.elements += elements
        return begin


class Values:
    """Variables plus the deduplicated slice and operand (concatenation) tables."""

    def __init__(self):
        self.variables: list[Variable] = []
        self.slices: list[tuple[int, int, int]] = []
        self._slice_ids: dict[tuple[int, int, int], int] = {}
        self.refs: list[tuple[int, int]] = []          # (first slice, number of slices) into ref_slices
        self.ref_slices: list[int] = []
        self._ref_ids: dict[tuple[int, ...], int] = {}

    def variable(self, name: str, ctype: str) -> int:
        self.variables.append(Variable(name, ctype))
        return len(self.variables) - 1

    def ref(self, parts: list[tuple[int, int, int]]) -> int:
        """The operand id of the concatenation of ``(variable, begin, end)`` slices (adjacent ones merged)."""
        merged: list[list[int]] = []
        for v, b, e in parts:
            if merged and merged[-1][0] == v and merged[-1][2] == b:
                merged[-1][2] = e
            else:
                merged.append([v, b, e])
        ids = []
        for v, b, e in merged:
            key = (v, b, e)
            if key not in self._slice_ids:
                self._slice_ids[key] = len(self.slices)
                self.slices.append(key)
            ids.append(self._slice_ids[key])
        key = tuple(ids)
        if key not in self._ref_ids:
            self._ref_ids[key] = len(self.refs)
            self.refs.append((len(self.ref_slices), len(ids)))
            self.ref_slices.extend(ids)
        return self._ref_ids[key]


# ---- the per-tile map of which value each byte range holds -------------------------------------

@dataclass(frozen=True)
class Chunk:
    start: int          # byte address on the tile
    end: int
    var: int            # variable id
    elem: int           # element of the variable stored at ``start``
    ctype: str

    def cut(self, a: int, b: int) -> "Chunk":
        return Chunk(a, b, self.var, self.elem + (a - self.start) // ELEMENT_BYTES[self.ctype], self.ctype)


class Memory:
    """Per tile, sorted disjoint byte ranges each holding a slice of one variable."""

    def __init__(self, tiles: int):
        self.starts: list[list[int]] = [[] for _ in range(tiles)]
        self.chunks: list[list[Chunk]] = [[] for _ in range(tiles)]

    def read(self, tile: int, addr: int, nbytes: int) -> list[tuple[int, int, Chunk | None]]:
        """``(start, end, chunk or None)`` covering ``[addr, addr + nbytes)`` in order; None: never written."""
        starts, chunks = self.starts[tile], self.chunks[tile]
        end = addr + nbytes
        i = max(bisect.bisect_right(starts, addr) - 1, 0)
        out, at = [], addr
        while i < len(chunks) and chunks[i].start < end:
            c = chunks[i]
            if c.end > at:
                if c.start > at:
                    out.append((at, c.start, None))
                    at = c.start
                out.append((at, min(c.end, end), c))
                at = min(c.end, end)
            i += 1
        if at < end:
            out.append((at, end, None))
        return out

    def write(self, tile: int, chunk: Chunk | None, addr: int, nbytes: int) -> None:
        """Bytes ``[addr, addr + nbytes)`` now hold ``chunk`` (None: undefined)."""
        starts, chunks = self.starts[tile], self.chunks[tile]
        end = addr + nbytes
        lo = max(bisect.bisect_right(starts, addr) - 1, 0)
        while lo < len(chunks) and chunks[lo].end <= addr:
            lo += 1
        hi = lo
        keep = []
        while hi < len(chunks) and chunks[hi].start < end:
            c = chunks[hi]
            if c.start < addr and (head := _trim(c, c.start, addr)) is not None:
                keep.append(head)
            if c.end > end and (tail := _trim(c, end, c.end)) is not None:
                keep.append(tail)
            hi += 1
        new = keep[:1] if keep and keep[0].start < addr else []
        if chunk is not None:
            new.append(chunk)
        new += [c for c in keep if c.start >= end]
        chunks[lo:hi] = new
        starts[lo:hi] = [c.start for c in new]


def _trim(c: Chunk, a: int, b: int) -> Chunk | None:
    """The whole elements of ``c`` within bytes [a, b); a partly overwritten element is lost
    (it was dead: the program writes over it), so its remaining bytes become undefined."""
    size = ELEMENT_BYTES[c.ctype]
    lo = c.start + -(-(a - c.start) // size) * size
    hi = c.start + (b - c.start) // size * size
    return c.cut(lo, hi) if lo < hi else None


# ---- replaying the program -------------------------------------------------------------------

@dataclass
class HostTensor:
    name: str            # the graph tensor (stream handle and file name)
    buffer: str
    kind: str            # "input", "parameter" or "output"
    dtype: str
    shape: list
    layout: str
    ctype: str
    elements: int
    ref: int             # the tensor in logical (row-major) order, replica 0
    replica_copies: list  # (src ref, dst ref): one Copy filling every further replica


@dataclass
class Group:
    call: object         # the kernel call and variant (for readers of the replay, e.g. tests)
    variant: str
    comment: str
    vertex: str
    fields: list         # vector field names, in operand order
    params: list         # (name, C++ literal)
    tiles: list
    refs: list           # per vertex, one ref per vector field


@dataclass
class Step:
    kind: str            # "compute" or "exchange"
    name: str
    comment: str
    groups: list = field(default_factory=list)
    copies: list = field(default_factory=list)   # (src ref, dst ref, comment)


class Replay:
    def __init__(self, tp: TileProgram, target, registry=None):
        self.tp, self.target, self.registry = tp, target, registry
        self.values = Values()
        self.memory = Memory(tp.tiles)
        self.upload: list[HostTensor] = []
        self.inputs: list[HostTensor] = []
        self.outputs: list[HostTensor] = []
        self.steps: list[Step] = []
        self._undefined: dict[str, int] = {}        # per step and type: the uninitialised variable
        self._step_vars: dict[tuple[str, str], int] = {}   # per step and type: the received elements
        self._step_name = ""

    # reads ---------------------------------------------------------------------------------

    def typed_read(self, tile: int, addr: int, nbytes: int, ctype: str, what: str) -> list[tuple[int, int, int]]:
        size = ELEMENT_BYTES[ctype]
        if nbytes % size:
            raise TileplanError(f"{what}: {nbytes} bytes is not a whole number of {ctype} elements")
        parts = []
        for a, b, c in self.memory.read(tile, addr, nbytes):
            if c is None:
                v = self._undefined_var(ctype)
                begin = self.values.variables[v].add_piece(tile, (b - a) // size)
                parts.append((v, begin, begin + (b - a) // size))
                continue
            if c.ctype != ctype or (a - c.start) % size or (b - a) % size:
                raise TileplanError(f"{what}: tile {tile} bytes [{a}, {b}) hold {c.ctype} elements of "
                                    f"{self.values.variables[c.var].name!r}, read as {ctype}")
            s = c.cut(a, b)
            parts.append((s.var, s.elem, s.elem + (b - a) // size))
        return parts

    def byte_read(self, tile: int, addr: int, nbytes: int, what: str) -> list[tuple[int, int, Chunk | None]]:
        """The typed pieces a byte copy moves: ``(offset, bytes, chunk or None)``."""
        out = []
        for a, b, c in self.memory.read(tile, addr, nbytes):
            if c is not None and ((a - c.start) % ELEMENT_BYTES[c.ctype] or (b - a) % ELEMENT_BYTES[c.ctype]):
                raise TileplanError(f"{what}: tile {tile} bytes [{a}, {b}) split {c.ctype} elements of "
                                    f"{self.values.variables[c.var].name!r}")
            out.append((a - addr, b - a, c.cut(a, b) if c is not None else None))
        return out

    def _undefined_var(self, ctype: str) -> int:
        key = f"{self._step_name}.uninitialised.{TYPE_SUFFIX[ctype]}"
        if key not in self._undefined:
            self._undefined[key] = self.values.variable(key, ctype)
        return self._undefined[key]

    # the program ---------------------------------------------------------------------------

    def run(self) -> "Replay":
        tp = self.tp
        by_tensor: dict[str, list[int]] = defaultdict(list)
        for i, b in enumerate(tp.buffers):
            if b.name in tp.io_maps and b.kind in ("input", "parameter", "output"):
                by_tensor[(b.kind == "output", b.tensor or b.name)].append(i)
        self._step_name = "host"
        for (is_out, tensor), ids in sorted(by_tensor.items(), key=lambda kv: (kv[0][0], kv[1][0])):
            if not is_out:
                self._host_write(tensor, ids)
        for si, step in enumerate(tp.steps):
            self._step_name = step.name
            if isinstance(step, Exchange):
                self._exchange(step)
            else:
                self._compute(si, step)
        self._step_name = "outputs"
        for (is_out, tensor), ids in sorted(by_tensor.items(), key=lambda kv: (kv[0][0], kv[1][0])):
            if is_out:
                self._host_read(tensor, ids[0])
        return self

    def _pieces(self, b: int):
        """Owner-map intervals of buffer ``b``: (tile, first element, end element, byte address), with
        the replica index of each (the first interval starting where a replica's coverage ends)."""
        info = self.tp.buffers[b]
        isz = DType(info.dtype).itemsize
        tile, start, stop, offset = (np.asarray(a) for a in self.tp.io_maps[info.name])
        order = np.lexsort((tile, start))
        ends: list[int] = []
        out = []
        for k in order.tolist():
            s, e, t = int(start[k]), int(stop[k]), int(tile[k])
            r = next((r for r, covered in enumerate(ends) if covered == s), None)
            if r is None:
                if s != 0:
                    raise TileplanError(f"buffer {info.name!r}: owner-map interval [{s}, {e}) on tile {t} "
                                        f"continues no replica")
                ends.append(0)
                r = len(ends) - 1
            ends[r] = e
            base = int(self.tp.addr[b, t])
            if base < 0:
                raise TileplanError(f"buffer {info.name!r} has owner-map elements on tile {t} but no bytes there")
            out.append((r, t, s, e, base + int(offset[k]) * isz))
        size = int(np.prod(info.shape)) if info.shape else 1
        if any(covered != size for covered in ends):
            raise TileplanError(f"buffer {info.name!r}: owner map covers {ends} of {size} elements per replica")
        return out, len(ends), size

    def _host_write(self, tensor: str, ids: list[int]) -> None:
        first = ids[0]
        info = self.tp.buffers[first]
        ctype = DType(info.dtype).cpp
        size_b = ELEMENT_BYTES[ctype]
        placed = {}
        refs = {}
        src: list = []       # replica 0, once per further replica (and per further buffer of the tensor)
        dst: list = []
        for b in ids:
            pieces, replicas, size = self._pieces(b)
            key = tuple((t, a, (e - s) * size_b) for r, t, s, e, a in sorted(pieces, key=lambda p: p[1:]))
            if key in placed:
                continue          # an alias: the same bytes as an earlier buffer of this tensor
            placed[key] = b
            v = self.values.variable(self.tp.buffers[b].name, ctype)
            var = self.values.variables[v]
            logical = [[] for _ in range(replicas)]
            for r, t, s, e, a in pieces:
                begin = var.add_piece(t, e - s)
                self.memory.write(t, Chunk(a, a + (e - s) * size_b, v, begin, ctype), a, (e - s) * size_b)
                logical[r].append((s, e, (v, begin, begin + e - s)))
            if not refs:
                refs["main"] = logical[0]
                sources = logical[1:]
            else:
                sources = logical
            for rep in sources:
                src += [p for s, e, _ in rep for p in _logical_slices(refs["main"], s, e)]
                dst += [sl for _, _, sl in rep]
        main = refs["main"]
        copies = [(self.values.ref(src), self.values.ref(dst))] if dst else []
        ht = HostTensor(tensor, info.name, info.kind, info.dtype, list(info.shape), info.layout, ctype,
                        main[-1][1], self.values.ref([sl for _, _, sl in main]), copies)
        (self.upload if info.kind == "parameter" else self.inputs).append(ht)

    def _host_read(self, tensor: str, b: int) -> None:
        info = self.tp.buffers[b]
        ctype = DType(info.dtype).cpp
        pieces, _, size = self._pieces(b)
        parts = []
        for r, t, s, e, a in pieces:
            if r == 0:
                for v, vb, ve in self.typed_read(t, a, (e - s) * ELEMENT_BYTES[ctype], ctype,
                                                 f"output {tensor!r}"):
                    if self.values.variables[v].name.endswith(".uninitialised." + TYPE_SUFFIX[ctype]):
                        raise TileplanError(f"output {tensor!r}: tile {t} bytes from {a} are never written")
                    parts.append((v, vb, ve))
        self.outputs.append(HostTensor(tensor, info.name, "output", info.dtype, list(info.shape), info.layout,
                                       ctype, size, self.values.ref(parts), []))

    def _exchange(self, step: Exchange) -> None:
        tr = step.transfers
        rows = zip(tr.src_tile.tolist(), tr.src_off.tolist(), tr.dst_tile.tolist(), tr.dst_off.tolist(),
                   tr.nbytes.tolist())
        sends = int(np.unique(tr.group).size) if len(tr) else 0
        copies = self._byte_copies(rows, f"exchange {step.name!r}")
        self.steps.append(Step("exchange", step.name, f"{step.name}: {len(tr)} transfers ({sends} sends)",
                               copies=copies))

    def _byte_copies(self, rows, what: str) -> list:
        """Reads every row first (a superstep reads before it writes), then writes; one Copy per type.

        Rows are taken in destination order (tile, address) so that each tile's
        received elements are one piece of the step's variable."""
        rows = sorted(rows, key=lambda r: (r[2], r[3], r[0], r[1], r[4]))
        src: dict[str, list] = defaultdict(list)
        dst: dict[str, list] = defaultdict(list)
        writes = []
        moved: dict[str, int] = defaultdict(int)
        for st, sa, dt, da, n in rows:
            for off, nb, c in self.byte_read(st, sa, n, what):
                if c is None:
                    writes.append((dt, None, da + off, nb))
                    continue
                var = self._step_var(c.ctype)
                count = nb // ELEMENT_BYTES[c.ctype]
                begin = self.values.variables[var].add_piece(dt, count)
                src[c.ctype].append((c.var, c.elem, c.elem + count))
                dst[c.ctype].append((var, begin, begin + count))
                writes.append((dt, Chunk(da + off, da + off + nb, var, begin, c.ctype), da + off, nb))
                moved[c.ctype] += count
        for t, chunk, a, nb in writes:
            self.memory.write(t, chunk, a, nb)
        return [(self.values.ref(src[ct]), self.values.ref(dst[ct]), f"{moved[ct]} {ct} elements")
                for ct in sorted(src, key=TYPE_CODE.get)]

    def _step_var(self, ctype: str) -> int:
        key = (self._step_name, ctype)
        if key not in self._step_vars:
            self._step_vars[key] = self.values.variable(f"{self._step_name}.{TYPE_SUFFIX[ctype]}", ctype)
        return self._step_vars[key]

    def _compute(self, si: int, step: ComputeSet) -> None:
        copies = sum(len(g.tile) for g in step.groups if g.call.primitive == "copy")
        counts = [f"{sum(len(g.tile) for g in step.groups) - copies} vertices"] + ([f"{copies} on-tile copies"]
                                                                                     if copies else [])
        out = Step("compute", step.name, f"{step.name}: {', '.join(counts)}")
        writes = []
        copy_rows = []
        for gi, group in enumerate(step.groups):
            if group.call.primitive == "copy":
                copy_rows += list(zip(group.tile.tolist(), group.ins[:, 0].tolist(), group.tile.tolist(),
                                      group.outs[:, 0].tolist(), [group.in_bytes[0]] * len(group.tile)))
                continue
            source = group_codelet(group, self.target, self.registry)
            what = f"compute set {step.name!r} group {gi} ({group.call})"
            outs = [self.values.variable(f"{step.name}/g{gi}.{f.name}", f.ctype) for f in source.outputs]
            tiles = group.tile.tolist()
            refs = []
            for i, t in enumerate(tiles):
                row = [self.values.ref(self.typed_read(t, int(group.ins[i, j]), int(group.in_bytes[j]), f.ctype, what))
                       for j, f in enumerate(source.inputs)]
                for j, (f, v) in enumerate(zip(source.outputs, outs)):
                    count = int(f.size)
                    begin = self.values.variables[v].add_piece(t, count)
                    a = int(group.outs[i, j])
                    writes.append((t, Chunk(a, a + count * ELEMENT_BYTES[f.ctype], v, begin, f.ctype)))
                    row.append(self.values.ref([(v, begin, begin + count)]))
                refs.append(row)
            params = [(f.name, f"{int(f.value)}u" if f.ctype == "unsigned" else f"{int(f.value)}")
                      for f in source.fields if not f.is_vector]
            comment = f"group {gi}: {group.call} with {group.variant} on {len(tiles)} tiles"
            out.groups.append(Group(group.call, group.variant, comment,
                                    source.vertex, [f.name for f in source.fields if f.is_vector], params,
                                    tiles, refs))
        if copy_rows:
            out.copies = self._byte_copies(copy_rows, f"on-tile copies of {step.name!r}")
        for t, chunk in writes:
            self.memory.write(t, chunk, chunk.start, chunk.end - chunk.start)
        self.steps.append(out)


def _logical_slices(main: list, s: int, e: int) -> list[tuple[int, int, int]]:
    """Slices of replica 0 (``[(start, end, (var, begin, end))]`` sorted by start) covering elements [s, e)."""
    starts = [p[0] for p in main]
    i = max(bisect.bisect_right(starts, s) - 1, 0)
    out = []
    while i < len(main) and main[i][0] < e:
        ps, pe, (v, b, _) = main[i]
        lo, hi = max(ps, s), min(pe, e)
        if lo < hi:
            out.append((v, b + lo - ps, b + hi - ps))
        i += 1
    return out


# ---- C++ text ------------------------------------------------------------------------------

def _str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _comment(s: str) -> str:
    return " ".join(s.replace("*/", "* /").split())


def _rows(rows: list[str], indent: str, per_line: int) -> str:
    lines = [", ".join(rows[i:i + per_line]) for i in range(0, len(rows), per_line)]
    return (",\n" + indent).join(lines)


def _array(decl: str, rows: list[str], per_line: int = 12, indent: str = "    ") -> str:
    if not rows:
        rows = ["{}"] if "{" in decl else ["0"]
    return f"{decl} = {{\n{indent}{_rows(rows, indent, per_line)}}};"


PRELUDE = r"""#include <cstddef>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include <poplar/DeviceManager.hpp>
#include <poplar/Engine.hpp>
#include <poplar/Graph.hpp>
#include <poplar/IPUModel.hpp>
#include <poplar/Program.hpp>

namespace {

// ---- tables ----------------------------------------------------------------
// A variable is a list of pieces, each mapped to one tile; an operand is a
// concatenation of slices [begin, end) of variables.

enum ElementType : unsigned { U8 = 0, F16 = 1, F32 = 2 };

struct VariableSpec { const char *name; unsigned type; unsigned firstPiece; unsigned numPieces; };
struct Piece { unsigned tile; unsigned elements; };
struct Slice { unsigned variable; unsigned begin; unsigned end; };
struct Operand { unsigned firstSlice; unsigned numSlices; };   // into kOperandSlices
struct HostTensor { const char *name; unsigned type; std::size_t elements; unsigned operand; };

poplar::Type elementType(unsigned type) {
  switch (type) {
    case U8: return poplar::UNSIGNED_CHAR;   // FP8 (F143 bytes) travels as bytes
    case F16: return poplar::HALF;
    default: return poplar::FLOAT;
  }
}

std::size_t elementBytes(unsigned type) { return type == U8 ? 1 : type == F16 ? 2 : 4; }
"""

HELPERS = r"""
// ---- building blocks -------------------------------------------------------

std::vector<poplar::Tensor> addVariables(poplar::Graph &graph) {
  std::vector<poplar::Tensor> vars;
  vars.reserve(std::size(kVariables));
  for (const VariableSpec &spec : kVariables) {
    std::size_t total = 0;
    for (unsigned p = 0; p < spec.numPieces; ++p) total += kPieces[spec.firstPiece + p].elements;
    poplar::Tensor var = graph.addVariable(elementType(spec.type), {total}, spec.name);
    std::size_t at = 0;
    for (unsigned p = 0; p < spec.numPieces; ++p) {
      const Piece &piece = kPieces[spec.firstPiece + p];
      graph.setTileMapping(var.slice(at, at + piece.elements), piece.tile);
      at += piece.elements;
    }
    vars.push_back(var);
  }
  return vars;
}

poplar::Tensor operand(const std::vector<poplar::Tensor> &vars, unsigned id) {
  const Operand &op = kOperands[id];
  std::vector<poplar::Tensor> parts;
  parts.reserve(op.numSlices);
  for (unsigned i = 0; i < op.numSlices; ++i) {
    const Slice &s = kSlices[kOperandSlices[op.firstSlice + i]];
    parts.push_back(vars[s.variable].slice(s.begin, s.end));
  }
  return parts.size() == 1 ? parts.front() : poplar::concat(parts);
}

poplar::program::Copy copy(const std::vector<poplar::Tensor> &vars, unsigned src, unsigned dst) {
  return poplar::program::Copy(operand(vars, src), operand(vars, dst));
}

std::vector<char> readFile(const std::string &path, std::size_t bytes) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> data(bytes);
  if (!in.read(data.data(), static_cast<std::streamsize>(bytes)))
    throw std::runtime_error("cannot read " + std::to_string(bytes) + " bytes from " + path);
  return data;
}

void writeFile(const std::string &path, const std::vector<char> &data) {
  std::ofstream out(path, std::ios::binary);
  if (!out.write(data.data(), static_cast<std::streamsize>(data.size())))
    throw std::runtime_error("cannot write " + path);
}

// The device: an IPUModel of the target by default; with -DTILEPLAN_HARDWARE,
// the first IPU that can be attached.
poplar::Device attachDevice() {
#ifdef TILEPLAN_HARDWARE
  // The graph uses tiles [0, kTiles) of the IPU, however many it has.
  poplar::DeviceManager manager = poplar::DeviceManager::createDeviceManager();
  for (poplar::Device &device : manager.getDevices(poplar::TargetType::IPU, 1)) {
    if (device.attach()) return std::move(device);
  }
  throw std::runtime_error("no IPU could be attached");
#else
  poplar::IPUModel model(kIpuVersion);
  model.numIPUs = 1;
  model.tilesPerIPU = kTiles;
  return model.createDevice({}, /*accurateHalf=*/true);
#endif
}
"""


def render(replay: Replay, tp: TileProgram, target, model_name: str, codelet_files: list[str]) -> str:
    v = replay.values
    out: list[str] = []
    w = out.append
    vertices = sum(len(g.tiles) for s in replay.steps for g in s.groups)
    w(f"// Generated by tileplan.lowering.emit.host; do not edit.\n"
      f"// Model {_comment(model_name)} on target {_comment(target.name)} ({tp.tiles} tiles): "
      f"{len(replay.steps)} steps, {vertices} vertices, {len(v.variables)} variables.\n"
      f"//\n"
      f"// The tile program of the package, built with the Poplar host API: every vertex on the\n"
      f"// tile the program puts it, every value mapped to the tiles that hold it, every exchange\n"
      f"// a Copy of the same elements between the same tiles, in step order. Poplar chooses the\n"
      f"// byte addresses (see tileplan/lowering/emit/host.py for how ours map to variables).\n"
      f"//\n"
      f"// Build and run with the Poplar SDK:\n"
      f"//   g++ -std=c++17 host.cpp -lpoplar -o host          (add -DTILEPLAN_HARDWARE for an IPU)\n"
      f"//   ./host DATA_DIR\n"
      f"// DATA_DIR/<tensor>.bin holds every input and parameter as raw row-major elements (FP16 as\n"
      f"// IEEE half, FP8 as F143 bytes divided by the tensor's power-of-two scale); the outputs are\n"
      f"// written to DATA_DIR/<tensor>.bin the same way.\n")
    w(PRELUDE)
    w(f"constexpr unsigned kTiles = {tp.tiles};\n"
      f"constexpr const char *kIpuVersion = {_str(target.family)};   // IPUModel architecture\n")
    w("const char *const kCodelets[] = {\n" + "".join(f"    {_str(f)},\n" for f in codelet_files) + "};\n")
    pieces, specs = [], []
    for var in v.variables:
        specs.append(f"{{{_str(var.name)}, {TYPE_CODE[var.ctype]}, {len(pieces)}, {len(var.pieces)}}}")
        pieces += [f"{{{t},{n}}}" for t, n in var.pieces]
    w("// name, element type, first piece, pieces")
    w(_array("const VariableSpec kVariables[]", specs, 1) + "\n")
    w("// {tile, elements}")
    w(_array("const Piece kPieces[]", pieces, 10) + "\n")
    w("// {variable, begin, end} in elements")
    w(_array("const Slice kSlices[]", [f"{{{a},{b},{c}}}" for a, b, c in v.slices], 8) + "\n")
    w("// {first entry in kOperandSlices, slices}")
    w(_array("const Operand kOperands[]", [f"{{{a},{b}}}" for a, b in v.refs], 10) + "\n")
    w(_array("const unsigned kOperandSlices[]", [str(i) for i in v.ref_slices], 20) + "\n")

    def host_rows(items):
        return [f"{{{_str(h.name)}, {TYPE_CODE[h.ctype]}, {h.elements}, {h.ref}}}" for h in items]

    w("// host tensors: stream handle and file name, element type, elements, operand (row-major order)")
    w(_array("const HostTensor kParameters[]", host_rows(replay.upload), 1))
    w(_array("const HostTensor kInputs[]", host_rows(replay.inputs), 1))
    w(_array("const HostTensor kOutputs[]", host_rows(replay.outputs), 1))
    w(HELPERS)
    w("// ---- the program --------------------------------------------------------------\n")
    w(_host_copies("loadParameters", "program 0: stream the parameters in, then copy them to their replicas",
                   replay.upload, "parameters"))
    w(_host_copies("streamInputs", "the prologue of program 1: stream the inputs in, then copy them to their "
                   "replicas", replay.inputs, "inputs"))
    w(_steps(replay, tp))
    w("}  // namespace\n")
    w(MAIN)
    return "\n".join(out)


def _host_copies(fn: str, doc: str, tensors: list[HostTensor], table: str) -> str:
    lines = [f"// {doc}.",
             f"void {fn}(poplar::Graph &graph, const std::vector<poplar::Tensor> &vars, "
             f"poplar::program::Sequence &prog) {{"]
    for i, h in enumerate(tensors):
        lines.append(f"  {{  // {_comment(h.name)}: {h.kind} {h.dtype} {h.shape}, layout {_comment(h.layout)}")
        lines.append(f"    const HostTensor &t = k{table.capitalize()}[{i}];")
        lines.append("    poplar::DataStream stream =\n"
                     "        graph.addHostToDeviceFIFO(t.name, elementType(t.type), t.elements);")
        lines.append("    prog.add(poplar::program::Copy(stream, operand(vars, t.operand)));")
        for src, dst in h.replica_copies:
            lines.append(f"    prog.add(copy(vars, {src}, {dst}));  // to the other replicas")
        lines.append("  }")
    lines.append("}\n")
    return "\n".join(lines)


def _steps(replay: Replay, tp: TileProgram) -> str:
    lines = ["// program 1: stream the inputs in, run every step in order, stream the outputs out.",
             "poplar::program::Sequence buildRun(poplar::Graph &graph, const std::vector<poplar::Tensor> &vars) {",
             "  poplar::program::Sequence run;",
             "  streamInputs(graph, vars, run);"]
    for si, step in enumerate(replay.steps):
        lines.append("")
        lines.append(f"  // step {si}, {step.kind}: {_comment(step.comment)}")
        if step.groups:
            lines.append("  {")
            lines.append(f"    poplar::ComputeSet cs = graph.addComputeSet({_str(step.name)});")
            for gi, g in enumerate(step.groups):
                n = len(g.tiles)
                lines.append(f"    {{  // {_comment(g.comment)}")
                lines.append("  " + _array(f"    static const unsigned tiles[{n}]", [str(t) for t in g.tiles], 16,
                                           "        "))
                fields = ", ".join(g.fields)
                rows = ["{" + ", ".join(str(r) for r in row) + "}" for row in g.refs]
                lines.append(f"      // operands: {fields}")
                lines.append("  " + _array(f"    static const unsigned operands[{n}][{len(g.fields)}]", rows, 8,
                                           "        "))
                lines.append(f"      for (unsigned i = 0; i < {n}; ++i) {{")
                lines.append(f"        poplar::VertexRef v = graph.addVertex(cs, {_str(g.vertex)});")
                for j, name in enumerate(g.fields):
                    lines.append(f"        graph.connect(v[{_str(name)}], operand(vars, operands[i][{j}]));")
                for name, lit in g.params:
                    lines.append(f"        graph.setInitialValue(v[{_str(name)}], {lit});")
                lines.append("        graph.setTileMapping(v, tiles[i]);")
                lines.append("      }")
                lines.append("    }")
            lines.append("    run.add(poplar::program::Execute(cs));")
            lines.append("  }")
        for src, dst, what in step.copies:
            lines.append(f"  run.add(copy(vars, {src}, {dst}));  // {_comment(what)}")
    lines.append("")
    lines.append("  for (const HostTensor &t : kOutputs) {")
    lines.append("    poplar::DataStream stream = graph.addDeviceToHostFIFO(t.name, elementType(t.type), t.elements);")
    lines.append("    run.add(poplar::program::Copy(operand(vars, t.operand), stream));")
    lines.append("  }")
    lines.append("  return run;")
    lines.append("}\n")
    return "\n".join(lines)


MAIN = r"""int main(int argc, char **argv) {
  const std::string dir = argc > 1 ? argv[1] : ".";
  try {
    poplar::Device device = attachDevice();
    poplar::Graph graph(device.getTarget());
    for (const char *file : kCodelets) graph.addCodelets(file);
    const std::vector<poplar::Tensor> vars = addVariables(graph);

    poplar::program::Sequence parameters;
    loadParameters(graph, vars, parameters);
    poplar::program::Sequence run = buildRun(graph, vars);

    poplar::Engine engine(graph, {parameters, run});
    engine.load(device);
    std::vector<std::vector<char>> buffers;
    buffers.reserve(std::size(kParameters) + std::size(kInputs) + std::size(kOutputs));
    for (const HostTensor &t : kParameters) {
      buffers.push_back(readFile(dir + "/" + t.name + ".bin", t.elements * elementBytes(t.type)));
      engine.connectStream(t.name, buffers.back().data());
    }
    for (const HostTensor &t : kInputs) {
      buffers.push_back(readFile(dir + "/" + t.name + ".bin", t.elements * elementBytes(t.type)));
      engine.connectStream(t.name, buffers.back().data());
    }
    const std::size_t firstOutput = buffers.size();
    for (const HostTensor &t : kOutputs) {
      buffers.emplace_back(t.elements * elementBytes(t.type));
      engine.connectStream(t.name, buffers.back().data());
    }
    engine.run(0);   // parameters
    engine.run(1);   // inputs, every step, outputs
    for (std::size_t i = 0; i < std::size(kOutputs); ++i)
      writeFile(dir + "/" + kOutputs[i].name + ".bin", buffers[firstOutput + i]);
  } catch (const std::exception &e) {
    std::fprintf(stderr, "host: %s\n", e.what());
    return 1;
  }
  return 0;
}
"""


def emit_host(tile_program: TileProgram, target, model_name: str, registry=None) -> str:
    """The ``host.cpp`` text for a tile program (deterministic: same program, same text)."""
    replay = Replay(tile_program, target, registry).run()
    files = list(emit_codelets(tile_program, target, registry))
    return render(replay, tile_program, target, model_name, files)
