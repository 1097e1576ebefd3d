"""The package: a folder holding everything one compiled model needs.

```
plan.json          the plan (per op choice, layouts, grid, estimates; runner-ups)
model.json         the graph the package was compiled from
target.json        the machine description it was compiled for
program.json       the tile program's index (buffers, steps, calls, passes)
program.npz        the tile program's arrays (addresses, vertex and transfer tables)
params.npz         parameter values, when the model file carried them (ONNX, torch)
codelets/*.cpp     one Poplar codelet per kernel specialisation
host.cpp           the same graph built with the Poplar host API, reading
host/tables.bin    its variables, operands, vertices and copies (binary tables; a step equal to an
                   earlier one slot for slot, a tower's later layers, refers to its rows)
report.json        estimate vs program by step, memory per tile, pass log
manifest.json      SHA-256 of every file above, and the format version
```

``write_package`` writes into a temporary folder beside the destination and
renames it into place (``tileplan.atomic``: it replaces only a folder carrying the
package marker ``.tileplan-package``), so a failed compile leaves nothing half-written; the
same inputs give byte-identical files (sorted keys, no timestamps, fixed zip
dates). ``load_package`` refuses a package whose manifest does not match its
files. ``validation.json`` (written by ``tileplan validate``) is not part of
the manifest: it records a run, not the compiled program.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..atomic import write_folder
from ..errors import TileplanError
from ..safeio import LIMITS, MiB, load_json_object, load_npz, parse_json, read_file
from ..graph.serialize import graph_from_dict, graph_to_dict
from ..target import Target
from .tile_program import TileProgram

FORMAT = "tileplan-package/4"   # 2: host/tables.bin stores repeated steps once (TPHOST2); 3: program.npz
                                # stores exchange sources relative to their buffers, groups as differences;
                                # 4: host/tables.bin deflated (TPHOST3), program.json compact


def dumps(obj) -> str:
    return json.dumps(obj, indent=1, sort_keys=True, default=_json_default) + "\n"


def compact_dumps(obj) -> str:
    """``dumps`` without the indentation: for ``program.json``, the tile program's index, which
    tools read and people seldom do. Design decision: its thousands of steps and buffers were a
    third whitespace (the 27-layer tower's 3.0 MB index is 2.1 MB compact); the documents people
    read (plan.json, report.json, model.json) keep their indentation."""
    return json.dumps(obj, separators=(",", ":"), sort_keys=True, default=_json_default) + "\n"


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if hasattr(o, "value"):
        return o.value
    return str(o)


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    from .tile_program import deterministic_npz
    return deterministic_npz({k: np.ascontiguousarray(v) for k, v in arrays.items()})


def package_files(plan, state, target, params: dict | None, plan_json: dict, report: dict, host) -> dict[str, bytes]:
    """Every file of the package. ``host``: a call giving the host program's files (host.cpp and
    host/tables.bin: ``lowering.compile.host_files``, which may be working them out in a forked
    process meanwhile)."""
    from .emit.codelets import emit_codelets
    tp = state.tile_program
    # Deflating program.npz releases the GIL: it runs on a second thread while the other files are
    # made, and the host program is asked for last: a large plan's is emitted in a forked process
    # meanwhile (``lowering.compile.beside``), the longest of these, so the documents, codelets and
    # parameters are made while it runs rather than after it (all only read the tile program).
    with ThreadPoolExecutor(max_workers=1) as pool:
        program = pool.submit(tp.to_files)
        files: dict[str, bytes] = {
            "plan.json": dumps(plan_json).encode(),
            "model.json": dumps(graph_to_dict(plan.graph)).encode(),
            "target.json": dumps(target.document()).encode(),
            "report.json": dumps(report).encode(),
        }
        for name, src in emit_codelets(tp, target).items():
            files[name] = src.encode()
        if params:
            check_params(params, plan.graph, "the model's parameter values")
            stored = {k: _stored_bytes(v) for k, v in params.items()}
            files["params.npz"] = npz_bytes(stored)
        files.update(host())        # (a small plan's is emitted here, still beside the deflating)
        npz, index = program.result()
    files["program.json"] = compact_dumps(index).encode()
    files["program.npz"] = npz
    manifest = {"format": FORMAT, "model": plan.graph.name, "target": target.name,
                "files": {n: hashlib.sha256(b).hexdigest() for n, b in sorted(files.items())}}
    files["manifest.json"] = dumps(manifest).encode()
    return files


def _stored_bytes(v: np.ndarray) -> np.ndarray:
    """Parameter values as raw storage (FP8 travels as uint8 bytes; npz has no float8)."""
    v = np.asarray(v)
    return v.view(np.uint8) if v.dtype.itemsize == 1 and v.dtype.kind not in "iub" else v


def write_package(out_dir: str | Path, files) -> Path:
    """Write the package folder atomically through ``tileplan.atomic`` (marker ``.tileplan-package``
    holding ``FORMAT``; an existing folder is replaced only if it is a package). ``files``: the dict of
    ``package_files``, or a function returning it."""
    return write_folder(out_dir, files, FORMAT)


@dataclass
class Package:
    path: Path
    graph: object
    target: Target
    program: TileProgram
    plan: dict
    report: dict
    params: dict[str, np.ndarray]


def load_package(path: str | Path) -> Package:
    """Read and verify a package; any mismatch is a ``TileplanError`` naming the file.

    Every file is read through ``tileplan.safeio`` (regular files only, size-capped), checked
    against its manifest digest, then for what it must hold before it is used: the JSON documents
    against their schema (``lowering.check.check_documents``: types, ranges, list lengths, indices
    in bounds), the tile program against its own bounds, the target and the graph
    (``lowering.check.check_program``). Before anything runs.

    Design decision: each file's read is bounded by what the files read before it declare, so a
    zip bomb or an ``.npy`` header claiming terabytes is refused before the allocation:
    ``program.npz`` by ``program_limit`` (the target's tile memory and the program index),
    ``params.npz`` by the model's parameter sizes (``params_limit``), the JSON documents and other
    files by ``safeio.LIMITS``."""
    from .check import check_documents, check_program
    root = Path(path)
    if not root.is_dir():
        raise TileplanError(f"{root}: not a package folder")
    mpath = root / "manifest.json"
    if not os.path.lexists(mpath):
        raise TileplanError(f"{root}: no manifest.json; not a tileplan package")
    manifest = load_json_object(mpath, LIMITS["json"], "manifest")
    if manifest.get("format") != FORMAT:
        raise TileplanError(f"{mpath}: package format {str(manifest.get('format'))[:80]!r}, this tileplan reads "
                            f"{FORMAT!r}: compile the model again (tileplan compile) to read it")
    listed = manifest.get("files")
    if not isinstance(listed, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in listed.items()):
        raise TileplanError(f"{mpath}: damaged manifest (files must map names to SHA-256 digests)")
    for name in sorted(listed):
        rel = Path(name)
        if not name or rel.is_absolute() or ".." in rel.parts:
            raise TileplanError(f"{mpath}: damaged manifest (the member {name[:120]!r} is outside the package)")
        if not os.path.lexists(root / name):
            raise TileplanError(f"{root}: {name} is missing from the package")
    for need in ("model.json", "target.json", "program.json", "program.npz", "plan.json"):
        if need not in listed:
            raise TileplanError(f"{root}: the manifest does not list {need}")
    for extra in ("params.npz", "report.json"):
        if extra not in listed and os.path.lexists(root / extra):
            raise TileplanError(f"{root / extra}: not listed in the manifest (damaged or edited package)")

    def read(name: str, limit: int) -> bytes:
        data = read_file(root / name, limit, name)
        if hashlib.sha256(data).hexdigest() != listed[name]:
            raise TileplanError(f"{root / name}: content does not match the manifest (damaged or edited package)")
        return data

    jsons = [n for n in ("model.json", "target.json", "program.json", "plan.json", "report.json") if n in listed]
    docs = {n: _object(parse_json(read(n, LIMITS["json"]), str(root / n), n), root / n) for n in jsons}
    check_documents(docs, root)
    try:
        target = Target(**docs["target.json"])
    except TileplanError as exc:
        raise TileplanError(f"{root / 'target.json'}: {exc}") from None
    try:
        graph = graph_from_dict(docs["model.json"])
    except TileplanError as exc:
        raise TileplanError(f"{root / 'model.json'}: {exc}") from None
    except (TypeError, KeyError, ValueError, AttributeError, IndexError, OverflowError) as exc:
        raise TileplanError(f"{root / 'model.json'}: cannot read it ({type(exc).__name__}: {str(exc)[:160]})") from None
    limit = program_limit(target, docs["program.json"])
    arrays = load_npz(read("program.npz", limit + 64 * MiB), limit, "program.npz", where=str(root / "program.npz"))
    try:
        program = TileProgram.from_files(arrays, docs["program.json"])
        check_program(program, target, graph)
    except TileplanError as exc:
        raise TileplanError(f"{root}: {exc}") from None
    params = {}
    if "params.npz" in listed:
        limit = params_limit(graph)
        params = _load_params(read("params.npz", limit + 64 * MiB), root / "params.npz", graph, limit)
    other = limit_of_other_files(target, docs["program.json"])
    for name in sorted(set(listed) - set(jsons) - {"program.npz", "params.npz"}):
        read(name, other)                    # codelets, host program: only their digests are checked
    return Package(root, graph, target, program, docs["plan.json"], docs.get("report.json", {}), params)


PROGRAM_FACTOR = 2      # program.npz's arrays in all, in units of the target's tile memory (tiles x SRAM)


def program_limit(target: Target, index: dict) -> int:
    """The most bytes of arrays ``program.npz`` may declare for this target and program index.

    Design decision: a program's vertex and transfer tables address bytes of tile memory, and its
    pooled tables (one per distinct table) stay well under the machine's memory: the 27-layer SigLIP
    tower's whole package is 8.6 MB on 1,472 tiles x 624 KiB (940 MB). So the tables are bounded by
    ``PROGRAM_FACTOR`` x tiles x SRAM, plus what the index declares: the address and size tables
    (int64 [buffers, tiles] each) and the host maps (at most one interval of four int64 per element
    of each host buffer)."""
    buffers = index.get("buffers") or []
    host = sum(math.prod(b["shape"]) for b in buffers if b.get("kind") in ("input", "parameter", "output"))
    return PROGRAM_FACTOR * target.tiles * target.sram_bytes + 16 * len(buffers) * target.tiles + 32 * host


def limit_of_other_files(target: Target, index: dict) -> int:
    """The cap on each codelet or host-program file (their digests are checked): the host program's
    tables describe the same tile program, so they share its bound (never less than the JSON cap)."""
    return max(LIMITS["json"], program_limit(target, index))


def params_limit(graph) -> int:
    """The bytes of arrays ``params.npz`` may declare: the model's parameters at their stored sizes,
    plus 1 MiB, so that a small stray or misshapen member is named by the per-array checks of
    ``_load_params`` rather than by the total."""
    from ..graph.core import Role
    return sum(t.nbytes for t in graph.tensors.values() if t.role is Role.PARAMETER) + MiB


def _object(doc, path: Path) -> dict:
    if not isinstance(doc, dict):
        raise TileplanError(f"{path}: damaged {_what(path)} (a JSON {type(doc).__name__}, not an object)")
    return doc


def _what(path: Path) -> str:
    return path.stem if path.name == "manifest.json" else path.name


def check_params(params: dict, graph, where: str) -> None:
    """Parameter values agree with the graph: each names a parameter tensor, with its shape and
    element type (``where``: the file or source named in errors)."""
    from ..graph.core import Role
    for k, v in params.items():
        t = graph.tensors.get(k)
        if t is None or t.role is not Role.PARAMETER:
            raise TileplanError(f"{where}: {k!r} is not a parameter of the model")
        v = np.asarray(v)
        if tuple(v.shape) != tuple(t.shape):
            raise TileplanError(f"{where}: {k!r} has shape {list(v.shape)}, the model's is {list(t.shape)}")
        if v.dtype != t.dtype.numpy:
            raise TileplanError(f"{where}: {k!r} holds {v.dtype} values, the model's tensor is {t.dtype}")


def _load_params(data: bytes, path: Path, graph, limit: int) -> dict[str, np.ndarray]:
    params = {}
    arrays = load_npz(data, limit, "params.npz", where=str(path))
    for k, raw in arrays.items():
        t = graph.tensors.get(k)
        if t is None:
            raise TileplanError(f"{path}: {k!r} is not a tensor of the model")
        want = _stored_bytes(np.zeros(1, dtype=t.dtype.numpy)).dtype
        if raw.dtype != want or raw.size != t.size:
            raise TileplanError(f"{path}: {k!r} holds {raw.size} {raw.dtype} values, the model's tensor is "
                                f"{list(t.shape)} {t.dtype} (stored as {want})")
        params[k] = raw.view(t.dtype.numpy).reshape(t.shape)
    check_params(params, graph, str(path))
    return params
