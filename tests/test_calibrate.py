"""The calibration data set and ``tileplan calibrate``: model vs public hardware measurements."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from tileplan import calibrate as cal
from tileplan.errors import TileplanError
from tileplan.kernels import MatMulCall, default_registry, dispatch
from tileplan.graph.dtypes import DType
from tileplan.target import load_target

ENTRIES = cal.load_entries()
TARGET = load_target("ipu21")


def test_the_data_set_is_schema_valid_with_a_source_and_split_per_entry_and_held_out_per_kind():
    ids = [e.id for e in ENTRIES]
    assert len(ids) == len(set(ids))
    for e in ENTRIES:
        assert e.source.startswith("ipu-stack ") and e.split in cal.SPLITS and e.hardware > 0, e.id
        assert (e.calls if e.kind == "kernel" else e.fixture), e.id
    for kind in cal.KINDS:
        splits = {e.split for e in ENTRIES if e.kind == kind}
        assert splits == {"fit", "held-out"}, kind
    # The split follows the file's stated rule (position within the family), not the errors.
    seen: dict[str, int] = {}
    for e in ENTRIES:
        seen[e.family] = seen.get(e.family, 0) + 1
        assert (e.split == "held-out") == cal.held_out_by_rule(seen[e.family]), e.id


def test_a_data_file_breaking_the_schema_or_the_split_rule_is_one_error_naming_file_and_entry(tmp_path):
    text = cal.DATA.read_text()
    bad = tmp_path / "dup.toml"
    bad.write_text(text.replace('id = "reduce_fp16_56_p2"', 'id = "reduce_fp16_8_p2"'))
    with pytest.raises(TileplanError, match=r"dup\.toml.*reduce_fp16_8_p2.*duplicate id"):
        cal.load_entries(bad)
    moved = tmp_path / "split.toml"
    moved.write_text(text.replace('id = "amp_qkv_fp8_244_128_64"\nkind = "kernel"', 'id = "amp_qkv_fp8_244_128_64"\n'
                                  'kind = "kernel"', 1).replace('hardware = 18576\nsource = "ipu-stack docs/'
                                  'GEMM_UTILIZATION_2026_09_13.md"\nsplit = "fit"', 'hardware = 18576\nsource = '
                                  '"ipu-stack docs/GEMM_UTILIZATION_2026_09_13.md"\nsplit = "held-out"'))
    with pytest.raises(TileplanError, match=r"amp_qkv_fp8_244_128_64.*breaks the file's rule"):
        cal.load_entries(moved)


def test_kernel_model_cycles_are_the_registry_dispatch_of_the_entry_call():
    entry = next(e for e in ENTRIES if e.id == "amp_qkv_fp8_244_128_64")
    call = MatMulCall(m=244, n=64, k=128, in_dtype=DType.FP8, partials=DType.FP16, b_format="panels", grain=32)
    direct = dispatch(call, TARGET)
    assert cal.kernel_model(entry, TARGET) == (direct.cycles(call, TARGET), [direct.name])
    # A registry whose AMP variant is gone prices the entry differently: the model is asked, not copied.
    other = cal.kernel_model(entry, TARGET, registry=default_registry().without("amp_fp8_fp16"))
    assert other[1] != [direct.name] and other[0] != direct.cycles(call, TARGET)


def test_an_entry_naming_a_variant_is_priced_by_that_variant():
    entry = next(e for e in ENTRIES if e.id == "softmax_7or8x768_whole_rows")
    (call,) = cal.calls_of(entry)
    model, names = cal.kernel_model(entry, TARGET)
    assert names == ["softmax_rows_fp16"] and model == dispatch(call, TARGET, force="softmax_rows_fp16").cycles(call, TARGET)
    assert model != dispatch(call, TARGET).cycles(call, TARGET)     # dispatch alone would take the split schedule


def test_the_calibrate_command_prints_a_row_per_kernel_entry_with_its_ratio(cli):
    code, out, err = cli("calibrate", "--kernels-only", "--json")
    assert code == 0, err
    doc = json.loads(out)
    kernels = [e for e in ENTRIES if e.kind == "kernel"]
    assert [r["id"] for r in doc["entries"]] == [e.id for e in kernels]
    for r, e in zip(doc["entries"], kernels):
        assert r["hardware"] == e.hardware and math.isclose(r["ratio"], r["model"] / e.hardware)
    for e in kernels:
        assert e.id in err                                    # the human table went to stderr
    groups = {(s["group"], s["split"]) for s in doc["summary"]}
    assert {("kernel", "fit"), ("kernel", "held-out"), ("kernel: amp", "held-out")} <= groups
    amp_held = next(s for s in doc["summary"] if s["group"] == "kernel: amp" and s["split"] == "held-out")
    assert amp_held["fitted"] is not None and amp_held["published"]["n"] == amp_held["fitted"]["n"]


def test_the_amp_fit_sees_only_the_fit_split_and_reproduces_the_module_constants():
    fit_entries = [e for e in ENTRIES if e.split == "fit"]
    fit = cal.fit_amp(fit_entries)
    assert {k: fit[k] for k in cal.AMP_FIT} == cal.AMP_FIT and tuple(fit["ids"]) == cal.AMP_FIT_IDS
    # Altering every held-out entry changes nothing: the fit takes the entries it is given.
    altered = [dataclasses.replace(e, hardware=e.hardware * 3) if e.split == "held-out" else e for e in ENTRIES]
    assert cal.fit_amp([e for e in altered if e.split == "fit"]) == fit
    # ... while altering a fit entry does change it (the fit does read its entries).
    shifted = [dataclasses.replace(e, hardware=e.hardware + 5000) if e.id == fit["ids"][0] else e for e in fit_entries]
    assert cal.fit_amp(shifted) != fit
    assert not set(fit["ids"]) & {e.id for e in ENTRIES if e.split == "held-out"}


@pytest.mark.slow
def test_a_pinned_layout_entry_is_the_planned_fixture_estimate():
    entry = next(e for e in ENTRIES if e.kind == "layout" and e.pins)
    (row,) = cal.rows([entry], TARGET, jobs=1)
    assert row["model"] > 0 and math.isclose(row["ratio"], row["model"] / entry.hardware)
    assert 0.5 < row["ratio"] < 2.0          # same grids as the measured program: the same order of cycles
