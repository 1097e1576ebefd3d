"""How the planner keeps parameters before selection: ``parameter_storage`` (each parameter's storage),
``resolve_weights`` (the plan's storage option) and ``stored_shape``. Here rather than in ``plan``
so that what only needs them (``quality.model_floor``) does not import the planner's entry point."""

from __future__ import annotations

import numpy as np

from ..estimate.memory import buffer_tile_bytes
from ..graph.core import Graph, Role
from ..program import Buffer
from . import elementwise as ew
from .candidates import Storage
from .families import family_of

# The share of a tile's usable bytes everything resident may take while the replicated parameters stay
# resident (``parameter_storage``); the rest is the activations' and transients' room. The stage split
# leaves a stage's parameters the same share, for the same reason (``stages.FILL`` is this constant).
RESIDENT_FILL = 0.85


def parameter_storage(graph: Graph, target) -> dict[str, Storage]:
    """How every parameter is kept: the storage its first consumer's family asks for
    (``families.Family.storage``), else a value born in ``Intervals``.

    Replicated parameters (bias rows, LayerNorm's gamma and beta: a whole copy on every tile) are
    resident while everything resident takes at most ``RESIDENT_FILL`` of every tile's usable
    bytes. A deep tower's replicas do not fit (27 SigLIP layers hold about 29 KB of them per
    layer on every tile, 790 KB in all, beside 279 KB of weight panels): then every replicated
    parameter becomes a value born in ``Intervals``, which selection broadcasts to its consumer
    when it runs (a conversion whose copy is transient), so all the layers' weights stay
    resident. The rule applies to all of them alike, so repeated
    layers keep one planning problem (``canon.op_key``).

    Design decision: the test is against ``RESIDENT_FILL`` of a tile, not all of it. Resident bytes
    that merely fit leave no room for the activations: 14 FP8 SigLIP layers (one pipeline stage of
    the tower on two IPUs) hold 557,760 B of replicas and panels on a tile of 589,824 usable bytes,
    and no selection fits beside them, while the 27-layer tower, whose replicas overflow and so are
    broadcast, plans on one IPU. The share is the one the stage split leaves for the same reason
    (``stages.FILL``)."""
    out: dict[str, Storage] = {}
    for op in graph.ops:
        fam = family_of(op)
        for idx, t in enumerate(graph.inputs_of(op)):
            if t.role is not Role.PARAMETER or t.name in out:
                continue
            out[t.name] = fam.storage(graph, op, idx, t, target) or Storage(ew.intervals(target.tiles, t.dtype), False)
    replicas = [n for n, st in out.items()
                if st.private and st.layout == ew.replicated(graph.tensors[n].shape, target.tiles)]
    if replicas:
        resident = np.zeros(target.tiles, dtype=np.int64)
        for n, st in out.items():
            if st.private:
                t = graph.tensors[n]
                buf = Buffer(n, st.layout, stored_shape(t, st), t.dtype, "parameter")
                resident += buffer_tile_bytes(buf, target.tiles, target.alignment)
        if int(resident.max()) > RESIDENT_FILL * target.usable_bytes:
            for n in replicas:
                out[n] = Storage(ew.intervals(target.tiles, graph.tensors[n].dtype), False)
    return out


def stored_shape(t, st: Storage) -> tuple[int, ...]:
    if st.transpose:
        return t.shape[:-2] + (t.shape[-1], t.shape[-2])
    return t.shape


def resolve_weights(graph: Graph, weights: str | None) -> str:
    """The parameter storage a plan uses: ``weights`` when given (checked), else the model file's
    (``graph.weights``), else ``"planner"``."""
    from ..graph.core import check_weights
    if weights is not None:
        return check_weights(weights, "weights")
    return graph.weights or "planner"
