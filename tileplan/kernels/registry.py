"""The kernel registry: variants keyed by (primitive, target family), and dispatch.

A ``Variant`` is one implementation of a primitive on one or more target
families: named predicates say when it applies, ``cycles`` prices a call,
``reference`` is its numpy semantics and ``codelet`` its Poplar C++ source.

``Registry.dispatch(call, target)`` tests every variant of ``(call.primitive,
target.family)`` (each up to its first failing predicate), then takes the accepted variant with the
fewest cycles (higher ``priority`` breaks ties, then the name), or the variant
the caller forces. When nothing fits, ``NoVariantError`` lists every variant,
one per line, with all of its rejection reasons.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, NamedTuple

import numpy as np

from ..errors import TileplanError
from ..target import Target
from .codelets import CodeletSource


class Predicate(NamedTuple):
    """A named applicability test; ``reason`` says what must hold (e.g. ``"k % 8 == 0"``)."""

    reason: str
    test: Callable[[Any, Target], bool]

    def __call__(self, call: Any, target: Target) -> bool:
        return bool(self.test(call, target))


@dataclass(frozen=True)
class Variant:
    name: str
    primitive: str
    families: tuple[str, ...]
    priority: int
    predicates: tuple[Predicate, ...]
    cycles_fn: Callable[[Any, Target], int] = field(repr=False)
    reference_fn: Callable[..., np.ndarray] = field(repr=False)
    codelet_fn: Callable[[Any, "Variant"], CodeletSource] = field(repr=False)
    doc: str = ""

    def rejections(self, call: Any, target: Target) -> list[str]:
        """The reasons of every predicate that fails (empty: the variant accepts)."""
        return [p.reason for p in self.predicates if not p(call, target)]

    def accepts(self, call: Any, target: Target) -> bool:
        """Every predicate holds (stops at the first that fails: no reasons are gathered)."""
        return all(p(call, target) for p in self.predicates)

    def cycles(self, call: Any, target: Target) -> int:
        return int(self.cycles_fn(call, target))

    def reference(self, call: Any, *inputs: np.ndarray) -> np.ndarray:
        return self.reference_fn(call, *inputs)

    def codelet(self, call: Any) -> CodeletSource:
        return self.codelet_fn(call, self)

    def __str__(self) -> str:
        return f"{self.name} ({self.primitive} on {'/'.join(self.families)}, priority {self.priority})"


class NoVariantError(TileplanError):
    """No registered variant accepts a call; the message has one line per variant."""

    def __init__(self, call: Any, target: Target, rejected: list[tuple[Variant, list[str]]]):
        self.call = call
        self.target = target
        self.rejected = rejected
        if rejected:
            rows = "\n".join(f"  {v.name}: {'; '.join(reasons)}" for v, reasons in rejected)
        else:
            rows = "  (no variants registered)"
        super().__init__(f"no {call.primitive} kernel for {call} on {target.name} "
                         f"(family {target.family}):\n{rows}")


class Registry:
    """Variants by (primitive, family); names are unique across the registry."""

    def __init__(self, variants: Iterable[Variant] = ()):
        self._variants: dict[str, Variant] = {}
        self._by_key: dict[tuple[str, str], list[Variant]] = {}    # variants(): kept until a register
        for v in variants:
            self.register(v)

    def register(self, variant: Variant) -> Variant:
        if variant.name in self._variants:
            raise KeyError(f"kernel variant {variant.name!r} is already registered")
        if not variant.families:
            raise ValueError(f"kernel variant {variant.name!r} lists no target family")
        self._variants[variant.name] = variant
        self._by_key.clear()
        return variant

    def __contains__(self, name: str) -> bool:
        return name in self._variants

    def __getitem__(self, name: str) -> Variant:
        try:
            return self._variants[name]
        except KeyError:
            raise KeyError(f"no kernel variant {name!r} (known: {', '.join(sorted(self._variants))})") from None

    def __iter__(self):
        return iter(self._variants.values())

    def __len__(self) -> int:
        return len(self._variants)

    def copy(self) -> "Registry":
        return Registry(self._variants.values())

    def without(self, *names: str) -> "Registry":
        """A copy lacking the named variants or every variant of the named primitives."""
        unknown = [n for n in names if n not in self._variants and not any(v.primitive == n for v in self)]
        if unknown:
            raise KeyError(f"nothing to remove: {', '.join(unknown)} is neither a variant nor a primitive")
        return Registry(v for v in self if v.name not in names and v.primitive not in names)

    def variants(self, primitive: str, family: str) -> list[Variant]:
        got = self._by_key.get((primitive, family))
        if got is None:
            got = self._by_key[(primitive, family)] = [v for v in self if v.primitive == primitive
                                                       and family in v.families]
        return list(got)

    def candidates(self, call: Any, target: Target) -> list[tuple[Variant, list[str]]]:
        """Every variant for the call's primitive and the target's family, with its
        rejection reasons (all predicates evaluated)."""
        return [(v, v.rejections(call, target)) for v in self.variants(call.primitive, target.family)]

    def dispatch(self, call: Any, target: Target, force: str | None = None) -> Variant:
        if force is None:
            # The accepted variants, each test stopping at its first failing predicate; the reasons
            # of every rejection are gathered only for the error when none accepts.
            accepted = [v for v in self.variants(call.primitive, target.family) if v.accepts(call, target)]
            if not accepted:
                raise NoVariantError(call, target, self.candidates(call, target))
            return min(accepted, key=lambda v: (v.cycles(call, target), -v.priority, v.name))
        found = self.candidates(call, target)
        for v, reasons in found:
            if v.name == force:
                if reasons:
                    raise TileplanError(f"forced kernel {force!r} does not accept {call} on {target.name}: "
                                        f"{'; '.join(reasons)}")
                return v
        known = ", ".join(v.name for v, _ in found) or "none"
        raise TileplanError(f"forced kernel {force!r} is not a {call.primitive} variant for family "
                            f"{target.family} (known: {known})")


# ---- the table's vocabulary (every kernel module's variant rows use it) -------------------------

BOTH = ("ipu2", "ipu21")          # the target families every kernel here runs on
SPECIAL, FALLBACK = 10, 0         # priorities: a specialised kernel, a general fallback (ties on cycles only)


def is_(field: str, value) -> Predicate:
    return Predicate(f"{field} is {value}", lambda c, t: getattr(c, field) == value)


def in_(field: str, values: tuple) -> Predicate:
    return Predicate(f"{field} is {' or '.join(map(str, values))}", lambda c, t: getattr(c, field) in values)
