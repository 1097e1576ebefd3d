"""Repeated layers behind a prologue (``canon.repeated_blocks``) and their composition in the
selection (``select._Search``): a whole vision model (patch embedding, position-embedding Add,
the layers, post-LayerNorm, MAP head) has its layers found as whole layers, each starting where
only the residual stream is live, and the selection composes every one of them from a layer's
start states, as it does for a tower that starts from embeddings."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tileplan.graph.loaders import load_model
from tileplan.planner import canon, select
from tileplan.planner.plan import Context, build_problem, parameter_storage, plan
from tileplan.planner.rewrite import canonical
from tileplan.target import load_target

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
sys.path.insert(0, str(FIXTURES))

import make_encoder  # noqa: E402

LAYERS = 3


def small(tmp_path: Path, vision: bool, layers: int = LAYERS) -> Path:
    """A small FP8 SigLIP-style model on 64 tiles: with ``vision``, from pixels (an image of 35 px,
    patches of 8: a crop, 16 tokens) with the MAP head; else the tower from embeddings."""
    spec = make_encoder.Spec("vision_small" if vision else "tower_small", "ipu21-64", 1, 16, 64, 4, 128, True,
                             layers=layers, image=35 if vision else 0, patch=8 if vision else 0, head=vision,
                             description="small")
    path = tmp_path / f"{spec.name}.toml"
    path.write_text(make_encoder.Writer(spec).text())
    return path


def blocks_of(path: Path):
    g = canonical(load_model(path))
    return g, canon.repeated_blocks(g, parameter_storage(g, load_target(g.target)))


def test_a_vision_model_s_repeated_blocks_are_its_whole_layers_as_the_tower_s_are(tmp_path):
    """The prologue ends with an Add (the position embeddings) as each layer does (the residual),
    so a run of blocks one op earlier covers as many ops; the blocks kept start at each layer's
    first op, where one value is live, like the tower's."""
    g, blocks = blocks_of(small(tmp_path, True))
    tg, tblocks = blocks_of(small(tmp_path, False))
    assert [(b[0].name, b[-1].name) for b in blocks] == [(f"l{i}.ln1", f"l{i}.res2") for i in range(LAYERS)]
    assert [[op.kind for op in b] for b in blocks] == [[op.kind for op in b] for b in tblocks]
    index = {op.name: i for i, op in enumerate(g.ops)}
    crossing = canon._crossing(g)
    assert [crossing[index[b[0].name]] for b in blocks] == [1] * LAYERS
    # the run one op earlier (from the position Add to each layer's last bias Add) repeats too, and
    # each of its starts holds two values: the residual stream and the bias Add's output
    early = index["l0.ln1"] - 1
    assert g.ops[early].kind == g.ops[index["l0.res2"]].kind == "add"
    assert [crossing[index[f"l{i}.res2"]] for i in range(LAYERS - 1)] == [2] * (LAYERS - 1)


def test_a_tower_from_embeddings_keeps_its_blocks_from_its_first_op_to_its_last(tmp_path):
    """No prologue: the blocks start at the first op and end at the last, as before the rule."""
    g, blocks = blocks_of(small(tmp_path, False))
    assert blocks[0][0] is g.ops[0] and blocks[-1][-1] is g.ops[-1]
    assert sum(len(b) for b in blocks) == len(g.ops)


@pytest.mark.slow
def test_every_layer_of_a_whole_vision_model_is_composed_from_the_residual_stream_alone(tmp_path, monkeypatch):
    """The selection of the small vision model composes each of its layers (the first too: it
    reads the prologue's output, not a host input, so it repeats the others) from states holding
    the residual stream alone, and the plan's selection is the composed one."""
    path = small(tmp_path, True, layers=2)
    g = load_model(path)
    target = load_target(g.target)
    seen = []
    compose = select._Search.compose

    def spy(self, block, states):
        got = compose(self, block, states)
        seen.append((block.start, sorted({len(live) for live, _, _ in states.values()}), got is not None))
        return got
    monkeypatch.setattr(select._Search, "compose", spy)
    p = plan(g, target, qkv="fused")
    problem = build_problem(Context(p.graph, target, 1, weights=p.weights), p.candidates)
    assert problem.blocks is not None and len(problem.blocks) == 2
    assert seen == [(a, [1], True) for a, _ in problem.blocks]
    assert select.fits(problem, select.evaluate(problem, p.selection.picks))
