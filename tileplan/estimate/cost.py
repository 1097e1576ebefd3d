"""``Estimate``: the one cost value type, composed with ``+``.

Cycles are split by superstep phase (compute, exchange, sync). Memory is the
worst tile's peak per class (standard, interleaved, total); composing two
fragments that run one after the other keeps the larger peak, adds cycles and
adds bytes moved. ``Estimate`` is what a candidate carries through the
planner, into plan.json and into the report.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Estimate:
    compute: int = 0           # cycles in compute sets (slowest tile of each)
    exchange: int = 0          # cycles in exchange phases (slowest tile of each)
    sync: int = 0              # cycles of global syncs, one per exchange phase
    standard: int = 0          # peak bytes in the standard region, worst tile
    interleaved: int = 0       # peak bytes in the interleaved region, worst tile
    total_memory: int = 0      # peak bytes over both regions, worst tile
    bytes_moved: int = 0       # bytes sent over the exchange (multicast counted once per receiver)

    @property
    def cycles(self) -> int:
        return self.compute + self.exchange + self.sync

    def __add__(self, other: "Estimate") -> "Estimate":
        return Estimate(
            compute=self.compute + other.compute,
            exchange=self.exchange + other.exchange,
            sync=self.sync + other.sync,
            standard=max(self.standard, other.standard),
            interleaved=max(self.interleaved, other.interleaved),
            total_memory=max(self.total_memory, other.total_memory),
            bytes_moved=self.bytes_moved + other.bytes_moved,
        )

    def as_dict(self) -> dict:
        d = asdict(self)
        d["cycles"] = self.cycles
        return d

    def __str__(self) -> str:
        return (f"{self.cycles:,} cyc (compute {self.compute:,}, exchange {self.exchange:,}, "
                f"sync {self.sync:,}); peak {self.total_memory:,} B")
