"""Pins, the vocabulary: a user's choice of a GEMM's grid, parsed from ``--pin OP=grid:...`` or a
``[pin]`` table (the planner applies them: ``planner.pins``, which says what they mean)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from ..errors import TileplanError
from .dtypes import DType

ORDERS = ("bijl", "bilj", "bjli")      # the GEMM grid's tile orders (planner.gemm uses this tuple)
REDUCTIONS = ("gather", "rows")
STORAGES = ("panels", "grid")
EPILOGUE_PARTS = ("bias", "gelu", "fp8")   # what a GEMM's reducers may do after the sum, in this order


def epilogue_name(bias: bool, epilogue) -> str:
    """A pin's ``epilogue``: what a GEMM's reducers do after the sum (``GemmChoice.bias`` and
    ``GemmChoice.epilogue``, a ``planner.gemm.Epilogue`` or None): the bias Add, a GeLU, a Cast to
    FP8, joined by ``+`` in that order, or ``none``."""
    on = (bias, epilogue is not None and bool(epilogue.gelu), epilogue is not None and epilogue.cast)
    return "+".join(name for name, yes in zip(EPILOGUE_PARTS, on) if yes) or "none"


@dataclass(frozen=True)
class Pin:
    op: str
    grid: tuple[int, int, int, int]            # (gb, gm, gn, gk)
    order: str | None = None
    reduction: str | None = None
    partials: DType | None = None
    serial: int | None = None
    storage: str | None = None
    epilogue: str | None = None                # ``epilogue_name``: "none", "bias", "bias+gelu+fp8", ...

    def matches(self, choice) -> bool:
        return ((choice.gb, choice.gm, choice.gn, choice.gk) == self.grid
                and (self.order is None or choice.order == self.order)
                and (self.reduction is None or choice.reduction == self.reduction)
                and (self.partials is None or choice.partials is self.partials)
                and (self.serial is None or choice.sk == self.serial)
                and (self.epilogue is None or epilogue_name(choice.bias, choice.epilogue) == self.epilogue))

    def __str__(self) -> str:
        gb, gm, gn, gk = self.grid
        parts = [f"grid:{f'{gb}x' if gb > 1 else ''}{gm}x{gn}x{gk}"]
        for key, value in (("order", self.order), ("reduction", self.reduction),
                           ("partials", self.partials.value if self.partials else None), ("serial", self.serial),
                           ("storage", self.storage), ("epilogue", self.epilogue)):
            if value is not None:
                parts.append(f"{key}:{value}")
        return ",".join(parts)


def parse_pin(text: str, where: str = "--pin") -> Pin:
    """``OP=grid:2x92x8,order:bjli`` -> ``Pin``; errors name ``where`` and the bad part."""
    if not isinstance(text, str) or "=" not in text:
        raise TileplanError(f"{where}: a pin is OP=grid:GMxGNxGK[,order:...], got {text!r}")
    op, spec = (s.strip() for s in text.split("=", 1))
    return parse_spec(op, spec, where)


def parse_spec(op: str, spec: str, where: str) -> Pin:
    if not op:
        raise TileplanError(f"{where}: a pin needs the op's name before '='")
    fields: dict = {}
    for part in (p.strip() for p in spec.split(",")):
        key, sep, value = part.partition(":")
        if not sep:
            raise TileplanError(f"{where}: pin of {op!r}: {part!r} is not key:value")
        if key in fields:
            raise TileplanError(f"{where}: pin of {op!r}: {key!r} is given twice")
        fields[key] = value.strip()
    if "grid" not in fields:
        raise TileplanError(f"{where}: pin of {op!r}: the grid is missing (grid:GMxGNxGK)")
    try:
        dims = tuple(int(d) for d in fields.pop("grid").lower().split("x"))
    except ValueError:
        dims = ()
    if len(dims) not in (3, 4) or any(d <= 0 for d in dims):
        raise TileplanError(f"{where}: pin of {op!r}: grid must be GMxGNxGK or GBxGMxGNxGK of positive integers")
    grid = dims if len(dims) == 4 else (1,) + dims
    pin = {"op": op, "grid": grid}
    for key, value in fields.items():
        if key == "order":
            if value not in ORDERS:
                raise TileplanError(f"{where}: pin of {op!r}: order must be one of {', '.join(ORDERS)}, got {value!r}")
            pin["order"] = value
        elif key == "reduction":
            if value not in REDUCTIONS:
                raise TileplanError(f"{where}: pin of {op!r}: reduction must be gather or rows, got {value!r}")
            pin["reduction"] = value
        elif key == "partials":
            if value not in ("fp16", "fp32"):
                raise TileplanError(f"{where}: pin of {op!r}: partials must be fp16 or fp32, got {value!r}")
            pin["partials"] = DType(value)
        elif key == "serial":
            if not value.isdigit() or int(value) < 1:
                raise TileplanError(f"{where}: pin of {op!r}: serial must be a positive integer, got {value!r}")
            pin["serial"] = int(value)
        elif key == "storage":
            if value not in STORAGES:
                raise TileplanError(f"{where}: pin of {op!r}: storage must be panels or grid, got {value!r}")
            pin["storage"] = value
        elif key == "epilogue":
            pin["epilogue"] = _epilogue(op, value, where)
        else:
            raise TileplanError(f"{where}: pin of {op!r}: unknown key {key!r} (grid, order, reduction, partials, "
                                "serial, storage, epilogue)")
    if grid[3] == 1 and pin.get("reduction"):
        raise TileplanError(f"{where}: pin of {op!r}: a reduction needs gk > 1 (the grid's last number)")
    if grid[3] == 1 and pin.get("epilogue", "none") != "none":
        raise TileplanError(f"{where}: pin of {op!r}: epilogue:{pin['epilogue']} is done by the reducers, which "
                            "need gk > 1 (the grid's last number)")
    return Pin(**pin)


def _epilogue(op: str, value: str, where: str) -> str:
    """A pin's ``epilogue`` value, checked: ``none``, or parts of ``bias+gelu+fp8`` (each once, in that
    order; a GeLU needs the bias: the fused kernel is reduction + bias-GeLU)."""
    parts = value.split("+")
    if value == "none":
        return value
    if any(p not in EPILOGUE_PARTS for p in parts) or len(set(parts)) != len(parts) \
            or parts != sorted(parts, key=EPILOGUE_PARTS.index):
        raise TileplanError(f"{where}: pin of {op!r}: epilogue must be none or parts of bias+gelu+fp8 in that "
                            f"order, each once, got {value!r}")
    if "gelu" in parts and "bias" not in parts:
        raise TileplanError(f"{where}: pin of {op!r}: epilogue {value!r}: a GeLU in the reduction needs the bias "
                            "too (the fused kernel is reduction + bias-GeLU)")
    return value


def read_pins_file(path: str | Path) -> list[Pin]:
    """The ``[pin]`` table of a TOML file (what ``--emit-pins`` writes)."""
    from ..safeio import LIMITS, read_file
    path = Path(path)
    try:
        doc = tomllib.loads(read_file(path, LIMITS["small_toml"], "pins file").decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise TileplanError(f"{path}: not a TOML file: {e}") from None
    return pins_from_table(doc.get("pin", {}), str(path), strict_keys=set(doc) - {"pin"})


def pins_from_table(table, where: str, strict_keys: set | None = None) -> list[Pin]:
    if strict_keys:
        raise TileplanError(f"{where}: unknown top-level key(s) {sorted(strict_keys)} (a pins file has a [pin] table)")
    if not isinstance(table, dict):
        raise TileplanError(f"{where}: [pin] must be a table of OP = \"grid:...\"")
    out = []
    for op, spec in table.items():
        if not isinstance(spec, str):
            raise TileplanError(f"{where}: [pin] {op!r} must be a string like \"grid:4x92x4\", got {spec!r}")
        out.append(parse_spec(op, spec, f"{where}: [pin]"))
    return out
