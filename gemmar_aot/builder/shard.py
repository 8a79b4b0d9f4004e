"""``--shard I/N``: a deterministic, cost-balanced share of a plan's distinct specs.

A CI matrix of N jobs each builds one share into a shared remote cache; a final job
with the whole manifest then finds every kernel there and writes the lock. The split:

- Specs the recipe compiles from one builder call (``build_group``, e.g. the SDMA phases
  of one config and rank) stay together, so no builder call runs in two jobs.
- Units are weighed by the compiler's expected cost (a GEMM ~20x a phase kernel, an
  mxfp8 GEMM twice that) and dealt greedily, heaviest first, to the lightest share
  (ties: the lower share); units of equal weight are ordered by spec id.

It depends only on the set of specs, never on their order, the machine or the time, so
every job of a matrix computes the same partition and the shares are disjoint and
cover the plan exactly.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from gemmar_aot.compiler.scheduler import expected_cost
from gemmar_aot.util.errors import GemmarError
from gemmar_aot.model.spec import KernelSpec


class ShardError(GemmarError):
    """A malformed ``--shard`` value."""


def parse_shard(text: str) -> tuple[int, int]:
    """``"I/N"`` (1 <= I <= N) -> (I, N)."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not m:
        raise ShardError(f"--shard {text!r}: expected I/N, e.g. 1/4 (share I of N, counting from 1)")
    i, n = int(m.group(1)), int(m.group(2))
    if n < 1 or not 1 <= i <= n:
        raise ShardError(f"--shard {text!r}: I must be in 1..N and N >= 1 (e.g. 1/4 .. 4/4)")
    return i, n


def partition(specs: Sequence[KernelSpec], count: int) -> list[list[KernelSpec]]:
    """``count`` disjoint shares covering ``specs``, balanced by expected compile cost."""
    from gemmar_aot_kernels import recipe_module

    units: dict[str, list[KernelSpec]] = {}
    for s in sorted(set(specs), key=lambda s: s.spec_id):
        group = recipe_module(s.recipe).build_group(s)
        units.setdefault(f"group:{group}" if group else f"spec:{s.spec_id}", []).append(s)
    order = sorted(units.values(), key=lambda u: (-sum(expected_cost(s) for s in u), u[0].spec_id))
    loads = [0.0] * count
    shares: list[list[KernelSpec]] = [[] for _ in range(count)]
    for unit in order:
        i = min(range(count), key=lambda j: (loads[j], j))
        shares[i].extend(unit)
        loads[i] += sum(expected_cost(s) for s in unit)
    return [sorted(sh, key=lambda s: s.spec_id) for sh in shares]


def select(specs: Sequence[KernelSpec], index: int, count: int) -> list[KernelSpec]:
    """The specs of share ``index`` (1-based) of ``count``, in the plan's order."""
    mine = {s.spec_id for s in partition(specs, count)[index - 1]}
    return [s for s in specs if s.spec_id in mine]
