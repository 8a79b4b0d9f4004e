"""mori's EP dispatch/combine v2 (FlyDSL backend, intranode) as data: what one ``[[ep]]`` entry
is, the rules mori applies to it, the (block, warp) variants its device table selects, the
window layout compiled into its kernels, and the per-call variant pick.

Everything here is read from amd-mori 1.2.4's ``mori/ops/dispatch_combine_v2`` (the notes in
``shared/reference/mori-ep-v2-notes.md`` give file and line) and re-stated without importing
it: the plan, ``explain`` and the runtime use it, and none of them may import mori. The tests
hold it against mori's own ``EpDispatchCombineConfig``, ``tuning_configs.lookup`` (under the
MI355X device identity) and the backend's own factory arguments.

- :class:`EpConfig`: one entry, resolved (every default filled, the geometry looked up).
- :func:`config_problems`: mori's refusals of a config, each with mori's own reason.
- :func:`arena_layout`: the backend's region list carved as ``SymmArena`` carves it (256-byte
  aligned); every offset is a compile-time constant of the kernels, as with gemm_ar's window.
- :func:`variants` / :func:`pick`: ``_specs_from`` and ``_pick`` (clamping included).

Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

#: Element bytes of the token dtypes mori's FlyDSL backend moves (fp4 counts 1 as mori's
#: ``elem_size`` does; its token bytes are hidden / 2).
DTYPES = {"bf16": 2, "fp32": 4, "fp8_e4m3fn": 1, "fp8_e4m3fnuz": 1, "fp4": 1}
FP8 = ("fp8_e4m3fn", "fp8_e4m3fnuz")
#: The quant types mori 1.2.4's config knows; the FlyDSL backend serves the first three.
QUANT_TYPES = ("none", "fp8_direct_cast", "fp8_blockwise", "fp4_blockwise", "fp4_blockwise_fp32")
FP4_QUANT = ("fp4_blockwise", "fp4_blockwise_fp32")
PUSH_QUANT = FP4_QUANT + ("fp8_blockwise",)
COMBINE_MODES = ("gather", "scatter")
#: SymmArena._ALIGN: every region starts on this boundary.
ARENA_ALIGN = 256
#: intranode_kernels.xdb_flag_slots ("the CU count"): the most blocks a combine may have.
XDB_FLAG_SLOTS = 256
#: The wave size the kernels are compiled for (gfx950; mori reads MORI_WAVE_SIZE at import).
WAVE = 64
#: A bucket: (max tokens inclusive, or None for "any more"; dispatch block, warp; combine block, warp).
Bucket = tuple  # tuple[int | None, int, int, int, int]

# ---- mori 1.2.4's MI355X device table (tuning_configs.py), as data ----

_BF16 = ((128, 128, 8, 32, 8), (256, 96, 8, 64, 8), (1024, 96, 8, 32, 16), (4096, 160, 8, 32, 16),
         (None, 128, 16, 48, 16))
_FP8 = ((128, 128, 8, 32, 8), (256, 160, 8, 64, 8), (1024, 128, 8, 32, 16), (4096, 160, 8, 32, 16),
        (None, 128, 16, 48, 16))
_FP4 = ((256, 128, 4, 32, 8), (2048, 144, 4, 64, 16), (None, 128, 8, 64, 16))
_FP4_BF16 = ((128, 128, 4, 128, 16), (256, 160, 4, 32, 8), (2048, 144, 8, 32, 16), (None, 128, 4, 48, 16))
_FP4_BF16_T6 = ((128, 96, 4, 160, 16), (256, 160, 4, 48, 8), (None, 96, 8, 32, 16))
#: device -> (single-shot geometry (dispatch block, dispatch warp, combine block, combine warp),
#: default schedule, {(world, hidden, topk): {tuning dtype: schedule}}).
DEVICES: dict[str, tuple[tuple[int, int, int, int], tuple, dict]] = {
    "MI355X": ((128, 16, 48, 16), _BF16, {
        (8, 7168, 8): {"bf16": _BF16, "fp8": _FP8, "fp4": _FP4, "fp4_disp_bf16_comb": _FP4_BF16},
        (8, 7168, 6): {"bf16": _BF16, "fp8": _FP8, "fp4": _FP4, "fp4_disp_bf16_comb": _FP4_BF16_T6},
    }),
}
#: Device names that take another's table (mori's _MODEL_ALIAS: same die).
DEVICE_ALIASES = {"MI350X": "MI355X"}


def device_table(device: str) -> str:
    """The table a device name uses (``MI350X`` -> ``MI355X``); KeyError for an unknown one."""
    name = DEVICE_ALIASES.get(device, device)
    if name not in DEVICES:
        raise KeyError(device)
    return name


@dataclass(frozen=True)
class EpConfig:
    """One EP dispatch/combine configuration of one world, resolved: what mori's
    ``EpDispatchCombineConfig`` holds after ``__post_init__`` (the rank aside: every rank of
    the world is built from it)."""

    world: int
    hidden: int
    max_tokens: int  # mori: max_num_inp_token_per_rank
    experts: int  # routed experts in all; per rank = experts / world
    topk: int
    dispatch_dtype: str
    combine_dtype: str
    quant_type: str = "none"
    combine_mode: str = "gather"
    scale_dim: int = 0
    scale_type_size: int = 0
    max_total_recv_tokens: int = 0
    std_moe: bool = False
    replay: bool = True
    device: str = "MI355X"

    # ---- mori's derived properties (dispatch_combine_op.py ~454-598) ----

    @property
    def experts_per_rank(self) -> int:
        return self.experts // self.world

    @property
    def elem_size(self) -> int:
        return DTYPES[self.dispatch_dtype]

    @property
    def combine_elem_size(self) -> int:
        return DTYPES[self.combine_dtype]

    @property
    def is_fp4(self) -> bool:
        return self.dispatch_dtype == "fp4"

    @property
    def token_nbytes(self) -> int:
        return self.hidden // 2 if self.is_fp4 else self.hidden * self.elem_size

    @property
    def combine_token_nbytes(self) -> int:
        return self.hidden // 2 if self.combine_dtype == "fp4" else self.hidden * self.combine_elem_size

    @property
    def is_scatter(self) -> bool:
        return self.combine_mode == "scatter"

    @property
    def fp8_direct_cast(self) -> bool:
        return self.quant_type == "fp8_direct_cast"

    @property
    def fp8_blockwise(self) -> bool:
        return self.quant_type == "fp8_blockwise"

    @property
    def wire_elem_size(self) -> int:
        return 1 if self.quant_type.startswith("fp8_") else self.elem_size

    @property
    def combine_scale_dim(self) -> int:
        return self.hidden // 128 if self.fp8_blockwise else 0

    @property
    def recv_cap(self) -> int:
        """``effective_max_recv``: the receive slots every kernel is compiled with."""
        per_rank = self.max_tokens
        if self.max_total_recv_tokens > 0:
            per_rank = min(-(-self.max_total_recv_tokens // self.world), self.max_tokens)
        return self.world * per_rank

    @property
    def tuning_dtype(self) -> str:
        """``dtype_str``: the key of the device table's schedules."""
        if self.is_fp4:
            return "fp4" if self.combine_dtype == "fp4" else "fp4_disp_bf16_comb"
        return "fp8" if self.dispatch_dtype in FP8 else "bf16"

    # ---- geometry: the device table (tuning_configs.lookup), never the build host's sysfs ----

    @property
    def geometry(self) -> tuple[int, int, int, int]:
        """(dispatch block, dispatch warp, combine block, combine warp): the single-shot fields."""
        return DEVICES[device_table(self.device)][0]

    @property
    def schedule(self) -> tuple:
        """The buckets the device table holds for this shape and dtype (its default otherwise)."""
        _geo, default, table = DEVICES[device_table(self.device)]
        entry = table.get((self.world, self.hidden, self.topk))
        if entry:
            return entry.get(self.tuning_dtype) or entry.get("fp8") or default
        return default

    def to_json(self) -> dict:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "EpConfig":
        return cls(**{f: d[f] for f in cls.__dataclass_fields__})


def config_problems(c: EpConfig) -> list[tuple[str, str]]:
    """(field, reason) for everything mori's config or its FlyDSL backend refuses, in mori's
    words; empty when mori builds it. Assumes the values' types and ranges are checked."""
    out: list[tuple[str, str]] = []
    if c.quant_type in FP4_QUANT:
        out.append(("quant_type", f"quant_type={c.quant_type!r} is the hip backend's gfx125x combine; "
                                  f"mori's FlyDSL backend cannot serve it"))
        return out
    mode = "scatter" if c.quant_type != "none" else c.combine_mode
    if c.token_nbytes % 16:
        out.append(("hidden", f"per-token transport bytes must be 16 B aligned (vec4 copy); hidden_dim={c.hidden}, "
                              f"dispatch_dtype={c.dispatch_dtype} -> token_nbytes={c.token_nbytes}"))
    if c.dispatch_dtype != c.combine_dtype:
        if mode != "gather" or c.quant_type != "none" or c.std_moe:
            out.append(("combine_dtype", "combine_data_type (asymmetric dtype) requires combine_mode=gather, "
                                         "quant_type=none, enable_std_moe=False (mori's FlyDSL backend)"))
        if c.combine_dtype == "fp4":
            out.append(("combine_dtype", "asymmetric combine dtype does not support fp4 (fp4 dispatch + bf16 "
                                         "combine is supported; fp4 combine is not)"))
        elif c.combine_token_nbytes % 16:
            out.append(("combine_dtype", f"combine per-token bytes must be 16 B aligned; combine_data_type="
                                         f"{c.combine_dtype} -> {c.combine_token_nbytes}"))
    if (c.is_fp4 or c.dispatch_dtype in FP8) and mode == "scatter":
        out.append(("combine_mode", "plain fp4/fp8 token dtype is gather-only (fp8 quant uses "
                                    "quant_type=fp8_direct_cast, not data_type)"))
    if c.std_moe and c.elem_size != 2:
        out.append(("std_moe", "StdMoE convert path is bf16-only"))
    if c.fp8_blockwise and c.hidden % 128:
        out.append(("hidden", f"fp8_blockwise scales blocks of 128 elements; hidden_dim={c.hidden} is not a "
                              f"multiple of 128"))
    geo, sched = c.geometry, c.schedule
    comb_warps = [b[4] for b in sched] if sched else [geo[3]]
    if c.world > min(comb_warps) * WAVE:
        out.append(("world", f"world_size ({c.world}) exceeds the smallest combine blockDim in the schedule "
                             f"({min(comb_warps) * WAVE})"))
    if any(b[3] > XDB_FLAG_SLOTS for b in sched) or geo[2] > XDB_FLAG_SLOTS:
        out.append(("device", f"a combine of more than {XDB_FLAG_SLOTS} blocks (xdb_flag_slots)"))
    return out


def resolved(c: EpConfig) -> EpConfig:
    """``c`` as mori's ``__post_init__`` leaves it: a quantised combine scatters."""
    if c.quant_type != "none" and c.combine_mode != "scatter":
        from dataclasses import replace

        return replace(c, combine_mode="scatter")
    return c


@dataclass(frozen=True)
class Arena:
    """The window layout: (name, offset, bytes) per region, in the backend's order, and its size."""

    regions: tuple[tuple[str, int, int], ...]
    total: int

    def offset(self, name: str) -> int:
        for n, off, _size in self.regions:
            if n == name:
                return off
        raise KeyError(name)

    def has(self, name: str) -> bool:
        return any(n == name for n, _o, _s in self.regions)

    def to_json(self) -> dict:
        return {"regions": [list(r) for r in self.regions], "total": self.total}


def arena_layout(c: EpConfig) -> Arena:
    """The FlyDSL backend's region list (flydsl_backend.py ~110-142) carved as SymmArena does."""
    cap, m, k, h = c.recv_cap, c.max_tokens, c.topk, c.hidden
    scale_b = c.scale_dim * c.scale_type_size
    regions = [("tok_off", 4), ("recv_num", c.world * 4), ("recv_to_src_token", cap * 4),
               ("out_idx", cap * k * 4), ("out_wts", cap * k * 4), ("disp_out", cap * c.token_nbytes),
               ("out_tok", cap * c.combine_token_nbytes), ("cross_device_barrier", c.world * 8)]
    if scale_b > 0:
        regions.append(("out_scales", cap * ((scale_b + 3) // 4) * 4))
    if c.is_scatter:
        regions += [("comb_inp", c.world * m * h * c.wire_elem_size), ("comb_wts", c.world * m * k * 4)]
        if c.fp8_blockwise:
            regions.append(("comb_scales", c.world * m * c.combine_scale_dim * 4))
    out, off = [], 0
    for name, size in regions:
        off = -(-off // ARENA_ALIGN) * ARENA_ALIGN
        out.append((name, off, size))
        off += size
    return Arena(tuple(out), max(-(-off // ARENA_ALIGN) * ARENA_ALIGN, ARENA_ALIGN))


def variants(c: EpConfig) -> tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]]:
    """``_specs_from``: the distinct (block, warp) of dispatch and of combine, sorted. A scatter
    combine is not schedule-tuned: its one variant is the single-shot combine geometry."""
    geo, sched = c.geometry, c.schedule
    if not sched:
        return ((geo[0], geo[1]),), ((geo[2], geo[3]),)
    disp = tuple(sorted({(b[1], b[2]) for b in sched}))
    comb = ((geo[2], geo[3]),) if c.is_scatter else tuple(sorted({(b[3], b[4]) for b in sched}))
    return disp, comb


def kernel_roles(c: EpConfig) -> tuple[tuple[str, int, int], ...]:
    """A rank's kernels of ``c`` as (kind, block, warp), in the order ``gemmar_aot_kernels.ep.specs``
    makes them and a lock lists them: each dispatch variant, each combine variant, with replay each
    replay dispatch variant, the local expert count (at the single-shot dispatch geometry), and with
    StdMoE its two converts (at the single-shot dispatch and combine geometries)."""
    disp, comb = variants(c)
    db, dw, cb, cw = c.geometry
    out = [("dispatch", b, w) for b, w in disp] + [("combine", b, w) for b, w in comb]
    if c.replay:
        out += [("dispatch_replay", b, w) for b, w in disp]
    out.append(("local_expert_count", db, dw))
    if c.std_moe:
        out += [("convert_dispatch", db, dw), ("convert_combine", cb, cw)]
    return tuple(out)


def kernels_per_rank(c: EpConfig) -> int:
    """How many kernels a rank of ``c`` builds (:func:`kernel_roles`)."""
    return len(kernel_roles(c))


#: The fields of an :class:`EpConfig` a pod's op must match exactly: what the kernels compute.
#: ``replay`` (whether the replay variants were built) and ``device`` (whose table chose the
#: variants) say which kernels exist, and are matched apart.
SERVED_FIELDS = ("world", "hidden", "max_tokens", "experts", "topk", "dispatch_dtype", "combine_dtype",
                 "quant_type", "combine_mode", "scale_dim", "scale_type_size", "max_total_recv_tokens", "std_moe")


def served_key(c: EpConfig) -> tuple:
    """``c``'s :data:`SERVED_FIELDS`, in order: how a pod's configuration finds its built entry."""
    return tuple(getattr(c, f) for f in SERVED_FIELDS)


def manifest_entry(c: EpConfig) -> str:
    """The ``[[ep]]`` block that builds ``c`` (defaults left out), as a pod's miss error prints it."""
    lines = ["[[ep]]"]
    defaults = EpConfig(world=1, hidden=1, max_tokens=1, experts=1, topk=1, dispatch_dtype="bf16",
                        combine_dtype="bf16")
    for f in EpConfig.__dataclass_fields__:
        v = getattr(c, f)
        if f == "combine_dtype" and v == c.dispatch_dtype:
            continue
        if f in ("quant_type", "combine_mode", "scale_dim", "scale_type_size", "max_total_recv_tokens", "std_moe",
                 "replay") and v == getattr(defaults, f):
            continue
        if f == "combine_mode" and c.quant_type != "none":
            continue  # a quantised combine scatters: the manifest resolves it as mori does
        lines.append(f"{f} = " + (("true" if v else "false") if isinstance(v, bool) else
                                  f'"{v}"' if isinstance(v, str) else str(v)))
    return "\n".join(lines)


def pick_table(c: EpConfig) -> tuple[tuple[int | None, tuple[int, int], tuple[int, int]], ...]:
    """``_pick`` resolved for every bucket: (its bound, None for the open one; its dispatch variant;
    its combine variant), each variant clamped to the largest built one when it is not one.
    Without a schedule, one open row of the first variants."""
    disp, comb = variants(c)
    if not c.schedule:
        return ((None, disp[0], comb[0]),)
    return tuple((b[0], (b[1], b[2]) if (b[1], b[2]) in disp else disp[-1],
                  (b[3], b[4]) if (b[3], b[4]) in comb else comb[-1]) for b in c.schedule)


def pick_from(table: tuple, n: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """``_pick`` over a :func:`pick_table`: the variants of the first bucket that holds ``n`` tokens,
    the last bucket's when none does."""
    for bound, disp, comb in table:
        if bound is None or n <= bound:
            return disp, comb
    return table[-1][1:]


def pick(c: EpConfig, n: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """``_pick``: the (dispatch, combine) variants for ``n`` tokens (:func:`pick_table`, :func:`pick_from`)."""
    return pick_from(pick_table(c), n)


# ---- what differs between the mori releases a profile pins ----

#: Keywords of mori's EP factories that a later release removed: keyword -> (the first release
#: without it, what it did). A spec made for that release or a later one omits the keyword
#: (:func:`for_mori`), so every record states exactly the call its build made.
REMOVED_KEYWORDS = {
    "reset_total_recv": ((1, 2, 5), "the combine zeroes the receive count at the address it is passed; "
                                    "mori 1.2.5's combine does not (its dispatch resets it), and its "
                                    "backend no longer passes the keyword"),
}


def mori_release(version: str) -> tuple[int, int, int]:
    """``1.2.5.dev20261026`` -> ``(1, 2, 5)``: the release a mori version (a nightly included) is of."""
    parts = []
    for p in str(version).split(".")[:3]:
        digits = ""
        for ch in p:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
    if len(parts) != 3:
        raise ValueError(f"mori version {version!r} is not MAJOR.MINOR.PATCH[...]")
    return (parts[0], parts[1], parts[2])


def factory_kwargs(kwargs: Mapping[str, Any], mori_version: str) -> dict[str, Any]:
    """``kwargs`` of one of mori's EP factory calls as the backend of mori ``mori_version`` passes
    them: without the keywords that release removed."""
    rel = mori_release(mori_version)
    return {k: v for k, v in kwargs.items() if k not in REMOVED_KEYWORDS or rel < REMOVED_KEYWORDS[k][0]}


def combine_zeroes_total_recv(mori_version: str | None) -> bool:
    """Whether the combine kernels built with mori ``mori_version`` write 0 at the receive count
    they are passed (mori 1.2.4's do: ``reset_total_recv=True``). Unknown (None): assumed to."""
    return mori_version is None or mori_release(mori_version) < REMOVED_KEYWORDS["reset_total_recv"][0]
