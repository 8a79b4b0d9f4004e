"""The runtime's two test doubles: a HIP driver that checks every launch, and a communicator.

``FakeHipDriver`` executes nothing. It is an independent check of what the op
hands to HIP: it parses every module it is given with
:func:`gemmar_aot.codeobject.parse_code_object` and, at every launch, decodes the
argument buffer at the offsets the code object's own metadata note gives, then
checks grid, block and every argument against the launch record FlyDSL produced
(taken from the lock file, by the code object's sha256 -- never from the op).

``FakeCommunicator`` stands in for ``mori.cco.Communicator``: memory is real host
memory (a CPU uint8 tensor per allocation, so the op's window views are real
tensors), every acquisition and release is counted, and any step can be made to
fail, to test rollback.
"""

from __future__ import annotations

import hashlib
import itertools
import struct
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from gemmar_aot.codeobject import CodeObject, KernelMetadata, parse_code_object
from gemmar_aot.artifact_model import Lock
from gemmar_aot.launch import LaunchRecord

GFX950 = "gfx950:sramecc+:xnack-"


# ---------------------------------------------------------------------------
# FakeHipDriver
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class FakeModule:
    id: int
    digest: str
    code: CodeObject


@dataclass(frozen=True)
class FakeFunction:
    module: FakeModule
    kernel: KernelMetadata


@dataclass
class LaunchLog:
    """One launch as the fake saw it."""

    kernel: str
    digest: str
    kinds: frozenset  # the lock's kinds for this blob ("gemm", "drain", ...)
    grid: tuple
    block: tuple
    args: tuple  # explicit argument values decoded at the metadata's offsets
    stream: int


@dataclass
class FakeHipDriver:
    """A validating, non-executing :class:`gemmar_aot.runtime.Driver`.

    ``locks``: the locks (or their JSON data) whose launch records are the expected launches.
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
        #: blob digest -> [(kind, LaunchRecord)] for every lock entry naming that blob
        self.expected: dict[str, list[tuple[str, LaunchRecord]]] = {}
        for lock in self.locks:
            if not isinstance(lock, Lock):
                lock = Lock.from_json(lock)
            for _where, e in lock.iter_launches():
                lst = self.expected.setdefault(e.blob.hash, [])
                if (e.kind, e.launch) not in lst:
                    lst.append((e.kind, e.launch))

    # ---- the driver interface ----

    def device_arch(self, device) -> str:
        self.counters["device_arch"] += 1
        return self.arch

    def current_stream(self, device) -> int:
        return self.stream

    def load_module(self, image: bytes) -> FakeModule:
        code = parse_code_object(bytes(image))  # the oracle: raises on anything that is not a code object
        digest = hashlib.sha256(image).hexdigest()
        assert digest in self.expected, f"module {digest[:12]} is not named by any lock entry"
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
        values = []
        explicit = [a for a in kern.args if not a.value_kind.startswith("hidden_")]
        for a in explicit:
            assert a.offset % a.size == 0, f"{kern.name}: argument at {a.offset} is not {a.size}-aligned"
            assert a.offset % min(a.size, kern.kernarg_align) == 0
            assert a.offset + a.size <= len(buf)
            fmt = {8: "<Q" if a.value_kind == "global_buffer" else "<q", 4: "<i", 2: "<h", 1: "<b"}[a.size]
            values.append(struct.unpack_from(fmt, buf, a.offset)[0])
        digest = function.module.digest
        problems = []
        kinds = set()
        for kind, rec in self.expected[digest]:
            why = self._match(rec, values, tuple(grid), tuple(block), stream)
            if why is None:
                kinds.add(kind)
            else:
                problems.append(f"{kind}: {why}")
        assert kinds, f"{kern.name} ({digest[:12]}) launch matches no launch record: " + "; ".join(problems)
        self.counters["launch"] += 1
        self.launches.append(LaunchLog(kern.name, digest, frozenset(kinds), tuple(grid), tuple(block),
                                       tuple(values), stream))

    @staticmethod
    def _match(rec: LaunchRecord, values, grid, block, stream) -> str | None:
        if len(values) != len(rec.kernel_args):
            return f"{len(values)} arguments, the record has {len(rec.kernel_args)}"
        params = [0] * len(rec.params)
        params[rec.stream_param] = stream
        for v, x in zip(values, rec.kernel_args):
            if not (isinstance(x, str) and x.startswith("p")):
                return f"argument {x} is computed; the fake reconstructs plain parameters only"
            params[int(x[1:])] = v
        g, b, kargs = rec.resolve(params)
        if tuple(g) != grid or tuple(b) != block:
            return f"grid/block {grid}/{block}, the record gives {tuple(g)}/{tuple(b)}"
        mask = [(1 << 64) - 1 if t in ("ptr", "i64") else (1 << 32) - 1 for t in rec.kernel_arg_types]
        if [k & m_ for k, m_ in zip(kargs, mask)] != [v & m_ for v, m_ in zip(values, mask)]:
            return f"arguments {values} differ from the record's {list(kargs)}"
        return None

    def memset(self, ptr: int, value: int, nbytes: int) -> None:
        self.memsets.append((ptr, value, nbytes))

    def synchronize(self, stream: int) -> None:
        self.syncs.append(stream)

    # ---- assertions helpers ----

    def launched(self, kind: str | None = None) -> list[LaunchLog]:
        return [l for l in self.launches if kind is None or kind in l.kinds]

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


class FakeDevComm(_Handle):
    _ptrs = itertools.count(0xDC000000, 0x1000)

    def __init__(self, comm, reqs):
        super().__init__(comm, "dev_comm")
        self.reqs, self.ptr = reqs, next(self._ptrs)


class FakeCommunicator:
    """Host-memory stand-in for ``mori.cco.Communicator`` (one rank).

    ``fail_at``: step names that raise :class:`InjectedFailure` ("alloc_mem",
    "register_window", "create_dev_comm", "barrier", "close_mem", ...).
    ``lazy``: allocate without zeroing (for benchmarks; the op zeroes through the driver).
    """

    def __init__(self, rank: int = 0, nranks: int = 2, device: str = "cpu", fail_at=(), lazy: bool = False):
        self.rank, self.nranks, self.device = rank, nranks, torch.device(device)
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
