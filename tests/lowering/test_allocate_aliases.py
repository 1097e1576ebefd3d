"""Lifetimes of aliased buffers: a view no step touches shares its root's bytes, not a lifetime.

A chain of copies that moved nothing (a fused GEMM's biased product, the Slice window over it, the
projection's output) makes every buffer of the chain an alias of the first; the window in the
middle is then read and written by no step. Its by-use lifetime is the default (0, 0), and it used
to stretch the root's lifetime back to the program's first step: on the 27-layer SigLIP tower at
batch 2 every layer's product stayed live from the start, and the allocation ran out of bytes the
plan never counted.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from tileplan.estimate.memory import program_memory
from tileplan.graph.dtypes import DType
from tileplan.layout import Intervals
from tileplan.lowering.allocate import allocate
from tileplan.program import Buffer, Copy, ExchangeStep, Program
from tileplan.target import load_target

TARGET = replace(load_target("ipu21-64"), reserve_bytes=0, standard_bytes=72, interleaved_bytes=0, sram_bytes=72)


def chain_program():
    """``early`` (48 bytes on tile 0) lives at step 0 only; ``root`` (48 bytes) is written at step 2,
    ``out`` (an alias of ``window``, itself an alias of ``root`` no step touches) read at step 3;
    ``src`` and ``sink`` (8 bytes) carry the steps. Live by step: 56, 16, 64, 56 bytes; had ``root``
    lived from step 0, 104 at step 0, over the 72-byte tile."""
    elements = {"early": 24, "src": 4, "root": 24, "window": 24, "out": 24, "sink": 4}
    buffers = {n: Buffer(n, Intervals(1), (k,), DType.FP16, "transient") for n, k in elements.items()}
    steps = [ExchangeStep("s0", (Copy("early", "src"),)), ExchangeStep("s1", (Copy("src", "sink"),)),
             ExchangeStep("s2", (Copy("src", "root"),)), ExchangeStep("s3", (Copy("out", "sink"),))]
    aliases = {"window": "root", "out": "window"}
    return Program(buffers, steps, aliases=dict(aliases)), aliases


def test_an_untouched_alias_does_not_stretch_its_root_back_to_the_first_step():
    program, aliases = chain_program()
    alloc = allocate(program, TARGET, aliases)
    at = {n: int(alloc.addr[alloc.names.index(n), 0]) for n in alloc.names}
    assert at["root"] == at["window"] == at["out"], at
    held = {n: (at[n], at[n] + int(alloc.size[alloc.names.index(n), 0])) for n in at}
    assert held["early"][1] <= 72 and held["root"][1] <= 72
    assert held["early"][0] < held["root"][1] and held["root"][0] < held["early"][1], \
        "never live at one step: they share bytes (72 could not hold them side by side)"


def test_the_memory_estimate_counts_the_chain_over_the_steps_it_is_used():
    program, _ = chain_program()
    memory = program_memory(program, TARGET)
    assert int(memory.total[0]) == 64, memory.total[0]
