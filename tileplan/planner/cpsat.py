"""The selection problem (``select.Problem``) as a CP-SAT model (OR-tools).

The same problem the DP solves, written as a 0-1 program, for general DAGs and
as a cross-check of the DP. ``select.evaluate`` is the reference semantics:
every family below mirrors one line of it, and ``solve`` re-evaluates the
answer with it.

Sets
----
- ops ``i`` in the problem's order; choices ``c`` of op ``i``;
- per tensor ``t`` its layouts ``L(t)``: the one it is born in when fixed
  (host inputs, parameter values), else the distinct output layouts of its
  producer's choices;
- per activation input ``k`` of op ``i`` (tensor ``t = inputs[i][k]``) the
  layouts ``D(i, k)`` its choices read it in.

Variables
---------
- ``x[i,c]``      in {0,1}: op ``i`` runs choice ``c``;
- ``z[t,L]``      in {0,1}: tensor ``t`` is stored in layout ``L`` (the constant
  1 for a fixed tensor's layout);
- ``w[i,k,D] = sum_{c: ins(i,c)[k] = D} x[i,c]`` is shorthand (an expression,
  not a variable): op ``i`` reads input ``k`` in ``D``; ``r[i,t,D]``: op ``i``
  reads tensor ``t`` in ``D`` (``w`` itself, or their OR when ``i`` reads ``t``
  more than once);
- ``a[t,D,j]``    in {0,1}: some op up to ``j`` read ``t`` in ``D`` (for ops
  from the first reader to ``t``'s last use);
- ``e[t,S,D,j]``  in {0,1}: ``t`` is stored in ``S`` and its converted copy in
  ``D`` exists at op ``j`` (``S != D``, finite nonzero price): made by its first
  reader, kept to ``t``'s last use, read by every later reader of ``D``;
- ``f[t,S,D,j]``  in {0,1}: op ``j`` is the first reader of ``t`` in ``D`` and
  converts it from ``S`` (pays the transient bytes).

Objective
---------
    minimise  sum_{i,c} cycles(i,c) * x[i,c]  +  sum_{t,S,D} conv_cycles(t,S,D) * e[t,S,D,last reader]

(one conversion per tensor and target layout, however many ops read it).

Cycles are the problem's integers (conversion cycles too); nothing is scaled.

Constraints (each family one method, each constraint named)
-----------------------------------------------------------
- ``one_choice[i]``:          sum_c x[i,c] = 1
- ``layout[t,L]``:            z[t,L] = sum_{c: out(i,c) = L} x[i,c]          (i produces t)
- ``read[i,t,D]``:            r = OR_k w[i,k,D]  (a variable only for a tensor read twice)
- ``copy_made[t,D,j]``:       a[t,D,j] = OR(a[t,D,j-1], r[j,t,D])
- ``conversion[t,S,D,j]``:    e = AND(z[t,S], a[t,D,j]);  f = AND(z[t,S], r[j,t,D], NOT a[t,D,j-1])
- ``forbidden[i,k,S,D]``:     z[t,S] + w[i,k,D] <= 1   when S != D and S or D is
                              ``select.Fused`` (a fused value converts to nothing)
                              or the price is infinite
- ``memory[i,p]``:            for every tile p, at op i:
      resident[p] + sum_{t live at i} sum_L bytes(t,L)[p] z[t,L]
      + sum_{t,S,D} bytes(t,D)[p] e[t,S,D,i] + conv_transient(t,S,D)[p] f[t,S,D,i]
      + sum_c (transient(i,c)[p] + bytes(out_i, out(i,c))[p]) x[i,c]   <=  capacity
      + sum_{j,c} resident(j,c)[p] x[j,c]      (storage a choice holds all along)
  where ``t`` is live at ``i`` when it exists before op ``i`` (fixed, or made by
  an earlier op) and its last use is ``i`` or later; a ``Fused`` output adds no
  bytes; a conversion adds memory only when its price is nonzero (as in
  ``evaluate``). Every coefficient is >= 0 and every variable 0-1, so of the
  per-tile columns (constant; coefficients) identical ones are one constraint
  (``np.unique`` over the columns) and a column that another bounds from above
  entry by entry is implied and dropped; columns that cannot exceed the
  capacity even with every variable at 1 are dropped too. A 1472-tile graph
  keeps a handful of rows per op.
- ``interleaved[i,p]``:       when the problem checks the region, for every tile p, at op i:
      resident_interleaved[p] + sum_{j,c} resident(j,c)[p] x[j,c]
      + sum_c interleaved(i,c)[p] x[i,c]   <=  interleaved_capacity
  (the same column reduction).

Solving is deterministic (one worker, fixed seed, no interleaved search): the
same problem gives the same picks, unless the time limit cuts the search
(then the best solution found is returned with ``exact = False``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from ortools.sat.python import cp_model

from ..errors import TileplanError
from .select import INF, Fused, Problem, Solution, evaluate, fits

SEED = 0


@dataclass(frozen=True, eq=False)
class _Conversion:
    """One possible conversion of op ``op``'s input ``k`` (tensor ``tensor``) from ``src`` to ``dst``."""

    op: str
    k: int
    tensor: str
    src: Any
    dst: Any
    cycles: int
    memory: np.ndarray | None      # int64 [tiles] bytes while op runs, None when it adds none


@dataclass(eq=False)
class _Copy:
    """The converted copy of ``tensor`` from ``src`` to ``dst``: made by the first op reading it in
    ``dst``, kept to the tensor's last use. ``e[j]``: it exists at op j; ``f[j]``: op j makes it."""

    tensor: str
    src: Any
    dst: Any
    cycles: int
    transient: np.ndarray | None   # int64 [tiles] while it is made, None when it adds no memory
    bytes: np.ndarray | None       # int64 [tiles] of the copy, None when it adds no memory
    e: dict = None
    f: dict = None


class SelectionModel:
    """The CP-SAT model of one ``Problem``: build with the ``add_*`` methods, then ``solve()``."""

    def __init__(self, problem: Problem):
        self.problem = problem
        self.model = cp_model.CpModel()
        self.tiles = int(np.asarray(problem.resident).size)
        self.last = problem.last_use()
        self.born: dict[str, int] = {t: -1 for t in problem.fixed}
        for i, op in enumerate(problem.ops):
            self.born[problem.output[op]] = i
        for op in problem.ops:
            for t in problem.inputs[op]:
                if t not in self.born:
                    raise ValueError(f"op {op!r} reads {t!r}, which is neither fixed nor made by an op")
        self.x: dict[tuple[str, int], cp_model.IntVar] = {}
        self.z: dict[str, dict[Any, Any]] = {}                 # tensor -> layout -> var (or 1 when fixed)
        self.copies: list[_Copy] = []
        self.reads: dict = {}                                  # (op, tensor, layout) -> 0-1 expression
        self.forbidden: list[_Conversion] = []

    # ---- variables ------------------------------------------------------------------------

    def add_variables(self) -> None:
        p = self.problem
        for op in p.ops:
            for c in range(len(p.choices[op])):
                self.x[op, c] = self.model.new_bool_var(f"x[{op},{c}]")
        for t, lay in p.fixed.items():
            self.z[t] = {lay: 1}
        for op in p.ops:
            t = p.output[op]
            self.z[t] = {}
            for ch in p.choices[op]:
                if ch.out not in self.z[t]:
                    self.z[t][ch.out] = self.model.new_bool_var(f"z[{t},{ch.out}]")
        index = {op: i for i, op in enumerate(p.ops)}
        found: dict = {}                                       # (t, src, dst) -> _Copy
        for op in p.ops:
            for k, t in enumerate(p.inputs[op]):
                for src in self.z[t]:
                    for dst in self.wanted(op, k):
                        if src == dst:
                            continue
                        cyc, tr = p.convert(t, src, dst)
                        if cyc == INF:
                            self.forbidden.append(_Conversion(op, k, t, src, dst, 0, None))
                            continue
                        if not cyc:
                            continue        # free and memoryless (evaluate adds nothing): no variable
                        if (t, src, dst) not in found:
                            mem = None if tr is None else np.asarray(tr, np.int64)
                            found[t, src, dst] = _Copy(t, src, dst, int(cyc), mem,
                                                       None if tr is None else np.asarray(p.tile_bytes(t, dst)))
        for cp in found.values():
            readers = sorted({index[op] for op in p.ops for k, t in enumerate(p.inputs[op])
                              if t == cp.tensor and cp.dst in self.wanted(op, k)})
            name = f"{cp.tensor},{cp.src}->{cp.dst}"
            cp.e = {j: self.model.new_bool_var(f"e[{name},{p.ops[j]}]")
                    for j in range(readers[0], min(max(self.last[cp.tensor], readers[-1]), len(p.ops) - 1) + 1)}
            cp.f = {j: self.model.new_bool_var(f"f[{name},{p.ops[j]}]") for j in readers}
            cp.readers = readers
            self.copies.append(cp)

    def read(self, op: str, t: str, dst):
        """Op reads tensor t in layout dst: ``w`` of its one input, or a variable for their OR."""
        key = (op, t, str(dst), id(dst))
        if key not in self.reads:
            ks = [k for k, u in enumerate(self.problem.inputs[op]) if u == t and dst in self.wanted(op, k)]
            if len(ks) == 1:
                self.reads[key] = self.w(op, ks[0], dst)
            else:
                r = self.model.new_bool_var(f"r[{op},{t},{dst}]")
                ws = [self.w(op, k, dst) for k in ks]
                for k, w in zip(ks, ws):
                    self.model.add(r >= w).with_name(f"read[{op},{t},{dst}].{k}")
                self.model.add(r <= sum(ws)).with_name(f"read[{op},{t},{dst}].any")
                self.reads[key] = r
        return self.reads[key]

    def wanted(self, op: str, k: int) -> list:
        """The layouts op's choices read input k in, in first-seen order."""
        out: list = []
        for ch in self.problem.choices[op]:
            if ch.ins[k] not in out:
                out.append(ch.ins[k])
        return out

    def w(self, op: str, k: int, dst) -> cp_model.LinearExpr:
        """Op reads input k in layout dst."""
        return sum(self.x[op, c] for c, ch in enumerate(self.problem.choices[op]) if ch.ins[k] == dst)

    # ---- constraint families --------------------------------------------------------------

    def add_one_choice_constraints(self) -> None:
        for op in self.problem.ops:
            n = len(self.problem.choices[op])
            self.model.add(sum(self.x[op, c] for c in range(n)) == 1).with_name(f"one_choice[{op}]")

    def add_layout_constraints(self) -> None:
        p = self.problem
        for op in p.ops:
            t = p.output[op]
            for lay, z in self.z[t].items():
                picks = [self.x[op, c] for c, ch in enumerate(p.choices[op]) if ch.out == lay]
                self.model.add(z == sum(picks)).with_name(f"layout[{t},{lay}]")

    def add_conversion_constraints(self) -> None:
        p = self.problem
        for cp in self.copies:
            z = self.z[cp.tensor][cp.src]
            name = f"{cp.tensor},{cp.src}->{cp.dst}"
            made = None                      # a[t,D,j-1]: an expression over earlier readers
            for j in sorted(cp.e):
                op = p.ops[j]
                reads = j in cp.f
                r = self.read(op, cp.tensor, cp.dst) if reads else None
                a = self.model.new_bool_var(f"a[{name},{op}]")
                parts = ([made] if made is not None else []) + ([r] if reads else [])
                for q, part in enumerate(parts):
                    self.model.add(a >= part).with_name(f"copy_made[{name},{op}].{q}")
                self.model.add(a <= sum(parts)).with_name(f"copy_made[{name},{op}].any")
                e = cp.e[j]
                self.model.add(e >= z + a - 1).with_name(f"conversion[{name},{op}].exists")
                self.model.add(e <= z).with_name(f"conversion[{name},{op}].stored")
                self.model.add(e <= a).with_name(f"conversion[{name},{op}].made")
                if reads:
                    f = cp.f[j]
                    before = made if made is not None else 0
                    self.model.add(f >= z + r - before - 1).with_name(f"conversion[{name},{op}].first")
                    self.model.add(f <= z).with_name(f"conversion[{name},{op}].first_stored")
                    self.model.add(f <= r).with_name(f"conversion[{name},{op}].first_read")
                    self.model.add(f + before <= 1).with_name(f"conversion[{name},{op}].first_only")
                made = a

    def add_forbidden_conversion_constraints(self) -> None:
        for conv in self.forbidden:
            z, w = self.z[conv.tensor][conv.src], self.w(conv.op, conv.k, conv.dst)
            self.model.add(z + w <= 1).with_name(f"forbidden[{conv.op},{conv.k},{conv.src}->{conv.dst}]")

    def add_memory_constraints(self) -> None:
        p = self.problem
        for i, op in enumerate(p.ops):
            const = np.asarray(p.resident, np.int64).copy()
            terms: dict[int, tuple[Any, np.ndarray]] = {}      # variable index -> (variable, coefficients)

            def add(var, coef):
                if isinstance(var, int):
                    const[:] += var * np.asarray(coef, np.int64)
                elif np.any(coef):
                    old = terms.get(var.index, (var, 0))[1]
                    terms[var.index] = (var, old + np.asarray(coef, np.int64))

            for t, b in self.born.items():
                if b < i and self.last.get(t, -1) >= i:
                    for lay, z in self.z[t].items():
                        add(z, p.tile_bytes(t, lay))
            for cp in self.copies:
                if cp.bytes is not None and i in cp.e:
                    add(cp.e[i], cp.bytes)
                if cp.transient is not None and i in cp.f:
                    add(cp.f[i], cp.transient)
            out = p.output[op]
            for c, ch in enumerate(p.choices[op]):
                coef = np.asarray(ch.transient, np.int64)
                if not isinstance(ch.out, Fused):
                    coef = coef + p.tile_bytes(out, ch.out)
                add(self.x[op, c], coef)
            self._held(add)
            self._rows(const, terms, p.capacity, f"memory[{op}")

    def add_interleaved_constraints(self) -> None:
        p = self.problem
        if p.interleaved_capacity is None:
            return
        for op in p.ops:
            const = p.interleaved_base(self.tiles).copy()
            terms: dict[int, tuple[Any, np.ndarray]] = {}

            def add(var, coef):
                if np.any(coef):
                    old = terms.get(var.index, (var, 0))[1]
                    terms[var.index] = (var, old + np.asarray(coef, np.int64))

            for c, ch in enumerate(p.choices[op]):
                if ch.interleaved is not None:
                    add(self.x[op, c], ch.interleaved)
            self._held(add)
            self._rows(const, terms, p.interleaved_capacity, f"interleaved[{op}")

    def _held(self, add) -> None:
        """Every choice's storage held over the whole program, as terms of one op's row."""
        for op in self.problem.ops:
            for c, ch in enumerate(self.problem.choices[op]):
                if ch.resident is not None:
                    add(self.x[op, c], ch.resident)

    def _rows(self, const, terms, capacity: int, name: str) -> None:
        variables = [v for v, _ in terms.values()]
        coefs = np.stack([c for _, c in terms.values()]) if terms else np.zeros((0, self.tiles), np.int64)
        for tile, col in _binding_columns(const, coefs, capacity):
            expr = sum(int(a) * v for a, v in zip(col, variables) if a)
            self.model.add(expr <= capacity - int(const[tile])).with_name(f"{name},tile {tile}]")

    # ---- objective and solving ------------------------------------------------------------

    def set_objective(self) -> None:
        p = self.problem
        cost = [int(ch.cycles) * self.x[op, c] for op in p.ops for c, ch in enumerate(p.choices[op])]
        cost += [cp.cycles * cp.e[cp.readers[-1]] for cp in self.copies]
        self.model.minimize(sum(cost))

    def run(self, time_limit: float) -> tuple[cp_model.CpSolver, int]:
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = 1
        solver.parameters.random_seed = SEED
        solver.parameters.interleave_search = False
        solver.parameters.max_time_in_seconds = float(time_limit)
        status = solver.solve(self.model)
        return solver, status

    def extract_and_validate(self, solver: cp_model.CpSolver, status: int) -> Solution | None:
        if status == cp_model.INFEASIBLE:
            return None
        if status == cp_model.MODEL_INVALID:
            raise RuntimeError(f"CP-SAT: invalid model: {self.model.validate()}")
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            raise TileplanError(f"the CP-SAT selection found no solution within its time limit "
                                f"({solver.parameters.max_time_in_seconds:g} s); try --solver dp")
        p = self.problem
        picks = {}
        for op in p.ops:
            chosen = [c for c in range(len(p.choices[op])) if solver.boolean_value(self.x[op, c])]
            assert len(chosen) == 1, (op, chosen)
            picks[op] = chosen[0]
        sol = evaluate(p, picks)
        objective = round(solver.objective_value)
        if sol.cycles != objective or not fits(p, sol):
            raise RuntimeError(f"CP-SAT solution disagrees with select.evaluate: model {objective:,} cycles, "
                               f"evaluate {sol.cycles:,} cycles, peak {sol.peak:,} of {p.capacity:,} bytes")
        sol.exact = status == cp_model.OPTIMAL
        return sol

    def build(self) -> "SelectionModel":
        self.add_variables()
        self.add_one_choice_constraints()
        self.add_layout_constraints()
        self.add_conversion_constraints()
        self.add_forbidden_conversion_constraints()
        self.add_memory_constraints()
        self.add_interleaved_constraints()
        return self

    def solve(self, time_limit: float = 30.0) -> Solution | None:
        self.set_objective()
        solver, status = self.run(time_limit)
        return self.extract_and_validate(solver, status)


def _binding_columns(const: np.ndarray, coefs: np.ndarray, capacity: int) -> list[tuple[int, np.ndarray]]:
    """The tiles whose memory rows are not implied by another's: (representative tile, coefficients).

    A column is (constant, coefficients) of one tile. Identical columns collapse to
    their first tile; a column bounded entry by entry by another column is implied
    (all variables are 0-1 and all coefficients >= 0); a column whose constant plus
    every coefficient fits the capacity can never bind.
    """
    full = np.vstack([const[None, :], coefs])
    cols, first = np.unique(full, axis=1, return_index=True)
    can_bind = cols.sum(axis=0) > capacity
    cols, first = cols[:, can_bind], first[can_bind]
    order = np.lexsort((first, -cols.sum(axis=0)))      # largest first: only they can dominate later ones
    kept: list[int] = []
    for j in order.tolist():
        if kept and np.any(np.all(cols[:, kept] >= cols[:, [j]], axis=0)):
            continue
        kept.append(j)
    kept.sort(key=lambda j: first[j])
    return [(int(first[j]), cols[1:, j]) for j in kept]


def solve_cpsat(problem: Problem, time_limit: float = 30.0) -> Solution | None:
    """The optimum of ``problem`` by CP-SAT, or None when no assignment fits (or converts)."""
    return SelectionModel(problem).build().solve(time_limit)
