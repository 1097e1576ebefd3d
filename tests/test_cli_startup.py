"""``tileplan --version`` and ``--help`` answer at once: the command line's module imports typer and the
standard library only; numpy, ml_dtypes, rich's tables, networkx, onnx and ortools wait for a command, and
help (plain text) needs neither rich nor the pydantic converters typer builds for option values."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("numpy", "ml_dtypes", "networkx", "onnx", "ortools", "torch")


def modules_after(code: str) -> set[str]:
    probe = (f"import sys\n{code}\n"
             "print('MODULES', ' '.join(sorted(m for m in sys.modules if not m.startswith('_'))), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return set(done.stderr.split("MODULES", 1)[1].split())


def heavy(mods: set[str]) -> list[str]:
    return sorted(m for m in mods if m.split(".")[0] in HEAVY)


def test_importing_the_command_line_imports_nothing_heavy():
    mods = modules_after("import tileplan.cli")
    assert heavy(mods) == [] and "rich" not in mods      # (--help's panels import rich: typer's, on demand)
    assert sorted(m for m in mods if m.startswith("tileplan.")) == ["tileplan._version", "tileplan.cli",
                                                                    "tileplan.errors", "tileplan.progress"]


def test_version_and_help_import_nothing_heavy():
    for argv in (["--version"], ["--help"], ["compile", "--help"], ["validate", "-h"], ["cache", "info", "--help"]):
        mods = modules_after("from tileplan.cli import main\n"
                             f"try:\n    main({argv!r})\nexcept SystemExit as e:\n    assert not e.code, e.code")
        assert heavy(mods) == [], (argv, heavy(mods))
        assert not {"rich", "pydantic"} & mods, argv


def test_planning_and_show_import_neither_ml_dtypes_nor_networkx():
    """Planning an FP8 model makes no FP8 array (ml_dtypes' import registers its casts with numpy, seconds of
    CPU), and the graph's dependency order is tileplan's own (no networkx)."""
    from pathlib import Path
    smoke = str(Path(__file__).resolve().parents[1] / "fixtures" / "mlp_smoke_fp8.toml")
    for argv in (["plan", smoke, "-t", "ipu21-64", "--no-cache", "-q"], ["show", smoke], ["machines"]):
        mods = modules_after("from tileplan.cli import main\n"
                             f"try:\n    main({argv!r})\nexcept SystemExit as e:\n    assert not e.code, e.code")
        assert not [m for m in mods if m.split(".")[0] in ("ml_dtypes", "networkx")], argv


def test_python_dash_m_tileplan_is_the_command_line():
    done = subprocess.run([sys.executable, "-m", "tileplan", "compile", "--help"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.startswith("Usage: tileplan compile [OPTIONS]") and "--output" in done.stdout
    assert max(map(len, done.stdout.splitlines())) <= 100      # plain text, at most 100 columns


def test_version_alone_builds_no_command_tree_and_no_process_pool_module():
    """``--version`` is answered before typer builds the commands, and ``main`` names ``BrokenProcessPool``
    only once a pool's module is loaded: neither concurrent.futures' process module nor multiprocessing."""
    for flag in ("--version", "-V"):
        mods = modules_after("from tileplan.cli import main\n"
                             f"try:\n    main([{flag!r}])\nexcept SystemExit as e:\n    assert not e.code, e.code")
        assert not {"concurrent.futures.process", "multiprocessing"} & mods, flag


def test_a_broken_process_pool_is_still_one_error_line(cli, monkeypatch):
    """The lazy ``except`` clause still turns a killed worker into the one-line error (exit 2)."""
    from concurrent.futures.process import BrokenProcessPool
    from pathlib import Path

    import tileplan.planner.plan as planner

    def broken(*args, **kwargs):
        raise BrokenProcessPool("a child process terminated abruptly")
    monkeypatch.setattr(planner, "plan", broken)
    smoke = Path(__file__).resolve().parents[1] / "fixtures" / "mlp_smoke_fp8.toml"
    code, _, err = cli("plan", smoke, "-t", "ipu21-64", "--no-cache", "-q")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: a worker process ended abruptly")


def test_the_plain_value_conversions_give_what_typers_give():
    """Every option and argument of every command: each value the command line converts itself
    (``cli._PlainValue``) converts to what typer's pydantic converter gives, type and value; the
    others (None returned) are left to typer."""
    import typer
    from typer._coercion import build_runtime_param

    from tileplan import cli
    group = typer.main.get_command(cli.app)
    samples = ["x", "fixtures/a.toml", "1", "8", "0", "-1", "1.5", " 2", "", "١", "-", "a\nb", "x\udcffy",
               ["a", "b"], ["1"], []]
    converted = left = 0
    for name, command in group.commands.items():
        commands = getattr(command, "commands", None) or {name: command}
        for sub in commands.values():
            ctx = sub.make_context(sub.name, ["--help"], resilient_parsing=True)
            for p in sub.get_params(ctx):
                desc = getattr(p, "type_descriptor", None)
                if desc is None or getattr(p, "is_flag", False):
                    continue
                for value in samples + ["a\x00b"]:       # (a NUL: typer refuses it in a path)
                    got = cli._PlainValue.plain(value, desc)
                    if got is None:
                        left += 1
                        continue
                    converted += 1
                    want = build_runtime_param(desc).coerce(value, param=p, ctx=ctx)
                    assert type(got) is type(want) and got == want, (name, p.name, value, got, want)
                    if isinstance(got, list):
                        assert [type(g) for g in got] == [type(w) for w in want], (name, p.name, value)
    assert converted > 50 and left > 50


def test_planning_from_the_command_line_imports_no_pydantic():
    """``tileplan plan`` with a target, jobs and a pin converts its values itself (no pydantic)."""
    from pathlib import Path
    smoke = str(Path(__file__).resolve().parents[1] / "fixtures" / "mlp_smoke_fp8.toml")
    mods = modules_after("from tileplan.cli import main\n"
                         f"try:\n    main(['plan', {smoke!r}, '-t', 'ipu21-64', '-j', '1', '--no-cache', '-q'])\n"
                         "except SystemExit as e:\n    assert not e.code, e.code")
    assert "pydantic" not in mods
