"""A pipeline stage of an FP8 tower keeps its small replicated parameters (bias rows, LayerNorm gamma
and beta) only while they leave its tiles room for the activations (``storage.parameter_storage``,
``RESIDENT_FILL``).

The case is the SigLIP FP8 tower on two IPUs in miniature: the small FP8 tower (4 layers, 64 tiles
per IPU) on tiles of 7,680 usable bytes. Its whole tower's replicas and panels (13,312 B per tile)
overflow a tile, so they are broadcast and the tower plans on one IPU; a 2-layer stage's (6,656 B)
just fit, and kept resident they left no room for the layer's activations: the stage did not plan
although the whole tower did on half the tiles."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import numpy as np

from tileplan.graph.core import Role
from tileplan.target import load_target

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def _tower(tmp_path: Path) -> Path:
    spec = importlib.util.spec_from_file_location("make_encoder", FIXTURES / "make_encoder.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("make_encoder", mod)       # its dataclasses look their module up
    spec.loader.exec_module(mod)
    s = mod.Spec("small_fp8_tower4", "ipu21-64", 2, 20, 96, 6, 192, True, layers=4, description="small FP8 tower")
    path = tmp_path / f"{s.name}.toml"
    path.write_text(mod.Writer(s).text())
    return path


def _tight(name: str):
    """``name`` with tiles of 8 KiB (7,680 usable bytes, 6 KiB of them interleaved)."""
    return dataclasses.replace(load_target(name), name=f"{name}-8k", standard_bytes=2048, interleaved_bytes=6144,
                               sram_bytes=8192, reserve_bytes=512)


def _resident(graph, target, storage) -> np.ndarray:
    from tileplan.estimate.memory import buffer_tile_bytes
    from tileplan.planner.storage import stored_shape
    from tileplan.program import Buffer
    out = np.zeros(target.tiles, dtype=np.int64)
    for name, st in storage.items():
        if st.private:
            t = graph.tensors[name]
            out += buffer_tile_bytes(Buffer(name, st.layout, stored_shape(t, st), t.dtype, "parameter"),
                                     target.tiles, target.alignment)
    return out


def test_a_stage_whose_replicas_would_fill_its_tiles_broadcasts_them(tmp_path):
    from tileplan.graph.loaders import load_model
    from tileplan.planner import elementwise as ew
    from tileplan.planner.rewrite import canonical
    from tileplan.planner.stages import stage_graph
    from tileplan.planner.storage import RESIDENT_FILL, parameter_storage
    g = canonical(load_model(_tower(tmp_path)))
    one = _tight("ipu21-64")
    half = next(i for i, op in enumerate(g.ops) if op.name.startswith("l2."))
    stage = stage_graph(g, 0, half)
    st = parameter_storage(stage, one)
    replicable = [n for n, t in stage.tensors.items() if t.role is Role.PARAMETER and len(t.shape) == 1]
    assert len(replicable) == 20                       # 10 bias rows and LayerNorm vectors a layer
    assert not any(st[n].private and st[n].layout == ew.replicated(stage.tensors[n].shape, one.tiles)
                   for n in replicable)
    assert _resident(stage, one, st).max() <= RESIDENT_FILL * one.usable_bytes
    # on a roomy tile the same stage keeps them resident (a copy on every tile)
    roomy = load_target("ipu21-64")
    kept = parameter_storage(stage, roomy)
    assert all(kept[n].layout == ew.replicated(stage.tensors[n].shape, roomy.tiles) for n in replicable)


def test_a_tower_that_plans_on_one_ipu_plans_as_two_stages_on_two(tmp_path):
    from tileplan.graph.loaders import load_model
    from tileplan.planner.plan import plan
    g = load_model(_tower(tmp_path))
    kw = dict(qkv="separate", weights="compact")
    whole = plan(g, _tight("ipu21-64"), **kw)
    two = _tight("ipu21-64x2")
    staged = plan(g, two, ipus="stages", **kw)
    stages = staged.stages["stages"]
    assert [(s["first_op"], s["last_op"]) for s in stages] == [("l0.ln1", "l1.res2"), ("l2.ln1", "l3.res2")]
    assert 0 < staged.estimate.total_memory <= two.usable_bytes
    # each stage runs half the layers: the slowest is faster than the whole tower on one IPU
    assert staged.stages["interval_cycles"] < whole.estimate.cycles
