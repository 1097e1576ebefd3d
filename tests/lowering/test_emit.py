"""Emission for the 64-tile FP8 smoke package: codelets, the manifest and host.cpp.

- every codelet the package emits compiles with g++ against tests/poplar's
  stand-in vertex headers and, run on sample data with each compute-set
  group's actual call, agrees with its variant's numpy semantics;
- host.cpp passes ``g++ -std=c++17 -fsyntax-only`` against the stand-in host
  headers, and the dataflow it encodes (variables, operand slices, copies and
  vertices, replayed here in numpy) computes byte for byte what the IPU model
  computes from the tile program;
- emission is deterministic.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tileplan.errors import TileplanError
from tileplan.graph.dtypes import DType
from tileplan.graph.loaders import load_model
from tileplan.kernels import CastCall, default_registry
from tileplan.lowering.emit import codelet_manifest, emit_codelets, emit_host
from tileplan.lowering.emit.codelets import group_codelet
from tileplan.lowering.emit.host import Replay
from tileplan.lowering.lower import lower
from tileplan.lowering.tile_program import BufferInfo, ComputeSet, TileProgram, VertexGroup
from tileplan.planner.plan import plan
from tileplan.sim.model import IPUModel, operand_types
from tileplan.sim.reference import seeded_values
from tileplan.target import load_target

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "poplar"))
from harness import GXX, Case, compare, comparison_for, random, run_codelets, syntax_check  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
NUMPY_OF_CTYPE = {"unsigned char": np.uint8, "half": np.float16, "float": np.float32}
needs_gxx = pytest.mark.skipif(GXX is None, reason="g++ is not installed")


@pytest.fixture(scope="module")
def smoke():
    graph = load_model(FIXTURES / "mlp_smoke_fp8.toml")
    target = load_target("ipu21-64")
    tp = lower(plan(graph, target).mid.program, target).tile_program
    return graph, target, tp


def sample_inputs(rng, source, call) -> dict[str, np.ndarray]:
    """Sample data per input field: AMP weights N(0, 1/sqrt(k)), FP8 activations wide enough to use the range."""
    out = {}
    for f in source.inputs:
        if f.dtype is None:
            out[f.name] = rng.integers(0, 256, f.size, dtype=np.uint8)
            continue
        std = 2.0 if f.dtype is DType.FP8 else 0.5
        if call.primitive == "matmul" and f.name == "b":
            std = 1 / np.sqrt(call.k)
        out[f.name] = random(rng, f.dtype, f.size, std)
    return out


@needs_gxx
def test_every_codelet_of_the_smoke_package_runs_and_matches_its_numpy_semantics(smoke, tmp_path):
    _, target, tp = smoke
    files = emit_codelets(tp, target)
    registry = default_registry()
    rng = np.random.default_rng(11)
    cases, checks = [], []
    for si, step in enumerate(tp.steps):
        for group in getattr(step, "groups", []):
            source = group_codelet(group, target)
            assert files[f"codelets/{source.key}.cpp"] == source.source
            inputs = sample_inputs(rng, source, group.call)
            cases.append(Case(source, inputs))
            checks.append((registry[group.variant], group.call, inputs, source))
    assert {f"codelets/{c.codelet.key}.cpp" for c in cases} == set(files)
    assert {"amp_fp8_fp16_panels", "reduce_fp16", "bias_gelu_fp16_tanh", "cast_fp16_fp8"} <= {
        c.codelet.key for c in cases}
    results = run_codelets(cases, tmp_path)
    for (variant, call, inputs, source), result in zip(checks, results):
        (out,) = source.outputs
        compare(variant, call, inputs, comparison_for(call), result[out.name], out.dtype or DType.FP8)


def test_the_manifest_names_each_group_s_vertex_and_field_values(smoke):
    _, target, tp = smoke
    manifest = codelet_manifest(tp, target)
    groups = [(si, gi) for si, st in enumerate(tp.steps) if isinstance(st, ComputeSet) for gi in range(len(st.groups))]
    assert [(e["step"], e["group"]) for e in manifest] == groups
    amp = next(e for e in manifest if e["variant"] == "amp_fp8_fp16" and "panels" in e["key"])
    assert amp["vertex"] == "AmpFp8Fp16Panels" and amp["file"] == "codelets/amp_fp8_fp16_panels.cpp"
    fields = {f["name"]: f for f in amp["fields"]}
    call = tp.steps[amp["step"]].groups[amp["group"]].call
    assert fields["a"] == {"name": "a", "direction": "input", "ctype": "unsigned char", "size": call.m * call.k}
    assert fields["m"]["value"] == call.m and fields["outScale"]["value"] == call.out_scale
    assert {e["file"] for e in manifest} == set(emit_codelets(tp, target))


@needs_gxx
def test_host_cpp_passes_a_syntax_check_against_the_stand_in_headers(smoke, tmp_path):
    graph, target, tp = smoke
    text = emit_host(tp, target, graph.name)
    for name in emit_codelets(tp, target):
        assert f'"{name}"' in text
    for api in ("poplar::Graph graph(device.getTarget())", "graph.addVariable(", "graph.setTileMapping(v, tiles[i])",
                "graph.addComputeSet(", "graph.connect(v[", "graph.setInitialValue(v[", "poplar::program::Execute(cs)",
                "addHostToDeviceFIFO", "addDeviceToHostFIFO", "poplar::Engine engine", "poplar::IPUModel model"):
        assert api in text, api
    (tmp_path / "host.cpp").write_text(text)
    syntax_check(tmp_path / "host.cpp")


def test_emission_is_deterministic(smoke):
    graph, target, tp = smoke
    again = lower(plan(graph, target).mid.program, target).tile_program
    assert emit_host(tp, target, graph.name) == emit_host(again, target, graph.name)
    assert emit_codelets(tp, target) == emit_codelets(again, target)
    assert codelet_manifest(tp, target) == codelet_manifest(again, target)


# ---- the host program's dataflow, replayed in numpy -----------------------------------------

class HostDataflow:
    """Executes what host.cpp encodes: typed variables, operands as slice lists, Copy and vertices."""

    def __init__(self, replay: Replay):
        self.replay = replay
        v = replay.values
        self.vars = [np.zeros(var.elements, NUMPY_OF_CTYPE[var.ctype]) for var in v.variables]

    def _slices(self, ref):
        first, n = self.replay.values.refs[ref]
        return [self.replay.values.slices[i] for i in self.replay.values.ref_slices[first:first + n]]

    def read(self, ref) -> np.ndarray:
        return np.concatenate([self.vars[v][b:e] for v, b, e in self._slices(ref)])

    def write(self, ref, data: np.ndarray) -> None:
        at = 0
        for v, b, e in self._slices(ref):
            self.vars[v][b:e] = data[at:at + e - b]
            at += e - b
        assert at == data.size

    def copy(self, pairs) -> None:
        data = [self.read(src) for src, _, *_ in pairs]          # a superstep reads, then writes
        for (_, dst, *_), d in zip(pairs, data):
            self.write(dst, d)

    def run(self, stored: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        registry = default_registry()
        for h in self.replay.upload + self.replay.inputs:
            self.write(h.ref, np.ascontiguousarray(stored[h.name]).reshape(-1).view(NUMPY_OF_CTYPE[h.ctype]))
            self.copy(h.replica_copies)
        for step in self.replay.steps:
            results = []
            for g in step.groups:
                variant = registry[g.variant]
                in_types, (out_type,) = operand_types(g.call)
                for refs in g.refs:
                    ins = [self.read(r).view(t.numpy) for r, t in zip(refs, in_types)]
                    out = np.asarray(variant.reference(g.call, *ins)).astype(out_type.numpy, copy=False)
                    results.append((refs[-1], out.reshape(-1)))
            for ref, out in results:
                self.write(ref, out.view(self.vars[self._slices(ref)[0][0]].dtype))
            self.copy(step.copies)
        return {h.name: self.read(h.ref) for h in self.replay.outputs}


def run_ipu_model(tp, target, stored) -> dict[str, np.ndarray]:
    sim = IPUModel(tp, target)
    for b in tp.buffers:
        if b.kind in ("input", "parameter") and b.name in tp.io_maps:
            sim.write(b.name, stored[b.tensor])
    sim.run()
    return {b.tensor: sim.read(b.name) for b in tp.buffers if b.kind == "output"}


def test_host_dataflow_computes_what_the_ipu_model_computes(smoke):
    graph, target, tp = smoke
    stored = seeded_values(graph, seed=3)
    replay = Replay(tp, target).run()
    assert all(len(refs) == len(g.fields) for s in replay.steps for g in s.groups for refs in g.refs)
    got = HostDataflow(replay).run(stored)
    want = run_ipu_model(tp, target, stored)
    assert set(got) == set(want) == {"y"}
    for name in want:
        assert got[name].tobytes() == np.ascontiguousarray(want[name]).tobytes(), name


# ---- a hand-built program: memory reuse across element types, and bad reads ----------------

def tiny_program(target, read_as_fp8: bool = True) -> TileProgram:
    """x (fp16, 8 elements on tile 0 at byte R, R = the target's reserve) is cast in place to fp8
    (bytes R..R+7), which is sent to tile 1 (byte R) and cast back to fp16 into y (tile 1, byte R+64)."""
    r = -(-target.reserve_bytes // 64) * 64
    from tileplan.estimate.exchange import Transfers
    from tileplan.lowering.tile_program import Exchange
    buffers = [BufferInfo("x", "fp16", [8], "input", "standard", "Rows(1)", "x", False, 0),
               BufferInfo("y", "fp16", [8], "output", "standard", "Rows(1)", "y", False, 0)]
    addr = np.array([[r, -1], [-1, r + 64]], dtype=np.int64)
    size = np.array([[16, 0], [0, 16]], dtype=np.int64)
    down = CastCall(8, DType.FP16, DType.FP8)
    up = CastCall(8, DType.FP8, DType.FP16)
    one = np.array([0], np.int32)
    i32 = lambda *v: np.array(v, np.int32)  # noqa: E731
    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    steps = [ComputeSet("down", [VertexGroup(down, "cast_fp16_fp8", 1, (16,), (8,), one, i64(r)[:, None],
                                             i64(r)[:, None])]),
             Exchange("send", Transfers(i64(0), i32(0), i32(0), i64(r), i32(1), i32(0), i64(r), i64(8))),
             ComputeSet("up", [VertexGroup(up if read_as_fp8 else CastCall(4, DType.FP16, DType.FP32),
                                           "cast_convert", 1, (8,), (16,), i32(1), i64(r)[:, None],
                                           i64(r + 64)[:, None])])]
    io = {"x": (i32(0), i64(0), i64(8), i64(0)), "y": (i32(1), i64(0), i64(8), i64(0))}
    return TileProgram(2, buffers, addr, size, steps, io)


def test_a_value_that_changes_type_in_place_travels_as_its_new_type():
    target = load_target("ipu21-64")
    tp = tiny_program(target)
    replay = Replay(tp, target).run()
    (send,) = [s for s in replay.steps if s.kind == "exchange"]
    (copy,) = send.copies
    assert "unsigned char" in copy[2]
    x = np.linspace(-3, 3, 8).astype(np.float16)
    got = HostDataflow(replay).run({"x": x})["y"]
    assert got.tobytes() == run_ipu_model(tp, target, {"x": x})["y"].tobytes()


def test_a_vertex_reading_bytes_of_another_type_is_an_error():
    target = load_target("ipu21-64")
    bad = r"compute set 'up'.*hold unsigned char elements of 'send.u8', read as half"
    with pytest.raises(TileplanError, match=bad):
        Replay(tiny_program(target, read_as_fp8=False), target).run()


def test_the_byte_map_agrees_with_a_byte_array_under_random_writes():
    """``Memory`` (sorted chunks per tile) against a plain per-byte array of (variable, element)."""
    from tileplan.lowering.emit.host import ELEMENT_BYTES, Chunk, Memory
    rng = np.random.default_rng(5)
    mem, size = Memory(1), 256
    owner = np.full(size, -1)       # variable id per byte
    elem = np.full(size, -1)        # element of that variable per byte
    for var in range(400):
        ctype = ["unsigned char", "half", "float"][rng.integers(3)]
        isz = ELEMENT_BYTES[ctype]
        a = int(rng.integers(0, size // isz)) * isz
        n = int(rng.integers(1, (size - a) // isz + 1)) * isz
        e0 = int(rng.integers(0, 100))
        mem.write(0, Chunk(a, a + n, var, e0, ctype), a, n)
        # the bytes of an element that the write only partly covers are lost
        covered = {(o, x) for o, x in zip(owner[a:a + n], elem[a:a + n]) if o >= 0}
        lost = np.array([(o, x) in covered for o, x in zip(owner, elem)])
        owner[lost], elem[lost] = -1, -1
        owner[a:a + n] = var
        elem[a:a + n] = e0 + np.arange(n) // isz
        pieces = mem.read(0, 0, size)
        assert sum(e - s for s, e, _ in pieces) == size
        got_owner = np.full(size, -1)
        got_elem = np.full(size, -1)
        for s, e, c in pieces:
            if c is not None:
                got_owner[s:e] = c.var
                got_elem[s:e] = c.elem + (np.arange(s, e) - c.start) // ELEMENT_BYTES[c.ctype]
        assert np.array_equal(got_owner, owner) and np.array_equal(got_elem, elem), var
