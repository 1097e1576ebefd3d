"""Repeated layers of an imported model are planned once, as the TOML tower's are: a small SigLIP
encoder of three layers (HF ``SiglipEncoder``, random init) imported through torch.export and
through its ONNX export costs as many GEMM catalogues (plan cache entries, misses) as its TOML
twin written by ``fixtures/make_encoder.py``; and a plan cache one import filled is read
correctly by the other (hits, no warning, the plan it would make on its own)."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnx")

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
sys.path.insert(0, str(FIXTURES))

import make_encoder  # noqa: E402
import siglip_hf  # noqa: E402

from tileplan.graph.loaders import load_model  # noqa: E402
from tileplan.graph.onnx import import_onnx  # noqa: E402
from tileplan.graph.torch import import_module  # noqa: E402
from tileplan.planner.cache import PlanCache  # noqa: E402
from tileplan.planner.plan import plan  # noqa: E402
from tileplan.target import load_target  # noqa: E402

LAYERS, WIDTH, HEADS, MLP, BATCH, TOKENS = 2, 32, 2, 64, 1, 8
TARGET = load_target("ipu21-64")


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    """The tower three ways: TOML twin, torch.export, ONNX export (all FP16)."""
    d = tmp_path_factory.mktemp("repeats")
    spec = make_encoder.Spec("tiny_tower", "ipu21-64", BATCH, TOKENS, WIDTH, HEADS, MLP, False, layers=LAYERS,
                              description="two small SigLIP layers")
    (d / "tiny.toml").write_text(make_encoder.Writer(spec).text())
    module, x = siglip_hf.siglip_encoder(LAYERS, WIDTH, HEADS, MLP, BATCH, TOKENS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, x, str(d / "tiny.onnx"), dynamo=False, opset_version=17)
    return {"toml": load_model(d / "tiny.toml"), "torch": import_module(module, x).graph,
            "onnx": import_onnx(d / "tiny.onnx").graph}


def planned(graph, folder: Path):
    warned: list[str] = []
    cache = PlanCache(folder, warn=warned.append)
    p = plan(graph, TARGET, cache=cache, qkv="separate")
    return p, cache, warned


@pytest.fixture(scope="module")
def fresh(graphs, tmp_path_factory):
    d = tmp_path_factory.mktemp("caches")
    return {name: (*planned(g, d / name), d / name) for name, g in graphs.items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["torch", "onnx"])
def test_an_imported_tower_costs_one_catalogue_per_distinct_layer_gemm_as_its_toml_twin(name, fresh):
    _, toml_cache, _, _ = fresh["toml"]
    _, cache, warned, _ = fresh[name]
    assert not warned
    # q, k, v and out projections alike; q@k, p@v, fc1, fc2: five problems, each costed once for
    # both layers (one more entry: the selection)
    assert cache.misses == toml_cache.misses and len(cache.entries()) == len(toml_cache.entries())
    assert len(toml_cache.entries()) < 8 * LAYERS


@pytest.mark.slow
@pytest.mark.parametrize("first,second", [("torch", "onnx"), ("onnx", "torch")])
def test_a_plan_cache_filled_by_one_import_is_read_by_the_other(first, second, graphs, fresh, tmp_path):
    import shutil
    shutil.copytree(fresh[first][3], tmp_path / "cache")
    alone = fresh[second][0]
    p, cache, warned = planned(graphs[second], tmp_path / "cache")
    assert not warned                         # no entry taken for foreign or corrupt
    assert cache.hits > 0
    assert p.estimate.cycles == alone.estimate.cycles
    chosen = lambda q: {op: str(q.candidates[op][i]) for op, i in q.picks.items()}  # noqa: E731
    assert chosen(p) == chosen(alone)
