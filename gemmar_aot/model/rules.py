"""The arithmetic rules of ``mori.ops.gemm_ar`` (amd-mori 1.2.4), as plain Python.

Nothing here imports torch, FlyDSL or mori: the manifest validator, the planner
and the runtime all need these answers, and the runtime must stay importable on a
machine that has none of the build toolchain.

Two groups of things live here:

* **Shape helpers** -- how M is padded, how many chunks a destination's row bands
  are pushed in, how many counter sets a window holds, and which counter set an M
  uses (:func:`counter_slot`, our deterministic replacement for the op's
  first-seen assignment; the runtime must use the same rule).
* **Checks** -- one function per rule the op enforces, each returning a short
  reason string when the rule is broken and ``None`` when it holds. They are
  listed in the order the op applies them, and :func:`check_gemm_ar` /
  :func:`check_mxfp8_gemm` run them in that order and return the first failure,
  which is what the op's constructor (or ``Mxfp8GemmOp``) would raise on.
The window layout, computed from these rules, is :func:`gemmar_aot.model.layout.window_layout`.

All lengths are in bytes unless a name says otherwise. ``A(x)`` in comments is
"round ``x`` up to a multiple of 128".
"""

from __future__ import annotations



# ---- Constants ----

#: Quantisations the fused op accepts.
QUANTS = ("blockscale", "mxfp8")
#: What the gather leg may carry, and who moves it when it is fp8.
GATHER_DTYPES = ("bf16", "fp8")
GATHER_TRANSPORTS = ("sdma", "lsa")

#: Largest number of pushes one destination's row bands are split into.
MAX_CHUNKS = 8
#: Block-scale group along K (A is 1x128, B is 128x128); also the scaled MFMA's K step.
SCALE_BLOCK_K = 128
#: The GEMM mainloop's K block.
BLOCK_K = 128
#: The mainloop needs at least two K blocks (a prefetch plus two tail steps).
MIN_K = 2 * BLOCK_K
#: mxfp8 (ue8m0) group on both operands, along K and along N.
MXFP8_BLOCK = 32
#: The only N tile the permlane epilogue can store.
DEFAULT_BLOCK_N = 256
#: Default M tile per quantisation. mxfp8 *requires* 256 (its packed A scale
#: holds four 64-row tiles per dword); 128 is blockscale's measured best.
DEFAULT_BLOCK_M = {"blockscale": 128, "mxfp8": 256}
MXFP8_BLOCK_M = 256
#: Tile granules the mainloop is written for: a tile must be a positive
#: multiple of these.
TILE_M_GRANULE = 128
TILE_N_GRANULE = 256

#: Mxfp8GemmOp (gemm-only): M only needs to be a multiple of the packed A-scale
#: group, and it owns two kernels -- the wide tile (BLOCK_N=256, permlane store)
#: and the narrow one (BLOCK_N=128) picked when the wide grid is small.
GEMM_ONLY_M_GRANULE = 64
NARROW_BLOCK_N = 128
WIDE_TILE_MIN_GRID = 140

#: Mxfp8GemvOp (gemv): the skinny kernel for decode M. A token is an MFMA row and
#: two 16-row tiles of them is its ceiling; one kernel per M bucket, each serving
#: every M up to the bucket (M is a runtime argument, the token tile masks).
GEMV_MAX_M = 32
GEMV_M_BUCKETS = (1, 2, 4, 8, 16, 32)
GEMV_STEP_K = 128  # K per MFMA step
GEMV_TILE = 16  # rows of one MFMA tile, on both operands

#: World sizes: 2 <= ws <= MAX_WORLD and the 512-thread blocks split evenly.
MAX_WORLD = 8
THREADS = 512
WORLD_SIZES = tuple(w for w in range(2, MAX_WORLD + 1) if THREADS % w == 0)  # (2, 4, 8)

#: Window-layout constants.
ALIGN = 128  # every region is 128-byte aligned
PACK_BYTES = 16  # the payload is moved in 16-byte packs
K_MAX_BLOCKS = 80  # rows of the barrier signal arrays
GATHER_BANDS = 8  # band counters per shape for the gather leg
FP8_GATHER_N_MULTIPLE = 16 * 64  # one wave per row, 16 elements per lane per chunk
BF16_BYTES = 2
LSA_BLOCK_CAP = 24  # grid cap of the LSA all-reduce
SDMA_REDUCE_BLOCK_CAP = 256  # grid cap of the SDMA reduce
#: The LSA all-reduce runs one stage below these payload sizes.
LSA_ONE_STAGE_MAX_BYTES_LE4 = 160 * 1024
LSA_ONE_STAGE_MAX_BYTES_LE8 = 80 * 1024

#: Kernel arguments c_m and c_n, and every flat buffer's element count, are
#: 32-bit signed integers.
INT32_MAX = 2**31 - 1


def align_up(value: int, alignment: int = ALIGN) -> int:
    """``value`` rounded up to a multiple of ``alignment``."""
    return (value + alignment - 1) // alignment * alignment


# ---- Shape helpers ----


def default_block_m(quant: str) -> int:
    """The M tile a quantisation uses when none is given."""
    return DEFAULT_BLOCK_M.get(quant, DEFAULT_BLOCK_M["blockscale"])


def padded_m(m: int, world: int, block_m: int = 128) -> int:
    """``m`` rounded up to whole row bands per destination (``world*block_m``)."""
    granule = world * block_m
    if granule <= 0:
        raise ValueError(f"world*block_m must be positive, got {world}*{block_m}")
    return -(-m // granule) * granule


def gemm_only_padded_m(m: int) -> int:
    """``m`` rounded up to the mxfp8 GEMM's packed A-scale group (64 rows)."""
    return -(-m // GEMM_ONLY_M_GRANULE) * GEMM_ONLY_M_GRANULE


def bands(m_pad: int, world: int, block_m: int) -> int:
    """Row bands (of ``block_m`` rows) each destination receives."""
    return m_pad // (world * block_m)


def counter_chunks(m_pad: int, world: int, block_m: int = 128) -> int:
    """How many pushes a destination's bands are split into.

    The largest ``c <= min(MAX_CHUNKS, bands)`` that divides the band count: the
    completion counter only fires when the chunks divide evenly.
    """
    b = bands(m_pad, world, block_m)
    if b < 1:
        raise ValueError(
            f"m_pad={m_pad} is less than one row band per destination "
            f"(world*block_m = {world * block_m})"
        )
    for c in range(min(MAX_CHUNKS, b), 0, -1):
        if b % c == 0:
            return c
    return 1  # unreachable: c = 1 always divides


def default_max_shapes(m_pad_max: int, world: int, block_m: int) -> int:
    """Counter sets a window holds: one for every padded M up to ``m_pad_max``."""
    return max(1, m_pad_max // (world * block_m))


def counter_slot(m_pad: int, world: int, block_m: int) -> int:
    """The counter set an M uses.

    The op hands out sets in first-seen order, which makes the compiled layout
    depend on call history. We fix it instead: padded M values are the multiples
    of ``world*block_m``, so M's slot is its band count minus one. Every slot is
    below :func:`default_max_shapes` of any ``m_max >= m_pad``.
    """
    slot = m_pad // (world * block_m) - 1
    if slot < 0 or m_pad % (world * block_m):
        raise ValueError(
            f"m_pad={m_pad} is not a positive multiple of world*block_m = "
            f"{world * block_m}"
        )
    return slot


def gemm_only_wants_narrow(m: int, n: int) -> bool:
    """Whether Mxfp8GemmOp runs its narrow (BLOCK_N=128) kernel for this M.

    The choice depends on the wide tile's grid, ``ceil(M/256) * N/256``: below
    :data:`WIDE_TILE_MIN_GRID` workgroups the narrow tile is faster.
    """
    wide_grid = -(-m // MXFP8_BLOCK_M) * (n // DEFAULT_BLOCK_N)
    return wide_grid < WIDE_TILE_MIN_GRID


def gemv_bucket(m: int) -> int:
    """The smallest M bucket covering ``m`` (Mxfp8GemvOp's ``m_bucket``)."""
    for b in GEMV_M_BUCKETS:
        if m <= b:
            return b
    raise ValueError(f"M={m} exceeds the skinny kernel's {GEMV_MAX_M} tokens")


def lsa_stage(world: int, nbytes: int) -> int:
    """1 or 2: which LSA all-reduce kernel runs for a ``nbytes`` payload."""
    if world == 2:
        return 1
    if world <= 4 and nbytes < LSA_ONE_STAGE_MAX_BYTES_LE4:
        return 1
    if world <= 8 and nbytes < LSA_ONE_STAGE_MAX_BYTES_LE8:
        return 1
    return 2


# ---- Checks: each returns a reason string, or None when the rule holds, in the op's order ----


def check_quant(quant: str) -> str | None:
    if quant not in QUANTS:
        return f"quant must be one of {', '.join(QUANTS)}"
    return None


def check_block_m_for_quant(quant: str, block_m: int) -> str | None:
    if quant == "mxfp8" and block_m != MXFP8_BLOCK_M:
        return (
            f"mxfp8 requires block_m = {MXFP8_BLOCK_M} (its packed A scale holds a "
            f"lane's four 64-row M tiles in one dword)"
        )
    return None


def check_gather_dtype(gather_dtype: str) -> str | None:
    if gather_dtype not in GATHER_DTYPES:
        return f"gather_dtype must be one of {', '.join(GATHER_DTYPES)}"
    return None


def check_gather_transport(gather_transport: str) -> str | None:
    if gather_transport not in GATHER_TRANSPORTS:
        return f"gather_transport must be one of {', '.join(GATHER_TRANSPORTS)}"
    return None


def check_block_n(block_n: int) -> str | None:
    """The permlane epilogue pairs exactly two 128-wide N tiles."""
    if block_n != DEFAULT_BLOCK_N:
        return (
            f"block_n must be exactly {DEFAULT_BLOCK_N} (the permlane epilogue "
            f"pairs exactly two N tiles)"
        )
    return None


def check_tile(block_m: int, block_n: int, n_granule: int = TILE_N_GRANULE) -> str | None:
    """Both tile sides must be positive multiples of the mainloop's granules."""
    for name, value, granule in (
        ("block_m", block_m, TILE_M_GRANULE),
        ("block_n", block_n, n_granule),
    ):
        if value < granule or value % granule:
            return (
                f"{name} must be a positive multiple of {granule} (the mainloop's "
                f"MFMA tiling and LDS staging granule)"
            )
    return None


def check_m_max(m_max: int) -> str | None:
    if m_max < 1:
        return "m_max must be >= 1"
    return None


def check_sdma_queues(sdma_queues: int) -> str | None:
    if sdma_queues < 1:
        return "sdma_queues must be >= 1"
    return None


def check_max_shapes(max_shapes: int) -> str | None:
    if max_shapes < 1:
        return "max_shapes must be >= 1"
    return None


def check_k(k: int, quant: str = "blockscale") -> str | None:
    if k % SCALE_BLOCK_K:
        why = "the block-scale group" if quant == "blockscale" else "the scaled MFMA's K step"
        return f"K must be a multiple of {SCALE_BLOCK_K} ({why})"
    if k < MIN_K:
        return (
            f"K must be at least {MIN_K} (the mainloop prefetches a second K block "
            f"and runs two tail steps, so K/{BLOCK_K} >= 2)"
        )
    return None


def check_n(n: int, block_n: int = DEFAULT_BLOCK_N, quant: str = "blockscale") -> str | None:
    if n % block_n:
        return f"N must be a multiple of block_n = {block_n}"
    group = MXFP8_BLOCK if quant == "mxfp8" else SCALE_BLOCK_K
    if n % group:
        return f"N must be a multiple of {group} (the B scale group)"
    return None


def check_gemm_shape(n: int, k: int, block_n: int = DEFAULT_BLOCK_N, quant: str = "blockscale") -> str | None:
    """The GEMM's shape rules: K first, then N (the op's order)."""
    return check_k(k, quant) or check_n(n, block_n, quant)


def check_world(world: int) -> str | None:
    if not 2 <= world <= MAX_WORLD:
        return f"world must be in [2, {MAX_WORLD}] (one of {', '.join(map(str, WORLD_SIZES))})"
    if THREADS % world:
        return (
            f"world must divide the {THREADS}-thread block "
            f"(one of {', '.join(map(str, WORLD_SIZES))})"
        )
    return None


def check_m(m: int) -> str | None:
    if m < 1:
        return "M must be >= 1"
    return None


def check_payload(m_pad: int, n: int, world: int) -> str | None:
    """The bf16 payload must split into whole 16-byte packs per rank."""
    if (m_pad * n * BF16_BYTES) % (world * PACK_BYTES):
        return (
            f"the payload M*N*2 bytes must be a multiple of world*{PACK_BYTES} = "
            f"{world * PACK_BYTES} (whole 16-byte packs per rank)"
        )
    return None


def check_fp8_gather_n(n: int, gather_dtype: str) -> str | None:
    if gather_dtype == "fp8" and n % FP8_GATHER_N_MULTIPLE:
        return (
            f"an fp8 gather needs N to be a multiple of {FP8_GATHER_N_MULTIPLE} "
            f"(one wave converts one row, 16 elements per lane per chunk)"
        )
    return None


def check_int32_extents(m: int, n: int, k: int) -> str | None:
    """c_m, c_n and every flat buffer's element count are int32 kernel arguments."""
    for what, value in (("M*K (A's elements)", m * k), ("N*K (B's elements)", n * k),
                        ("M*N (C's elements)", m * n)):
        if value > INT32_MAX:
            return f"{what} = {value} exceeds the int32 kernel-argument limit {INT32_MAX}"
    return None


#: Modes with an all-reduce (a window, one kernel set per rank), and the ones
#: whose tail runs SDMA phases (and so takes ``sdma_queues``).
COLLECTIVE_TRANSPORTS = ("fused-sdma", "split-sdma", "split-lsa", "fused-lsa")
SDMA_TRANSPORTS = ("fused-sdma", "split-sdma", "fused-lsa")
#: Collective-free modes, which implement only mxfp8.
MXFP8_ONLY_TRANSPORTS = ("gemm-only", "gemv")

#: One broken rule: (the argument to change, the rule's name, the reason).
Problem = tuple


def check_mode_quant(transport: str, quant: str) -> str | None:
    if transport in MXFP8_ONLY_TRANSPORTS and quant != "mxfp8":
        op = "Mxfp8GemmOp" if transport == "gemm-only" else "Mxfp8GemvOp"
        return f'transport "{transport}" is {op}, which implements only mxfp8'
    return None


def wire_problem(transport: str, gather_dtype: str | None, gather_transport: str | None) -> Problem | None:
    """The wires a mode has: split-lsa is one LSA kernel (bf16 only); fused-lsa is
    built and measured by mori on the bf16 wire only."""
    if transport == "split-lsa":
        if gather_dtype == "fp8":
            return ("gather_dtype", "wire_dtype", "the split-lsa all-reduce has no fp8 path")
        if gather_transport == "sdma":
            return ("gather_transport", "wire_transport", "split-lsa moves every byte over LSA")
    if transport == "fused-lsa" and gather_dtype == "fp8":
        return ("gather_dtype", "wire_dtype",
                "fused-lsa runs the bf16 gather only (mori builds and measures the Direct-LSA "
                "epilogue on the bf16 wire)")
    return None


def gemm_ar_problems(*, n, k, world, quant, block_m, block_n, gather_dtype="bf16", gather_transport="lsa",
                     sdma_queues=1, m_max=None, max_shapes=None, transport="fused-sdma"):
    """Every M-independent rule a collective op breaks, in the op's order, as Problems.

    The order is ``GemmAllReduceOp``'s constructor's: quant, tile-for-quant, wire,
    block_n, tile, m_max/sdma_queues/max_shapes, then the GEMM's shape (K, then N),
    world and the fp8 gather's N. ``block_m`` must already be resolved (its default
    depends on quant). An argument passed as None is one the caller already found
    invalid: rules that need it are skipped, so each problem is reported once.
    """
    if quant is not None and check_quant(quant):
        yield ("quant", "quant", check_quant(quant))
        quant = None
    if quant is not None and block_m is not None and check_block_m_for_quant(quant, block_m):
        yield ("block_m", "block_m_quant", check_block_m_for_quant(quant, block_m))
        block_m = None
    for field, value, check in (("gather_dtype", gather_dtype, check_gather_dtype),
                                ("gather_transport", gather_transport, check_gather_transport)):
        if value is not None and check(value):
            yield (field, field, check(value))
            if field == "gather_dtype":
                gather_dtype = None
            else:
                gather_transport = None
    wire = wire_problem(transport, gather_dtype, gather_transport)
    if wire:
        yield wire
        gather_dtype = None if wire[0] == "gather_dtype" else gather_dtype
    if block_n is not None and check_block_n(block_n):
        yield ("block_n", "block_n", check_block_n(block_n))
        block_n = None
    if block_m is not None and check_tile(block_m, block_n or DEFAULT_BLOCK_N):
        yield ("block_m", "tile_m", check_tile(block_m, block_n or DEFAULT_BLOCK_N))
        block_m = None
    for field, value, check in (("m_max", m_max, check_m_max), ("sdma_queues", sdma_queues, check_sdma_queues),
                                ("max_shapes", max_shapes, check_max_shapes)):
        if value is not None and check(value):
            yield (field, field, check(value))
    yield from _shape_problems(n, k, block_n, quant)
    if world is not None and check_world(world):
        yield ("world", "world", check_world(world))
    if n is not None and gather_dtype is not None and check_fp8_gather_n(n, gather_dtype):
        yield ("n", "fp8_gather_n", check_fp8_gather_n(n, gather_dtype))


def _shape_problems(n, k, block_n, quant, *, narrow_n: int | None = None):
    """K, then N (against block_n, or only the scale group when block_n is unknown)."""
    if k is not None and check_k(k, quant or "blockscale"):
        yield ("k", "k", check_k(k, quant or "blockscale"))
    if n is None:
        return
    if block_n is not None:
        why = check_n(n, block_n, quant or "blockscale")
        if why:
            yield ("n", "n", why)
        elif narrow_n is not None and check_n(n, narrow_n, quant or "blockscale"):
            yield ("n", "n_narrow", check_n(n, narrow_n, quant or "blockscale")
                   + " (the narrow kernel Mxfp8GemmOp uses at small grids)")
        return
    group = MXFP8_BLOCK if quant == "mxfp8" else SCALE_BLOCK_K
    if n % group:
        yield ("n", "n", f"N must be a multiple of {group} (the B scale group)")


def check_gemm_ar(
    m: int,
    n: int,
    k: int,
    world: int,
    *,
    block_m: int | None = None,
    block_n: int = DEFAULT_BLOCK_N,
    gather_dtype: str = "bf16",
    gather_transport: str = "lsa",
    quant: str = "blockscale",
    m_max: int | None = None,
    sdma_queues: int = 1,
    max_shapes: int | None = None,
    transport: str = "fused-sdma",
) -> str | None:
    """First reason a collective op (constructed for ``m_max``, called at ``m``) fails.

    ``m`` is the unpadded M; it is padded as the caller would. ``m_max`` defaults
    to ``m``. Returns None when the op accepts the shape.
    """
    if block_m is None:
        block_m = default_block_m(quant)
    if m_max is None:
        m_max = m
    for _field, _rule, why in gemm_ar_problems(
            n=n, k=k, world=world, quant=quant, block_m=block_m, block_n=block_n, gather_dtype=gather_dtype,
            gather_transport=gather_transport, sdma_queues=sdma_queues, m_max=m_max, max_shapes=max_shapes,
            transport=transport):
        return why
    why = check_m(m)
    if why:
        return why
    m_pad = padded_m(m, world, block_m)
    m_max_pad = padded_m(m_max, world, block_m)
    if m_pad > m_max_pad:
        return f"M (padded {m_pad}) exceeds m_max (padded {m_max_pad})"
    return (
        check_payload(m_max_pad, n, world)
        or check_payload(m_pad, n, world)
        or check_int32_extents(m_max_pad, n, k)
    )


def mxfp8_gemm_problems(*, n, k, block_m=MXFP8_BLOCK_M, block_n=DEFAULT_BLOCK_N, quant="mxfp8",
                        transport="gemm-only"):
    """Every rule Mxfp8GemmOp (gemm-only) breaks for ``(N, K)``, as Problems, in its order.

    Both of its kernels must be buildable: the wide tile (``block_n``, permlane)
    and the narrow 128-wide tile it switches to at small grids.
    """
    if quant is not None and check_mode_quant(transport, quant):
        yield ("quant", "mode_quant", check_mode_quant(transport, quant))
    if block_m is not None and check_block_m_for_quant("mxfp8", block_m):
        yield ("block_m", "block_m_quant", check_block_m_for_quant("mxfp8", block_m))
    if block_n is not None:
        why = check_tile(MXFP8_BLOCK_M, block_n) or check_block_n(block_n)
        if why:
            yield ("block_n", "block_n", why)
            block_n = None
    yield from _shape_problems(n, k, block_n, "mxfp8", narrow_n=NARROW_BLOCK_N)


def check_mxfp8_gemm(n: int, k: int, *, block_n: int = DEFAULT_BLOCK_N, m: int | None = None) -> str | None:
    """First reason Mxfp8GemmOp (gemm-only) cannot serve ``(N, K)`` (at ``m``), or None."""
    for _field, _rule, why in mxfp8_gemm_problems(n=n, k=k, block_n=block_n):
        return why
    if m is None:
        return None
    return check_m(m) or check_int32_extents(gemm_only_padded_m(m), n, k)


def mxfp8_gemv_problems(*, n, k, quant="mxfp8"):
    """Every rule Mxfp8GemvOp breaks for ``(N, K)`` (its ``supports_gemv``), as Problems."""
    if quant is not None and check_mode_quant("gemv", quant):
        yield ("quant", "mode_quant", check_mode_quant("gemv", quant))
    if k is not None and (k < GEMV_STEP_K or k % GEMV_STEP_K):
        yield ("k", "gemv_k", f"K must be a positive multiple of {GEMV_STEP_K} (the skinny kernel's MFMA step)")
    if n is not None and n % MXFP8_BLOCK:
        yield ("n", "gemv_n", f"N must be a multiple of {MXFP8_BLOCK} (the B scale group; also whole "
                              f"{GEMV_TILE}-row MFMA tiles)")


def check_gemv_m(m: int) -> str | None:
    if not 1 <= m <= GEMV_MAX_M:
        return (f"M must be in [1, {GEMV_MAX_M}] (the skinny kernel's token tile; Mxfp8GemmOp serves "
                f"larger M)")
    return None


def check_mxfp8_gemv(n: int, k: int, *, m: int | None = None) -> str | None:
    """First reason Mxfp8GemvOp cannot serve ``(N, K)`` (at ``m``), or None."""
    for _field, _rule, why in mxfp8_gemv_problems(n=n, k=k):
        return why
    if m is None:
        return None
    return check_gemv_m(m) or check_int32_extents(m, n, k)
