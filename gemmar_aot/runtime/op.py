"""``GemmAllReduceOp``: mori's fused FP8 GEMM + all-reduce, served from precompiled kernels.

Same constructor keywords, call signature, validation and results as
``mori.ops.gemm_ar.GemmAllReduceOp`` (amd-mori 1.2.4), plus:

``artifacts``     where the compiled kernels are (see :mod:`.artifacts`);
``on_miss``       ``"raise"`` (the default, else ``$GEMMAR_AOT_ON_MISS``): a call at an M the
                  artifacts lack raises; ``"pad"``: it is served at the smallest built M above
                  its own, its operands zero-extended into buffers sized at construction, and
                  the first M rows of that output returned (see :meth:`_padded_call`);
``miss_report``   where each distinct miss of this process is appended as a JSON line
                  (default ``$GEMMAR_AOT_MISS_REPORT``; :mod:`.misses`), for
                  ``gemmar-aot suggest`` to turn into manifest lines;
``trusted_keys``  the public keys the artifacts' locks must be signed by (default
                  ``$GEMMAR_AOT_TRUSTED_KEYS``; none: not authenticated; :mod:`gemmar_aot.signing`);
``self_test``     run :meth:`self_test` before returning (default True);
``self_test_gemm`` also run :meth:`self_test_gemm` before returning (default False: it
                  allocates and quantises two operand tensors; cost in BENCHMARKS.md);
``driver``        the HIP driver (default: :class:`~.hip.HipDriver`, the real one);
``jit_fallback``  on an M without artifacts, build mori's own op and use it (logged
                  at WARNING on every call) instead of raising. Off by default;
                  fused-sdma only (mori has no class for the other modes).
``transport``     which of the PR's collective modes to serve (default
                  ``"fused-sdma"``, mori's op). The others are mori's benchmark
                  paths, with the same window, operands, validation and result:

                  ``split-sdma``  GEMM(fuse=False) -> scatter -> reduce -> (fp8 inserts) -> gather
                  ``split-lsa``   GEMM(fuse=False) -> one LSA all-reduce kernel (bf16 wire)
                  ``fused-lsa``   GEMM(fuse=True, transport="lsa"), the epilogue storing into
                                  the peers' windows -> barrier -> reduce -> gather (bf16 wire)

                  Each call runs the recorded sequence for its M and rank; ``self_test``
                  runs the mode's recorded self-test (the SDMA split order, or for
                  split-lsa its all-reduce).

What differs from mori on purpose:

* **Nothing compiles.** Every M the op serves is loaded, verified and resolved at
  construction. A call at an M the artifacts lack raises
  :class:`~.errors.ArtifactMissingError` naming the M, the nearest built M values
  and the manifest lines that would add it.
* **Counter slots are deterministic** (``rules.counter_slot``: band count - 1),
  as compiled into the kernels, not first-seen; so any call order works and every
  rank agrees without coordination.
* **The hot path allocates nothing and never syncs**: per M the GEMM's argument
  buffer and struct, every phase's packed arguments, grids and blocks are fixed at
  construction; a call validates operand metadata, writes four pointers and queues
  four launches. That is what lets a CUDA/HIP graph capture it.

Contract (mori's): every rank constructs the op and calls it the same number of
times in the same order; the output aliases the window and is overwritten by the
next call; one instance is not safe to use concurrently.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from gemmar_aot import rules
from gemmar_aot.model.layout import WindowLayout
from gemmar_aot.model.types import FUSED_SDMA, LaunchEntry

from .artifacts import Artifacts, RankEntry, TupleKey, load_artifacts
from .driver import Driver, arch_base, unload_modules
from .errors import ArtifactError, ArtifactMismatchError, ArtifactMissingError, SelfTestError
from .gc_pause import gc_paused
from . import misses
from .kernel import EntryPosition, PreparedLaunch, prepare_launch, verify_entries
from .manifest_lines import manifest_snippet, nearest
from .memory import communicator_device, dev_comm_requirements, device_context, tensor_at
from .operands import check_operands
from .provenance import COMMUNICATORS, check_installed_mori, one_profile

log = logging.getLogger("gemmar_aot.runtime")

#: The mode a GemmAllReduceOp serves unless told otherwise (mori's own op).
TRANSPORT = FUSED_SDMA
DEFAULT_BLOCK_N = rules.DEFAULT_BLOCK_N
#: The GEMM launcher's arguments, in order: (kind, dtype per quant or None).
_GEMM_ARGS = ("tensor", "tensor", "tensor", "tensor", "tensor", "i32", "i32", "i64", "i64", "stream")
_PHASE_ARGS = ("i64", "i64", "stream")


class _Plan:
    """One M, resolved: the GEMM, the tail phases, the self-test sequence, the window views."""

    __slots__ = ("m", "slot", "entry", "gemm", "tail", "self_test", "input", "output", "a_slot", "b_slot",
                 "as_slot", "bs_slot", "calls")

    def __init__(self, m: int, slot: int, entry: RankEntry, gemm: PreparedLaunch, tail: tuple,
                 self_test: tuple, input, output):
        self.m, self.slot, self.entry = m, slot, entry
        self.gemm, self.tail, self.self_test = gemm, tail, self_test
        self.input, self.output = input, output
        self.a_slot, self.b_slot, self.as_slot, self.bs_slot = gemm.slots
        self.calls = 0  # served calls at this M (op.stats())


def padded_m(m: int, world_size: int, block_m: int = 128) -> int:
    """``m`` rounded up to a whole number of row bands per destination (mori's ``padded_m``)."""
    return rules.padded_m(m, world_size, block_m)


def window_bytes_for(world_size: int, *, m_max: int, n: int, block_m: int = 128, gather_dtype: str = "bf16",
                     gather_transport: str = "lsa", max_shapes: int | None = None) -> int:
    """Symmetric-window bytes an op for this shape allocates (size the communicator's VMM with it).

    Like mori's, this has no ``quant``: for mxfp8 pass ``block_m=256``.
    """
    m_pad = rules.padded_m(m_max, world_size, block_m)
    return rules.window_layout(world_size, n, m_pad, block_m, gather_dtype, gather_transport,
                               max_shapes or rules.default_max_shapes(m_pad, world_size, block_m)).window_bytes


def supports(m: int, n: int, k: int, world_size: int, *, block_m: int | None = None,
             block_n: int = DEFAULT_BLOCK_N, gather_dtype: str = "bf16", gather_transport: str = "lsa",
             quant: str = "blockscale", sdma_queues: int = 1, m_max: int | None = None,
             artifacts: Any = None, transport: str = TRANSPORT) -> bool:
    """Whether an op could serve M here: the shape rules hold AND the kernels for padded M exist.

    "Exist" means for every rank of the world, which is what the op itself requires
    (an M only some ranks can run would hang the others). ``m_max`` (optional) must
    also match the window the artifacts were built for. Never raises: no artifacts
    at all is False.
    """
    try:
        if rules.check_gemm_ar(m, n, k, world_size, block_m=block_m, block_n=block_n, gather_dtype=gather_dtype,
                               gather_transport=gather_transport, quant=quant, sdma_queues=sdma_queues,
                               m_max=m_max if m_max is not None else m) is not None:
            return False
        bm = rules.default_block_m(quant) if block_m is None else block_m
        arts = load_artifacts(artifacts)
        if _transport_problem(transport, gather_dtype, gather_transport, sdma_queues):
            return False
        key = TupleKey.make(transport=transport, n=n, k=k, world=world_size, quant=quant,
                            gather_dtype=gather_dtype, gather_transport=gather_transport, block_m=bm,
                            sdma_queues=sdma_queues)
        pm = rules.padded_m(m, world_size, bm)
        if pm not in arts.m_values(key, world=world_size):
            return False
        if m_max is not None:
            want = rules.padded_m(m_max, world_size, bm)
            for r in range(world_size):
                e = arts.entry(key, pm, r)
                if e is None or e.layout is None or e.layout.m_max != want:
                    return False
        return True
    except (ArtifactError, ValueError, TypeError, OSError):
        return False


def _transport_problem(transport: str, gather_dtype: str, gather_transport: str, sdma_queues: int) -> str | None:
    """Why a collective mode cannot run this wire (or these queues), or None."""
    if transport not in rules.COLLECTIVE_TRANSPORTS:
        return (f"transport={transport!r}: must be one of {', '.join(rules.COLLECTIVE_TRANSPORTS)} (gemm-only and "
                f"gemv are Mxfp8GemmOp and Mxfp8GemvOp)")
    wire = rules.wire_problem(transport, gather_dtype, gather_transport)
    if wire:
        return f"{wire[0]}={gather_dtype if wire[0] == 'gather_dtype' else gather_transport!r}: {wire[2]}"
    if transport not in rules.SDMA_TRANSPORTS and sdma_queues != 1:
        return f"sdma_queues={sdma_queues}: {transport} uses no SDMA queue; leave it at 1"
    return None


class GemmAllReduceOp:
    """Fused fp8 GEMM + all-reduce over cco SDMA, from ahead-of-time compiled kernels.

    Owns the symmetric window and one resolved launch plan per M the artifacts hold
    for this (N, K, world, quant, wire, rank). ``m_max`` must be the window the
    artifacts were built for (it is compiled into every kernel).
    """

    @gc_paused()  # getting ready makes ~10^4 acyclic objects: no collection in between (gc_pause)
    def __init__(self, comm, *, n: int, k: int, m_max: int, block_m: int | None = None,
                 block_n: int = DEFAULT_BLOCK_N, sdma_queues: int = 1, gather_dtype: str = "bf16",
                 gather_transport: str = "lsa", quant: str = "blockscale", max_shapes: int | None = None,
                 artifacts: Any = None, self_test: bool = True, driver: Driver | None = None,
                 jit_fallback: bool = False, self_test_gemm: bool = False, transport: str = TRANSPORT,
                 trusted_keys: Any = None, miss_report: Any = None, on_miss: str | None = None):
        t_start = time.perf_counter()
        # Cleanup state first, so a failure anywhere below can roll back through close().
        self._closed = True
        self._startup_seconds: float | None = None
        self._padded_rows = 0
        self._pad_a = self._pad_scale = self._pad_scale_bytes = None
        self._buckets: tuple[int, ...] = ()
        self.mem = self.win = self.dev_comm = None
        self._modules: list[Any] = []
        self._plans: dict[int, _Plan] = {}
        self._phases: dict[str, PreparedLaunch] = {}
        self._entries: dict[int, RankEntry] = {}
        self._pad_in = None
        self._fallback = None
        self._driver: Any = None
        self._mori = None  # the artifacts' mori / toolchain profile, counted on the communicator
        self._mori_held = False

        # ---- 1. arguments, in mori's order ----
        why = rules.check_quant(quant)
        if why:
            raise ValueError(f"quant={quant!r}: {why}")
        if block_m is None:
            block_m = rules.default_block_m(quant)
        for why in (rules.check_block_m_for_quant(quant, block_m), rules.check_gather_dtype(gather_dtype),
                    rules.check_gather_transport(gather_transport), rules.check_block_n(block_n),
                    rules.check_tile(block_m, block_n)):
            if why:
                raise ValueError(why)
        why = _transport_problem(transport, gather_dtype, gather_transport, sdma_queues)
        if why:
            raise ValueError(why)
        on_miss = misses.policy(on_miss)
        if on_miss == "pad" and jit_fallback:
            raise ValueError("on_miss='pad' and jit_fallback=True both serve a missing M: choose one")
        self._on_miss = on_miss
        if jit_fallback and transport != TRANSPORT:
            raise ValueError(f"jit_fallback=True needs mori's own op, which only runs {TRANSPORT}; "
                             f"transport {transport!r} has no mori class to fall back to")
        if m_max < 1 or sdma_queues < 1:
            raise ValueError(f"m_max and sdma_queues must both be >= 1; got m_max={m_max} sdma_queues={sdma_queues}")
        world, rank = int(comm.nranks), int(comm.rank)
        why = rules.check_world(world)
        if why:
            raise ValueError(f"world_size={world}: {why}")
        m_max_pad = rules.padded_m(m_max, world, block_m)
        if max_shapes is None:
            max_shapes = rules.default_max_shapes(m_max_pad, world, block_m)
        if max_shapes < 1:
            raise ValueError(f"max_shapes must be >= 1; got {max_shapes}")
        why = rules.check_gemm_shape(n, k, block_n, quant) or rules.check_gemm_ar(
            m_max_pad, n, k, world, block_m=block_m, block_n=block_n, gather_dtype=gather_dtype,
            gather_transport=gather_transport, quant=quant, sdma_queues=sdma_queues, max_shapes=max_shapes)
        if why:
            raise ValueError(f"unsupported shape: {why}")

        self.comm = comm
        self.rank, self.world_size = rank, world
        self.n, self.k = n, k
        self.quant = quant
        self.block_m, self.block_n = block_m, block_n
        self.sdma_queues = sdma_queues
        self.gather_dtype, self.gather_transport = gather_dtype, gather_transport
        self.max_shapes = max_shapes
        self.m_max = m_max_pad
        self._jit_fallback = bool(jit_fallback)
        self._misses = misses.OpMisses(type(self).__name__, miss_report, self._miss_identity, rank=rank)
        self.transport = transport

        # ---- 2. the artifacts: every M held for this op and rank, one shared layout ----
        self.artifacts: Artifacts = load_artifacts(artifacts, trusted_keys=trusted_keys)
        self.key = TupleKey.make(transport=transport, n=n, k=k, world=world, quant=quant,
                                 gather_dtype=gather_dtype, gather_transport=gather_transport,
                                 block_m=block_m, sdma_queues=sdma_queues)
        # Only M values built for EVERY rank: a rank that served an M its peers lack would enter
        # the collective alone and hang them, so all ranks must agree on the set -- and they do,
        # given the same artifacts, without talking to each other.
        served = self.artifacts.m_values(self.key, world=world)
        partial = sorted(set(self.artifacts.m_values(self.key, rank=rank)) - set(served))
        if partial:
            log.warning("gemmar-aot: M %s are built for only some of the %d ranks (%s); this op will not "
                        "serve them", partial, world, self.key.describe())
        entries = {m: self.artifacts.entry(self.key, m, rank) for m in served}
        if not entries:
            err = self._nothing_built_error()
            self._report_miss(None, err)
            raise err
        self._entries = entries
        self.window_bytes = self._check_layouts(entries)
        # One toolchain profile per op and per communicator; the pod's mori must be the artifacts'.
        built = [(e.lock.mori, e.where) for _, e in sorted(entries.items())]
        self._mori = one_profile(built)
        check_installed_mori(built)
        COMMUNICATORS.acquire(comm, self._mori, built[0][1], check_only=True)

        # ---- 3. the device ----
        if driver is None:
            from .hip import HipDriver

            driver = HipDriver()
        self._driver = driver
        self.device = communicator_device(comm)
        dev_arch = driver.device_arch(self.device)
        for e in entries.values():
            if e.lock.arch != arch_base(dev_arch):
                raise ArtifactMismatchError(
                    f"the artifacts for M={e.m} were compiled for {e.lock.arch or '?'} ({e.where}) but "
                    f"{self.device} is {dev_arch}; build the manifest for this GPU's arch")
        self.arch = arch_base(dev_arch)

        # ---- 4. every code object: loaded once, verified, parsed, checked against its records ----
        images = self._load_code_objects(entries)

        # ---- 5. acquire (on the op's device); roll everything back if any step fails ----
        with device_context(self.device):
            try:
                COMMUNICATORS.acquire(comm, self._mori, self._entries[min(self._entries)].where)
                self._mori_held = True
                functions = {}
                for digest, (data, kern) in images.items():
                    module = driver.load_module(data)
                    self._modules.append(module)
                    functions[digest] = driver.get_function(module, kern.name)
                self.mem = comm.alloc_mem(self.window_bytes)
                self.win = comm.register_window(self.mem.ptr, self.mem.size)
                # Counters live in the window and are read before first written: zero it once,
                # completely, before any peer can run the protocol.
                driver.memset(self.mem.ptr, 0, self.window_bytes)
                self.dev_comm = comm.create_dev_comm(dev_comm_requirements(comm, sdma_queues))
                comm.barrier()
                self._closed = False
                shared: dict = {}  # what the M values' launches have in common, derived once
                for m, e in sorted(entries.items()):
                    self._plans[m] = self._make_plan(e, images, functions, shared)
                if self._on_miss == "pad":
                    self._alloc_pad_buffers()
                if self_test:
                    self.self_test()
                if self_test_gemm:
                    self.self_test_gemm()
            except BaseException:
                self._rollback()
                raise
        self._startup_seconds = time.perf_counter() - t_start

    def _rollback(self) -> None:
        """Release whatever the constructor acquired; never masks the error being raised."""
        self._closed = False
        try:
            self.close()
        except Exception:  # noqa: BLE001 - the original error is the one to report
            log.exception("gemmar-aot: releasing a half-constructed GemmAllReduceOp failed")

    # ------------------------------------------------------------------
    # construction helpers
    # ------------------------------------------------------------------

    def _describe(self) -> str:
        return f"{self.key.describe()} rank {self.rank}"

    def _nothing_built_error(self) -> ArtifactMissingError:
        others = sorted({(k.n, k.k, k.world, k.quant, k.gather_dtype) for k in self.artifacts.index
                         if k.transport == self.transport})
        snippet = manifest_snippet(self.key, [self.m_max], self.m_max)
        return ArtifactMissingError(
            f"the artifacts hold no kernels for {self._describe()} (sources: "
            f"{self.artifacts.describe_sources()}). {self.transport} tuples present (n, k, world, quant, wire): "
            f"{others or 'none'}. Add to the manifest and rebuild:\n{snippet}",
            m=self.m_max, manifest_lines=snippet)

    def _check_layouts(self, entries: dict[int, RankEntry]) -> int:
        """Every M must share one window layout, equal to the one recomputed here. Returns window bytes."""
        first: RankEntry | None = None
        for m, e in sorted(entries.items()):
            lay = e.layout
            if lay is None or lay.call is None:
                raise ArtifactMismatchError(f"{e.where}: M={m} has no window layout in the lock; rebuild it")
            if lay.m_max != self.m_max:
                raise ArtifactMismatchError(
                    f"the artifacts were built for m_max {lay.m_max} (window of {lay.window_bytes} bytes, "
                    f"{e.where}), but this op pads m_max to {self.m_max}: the window layout is compiled into "
                    f"every kernel. Construct the op with m_max={lay.m_max}, or rebuild the manifest with "
                    f"m_max = {self.m_max}")
            if lay.max_shapes != self.max_shapes:
                raise ArtifactMismatchError(
                    f"the artifacts were built with max_shapes {lay.max_shapes} ({e.where}), this op "
                    f"asks for {self.max_shapes}; pass max_shapes={lay.max_shapes} (or leave it unset)")
            if e.tuple.id.block_n != self.block_n:
                raise ArtifactMismatchError(f"{e.where}: built with block_n {e.tuple.id.block_n}")
            if first is None:
                first = e
                first_shared = [getattr(lay, f) for f in _SHARED_WINDOW_FIELDS]
            elif [getattr(lay, f) for f in _SHARED_WINDOW_FIELDS] != first_shared:
                # Only the per-M values (lay.call) may differ between the M values of one window.
                diff = _differing_fields(first.layout.shared().flat(), lay.shared().flat())
                if diff:
                    raise ArtifactMismatchError(
                        f"the artifacts' window layouts differ between M={first.m} ({first.where}) and "
                        f"M={m} ({e.where}) in {diff}: one window cannot serve both. Rebuild them together "
                        f"from one manifest")
            want = rules.window_layout(self.world_size, self.n, self.m_max, self.block_m, self.gather_dtype,
                                       e.tuple.id.gather_transport, self.max_shapes, m_pad=m)
            if lay != want:
                raise ArtifactMismatchError(
                    f"{e.where}: the recorded window layout for M={m} is not the one this runtime computes "
                    f"(differs in {_differing_fields(want.flat(), lay.flat())}); the kernels would address the "
                    f"wrong bytes. Rebuild with this gemmar-aot version")
        return first.layout.window_bytes

    def _load_code_objects(self, entries: dict[int, RankEntry]) -> dict[str, tuple[bytes, Any]]:
        """digest -> (verified bytes, kernel metadata), each blob read once; nothing acquired yet."""
        return verify_entries(self.artifacts, [e for _m, e in sorted(entries.items())],
                              launches=lambda e: (*e.launches, *e.self_test), position=self._position)

    def _position(self, e: RankEntry, kind: str) -> EntryPosition:
        """Where a lock entry sits, for checking it against its record."""
        i = e.tuple.id
        return EntryPosition(transport=i.transport, kind=kind, rank=e.rank, world=i.world, m=e.m,
                             slot=e.layout.call.slot, m_max=e.layout.m_max, n=i.n, k=i.k, quant=i.quant,
                             gather_dtype=i.gather_dtype, gather_transport=i.gather_transport, block_m=i.block_m)

    def _make_plan(self, e: RankEntry, images, functions, shared: dict | None = None) -> _Plan:
        m = e.m
        lay = e.layout
        launches = list(e.launches)
        if not launches or launches[0].kind != "gemm":
            raise ArtifactMismatchError(f"{e.where}: M={m}'s launch sequence does not start with the GEMM")
        c_ptr = self.mem.ptr + lay.input_off
        dev_comm, win = int(self.dev_comm.ptr), int(self.win.handle)
        phases = self._phases  # action key -> prepared phase: its arguments are the same for every M

        def phase(le: LaunchEntry) -> PreparedLaunch:
            p = phases.get(le.key)
            if p is None:
                p = phases[le.key] = prepare_phase(le)
            return p

        def prepare_phase(le: LaunchEntry) -> PreparedLaunch:
            rec = le.launch
            kinds = tuple(a.kind for a in rec.args)
            if kinds != _PHASE_ARGS:
                raise ArtifactMismatchError(f"{e.where}: phase {le.kind} takes {kinds}, expected "
                                            f"(dev_comm, win, stream)")
            d = le.blob.hash
            return prepare_launch(kind=le.kind, digest=d, record=rec, kernel=images[d][1],
                                  function=functions[d], where=f"{e.where} {le.kind}",
                                  fixed={rec.args[0].params[0]: dev_comm, rec.args[1].params[0]: win},
                                  per_call=(), cache=shared)

        g = launches[0]
        rec = g.launch
        kinds = tuple(a.kind for a in rec.args)
        if kinds != _GEMM_ARGS:
            raise ArtifactMismatchError(f"{e.where}: the GEMM launcher takes {kinds}, expected "
                                        f"(A, B, C, A_scale, B_scale, c_m, c_n, dev_comm, win, stream)")
        scale_dtype = "int32" if self.quant == "mxfp8" else "float32"
        want_dtypes = ("int8", "int8", "bfloat16", scale_dtype, scale_dtype)
        got_dtypes = tuple(a.dtype for a in rec.args[:5])
        if any(g_ and g_ != w for g_, w in zip(got_dtypes, want_dtypes)):
            raise ArtifactMismatchError(f"{e.where}: the GEMM was traced with operand dtypes {got_dtypes}, this "
                                        f"op passes {want_dtypes}")
        a, b, c, asc, bsc, c_m, c_n, dc, wn, _s = rec.args
        n, k = self.n, self.k
        numel = {"a": m * k, "b": n * k}
        if self.quant == "mxfp8":
            numel["as"], numel["bs"] = m * k // 128, (n // 32) * (k // 32)
        else:
            numel["as"], numel["bs"] = m * (k // 128), (n // 128) * (k // 128)
        fixed = {a.params[1]: numel["a"], b.params[1]: numel["b"], asc.params[1]: numel["as"],
                 bsc.params[1]: numel["bs"], c.params[0]: c_ptr, c.params[1]: m * n,
                 c_m.params[0]: m, c_n.params[0]: n, dc.params[0]: dev_comm, wn.params[0]: win}
        d = g.blob.hash
        gemm = prepare_launch(kind="gemm", digest=d, record=rec, kernel=images[d][1], function=functions[d],
                              where=f"{e.where} gemm", fixed=fixed,
                              per_call=(a.params[0], b.params[0], asc.params[0], bsc.params[0]), cache=shared)
        import torch

        return _Plan(
            m=m, slot=rules.counter_slot(m, self.world_size, self.block_m), entry=e, gemm=gemm,
            tail=tuple(phase(le) for le in launches[1:]),
            self_test=tuple(phase(le) for le in e.self_test),
            input=tensor_at(self.comm, c_ptr, (m, n), torch.bfloat16, self.device),
            output=tensor_at(self.comm, self.mem.ptr + lay.output_off, (m, n), torch.bfloat16, self.device),
        )

    # ------------------------------------------------------------------
    # public surface
    # ------------------------------------------------------------------

    @property
    def m_values(self) -> tuple[int, ...]:
        """The padded M values this op serves (sorted)."""
        return tuple(sorted(self._entries))

    @property
    def driver(self):
        return self._driver

    window_bytes_for = staticmethod(window_bytes_for)
    supports = staticmethod(supports)

    def padded_m(self, m: int) -> int:
        """``m`` rounded up to what :meth:`__call__` accepts."""
        return rules.padded_m(m, self.world_size, self.block_m)

    def counter_slot(self, m: int) -> int:
        """The counter set M's kernels were compiled for (deterministic: bands - 1)."""
        return rules.counter_slot(m, self.world_size, self.block_m)

    def __call__(self, a_fp8, b_preshuffled, a_scale, b_scale):
        """One fused GEMM + all-reduce; returns the bf16 ``[M, N]`` output view of the window.

        Same operands as mori's op (see :mod:`.operands`). The result aliases the
        window and is overwritten by the next call; clone it to keep it.
        """
        plan = self._plans.get(a_fp8.shape[0])
        if plan is None:
            return self._unplanned_call(a_fp8, b_preshuffled, a_scale, b_scale)
        return self._launch(plan, self._pack_gemm(plan, a_fp8, b_preshuffled, a_scale, b_scale))

    def _launch(self, plan: _Plan, g: PreparedLaunch):
        """Queue ``plan``'s GEMM (its pointers written: ``g``) and its tail; the output view."""
        plan.calls += 1
        driver = self._driver
        stream = driver.current_stream(self.device)
        launch = driver.launch
        launch(g.function, g.grid, g.block, g.args, stream)
        for p in plan.tail:
            launch(p.function, p.grid, p.block, p.args, stream)
        return plan.output

    def _pack_gemm(self, plan: _Plan, a_fp8, b_preshuffled, a_scale, b_scale):
        """Check the operands against ``plan``'s M and write their pointers into the GEMM's
        preallocated kernel arguments; returns the GEMM's prepared launch."""
        return self._write_pointers(plan, *check_operands(a_fp8, b_preshuffled, a_scale, b_scale, m=plan.m, n=self.n,
                                                          k=self.k, quant=self.quant, device=self.device))

    def _write_pointers(self, plan: _Plan, a, b, asc, bsc) -> PreparedLaunch:
        """Checked operands' pointers into the GEMM's preallocated kernel arguments."""
        g = plan.gemm
        v = g.values
        v[plan.a_slot] = a.data_ptr()
        v[plan.b_slot] = b.data_ptr()
        v[plan.as_slot] = asc.data_ptr()
        v[plan.bs_slot] = bsc.data_ptr()
        g.struct.pack_into(g.args.buf, 0, *v)
        return g

    def gemm_only(self, a_fp8, b_preshuffled, a_scale, b_scale):
        """The call's GEMM alone, no all-reduce: the PR's gemm-only measurement (split modes only).

        A split mode's GEMM is the unfused kernel, which writes the window's input
        region and touches nothing else there, so it may run by itself; a fused GEMM
        pushes its output to the peers and must be followed by its tail. Returns the
        bf16 ``[M, N]`` input-region view (this rank's unreduced product).
        """
        if not self.transport.startswith("split-"):
            raise ValueError(f"gemm_only() runs a split mode's unfused GEMM; {self.transport}'s GEMM pushes to "
                             f"the peers and cannot run without its tail")
        plan = self._plans.get(a_fp8.shape[0])
        if plan is None:  # never padded: the bucket's GEMM alone would leave its input region half ours
            self._unplanned_call(a_fp8, b_preshuffled, a_scale, b_scale, pad=False)  # raises: closed, rules, a miss
            raise AssertionError("unreachable")  # pragma: no cover - jit_fallback is fused-sdma only
        g = self._pack_gemm(plan, a_fp8, b_preshuffled, a_scale, b_scale)
        self._driver.launch(g.function, g.grid, g.block, g.args, self._driver.current_stream(self.device))
        return plan.input

    def _unplanned_call(self, a_fp8, b_preshuffled, a_scale, b_scale, pad: bool = True):
        """Why there is no plan for this M: closed, too big, off-granule, or not built (then, with
        ``on_miss="pad"`` and ``pad``, served at a larger bucket)."""
        if self._closed:
            raise RuntimeError("this GemmAllReduceOp has been closed")
        if a_fp8.dim() != 2:
            raise ValueError(f"a_fp8 must be 2-D [M, K], got shape {tuple(a_fp8.shape)}")
        m = int(a_fp8.shape[0])
        if m > self.m_max:
            raise ValueError(f"M={m} exceeds the window's m_max={self.m_max}; the window cannot grow after "
                             f"construction")
        if m % (self.world_size * self.block_m):
            raise ValueError(f"M={m} must be a multiple of world_size * block_m = "
                             f"{self.world_size * self.block_m}; use padded_m()/pad_rows()")
        if pad and self._on_miss == "pad":
            bucket = next((b for b in self._buckets if b > m), None)
            if bucket is not None:
                return self._padded_call(m, bucket, a_fp8, b_preshuffled, a_scale, b_scale)
        err = self.missing_error(m)
        self._report_miss(m, err)
        if not self._jit_fallback:
            raise err
        return self._fallback_call(m, err, a_fp8, b_preshuffled, a_scale, b_scale)

    def missing_error(self, m: int) -> ArtifactMissingError:
        """The error a call at padded ``m`` raises when the artifacts lack it."""
        avail = self.m_values
        near = nearest(m, avail)
        snippet = manifest_snippet(self.key, [m], self.m_max)
        return ArtifactMissingError(
            f"no precompiled kernels for M={m} ({self._describe()}); nothing is compiled at run time. "
            f"This op serves M in {list(avail)}; nearest: {' and '.join(map(str, near)) or 'none'}. "
            f"Pad to one of those, or add M={m} to the manifest and rebuild (gemmar-aot build), e.g.:\n"
            f"{snippet}",
            m=m, available=avail, nearest=near, manifest_lines=snippet)

    def _alloc_pad_buffers(self) -> None:
        """The zero-extended A and A scale of a padded call, for the largest bucket: allocated once."""
        import torch

        self._buckets = tuple(sorted(self._plans))
        top = self._buckets[-1]
        self._pad_a = torch.zeros((top, self.k), dtype=torch.float8_e4m3fn, device=self.device)
        # M*K/128 elements either way: blockscale's fp32 per 128-wide K block, mxfp8's int32 of four ue8m0 bytes
        dtype = torch.int32 if self.quant == "mxfp8" else torch.float32
        self._pad_scale = torch.zeros(top * self.k // 128, dtype=dtype, device=self.device)
        # mxfp8's scale is laid out by byte (one ue8m0 per row and 32-wide K block): its byte view, once
        self._pad_scale_bytes = self._pad_scale.view(torch.uint8) if self.quant == "mxfp8" else None

    def _padded_call(self, m: int, bucket: int, a_fp8, b_preshuffled, a_scale, b_scale):
        """Serve M with ``bucket``'s kernels (``on_miss="pad"``).

        Why this is mori's result for M: a GEMM row depends only on its own A row and A-scale
        row, and the all-reduce and the gather are elementwise over rows (the fp8 gather's
        scales take an absolute maximum, which zero rows never raise). So rows M..bucket-1 of A
        and of the A scale are zeroed, rows below M copied from the caller's (whose shapes are
        checked at the caller's M, as mori checks them), and the first M rows of the bucket's
        output are what mori's op computes for M. Allocates nothing: the buffers are sized for
        the largest bucket at construction.

        Both A scales are K-block major, each block's M rows together: blockscale's one fp32
        per row at ``kb * M + row``; mxfp8's one ue8m0 byte per row at ``kb * M + p(row)``
        (``preshuffle_a_scale``), where ``p`` permutes rows within each 64-row group -- and M
        is a multiple of world * 256, so rows below M stay below M. Either way the bucket's
        scale is the caller's blocks, each followed by zeros (a zero A row's product is zero,
        whatever its scale)."""
        a, b, asc, bsc = check_operands(a_fp8, b_preshuffled, a_scale, b_scale, m=m, n=self.n, k=self.k,
                                        quant=self.quant, device=self.device)
        pa = self._pad_a[:bucket]
        pa[:m].copy_(a)
        pa[m:].zero_()
        flat = self._pad_scale[:bucket * self.k // 128]
        if self._pad_scale_bytes is not None:  # mxfp8
            blocks = self.k // 32  # one byte per row and 32-wide K block
            ps = self._pad_scale_bytes[:blocks * bucket].view(blocks, bucket)
            src = asc.view(self._pad_scale_bytes.dtype).view(blocks, m)
        else:
            blocks = self.k // 128
            ps, src = flat.view(blocks, bucket), asc.view(blocks, m)
        ps[:, :m].copy_(src)
        ps[:, m:].zero_()
        self._padded_rows += bucket - m
        self._report_miss(m, None, served=bucket)
        plan = self._plans[bucket]
        # The buffers are the op's own, shaped for the bucket: no second operand check.
        return self._launch(plan, self._write_pointers(plan, pa, b, flat, bsc))[:m]

    def stats(self) -> dict:
        """What this op has done: served calls and kernel launches per M, misses per M (None: the op
        was asked for a tuple none were built for, or a call padded to another bucket), rows
        computed beyond the rows asked for (``on_miss="pad"``), and the seconds construction took
        up to ready. Counting costs a call one increment."""
        calls = {m: p.calls for m, p in sorted(self._plans.items())}
        return {"calls": calls, "launches": {m: c * (1 + len(self._plans[m].tail)) for m, c in calls.items()},
                "misses": dict(self._misses.counts), "padded_rows": self._padded_rows, "startup_seconds": self._startup_seconds,
                "transport": self.transport, "rank": self.rank}

    def _report_miss(self, m: int | None, err: Exception | None, served: int | None = None) -> None:
        """Count the miss, and append it to the miss report if one is set (once per process and M;
        never raises). ``served``: the bucket a padded call ran at (then there is no error)."""
        self._misses.miss(m, None if err is None else
                          type(err).__name__ + (" (jit_fallback)" if self._jit_fallback else ""), served)

    def _miss_identity(self) -> tuple[dict, str | None, list[str]]:
        return (misses.tuple_identity(self.key, self.m_max), misses.profile_of(self.artifacts),
                misses.lock_digests(self.artifacts))

    def _fallback_call(self, m, err, a_fp8, b_preshuffled, a_scale, b_scale):
        """jit_fallback=True: serve a missing M with mori's own (JIT-compiling) op. Loud, every time."""
        log.warning(
            "gemmar-aot: M=%d has no precompiled kernels (%s); falling back to mori's JIT op "
            "(jit_fallback=True). The first call per M compiles for seconds, it uses a second window, "
            "and it cannot be captured into a graph. Add this M to the manifest:\n%s",
            m, self._describe(), err.manifest_lines)
        if self._fallback is None:
            try:
                from mori.ops.gemm_ar import GemmAllReduceOp as MoriOp
            except Exception as exc:  # noqa: BLE001 - mori missing or broken
                raise ArtifactMissingError(
                    f"{err}\njit_fallback=True, but mori's op cannot be imported: {exc!r}",
                    m=m, available=err.available, nearest=err.nearest,
                    manifest_lines=err.manifest_lines) from exc
            self._fallback = MoriOp(self.comm, n=self.n, k=self.k, m_max=self.m_max, block_m=self.block_m,
                                    block_n=self.block_n, sdma_queues=self.sdma_queues,
                                    gather_dtype=self.gather_dtype, gather_transport=self.gather_transport,
                                    quant=self.quant, max_shapes=self.max_shapes)
        return self._fallback(a_fp8, b_preshuffled, a_scale, b_scale)

    def self_test(self, m: int | None = None) -> None:
        """Check the all-reduce moves bytes: every rank writes rank+1, every element must read sum(1..world).

        Runs the recorded self-test sequence (scatter -> reduce -> gather, plus the
        fp8 wire's quantize/pull steps) at ``m`` (default: m_max, or the largest M
        built). The failure this exists for is silent: a mori built without
        ``BUILD_CCO_SDMA=ON``, or run without ``MORI_ENABLE_SDMA=1``, launches every
        kernel and returns from every put, but the puts do nothing -- the model
        keeps answering, wrongly, and the fused path even measures faster.
        """
        if self._closed:
            raise RuntimeError("this GemmAllReduceOp has been closed")
        if m is None:
            m = self.m_max if self.m_max in self._plans else max(self._plans)
        plan = self._plans.get(m)
        if plan is None:
            raise self.missing_error(m)
        if not plan.self_test:
            raise ArtifactMismatchError(f"{plan.entry.where}: no self-test kernels recorded for M={m}; rebuild")
        want = self.world_size * (self.world_size + 1) / 2
        plan.input.fill_(float(self.rank + 1))
        plan.output.zero_()
        driver = self._driver
        stream = driver.current_stream(self.device)
        for p in plan.self_test:
            driver.launch(p.function, p.grid, p.block, p.args, stream)
        driver.synchronize(stream)
        got = plan.output.float()
        worst = (got - want).abs().max().item() / want
        if worst > 1e-2:
            built = _mori_build_cco_sdma()
            hint = (" The LSA all-reduce moves bytes with plain loads and stores, so check that every rank "
                    "constructed this op on the same communicator and window size."
                    if self.transport == "split-lsa" else
                    " mori was built with BUILD_CCO_SDMA=OFF, so the SDMA puts are compiled out and do "
                    "nothing; rebuild mori with BUILD_CCO_SDMA=ON."
                    if built is False else
                    " Check that mori was built with BUILD_CCO_SDMA=ON and that MORI_ENABLE_SDMA=1 is set: "
                    "without either, every put silently does nothing.")
            raise SelfTestError(
                f"gemm_ar self-test failed: the all-reduce returned {got.flatten()[0].item():g} where "
                f"{want:g} was expected (worst relative error {worst:.3g} at M={m}, world_size="
                f"{self.world_size}, rank {self.rank}).{hint}")

    def self_test_gemm(self, m: int | None = None) -> None:
        """Check the whole call, GEMM included: a constant problem with a known all-reduced answer.

        Every rank multiplies ``A = rank + 1`` by ``B = 1`` with unit scales (constant
        operands look the same in every layout: no preshuffling needed), so every output
        element must read ``K * sum(1..world)``. Runs one ordinary call at ``m``
        (default: the smallest M built, the cheapest), so it covers what :meth:`self_test`
        does not: the GEMM's operand and scale addressing, its epilogue's puts and the
        counters that start the tail. Collective, like every call: every rank must run it.
        """
        import torch

        if self._closed:
            raise RuntimeError("this GemmAllReduceOp has been closed")
        if m is None:
            m = min(self._plans)
        if m not in self._plans:
            raise self.missing_error(m)
        n, k, dev = self.n, self.k, self.device
        fp8 = torch.float8_e4m3fn
        a = torch.full((m, k), float(self.rank + 1), device=dev).to(fp8)
        b = torch.ones((n, k), device=dev).to(fp8)
        if self.quant == "mxfp8":  # ue8m0 127 = 2**0, four packed per A-scale int32
            a_scale = torch.full((m * k // 128,), 0x7F7F7F7F, dtype=torch.int32, device=dev)
            b_scale = torch.full(((n // 32) * (k // 32),), 127, dtype=torch.int32, device=dev)
        else:
            a_scale = torch.ones((k // 128, m), device=dev)
            b_scale = torch.ones((n // 128, k // 128), device=dev)
        out = self(a, b, a_scale, b_scale)
        self._driver.synchronize(self._driver.current_stream(dev))
        want = float(k) * self.world_size * (self.world_size + 1) / 2
        got = out.float()
        worst = (got - want).abs().max().item() / want
        if worst > 1e-2:
            raise SelfTestError(
                f"gemm_ar GEMM self-test failed: a constant problem (A = rank + 1, B = 1, unit scales, K={k}) "
                f"returned {got.flatten()[0].item():g} where {want:g} was expected (worst relative error "
                f"{worst:.3g} at M={m}, world_size={self.world_size}, rank {self.rank}). The all-reduce "
                f"self-test checks the collective alone; this one also runs the GEMM, so a failure here "
                f"and not there points at the GEMM kernels or their artifacts: rebuild them (gemmar-aot "
                f"build) and check the toolchain (gemmar-aot doctor)")

    def close(self) -> None:
        """Release the window, its memory and the loaded modules. Idempotent.

        Synchronise first if work may be in flight: the kernels address the window.
        The dev comm is left to the communicator, as mori does (its SDMA queues are
        communicator-scoped; destroying it first aborts the process at teardown).
        """
        if self._closed:
            return
        self._closed = True
        if getattr(self, "_torch_handle", None) is not None:  # registered by runtime.torch_op
            from .torch_op import unregister

            unregister(self)
        self._plans.clear()
        self._phases.clear()
        self._pad_in = None
        self._pad_a = self._pad_scale = self._pad_scale_bytes = None
        if self._mori_held:
            self._mori_held = False
            COMMUNICATORS.release(self.comm, self._mori)
        errors = []
        if self._fallback is not None:
            try:
                self._fallback.close()
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)
            self._fallback = None
        for handle in (self.win, self.mem):  # deregister before free
            if handle is not None:
                try:
                    handle.close()
                except Exception as exc:  # noqa: BLE001
                    errors.append(exc)
        self.win = self.mem = None
        unload_modules(self._driver, self._modules, errors)
        if errors:
            raise errors[0]

    def __enter__(self) -> "GemmAllReduceOp":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def pad_rows(self, x, m_pad: int):
        """Zero-extend ``x`` to ``m_pad`` rows in a buffer reused across calls (pad before quantising).

        The result is a view of a reused buffer: a later ``pad_rows`` overwrites it.
        """
        import torch

        if x.dim() != 2:
            raise ValueError(f"expected a 2-D [M, K] tensor, got shape {tuple(x.shape)}")
        m, k = x.shape
        if m_pad < m:
            raise ValueError(f"m_pad={m_pad} is smaller than the input's M={m}")
        buf = self._pad_in
        if buf is None or buf.shape[0] < m_pad or buf.shape[1] != k or buf.dtype != x.dtype \
                or buf.device != x.device:
            buf = self._pad_in = torch.zeros((m_pad, k), dtype=x.dtype, device=x.device)
        buf = buf[:m_pad]
        buf[:m].copy_(x)
        buf[m:].zero_()
        return buf

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"M {list(self.m_values)}"
        return (f"<gemmar_aot GemmAllReduceOp n={self.n} k={self.k} world={self.world_size} rank={self.rank} "
                f"{self.quant} wire={self.gather_dtype} m_max={self.m_max} {self.transport}: {state}>")


#: A window layout's fields but the per-M values (``call``): what one window's M values share.
_SHARED_WINDOW_FIELDS = tuple(f.name for f in dataclasses.fields(WindowLayout) if f.name != "call")


def _differing_fields(a: dict, b: dict) -> list[str]:
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def _mori_build_cco_sdma() -> bool | None:
    """mori's BUILD_CCO_SDMA flag, read from its file without importing mori's device package."""
    try:
        import ast
        import importlib.util
        from pathlib import Path

        spec = importlib.util.find_spec("mori")
        if spec is None or not spec.submodule_search_locations:
            return None
        path = Path(list(spec.submodule_search_locations)[0]) / "cco" / "device" / "_build_flags.py"
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "BUILD_CCO_SDMA"
                                                    for t in node.targets):
                return bool(ast.literal_eval(node.value))
    except Exception:  # noqa: BLE001 - only a hint
        return None
    return None
