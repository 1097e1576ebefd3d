"""Slices (a column window of the input's layout, copied where it lies) and fused QKV (one GEMM of
the concatenated weights, then Slices), chosen against the separate GEMMs by the estimates."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tileplan.errors import TileplanError
from tileplan.graph.core import Add, Graph, LayerNorm, MatMul, Role, Slice, Tanh, Tensor
from tileplan.graph.dtypes import DType
from tileplan.graph.toml import load_toml
from tileplan.lowering.compile import compile_model
from tileplan.lowering.package import load_package
from tileplan.planner.plan import plan
from tileplan.planner.qkv import fused_graph, package_params
from tileplan.sim.validate import validate_package
from tileplan.target import load_target

TARGET = load_target("ipu21-64")


def _run(graph, tmp_path, **kw):
    p, _, path = compile_model(graph, TARGET, tmp_path / "pkg", jobs=1, **kw)
    pkg = load_package(path)
    v = validate_package(pkg)
    estimate = json.loads((pkg.path / "report.json").read_text())["estimate"]["cycles"]
    return p, pkg, v, estimate


@pytest.mark.parametrize("shape, axis, start, stop, step", [
    ((2, 20, 96), -1, 32, 64, 1),          # a head block of a fused projection's output
    ((2, 20, 96), -1, 0, 96, 1),           # the whole axis
    ((40, 37), 1, 5, 30, 1),               # odd columns, rows of 37
    ((2, 20, 96), 1, 3, 17, 1),            # a middle axis: runs of whole rows
    ((3, 5, 16), 0, 1, 3, 1),              # the first axis: one contiguous range
    ((130, 24), -1, 8, 16, 1),             # more rows than tiles
    ((2, 20, 96), 1, 19, -1, -1),          # reversed tokens: rows gathered
    ((130, 24), 0, 3, 130, 4),             # every fourth row
    ((40, 37), -1, 36, 0, -5),             # the last axis backwards: swapped to rows and back
    ((3, 5, 16), 2, 1, 16, 3),             # strided along the last axis of a 3-D tensor
    ((37,), 0, 35, 2, -3),                 # a 1-D tensor backwards: a row, swapped to rows and back
])
@pytest.mark.parametrize("dtype", [DType.FP16, DType.FP32])
def test_a_slice_validates_exactly_and_its_estimate_is_the_simulated_cycles(tmp_path, shape, axis, start, stop,
                                                                             step, dtype):
    x = Tensor("x", shape, dtype, Role.INPUT)
    graph = Graph.build("s", [x], [Tanh("a", ("x",), "h"),
                                   Slice("s", ("h",), "hs", axis=axis, start=start, stop=stop, step=step),
                                   Tanh("b", ("hs",), "y")])
    _, _, v, estimate = _run(graph, tmp_path)
    assert v.outputs["y"]["passed"] and v.outputs["y"]["max_abs"] == 0.0, v.outputs["y"]
    assert estimate == v.profile.cycles


def _window_candidates(c0: int):
    """The Slice candidates of columns [c0, c0 + 32) of a [40, 96] tensor, by (in, out) layout."""
    x = Tensor("x", (40, 96), DType.FP16, Role.INPUT)
    graph = Graph.build("w", [x], [Tanh("a", ("x",), "h"), Slice("s", ("h",), "hs", start=c0, stop=c0 + 32),
                                   Tanh("b", ("hs",), "y")])
    p = plan(graph, TARGET)
    return {(str(c.ins[0]), str(c.out)): c.estimate for c in p.candidates["s"]}


def test_a_window_whose_pieces_are_the_outputs_at_their_offsets_is_a_relabelling():
    # 40 rows on 64 tiles: one row a tile; columns [0, 32) sit at the offsets the sliced rows have.
    got = _window_candidates(0)[("Rows(64)", "Rows(64)")]
    assert got.cycles == 0 and got.bytes_moved == 0


def test_a_window_off_its_rows_start_is_an_on_tile_copy_and_moves_nothing_over_the_exchange():
    got = _window_candidates(32)
    rows = got[("Rows(64)", "Rows(64)")]
    assert rows.cycles > 0 and rows.exchange == 0 and rows.sync == 0      # copied where it lies
    crossed = got[("Rows(64)", "Iv(64,a16)")]
    assert crossed.exchange > 0                                            # another layout: exchanged


def test_a_slice_outside_its_axis_is_one_error_naming_the_op():
    x = Tensor("x", (4, 8), DType.FP16, Role.INPUT)
    with pytest.raises(TileplanError, match=r"op 's' \(slice\): range\(6, 9, 1\) does not lie in axis -1 of 'x'"):
        Graph.build("s", [x], [Slice("s", ("x",), "y", start=6, stop=9)])
    with pytest.raises(TileplanError, match=r"op 's' \(slice\): step must not be 0"):
        Slice("s", ("x",), "y", start=0, stop=2, step=0)


def test_a_toml_slice_reads_axis_start_stop_and_step(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text('[model]\nname = "m"\n[tensors]\nx = { shape = [4, 8], dtype = "fp16", role = "input" }\n'
                    '[[ops]]\nname = "s"\nop = "slice"\ninputs = ["x"]\noutput = "y"\naxis = 1\nstart = 2\nstop = 5\n')
    (op,) = load_toml(path).ops
    assert (op.axis, op.start, op.stop, op.step) == (1, 2, 5, 1)
    path.write_text(path.read_text() + "step = 2\n")
    (op,) = load_toml(path).ops
    assert op.step == 2 and load_toml(path).tensors["y"].shape == (4, 2)


def qkv_graph(width: int = 64, tokens: int = 24, dtype=DType.FP16) -> Graph:
    """LayerNorm, then Q, K and V projections with bias Adds, their sum the output (a small layer's
    three GEMMs reading one activation)."""
    ts = [Tensor("x", (tokens, width), dtype, Role.INPUT),
          Tensor("g", (width,), dtype, Role.PARAMETER), Tensor("b", (width,), dtype, Role.PARAMETER)]
    ops = [LayerNorm("ln", ("x", "g", "b"), "n")]
    for p in "qkv":
        ts += [Tensor(f"{p}.w", (width, width), dtype, Role.PARAMETER), Tensor(f"{p}.b", (width,), dtype, Role.PARAMETER)]
        ops += [MatMul(p, ("n", f"{p}.w"), f"{p}.mm"), Add(f"{p}.bias", (f"{p}.mm", f"{p}.b"), f"{p}.out")]
    ops += [Add("qk", ("q.out", "k.out"), "qk.out"), Add("qkv", ("qk.out", "v.out"), "y")]
    return Graph.build("qkv", ts, ops)


def test_three_gemms_reading_one_activation_fuse_into_one_gemm_and_three_slices():
    g, groups = fused_graph(qkv_graph())
    (group,) = groups
    assert group.members == ("q", "k", "v") and group.sources == ("q.w", "k.w", "v.w")
    mm = g.op(group.op)
    assert isinstance(mm, MatMul) and g.tensors[group.weight].shape == (64, 192)
    assert [(s.start, s.stop) for s in (g.op("q"), g.op("k"), g.op("v"))] == [(0, 64), (64, 128), (128, 192)]
    assert not {"q.w", "k.w", "v.w"} & set(g.tensors)


def test_gemms_with_weights_of_another_type_or_a_pin_do_not_fuse():
    g = qkv_graph()
    assert fused_graph(g, pinned={"q", "k"}) is None                  # one left: nothing to fuse with
    assert fused_graph(g, pinned={"q"}) is not None                   # k and v still fuse


def test_the_package_holds_the_weights_concatenated_and_the_users_params_stay_as_they_are():
    rng = np.random.default_rng(0)
    params = {n: rng.standard_normal((4, 3)).astype(np.float16) for n in ("q.w", "k.w", "v.w")}
    params["other"] = np.ones(3, np.float16)
    fused = [{"op": "q.fused", "weight": "q.fused.w", "members": ["q", "k", "v"], "sources": ["q.w", "k.w", "v.w"],
              "axis": -1}]
    out = package_params(fused, params)
    assert set(out) == {"q.fused.w", "other"} and set(params) == {"q.w", "k.w", "v.w", "other"}
    assert np.array_equal(out["q.fused.w"], np.concatenate([params["q.w"], params["k.w"], params["v.w"]], axis=1))
    params.update({f"{p}.b": np.full(3, i, np.float16) for i, p in enumerate("qkv")})
    fused[0].update(bias="q.fused.b", bias_sources=["q.b", "k.b", "v.b"])
    out = package_params(fused, params)
    assert set(out) == {"q.fused.w", "q.fused.b", "other"}
    assert out["q.fused.b"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2] and out["q.fused.b"].dtype == np.float16


def test_selection_keeps_the_form_with_fewer_estimated_cycles_and_records_both():
    g = qkv_graph()
    separate = plan(g, TARGET, qkv="separate")
    fused = plan(g, TARGET, qkv="fused")
    auto = plan(g, TARGET)
    costs = {"separate": separate.estimate.cycles, "fused": fused.estimate.cycles}
    assert costs["separate"] != costs["fused"]
    cheaper = min(costs, key=costs.get)
    assert auto.qkv["chosen"] == cheaper and auto.estimate.cycles == costs[cheaper]
    assert (auto.qkv["separate_cycles"], auto.qkv["fused_cycles"]) == (costs["separate"], costs["fused"])
    assert separate.qkv["chosen"] == "separate" and separate.qkv["fused_cycles"] is None
    assert any(op.name == "q.fused" for op in auto.graph.ops) == (cheaper == "fused")


def test_with_two_jobs_the_separate_form_is_selected_in_the_background_and_the_plan_is_the_same():
    from tileplan.planner.planjson import plan_to_json
    g = qkv_graph()
    one, two = plan(g, TARGET, jobs=1), plan(g, TARGET, jobs=2)
    assert two.qkv["separate_cycles"] is not None and two.qkv["fused_cycles"] is not None
    assert plan_to_json(one) == plan_to_json(two)


@pytest.mark.slow
def test_the_small_encoder_layer_with_qkv_fused_validates_and_plan_json_says_so(tmp_path):
    from tileplan.graph.loaders import load_model
    graph = load_model("fixtures/encoder_layer_small.toml")
    p, pkg, v, estimate = _run(graph, tmp_path, qkv="fused")
    assert v.passed, v.outputs
    assert v.outputs["l.y"]["cosine"] > 0.9999 and estimate == v.profile.cycles
    doc = json.loads((pkg.path / "plan.json").read_text())
    assert doc["qkv"]["chosen"] == "fused" and doc["qkv"]["fused"][0]["members"] == ["l.q", "l.k", "l.v"]
    assert pkg.graph.op("l.q.fused").kind == "matmul" and pkg.graph.op("l.k").kind == "slice"


def test_the_pins_a_fused_plan_emits_reproduce_it(tmp_path):
    from tileplan.graph.pins import read_pins_file
    from tileplan.planner.pins import emit_pins
    g = qkv_graph()
    fused = plan(g, TARGET, qkv="fused")
    (tmp_path / "pins.toml").write_text(emit_pins(fused))
    pins = read_pins_file(tmp_path / "pins.toml")
    assert "q.fused" in {p.op for p in pins}
    again = plan(g, TARGET, pins=pins)                # a pin of the fused GEMM plans the fused form
    assert again.qkv["chosen"] == "fused" and again.estimate.cycles == fused.estimate.cycles


def test_the_members_bias_adds_fuse_into_one_add_of_the_concatenated_biases():
    g, (group,) = fused_graph(qkv_graph())
    add = g.op("q.fused.bias")
    assert add.inputs == ("q.fused.out", group.bias) and g.tensors[group.bias].shape == (192,)
    assert group.bias_sources == ("q.b", "k.b", "v.b") and not {"q.bias", "k.bias", "v.bias"} & {o.name for o in g.ops}
    # each Slice writes its member's Add output, so the rest of the graph reads what it read
    assert [(g.op(p).inputs, g.op(p).output) for p in "qkv"] == [(("q.fused.biased",), f"{p}.out") for p in "qkv"]
    assert not {"q.mm", "k.mm", "v.mm", "q.b", "k.b", "v.b"} & set(g.tensors)


def test_a_member_without_a_bias_add_keeps_every_member_s_add_apart():
    g = qkv_graph()
    ops = [op if op.name != "v.bias" else Tanh("v.bias", ("v.mm",), "v.out") for op in g.ops]
    g2 = Graph.build("qkv", [t for n, t in g.tensors.items() if n != "v.b"], ops)
    fused, (group,) = fused_graph(g2)
    assert group.bias is None and {"q.bias", "k.bias"} <= {o.name for o in fused.ops}


def test_a_fused_plan_with_values_validates_against_the_separate_graph_s_float64_result(tmp_path):
    """The package's concatenated weights and biases (``package_params``) give what the user's
    separate graph computes on the user's values."""
    g = qkv_graph()
    rng = np.random.default_rng(1)
    params = {n: (rng.standard_normal(t.shape) * (0.125 if n.endswith(".w") else 0.5)).astype(np.float16)
              for n, t in g.tensors.items() if t.role is Role.PARAMETER}
    x = rng.standard_normal(g.tensors["x"].shape).astype(np.float16)
    env = {"x": x.astype(np.float64), **{k: v.astype(np.float64) for k, v in params.items()}}
    for op in g.ops:                        # the separate graph's float64 semantics, rounded as declared
        out = op.reference(*(env[i] for i in op.inputs))
        env[op.output] = out.astype(g.tensors[op.output].dtype.numpy).astype(np.float64)
    np.savez(tmp_path / "in.npz", x=x)
    np.savez(tmp_path / "want.npz", y=env["y"])
    p, _, path = compile_model(g, TARGET, tmp_path / "pkg", jobs=1, qkv="fused", params=params)
    assert p.qkv["fused"][0]["bias"] == "q.fused.b"
    v = validate_package(load_package(path), inputs_path=tmp_path / "in.npz", expected_path=tmp_path / "want.npz")
    assert v.passed and v.outputs["y"]["cosine"] > 0.9999, v.outputs


def test_both_forms_catalogues_costed_in_one_pool_give_the_plan_one_job_gives(monkeypatch):
    """On a big target with two jobs, ``plan`` costs the two QKV forms' catalogues together first
    (``catalogue.warm``: the fused GEMM's beside the separate form's GEMMs, in one pool); each form
    then reads them from the cache. The plan is byte for byte the one-job plan."""
    from tileplan.planner import catalogue
    from tileplan.planner.planjson import plan_to_json
    big = load_target("ipu21")
    g = qkv_graph(width=128, tokens=64)
    warmed = []
    real = catalogue.warm
    monkeypatch.setattr(catalogue, "warm", lambda *a: warmed.append(real(*a)) or warmed[-1])
    one, two = plan(g, big, jobs=1), plan(g, big, jobs=2)
    assert warmed == [2]                      # q/k/v (one problem) and the fused GEMM; jobs=1 warms nothing
    assert plan_to_json(one) == plan_to_json(two)


def test_the_qkv_line_of_a_tower_names_its_first_and_last_group_and_the_count():
    """27 layers' q+k+v groups on one terminal line would run to hundreds of characters: a
    tower's line names the first and the last group and how many there are; a layer's names all."""
    from tileplan.report.terminal import qkv_line
    tower = {"groups": [[f"l{i}.q", f"l{i}.k", f"l{i}.v"] for i in range(27)], "mode": "auto",
             "chosen": "fused", "separate_cycles": 8_831_288, "fused_cycles": 8_429_712}
    line = qkv_line(tower)
    assert "27 groups: l0.q+l0.k+l0.v; ...; l26.q+l26.k+l26.v" in line and "l13.q" not in line
    assert len(line) < 140 and "separate 8,831,288, fused 8,429,712" in line
    layer = dict(tower, groups=tower["groups"][:2])
    assert "fused QKV (l0.q+l0.k+l0.v; l1.q+l1.k+l1.v): fused (the cheaper)" in qkv_line(layer)
