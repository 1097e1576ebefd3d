"""The ``tileplan`` command line.

One ``typer`` app, one function per command. Commands raise ``TileplanError`` for
anything the user can fix; ``main()`` is the only place that turns it into the
one-line ``error: ...`` on stderr with exit status 2 (usage errors are typer's,
also status 2). Add a command by writing one more ``@app.command()`` function.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Annotated, Optional


def _interrupted_while_starting(signum, frame):
    """SIGINT or SIGTERM before ``main()`` installs its handlers (while the command line starts and
    imports typer): nothing exists yet to clean up, so the same
    one line and exit status as an interrupted command, not a KeyboardInterrupt traceback. It ends
    the process with ``os._exit``: a ``SystemExit`` raised here can land in a finalizer or a
    weakref callback, where Python prints and ignores it and the command goes on (seen under load:
    the line printed, then exit status 0)."""
    print(f"error: interrupted by {signal.Signals(signum).name}; no partial output left", file=sys.stderr)
    sys.stderr.flush()
    os._exit(128 + signum)


if (__name__ == "__main__" or Path(sys.argv[0]).name == "tileplan") \
        and threading.current_thread() is threading.main_thread():
    for _sig in (signal.SIGINT, signal.SIGTERM):      # only as the command line, never as a library
        signal.signal(_sig, _interrupted_while_starting)

import typer  # noqa: E402

from . import progress  # noqa: E402
from .errors import TileplanError  # noqa: E402

# Design decision: importing this module imports typer and the standard library only, so
# ``tileplan --version`` and ``--help`` answer at once; numpy, ml_dtypes, rich's tables, onnx and
# ortools are imported inside the commands that use them (tests/test_cli_startup.py checks it).

DEFAULT_TARGET = "ipu21"

class _FlagValue:
    """How a boolean flag's parsed value becomes the command's argument: a bool or None passes
    through as it is. Design decision: typer builds each parameter's converter on first use from a
    pydantic TypeAdapter, and ``--help`` is an unset flag (None) on the group and a set one on the
    command, so ``tileplan compile --help`` imported pydantic (a third of its start-up) to pass a
    None through; a flag never needs a converter. Anything else (never seen) goes to typer's own."""

    def __init__(self, param):
        self.param = param

    def coerce(self, value, param, ctx):
        if value is None or isinstance(value, bool):
            return value
        from typer._coercion import build_runtime_param
        return build_runtime_param(self.param.type_descriptor).coerce(value, param=param, ctx=ctx)


_PATH_CHECKS = {"exists": False, "file_okay": True, "dir_okay": True, "writable": False, "readable": True,
                "resolve_path": False, "allow_dash": False, "path_type": None}


class _PlainValue(_FlagValue):
    """How a str, Path or int option's value becomes the command's argument, for the values whose
    conversion is plain: None (an unset option: ``()`` for a repeatable one, as typer gives), a str
    for a str, a str (or a list of them) for a Path without path checks, digits within the
    option's ``min``/``max`` for an int. Design decision: typer converts every value through a
    pydantic TypeAdapter, and importing pydantic took about 0.16 s of CPU, more than the rest of
    ``tileplan plan``'s start-up; these conversions give what typer's give
    (tests/test_cli_startup.py compares them), and anything else (a float, a value out of range,
    a path with checks) still goes to typer's own, with its error messages."""

    def coerce(self, value, param, ctx):
        if value is None:
            return () if param.multiple or param.nargs == -1 else None
        got = self.plain(value, self.param.type_descriptor)
        return got if got is not None else super().coerce(value, param, ctx)

    @staticmethod
    def plain(value, descriptor):
        import typing
        ann, info = descriptor.annotation, descriptor.parameter_info
        if typing.get_origin(ann) is list and isinstance(value, (list, tuple)):
            (item,) = typing.get_args(ann)
            got = [_PlainValue.plain(v, type(descriptor)(item, info, None)) for v in value]
            return None if any(g is None for g in got) else got
        if not isinstance(value, str) or not value:
            return None
        if ann is str:
            return value
        if ann is Path and "\x00" not in value and all(getattr(info, k, d) == d for k, d in _PATH_CHECKS.items()):
            return Path(value)
        if ann is int and value.isascii() and value.isdigit():
            n = int(value)
            lo, hi = getattr(info, "min", None), getattr(info, "max", None)
            ok = (lo is None or n >= lo) and (hi is None or n <= hi) and not getattr(info, "clamp", False)
            return n if ok else None
        return None


def _flags_untyped(params: list) -> list:
    """A flag (``--quiet``, ``--help``) takes no value: its help row shows no type (typer would print
    ``<bool>``), and its value needs no converter (``_FlagValue``); other values convert plainly
    where they can (``_PlainValue``)."""
    for p in params:
        if getattr(p, "is_flag", False):
            if p.metavar is None:
                p.metavar = ""
            if getattr(p, "_runtime_param", False) is None:
                p._runtime_param = _FlagValue(p)
        elif getattr(p, "_runtime_param", False) is None and getattr(p, "type_descriptor", None) is not None \
                and p.type_descriptor.file_annotation is None:
            p._runtime_param = _PlainValue(p)
    return params


class _Command(typer.core.TyperCommand):
    def get_params(self, ctx):
        return _flags_untyped(super().get_params(ctx))


class _Group(typer.core.TyperGroup):
    def get_params(self, ctx):
        return _flags_untyped(super().get_params(ctx))


# Design decision: help is plain text (click's layout, at most 100 columns), not typer's rich panels:
# rendering those imports rich's markdown and syntax modules, which alone took longer than the 0.3 s
# that ``tileplan --help`` may take; plain text also wraps only the description column, never a
# name or a value, and needs no markup escapes in the help strings.
_CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

app = typer.Typer(
    cls=_Group,
    name="tileplan",
    help="Plan and compile model graphs for IPU-style many-core accelerators.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings=_CONTEXT,
)

CastBf16Option = Annotated[Optional[str], typer.Option(
    "--cast-bf16", help="Convert a bf16 ONNX/torch model to this type (fp16); recorded in plan.json.",
    metavar="fp16")]
TargetOption = Annotated[Optional[str], typer.Option(
    "--target", "-t", help="Preset name (see `tileplan machines`) or a target TOML file.")]


MODEL_FORMS = ("a .toml or .onnx model file, or path/to/model.py:factory (factory() returns (torch module, "
               "example inputs); the model is named after the factory)")
ModelArgument = Annotated[Path, typer.Argument(help=f"The model: {MODEL_FORMS}.", metavar="MODEL")]


def _one_of(value, option: str, choices, what: str | None = None):
    """``value`` when it is one of ``choices``, else the one error line every option with a fixed
    set of values gives: ``--solver must be 'dp' or 'cpsat', got 'foo'``."""
    choices = tuple(choices)
    if value not in choices:
        listing = " or ".join(repr(c) for c in choices) if len(choices) <= 2 else \
            ", ".join(repr(c) for c in choices[:-1]) + f" or {choices[-1]!r}"
        raise TileplanError(f"{option} must be {listing}, got {value!r}" + (f" (an unknown {what})" if what else ""))
    return value


CacheOption = Annotated[Optional[Path], typer.Option(
    "--cache", help="Plan cache folder (default: ~/.cache/tileplan).", metavar="DIR")]
NoCacheOption = Annotated[bool, typer.Option("--no-cache", help="Plan without the plan cache.")]


def _plan_cache(cache: Optional[Path], no_cache: bool):
    """The plan cache a plan or compile uses (``planner.cache``), or None with --no-cache."""
    if no_cache:
        return None
    from .planner.cache import PlanCache
    return PlanCache(cache)


JsonOption = Annotated[bool, typer.Option(
    "--json", help="Print one JSON document on stdout; the human output goes to stderr.")]
QuietOption = Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing but errors.")]
QuietJsonOption = Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing but errors (and --json's document).")]
VerboseOption = Annotated[bool, typer.Option("--verbose", "-v", help="Print the details: full candidate names "
                                             "and reasons, memory by region, compute sets.")]


class Output:
    """Where a command's output goes. Human output: stdout, or stderr with ``--json`` (stdout then
    holds only the one JSON document), nothing with ``--quiet``; ``verbose`` asks for the details."""

    def __init__(self, json: bool = False, quiet: bool = False, verbose: bool = False):
        from rich.console import Console
        if quiet and verbose:
            raise typer.BadParameter("--quiet and --verbose exclude each other", param_hint="--quiet")
        self.json, self.quiet, self.verbose = json, quiet, verbose
        if quiet:
            self.console = Console(quiet=True)
        elif json:
            self.console = Console(stderr=True) if sys.stderr.isatty() or "COLUMNS" in os.environ \
                else Console(stderr=True, width=160)
        else:
            self.console = _console()

    def print(self, *args, **kw) -> None:
        self.console.print(*args, **kw)

    def settle(self) -> None:
        """The result is printed from here on: a live progress display ends first."""
        progress.current().settle()

    def document(self, doc) -> None:
        """With ``--json``: the command's result as one JSON document on stdout."""
        if self.json:
            from .lowering.package import dumps
            sys.stdout.write(dumps(doc))
            sys.stdout.flush()


def _version(value: bool) -> None:
    if value:
        from ._version import __version__
        typer.echo(f"tileplan {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[bool, typer.Option("--version", "-V", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """Plan and compile model graphs for IPU-style many-core accelerators."""


def _console():
    """stdout console; wide when not a terminal so piped tables are not squeezed."""
    from rich.console import Console
    if sys.stdout.isatty() or "COLUMNS" in os.environ:
        return Console()
    return Console(width=160)


def _n(x: float) -> str:
    return f"{x:,.0f}"


def _shape(shape) -> str:
    return "x".join(map(str, shape))


def resolve_target(spec: str | None, graph=None, model: Path | None = None) -> tuple:
    """The target to use and where the choice came from: --target, the model file (a relative
    path there is relative to the model file), or the default."""
    from .target import load_target
    if spec:
        return load_target(spec), "--target"
    if graph is not None and graph.target:
        try:
            return load_target(graph.target, base_dir=model.parent if model else None), "model file"
        except TileplanError as exc:
            raise exc.with_source(str(model)) if model else exc from None
    return load_target(DEFAULT_TARGET), "default"


# ---- commands ----------------------------------------------------------------

@app.command()
def machines(
    targets: Annotated[Optional[list[str]], typer.Argument(
        help="Presets or target TOML files to list (default: every preset).", metavar="[TARGET]...")] = None,
) -> None:
    """List the machine targets: tiles, memory, clock, AMP and exchange figures."""
    from .graph.dtypes import DType
    from .report.terminal import PlainTable, plain
    from .target import load_target, preset_names
    loaded = [load_target(t) for t in (targets or preset_names())]
    rows = [
        ("description", lambda t: t.description),
        ("tiles", lambda t: _n(t.tiles)),
        ("SRAM per tile (B)", lambda t: _n(t.sram_bytes)),
        ("  standard region (B)", lambda t: _n(t.standard_bytes)),
        ("  interleaved region (B)", lambda t: _n(t.interleaved_bytes)),
        ("  reserve (B)", lambda t: _n(t.reserve_bytes)),
        ("clock (GHz)", lambda t: f"{t.clock_hz / 1e9:.2f}"),
        ("AMP fp32 (FLOP/tile/cycle)", lambda t: str(t.amp_fp32)),
        ("AMP fp16", lambda t: str(t.amp_fp16)),
        ("AMP fp16, fp32 partials", lambda t: str(t.amp_fp16_fp32)),
        ("AMP fp8", lambda t: str(t.amp_fp8) if t.amp_fp8 else "-"),
        ("peak fp16 (TFLOP/s)", lambda t: f"{t.peak_tflops(DType.FP16):.1f}"),
        ("peak fp8 (TFLOP/s)", lambda t: f"{t.peak_tflops(DType.FP8):.1f}" if t.amp_fp8 else "-"),
        ("exchange (B/cycle/tile)", lambda t: str(t.exchange_bytes_per_cycle)),
        ("  paired exchange", lambda t: str(t.paired_bytes_per_cycle)),
        ("sync (cycles)", lambda t: _n(t.sync_cycles)),
        ("IPUs", lambda t: str(t.ipus)),
        ("  link (B/cycle, each way)", lambda t: str(t.link_bytes_per_cycle) if t.ipus > 1 else "-"),
        ("  link latency (cycles)", lambda t: _n(t.link_latency_cycles) if t.ipus > 1 else "-"),
        ("  topology", lambda t: t.topology if t.ipus > 1 else "-"),
        ("  sync across IPUs", lambda t: _n(t.sync_cycles_multi) if t.ipus > 1 else "-"),
    ]
    table = PlainTable(title="Targets")
    table.add_column("", style="bold")
    for t in loaded:
        table.add_column(plain(t.name), justify="right")
    for label, value in rows:
        table.add_row(label, *(value(t) for t in loaded))
    _console().print(table)


@app.command()
def show(
    model: ModelArgument,
    target: TargetOption = None,
    as_json: JsonOption = False,
    quiet: QuietJsonOption = False,
    cast_bf16: CastBf16Option = None,
) -> None:
    """Summarise a model graph: ops, tensors, FLOPs, bytes and the roofline bound."""
    from .graph.core import MatMul, Role
    from .graph.dtypes import DType
    from .report.terminal import NO_ROOFLINE, PlainTable, plain
    graph, tgt, chosen_by, _ = _load_checked(model, target, cast_bf16)
    _at("report")
    roofline = graph.roofline_cycles(tgt)

    console = Output(as_json, quiet)
    doc = {"model": graph.name, "target": tgt.name, "target_from": chosen_by, "tiles": tgt.tiles,
           "roofline_cycles": roofline,
           "ops": [{"name": op.name, "kind": op.kind, "inputs": list(op.inputs), "output": op.output,
                    "shapes": [list(graph.tensors[t].shape) for t in (*op.inputs, op.output)],
                    "dtypes": [str(graph.tensors[t].dtype) for t in (*op.inputs, op.output)],
                    "flops": graph.flops(op), "bytes": graph.op_bytes(op)} for op in graph.ops],
           "tensors": [{"name": t.name, "role": str(t.role), "shape": list(t.shape), "dtype": str(t.dtype),
                        "scale": t.scale if t.dtype is DType.FP8 else None, "bytes": t.nbytes,
                        "layout": str(t.layout) if t.layout is not None else None}
                       for t in graph.tensors.values()],
           "flops": graph.total_flops()}
    console.print(plain((graph.name, "bold"), f"  ({model})"))

    ops = PlainTable(title="Ops (in execution order)")
    for col in ("#", "op", "kind", "inputs -> output", "shapes", "dtypes", "FLOPs", "bytes"):
        ops.add_column(col, justify="right" if col in ("#", "FLOPs", "bytes") else "left")
    for i, op in enumerate(graph.ops):
        ins, out = graph.inputs_of(op), graph.output_of(op)
        kind = op.kind + (f" ({op.approximate})" if op.kind == "gelu" else "")
        if isinstance(op, MatMul) and (op.transpose_a or op.transpose_b):
            kind += " (" + ", ".join(n for n, on in (("A^T", op.transpose_a), ("B^T", op.transpose_b)) if on) + ")"
        ops.add_row(str(i), op.name, kind,
                    f"{', '.join(op.inputs)} -> {op.output}",
                    f"{', '.join(_shape(t.shape) for t in ins)} -> {_shape(out.shape)}",
                    f"{', '.join(str(t.dtype) for t in ins)} -> {out.dtype}",
                    _n(graph.flops(op)), _n(graph.op_bytes(op)))
    console.print(ops)

    tensors = PlainTable(title="Tensors")
    for col in ("tensor", "role", "shape", "dtype", "scale", "bytes", "layout"):
        tensors.add_column(col, justify="right" if col in ("scale", "bytes") else "left")
    for t in graph.tensors.values():
        scale = f"2^{t.scale}" if t.dtype is DType.FP8 else ""
        tensors.add_row(t.name, str(t.role), _shape(t.shape), str(t.dtype), scale, _n(t.nbytes),
                        str(t.layout) if t.layout is not None else "")
    console.print(tensors)

    def role_bytes(role) -> int:
        return sum(t.nbytes for t in graph.by_role(role))

    matmul_flops = sum(graph.flops(op) for op in graph.ops if isinstance(op, MatMul))
    params = role_bytes(Role.PARAMETER)
    sram = tgt.tiles * tgt.usable_bytes
    console.print(
        f"totals: {len(graph.ops)} ops, {_n(graph.total_flops())} FLOPs "
        f"({_n(matmul_flops)} in MatMuls); inputs {_n(role_bytes(Role.INPUT))} B, "
        f"parameters {_n(params)} B, outputs {_n(role_bytes(Role.OUTPUT))} B, "
        f"intermediates {_n(role_bytes(Role.INTERMEDIATE))} B")
    console.print(plain(
        f"target: {tgt.name} ({chosen_by}): {tgt.description}, {_n(tgt.tiles)} tiles, "
        f"{tgt.clock_hz / 1e9:.2f} GHz; parameters fill {100 * params / sram:.1f}% of its usable SRAM"))
    if roofline:
        console.print(
            f"roofline bound: [bold]{_n(roofline)} cycles[/bold] = {roofline / tgt.clock_hz * 1e6:,.1f} us "
            f"(MatMul FLOPs / ({_n(tgt.tiles)} tiles x AMP FLOP per tile per cycle))")
    else:
        console.print(f"roofline bound: {NO_ROOFLINE}")
    from .planner.quality import model_floor
    try:
        floor = model_floor(graph, tgt)["cycles"]
    except TileplanError as e:
        console.print(plain(f"model floor: not available ({e})"))
        doc["model_floor_cycles"] = None
    else:
        doc["model_floor_cycles"] = floor
        console.print(
            f"model floor: [bold]{_n(floor)} cycles[/bold]" + (f" = {floor / roofline:.2f}x the roofline bound"
                                                                if roofline else "")
            + " (no plan in tileplan's candidate space is faster under its cycle model)")
    console.document(doc)


JobsOption = Annotated[Optional[int], typer.Option("--jobs", "-j", min=1,
                                                  help="Worker processes costing the catalogue (default: all cores).")]
SOLVERS = ("dp", "cpsat")
SolverOption = Annotated[str, typer.Option("--solver", metavar="dp|cpsat", help="Selection solver: dp or cpsat.")]
PinOption = Annotated[Optional[list[str]], typer.Option(
    "--pin", metavar="OP=grid:GMxGNxGK[,order:..][,reduction:..][,partials:..][,serial:N][,storage:..]",
    help="Pin a GEMM's grid (repeatable; over the model file's [pin] table).")]
PinsFileOption = Annotated[Optional[Path], typer.Option("--pins", metavar="FILE",
                                                        help="A TOML file with a [pin] table (what --emit-pins writes).")]


WeightsOption = Annotated[Optional[str], typer.Option(
    "--weights", metavar="planner|compact",
    help="Parameter storage: planner (selection may store a GEMM's weights as its grid reads them) or compact "
         "(never); default: the model file's [plan] weights, else planner.")]


QkvOption = Annotated[str, typer.Option(
    "--qkv", metavar="auto|fused|separate",
    help="GEMMs reading one activation (Q, K, V): plan them separate and fused and keep the cheaper (auto), "
         "or force one form.")]


IpusOption = Annotated[str, typer.Option(
    "--ipus", metavar="auto|stages|spread",
    help="A target of several IPUs: pipeline stages (contiguous layers per IPU), one graph spread over every "
         "tile, or auto (plan both, keep the cheaper).")]


MicroBatchOption = Annotated[Optional[str], typer.Option(
    "--micro-batch", metavar="N",
    help="Cut the batch into micro-batches of N images: planned once for N, pipelined through the stages of a "
         "multi-IPU plan (fill, steady state, drain).")]


def _micro_batch(value: str | None) -> int | None:
    from .planner.pipeline import check_micro_batch
    if value is None:
        return None
    try:
        n = int(value, 10)
    except ValueError:
        raise TileplanError(f"--micro-batch must be a positive whole number of images, got {value!r}") from None
    return check_micro_batch(n)


def _ipus(mode: str) -> str:
    from .planner.stages import MODES
    return _one_of(mode, "--ipus", MODES)


def _qkv(qkv: str) -> str:
    from .planner.qkv import QKV_MODES
    return _one_of(qkv, "--qkv", QKV_MODES)


def _weights(weights: str | None) -> str | None:
    from .graph.core import WEIGHTS
    return None if weights is None else _one_of(weights, "--weights", WEIGHTS)


def _pins(pin: list[str] | None, pins_file: Path | None) -> list:
    """The command line's pins: a --pins file's, then each --pin (a later pin of an op replaces an earlier one,
    and both replace the model file's)."""
    from .graph.pins import parse_pin, read_pins_file
    found = {}
    for p in (read_pins_file(pins_file) if pins_file is not None else []):
        found[p.op] = p
    for text in pin or []:
        p = parse_pin(text)
        found[p.op] = p
    return list(found.values())


def write_text_file(path: Path, text: str) -> None:
    from .atomic import write_file
    write_file(path, text)


@app.command("plan")
def plan_command(
    model: ModelArgument,
    target: TargetOption = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write the plan as JSON here.")] = None,
    jobs: JobsOption = None,
    solver: SolverOption = "dp",
    cache: CacheOption = None,
    no_cache: NoCacheOption = False,
    as_json: JsonOption = False,
    quiet: QuietJsonOption = False,
    verbose: VerboseOption = False,
    pin: PinOption = None,
    pins_file: PinsFileOption = None,
    emit_pins: Annotated[Optional[Path], typer.Option("--emit-pins", metavar="FILE",
                                                      help="Write the pins that reproduce this plan (TOML).")] = None,
    cast_bf16: CastBf16Option = None,
    weights: WeightsOption = None,
    qkv: QkvOption = "auto",
    ipus: IpusOption = "auto",
    micro_batch: MicroBatchOption = None,
) -> None:
    """Plan a model: choose every op's implementation and print the cost report.
    With --json (or -o -) the plan, as plan.json holds it, goes to stdout."""
    from .report.terminal import plain
    from .planner.plan import plan
    from .planner.planjson import plan_to_json, write_plan_json
    from .report.terminal import print_report

    from .atomic import check_file

    if output == Path("-"):
        as_json, output = True, None
    out = Output(as_json, quiet, verbose)
    progress.show(quiet)
    weights, qkv, micro = _weights(weights), _qkv(qkv), _micro_batch(micro_batch)
    graph, tgt, _ = _model_and_target(model, target, solver, cast_bf16)
    if output is not None:
        check_file(output)                   # before planning, not after
    with _naming(model):
        result = plan(graph, tgt, jobs=jobs or os.cpu_count() or 1, solver=solver, progress=_catalogue_ticks(graph),
                      pins=_pins(pin, pins_file), cache=_plan_cache(cache, no_cache), weights=weights, qkv=qkv,
                      ipus=_ipus(ipus), micro_batch=micro)
    _at("report")
    out.settle()
    doc = plan_to_json(result)           # once: the report, plan.json and --json print the same document
    if not quiet:                        # (a quiet console would still lay the whole report out)
        print_report(doc, out.console, plan_seconds=result.plan_seconds, verbose=verbose)
    if output is not None:
        write_plan_json(doc, output)
        out.print(plain(f"wrote {output}"))
    if emit_pins is not None:
        from .planner.pins import emit_pins as pins_text
        write_text_file(emit_pins, pins_text(result))
        out.print(plain(f"wrote {emit_pins}"))
    out.document(doc)


@app.command("compile")
def compile_command(
    model: ModelArgument,
    output: Annotated[Path, typer.Option("--output", "-o", help="Package folder to write.")],
    target: TargetOption = None,
    jobs: JobsOption = None,
    solver: SolverOption = "dp",
    cache: CacheOption = None,
    no_cache: NoCacheOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = False,
    pin: PinOption = None,
    pins_file: PinsFileOption = None,
    cast_bf16: CastBf16Option = None,
    weights: WeightsOption = None,
    qkv: QkvOption = "auto",
    ipus: IpusOption = "auto",
    micro_batch: MicroBatchOption = None,
) -> None:
    """Plan and compile a model into a package: plan, tile program, codelets, host program, report data."""
    from .report.terminal import plain, roofline_ratio_text
    from .atomic import check_folder
    from .lowering.compile import compile_fitting
    from .planner.plan import plan

    progress.show(quiet)
    weights, qkv, micro = _weights(weights), _qkv(qkv), _micro_batch(micro_batch)
    graph, tgt, params = _model_and_target(model, target, solver, cast_bf16)   # one import: a factory runs once
    check_folder(output)                     # before planning, not after
    with _naming(model):                     # (compile_model's steps, each with its stage)
        def planned(budget=None):            # (again within a budget when the allocator fragments)
            return plan(graph, tgt, jobs=jobs or os.cpu_count() or 1, solver=solver, progress=_catalogue_ticks(graph),
                        pins=_pins(pin, pins_file), cache=plan_cache, weights=weights, qkv=qkv, ipus=_ipus(ipus),
                        budget=budget, micro_batch=micro)
        plan_cache = _plan_cache(cache, no_cache)
        p = planned()
        _at("lowering")
        p, state, path = compile_fitting(p, planned, tgt, output, params=params, stage=_at)
    _at("report")
    elapsed = progress.current().seconds()   # the whole command's time, from the process start
    out = Output(quiet=quiet, verbose=verbose)
    out.settle()
    est = p.estimate
    out.print(plain("compiled ", (graph.name, "bold"), f" for {tgt.name} into {path} in {elapsed:.2f} s "
                    f"(plan {p.plan_seconds:.2f} s)"))
    out.print(f"estimate: {_n(est.cycles)} cycles (compute {_n(est.compute)}, exchange {_n(est.exchange)}, "
              f"sync {_n(est.sync)}), {roofline_ratio_text(est.cycles, p.roofline)}; "
              f"memory peak (planner's estimate): {_n(est.total_memory)} B per tile")
    out.print(f"tile program: {len(state.tile_program.steps)} steps; passes: {', '.join(state.tile_program.passes)}")
    if p.stages:                             # a multi-IPU target: its pipeline stages, or spread
        from .report.terminal import stage_lines
        for line in stage_lines(p.stages):
            out.print(plain(line))
    if p.pipeline:                           # micro-batches (planner.pipeline): the compiled program's figures
        from .lowering.compile import compiled_pipeline
        from .planner.pipeline import summary
        out.print(plain(summary(compiled_pipeline(p, state.tile_program, tgt), "compiled program")))
    if p.budget is not None:                 # lowering.compile.compile_fitting re-planned it
        out.print(f"planned within {_n(p.budget)} B per tile: the allocator could not place the plan within "
                  f"{_n(tgt.usable_bytes)}")
    if p.graph.folded:                       # planner.rewrite: results known at plan time, written by the host
        out.print(plain("folded at plan time (host data, 0 cycles): " + ", ".join(
            f"{n} = {v!r}" for n, v in sorted(p.graph.folded.items()))))
    if verbose:
        from .report.terminal import render
        from .planner.planjson import plan_to_json
        out.print(render(plan_to_json(p), p.plan_seconds, verbose=True))


@app.command("validate")
def validate_command(
    package: Annotated[Path, typer.Argument(help="Package folder written by tileplan compile.", metavar="DIR")],
    inputs: Annotated[Optional[Path], typer.Option("--inputs", help="npz of input/parameter values by tensor name.")] = None,
    expected: Annotated[Optional[Path], typer.Option("--expected", help="npz of expected outputs by tensor name.")] = None,
    outputs: Annotated[Optional[Path], typer.Option("--outputs", help="Write the computed outputs to this npz.")] = None,
    atol: Annotated[Optional[float], typer.Option("--atol", help="Absolute tolerance (default by dtype).")] = None,
    rtol: Annotated[Optional[float], typer.Option("--rtol", help="Relative tolerance (default by dtype).")] = None,
    trace: Annotated[Optional[Path], typer.Option(
        "--trace", metavar="FILE", help="Write the simulated per-tile timeline here as a Chrome trace (JSON: "
        "Perfetto, chrome://tracing).")] = None,
    as_json: JsonOption = False,
    quiet: QuietJsonOption = False,
    verbose: VerboseOption = False,
) -> None:
    """Run a package on the IPU model; compare with float64 (or --expected). Exit 0 pass, 1 fail, 2 bad input."""
    from .report.terminal import plain, roofline_ratio_text
    import time

    from .atomic import check_file, write_file
    from .lowering.package import load_package, npz_bytes
    from .report.terminal import error_table
    from .sim.validate import check_validation_destination, validate_package, validation_record, write_trace, \
        write_validation

    progress.show(quiet)
    for path in (outputs, trace):
        if path is not None:
            check_file(path)                 # before the run, not after
    pkg = load_package(package)
    check_validation_destination(pkg)        # validation.json/.npz: refused before the run, not after the table
    _at("simulation")
    t0 = time.perf_counter()
    v = validate_package(pkg, inputs_path=inputs, expected_path=expected, atol=atol, rtol=rtol)
    elapsed = time.perf_counter() - t0
    _at("report")
    prof = v.profile
    report = pkg.report
    out = Output(as_json, quiet, verbose)
    out.settle()
    out.print(error_table(f"validate {pkg.graph.name} on the IPU model ({pkg.target.name}, {pkg.target.tiles} tiles)",
                          v.outputs, v.atol, v.rtol))
    roof = report.get("roofline_cycles") or 0
    est = report.get("estimate", {}).get("cycles")
    out.print(f"simulated: {_n(prof.cycles)} cycles (compute {_n(prof.compute)}, exchange {_n(prof.exchange)}, "
              f"sync {_n(prof.sync)}), {roofline_ratio_text(prof.cycles, roof)}")
    if est:
        out.print(f"planner estimate: {_n(est)} cycles; estimate / simulated = {est / max(prof.cycles, 1):.3f}")
    if v.pipeline:                           # micro-batches: every one run through the pipelined schedule
        from .planner.pipeline import summary
        planned = (pkg.plan.get("pipeline") or {}).get("cycles")
        out.print(plain(summary(v.pipeline, "simulated") + (f"; planner estimate {_n(planned)} cycles"
                                                             if planned is not None else "")))
    out.print(f"memory peak (IPU model's simulated peak): {_n(int(prof.memory_peak.max()))} B on tile {int(prof.memory_peak.argmax())} "
              f"(of {_n(pkg.target.sram_bytes)}); tolerance atol {v.atol:g}"
              f"{' x max(1, max |want|)' if atol is None else ''}"
              f"{' x sqrt(FP8 GEMM depth / 2)' if any('fp8_depth' in o for o in v.outputs.values()) else ''}"
              f" rtol {v.rtol:g}; run {elapsed:.2f} s")
    weights = pkg.plan.get("weights")        # the parameter storage it was planned with (--weights)
    if weights is not None:
        pre = [e["tensor"] for e in pkg.plan.get("prearranged", [])]
        out.print(plain(f"weights: {weights}" + (f"; pre-arranged: {', '.join(pre)}" if pre else "; none pre-arranged")))
    write_validation(pkg, v)
    if outputs is not None:                  # exactly the path given (np.savez would add .npz)
        write_file(outputs, npz_bytes({k: val for k, val in sorted(v.values.items())}))
        out.print(plain(f"wrote {outputs}"))
    if trace is not None:
        write_trace(trace, pkg, v)
        out.print(plain(f"wrote {trace}"))
    if verbose:
        for st in prof.steps:
            out.print(plain(f"  {st.name}: {st.kind} {_n(st.cycles + st.sync)} cycles"
                            + (f", {_n(st.bytes)} B" if st.bytes else "")))
    out.document({**validation_record(v), "passed": v.passed, "model": pkg.graph.name,
                  "target": pkg.target.name, "weights": weights, "run_seconds": round(elapsed, 3)})
    if not v.passed:
        for name, fig in sorted(v.outputs.items()):
            if fig.get("why"):               # non-finite values: what they are and why they fail
                out.print(f"{name}: {fig['why']}", markup=False, highlight=False)
        out.print("[red]validation FAILED[/red]: outputs outside tolerance")
        raise typer.Exit(1)
    out.print("[green]validation passed[/green]")


@app.command("report")
def report_command(
    package: Annotated[Optional[Path], typer.Argument(help="Package folder written by tileplan compile.",
                                                      metavar="DIR")] = None,
    html: Annotated[Optional[Path], typer.Option("--html", help="Where to write the HTML report "
                                                 "(default: DIR/report.html).")] = None,
    compare: Annotated[Optional[list[Path]], typer.Option(
        "--compare", help="Another package to show side by side (repeatable: the page switches between them).",
        metavar="DIR")] = None,
    legend: Annotated[bool, typer.Option("--legend", help="Print the key to the notation and exit.")] = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = False,
) -> None:
    """Print a package's cost report and write it as one self-contained HTML file with plots."""
    from .report.terminal import plain
    from .report.html import allocation_peaks, load_report_data, write_html
    from .report.terminal import compare_table, legend_table, render_package

    from .atomic import check_file

    out = Output(quiet=quiet, verbose=verbose)
    if legend:
        out.print(legend_table())
        return
    if package is None:
        raise typer.BadParameter("missing the package folder DIR", param_hint="DIR")
    progress.show(quiet)
    if html is not None:
        check_file(html)
    data = load_report_data(package)
    others = [load_report_data(c) for c in compare or ()]
    _at("report")
    out.settle()
    out.print(render_package(data.plan, data.report, data.validation, verbose=verbose,
                             allocation=allocation_peaks(data)))
    for other in others:
        out.print(compare_table(data, other, verbose=verbose))
    path = write_html(data, html if html is not None else package / "report.html", compare=others)
    out.print(plain(f"wrote {path}"))


@app.command("bench")
def bench_command(
    quick: Annotated[bool, typer.Option("--quick", help="Fewer repeats and a 5-minute budget (see BENCH.md).")] = False,
    out: Annotated[Path, typer.Option("--out", help="Folder for bench.json, BENCH.md and the SigLIP b4 MLP's "
                                                     "trace.")] = Path("artifacts"),
    jobs: JobsOption = None,
    only: Annotated[Optional[list[str]], typer.Option("--only", help="Run only this benchmark (repeatable).")] = None,
    as_json: JsonOption = False,
    quiet: QuietJsonOption = False,
) -> None:
    """Benchmark plan and compile time, planner memory, modelled cycles and plan quality on the fixtures."""
    from rich.console import Console

    from .report.terminal import plain
    from .bench import BY_NAME, rich_tables, run_bench, write_artifacts

    for name in only or ():
        _one_of(name, "--only", BY_NAME, "benchmark")
    progress.show(quiet)
    err = Console(stderr=True, quiet=quiet)

    def on_result(rec: dict) -> None:
        where = f" in {rec['stage_at_stop']}" if rec["status"] != "ok" and rec["stage_at_stop"] else ""
        err.print(plain(f"{rec['fixture']}: {rec['status']}{where} ({rec['elapsed_seconds']:.1f} s)"))

    _at("bench")
    doc = run_bench(quick=quick, jobs=jobs or os.cpu_count() or 1, only=only, on_result=on_result, trace_dir=out)
    _at("report")
    console = Output(as_json, quiet)
    console.settle()
    for table in rich_tables(doc):
        console.print(table)
    paths = write_artifacts(doc, out)
    console.print(plain(f"bench took {doc['total_seconds']:.0f} s; wrote {paths[0]} and {paths[1]}"))
    console.document(doc)


@app.command("calibrate")
def calibrate_command(
    kernels_only: Annotated[bool, typer.Option("--kernels-only", help="Skip the layout entries (each plans a "
                                               "1472-tile fixture).")] = False,
    jobs: JobsOption = None,
    as_json: JsonOption = False,
    quiet: QuietJsonOption = False,
) -> None:
    """Compare tileplan's cost model with public IPU21 hardware measurements (model / hardware per entry)."""
    from .report.terminal import plain
    from . import calibrate as cal
    from .report.terminal import PlainTable

    out = Output(as_json, quiet)
    _at("calibration")
    doc = cal.report(kernels_only=kernels_only, jobs=jobs or os.cpu_count() or 1,
                     progress=lambda e: out.print(plain(f"planning {e.id}")) if e.kind == "layout" else None)
    table = PlainTable(*cal.ENTRY_COLUMNS, title=f"tileplan calibrate: model vs hardware on {doc['target']}")
    for r in doc["entries"]:
        table.add_row(*cal.entry_cells(r))
    out.print(table)
    sums = PlainTable(*cal.SUMMARY_COLUMNS, title="model / hardware per group and split")
    for s in doc["summary"]:
        sums.add_row(*cal.summary_cells(s))
    out.print(sums)
    out.print(plain(cal.fit_line(doc)))
    out.document(doc)


cache_app = typer.Typer(cls=_Group, help="Inspect or empty the plan cache (GEMM catalogues already costed).",
                        no_args_is_help=True, rich_markup_mode=None, context_settings=_CONTEXT)
app.add_typer(cache_app, name="cache")


@cache_app.command("info")
def cache_info_command(cache: CacheOption = None, as_json: JsonOption = False, quiet: QuietJsonOption = False) -> None:
    """Where the plan cache is, how many entries it holds and their size."""
    from .report.terminal import plain
    from .planner.cache import PlanCache
    info = PlanCache(cache).info()
    out = Output(as_json, quiet)
    out.print(plain(f"plan cache {info['path']}: {info['entries']} entries, {_n(info['bytes'])} bytes"))
    out.document(info)


@cache_app.command("clear")
def cache_clear_command(cache: CacheOption = None, quiet: QuietOption = False) -> None:
    """Remove every entry of the plan cache."""
    from .report.terminal import plain
    from .planner.cache import PlanCache
    pc = PlanCache(cache)
    removed = pc.clear()
    Output(quiet=quiet).print(plain(f"plan cache {pc.path}: removed {removed} entries"))


def _load_checked(model: Path, target: str | None, cast_bf16: str | None = None):
    """A model, its target, where the target came from, and its parameter values (one import)."""
    from .graph.loaders import check_against_target, load_model_and_params
    _at("import")
    graph, params = load_model_and_params(model, cast_bf16=cast_bf16)
    tgt, chosen_by = resolve_target(target, graph, model)
    try:
        check_against_target(graph, tgt)
    except TileplanError as exc:
        raise exc.with_source(str(model)) from None
    return graph, tgt, chosen_by, params


def _model_and_target(model: Path, target: str | None, solver: str, cast_bf16: str | None = None):
    """Load a model, its target and its parameter values for plan/compile, with the solver name checked."""
    _one_of(solver, "--solver", SOLVERS)
    graph, tgt, _, params = _load_checked(model, target, cast_bf16)
    return graph, tgt, params


class _naming:
    """Errors inside the block that name no file get ``source`` (the model being planned)."""

    def __init__(self, source: Path):
        self.source = str(source)

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if isinstance(exc, TileplanError) and exc.source is None and not str(exc).startswith(self.source):
            raise exc.with_source(self.source) from None
        return False


def _catalogue_ticks(graph):
    """The planner's progress callback for ``graph``: the catalogues stage, one unit per GEMM
    catalogue (counted before planning starts), then the selection stage (``tileplan.progress``)."""
    from .planner.families import family_of
    return progress.catalogue_ticks(sum(1 for op in graph.ops if family_of(op).catalogued))


for _app in (app, cache_app):               # every command's help: flags without a <bool> type
    for _info in _app.registered_commands:
        _info.cls = _Command if _info.cls is typer.core.TyperCommand else _info.cls

# ---- entry point -------------------------------------------------------------

class Interrupted(BaseException):
    """SIGINT or SIGTERM during a command: raised in the main thread so every ``finally`` and
    ``except BaseException`` runs (temporary folders removed, pool workers stopped)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class _signals_raise:
    """SIGINT and SIGTERM raise ``Interrupted`` once; a second signal during the clean-up is
    ignored so the clean-up finishes. Handlers are restored after (the CLI may run in-process)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __enter__(self):
        self.saved = {}
        if threading.current_thread() is not threading.main_thread():
            return self
        self.raised = False

        def handler(signum, frame):
            if not self.raised:
                self.raised = True
                raise Interrupted(signum)

        for sig in self.SIGNALS:
            self.saved[sig] = signal.signal(sig, handler)
        return self

    def __exit__(self, *exc):
        for sig, old in self.saved.items():
            signal.signal(sig, old)
        return False


def _at(stage: str) -> None:
    """The command moves on to ``stage`` (``tileplan.progress.STAGES``): the progress display shows
    it, and the one line of an error that is about the machine, not the input (out of memory, a
    worker process killed), names what the command was doing in it. One mechanism for both."""
    progress.stage(stage)


def _out_of_memory(exc: BaseException) -> str:
    """The one line for a ``MemoryError``: the stage and, when the exception says it (numpy's
    ``Unable to allocate 2.00 GiB for an array with shape (...)``), what was asked for."""
    asked = " ".join(str(exc).split())[:200]
    return (f"out of memory while {progress.activity()}" + (f" ({asked})" if asked else "")
            + "; give the process more memory (a higher ulimit -v) or plan with fewer --jobs")


def _fail(message: str, status: int = 2) -> None:
    """The one error line. Escaped whole (``checked.printable``): it may quote a path, a file name or
    text from a file the user gave, and must neither act on the terminal nor span lines."""
    from .checked import printable
    progress.current().finish(ok=False)      # (a live display stopped first: the error is its own line)
    print(printable(f"error: {' '.join(message.split())}"), file=sys.stderr)
    sys.exit(status)


class _finishing:
    """The progress display's end: its last stage's line when the command succeeded (or ran and
    reported a failed validation, status 1); on an error only the display stopped, so the error
    stays the one line after the stages that did finish."""

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        ok = kind is None or (kind is SystemExit and exc.code in (None, 0, 1)) \
            or (kind is typer.Exit and exc.exit_code in (0, 1))
        progress.current().finish(ok=ok)
        return False


def _broken_pool():
    """``BrokenProcessPool`` when a process pool can have run (its module imported), else an empty
    tuple (an ``except`` clause that matches nothing): importing ``concurrent.futures.process`` only
    to name the class took a quarter of ``tileplan --version``'s CPU."""
    mod = sys.modules.get("concurrent.futures.process")
    return mod.BrokenProcessPool if mod is not None else ()


def main(argv: list[str] | None = None) -> None:
    """Run the CLI: the one error path. Anything the user caused (a ``TileplanError``; an OS error on
    a path they gave; input nested too deeply) becomes one ``error:`` line on stderr and exit 2;
    SIGINT and SIGTERM exit 130 and 143 after the clean-up. Running out of memory (here or in a
    worker process: the pool re-raises a worker's ``MemoryError``), or a worker process killed
    outright, is one line naming the stage (``_at``), exit 2. Other exceptions are bugs in tileplan
    and keep their traceback."""
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) == 1 and args[0] in ("--version", "-V"):
        # Design decision: the version alone is answered before typer builds the command tree (every
        # command's signature and type hints: most of ``tileplan --version``'s CPU); the output and
        # exit status are the option's own (``_version``), ending in SystemExit(0) as typer's does.
        from ._version import __version__
        print(f"tileplan {__version__}")
        raise SystemExit(0)
    progress.begin(in_process=argv is not None)
    with _signals_raise(), _finishing():
        try:
            app(args=argv, prog_name="tileplan")
        except TileplanError as exc:
            _fail(str(exc))
        except OSError as exc:
            where = exc.filename if exc.filename is not None else "tileplan"
            reason = "the disk is full" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
            _fail(f"{where}: {reason}")
        except RecursionError:
            _fail("the input is nested too deeply to read")
        except MemoryError as exc:
            message = _out_of_memory(exc)
            del exc                          # (its traceback holds the frames, and their arrays)
            _fail(message)
        except _broken_pool():
            _fail(f"a worker process ended abruptly while {progress.activity()} (killed, perhaps by the system for lack "
                  "of memory); try fewer --jobs")
        except Interrupted as exc:
            name = signal.Signals(exc.signum).name
            _fail(f"interrupted by {name}; no partial output left", 128 + exc.signum)


if __name__ == "__main__":
    main()
