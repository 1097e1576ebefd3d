"""Seeded random model graphs for the fuzz test: every op kind tileplan plans, as TOML model files.

``generate(seed)`` returns a ``Case``: the model file's text (what a user would write, read back
through ``tileplan.load_model``), a small target's text (7, 16 or 64 tiles, inheriting ``ipu21``),
the selection solver to plan it with (``dp``, one case in five ``cpsat``) and the count of every op
kind and feature the graph holds. The same seed gives the same text.

What the graphs hold: fan-out (a tensor read by several ops, an output that is also read), several
inputs and outputs (a quarter of the inputs with a pinned layout: whole rows, intervals or
explicit element ranges over random tiles), 2-, 3- and 4-D activations (batch dimensions,
attention-style heads), MatMuls with a parameter on either side, transposed operands and activation x activation products
(``q k^T``, batched, batches broadcast both ways), FP8 MatMuls with power-of-two scales on both operands, FP16 MatMuls with
FP32 partials, every broadcast form the Pointwise family plans (dense, scalar, a row ``[N]``, a
trailing ``[..., P, N]``, a column ``[..., M, 1]``, either way round), casts between FP32, FP16 and
FP8, Reshapes, Transposes, Slices of any axis, LayerNorm, Softmax over any axis and the reductions with and without
``keepdims``. Dimensions are small and mostly odd (3..40).

Input domains stay legal and well conditioned for the float64 comparison: validation inputs are
N(0, 0.5), and each tensor carries a rough magnitude (about five standard deviations) and, when it
is positive, a lower bound. Sqrt, Reciprocal and a divisor read a tensor bounded away from zero
(``exp(tanh(x))`` or ``sigmoid(x)`` when the chosen one is not), Exp and Softmax read at most
about 3 (a ``tanh`` first when larger), and tensors that grew large are squashed before products.

What the generator does not make, because tileplan refuses it with an error naming the op (the
documented limitations, README "The model format"): a broadcast where both operands broadcast, or
a column ``[M, 1]`` repeated over a batch; a parameter a batch-broadcasting MatMul would have
to rearrange; a Transpose moving the last axis together with others; an input pinned to
intervals or explicit ranges that a row-wise op reads (it needs whole rows: such an input is
pinned to rows instead); bf16; FP8 operands of pointwise ops.

Run ``python tests/fuzz/dags.py SEED`` to print a case's model file (``--target`` for its target);
``python tests/fuzz/dags.py fanout WIDTH [--gather]`` prints the fan-out model of ``fanout(WIDTH)``.
"""

from __future__ import annotations

import math
import random
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ODD = (3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31, 33, 35, 37, 39)
SIZES = ODD + (4, 8, 12, 16, 24, 32, 40)          # mostly odd, some even
TILES = (7, 16, 64)
LAYOUT_PINS = 0.25                                 # the share of graph inputs with a pinned layout
MAX_ELEMENTS = 4096                                # per tensor: the IPU model runs 50 cases in seconds
UNARY = ("neg", "sqrt", "reciprocal", "exp", "tanh", "erf", "sigmoid", "relu", "gelu")
BINARY = ("add", "sub", "mul", "div", "max")
REDUCE = ("reducesum", "reducemean", "reducemax")
ROWWISE = ("layernorm", "softmax") + REDUCE


@dataclass
class T:
    """A tensor as the generator sees it: shape, dtype, a rough magnitude bound and, for a
    positive tensor, a lower bound (None: it may be zero or negative)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    mag: float = 2.5
    lo: float | None = None
    scale: int = 0

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass
class Case:
    seed: int
    model: str                     # the TOML model file
    target: str                    # the TOML target file (inherits ipu21)
    tiles: int
    solver: str                    # the selection solver: "dp" (the default) or "cpsat"
    kinds: Counter = field(default_factory=Counter)      # op kind -> count
    features: Counter = field(default_factory=Counter)   # feature -> count
    stem: str = ""                 # the model file's name (without .toml); "" for fuzz_SEED

    def write(self, folder: Path) -> tuple[Path, Path]:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        model, target = folder / f"{self.stem or f'fuzz_{self.seed}'}.toml", folder / f"fuzz{self.tiles}.toml"
        model.write_text(self.model)
        target.write_text(self.target)
        return model, target


def _toml(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return repr(v)


class _Builder:
    def __init__(self, seed: int):
        self.seed = seed
        self.rng = random.Random(seed)
        self.declared: list[tuple] = []          # (tensor, its [tensors] line, its pinned layout)
        self.op_tables: list[str] = []           # [[ops]] tables
        self.pool: list[T] = []                  # activations (fp16/fp32) ops may read
        self.tensors: dict[str, T] = {}
        self.roles: dict[str, str] = {}
        self.produced: list[T] = []
        self.readers: dict[str, set[str]] = defaultdict(set)
        self.uses: Counter = Counter()
        self.kinds: Counter = Counter()
        self.features: Counter = Counter()
        self.inputs: list[str] = []
        self.counter = 0
        self.dtype = self.rng.choice(("fp16", "fp16", "fp32"))
        self.tiles = self.rng.choice(TILES)

    # ---- naming and emission ----------------------------------------------------------------

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def declare(self, t: T, role: str) -> T:
        scale = f", scale = {t.scale}" if t.scale else ""
        layout = self.layout(t) if role == "input" and self.rng.random() < LAYOUT_PINS else None
        self.declared.append((t, f'{t.name} = {{ shape = {_toml(list(t.shape))}, dtype = "{t.dtype}", '
                                 f'role = "{role}"{scale}', layout))
        self.tensors[t.name] = t
        self.roles[t.name] = role
        if role == "input":
            self.inputs.append(t.name)
            self.pool.append(t)
        return t

    def layout(self, t: T) -> str:
        """A pinned boundary layout for a graph input: whole rows or intervals over some of the
        tiles, or explicit element ranges (a random partition over random tiles)."""
        kind = self.rng.choice(("rows", "intervals", "explicit"))
        owners = self.rng.randint(1, self.tiles)
        rows = (f'kind = "rows", owners = {owners}',)
        if kind == "rows":
            return rows + rows + ("rows",)
        if kind == "intervals":
            return (f'kind = "intervals", owners = {owners}, align = {self.rng.choice((8, 16))}',) + rows + (kind,)
        cuts = sorted(self.rng.sample(range(1, t.size), min(t.size - 1, self.rng.randint(0, 2 * self.tiles))))
        bounds = [0] + cuts + [t.size]
        ivs = [[self.rng.randrange(self.tiles), a, b] for a, b in zip(bounds, bounds[1:])]
        return (f'kind = "explicit", intervals = {_toml(ivs)}',) + rows + (kind,)

    def declarations(self) -> list[str]:
        """The [tensors] lines. A row-wise op needs whole rows: an input it reads keeps a rows pin
        (tileplan refuses intervals there, naming the op: a documented limitation)."""
        lines = []
        for t, line, layout in self.declared:
            if layout is not None:
                pin, rows, kind = layout
                if kind != "rows" and self.readers[t.name] & set(ROWWISE):
                    pin, kind = rows, "rows"
                self.features[f"pinned {kind} layout"] += 1
                line += f", layout = {{ {pin} }}"
            lines.append(line + " }")
        return lines

    def input(self, shape, dtype=None) -> T:
        return self.declare(T(self.fresh("x"), tuple(shape), dtype or self.dtype), "input")

    def param(self, shape, dtype=None, scale=0) -> T:
        return self.declare(T(self.fresh("p"), tuple(shape), dtype or self.dtype, scale=scale), "parameter")

    def emit(self, kind: str, ins: list[T], out: T, **options) -> T:
        name = self.fresh(f"{kind}_")
        lines = ["[[ops]]", f'name = "{name}"', f'op = "{kind}"',
                 f"inputs = {_toml([t.name for t in ins])}", f'output = "{out.name}"']
        lines += [f"{k} = {_toml(v)}" for k, v in options.items()]
        self.op_tables.append("\n".join(lines))
        self.kinds[kind] += 1
        for t in ins:
            self.uses[t.name] += 1
            self.readers[t.name].add(kind)
        self.tensors[out.name] = out
        self.produced.append(out)
        if out.dtype != "fp8":
            self.pool.append(out)
        return out

    def out(self, like: T, shape=None, dtype=None, mag=None, lo=None) -> T:
        """An op output shaped like ``like`` (an FP8 view of an FP8 tensor keeps its scale)."""
        dtype = dtype or like.dtype
        return T(self.fresh("t"), tuple(like.shape if shape is None else shape), dtype,
                 like.mag if mag is None else mag, lo, like.scale if dtype == like.dtype == "fp8" else 0)

    # ---- choices ------------------------------------------------------------------------------

    def pick(self, rank_min: int = 1, rank_max: int = 4) -> T | None:
        """An activation: usually a recent one (depth), sometimes any (fan-out, branches)."""
        fits = [t for t in self.pool if rank_min <= len(t.shape) <= rank_max]
        if not fits:
            return None
        if self.rng.random() < 0.6:
            return self.rng.choice(fits[-3:])
        return self.rng.choice(fits)

    def size(self, limit: int = 40) -> int:
        return self.rng.choice([s for s in SIZES if s <= limit] or [1])

    def cast(self, t: T, dtype: str, scale: int = 0) -> T:
        if t.dtype == dtype and not scale:
            return t
        options = {"dtype": dtype} | ({"scale": scale} if scale else {})
        out = self.out(t, dtype=dtype, lo=t.lo)
        out.scale = scale if dtype == "fp8" else 0
        if scale:
            self.features["fp8 scale"] += 1
        return self.emit("cast", [t], out, **options)

    def fp8_scale(self, t: T) -> int:
        """A power-of-two exponent putting t's magnitude inside F143's range (max 240), with play."""
        least = math.ceil(math.log2(max(t.mag, 1e-3) / 200.0))
        return max(-8, min(8, least + self.rng.choice((0, 0, 1, 2, 3))))

    # ---- domain guards ----------------------------------------------------------------------

    def bounded(self, t: T, limit: float) -> T:
        if t.mag <= limit:
            return t
        if self.rng.random() < 0.3 and len(t.shape) >= 1 and t.mag < 1e4:
            return self.layernorm(t)
        return self.emit("tanh", [t], self.out(t, mag=1.0))

    def positive(self, t: T) -> T:
        """t itself when it is bounded away from zero, else exp(tanh(t)) or sigmoid(t) (t small)."""
        if t.lo is not None and t.lo >= 0.05 and t.mag <= 100:
            return t
        if self.rng.random() < 0.5:
            t = self.bounded(t, 2.0)
            return self.emit("sigmoid", [t], self.out(t, mag=1.0, lo=1.0 / (1.0 + math.exp(t.mag))))
        t = self.emit("tanh", [t], self.out(t, mag=1.0))
        return self.emit("exp", [t], self.out(t, mag=math.e, lo=1.0 / math.e))

    def same_dtype(self, t: T, dtype: str) -> T:
        return self.cast(t, dtype) if t.dtype != dtype else t

    # ---- op builders (each returns False when it cannot apply) -----------------------------

    def unary(self) -> bool:
        kind = self.rng.choice(UNARY)
        t = self.pick()
        if t is None:
            return False
        options = {}
        if kind == "exp":
            t = self.bounded(t, 3.0)
            out = self.out(t, mag=math.exp(t.mag), lo=math.exp(-t.mag))
        elif kind in ("sqrt", "reciprocal"):
            t = self.positive(t)
            out = self.out(t, mag=math.sqrt(t.mag), lo=math.sqrt(t.lo)) if kind == "sqrt" else \
                self.out(t, mag=1.0 / t.lo, lo=1.0 / t.mag)
        elif kind in ("tanh", "erf"):
            out = self.out(t, mag=1.0)
        elif kind == "sigmoid":
            t = self.bounded(t, 30.0)
            out = self.out(t, mag=1.0, lo=1.0 / (1.0 + math.exp(t.mag)) if t.mag <= 3 else None)
        elif kind == "gelu":
            options["approximate"] = self.rng.choice(("tanh", "erf"))
            t = self.bounded(t, 30.0)
            out = self.out(t)
        else:                                  # neg, relu
            out = self.out(t)
        self.emit(kind, [t], out, **options)
        return True

    def binary(self) -> bool:
        kind = self.rng.choice(BINARY)
        a = self.pick()
        if a is None:
            return False
        a = self.bounded(a, 30.0)
        s = a.shape
        forms = ["dense", "dense", "scalar", "row", "col"] + (["trailing"] if len(s) >= 3 else [])
        form = self.rng.choice(forms)
        shape = {"dense": s, "scalar": self.rng.choice([(1,), (1,) * len(s)]),
                 "row": self.rng.choice([(s[-1],), (1, s[-1])]), "col": s[:-1] + (1,),
                 "trailing": s[1:]}[form]
        if form == "col" and s[-1] == 1 or tuple(np.broadcast_shapes(s, shape)) != tuple(s):
            form, shape = "dense", s
        self.features[f"broadcast {form}"] += 1
        b = self.operand(a, shape, form)
        b = self.bounded(self.same_dtype(b, a.dtype), 30.0)
        swap = form != "dense" and self.rng.random() < 0.3 or form == "dense" and self.rng.random() < 0.5
        x, y = (b, a) if swap else (a, b)
        if kind == "div":
            y = self.positive(y)
        out_shape = s
        if kind in ("add", "sub"):
            mag, lo = x.mag + y.mag, (x.lo + y.lo if kind == "add" and x.lo and y.lo else None)
        elif kind == "mul":
            mag, lo = x.mag * y.mag, (x.lo * y.lo if x.lo and y.lo else None)
        elif kind == "div":
            mag, lo = x.mag / y.lo, (x.lo / y.mag if x.lo else None)
        else:
            mag = max(x.mag, y.mag)
            lo = max(v for v in (x.lo, y.lo) if v) if (x.lo or y.lo) else None
        self.emit(kind, [x, y], T(self.fresh("t"), out_shape, a.dtype, mag, lo))
        return True

    def operand(self, a: T, shape, form: str) -> T:
        """The other operand of a binary op: a parameter, a new input, or an activation of the graph."""
        r = self.rng.random()
        if form == "dense":
            same = [t for t in self.pool if t.shape == a.shape and t.name != a.name]
            if same and r < 0.5:
                self.features["two branches joined"] += 1
                return self.rng.choice(same)
            if r < 0.5:                        # a branch of a itself joined back (x * sigmoid(x))
                self.features["two branches joined"] += 1
                kind = self.rng.choice(("sigmoid", "tanh", "relu", "neg"))
                return self.emit(kind, [a], self.out(a, mag=1.0 if kind in ("sigmoid", "tanh") else a.mag))
        if form == "col" and r < 0.4:
            kind = self.rng.choice(REDUCE)
            self.features["column from a reduction of the same tensor"] += 1
            return self.reduce(a, kind, keepdims=True)
        if r < 0.75:
            return self.param(shape, a.dtype)
        x = self.input(shape, a.dtype)
        if self.rng.random() < 0.5:            # an activation made from the input
            x = self.emit("tanh", [x], self.out(x, mag=1.0))
        return x

    def reduce(self, t: T, kind: str, keepdims: bool) -> T:
        n = t.shape[-1]
        shape = t.shape[:-1] + ((1,) if keepdims or len(t.shape) == 1 else ())
        mag = t.mag * (n if kind == "reducesum" else 1)
        lo = (t.lo * (n if kind == "reducesum" else 1)) if t.lo else None
        options = {} if keepdims and self.rng.random() < 0.5 else {"keepdims": keepdims}
        return self.emit(kind, [t], T(self.fresh("t"), shape, t.dtype, mag, lo), **options)

    def reduction(self) -> bool:
        t = self.pick()
        if t is None:
            return False
        keepdims = self.rng.random() < 0.6
        self.reduce(self.bounded(t, 100.0), self.rng.choice(REDUCE), keepdims)
        return True

    def layernorm(self, t: T | None = None) -> T | bool:
        x = t or self.pick()
        if x is None:
            return False
        c = x.shape[-1]
        gamma, beta = self.param((c,), x.dtype), self.param((c,), x.dtype)
        options = {"epsilon": self.rng.choice((1e-5, 1e-6))} if self.rng.random() < 0.5 else {}
        out = self.emit("layernorm", [x, gamma, beta], self.out(x, mag=8.0), **options)
        return out if t is not None else True

    def softmax(self) -> bool:
        t = self.pick()
        if t is None:
            return False
        t = self.bounded(t, 3.0)
        n = len(t.shape)
        axis = self.rng.choice([-1, -1, n - 1] + list(range(n - 1)) + [-n])
        self.features[f"softmax axis {'last' if axis % n == n - 1 else 'other'}"] += 1
        self.emit("softmax", [t], self.out(t, mag=1.0), **({} if axis == -1 and self.rng.random() < 0.5 else {"axis": axis}))
        return True

    def casting(self) -> bool:
        t = self.pick()
        if t is None:
            return False
        if self.rng.random() < 0.5:            # through FP8 and back (or out of the graph in FP8)
            t8 = self.cast(t, "fp8", self.fp8_scale(t))
            if self.rng.random() < 0.8:
                self.cast(t8, self.rng.choice(("fp16", "fp32")))
            else:
                self.features["fp8 output"] += 1
        else:
            self.cast(t, "fp32" if t.dtype == "fp16" else "fp16")
        return True

    def reshape(self) -> bool:
        t = self.pick(rank_min=2)
        if t is None:
            return False
        s = list(t.shape)
        options = []
        if len(s) >= 3:
            options.append(s[:-3] + [s[-3] * s[-2], s[-1]])          # fold a batch into the rows
        for i in range(len(s) - 1):                               # split a leading axis
            for f in _factors(s[i]):
                if len(s) < 4:
                    options.append(s[:i] + [f, s[i] // f] + s[i + 1:])
        if len(s) < 4:
            for f in _factors(s[-1]):                             # split the last axis (heads)
                options.append(s[:-1] + [f, s[-1] // f])
        options.append(s[:-2] + [s[-2] * s[-1]])                  # merge the last two
        options = [o for o in options if o[-1] <= 512]
        if not options:
            return False
        shape = self.rng.choice(options)
        self.emit("reshape", [t], self.out(t, shape=tuple(shape), lo=t.lo), shape=shape)
        return True

    def transpose(self) -> bool:
        t = self.pick(rank_min=2)
        if t is None:
            return False
        n = len(t.shape)
        if n >= 3 and self.rng.random() < 0.5:                    # permute leading axes, keep the last
            lead = list(range(n - 1))
            while lead == list(range(n - 1)):
                self.rng.shuffle(lead)
            perm = lead + [n - 1]
        else:
            perm = list(range(n - 2)) + [n - 1, n - 2]
        self.emit("transpose", [t], self.out(t, shape=tuple(t.shape[p] for p in perm), lo=t.lo), perm=perm)
        return True

    def recent_axis(self, rng: random.Random):
        """A recent activation and one of its axes, the last one time in two (None: no activation)."""
        fits = self.pool[-4:]
        if not fits:
            return None
        t = rng.choice(fits)
        n = len(t.shape)
        return t, n, (n - 1 if rng.random() < 0.5 else rng.randrange(n))

    def slicing(self, rng: random.Random) -> bool:
        """A Slice of part of one axis of a recent activation, the last axis one time in two."""
        got = self.recent_axis(rng)
        if got is None:
            return False
        t, n, axis = got
        length = t.shape[axis]
        if length < 2:
            return False
        start = rng.randrange(length)
        stop = rng.randint(start + 1, length - (start == 0))      # a proper part of the axis
        shape = t.shape[:axis] + (stop - start,) + t.shape[axis + 1:]
        self.features[f"slice axis {'last' if axis == n - 1 else 'other'}"] += 1
        self.emit("slice", [t], self.out(t, shape=shape, lo=t.lo),
                  axis=axis - n if rng.random() < 0.5 else axis, start=start, stop=stop)
        return True

    def concat(self, rng: random.Random) -> bool:
        """A Concat of a recent activation with another of its type and shape but along ``axis``
        (itself when none is), on the last axis one time in two."""
        got = self.recent_axis(rng)
        if got is None:
            return False
        t, n, axis = got
        mates = [u for u in self.pool if u is not t and u.dtype == t.dtype and u.scale == t.scale
                 and len(u.shape) == n and all(a == b for i, (a, b) in enumerate(zip(u.shape, t.shape)) if i != axis)]
        parts = [t, rng.choice(mates) if mates else t]
        shape = t.shape[:axis] + (sum(p.shape[axis] for p in parts),) + t.shape[axis + 1:]
        lo = None if any(p.lo is None for p in parts) else min(p.lo for p in parts)
        self.features[f"concat axis {'last' if axis == n - 1 else 'other'}"] += 1
        self.emit("concat", parts, self.out(t, shape=shape, mag=max(p.mag for p in parts), lo=lo),
                  axis=axis - n if rng.random() < 0.5 else axis)
        return True

    def gather(self, rng: random.Random) -> None:
        """Token ids ``[B, T]`` or ``[N]`` (an int32 input, seeded 0 or 1 by validate) gathering rows
        of a ``[V, W]`` table in the model's float type."""
        ids = T(self.fresh("ids"), tuple(rng.choice([(rng.randint(1, 4), rng.randint(1, 12)), (rng.randint(1, 30),)])),
                "int32")
        self.declared.append((ids, f'{ids.name} = {{ shape = {_toml(list(ids.shape))}, dtype = "int32", '
                                   f'role = "input"', None))
        self.tensors[ids.name], self.roles[ids.name] = ids, "input"
        self.inputs.append(ids.name)
        width = rng.choice((1, 3, 8, 24, 40, 64))
        table = self.param((rng.randint(2, 50), width))
        self.emit("gather", [table, ids], T(self.fresh("t"), ids.shape + (width,), self.dtype, mag=2.5))

    def matmul(self) -> bool:
        a = self.pick(rank_min=2)
        if a is None:
            return False
        a = self.bounded(a, 8.0)
        mode = self.rng.choice(("weight", "weight", "weight_left", "activations", "activations"))
        types = {"fp16": ("fp16", "fp32", "fp8"), "fp32": ("fp32", "fp8")}[a.dtype]
        types = self.rng.choice(types)        # fp16 -> fp16, fp16 with fp32 partials ("fp32"), fp8, fp32
        compute = {"fp16": "fp16", "fp32": a.dtype, "fp8": "fp8"}[types]
        out_dtype = {"fp16": "fp16", "fp32": "fp32", "fp8": "fp16"}[types]

        def operand(t: T) -> T:
            if compute == "fp8":
                return self.cast(t, "fp8", self.fp8_scale(t))
            return self.same_dtype(t, compute)

        def weight(shape) -> T:
            scale = self.rng.choice((-3, -2, -1, 0, 0, 1, 2)) if compute == "fp8" else 0
            if scale:
                self.features["fp8 scale"] += 1
            return self.param(shape, compute, scale)

        options = {}
        *batch, m, k = a.shape
        if mode == "weight":
            n = self.size()
            shape, mag = tuple(batch) + (m, n), a.mag
            if math.prod(shape) > MAX_ELEMENTS:
                return False
            if batch and self.rng.random() < 0.3:      # the batch folded into rows by a Reshape (FP8 too)
                x = operand(a)
                rows = (math.prod(batch) * m, k)
                x = self.emit("reshape", [x], self.out(x, shape=rows, lo=x.lo), shape=list(rows))
                self.features[f"{x.dtype} view"] += 1
                shape = rows[:1] + (n,)
                ins = [x, weight((k, n))]
                return self.finish_matmul(ins, shape, mag, options, types, compute, out_dtype)
            if self.rng.random() < 0.3:
                options["transpose_b"] = True
                ins = [operand(a), weight((n, k))]
            else:
                ins = [operand(a), weight((k, n))]
        elif mode == "weight_left":                     # W [M2, K2] x activation [..., K2, N2]
            m2 = self.size()
            shape, mag = tuple(batch) + (m2, k), a.mag
            if math.prod(shape) > MAX_ELEMENTS:
                return False
            if self.rng.random() < 0.3:
                options["transpose_a"] = True
                ins = [weight((m, m2)), operand(a)]
            else:
                ins = [weight((m2, m)), operand(a)]
        else:
            pair = self.activation_product(a, options)
            if pair is None:
                return False
            (x, y), shape, mag = pair
            ins = [operand(x)] * 2 if x is y else [operand(x), operand(y)]
            self.features["activation x activation"] += 1
        return self.finish_matmul(ins, shape, mag, options, types, compute, out_dtype)

    def finish_matmul(self, ins, shape, mag, options, types, compute, out_dtype) -> bool:
        if options.get("transpose_b") and self.roles.get(ins[1].name) != "parameter" and self.rng.random() < 0.3:
            b = ins[1]                                 # the key transposed explicitly (FP8 too)
            n = len(b.shape)
            perm = list(range(n - 2)) + [n - 1, n - 2]
            ins[1] = self.emit("transpose", [b], self.out(b, shape=tuple(b.shape[p] for p in perm)), perm=perm)
            del options["transpose_b"]
            self.features[f"{b.dtype} view"] += 1
        if len(shape) >= 3:
            self.features["batched matmul"] += 1
        out = T(self.fresh("t"), shape, out_dtype, mag)
        if out_dtype != compute or self.rng.random() < 0.2:
            options["dtype"] = out_dtype
        self.features[f"matmul {types}"] += 1
        self.emit("matmul", ins, out, **options)
        if self.rng.random() < 0.4:                    # a bias row, as layers have
            self.emit("add", [out, self.param((shape[-1],), out_dtype)], self.out(out, mag=out.mag + 2.5))
            self.features["broadcast row"] += 1
        return True

    def activation_product(self, a: T, options):
        """Two activations to multiply (before casts) with the product's shape and magnitude, or
        None when the product would be too large."""
        *batch, m, k = a.shape
        r = self.rng.random()
        if r < 0.3:                                    # a a^T (the same tensor read twice)
            shape = tuple(batch) + (m, m)
            if math.prod(shape) > MAX_ELEMENTS:
                return None
            options["transpose_b"] = True
            return (a, a), shape, math.sqrt(k) * a.mag * a.mag / 5 * (k ** 0.5 if a.lo else 1)
        others = [t for t in self.pool if t.name != a.name and len(t.shape) >= 2 and t.shape[-1] == k
                  and _batch_ok(batch, list(t.shape[:-2]))
                  and math.prod(_batch_of(batch, list(t.shape[:-2])) + (m, t.shape[-2])) <= MAX_ELEMENTS]
        if others and r < 0.6:                         # q k^T with another activation
            b = self.bounded(self.rng.choice(others), 8.0)
            options["transpose_b"] = True
            shape = _batch_of(batch, list(b.shape[:-2])) + (m, b.shape[-2])
            return (a, b), shape, math.sqrt(k) * a.mag * b.mag / 5
        n = self.size()
        # B's batch: A's, none, or one that broadcasts against A's both ways ([3, 1] with [1, 2]).
        both = [self.rng.choice((d, 1)) if d > 1 else self.rng.choice((1, 2, 3)) for d in batch]
        b_batch = self.rng.choice([list(batch), [], both] + ([list(batch)] if batch else [[self.size(5)]]))
        if b_batch == both and both != list(batch):
            self.features["matmul batch broadcast"] += 1
        shape = _batch_of(batch, b_batch) + (m, n)
        if math.prod(shape) > MAX_ELEMENTS or math.prod(b_batch) * k * n > MAX_ELEMENTS:
            return None
        b = self.input(tuple(b_batch) + (k, n), a.dtype)
        if self.rng.random() < 0.5:
            b = self.emit(self.rng.choice(("tanh", "sigmoid", "relu")), [b], self.out(b))
        return (a, b), shape, math.sqrt(k) * a.mag * b.mag / 5

    # ---- the graph ----------------------------------------------------------------------------

    def build(self) -> Case:
        rng = self.rng
        rank = rng.choice((2, 2, 3, 3, 3, 4))
        dims = [self.size() for _ in range(rank)]
        if rank >= 3:
            dims[0] = rng.choice((1, 2, 3, 4, 5))
        if rank == 4:
            dims[1] = rng.choice((2, 3, 4))
        while math.prod(dims) > MAX_ELEMENTS // 2:
            i = max(range(rank), key=lambda j: dims[j])
            dims[i] = max(1, dims[i] // 2) | 1
        self.input(dims)
        if rng.random() < 0.3:
            self.input([self.size() for _ in range(rng.choice((2, 3)))])
        builders = [self.unary] * 4 + [self.binary] * 4 + [self.matmul] * 4 + [self.reduction, self.layernorm,
                    self.softmax, self.casting, self.reshape, self.transpose] * 1 + [self.softmax, self.reshape]
        steps = rng.randint(4, 10)
        tries = 0
        while steps and tries < 50:
            tries += 1
            if rng.choice(builders)():
                steps -= 1
        # A Slice, in two cases of three, drawn from its own generator (adding it kept the other draws).
        slices = random.Random(f"slice {self.seed}")
        if slices.random() < 2 / 3:
            self.slicing(slices)
        # A Concat, in one case of three, likewise from its own generator.
        joins = random.Random(f"concat {self.seed}")
        if joins.random() < 1 / 3:
            self.concat(joins)
        # A Gather (an embedding: a parameter table's rows by int32 token ids, a new input), in one
        # case of three, from its own generator; its output is a graph output (drawn last, so the
        # cases drawn before it are unchanged).
        lookups = random.Random(f"gather {self.seed}")
        if lookups.random() < 1 / 3:
            self.gather(lookups)
        # Every input must be read; an unread one joins the graph through a pointwise op.
        for name in self.inputs:
            if not self.uses[name]:
                t = self.tensors[name]
                self.emit("relu", [t], self.out(t))
        consumed = set(self.uses)
        produced = self.produced
        outputs = [t.name for t in produced if t.name not in consumed]
        read = [t.name for t in produced if t.name in consumed]
        if read and rng.random() < 0.3:                # an output that other ops also read
            outputs.append(rng.choice(read))
            self.features["output also read"] += 1
        self.features["inputs"] = len(self.inputs)
        self.features["outputs"] = len(outputs)
        self.features["fan-out tensors"] = sum(1 for n, u in self.uses.items() if u > 1)
        self.features["max rank"] = max(len(t.shape) for t in self.tensors.values())
        self.features["odd dimensions"] = sum(1 for t in self.tensors.values() for d in t.shape if d % 2 and d > 1)
        tiles = self.tiles
        model = "\n".join([
            "[model]", f'name = "fuzz_{self.seed}"',
            f'description = "tests/fuzz/dags.py seed {self.seed}: {sum(self.kinds.values())} ops"',
            f"outputs = {_toml(outputs)}", "", "[tensors]", *self.declarations(), "", *(
                t + "\n" for t in self.op_tables)])
        target = (f'inherits = "ipu21"\nname = "fuzz{tiles}"\ndescription = "a {tiles}-tile slice of the C600 '
                  f'(the fuzz test)"\ntiles = {tiles}\n')
        solver = "cpsat" if rng.random() < 0.2 else "dp"
        self.features[f"solver {solver}"] += 1
        return Case(self.seed, model, target, tiles, solver, self.kinds, self.features)


def _factors(n: int) -> list[int]:
    return [f for f in range(2, n) if n % f == 0]


def _batch_ok(a: list[int], b: list[int]) -> bool:
    """A MatMul's batches tileplan plans: the same batch, or one operand a single matrix."""
    return math.prod(b) == 1 and len(b) <= len(a) or a == b or (math.prod(a) == 1 and not a)


def _batch_of(a: list[int], b: list[int]) -> tuple[int, ...]:
    return tuple(int(d) for d in np.broadcast_shapes(tuple(a), tuple(b)))


def fanout(width: int, shape: tuple[int, ...] = (24, 40), tiles: int = 64, solver: str = "dp",
           gather: bool = False) -> Case:
    """One FP16 input read by ``width`` pointwise ops, each result a graph output: in turn an Add of
    its own parameter, a GeLU and a Cast to FP32. The graph is as wide as it is long: its selection
    holds ``width`` live outputs at the end (what ``select.solve_dp``'s state must not multiply).
    With ``gather`` (Adds and GeLUs only) the results are not outputs but summed in a chain of
    Adds, the last sum the one output: ``width`` values live at once that later ops read."""
    rows = [f'x = {{ shape = {_toml(list(shape))}, dtype = "fp16", role = "input" }}']
    ops, outputs = [], []
    kinds: Counter = Counter()
    for k in range(width):
        kind = ("add", "gelu")[k % 2] if gather else ("add", "gelu", "cast")[k % 3]
        out = f"y{k}"
        ins = ["x"]
        extra = ""
        if kind == "add":
            rows.append(f'p{k} = {{ shape = {_toml(list(shape))}, dtype = "fp16", role = "parameter" }}')
            ins.append(f"p{k}")
        elif kind == "cast":
            extra = '\ndtype = "fp32"'
        ops.append(f'[[ops]]\nname = "{kind}_{k}"\nop = "{kind}"\ninputs = {_toml(ins)}\noutput = "{out}"{extra}\n')
        outputs.append(out)
        kinds[kind] += 1
    if gather:
        acc = outputs[0]
        for k, o in enumerate(outputs[1:]):
            ops.append(f'[[ops]]\nname = "sum_{k}"\nop = "add"\ninputs = ["{acc}", "{o}"]\noutput = "s{k}"\n')
            acc = f"s{k}"
        outputs = [acc]
    model = "\n".join(["[model]", f'name = "fanout_{width}{"_gather" if gather else ""}"',
                       f'description = "tests/fuzz/dags.py fanout: one tensor read by {width} ops, each an output"',
                       f"outputs = {_toml(outputs)}", "", "[tensors]", *rows, "", *ops])
    target = (f'inherits = "ipu21"\nname = "fuzz{tiles}"\ndescription = "a {tiles}-tile slice of the C600 '
              f'(the fuzz test)"\ntiles = {tiles}\n')
    features = Counter({"fan-out tensors": 1, "inputs": 1, "outputs": width, "max rank": len(shape)})
    stem = f"fanout_{width}" + ("_gather" if gather else "")
    return Case(-width, model, target, tiles, solver, kinds, features, stem)


def generate(seed: int) -> Case:
    """The fuzz case of ``seed`` (deterministic)."""
    return _Builder(seed).build()


if __name__ == "__main__":
    args = sys.argv[1:]
    case = fanout(int(args[1]), gather="--gather" in args) if args[0] == "fanout" else generate(int(args[0]))
    print(case.target if "--target" in args else case.model, end="")
