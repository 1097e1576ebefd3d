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

import dataclasses
import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..atomic import write_folder
from ..errors import TileplanError
from ..graph.serialize import graph_from_dict, graph_to_dict
from ..target import Target
from .tile_program import TileProgram

FORMAT = "tileplan-package/2"   # 2: host/tables.bin stores repeated steps once (TPHOST2)


def dumps(obj) -> str:
    return json.dumps(obj, indent=1, sort_keys=True, default=_json_default) + "\n"


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
    # Deflating program.npz releases the GIL: it runs on a second thread while the host program is
    # emitted (both only read the tile program).
    with ThreadPoolExecutor(max_workers=1) as pool:
        program = pool.submit(tp.to_files)
        host = host()
        npz, index = program.result()
    files: dict[str, bytes] = {
        "plan.json": dumps(plan_json).encode(),
        "model.json": dumps(graph_to_dict(plan.graph)).encode(),
        "target.json": dumps(dataclasses.asdict(target)).encode(),
        "program.json": dumps(index).encode(),
        "program.npz": npz,
        "report.json": dumps(report).encode(),
    }
    files.update(host)
    for name, src in emit_codelets(tp, target).items():
        files[name] = src.encode()
    if params:
        check_params(params, plan.graph, "the model's parameter values")
        stored = {k: _stored_bytes(v) for k, v in params.items()}
        files["params.npz"] = npz_bytes(stored)
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

    Beyond the manifest's hashes, every file is checked for what it must hold (JSON objects,
    a readable npz), and the tile program against its own bounds and the graph
    (``lowering.check.check_program``), before anything runs."""
    from .check import check_program
    root = Path(path)
    if not root.is_dir():
        raise TileplanError(f"{root}: not a package folder")
    mpath = root / "manifest.json"
    if not mpath.is_file():
        raise TileplanError(f"{root}: no manifest.json; not a tileplan package")
    manifest = _json_object(mpath)
    if manifest.get("format") != FORMAT:
        raise TileplanError(f"{mpath}: package format {manifest.get('format')!r}, this tileplan reads {FORMAT!r}")
    listed = manifest.get("files")
    if not isinstance(listed, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in listed.items()):
        raise TileplanError(f"{mpath}: damaged manifest (files must map names to SHA-256 digests)")
    for name, digest in sorted(listed.items()):
        rel = Path(name)
        if rel.is_absolute() or ".." in rel.parts:
            raise TileplanError(f"{mpath}: damaged manifest (the member {name!r} is outside the package)")
        f = root / name
        if not f.is_file():
            raise TileplanError(f"{root}: {name} is missing from the package")
        if hashlib.sha256(_read(f)).hexdigest() != digest:
            raise TileplanError(f"{f}: content does not match the manifest (damaged or edited package)")
    for need in ("model.json", "target.json", "program.json", "program.npz", "plan.json"):
        if need not in listed:
            raise TileplanError(f"{root}: the manifest does not list {need}")
    docs = {name: _json_object(root / name) for name in ("model.json", "target.json", "program.json", "plan.json")}
    report = _json_object(root / "report.json") if (root / "report.json").is_file() else {}
    for name, build in (("model.json", lambda: graph_from_dict(docs["model.json"])),
                        ("target.json", lambda: Target(**docs["target.json"]))):
        try:
            built = build()
        except TileplanError as exc:
            raise TileplanError(f"{root / name}: {exc}") from None
        except (TypeError, KeyError, ValueError, AttributeError, IndexError) as exc:
            raise TileplanError(f"{root / name}: cannot read it ({type(exc).__name__}: {exc})") from None
        if name == "model.json":
            graph = built
        else:
            target = built
    try:
        program = TileProgram.from_files(_read(root / "program.npz"), docs["program.json"])
    except TileplanError as exc:
        raise TileplanError(f"{root}: {exc}") from None
    except Exception as exc:  # a package whose hashes match but whose content we cannot read
        raise TileplanError(f"{root}: cannot read the tile program ({type(exc).__name__}: {exc})") from None
    try:
        check_program(program, target, graph)
    except TileplanError as exc:
        raise TileplanError(f"{root}: {exc}") from None
    params = _load_params(root / "params.npz", graph) if (root / "params.npz").is_file() else {}
    return Package(root, graph, target, program, docs["plan.json"], report, params)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TileplanError(f"{path}: cannot read it ({exc.strerror or exc})") from None


def _json_object(path: Path) -> dict:
    """A package file that must hold one JSON object."""
    try:
        doc = json.loads(_read(path))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TileplanError(f"{path}: damaged {_what(path)} (not JSON: {getattr(exc, 'msg', exc)})") from None
    except RecursionError:
        raise TileplanError(f"{path}: damaged {_what(path)} (JSON nested too deeply)") from None
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


def _load_params(path: Path, graph) -> dict[str, np.ndarray]:
    import zipfile
    params = {}
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise TileplanError(f"{path}: damaged (not a readable npz: {type(exc).__name__})") from None
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
