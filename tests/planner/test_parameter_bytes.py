"""Early refusal: a model whose parameters alone outweigh the target's usable SRAM is refused before
planning, naming the parameter bytes, the SRAM and the IPUs (and preset) that would hold them."""

from __future__ import annotations

import time

import pytest

from tileplan.errors import TileplanError
from tileplan.graph.loaders import check_parameter_bytes
import tomllib

from tileplan.graph.toml import parse_model
from tileplan.target import load_target

IPU64 = load_target("ipu21-64")          # 64 tiles x 589,824 usable bytes = 37,748,736 bytes


def heavy_model(layers: int, k: int = 2048, n: int = 4096) -> str:
    """``layers`` chained FP16 GEMMs of [k, n] then [n, k] weights: 2 x k x n x 2 bytes each layer."""
    tensors = ['"x" = { shape = [16, %d], dtype = "fp16", role = "input" }' % k]
    ops, x = [], "x"
    for i in range(layers):
        for j, (a, b) in enumerate(((k, n), (n, k))):
            w, y = f"w{i}_{j}", f"y{i}_{j}"
            tensors.append(f'"{w}" = {{ shape = [{a}, {b}], dtype = "fp16", role = "parameter" }}')
            ops.append(f'[[ops]]\nname = "mm{i}_{j}"\nop = "matmul"\ninputs = ["{x}", "{w}"]\noutput = "{y}"')
            x = y
    return ("[model]\nname = \"heavy\"\ntarget = \"ipu21-64\"\noutputs = [\"%s\"]\n\n[tensors]\n" % x
            + "\n".join(tensors) + "\n\n" + "\n\n".join(ops) + "\n")


def heavy(layers: int):
    return parse_model(tomllib.loads(heavy_model(layers)), name="heavy")


def test_parameters_over_the_sram_are_refused_before_planning_naming_the_ipus_and_preset(tmp_path, cli):
    # 2 layers: 4 weights of 16,777,216 bytes = 67,108,864 bytes, 1.78 IPUs of 64 tiles: 2 needed.
    graph = heavy(2)
    t0 = time.perf_counter()
    with pytest.raises(TileplanError) as info:
        check_parameter_bytes(graph, IPU64)
    assert time.perf_counter() - t0 < 0.5            # counted, not planned
    msg = str(info.value)
    assert "67,108,864 bytes" in msg and "37,748,736 bytes of usable SRAM" in msg, msg
    assert msg.endswith("it needs at least 2 IPUs: try --target ipu21-64x2"), msg
    # The command line says so in one line, before any planning.
    path = tmp_path / "heavy.toml"
    path.write_text(heavy_model(2))
    code, out, err = cli("plan", str(path), "-t", "ipu21-64", "-o", str(tmp_path / "plan.json"))
    assert code == 2 and not (tmp_path / "plan.json").exists()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "at least 2 IPUs: try --target ipu21-64x2" in lines[0]


def test_more_ipus_than_any_preset_says_to_write_a_target_file():
    # 3 layers: 100,663,296 bytes: 2.67 IPUs of 64 tiles, 3 needed: the 4-IPU preset is the smallest
    with pytest.raises(TileplanError, match=r"at least 3 IPUs: try --target ipu21-64x4$"):
        check_parameter_bytes(heavy(3), IPU64)
    # 5 layers: 167,772,160 bytes: 4.44 IPUs, 5 needed; the largest such preset has 4.
    with pytest.raises(TileplanError, match=r"at least 5 IPUs: no preset has that many: write a target file "
                                            r"with ipus = 5"):
        check_parameter_bytes(heavy(5), IPU64)


def test_parameters_that_fit_pass_and_a_multi_ipu_target_counts_all_its_ipus():
    graph = heavy(1)    # 33,554,432 bytes: under one 64-tile IPU
    check_parameter_bytes(graph, IPU64)
    check_parameter_bytes(heavy(2), load_target("ipu21-64x2"))
