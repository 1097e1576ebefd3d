"""The float64 reference and the validation data.

The reference evaluates the graph in float64 on the exact stored (quantised)
inputs and parameters, op by op: each op is computed exactly in float64 and
its result is stored in its output tensor's declared type (an FP16 tensor
rounds to FP16; an FP8 cast rounds and saturates with its scale), because the
graph declares those types. What the reference does not have is the device's
inner arithmetic: FP32 accumulation, FP16 partials of a split K, a fused
bias-GeLU that keeps the sum in FP32.

Validation data (fixed seed): activations (graph inputs) N(0, 0.5) (standard
deviation 0.5); a MatMul's parameter operand N(0, 1/sqrt(K)); a bias added
to a MatMul's result N(0, 1/sqrt(K)) of that MatMul (the scale of PyTorch's
Linear initialisation); any other parameter N(0, 0.5). FP8 values are stored with their tensor's
power-of-two scale.
"""

from __future__ import annotations

import math
import zlib

import numpy as np

from ..graph.core import Add, Graph, MatMul, Role
from ..graph.dtypes import DType, dequantise, quantise


def seeded_values(graph: Graph, seed: int = 0, batch: int | None = None) -> dict[str, np.ndarray]:
    """Stored values (in each tensor's dtype) for every input and parameter. ``batch``: the inputs'
    leading axis that long instead (a package of micro-batches: the whole batch's inputs, which it
    runs a micro-batch at a time; ``planner.pipeline``)."""
    k_of, k_of_result = {}, {}
    for op in graph.ops:
        if isinstance(op, MatMul):
            ta, tb = graph.inputs_of(op)
            k = op.mnk([ta, tb])[3]
            k_of_result[op.output] = k
            for t in (ta, tb):
                if t.role is Role.PARAMETER:
                    k_of[t.name] = k
    for op in graph.ops:
        if isinstance(op, Add):
            for mine, other in ((op.inputs[0], op.inputs[1]), (op.inputs[1], op.inputs[0])):
                if graph.tensors[mine].role is Role.PARAMETER and other in k_of_result:
                    k_of.setdefault(mine, k_of_result[other])
    out = {}
    for name in sorted(graph.tensors):
        t = graph.tensors[name]
        if t.role not in (Role.INPUT, Role.PARAMETER):
            continue
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
        if t.dtype is DType.INT32:
            # 0 and 1: a valid attention mask and valid row indices of any table of two rows or more.
            out[name] = rng.integers(0, 2, t.shape).astype(np.int32)
            continue
        std = 1.0 / math.sqrt(k_of[name]) if name in k_of else 0.5
        shape = (batch, *t.shape[1:]) if batch is not None and t.role is Role.INPUT else t.shape
        out[name] = quantise(rng.normal(0.0, std, shape), t.dtype, t.scale)
    return out


def reference(graph: Graph, stored: dict[str, np.ndarray], keep=None) -> dict[str, np.ndarray]:
    """float64 values of every tensor, from stored inputs and parameters; with ``keep`` (tensor
    names), only those: a stored value is widened to float64 when its first consumer runs and every
    value is dropped after its last consumer, so a 27-layer tower's reference holds about one
    layer's tensors at a time (all of them in float64 are 10 GB)."""
    def value(name):
        if name not in vals:
            t = graph.tensors[name]
            raw = graph.folded_value(name) if name in graph.folded else stored[name]   # folded: host data
            vals[name] = dequantise(raw, t.dtype, t.scale)
        return vals[name]

    vals: dict[str, np.ndarray] = {}
    last = {}
    if keep is None:
        for name in stored:
            value(name)
    else:
        keep = set(keep)
        for i, op in enumerate(graph.ops):
            for name in op.inputs:
                last[name] = i
    for i, op in enumerate(graph.ops):
        ins = [value(n) for n in op.inputs]
        out_t = graph.output_of(op)
        y = op.reference(*ins)
        del ins
        y = np.asarray(y, dtype=np.float64).reshape(out_t.shape)
        vals[op.output] = dequantise(quantise(y, out_t.dtype, out_t.scale, op.saturate), out_t.dtype, out_t.scale)
        if keep is not None:
            for name in set(op.inputs):
                if last[name] == i and name not in keep:
                    del vals[name]
    if keep is None:
        return vals
    return {n: vals[n] if n in vals else value(n) for n in keep}


def compare(got: np.ndarray, want: np.ndarray) -> dict:
    """max abs error, max rel error (against max |want|-scaled floor) and cosine similarity over the
    elements where both values are finite, and how many are not (``nonfinite``; of those,
    ``nonfinite_got`` in the output and ``nonfinite_want`` in the reference), so a report never
    shows a clean figure beside NaN or infinite values (``validate_package`` decides which of
    them match: a NaN where NaN is expected, the expected infinity)."""
    g = np.asarray(got, dtype=np.float64).reshape(-1)
    w = np.asarray(want, dtype=np.float64).reshape(-1)
    finite = np.isfinite(g) & np.isfinite(w)
    gf, wf = g[finite], w[finite]
    d = np.abs(gf - wf)
    scale = max(float(np.abs(wf).max(initial=0.0)), 1e-30)
    rel = d / np.maximum(np.abs(wf), 1e-3 * scale)
    denom = float(np.linalg.norm(gf) * np.linalg.norm(wf))
    return {"max_abs": float(d.max(initial=0.0)), "max_rel": float(rel.max(initial=0.0)),
            "cosine": float(gf @ wf / denom) if denom > 0 else (1.0 if not d.any() else 0.0),
            "nonfinite": int((~finite).sum()), "nonfinite_got": int((~np.isfinite(g)).sum()),
            "nonfinite_want": int((~np.isfinite(w)).sum()), "elements": int(g.size)}
