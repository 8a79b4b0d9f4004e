"""``Mxfp8GemmOp`` and ``Mxfp8GemvOp``: mori's collective-free mxfp8 ops, from precompiled kernels.

Same constructor keywords, call signature, validation and results as
``mori.ops.gemm_ar.Mxfp8GemmOp`` (gemm.py) and ``Mxfp8GemvOp`` (gemv.py) in
amd-mori 1.2.4, plus ``artifacts`` (where the kernels are, as for
:class:`~.op.GemmAllReduceOp`), ``driver`` (the HIP driver) and ``device`` (the
GPU the operands live on; default: torch's current one).

* **Mxfp8GemmOp** owns two kernels per (N, K): the wide tile (BLOCK_N 256) and
  the narrow one (BLOCK_N 128) that a small grid switches to. M is a runtime
  argument (any multiple of 64), so the op serves every M whose tile was built;
  an M whose tile is missing raises :class:`~.artifact_errors.ArtifactMissingError` with
  the manifest lines that build it.
* **Mxfp8GemvOp** owns one kernel per M bucket (1, 2, 4, 8, 16, 32): M up to 32
  is a runtime argument within its bucket. A bucket that was not built is a miss.

Both count and report their misses (``miss_report=``, ``$GEMMAR_AOT_MISS_REPORT``;
``op.stats()``) as :class:`~.op.GemmAllReduceOp` does; ``on_miss="pad"`` is refused, since
neither has a padding that is mori's result (each class's ``_CANNOT_PAD`` says why).

Both verify every code object against its launch record before anything is
loaded, load each once, and launch without allocating device or argument memory:
the argument buffer is packed in place per call and the grid evaluated from the
record's own program (it depends on M). The only allocation is mori's: with
``out=None`` the result is a fresh tensor, as mori returns; pass ``out=`` to keep
a call allocation-free (and graph-capturable).

Runtime module: no FlyDSL, MLIR or mori import; torch lazily.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

from gemmar_aot.model import rules
from gemmar_aot.model.types import GEMM_ONLY, GEMV, TupleKey
from gemmar_aot.model.launch import LaunchRecord

from . import misses
from .artifacts import load_artifacts
from .driver import Driver
from .artifact_errors import ArtifactConflictError, ArtifactMismatchError, ArtifactMissingError
from .launches import Launch, prepare_launch
from .loading import Kernels, LoadedOp
from gemmar_aot.model.manifest_lines import manifest_snippet
from .memory import resolve_device
from .operands import FNUZ_REASON, check_operands
from .kernel_checks import EntryPosition

log = logging.getLogger("gemmar_aot.runtime")

#: Mxfp8GemmOp: rows of one packed A-scale group; M is a multiple of it.
SCALE_GROUP_M = 64
#: Mxfp8GemvOp: most tokens the skinny kernel serves.
MAX_TOKENS = rules.GEMV_MAX_M
M_BUCKETS = rules.GEMV_M_BUCKETS

#: The launchers' arguments, in order (kind, traced dtype).
_GEMM_ARGS = (("tensor", "int8"), ("tensor", "int8"), ("tensor", "bfloat16"), ("tensor", "int32"),
              ("tensor", "int32"), ("i32", ""), ("i32", ""), ("i64", ""), ("i64", ""), ("stream", ""))
_GEMV_ARGS = (("tensor", "int32"), ("tensor", "int32"), ("tensor", "int32"), ("tensor", "int32"),
              ("tensor", "bfloat16"), ("i32", ""), ("i32", ""), ("stream", ""))


class _StandaloneOp(LoadedOp):
    """What the two ops share: finding their kernels, loading them, closing."""

    transport = ""
    _ARGS: tuple = ()

    #: Why ``on_miss="pad"`` has no exact meaning for this op (each subclass says).
    _CANNOT_PAD = ""

    def _init_state(self, on_miss: str | None, miss_report: Any) -> None:
        self._init_loaded()
        self._launches: dict[Any, Launch] = {}
        self._on_miss = misses.policy(on_miss, cannot_pad=self._CANNOT_PAD)
        self._misses = misses.OpMisses(type(self).__name__, miss_report, self._miss_identity, rank=None)

    def _miss_identity(self) -> tuple[dict, str | None, list[str]]:
        artifacts = getattr(self, "artifacts", None)
        return misses.tuple_identity(self._key(), None), misses.profile_of(artifacts), misses.lock_digests(artifacts)

    def _missing(self, err: ArtifactMissingError, m: int | None) -> ArtifactMissingError:
        """``err``, counted and reported (the miss report, :meth:`stats`) at ``m``."""
        self._misses.miss(m, type(err).__name__)
        return err

    def stats(self) -> dict:
        """Misses per M (None: the op was asked for (N, K) none were built for)."""
        return {"misses": dict(self._misses.counts), "transport": self.transport}

    def _entries(self, artifacts: Any, select, trusted_keys: Any = None) -> dict[Any, Any]:
        """slot -> the lock entry whose kernel serves it; ``select(m, entry)`` names the slot or None."""
        self.artifacts = load_artifacts(artifacts, trusted_keys=trusted_keys)
        found: dict[Any, Any] = {}
        for key, by_m in self.artifacts.index.items():
            if (key.transport, key.n, key.k, key.quant) != (self.transport, self.n, self.k, "mxfp8"):
                continue
            for m, by_rank in sorted(by_m.items()):
                e = by_rank.get(0)
                slot = None if e is None else select(m, e)
                if slot is None:
                    continue
                old = found.get(slot)
                if old is not None and old.launches[0].blob != e.launches[0].blob:
                    raise ArtifactConflictError(
                        f"conflicting {self.transport} kernels for N={self.n} K={self.k} ({slot}): {old.where} and "
                        f"{e.where} name different code objects. Remove one, or point artifacts= at exactly one")
                found.setdefault(slot, e)
        return found

    def _acquire(self, entries: dict[Any, Any], driver: Driver | None, device: Any, fixed) -> None:
        """Verify every code object, then load each once and prepare its launch (:mod:`.loading`);
        roll back on failure. ``fixed(record)``: the host parameters that never change per call."""
        for e in entries.values():
            record = e.launches[0].launch
            kinds = tuple((a.kind, a.dtype) for a in record.args)
            if tuple(k for k, _ in kinds) != tuple(k for k, _ in self._ARGS) or any(
                    d and w and d != w for (_, d), (_, w) in zip(kinds, self._ARGS)):
                raise ArtifactMismatchError(f"{e.where} {e.launches[0].kind} (blob {e.launches[0].blob.hash[:12]}): "
                                            f"the launcher takes {kinds}, this op passes {self._ARGS}")
            # a call's values go to the parameters in order: a tensor is (pointer, length), the rest one each
            bad = [a.name for a in record.args if len(a.params) != (2 if a.kind == "tensor" else 1)]
            if bad:
                raise ArtifactMismatchError(f"{e.where} {e.launches[0].kind}: the launcher's arguments {bad} do not "
                                            f"take one host parameter each (two for a tensor); rebuild it")

        def position(e, le) -> EntryPosition:  # no window, no rank: checked for its kind, K and quant
            i = e.tuple.id
            return EntryPosition(transport=i.transport, kind=le.kind, rank=e.rank, world=i.world, m=e.m, slot=-1,
                                 m_max=0, n=i.n, k=i.k, quant=i.quant, gather_dtype=i.gather_dtype,
                                 gather_transport=i.gather_transport, block_m=i.block_m)

        def acquire(kernels: Kernels) -> None:
            for slot, e in entries.items():
                le = e.launches[0]
                record, given = le.launch, fixed(le.launch)
                self._launches[slot] = prepare_launch(
                    kind=le.kind, digest=le.blob.hash, record=record, kernel=kernels.kernel[le.blob.hash],
                    function=kernels.function[le.blob.hash], fixed=given, where=f"{e.where} {le.kind}",
                    per_call=tuple(p for a in record.args if a.kind != "stream" for p in a.params if p not in given))

        self._load(self.artifacts, list(entries.values()), driver=driver, device=lambda: resolve_device(device),
                   launches=lambda e: e.launches[:1], position=position, acquire=acquire)

    def _key(self) -> TupleKey:
        return TupleKey.make(transport=self.transport, n=self.n, k=self.k, world=1, quant="mxfp8",
                             gather_dtype="bf16", gather_transport=None, block_m=rules.MXFP8_BLOCK_M, sdma_queues=1)

    def _snippet(self, ms: Sequence[int]) -> str:
        return manifest_snippet(self._key(), ms, None)

    @property
    def driver(self):
        return self._driver

    def close(self) -> None:
        """Unload the modules. Idempotent; synchronise first if launches may be in flight."""
        if self._closed:
            return
        self._closed = True
        self._launches.clear()
        errors: list = []
        self._release_loaded((), errors)
        if errors:
            raise errors[0]

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _stream(self) -> int:
        if self._closed:
            raise RuntimeError(f"this {type(self).__name__} has been closed")
        return self._driver.current_stream(self.device)


def _check_out(out, m: int, n: int, device):
    import torch

    if out is None:
        return torch.empty((m, n), dtype=torch.bfloat16, device=device)
    if tuple(out.shape) != (m, n) or out.dtype != torch.bfloat16:
        raise ValueError(f"out must be {(m, n)} bfloat16, got {tuple(out.shape)} {out.dtype}")
    if out.device != device:
        raise ValueError(f"out must be on the op's device {device}, got {out.device}")
    if not out.is_contiguous():
        raise ValueError("out must be contiguous: the kernel writes it as a flat [M*N] buffer")
    return out


# ---------------------------------------------------------------------------
# Mxfp8GemmOp
# ---------------------------------------------------------------------------


class Mxfp8GemmOp(_StandaloneOp):
    """The mxfp8 GEMM for one ``(N, K)``, every M a multiple of 64, from precompiled kernels.

    ::

        op = Mxfp8GemmOp(n=8192, k=1280)
        out = op(a_fp8, b_preshuffled, a_scale, b_scale)   # [M, N] bf16

    Operands as mori's: ``b_preshuffled`` through ``preshuffle_b``, ``a_scale``
    through ``preshuffle_a_scale`` (flat int32), ``b_scale`` ``[N/32, K/32]`` ue8m0
    widened to int32.
    """

    transport = GEMM_ONLY
    _ARGS = _GEMM_ARGS

    _CANNOT_PAD = ("Mxfp8GemmOp takes M at run time, so a miss is a tile (narrow or wide) not built, for "
                   "every M that selects it; the other tile computes the product with another N tiling, which "
                   "is not mori's kernel for that M. Build the tile (gemmar-aot suggest)")

    def __init__(self, *, n: int, k: int, block_n: int = rules.DEFAULT_BLOCK_N, artifacts: Any = None,
                 driver: Driver | None = None, device: Any = None, trusted_keys: Any = None,
                 miss_report: Any = None, on_miss: str | None = None):
        self._init_state(on_miss, miss_report)
        why = rules.check_tile(rules.MXFP8_BLOCK_M, block_n) or rules.check_block_n(block_n)
        if why:
            raise ValueError(f"unsupported tile: {why}")
        why = rules.check_gemm_shape(n, k, block_n, "mxfp8")
        if why:
            raise ValueError(f"unsupported shape: {why}")
        self.n, self.k = n, k
        self.block_m, self.block_n = rules.MXFP8_BLOCK_M, block_n

        def select(m, e):
            if e.tuple.id.block_n != block_n:
                return None
            return "narrow" if rules.gemm_only_wants_narrow(m, n) else "wide"

        entries = self._entries(artifacts, select, trusted_keys)
        if not entries:
            raise self._missing(ArtifactMissingError(
                f"the artifacts hold no Mxfp8GemmOp kernels for N={n} K={k} block_n={block_n} (sources: "
                f"{self.artifacts.describe_sources()}); nothing is compiled at run time. Add to the manifest "
                f"and rebuild (an M of 256 builds the narrow tile, a large one the wide tile):\n"
                f"{self._snippet([256])}", m=None, manifest_lines=self._snippet([256])), None)

        def fixed(record: LaunchRecord) -> dict[int, int]:
            a = record.args
            return {a[6].params[0]: n, a[7].params[0]: 0, a[8].params[0]: 0}  # c_n; dev_comm, win unused

        self._acquire(entries, driver, device, fixed)

    @property
    def tiles(self) -> tuple[str, ...]:
        """Which of the two kernels this op holds: ``"narrow"`` and/or ``"wide"``."""
        return tuple(sorted(self._launches))

    def padded_m(self, m: int) -> int:
        """``m`` rounded up to a whole packed A-scale group."""
        return rules.gemm_only_padded_m(m)

    def wants_narrow_n(self, m: int) -> bool:
        """Whether this M runs the 128-wide N tile (the wide grid would be under 140 workgroups)."""
        return rules.gemm_only_wants_narrow(m, self.n)

    def pad_rows(self, x, m_pad: int):
        """Zero-extend ``x`` to ``m_pad`` rows in a buffer reused across calls (pad before quantising)."""
        import torch

        if x.dim() != 2:
            raise ValueError(f"expected a 2-D [M, K] tensor, got {tuple(x.shape)}")
        m, k = x.shape
        if m_pad < m:
            raise ValueError(f"m_pad={m_pad} is smaller than the input's M={m}")
        buf = getattr(self, "_pad_in", None)
        if buf is None or buf.shape[1] != k or buf.shape[0] < m_pad or buf.dtype != x.dtype \
                or buf.device != x.device:
            buf = self._pad_in = torch.empty((m_pad, k), dtype=x.dtype, device=x.device)
        out = buf[:m_pad]
        out[:m].copy_(x)
        out[m:].zero_()
        return out

    def missing_error(self, m: int) -> ArtifactMissingError:
        tile = "narrow (BLOCK_N 128)" if self.wants_narrow_n(m) else "wide (BLOCK_N 256)"
        snippet = self._snippet([m])
        return ArtifactMissingError(
            f"no precompiled Mxfp8GemmOp kernel for M={m} at N={self.n} K={self.k}: this M runs the {tile} "
            f"tile, and the artifacts hold only {' and '.join(self.tiles)}; nothing is compiled at run time. "
            f"Add an M that runs it to the manifest and rebuild (gemmar-aot build), e.g.:\n{snippet}",
            m=m, manifest_lines=snippet)

    def __call__(self, a_fp8, b_preshuffled, a_scale, b_scale, out=None):
        """``a_fp8 @ b_preshuffled.T`` with 32-wide ue8m0 scales, into bf16 ``[M, N]``.

        M must already be a multiple of 64 (pad the bf16 input with :meth:`pad_rows`
        before quantising). With ``out=None`` a new tensor is returned, as mori does.
        """
        stream = self._stream()
        m = a_fp8.shape[0]
        if m % SCALE_GROUP_M:
            raise ValueError(f"M={m} must be a multiple of {SCALE_GROUP_M} (the packed A scale's group); pad "
                             f"the bf16 input with pad_rows() before quantising, not the fp8 afterwards")
        launch = self._launches.get("narrow" if self.wants_narrow_n(m) else "wide")
        if launch is None:
            raise self._missing(self.missing_error(m), m)
        n, k = self.n, self.k
        a, b, asc, bsc = check_operands(a_fp8, b_preshuffled, a_scale, b_scale, m=m, n=n, k=k, quant="mxfp8",
                                        device=self.device)
        out = _check_out(out, m, n, self.device)
        launch.launch(self._driver, stream, (
            a.data_ptr(), m * k, b.data_ptr(), n * k, out.data_ptr(), m * n,
            asc.data_ptr(), m * k // (4 * rules.MXFP8_BLOCK),
            bsc.data_ptr(), (n // rules.MXFP8_BLOCK) * (k // rules.MXFP8_BLOCK), m))
        return out

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"tiles {list(self.tiles)}"
        return f"<gemmar_aot Mxfp8GemmOp n={self.n} k={self.k} block_n={self.block_n}: {state}>"


# ---------------------------------------------------------------------------
# Mxfp8GemvOp
# ---------------------------------------------------------------------------


class Mxfp8GemvOp(_StandaloneOp):
    """The skinny mxfp8 matmul for one ``(N, K)``, M up to 32, from precompiled kernels.

    ::

        op = Mxfp8GemvOp(n=8192, k=1280)
        out = op(x_fp8, w_preshuffled, x_scale, w_scale)   # [M, N] bf16

    ``w_preshuffled`` through ``preshuffle_b`` (shared with Mxfp8GemmOp); both
    scales as the checkpoint stores them: row-major ue8m0 bytes ``[M, K/32]`` and
    ``[N/32, K/32]`` (torch.uint8).
    """

    transport = GEMV
    _ARGS = _GEMV_ARGS

    _CANNOT_PAD = ("each Mxfp8GemvOp bucket is compiled with its own tuned configuration (waves, steps, "
                   "split K), so a larger bucket's kernel sums in another order than mori's kernel for this M. "
                   "Build the bucket (gemmar-aot suggest)")

    def __init__(self, *, n: int, k: int, artifacts: Any = None, driver: Driver | None = None,
                 device: Any = None, trusted_keys: Any = None, miss_report: Any = None, on_miss: str | None = None):
        self._init_state(on_miss, miss_report)
        if rules.check_mxfp8_gemv(n, k):
            raise ValueError(f"unsupported shape N={n} K={k}: K must be a multiple of {rules.GEMV_STEP_K} and N "
                             f"of {rules.MXFP8_BLOCK}")
        self.n, self.k = n, k
        entries = self._entries(artifacts, lambda m, e: m if m in M_BUCKETS else None, trusted_keys)
        if not entries:
            snippet = self._snippet(list(M_BUCKETS))
            raise self._missing(ArtifactMissingError(
                f"the artifacts hold no Mxfp8GemvOp kernels for N={n} K={k} (sources: "
                f"{self.artifacts.describe_sources()}); nothing is compiled at run time. Add to the manifest "
                f"and rebuild:\n{snippet}", m=None, manifest_lines=snippet), None)
        self._acquire(entries, driver, device, lambda record: {record.args[6].params[0]: n})

    @property
    def buckets(self) -> tuple[int, ...]:
        """The M buckets this op serves (each serves every M up to it, above the previous bucket)."""
        return tuple(sorted(self._launches))

    def missing_error(self, m: int) -> ArtifactMissingError:
        bucket = rules.gemv_bucket(m)
        snippet = self._snippet([bucket])
        return ArtifactMissingError(
            f"no precompiled Mxfp8GemvOp kernel for M={m} (bucket {bucket}) at N={self.n} K={self.k}; this op "
            f"serves buckets {list(self.buckets)} and nothing is compiled at run time. Add the bucket to the "
            f"manifest and rebuild (gemmar-aot build), e.g.:\n{snippet}",
            m=m, available=self.buckets, manifest_lines=snippet)

    def _check(self, x_fp8, w, x_scale, w_scale, m: int) -> None:
        """mori's checks, in its order: shapes and fp8 dtype of X and W, then the uint8 scales."""
        import torch

        for name, t, shape in (("x_fp8", x_fp8, (m, self.k)), ("w_preshuffled", w, (self.n, self.k))):
            if t.dim() != 2 or tuple(t.shape) != shape:
                raise ValueError(f"{name} must be {shape}, got {tuple(t.shape)}")
            if t.dtype != torch.float8_e4m3fn:
                if t.dtype == getattr(torch, "float8_e4m3fnuz", None):
                    raise ValueError(f"{name} is torch.float8_e4m3fnuz; {FNUZ_REASON}")
                raise ValueError(f"{name} must be torch.float8_e4m3fn, got {t.dtype}; the launch reads it as "
                                 f"bytes, so a wider dtype runs and returns nonsense rather than failing")
            if t.device != self.device:
                raise ValueError(f"{name} must be on the op's device {self.device}, got {t.device}")
        kb = self.k // rules.MXFP8_BLOCK
        for name, t, shape in (("x_scale", x_scale, (m, kb)), ("w_scale", w_scale, (self.n // rules.MXFP8_BLOCK,
                                                                                     kb))):
            if t.dtype != torch.uint8:
                raise ValueError(f"{name} must be torch.uint8 ue8m0, got {t.dtype}")
            if t.dim() != 2 or tuple(t.shape) != shape:
                raise ValueError(f"{name} must be {shape}, got {tuple(t.shape)}")
            if t.device != self.device:
                raise ValueError(f"{name} must be on the op's device {self.device}, got {t.device}")

    def __call__(self, x_fp8, w_preshuffled, x_scale, w_scale, out=None):
        """``x_fp8 @ w_preshuffled.T`` with 32-wide ue8m0 scales, into bf16 ``[M, N]``; no padding needed."""
        stream = self._stream()
        m = x_fp8.shape[0]
        if m > MAX_TOKENS:
            raise ValueError(f"M={m} exceeds the skinny kernel's {MAX_TOKENS} tokens; use Mxfp8GemmOp above it")
        self._check(x_fp8, w_preshuffled, x_scale, w_scale, m)
        launch = self._launches.get(rules.gemv_bucket(m)) if m >= 1 else None
        if launch is None:
            if m < 1:
                raise ValueError(f"M={m}: x_fp8 must have at least one row")
            raise self._missing(self.missing_error(m), rules.gemv_bucket(m))  # the bucket is what to build
        out = _check_out(out, m, self.n, self.device)
        n, k, kb = self.n, self.k, self.k // rules.MXFP8_BLOCK
        x, w, xs, ws = (t if t.is_contiguous() else t.contiguous() for t in (x_fp8, w_preshuffled, x_scale, w_scale))
        launch.launch(self._driver, stream, (
            w.data_ptr(), n * k // 4, ws.data_ptr(), (n // rules.MXFP8_BLOCK) * kb // 4,
            x.data_ptr(), m * k // 4, xs.data_ptr(), m * kb // 4, out.data_ptr(), m * n, m))
        return out

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"buckets {list(self.buckets)}"
        return f"<gemmar_aot Mxfp8GemvOp n={self.n} k={self.k}: {state}>"
