"""Compile then validate, end to end.

- Every small fixture compiles into a package that validates on the IPU model
  within its dtype's tolerance: the FP8 smoke MLP within 0.01 max abs error,
  the FP16 small MLP within 0.001; the planner's detailed estimate (the
  package's ``report.json``) is within 5% of the simulated cycles.
- Property: random small graphs (chains of MatMul with a parameter B, bias or
  residual Add, tanh/erf GeLU and Cast; odd sizes, 3-D activations; 4 to 64
  tiles; FP32, FP16 and FP8) plan, lower and run on the IPU model without a
  conflict, and agree with the float64 reference within the default tolerance.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tileplan.graph.core import Add, Cast, GeLU, Graph, MatMul, Role, Tensor
from tileplan.graph.dtypes import DType
from tileplan.graph.loaders import load_model
from tileplan.lowering.compile import compile_model
from tileplan.lowering.lower import lower
from tileplan.lowering.package import Package, load_package
from tileplan.planner.plan import plan
from tileplan.sim.validate import validate_package
from tileplan.target import load_target

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SMALL_FIXTURES = ["mlp_smoke_fp8", "mlp_fp16_small", "odd_prime_dims", "odd_fp8_tails", "odd_fp8_panels",
                  "odd_3d_activation", "residual_block", "pointwise_mix", "encoder_layer_small"]
MAX_ABS_ERROR = {"mlp_smoke_fp8": 0.01, "mlp_fp16_small": 0.001, "odd_fp8_panels": 0.01}


@pytest.fixture(scope="module")
def validated(tmp_path_factory):
    """Per fixture and parameter storage (``weights``, None: the planner's): (package, validation),
    compiled and validated once for this module."""
    cache = {}

    def get(name: str, weights: str | None = None):
        if (name, weights) not in cache:
            graph = load_model(FIXTURES / f"{name}.toml")
            target = load_target(graph.target)
            _, _, path = compile_model(graph, target, tmp_path_factory.mktemp(name) / "pkg", jobs=1, weights=weights)
            pkg = load_package(path)
            cache[name, weights] = pkg, validate_package(pkg)
        return cache[name, weights]

    return get


@pytest.mark.parametrize("fixture", SMALL_FIXTURES)
def test_each_small_fixture_compiles_and_validates_within_its_tolerance(validated, fixture):
    pkg, v = validated(fixture)
    assert v.outputs, "the package has outputs to compare"
    for name, figures in v.outputs.items():
        assert figures["passed"], (name, figures)
        assert figures["nonfinite"] == 0 and figures["cosine"] > 0.999
        if fixture in MAX_ABS_ERROR:
            assert figures["max_abs"] <= MAX_ABS_ERROR[fixture], (name, figures["max_abs"])


@pytest.mark.parametrize("fixture", SMALL_FIXTURES)
def test_the_detailed_estimate_is_within_five_percent_of_the_simulated_cycles(validated, fixture):
    pkg, v = validated(fixture)
    estimate = json.loads((pkg.path / "report.json").read_text())["estimate"]
    simulated = v.profile
    assert abs(estimate["cycles"] - simulated.cycles) <= 0.05 * simulated.cycles, (estimate, simulated.cycles)
    assert simulated.cycles == simulated.compute + simulated.exchange + simulated.sync


@pytest.mark.parametrize("fixture, op, weight", [("odd_fp8_panels", "fc1", "w1"), ("odd_fp8_panels", "fc2", "w2"),
                                                  ("mlp_smoke_fp8", "fc2", "w2")])
def test_fp8_weights_with_a_partial_last_panel_are_read_as_panels_and_estimated_exactly(validated, fixture, op,
                                                                                       weight):
    # N % 32 != 0: with compact weights, the weight is stored as panels (the last one narrower), the AMP
    # reads them without an in-kernel pack, the package validates, and the detailed estimate is the
    # simulated figure.
    pkg, v = validated(fixture, "compact")
    w = next(b for b in pkg.program.buffers if b.kind == "parameter" and b.tensor == weight)
    assert w.shape[-1] % 32 and w.space == "panels32" and w.layout.startswith("Packed(32,")
    amp = [g for s in pkg.program.steps if s.name == f"{op}.amp" for g in s.groups]
    assert amp and {g.call.b_format for g in amp} == {"panels"} and {g.variant for g in amp} == {"amp_fp8_fp16"}
    assert any(g.call.n % 32 for g in amp)                     # some tile reads the partial panel
    assert all(f["passed"] and f["max_abs"] <= 0.01 for f in v.outputs.values())
    estimate = json.loads((pkg.path / "report.json").read_text())["estimate"]
    assert estimate["cycles"] == v.profile.cycles


# ---- property: random small graphs --------------------------------------------------------

F32, F16, F8 = DType.FP32, DType.FP16, DType.FP8
IPU21_64 = load_target("ipu21-64")
OP_KINDS = ["matmul", "gelu", "bias", "cast", "residual"]


@st.composite
def small_graphs(draw):
    """(graph, target): a valid chain by construction, with its tile count."""
    tiles = draw(st.integers(4, 64))
    kind = draw(st.sampled_from([F32, F16, F8]))
    lead = draw(st.sampled_from([(), (), (2,), (3,)]))
    shape = lead + (draw(st.integers(1, 40)), draw(st.integers(1, 48)))
    x = Tensor("x", shape, F16 if kind is F8 else kind, Role.INPUT)
    tensors, ops = [x], []
    cur = (x.name, shape, x.dtype)
    if kind is F8:                       # an FP8 MatMul needs FP8 operands: cast the input first
        tensors.append(Tensor("x8", shape, F8))
        ops.append(Cast("cast_x", ("x",), "x8"))
        cur = ("x8", shape, F8)
    seen = [cur]
    for i, op in enumerate(draw(st.lists(st.sampled_from(OP_KINDS), min_size=1, max_size=4))):
        name, shape, dtype = cur
        residuals = [s for s in seen if s[1:] == (shape, dtype) and s[0] != name]
        if dtype is F8 and op != "matmul":
            op = "cast"                  # FP8 values only feed a MatMul or a cast
        elif op == "residual" and not residuals:
            op = "gelu"
        out = f"t{i}"
        if op == "matmul":
            n = draw(st.integers(1, 48))
            tensors.append(Tensor(f"w{i}", (shape[-1], n), dtype, Role.PARAMETER))
            ops.append(MatMul(f"mm{i}", (name, f"w{i}"), out))
            cur = (out, shape[:-1] + (n,), F16 if dtype is F8 else dtype)
        elif op == "bias":
            tensors.append(Tensor(f"b{i}", (shape[-1],), dtype, Role.PARAMETER))
            ops.append(Add(f"bias{i}", (name, f"b{i}"), out))
            cur = (out, shape, dtype)
        elif op == "residual":
            other = draw(st.sampled_from(residuals))[0]
            ops.append(Add(f"res{i}", (other, name), out))
            cur = (out, shape, dtype)
        elif op == "gelu":
            ops.append(GeLU(f"gelu{i}", (name,), out, approximate=draw(st.sampled_from(["tanh", "erf"]))))
            cur = (out, shape, dtype)
        else:
            to = draw(st.sampled_from([d for d in (F32, F16, F8) if d is not dtype]))
            tensors.append(Tensor(out, shape, to, scale=draw(st.sampled_from([-1, 0, 1])) if to is F8 else 0))
            ops.append(Cast(f"cast{i}", (name,), out))
            cur = (out, shape, to)
        seen.append(cur)
    graph = Graph.build("random_chain", tensors, ops)
    return graph, IPU21_64.with_tiles(tiles)


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(small_graphs())
def test_random_small_graphs_run_without_conflict_and_agree_with_the_reference(case):
    graph, target = case
    p = plan(graph, target)
    state = lower(p.mid.program, target)
    v = validate_package(Package(None, graph, target, state.tile_program, {}, {}, {}))   # raises on a conflict
    described = "; ".join(op.describe() for op in graph.ops) + f" on {target.tiles} tiles"
    assert v.passed, (described, v.outputs)
    assert v.profile.cycles == p.estimate.cycles, described


def test_an_onnx_models_package_validates_with_the_parameter_values_it_carries(tmp_path):
    from tileplan.graph.loaders import load_params
    from tileplan.sim.reference import seeded_values

    model = FIXTURES / "mlp_smoke_fp8.onnx"
    graph, params = load_model(model), load_params(model)
    _, _, path = compile_model(graph, load_target("ipu21-64"), tmp_path / "pkg", params=params, jobs=1)
    pkg = load_package(path)
    assert sorted(pkg.params) == sorted(params) == sorted(t.name for t in graph.by_role(Role.PARAMETER))
    seeded = seeded_values(graph)
    for name, value in params.items():
        assert pkg.params[name].dtype == graph.tensors[name].dtype.numpy
        assert pkg.params[name].tobytes() == value.astype(graph.tensors[name].dtype.numpy).tobytes()
        assert pkg.params[name].tobytes() != seeded[name].tobytes(), "the file's values, not the seeded ones"
    v = validate_package(pkg)
    assert v.passed and v.outputs["y"]["max_abs"] <= 0.01


def test_a_gemm_whose_blocks_do_not_fit_at_once_runs_serial_k_and_validates(tmp_path):
    # A 64-tile target with 10,240 B of SRAM per tile: no grid of the smoke MLP fits without
    # splitting K serially; the accumulating AMP steps must give the reference numbers.
    import dataclasses
    from tileplan.lowering.package import load_package
    from tileplan.lowering.compile import compile_model
    from tileplan.sim.validate import validate_package
    base = load_target("ipu21-64")
    tiny = dataclasses.replace(base, name="tiny", sram_bytes=10_240, standard_bytes=5_120, interleaved_bytes=5_120,
                               reserve_bytes=1_024)
    graph = load_model(FIXTURES / "mlp_smoke_fp8.toml")
    p, _, path = compile_model(graph, tiny, tmp_path / "pkg")
    serial = [n.candidate.choice.sk for n in p.mid.nodes if n.kind == "op" and n.candidate.choice is not None]
    assert max(serial) > 1
    v = validate_package(load_package(path))
    assert v.passed and v.outputs["y"]["max_abs"] <= 0.01
    assert v.profile.cycles == p.estimate.cycles


@pytest.mark.slow
def test_the_full_size_siglip_fp8_encoder_layer_compiles_and_validates(tmp_path):
    """The So400m/14 encoder layer (729 tokens, 16 heads of 72, FP8 projections) on 1472 tiles:
    within the FP8 tolerance of float64, and the planner's estimate is the simulated cycles."""
    graph = load_model(FIXTURES / "siglip_layer_fp8_b1.toml")
    target = load_target(graph.target)
    _, _, path = compile_model(graph, target, tmp_path / "pkg", jobs=2)
    pkg = load_package(path)
    v = validate_package(pkg)
    figures = v.outputs["l.y"]
    assert figures["passed"] and figures["cosine"] > 0.999, figures
    assert json.loads((pkg.path / "report.json").read_text())["estimate"]["cycles"] == v.profile.cycles
