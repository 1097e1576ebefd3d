"""The machine model: a frozen ``Target`` loaded from TOML.

Presets live in ``tileplan/targets/*.toml`` (``ipu2``, ``bow``, ``ipu21``,
``ipu21-64``); every figure there carries a comment naming its public source. A
target file may ``inherits = "<preset or path>"`` and override any field, so a
user's own target (``--target my.toml``) works the same way as a preset.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

from .errors import TileplanError
from .graph.dtypes import DType

PRESET_DIR = Path(__file__).parent / "targets"


@dataclass(frozen=True)
class Target:
    name: str
    family: str                      # kernel registry key: "ipu2" or "ipu21"
    description: str
    tiles: int
    sram_bytes: int
    standard_bytes: int
    interleaved_bytes: int
    reserve_bytes: int
    clock_hz: float
    workers: int
    alignment: int
    amp_fp32: int                    # AMP FLOP per tile per cycle, by operand type
    amp_fp16: int
    amp_fp16_fp32: int               # FP16 operands, FP32 partials
    amp_fp8: int                     # 0: no FP8 AMP
    grain_fp32: int
    grain_fp16: int
    grain_fp8: int
    exchange_bytes_per_cycle: int
    paired_bytes_per_cycle: int
    sync_cycles: int
    send_control_cycles: int
    receive_control_cycles: int
    local_copy_bytes_per_cycle: int
    local_copy_call_cycles: int
    kernel_launch_cycles: int

    def __post_init__(self):
        if self.tiles <= 0:
            raise TileplanError(f"target {self.name!r}: tiles must be positive, got {self.tiles}")
        if self.standard_bytes + self.interleaved_bytes != self.sram_bytes:
            raise TileplanError(f"target {self.name!r}: standard_bytes + interleaved_bytes "
                                f"({self.standard_bytes} + {self.interleaved_bytes}) != sram_bytes ({self.sram_bytes})")
        if not 0 <= self.reserve_bytes < self.standard_bytes:
            raise TileplanError(f"target {self.name!r}: reserve_bytes {self.reserve_bytes} must fit the standard region")
        if self.alignment <= 0 or self.alignment & (self.alignment - 1):
            raise TileplanError(f"target {self.name!r}: alignment must be a power of two")

    # ---- derived figures -----------------------------------------------------

    @property
    def usable_standard_bytes(self) -> int:
        return self.standard_bytes - self.reserve_bytes

    @property
    def usable_bytes(self) -> int:
        """Per-tile bytes available to tensors (both regions, less the reserve)."""
        return self.sram_bytes - self.reserve_bytes

    def amp_flops(self, dtype: DType, partials: DType | None = None) -> int:
        """AMP peak FLOP per tile per cycle for operands of ``dtype``."""
        if dtype is DType.FP16 and partials is DType.FP32:
            return self.amp_fp16_fp32
        return {DType.FP32: self.amp_fp32, DType.FP16: self.amp_fp16, DType.FP8: self.amp_fp8}[dtype]

    def grain(self, dtype: DType) -> int:
        return {DType.FP32: self.grain_fp32, DType.FP16: self.grain_fp16, DType.FP8: self.grain_fp8}[dtype]

    def supports(self, dtype: DType) -> bool:
        return self.amp_flops(dtype) > 0

    def peak_tflops(self, dtype: DType) -> float:
        return self.tiles * self.amp_flops(dtype) * self.clock_hz / 1e12

    def with_tiles(self, tiles: int) -> "Target":
        from dataclasses import replace
        return replace(self, tiles=tiles, name=f"{self.name}@{tiles}")


# TOML key (section, key) -> field name.
_SECTIONS = {
    "amp": {"fp32": "amp_fp32", "fp16": "amp_fp16", "fp16_fp32": "amp_fp16_fp32", "fp8": "amp_fp8",
            "grain_fp32": "grain_fp32", "grain_fp16": "grain_fp16", "grain_fp8": "grain_fp8"},
    "exchange": {"bytes_per_cycle": "exchange_bytes_per_cycle", "paired_bytes_per_cycle": "paired_bytes_per_cycle",
                 "sync_cycles": "sync_cycles", "send_control_cycles": "send_control_cycles",
                 "receive_control_cycles": "receive_control_cycles"},
    "compute": {"local_copy_bytes_per_cycle": "local_copy_bytes_per_cycle",
                "local_copy_call_cycles": "local_copy_call_cycles",
                "kernel_launch_cycles": "kernel_launch_cycles"},
}
_FIELDS = {f.name: f for f in fields(Target)}


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


def _flatten(doc: dict, source: str) -> dict:
    flat = {}
    for key, value in doc.items():
        if key in _SECTIONS:
            if not isinstance(value, dict):
                raise TileplanError(f"[{key}] must be a table", source=source)
            for k, v in value.items():
                if k not in _SECTIONS[key]:
                    raise TileplanError(f"unknown key {k!r} in [{key}] (known: {', '.join(_SECTIONS[key])})",
                                        source=source)
                flat[_SECTIONS[key][k]] = v
        elif key == "inherits":
            continue
        elif key in _FIELDS:
            flat[key] = value
        else:
            raise TileplanError(f"unknown target key {key!r}", source=source)
    return flat


def _resolve(spec: str, seen: tuple[str, ...]) -> dict:
    path = Path(spec)
    if spec in preset_names():
        path = PRESET_DIR / f"{spec}.toml"
    elif not (path.suffix == ".toml" and path.is_file()):
        raise TileplanError(f"unknown target {spec!r}: not a preset ({', '.join(preset_names())}) "
                            "and not a target TOML file")
    key = str(path.resolve())
    if key in seen:
        raise TileplanError(f"target {spec!r} inherits from itself")
    try:
        doc = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise TileplanError(f"malformed TOML: {exc}", source=str(path)) from None
    base = {}
    if "inherits" in doc:
        parent = doc["inherits"]
        if not isinstance(parent, str) or not parent:
            raise TileplanError(f"inherits must be a preset name or a target file path, got {parent!r}",
                                source=str(path))
        # A relative path is looked up beside the inheriting file first (presets are names).
        if parent not in preset_names() and (path.parent / parent).is_file():
            parent = str(path.parent / parent)
        try:
            base = _resolve(parent, seen + (key,))
        except TileplanError as exc:
            raise exc.with_source(str(path)) from None
    return {**base, **_flatten(doc, str(path))}


def load_target(spec: "str | Target") -> Target:
    """A preset name or a target TOML path -> ``Target``."""
    if isinstance(spec, Target):
        return spec
    values = _resolve(str(spec), ())
    missing = sorted(set(_FIELDS) - set(values))
    if missing:
        raise TileplanError(f"target {spec!r} is missing {', '.join(missing)} "
                            f"(start it with inherits = \"<preset>\" to take the rest from a preset)")
    for name, v in values.items():
        want = _FIELDS[name].type
        if want in ("int", int) and not (isinstance(v, int) and not isinstance(v, bool)):
            raise TileplanError(f"target {spec!r}: {name} must be an integer, got {v!r}")
        if want in ("float", float) and not isinstance(v, (int, float)):
            raise TileplanError(f"target {spec!r}: {name} must be a number, got {v!r}")
    values["clock_hz"] = float(values["clock_hz"])
    try:
        return Target(**values)
    except TileplanError as exc:              # name the file: the inherited name may be a preset's
        raise exc.with_source(str(spec)) from None
