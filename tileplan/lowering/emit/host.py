"""``host.cpp`` and ``host/tables.bin``: the tile program rebuilt with the Poplar host API.

For users who have the Poplar SDK: from the package folder, ``g++ -std=c++17
host.cpp -lpoplar -lz -o host && ./host DATA_DIR`` builds the same graph (every
vertex on the same tile with the same shapes, every value on the same tiles,
every exchange moving the same elements between the same tiles, in the same
step order), runs it on an IPUModel (or, with ``-DTILEPLAN_HARDWARE``, on an
attached IPU) and writes the outputs next to the inputs.

``host.cpp`` is small and generic: it reads the program from
``host/tables.bin`` at startup (layout below) and adds variables, vertices and
copies in loops. Its size does not depend on the number of vertices or
transfers; the tables grow with them.

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
it). Instead, emission replays the program over a map of which *value* each
byte range of each tile holds, and declares one Poplar variable per value
written:

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
come from an uninitialised variable of the reader's type. A partly overwritten
element becomes undefined (the program wrote over it: it was dead). Placement
in the interleaved region is left to Poplar; FP8 travels as ``UNSIGNED_CHAR``
(F143 bytes, decoded by the codelets), not Poplar's ``QUARTER``.

The replay is vectorised: the byte map is one sorted partition of the address
space ``tile * 2**32 + address`` into intervals (numpy arrays), every step
reads all its operands with one ``searchsorted`` and applies all its writes
as one overlay. Operand slices are stored as strided runs (a multicast source
read by consecutive destinations is one run), which keeps the tables of the
full-size SigLIP MLP on 1472 tiles (millions of transfer rows) small.

Repeated steps are replayed once (``Replay._replay_step``). A tower's 27 layers
run the same steps over their own values: the same exchange rows between their
own buffers (``Exchange.origin``: numbered buffer-relative rows, and the same
destination columns), the same vertices reading their own weights. A step's
*view* is what the bytes it reads hold, relative to where it reads them (an
exchange: its source buffers, which its rows read only; a compute set: every
operand). A step of a shape replayed in full before (the same rows or vertex
groups) whose view equals that step's up to a renaming of the variables reads
the same pieces of the renamed variables, so its rows, variables and writes
are that step's renamed: its cost is its view and its writes, not its rows (the
tower's 150 million transfer rows are read for its first layer only). The
tables are the ones a full replay writes, byte for byte; a view that differs
(another layer's weights pre-arranged in another layout) replays in full.

``host/tables.bin``
-------------------
Little-endian. ``char magic[8] = "TPHOST3\\0"``, ``uint32 sections``, then per
section: ``char name[16]`` (NUL-padded), ``uint32 element_bytes`` (1 for
``strings``, 4 for every other section: signed int32), ``uint32 columns``,
``uint64 rows``, ``uint64 stored_bytes``, then ``stored_bytes`` bytes: ``strings`` as they are
(``rows`` bytes), every other section as one zlib stream (RFC 1950, what zlib's ``uncompress``
reads) of its ``rows * columns`` int32 values *column by column* (the first column's rows,
then the second's). A name is a byte offset into ``strings`` (NUL-terminated names).

Design decision: the int32 sections are deflated, column-major. Repeated scopes are already
stored once (below), so what remains is one layer's rows for each distinct layer, and their
columns are runs of near-equal numbers (tiles in order, begins a stride apart): the 27-layer
SigLIP tower's 8.2 MB of int32 rows deflate to 1.16 MB column by column (1.51 MB row by row).
host.cpp links zlib (``-lz``), which every Linux with the Poplar SDK has. The names stay plain
bytes, so a reader can still find a name in the file.

Each step and each host tensor is a *scope*: its runs name variables by slot, slot ``i`` being
the scope's binding ``bindings[first binding + i]``. A scope whose rows (groups, fields, params,
vertices, operands, runs, copies) equal an earlier scope's slot for slot refers to that scope's
rows and differs only in its binding: the 27 layers of a tower store each layer-invariant step
once, and each layer's variables (its parameters, its activations) are bound per step. Variables
with equal pieces share one range of ``pieces`` too. Sections:

==============  =================================================================
strings         the names, each NUL-terminated
variables       name, element type (0 U8, 1 F16, 2 F32, 3 I32), first piece, pieces
pieces          tile, elements (a variable is its pieces in order)
runs            slot (the variable: see bindings), begin, elements, count, stride:
                the ``count`` slices ``[begin + c * stride, begin + c * stride + elements)``
operands        first run, runs (an operand concatenates its runs' slices)
bindings        variable (a scope's slot ``i`` is row ``first binding + i``)
host_tensors    role (0 parameter, 1 input, 2 output), name (stream handle),
                element type, elements, operand (row-major order, replica 0),
                first replica copy, replica copies, first binding, bindings,
                data file (``cpp.data_file``: ``t<row>_<letters of the name>.bin``)
host_copies     source operand, destination operand (fill further replicas)
steps           kind (0 compute, 1 exchange), name, first group, groups,
                first copy, copies, first binding, bindings (a compute step
                executes its compute set, then its copies; an exchange is its
                copies)
groups          vertex class, first field, fields, first param, params,
                first vertex, vertices, first operand: vertex ``i``'s field
                ``j`` connects to operand ``first operand + i * fields + j``
fields          name (vector fields: the inputs, then the outputs)
params          name, unsigned (1), int (0) or float (2: the value is the float32's bits), value
vertices        tile
copies          source operand, destination operand (one ``Copy`` each)
step_places     per step: its place in the micro-batch schedule (0: its stage's own step, 1: the
                link phase into the stage), the stage (``planner.pipeline``)
host_places     per host tensor: the stage whose IPU holds it (an input is streamed in, an output
                out, in the slot its micro-batch is on that stage)
==============  =================================================================

Host I/O: ``DATA_DIR/<file>`` holds each input and parameter as raw
row-major elements of its type (FP16 as IEEE half, FP8 as F143 bytes already
divided by the tensor's power-of-two scale); program 0 streams the parameters
in, program 1 streams the inputs in, runs every step and streams the outputs
to ``DATA_DIR/<file>``. ``<file>`` is the host tensor's data file column, never its name
(``cpp.data_file``: a tensor named ``../x`` stays inside DATA_DIR), and host.cpp refuses a data
file name that is not a plain name in DATA_DIR (a damaged table). Outputs the planner folded at
plan time (``Graph.folded``: a zero-size result, a reduction over an empty axis) live on no tile:
``kFolded`` in host.cpp holds each one's data file (numbered after the host tensors), element
count and the bytes of its one element, and the host writes ``DATA_DIR/<file>`` from them after
the run (``writeFolded``; with ``-DTILEPLAN_DUMP_TABLES``, ``./dump TABLES DIR`` writes them too,
and prints each host tensor's and folded output's data file).

Every name in host.cpp (the model's, the target's, a folded output's, a file's) is written by
``cpp.cpp_string`` or ``cpp.cpp_comment``: host.cpp is printable ASCII whatever the names hold.
The tables hold names as their UTF-8 bytes (Poplar's debug names and stream handles).
"""

from __future__ import annotations

import functools
import heapq
import struct
from collections import defaultdict
from dataclasses import dataclass

import jinja2
import numpy as np

from ...errors import TileplanError
from ...graph.dtypes import DType
from ...layout.panels import row_segments
from ..tile_program import ComputeSet, Exchange, TileProgram, exchange_shape
from .codelets import emit_codelets, group_codelet
from .cpp import cpp_comment, cpp_string, data_file

CTYPES = ("unsigned char", "half", "float", "int")       # element type codes 0 (U8), 1 (F16), 2 (F32), 3 (I32)
TYPE_CODE = {c: i for i, c in enumerate(CTYPES)}
ELEMENT_BYTES = {"unsigned char": 1, "half": 2, "float": 4, "int": 4}
TYPE_SUFFIX = {"unsigned char": "u8", "half": "f16", "float": "f32", "int": "i32"}
_ESZ = np.array([1, 2, 4, 4, 1], np.int64)                  # element bytes by code; code -1 (undefined) -> 1
STRIDE = 1 << 32                                          # global byte address: tile * STRIDE + address
HOST_CPP = "host.cpp"
TABLES_FILE = "host/tables.bin"
MAGIC = b"TPHOST3\0"
TABLES_LEVEL = 6             # zlib level of the int32 sections (6: zlib's default; 9 saves 2% for 3x the time)
ROLE = {"parameter": 0, "input": 1, "output": 2}
SECTIONS = (("strings", 1), ("variables", 4), ("pieces", 2), ("runs", 5), ("operands", 2), ("bindings", 1),
            ("host_tensors", 10), ("host_copies", 2), ("steps", 8), ("groups", 8), ("fields", 1), ("params", 3),
            ("vertices", 1), ("copies", 2), ("step_places", 2), ("host_places", 1))


def _expand(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(owner, rank)`` for ``counts[i]`` items per owner i, in owner order."""
    counts = np.asarray(counts, np.int64)
    owner = np.repeat(np.arange(counts.size), counts)
    rank = np.arange(owner.size) - np.repeat(np.cumsum(counts) - counts, counts)
    return owner, rank


def _unique(a: np.ndarray) -> np.ndarray:
    """``np.unique(a)`` by one sort (the arrays here come nearly sorted, which the sort is fast on;
    numpy's hashing ``unique`` is not)."""
    a = np.sort(a, kind="stable")
    return a[np.concatenate(([True], a[1:] != a[:-1]))] if a.size else a


def _first_use(ids: np.ndarray) -> np.ndarray:
    """``ids`` renumbered by first appearance (equal results: equal up to a renaming)."""
    _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    rank = np.empty(first.size, np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    return rank[inverse.reshape(-1)]


def _where(a: int, b: int) -> str:
    return f"tile {int(a) // STRIDE} bytes [{int(a) % STRIDE}, {int(a) % STRIDE + int(b - a)})"


def _run_starts(link: np.ndarray, step: np.ndarray) -> np.ndarray:
    """Greedy strided runs, vectorised: which items start a run, given ``link`` (item k may extend a run
    holding item k - 1) and ``step`` (the stride from item k - 1 to k). A run takes the stride of its first
    step, so item k starts a run iff it cannot link, or it breaks the stride of a run item k - 1 extended:
    ``start[k] = ~link[k] | (~start[k - 1] & diff[k])`` with ``diff[k] = link[k] & link[k - 1] &
    (step[k] != step[k - 1])``. Within a stretch of consecutive diffs the starts alternate, beginning with
    the opposite of the item before the stretch (which starts iff it cannot link)."""
    n = link.size
    diff = np.zeros(n, bool)
    if n > 1:
        diff[1:] = link[1:] & link[:-1] & (step[1:] != step[:-1])
    start = ~link
    k = np.flatnonzero(diff)
    if k.size:
        first = np.concatenate(([True], k[1:] != k[:-1] + 1))       # k begins a stretch of diffs
        p = k[first][np.cumsum(first) - 1]                            # the stretch's first item
        before = ~link[p - 1]                                         # does the item before it start a run
        start[k] = before ^ ((k - p) % 2 == 0)
    return start


def _through(main, s: np.ndarray, e: np.ndarray):
    """The slices ``(var, begin, end)`` holding elements ``[s, e)`` of a tensor, in order, given ``main``:
    ``(start, end, var, begin)`` arrays of the slices of its elements, sorted by start."""
    ms, me, mv, mb = main
    i0 = np.searchsorted(ms, s, "right") - 1
    i1 = np.searchsorted(ms, e, "left")
    k, rank = _expand(np.maximum(i1 - i0, 0))
    i = i0[k] + rank
    lo, hi = np.maximum(ms[i], s[k]), np.minimum(me[i], e[k])
    return mv[i], mb[i] + lo - ms[i], mb[i] + hi - ms[i]


def _row_major(main, info):
    """``(query, var, begin, end)``: one operand of a host tensor's elements in row-major order, from
    ``main`` (see ``_through``) in the buffer's index space: row-major, or panel-major for ``panels<g>``
    (panel p of g columns, then rows, then the columns within the panel; ``layout.panels``)."""
    space = getattr(info, "space", "rows") or "rows"
    if space == "rows":
        s, e = main[0], main[1]
    else:
        g = int(space[len("panels"):])
        n = int(info.shape[-1]) if info.shape else 1
        rows = int(main[1][-1]) // n
        s, w = row_segments(rows, n, g)
        e = s + w
    v, b, e = _through(main, _i64(s), _i64(e))
    return np.zeros(v.size), v, b, e


def _destination_order(st, sa, dt, da, nbytes) -> np.ndarray:
    """The order of byte copies by (destination tile, address, source tile, address, bytes). Rows write
    distinct destination bytes, so the global destination address alone almost always decides: one
    stable sort of one key (fast on the nearly sorted rows of an exchange), and the full sort only
    where two rows share a destination address."""
    key = dt * STRIDE + da
    order = np.argsort(key, kind="stable")
    ks = key[order]
    if (ks[1:] == ks[:-1]).any():
        return np.lexsort((nbytes, sa, st, da, dt))
    return order


def param_row(f) -> list[int]:
    """A vertex parameter's (kind, value) in the ``params`` table: unsigned 1, int 0, float 2 with
    the float32's bits as a signed 32-bit value (LayerNorm's eps, softmax's scale)."""
    if f.ctype == "float":
        return [2, int(np.array([f.value], np.float32).view(np.int32)[0])]
    return [int(f.ctype == "unsigned"), int(f.value)]


def _i64(a) -> np.ndarray:
    return np.asarray(a, dtype=np.int64)


# ---- the map of which value each byte holds ---------------------------------------------------

class ByteMap:
    """A partition of the global byte space ``[0, tiles * STRIDE)`` into intervals, each holding
    consecutive elements of one variable (``var >= 0``: element ``elem`` at the interval's start, element
    type code ``ct``) or undefined bytes (``var == -1``). Adjacent intervals that continue each other
    are merged.

    ``freeze`` sets what the map holds aside as a second, read-only map, the *static* one (the replay
    freezes it after the host wrote every parameter: a tower's weights, most of the intervals, which
    no step overwrites), and the map itself then holds ``var == -2`` ("as the static map") wherever
    no step wrote since. A write first copies the static intervals it overlaps into the map (whole:
    an element a write covers only partly is lost, as without the static map), so what ``look``
    returns is what one map would, while every write costs in proportion to the bytes steps wrote,
    not to everything the host placed (27 layers' weights)."""

    def __init__(self, tiles: int):
        self.limit = tiles * STRIDE
        self.bounds = np.array([0, self.limit], np.int64)      # interval k is [bounds[k], bounds[k + 1])
        self.var = np.array([-1], np.int64)
        self.elem = np.zeros(1, np.int64)
        self.ct = np.array([-1], np.int64)
        self.static: ByteMap | None = None

    def freeze(self) -> None:
        """Set the map's content aside as the static map; the map then refers to it everywhere."""
        static = ByteMap.__new__(ByteMap)
        static.limit, static.bounds, static.var, static.elem, static.ct = \
            self.limit, self.bounds, self.var, self.elem, self.ct
        static.static = None
        self.static = static
        self.bounds = np.array([0, self.limit], np.int64)
        self.var = np.array([-2], np.int64)
        self.elem = np.zeros(1, np.int64)
        self.ct = np.array([-1], np.int64)

    def look(self, qa: np.ndarray, qb: np.ndarray):
        """What the byte ranges ``[qa, qb)`` hold, as ``read``'s pieces in its order, through the static
        map where the map refers to it: ``(query, start, end, var, ct, interval start, its element)``."""
        q, idx, ps, pe = self.read(qa, qb)
        var, ct, start, elem = self.var[idx], self.ct[idx], self.bounds[idx], self.elem[idx]
        m = np.flatnonzero(var == -2)
        if not m.size:
            return q, ps, pe, var, ct, start, elem
        s = self.static
        k, sidx, sps, spe = s.read(ps[m], pe[m])
        keep = np.ones(q.size, bool)
        keep[m] = False
        at = np.concatenate((np.flatnonzero(keep), m[k]))
        order = np.argsort(at, kind="stable")       # each static piece where the piece it resolves was
        parts = ((q[keep], q[m][k]), (ps[keep], sps), (pe[keep], spe), (var[keep], s.var[sidx]),
                 (ct[keep], s.ct[sidx]), (start[keep], s.bounds[sidx]), (elem[keep], s.elem[sidx]))
        return tuple(np.concatenate(p)[order] for p in parts)

    def read(self, qa: np.ndarray, qb: np.ndarray):
        """The non-empty pieces of the byte ranges ``[qa, qb)``: ``(query, interval, start, end)`` in query
        order, then address order."""
        b = self.bounds
        i0 = np.searchsorted(b, qa, "right") - 1
        i1 = i0 + 1                           # most reads end inside the interval they start in
        far = (qb > b[np.minimum(i1, b.size - 1)]) | (qb <= qa)
        if not far.any():                     # (then each range is the one piece it lies in)
            return np.arange(qa.size), i0, qa, qb
        i1[far] = np.searchsorted(b, qb[far], "left")
        q, rank = _expand(np.maximum(i1 - i0, 0))
        idx = i0[q] + rank
        ps, pe = np.maximum(b[idx], qa[q]), np.minimum(b[idx + 1], qb[q])
        keep = ps < pe
        return q[keep], idx[keep], ps[keep], pe[keep]

    def write(self, wa, wb, var, elem, ct, what: str) -> tuple[np.ndarray, ...]:
        """Bytes ``[wa, wb)`` now hold ``var`` from element ``elem`` (``var == -1``: undefined); the writes
        must not overlap. An element of an older value that a write covers only partly is lost (undefined).
        Returns the writes as applied: sorted, and joined where one continues another (``_merged_writes``:
        the same map, from fewer rows)."""
        wa, wb, var, elem, ct = _merged_writes(wa, wb, var, elem, ct, what)
        self.write_merged(wa, wb, var, elem, ct, what)
        return wa, wb, var, elem, ct

    def write_merged(self, wa, wb, var, elem, ct, what: str) -> None:
        """``write`` writes as ``write`` returns them (sorted, disjoint, joined), without sorting,
        checking and joining them again: a repeated step's writes are an earlier step's, renamed one
        variable to one variable, which keeps them so (``Replay._repeat``)."""
        if self.static is not None and wa.size:
            self._fault_in(wa, wb)
        self._write(wa, wb, var, elem, ct, what)

    def write_each(self, writes: list[tuple]) -> None:
        """``write`` each of ``writes`` (its arguments) in turn: as one write where no two overlap (the
        same map: each write then covers bytes none of the others does), which costs one pass over the
        map instead of one per write (a tower's hundreds of parameters)."""
        if not writes:
            return
        wa, wb, var, elem, ct = (np.concatenate([_i64(w[i]) for w in writes]) for i in range(5))
        keep = wb > wa
        order = np.argsort(wa[keep], kind="stable")
        sa, sb = wa[keep][order], wb[keep][order]
        if (sa[1:] < sb[:-1]).any():
            for w in writes:
                self.write(*w)
        else:
            self.write(wa, wb, var, elem, ct, writes[0][5])

    def _fault_in(self, wa: np.ndarray, wb: np.ndarray) -> None:
        """Copy the static intervals that ``[wa, wb)`` overlap where the map refers to the static map into
        the map, whole. (Where the map refers to it, its bounds are static bounds: every fault-in copies
        whole static intervals, and what a write leaves of a referring interval still refers.)"""
        q, idx, ps, pe = self.read(wa, wb)
        m = self.var[idx] == -2
        if not m.any():
            return
        s = self.static
        sidx = _unique(s.read(ps[m], pe[m])[1])
        self._write(s.bounds[sidx], s.bounds[sidx + 1], s.var[sidx], s.elem[sidx], s.ct[sidx], "static map")

    def _write(self, wa, wb, var, elem, ct, what: str) -> None:
        wa, wb, var, elem, ct = _nonempty_by_address(wa, wb, var, elem, ct)
        if not wa.size:
            return
        b = self.bounds            # (disjoint: ``write`` checked them; the static map's intervals are)
        i0 = np.searchsorted(b, wa, "right") - 1
        i1 = np.searchsorted(b, wb, "left")
        k, rank = _expand(i1 - i0)
        t = _unique(i0[k] + rank)                    # the intervals the writes touch
        # what the writes leave of the touched intervals: their intersections with the gaps between writes
        gs, ge = np.concatenate(([0], wb)), np.concatenate((wa, [self.limit]))
        gap = gs < ge
        gs, ge = gs[gap], ge[gap]
        ts, te = b[t], b[t + 1]
        j0 = np.searchsorted(ge, ts, "right")
        j1 = np.searchsorted(gs, te, "left")
        k, rank = _expand(np.maximum(j1 - j0, 0))
        j = j0[k] + rank
        old = t[k]
        ps, pe = np.maximum(ts[k], gs[j]), np.minimum(te[k], ge[j])
        nonempty = ps < pe
        old, ps, pe = old[nonempty], ps[nonempty], pe[nonempty]
        ov, oc, os_ = self.var[old], self.ct[old], b[old]
        z = _ESZ[oc]
        lo = os_ - (os_ - ps) // z * z                 # whole elements of the old value in [ps, pe)
        hi = os_ + (pe - os_) // z * z
        whole = (ov >= 0) & (lo < hi)
        head = whole & (ps < lo)
        tail = whole & (hi < pe)
        lost = ~whole
        starts = np.concatenate((wa, lo[whole], ps[head], hi[tail], ps[lost]))
        # (what a write leaves of an interval referring to the static map still refers to it)
        nv = np.concatenate((var, ov[whole], np.full(int(head.sum() + tail.sum()), -1),
                             np.where(ov[lost] == -2, -2, -1)))
        ne = np.concatenate((elem, self.elem[old][whole] + (lo - os_)[whole] // z[whole],
                             np.zeros(starts.size - var.size - int(whole.sum()), np.int64)))
        nc = np.concatenate((ct, oc[whole], np.full(nv.size - var.size - int(whole.sum()), -1)))
        order = np.argsort(starts, kind="stable")
        starts, nv, ne, nc = starts[order], nv[order], ne[order], nc[order]
        # the new intervals in place of the touched ones (both sorted, disjoint); the map's other
        # intervals are left as they are, moved in blocks, not indexed one by one
        ks = np.delete(b[:-1], t)
        at = np.searchsorted(ks, starts)
        s_ = np.insert(ks, at, starts)
        v = np.insert(np.delete(self.var, t), at, nv)
        e = np.insert(np.delete(self.elem, t), at, ne)
        c = np.insert(np.delete(self.ct, t), at, nc)
        # join intervals that continue each other: only next to a new one (the map's intervals were
        # joined already, and two old intervals side by side now were side by side before)
        new_at = at + np.arange(at.size)
        j = _unique(np.concatenate((new_at, new_at + 1)))
        j = j[(j >= 1) & (j < s_.size)]
        gapb = s_[j] - s_[j - 1]
        zz = _ESZ[c[j]]
        join = (v[j] == v[j - 1]) & ((v[j] < 0) | ((gapb % zz == 0) & (e[j] == e[j - 1] + gapb // zz)))
        drop = j[join]
        if drop.size:
            s_, v, e, c = (np.delete(x, drop) for x in (s_, v, e, c))
        self.bounds = np.concatenate((s_, [self.limit]))
        self.var, self.elem, self.ct = v, e, c


# ---- the tables host.cpp reads ---------------------------------------------------------------

class Tables:
    """Variables, their pieces, operands as strided runs of slices, and the program tables."""

    def __init__(self):
        self.strings = bytearray()
        self._string_ids: dict[str, int] = {}
        self.var_name: list[str] = []
        self.var_type: list[int] = []
        self.var_size: list[int] = []
        self._pieces: list[tuple[int, np.ndarray, np.ndarray]] = []
        self._runs: list[np.ndarray] = []
        self._op_runs: list[np.ndarray] = []
        self.n_ops = 0
        self.host_tensors: list[list[int]] = []
        self.host_copies: list[list[int]] = []
        self.steps: list[list[int]] = []
        self.groups: list[list[int]] = []
        self.fields: list[list[int]] = []
        self.params: list[list[int]] = []
        self._vertices: list[np.ndarray] = []
        self.n_vertices = 0
        self.copies: list[list[int]] = []
        self._bindings: list[np.ndarray] = []
        self.n_bindings = 0
        self._scope: tuple | None = None
        self._bodies: dict[bytes, tuple[int, ...]] = {}     # a scope's content -> where it is stored
        self.shared_scopes = 0

    def string(self, s: str) -> int:
        if s not in self._string_ids:
            self._string_ids[s] = len(self.strings)
            self.strings += s.encode() + b"\0"
        return self._string_ids[s]

    def variable(self, name: str, ctype: str) -> int:
        self.var_name.append(name)
        self.var_type.append(TYPE_CODE[ctype])
        self.var_size.append(0)
        return len(self.var_name) - 1

    def pieces(self, var: int, tiles, counts) -> np.ndarray:
        """Append pieces of ``counts`` elements on ``tiles`` to ``var``; the first element of each."""
        tiles, counts = _i64(tiles), _i64(counts)
        begins = self.var_size[var] + np.cumsum(counts) - counts
        self.var_size[var] += int(counts.sum())
        # Consecutive pieces on one tile are one (what ``sections`` makes of them anyway): a tower's
        # exchanges add millions of destination pieces, most of them continuing the one before.
        self._pieces.append((var, *_merged_pieces(tiles, counts)))
        return begins

    def merged_pieces(self, var: int, tiles: np.ndarray, counts: np.ndarray) -> None:
        """``pieces`` of pieces as ``pieces`` stores them (a repeated step's: the earlier step's, as
        stored), without joining them again."""
        self.var_size[var] += int(counts.sum())
        self._pieces.append((var, tiles, counts))

    def operands(self, n: int, q, var, begin, end) -> int:
        """Add ``n`` operands, operand ``i`` concatenating the slices ``[begin, end)`` of ``var`` where
        ``q == i`` (``q`` ascending, slices in order); returns the id of the first."""
        q, var, begin, end = (_i64(x) for x in (q, var, begin, end))
        keep = end > begin
        if not keep.all():
            q, var, begin, end = q[keep], var[keep], begin[keep], end[keep]
        if q.size:   # merge slices that continue each other
            cont = (q[1:] == q[:-1]) & (var[1:] == var[:-1]) & (begin[1:] == end[:-1])
            first = np.flatnonzero(np.concatenate(([True], ~cont)))
            last = np.concatenate((first[1:] - 1, [q.size - 1]))
            q, var, begin, end = q[first], var[first], begin[first], end[last]
        length = end - begin
        link = np.concatenate(([False], (q[1:] == q[:-1]) & (var[1:] == var[:-1]) & (length[1:] == length[:-1])))
        step = np.concatenate(([0], begin[1:] - begin[:-1]))
        start = np.flatnonzero(_run_starts(link, step))
        count = np.diff(np.concatenate((start, [q.size])))
        stride = np.where(count > 1, step[np.minimum(start + 1, max(q.size - 1, 0))], 0)
        self._runs.append(np.stack([var[start], begin[start], length[start], count, stride], axis=1))
        self._op_runs.append(np.bincount(q[start], minlength=n)[:n])
        first_op = self.n_ops
        self.n_ops += n
        return first_op

    def vertices(self, tiles) -> int:
        self._vertices.append(_i64(tiles))
        self.n_vertices += len(tiles)
        return self.n_vertices - len(tiles)

    # ---- scopes: a step's (or a host tensor's) rows, stored once per distinct content ----------

    def open_scope(self) -> None:
        """Start the rows of one step or host tensor (its groups, fields, params, vertices, operands,
        runs, copies and host copies)."""
        self._scope = (len(self._runs), len(self._op_runs), self.n_ops, len(self.groups), len(self.fields),
                       len(self.params), len(self._vertices), self.n_vertices, len(self.copies),
                       len(self.host_copies))

    def close_scope(self) -> tuple[int, int, int, int, int, int, int, int]:
        """End the scope: its runs name variables through a binding (run ``var`` = slot ``i``: the
        scope's ``i``-th distinct variable, in order of first use), and rows equal, slot for slot, to an
        earlier scope's are dropped for that scope's. Returns ``(first operand, first group, groups,
        first copy, copies, first host copy, host copies, first binding)``: the rows the scope uses
        (its own or the earlier scope's); its binding is ``bindings[first binding:]`` (``binding_count``)."""
        r0, o0, n0, g0, f0, p0, v0, nv0, c0, h0 = self._scope
        self._scope = None
        runs = np.concatenate(self._runs[r0:]) if len(self._runs) > r0 else np.zeros((0, 5), np.int64)
        uniq, first, inverse = np.unique(runs[:, 0], return_index=True, return_inverse=True)
        by_use = np.argsort(first, kind="stable")
        slot = np.empty(uniq.size, np.int64)
        slot[by_use] = np.arange(uniq.size)
        local = runs.copy()
        local[:, 0] = slot[inverse.reshape(-1)]
        binding = uniq[by_use]
        op_runs = np.concatenate(self._op_runs[o0:]) if len(self._op_runs) > o0 else np.zeros(0, np.int64)
        groups = np.asarray(self.groups[g0:], np.int64).reshape(-1, 8) - [0, f0, 0, p0, 0, nv0, 0, n0]
        copies = np.asarray(self.copies[c0:], np.int64).reshape(-1, 2) - n0
        host_copies = np.asarray(self.host_copies[h0:], np.int64).reshape(-1, 2) - n0
        vertices = np.concatenate(self._vertices[v0:]) if len(self._vertices) > v0 else np.zeros(0, np.int64)
        parts = (local, op_runs, groups, np.asarray(self.fields[f0:], np.int64), np.asarray(self.params[p0:], np.int64),
                 _i64(vertices), copies, host_copies, _i64([self.n_ops - n0, uniq.size]))
        key = b"|".join(str(a.shape).encode() + _i64(a).tobytes() for a in parts)
        body = self._bodies.get(key)
        if body is None:
            body = (n0, g0, groups.shape[0], c0, copies.shape[0], h0, host_copies.shape[0])
            self._bodies[key] = body
            self._runs[r0:] = [local]
        else:                        # the same rows as an earlier scope: refer to them
            self.shared_scopes += 1
            del self._runs[r0:], self._op_runs[o0:], self.groups[g0:], self.fields[f0:], self.params[p0:]
            del self._vertices[v0:], self.copies[c0:], self.host_copies[h0:]
            self.n_ops, self.n_vertices = n0, nv0
        self._bindings.append(binding)
        self.n_bindings += binding.size
        return (*body, self.n_bindings - binding.size)

    @property
    def scope_first_operand(self) -> int:
        return self._scope[2]

    @property
    def last_binding(self) -> np.ndarray:
        return self._bindings[-1]

    def bind(self, binding: np.ndarray) -> int:
        """A scope that uses rows already stored, with ``binding``: returns its first binding."""
        self.shared_scopes += 1
        self._bindings.append(_i64(binding))
        self.n_bindings += binding.size
        return self.n_bindings - binding.size

    def binding_count(self, first_binding: int) -> int:
        return self.n_bindings - first_binding

    def sections(self) -> dict[str, np.ndarray]:
        """Every section as an int64 ``[rows, columns]`` array (``strings`` as bytes)."""
        nv = len(self.var_name)
        if self._pieces:
            pv = np.concatenate([np.full(t.size, v, np.int64) for v, t, _ in self._pieces])
            pt = np.concatenate([t for _, t, _ in self._pieces])
            pc = np.concatenate([c for _, _, c in self._pieces])
            order = np.argsort(pv, kind="stable")
            pv, pt, pc = pv[order], pt[order], pc[order]
            keep = pc > 0
            pv, pt, pc = pv[keep], pt[keep], pc[keep]
            first = np.flatnonzero(np.concatenate(([True], (pv[1:] != pv[:-1]) | (pt[1:] != pt[:-1]))))
            pv, pt, pc = pv[first], pt[first], np.add.reduceat(pc, first) if first.size else pc[:0]
        else:
            pv = pt = pc = np.zeros(0, np.int64)
        npieces = np.bincount(pv, minlength=nv)[:nv]
        shared = _SharedPieces(np.stack([pt, pc], axis=1), npieces)
        runs = np.concatenate(self._runs) if self._runs else np.zeros((0, 5), np.int64)
        op_runs = np.concatenate(self._op_runs) if self._op_runs else np.zeros(0, np.int64)

        def table(rows, columns):
            return np.asarray(rows, np.int64).reshape(-1, columns)

        names = _i64([self.string(s) for s in self.var_name])      # before ``strings`` is taken
        return {
            "strings": bytes(self.strings),
            "variables": np.stack([names, _i64(self.var_type), shared.first, npieces], axis=1),
            "pieces": shared.pieces,
            "runs": runs,
            "operands": np.stack([np.cumsum(op_runs) - op_runs, op_runs], axis=1),
            "bindings": (np.concatenate(self._bindings) if self._bindings else np.zeros(0, np.int64))[:, None],
            "host_tensors": table(self.host_tensors, 10),
            "host_copies": table(self.host_copies, 2),
            "steps": table(self.steps, 8),
            "groups": table(self.groups, 8),
            "fields": table(self.fields, 1),
            "params": table(self.params, 3),
            "vertices": (np.concatenate(self._vertices) if self._vertices else np.zeros(0, np.int64))[:, None],
            "copies": table(self.copies, 2),
        }


class _SharedPieces:
    """The pieces table with each distinct piece list stored once (``pieces``) and the first piece of
    each variable in it (``first``)."""

    def __init__(self, pieces: np.ndarray, counts: np.ndarray):
        first = np.cumsum(counts) - counts
        keep = np.ones(pieces.shape[0], bool)
        out_first = first.copy()
        seen: dict[bytes, int] = {}
        stored = 0
        for v in np.flatnonzero(counts).tolist():
            a, n = int(first[v]), int(counts[v])
            key = pieces[a:a + n].tobytes()
            at = seen.get(key)
            if at is None:
                seen[key] = at = stored
                stored += n
            else:
                keep[a:a + n] = False
            out_first[v] = at
        out_first[counts == 0] = 0
        self.pieces, self.first = pieces[keep], out_first


def pack_tables(sections: dict[str, np.ndarray]) -> bytes:
    """``host/tables.bin`` (layout in the module docstring); int32 values, checked."""
    import zlib
    out = [MAGIC, struct.pack("<I", len(SECTIONS))]
    strings = sections["strings"]
    for name, columns in SECTIONS:
        if name == "strings":
            out += [struct.pack("<16sIIQQ", name.encode(), 1, 1, len(strings), len(strings)), strings]
            continue
        a = np.asarray(sections[name], np.int64).reshape(-1, columns)
        if a.size and (a.min() < -2**31 or a.max() >= 2**31):
            raise TileplanError(f"host tables: {name} holds a value outside int32 "
                                f"({int(a.min())}..{int(a.max())})")
        stored = zlib.compress(np.ascontiguousarray(a.T).astype("<i4").tobytes(), TABLES_LEVEL)
        out += [struct.pack("<16sIIQQ", name.encode(), 4, columns, a.shape[0], len(stored)), stored]
    return b"".join(out)


# ---- replaying the program -------------------------------------------------------------------

@dataclass
class _Replayed:
    """A step as replayed in full, kept for the later ones of its shape (``Replay._repeat``): what it
    read (``Replay._view``), the variables it made (name after the step's name, element type, made by
    name: ``Replay._named_var``) and their pieces (index into ``made``, tiles, counts, as
    ``Tables.pieces`` stores them), the id of the first of them, its writes merged as the byte map
    merges them, its ``steps`` row (kind; first group, groups, first copy, copies), its binding and
    the vertices it counts."""

    view: tuple
    made: list
    pieces: list
    first_made: int
    writes: tuple
    kind: int
    body: tuple
    binding: np.ndarray
    vertices: int


def _merged_pieces(tiles, counts) -> tuple[np.ndarray, np.ndarray]:
    """Pieces of ``counts`` elements on ``tiles`` with consecutive pieces on one tile joined (what
    ``Tables.pieces`` stores: the same variable either way)."""
    tiles, counts = _i64(tiles), _i64(counts)
    keep = counts > 0
    tiles, counts = tiles[keep], counts[keep]
    if tiles.size:
        first = np.flatnonzero(np.concatenate(([True], tiles[1:] != tiles[:-1])))
        tiles, counts = tiles[first].astype(np.int32), np.add.reduceat(counts, first)
    return tiles, counts


def _nonempty_by_address(wa, wb, *columns) -> tuple[np.ndarray, ...]:
    """``(wa, wb, *columns)`` of the writes with ``wb > wa``, in stable order of ``wa``. Most writes come
    non-empty and sorted (a step's, as ``_merged_writes`` returns them): those arrays are returned as
    they are, neither gathered nor sorted again."""
    out = (wa, wb, *columns)
    keep = wb > wa
    if not keep.all():
        out = tuple(x[keep] for x in out)
    if (out[0][1:] < out[0][:-1]).any():
        order = np.argsort(out[0], kind="stable")
        out = tuple(x[order] for x in out)
    return out


def _merged_writes(wa, wb, var, elem, ct, what: str) -> tuple[np.ndarray, ...]:
    """Writes sorted, checked to be disjoint (``what`` names them in the error), and joined where one
    continues the other (adjacent bytes, the same variable and the next elements, or both undefined):
    the byte map they leave is the same (``ByteMap._write`` joins such intervals itself, and a
    write's effect on older values depends only on the bytes it covers)."""
    wa, wb, var, elem, ct = _nonempty_by_address(*(_i64(x) for x in (wa, wb, var, elem, ct)))
    over = np.flatnonzero(wa[1:] < wb[:-1])
    if over.size:
        k = int(over[0])
        raise TileplanError(f"{what}: two writes to tile {wa[k + 1] // STRIDE} bytes "
                            f"[{wa[k + 1] % STRIDE}, {min(wb[k], wb[k + 1]) % STRIDE}) in one step")
    if wa.size < 2:
        return wa, wb, var, elem, ct
    z = _ESZ[ct[:-1]]
    cont = (wa[1:] == wb[:-1]) & (var[1:] == var[:-1]) & (ct[1:] == ct[:-1]) & (
        (var[1:] < 0) | ((wb[:-1] - wa[:-1]) % z == 0) & (elem[1:] == elem[:-1] + (wb[:-1] - wa[:-1]) // z))
    first = np.flatnonzero(np.concatenate(([True], ~cont)))
    last = np.concatenate((first[1:], [wa.size])) - 1
    return wa[first], wb[last], var[first], elem[first], ct[first]



class Replay:
    """Replays a tile program over the byte map, filling ``Tables``."""

    def __init__(self, tp: TileProgram, target, registry=None):
        self.tp, self.target, self.registry = tp, target, registry
        self.tables = Tables()
        self.map = ByteMap(tp.tiles)
        self._vars: dict[tuple[str, str], int] = {}
        self._replayed: dict[tuple, _Replayed] = {}    # a step's shape -> the last one of it replayed in full
        self._codelets: dict = {}                      # group_codelet's memo
        self._orders: dict[tuple, tuple] = {}          # ``_host_order``'s memo
        self._step = ""
        self.summary = {"vertices": 0, "transfers": 0}

    def _named_var(self, name: str, ctype: str) -> int:
        if (name, ctype) not in self._vars:
            self._vars[(name, ctype)] = self.tables.variable(name, ctype)
        return self._vars[(name, ctype)]

    # reads ---------------------------------------------------------------------------------

    def typed_read(self, tiles, addrs, nbytes, ctype: str, what: str, *, written: bool = False):
        """The slices ``(query, var, begin, end)`` that typed reads of ``nbytes`` (one size or one per read)
        at ``(tiles, addrs)`` see. Never-written bytes read as a piece of the step's uninitialised variable of
        the type, or are an error if ``written``."""
        size = ELEMENT_BYTES[ctype]
        nbytes = _i64(nbytes)
        if np.any(nbytes % size):
            raise TileplanError(f"{what}: {int(nbytes.flat[np.argmax(nbytes % size != 0)])} bytes is not a whole "
                                f"number of {ctype} elements")
        qa = _i64(tiles) * STRIDE + _i64(addrs)
        q, ps, pe, var, ct, start, elem = self.map.look(qa, qa + nbytes)
        defined = var >= 0
        undefined = np.flatnonzero(~defined)
        if written and undefined.size:
            k = int(undefined[0])
            raise TileplanError(f"{what}: tile {ps[k] // STRIDE} bytes from {ps[k] % STRIDE} are never written")
        bad = np.flatnonzero(defined & ((ct != TYPE_CODE[ctype]) | ((ps - start) % size != 0)
                                        | ((pe - ps) % size != 0)))
        if bad.size:
            k = int(bad[0])
            raise TileplanError(f"{what}: {_where(ps[k], pe[k])} hold {CTYPES[ct[k]]} elements of "
                                f"{self.tables.var_name[int(var[k])]!r}, read as {ctype}")
        begin = elem + (ps - start) // size
        count = (pe - ps) // size
        if undefined.size:
            v = self._named_var(f"{self._step}.uninitialised.{TYPE_SUFFIX[ctype]}", ctype)
            var = var.copy()
            var[undefined] = v
            begin[undefined] = self.tables.pieces(v, ps[undefined] // STRIDE, count[undefined])
        return q, var, begin, begin + count

    def byte_copies(self, st, sa, dt, da, nbytes, what: str):
        """Byte copies, all read before any is written: one Copy per element type; returns the copies
        and the writes. Rows are taken in destination order (tile, address) so that each tile's received
        elements are one piece of the step's variable."""
        copies, writes, _ = self._copy_rows(self._copy_reads(st, sa, dt, da, nbytes, what))
        return copies, writes

    def _copy_reads(self, st, sa, dt, da, nbytes, what: str) -> tuple[np.ndarray, ...]:
        """What byte copies read, in destination order: ``(query, start, end, var, ct, interval start, its
        element, destination tile, destination address)`` per piece (``ByteMap.look``)."""
        st, sa, dt, da, nbytes = (_i64(x) for x in (st, sa, dt, da, nbytes))
        order = _destination_order(st, sa, dt, da, nbytes)
        st, sa, dt, da, nbytes = (x[order] for x in (st, sa, dt, da, nbytes))
        qa = st * STRIDE + sa
        q, ps, pe, var, ct, start, elem = self.map.look(qa, qa + nbytes)
        z = _ESZ[ct]
        bad = np.flatnonzero((var >= 0) & (((ps - start) % z != 0) | ((pe - ps) % z != 0)))
        if bad.size:
            k = int(bad[0])
            raise TileplanError(f"{what}: {_where(ps[k], pe[k])} "
                                f"split {CTYPES[ct[k]]} elements of {self.tables.var_name[int(var[k])]!r}")
        return q, ps, pe, var, ct, start, elem, dt[q], dt[q] * STRIDE + da[q] + (ps - qa[q])

    def _copy_rows(self, reads):
        """The copies and writes of ``_copy_reads``'s pieces, and the variables made for them:
        ``(code, variable, tiles, counts, was new)`` per element type."""
        q, ps, pe, var, ct, start, elem, dtile, dst = reads
        defined = var >= 0
        wvar = np.full(q.size, -1, np.int64)
        welem = np.zeros(q.size, np.int64)
        wct = np.full(q.size, -1, np.int64)
        copies, made = [], []
        for code, ctype in enumerate(CTYPES):
            m = np.flatnonzero(defined & (ct == code))
            if not m.size:
                continue
            size = ELEMENT_BYTES[ctype]
            count = (pe[m] - ps[m]) // size
            v = self._named_var(f"{self._step}.{TYPE_SUFFIX[ctype]}", ctype)
            made.append((code, v, dtile[m], count, self.tables.var_size[v] == 0))
            begins = self.tables.pieces(v, dtile[m], count)
            src_begin = elem[m] + (ps[m] - start[m]) // size
            zero = np.zeros(m.size, np.int64)
            src = self.tables.operands(1, zero, var[m], src_begin, src_begin + count)
            # (the pieces just appended to ``v`` are consecutive elements: the destination is one slice)
            dst_op = self.tables.operands(1, zero[:1], _i64([v]), begins[:1], begins[-1:] + count[-1:])
            copies.append([src, dst_op])
            wvar[m], welem[m], wct[m] = v, begins, code
        return copies, (dst, dst + (pe - ps), wvar, welem, wct), made

    # the program ---------------------------------------------------------------------------

    def run(self) -> "Replay":
        tp = self.tp
        by_tensor: dict[tuple[bool, str], list[int]] = defaultdict(list)
        for i, b in enumerate(tp.buffers):
            if b.name in tp.io_maps and b.kind in ("input", "parameter", "output"):
                by_tensor[(b.kind == "output", b.tensor or b.name)].append(i)
        host = sorted(by_tensor.items(), key=lambda kv: (kv[0][0], kv[1][0]))
        self._step = "host"
        self._host_writes: list[tuple] = []
        for (is_out, tensor), ids in host:
            if not is_out:
                self._host_write(tensor, ids)
        self.map.write_each(self._host_writes)      # (nothing reads the map while the host writes)
        self.map.freeze()          # the host's values aside: steps' writes then cost what they write
        for step in tp.steps:
            self._step = step.name
            if isinstance(step, Exchange):
                self._exchange(step)
            else:
                self._compute(step)
        self._step = "outputs"
        for (is_out, tensor), ids in host:
            if is_out:
                self._host_read(tensor, ids[0])
        return self

    def _pieces(self, b: int):
        """Owner-map intervals of buffer ``b`` sorted by (first element, tile): arrays replica, tile, first
        element, end element, byte address; a replica continues where its coverage ends (the lowest
        numbered such replica), a new one starts at element 0."""
        info = self.tp.buffers[b]
        isz = DType(info.dtype).itemsize
        tile, start, stop, offset = (_i64(a) for a in self.tp.io_maps[info.name])
        order = np.lexsort((tile, start))
        tile, start, stop, offset = tile[order], start[order], stop[order], offset[order]
        if tile.size and start[0] == 0 and np.array_equal(start[1:], stop[:-1]):
            replica, ends = np.zeros(tile.size, np.int64), [int(stop[-1])]    # one replica: no search
        else:
            replica, ends = self._replicas(info.name, tile, start, stop)
        base = _i64(self.tp.addr[b, tile]) if tile.size else np.zeros(0, np.int64)
        missing = np.flatnonzero(base < 0)
        if missing.size:
            raise TileplanError(f"buffer {info.name!r} has owner-map elements on tile {int(tile[missing[0]])} "
                                f"but no bytes there")
        size = int(np.prod(info.shape)) if info.shape else 1
        if any(covered != size for covered in ends):
            raise TileplanError(f"buffer {info.name!r}: owner map covers {ends} of {size} elements per replica")
        return replica, tile, start, stop, base + offset * isz, len(ends), size

    @staticmethod
    def _replicas(name: str, tile, start, stop) -> tuple[np.ndarray, list[int]]:
        ends: list[int] = []
        waiting: dict[int, list[int]] = defaultdict(list)     # coverage -> replicas (a heap)
        replica = np.empty(tile.size, np.int64)
        for k, (s, e) in enumerate(zip(start.tolist(), stop.tolist())):
            if waiting.get(s):
                r = heapq.heappop(waiting[s])
            elif s == 0:
                ends.append(0)
                r = len(ends) - 1
            else:
                raise TileplanError(f"buffer {name!r}: owner-map interval [{s}, {e}) on tile {int(tile[k])} "
                                    f"continues no replica")
            ends[r] = e
            heapq.heappush(waiting[e], r)
            replica[k] = r
        return replica, ends

    def _host_write(self, tensor: str, ids: list[int]) -> None:
        t = self.tables
        info = self.tp.buffers[ids[0]]
        ctype = DType(info.dtype).cpp
        size_b = ELEMENT_BYTES[ctype]
        code = TYPE_CODE[ctype]
        t.open_scope()
        placed: set[bytes] = set()
        main = None
        src, dst = [], []          # slices (var, begin, end) of the replica copies
        for b in ids:
            r, tl, s, e, a, replicas, size = self._pieces(b)
            order = np.lexsort((a, e, s, tl))
            key = np.stack([tl, a, (e - s) * size_b])[:, order].tobytes()
            if key in placed:
                continue          # an alias: the same bytes as an earlier buffer of this tensor
            placed.add(key)
            v = t.variable(self.tp.buffers[b].name, ctype)
            begin = t.pieces(v, tl, e - s)
            wa = tl * STRIDE + a
            self._host_writes.append((wa, wa + (e - s) * size_b, np.full(tl.size, v), begin, np.full(tl.size, code),
                                      f"host tensor {tensor!r}"))
            if main is None:
                m = np.flatnonzero(r == 0)           # sorted by first element
                main = (s[m], e[m], np.full(m.size, v), begin[m])
                others = np.flatnonzero(r > 0)
            else:
                others = np.arange(r.size)
            others = others[np.lexsort((s[others], r[others]))]
            if others.size:
                src.append(_through(main, s[others], e[others]))
                dst.append((np.full(others.size, v), begin[others], begin[others] + e[others] - s[others]))
        operand = t.operands(1, *self._host_order(main, info))
        if dst:
            sv, sb, se = (np.concatenate(x) for x in zip(*src))
            dv, db, de = (np.concatenate(x) for x in zip(*dst))
            t.host_copies.append([t.operands(1, np.zeros(sv.size), sv, sb, se),
                                  t.operands(1, np.zeros(dv.size), dv, db, de)])
        self._host_tensor(ROLE["parameter" if info.kind == "parameter" else "input"], tensor, code,
                          int(main[1][-1]), operand)

    def _host_order(self, main, info):
        """``_row_major(main, info)`` for the pieces ``main`` of one variable, computed once per layout
        (the pieces' elements and the index space) and named after the variable.

        Design decision: a tower's layers hold their parameters in the same pieces of their own
        variables, and the row-major order of a panel-major weight is hundreds of thousands of
        slices; it is the same slices of each layer's variable, so it is found once, not per layer."""
        s, e, v, begin = main
        key = (getattr(info, "space", "rows") or "rows", tuple(info.shape), s.tobytes(), e.tobytes(), begin.tobytes())
        got = self._orders.get(key)
        if got is None:
            q, _, b, end = _row_major(main, info)
            got = self._orders[key] = (q, b, end)
        q, b, end = got
        return q, np.repeat(v[:1], q.size), b, end

    def _host_tensor(self, role: int, tensor: str, code: int, elements: int, operand: int) -> None:
        """The ``host_tensors`` row of the open scope (a host tensor's operand and replica copies)."""
        t = self.tables
        rel = operand - t.scope_first_operand
        first_op, _, _, _, _, first_copy, copies, first_binding = t.close_scope()
        t.host_tensors.append([role, t.string(tensor), code, elements, first_op + rel, first_copy, copies,
                               first_binding, t.binding_count(first_binding),
                               t.string(data_file(len(t.host_tensors), tensor))])

    def _host_read(self, tensor: str, b: int) -> None:
        t = self.tables
        info = self.tp.buffers[b]
        ctype = DType(info.dtype).cpp
        t.open_scope()
        r, tl, s, e, a, _, size = self._pieces(b)
        m = np.flatnonzero(r == 0)
        q, var, begin, end = self.typed_read(tl[m], a[m], (e[m] - s[m]) * ELEMENT_BYTES[ctype], ctype,
                                             f"output {tensor!r}", written=True)
        length = end - begin
        before = np.cumsum(length) - length                     # elements before each slice ...
        first = np.flatnonzero(np.concatenate(([True], q[1:] != q[:-1])))
        before -= np.repeat(before[first], np.diff(np.concatenate((first, [q.size]))))   # ... in its piece
        at = s[m][q] + before                                   # the slice's first element of the tensor
        operand = t.operands(1, *_row_major((at, at + length, var, begin), info))
        self._host_tensor(ROLE["output"], tensor, TYPE_CODE[ctype], size, operand)

    # repeated steps ------------------------------------------------------------------------

    def _replay_step(self, step, shape, view, replay) -> None:
        """Replay ``step``: as the last step of its ``shape`` replayed in full, renamed, where ``view``
        (what the bytes it reads hold: ``_view``) equals that step's view up to a renaming of the
        variables (``_repeat``); else in full (``replay()``, which returns the writes it made), keeping
        what a later step of the shape needs. A tower's layers: each layer-invariant step is replayed
        row by row once, and its repetitions cost what their views and their writes hold, not their
        rows. ``shape`` None: always in full."""
        earlier = self._replayed.get(shape) if shape is not None else None
        if earlier is not None and self._repeat(step.name, earlier, view, f"step {step.name!r}"):
            return
        t = self.tables
        v0, p0, n0 = len(t.var_name), len(t._pieces), self.summary["vertices"]
        writes = replay()
        if shape is None:
            return
        made = range(v0, len(t.var_name))
        names = [t.var_name[v] for v in made]
        entries = t._pieces[p0:]
        read = _unique(view[1])
        binding = t.last_binding
        if not all(n.startswith(step.name) for n in names) or any(v < v0 for v, _, _ in entries) \
                or np.any((writes[2] >= 0) & (writes[2] < v0)) \
                or not np.isin(binding[binding < v0], read).all():
            return               # it wrote or bound what its view does not say (kept out of the shortcut)
        self._replayed[shape] = _Replayed(
            view, [(n[len(step.name):], CTYPES[t.var_type[v]], (n, CTYPES[t.var_type[v]]) in self._vars)
                   for n, v in zip(names, made)],
            [(v - v0, tiles, counts) for v, tiles, counts in entries], v0, writes, t.steps[-1][0],
            tuple(t.steps[-1][2:6]), binding, self.summary["vertices"] - n0)

    def _view(self, qa: np.ndarray, qb: np.ndarray, key: np.ndarray) -> tuple:
        """What the byte ranges ``[qa, qb)`` hold now, relative to each range (the pieces of
        ``ByteMap.look``): ``(where, var)`` with ``where`` the int64 columns (``key`` of the range,
        first byte and end byte in it, element type, byte phase in the element, the element) and
        ``var`` the variables. Two steps whose reads lie in ranges with equal keys and whose views
        are equal up to a renaming of the variables read the same pieces of the renamed variables."""
        q, ps, pe, var, ct, start, elem = self.map.look(qa, qb)
        z = _ESZ[ct]
        defined = var >= 0              # (undefined bytes: no element, whichever interval holds them)
        where = np.stack([key[q], ps - qa[q], pe - qa[q], ct, np.where(defined, (ps - start) % z, 0),
                          np.where(defined, elem + (ps - start) // z, 0)])
        return where, var

    def _repeat(self, name: str, earlier: "_Replayed", view, what: str) -> bool:
        """Replay a step as the ``earlier`` one of its shape (see ``_replay_step``) if what it reads holds
        what the earlier one read, up to a renaming of the variables; False (nothing done) if not.
        The variables it makes are the earlier one's under its name, with their pieces (the same
        tiles and counts, in the same order), so what it writes is the earlier writes renamed, and its
        rows are the earlier rows bound to the renamed variables."""
        where, var = view
        old_where, old_var = earlier.view
        if where.shape != old_where.shape or not np.array_equal(where, old_where) \
                or not np.array_equal(var < 0, old_var < 0) or not np.array_equal(var[var < 0], old_var[old_var < 0]) \
                or not np.array_equal(_first_use(var), _first_use(old_var)):
            return False
        if any((name + suffix, ctype) in self._vars for suffix, ctype, named in earlier.made if named):
            return False
        t = self.tables
        old_ids, at = np.unique(old_var, return_index=True)
        new_ids = var[at]
        made = [self._named_var(name + suffix, ctype) if named else t.variable(name + suffix, ctype)
                for suffix, ctype, named in earlier.made]
        for i, tiles, counts in earlier.pieces:
            t.merged_pieces(made[i], tiles, counts)
        old_ids = np.concatenate((old_ids, earlier.first_made + np.arange(len(made))))
        new_ids = np.concatenate((new_ids, _i64(made)))
        order = np.argsort(old_ids)
        old_ids, new_ids = old_ids[order], new_ids[order]
        wa, wb, wvar, welem, wct = earlier.writes
        renamed = np.where(wvar >= 0, new_ids[np.searchsorted(old_ids, wvar)], wvar)
        self.map.write_merged(wa, wb, renamed, welem, wct, what)
        first_binding = t.bind(new_ids[np.searchsorted(old_ids, earlier.binding)])
        t.steps.append([earlier.kind, t.string(name), *earlier.body, first_binding, earlier.binding.size])
        self.summary["vertices"] += earlier.vertices
        return True

    # exchanges -----------------------------------------------------------------------------

    def _exchange(self, step: Exchange) -> None:
        tr = step.transfers
        self.summary["transfers"] += len(tr)
        # A tower's layers run exchanges of the same rows (``Exchange.origin``) over their own values:
        # the view is what their source buffers hold (rows read only their source buffer's bytes).
        shape = view = exchange_shape(step)
        if shape is not None:
            view = self._view(*self._buffer_ranges([sid for _, sid, _ in step.origin]))
        self._replay_step(step, shape, view, lambda: self._exchange_rows(step))

    def _buffer_ranges(self, buffers) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The byte ranges of ``buffers`` (one per tile holding bytes of it), keyed by (position in
        ``buffers``, tile)."""
        qa, qb, key = [], [], []
        for c, b in enumerate(buffers):
            t = np.flatnonzero((self.tp.addr[b] >= 0) & (self.tp.size[b] > 0))
            at = t * STRIDE + self.tp.addr[b, t]
            qa.append(at)
            qb.append(at + self.tp.size[b, t])
            key.append(c * self.tp.tiles + t)
        return tuple(np.concatenate(x) for x in (qa, qb, key))

    def _exchange_rows(self, step: Exchange) -> tuple:
        """An exchange replayed row by row; returns its writes."""
        tr = step.transfers
        t = self.tables
        what = f"exchange {step.name!r}"
        reads = self._copy_reads(tr.src_tile, tr.src_off, tr.dst_tile, tr.dst_off, tr.nbytes, what)
        t.open_scope()
        copies, writes, _ = self._copy_rows(reads)
        writes = self.map.write(*writes, what)
        t.copies += copies
        self._step_row(1, step.name)
        return writes

    def _step_row(self, kind: int, name: str) -> tuple[int, ...]:
        """The ``steps`` row of the open scope; returns the scope's rows (``Tables.close_scope``)."""
        t = self.tables
        *body, first_binding = t.close_scope()
        t.steps.append([kind, t.string(name), *body[1:5], first_binding, t.binding_count(first_binding)])
        return tuple(body)

    def _compute(self, step: ComputeSet) -> None:
        # The layers' compute sets: the same vertices (tiles, outputs, calls) reading their own values
        # (a layer's weights sit elsewhere); the view is what every operand they read holds.
        shape, qa, qb = [], [], []
        for group in step.groups:
            copy = group.call.primitive == "copy"
            shape.append((group.call, group.variant, group.in_bytes, group.out_bytes, id(group.tile),
                          id(group.outs), id(group.ins) if copy else None))
            at = _i64(group.tile) * STRIDE
            for j in range(1 if copy else len(group.in_bytes)):
                qa.append(at + group.ins[:, j])
                qb.append(at + group.ins[:, j] + int(group.in_bytes[j]))
        qa = np.concatenate(qa) if qa else np.zeros(0, np.int64)
        qb = np.concatenate(qb) if qb else np.zeros(0, np.int64)
        view = self._view(qa, qb, np.arange(qa.size))
        self._replay_step(step, ("compute", tuple(shape)), view, lambda: self._compute_rows(step))

    def _compute_rows(self, step: ComputeSet) -> tuple:
        """A compute set replayed vertex by vertex; returns its writes."""
        t = self.tables
        t.open_scope()
        writes = []
        copy_rows = []
        for gi, group in enumerate(step.groups):
            tiles = _i64(group.tile)
            if group.call.primitive == "copy":
                copy_rows.append((tiles, group.ins[:, 0], tiles, group.outs[:, 0],
                                  np.full(tiles.size, group.in_bytes[0])))
                continue
            source = group_codelet(group, self.target, self.registry, self._codelets)
            what = f"compute set {step.name!r} group {gi} ({group.call})"
            ins, outs = source.inputs, source.outputs
            n, nf = tiles.size, len(ins) + len(outs)
            parts = []
            for j, f in enumerate(ins):
                q, var, begin, end = self.typed_read(tiles, group.ins[:, j], int(group.in_bytes[j]), f.ctype, what)
                parts.append((q * nf + j, var, begin, end))
            for j, f in enumerate(outs):
                v = t.variable(f"{step.name}/g{gi}.{f.name}", f.ctype)
                count = int(f.size)
                begin = t.pieces(v, tiles, np.full(n, count))
                parts.append((np.arange(n) * nf + len(ins) + j, np.full(n, v), begin, begin + count))
                wa = tiles * STRIDE + _i64(group.outs[:, j])
                writes.append((wa, wa + count * ELEMENT_BYTES[f.ctype], np.full(n, v), begin,
                               np.full(n, TYPE_CODE[f.ctype])))
            q, var, begin, end = (np.concatenate(x) for x in zip(*parts))
            order = np.argsort(q, kind="stable")
            first_op = t.operands(n * nf, q[order], var[order], begin[order], end[order])
            first_field = len(t.fields)
            t.fields += [[t.string(f.name)] for f in ins + outs]
            params = [f for f in source.fields if not f.is_vector]
            for f in params:
                if f.ctype == "float":
                    continue
                value = int(f.value)
                if not (0 if f.ctype == "unsigned" else -2**31) <= value < 2**31:
                    raise TileplanError(f"{what}: parameter {f.name} = {value} does not fit the host tables")
            first_param = len(t.params)
            t.params += [[t.string(f.name), *param_row(f)] for f in params]
            t.groups.append([t.string(source.vertex), first_field, nf, first_param, len(params),
                             t.vertices(tiles), n, first_op])
            self.summary["vertices"] += n
        copies = []
        if copy_rows:
            st, sa, dt, da, nb = (np.concatenate(x) for x in zip(*copy_rows))
            copies, w = self.byte_copies(st, sa, dt, da, nb, f"on-tile copies of {step.name!r}")
            writes.append(w)
        writes = tuple(np.concatenate(x) for x in zip(*writes)) if writes else (np.zeros(0, np.int64),) * 5
        writes = self.map.write(*writes, f"compute set {step.name!r}")
        t.copies += copies
        self._step_row(0, step.name)
        return writes


# ---- host.cpp --------------------------------------------------------------------------------

def _printable(value) -> str:
    """The template's ``finalize``: every value host.cpp.j2 interpolates must come out printable
    ASCII (a name reaches it only through ``cpp_string`` or ``cpp_comment``)."""
    text = str(value)
    if not all(32 <= ord(ch) < 127 for ch in text):
        raise TileplanError(f"host.cpp: {text!r} would be written unescaped")
    return text


@functools.cache
def _template() -> jinja2.Template:
    """``templates/host.cpp.j2``: the fixed C++ of host.cpp, with the program's figures and names.

    Design decision: no autoescaping (the output is C++, not HTML); instead the names go through the
    ``cpp_string`` and ``cpp_comment`` filters where the template uses them, and ``finalize``
    refuses any value that comes out with a character outside printable ASCII, so a name the
    template forgot to escape is an error, not a bidi character in host.cpp. With
    ``-DTILEPLAN_DUMP_TABLES`` (no Poplar needed) the program prints every section of a table file
    as text and the data files, so that tests can check that host.cpp reads what emission wrote."""
    env = jinja2.Environment(loader=jinja2.PackageLoader("tileplan.lowering.emit", "templates"),
                             autoescape=False, undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True, finalize=_printable)
    env.filters["cpp_string"] = cpp_string
    env.filters["cpp_comment"] = cpp_comment
    return env.get_template("host.cpp.j2")


def render(replay: Replay, tp: TileProgram, target, model_name: str, codelet_files: list[str],
           sections: dict[str, np.ndarray], folded=(), schedule: tuple[int, int] = (1, 1)) -> str:
    rows = {name: (len(a) if name == "strings" else int(np.asarray(a).shape[0])) for name, a in sections.items()}
    return _template().render(
        model_name=model_name, target_name=target.name, ipu_version=target.family, tiles=tp.tiles, ipus=target.ipus,
        steps=len(tp.steps), vertices=replay.summary["vertices"], transfers=replay.summary["transfers"],
        variables=rows["variables"], table_rows=", ".join(f"{n} {rows[n]}" for n, _ in SECTIONS),
        tables_file=TABLES_FILE, codelet_files=codelet_files, folded=_folded_rows(folded, rows["host_tensors"]),
        stages=int(schedule[0]), micro_batches=int(schedule[1]))


def _folded_rows(folded, first_row: int) -> list[dict]:
    """``kFolded``'s rows: per folded output (name, stored values), its name, its data file (numbered
    from ``first_row``, after the host tensors), its element count and the bytes of its one element
    as an octal-escaped string literal."""
    rows = []
    for k, (name, values) in enumerate(folded):
        v = np.ascontiguousarray(values)
        one = np.full(1, v.flat[0] if v.size else 0, v.dtype).tobytes()
        rows.append({"name": name, "file": data_file(first_row + k, name), "elements": v.size,
                     "element_bytes": len(one), "element": '"' + "".join(f"\\{b:03o}" for b in one) + '"'})
    return rows


def schedule_sections(tp: TileProgram, target, stages: int) -> dict[str, np.ndarray]:
    """``step_places`` and ``host_places``: each step's place in the micro-batch schedule and each host
    tensor's stage, in the order of the ``steps`` and ``host_tensors`` rows (``Replay.run``: the
    inputs and parameters by first buffer, then the outputs). One stage: every step stage 0's own."""
    from ...planner.pipeline import program_places
    places = program_places(tp, target, stages)
    steps = np.array([[0 if kind == "own" else 1, s] for kind, s in places], np.int64).reshape(-1, 2)
    by_tensor: dict[tuple[bool, str], list[int]] = defaultdict(list)
    for i, b in enumerate(tp.buffers):
        if b.name in tp.io_maps and b.kind in ("input", "parameter", "output"):
            by_tensor[(b.kind == "output", b.tensor or b.name)].append(i)
    host = sorted(by_tensor.items(), key=lambda kv: (kv[0][0], kv[1][0]))
    tpi = target.tiles_per_ipu

    def stage_of(i):
        tiles = np.asarray(tp.io_maps[tp.buffers[i].name][0])
        return int(tiles.min()) // tpi if stages > 1 and tiles.size else 0
    return {"step_places": steps, "host_places": np.array([[stage_of(ids[0])] for _, ids in host],
                                                          np.int64).reshape(-1, 1)}


def emit_host(tile_program: TileProgram, target, model_name: str, registry=None, folded=(),
              schedule: tuple[int, int] = (1, 1)) -> dict[str, bytes]:
    """The host program's package files: ``{"host.cpp": text, "host/tables.bin": tables}`` (deterministic:
    the same program gives the same bytes; host.cpp's size does not grow with the program). ``folded``:
    (name, stored values) of each output folded at plan time, which the host writes itself.
    ``schedule``: (stages, micro-batches) of a package of micro-batches (``planner.pipeline``): the
    host runs the slots of the pipelined schedule; (1, 1) runs the program once."""
    replay = Replay(tile_program, target, registry).run()
    sections = replay.tables.sections()
    sections.update(schedule_sections(tile_program, target, schedule[0]))
    if len(sections["host_places"]) != len(sections["host_tensors"]):
        raise AssertionError("host_places: not one row per host tensor")
    files = list(emit_codelets(tile_program, target, registry))
    text = render(replay, tile_program, target, model_name, files, sections, folded, schedule)
    return {HOST_CPP: text.encode(), TABLES_FILE: pack_tables(sections)}
