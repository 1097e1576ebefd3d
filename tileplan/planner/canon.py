"""Canonical keys of planning problems: what an op's candidates depend on, without its names.

A tower of identical layers is 27 copies of the same planning problems that differ only in
their tensor and op names and their parameter values. ``op_key`` is the SHA-256 of everything
an op family reads when it makes an op's candidates, with every name replaced by a local
number (tensors numbered in order of first appearance):

- the op: its class and attributes (``dataclasses.fields`` other than name, inputs, output);
- its neighbourhood: the ops consuming its output (the fusions read them: a bias Add after a
  GEMM, a GeLU after a bias Add), with their classes, attributes and tensors, and for a GEMM the
  GEMM reading one of the tensors it may write as its A (its grid-aligned layouts are that
  GEMM's); and whether a GEMM's A may come grid-aligned (``may_read_aligned``);
- every tensor of that neighbourhood: shape, dtype, FP8 scale, role, pinned layout, how many
  ops consume it, and the parameter storage the planner gave it (``storage.parameter_storage``:
  layout, private, transposed).

Parameter values never enter (the planner never reads them). Two ops with the same key get
the same candidates up to renaming (``Renaming``), which is what ``plan`` shares (one costing
per key) and what the plan cache stores (``planner.cache``, keyed by ``op_key``, the target's
``target_key`` and the tileplan version).

``subgraph_key`` hashes a list of ops the same way (a layer), and ``repeated_blocks`` finds the
repeated layers of a graph: the longest run of consecutive equal-keyed blocks of ops.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re

from ..graph.core import Add, Cast, GeLU, Graph, MatMul, Op, Role

_NAMES = ("name", "inputs", "output")


def _attrs(op: Op) -> list:
    return [[f.name, repr(getattr(op, f.name))] for f in dataclasses.fields(op) if f.name not in _NAMES]


def _tensor_sig(graph: Graph, storage: dict, name: str) -> list:
    t = graph.tensors[name]
    st = storage.get(name)
    return [list(t.shape), str(t.dtype), t.scale, str(t.role), repr(t.layout),
            len(graph.consumers.get(name, [])),
            None if st is None else [repr(st.layout), st.private, st.transpose]]


def digest(doc) -> str:
    """SHA-256 (hex) of a JSON document (compact separators)."""
    return hashlib.sha256(json.dumps(doc, separators=(",", ":")).encode()).hexdigest()




class _Numbering:
    """Local numbers for names, in order of first appearance (the canonical renaming)."""

    def __init__(self):
        self.ids: dict[str, int] = {}

    def __call__(self, name: str) -> int:
        return self.ids.setdefault(name, len(self.ids))


def neighbourhood(graph: Graph, op: Op) -> list[Op]:
    """The ops whose structure an op's candidates depend on: the op, then its output's consumers,
    then up to two further GeLU or Cast ops each the only consumer of the one before (the rest of
    a fused epilogue chain the op may do: ``planner.epilogue``); for a MatMul, then the MatMul that
    reads one of those outputs as its A (``a_reader``: the GEMM whose grid a grid-aligned output
    is laid out for, ``planner.catalogue.aligned_layouts``)."""
    near = [op] + [c for c in graph.consumers.get(op.output, []) if c is not op]
    cur = near[-1] if len(near) == 2 else None
    for _ in range(2):
        users = graph.consumers.get(cur.output, []) if cur is not None else []
        if len(users) != 1 or not isinstance(users[0], (GeLU, Cast)) or users[0] in near:
            break
        cur = users[0]
        near.append(cur)
    if isinstance(op, MatMul):
        near += [d for d in dict.fromkeys(a_reader(graph, o.output) for o in near) if d is not None and d not in near]
    return near


def a_reader(graph: Graph, name: str) -> MatMul | None:
    """The MatMul reading ``name`` as its A when it is the tensor's only consumer and the tensor an
    intermediate without a pinned layout: a grid-aligned boundary may hold it as that GEMM's grid
    reads it (``planner.catalogue.aligned_layouts``)."""
    t = graph.tensors[name]
    users = graph.consumers.get(name, [])
    if t.role is not Role.INTERMEDIATE or t.layout is not None or len(users) != 1:
        return None
    d = users[0]
    return d if isinstance(d, MatMul) and d.inputs[0] == name and name not in d.inputs[1:] else None


def may_read_aligned(graph: Graph, op: Op) -> bool:
    """Whether a MatMul's A may come from a GEMM's fragment, which could write it grid-aligned: it
    is written through at most a bias Add, a GeLU and a Cast from a MatMul's product (what a GEMM's
    fragments may write: the product, the bias Add's output, the fused epilogue chain's last
    output; ``planner.catalogue.aligned_producer`` says which GEMM does). Its candidates depend on
    it, so its ``op_key`` says it."""
    if not isinstance(op, MatMul) or a_reader(graph, op.inputs[0]) is not op:
        return False
    todo = [(op.inputs[0], 0)]
    while todo:
        name, depth = todo.pop()
        p = graph.producers.get(name)
        if isinstance(p, MatMul):
            return True
        if isinstance(p, (Add, GeLU, Cast)) and depth < 3:
            todo += [(i, depth + 1) for i in p.inputs if graph.tensors[i].role is Role.INTERMEDIATE]
    return False


def _ops_doc(graph: Graph, storage: dict, ops: list[Op]) -> tuple[list, list[str], list[str]]:
    """(canonical document, op names in order, tensor names in local-number order)."""
    tensors = _Numbering()
    names = _Numbering()
    doc = []
    for o in ops:
        names(o.name)
        doc.append([type(o).__name__, _attrs(o), [tensors(i) for i in o.inputs], tensors(o.output)])
    sigs = [_tensor_sig(graph, storage, n) for n in tensors.ids]
    return [doc, sigs], list(names.ids), list(tensors.ids)


def op_key(graph: Graph, storage: dict, op: Op) -> str:
    """SHA-256 (hex) of an op's planning problem, independent of names and parameter values."""
    doc, _, _ = _ops_doc(graph, storage, neighbourhood(graph, op))
    return digest(["op", doc] + (["A may be grid-aligned"] if may_read_aligned(graph, op) else []))


def op_names(graph: Graph, op: Op) -> list[str]:
    """The names an op's candidates may mention, in canonical order: the neighbourhood's op names,
    then its tensor names. Two ops with the same ``op_key`` map position by position."""
    _, ops, tensors = _ops_doc(graph, {}, neighbourhood(graph, op))
    return ops + tensors


def subgraph_key(graph: Graph, storage: dict, ops: list[Op]) -> str:
    """SHA-256 (hex) of a subgraph (a layer): its ops in order with their attributes and tensors,
    independent of names and parameter values."""
    doc, _, _ = _ops_doc(graph, storage, ops)
    return digest(["subgraph", doc])


def target_key(target) -> str:
    """SHA-256 (hex) of a target's machine figures (its name and description left out)."""
    doc = {k: v for k, v in target.document().items() if k not in ("name", "description")}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=repr).encode()).hexdigest()


def repeated_blocks(graph: Graph, storage: dict) -> list[list[Op]]:
    """The repeated layers of a graph: the longest run of consecutive blocks of ops (in execution
    order) with one ``subgraph_key``, each block at least two ops; [] when nothing repeats. Block
    lengths tried are those at which the sequence of op kinds repeats.

    Design decision (where a block starts): runs that cover as many ops may differ in where their
    blocks start. A prologue that ends with an op of the kind that also ends a layer (a vision
    model's position-embedding Add before layers that end with a residual Add) lets a run start one
    op early, its blocks then cut each layer before its last op, where the residual stream and the
    last sum's other operand are both live. The run kept is the one whose block starts carry the
    fewest live values (``_crossing``: values produced before an op and read at or after it), then
    the earliest (after the most ops covered, then the shortest blocks, as before): the boundary a whole layer has. What crosses a block start is the state the
    selection composes every block from (``select._Search``; each start state is one search of the
    representative block, and two live values with their copies multiply them), and what a pipeline
    stage boundary sends to the next IPU (``planner.stages``)."""
    ops = graph.ops
    kinds = [type(o).__name__ + repr(_attrs(o)) for o in ops]
    crossing = _crossing(graph)
    best: list[list[Op]] = []
    best_rank: tuple = ()
    n = len(ops)
    for size in range(2, n // 2 + 1):
        for start in range(0, size):
            count = (n - start) // size
            covered = sum(len(b) for b in best)
            if count < 2 or count * size < covered or (count * size == covered and size > len(best[0])):
                continue
            same = 1              # blocks whose op kinds repeat the first's (cheap: checked first)
            while same < count and kinds[start + same * size:start + (same + 1) * size] == kinds[start:start + size]:
                same += 1
            if same < 2 or same * size < covered:
                continue
            run: list[list[Op]] = []
            key = None
            for k in range(same):
                block = ops[start + k * size:start + (k + 1) * size]
                # The first and last layers read the graph's input and write its output: compare
                # inner structure (roles of boundary tensors aside) through the ops' attributes,
                # tensor shapes and dtypes.
                doc = _ops_doc(graph, {}, block)[0]
                bkey = digest(doc[0] + [[s[0], s[1], s[2]] for s in doc[1]])
                if key is None:
                    key = bkey
                elif bkey != key:
                    break
                run.append(block)
            if len(run) < 2:
                continue
            rank = (-len(run) * size, size, sum(crossing[start + k * size] for k in range(len(run))))
            if not best or rank < best_rank:          # (ties keep the earlier start: found first)
                best, best_rank = run, rank
        if best and len(best) * len(best[0]) == n:
            break
    return best


def _crossing(graph: Graph) -> list[int]:
    """Per op index i, how many values an op before i writes and an op at i or later reads: what is
    live when op i starts (graph inputs and parameters aside: their layouts are fixed)."""
    index = {op.name: i for i, op in enumerate(graph.ops)}
    delta = [0] * (len(graph.ops) + 1)
    for name, users in graph.consumers.items():
        p = graph.producers.get(name)
        if p is None or p.name not in index or not users:
            continue
        first, last = index[p.name] + 1, max(index[u.name] for u in users)
        if first <= last:
            delta[first] += 1
            delta[last + 1] -= 1
    out, live = [], 0
    for d in delta[:-1]:
        live += d
        out.append(live)
    return out


def renaming(old: list[str], graph: Graph, op: Op) -> "Renaming":
    """The ``Renaming`` from ``old`` (the ``op_names`` of an op with ``op``'s ``op_key``: of this
    graph, or as a plan cache entry stored them) onto ``op``'s names; its first
    ``len(neighbourhood)`` names are op names (``Renaming.op``)."""
    return Renaming(old, op_names(graph, op), ops=len(neighbourhood(graph, op)))


class Renaming:
    """Maps one op's names onto another's with the same ``op_key`` (``op_names`` position by position)
    in strings: buffer names, step names, descriptions. A name matches where it is not part of a
    longer name (the longest name wins; ``.`` joins a name to a suffix such as ``@layout``).

    Design decision: op names map through their own table (``op``; the first ``ops`` names), the
    fields of a candidate that name ops (the op it fuses into, the ops it does the work of) through
    it. One model may name an op and a tensor alike (torch.export: the MatMul ``matmul_1`` writes
    the tensor ``matmul_1``) while another of the same key names them apart (ONNX: ``MatMul_1`` and
    ``MatMul_1_output_0``); one table for both would map that op name onto a tensor name, and a
    plan cache entry written by one import would send the other after a name it has not got. In
    strings (buffers hold tensors) the tensor's mapping wins."""

    def __init__(self, old: list[str], new: list[str], ops: int | None = None):
        # Names both ops share stay in the table, mapped to themselves: a shared tensor ``l.q.x8``
        # (one cast read by the Q, K and V GEMMs) is the longest match in ``l.q.x8@Rows``, so the
        # shorter ``l.q`` -> ``l.k`` does not rename its prefix.
        self.table = dict(zip(old, new))
        self.ops = dict(zip(old[:ops], new[:ops])) if ops is not None else self.table
        self.changes = any(o != n for o, n in self.table.items()) or any(o != n for o, n in self.ops.items())
        if self.changes:
            alts = "|".join(re.escape(o) for o in sorted(self.table, key=len, reverse=True))
            self.pattern = re.compile(rf"(?<![\w.])(?:{alts})(?![\w])")
        self.memo: dict[str, str] = {}

    @property
    def identity(self) -> bool:
        return not self.changes

    def op(self, name):
        """An op name mapped (None stays None; a name not in the table stays as it is)."""
        return self.ops.get(name, name) if name is not None else None

    def __call__(self, s):
        if s is None or not self.changes:
            return s
        out = self.memo.get(s)
        if out is None:
            out = self.memo[s] = self.pattern.sub(lambda m: self.table[m.group(0)], s)
        return out


def rename_program(prog, rename: Renaming):
    """A fragment program with its buffer and step names mapped by ``rename`` (same steps, same
    vertices, same costs: what building it for the renamed op gives). Compute steps are renamed
    as a whole (``ComputeStep.renamed``: their vertices are built only if asked for, and lowering
    expands the original once), so renaming costs per buffer and step, not per vertex."""
    from ..program import ComputeStep, Copy, ExchangeStep, Program
    if prog is None or rename.identity:
        return prog
    out = Program()
    for b in prog.buffers.values():
        out.buffers[rename(b.name)] = dataclasses.replace(b, name=rename(b.name), tensor=rename(b.tensor))
    for st in prog.steps:
        if isinstance(st, ComputeStep):
            out.steps.append(ComputeStep.renamed(st, rename(st.name), rename))
        elif isinstance(st, ExchangeStep):
            out.steps.append(ExchangeStep(rename(st.name), tuple(Copy(rename(c.src), rename(c.dst))
                                                                 for c in st.copies)))
        else:
            raise TypeError(f"rename_program: unknown step {type(st).__name__}")
    out.aliases = {rename(k): rename(v) for k, v in prog.aliases.items()}
    return out


def retarget(cand, rename: Renaming, op_name: str, keep_program: bool = True, lazy: bool = False):
    """A candidate of one op re-targeted to another op with the same ``op_key``: names mapped in
    its fused op and description. Its program: renamed now, or with ``lazy`` when
    ``catalogue.program_of`` first asks for it (``Candidate.template``: only the picked ones are
    renamed), or with ``keep_program=False`` dropped, for ``program_of`` to rebuild from its grid
    choice (GEMMs)."""
    import dataclasses as dc
    program, template = None, None
    if keep_program and cand.program is not None:
        if lazy:
            template = (cand.program, rename)
        else:
            program = rename_program(cand.program, rename)
    elif keep_program and cand.template is not None:
        src, first = cand.template
        template = (src, _Chain(first, rename))
    return dc.replace(cand, op=op_name, fused=_op_name(rename, cand.fused), desc=rename(cand.desc),
                      program=program, template=template, through=tuple(_op_name(rename, t) for t in cand.through))


def retarget_runner_up(r, rename: Renaming, op_name: str):
    """A runner-up re-targeted like its candidate (``retarget``, program dropped) and its reason renamed."""
    return dataclasses.replace(r, candidate=retarget(r.candidate, rename, op_name, False), why=rename(r.why))


def _op_name(rename, name):
    return rename.op(name) if hasattr(rename, "op") else rename(name)


class _Chain:
    """Two renamings one after the other (a re-target of a re-targeted candidate)."""

    def __init__(self, first, second):
        self.first, self.second = first, second
        self.identity = first.identity and second.identity

    def __call__(self, s):
        return self.second(self.first(s))

    def op(self, name):
        return _op_name(self.second, _op_name(self.first, name))
