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
host/tables.bin    its variables, operands, vertices and copies (binary tables)
report.json        estimate vs program by step, memory per tile, pass log
manifest.json      SHA-256 of every file above, and the format version
```

``write_package`` writes into a temporary folder beside the destination and
renames it into place, so a failed compile leaves nothing half-written; the
same inputs give byte-identical files (sorted keys, no timestamps, fixed zip
dates). ``load_package`` refuses a package whose manifest does not match its
files. ``validation.json`` (written by ``tileplan validate``) is not part of
the manifest: it records a run, not the compiled program.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import TileplanError
from ..graph.serialize import graph_from_dict, graph_to_dict
from ..target import Target
from .tile_program import TileProgram

FORMAT = "tileplan-package/1"


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


def package_files(plan, state, target, params: dict | None, plan_json: dict, report: dict) -> dict[str, bytes]:
    from .emit.codelets import emit_codelets
    from .emit.host import emit_host
    tp = state.tile_program
    # Deflating program.npz releases the GIL: it runs on a second thread while the host program is
    # emitted (both only read the tile program).
    with ThreadPoolExecutor(max_workers=1) as pool:
        program = pool.submit(tp.to_files)
        host = emit_host(tp, target, plan.graph.name)       # host.cpp and host/tables.bin
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


def write_package(out_dir: str | Path, files: dict[str, bytes]) -> Path:
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for name, data in sorted(files.items()):
            p = tmp / name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)           # mkdtemp makes 0700; a package is an ordinary folder
        old = None
        if out.exists():
            if not (out / "manifest.json").is_file() and any(out.iterdir()):
                raise TileplanError(f"{out} exists and is not a tileplan package; not overwriting it")
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
            os.rename(out, old / "pkg")
        os.rename(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


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
    """Read and verify a package; any mismatch is a ``TileplanError`` naming the file."""
    root = Path(path)
    if not root.is_dir():
        raise TileplanError(f"{root}: not a package folder")
    mpath = root / "manifest.json"
    try:
        manifest = json.loads(mpath.read_text())
    except FileNotFoundError:
        raise TileplanError(f"{root}: no manifest.json; not a tileplan package") from None
    except json.JSONDecodeError as exc:
        raise TileplanError(f"{mpath}: damaged manifest ({exc.msg})") from None
    if manifest.get("format") != FORMAT:
        raise TileplanError(f"{mpath}: package format {manifest.get('format')!r}, this tileplan reads {FORMAT!r}")
    for name, digest in sorted(manifest.get("files", {}).items()):
        f = root / name
        if not f.is_file():
            raise TileplanError(f"{root}: {name} is missing from the package")
        if hashlib.sha256(f.read_bytes()).hexdigest() != digest:
            raise TileplanError(f"{f}: content does not match the manifest (damaged or edited package)")
    for need in ("model.json", "target.json", "program.json", "program.npz", "plan.json"):
        if need not in manifest.get("files", {}):
            raise TileplanError(f"{root}: the manifest does not list {need}")
    try:
        graph = graph_from_dict(json.loads((root / "model.json").read_text()))
        target = Target(**json.loads((root / "target.json").read_text()))
        program = TileProgram.from_files((root / "program.npz").read_bytes(),
                                         json.loads((root / "program.json").read_text()))
    except TileplanError:
        raise
    except Exception as exc:  # a package whose hashes match but whose content we cannot read
        raise TileplanError(f"{root}: cannot read the package ({type(exc).__name__}: {exc})") from None
    if program.tiles != target.tiles:
        raise TileplanError(f"{root}: the tile program has {program.tiles} tiles, its target {target.tiles}")
    params = {}
    if (root / "params.npz").is_file():
        with np.load(root / "params.npz", allow_pickle=False) as z:
            for k in z.files:
                t = graph.tensors.get(k)
                if t is None:
                    raise TileplanError(f"{root}/params.npz: {k!r} is not a tensor of the model")
                params[k] = z[k].view(t.dtype.numpy).reshape(t.shape)
    return Package(root, graph, target, program, json.loads((root / "plan.json").read_text()),
                   json.loads((root / "report.json").read_text()) if (root / "report.json").is_file() else {},
                   params)
