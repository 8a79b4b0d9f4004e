"""The runtime's two test doubles: a HIP driver that checks every launch, and a communicator.

``FakeHipDriver`` executes nothing. Every check it makes comes from the code
object it is handed, read by :mod:`note_oracle` (the code object's own metadata
note and dynamic symbol table, read along the loader's path, without
``gemmar_aot``): a module must be an AMDGPU code object for the fake's GPU; a
function must be a kernel of its module with a kernel descriptor symbol; a launch's
argument buffer must be exactly the note's kernarg segment, its block must be the
note's ``reqd_workgroup_size`` (or fit its ``max_flat_workgroup_size``), no
dimension may be zero, and every ``global_buffer`` argument must be a non-null
pointer. The launch is then logged with the argument values decoded at the note's
offsets and, as ``kinds``, the roles its kernel's own name allows (``gemm``,
``reduce``, ...; see :data:`ROLES_BY_NAME`), so a test that asserts a launch order
asserts it about the code objects, not about labels in the lock. Nothing here reads a launch record: grids
and argument values are asserted by the tests from the shapes they chose, and the
parity tier (tests/test_parity.py) holds every launch to mori's own.

``locks``, if given, only bounds what may be *loaded*: the runtime must load
nothing its lock does not name. That checks the runtime against its input; it
vouches for no record.

``FakeCommunicator`` stands in for ``mori.cco.Communicator``: memory is real host
memory (a CPU uint8 tensor per allocation, so the op's window views are real
tensors), every acquisition and release is counted, and any step can be made to
fail, to test rollback. Its device communicators (``create_dev_comm``) carry the
host ``ccoDevComm`` struct mori's internode kernels take by value, and
:func:`fake_cco_modules` stands in for ``mori.cco.cco`` / ``mori.cco.communicator``
where mori makes one itself (``DevCommHandle``), so mori's own checks run against it.
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import re
import struct
import types
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from gemmar_aot.model.lock import Lock
from note_oracle import NoteCodeObject, NoteKernel, read_note

GFX950 = "gfx950:sramecc+:xnack-"

#: The roles a kernel's own name allows (mori's builders name every kernel they emit: the
#: GEMMs by their configuration, the phases by their Python function). ``push`` is one
#: generic kernel (kernels_sdma.py ``_push_kernel``) behind scatter, drain, gather and
#: gather_barrier, so its name allows all four; what tells them apart is their code, which
#: the parity tier compares with mori's. First match wins.
ROLES_BY_NAME = (
    (re.compile(r"^mori_fused_"), {"gemm"}),
    (re.compile(r"^mori_mxfp8_gemv_"), {"gemv"}),
    (re.compile(r"^push_\d+$"), {"scatter", "drain", "gather", "gather_barrier"}),
    (re.compile(r"^sdma_reduce_quant_\d+$"), {"reduce_quant"}),
    (re.compile(r"^sdma_reduce_push_\d+$"), {"reduce_push"}),
    (re.compile(r"^sdma_reduce_\d+$"), {"reduce"}),
    (re.compile(r"^quantize_gather_\d+$"), {"quantize"}),
    (re.compile(r"^dequantize_gather_\d+$"), {"dequantize"}),
    (re.compile(r"^lsa_pull_gather_\d+$"), {"pull"}),
    (re.compile(r"^ar_[12]stage_\d+$"), {"lsa_ar"}),
    # mori's EP dispatch/combine v2 (dispatch_combine_v2/intranode_kernels.py)
    (re.compile(r"^ep_dispatch_\d+$"), {"dispatch", "dispatch_replay"}),
    (re.compile(r"^ep_combine_s?_?\d+$"), {"combine"}),
    (re.compile(r"^local_expert_count_kernel_\d+$"), {"local_expert_count"}),
    (re.compile(r"^convert_disp_\d+$"), {"convert_dispatch"}),
    (re.compile(r"^convert_comb_\d+$"), {"convert_combine"}),
)


def roles_of(kernel_name: str) -> frozenset:
    """The roles ``kernel_name`` allows; empty for a name no mori builder gives (tests/test_fakes.py
    holds every kernel the smoke build compiles to exactly the role its lock entry gives it)."""
    for pattern, roles in ROLES_BY_NAME:
        if pattern.search(kernel_name):
            return frozenset(roles)
    return frozenset()


# ---------------------------------------------------------------------------
# FakeHipDriver
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class FakeModule:
    id: int
    digest: str
    code: NoteCodeObject


@dataclass(frozen=True)
class FakeFunction:
    module: FakeModule
    kernel: NoteKernel


@dataclass
class LaunchLog:
    """One launch as the fake saw it."""

    kernel: str
    digest: str
    kinds: frozenset  # the roles the kernel's own name allows ({"gemm"}, {"reduce"}, push: four)
    grid: tuple
    block: tuple
    args: tuple  # explicit argument values decoded at the metadata's offsets
    stream: int


@dataclass
class FakeHipDriver:
    """A validating, non-executing :class:`gemmar_aot.runtime.Driver` (checks from each code object's note).

    ``locks``: optional; when given, loading a code object no lock entry names is refused.
    """

    locks: list = field(default_factory=list)
    arch: str = GFX950
    stream: int = 0x5EED
    launches: list = field(default_factory=list)
    memsets: list = field(default_factory=list)
    syncs: list = field(default_factory=list)
    loaded: dict = field(default_factory=dict)  # module id -> FakeModule, while loaded
    counters: Counter = field(default_factory=Counter)
    _ids: Any = field(default_factory=lambda: itertools.count(1))

    def __post_init__(self):
        #: blob digests the given locks name (None: no bound)
        self.allowed: set[str] | None = None
        for lock in self.locks:
            if not isinstance(lock, Lock):
                lock = Lock.from_json(lock)
            self.allowed = (self.allowed or set()) | {e.blob.hash for _where, e in lock.iter_launches()}

    # ---- the driver interface ----

    def device_arch(self, device) -> str:
        self.counters["device_arch"] += 1
        return self.arch

    def current_stream(self, device) -> int:
        return self.stream

    def load_module(self, image: bytes) -> FakeModule:
        image = bytes(image)
        code = read_note(image)  # raises on anything that is not a code object
        gfx = self.arch.split(":")[0]
        assert code.target.rsplit("-", 1)[-1].split(":")[0] == gfx, (  # amdgcn-amd-amdhsa-unknown-gfx950[:feat]
            f"code object for {code.target!r} loaded on a {self.arch} device")
        digest = hashlib.sha256(image).hexdigest()
        assert self.allowed is None or digest in self.allowed, f"module {digest[:12]} is not named by any lock entry"
        mod = FakeModule(next(self._ids), digest, code)
        self.loaded[mod.id] = mod
        self.counters["load_module"] += 1
        return mod

    def get_function(self, module: FakeModule, name: str) -> FakeFunction:
        assert module.id in self.loaded, "get_function on a module that is not loaded"
        self.counters["get_function"] += 1
        return FakeFunction(module, module.code.kernel(name))

    def unload_module(self, module: FakeModule) -> None:
        assert module.id in self.loaded, f"module {module.id} unloaded twice (or never loaded)"
        del self.loaded[module.id]
        self.counters["unload_module"] += 1

    def launch(self, function: FakeFunction, grid, block, args, stream: int) -> None:
        assert function.module.id in self.loaded, "launch of a function whose module was unloaded"
        kern = function.kernel
        buf = args.tobytes()
        assert args.size == kern.kernarg_size == len(buf), (
            f"{kern.name}: kernarg buffer is {args.size} bytes, the code object says {kern.kernarg_size}")
        grid, block = tuple(int(x) for x in grid), tuple(int(x) for x in block)
        assert len(grid) == 3 and all(1 <= g < 2**31 for g in grid), f"{kern.name}: grid {grid}"
        assert len(block) == 3 and all(b >= 1 for b in block), f"{kern.name}: block {block}"
        if kern.reqd_workgroup_size is not None:
            assert block == kern.reqd_workgroup_size, (
                f"{kern.name}: block {block}, the code object requires {kern.reqd_workgroup_size}")
        assert block[0] * block[1] * block[2] <= kern.max_flat_workgroup_size, (
            f"{kern.name}: block {block} is over max_flat_workgroup_size {kern.max_flat_workgroup_size}")
        values = []
        for a in kern.explicit_args:
            assert a.offset % a.size == 0, f"{kern.name}: argument at {a.offset} is not {a.size}-aligned"
            assert a.offset % min(a.size, kern.kernarg_align) == 0
            assert a.offset + a.size <= len(buf)
            pointer = a.kind == "global_buffer"
            fmt = {8: "<Q" if pointer else "<q", 4: "<i", 2: "<h", 1: "<b"}[a.size]
            value = struct.unpack_from(fmt, buf, a.offset)[0]
            assert not pointer or value != 0, f"{kern.name}: a null pointer for the argument at offset {a.offset}"
            values.append(value)
        self.counters["launch"] += 1
        self.launches.append(LaunchLog(kern.name, function.module.digest, roles_of(kern.name), grid,
                                       block, tuple(values), stream))

    def memset(self, ptr: int, value: int, nbytes: int) -> None:
        self.memsets.append((ptr, value, nbytes))

    def synchronize(self, stream: int) -> None:
        self.syncs.append(stream)

    # ---- assertions helpers ----

    def launched(self, kind: str | None = None) -> list[LaunchLog]:
        return [l for l in self.launches if kind is None or kind in l.kinds]

    def assert_roles(self, roles: list[str]) -> None:
        """The launches, in order, are kernels whose own names allow these roles."""
        got = [sorted(l.kinds) for l in self.launches]
        assert len(got) == len(roles) and all(r in l.kinds for r, l in zip(roles, self.launches)), (
            f"launched {[l.kernel for l in self.launches]} (roles {got}), expected roles {roles}")

    def clear(self) -> None:
        self.launches.clear()
        self.syncs.clear()


# ---------------------------------------------------------------------------
# FakeCommunicator
# ---------------------------------------------------------------------------


class InjectedFailure(RuntimeError):
    """Raised by FakeCommunicator at the step named in ``fail_at``."""


class _Handle:
    def __init__(self, comm: "FakeCommunicator", kind: str):
        self._comm, self._kind, self.closed = comm, kind, False
        comm.acquired[kind] += 1
        comm.live.append(self)

    def close(self) -> None:
        if self.closed:
            return
        self._comm._step(f"close_{self._kind}")
        self.closed = True
        self._comm.released[self._kind] += 1
        self._comm.live.remove(self)
        self._comm.closed_order.append(self._kind)


class FakeMemory(_Handle):
    def __init__(self, comm, size: int):
        super().__init__(comm, "mem")
        # lazy: pages are never touched (the benchmarks' 700 MiB windows cost nothing)
        self.tensor = (torch.empty if comm.lazy else torch.zeros)(size, dtype=torch.uint8)
        self.ptr, self.size = self.tensor.data_ptr(), size

    def close(self) -> None:
        live_windows = [h for h in self._comm.live if isinstance(h, FakeWindow) and h.mem is self]
        assert not live_windows, "memory freed while a window over it is still registered"
        super().close()


class FakeWindow(_Handle):
    _handles = itertools.count(0x1000)

    def __init__(self, comm, mem: FakeMemory, ptr: int, size: int):
        super().__init__(comm, "window")
        self.mem, self.ptr, self.size, self.handle = mem, ptr, size, next(self._handles)

    @property
    def local_ptr(self) -> int:
        """This rank's address of the window (``mori.cco`` windows carry it; mori's EP arena reads it)."""
        return self.ptr


class FakeDevComm(_Handle):
    """A device communicator: ``ptr`` names its (absent) device copy; ``host_ptr`` is the host
    ``ccoDevComm`` (:data:`DEV_COMM_BYTES` bytes: rank, worldSize, lsaSize, lsaRank, myNodeStart and
    gdaConnType as ``include/mori/cco/cco.hpp`` lays them out, then zeros -- a double has no flat VA,
    windows or QPs), what mori's internode kernels take by value."""

    _ptrs = itertools.count(0xDC000000, 0x1000)

    def __init__(self, comm, reqs):
        super().__init__(comm, "dev_comm")
        self.reqs, self.ptr = reqs, next(self._ptrs)
        self.rank, self.world_size, self.lsa_size = comm.rank, comm.nranks, comm.lsa_size
        self.lsa_rank = comm.rank % comm.lsa_size
        self.host = ctypes.create_string_buffer(DEV_COMM_BYTES)
        gda = getattr(reqs, "gda_connection_type", 0)  # cco's code, or gemmar-aot's name ("none")
        gda = gda if isinstance(gda, int) else FAKE_GDA_CONNECTIONS.get(f"GDA_CONNECTION_{str(gda).upper()}", 0)
        struct.pack_into("<6i", self.host, 0, self.rank, self.world_size, self.lsa_size, self.lsa_rank,
                         self.rank - self.lsa_rank, gda)
        self.host_ptr = ctypes.addressof(self.host)


#: ``sizeof(ccoDevComm)``: the ``devComm:b200`` field of mori's internode argument schema.
DEV_COMM_BYTES = 200


class FakeCommunicator:
    """Host-memory stand-in for ``mori.cco.Communicator`` (one rank).

    ``fail_at``: step names that raise :class:`InjectedFailure` ("alloc_mem",
    "register_window", "create_dev_comm", "barrier", "close_mem", ...).
    ``lazy``: allocate without zeroing (for benchmarks; the op zeroes through the driver).
    ``lsa_size``: ranks per node, what cco's device communicator reports (default: all of them).
    """

    def __init__(self, rank: int = 0, nranks: int = 2, device: str = "cpu", fail_at=(), lazy: bool = False,
                 lsa_size: int | None = None):
        self.rank, self.nranks, self.device = rank, nranks, torch.device(device)
        self.lsa_size = lsa_size or nranks  # ranks on this rank's node (cco's LSA team)
        self.lazy = lazy
        self.fail_at = set(fail_at)
        self.acquired: Counter = Counter()
        self.released: Counter = Counter()
        self.live: list[_Handle] = []
        self.closed_order: list[str] = []
        self.barriers = 0
        self.dev_comm_requests: list = []

    def _step(self, name: str) -> None:
        if name in self.fail_at:
            raise InjectedFailure(f"injected failure at {name}")

    def alloc_mem(self, size: int) -> FakeMemory:
        self._step("alloc_mem")
        return FakeMemory(self, size)

    def register_window(self, ptr: int, size: int) -> FakeWindow:
        self._step("register_window")
        mem = self._owner(ptr, size)
        return FakeWindow(self, mem, ptr, size)

    def create_dev_comm(self, reqs) -> FakeDevComm:
        self._step("create_dev_comm")
        self.dev_comm_requests.append(reqs)
        return FakeDevComm(self, reqs)

    def barrier(self) -> None:
        self._step("barrier")
        self.barriers += 1

    def _owner(self, ptr: int, nbytes: int) -> FakeMemory:
        for h in self.live:
            if isinstance(h, FakeMemory) and h.ptr <= ptr and ptr + nbytes <= h.ptr + h.size:
                return h
        raise AssertionError(f"[{ptr:#x}, +{nbytes}) is not inside any live allocation of this communicator")

    def tensor_at(self, ptr: int, shape, dtype):
        """A view of live memory (what the runtime's ``memory.tensor_at`` asks a communicator for)."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        nbytes = itemsize
        for s in shape:
            nbytes *= s
        mem = self._owner(ptr, nbytes)
        off = ptr - mem.ptr
        assert off % itemsize == 0, f"view at offset {off} is not {itemsize}-aligned"
        return mem.tensor[off:off + nbytes].view(dtype).view(tuple(shape))

    @property
    def live_counts(self) -> Counter:
        return Counter(h._kind for h in self.live)


# ---------------------------------------------------------------------------
# mori.cco's Python surface, for code of mori's that makes its own device communicator
# ---------------------------------------------------------------------------


class FakeDevCommRequirements:
    """Stands in for ``mori.cco.cco.DevCommRequirements`` (its defaults: CROSSNODE, 4 contexts)."""

    def __init__(self):
        self.gda_connection_type = FAKE_GDA_CONNECTIONS["GDA_CONNECTION_CROSSNODE"]
        self.gda_context_count = 4
        self.gda_signal_count = 16
        self.gda_counter_count = 16


#: ``ccoGdaConnectionType`` (include/mori/cco/cco.hpp).
FAKE_GDA_CONNECTIONS = {"GDA_CONNECTION_NONE": 0, "GDA_CONNECTION_FULL": 1, "GDA_CONNECTION_CROSSNODE": 2,
                        "GDA_CONNECTION_RAIL": 3}


class FakeDevCommHandle:
    """Stands in for ``mori.cco.communicator.DevCommHandle``: a device communicator of ``comm``
    (a :class:`FakeCommunicator`), released by ``close``."""

    def __init__(self, comm: FakeCommunicator, requirements=None):
        self._comm = comm
        self._dev_comm = comm.create_dev_comm(requirements or FakeDevCommRequirements())

    ptr = property(lambda self: self._dev_comm.ptr)
    rank = property(lambda self: self._dev_comm.rank)
    world_size = property(lambda self: self._dev_comm.world_size)
    lsa_size = property(lambda self: self._dev_comm.lsa_size)
    lsa_rank = property(lambda self: self._dev_comm.lsa_rank)

    def close(self) -> None:
        self._dev_comm.close()


def fake_cco_modules() -> dict[str, types.ModuleType]:
    """``mori.cco``, ``mori.cco.cco`` and ``mori.cco.communicator`` as this double (for
    ``sys.modules``): mori's cco is a native extension over RDMA NICs and ROCm, none of which a
    CPU host has."""
    cco = types.ModuleType("mori.cco.cco")
    cco.DevCommRequirements = FakeDevCommRequirements
    for name, value in FAKE_GDA_CONNECTIONS.items():
        setattr(cco, name, value)
    communicator = types.ModuleType("mori.cco.communicator")
    communicator.DevCommHandle = FakeDevCommHandle
    pkg = types.ModuleType("mori.cco")
    pkg.__path__ = []
    pkg.cco, pkg.communicator = cco, communicator
    return {"mori.cco": pkg, "mori.cco.cco": cco, "mori.cco.communicator": communicator}
