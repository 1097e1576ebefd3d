"""``validate_package``: run a package on the IPU model and compare with float64.

Inputs: seeded validation data (``sim.reference.seeded_values``), replaced by
the package's own parameter values (``params.npz``) and by the user's arrays
(``--inputs``, keys are tensor names, float values quantised to the tensor's
type). The outputs are read back through their layouts and compared with the
float64 reference, or with the user's ``--expected`` arrays.

Tolerance: an output passes when ``|got - want| <= atol + rtol * |want|``
everywhere. Defaults follow the lowest-precision type the graph computes in:
FP8 atol 0.02, rtol 0.125 (one F143 step: 3 mantissa bits, so neighbouring
values are 2**-3 apart at the bottom of a binade; a value the device computes
a few FP16 ulps away from the reference may round to the neighbouring FP8
value); FP16 atol 2e-3, rtol 1e-2; FP32 atol 1e-4, rtol 1e-4. The default atol is
scaled by the output's magnitude, ``max(1, max |want|)``: an output that is a sum of
large terms (a residual stream) carries their rounding at their scale, so a small
element of it can differ by a few ulps of the terms (an encoder layer's FP16 output
of magnitude 4 gets atol 8e-3). A user's ``--atol`` is taken as given.

FP8 depth: the FP8 atol above was set on MLPs, whose outputs lie two FP8 GEMMs deep
(``FP8_FITTED_DEPTH``). A deeper output gets that atol times ``sqrt(depth / 2)``, ``depth`` the most
FP8 GEMMs (a MatMul with an FP8 operand) on any path from the graph's inputs to it
(``fp8_gemm_depth``): 4 per encoder layer, 108 for the 27-layer SigLIP tower. Why: the device and the
float64 reference compute the same quantised graph with different inner arithmetic (FP32 sums in
another order, FP16 partials of a split K, the bias added in the reduction), so a value a hair
from an FP8 rounding boundary rounds to the other neighbour in one of them; that changes the GEMM's
outputs by a step times a weight, the next casts flip more, and the disagreement random-walks: its
variance adds per FP8 GEMM on the path. Measured on ``siglip_tower_fp8_b1``'s layers (seeded data):
the float64 reference against itself with FP32 GEMM sums only, max abs 0.045, 0.106, 0.127, 0.153,
0.257, 0.44 after 1, 2, 3, 4, 8, 17 layers (about 0.1 sqrt(layers)); the IPU model 0.076, 0.158,
0.191 after 1, 2, 3 layers, each layer recomputed from the IPU model's own input adding the same
(0.068, 0.058), and every layer at about ``0.01 max|want| sqrt(depth)``: the rule's
``0.02 / sqrt(2) max|want| sqrt(depth)`` keeps a margin of about 1.4. The FP8 rounding itself (the
reference against float64 without any rounding) is larger: 0.156, 0.214, 0.258 after 1, 2, 3 layers,
0.66 after 21 (README, "Validation of FP8 towers").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import TileplanError
from ..gcpause import pausing
from ..graph.core import Role
from ..graph.dtypes import DType, dequantise, quantise
from .model import IPUModel, Profile
from .reference import compare, reference, seeded_values

TOLERANCES = {DType.FP8: (0.02, 0.125), DType.FP16: (2e-3, 1e-2), DType.FP32: (1e-4, 1e-4)}
FP8_FITTED_DEPTH = 2        # FP8 GEMMs on the path of the outputs the FP8 atol was set on (the MLPs)


@dataclass
class Validation:
    outputs: dict[str, dict]                 # tensor -> compare() figures + "passed"
    profile: Profile
    atol: float
    rtol: float
    values: dict[str, np.ndarray] = field(default_factory=dict)   # what the package computed (float64)
    pipeline: dict | None = None             # micro-batches: the run's schedule figures (planner.pipeline)

    @property
    def passed(self) -> bool:
        return all(o["passed"] for o in self.outputs.values())


def default_tolerance(graph) -> tuple[float, float]:
    types = {t.dtype for t in graph.tensors.values()}
    for dt in (DType.FP8, DType.FP16, DType.FP32):
        if dt in types:
            return TOLERANCES[dt]
    return TOLERANCES[DType.FP32]


def fp8_gemm_depth(graph) -> dict[str, int]:
    """Per tensor, the most FP8 GEMMs (MatMul ops with an FP8 operand) on any path from the graph's
    inputs and parameters to it (graph ops are in execution order)."""
    from ..graph.core import MatMul
    depth = {n: 0 for n in graph.tensors}
    for op in graph.ops:
        d = max((depth[i] for i in op.inputs), default=0)
        fp8 = isinstance(op, MatMul) and any(graph.tensors[i].dtype is DType.FP8 for i in op.inputs)
        depth[op.output] = d + int(fp8)
    return depth


def depth_factor(depth: int) -> float:
    """What the FP8 default atol is multiplied by for an output ``depth`` FP8 GEMMs deep."""
    return math.sqrt(max(1.0, depth / FP8_FITTED_DEPTH))


def _load_npz(path, what: str, tensors) -> dict[str, np.ndarray]:
    """An npz of real numbers by tensor name, read through ``safeio.load_npz``; anything else
    (strings, complex, objects, booleans but for an INT32 input such as a mask, an ``.npy`` rather
    than an ``.npz``) is an error naming the file and the array.

    Design decision: the arrays it may declare are bounded by the tensors it may hold (``tensors``:
    the model's inputs and parameters, or its outputs), at 8 bytes a value (float64, the widest a
    user is likely to give), plus 1 MiB so that a stray member is named by the per-array checks
    rather than by the total: a zip bomb or an ``.npy`` header claiming terabytes is refused before
    anything is decompressed."""
    from ..safeio import MiB, load_npz
    limit = 8 * sum(t.size for t in tensors) + MiB
    arrays = load_npz(path, limit, f"{what} file")
    integer = {t.name for t in tensors if t.dtype is DType.INT32}
    for k, a in arrays.items():
        if a.dtype.kind == "b" and k in integer:      # a bool attention mask for an INT32 input: 0/1
            arrays[k] = a.astype(np.int32)
        elif a.dtype.kind not in "iuf":
            raise TileplanError(f"{path}: array {k!r} holds {a.dtype} values; {what} must be real numbers")
    return arrays


def check_tolerance(value, option: str) -> float | None:
    """``--atol``/``--rtol``: None (the default by dtype) or a finite non-negative number."""
    if value is None:
        return None
    if not isinstance(value, (int, float)) or not np.isfinite(value) or value < 0:
        raise TileplanError(f"{option} must be a finite non-negative number, got {value!r}")
    return float(value)


@pausing
def validate_package(pkg, *, inputs_path=None, expected_path=None, atol=None, rtol=None, seed: int = 0,
                     registry=None) -> Validation:
    """Run ``pkg`` on the IPU model and compare. With ``--inputs`` every graph input must be given
    (nothing is filled in with seeded data; parameters the package and ``--inputs`` leave out take
    the seeded values, the same on every run); with ``--expected`` every output must be given.
    Errors name the file and the array."""
    atol, rtol = check_tolerance(atol, "--atol"), check_tolerance(rtol, "--rtol")
    graph = pkg.graph
    pipe = package_pipeline(pkg)
    full = (lambda name: (pipe["batch"], *graph.boundary_shape(name)[1:])) if pipe else graph.boundary_shape
    stored = seeded_values(graph, seed, batch=pipe["batch"] if pipe else None)
    stored.update(pkg.params)
    given: set[str] = set(pkg.params)
    if inputs_path is not None:
        for name, arr in _load_npz(inputs_path, "inputs", [t for t in graph.tensors.values()
                                                            if t.role in (Role.INPUT, Role.PARAMETER)]).items():
            t = graph.tensors.get(name)
            if t is None or t.role not in (Role.INPUT, Role.PARAMETER):
                raise TileplanError(f"{inputs_path}: {name!r} is not an input or parameter of model {graph.name!r}")
            if tuple(arr.shape) != full(name):
                raise TileplanError(f"{inputs_path}: {name!r} has shape {list(arr.shape)}, the model's is "
                                    f"{list(full(name))}")
            shape = (pipe["batch"], *t.shape[1:]) if pipe and t.role is Role.INPUT else t.shape
            try:
                stored[name] = quantise(np.asarray(arr, dtype=np.float64).reshape(shape), t.dtype, t.scale)
            except ValueError as e:             # an integer input given a fraction or out of range
                raise TileplanError(f"{inputs_path}: {name!r}: {e}") from None
            given.add(name)
        missing = [t.name for t in graph.tensors.values() if t.role is Role.INPUT and t.name not in given]
        if missing:
            raise TileplanError(f"{inputs_path}: holds no values for the input{'s' if len(missing) > 1 else ''} "
                                f"{', '.join(repr(m) for m in missing)} of model {graph.name!r}")
        for op in graph.ops:     # values the model must not be given (a token id past its table), named
            if all(i in stored for i in op.inputs):
                try:
                    op.check_values(*(stored[i] for i in op.inputs))
                except TileplanError as e:
                    raise TileplanError(f"{inputs_path}: {e}") from None
    outs = [t for t in graph.tensors.values() if t.role is Role.OUTPUT]
    expected = _load_npz(expected_path, "expected outputs", outs) if expected_path is not None else None
    if expected is not None:
        for name, arr in expected.items():
            t = graph.tensors.get(name)
            if t is None or t.role is not Role.OUTPUT:
                raise TileplanError(f"{expected_path}: {name!r} is not an output of model {graph.name!r}")
            if tuple(arr.shape) != full(name):
                raise TileplanError(f"{expected_path}: {name!r} has shape {list(arr.shape)}, the model's is "
                                    f"{list(full(name))}")
            expected[name] = arr.reshape((pipe["batch"], *t.shape[1:]) if pipe else t.shape)   # (0-d: [1] inside)
        missing = [t.name for t in outs if t.name not in expected]
        if missing:       # an output left out would pass without a comparison
            what = "holds no arrays; expected values of the outputs" if not expected else \
                f"holds no expected values of the output{'s' if len(missing) > 1 else ''}"
            raise TileplanError(f"{expected_path}: {what} {', '.join(repr(m) for m in missing)}")
    read: dict[str, np.ndarray] = {}
    pipeline = None
    try:                                     # the IPU model's errors name the package
        model = IPUModel(pkg.program, pkg.target, registry=registry)
        for b in pkg.program.buffers:
            if b.kind == "parameter" or (b.kind == "input" and not pipe):
                v = stored[b.tensor]
                model.write(b.name, np.swapaxes(v, -1, -2) if b.transpose else v)
        if pipe:
            profile, read, pipeline = _run_pipelined(pkg, model, stored, pipe)
        else:
            profile = model.run()
    except TileplanError as exc:
        raise TileplanError(f"{pkg.path}: {exc}") from None
    if expected is not None:
        ref = None
    elif pipe:                               # float64, one micro-batch at a time, joined
        m = pipe["micro_batch"]
        parts = [reference(graph, {k: (v[j * m:(j + 1) * m] if graph.tensors[k].role is Role.INPUT else v)
                                   for k, v in stored.items()}, keep=[t.name for t in outs])
                 for j in range(pipe["micro_batches"])]
        ref = {t.name: np.concatenate([p[t.name] for p in parts]) for t in outs}
    else:
        ref = reference(graph, stored, keep=[t.name for t in outs])
    d_atol, d_rtol = default_tolerance(graph)
    scaled_atol = atol is None                      # the default scales with each output's magnitude
    fp8_depth = fp8_gemm_depth(graph) if scaled_atol and (d_atol, d_rtol) == TOLERANCES[DType.FP8] else None
    atol = d_atol if atol is None else atol
    rtol = d_rtol if rtol is None else rtol
    results, values = {}, {}
    poisoned = nonfinite_sources(graph, stored)
    for t in outs:
        bufs = [b for b in pkg.program.buffers if b.tensor == t.name and b.kind == "output"]
        shape = (pipe["batch"], *t.shape[1:]) if pipe else t.shape
        if t.name in graph.folded:              # folded at plan time: the host writes it, no tile holds it
            raw = graph.folded_value(t.name)
            raw = np.concatenate([raw] * pipe["micro_batches"]) if pipe else raw
        elif pipe and bufs:
            raw = read[bufs[0].name]
        elif not bufs:
            raise TileplanError(f"{pkg.path}: output {t.name!r} has no output buffer in the tile program")
        else:
            try:
                raw = model.read(bufs[0].name)
            except TileplanError as exc:
                raise TileplanError(f"{pkg.path}: {exc}") from None
        got = dequantise(raw, t.dtype, t.scale).reshape(shape)
        want = expected[t.name] if expected is not None and t.name in expected else \
            (ref[t.name] if ref is not None else None)
        values[t.name] = got.reshape(full(t.name))
        if want is None:
            continue
        fig = compare(got, want)
        want = np.asarray(want, dtype=np.float64)
        # A NaN where NaN is expected, or the expected infinity, matches; any other non-finite value fails.
        matched = (np.isnan(got) & np.isnan(want)) | (np.isinf(got) & (got == want))
        with np.errstate(invalid="ignore"):
            diff = np.where(matched, 0.0, np.abs(got - want))
        finite = np.abs(want[np.isfinite(want)])
        out_atol = atol * max(1.0, float(finite.max(initial=0.0))) if scaled_atol else atol
        if fp8_depth is not None:                 # and with the FP8 GEMMs on the output's path
            fig["fp8_depth"] = fp8_depth[t.name]
            out_atol *= depth_factor(fp8_depth[t.name])
        fig["atol"] = out_atol
        fig["nonfinite_unexpected"] = int(fig["nonfinite"] - matched.sum())
        with np.errstate(invalid="ignore"):
            within = matched | (diff <= out_atol + rtol * np.abs(np.where(matched, 0.0, want)))
        fig["passed"] = bool(np.all(within) and fig["nonfinite_unexpected"] == 0)
        user_expected = expected is not None and t.name in expected
        why = _nonfinite_reason(fig, poisoned.get(t.name, ()), user_expected)
        if why:
            fig["why"] = why
            fig["passed"] = fig["passed"] and (user_expected or not poisoned.get(t.name))
        results[t.name] = fig
    return Validation(results, profile, atol, rtol, values, pipeline)


def package_pipeline(pkg) -> dict | None:
    """plan.json's ``pipeline`` (``planner.pipeline``: a package of micro-batches), checked against
    the package's graph and target; None for a package without micro-batches."""
    pipe = (pkg.plan or {}).get("pipeline")
    if not pipe:
        return None
    where = f"{pkg.path / 'plan.json'}: damaged pipeline record"
    m, n, b, stages = (pipe[k] for k in ("micro_batch", "micro_batches", "batch", "stages"))
    if m * n != b:
        raise TileplanError(f"{where}: {n} micro-batches of {m} images are not the batch of {b}")
    if stages > pkg.target.ipus:
        raise TileplanError(f"{where}: {stages} stages on a target of {pkg.target.ipus} IPU(s)")
    for t in pkg.graph.tensors.values():
        if t.role is Role.INPUT and (not t.shape or t.shape[0] != m):
            raise TileplanError(f"{where}: input {t.name!r} {list(t.shape)} is not a micro-batch of {m}")
    return pipe


def _run_pipelined(pkg, model, stored: dict, pipe: dict):
    """The IPU model's pipelined run of every micro-batch (``IPUModel.run_pipelined``): its profile, each
    output buffer's values over the whole batch, and the schedule's figures from the run's cycles."""
    from ..planner.pipeline import program_places, tile_program_pipeline
    tp, target = pkg.program, pkg.target
    m, n, stages = pipe["micro_batch"], pipe["micro_batches"], pipe["stages"]
    places = program_places(tp, target, stages)
    tpi = target.tiles_per_ipu

    def ipu(b):
        tiles = np.asarray(tp.io_maps[b.name][0])
        return int(tiles.min()) // tpi if stages > 1 and tiles.size else 0
    ins = [(b, ipu(b)) for b in tp.buffers if b.kind == "input"]
    outs = [(b, ipu(b)) for b in tp.buffers if b.kind == "output"]
    got: dict[str, list] = {b.name: [None] * n for b, _ in outs}

    def feed(j, s):
        for b, k in ins:
            if k == s:
                v = stored[b.tensor][j * m:(j + 1) * m]
                model.write(b.name, np.swapaxes(v, -1, -2) if b.transpose else v)

    def collect(j, s):
        for b, k in outs:
            if k == s:
                got[b.name][j] = model.read(b.name)
    profile = model.run_pipelined(places, stages, n, feed, collect)
    figures = tile_program_pipeline(tp, target, stages, m, n, [st.cycles + st.sync for st in profile.steps])
    return profile, {k: np.concatenate(v) for k, v in got.items()}, figures


def nonfinite_sources(graph, stored: dict[str, np.ndarray]) -> dict[str, tuple[str, ...]]:
    """Per tensor, the inputs and parameters holding NaN or infinity that it is computed from
    (graph ops run in execution order; tensors from finite data only are left out).

    Design decision: a NaN or infinity the float64 reference computes from finite inputs (an FP8
    cast with ``saturate = 0``, a reduction over an empty axis) is a value to match, and the output
    passes when it matches; one that is there because an input or parameter already held it proves
    nothing (every output it reaches is NaN on the device and in the reference alike), so an output
    with non-finite values traced to such data fails validation, and says which data. Expected
    values the user gives (``--expected``) are the exception: they state what the non-finite
    inputs must become (an ONNX Cast of NaN and infinity, say), so matching them passes."""
    bad = {}
    for name, v in stored.items():
        t = graph.tensors.get(name)
        if t is not None and not _all_finite(v, t):
            bad[name] = (name,)
    for op in graph.ops:
        src = sorted({s for i in op.inputs for s in bad.get(i, ())})
        if src:
            bad[op.output] = tuple(src)
    return bad


def _all_finite(stored: np.ndarray, t, chunk: int = 1 << 20) -> bool:
    """Every stored value of tensor ``t`` is finite (widened a chunk at a time: a tower's parameters
    in float64 at once would be gigabytes)."""
    flat = np.asarray(stored).reshape(-1)
    return all(np.isfinite(dequantise(flat[i:i + chunk], t.dtype, t.scale)).all()
               for i in range(0, flat.size, chunk))


def _nonfinite_reason(fig: dict, sources: tuple[str, ...], user_expected: bool) -> str:
    """Why an output's non-finite values fail (or, where they match a reference computed from
    finite data, what they are), for the table's reader; empty when the output is finite."""
    got, want = fig.get("nonfinite_got", 0), fig.get("nonfinite_want", 0)
    if not (got or want):
        return ""
    ref = "the expected values" if user_expected else "the float64 reference"
    if sources and not user_expected:
        names = ", ".join(repr(s) for s in sources[:4]) + (", ..." if len(sources) > 4 else "")
        return (f"{got:,} values of the output and {want:,} of {ref} are NaN or infinite because the input or "
                f"parameter values {names} hold NaN or infinity; nothing is validated")
    if fig.get("nonfinite_unexpected"):
        return (f"{fig['nonfinite_unexpected']:,} values are non-finite in the output where {ref} is finite "
                f"or differs ({want:,} non-finite in {ref})")
    return f"{ref} itself is NaN or infinite at {want:,} values, and the output matches them"


# ---- the run's record in the package ----------------------------------------------------------

TRACE_FILE = "validation.npz"     # per step, per tile cycles of the run (the report's execution trace)


def validation_record(v: Validation) -> dict:
    """What ``validation.json`` holds: the outputs' figures, the tolerances, the cycles by phase and
    per step (slowest tile), and each tile's memory peak. Per-tile cycles go to ``validation.npz``."""
    prof = v.profile
    return {"outputs": v.outputs, "atol": v.atol, "rtol": v.rtol, "cycles": prof.cycles,
            "compute": prof.compute, "exchange": prof.exchange, "sync": prof.sync,
            "steps": [{"name": s.name, "kind": s.kind, "cycles": s.cycles, "sync": s.sync, "bytes": s.bytes}
                      for s in prof.steps],
            "memory_peak": [int(x) for x in prof.memory_peak],
            "step_tile_cycles_max": [int(s.tile_cycles.max(initial=0)) for s in prof.steps],
            "trace": TRACE_FILE, **({"pipeline": v.pipeline} if v.pipeline else {})}


def tile_cycles(v: Validation) -> np.ndarray:
    """int32 [steps, tiles]: each tile's cycles in each step of the run (a compute set: the sum of its
    vertices; an exchange: max(send, receive), without the sync)."""
    steps = v.profile.steps
    tiles = len(v.profile.memory_peak)
    out = np.zeros((len(steps), tiles), dtype=np.int32)
    for i, s in enumerate(steps):
        out[i, :len(s.tile_cycles)] = s.tile_cycles
    return out


def check_validation_destination(pkg) -> None:
    """Refuse now what ``write_validation`` would refuse after the run: ``validation.json`` or
    ``validation.npz`` in the package that is not a regular file (a folder, a FIFO, a link), or a
    package folder this process cannot write into. Design decision: the check runs before the IPU
    model, so a run whose record cannot be kept prints no table (a passing table followed by an
    error would read as a pass)."""
    import os

    from ..atomic import check_file
    for name in ("validation.json", TRACE_FILE):
        check_file(pkg.path / name)
    if not os.access(pkg.path, os.W_OK | os.X_OK):
        raise TileplanError(f"{pkg.path}: the package folder is not writable; validate records its run "
                            f"there (validation.json, {TRACE_FILE})")


def write_validation(pkg, v: Validation) -> None:
    """Record a run in the package: ``validation.json`` and ``validation.npz`` (``tile_cycles``),
    each written through ``tileplan.atomic.write_file`` (a temporary file renamed into place).
    Neither is in the manifest: they describe a run of the package, not its contents."""
    from ..atomic import write_file
    from ..lowering.package import dumps
    from ..lowering.tile_program import deterministic_npz
    files = {"validation.json": dumps(validation_record(v)).encode(),
             TRACE_FILE: deterministic_npz({"tile_cycles": tile_cycles(v)})}
    for name, data in files.items():
        write_file(pkg.path / name, data)


def chrome_trace(pkg, v: Validation) -> bytes:
    """The run's per-tile timeline in the Chrome trace-event format (``chrome://tracing``, Perfetto):
    one process per IPU (this model simulates one), one thread per tile, every tile written.

    Per step of the program (its supersteps: compute sets and exchanges, in order) each tile has
    its busy event (named as the step, ``args.kind`` compute or exchange, its cycles from the run:
    ``tile_cycles``), then ``idle`` until the step's slowest tile ends, then the step's ``sync``.
    So every tile's events add up to the run's total cycles and its busy events to its cycles in
    ``validation.npz``.

    Design decision: time is in cycles, written as the format's microseconds (``ts``, ``dur``
    integers: exact sums, no rounding through the clock); ``otherData`` says so and gives the
    clock to convert. Design decision: compact but complete: consecutive events of one tile with
    the same name and kind (an idle tile across several steps) merge into one, whose ``args``
    give the first and last step; one event a line, keys sorted (the same run, the same bytes)."""
    import json
    prof = v.profile
    cycles = tile_cycles(v)
    tiles = cycles.shape[1] if cycles.ndim == 2 else 0
    starts, at = [], 0
    for s in prof.steps:
        starts.append(at)
        at += s.cycles + s.sync
    events: list[dict] = [{"name": "process_name", "ph": "M", "pid": 0, "tid": 0,
                           "args": {"name": f"IPU 0 ({pkg.target.name}, {tiles} tiles)"}}]
    for t in range(tiles):
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": t, "args": {"name": f"tile {t}"}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": t, "args": {"sort_index": t}})
    for t in range(tiles):
        last = None
        for i, s in enumerate(prof.steps):
            busy = int(cycles[i, t])
            for name, kind, ts, dur in ((s.name, s.kind, starts[i], busy),
                                        ("idle", "idle", starts[i] + busy, s.cycles - busy),
                                        ("sync", "sync", starts[i] + s.cycles, s.sync)):
                if dur <= 0:
                    continue
                if last is not None and last["name"] == name and last["args"]["kind"] == kind \
                        and last["ts"] + last["dur"] == ts:
                    last["dur"] += dur
                    last["args"]["last_step"] = i
                    continue
                last = {"name": name, "ph": "X", "ts": ts, "dur": dur, "pid": 0, "tid": t,
                        "args": {"kind": kind, "first_step": i, "last_step": i}}
                events.append(last)
    other = {"time_unit": "1 us in this trace = 1 IPU cycle", "clock_hz": pkg.target.clock_hz,
             "model": pkg.graph.name, "target": pkg.target.name, "cycles": prof.cycles,
             "steps": [s.name for s in prof.steps]}
    lines = ",\n".join(json.dumps(e, sort_keys=True, separators=(",", ":")) for e in events)
    head = json.dumps({"displayTimeUnit": "ms", "otherData": other}, sort_keys=True, separators=(",", ":"))
    return (head[:-1] + ',"traceEvents":[\n' + lines + "\n]}\n").encode()


def write_trace(path, pkg, v: Validation) -> None:
    """``chrome_trace`` written to ``path`` through ``tileplan.atomic.write_file``."""
    from ..atomic import write_file
    write_file(path, chrome_trace(pkg, v))
