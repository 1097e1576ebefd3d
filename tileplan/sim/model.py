"""The IPU model: executes a ``TileProgram`` on all tiles' SRAM as one numpy array.

Memory is ``uint8 [tiles, sram_bytes]``. The host writes inputs and parameters
through their layouts (owner maps); each step then runs:

- a compute set: every vertex group's kernel semantics (the variant's numpy
  ``reference``) on views of tile memory, batched over the group's tiles;
- an exchange: vectorised byte copies between tiles.

Every access is checked: an operand or transfer outside the tile's memory or
inside the reserve; two writers of one byte in a compute set or an exchange;
a read of a byte that another vertex writes in the same compute set; an
exchange that writes a byte it also reads. Cycles come from the actual program:
a compute set lasts as long as its slowest tile (the sum of the cycles of the
vertices on it), an exchange as long as its slowest tile's max(send, receive)
under ``estimate.exchange``'s model, plus one sync.

What a step's checks and cycles find depends on its tables only. A tower's
repeated layers share most of theirs (``lowering.tile_program.ArrayPool``: one
array per distinct table, also when loaded from a package), so the checks and
the cycle count run once per distinct table and are reused for every step that
holds the same arrays; the data still moves at every step.

A compute set's GEMM vertices run as one batched ``np.matmul`` of small
matrices (81 x 128 x 64 on the SigLIP tower); BLAS's thread pool only adds
overhead at that size (about 30x on a busy two-core machine, measured), so a
run uses one BLAS thread (``single_blas_thread``).
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field

import numpy as np

from ..errors import TileplanError
from ..estimate.exchange import link_bytes, phase_cycles, phase_sync, tile_exchange_cycles
from ..graph.dtypes import DType
from ..kernels import default_registry
from ..layout.panels import from_panel_major, to_panel_major
from ..lowering.tile_program import EXCHANGE_FIELDS, ComputeSet, Exchange, TileProgram

CHUNK_BYTES = 32 << 20        # bytes gathered at once when executing a step


class SimError(TileplanError):
    """The program did something the hardware would not allow (a conflict, an access out of bounds)."""


@dataclass
class StepProfile:
    name: str
    kind: str                   # "compute" | "exchange"
    cycles: int                 # slowest tile (exchange: without the sync)
    sync: int
    tile_cycles: np.ndarray     # int64 [tiles]
    bytes: int = 0


@dataclass
class Profile:
    steps: list[StepProfile] = field(default_factory=list)
    memory_peak: np.ndarray | None = None     # int64 [tiles]: most bytes live at once (buffers in use)

    @property
    def compute(self) -> int:
        return sum(s.cycles for s in self.steps if s.kind == "compute")

    @property
    def exchange(self) -> int:
        return sum(s.cycles for s in self.steps if s.kind == "exchange")

    @property
    def sync(self) -> int:
        return sum(s.sync for s in self.steps)

    @property
    def cycles(self) -> int:
        return self.compute + self.exchange + self.sync


class IPUModel:
    def __init__(self, program: TileProgram, target, registry=None):
        self.program, self.target = program, target
        self.registry = registry or default_registry()
        try:
            self.mem = np.zeros((program.tiles, target.sram_bytes), dtype=np.uint8)
        except (MemoryError, ValueError):
            raise SimError(f"the IPU model of target {target.name!r} needs {program.tiles:,} x "
                           f"{target.sram_bytes:,} bytes of tile memory, more than this machine can allocate") from None
        self._checked: dict[tuple, tuple] = {}   # ids of a step's tables -> (the tables, kept alive; per-tile cycles)
        self.high = np.zeros(program.tiles, dtype=np.int64)
        used = program.addr >= 0
        if used.any():
            top = np.where(used, program.addr + program.size, 0).max(axis=0)
            self.high = top.astype(np.int64)
            bad = (program.addr[used] < target.reserve_bytes).any() or top.max() > target.sram_bytes
            if bad:
                raise SimError("the allocation places a buffer in the reserve or past the end of tile memory")

    # ---- host I/O through layouts --------------------------------------------------------

    def _io(self, name: str):
        if name not in self.program.io_maps:
            raise TileplanError(f"buffer {name!r} is not a host input, parameter or output of the package")
        b = self.program.buffers[self.program.buffer_index(name)]
        return b, self.program.io_maps[name], self.program.buffer_index(name)

    def write(self, name: str, stored: np.ndarray) -> None:
        """Write a tensor's stored values (already in its dtype) through its layout."""
        b, (tile, start, stop, offset), bi = self._io(name)
        item = DType(b.dtype).itemsize
        flat = to_index_space(np.ascontiguousarray(stored).reshape(b.shape), b.space).reshape(-1).view(np.uint8)
        mem_at, values_at, n = self._io_runs(bi, item, tile, start, stop, offset)
        _copy_runs(self.mem.reshape(-1), mem_at, flat, values_at, n)

    def read(self, name: str) -> np.ndarray:
        """A tensor's stored values read back through its layout (flat, the buffer's dtype)."""
        b, (tile, start, stop, offset), bi = self._io(name)
        dt = DType(b.dtype)
        item = dt.itemsize
        size = int(np.prod(b.shape))
        out = np.zeros(size * item, dtype=np.uint8)
        mem_at, values_at, n = self._io_runs(bi, item, tile, start, stop, offset)
        if n.sum() == out.size:
            _copy_runs(out, values_at, self.mem.reshape(-1), mem_at, n)
        else:                                # replicas: the last interval holding a byte gives it
            for t, s, e, o in zip(tile.tolist(), start.tolist(), stop.tolist(), offset.tolist()):
                a = int(self.program.addr[bi, t]) + o * item
                out[s * item:e * item] = self.mem[t, a:a + (e - s) * item]
        return from_index_space(out.view(dt.numpy).reshape(b.shape), b.space).reshape(-1)

    def _io_runs(self, bi: int, item: int, tile, start, stop, offset):
        """(flat tile-memory byte, tensor byte, bytes) of each owner-map interval of a host buffer."""
        tile, start, stop, offset = (np.asarray(x, dtype=np.int64) for x in (tile, start, stop, offset))
        mem_at = tile * self.mem.shape[1] + self.program.addr[bi, tile] + offset * item
        return mem_at, start * item, (stop - start) * item

    # ---- execution -------------------------------------------------------------------------

    def run(self) -> Profile:
        prof = Profile()
        with single_blas_thread():
            for i, step in enumerate(self.program.steps):
                if isinstance(step, ComputeSet):
                    prof.steps.append(self._compute(step))
                else:
                    prof.steps.append(self._exchange(step))
        prof.memory_peak = self._live_peak()
        return prof

    def run_pipelined(self, places: list[tuple[str, int]], stages: int, micro_batches: int, feed, collect) -> Profile:
        """Run the program once per micro-batch in the pipelined schedule of ``planner.pipeline``: in slot
        ``t`` the link-phase steps into every stage ``s`` that works in the slot (``places``: each step's
        ``("own" | "link", stage)``), then ``feed(j, s)`` (the host writes micro-batch ``j``'s inputs
        on stage ``s``'s IPU), then every working stage's own steps, then ``collect(j, s)`` (the host
        reads what stage ``s`` finished for micro-batch ``j``). Stage ``s`` works on micro-batch
        ``t - s``.

        Design decision: the stages run one after the other here, which computes what running them
        at once computes: each stage's own steps touch its IPU's tiles only (``planner.pipeline.place``
        refuses a program where they do not), and the link phase, which reads the stage before's
        results, runs before any stage computes. Every step's accesses are checked as in ``run``;
        the profile holds the first micro-batch's run of each step (a step's cycles depend on its
        tables only, the same in every micro-batch)."""
        steps: list = [None] * len(self.program.steps)
        by_place: dict = {}
        for i, pl in enumerate(places):
            by_place.setdefault(pl, []).append(i)
        with single_blas_thread():
            for t in range(micro_batches + stages - 1):
                active = [s for s in range(stages) if 0 <= t - s < micro_batches]
                for phase in ("link", "own"):
                    if phase == "own":
                        for s in active:
                            feed(t - s, s)
                    for s in active:
                        for i in by_place.get((phase, s), ()):
                            st = self.program.steps[i]
                            got = self._compute(st) if isinstance(st, ComputeSet) else self._exchange(st)
                            if steps[i] is None:
                                steps[i] = got
                for s in active:
                    collect(t - s, s)
        prof = Profile([st for st in steps if st is not None])
        prof.memory_peak = self._live_peak()
        return prof

    def _live_peak(self) -> np.ndarray:
        """Per tile, the most bytes live at once (``live_bytes`` summed over the buffers)."""
        return live_bytes(self.program).max(axis=0)

    def _bounds(self, tiles, addr, nbytes, what: str) -> None:
        lo = self.target.reserve_bytes
        bad = (addr < lo) | (addr + nbytes > self.target.sram_bytes)
        if np.any(bad):
            i = int(np.argmax(bad))
            raise SimError(f"{what}: tile {int(tiles[i])} accesses bytes [{int(addr[i])}, {int(addr[i] + nbytes[i])}) "
                           f"outside its usable memory [{lo}, {self.target.sram_bytes})")

    def _compute(self, cs: ComputeSet) -> StepProfile:
        key = ("compute",) + tuple((id(g.tile), id(g.ins), id(g.outs), g.in_bytes, g.out_bytes, g.cycles)
                                   for g in cs.groups)
        if key not in self._checked:
            self._checked[key] = (cs.groups, self._check_compute(cs))
        per_tile = self._checked[key][1]
        for g in cs.groups:
            self._run_group(g)
        return StepProfile(cs.name, "compute", int(per_tile.max(initial=0)), 0, per_tile)

    def _check_compute(self, cs: ComputeSet) -> np.ndarray:
        """Bounds and conflicts of a compute set's operands; its cycles per tile."""
        from ..lowering.check import check_variant
        tiles = self.program.tiles
        per_tile = np.zeros(tiles, dtype=np.int64)
        acc = []   # (tile, lo, hi, vertex id, is_write)
        vid = 0
        for g in cs.groups:
            # the vertex's kernel runs on this target (what load_package checks, for any program)
            check_variant(g, self.target, self.registry, f"{cs.name}: vertex group {g.variant}")
            n = len(g.tile)
            ids = np.arange(vid, vid + n)
            vid += n
            np.add.at(per_tile, g.tile, g.cycles)
            for j, nb in enumerate(g.in_bytes):
                self._bounds(g.tile, g.ins[:, j], np.full(n, nb), f"{cs.name}: {g.variant} input {j}")
                acc.append((g.tile, g.ins[:, j], g.ins[:, j] + nb, ids, np.zeros(n, bool)))
            for j, nb in enumerate(g.out_bytes):
                self._bounds(g.tile, g.outs[:, j], np.full(n, nb), f"{cs.name}: {g.variant} output {j}")
                acc.append((g.tile, g.outs[:, j], g.outs[:, j] + nb, ids, np.ones(n, bool)))
        if acc:
            _check_conflicts(cs.name, *(np.concatenate(c) for c in zip(*acc)))
        return per_tile

    def _run_group(self, g) -> None:
        if g.variant not in self.registry:
            raise SimError(f"the package uses kernel variant {g.variant!r}, which this registry lacks")
        variant = self.registry[g.variant]
        in_types, out_types = operand_types(g.call)
        per_vertex = sum(g.in_bytes) + sum(g.out_bytes)
        step = max(1, CHUNK_BYTES // 8 // max(per_vertex, 1))     # its gathers index 8 bytes per byte
        flat = self.mem.reshape(-1)
        row = self.mem.shape[1]
        for c0 in range(0, len(g.tile), step):
            sl = slice(c0, c0 + step)
            tiles = g.tile[sl]
            base = tiles.astype(np.int64) * row
            ins = []
            for j, nb in enumerate(g.in_bytes):
                # Every vertex's operand bytes at once: one row gather of [vertices, nb] bytes.
                raw = _runs(flat, nb)[base + g.ins[sl, j]]
                ins.append(raw.view(in_types[j].numpy))
            try:
                out = variant.reference(g.call, *ins)
            except (ValueError, TypeError, IndexError) as exc:   # a package edited so operands and call disagree
                raise SimError(f"{g.variant}: its operands ({list(g.in_bytes)} bytes) do not fit its call "
                               f"{g.call} ({type(exc).__name__}: {str(exc)[:120]})") from None
            outs = out if isinstance(out, tuple) else (out,)
            for j, nb in enumerate(g.out_bytes):
                arr = np.ascontiguousarray(np.asarray(outs[j]).astype(out_types[j].numpy, copy=False))
                raw = arr.reshape(len(tiles), -1).view(np.uint8)
                if raw.shape[1] != nb:
                    raise SimError(f"{g.variant}: wrote {raw.shape[1]} bytes per vertex, expected {nb}")
                # Output runs of one compute set never overlap (``_check_conflicts``): one row scatter.
                _runs(flat, nb)[base + g.outs[sl, j]] = raw

    def _exchange(self, ex: Exchange) -> StepProfile:
        tr = ex.transfers
        n = len(tr)
        key = ("exchange",) + tuple(id(getattr(tr, f)) for f in EXCHANGE_FIELDS)
        if key not in self._checked:
            self._checked[key] = (tr, self._check_exchange(ex))
        per_tile, cycles, sync = self._checked[key][1]
        _move_bytes(self.mem, tr.src_tile, tr.src_off, tr.dst_tile, tr.dst_off, tr.nbytes)
        return StepProfile(ex.name, "exchange", cycles, sync, per_tile, int(tr.nbytes.sum()))

    def _check_exchange(self, ex: Exchange) -> tuple[np.ndarray, int, int]:
        """Bounds and conflicts of an exchange's transfers; its cycles per tile, the phase's cycles
        (its slowest tile, or on several IPUs its links) and its sync, by the one exchange model."""
        tr = ex.transfers
        tiles = self.program.tiles
        self._bounds(tr.src_tile, tr.src_off, tr.nbytes, f"{ex.name}: transfer source")
        self._bounds(tr.dst_tile, tr.dst_off, tr.nbytes, f"{ex.name}: transfer destination")
        n = len(tr)
        # Writers of one byte, and writes over bytes the exchange reads.
        first = np.ones(n, dtype=bool)
        first[1:] = tr.group[1:] != tr.group[:-1]
        src_rows = np.flatnonzero(first)
        tile = np.concatenate([tr.dst_tile, tr.src_tile[src_rows]])
        lo = np.concatenate([tr.dst_off, tr.src_off[src_rows]])
        hi = lo + np.concatenate([tr.nbytes, tr.nbytes[src_rows]])
        vid = np.concatenate([np.arange(n), n + np.arange(src_rows.size)])
        write = np.concatenate([np.ones(n, bool), np.zeros(src_rows.size, bool)])
        _check_conflicts(ex.name, tile, lo, hi, vid, write)
        send, recv = tile_exchange_cycles(tr, self.target, tiles)
        pairs = link_bytes(tr, self.target)
        return np.maximum(send, recv), phase_cycles(send, recv, pairs, self.target), \
            phase_sync(n > 0, pairs, self.target)


@contextlib.contextmanager
def single_blas_thread():
    """numpy's OpenBLAS limited to one thread inside the block (nothing where it is not OpenBLAS)."""
    fns = _openblas_threads()
    if fns is None:
        yield
        return
    get, set_ = fns
    before = get()
    set_(1)
    try:
        yield
    finally:
        set_(before)


@functools.lru_cache(maxsize=1)
def _openblas_threads():
    """(get, set) of the number of threads of the OpenBLAS numpy loaded, or None."""
    import ctypes
    try:
        with open("/proc/self/maps") as f:
            paths = sorted({line.split()[-1] for line in f if "openblas" in line.lower() and ".so" in line})
    except OSError:
        return None
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix, suffix in (("scipy_openblas", "64_"), ("openblas", "64_"), ("openblas", "")):
            get, set_ = (getattr(lib, f"{prefix}_{w}_num_threads{suffix}", None) for w in ("get", "set"))
            if get is not None and set_ is not None:
                get.restype, set_.argtypes = ctypes.c_int, [ctypes.c_int]
                return get, set_
    return None


def live_bytes(tp: TileProgram, group=None, groups: int = 1) -> np.ndarray:
    """int64 [steps, tiles] (or [groups, steps, tiles] when ``group`` maps each buffer index to a group
    in ``range(groups)``): the bytes live on each tile at each step of the program. A buffer is live
    over its span (the whole program when it has none); aliases count once, on their root, over the
    union of their spans."""
    nsteps = max(len(tp.steps), 1)
    names = [b.name for b in tp.buffers]
    root = np.array([names.index(b.alias_of) if b.alias_of else i for i, b in enumerate(tp.buffers)], dtype=np.int64)
    nb = len(names)
    lo = np.full(nb, nsteps, dtype=np.int64)
    hi = np.full(nb, -1, dtype=np.int64)
    for i, b in enumerate(tp.buffers):
        a, e = b.span if b.span is not None else (0, nsteps - 1)
        lo[root[i]] = min(lo[root[i]], a)
        hi[root[i]] = max(hi[root[i]], e)
    size = np.zeros((nb, tp.tiles), dtype=np.int64)
    if nb:
        np.maximum.at(size, root, tp.size)
    gid = np.zeros(nb, dtype=np.int64) if group is None else np.asarray(group, dtype=np.int64)
    live = np.zeros((groups if group is not None else 1, nsteps + 1, tp.tiles), dtype=np.int64)
    for r in np.flatnonzero(hi >= lo):
        live[gid[r], lo[r]] += size[r]
        live[gid[r], hi[r] + 1] -= size[r]
    out = np.cumsum(live, axis=1)[:, :-1]
    return out[0] if group is None else out


def _move_bytes(mem: np.ndarray, src_tile, src_off, dst_tile, dst_off, nbytes) -> None:
    """Copy ``nbytes[i]`` bytes from ``mem[src_tile[i], src_off[i]:]`` to ``mem[dst_tile[i], dst_off[i]:]``
    for every row (no row reads what another writes: the caller checked)."""
    flat = mem.reshape(-1)                       # a view: tile memory is one C-contiguous array
    width = mem.shape[1]
    src = np.asarray(src_tile, dtype=np.int64) * width + src_off
    dst = np.asarray(dst_tile, dtype=np.int64) * width + dst_off
    _copy_runs(flat, dst, flat, src, nbytes)


def _runs(flat: np.ndarray, nbytes: int) -> np.ndarray:
    """Every run of ``nbytes`` bytes of the 1-D byte array ``flat``, as a writeable strided view
    ``[flat.size - nbytes + 1, nbytes]`` (row ``i`` is ``flat[i:i + nbytes]``; no copy). Indexing
    its rows with an array of start offsets gathers or scatters whole runs, one ``memcpy`` each:
    about 30x faster than indexing every byte (measured: 1472 x 6 runs of 10 KB)."""
    return np.lib.stride_tricks.as_strided(flat, shape=(flat.size - nbytes + 1, nbytes),
                                           strides=(flat.strides[0],) * 2, writeable=True)


def _copy_runs(dst: np.ndarray, dst_at, src: np.ndarray, src_at, nbytes) -> None:
    """``dst[dst_at[i]:][:nbytes[i]] = src[src_at[i]:][:nbytes[i]]`` for every row (1-D byte arrays; runs
    neither overlap nor read what another writes). Runs of one length move together as rows of
    ``_runs`` views (the gather is a copy, so ``dst`` may be ``src``), ``CHUNK_BYTES`` at a time."""
    n = np.asarray(nbytes, dtype=np.int64)
    dst_at, src_at = np.asarray(dst_at, dtype=np.int64), np.asarray(src_at, dtype=np.int64)
    rows = np.flatnonzero(n > 0)
    if not rows.size:
        return
    order = rows[np.argsort(n[rows], kind="stable")]
    lengths = n[order]
    cuts = np.flatnonzero(np.diff(lengths)) + 1
    for r in np.split(order, cuts):            # rows of one length: one row gather and scatter each
        c = int(n[r[0]])
        d, s = _runs(dst, c), _runs(src, c)
        step = max(1, CHUNK_BYTES // c)
        for c0 in range(0, r.size, step):
            rr = r[c0:c0 + step]
            d[dst_at[rr]] = s[src_at[rr]]


def _check_conflicts(where: str, tile, lo, hi, vid, write) -> None:
    """Raise if a byte has two writers, or is read by one access and written by another."""
    keep = hi > lo
    tile, lo, hi, vid, write = tile[keep], lo[keep], hi[keep], vid[keep], write[keep]
    if tile.size == 0:
        return
    order = np.lexsort((lo, tile))
    t, l, h, v, w = tile[order], lo[order], hi[order], vid[order], write[order]
    # Running maximum of earlier ends on the same tile, and who owns it.
    key = t.astype(np.int64) * (1 << 40)
    ends = key + h
    run = np.maximum.accumulate(ends)
    prev_end = np.concatenate(([np.iinfo(np.int64).min], run[:-1])) - key
    overlap = prev_end > l
    if not overlap.any():
        return
    # Some interval overlaps an earlier one: inspect those pairs exactly (few in a correct program).
    for i in np.flatnonzero(overlap).tolist():
        j = i - 1
        while j >= 0 and t[j] == t[i]:
            if h[j] > l[i] and v[j] != v[i] and (w[i] or w[j]):
                what = "two writers of one byte" if (w[i] and w[j]) else "a read of a byte written in the same step"
                raise SimError(f"{where}: {what} on tile {int(t[i])} at bytes [{int(max(l[i], l[j]))}, "
                               f"{int(min(h[i], h[j]))})")
            if h[j] <= l[i] and run[j] - key[j] <= l[i]:
                break
            j -= 1


def to_index_space(values: np.ndarray, space: str) -> np.ndarray:
    """A tensor's values in its buffer's index order: row-major, or panel-major for ``panels<g>``
    (``layout.panels``; the last panel may be partial)."""
    if not space.startswith("panels"):
        return np.ascontiguousarray(values).reshape(-1)
    return to_panel_major(values, int(space[len("panels"):]))


def from_index_space(flat: np.ndarray, space: str, shape=None) -> np.ndarray:
    """The inverse of ``to_index_space``: values back in row-major order (``flat`` shaped like the tensor)."""
    if not space.startswith("panels"):
        return flat
    n = flat.shape[-1]
    return from_panel_major(flat, flat.size // n, n, int(space[len("panels"):])).reshape(flat.shape)


def operand_types(call) -> tuple[list, list]:
    """Element types of a call's inputs and outputs, in field order (each call says its own)."""
    return call.operand_types()
