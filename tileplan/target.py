"""The machine model: a frozen ``Target`` loaded from TOML.

Presets live in ``tileplan/targets/*.toml`` (``ipu2``, ``bow``, ``ipu21``,
``ipu21-64``, and the multi-IPU ``ipu21x2``, ``ipu21x4``, ``ipu2x4``); every figure
there carries a comment naming its public source. A target file may
``inherits = "<preset or path>"`` and override any field, so a user's own target
(``--target my.toml``) works the same way as a preset.

Several IPUs: ``tiles`` is the tile count of the whole device and ``ipus`` the
number of IPUs it spans; IPU i holds tiles ``[i * tiles_per_ipu, (i + 1) *
tiles_per_ipu)``, as Poplar numbers the tiles of a multi-IPU target. The link
figures (``[link]`` in TOML) are read only when ``ipus > 1``.

Design decision: ``link_bytes_per_cycle`` is the bandwidth of the connection between
two directly linked IPUs, in one direction, in bytes per tile clock cycle (the
aggregate of the IPU-Links that join the pair), not a per-tile figure: the public
sources give link bandwidth per IPU-Link and per IPU, and the links, not the tiles'
exchange ports, are the bottleneck (one IPU's 1472 tiles send 5,888 B/cycle; its
IPU-Links carry a few tens).
"""

from __future__ import annotations

import tomllib
from dataclasses import MISSING, dataclass, fields
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
    # Several IPUs (read only when ipus > 1); defaults describe one IPU.
    ipus: int = 1                    # IPUs the tiles span, tiles_per_ipu = tiles / ipus each
    link_bytes_per_cycle: int = 0    # one direction between two directly linked IPUs, B/cycle
    link_latency_cycles: int = 0     # added once per hop of the longest route in a phase
    topology: str = "all-to-all"     # "all-to-all" (a direct connection per pair) or "ring"
    sync_cycles_multi: int = 0       # a sync spanning IPUs (an exchange with a cross-IPU transfer)

    def __post_init__(self):
        for f in fields(self):
            if f.name == "topology":
                if self.topology not in TOPOLOGIES:
                    raise TileplanError(f"target {self.name!r}: topology must be one of "
                                        f"{', '.join(TOPOLOGIES)}, got {self.topology!r}")
                continue
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
        if self.tiles % self.ipus:
            raise TileplanError(f"target {self.name!r}: tiles ({self.tiles}) is not a multiple of ipus ({self.ipus})")
        if self.ipus > 1:
            if self.link_bytes_per_cycle <= 0:
                raise TileplanError(f"target {self.name!r}: a target of {self.ipus} IPUs needs "
                                    "link_bytes_per_cycle > 0 ([link] bytes_per_cycle)")
            if self.sync_cycles_multi < self.sync_cycles:
                raise TileplanError(f"target {self.name!r}: sync_cycles_multi ({self.sync_cycles_multi}) is below "
                                    f"sync_cycles ({self.sync_cycles}): a sync spanning IPUs costs at least one "
                                    "within an IPU")

    # ---- derived figures -----------------------------------------------------

    @property
    def tiles_per_ipu(self) -> int:
        return self.tiles // self.ipus

    @property
    def usable_standard_bytes(self) -> int:
        return self.standard_bytes - self.reserve_bytes

    @property
    def usable_bytes(self) -> int:
        """Per-tile bytes available to tensors (both regions, less the reserve)."""
        return self.sram_bytes - self.reserve_bytes

    def document(self) -> dict:
        """The target as a JSON document (a package's target.json, the plan cache's key). Design
        decision: a one-IPU target leaves the multi-IPU figures out, so its documents and keys are
        the ones a target without those fields always had."""
        from dataclasses import asdict
        doc = asdict(self)
        if self.ipus == 1:
            for name in OPTIONAL_FIELDS:
                del doc[name]
        return doc

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
        """The target cut to its first ``tiles`` tiles: a cut within one IPU is a one-IPU target, a
        cut of whole IPUs keeps those IPUs; a cut through an IPU past the first is refused (IPUs of
        one target have equal tile counts)."""
        from dataclasses import replace
        per = self.tiles_per_ipu
        if tiles <= per:
            ipus = 1
        elif tiles % per == 0:
            ipus = tiles // per
        else:
            raise TileplanError(f"target {self.name!r}: {tiles} tiles is not a whole number of its "
                                f"{per}-tile IPUs")
        return replace(self, tiles=tiles, name=f"{self.name}@{tiles}", ipus=ipus)


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
            "receive_control_cycles", "local_copy_call_cycles", "kernel_launch_cycles",
            "link_bytes_per_cycle", "link_latency_cycles", "sync_cycles_multi")
_MAXIMUM = {"tiles": 1 << 24, "clock_hz": 1e12, "workers": 1 << 10, "ipus": 1 << 10}
TOPOLOGIES = ("all-to-all", "ring")

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
    "link": {"bytes_per_cycle": "link_bytes_per_cycle", "latency_cycles": "link_latency_cycles",
             "topology": "topology", "sync_cycles": "sync_cycles_multi"},
}
_FIELDS = {f.name: f for f in fields(Target)}
_DEFAULTS = {f.name for f in fields(Target) if f.default is not MISSING}
OPTIONAL_FIELDS = frozenset(_DEFAULTS)     # a document or file may leave them out (one IPU)


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
    missing = sorted(set(_FIELDS) - set(values) - set(_DEFAULTS))
    if missing:
        raise TileplanError(f"target {spec!r} is missing {', '.join(missing)} "
                            f"(start it with inherits = \"<preset>\" to take the rest from a preset)")
    for name, v in values.items():
        want = _FIELDS[name].type
        if want in ("int", int) and not (isinstance(v, int) and not isinstance(v, bool)):
            raise TileplanError(f"target {spec!r}: {name} must be an integer, got {v!r}")
        if want in ("float", float) and not isinstance(v, (int, float)):
            raise TileplanError(f"target {spec!r}: {name} must be a number, got {v!r}")
        if want in ("str", str) and not isinstance(v, str):
            raise TileplanError(f"target {spec!r}: {name} must be a string, got {v!r}")
    values["clock_hz"] = checked.figure(values["clock_hz"], f"target {spec!r}: clock_hz", integer=False,
                                        maximum=_MAXIMUM["clock_hz"])
    try:
        return Target(**values)
    except TileplanError as exc:              # name the file: the inherited name may be a preset's
        raise exc.with_source(str(spec)) from None
