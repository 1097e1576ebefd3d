"""Lowering a program by hand: rearrangement kernels, allocation, and what the tile program holds."""

from __future__ import annotations

import numpy as np
import pytest

import tileplan.lowering.lower as lowering
from tileplan.errors import TileplanError
from tileplan.program import Buffer, Copy, ExchangeStep, Program
from tileplan.graph.dtypes import DType
from tileplan.kernels import default_registry
from tileplan.layout import Intervals, Packed
from tileplan.lowering.lower import lower
from tileplan.sim.model import IPUModel
from tileplan.target import load_target

TARGET = load_target("ipu21-64")


def unpack_program(k: int = 64, n: int = 96) -> Program:
    """A resident FP8 parameter in AMP panels copied into a row-major (Intervals) buffer."""
    w = Buffer("w", Packed(32, TARGET.tiles), (k, n), DType.FP8, "parameter", "interleaved", tensor="w")
    rows = Buffer("w@Iv", Intervals(TARGET.tiles), (k, n), DType.FP8, "output", tensor="w")
    return Program({"w": w, "w@Iv": rows}, [ExchangeStep("convert.w", (Copy("w", "w@Iv"),))])


def test_a_conversion_out_of_panels_without_an_unpack_kernel_fails_before_any_expansion(monkeypatch):
    def must_not_run(*args, **kwargs):
        raise AssertionError("lowering went on to allocate or expand the conversion")

    monkeypatch.setattr(lowering, "allocate", must_not_run)
    monkeypatch.setattr(lowering, "expand", must_not_run)
    with pytest.raises(TileplanError) as info:
        lower(unpack_program(), TARGET, registry=default_registry().without("pack", "unpack"))
    message = str(info.value)
    assert "conversion of 'w'" in message
    assert "from Packed(32,64) (panels) to Iv(64,a8) (rows)" in message
    assert "needs the 'unpack' rearrangement kernel" in message
    assert "'ipu21'" in message


def test_a_conversion_out_of_panels_with_the_unpack_kernel_reads_back_row_major():
    k, n = 64, 96
    state = lower(unpack_program(k, n), TARGET)
    model = IPUModel(state.tile_program, TARGET)
    values = (np.arange(k * n) % 200).astype(np.uint8).reshape(k, n)   # distinct bytes per column group
    model.write("w", values.view(DType.FP8.numpy))
    model.run()
    np.testing.assert_array_equal(model.read("w@Iv").view(np.uint8).reshape(k, n), values)


def test_a_buffer_that_does_not_fit_names_the_tile_the_region_and_the_bytes():
    big = Buffer("big", Intervals(1), (TARGET.usable_bytes // 2 + 8,), DType.FP16, "tensor", tensor="t")
    out = Buffer("out", Intervals(2), big.shape, DType.FP16, "output", tensor="t")
    program = Program({"big": big, "out": out}, [ExchangeStep("spread", (Copy("big", "out"),))])
    with pytest.raises(TileplanError) as info:
        lower(program, TARGET)
    message = str(info.value)
    assert message.startswith("tile 0: buffer 'big'")
    assert f"({TARGET.usable_bytes + 16:,} bytes, standard preferred) does not fit" in message
    assert f"the tile has {TARGET.usable_bytes:,} usable bytes" in message


def test_every_buffer_is_aligned_and_clear_of_the_reserve():
    state = lower(unpack_program(), TARGET)
    tp = state.tile_program
    held = tp.size > 0
    assert (tp.addr[held] % TARGET.alignment == 0).all()
    assert (tp.addr[held] >= TARGET.reserve_bytes).all()
    assert ((tp.addr + tp.size)[held] <= TARGET.sram_bytes).all()
    packed = tp.addr[tp.buffer_index("w")]
    assert (packed[packed >= 0] >= TARGET.standard_bytes).all(), "a resident AMP operand prefers interleaved memory"
