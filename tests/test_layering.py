"""The dependency order of the layers, checked on the source: every import in tileplan/ (module level and
inside functions) points down the layers, and no modules import each other in a cycle.

    vocabulary (graph, target, layout; errors, _version, checked, atomic, safeio, schema, gcpause, forked)
    <- kernels
    <- program <- estimate <- planner <- lowering <- sim <- report <- cli, bench, calibrate, the top-level API
    (tileplan/__init__.py)

The model-file loaders (graph/toml.py, onnx.py, torch.py) build the vocabulary and may use targets
and layouts: they sit in its layer."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1] / "tileplan"
LAYERS = {"errors": 0, "_version": 0, "checked": 0, "atomic": 0, "gcpause": 0, "forked": 0, "safeio": 0, "schema": 0,
          "graph": 1, "target": 1, "targets": 1,
          "layout": 1, "kernels": 2, "program": 3, "estimate": 4, "planner": 5, "lowering": 6, "sim": 7, "report": 8, "cli": 9, "__main__": 9, "bench": 9, "calibrate": 9, "progress": 9, "calibration": 9,
          "": 10}


def modules() -> dict[str, Path]:
    out = {}
    for f in ROOT.rglob("*.py"):
        parts = list(f.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def import_edges() -> set[tuple[str, str]]:
    mods = modules()
    edges = set()
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for t in targets:
                while t and t not in mods and "." in t:
                    t = t.rsplit(".", 1)[0]
                if t in mods and t != name and t.startswith("tileplan"):
                    edges.add((name, t))
    return edges


def layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS[parts[1] if len(parts) > 1 else ""]


def test_every_import_points_down_the_layers():
    up = sorted(f"{a} -> {b}" for a, b in import_edges() if layer(b) > layer(a))
    assert not up, "imports from a lower layer to a higher one:\n" + "\n".join(up)


def test_no_modules_import_each_other_in_a_cycle():
    cycles = list(nx.simple_cycles(nx.DiGraph(sorted(import_edges()))))
    assert not cycles, f"import cycles: {cycles[:5]}"


def test_the_walk_sees_imports_inside_functions():
    # planner.quality imports planner.families inside model_floor: the walk must find it.
    assert ("tileplan.planner.quality", "tileplan.planner.families") in import_edges()
