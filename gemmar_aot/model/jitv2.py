"""mori's JIT v2 (``libmori_jit.so``) kernels as data: the plans mori makes, the devices whose tables
pick their geometry, and what a lock says of each code object the build made.

mori's EP dispatch/combine v2 with ``kernel_backend="hip"`` (and every internode config: only the
HIP backend has an internode path) renders one C++ translation unit per plan, keys it, compiles
it with ``$MORI_JIT_HIPCC`` (``hipcc --genco``) and publishes it into its cache
(``$MORI_JIT_CACHE_DIR/<arch>_<nic>[_ccqe]/kernel.<plan>.<key>/kernel.hsaco``), at op
construction. The build drives that code on a CPU host (``gemmar_aot_kernels.jitv2``); a pod
seeds mori's cache with verified copies and points ``MORI_JIT_HIPCC`` at a hipcc that compiles
nothing (``gemmar_aot.runtime.jitv2_server``).

mori keys an entry by the first line of ``hipcc --version``: the build and the pod answer it with
:data:`HIPCC_IDENTITY`, a constant, so the cache entry a record names follows from what its key
covers (the rendered text, the flags, the NIC, mori's sources).

A JIT v2 compile imports this module (its key hashes it); the lock's item is
:mod:`gemmar_aot.model.jitv2_lock`'s. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

from gemmar_aot.model.hipcc import NICS

#: The plans mori's EP v2 HIP backend registers (``libmori_ops_v2.so``): intranode and internode.
INTRANODE_PLANS = ("ep_dispatch", "ep_combine")
INTERNODE_PLANS = ("ep_internode_copystaging", "ep_internode_dispatch", "ep_internode_dispatch_ll",
                   "ep_internode_combinesync", "ep_internode_combinesyncbarrier", "ep_internode_combine",
                   "ep_internode_combine_ll", "ep_internode_combineall")
PLANS = INTRANODE_PLANS + INTERNODE_PLANS
#: What ``$MORI_JIT_HIPCC --version`` answers, at the build and in the pod: the first line of it
#: is in mori's cache key. A pod's hipcc of ours compiles nothing.
HIPCC_IDENTITY = "gemmar-aot hipcc: mori JIT v2 kernels built ahead of time (HIP 7.2.4, clang 22); compiles nothing"
def cache_tag(arch: str, nic: str) -> str:
    """mori's cache directory of an arch and NIC variant (``<arch>_<nic>[_ccqe]``)."""
    env_nic, ccqe = NICS[nic]
    return f"{arch}_{env_nic}" + ("_ccqe" if ccqe else "")


@dataclass(frozen=True, order=True)
class JitV2Variant:
    """Where a JIT v2 code object serves: an arch and a NIC variant (``model.hipcc.NICS``)."""

    arch: str
    nic: str

    def describe(self) -> str:
        return f"{self.arch}, NIC {self.nic}"
