"""Calibration: tileplan's cost model beside public hardware measurements.

The data set, ``tileplan/calibration/hardware.toml``, lists every published IPU21 measurement
tileplan can be compared with (see the file's header for its fields and its fit / held-out rule).
For each entry this module computes tileplan's modelled cycles with the functions the planner
uses, never a copy:

- a kernel entry: each call is built from the entry's fields and priced by the registry,
  ``registry.dispatch(call, target, force=entry.variant).cycles(call, target)``; an entry of
  several calls (a fused kernel tileplan lacks) is the sum of its calls;
- a layout entry: the fixture planned with the entry's pins (``planner.plan``), its
  ``estimate.cycles`` (what the bundled IPU model simulates for the plan).

Design decision: the published formulas stay the planner's. Where the data shows a formula off
systematically, a DERIVED correction is fitted here on the fit split only, reported on the
held-out split, and shown beside the published figure; the planner does not use it (every
package's cycles and many tests depend on the published formulas; switching is a separate
decision).

The one fit, ``AMP_FIT``: the interleaved-weight AMP GEMM, ``setup + G (row R + group)`` with
``G = ceil(K'/16) ceil(C/16)`` (the published form, ipu-stack ``kernel/cost.rs``: 294, 4, 160),
its three coefficients refitted by least squares on the fit split's AMP entries (inside the
SigLIP tower the kernel spends a little more than the published formula: panel setup and
coefficient loading, ipu-stack docs/GEMM_UTILIZATION_2026_09_13.md). ``fit_amp`` computes it;
a test checks the constants below are what it returns on the fit split.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

from .errors import TileplanError
from .graph.dtypes import DType
from .safeio import read_file

DATA = Path(__file__).resolve().parent / "calibration" / "hardware.toml"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
DATA_LIMIT = 1 << 20
KINDS = ("kernel", "layout")
SPLITS = ("fit", "held-out")
TARGET = "ipu21"

# DERIVED: least squares of ``hardware = setup + G * (row * R + group)`` on the fit split's AMP
# entries (the ids below), ``G = ceil(K'/16) * ceil(C/16)``; rounded to 0.01. Not used by the
# planner (module docstring). ``fit_amp(fit entries)`` reproduces it (tests/test_calibrate.py).
AMP_FIT = {"setup": 458.21, "row": 4.0, "group": 155.39}
AMP_FIT_IDS: tuple[str, ...] = ("amp_qkv_fp8_244_128_64", "amp_mlp_down_fp8_122_160_128", "amp_out_proj_fp8_146_96_48",
                                "amp_pv_fp8_57_128_80", "amp_fp16_184_288_48", "amp_fp16_184_288_32",
                                "amp_fp16_146_576_32")
# What it shows (tileplan calibrate): the per-row term stays the AMP rate (4.00 cycles per group
# row), the setup grows (458 vs 294) and the per-group term shrinks (155 vs 160). On the held-out
# AMP entries it does not beat the published formula (geometric mean model / hardware 0.996 vs
# 0.998): the published formula is already within 2% of every AMP measurement, so the planner keeps it.


@dataclass(frozen=True)
class Entry:
    """One hardware measurement (fields as in the data file's header)."""

    id: str
    kind: str
    family: str
    what: str
    hardware: int
    source: str
    split: str
    calls: tuple = ()              # kernel: tuple of dicts (the call's fields, "primitive" first)
    variant: str | None = None     # kernel: the variant asked, else the registry's dispatch
    note: str | None = None
    fixture: str | None = None     # layout
    pins: tuple = ()
    differs: str | None = None


REQUIRED = ("id", "kind", "family", "what", "hardware", "source", "split")


def held_out_by_rule(position: int) -> bool:
    """The data set's split rule: the 1-based ``position`` within its family, in file order, is
    held out when ``position % 3 == 2`` (the 2nd, 5th, 8th, ...)."""
    return position % 3 == 2


def load_entries(path: str | Path | None = None) -> list[Entry]:
    """The entries of the data file, checked: required fields, unique ids, known kinds and
    splits, the split rule, calls for kernels and a fixture for layouts. Errors name the file
    and the entry."""
    path = Path(path) if path is not None else DATA
    where = str(path)
    try:
        doc = tomllib.loads(read_file(path, DATA_LIMIT, "calibration data").decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise TileplanError(f"{where}: not a valid TOML calibration file: {exc}") from None
    raw = doc.get("entry")
    if not isinstance(raw, list) or not raw:
        raise TileplanError(f"{where}: no [[entry]] tables")
    known = {f.name for f in fields(Entry)}
    entries, seen, positions = [], set(), {}
    for i, e in enumerate(raw):
        name = e.get("id", f"#{i + 1}") if isinstance(e, dict) else f"#{i + 1}"
        bad = lambda msg: TileplanError(f"{where}: entry {name!r}: {msg}")   # noqa: E731
        if not isinstance(e, dict):
            raise bad("not a table")
        missing = [k for k in REQUIRED if k not in e]
        if missing:
            raise bad(f"missing {', '.join(missing)}")
        extra = sorted(set(e) - known)
        if extra:
            raise bad(f"unknown field {', '.join(extra)}")
        if not all(isinstance(e[k], str) and e[k] for k in REQUIRED if k != "hardware"):
            raise bad("id, kind, family, what, source and split must be non-empty strings")
        if not (isinstance(e["hardware"], int) and not isinstance(e["hardware"], bool) and e["hardware"] > 0):
            raise bad(f"hardware must be a positive number of cycles, got {e['hardware']!r}")
        if e["id"] in seen:
            raise bad("duplicate id")
        seen.add(e["id"])
        if e["kind"] not in KINDS:
            raise bad(f"kind must be one of {', '.join(KINDS)}, got {e['kind']!r}")
        if e["split"] not in SPLITS:
            raise bad(f"split must be one of {', '.join(SPLITS)}, got {e['split']!r}")
        positions[e["family"]] = positions.get(e["family"], 0) + 1
        rule = "held-out" if held_out_by_rule(positions[e["family"]]) else "fit"
        if e["split"] != rule:
            raise bad(f"split {e['split']!r} breaks the file's rule (position {positions[e['family']]} "
                      f"in family {e['family']!r} is {rule!r})")
        if e["kind"] == "kernel":
            calls = e.get("calls")
            if not (isinstance(calls, list) and calls and all(isinstance(c, dict) and "primitive" in c
                                                               for c in calls)):
                raise bad("a kernel entry needs [[entry.calls]] tables, each with a primitive")
            if e.get("variant") is not None and len(calls) != 1:
                raise bad("a variant names the kernel of a single call")
        elif not isinstance(e.get("fixture"), str) or not isinstance(e.get("pins", []), list):
            raise bad("a layout entry needs a fixture (a file name) and pins (a list)")
        entries.append(Entry(**{**e, "calls": tuple(e.get("calls", ())), "pins": tuple(e.get("pins", ()))}))
    return entries


# ---- tileplan's model of each entry ------------------------------------------------------------

def build_call(spec: dict, where: str = "call"):
    """The kernel call a data-file table describes: ``primitive`` names the call class
    (``kernels.CALL_CLASSES``), the other keys its fields; type names become ``DType``."""
    from .kernels import CALL_CLASSES
    by_primitive = {cls.primitive: cls for cls in CALL_CLASSES}
    spec = dict(spec)
    primitive = spec.pop("primitive")
    cls = by_primitive.get(primitive)
    if cls is None:
        raise TileplanError(f"{where}: no kernel call for primitive {primitive!r}")
    dtypes = {d.value: d for d in DType}
    args = {k: dtypes.get(v, v) if isinstance(v, str) and k.endswith(("dtype", "partials", "cast_to")) else v
            for k, v in spec.items()}
    try:
        return cls(**args)
    except TypeError as exc:
        raise TileplanError(f"{where}: {exc}") from None


def calls_of(entry: Entry) -> list:
    return [build_call(c, f"calibration entry {entry.id!r}") for c in entry.calls]


def kernel_model(entry: Entry, target, registry=None) -> tuple[int, list[str]]:
    """Modelled cycles of a kernel entry and the variants priced: the registry's dispatch (or the
    entry's variant) and that variant's ``cycles(call, target)``, summed over the entry's calls."""
    from .kernels import dispatch
    total, names = 0, []
    for call in calls_of(entry):
        variant = dispatch(call, target, force=entry.variant, registry=registry)
        total += variant.cycles(call, target)
        names.append(variant.name)
    return total, names


def layout_model(entry: Entry, target, jobs: int = 1, fixtures: Path | None = None) -> int:
    """Modelled cycles of a layout entry: its fixture planned with its pins, the plan's estimate."""
    from .graph.loaders import load_model
    from .graph.pins import parse_pin
    from .planner.plan import plan
    path = (fixtures or FIXTURES) / entry.fixture
    if not path.is_file():
        raise TileplanError(f"calibration entry {entry.id!r}: fixture {path} not found (layout entries need "
                            f"a source checkout; --kernels-only skips them)")
    pins = [parse_pin(p, f"calibration entry {entry.id!r}") for p in entry.pins]
    return plan(load_model(path), target, jobs=jobs, pins=pins).estimate.cycles


# ---- the AMP fit -------------------------------------------------------------------------------

def amp_terms(call) -> tuple[int, int]:
    """``(R, G)`` of an AMP call in the published form: ``G = ceil(K'/16) * ceil(C/16)``, ``K'`` the
    FP8 K halved (as ``kernels.cycles.matmul_cycles``)."""
    from .kernels.cycles import AMP_GROUP_C, AMP_GROUP_K, ceil_div
    k_prime = ceil_div(call.k, 2) if call.in_dtype is DType.FP8 else call.k
    return call.m, ceil_div(k_prime, AMP_GROUP_K) * ceil_div(call.n, AMP_GROUP_C)


def _amp_rows(entries) -> tuple[np.ndarray, np.ndarray, list[str]]:
    a, y, ids = [], [], []
    for e in entries:
        if e.kind == "kernel" and e.family == "amp":
            (call,) = calls_of(e)
            r, g = amp_terms(call)
            a.append((1.0, g * r, g))
            y.append(float(e.hardware))
            ids.append(e.id)
    return np.array(a, dtype=np.float64).reshape(-1, 3), np.array(y, dtype=np.float64), ids


def fit_amp(entries) -> dict:
    """Least squares of ``hardware = setup + G (row R + group)`` on the AMP entries given (the
    caller passes the fit split only), coefficients rounded to 0.01, with the ids used."""
    a, y, ids = _amp_rows(entries)
    if len(ids) < 3:
        raise TileplanError(f"the AMP fit needs at least 3 entries, got {len(ids)}")
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    return {"setup": round(float(coef[0]), 2), "row": round(float(coef[1]), 2), "group": round(float(coef[2]), 2),
            "ids": ids}


def amp_fitted(entry: Entry, fit: dict = AMP_FIT) -> float | None:
    """The fitted AMP model's cycles for an AMP entry; None for any other."""
    if entry.kind != "kernel" or entry.family != "amp":
        return None
    (call,) = calls_of(entry)
    r, g = amp_terms(call)
    return fit["setup"] + g * (fit["row"] * r + fit["group"])


# ---- the table ---------------------------------------------------------------------------------

def rows(entries, target, *, kernels_only: bool = False, jobs: int = 1, registry=None, progress=None) -> list[dict]:
    """One row per entry (layouts skipped with ``kernels_only``): hardware, model (published
    formulas), model / hardware, the fitted model and its ratio where a fit applies."""
    out = []
    for e in entries:
        if e.kind == "layout" and kernels_only:
            continue
        if progress is not None:
            progress(e)
        if e.kind == "kernel":
            model, variants = kernel_model(e, target, registry)
        else:
            model, variants = layout_model(e, target, jobs), []
        fitted = amp_fitted(e)
        out.append({"id": e.id, "kind": e.kind, "family": e.family, "what": e.what, "source": e.source,
                    "split": e.split, "hardware": e.hardware, "model": int(model), "ratio": model / e.hardware,
                    "fitted": None if fitted is None else round(fitted, 2),
                    "fitted_ratio": None if fitted is None else fitted / e.hardware,
                    "variants": variants, "note": e.note or e.differs})
    return out


def _stats(ratios: list[float]) -> dict | None:
    if not ratios:
        return None
    return {"n": len(ratios), "geomean": math.exp(sum(math.log(r) for r in ratios) / len(ratios)),
            "min": min(ratios), "max": max(ratios)}


def summary(table: list[dict]) -> list[dict]:
    """Per kind, and for the AMP family (the fitted one), per split: the published model's ratios
    and, where every row of the group has a fitted figure, the fitted model's."""
    groups = [(k, lambda r, k=k: r["kind"] == k) for k in KINDS]
    groups.append(("kernel: amp", lambda r: r["kind"] == "kernel" and r["family"] == "amp"))
    out = []
    for name, member in groups:
        for split in SPLITS:
            chosen = [r for r in table if member(r) and r["split"] == split]
            if not chosen:
                continue
            fitted = [r["fitted_ratio"] for r in chosen]
            out.append({"group": name, "split": split, "published": _stats([r["ratio"] for r in chosen]),
                        "fitted": _stats(fitted) if all(f is not None for f in fitted) else None})
    return out


def report(target=None, *, kernels_only: bool = False, jobs: int = 1, progress=None) -> dict:
    """The calibration document: target, entries' rows, summary, and the AMP fit (its
    parameters, the ids fitted, recomputed from the data set's fit split)."""
    from .target import load_target
    target = target or load_target(TARGET)
    entries = load_entries()
    table = rows(entries, target, kernels_only=kernels_only, jobs=jobs, progress=progress)
    return {"target": target.name, "data": "tileplan/calibration/hardware.toml", "entries": table,
            "summary": summary(table),
            "fits": {"amp": {**AMP_FIT, "ids": list(AMP_FIT_IDS),
                             "form": "setup + ceil(K'/16) ceil(C/16) (row R + group)",
                             "published": {"setup": 294, "row": 4, "group": 160}}}}


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def _stat_cells(s: dict | None) -> list[str]:
    return ["-"] * 3 if s is None else [f"{s['geomean']:.3f}", f"{s['min']:.3f}", f"{s['max']:.3f}"]


ENTRY_COLUMNS = ("entry", "source", "hardware", "model (published)", "ratio", "fitted", "fitted ratio", "split")
SUMMARY_COLUMNS = ("group", "split", "n", "published geomean", "min", "max", "fitted geomean", "min", "max")


def entry_cells(r: dict) -> list[str]:
    return [r["id"], r["source"], f"{r['hardware']:,}", f"{r['model']:,}", _x(r["ratio"]),
            "-" if r["fitted"] is None else f"{r['fitted']:,.0f}", _x(r["fitted_ratio"]), r["split"]]


def summary_cells(s: dict) -> list[str]:
    return [s["group"], s["split"], str(s["published"]["n"]), *_stat_cells(s["published"]),
            *_stat_cells(s["fitted"])]


def fit_line(doc: dict) -> str:
    f = doc["fits"]["amp"]
    return (f"AMP fit (DERIVED, not used by the planner): {f['form']} with setup {f['setup']}, row {f['row']}, "
            f"group {f['group']} (published 294, 4, 160), least squares on the fit split's "
            f"{len(f['ids'])} AMP entries: {', '.join(f['ids'])}")
