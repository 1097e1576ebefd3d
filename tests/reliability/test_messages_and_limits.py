"""Messages at the edges: running out of memory, long output names, output-path errors, ONNX opsets
the importer does not know, ONNX external data, and 0-d graph inputs at the package boundary.

Each case runs the CLI through a ``guarded.Guard`` (its own forked process, an address-space limit,
a timeout): a run that runs out of memory must end in the one ``error:`` line, never a traceback."""

from __future__ import annotations

import os

import numpy as np
import pytest

from reliability_corpus import FIXTURES, SMOKE, assert_refused

MiB = 1 << 20


@pytest.fixture(scope="module")
def small_guard():
    """A Guard whose cases run under a 700 MiB address-space limit: enough to compile the 64-tile
    smoke model, not enough to plan the full-size SigLIP MLP."""
    from guarded import Guard
    g = Guard(memory=700 * MiB)
    yield g
    g.close()


# ---- running out of memory ----------------------------------------------------------------------

@pytest.mark.parametrize("jobs", ["1", "2"])
def test_running_out_of_memory_is_one_line_naming_the_stage(small_guard, tmp_path, jobs):
    result = small_guard.run(["compile", FIXTURES / "siglip_mlp_fp8_b1.toml", "-o", tmp_path / "pkg", "-j", jobs],
                             tmp_path, timeout=240)
    assert result[0] is not None, "ran past its timeout"
    line = assert_refused(result, "out of memory while planning", "Unable to allocate")
    assert "_ArrayMemoryError" not in line
    assert not (tmp_path / "pkg").exists()
    assert [p.name for p in tmp_path.iterdir()] == []           # no temporary left either


# ---- output names -------------------------------------------------------------------------------

def test_a_230_character_output_name_compiles_and_its_stale_temporary_is_removed(guard, tmp_path):
    name = "p" * 230
    # A temporary left by a killed compile into the same name (its pid no longer runs).
    from tileplan.atomic import MARKER, TMP_TAG, _tmp_stem
    stale = tmp_path / f".{_tmp_stem(name)}{TMP_TAG}{2**22 + 12345}-0123abcd"
    stale.mkdir()
    (stale / MARKER).write_text("tileplan-package/2\n")
    assert len(os.fsencode(stale.name)) <= 255
    code, _, err = guard.run(["compile", SMOKE, "-o", name, "-j", "1", "-q"], tmp_path, timeout=120)
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]
    assert (tmp_path / name / "manifest.json").is_file() and (tmp_path / name / MARKER).is_file()


def test_two_long_names_sharing_their_start_have_distinct_temporaries():
    from tileplan.atomic import _tmp_stem
    a, b = "x" * 240 + "a", "x" * 240 + "b"
    assert _tmp_stem(a) != _tmp_stem(b)
    assert len(os.fsencode(_tmp_stem("é" * 200))) <= 200          # cut by bytes, not characters
    assert _tmp_stem("short") == "short"


@pytest.mark.parametrize("command", ["compile", "plan"])
def test_an_output_path_error_names_the_output_path_and_not_the_model(guard, tmp_path, command):
    out = tmp_path / ("q" * 256)                     # longer than a file name may be
    code, stdout, err = guard.run([command, SMOKE, "-o", out, "-j", "1", "-q"], tmp_path, timeout=120)
    line = assert_refused((code, stdout, err), str(out), "File name too long")
    assert line.startswith(f"error: {out}: ")
    assert str(SMOKE) not in line and "mlp_smoke" not in line


# ---- ONNX: opsets and external data -------------------------------------------------------------

def _gemm_model(path, *, opset=17, external=None, c_shape=(4,)):
    """y = x @ w + c, ``w`` an initializer (stored in ``external``: (file, offset, length or None)),
    ``c`` a graph input of shape ``c_shape``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    w = np.arange(12, dtype=np.float32).reshape(3, 4) / 8
    init = numpy_helper.from_array(w, "w")
    if external is not None:
        location, offset, length = external
        init.ClearField("raw_data")
        init.data_location = TensorProto.EXTERNAL
        init.external_data.add(key="location", value=location)
        init.external_data.add(key="offset", value=str(offset))
        if length is not None:
            init.external_data.add(key="length", value=str(length))
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "c"], ["y"], name="gemm")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("c", TensorProto.FLOAT, list(c_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [init])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.save(model, str(path))
    return w


def test_an_opset_newer_than_the_importer_knows_is_refused_naming_it(guard, tmp_path):
    import onnx
    model = tmp_path / "future.onnx"
    _gemm_model(model, opset=99)
    result = guard.run(["show", model, "-t", "ipu21-64"], tmp_path)
    assert_refused(result, model, "opset 99", f"at most {onnx.defs.onnx_opset_version()}")


def test_external_data_without_a_length_reads_only_what_the_tensor_needs(small_guard, tmp_path):
    backing = tmp_path / "weights.bin"
    offset = 4096
    with open(backing, "wb") as f:                   # a 1 GiB sparse file: the tensor's 48 bytes at 4096
        f.truncate(1 << 30)
    model = tmp_path / "m.onnx"
    w = _gemm_model(model, external=("weights.bin", offset, None))
    with open(backing, "r+b") as f:
        f.seek(offset)
        f.write(w.tobytes())
    code, _, err = small_guard.run(["compile", model, "-o", tmp_path / "pkg", "-t", "ipu21-64", "-j", "1", "-q"],
                                   tmp_path, timeout=120)
    assert code == 0, err
    with np.load(tmp_path / "pkg" / "params.npz") as z:
        assert np.array_equal(z["w"], w)


@pytest.mark.parametrize("case", ["shorter than the tensor", "outside the model's folder", "absolute",
                                  "a symbolic link out", "a length that is not the tensor's"])
def test_bad_external_data_is_refused_naming_the_model(guard, tmp_path, case):
    folder = tmp_path / "model"
    folder.mkdir()
    (tmp_path / "outside.bin").write_bytes(bytes(48))
    (folder / "short.bin").write_bytes(bytes(40))
    (folder / "ok.bin").write_bytes(bytes(48))
    os.symlink(tmp_path / "outside.bin", folder / "link.bin")
    external, words = {
        "shorter than the tensor": (("short.bin", 0, None), ["short.bin", "too short", "48 bytes"]),
        "outside the model's folder": (("../outside.bin", 0, None), ["'../outside.bin'", "inside the model's folder"]),
        "absolute": ((str(tmp_path / "outside.bin"), 0, None), ["relative path"]),
        "a symbolic link out": (("link.bin", 0, None), ["'link.bin'", "outside the model's folder"]),
        "a length that is not the tensor's": (("ok.bin", 0, 40), ["length 40", "need 48"]),
    }[case]
    model = folder / "m.onnx"
    _gemm_model(model, external=external)
    result = guard.run(["show", model, "-t", "ipu21-64"], tmp_path)
    assert_refused(result, model, "tensor 'w'", *words)


# ---- 0-d graph inputs ---------------------------------------------------------------------------

def test_a_0d_input_keeps_its_shape_through_compile_and_validate(guard, tmp_path):
    model = tmp_path / "scalar_bias.onnx"
    w = _gemm_model(model, c_shape=())
    code, _, err = guard.run(["compile", model, "-o", tmp_path / "pkg", "-t", "ipu21-64", "-j", "1", "-q"],
                             tmp_path, timeout=120)
    assert code == 0, err
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    c = np.array(0.75, dtype=np.float32)
    np.savez(tmp_path / "inputs.npz", x=x, c=c)
    np.savez(tmp_path / "expected.npz", y=x.astype(np.float64) @ w + 0.75)
    code, out, err = guard.run(["validate", tmp_path / "pkg", "--inputs", tmp_path / "inputs.npz",
                                "--expected", tmp_path / "expected.npz", "--outputs", tmp_path / "got.npz"],
                               tmp_path, timeout=120)
    assert code == 0, out + err
    with np.load(tmp_path / "got.npz") as z:
        assert z["y"].shape == (2, 4)
        assert np.allclose(z["y"], x @ w + 0.75, atol=1e-5)
    # The declared shape is the boundary: a [1] array for the 0-d input is refused, naming both shapes.
    np.savez(tmp_path / "wrong.npz", x=x, c=c.reshape(1))
    result = guard.run(["validate", tmp_path / "pkg", "--inputs", tmp_path / "wrong.npz"], tmp_path, timeout=120)
    assert_refused(result, "wrong.npz", "'c'", "shape [1]", "the model's is []")
