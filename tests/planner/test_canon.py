"""Canonical keys of planning problems (planner/canon.py) and sharing one costing among equal ops."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tileplan.graph.core import Graph, Role
from tileplan.graph.loaders import load_model
from tileplan.planner import canon
from tileplan.planner.plan import parameter_storage, plan
from tileplan.planner.planjson import plan_to_json
from tileplan.planner.rewrite import canonical
from tileplan.target import load_target

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
LAYER = FIXTURES / "encoder_layer_small.toml"
TOWER = FIXTURES / "encoder_tower_small.toml"


def op_keys(graph, target) -> list[str]:
    g = canonical(graph)
    storage = parameter_storage(g, target)
    return [canon.op_key(g, storage, op) for op in g.ops]


def renamed(graph: Graph) -> Graph:
    """The same graph with every tensor and op renamed (and the ops' names reversed in order)."""
    tmap = {n: f"t{i}_{n[::-1]}" for i, n in enumerate(graph.tensors)}
    tensors = [dataclasses.replace(t, name=tmap[t.name]) for t in graph.tensors.values()]
    ops = [dataclasses.replace(op, name=f"op_{op.name[::-1]}", inputs=tuple(tmap[i] for i in op.inputs),
                               output=tmap[op.output]) for op in graph.ops]
    outputs = [tmap[t.name] for t in graph.by_role(Role.OUTPUT)]
    return Graph.build("renamed", tensors, ops, outputs=outputs, target=graph.target)


def test_op_keys_do_not_change_when_every_tensor_and_op_is_renamed():
    g = load_model(LAYER)
    target = load_target(g.target)
    assert op_keys(renamed(g), target) == op_keys(g, target)


def test_op_keys_are_the_same_in_a_fresh_interpreter():
    code = ("from tileplan.graph.loaders import load_model; from tileplan.target import load_target;"
            "from tests.planner.test_canon import op_keys; g = load_model(%r);"
            "print(','.join(op_keys(g, load_target(g.target))))" % str(LAYER))
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, check=True,
                         env={"PYTHONHASHSEED": "12345", "PATH": ""}).stdout.strip()
    g = load_model(LAYER)
    assert out.split(",") == op_keys(g, load_target(g.target))


@pytest.mark.parametrize("name", ["mlp_smoke_fp8", "odd_fp8_tails", "odd_3d_activation", "odd_prime_dims"])
def test_op_keys_of_the_onnx_twin_equal_those_of_the_toml_model(name):
    g = load_model(FIXTURES / f"{name}.toml")
    twin = load_model(FIXTURES / f"{name}.onnx")
    target = load_target(g.target)
    assert op_keys(twin, target) == op_keys(g, target)


def test_op_keys_of_a_model_written_to_onnx_and_read_back_are_unchanged(tmp_path):
    from tileplan.graph.onnx import to_onnx
    g = load_model(FIXTURES / "residual_block.toml")
    rng = np.random.default_rng(0)
    params = {t.name: rng.standard_normal(t.shape).astype(t.dtype.numpy) for t in g.by_role(Role.PARAMETER)}
    path = tmp_path / "block.onnx"
    path.write_bytes(to_onnx(g, params).SerializeToString())
    target = load_target(g.target)
    assert op_keys(load_model(path), target) == op_keys(g, target)


def test_a_different_shape_or_scale_changes_the_op_key():
    g = load_model(FIXTURES / "mlp_smoke_fp8.toml")
    target = load_target(g.target)
    base = op_keys(g, target)
    tensors = dict(g.tensors)
    tensors["w1"] = dataclasses.replace(tensors["w1"], scale=3)
    other = Graph.build(g.name, list(tensors.values()), g.ops, target=g.target)
    changed = op_keys(other, target)
    names = [op.name for op in canonical(g).ops]
    # fc1 and the cast feeding it (its neighbourhood reads fc1) change; the second half does not.
    assert changed[names.index("fc1")] != base[names.index("fc1")]
    assert changed[names.index("cast_x")] != base[names.index("cast_x")]
    later = [names.index(n) for n in ("act", "cast_g", "fc2", "bias2")]
    assert [changed[i] for i in later] == [base[i] for i in later]


def test_the_q_k_v_projections_of_a_layer_are_one_planning_problem():
    g = canonical(load_model(LAYER))
    storage = parameter_storage(g, load_target(g.target))
    keys = {op.name: canon.op_key(g, storage, op) for op in g.ops}
    assert keys["l.q"] == keys["l.k"] == keys["l.v"]
    assert keys["l.q"] != keys["l.fc1"]


def test_the_small_tower_is_found_as_four_repeated_layers_with_one_subgraph_key():
    g = canonical(load_model(TOWER))
    storage = parameter_storage(g, load_target(g.target))
    blocks = canon.repeated_blocks(g, storage)
    assert len(blocks) == 4 and sum(len(b) for b in blocks) == len(g.ops)
    assert {b[0].name.split(".")[0] for b in blocks} == {"l0", "l1", "l2", "l3"}
    inner = {canon.subgraph_key(g, storage, b) for b in blocks[1:-1]}
    assert len(inner) == 1
    keys = {op.name: canon.op_key(g, storage, op) for op in g.ops}
    assert keys["l1.fc1"] == keys["l2.fc1"] == keys["l0.fc1"]


@pytest.mark.parametrize("fixture", [LAYER, pytest.param(TOWER, marks=pytest.mark.slow)],
                         ids=["encoder_layer_small", "encoder_tower_small"])
def test_a_plan_with_shared_costing_is_byte_identical_to_one_costing_every_op(planned, fixture):
    g, target, shared_plan = planned(fixture)                  # share=True: the planner's default
    shared = json.dumps(plan_to_json(shared_plan), sort_keys=True)
    alone = json.dumps(plan_to_json(plan(g, target, share=False)), sort_keys=True)
    assert shared == alone


def test_a_renaming_leaves_a_tensor_both_ops_share_alone_even_where_its_name_extends_the_op_name():
    """The K GEMM reads the Q GEMM's cast (one cast for Q, K and V): mapping ``l.q`` to ``l.k`` must
    not turn the shared ``l.q.x8`` into ``l.k.x8``."""
    from tileplan.planner.canon import Renaming
    rn = Renaming(["l.q", "l.q.x8", "l.q.w"], ["l.k", "l.q.x8", "l.k.w"])
    assert rn("l.q.x8@Rows(1472)") == "l.q.x8@Rows(1472)"
    assert rn("l.q.prep") == "l.k.prep" and rn("l.q.w") == "l.k.w" and rn("l.q.A") == "l.k.A"
    assert Renaming(["a", "b"], ["a", "b"]).identity
