"""One validated (M, N, K, world, quant, transport) tuple of a manifest.

This is the boundary between the manifest (which parses and validates) and the
plan (which expands a workload into per-rank kernel specs). Everything here is
already validated against the op's rules (see ``gemmar_aot.model.rules``).
"""

from __future__ import annotations

from dataclasses import dataclass

# The modes are defined with the artifact model (a lock names a tuple's mode, and the
# runtime reads locks without the build side); see TRANSPORTS there for what each does.
from gemmar_aot.model.types import COLLECTIVE_MODES, TRANSPORTS, TupleId, first_of_each

#: The modes a manifest can ask for.
MODES = TRANSPORTS

__all__ = ["COLLECTIVE_MODES", "MODES", "Workload", "dedup_workloads"]


@dataclass(frozen=True, order=True)
class Workload:
    """A validated manifest tuple. ``m`` is the padded M the kernels are built for.

    For ``gemv`` the padded M is the M bucket whose kernel serves it; block_m and
    block_n are recorded at their mxfp8 values and unused (the skinny kernel has its
    own tiling), as world is for both collective-free modes.
    """

    transport: str  # one of MODES
    m: int  # padded M (a multiple of world*block_m for collective modes)
    n: int
    k: int
    world: int
    quant: str  # "blockscale" | "mxfp8"
    gather_dtype: str = "bf16"  # "bf16" | "fp8"   (collective modes)
    gather_transport: str = "lsa"  # "sdma" | "lsa" (collective modes; matters with fp8)
    block_m: int = 128
    block_n: int = 256
    m_max: int | None = None  # padded; None = the group's largest padded M
    sdma_queues: int = 1
    m_requested: int = 0  # the M the manifest wrote, before padding
    source: str = ""  # "path:entry N (line L)", for messages

    def identity(self) -> TupleId:
        """What makes this tuple one build (not where or how the manifest wrote it)."""
        return TupleId(self.transport, self.m, self.n, self.k, self.world, self.quant, self.gather_dtype,
                       self.gather_transport, self.block_m, self.block_n, self.sdma_queues, self.m_max)

    @property
    def collective(self) -> bool:
        return self.transport in COLLECTIVE_MODES

    def group_key(self) -> tuple:
        """Tuples with equal group keys share one window (one op instance)."""
        return self.identity().group_key()


def dedup_workloads(workloads) -> tuple[list[Workload], list[tuple[Workload, Workload]]]:
    """Workloads with distinct identities (the first of each), and every (first, repeat) pair."""
    return first_of_each(workloads, Workload.identity)
