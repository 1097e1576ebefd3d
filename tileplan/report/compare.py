"""Two packages side by side: per op and per step, cycles and memory, with deltas.

``op_rows(a, b)`` and ``step_rows(a, b)`` take two ``html.ReportData`` and return
plain rows that the terminal (``terminal.compare_table``) and the HTML report (its
"Compare" section) both show. Ops and steps are matched by name, in the order of
``a``, then those only ``b`` has; a side that lacks one shows ``None``. Steps use the
IPU model run when both packages are validated, else the lowered program's static
count (``report.json``'s ``program_steps``); ``source`` says which.
"""

from __future__ import annotations


def _delta(x, y):
    return None if x is None or y is None else y - x


def _ratio(x, y):
    return None if not x or y is None else y / x


def op_rows(a, b) -> list[dict]:
    """Per op: cycles and worst-tile memory in a and b, b - a and b / a; the chosen candidates."""
    ops_a = {op["name"]: op for op in a.plan["ops"]}
    ops_b = {op["name"]: op for op in b.plan["ops"]}
    names = list(ops_a) + [n for n in ops_b if n not in ops_a]
    rows = []
    for n in names:
        oa, ob = ops_a.get(n), ops_b.get(n)
        ca = oa["estimate"]["cycles"] if oa else None
        cb = ob["estimate"]["cycles"] if ob else None
        ma = oa["memory"]["total"] if oa else None
        mb = ob["memory"]["total"] if ob else None
        rows.append({"name": n, "kind": (oa or ob)["kind"],
                     "candidate_a": oa["candidate"] if oa else None, "candidate_b": ob["candidate"] if ob else None,
                     "cycles_a": ca, "cycles_b": cb, "cycles_delta": _delta(ca, cb), "cycles_ratio": _ratio(ca, cb),
                     "memory_a": ma, "memory_b": mb, "memory_delta": _delta(ma, mb)})
    return rows


def _program(d) -> dict[str, int]:
    return {s["name"]: s["cycles"] + s["sync"] for s in d.report.get("program_steps", [])}


def _steps(d) -> tuple[str, dict[str, int]]:
    if d.validation is not None:
        return "IPU model run", {s["name"]: s["cycles"] + s["sync"] for s in d.validation["steps"]}
    return "lowered program", _program(d)


def step_rows(a, b) -> tuple[str, list[dict]]:
    """(source, rows): per step name, cycles (incl. sync) in a and b and the delta."""
    src_a, sa = _steps(a)
    src_b, sb = _steps(b)
    source = src_a
    if src_a != src_b:                    # one validated, one not: compare the static counts
        source, sa, sb = "lowered program", _program(a), _program(b)
    names = list(sa) + [n for n in sb if n not in sa]
    return source, [{"name": n, "cycles_a": sa.get(n), "cycles_b": sb.get(n),
                     "cycles_delta": _delta(sa.get(n), sb.get(n))} for n in names]


def totals(a, b) -> dict:
    ta, tb = a.plan["totals"], b.plan["totals"]
    return {"cycles_a": ta["cycles"], "cycles_b": tb["cycles"], "cycles_delta": tb["cycles"] - ta["cycles"],
            "cycles_ratio": _ratio(ta["cycles"], tb["cycles"]),
            "memory_a": ta["total_memory"], "memory_b": tb["total_memory"],
            "memory_delta": tb["total_memory"] - ta["total_memory"]}
