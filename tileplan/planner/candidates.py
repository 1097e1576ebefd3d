"""``Candidate``: one implementation of one op, with its costs and its story.

A candidate keeps its boundary layouts, a one-line description, its coarse and
detailed estimates, the fragment program it was costed from (or how to make it)
and its transient per-tile bytes. It is immutable: a changed candidate (re-targeted
to another op, its weights stored in its grid) is a new one. The candidates a
catalogue drops are ``RunnerUp`` records, each with the reason it lost, so that
``tileplan report`` can say why without recomputing.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..estimate.cost import Estimate
from ..program import Program
from .select import Fused  # noqa: F401  (re-exported: candidates carry it)


@dataclass(frozen=True, eq=False)
class Candidate:
    op: str
    ins: tuple                    # layouts of the activation inputs, in input order
    out: Any                      # layout of the output (a Fused marker when it writes the fused op's output)
    desc: str                     # one line: the private implementation
    coarse: Estimate
    estimate: Estimate            # detailed, or the coarse one for a runner-up never detailed
    program: Program | None
    transient: np.ndarray         # int64 [tiles]
    fused: str | None = None      # the op whose output it writes: the GeLU of a bias-GeLU, the bias Add
                                  # a GEMM does in its reduction
    absorbed: bool = False        # an op whose work another does (a GeLU in its bias Add, a bias Add
                                  # in its GEMM's reduction)
    choice: Any = None            # GemmChoice for GEMMs
    boundary: tuple | None = None # GEMMs: (A layout, B layout, C layout) of its chunk (None: private storage)
    detailed: bool = True
    weights: Any = None           # GEMMs: B's pre-arranged storage (``gemm.prearranged_b``) when the
                                  # candidate reads its weights so; None: costed with the default storage
    template: Any = None          # (program, renaming): the program of an op with the same planning
                                  # problem and how to rename it (``canon.retarget``), made on demand
    resident: np.ndarray | None = None     # int64 [tiles]: with ``weights``, that storage's bytes per tile,
                                           # resident over the whole program (interleaved region)
    interleaved: np.ndarray | None = None  # int64 [tiles]: transient bytes in the interleaved region (GEMMs)
    through: tuple = ()           # the ops between it and ``fused`` whose work it also does and whose
                                  # outputs are never stored (the GeLU of a bias-GeLU cast to FP8)

    @functools.cached_property
    def renamed_program(self) -> Program | None:
        """The program of its ``template``, renamed on first use and kept with it."""
        from .canon import rename_program
        src, rename = self.template
        return rename_program(src, rename)

    def __str__(self) -> str:
        names = "AB"
        ins = " ".join(f"{names[i] if i < 2 else i}:{lay}" for i, lay in enumerate(self.ins))
        return f"{ins + ' ' if ins else ''}{self.desc} -> {self.out}"


@dataclass(frozen=True, eq=False)
class RunnerUp:
    """A candidate the catalogue dropped (``lost``: coarse-only, or detailed and dominated), and why."""

    candidate: Candidate
    why: str


@dataclass(frozen=True)
class Storage:
    """How a parameter is kept: ``private`` (resident buffer an op reads directly) or a fixed-layout value."""

    layout: Any
    private: bool
    transpose: bool = False


def activation_inputs(storage: dict, op) -> list[str]:
    """The inputs of an op that are values in the selection (not private parameter storage)."""
    return [name for name in op.inputs if not (name in storage and storage[name].private)]
