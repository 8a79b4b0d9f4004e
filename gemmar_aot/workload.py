"""One validated (M, N, K, world, quant, transport) tuple of a manifest.

This is the boundary between the manifest (which parses and validates) and the
plan (which expands a workload into per-rank kernel specs). Everything here is
already validated against the op's rules (see ``gemmar_aot.rules``).
"""

from __future__ import annotations

from dataclasses import dataclass

#: The modes a manifest can ask for, by the names the upstream spec uses.
#:   fused-sdma  GemmAllReduceOp: GEMM with the scatter fused into its epilogue,
#:               then drain -> reduce -> (fp8 inserts) -> gather.
#:   split-lsa   the unfused baseline: GEMM(fuse=False) -> LSA all-reduce.
#:   gemm-only   Mxfp8GemmOp's GEMM, no collective.
MODES = ("fused-sdma", "split-lsa", "gemm-only")
#: Modes the upstream builders have but this tool does not build yet.
MODES_LATER = ("split-sdma", "fused-lsa")


@dataclass(frozen=True, order=True)
class Workload:
    """A validated manifest tuple. ``m`` is the padded M the kernels are built for."""

    transport: str  # one of MODES
    m: int  # padded M (a multiple of world*block_m for collective modes)
    n: int
    k: int
    world: int
    quant: str  # "blockscale" | "mxfp8"
    gather_dtype: str = "bf16"  # "bf16" | "fp8"   (fused-sdma only)
    gather_transport: str = "lsa"  # "sdma" | "lsa" (fused-sdma only; matters with fp8)
    block_m: int = 128
    block_n: int = 256
    m_max: int | None = None  # padded; None = the group's largest padded M
    sdma_queues: int = 1
    m_requested: int = 0  # the M the manifest wrote, before padding
    source: str = ""  # "path:entry N (line L)", for messages

    @property
    def collective(self) -> bool:
        return self.transport != "gemm-only"

    def group_key(self) -> tuple:
        """Tuples with equal group keys share one window (one op instance)."""
        return (
            self.transport,
            self.n,
            self.k,
            self.world,
            self.quant,
            self.gather_dtype,
            self.gather_transport,
            self.block_m,
            self.block_n,
            self.sdma_queues,
            self.m_max,
        )
