"""Emission for the 64-tile FP8 smoke package: codelets, the manifest and host.cpp.

- every codelet the package emits compiles with g++ against tests/poplar's
  stand-in vertex headers and, run on sample data with each compute-set
  group's actual call, agrees with its variant's numpy semantics;
- host.cpp passes ``g++ -std=c++17 -fsyntax-only`` against the stand-in host
  headers; built with ``-DTILEPLAN_DUMP_TABLES`` (no Poplar) it reads back
  exactly the host/tables.bin emission wrote;
- the dataflow host/tables.bin encodes (variables, operands as strided runs of
  slices, copies and vertices), read here by its documented layout and
  replayed in numpy, computes byte for byte what the IPU model computes from
  the tile program (the smoke package, a hand-built type change in place, a
  multicast);
- host.cpp does not grow with the program (~1M transfer rows on 1472 tiles);
- emission is deterministic.
"""

from __future__ import annotations

import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from tileplan.errors import TileplanError
from tileplan.graph.dtypes import DType
from tileplan.graph.loaders import load_model
from tileplan.kernels import CastCall, default_registry
from tileplan.lowering.emit import codelet_manifest, emit_codelets, emit_host
from tileplan.lowering.emit.codelets import group_codelet
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
    assert {"amp_fp8_fp16_panels", "reduce_bias_fp16_own", "bias_gelu_aligned_fp16_tanh", "cast_fp16_fp8"} <= {
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


def host_files(tp, target, name="model"):
    files = emit_host(tp, target, name)
    assert set(files) == {"host.cpp", "host/tables.bin"}
    return files


@needs_gxx
def test_host_cpp_passes_a_syntax_check_against_the_stand_in_headers(smoke, tmp_path):
    graph, target, tp = smoke
    text = host_files(tp, target, graph.name)["host.cpp"].decode()
    for name in emit_codelets(tp, target):
        assert f'"{name}"' in text
    for api in ("poplar::Graph graph(device.getTarget())", "graph.addVariable(", "graph.setTileMapping(v, ",
                "graph.addComputeSet(", "graph.connect(v[", "graph.setInitialValue(v[", "poplar::program::Execute(cs)",
                "addHostToDeviceFIFO", "addDeviceToHostFIFO", "poplar::Engine engine", "poplar::IPUModel model",
                '"host/tables.bin"', "std::ifstream in(path, std::ios::binary)"):
        assert api in text, api
    (tmp_path / "host.cpp").write_text(text)
    syntax_check(tmp_path / "host.cpp")


@needs_gxx
def test_host_cpp_reads_the_tables_emission_wrote(smoke, tmp_path):
    """host.cpp built with -DTILEPLAN_DUMP_TABLES (no Poplar) prints every table it read from host/tables.bin."""
    graph, target, tp = smoke
    files = host_files(tp, target, graph.name)
    (tmp_path / "host").mkdir()
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    build = subprocess.run([GXX, "-std=c++17", "-O1", "-Wall", "-DTILEPLAN_DUMP_TABLES", "host.cpp", "-lz", "-o", "dump"],
                           cwd=tmp_path, capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run(["./dump"], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    tables = read_tables(files["host/tables.bin"])
    want = [f"strings {len(tables['strings'])}"]
    for name in TABLE_NAMES:
        a = tables[name]
        want.append(f"{name} {a.shape[0]} {a.shape[1]}")
        want += [" ".join(str(x) for x in row) for row in a.tolist()]
    want += [tables.string(o) for o in tables["variables"][:, 0].tolist()]
    want.append("folded 0")                         # kFolded: outputs folded at plan time (none here)
    want += [f"file {tables.string(o)}" for o in tables["host_tensors"][:, 9].tolist()]   # data files
    assert run.stdout.splitlines() == want
    (tmp_path / "host/tables.bin").write_bytes(files["host/tables.bin"][:-3])
    run = subprocess.run(["./dump"], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 1 and "host: host/tables.bin: truncated in host_places" in run.stderr


def test_emission_is_deterministic(smoke):
    graph, target, tp = smoke
    again = lower(plan(graph, target).mid.program, target).tile_program
    assert emit_host(tp, target, graph.name) == emit_host(again, target, graph.name)
    assert emit_codelets(tp, target) == emit_codelets(again, target)
    assert codelet_manifest(tp, target) == codelet_manifest(again, target)


# ---- host/tables.bin, read here by its documented layout --------------------------------------

TABLE_NAMES = ("variables", "pieces", "runs", "operands", "bindings", "host_tensors", "host_copies", "steps", "groups",
               "fields", "params", "vertices", "copies", "step_places", "host_places")
CTYPE_OF_CODE = ("unsigned char", "half", "float")


class HostTables(dict):
    def string(self, offset: int) -> str:
        data = self["strings"]
        return data[offset:data.index(b"\0", offset)].decode()


def read_tables(data: bytes) -> HostTables:
    """Little-endian: magic "TPHOST3\\0", u32 sections; per section char name[16], u32 element bytes,
    u32 columns, u64 rows, u64 stored bytes, then the stored bytes (``strings`` as they are, the others
    one zlib stream of int32 values column by column)."""
    assert data[:8] == b"TPHOST3\0"
    (count,) = struct.unpack_from("<I", data, 8)
    at, out = 12, HostTables()
    for _ in range(count):
        name, esize, columns, rows, stored = struct.unpack_from("<16sIIQQ", data, at)
        at += 40
        name = name.rstrip(b"\0").decode()
        chunk = data[at:at + stored]
        at += stored
        if name == "strings":
            assert esize == 1 and columns == 1 and stored == rows
            out[name] = chunk
        else:
            raw = zlib.decompress(chunk)
            assert esize == 4 and len(raw) == 4 * rows * columns
            out[name] = np.frombuffer(raw, "<i4").reshape(columns, rows).T.astype(np.int64)
    assert at == len(data) and set(out) == {"strings", *TABLE_NAMES}
    return out


# ---- the host program's dataflow, replayed in numpy -----------------------------------------

class HostDataflow:
    """Executes what host.cpp does with host/tables.bin: typed variables, operands as strided runs of slices,
    Copy programs and vertices. The vertices' kernels come from the tile program's groups (the tables
    name each group's vertex class and parameters, checked against the codelet)."""

    def __init__(self, tables: HostTables, tp: TileProgram, target):
        self.t, self.tp, self.target = tables, tp, target
        var, pieces = tables["variables"], tables["pieces"]
        self.vars = []
        for name, ctype, first, count in var.tolist():
            elements = int(pieces[first:first + count, 1].sum())
            self.vars.append(np.zeros(elements, NUMPY_OF_CTYPE[CTYPE_OF_CODE[ctype]]))

    def slices(self, op: int, scope) -> list[tuple[int, int, int]]:
        """An operand's slices; its runs name slots of ``scope`` (first binding, bindings)."""
        first, count = self.t["operands"][op].tolist()
        bound = self.t["bindings"][scope[0]:scope[0] + scope[1], 0].tolist()
        out = []
        for slot, begin, elements, n, stride in self.t["runs"][first:first + count].tolist():
            out += [(bound[slot], begin + c * stride, begin + c * stride + elements) for c in range(n)]
        return out

    def read(self, op: int, scope) -> np.ndarray:
        return np.concatenate([self.vars[v][b:e] for v, b, e in self.slices(op, scope)])

    def write(self, op: int, scope, data: np.ndarray) -> None:
        at = 0
        for v, b, e in self.slices(op, scope):
            self.vars[v][b:e] = data[at:at + e - b]
            at += e - b
        assert at == data.size

    def copy(self, pairs, scope) -> None:
        data = [self.read(src, scope) for src, _ in pairs]          # a superstep reads, then writes
        for (_, dst), d in zip(pairs, data):
            self.write(dst, scope, d)

    def run(self, stored: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        t = self.t
        registry = default_registry()
        hosts = t["host_tensors"].tolist()
        for role in (0, 1):          # program 0 streams the parameters, program 1 starts with the inputs
            for r, name, ctype, elements, op, first, count, *scope in hosts:
                if r == role:
                    data = np.ascontiguousarray(stored[t.string(name)]).reshape(-1)
                    self.write(op, scope, data.view(NUMPY_OF_CTYPE[CTYPE_OF_CODE[ctype]]))
                    assert data.size == elements
                    self.copy(t["host_copies"][first:first + count].tolist(), scope)
        assert len(t["steps"]) == len(self.tp.steps)
        for (kind, name, g0, ng, c0, nc, *scope), step in zip(t["steps"].tolist(), self.tp.steps):
            assert t.string(name) == step.name and kind == (0 if isinstance(step, ComputeSet) else 1)
            groups = [g for g in getattr(step, "groups", []) if g.call.primitive != "copy"]
            assert ng == len(groups)
            results = []
            for (vertex, f0, nf, p0, npar, v0, nv, op0), group in zip(t["groups"][g0:g0 + ng].tolist(), groups):
                source = group_codelet(group, self.target)
                assert t.string(vertex) == source.vertex and nv == len(group.tile)
                assert [t.string(f) for (f,) in t["fields"][f0:f0 + nf].tolist()] == [
                    f.name for f in source.inputs + source.outputs]
                assert {t.string(p): param_value(kind, v) for p, kind, v in t["params"][p0:p0 + npar].tolist()} \
                    == source.params
                assert t["vertices"][v0:v0 + nv, 0].tolist() == group.tile.tolist()
                variant = registry[group.variant]
                in_types, out_types = operand_types(group.call)
                for i in range(nv):
                    ops = [op0 + i * nf + j for j in range(nf)]
                    # one vertex as the IPU model runs a group: operands [vertices, elements]
                    ins = [self.read(o, scope).view(ty.numpy)[None] for o, ty in zip(ops, in_types)]
                    outs = variant.reference(group.call, *ins)
                    for o, out, ty in zip(ops[len(in_types):], outs if isinstance(outs, tuple) else (outs,),
                                          out_types):
                        results.append((o, np.asarray(out).astype(ty.numpy, copy=False).reshape(-1)))
            for op, out in results:
                self.write(op, scope, out.view(self.vars[self.slices(op, scope)[0][0]].dtype))
            self.copy(t["copies"][c0:c0 + nc].tolist(), scope)
        return {t.string(name): self.read(op, scope) for r, name, _, _, op, _, _, *scope in hosts if r == 2}


def param_value(kind: int, value: int):
    """A ``params`` row's value: unsigned (1) and int (0) as they are, float (2) from its float32 bits."""
    return float(np.array([value], np.int32).view(np.float32)[0]) if kind == 2 else value


def run_ipu_model(tp, target, stored) -> dict[str, np.ndarray]:
    sim = IPUModel(tp, target)
    for b in tp.buffers:
        if b.kind in ("input", "parameter") and b.name in tp.io_maps:
            sim.write(b.name, stored[b.tensor])
    sim.run()
    return {b.tensor: sim.read(b.name) for b in tp.buffers if b.kind == "output"}


def host_dataflow(tp, target) -> HostDataflow:
    return HostDataflow(read_tables(host_files(tp, target)["host/tables.bin"]), tp, target)


def test_host_dataflow_computes_what_the_ipu_model_computes(smoke):
    graph, target, tp = smoke
    stored = seeded_values(graph, seed=3)
    flow = host_dataflow(tp, target)
    assert len(flow.t["runs"]) < len(flow.t["operands"]) + sum(
        len(s.transfers) for s in tp.steps if not isinstance(s, ComputeSet))
    got = flow.run(stored)
    want = run_ipu_model(tp, target, stored)
    assert set(got) == set(want) == {"y"}
    for name in want:
        assert got[name].tobytes() == np.ascontiguousarray(want[name]).tobytes(), name


def test_float_vertex_parameters_travel_as_their_bits_and_the_host_dataflow_computes_what_the_ipu_model_does():
    """LayerNorm's eps and a scaled softmax's scale are float fields: the host tables carry them exactly."""
    from tileplan.graph.core import Graph, LayerNorm, Role, Softmax, Tensor
    target = load_target("ipu21-64")
    graph = Graph.build("norm_scores", [Tensor("x", (64, 48), DType.FP16, Role.INPUT),
                                        Tensor("g", (48,), DType.FP16, Role.PARAMETER),
                                        Tensor("b", (48,), DType.FP16, Role.PARAMETER)],
                        [LayerNorm("ln", ("x", "g", "b"), "h", epsilon=1e-6),
                         Softmax("sm", ("h",), "y", softmax_scale=0.125)])
    tp = lower(plan(graph, target).mid.program, target).tile_program
    flow = host_dataflow(tp, target)
    floats = {flow.t.string(p): param_value(kind, v) for p, kind, v in flow.t["params"].tolist() if kind == 2}
    assert floats == {"eps": float(np.float32(1e-6)), "scale": 0.125}
    stored = seeded_values(graph, seed=5)
    got, want = flow.run(stored), run_ipu_model(tp, target, stored)
    assert got["y"].tobytes() == np.ascontiguousarray(want["y"]).tobytes()


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
    flow = host_dataflow(tp, target)
    t = flow.t
    (_, _, _, _, c0, nc, *scope) = t["steps"][1].tolist()
    assert nc == 1                                      # the exchange: one Copy, of bytes
    (src, dst) = t["copies"][c0].tolist()
    for op in (src, dst):
        slices = flow.slices(op, scope)
        assert slices and all(t["variables"][var, 1] == 0 for var, _, _ in slices)
    x = np.linspace(-3, 3, 8).astype(np.float16)
    got = flow.run({"x": x})["y"]
    assert got.tobytes() == run_ipu_model(tp, target, {"x": x})["y"].tobytes()


def test_a_vertex_reading_bytes_of_another_type_is_an_error():
    target = load_target("ipu21-64")
    bad = r"compute set 'up'.*hold unsigned char elements of 'send.u8', read as half"
    with pytest.raises(TileplanError, match=bad):
        emit_host(tiny_program(target, read_as_fp8=False), target, "tiny")


@pytest.mark.parametrize("freeze_at", [None, 0, 150])
def test_the_byte_map_agrees_with_a_byte_array_under_random_writes(freeze_at):
    """``ByteMap`` (one sorted partition of every tile's bytes) against a plain per-byte array of
    (variable, element): each step writes several disjoint ranges on several tiles at once, some of them
    undefined; an element a write covers only partly is lost. With ``freeze_at`` the map sets what it
    holds aside as its static map at that step (as the replay does after the host's writes) and must
    read the same from then on."""
    from tileplan.lowering.emit.host import STRIDE, ByteMap
    rng = np.random.default_rng(5)
    tiles, size = 3, 256
    mem = ByteMap(tiles)
    owner = np.full((tiles, size), -1)       # variable id per byte
    elem = np.full((tiles, size), -1)        # element of that variable per byte
    esize = {}
    var = 0
    for step in range(300):
        if step == freeze_at:
            mem.freeze()
        writes = []
        for tile in range(tiles):
            at = int(rng.integers(0, 32))
            while at < size and rng.random() < 0.7:
                code = int(rng.integers(3))
                isz = (1, 2, 4)[code]
                at = -(-at // isz) * isz
                n = min(int(rng.integers(1, 24)), (size - at) // isz) * isz
                if n <= 0:
                    break
                v = -1 if rng.random() < 0.15 else var
                esize[var] = isz
                var += 1
                writes.append((tile, at, n, v, int(rng.integers(0, 100)), code))
                at += n + int(rng.integers(0, 16))
        covered = set()
        for tile, a, n, v, e0, code in writes:
            covered |= {(o, x) for o, x in zip(owner[tile, a:a + n], elem[tile, a:a + n]) if o >= 0}
        lost = np.array([[(o, x) in covered for o, x in zip(orow, erow)] for orow, erow in zip(owner, elem)])
        owner[lost], elem[lost] = -1, -1
        for tile, a, n, v, e0, code in writes:
            owner[tile, a:a + n] = v
            elem[tile, a:a + n] = e0 + np.arange(n) // (1, 2, 4)[code] if v >= 0 else -1
        if writes:
            tl, a, n, v, e0, code = (np.array(c) for c in zip(*writes))
            mem.write(tl * STRIDE + a, tl * STRIDE + a + n, v, e0, np.where(v >= 0, code, -1), "test")
        qa = np.arange(tiles) * STRIDE
        got_owner = np.full((tiles, size), -1)
        got_elem = np.full((tiles, size), -1)
        for tile, s, e, v, _, start, e0 in zip(*(a.tolist() for a in mem.look(qa, qa + size))):
            if v >= 0:
                s, e, start = s % STRIDE, e % STRIDE, start % STRIDE
                got_owner[tile, s:e] = v
                got_elem[tile, s:e] = e0 + (np.arange(s, e) - start) // esize[v]
        assert np.array_equal(got_owner, owner) and np.array_equal(got_elem, elem), step
        # merged: no two neighbours continue each other
        assert not np.any((mem.var[1:] < 0) & (mem.var[1:] == mem.var[:-1]))
    with pytest.raises(TileplanError, match="test: two writes to tile 1 bytes"):
        mem.write(np.array([STRIDE, STRIDE + 4]), np.array([STRIDE + 8, STRIDE + 12]), np.array([0, 1]),
                  np.array([0, 0]), np.array([0, 0]), "test")


# ---- a large program: host.cpp does not grow with it ---------------------------------------

def multicast_program(target, spread: int, chunks: int = 11) -> TileProgram:
    """Every tile holds ``chunks`` 4-element FP16 chunks of x and multicasts each to the next ``spread``
    tiles, which store what they receive transposed (chunk-major) in y: tiles * spread * chunks transfer
    rows, like the multicast of weight panels."""
    from tileplan.estimate.exchange import Transfers
    from tileplan.lowering.tile_program import Exchange
    tiles, elements = target.tiles, 4 * chunks
    r = -(-target.reserve_bytes // 64) * 64
    buffers = [BufferInfo("x", "fp16", [tiles * elements], "input", "standard", "Rows", "x", False, 0),
               BufferInfo("y", "fp16", [tiles * spread * elements], "output", "standard", "Rows", "y", False, 0)]
    addr = np.stack([np.full(tiles, r), np.full(tiles, r + 2 * elements)]).astype(np.int64)
    size = np.stack([np.full(tiles, 2 * elements), np.full(tiles, 2 * spread * elements)]).astype(np.int64)
    t, d, c = (a.reshape(-1) for a in np.meshgrid(np.arange(tiles), np.arange(1, spread + 1), np.arange(chunks),
                                                  indexing="ij"))
    src = (t - d) % tiles
    zero = np.zeros(t.size, np.int32)
    send = Transfers((src * chunks + c).astype(np.int64), src.astype(np.int32), zero, (r + 8 * c).astype(np.int64),
                     t.astype(np.int32), zero, (r + 2 * elements + 8 * (c * spread + d - 1)).astype(np.int64),
                     np.full(t.size, 8, np.int64))
    every = np.arange(tiles)
    io = {"x": (every.astype(np.int32), every * elements, (every + 1) * elements, np.zeros(tiles, np.int64)),
          "y": (every.astype(np.int32), every * spread * elements, (every + 1) * spread * elements,
                np.zeros(tiles, np.int64))}
    return TileProgram(tiles, buffers, addr, size, [Exchange("send", send)], io)


def test_a_multicast_s_host_dataflow_computes_what_the_ipu_model_computes():
    target = load_target("ipu21-64")
    tp = multicast_program(target, spread=8)
    flow = host_dataflow(tp, target)
    assert len(flow.t["runs"]) < len(tp.steps[0].transfers) / 4      # strided runs, not one slice a row
    x = np.random.default_rng(1).standard_normal(64 * 44).astype(np.float16)
    got = flow.run({"x": x})["y"]
    assert got.tobytes() == run_ipu_model(tp, target, {"x": x})["y"].tobytes()


def test_host_cpp_does_not_grow_with_the_transfer_rows():
    """~1M transfer rows on 1472 tiles against 5.6k on 64: host.cpp is the same text but for a few counts in
    its header and kTiles; the tables stay small because multicast sources are strided runs."""
    small = emit_host(multicast_program(load_target("ipu21-64"), spread=8), load_target("ipu21-64"), "m")
    big_tp = multicast_program(load_target("ipu21"), spread=64)
    assert len(big_tp.steps[0].transfers) > 1_000_000
    big = emit_host(big_tp, load_target("ipu21"), "m")
    assert abs(len(big["host.cpp"]) - len(small["host.cpp"])) < 64
    assert len(big["host.cpp"]) < 40_000
    tables = read_tables(big["host/tables.bin"])
    assert len(tables["runs"]) < 40_000 and len(big["host/tables.bin"]) < 1_500_000
