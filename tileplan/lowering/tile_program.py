"""``TileProgram``: per tile allocations, compute sets and exchange transfers.

What lowering produces and the IPU model executes. Everything per tile is a
numpy array; the small index (buffers, calls, step names) is JSON.

- Buffers: ``addr[b, t]`` (byte address on tile t, -1 where the buffer has
  nothing there) and ``size[b, t]`` (bytes). Host I/O buffers (inputs,
  parameters, outputs) keep their owner maps so the host can write and read
  them through their layouts.
- A compute set is a list of vertex *groups*: one kernel call (same variant,
  same operand sizes) on many tiles; per group ``tile[n]``, ``ins[n, k]`` and
  ``outs[n, k]`` byte addresses; operand byte sizes are per group.
- An exchange is a transfer table: ``group`` (one id per multicast send),
  ``src_tile, src_addr, dst_tile, dst_addr, nbytes``.

Cycles of every step follow the cycle model of ``estimate.exchange`` and the
kernels' formulas, so the IPU model counts the same way the estimate does.

Repeated layers: the layers of a tower are one program modulo parameter values,
so most of their steps' tables are equal array for array (the same tiles, the
same activation addresses). Lowering passes every table through an
``ArrayPool``, so equal tables are one numpy array in memory, and
``program.npz`` stores each distinct table once: a step whose table equals an
earlier step's names that member in ``program.json`` (``"arrays"``) instead of
storing its own copy; an exchange's source addresses are stored relative to its source
buffers, one member for every layer, with a per-step ``[rows, buffer]`` table
(``Exchange.sources``, ``TileProgram.to_files``). Transfer tables are int32 (tiles, addresses and byte
counts of one tile's memory all fit). An exchange's table is placed from its
copies' buffer-relative rows column by column (``Placement``: a column shared
by the layers is made and pooled once), and keeps in memory where it came from
(``Exchange.origin``), which host emission and the report use to treat a
repeated exchange once (``exchange_shape``).
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import TileplanError
from ..estimate.exchange import Transfers


@dataclass
class BufferInfo:
    name: str
    dtype: str
    shape: list
    kind: str
    region: str
    layout: str
    tensor: str | None
    transpose: bool
    scale: int
    alias_of: str | None = None   # the buffer whose memory this one shares (a no-op copy, a donated buffer)
    span: list | None = None      # [first, last] tile-program step that uses it
    space: str = "rows"           # element index space of its owner map: "rows" or "panels<g>" (panel-major)


@dataclass
class VertexGroup:
    call: Any                     # a kernels call (frozen dataclass)
    variant: str
    cycles: int                   # per vertex
    in_bytes: tuple[int, ...]
    out_bytes: tuple[int, ...]
    tile: np.ndarray              # int32 [n]
    ins: np.ndarray               # int64 [n, len(in_bytes)] byte addresses
    outs: np.ndarray              # int64 [n, len(out_bytes)]


@dataclass
class ComputeSet:
    name: str
    groups: list[VertexGroup]


@dataclass
class Exchange:
    name: str
    transfers: Transfers | None   # offsets are absolute byte addresses here (None during lowering, until
                                  # made from ``parts``)
    fragments: int | None = None  # before merge_transfers: the logical fragments the rows stand for, where
                                  # expansion already moved a block as one row (None: one per row)
    parts: tuple | None = None    # during lowering only: per copy, (its rows with buffer-relative offsets
                                  # and buffer ids 0, shared by every copy with its plan; source buffer
                                  # index; destination buffer index), what merge_transfers merges copy by copy
    origin: tuple | None = None   # in memory only (not in the package): per copy, in table order, (rows,
                                  # source buffer index, destination buffer index), ``rows`` numbering the
                                  # copy's buffer-relative rows: equal numbers, equal rows (a tower's layers
                                  # share them). What lets host emission replay a repeated exchange once
                                  # (``emit.host``). None: a table without its copies (built by hand, loaded)
    sources: tuple | None = None  # the table's source addresses relative to its source buffers: (src_rel, an
                                  # int32 [rows] column, ((rows, source buffer index), ...) in table order);
                                  # src_off = addr[buffer, src_tile] + src_rel. What program.npz stores in
                                  # place of src_off (a tower's layers share src_rel). None: not known


def absolute(tr: Transfers, addr: np.ndarray) -> Transfers:
    """Buffer-relative transfer offsets -> absolute byte addresses on the tiles (``addr[buffer, tile]``)."""
    if len(tr) == 0:
        return tr
    src = addr[tr.src_buf, tr.src_tile] + tr.src_off
    dst = addr[tr.dst_buf, tr.dst_tile] + tr.dst_off
    zero = np.zeros(len(tr), dtype=np.int32)
    return Transfers(tr.group, tr.src_tile, zero, src, tr.dst_tile, zero, dst, tr.nbytes)


def on_buffers(tr: Transfers, sid: int, did: int) -> Transfers:
    """Transfers made with buffer ids 0, between buffers ``sid`` and ``did``."""
    if len(tr) == 0:
        return tr
    return Transfers(tr.group, tr.src_tile, np.full(len(tr), sid, np.int32), tr.src_off, tr.dst_tile,
                     np.full(len(tr), did, np.int32), tr.dst_off, tr.nbytes)


def exchange_shape(step: "Exchange") -> tuple | None:
    """What makes two exchanges the same rows between other buffers: the numbers of their copies'
    buffer-relative rows (``Exchange.origin``) and their pooled columns other than the source
    addresses (the very arrays: the same destination bytes, tiles and sizes, in the same order).
    Two exchanges of one shape differ at most in where their sources sit (a tower's layers read
    their own weights). None: an exchange without its copies (built by hand, loaded)."""
    if step.origin is None:
        return None
    tr = step.transfers
    return (tuple(rows for rows, _, _ in step.origin),
            tuple(id(getattr(tr, f)) for f in ("group", "src_tile", "dst_tile", "dst_off", "nbytes")))


class RowNumbers:
    """Numbers for buffer-relative row tables (``Exchange.origin``): one number per distinct table
    object, in order of first use, kept with the table so that a number never names two tables."""

    def __init__(self):
        self._number: dict[int, tuple[int, object]] = {}     # id -> (number, the table, kept alive)

    def __call__(self, rows) -> int:
        got = self._number.get(id(rows))
        if got is None:
            got = self._number[id(rows)] = (len(self._number), rows)
        return got[0]

    def origin(self, parts) -> tuple:
        """``Exchange.origin`` of an exchange made of ``parts`` ((rows, source, destination) per copy)."""
        return tuple((self(rows), int(sid), int(did)) for rows, sid, did in parts if len(rows))


@dataclass
class TileProgram:
    tiles: int
    buffers: list[BufferInfo]
    addr: np.ndarray              # int64 [nbuf, tiles]
    size: np.ndarray              # int64 [nbuf, tiles]
    steps: list = field(default_factory=list)        # ComputeSet | Exchange
    io_maps: dict[str, tuple] = field(default_factory=dict)   # buffer name -> (tile, start, stop, offset) arrays
    passes: list[str] = field(default_factory=list)  # the low passes that ran, in order

    def buffer_index(self, name: str) -> int:
        for i, b in enumerate(self.buffers):
            if b.name == name:
                return i
        raise KeyError(name)

    # ---- serialisation: one npz of arrays plus a JSON index ------------------------------

    def to_files(self) -> tuple[bytes, dict]:
        """``program.npz``'s arrays and ``program.json``'s index.

        Design decision: what a tower's layers repeat is stored once. An array several steps hold
        (``ArrayPool``) is one member, which the later steps name (``"arrays"``). An exchange's
        source addresses are stored relative to its source buffers when lowering knows them
        (``Exchange.sources``): the member holds ``src_rel`` (the same rows for every layer, so one
        member) and the step lists its ``"sources"``, ``[rows, buffer]`` in table order, the
        per-instance address table (``addr[buffer, src_tile] + src_rel``). A transfer's ``group``
        (its multicast id: mostly one more than the row before's) is stored as its differences
        from the row before, which deflate to almost nothing. Host maps with equal arrays share
        their members (``"io_arrays"``)."""
        arrays: dict[str, np.ndarray] = {"addr": self.addr, "size": self.size}
        stored: dict[tuple, str] = {}    # (id of an array already stored, its encoding) -> its member name
        kept: list = []                  # the arrays named by ``stored`` (kept alive: their ids stay theirs)

        def put(name: str, a: np.ndarray, refs: dict, field: str, encode=None) -> None:
            """Store ``a`` (``encode(a)`` when given) under ``name``, or refer to the member that already
            holds it."""
            key = (id(a), encode)
            if key in stored:
                refs[field] = stored[key]
            else:
                stored[key] = name
                kept.append(a)
                arrays[name] = a if encode is None else encode(a)

        steps = []
        first_like: dict[str, int] = {}      # a compute step's groups (without their arrays) -> the first step
        for si, st in enumerate(self.steps):
            if isinstance(st, ComputeSet):
                groups, group_refs = [], []
                for gi, g in enumerate(st.groups):
                    p = f"s{si}g{gi}"
                    refs: dict[str, str] = {}
                    for f in ("tile", "ins", "outs"):
                        put(f"{p}_{f}", getattr(g, f), refs, f)
                    groups.append({"call": call_to_json(g.call), "variant": g.variant, "cycles": g.cycles,
                                   "in_bytes": list(g.in_bytes), "out_bytes": list(g.out_bytes)})
                    group_refs.append(refs)
                key = json.dumps(groups, sort_keys=True, default=str)
                like = first_like.setdefault(key, si)
                if like != si:         # a later layer's step: the first one's calls, its own arrays
                    steps.append({"kind": "compute", "name": st.name, "like": like, "group_arrays": group_refs})
                    continue
                for d, refs in zip(groups, group_refs):
                    if refs:
                        d["arrays"] = refs
                steps.append({"kind": "compute", "name": st.name, "groups": groups})
            else:
                p = f"s{si}x"
                refs = {}
                d = {"kind": "exchange", "name": st.name}
                sources = st.sources if st.sources is not None and \
                    sum(n for n, _ in st.sources[1]) == len(st.transfers) else None
                for f in EXCHANGE_FIELDS:
                    if f == "src_off" and sources is not None:
                        put(f"{p}_{f}", sources[0], refs, f)
                        d["sources"] = [[int(n), int(b)] for n, b in sources[1]]
                    else:
                        put(f"{p}_{f}", getattr(st.transfers, f), refs, f, _deltas if f == "group" else None)
                if refs:
                    d["arrays"] = refs
                steps.append(d)
        equal: dict[tuple, np.ndarray] = {}     # (dtype, shape, digest) -> the first host map array of it
        io_refs: dict[str, dict] = {}
        for name, (t, s, e, o) in sorted(self.io_maps.items()):
            refs = {}
            for k, a in zip(("tile", "start", "stop", "offset"), (t, s, e, o)):
                a = np.ascontiguousarray(a)
                a = equal.setdefault((a.dtype.str, a.shape, hashlib.blake2b(a.data, digest_size=16).digest()), a)
                put(f"io:{name}:{k}", a, refs, k)
            if refs:
                io_refs[name] = refs
        index = {"tiles": self.tiles, "buffers": [b.__dict__ for b in self.buffers], "steps": steps,
                 "io": sorted(self.io_maps), "passes": self.passes}
        if io_refs:
            index["io_arrays"] = io_refs
        return deterministic_npz(arrays), index

    @classmethod
    def from_files(cls, source: "bytes | dict[str, np.ndarray]", index: dict, limit: int | None = None) -> "TileProgram":
        """The tile program of ``program.npz`` (its bytes, read through ``safeio.load_npz`` with at
        most ``limit`` bytes of arrays, or its arrays already read so) and its index ``program.json``
        (whose structure ``lowering.check.check_documents`` has checked; anything it lacks is a
        ``TileplanError`` here, not a ``KeyError``)."""
        from ..safeio import LIMITS, load_npz
        arrays = source if isinstance(source, dict) else \
            load_npz(source, LIMITS["npz"] if limit is None else limit, "program.npz")
        try:
            return cls._from_arrays(arrays, index)
        except TileplanError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as exc:
            raise TileplanError(f"program.json: cannot read the tile program ({type(exc).__name__}: "
                                f"{str(exc)[:160]})") from None

    @classmethod
    def _from_arrays(cls, arrays: dict, index: dict) -> "TileProgram":

        def get(prefix: str, field: str, refs) -> np.ndarray:
            name = (refs or {}).get(field, f"{prefix}_{field}")
            if not isinstance(name, str) or name not in arrays:
                raise TileplanError(f"program.json: {prefix} refers to {name!r}, which program.npz lacks")
            return arrays[name]

        steps = []
        decoded: dict[tuple, np.ndarray] = {}
        pool = ArrayPool()
        for si, st in enumerate(index["steps"]):
            if st["kind"] == "compute":
                groups = []
                if "like" in st:
                    like = index["steps"][st["like"]]     # (check_documents: an earlier step with its groups)
                    own = st["group_arrays"]
                    entries = [dict(g, arrays=refs) for g, refs in zip(like["groups"], own)]
                else:
                    entries = st["groups"]
                for gi, g in enumerate(entries):
                    p = f"s{si}g{gi}"
                    refs = g.get("arrays")
                    try:
                        call = call_from_json(g["call"])
                    except TileplanError as exc:
                        raise TileplanError(f"program.json: steps[{si}].groups[{gi}].call: {exc}") from None
                    groups.append(VertexGroup(call, g["variant"], int(g["cycles"]),
                                              tuple(g["in_bytes"]), tuple(g["out_bytes"]),
                                              *(get(p, f, refs) for f in ("tile", "ins", "outs"))))
                steps.append(ComputeSet(st["name"], groups))
            else:
                p = f"s{si}x"
                z = {f: get(p, f, st.get("arrays")) for f in EXCHANGE_FIELDS}
                # A column decoded once per member (and sources): steps sharing members share the arrays.
                key = ("group", id(z["group"]))
                if key not in decoded:
                    decoded[key] = _undeltas(z["group"], p)
                z["group"] = decoded[key]
                if "sources" in st:
                    key = ("src_off", id(z["src_off"]), id(z["src_tile"]), repr(st["sources"]))
                    if key not in decoded:     # (equal columns are one array, as lowering pooled them)
                        decoded[key] = pool(_relocated(z["src_off"], z["src_tile"], st["sources"], arrays.get("addr"),
                                                       p, (len(index["buffers"]), index["tiles"])))
                    z["src_off"] = decoded[key]
                steps.append(Exchange(st["name"], exchange_table(**z)))
        io_refs = index.get("io_arrays") or {}
        io_maps = {}
        for n in index["io"]:
            refs = io_refs.get(n) or {}
            members = [refs.get(k, f"io:{n}:{k}") for k in ("tile", "start", "stop", "offset")]
            for k, m in zip(("tile", "start", "stop", "offset"), members):
                if not isinstance(m, str) or m not in arrays:
                    raise TileplanError(f"program.json: the tile program's host map of {n!r} lacks its {k} array in program.npz")
            io_maps[n] = tuple(arrays[m] for m in members)
        for k in ("addr", "size"):
            if k not in arrays:
                raise TileplanError(f"program.npz: no {k} array (the tile program's buffer table)")
        return cls(index["tiles"], [BufferInfo(**b) for b in index["buffers"]], arrays["addr"], arrays["size"],
                   steps, io_maps, list(index.get("passes", [])))


EXCHANGE_FIELDS = ("group", "src_tile", "src_off", "dst_tile", "dst_off", "nbytes")


def _deltas(group: np.ndarray) -> np.ndarray:
    """A transfer table's group column as stored: each id minus the one before (the first as is)."""
    g = np.asarray(group)
    return np.diff(g, prepend=g.dtype.type(0)) if g.size else g


def _undeltas(stored, where: str) -> np.ndarray:
    """The group column of ``_deltas``' form (int32 when its ids fit, as lowering made it)."""
    d = np.asarray(stored)
    if d.dtype.kind not in "iu" or d.ndim != 1:
        raise TileplanError(f"program.npz: {where}_group is not a 1-D integer array")
    return _narrow(np.cumsum(d, dtype=np.int64), np.int32)


def _relocated(rel, src_tile, sources, addr, where: str, shape: tuple) -> np.ndarray:
    """An exchange's absolute source addresses from ``src_rel`` and its sources (``[rows, buffer]``
    in table order): ``addr[buffer, src_tile] + src_rel``. A table that does not add up is a
    ``TileplanError`` naming the step."""
    rel, tiles = np.asarray(rel), np.asarray(src_tile)
    if addr is None:
        raise TileplanError("program.npz: no addr array (the tile program's buffer table)")
    if np.shape(addr) != tuple(shape) or np.asarray(addr).dtype.kind not in "iu":
        raise TileplanError(f"program.npz: addr has shape {list(np.shape(addr))}, expected [{shape[0]}, {shape[1]}] "
                            f"(buffers x tiles) of integers")
    if rel.dtype.kind not in "iu" or tiles.dtype.kind not in "iu" or rel.ndim != 1 or rel.shape != tiles.shape:
        raise TileplanError(f"program.npz: {where}: src_off and src_tile are not integer columns of one length")
    if not isinstance(sources, list) or not all(
            isinstance(x, list) and len(x) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in x)
            for x in sources):
        raise TileplanError(f"program.json: {where}: sources is not a list of [rows, buffer] pairs")
    rows = [n for n, _ in sources]
    bufs = np.array([b for _, b in sources], dtype=np.int64)
    if any(n <= 0 for n in rows) or sum(rows) != rel.size:
        raise TileplanError(f"program.json: {where}: sources count {sum(rows)} rows, the table has {rel.size}")
    nbuf, ntiles = np.shape(addr)
    if ((bufs < 0) | (bufs >= nbuf)).any():
        raise TileplanError(f"program.json: {where}: a source buffer outside [0, {nbuf})")
    if tiles.size and (tiles.min() < 0 or tiles.max() >= ntiles):
        raise TileplanError(f"program.npz: {where}_src_tile: a tile outside [0, {ntiles})")
    buf = np.repeat(bufs, rows)
    return _narrow(np.asarray(addr, dtype=np.int64)[buf, tiles.astype(np.int64)] + rel.astype(np.int64), np.int32)


def exchange_table(group, src_tile, src_off, dst_tile, dst_off, nbytes) -> Transfers:
    """A tile program's transfer table (absolute addresses; the buffer columns are zero, shared)."""
    zeros = np.broadcast_to(np.int32(0), np.shape(group))
    return Transfers(group, src_tile, zeros, src_off, dst_tile, zeros, dst_off, nbytes)


class ArrayPool:
    """Equal tables become one array: ``pool(a)`` returns the first array seen with ``a``'s dtype, shape
    and bytes (read-only), or ``a`` itself. What lets a tower's repeated layers share their tables."""

    SAMPLE = 256            # elements of an array its first key hashes (all of a smaller one)

    def __init__(self):
        # (dtype, shape, sample digest) -> the first array of the key (large: None once it has two)
        self._first: dict[tuple, np.ndarray | None] = {}
        self._seen: dict[tuple, np.ndarray] = {}     # (that key, digest of all bytes) -> the first array
        self._pooled: dict[int, np.ndarray] = {}     # id -> an array the pool holds (asked again: no hash)
        self.hits = self.bytes_saved = 0

    def __call__(self, a: np.ndarray, dtype=None) -> np.ndarray:
        a = np.ascontiguousarray(a if dtype is None else _narrow(a, dtype))
        if self._pooled.get(id(a)) is a:
            self.hits += 1
            self.bytes_saved += a.nbytes
            return a
        got = self._equal(a)
        if got is not None:
            self.hits += 1
            self.bytes_saved += a.nbytes
            return got
        a.flags.writeable = False
        self._pooled[id(a)] = a
        return a

    def _equal(self, a: np.ndarray) -> np.ndarray | None:
        """The first array seen with ``a``'s dtype, shape and bytes, or None (``a`` is then seen).

        Design decision: the first key hashes a sample of the elements (all of a small array), and
        all the bytes of a large one are hashed only once a second array has its key: a tower's
        exchange columns that no other step shares (a layer's weights elsewhere) are millions of
        rows each, hashed for nothing otherwise."""
        flat = a.reshape(-1)
        whole = flat.size <= self.SAMPLE
        sample = flat if whole else np.concatenate((flat[::flat.size // self.SAMPLE], flat[-1:]))
        key = (a.dtype.str, a.shape, hashlib.blake2b(np.ascontiguousarray(sample).data, digest_size=16).digest())
        if key not in self._first:
            self._first[key] = a
            return None
        if whole:
            return self._first[key]
        first = self._first[key]
        if first is not None:           # the key's second array: the first one's bytes hashed now
            self._seen[(key, hashlib.blake2b(first.data, digest_size=16).digest())] = first
            self._first[key] = None
        full = (key, hashlib.blake2b(a.data, digest_size=16).digest())
        got = self._seen.get(full)
        if got is None:
            self._seen[full] = a
        return got

    def transfers(self, tr: Transfers) -> Transfers:
        """A transfer table with int32 columns, each column pooled."""
        return exchange_table(*(self(getattr(tr, f), np.int32) for f in EXCHANGE_FIELDS))


class Placement:
    """Exchange tables from their copies' buffer-relative rows (``Exchange.parts``), at absolute
    addresses (the table ``absolute`` makes of their concatenation, each column pooled as
    ``ArrayPool.transfers`` pools it), with the table's ``Exchange.origin``. Each column is made and
    pooled once per what it depends on: the transfer ids, tiles and byte counts on the copies' rows
    only, the source (destination) addresses also on where each copy's source (destination) buffer
    sits on every tile. A tower's layers place the same rows between buffers at the same addresses
    (activations) or elsewhere (their weights): the columns they share are neither rebuilt nor
    hashed again, and are the very arrays the pool would return (the first it saw with their content).

    The origin says that each copy's rows read only its source buffer's bytes (what host emission
    relies on to replay a repeated exchange once): checked once per rows and source buffer sizes;
    an exchange with a copy that reads past its source has no origin (replayed in full)."""

    def __init__(self, pool: ArrayPool, numbers: RowNumbers, addr: np.ndarray, size: np.ndarray):
        self.pool, self.numbers, self.addr, self.size = pool, numbers, addr, size
        self._columns: dict[tuple, np.ndarray] = {}
        self._inside: dict[tuple, bool] = {}
        self._rows_of: dict[tuple, int] = {}          # (array, buffer) -> number of that row of it
        self._row_numbers: dict[bytes, int] = {}

    def _row(self, a: np.ndarray, b: int) -> int:
        """A number for ``a[b]`` (``addr`` or ``size``: where buffer ``b`` sits, or how much of it, on
        every tile): equal numbers, equal rows."""
        key = (id(a), b)
        got = self._rows_of.get(key)
        if got is None:
            digest = (hashlib.blake2b(np.ascontiguousarray(a[b]).data, digest_size=16).digest()
                      + (b"a" if a is self.addr else b"s"))
            got = self._rows_of[key] = self._row_numbers.setdefault(digest, len(self._row_numbers))
        return got

    def __call__(self, parts) -> tuple[Transfers, tuple | None, tuple]:
        """(the table, its ``Exchange.origin``, its ``Exchange.sources``)."""
        parts = [(rows, int(sid), int(did)) for rows, sid, did in parts if len(rows)]
        origin = self.numbers.origin(parts)
        rows_key = tuple(n for n, _, _ in origin)
        cols = []
        for f in EXCHANGE_FIELDS:
            key = (f, rows_key)
            if f in ("src_off", "dst_off"):
                key += (tuple(self._row(self.addr, p[1 if f == "src_off" else 2]) for p in parts),)
            got = self._columns.get(key)
            if got is None:
                got = self._columns[key] = self.pool(self._column(f, parts), np.int32)
            cols.append(got)
        inside = all(self._reads_inside(n, rows, sid) for (n, _, _), (rows, sid, _) in zip(origin, parts))
        key = ("src_rel", rows_key)
        rel = self._columns.get(key)
        if rel is None:
            rel = self._columns[key] = self.pool(self._column("src_rel", parts), np.int32)
        sources = (rel, tuple((len(rows), sid) for rows, sid, _ in parts))
        return exchange_table(*cols), (origin if inside else None), sources

    def _reads_inside(self, number: int, rows: Transfers, sid: int) -> bool:
        key = (number, self._row(self.size, sid))
        got = self._inside.get(key)
        if got is None:
            end = self.size[sid, rows.src_tile]
            got = self._inside[key] = bool(((rows.src_off >= 0) & (rows.src_off + rows.nbytes <= end)).all())
        return got

    def _column(self, f: str, parts) -> np.ndarray:
        if not parts:
            return np.zeros(0, np.int64)
        if f == "group":                # ``Transfers.concat``: each copy's ids after the ones before
            out, base = [], 0
            for rows, _, _ in parts:
                out.append(rows.group + base)
                base += int(rows.group.max()) + 1
            return np.concatenate(out)
        if f == "src_rel":               # the source offsets relative to each copy's source buffer
            return np.concatenate([rows.src_off for rows, _, _ in parts])
        if f in ("src_off", "dst_off"):  # ``absolute``
            tile = "src_tile" if f == "src_off" else "dst_tile"
            return np.concatenate([self.addr[sid if f == "src_off" else did, getattr(rows, tile)] + getattr(rows, f)
                                   for rows, sid, did in parts])
        return np.concatenate([getattr(rows, f) for rows, _, _ in parts])


def _narrow(a: np.ndarray, dtype) -> np.ndarray:
    """``a`` as ``dtype`` when every value fits (else unchanged)."""
    a = np.asarray(a)
    if a.dtype == dtype or a.size == 0:
        return a.astype(dtype, copy=False)
    info = np.iinfo(dtype)
    if a.min() >= info.min and a.max() <= info.max:
        return a.astype(dtype)
    return a


def deterministic_npz(arrays: dict[str, np.ndarray]) -> bytes:
    """An npz (a zip of ``.npy`` members, deflated) with fixed timestamps and members in name order,
    so equal arrays give equal bytes. Each member is compressed once, straight from its ``.npy`` bytes
    (what ``np.load`` reads; the same bytes ``np.savez`` would store)."""
    import zipfile
    members = {}
    for key, value in arrays.items():
        npy = io.BytesIO()
        np.lib.format.write_array(npy, np.asanyarray(value), allow_pickle=True, pickle_kwargs=None)
        members[key + ".npy"] = npy.getvalue()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for name in sorted(members):
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            dst.writestr(info, members[name])
    return out.getvalue()


def call_to_json(call) -> dict:
    from dataclasses import fields
    d = {"primitive": call.primitive}
    for f in fields(call):
        v = getattr(call, f.name)
        d[f.name] = v.value if hasattr(v, "value") and not isinstance(v, (int, str)) else v
    return d


def call_from_json(d: dict):
    from dataclasses import fields
    from ..graph.dtypes import DType
    from ..kernels import CALL_CLASSES
    classes = {cls.primitive: cls for cls in CALL_CLASSES}
    cls = classes.get(d.get("primitive"))
    if cls is None:
        raise TileplanError(f"unknown kernel primitive {d.get('primitive')!r} in the tile program")
    kw = {}
    for f in fields(cls):
        if f.name not in d:
            raise TileplanError(f"the {cls.primitive} call in the tile program lacks its field {f.name!r}")
        v = d[f.name]
        if "DType" in str(f.type):
            if v is None and "None" in str(f.type):
                kw[f.name] = None
                continue
            try:
                kw[f.name] = DType(v)
            except (ValueError, TypeError):
                raise TileplanError(f"the {cls.primitive} call's {f.name} is {str(v)[:40]!r}, not an element "
                                    "type") from None
            continue
        want = _FIELD_TYPES.get(str(f.type))
        if want is not None and (not isinstance(v, want) or (isinstance(v, bool) and bool not in want)):
            raise TileplanError(f"the {cls.primitive} call's {f.name} is {str(v)[:40]!r}, not of type {f.type}")
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > 1 << 40:
            raise TileplanError(f"the {cls.primitive} call's {f.name} is {v}, out of range")
        kw[f.name] = v
    extra = set(d) - {f.name for f in fields(cls)} - {"primitive"}
    if extra:
        raise TileplanError(f"the {cls.primitive} call has unknown fields {sorted(extra)[:4]}")
    return cls(**kw)


_FIELD_TYPES = {"int": (int,), "bool": (bool,), "str": (str,), "float": (int, float)}
