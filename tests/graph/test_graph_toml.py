"""The TOML model format: inference, inline output types, outputs, layouts, errors."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tileplan.errors import TileplanError
from tileplan.graph import DType, Role, Tensor
from tileplan.graph.loaders import load_model
from tileplan.graph.toml import LayoutSpec
from tileplan.target import load_target

MLP = """
[model]
name = "tiny"
target = "ipu21-64"

[tensors]
x = { shape = [8, 16], dtype = "fp16", role = "input" }
w = { shape = [16, 32], dtype = "fp16", role = "parameter" }
b = { shape = [32], dtype = "fp16", role = "parameter" }

# listed out of order on purpose: the loader sorts ops topologically
[[ops]]
name = "bias"
op = "add"
inputs = ["h", "b"]
output = "y"

[[ops]]
name = "fc"
op = "matmul"
inputs = ["x", "w"]
output = "h"
"""


def test_ops_are_sorted_topologically_and_outputs_inferred(write_model):
    g = load_model(write_model(MLP))
    assert [op.name for op in g.ops] == ["fc", "bias"]
    assert g.tensors["h"].shape == (8, 32) and g.tensors["h"].dtype is DType.FP16
    assert g.tensors["h"].role is Role.INTERMEDIATE
    assert g.tensors["y"].role is Role.OUTPUT
    assert g.name == "tiny" and g.target == "ipu21-64"


def test_a_softmax_scale_is_read_and_the_graph_computes_the_softmax_of_the_scaled_scores(write_model, tmp_path):
    from tileplan.graph.serialize import graph_from_dict, graph_to_dict
    from tileplan.sim.reference import reference

    g = load_model(write_model("""
[model]
name = "scores"
[tensors]
x = { shape = [3, 8], dtype = "fp32", role = "input" }
[[ops]]
name = "sm"
op = "softmax"
inputs = ["x"]
output = "y"
softmax_scale = 0.25
"""))
    assert g.op("sm").softmax_scale == 0.25
    x = np.random.default_rng(3).normal(0, 4.0, (3, 8)).astype(np.float32)
    e = np.exp(0.25 * (x - x.max(axis=-1, keepdims=True)))
    np.testing.assert_allclose(reference(g, {"x": x})["y"], e / e.sum(axis=-1, keepdims=True), rtol=1e-6)
    assert graph_from_dict(graph_to_dict(g)).op("sm").softmax_scale == 0.25    # as a package keeps it


def test_model_name_defaults_to_the_file_stem(write_model):
    g = load_model(write_model(MLP.replace('name = "tiny"\n', ""), name="my_mlp.toml"))
    assert g.name == "my_mlp"


def test_inline_dtype_gives_fp32_partials_and_the_roofline_uses_their_rate(write_model):
    g = load_model(write_model(MLP.replace('output = "h"', 'output = "h"\ndtype = "fp32"')
                               .replace('"fp16", role = "parameter" }\n\n#', '"fp32", role = "parameter" }\n\n#')))
    assert g.tensors["h"].dtype is DType.FP32
    t = load_target("ipu21-64")
    assert g.roofline_cycles(t) == pytest.approx(2 * 8 * 16 * 32 / (64 * t.amp_fp16_fp32))


def test_cast_with_inline_dtype_and_scale_creates_the_fp8_tensor(write_model):
    g = load_model(write_model("""
        [model]
        name = "c"
        [tensors]
        x = { shape = [4, 8], dtype = "fp16", role = "input" }
        [[ops]]
        name = "q"
        op = "cast"
        inputs = ["x"]
        output = "x8"
        dtype = "fp8"
        scale = -2
        """))
    t = g.tensors["x8"]
    assert (t.shape, t.dtype, t.scale, t.role) == ((4, 8), DType.FP8, -2, Role.OUTPUT)
    assert g.target is None


def test_cast_output_declared_in_tensors_pins_its_type(write_model):
    g = load_model(write_model("""
        [model]
        name = "c"
        [tensors]
        x = { shape = [4, 8], dtype = "fp16", role = "input" }
        x8 = { shape = [4, 8], dtype = "fp8", scale = 3 }
        [[ops]]
        name = "q"
        op = "cast"
        inputs = ["x"]
        output = "x8"
        """))
    assert g.tensors["x8"].dtype is DType.FP8 and g.tensors["x8"].scale == 3


def test_transpose_b_is_applied_before_shape_inference(write_model):
    g = load_model(write_model(MLP.replace("[16, 32]", "[32, 16]")
                               .replace('output = "h"', 'output = "h"\ntranspose_b = true')))
    assert g.tensors["h"].shape == (8, 32)
    assert g.op("fc").transpose_b and g.flops(g.op("fc")) == 2 * 8 * 16 * 32


def test_role_output_on_a_consumed_tensor_makes_it_an_output_too(write_model):
    g = load_model(write_model(MLP.replace('b = { shape', 'h = { shape = [8, 32], dtype = "fp16", role = "output" }\nb = { shape')))
    assert g.tensors["h"].role is Role.OUTPUT and g.tensors["y"].role is Role.OUTPUT


def test_role_output_missing_from_an_explicit_outputs_list_is_an_error(write_model):
    text = MLP.replace('target = "ipu21-64"', 'target = "ipu21-64"\noutputs = ["y"]').replace(
        'b = { shape', 'h = { shape = [8, 32], dtype = "fp16", role = "output" }\nb = { shape')
    with pytest.raises(TileplanError, match="role 'output' but is not in"):
        load_model(write_model(text))


def test_target_path_is_resolved_relative_to_the_model_file(write_model, tmp_path):
    (tmp_path / "small.toml").write_text('inherits = "ipu21"\nname = "small"\ntiles = 16\n')
    path = write_model(MLP.replace('"ipu21-64"', '"small.toml"'))
    g = load_model(path)
    assert g.target == "small.toml"          # as written: the graph does not depend on the cwd
    assert load_target(g.target, base_dir=path.parent).tiles == 16


def test_errors_are_prefixed_with_the_file_path(write_model):
    path = write_model(MLP.replace('op = "add"', 'op = "addd"'))
    with pytest.raises(TileplanError) as info:
        load_model(path)
    assert str(info.value).startswith(f"{path}: op 'bias': unknown op 'addd'")


def test_missing_file_and_unknown_extension_are_errors(tmp_path):
    with pytest.raises(TileplanError, match="no such model file"):
        load_model(tmp_path / "nothing.toml")
    (tmp_path / "m.txt").write_text("")
    with pytest.raises(TileplanError, match="unknown model file type"):
        load_model(tmp_path / "m.txt")


# ---- layouts ---------------------------------------------------------------------

def _with_layout(layout: str) -> str:
    return MLP.replace('role = "input" }', f'role = "input", layout = {layout} }}')


@pytest.mark.parametrize("text, expected", [
    ('{ kind = "rows", owners = 8 }', LayoutSpec("rows", owners=8)),
    ('{ kind = "intervals", owners = 4 }', LayoutSpec("intervals", owners=4, align=8)),
    ('{ kind = "intervals", owners = 4, align = 16 }', LayoutSpec("intervals", owners=4, align=16)),
    ('{ kind = "explicit", intervals = [[1, 64, 128], [0, 0, 64]] }',
     LayoutSpec("explicit", intervals=((1, 64, 128), (0, 0, 64)))),
])
def test_layouts_are_parsed_into_frozen_specs(write_model, text, expected):
    g = load_model(write_model(_with_layout(text)), target=load_target("ipu21-64"))
    assert g.tensors["x"].layout == expected
    hash(g.tensors["x"].layout)


def test_layout_specs_print_in_one_short_line():
    assert str(LayoutSpec("rows", owners=64)) == "Rows(64)"
    assert str(LayoutSpec("intervals", owners=64, align=8)) == "Intervals(64, align=8)"
    assert str(LayoutSpec("explicit", intervals=((0, 0, 4), (0, 4, 8), (1, 8, 9)))) == "Explicit(3 intervals on 2 tiles)"


def test_layout_owners_beyond_the_target_tiles_are_an_error_with_the_target(write_model):
    path = write_model(_with_layout('{ kind = "intervals", owners = 65 }'))
    load_model(path)                       # no target: nothing to compare with
    with pytest.raises(TileplanError, match="65 owners but the target has 64 tiles"):
        load_model(path, target=load_target("ipu21-64"))


def test_layout_with_an_unknown_key_is_an_error(write_model):
    with pytest.raises(TileplanError, match="unknown key 'ownres'"):
        load_model(write_model(_with_layout('{ kind = "rows", ownres = 4 }')))


def test_to_layout_builds_the_layout_module_objects():
    import tileplan.layout as layout
    assert isinstance(LayoutSpec("rows", owners=4).to_layout(), layout.WholeRows)
    assert isinstance(LayoutSpec("intervals", owners=4, align=8).to_layout(), layout.Intervals)
    assert isinstance(LayoutSpec("explicit", intervals=((0, 0, 4),)).to_layout(), layout.Explicit)


def _partition(size: int, cuts: list[int], tiles: int, seed: int) -> list[tuple[int, int, int]]:
    bounds = sorted({0, size, *(c % size for c in cuts)})
    rng = random.Random(seed)
    ivs = [(rng.randrange(tiles), a, b) for a, b in zip(bounds, bounds[1:])]
    rng.shuffle(ivs)
    return ivs


@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 500), cuts=st.lists(st.integers(0, 10_000), max_size=20),
       seed=st.integers(0, 1000), drop=st.integers(0, 100), data=st.data())
def test_explicit_coverage_accepts_partitions_and_rejects_gaps_and_overlaps(size, cuts, seed, drop, data):
    tensor = Tensor("t", (size,), DType.FP16)
    ivs = _partition(size, cuts, tiles=8, seed=seed)
    LayoutSpec("explicit", intervals=tuple(ivs)).check(tensor, tiles=8)       # a partition passes
    if len(ivs) > 1:
        gap = [iv for i, iv in enumerate(ivs) if i != drop % len(ivs)]
        with pytest.raises(TileplanError, match="not covered"):
            LayoutSpec("explicit", intervals=tuple(gap)).check(tensor, tiles=8)
    i = data.draw(st.integers(0, len(ivs) - 1))
    with pytest.raises(TileplanError, match="more than once"):
        LayoutSpec("explicit", intervals=tuple(ivs + [ivs[i]])).check(tensor, tiles=8)


def test_explicit_coverage_check_is_vectorised_enough_for_a_large_tensor():
    size, n = 4 * 729 * 4304, 1472 * 4
    bounds = np.linspace(0, size, n + 1).astype(int)
    ivs = tuple((i % 1472, int(a), int(b)) for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])))
    LayoutSpec("explicit", intervals=ivs).check(Tensor("g", (4, 729, 4304), DType.FP16), tiles=1472)
