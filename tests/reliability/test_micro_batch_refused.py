"""Bad ``--micro-batch`` values and a damaged pipeline record: one ``error:`` line, exit 2, nothing written."""

from __future__ import annotations

import json

import pytest

from guarded import tree
from reliability_corpus import SMOKE, assert_refused, fresh_copy, rehash


@pytest.mark.parametrize("value, words", [
    ("0", ("--micro-batch", "positive")),
    ("-4", ("--micro-batch", "positive")),
    ("abc", ("--micro-batch", "'abc'")),
    ("2.5", ("--micro-batch", "'2.5'")),
    ("5", ("--micro-batch 5", "96")),          # does not divide the 96 rows
    ("192", ("--micro-batch 192", "96")),      # more than the batch
])
def test_bad_micro_batch_refused(guard, tmp_path, value, words):
    out = tmp_path / "out"
    before = tree(tmp_path)
    result = guard.run(["compile", SMOKE, "-o", out, "-t", "ipu21-64x2", "--micro-batch", value, "-j", "1"], tmp_path)
    assert_refused(result, *words)
    assert tree(tmp_path) == before


def test_plan_refuses_a_model_whose_activations_fold_the_batch(guard, tmp_path):
    model = tmp_path / "fold.toml"
    model.write_text('[model]\nname = "fold"\ntarget = "ipu21-64"\noutputs = ["y"]\n\n[tensors]\n'
                     'x = { shape = [2, 4, 8], dtype = "fp16", role = "input" }\n\n'
                     '[[ops]]\nname = "flat"\nop = "reshape"\ninputs = ["x"]\noutput = "y"\nshape = [8, 8]\n')
    assert_refused(guard.run(["plan", model, "--micro-batch", "1"], tmp_path), "'y'", "--micro-batch", "batch")


@pytest.fixture(scope="module")
def piped_package(tmp_path_factory):
    """The smoke MLP on ipu21-64x2 in 4 micro-batches of 24 rows."""
    from tileplan.cli import main
    out = tmp_path_factory.mktemp("micro") / "piped"
    with pytest.raises(SystemExit) as info:
        main(["compile", str(SMOKE), "-o", str(out), "-t", "ipu21-64x2", "--ipus", "stages", "--micro-batch", "24",
              "-j", "1", "-q"])
    assert (info.value.code or 0) == 0
    return out


@pytest.mark.parametrize("field, value, words", [
    ("micro_batches", 5, ("plan.json", "pipeline", "5 micro-batches")),
    ("micro_batches", 10 ** 9, ("plan.json", "micro_batches")),
    ("stages", 3, ("plan.json", "3 stages")),
    ("micro_batch", 48, ("plan.json", "'x'")),
])
def test_damaged_pipeline_record_refused(guard, piped_package, tmp_path, field, value, words):
    pkg = fresh_copy(piped_package, tmp_path)
    doc = json.loads((pkg / "plan.json").read_text())
    doc["pipeline"][field] = value
    if field == "micro_batch":
        doc["pipeline"]["micro_batches"] = 2          # 2 x 48 = the batch: the input's rows then disagree
    (pkg / "plan.json").write_text(json.dumps(doc))
    rehash(pkg)
    assert_refused(guard.run(["validate", pkg], tmp_path), *words)
