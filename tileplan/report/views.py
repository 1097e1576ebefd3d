"""The per-tile views of the HTML report, computed from a package's tile program and its run.

- ``liveness``: bytes live on every tile at every step, by class (parameters,
  activations, partials, transient: ``buffer_class``), from the buffers' spans
  (``sim.model.live_bytes``, the same count as the IPU model's memory peak); the
  always-live buffers; the worst tile.
- ``trace``: each tile's cycles in each step of the IPU model run (validation.npz)
  with the step's sync, and the tile balance per step (mean / max).
- ``compute_sets``: per compute step, its vertex groups: kernel variant, vertex
  count, tiles, cycles per vertex, the call's sizes.
- ``exchanges``: per exchange step, the bytes each tile sends (a multicast counts
  once) and receives, and the largest flows between two tiles.

Everything is plain lists of ints and strings, ready for the page's JSON data
(``html.page_data``), deterministic for a given package.
"""

from __future__ import annotations

from dataclasses import fields

import numpy as np

CLASSES = ("parameters", "activations", "partials", "transient")
PARTIALS = (".C", ".P", ".Pr")        # a GEMM's partial sums (planner/gemm.py names its buffers so)
FLOWS = 8                             # largest flows listed per exchange


def buffer_class(b) -> str:
    """The liveness class of a tile-program buffer."""
    if b.kind == "parameter":
        return "parameters"
    if b.kind in ("input", "output", "tensor"):
        return "activations"
    if any(b.name.endswith(s) for s in PARTIALS):
        return "partials"
    return "transient"


def liveness(tp) -> dict:
    from ..sim.model import live_bytes
    group = [CLASSES.index(buffer_class(b)) for b in tp.buffers]
    live = live_bytes(tp, group, len(CLASSES))            # [classes, steps, tiles]
    total = live.sum(axis=0)
    worst = int(total.max(axis=0).argmax()) if total.size else 0
    nsteps = len(tp.steps)
    always = []
    for i, b in enumerate(tp.buffers):
        if b.alias_of is None and (b.span is None or (b.span[0] <= 0 and b.span[1] >= nsteps - 1)):
            always.append({"name": b.name, "class": buffer_class(b), "layout": b.layout,
                           "bytes_max": int(tp.size[i].max(initial=0)), "bytes_total": int(tp.size[i].sum())})
    always.sort(key=lambda r: (-r["bytes_max"], r["name"]))
    idx = [i for i, b in enumerate(tp.buffers) if b.name in {r["name"] for r in always}]
    per_tile = tp.size[idx].sum(axis=0) if idx else np.zeros(tp.tiles, np.int64)
    return {"classes": list(CLASSES), "live": live, "worst_tile": worst,
            "peak": int(total[:, worst].max(initial=0)), "always_live": always, "always_bytes": per_tile}


def trace(tile_cycles: np.ndarray, steps: list[dict]) -> dict:
    """Per step: the slowest tile's cycles, the sync, and balance = mean / max over the tiles that
    work in the step (1.0: perfectly balanced)."""
    rows = []
    for i, s in enumerate(steps):
        c = tile_cycles[i]
        busy = c[c > 0]
        mx = int(c.max(initial=0))
        rows.append({"name": s["name"], "kind": s["kind"], "max": mx, "sync": s["sync"],
                     "min": int(busy.min()) if busy.size else 0, "mean": float(busy.mean()) if busy.size else 0.0,
                     "active": int(busy.size), "slowest": int(c.argmax()) if busy.size else -1,
                     "balance": float(busy.mean() / mx) if mx else 1.0})
    return {"steps": rows}


def _call(call) -> str:
    return ", ".join(f"{f.name}={getattr(call, f.name)}" for f in fields(call)
                     if not isinstance(getattr(call, f.name), (list, tuple, dict)))


def compute_sets(tp) -> list[dict]:
    from ..lowering.tile_program import ComputeSet
    out = []
    for i, st in enumerate(tp.steps):
        if not isinstance(st, ComputeSet):
            continue
        per = np.zeros(tp.tiles, dtype=np.int64)
        groups = []
        for g in st.groups:
            np.add.at(per, g.tile, g.cycles)
            groups.append({"variant": g.variant, "vertices": len(g.tile), "tiles": int(np.unique(g.tile).size),
                           "cycles": int(g.cycles), "call": _call(g.call)})
        by_variant: dict[str, dict] = {}
        for g in groups:
            v = by_variant.setdefault(g["variant"], {"variant": g["variant"], "vertices": 0, "groups": 0})
            v["vertices"] += g["vertices"]
            v["groups"] += 1
        out.append({"step": i, "name": st.name, "vertices": sum(g["vertices"] for g in groups),
                    "cycles": int(per.max(initial=0)), "variants": sorted(by_variant.values(),
                                                                          key=lambda v: -v["vertices"]),
                    "groups": sorted(groups, key=lambda g: (-g["cycles"] * g["vertices"], g["variant"]))})
    return out


def exchanges(tp) -> list[dict]:
    from ..lowering.tile_program import Exchange
    out = []
    for i, st in enumerate(tp.steps):
        if not isinstance(st, Exchange):
            continue
        tr = st.transfers
        n = len(tr)
        recv = np.bincount(tr.dst_tile, weights=tr.nbytes, minlength=tp.tiles).astype(np.int64) if n else \
            np.zeros(tp.tiles, np.int64)
        first = np.ones(n, dtype=bool)
        if n:
            first[1:] = tr.group[1:] != tr.group[:-1]
        sent = np.bincount(tr.src_tile[first], weights=tr.nbytes[first], minlength=tp.tiles).astype(np.int64) \
            if n else np.zeros(tp.tiles, np.int64)
        flows = []
        if n:
            key = tr.src_tile.astype(np.int64) * tp.tiles + tr.dst_tile
            pairs, inv = np.unique(key, return_inverse=True)
            per = np.bincount(inv, weights=tr.nbytes).astype(np.int64)
            top = np.lexsort((pairs, -per))[:FLOWS]
            flows = [{"src": int(pairs[k] // tp.tiles), "dst": int(pairs[k] % tp.tiles), "bytes": int(per[k])}
                     for k in top]
        out.append({"step": i, "name": st.name, "bytes": int(tr.nbytes.sum()) if n else 0, "transfers": n,
                    "sent": sent, "received": recv, "flows": flows,
                    "max_sent": int(sent.max(initial=0)), "max_sent_tile": int(sent.argmax()) if n else -1,
                    "max_received": int(recv.max(initial=0)), "max_received_tile": int(recv.argmax()) if n else -1,
                    "senders": int((sent > 0).sum()), "receivers": int((recv > 0).sum())})
    return out


def allocation(tp, target: dict) -> dict:
    """Per tile, the allocation's peak (``lowering.allocate``'s placement, kept in the tile program's
    addresses): in each region the highest address used above the region's start (the standard
    region's start is the reserve's end), and their sum. int64 arrays [tiles]."""
    res, sb = int(target["reserve_bytes"]), int(target["standard_bytes"])
    used = (tp.addr >= 0) & (tp.size > 0)
    ends = tp.addr + tp.size
    std = np.where(used & (tp.addr < sb), ends, res).max(axis=0, initial=res) - res
    inter = np.where(used & (tp.addr >= sb), ends, sb).max(axis=0, initial=sb) - sb
    return {"standard": std, "interleaved": inter, "total": std + inter}


def tile_buffers(tp, tile: int, target: dict) -> list[dict]:
    """The buffers placed on one tile, by region then address: name, class, region, offset from the
    region's start, bytes, the program steps it is live over, and the buffers sharing its memory."""
    res, sb = int(target["reserve_bytes"]), int(target["standard_bytes"])
    nsteps = len(tp.steps)
    shared: dict[str, list[str]] = {}
    for b in tp.buffers:
        if b.alias_of is not None:
            shared.setdefault(b.alias_of, []).append(b.name)
    rows = []
    for i, b in enumerate(tp.buffers):
        a, n = int(tp.addr[i, tile]), int(tp.size[i, tile])
        if a < 0 or n <= 0 or b.alias_of is not None:
            continue
        region = "standard" if a < sb else "interleaved"
        span = b.span if b.span is not None else [0, max(nsteps - 1, 0)]
        rows.append({"name": b.name, "class": buffer_class(b), "region": region,
                     "offset": a - (res if region == "standard" else sb), "bytes": n,
                     "first": int(span[0]), "last": int(span[1]), "shared": sorted(shared.get(b.name, []))})
    rows.sort(key=lambda r: (r["region"] != "standard", r["offset"], r["name"]))
    return rows
