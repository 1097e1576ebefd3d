"""Fragment programs: buffers, exchange steps and compute steps.

Every candidate implementation (a GEMM on a grid, an elementwise op on a
layout, a conversion between two layouts) is built as a small bulk-synchronous
program over *buffers*: distributed arrays with a layout. The detailed
estimate costs these programs per tile; lowering allocates their buffers and
turns their steps into per-tile vertices and transfers; the IPU model executes
what lowering made. Because all three start from the same program, the
estimate and the simulated cycles differ only by what the low passes change.

- ``Buffer``: one distributed array. ``kind`` says what it is: ``tensor`` (a
  graph tensor at an op boundary), ``parameter`` (resident, written by the host
  once), ``transient`` (preparation, partials; lives inside one fragment).
- ``ExchangeStep``: copies between buffers, all in one exchange phase.
- ``ComputeStep``: vertices, at most a few per tile, in one compute set.
- A ``Vertex`` runs one kernel ``call`` on one tile with operands that are
  contiguous element runs of buffers on that tile.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..graph.dtypes import DType


@dataclass(frozen=True)
class Buffer:
    name: str
    layout: Any                  # a tileplan.layout Layout (or anything with owner_map(shape, dtype, tiles))
    shape: tuple[int, ...]       # logical shape; rows = prod(shape[:-1]), cols = shape[-1]
    dtype: DType
    kind: str = "transient"      # "input" | "output" | "tensor" | "parameter" | "transient"
    region: str = "standard"     # preferred region: "interleaved" for AMP weight operands and parameters
    scale: int = 0               # FP8 power-of-two scale of the stored values
    tensor: str | None = None    # the graph tensor whose values it holds, where it holds one
    transpose: bool = False      # holds the tensor's values transposed (a parameter stored as W^T)

    def owner_map(self, tiles: int):
        return self.layout.owner_map(self.shape, self.dtype, tiles)


@dataclass(frozen=True)
class Operand:
    buffer: str                  # buffer name
    offset: int                  # element offset of the run in the buffer's local piece on the vertex's tile
    count: int                   # elements


class Operands:
    """The operands of one buffer, each (offset, count) made once: ``Operands(buffer)(offset, count)``.

    A grid's vertices read few distinct runs (most tiles hold their block at one offset), and an
    operand is immutable, so a builder of many vertices shares them instead of making one per
    vertex (a GEMM core's 5,000 vertices: object creation was most of its build time)."""

    __slots__ = ("buffer", "made")

    def __init__(self, buffer: str):
        self.buffer, self.made = buffer, {}

    def __call__(self, offset: int, count: int) -> Operand:
        got = self.made.get((offset, count))
        if got is None:
            got = self.made[(offset, count)] = Operand(self.buffer, offset, count)
        return got


@dataclass(frozen=True)
class Vertex:
    tile: int
    call: Any                    # a tileplan.kernels call (MatMulCall, BinaryCall, ...)
    ins: tuple[Operand, ...]
    outs: tuple[Operand, ...]
    variant: str = ""            # the kernel variant dispatch chose (filled by the builder)
    cycles: int = 0              # that variant's cycles for this call on the target


@dataclass(frozen=True)
class Copy:
    src: str                     # buffer name
    dst: str                     # buffer name


@dataclass(frozen=True)
class ExchangeStep:
    name: str
    copies: tuple[Copy, ...]


class ComputeStep:
    """One compute set: ``name`` and ``vertices``. Its figures below are worked out once per step
    object, on first use, and kept with it: candidate programs share their compute steps (a GEMM's
    core serves every boundary combination), so each is costed once however many programs hold it.

    A *renamed* step (``ComputeStep.renamed``: the same vertices as another step, with its buffers
    renamed; what ``planner.canon.rename_program`` makes for each of a tower's repeated layers)
    keeps its ``source``: the original step and the name of each of that step's buffers here. Its
    cycles and buffers come from the source's (computed once for all its renamings), its vertices
    are only built if something asks for them, and lowering expands the source once and places
    each renaming by its buffer names (``lowering.lower``). Steps compare by name and vertices,
    renamed or not."""

    __slots__ = ("name", "source", "__dict__")

    def __init__(self, name: str, vertices: tuple[Vertex, ...] = (), source: tuple | None = None):
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "source", source)      # (original step, {its buffer: buffer here}) or None
        if source is None:
            self.__dict__["vertices"] = vertices

    @classmethod
    def renamed(cls, step: "ComputeStep", name: str, rename) -> "ComputeStep":
        """``step`` under another name with every buffer mapped by ``rename`` (a function of names).
        A renamed step's source is the original, so renamings of renamings share one source."""
        if step.source is not None:
            root, names = step.source
            mapping = {b: rename(n) for b, n in names.items()}
        else:
            root, mapping = step, {b: rename(b) for b in step.buffers}
        return cls(name, source=(root, mapping))

    def __setattr__(self, key, value):
        raise AttributeError(f"ComputeStep is immutable (cannot set {key!r})")

    def __reduce__(self):
        if self.source is not None:
            return (ComputeStep, (self.name, (), self.source))
        return (ComputeStep, (self.name, self.vertices))

    def __eq__(self, other):
        if not isinstance(other, ComputeStep):
            return NotImplemented
        return self is other or (self.name == other.name and self.vertices == other.vertices)

    def __hash__(self):
        return hash((self.name, self.vertices))

    def __repr__(self):
        return f"ComputeStep(name={self.name!r}, vertices={len(self.vertices)} vertices)"

    @functools.cached_property
    def vertices(self) -> tuple[Vertex, ...]:
        """A renamed step's vertices: its source's with the operands' buffers renamed (built on first
        use; an operand shared by several vertices stays one object)."""
        root, names = self.source
        ops: dict = {}
        new = object.__new__

        def operand(o):
            got = ops.get(id(o))
            if got is None:      # ``Operand(names[o.buffer], o.offset, o.count)`` without ``__init__``
                n = new(Operand)
                d = n.__dict__
                d.update(o.__dict__)
                d["buffer"] = names[o.buffer]
                got = ops[id(o)] = n
            return got

        vs = []
        for v in root.vertices:
            n = new(type(v))
            d = n.__dict__
            d.update(v.__dict__)
            d["ins"] = tuple([operand(o) for o in v.ins])
            d["outs"] = tuple([operand(o) for o in v.outs])
            vs.append(n)
        return tuple(vs)

    @functools.cached_property
    def buffers(self) -> tuple[str, ...]:
        """The buffers its vertices read or write, sorted."""
        if self.source is not None:
            return tuple(sorted(self.source[1].values()))
        return tuple(sorted({o.buffer for v in self.vertices for o in v.ins + v.outs}))

    @functools.cached_property
    def primitives(self) -> frozenset:
        """The kernel primitives its vertices call."""
        if self.source is not None:
            return self.source[0].primitives
        return frozenset(v.call.primitive for v in self.vertices)

    @functools.cached_property
    def cycles(self) -> int:
        """The slowest tile of the compute set: per tile, the sum of its vertices' cycles."""
        if self.source is not None:
            return self.source[0].cycles
        if not self.vertices:
            return 0
        n = len(self.vertices)
        t = np.fromiter((v.tile for v in self.vertices), dtype=np.int64, count=n)
        c = np.fromiter((v.cycles for v in self.vertices), dtype=np.int64, count=n)
        return int(np.bincount(t, weights=c).max())


@dataclass
class Program:
    """A list of steps over named buffers; fragments concatenate into the whole-graph program."""

    buffers: dict[str, Buffer] = field(default_factory=dict)
    steps: list = field(default_factory=list)
    aliases: dict[str, str] = field(default_factory=dict)   # buffer -> the buffer whose memory it shares
                                                            # (``estimate.detailed.scheduled``); a fragment
                                                            # may declare one: a view of another buffer's
                                                            # memory (a Slice's ``Window``), kept by
                                                            # ``extend``, scheduling and lowering

    def add_buffer(self, buf: Buffer) -> Buffer:
        old = self.buffers.get(buf.name)
        if old is not None and old != buf:
            raise ValueError(f"buffer {buf.name!r} defined twice with different contents")
        self.buffers[buf.name] = buf
        return buf

    def extend(self, other: "Program") -> "Program":
        for b in other.buffers.values():
            self.add_buffer(b)
        self.steps.extend(other.steps)
        for k, v in other.aliases.items():
            if self.aliases.setdefault(k, v) != v:
                raise ValueError(f"buffer {k!r} declared a view of {self.aliases[k]!r} and of {v!r}")
        return self


def alias_root(name: str, aliases: dict[str, str]) -> str:
    """The buffer whose memory ``name`` occupies: follow ``aliases`` (buffer -> buffer it shares
    memory with, from copies that moved nothing) to the end."""
    while name in aliases:
        name = aliases[name]
    return name


def alias_noop_copies(steps: list, buffers: dict[str, Buffer], aliases: dict[str, str],
                      moves_nothing) -> tuple[list, list[str]]:
    """Drop every copy that moves nothing (``moves_nothing(src, dst)``: every element stays on its
    tile at its offset) and make its destination an alias of its source in ``aliases`` (updated in
    place); exchange steps left empty disappear. Returns the new steps and one log line per alias.

    The low pass ``eliminate_noop_copies`` and the planner's whole-graph estimate
    (``estimate.detailed.scheduled``) both run this, with one test of "moves nothing"
    (``estimate.detailed.moves_nothing``)."""
    out, log = [], []
    for step in steps:
        if not isinstance(step, ExchangeStep):
            out.append(step)
            continue
        keep = []
        for cp in step.copies:
            if cp.dst not in aliases and moves_nothing(buffers[cp.src], buffers[cp.dst]):
                aliases[cp.dst] = cp.src
                log.append(f"eliminate_noop_copies: {cp.dst} aliases {cp.src}")
            else:
                keep.append(cp)
        if keep:
            out.append(ExchangeStep(step.name, tuple(keep)))
    return out, log


def group_exchange_steps(steps: list, aliases: dict[str, str]) -> tuple[list, list[str]]:
    """Merge each exchange step into the one before it when no compute lies between them and
    they are independent: no copy of the second reads memory the first writes, or writes memory
    the first touches. Buffers are compared by the memory they occupy (``aliases``: buffer ->
    buffer whose memory it shares). Returns the new steps and one log line per merge.

    The low pass ``group_exchanges`` and the planner's whole-graph estimate both use this, so
    the estimate counts the syncs the lowered program has.
    """
    out, log = [], []
    for step in steps:
        prev = out[-1] if out else None
        if isinstance(step, ExchangeStep) and isinstance(prev, ExchangeStep):
            written = {alias_root(c.dst, aliases) for c in prev.copies}
            touched = written | {alias_root(c.src, aliases) for c in prev.copies}
            if not any(alias_root(c.src, aliases) in written or alias_root(c.dst, aliases) in touched
                       for c in step.copies):
                out[-1] = ExchangeStep(f"{prev.name}+{step.name}", prev.copies + step.copies)
                log.append(f"group_exchanges: {step.name} joins {prev.name}")
                continue
        out.append(step)
    return out, log
