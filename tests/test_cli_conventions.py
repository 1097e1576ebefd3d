"""The command-line conventions: --version/-V, -h, --json (one document on stdout), --quiet,
--verbose, tables that fit 100 columns, the legend, errors in scientific notation with their
tolerances, and the catalogue progress counting chunks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tileplan

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "fixtures" / "mlp_smoke_fp8.toml"


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    pkg = tmp_path_factory.mktemp("conventions") / "smoke"
    tileplan.compile(SMOKE, pkg)
    return pkg


def test_version_and_its_short_form_print_the_package_version(cli):
    for flag in ("--version", "-V"):
        code, out, _ = cli(flag)
        assert code == 0 and out.strip() == f"tileplan {tileplan.__version__}"


def test_dash_h_prints_the_same_help_as_dash_dash_help(cli):
    code_h, out_h, _ = cli("plan", "-h")
    code_help, out_help, _ = cli("plan", "--help")
    assert code_h == code_help == 0 and out_h == out_help
    assert "--json" in out_h and "--quiet" in out_h and "--verbose" in out_h


def test_help_names_the_model_file_tables_it_refers_to(cli, monkeypatch):
    """Square brackets in help text are rich markup unless escaped: the [pin] and [plan] tables the
    options refer to must be printed, not swallowed (a wide terminal: each help line whole)."""
    monkeypatch.setenv("COLUMNS", "300")
    code, out, _ = cli("compile", "--help")
    flat = " ".join(out.replace("│", " ").split())
    assert code == 0
    assert "over the model file's [pin] table" in flat and "A TOML file with a [pin] table" in flat
    assert "the model file's [plan] weights" in flat


def test_plan_json_is_one_document_on_stdout_equal_to_the_plan_file(cli, tmp_path):
    code, out, err = cli("plan", SMOKE, "--json", "--jobs", "1", "-o", tmp_path / "plan.json")
    assert code == 0
    doc = json.loads(out)                                   # the whole of stdout is one document
    assert doc == json.loads((tmp_path / "plan.json").read_text())
    assert doc["model"] == "mlp_smoke_fp8" and [op["name"] for op in doc["ops"]][:2] == ["cast_x", "fc1"]
    assert "Plan: mlp_smoke_fp8" in err                     # the human report went to stderr


def test_plan_to_dash_writes_the_json_to_stdout_and_no_file_named_dash(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, _ = cli("plan", SMOKE, "-o", "-", "--jobs", "1", "--quiet")
    assert code == 0 and json.loads(out)["totals"]["cycles"] > 0
    assert not (tmp_path / "-").exists()


def test_show_json_lists_ops_tensors_and_the_roofline(cli):
    code, out, err = cli("show", SMOKE, "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["target"] == "ipu21-64" and doc["tiles"] == 64
    assert [op["name"] for op in doc["ops"]] == ["cast_x", "fc1", "bias1", "act", "cast_g", "fc2", "bias2"]
    assert doc["ops"][1]["shapes"] == [[96, 144], [144, 288], [96, 288]]
    assert round(doc["roofline_cycles"]) == 972
    code, out, _ = cli("plan", SMOKE, "--json", "--jobs", "1", "--quiet")
    planned = json.loads(out)                     # the floor show gives is the one the plan reports, under the plan
    assert doc["model_floor_cycles"] == planned["model_floor"]["cycles"] <= planned["totals"]["cycles"]
    assert "roofline bound" in err


def test_validate_json_gives_errors_tolerances_and_cycles(cli, package):
    code, out, err = cli("validate", package, "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["passed"] is True and (doc["atol"], doc["rtol"]) == (0.02, 0.125)
    planned = json.loads((package / "plan.json").read_text())
    assert doc["outputs"]["y"]["max_abs"] < 0.01 and doc["cycles"] == planned["totals"]["cycles"]
    assert "validation passed" in err


def test_validate_prints_errors_in_scientific_notation_beside_the_tolerances(cli, package):
    code, out, _ = cli("validate", package)
    assert code == 0
    row = next(line for line in out.splitlines() if line.lstrip().startswith("y "))
    assert "9.766e-04" in row and "0.02" in row and "0.125" in row


def test_quiet_prints_nothing_and_keeps_the_exit_status(cli, package):
    code, out, err = cli("validate", package, "--quiet")
    assert (code, out, err) == (0, "", "")
    code, out, err = cli("validate", package, "--quiet", "--atol", "0", "--rtol", "0")
    assert code == 1 and out == ""


def test_quiet_and_verbose_together_are_a_usage_error(cli, package):
    code, _, err = cli("validate", package, "--quiet", "--verbose")
    assert code == 2 and "exclude each other" in err


def test_the_report_tables_fit_100_columns_and_no_cell_wraps(cli, package, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    code, out, _ = cli("report", package)
    assert code == 0
    lines = out.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 100
    fc2 = next(op for op in json.loads((package / "plan.json").read_text())["ops"] if op["name"] == "fc2")
    g = fc2["grid"]
    plan_rows = [line for line in lines if line.split()[:2] == ["fc2", "matmul"]]
    assert len(plan_rows) == 1 and f"grid {g['gm']}x{g['gn']}x{g['gk']} {g['order']}" in plan_rows[0]
    # cycles and memory on the same line
    assert f"{fc2['estimate']['cycles']:,}" in plan_rows[0] and f"{fc2['memory']['total']:,}" in plan_rows[0]
    # no row continues on the next line: every row of the plan table starts with an op or "convert"
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == ["op"])
    body = lines[start + 2:start + 10]
    assert all(line.split()[0] in {"cast_x", "fc1", "bias1", "act", "cast_g", "fc2", "bias2", "convert"}
               for line in body)


def test_verbose_prints_the_full_candidates_and_reasons(cli, package, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = cli("report", package, "--verbose")
    assert code == 0
    fc2 = next(op for op in json.loads((package / "plan.json").read_text())["ops"] if op["name"] == "fc2")
    assert ", bias fused into the reduction" in fc2["candidate"] and fc2["candidate"] in out
    assert "interleaved B" in out and "B moved" in out


def test_report_legend_explains_every_notation_the_report_uses(cli):
    code, out, _ = cli("report", "--legend")
    assert code == 0
    for notation in ("Iv(k,a16)", "Packed(g,k)", "Imp(L)", "Grid(RxC rN pG)", "bjli", "bijl", "bilj", "Fused(L)"):
        assert notation in out


def test_report_compare_prints_per_op_deltas(cli, package, tmp_path):
    other = tileplan.compile(REPO / "fixtures" / "mlp_fp16_small.toml", tmp_path / "small")
    code, out, _ = cli("report", package, "--compare", other)
    assert code == 0
    cycles = [json.loads((p / "plan.json").read_text())["totals"]["cycles"] for p in (package, other)]
    assert "Compare per op" in out and "fc1" in out and "total" in out
    assert all(f"{c:,}" in out for c in cycles)


def test_the_progress_counts_every_chunk_of_a_catalogue():
    calls: list[tuple[str, int, int]] = []
    tileplan.plan(SMOKE, progress=lambda op, done, total: calls.append((op, done, total)))
    fc1 = [(d, t) for op, d, t in calls if op == "fc1"]
    assert fc1[0][0] == 0 and fc1[-1][0] == fc1[-1][1] > 2        # more steps than 0/1, 1/1
    done = [d for d, _ in fc1]
    assert done == sorted(done) and len(set(done)) == fc1[-1][1] + 1


def test_a_progress_bar_only_draws_on_a_terminal(tmp_path):
    """Piped stderr: no progress lines at all (the plan report only)."""
    done = subprocess.run([sys.executable, "-m", "tileplan.cli", "plan", str(SMOKE), "--jobs", "1", "--quiet"],
                          capture_output=True, text=True, env={**os.environ, "COLUMNS": "100"})
    assert done.returncode == 0 and done.stdout == "" and done.stderr == ""


def test_pooled_catalogues_count_their_chunks_too():
    """With a pool (jobs=2, two GEMMs on 1472 tiles) the workers' chunk ticks reach the caller, and
    each catalogue ends complete; the plan is the one jobs=1 gives."""
    from tileplan.graph.core import Graph, MatMul, Role, Tensor
    from tileplan.graph.dtypes import DType
    t = [Tensor("x", (96, 256), DType.FP16, Role.INPUT), Tensor("w1", (256, 384), DType.FP16, Role.PARAMETER),
         Tensor("w2", (384, 256), DType.FP16, Role.PARAMETER)]
    graph = Graph.build("two", t, [MatMul("up", ("x", "w1"), "h"), MatMul("down", ("h", "w2"), "y")])
    calls: list[tuple[str, int, int]] = []
    pooled = tileplan.plan(graph, "ipu21", jobs=2, progress=lambda op, d, total: calls.append((op, d, total)))
    for op in ("up", "down"):
        ticks = [(d, total) for name, d, total in calls if name == op]
        assert max(total for _, total in ticks) > 2, ticks           # the chunks, not 0/1 then 1/1
        assert ticks[-1][0] == ticks[-1][1], ticks                  # ends complete
    assert pooled.picks == tileplan.plan(graph, "ipu21", jobs=1).picks


COMMANDS = (("machines",), ("show",), ("plan",), ("compile",), ("validate",), ("report",), ("bench",),
            ("calibrate",), ("cache", "info"), ("cache", "clear"))


def help_text(cli, *command) -> str:
    code, out, _ = cli(*command, "--help")
    assert code == 0, command
    return out


@pytest.mark.parametrize("option, choices", [("--solver", ("dp", "cpsat")), ("--weights", ("planner", "compact")),
                                             ("--qkv", ("auto", "fused", "separate"))])
def test_a_bad_option_value_is_one_error_line_naming_the_valid_choices(cli, tmp_path, option, choices):
    for command in (("plan", SMOKE, "-o", tmp_path / "plan.json"), ("compile", SMOKE, "-o", tmp_path / "pkg")):
        code, out, err = cli(*command, option, "foo")
        assert code == 2 and out == "" and len(err.splitlines()) == 1, err
        assert err.startswith(f"error: {option} must be ") and err.rstrip().endswith(", got 'foo'")
        assert all(f"'{c}'" in err for c in choices)
    assert not (tmp_path / "plan.json").exists() and not (tmp_path / "pkg").exists()


def test_an_unknown_benchmark_is_refused_in_the_same_style(cli):
    code, _, err = cli("bench", "--only", "nope")
    assert code == 2 and err.startswith("error: --only must be ") and "got 'nope' (an unknown benchmark)" in err


def test_no_help_labels_a_flag_bool(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    assert "<bool>" not in help_text(cli)
    for command in COMMANDS:
        text = help_text(cli, *command)
        assert "--help" in text and "<bool>" not in text, command


def test_the_model_argument_has_one_description_on_every_command_that_takes_a_model(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    rows = set()
    for command in ("show", "plan", "compile"):
        row = next(line for line in help_text(cli, command).splitlines() if "MODEL " in line and "The model" in line)
        rows.add(" ".join(row.replace("│", " ").split()))
    assert len(rows) == 1
    row = rows.pop()
    assert ".toml" in row and ".onnx" in row and "model.py:factory" in row


def test_quiet_mentions_json_only_where_the_command_has_json(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    for command in COMMANDS[1:]:
        text = help_text(cli, *command)
        quiet = next(line for line in text.splitlines() if "--quiet" in line)
        assert ("--json" in quiet) == ("--json " in text.replace("--json's", "")), (command, quiet)


def test_a_torch_factory_names_the_model_after_the_factory():
    from tileplan.graph.torch import factory_name
    assert factory_name(Path("models/model.py"), "siglip_layer") == "siglip_layer"
    assert factory_name(Path("models/tiny_mlp.py"), "factory") == "tiny_mlp"     # the generic name: the file's
