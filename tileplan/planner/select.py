"""Whole-graph selection: pick one candidate per op, fewest cycles within tile memory.

The problem (``Problem``) is solver-neutral: ops in a fixed order; per op its
candidates, each with the layouts it needs for its activation inputs, the
layout it gives its output, its cycles and its transient per-tile bytes;
tensors with a fixed layout (host inputs, parameters read as values); a
conversion price for every (tensor, from, to), paid once per tensor and target
layout: the converted copy stays live to the tensor's last use and later
readers of that layout read it (as ``MidGraph.build`` reuses it); per-tile bytes of every
(tensor, layout); resident bytes per tile; the capacity.

Memory at op i, per tile: resident + every live tensor in its layout + the
converted copies op i reads + op i's transients + its output + the storage
every op's chosen candidate holds over the whole program (``Choice.resident``:
a GEMM's weights, compact or pre-arranged as its candidate reads them). A
tensor is live from its production (or the start) to its last use (outputs:
the end). A path's peak is the largest such total over ops, worst tile.
The interleaved region is checked on its own (``interleaved_capacity``): its
resident parameters + every choice's resident storage (weights live there) +
op i's interleaved transients, at every op, every tile.

Solvers:
- ``solve_dp``: a DP over the op order whose state is the layouts of the live
  values some later op reads (a graph output no later op reads is retired from
  the state: each path carries its bytes per tile), keeping per state at most ``paths`` (cycles, peak) Pareto paths
  (dominance pruning: the fastest, the one with the least peak and, when choices
  hold storage over the whole program, the one holding the least); exact when
  ``paths`` is None (unbounded). Repeated blocks of ops (``Problem.blocks``: a
  tower's layers) are searched once and composed (``_Search``).
- ``solve_exhaustive``: the oracle for tests (every combination).
- ``planner.cpsat.solve_cpsat``: the same problem as a CP-SAT model.

The ``Fused`` layout marks a value that was never stored because its producer
fused with its consumer; it converts to nothing else.
"""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..errors import TileplanError
from ..layout import Stored

INF = float("inf")


@dataclass(frozen=True)
class Fused:
    """The layout marker of a value that was never stored: its producer fused with its consumer,
    which finds its own output already written in ``layout``. It converts to nothing else."""

    layout: Any
    via: str = ""                 # which fusion chain (``elementwise.chain_tag``): "" for a single fused pair

    def __str__(self) -> str:
        return f"Fused({self.layout}{', ' + self.via if self.via else ''})"


@dataclass(frozen=True)
class Choice:
    """One candidate as the selection sees it."""

    ins: tuple[Any, ...]          # required layout per activation input (same order as Problem.inputs[op])
    out: Any                      # layout of the output
    cycles: int
    transient: np.ndarray         # int64 [tiles] bytes the op needs besides its boundary values
    label: str = ""
    resident: np.ndarray | None = None     # int64 [tiles] storage it holds over the whole program (interleaved)
    interleaved: np.ndarray | None = None  # int64 [tiles] of its transients in the interleaved region


@dataclass
class Problem:
    ops: list[str]
    inputs: dict[str, list[str]]              # op -> activation input tensors (in order)
    output: dict[str, str]                    # op -> output tensor
    choices: dict[str, list[Choice]]
    fixed: dict[str, Any]                     # tensor -> layout it is born in (host inputs, parameters)
    outputs: set[str]                         # graph outputs (live to the end)
    tile_bytes: Callable[[str, Any], np.ndarray]                  # (tensor, layout) -> int64 [tiles]
    conversion: Callable[[str, Any, Any], tuple[int, np.ndarray]]  # (tensor, from, to) -> (cycles, transient)
    resident: np.ndarray                      # int64 [tiles]
    capacity: int
    resident_parts: dict | None = None        # tensor -> (int64 [tiles], region): what ``resident`` sums
    interleaved_capacity: int | None = None   # bytes of the interleaved region (None: not checked)
    resident_interleaved: np.ndarray | None = None   # int64 [tiles]: the part of ``resident`` kept there
    blocks: list[tuple[int, int]] | None = None      # repeated blocks of ops (index ranges): ``solve_dp`` hint

    def holds(self) -> bool:
        """Some choice holds storage over the whole program: paths then carry per-tile figures."""
        return any(ch.resident is not None for chs in self.choices.values() for ch in chs)

    def interleaved_base(self, tiles: int) -> np.ndarray:
        r = self.resident_interleaved
        return np.zeros(tiles, dtype=np.int64) if r is None else np.asarray(r, dtype=np.int64)

    def last_use(self) -> dict[str, int]:
        last: dict[str, int] = {}
        for i, op in enumerate(self.ops):
            for t in self.inputs[op]:
                last[t] = i
        for t in self.outputs:
            last[t] = len(self.ops)
        for op in self.ops:
            last.setdefault(self.output[op], self.ops.index(op))
        return last

    def convert(self, tensor: str, src, dst) -> tuple[float, np.ndarray | None]:
        if src == dst:
            return 0, None
        if isinstance(src, Fused) or isinstance(dst, (Fused, Stored)):
            return INF, None
        return self.conversion(tensor, src, dst)


@dataclass
class Solution:
    picks: dict[str, int]                     # op -> index into its choices
    cycles: int
    peak: int                                 # worst tile, worst op
    peak_op: str = ""
    peak_tile: int = -1
    exact: bool = True
    interleaved_peak: int = 0                 # worst tile, worst op, interleaved region


def evaluate(problem: Problem, picks: dict[str, int]) -> Solution:
    """Cycles and memory peak of one complete assignment (the reference semantics)."""
    layout: dict[str, Any] = dict(problem.fixed)
    last = problem.last_use()
    live = set(problem.fixed) & set(last)
    cycles = 0
    peak, peak_op, peak_tile = -1, "", -1
    held = problem.resident.astype(np.int64).copy()       # resident + every choice's storage, all along
    for op in problem.ops:
        r = problem.choices[op][picks[op]].resident
        if r is not None:
            held += r
    ibase = problem.interleaved_base(held.size) + (held - problem.resident)
    ipeak = 0
    copies: list = []                 # (tensor, layout) converted copies, reused by later readers
    for i, op in enumerate(problem.ops):
        ch = problem.choices[op][picks[op]]
        ipeak = max(ipeak, int((ibase + (ch.interleaved if ch.interleaved is not None else 0)).max()))
        mem = held.copy()
        for t in live:
            mem += problem.tile_bytes(t, layout[t])
        for t, lay in copies:
            if problem.convert(t, layout[t], lay)[1] is not None:
                mem += problem.tile_bytes(t, lay)
        for t, want in zip(problem.inputs[op], ch.ins):
            if any(ct == t and cl == want for ct, cl in copies):
                continue
            c, tr = problem.convert(t, layout[t], want)
            cycles += c
            if c:
                copies.append((t, want))
                if tr is not None:
                    mem += tr
                    mem += problem.tile_bytes(t, want)
        cycles += ch.cycles
        mem += ch.transient
        out = problem.output[op]
        layout[out] = ch.out
        if not isinstance(ch.out, Fused):
            mem += problem.tile_bytes(out, ch.out)
        tile = int(np.argmax(mem))
        if mem[tile] > peak:
            peak, peak_op, peak_tile = int(mem[tile]), op, tile
        live.add(out)
        live = {t for t in live if last.get(t, -1) > i}
        copies = [(t, lay) for t, lay in copies if last.get(t, -1) > i]
    return Solution(dict(picks), int(cycles) if cycles != INF else INF, peak, peak_op, peak_tile,
                    interleaved_peak=ipeak)


def fits(problem: Problem, sol: Solution) -> bool:
    """The solution's peaks fit the capacity and, when checked, the interleaved region."""
    return sol.peak <= problem.capacity and (problem.interleaved_capacity is None
                                             or sol.interleaved_peak <= problem.interleaved_capacity)


def solve_exhaustive(problem: Problem) -> Solution | None:
    """Every combination; the oracle for tests (small problems only)."""
    best = None
    for combo in itertools.product(*(range(len(problem.choices[op])) for op in problem.ops)):
        s = evaluate(problem, dict(zip(problem.ops, combo)))
        if s.cycles == INF or not fits(problem, s):
            continue
        if best is None or (s.cycles, s.peak) < (best.cycles, best.peak):
            best = s
    return best


class _Path:
    """One partial assignment: its cycles, its peak, its picks so far and, when paths carry per-tile
    figures (``Problem.holds``), ``vec``: three int64 [tiles] arrays, the largest memory per tile
    over its ops without held storage (top), the storage its choices hold over the whole program
    (held) and the largest interleaved transients over its ops (itop), each the very array of its
    parent when its last choice left it as it was (read-only: shared); ``sums``: the three sums (a
    path with a larger sum cannot be no larger on every tile); ``dead``: the bytes per tile of the
    graph outputs it retired from the state (``_Search``: their layouts no later op reads), None
    when none, and ``dsum`` their sum."""

    __slots__ = ("cycles", "peak", "picks", "vec", "sums", "dead", "dsum")

    def __init__(self, cycles, peak: int, picks: tuple[int, ...], vec: tuple | None = None,
                 sums: tuple | None = None, dead: np.ndarray | None = None, dsum: int = 0):
        self.cycles, self.peak, self.picks, self.vec, self.sums = cycles, peak, picks, vec, sums
        self.dead, self.dsum = dead, dsum     # retired outputs' bytes per tile (``_Search``), their sum


def _then(path: _Path, gone) -> tuple:
    """``path``'s retired bytes (dead, dsum) after a move that retires ``gone`` ((bytes, sum) or None)."""
    if gone is None:
        return path.dead, path.dsum
    return (gone[0] if path.dead is None else path.dead + gone[0]), path.dsum + gone[1]


MAX_STATES = 4096


def solve_dp(problem: Problem, paths: int | None = 16, max_states: int | None = MAX_STATES) -> Solution | None:
    """DP over the op order; state = layouts of the values live after the op. When some choice holds
    storage over the whole program (``Problem.holds``: pre-arranged weights), a path carries per
    tile its largest memory so far without that storage, the storage its choices hold, and its
    largest interleaved transients (its peak: the first plus the second, worst tile), and
    dominance compares them tile by tile: a choice made later still adds its storage to every op
    before it.

    That per-tile dominance keeps several times more paths. A faster first pass with scalar
    (cycles, peak) dominance and the held storage counted from the op that holds it was tried and
    removed: two paths with one state can carry different held storage into every later op, so
    scalar dominance pruned the path that fits and the bounded DP then kept a slower one (found
    by test_bounded_dp_stays_within_one_percent_of_the_oracle).

    Design decision (width): a graph output that no later op reads is retired from the state after
    its last reader (its producer when none): the layouts it and its converted copies are in can
    change nothing later, only their bytes, which every later op holds. Each path carries those
    bytes per tile (``_Path.dead``) and dominance compares them tile by tile (a path holding no
    more on any tile is no worse whatever comes next), so the DP stays exact with unbounded
    buckets. Keeping them in the state made it exponential in the live outputs: one tensor read by
    N ops whose results are all outputs had 2^N states (N = 25: minutes and gigabytes); now it
    has one state per step. Values that later ops still read keep their layouts in the state:
    a graph that holds many of them at once still multiplies states, so a step that would open
    more than ``max_states`` states raises ``StateLimit`` (memory and time bounded; ``plan``
    falls back to CP-SAT, which is polynomial in its model size) instead of growing without bound."""
    return _solve_dp(problem, paths, max_states=max_states)


def _solve_dp(problem: Problem, paths: int | None, pass_over: bool = True, trace: list | None = None,
              max_states: int | None = MAX_STATES) -> Solution | None:
    """``solve_dp``'s search.

    Every path of one state has the same live values in the same layouts and the same converted
    copies (that is what the state is), so what an op's choice does from that state (its
    conversions, its memory at the op without held storage, the next state) is worked out once
    per state (``_Search.moves``). The paths are offered to the next states path by path, then choice by
    choice; an offer a full bucket would thin away again is passed over on its scalars
    (``_Bucket``), and only the others get their per-tile figures (``_figures``), so the bounded DP
    keeps the same paths in the same order as offering every one (``pass_over=False`` offers every
    one: the reference the tests hold it to; ``trace`` gets every step's states, each its paths'
    picks in order; a repeated block is one step). Repeated blocks (``Problem.blocks``) are searched
    once and composed (``_Search.compose``)."""
    search = _Search(problem, paths, pass_over, max_states)
    states = search.start()
    ops = problem.ops
    i = 0
    while i < len(ops):
        block = search.repeats.get(i)
        nxt = search.compose(block, states) if block is not None else None
        if nxt is None:                      # (not a repeated block, or its start states do not map onto it)
            nxt, i = search.step(i, states, search.holds), i + 1
        else:
            i = block.end
        if not nxt:
            return None
        states = {key: (live, copies, b.paths) for key, (live, copies, b) in nxt.items()}
        if trace is not None:
            trace.append([[p.picks for p in entries] for _, _, entries in states.values()])
    best = min((p for _, _, entries in states.values() for p in entries), key=_FASTEST)
    sol = evaluate(problem, dict(zip(ops, best.picks)))
    sol.exact = paths is None
    return sol


class StateLimit(Exception):
    """``solve_dp`` stopped: a step would hold more than its ``max_states`` states (``plan`` then
    falls back to CP-SAT)."""


@dataclass
class _Repeat:
    """A block of ops (``Problem.blocks``) that repeats the representative block ``rep`` (the last one some
    earlier block repeats, which has the least fixed storage live: what does not fit there fits in no
    earlier block; ``_Search._repeats``): ``names``
    maps this block's tensors onto the representative's (``inverse`` back), ``offset`` is the fixed
    storage live at each of its ops beyond what is live at the representative's matching op (the
    same per-tile array at every op of the block: the later blocks' parameters), None when zero."""

    start: int
    end: int
    rep: tuple[int, int]
    names: dict[str, str]
    inverse: dict[str, str]
    offset: np.ndarray | None


class _Search:
    """The state of one ``solve_dp`` search: the problem's fixed figures, the memo tables, and the
    repeated blocks it composes.

    Design decision (repeated blocks, a tower's 27 layers): the paths through one block, from a
    state at its start, are searched once, from one empty path, with the representative block's
    tensors (``block_paths``: per state at its end, a bucket of block paths whose figures are
    relative: their cycles, their largest memory per tile without held storage, the storage they
    hold, their interleaved transients); every block then composes its start paths with them
    (``compose``): cycles add, held storage adds, the largest memory is the larger of the path's
    and the block path's plus the block's ``offset``. Composition keeps dominance (a block path
    no worse on every figure gives a composed path no worse), so with unbounded buckets the result
    is the exact one. With bounded buckets the block's own buckets are thinned on its relative
    figures, not on the whole paths', so they also keep the (held storage, cycles) staircase
    (``_staircase``): the paths fastest for the storage they hold, which the blocks trade against
    each other under the memory of the whole program (without it, a block's fastest paths all
    pre-arranged three or four weights, and no composed layer of the SigLIP tower pre-arranged
    any). The staircase is at most half the bound (8 of 16 paths): with 16 the tower planned 2,226
    cycles faster (0.03%) and its selection took about 0.8 s longer per QKV form. The 27-layer
    tower: 8,247,271 modelled cycles (8,255,057 op by op), about 3 s of search per QKV form
    instead of 38 s."""

    def __init__(self, problem: Problem, paths: int | None, pass_over: bool, max_states: int | None = None):
        self.problem, self.paths = problem, paths
        self.last = last = problem.last_use()
        self.holds = problem.holds()              # paths carry per-tile figures
        self.icap = problem.interleaved_capacity
        self.cap = problem.capacity
        self.tiles = int(np.asarray(problem.resident).size)
        self.ibase = problem.interleaved_base(self.tiles)
        self.start_ok = self.icap is None or int(self.ibase.max()) <= self.icap   # the empty path's region fits
        self.ifits: dict = {}
        # Memoised by the layout objects' identity (the choices' own objects, alive for the whole
        # solve): hashing a layout dataclass field by field for every path was most of the time.
        self.tb_memo: dict = {}
        self.cv_memo: dict = {}
        self.key_memo: dict = {}
        self.skips = pass_over and paths is not None and paths >= 2   # (``_Bucket.mark``: a bound of two or more)
        # Values with a fixed layout (host inputs, parameters read as values) keep it on every path:
        # they are left out of the states (the same at every state of a step, so the states split the
        # same way) and their bytes, while live, are a per-step base shared by every path. A tower's
        # hundreds of broadcast parameters would otherwise make every state that long.
        self.fixed = fixed = {t: problem.fixed[t] for t in problem.fixed if t in last}
        base = problem.resident.astype(np.int64).copy()
        for t, lay in sorted(fixed.items()):
            base = base + self.tile_bytes(t, lay)
        ending: dict[int, list[str]] = {}
        for t in fixed:
            ending.setdefault(last[t], []).append(t)
        self.fixed_base = []                  # per op (one array over the ops where no fixed value ends)
        for i in range(len(problem.ops)):
            self.fixed_base.append(base)
            for t in ending.get(i, ()):       # fixed values whose last use was this op
                base = base - self.tile_bytes(t, fixed[t])
        # A graph output no op reads after op ``retire[t]`` leaves the states there (``moves``).
        self.retire: dict[str, int] = {}
        produced = {problem.output[op]: i for i, op in enumerate(problem.ops)}
        for t in problem.outputs:
            if t in last:
                readers = [i for i, op in enumerate(problem.ops) if t in problem.inputs[op]]
                self.retire[t] = max(readers + [produced.get(t, -1)])
        self.repeats = self._repeats()
        self.block_memo: dict = {}
        self.max_states = max_states

    def inter_ok(self, ch) -> bool:           # without held storage: the region at one op, one choice
        if self.icap is None or ch.interleaved is None:
            return True
        v = self.ifits.get(id(ch))
        if v is None:
            v = self.ifits[id(ch)] = (int((self.ibase + ch.interleaved).max()) <= self.icap, ch)
        return v[0]

    def tile_bytes(self, t, lay):
        k = (t, id(lay))
        v = self.tb_memo.get(k)
        if v is None:
            v = self.tb_memo[k] = (self.problem.tile_bytes(t, lay), lay)
        return v[0]

    def convert(self, t, src, dst):
        k = (t, id(src), id(dst))
        v = self.cv_memo.get(k)
        if v is None:
            v = self.cv_memo[k] = (self.problem.convert(t, src, dst), src, dst)
        return v[0]

    def key_of(self, live):
        out = []
        for t, lay in live:
            v = self.key_memo.get(id(lay))
            if v is None:
                v = self.key_memo[id(lay)] = ((str(lay), hash(lay)), lay)
            out.append((t,) + v[0])
        return tuple(out)

    def opened(self, nxt: dict, slot: list, key, live, copies) -> "_Bucket":
        """A new next state's bucket (``_open``), within ``max_states`` (``StateLimit``)."""
        self.count(nxt)
        return _open(nxt, slot, key, live, copies)

    def offered(self, offers: dict, key, entry: tuple) -> tuple:
        """A new next state's offers, within ``max_states`` (``StateLimit``)."""
        self.count(offers)
        offers[key] = entry
        return entry

    def count(self, states: dict) -> None:
        if self.max_states is not None and len(states) >= self.max_states:
            raise StateLimit(f"the selection DP would hold more than {self.max_states:,} states (layouts of the "
                             "values that later ops read)")

    def start(self) -> dict:
        zero = np.zeros(self.tiles, dtype=np.int64)
        start = _Path(0, 0, (), (zero, zero, zero), (0, 0, 0)) if self.holds else _Path(0, 0, ())
        return {(self.key_of(()), self.key_of(())): ((), (), [start])}

    def moves(self, i: int, live: tuple, copies: tuple, retiring: bool = True) -> list:
        """From one state, per choice of op i that can run there: (index, choice, its cycles with its
        conversions', its memory at op i without held storage and retired outputs, the next state's
        live values, copies and key, and what it retires: (bytes per tile, their sum) or None).

        A graph output that no op reads after op i (``retire``) is retired: it and its converted
        copies leave the next state and their bytes go to the path (``_Path.dead``); ``retiring=False``
        keeps them in the state (``block_paths``)."""
        problem, last, fixed, tile_bytes, convert = self.problem, self.last, self.fixed, self.tile_bytes, self.convert
        retire = self.retire if retiring else None
        op = problem.ops[i]
        layout = dict(live)
        base = self.fixed_base[i].copy()
        for t, lay in live:
            base += tile_bytes(t, lay)
        for t, lay in copies:
            if convert(t, layout[t] if t in layout else fixed[t], lay)[1] is not None:
                base += tile_bytes(t, lay)
        out = problem.output[op]
        found = []
        for ci, ch in enumerate(problem.choices[op]):
            mem = base + ch.transient
            ok = True
            made = list(copies)
            convs = []
            for t, want in zip(problem.inputs[op], ch.ins):
                if any(ct == t and cl == want for ct, cl in made):
                    continue                    # a copy an earlier reader converted
                c, tr = convert(t, layout[t] if t in layout else fixed[t], want)
                if c == INF:
                    ok = False
                    break
                convs.append(c)
                if c:
                    made.append((t, want))
                    if tr is not None:
                        mem = mem + tr + tile_bytes(t, want)
            if not ok:
                continue
            if not isinstance(ch.out, Fused):
                mem = mem + tile_bytes(out, ch.out)
            kept_live = [(t, l) for t, l in live if last.get(t, -1) > i] + \
                ([(out, ch.out)] if last.get(out, -1) > i else [])
            kept_copies = [(t, l) for t, l in made if last.get(t, -1) > i]
            gone = None
            if retire:
                gl = [e for e in kept_live if retire.get(e[0], i + 1) <= i]
                gc = [e for e in kept_copies if retire.get(e[0], i + 1) <= i]
                if gl or gc:
                    kept_live = [e for e in kept_live if e not in gl]
                    kept_copies = [e for e in kept_copies if e not in gc]
                    g = np.zeros(self.tiles, dtype=np.int64)
                    for t, lay in gl:
                        g = g + tile_bytes(t, lay)
                    for t, lay in gc:
                        if convert(t, layout[t] if t in layout else fixed[t], lay)[1] is not None:
                            g = g + tile_bytes(t, lay)
                    gone = (g, int(g.sum()))
            new_live = tuple(sorted(kept_live))
            new_copies = tuple(sorted(kept_copies, key=lambda e: (e[0], str(e[1]))))
            cycles = ch.cycles
            for c in convs:        # (integers: a path's cycles plus these is the path-by-path sum)
                cycles += c
            found.append((ci, ch, cycles, mem, new_live, new_copies, (self.key_of(new_live), self.key_of(new_copies)),
                          gone))
        return found

    def step(self, i: int, states: dict, vec: bool, stairs: bool = False, retiring: bool = True) -> dict:
        """Op i from every state: the next states' buckets (state key -> (live values, copies,
        ``_Bucket``)). ``vec``: the paths carry per-tile figures. ``stairs`` (with ``vec``): the buckets
        also keep the (held storage, cycles) staircase, each filled at once (``_settled``)."""
        paths, cap, icap, tiles, skips = self.paths, self.cap, self.icap, self.tiles, self.skips
        nxt: dict[tuple, tuple] = {}          # state key -> (its live values, its copies, its _Bucket)
        offers: dict[tuple, tuple] = {}       # with ``stairs``: state key -> (live values, copies, offers)
        for live, copies, entries in states.values():
            found = self.moves(i, live, copies, retiring)
            if not vec:
                steps = [(ci, cyc, int(mem.max()), mem, nl, nc, key, gone)
                         for ci, ch, cyc, mem, nl, nc, key, gone in found if int(mem.max()) <= cap and self.inter_ok(ch)]
                slots = _slots(nxt, [s[6] for s in steps])
                for path in entries:
                    pc, pp, pd = path.cycles, path.peak, path.dead
                    for k, (ci, cyc, top, mem, nl, nc, key, gone) in enumerate(steps):
                        if pd is not None:          # (the outputs it retired are in memory at every later op)
                            top = int((mem + pd).max())
                            if top > cap:
                                continue
                        # (a path's peak is within the capacity, so is the larger of the two)
                        c, pk = pc + cyc, max(pp, top)
                        dead, dsum = _then(path, gone)
                        b = slots[k][0]
                        if b is not None and skips and len(b.paths) >= paths:
                            m = b.marks or b.mark(paths)
                            if _passes(m, c, pk):
                                if not b.thinned and not _covered(b.paths, _Path(c, pk, (), None, None, dead, dsum)):
                                    b.settle(paths)
                                continue
                        if b is None:
                            b = self.opened(nxt, slots[k], key, nl, nc)
                        b.offer(_Path(c, pk, path.picks + (ci,), None, None, dead, dsum), paths)
                continue
            if not found:
                continue
            ibase, start_ok = self.ibase, self.start_ok
            if stairs:
                for ci, ch, cyc, mem, nl, nc, key, gone in found:
                    # (the peak after the move is at least the path's plus the least the move holds, and
                    # at least the move's memory plus what it holds: the offer's bound until it is made)
                    r = ch.resident
                    rsum, rmin = (0, 0) if r is None else (int(r.sum()), int(r.min()))
                    rtop = int(mem.max() if r is None else (mem + r).max())
                    got = offers.get(key) or self.offered(offers, key, (nl, nc, []))
                    for path in entries:
                        low = max(path.peak + rmin, rtop)
                        if low <= cap:
                            got[2].append((path.cycles + cyc, low, path.sums[1] + rsum, (path.picks, (ci,)), _moved,
                                           (path, ch, mem, rsum, ci, cyc, tiles, cap, icap, ibase, start_ok, gone)))
                continue
            # Per move, what decides a skip without per-tile figures: a path's peak after it is at
            # least its peak before plus the least the move holds, and at least the move's own memory
            # plus what it holds, on its fullest tile (``_Bucket``); and the sum it adds to held storage.
            cheap = []
            for ci, ch, cyc, mem, nl, nc, key, _ in found:
                r = ch.resident
                cheap.append((cyc, 0 if r is None else int(r.min()), int(mem.max() if r is None else (mem + r).max()),
                              0 if r is None else int(r.sum())))
            slots = _slots(nxt, [f[6] for f in found])
            for row, path in enumerate(entries):
                pc, pp, ps1 = path.cycles, path.peak, path.sums[1]
                figures: dict = {}
                for k, (cyc, rmin, rtop, rsum) in enumerate(cheap):
                    c = pc + cyc
                    b = slots[k][0]
                    if b is not None and skips and len(b.paths) >= paths:
                        m = b.marks or b.mark(paths)
                        s1 = ps1 + rsum
                        if _could(m, c, s1):
                            pk = max(pp + rmin, rtop)
                            if not _passes(m, c, pk, s1):
                                f = figures[k] = _figures(path, found[k][1], found[k][3], rsum, tiles, cap, icap,
                                                          ibase, start_ok)
                                pk = f[0]                    # the bound falls short: the peak itself
                            if _passes(m, c, pk, s1):
                                if not b.thinned:        # (an offer that does not fit, or is covered, changes nothing)
                                    f = figures.get(k) or _figures(path, found[k][1], found[k][3], rsum, tiles,
                                                                   cap, icap, ibase, start_ok)
                                    if f[3] and not _covered(b.paths, _Path(c, f[0], (), f[1], f[2],
                                                                            *_then(path, found[k][7]))):
                                        b.settle(paths)
                                continue
                    f = figures.get(k) or _figures(path, found[k][1], found[k][3], rsum, tiles, cap, icap, ibase,
                                                   start_ok)
                    if not f[3]:
                        continue
                    if b is None:
                        _, _, _, _, nl, nc, key, _ = found[k]
                        b = self.opened(nxt, slots[k], key, nl, nc)
                    b.offer(_Path(c, f[0], path.picks + (found[k][0],), f[1], f[2], *_then(path, found[k][7])), paths)
        for key, (live, copies, cands) in offers.items():
            b = _settled(cands, paths, True)
            if b is not None:
                nxt[key] = (live, copies, b)
        return nxt

    # -- repeated blocks --------------------------------------------------------------------------

    def _repeats(self) -> dict[int, _Repeat]:
        """The blocks of ``Problem.blocks`` that repeat a representative one op for op (``_match``), by
        start: the last block that at least one earlier block repeats (a tower's last layer writes the
        graph's output, which may take other choices: then the one before it)."""
        blocks = self.problem.blocks or []
        for r in range(len(blocks) - 1, 0, -1):
            out = {}
            for a, b in blocks[:r + 1]:
                got = self._match((a, b), blocks[r])
                if got is not None:
                    out[a] = got
            if len(out) >= 2:
                return out
        return {}

    def _numbering(self, a: int, b: int) -> list[str]:
        """The tensors ops a..b-1 read and write, in order of first appearance."""
        seen: dict[str, None] = {}
        p = self.problem
        for op in p.ops[a:b]:
            for t in (*p.inputs[op], p.output[op]):
                seen.setdefault(t, None)
        return list(seen)

    def _match(self, blk: tuple[int, int], rep: tuple[int, int]) -> _Repeat | None:
        """``blk`` as a repeat of ``rep``, or None when it is not one: the same ops in the same order
        with equal choices (layouts, cycles, per-tile bytes), the same tensors in the same places,
        the same fixed layouts, each tensor's last use at the same place in the block (or after it,
        in both), and fixed storage that differs by one per-tile array at every op."""
        p, last = self.problem, self.last
        (a, b), (ra, rb) = blk, rep
        if b - a != rb - ra:
            return None
        mine, theirs = self._numbering(a, b), self._numbering(ra, rb)
        if len(mine) != len(theirs):
            return None
        names = dict(zip(mine, theirs))
        for j in range(b - a):
            op, rop = p.ops[a + j], p.ops[ra + j]
            if [names[t] for t in p.inputs[op]] != list(p.inputs[rop]) or names[p.output[op]] != p.output[rop]:
                return None
            mc, rc = p.choices[op], p.choices[rop]
            if len(mc) != len(rc) or not all(_same_choice(x, y) for x, y in zip(mc, rc)):
                return None
        for t, u in names.items():
            if (t in self.fixed) != (u in self.fixed) or (t in self.fixed and self.fixed[t] != self.fixed[u]):
                return None
            if (t in p.fixed) != (u in p.fixed):
                return None
            lt, lu = last.get(t, -1), last.get(u, -1)
            if (lt - a if lt < b else None) != (lu - ra if lu < rb else None):
                return None
        offset = self.fixed_base[a] - self.fixed_base[ra]
        for j in range(1, b - a):
            if not np.array_equal(self.fixed_base[a + j] - self.fixed_base[ra + j], offset):
                return None
        if (offset < 0).any():
            return None
        return _Repeat(a, b, rep, names, {u: t for t, u in names.items()}, offset if offset.any() else None)

    def compose(self, block: _Repeat, states: dict) -> dict | None:
        """The states after ``block`` from the states at its start: every start path composed with
        the block's paths from its state (``block_paths``). None when a start state holds a value the
        block does not read (it cannot be mapped onto the representative's).

        The peaks and fits of one start path with every block path are worked out at once, on
        matrices; each next state's bucket is filled from them at once (``_settled``), so most
        compositions are never made into paths."""
        mapped = []
        for live, copies, entries in states.values():
            if any(t not in block.names for t, _ in (*live, *copies)) or any(P.dead is not None for P in entries):
                return None
            mapped.append((_renamed(live, copies, block.names), entries))
        paths, cap, icap, ibase = self.paths, self.cap, self.icap, self.ibase
        holds, offset = self.holds, block.offset
        offers: dict[tuple, tuple] = {}
        for (rlive, rcopies), entries in mapped:
            ends = self.block_paths(block.rep, rlive, rcopies)
            if any(L.dead is not None for _, _, lpaths in ends for L in lpaths):
                return None                  # (a block that retires outputs: searched op by op)
            for olive, ocopies, lpaths in ends:
                live, copies = _renamed(olive, ocopies, block.inverse)
                key = (self.key_of(live), self.key_of(copies))
                got = offers.get(key) or self.offered(offers, key, (live, copies, []))
                # The block paths' figures as matrices (one row each), composed with a start path at once.
                tops = np.stack([L.vec[0] for L in lpaths]) if offset is None else \
                    np.stack([L.vec[0] for L in lpaths]) + offset
                cycles = [L.cycles for L in lpaths]
                if holds:
                    helds, itops = np.stack([L.vec[1] for L in lpaths]), np.stack([L.vec[2] for L in lpaths])
                    held_sums = [L.sums[1] for L in lpaths]
                else:
                    top_max = tops.max(axis=1)
                for P in entries:
                    if holds:
                        h = P.vec[1] + helds
                        peaks = (np.maximum(P.vec[0], tops) + h).max(axis=1)
                        ok = peaks <= cap
                        if icap is not None:
                            ok &= (ibase + h + np.maximum(P.vec[2], itops)).max(axis=1) <= icap
                    else:
                        peaks = np.maximum(top_max, P.peak)
                        ok = peaks <= cap
                    for r in np.flatnonzero(ok).tolist():
                        L = lpaths[r]
                        peak = int(peaks[r])
                        got[2].append((P.cycles + cycles[r], peak, P.sums[1] + held_sums[r] if holds else 0,
                                       (P.picks, L.picks), *((_joined, (P, L, tops[r], cap, icap, ibase, self.start_ok))
                                                             if holds else (_scalar_join, (P, L, peak)))))
        nxt: dict[tuple, tuple] = {}
        for key, (live, copies, cands) in offers.items():
            b = _settled(cands, paths, holds)
            if b is not None:
                nxt[key] = (live, copies, b)
        return nxt

    def block_paths(self, rep: tuple[int, int], live: tuple, copies: tuple) -> list:
        """The representative block's paths from one start state, from an empty path with per-tile
        figures: per state at its end, (live values, copies, paths).

        Design decision: no graph output is retired inside the representative. It is the last
        block some earlier one repeats, so in a tower it is the last layer, whose result is the
        graph's output; retiring it there would give every block's paths retired bytes and stop
        every composition (the tower then searched op by op: about 4x the selection time and a
        slightly slower plan). Kept live, the output's bytes count at every later op as the
        retired bytes would (there are none later in the last block), and in the other blocks the
        same value is read by the next layer, never retired."""
        key = (self.key_of(live), self.key_of(copies))
        got = self.block_memo.get(key)
        if got is None:
            zero = np.zeros(self.tiles, dtype=np.int64)
            states = {key: (live, copies, [_Path(0, 0, (), (zero, zero, zero), (0, 0, 0))])}
            for i in range(*rep):
                nxt = self.step(i, states, True, stairs=self.holds, retiring=False)
                states = {k: (lv, cp, b.paths) for k, (lv, cp, b) in nxt.items()}
                if not states:
                    break
            got = self.block_memo[key] = list(states.values())
        return got


def _same_choice(x: Choice, y: Choice) -> bool:
    """Two choices the selection cannot tell apart (their labels aside)."""
    def same(u, v):
        return u is v or (u is not None and v is not None and np.array_equal(u, v))
    return (x.ins == y.ins and x.out == y.out and x.cycles == y.cycles and same(x.transient, y.transient)
            and same(x.resident, y.resident) and same(x.interleaved, y.interleaved))


def _renamed(live: tuple, copies: tuple, names: dict) -> tuple[tuple, tuple]:
    """A state's live values and copies with their tensors renamed, in the order states keep them."""
    return (tuple(sorted((names[t], lay) for t, lay in live)),
            tuple(sorted(((names[t], lay) for t, lay in copies), key=lambda e: (e[0], str(e[1])))))


def _joined(P: _Path, L: _Path, ltop: np.ndarray, cap: int, icap, ibase, start_ok: bool) -> _Path | None:
    """Path ``P`` followed by block path ``L`` (its largest memory per tile ``ltop``, with the block's
    offset), or None when that does not fit: the figures ``_figures`` gives op by op."""
    ptop, pheld, pitop = P.vec
    _, lheld, litop = L.vec
    top = ptop if (ltop <= ptop).all() else np.maximum(ptop, ltop)
    held = pheld if L.sums[1] == 0 else pheld + lheld          # (held bytes are never negative)
    peak = P.peak if top is ptop and held is pheld else int((top + held).max())
    if peak > cap:
        return None
    itop = pitop if (litop <= pitop).all() else np.maximum(pitop, litop)
    if icap is not None and not (start_ok and held is pheld and itop is pitop) and \
            int((ibase + held + itop).max()) > icap:
        return None
    sums = (P.sums[0] if top is ptop else int(top.sum()), P.sums[1] + L.sums[1],
            P.sums[2] if itop is pitop else int(itop.sum()))
    return _Path(P.cycles + L.cycles, peak, P.picks + L.picks, (top, held, itop), sums)


def _scalar_join(P: _Path, L: _Path, peak: int) -> _Path:
    """``_joined`` without per-tile figures (no choice holds storage), its peak worked out already."""
    return _Path(P.cycles + L.cycles, peak, P.picks + L.picks)


def _moved(path: _Path, ch: Choice, mem, rsum: int, ci: int, cycles: int, tiles: int, cap: int, icap, ibase,
           start_ok: bool, gone=None) -> _Path | None:
    """``path`` after choice ``ci`` (``ch``, its cycles with its conversions', its memory ``mem``, the
    outputs it retires ``gone``), or None when that does not fit (``_figures``)."""
    f = _figures(path, ch, mem, rsum, tiles, cap, icap, ibase, start_ok)
    return _Path(path.cycles + cycles, f[0], path.picks + (ci,), f[1], f[2], *_then(path, gone)) if f[3] else None


def _settled(offers: list, bound: int | None, lean: bool) -> _Bucket | None:
    """A bucket of the paths ``offers`` make, thinned once (``_thin`` with the staircase), or None when
    none. Each offer is (cycles, peak or a lower bound of it, held sum, picks, make, args): its path
    is ``make(*args)``, None when it does not fit.

    Taken fastest first (cycles, peak, held, picks), an offer made once the bucket holds ``bound``
    - 1 paths that holds no less than the leanest there and peaks no lower than the least there is
    one ``_thin`` drops (the paths there are no slower: it is on no staircase, nor the least, nor
    the leanest), so it is passed over and its path never made."""
    offers.sort(key=operator.itemgetter(0, 1, 2, 3))
    b = _Bucket()
    lean_min = least = INF
    for cycles, peak, held, _, make, args in offers:
        if bound is not None and len(b.paths) >= bound - 1 and held >= lean_min and peak >= least:
            continue
        path = make(*args)
        if path is not None and _insert(b.paths, path, None)[0]:
            lean_min, least = min(lean_min, held), min(least, path.peak)
    if bound is not None and len(b.paths) > bound:
        b.paths[:], _ = _thin(b.paths, bound, lean, True)
    return b if b.paths else None


_FASTEST = operator.attrgetter("cycles", "peak", "picks")
_LEAST = operator.attrgetter("peak", "cycles", "picks")


def _LEANEST(p):
    return p.sums[1], p.cycles, p.peak, p.picks


def _figures(path: _Path, ch: Choice, mem: np.ndarray, held_sum: int, tiles: int, cap: int, icap, ibase,
             start_ok: bool) -> tuple:
    """A path's per-tile figures after a move (choice ``ch``, its memory ``mem`` at the op without held
    storage, ``held_sum`` the sum of what it holds): (peak, vec, sums, fits). ``fits``: the peak within
    ``cap`` and the interleaved region within ``icap``; vec and sums are None when it does not fit."""
    ptop, pheld, pitop = path.vec
    s0, s1, s2 = path.sums
    if path.dead is not None:        # the outputs it retired are in memory at every later op
        mem = mem + path.dead
    # A figure the move does not raise on any tile stays the parent's very array: once a tower's
    # largest op is behind it, most paths share one top (and one itop), and comparing them is free.
    top = ptop if (mem <= ptop).all() else np.maximum(ptop, mem)
    held = pheld if ch.resident is None else pheld + ch.resident
    peak = path.peak if top is ptop and held is pheld else int((top + held).max())    # (a path's peak: of both)
    if peak > cap:
        return peak, None, None, False
    inter = ch.interleaved
    itop = pitop if inter is None or (inter <= pitop).all() else np.maximum(pitop, inter)
    # A move that leaves a path's held storage and interleaved figures as they were leaves its
    # region as it was, and every path in a bucket passed this check (the start path too, when
    # ``start_ok``): it would pass again.
    if icap is not None and not (start_ok and held is pheld and itop is pitop):
        if int((ibase + held + itop).max()) > icap:
            return peak, None, None, False
    sums = (s0 if top is ptop else int(top.sum()), s1 + held_sum if ch.resident is not None else s1,  # (exact)
            s2 if itop is pitop else int(itop.sum()))
    return peak, (top, held, itop), sums, True


def _insert(bucket: list[_Path], p: _Path, bound: int | None) -> tuple[int, tuple | None]:
    """Keep the bucket a Pareto set, at most ``bound`` paths (fastest kept, ``_thin``): 0 when ``p``
    stayed out, 1 when it went in, 2 when it went in and the bucket was then thinned (with the
    marks of what it kept, ``_thin``). A path covers
    another when it is no slower, its peak is no larger and, with per-tile figures, whatever comes
    next it never has more memory on any tile in either class (every figure of ``vec`` no larger;
    the sums are checked first: a larger sum rules it out) and, when it retired outputs, no more of
    their bytes on any tile (every later op holds them)."""
    if _covered(bucket, p):
        return 0, None
    pc, pp, ps, pv, pd, pds = p.cycles, p.peak, p.sums, p.vec, p.dead, p.dsum
    if ps is None:
        keep = [q for q in bucket if not (pc <= q.cycles and pp <= q.peak and pds <= q.dsum and _le(pd, q.dead))]
    else:
        a0, a1, a2 = ps
        keep = [q for q in bucket if not (pc <= q.cycles and pp <= q.peak and a0 <= q.sums[0] and a1 <= q.sums[1]
                                          and a2 <= q.sums[2] and pds <= q.dsum and _no_more(pv, q.vec)
                                          and _le(pd, q.dead))]
    if len(keep) != len(bucket):
        bucket[:] = keep
    bucket.append(p)
    if bound is not None and len(bucket) > bound:
        bucket[:], marks = _thin(bucket, bound, ps is not None)
        return 2, marks
    return 1, None


def _covered(bucket: list[_Path], p: _Path) -> bool:
    """Some path of the bucket covers ``p`` (``_insert``)."""
    pc, pp, ps, pv, pd, pds = p.cycles, p.peak, p.sums, p.vec, p.dead, p.dsum
    if ps is None:
        for q in bucket:
            if q.cycles <= pc and q.peak <= pp and q.dsum <= pds and _le(q.dead, pd):
                return True
        return False
    a0, a1, a2 = ps
    for q in bucket:
        if q.cycles <= pc and q.peak <= pp and q.dsum <= pds:
            s = q.sums
            if s[0] <= a0 and s[1] <= a1 and s[2] <= a2 and _no_more(q.vec, pv) and _le(q.dead, pd):
                return True
    return False


def _le(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    """Retired bytes ``a`` no larger than ``b`` on every tile (None: none; never negative)."""
    if a is None or a is b:
        return True
    if b is None:
        return not a.any()
    return bool((a <= b).all())


def _no_more(a: tuple, b: tuple) -> bool:
    """Per-tile figures ``a`` no larger than ``b`` on every tile (a shared array is equal to itself)."""
    return ((a[0] is b[0] or bool((a[0] <= b[0]).all())) and (a[1] is b[1] or bool((a[1] <= b[1]).all()))
            and (a[2] is b[2] or bool((a[2] <= b[2]).all())))


def _thin(bucket: list[_Path], bound: int, lean: bool, stairs: bool = False) -> tuple[list[_Path], tuple | None]:
    """The paths a crowded bucket keeps (sorting it fastest first): the bound - 1 fastest, and the
    least-memory path (or the next fastest if it is among them). With storage held over the whole
    program (``lean``), also the path holding the least of it (the fastest such): the fastest paths
    may all hold pre-arranged weights that leave later ops no room but for slow grids (a 27-layer
    tower), and this path is the one that leaves them the most; with ``stairs`` too, up to half
    ``bound`` paths of the staircase between the two (``_staircase``: a repeated block's buckets, ``_Search``).
    Also the marks of the paths kept (``_marks``; None when ``bound`` < 2): the kept paths' fastest,
    least and leanest are these (the pass-over, which reads them, is never used with ``stairs``)."""
    bucket.sort(key=_FASTEST)
    low = min(bucket, key=_LEAST)
    fastest = bucket[:bound - 1]
    kept = fastest + [bucket[bound - 1] if low in fastest else low]
    least = None
    if lean:
        least = min(bucket, key=_LEANEST)
        if least not in kept:
            kept.append(least)
        if stairs:
            kept += [q for q in _staircase(bucket, max(2, bound // 2)) if q not in kept]
    return kept, _marks(bucket, low, least, bound) if bound >= 2 else None


def _staircase(bucket: list[_Path], bound: int) -> list[_Path]:
    """The paths fastest for the storage they hold: by held sum, each faster than every path holding
    less; at most ``bound`` of them, spread evenly from the leanest to the fastest."""
    steps: list[_Path] = []
    for q in sorted(bucket, key=_LEANEST):
        if not steps or q.cycles < steps[-1].cycles:
            steps.append(q)
    if len(steps) > bound:
        steps = [steps[round(k * (len(steps) - 1) / (bound - 1))] for k in range(bound)] if bound > 1 else steps[:1]
    return steps


def _marks(by_speed: list[_Path], low: _Path, lean: _Path | None, bound: int) -> tuple:
    """(cycles, peak) of the last path kept for speed (the (bound - 1)-th fastest, or the bound-th
    when the least-memory path ``low`` is among those), the least peak and, with per-tile figures,
    the leanest path's (held sum, cycles, peak) (``_Bucket``). ``by_speed``: fastest first."""
    last = by_speed[bound - 1] if low in by_speed[:bound - 1] else by_speed[bound - 2]
    m = (last.cycles, last.peak, low.peak)
    return m if lean is None else m + (lean.sums[1], lean.cycles, lean.peak)


class _Bucket:
    """The paths offered to one next state during a step (``_insert``), and what lets the step pass
    over most offers without building them.

    Design decision: a skip that keeps the bounded DP's result path for path. An offer ``p`` to a
    bucket holding at least ``bound`` paths changes nothing but the bucket's order when ``_thin``
    would drop it and it covers no path there; then the bucket is what ``_thin`` makes of it
    (``settle``: the order a path-by-path run leaves, which the next step offers in; unless a path
    there covers it, which leaves the bucket as it was). ``_thin`` drops
    it when, strictly on scalars (ties on picks never decide), it is slower than the path that is
    the last kept for speed (``mark``: the (bound - 1)-th fastest, or the bound-th when the
    least-memory path is among those), its peak is above the least peak, and it holds more than the
    leanest path (held sum, then cycles, then peak). Those three also rule out that it covers any
    path there (covering needs no more cycles, peak and held sum). The peak may be a lower bound
    (``_passes`` only gets truer as the peak grows), so most offers are decided without their
    per-tile figures. Found by profiling the 27-layer SigLIP tower: about three in five offers were
    built, checked against every path and thinned away again."""

    __slots__ = ("paths", "thinned", "marks")

    def __init__(self):
        self.paths: list[_Path] = []
        self.thinned = False          # the paths are what ``_thin`` made of them (its order)
        self.marks: tuple | None = None

    def offer(self, p: _Path, bound: int | None) -> bool:
        got, marks = _insert(self.paths, p, bound)
        if got:
            self.thinned, self.marks = got == 2, marks
        return got > 0

    def settle(self, bound: int) -> None:
        """An offer ``_thin`` drops, covered by no path here, went in and out: the bucket in the order
        that leaves (one thinned already is in it)."""
        if not self.thinned:
            self.paths[:], _ = _thin(self.paths, bound, self.paths[0].sums is not None)
            self.thinned = True         # (the same paths: the marks stay)

    def mark(self, bound: int) -> tuple:
        """(cycles, peak) of the last path kept for speed, the least peak and, with per-tile
        figures, the leanest path's (held sum, cycles, peak); the bucket holds at least ``bound``
        paths, ``bound`` >= 2."""
        ps = self.paths
        m = self.marks = _marks(sorted(ps, key=_FASTEST), min(ps, key=_LEAST),
                                min(ps, key=_LEANEST) if ps[0].sums is not None else None, bound)
        return m


def _could(m: tuple, c, s1) -> bool:
    """``_passes`` for some peak (a large enough one)."""
    return (c >= m[0]) and (s1 > m[3] or (s1 == m[3] and c >= m[4]))


def _passes(m: tuple, c, pk, s1=None) -> bool:
    """An offer of cycles ``c``, peak ``pk`` and, with per-tile figures, held sum ``s1`` is one
    ``_thin`` drops from a bucket of marks ``m`` (``_Bucket.mark``), and it covers none of its paths."""
    if not ((c > m[0] or (c == m[0] and pk > m[1])) and pk > m[2]):
        return False
    return s1 is None or s1 > m[3] or (s1 == m[3] and (c > m[4] or (c == m[4] and pk > m[5])))


def _slots(nxt: dict, keys: list) -> list[list]:
    """Per move, the one-element list holding its next state's ``_Bucket`` (None until opened),
    shared by the moves to one state."""
    by: dict = {}
    out = []
    for key in keys:
        s = by.get(key)
        if s is None:
            got = nxt.get(key)
            s = by[key] = [got[2] if got is not None else None]
        out.append(s)
    return out


def _open(nxt: dict, slot: list, key, live, copies) -> _Bucket:
    b = slot[0] = _Bucket()
    nxt[key] = (live, copies, b)
    return b


def no_fit_error(problem: Problem) -> TileplanError:
    """Why nothing fits: the least-overflowing assignment (greedy, fewest-memory choices), naming
    the op, the tile, its bytes and, when the problem knows them, the largest resident buffers
    on that tile with their regions and the live values there."""
    picks = {}
    for op in problem.ops:
        ch = problem.choices[op]
        picks[op] = min(range(len(ch)), key=lambda c: int(ch[c].transient.max()))
    s = evaluate(problem, picks)
    over = s.peak - problem.capacity
    tile = s.peak_tile
    detail = ""
    if problem.resident_parts and tile >= 0:
        parts = sorted(((int(b[tile]), name, region) for name, (b, region) in problem.resident_parts.items()
                        if b[tile]), reverse=True)
        total = sum(p[0] for p in parts)
        by_region: dict = {}
        for nb, _, region in parts:
            by_region[region] = by_region.get(region, 0) + nb
        regions = ", ".join(f"{r} {nb:,}" for r, nb in sorted(by_region.items()))
        largest = ", ".join(f"{name} {nb:,} B ({region})" for nb, name, region in parts[:3])
        detail = (f"; resident parameters take {total:,} bytes of it ({regions}; {len(parts)} buffers, the "
                  f"largest {largest})")
    return TileplanError(f"nothing fits: at op {s.peak_op!r} tile {tile} needs {s.peak:,} bytes "
                         f"(resident parameters, live values and the op's transients), "
                         f"{over:,} bytes over its {problem.capacity:,} usable bytes{detail}")
