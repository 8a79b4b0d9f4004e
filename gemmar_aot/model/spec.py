"""A kernel spec: everything one compile reads, and nothing else.

A spec is what the plan produces and the compiler consumes. Two specs with equal
``spec_id`` compile to the same bytes with the same toolchain: the plan relies on
that to deduplicate, and the store (with the toolchain fingerprint added) to key.
So ``params`` must hold every value the recipe passes to a builder or puts in the
environment -- and it holds them explicitly, defaults included, so a change of an
upstream default cannot hide behind an unchanged spec (the generator-source digest
in the key covers the rest).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

from gemmar_aot.util.filedigest import sha256_hex

#: Bump when the meaning of a spec's fields changes (it is part of every key).
SPEC_SCHEMA = 1

Scalar = int | str | bool | None


def canonical_json(obj: Any) -> str:
    """The one JSON encoding used for hashing: sorted keys, no spaces, ASCII."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _freeze(params: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    out = []
    for k in sorted(params):
        v = params[k]
        if isinstance(v, Mapping):
            v = _freeze(v)
        elif isinstance(v, list):
            v = tuple(v)
        elif not isinstance(v, (int, str, bool, type(None), tuple)):
            raise TypeError(f"spec param {k}={v!r} is not a JSON scalar; specs hold plain values only")
        out.append((k, v))
    return tuple(out)


def _thaw(v: Any) -> Any:
    if isinstance(v, tuple) and v and all(isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) for x in v):
        return {k: _thaw(x) for k, x in v}
    if isinstance(v, tuple):
        return [_thaw(x) for x in v]
    return v


@dataclass(frozen=True, order=True)
class KernelSpec:
    """One kernel to compile.

    ``recipe`` names the module in ``kernels/`` that maps the spec to builder
    calls; ``kind`` is the kernel's role in the mode's sequence ("gemm", "drain",
    "reduce", ...). ``params`` holds every builder argument and compile-relevant
    environment value, as nested sorted tuples so the spec is hashable.
    """

    recipe: str
    kind: str
    rank: int
    params: tuple[tuple[str, Any], ...]

    @classmethod
    def make(cls, recipe: str, kind: str, rank: int, params: Mapping[str, Any]) -> "KernelSpec":
        return cls(recipe=recipe, kind=kind, rank=rank, params=_freeze(params))

    def param_dict(self) -> dict[str, Any]:
        return {k: _thaw(v) for k, v in self.params}

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SPEC_SCHEMA,
            "recipe": self.recipe,
            "kind": self.kind,
            "rank": self.rank,
            "params": self.param_dict(),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "KernelSpec":
        if d.get("schema") != SPEC_SCHEMA:
            raise ValueError(f"spec schema {d.get('schema')!r} is not {SPEC_SCHEMA}")
        return cls.make(d["recipe"], d["kind"], d["rank"], d["params"])

    @property
    def spec_id(self) -> str:
        """sha256 of the canonical encoding; stable across processes and machines."""
        return sha256_hex(canonical_json(self.to_json()).encode())

    def label(self) -> str:
        p = self.param_dict()
        cfg = p.get("cfg") if isinstance(p.get("cfg"), dict) else {}
        # A canonical (shape-free) config has no capacity: its M means nothing.
        m = cfg.get("m_pad") if cfg.get("capacity_m") else None
        bits = [self.recipe, self.kind, f"r{self.rank}"]
        if m:
            bits.append(f"m{m}")
        if "K" in p:
            bits.append(f"k{p['K']}")
        return ":".join(bits)
