"""Boundary layouts pinned in a model file (``layout = {...}`` on a tensor) are planned, compiled and
validated: the loader's specs become ``tileplan.layout`` objects where the planner reads them."""

from __future__ import annotations

import json

import pytest

import tileplan
from tileplan.errors import TileplanError

MODEL = """
[model]
name = "pinned"
target = "ipu21-64"

[tensors]
x = {{ shape = [6, 35], dtype = "fp16", role = "input", layout = {{ {layout} }} }}
w = {{ shape = [35, 21], dtype = "fp16", role = "parameter" }}

[[ops]]
name = "act"
op = "tanh"
inputs = ["x"]
output = "h"

[[ops]]
name = "fc"
op = "matmul"
inputs = ["h", "w"]
output = "y"
"""


@pytest.mark.parametrize("layout", [
    'kind = "rows", owners = 4',
    'kind = "intervals", owners = 5, align = 16',
    'kind = "explicit", intervals = [[3, 0, 100], [0, 100, 101], [63, 101, 210]]',
])
def test_a_model_file_with_a_pinned_input_layout_compiles_and_validates(tmp_path, layout):
    # Found by the fuzz test: every model file with a layout pin failed with an AttributeError
    # ('LayoutSpec' object has no attribute 'verify') while planning.
    path = tmp_path / "pinned.toml"
    path.write_text(MODEL.format(layout=layout))
    pkg = tileplan.compile(path, tmp_path / "pkg")
    v = tileplan.validate(pkg, write=False)
    assert v.passed, v.outputs
    assert json.loads((pkg / "report.json").read_text())["estimate"]["cycles"] == v.profile.cycles


def test_a_row_wise_op_reading_an_input_pinned_to_intervals_is_refused_naming_the_op(tmp_path):
    path = tmp_path / "pinned.toml"
    path.write_text(MODEL.format(layout='kind = "intervals", owners = 5').replace('"tanh"', '"softmax"'))
    with pytest.raises(TileplanError, match=r"op 'act' \(softmax\): a row-wise op needs whole rows"):
        tileplan.plan(path)
