"""Bad model files, targets and torch factories: one line naming the file, exit 2, no traceback.

Each case is an edit of a small valid model (or target) written to a temporary
file, run through ``tileplan show`` (which loads and checks everything a plan or
compile would) or ``tileplan compile``.
"""

from __future__ import annotations

import pytest

from reliability_corpus import FIXTURES, assert_refused

MODEL = """\
[model]
name = "tiny"
target = "ipu21-64"

[tensors]
x = { shape = [32, 64], dtype = "fp16", role = "input" }
w = { shape = [64, 48], dtype = "fp16", role = "parameter" }

[[ops]]
name = "fc"
op = "matmul"
inputs = ["x", "w"]
output = "y"
"""

# (case, text, words the error must name besides the file)
MODEL_CASES = [
    ("op is a list", MODEL.replace('op = "matmul"', 'op = ["matmul"]'), ["unknown op ['matmul']"]),
    ("op is a table", MODEL.replace('op = "matmul"', 'op = { kind = "matmul" }'), ["unknown op"]),
    ("op is a number", MODEL.replace('op = "matmul"', "op = 3"), ["unknown op 3"]),
    ("a dimension of 10^12", MODEL.replace("[32, 64]", "[1000000000000, 64]"), ["tensor 'x'", "limit of 2^36"]),
    ("a dimension of 2^63", MODEL.replace("[32, 64]", "[9223372036854775807, 64]"), ["tensor 'x'", "limit"]),
    ("dimensions whose product overflows int64", MODEL.replace("[32, 64]", "[4294967296, 4294967296, 64]"),
     ["tensor 'x'", "limit"]),
    ("an inferred output too large", MODEL.replace("[32, 64]", "[300000, 64]").replace("[64, 48]", "[64, 300000]"),
     ["tensor 'y'", "limit"]),
    ("a tensor larger than the whole target", MODEL.replace("[32, 64]", "[4000000, 64]"),
     ["tensor 'x'", "whole usable SRAM", "ipu21-64"]),
    ("a zero dimension", MODEL.replace("[32, 64]", "[0, 64]"), ["zero dimension"]),
    ("a negative dimension", MODEL.replace("[32, 64]", "[-4, 64]"), ["negative dimension"]),
    ("a boolean dimension", MODEL.replace("[32, 64]", "[true, 64]"), ["integers"]),
    ("an array nested 100,000 deep", MODEL + "junk = " + "[" * 100000 + "]" * 100000 + "\n", ["nested too deeply"]),
    ("a tensor name with NUL", MODEL.replace('x = {', '"x\\u0000y" = {').replace('["x", "w"]', '["x\\u0000y", "w"]'),
     ["control character U+0000"]),
    ("a tensor name with a newline", MODEL.replace('x = {', '"x\\ny" = {').replace('["x", "w"]', '["x\\ny", "w"]'),
     ["control character U+000A"]),
    ("an op name with an escape character", MODEL.replace('name = "fc"', 'name = "f\\u001bc"'),
     ["control character U+001B"]),
    ("not UTF-8", None, ["not UTF-8"]),
    ("a target that does not exist", MODEL.replace('"ipu21-64"', '"nowhere.toml"'), ["unknown target 'nowhere.toml'"]),
]


@pytest.mark.parametrize("case, text, words", MODEL_CASES, ids=[c[0] for c in MODEL_CASES])
def test_show_refuses_a_bad_model_file_naming_it(cli, tmp_path, case, text, words):
    path = tmp_path / "model.toml"
    if text is None:
        path.write_bytes(b"\xff\xfe[model]\n")
    else:
        path.write_text(text)
    assert_refused(cli("show", path), path, *words)


def test_a_model_file_that_is_a_folder_is_refused(cli, tmp_path):
    (tmp_path / "m.toml").mkdir()
    assert_refused(cli("show", tmp_path / "m.toml"), tmp_path / "m.toml")


def test_an_unreadable_model_file_is_refused(cli, tmp_path):
    import os
    path = tmp_path / "m.toml"
    path.write_text(MODEL)
    path.chmod(0)
    if os.access(path, os.R_OK):
        pytest.skip("running as root: permissions do not stop reads")
    assert_refused(cli("show", path), path)


# ---- targets -------------------------------------------------------------------------------------

TARGET_CASES = [
    ("clock_hz = 0", "clock_hz = 0", "clock_hz"),
    ("clock_hz is NaN", "clock_hz = nan", "clock_hz"),
    ("clock_hz is infinite", "clock_hz = inf", "clock_hz"),
    ("clock_hz is huge", "clock_hz = 1e300", "clock_hz"),
    ("tiles = 0", "tiles = 0", "tiles"),
    ("tiles is a float", "tiles = 64.0", "tiles"),
    ("tiles beyond int64", "tiles = 9223372036854775807", "tiles"),
    ("workers = 0", "workers = 0", "workers"),
    ("negative sync cycles", "[exchange]\nsync_cycles = -5", "sync_cycles"),
    ("zero exchange rate", "[exchange]\nbytes_per_cycle = 0", "exchange_bytes_per_cycle"),
    ("negative send control cycles", "[exchange]\nsend_control_cycles = -1", "send_control_cycles"),
    ("zero local copy rate", "[compute]\nlocal_copy_bytes_per_cycle = 0", "local_copy_bytes_per_cycle"),
    ("negative kernel launch", "[compute]\nkernel_launch_cycles = -2", "kernel_launch_cycles"),
    ("zero AMP fp16", "[amp]\nfp16 = 0", "amp_fp16"),
    ("negative AMP fp8", "[amp]\nfp8 = -256", "amp_fp8"),
    ("zero grain", "[amp]\ngrain_fp16 = 0", "grain_fp16"),
    ("negative reserve", "reserve_bytes = -1", "reserve_bytes"),
    ("description is a number", "description = 5", "description"),
]


@pytest.mark.parametrize("case, line, field", TARGET_CASES, ids=[c[0] for c in TARGET_CASES])
def test_machines_refuses_a_target_figure_that_is_not_positive_and_finite(cli, tmp_path, case, line, field):
    path = tmp_path / "quarter.toml"
    head, _, table = line.rpartition("\n")
    text = 'inherits = "ipu21-64"\nname = "quarter"\n'
    text = text + (f"{head}\n{table}\n" if head else f"{table}\n")
    path.write_text(text)
    assert_refused(cli("machines", path), path, field)


def test_a_model_naming_a_bad_target_file_names_the_target_file(cli, tmp_path):
    (tmp_path / "slow.toml").write_text('inherits = "ipu21-64"\nname = "slow"\nclock_hz = 0\n')
    model = tmp_path / "m.toml"
    model.write_text(MODEL.replace('"ipu21-64"', '"slow.toml"'))
    assert_refused(cli("show", model), "slow.toml", "clock_hz")


def test_a_model_target_path_is_stored_as_written_whatever_the_working_directory(cli, tmp_path, monkeypatch):
    import json
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "quarter.toml").write_text('inherits = "ipu21-64"\nname = "quarter"\ntiles = 32\n')
    model = tmp_path / "models" / "m.toml"
    model.write_text(MODEL.replace('"ipu21-64"', '"quarter.toml"'))
    outputs = []
    for cwd in (tmp_path, tmp_path / "models"):
        monkeypatch.chdir(cwd)
        out = tmp_path / f"pkg{len(outputs)}"
        code, _, err = cli("compile", model, "-o", out, "-j", "1")
        assert code == 0, err
        outputs.append(out)
    a, b = ((o / "model.json").read_bytes() for o in outputs)
    assert a == b and json.loads(a)["target"] == "quarter.toml"
    assert (outputs[0] / "manifest.json").read_bytes() == (outputs[1] / "manifest.json").read_bytes()


# ---- graphs without a MatMul -----------------------------------------------------------------------

def test_a_graph_without_a_matmul_compiles_and_validates_without_a_division_by_zero(cli, tmp_path):
    path = tmp_path / "add.toml"
    path.write_text('[model]\nname = "add"\ntarget = "ipu21-64"\n[tensors]\n'
                    'a = { shape = [16, 32], dtype = "fp16", role = "input" }\n'
                    'b = { shape = [32], dtype = "fp16", role = "parameter" }\n'
                    '[[ops]]\nname = "add"\nop = "add"\ninputs = ["a", "b"]\noutput = "y"\n')
    for argv in (("show", path), ("compile", path, "-o", tmp_path / "pkg", "-j", "1"),
                 ("validate", tmp_path / "pkg"), ("report", tmp_path / "pkg")):
        code, out, err = cli(*argv)
        assert code == 0 and err == "", (argv, err)


# ---- ONNX ------------------------------------------------------------------------------------------

def test_an_onnx_zero_dimension_is_not_called_dynamic_and_a_shape_it_contradicts_is_named(cli, tmp_path):
    """A zero dimension is ONNX's zero-size tensor (tests/graph/test_zero_size.py), not a dynamic one;
    this file's value_info still declares the batch of 96, which the zero contradicts."""
    onnx = pytest.importorskip("onnx")
    model = onnx.load(str(FIXTURES / "mlp_smoke_fp8.onnx"))
    dim = model.graph.input[0].type.tensor_type.shape.dim[0]
    dim.dim_value = 0
    path = tmp_path / "zero.onnx"
    onnx.save(model, str(path))
    line = assert_refused(cli("show", path), path, "is declared with shape [96, 144] but the op gives [0, 144]")
    assert "dynamic" not in line


def test_a_file_that_is_not_onnx_is_refused(cli, tmp_path):
    path = tmp_path / "junk.onnx"
    path.write_bytes(b"\x00\x01 definitely not protobuf" * 10)
    assert_refused(cli("show", path), path)


# ---- torch factories -------------------------------------------------------------------------------

FACTORIES = '''\
import sys
import torch

class Net(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.fc = torch.nn.Linear(64, n)
    def forward(self, x):
        return self.fc(x)

def strings():
    return "module", "inputs"

def a_class():
    return Net, torch.randn(8, 64)

def exits():
    sys.exit(0)

def raises():
    raise RuntimeError("no weights here")

def data_dependent():
    class Branchy(torch.nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x
    return Branchy(), (torch.randn(8, 64),)

def changes():
    # a different module on every call (the count survives re-imports of this file)
    import pathlib
    count = pathlib.Path(__file__).with_suffix(".count")
    n = int(count.read_text()) + 1 if count.exists() else 1
    count.write_text(str(n))
    return Net(16 * n), (torch.randn(8, 64),)
'''

FACTORY_CASES = [
    ("strings", ["torch.nn.Module", "str"]),
    ("a_class", ["the class Net"]),
    ("exits", ["sys.exit(0)"]),
    ("raises", ["RuntimeError", "no weights here"]),
    ("data_dependent", ["torch.export failed"]),
]


@pytest.mark.parametrize("factory, words", FACTORY_CASES, ids=[c[0] for c in FACTORY_CASES])
def test_a_bad_torch_factory_is_one_error_line_without_torchs_traceback(cli, tmp_path, factory, words):
    pytest.importorskip("torch")
    path = tmp_path / "nets.py"
    path.write_text(FACTORIES)
    assert_refused(cli("compile", f"{path}:{factory}", "-o", tmp_path / "pkg", "-j", "1", "-t", "ipu21-64"),
                   path, *words)
    assert not (tmp_path / "pkg").exists()


def test_a_torch_factory_runs_once_per_compile_so_params_match_the_model(cli, tmp_path):
    pytest.importorskip("torch")
    import json

    import numpy as np
    path = tmp_path / "nets.py"
    path.write_text(FACTORIES)
    code, _, err = cli("compile", f"{path}:changes", "-o", tmp_path / "pkg", "-j", "1", "-t", "ipu21-64")
    assert code == 0, err
    model = json.loads((tmp_path / "pkg" / "model.json").read_text())
    shapes = {t["name"]: t["shape"] for t in model["tensors"]} if isinstance(model["tensors"], list) else \
        {n: t["shape"] for n, t in model["tensors"].items()}
    with np.load(tmp_path / "pkg" / "params.npz") as z:
        for name in z.files:
            assert int(np.prod(shapes[name])) == z[name].size
    assert (tmp_path / "nets.count").read_text() == "1"        # the factory ran once
    code, out, err = cli("validate", tmp_path / "pkg")
    assert code == 0 and "validation passed" in out, err


def test_compile_refuses_parameter_values_that_disagree_with_the_graph(tmp_path):
    from tileplan.errors import TileplanError
    from tileplan.graph.loaders import load_model
    from tileplan.lowering.compile import compile_model
    from tileplan.target import load_target
    import numpy as np
    path = tmp_path / "m.toml"
    path.write_text(MODEL)
    graph = load_model(path)
    with pytest.raises(TileplanError, match="'w' has shape"):
        compile_model(graph, load_target("ipu21-64"), tmp_path / "pkg", params={"w": np.zeros((3, 3), np.float16)})
    assert not (tmp_path / "pkg").exists()
