"""tileplan: a graph-level distributed tile planner and compiler for IPU-style accelerators.

The Python API, the same five steps as the ``tileplan`` command::

    import tileplan
    graph = tileplan.load_model("fixtures/mlp_smoke_fp8.toml")     # check a model file
    p = tileplan.plan(graph)                                        # choose every op's implementation
    pkg = tileplan.compile(graph, "/tmp/smoke")                     # plan, lower, write the package
    v = tileplan.validate(pkg)                                      # run it on the IPU model
    html = tileplan.report(pkg)                                     # write pkg/report.html

Each function is a thin wrapper over the module doing the work (``graph.loaders``,
``planner.plan``, ``lowering.compile``, ``sim.validate``, ``report.html``); their
imports happen on the first call, so ``import tileplan`` stays cheap. A target is
a preset name (``"ipu21"``), a target TOML path or a ``Target``; when none is
given, the model file's own target is used, else ``ipu21``. Anything a user can
get wrong raises ``tileplan.errors.TileplanError``.
"""

from __future__ import annotations

from pathlib import Path

from ._version import __version__

__all__ = ["__version__", "load_model", "plan", "compile", "validate", "report"]


def load_model(path, target=None, *, cast_bf16=None):
    """Load and check a model: a ``.toml`` or ``.onnx`` file or ``"model.py:factory"``.
    ``cast_bf16="fp16"`` converts a bf16 model to FP16 (else bf16 is refused).

    Returns a ``tileplan.graph.core.Graph``. With ``target`` (a preset name, a target
    TOML path or a ``Target``) it also checks the model against that machine (an AMP
    for every MatMul's types, pinned layouts that fit). Raises ``TileplanError`` naming
    the file, op or tensor on bad input.
    """
    from .graph.loaders import load_model as _load
    from .target import load_target
    return _load(path, load_target(target) if target is not None else None, cast_bf16=cast_bf16)


def _graph_and_target(model, target):
    """A Graph (loaded when ``model`` is a path) and the Target to use for it."""
    from .cli import resolve_target
    from .graph.core import Graph
    from .graph.loaders import check_against_target
    graph = model if isinstance(model, Graph) else load_model(model)
    from .target import load_target
    tgt = load_target(target) if target is not None else resolve_target(None, graph)[0]
    check_against_target(graph, tgt)
    return graph, tgt


def plan(model, target=None, *, jobs: int = 1, solver: str = "dp", progress=None, weights=None, qkv: str = "auto"):
    """Plan a model: choose every op's implementation, layouts and GEMM grid.

    ``model`` is a ``Graph`` or a model path (as for ``load_model``). ``jobs`` worker
    processes cost the GEMM catalogues (results do not depend on it); ``solver`` is
    ``"dp"`` or ``"cpsat"``; ``progress(op, done, total)`` is called as catalogues are
    costed; ``weights`` is the parameter storage, ``"planner"`` (selection may store a GEMM's
    weights as its grid reads them) or ``"compact"`` (never), default the model file's
    ``[plan] weights``, else ``"planner"``; ``qkv`` is ``"auto"`` (GEMMs reading one activation, an
    encoder layer's Q, K and V, are planned separate and fused, and the cheaper kept), ``"fused"``
    or ``"separate"``. Returns a ``tileplan.planner.plan.Plan``: ``.estimate`` (cycles by phase,
    memory), ``.ratio`` to the roofline bound, ``.runner_ups`` per GEMM.
    ``tileplan.planner.planjson.plan_to_json(p)`` gives what ``plan.json`` holds.
    """
    from .planner.plan import plan as _plan
    graph, tgt = _graph_and_target(model, target)
    return _plan(graph, tgt, jobs=jobs, solver=solver, progress=progress, weights=weights, qkv=qkv)


def compile(model, out_dir, target=None, *, jobs: int = 1, solver: str = "dp", progress=None,
            weights=None, qkv: str = "auto") -> Path:
    """Plan and compile a model into the package folder ``out_dir``; returns its path.

    The package holds plan.json, the tile program, Poplar codelets and host program,
    report.json and a manifest (README: "The package"). Parameter values a model file
    carries (ONNX initializers, torch weights) travel in it. The same inputs give
    byte-identical packages. ``weights`` and ``qkv`` as for ``plan``.
    """
    from .graph.core import Graph
    from .graph.loaders import load_model_and_params
    from .lowering.compile import compile_model
    graph, params = (model, None) if isinstance(model, Graph) else load_model_and_params(model)  # one import
    graph, tgt = _graph_and_target(graph, target)
    _, _, path = compile_model(graph, tgt, out_dir, params=params, jobs=jobs, solver=solver, progress=progress,
                               weights=weights, qkv=qkv)
    return Path(path)


def validate(package, *, inputs=None, expected=None, atol=None, rtol=None, write: bool = True):
    """Run a package on the IPU model and compare its outputs with float64 (or ``expected``).

    ``inputs`` and ``expected`` are ``.npz`` paths keyed by tensor name; ``atol``/``rtol``
    default by the graph's lowest-precision type. Returns a ``tileplan.sim.validate.Validation``:
    ``.passed``, ``.outputs`` (per output max abs/rel error, cosine), ``.profile`` (simulated
    cycles per step and tile), ``.atol``/``.rtol``, ``.values``. With ``write`` (the default)
    it records the run in the package (validation.json and validation.npz), as
    ``tileplan validate`` does, so ``report`` shows it.
    """
    from .lowering.package import load_package
    from .sim.validate import validate_package, write_validation
    pkg = load_package(package)
    v = validate_package(pkg, inputs_path=inputs, expected_path=expected, atol=atol, rtol=rtol)
    if write:
        write_validation(pkg, v)
    return v


def report(package, html=None, *, compare=()) -> Path:
    """Write the HTML report of a package (default ``package/report.html``); returns its path.

    One self-contained page: plan per op, GEMM candidates, memory and liveness, and
    after ``validate`` the per-tile execution trace, compute sets and exchanges.
    ``compare``: other packages to show side by side with this one (per op and per step,
    cycles and memory, with deltas); the page switches between them.
    """
    from .report import render
    return render(package, html, compare=compare)

