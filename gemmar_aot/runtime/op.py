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
                  ``$GEMMAR_AOT_TRUSTED_KEYS``; none: not authenticated; :mod:`gemmar_aot.trust`);
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
  :class:`~.artifact_errors.ArtifactMissingError` naming the M, the nearest built M values
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

import logging
import time
from typing import Any

from gemmar_aot.model import rules
from gemmar_aot.model.types import LaunchEntry

from . import misses, self_test as tests
from .artifacts import Artifacts, RankEntry, TupleKey, load_artifacts
from .driver import Driver
from .artifact_errors import ArtifactMismatchError, ArtifactMissingError
from .gc_pause import gc_paused
from .launches import Launch, prepare_launch
from .loading import Kernels, LoadedOp
from gemmar_aot.model.manifest_lines import manifest_snippet, nearest
from .memory import communicator_device, dev_comm_requirements, tensor_at
from .operands import check_operands
from .padding import PadBuffers
from .kernel_checks import EntryPosition
from .support import TRANSPORT, checked_arguments, supports
from .window import check_layouts, window_bytes_for

log = logging.getLogger("gemmar_aot.runtime")

DEFAULT_BLOCK_N = rules.DEFAULT_BLOCK_N
#: The GEMM launcher's arguments, in order: (kind, dtype per quant or None).
_GEMM_ARGS = ("tensor", "tensor", "tensor", "tensor", "tensor", "i32", "i32", "i64", "i64", "stream")
_PHASE_ARGS = ("i64", "i64", "stream")


class _Plan:
    """One M, resolved: the GEMM (its four operand pointers written per call), the tail phases,
    the self-test sequence, the window views."""

    __slots__ = ("m", "slot", "entry", "gemm", "tail", "self_test", "input", "output", "calls")

    def __init__(self, m: int, slot: int, entry: RankEntry, gemm: Launch, tail: tuple, self_test: tuple,
                 input, output):
        self.m, self.slot, self.entry = m, slot, entry
        self.gemm, self.tail, self.self_test = gemm, tail, self_test
        self.input, self.output = input, output
        self.calls = 0  # served calls at this M (op.stats())


class GemmAllReduceOp(LoadedOp):
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
        self._init_state()  # first, so a failure anywhere below can roll back through close()
        block_m, m_max_pad, max_shapes, self._on_miss = checked_arguments(
            comm, n=n, k=k, m_max=m_max, block_m=block_m, block_n=block_n, sdma_queues=sdma_queues,
            gather_dtype=gather_dtype, gather_transport=gather_transport, quant=quant, max_shapes=max_shapes,
            jit_fallback=jit_fallback, transport=transport, on_miss=on_miss)
        self.comm = comm
        self.rank, self.world_size = int(comm.rank), int(comm.nranks)
        self.n, self.k = n, k
        self.quant = quant
        self.block_m, self.block_n = block_m, block_n
        self.sdma_queues = sdma_queues
        self.gather_dtype, self.gather_transport = gather_dtype, gather_transport
        self.max_shapes = max_shapes
        self.m_max = m_max_pad
        self._jit_fallback = bool(jit_fallback)
        self._misses = misses.OpMisses(type(self).__name__, miss_report, self._miss_identity, rank=self.rank)
        self.transport = transport
        ordered = self._find_entries(artifacts, trusted_keys)

        def acquire(kernels: Kernels) -> None:
            self._acquire(ordered, kernels)
            if self_test:
                self.self_test()
            if self_test_gemm:
                self.self_test_gemm()

        self._load(self.artifacts, ordered, driver=driver, device=lambda: communicator_device(comm), comm=comm,
                   launches=lambda e: (*e.launches, *e.self_test), position=self._position, acquire=acquire)
        self._startup_seconds = time.perf_counter() - t_start

    def _init_state(self) -> None:
        """What close() reads: nothing acquired yet."""
        self._init_loaded()
        self._startup_seconds: float | None = None
        self._padded_rows = 0
        self._pad: PadBuffers | None = None
        self._buckets: tuple[int, ...] = ()
        self.mem = self.win = self.dev_comm = None
        self._plans: dict[int, _Plan] = {}
        self._phases: dict[str, Launch] = {}
        self._entries: dict[int, RankEntry] = {}
        self._pad_in = None
        self._fallback = None

    def _find_entries(self, artifacts: Any, trusted_keys: Any) -> list[RankEntry]:
        """Every M held for this op and rank (built for every rank), with one shared window
        layout, in M order; raises the miss error when there is none."""
        self.artifacts: Artifacts = load_artifacts(artifacts, trusted_keys=trusted_keys)
        world, rank = self.world_size, self.rank
        self.key = TupleKey.make(transport=self.transport, n=self.n, k=self.k, world=world, quant=self.quant,
                                 gather_dtype=self.gather_dtype, gather_transport=self.gather_transport,
                                 block_m=self.block_m, sdma_queues=self.sdma_queues)
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
        self.window_bytes = check_layouts(entries, world=world, n=self.n, m_max=self.m_max, block_m=self.block_m,
                                          block_n=self.block_n, gather_dtype=self.gather_dtype,
                                          max_shapes=self.max_shapes)
        return [e for _m, e in sorted(entries.items())]

    def _acquire(self, ordered: list[RankEntry], kernels: Kernels) -> None:
        """Acquire (on the op's device, the kernels loaded): the window (zeroed), the dev comm; then
        one plan per M. The loading path rolls back on failure."""
        comm, driver = self.comm, self._driver
        self.mem = comm.alloc_mem(self.window_bytes)
        self.win = comm.register_window(self.mem.ptr, self.mem.size)
        # Counters live in the window and are read before first written: zero it once,
        # completely, before any peer can run the protocol.
        driver.memset(self.mem.ptr, 0, self.window_bytes)
        self.dev_comm = comm.create_dev_comm(dev_comm_requirements(comm, self.sdma_queues))
        comm.barrier()
        shared: dict = {}  # what the M values' launches have in common, derived once
        for e in ordered:
            self._plans[e.m] = self._make_plan(e, kernels, shared)
        if self._on_miss == "pad":
            self._buckets = tuple(sorted(self._plans))
            self._pad = PadBuffers(self._buckets[-1], self.k, self.quant, self.device)

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

    def _position(self, e: RankEntry, le: LaunchEntry) -> EntryPosition:
        """Where a lock entry's launch ``le`` sits, for checking it against its record."""
        i, lay, kind = e.tuple.id, e.tuple.layout, le.kind
        # positional, in field order: made per launch entry, and a named tuple by keyword costs twice as much
        return EntryPosition(i.transport, kind, e.rank, i.world, e.m, lay.call.slot, lay.m_max, i.n, i.k, i.quant,
                             i.gather_dtype, i.gather_transport, i.block_m)

    def _make_plan(self, e: RankEntry, kernels: Kernels, shared: dict | None = None) -> _Plan:
        m = e.m
        lay = e.layout
        launches = list(e.launches)
        if not launches or launches[0].kind != "gemm":
            raise ArtifactMismatchError(f"{e.where}: M={m}'s launch sequence does not start with the GEMM")
        c_ptr = self.mem.ptr + lay.input_off
        dev_comm, win = int(self.dev_comm.ptr), int(self.win.handle)
        phases = self._phases  # action key -> prepared phase: its arguments are the same for every M

        def phase(le: LaunchEntry) -> Launch:
            p = phases.get(le.key)
            if p is None:
                p = phases[le.key] = prepare_phase(le)
            return p

        def prepare_phase(le: LaunchEntry) -> Launch:
            rec = le.launch
            kinds = tuple(a.kind for a in rec.args)
            if kinds != _PHASE_ARGS:
                raise ArtifactMismatchError(f"{e.where}: phase {le.kind} takes {kinds}, expected "
                                            f"(dev_comm, win, stream)")
            d = le.blob.hash
            return prepare_launch(kind=le.kind, digest=d, record=rec, kernel=kernels.kernel[d],
                                  function=kernels.function[d], where=f"{e.where} {le.kind}",
                                  fixed={rec.args[0].params[0]: dev_comm, rec.args[1].params[0]: win},
                                  cache=shared)

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
        gemm = prepare_launch(kind="gemm", digest=d, record=rec, kernel=kernels.kernel[d],
                              function=kernels.function[d], where=f"{e.where} gemm", fixed=fixed,
                              per_call=(a.params[0], b.params[0], asc.params[0], bsc.params[0]), cache=shared)
        if gemm.grid is None:
            raise ArtifactMismatchError(f"{e.where}: the GEMM's grid or block depends on its operand pointers; "
                                        f"this op resolves them once per M. Rebuild with this gemmar-aot version")
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

    def _launch(self, plan: _Plan, g: Launch):
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

    def _write_pointers(self, plan: _Plan, a, b, asc, bsc) -> Launch:
        """Checked operands' pointers into the GEMM's preallocated kernel arguments."""
        g = plan.gemm
        g.pack((a.data_ptr(), b.data_ptr(), asc.data_ptr(), bsc.data_ptr()))
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

    def _padded_call(self, m: int, bucket: int, a_fp8, b_preshuffled, a_scale, b_scale):
        """Serve M with ``bucket``'s kernels (``on_miss="pad"``; :mod:`.padding` says why that is
        mori's result for M), the operands checked at M as mori checks them; the first M rows."""
        a, b, asc, bsc = check_operands(a_fp8, b_preshuffled, a_scale, b_scale, m=m, n=self.n, k=self.k,
                                        quant=self.quant, device=self.device)
        pa, pscale = self._pad.fill(m, bucket, a, asc)
        self._padded_rows += bucket - m
        self._report_miss(m, None, served=bucket)
        plan = self._plans[bucket]
        # The buffers are the op's own, shaped for the bucket: no second operand check.
        return self._launch(plan, self._write_pointers(plan, pa, b, pscale, bsc))[:m]

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

        Runs the recorded self-test sequence (scatter -> reduce -> gather, plus the fp8 wire's
        quantize/pull steps) at ``m`` (default: m_max, or the largest M built); see
        :func:`.self_test.all_reduce_moves_bytes` for the silent failure it exists for.
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
        tests.all_reduce_moves_bytes(launches=plan.self_test, input=plan.input, output=plan.output,
                                     driver=self._driver, stream=self._driver.current_stream(self.device),
                                     world=self.world_size, rank=self.rank, m=m, transport=self.transport)

    def self_test_gemm(self, m: int | None = None) -> None:
        """Check the whole call, GEMM included: a constant problem with a known all-reduced answer
        (:func:`.self_test.constant_problem`), one ordinary call at ``m`` (default: the smallest M
        built, the cheapest). Collective, like every call: every rank must run it."""
        if self._closed:
            raise RuntimeError("this GemmAllReduceOp has been closed")
        if m is None:
            m = min(self._plans)
        if m not in self._plans:
            raise self.missing_error(m)
        tests.constant_problem(self, m)

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
        self._pad = None
        errors: list = []
        if self._fallback is not None:
            try:
                self._fallback.close()
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)
            self._fallback = None
        self._release_loaded((self.win, self.mem), errors)  # deregister before free
        self.win = self.mem = None
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
