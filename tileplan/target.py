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

from . import checked
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
        for f in fields(self):
            if f.name in _TEXT:
                _text(getattr(self, f.name), f.name)
                continue
            checked.figure(getattr(self, f.name), f"target {self.name!r}: {f.name}",
                           integer=f.name != "clock_hz", zero_ok=f.name in _ZERO_OK,
                           maximum=_MAXIMUM.get(f.name, checked.MAX_FIGURE))
        if self.paired_bytes_per_cycle < self.exchange_bytes_per_cycle:
            raise TileplanError(f"target {self.name!r}: paired_bytes_per_cycle ({self.paired_bytes_per_cycle}) "
                                f"is below exchange_bytes_per_cycle ({self.exchange_bytes_per_cycle})")
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


# Figures and their bounds (``tileplan.checked.figure``): every figure is positive but these, where 0
# means "none" (no interleaved region, no FP8 AMP, no sync cost, free control or launch); tiles,
# clock and workers have tighter limits.
_TEXT = ("name", "family", "description")


def _text(value, field: str) -> str:
    """A target's name, family or description: a string, printable (``checked.name``: no control,
    bidi or other non-printing character; they are printed by ``show`` and ``machines`` and written
    into reports). A description may be empty."""
    if not isinstance(value, str):
        raise TileplanError(f"target {field} must be a string, got {value!r}")
    return value if field == "description" and value == "" else checked.name(value, "target", field)
_ZERO_OK = ("interleaved_bytes", "reserve_bytes", "amp_fp8", "sync_cycles", "send_control_cycles",
            "receive_control_cycles", "local_copy_call_cycles", "kernel_launch_cycles")
_MAXIMUM = {"tiles": 1 << 24, "clock_hz": 1e12, "workers": 1 << 10}

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
            if key in _TEXT:                 # checked here too, where the file that says it is known
                try:
                    _text(value, key)
                except TileplanError as exc:
                    raise exc.with_source(source) from None
            flat[key] = value
        else:
            raise TileplanError(f"unknown target key {key!r}", source=source)
    return flat


def _resolve(spec: str, seen: tuple[str, ...], base_dir: Path | None = None) -> dict:
    path = Path(spec)
    if spec in preset_names():
        path = PRESET_DIR / f"{spec}.toml"
    elif base_dir is not None and not path.is_absolute() and (base_dir / path).is_file():
        path = base_dir / path
    elif not (path.suffix == ".toml" and path.is_file()):
        raise TileplanError(f"unknown target {spec!r}: not a preset ({', '.join(preset_names())}) "
                            "and not a target TOML file")
    key = str(path.resolve())
    if key in seen:
        raise TileplanError(f"target {spec!r} inherits from itself")
    from .safeio import LIMITS, read_file
    try:
        doc = tomllib.loads(read_file(path, LIMITS["small_toml"], "target file").decode())
    except tomllib.TOMLDecodeError as exc:
        raise TileplanError(f"malformed TOML: {exc}", source=str(path)) from None
    except UnicodeDecodeError:
        raise TileplanError("malformed TOML: the file is not UTF-8 text", source=str(path)) from None
    except RecursionError:
        raise TileplanError("malformed TOML: arrays or tables nested too deeply", source=str(path)) from None
    except OSError as exc:
        raise TileplanError(f"cannot read the target file ({exc.strerror or exc})", source=str(path)) from None
    base = {}
    if "inherits" in doc:
        parent = doc["inherits"]
        if not isinstance(parent, str) or not parent:
            raise TileplanError(f"inherits must be a preset name or a target file path, got {parent!r}",
                                source=str(path))
        # A relative path is looked up beside the inheriting file first (presets are names).
        try:
            base = _resolve(parent, seen + (key,), path.parent)
        except TileplanError as exc:
            raise exc.with_source(str(path)) from None
    return {**base, **_flatten(doc, str(path))}


def load_target(spec: "str | Target", base_dir: "str | Path | None" = None) -> Target:
    """A preset name or a target TOML path -> ``Target``. A relative path is looked up in
    ``base_dir`` first (a model file's folder, for the target its ``[model]`` names), then the cwd."""
    if isinstance(spec, Target):
        return spec
    values = _resolve(str(spec), (), Path(base_dir) if base_dir is not None else None)
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
    values["clock_hz"] = checked.figure(values["clock_hz"], f"target {spec!r}: clock_hz", integer=False,
                                        maximum=_MAXIMUM["clock_hz"])
    try:
        return Target(**values)
    except TileplanError as exc:              # name the file: the inherited name may be a preset's
        raise exc.with_source(str(spec)) from None
